//! Services and EndpointSlices as the Kubernetes source decodes them off the wire: the
//! object's metadata with only what the conversions and the source's store read, the rest of
//! the object as k8s-openapi types.
//!
//! The metadata is where the bytes nobody reads are: managedFields (a JSON tree per field
//! manager), kubectl's last-applied annotation (the whole object again, as a string), owner
//! references, finalizers. Decoded into `ObjectMeta` they were allocated, then dropped by the
//! trimming; decoded here they are skipped in the text (serde's `IgnoredAny`). That is a third
//! of a Service's decoding time and close to half of a slice's (the criterion bench `decode`:
//! lean/full 0.68 and 0.56 on objects shaped as the VM benchmarks' API double serves them). The
//! trimming (the kube module's `trim_service` and `trim_slice`) still runs after, on
//! what is left.
//!
//! A slice's endpoints keep what the conversion reads: addresses, conditions, hints, node
//! and zone (not the Pod reference, hostname or deprecated topology).
//!
//! [`LeanService`] and [`LeanSlice`] implement k8s-openapi's `Resource` and `Metadata` with
//! the real kinds' constants, so kube's API and watcher take them as those kinds, and convert
//! into the real types by moving fields.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::{Service, ServiceSpec, ServiceStatus};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use proxier_core::k8s::{
    HEADLESS_LABEL, LAST_CHANGE_TRIGGER_TIME_ANNOTATION, SERVICE_NAME_LABEL,
    SERVICE_PROXY_NAME_LABEL,
};
use proxier_core::model::{SCHEDULER_ANNOTATION, WEIGHTS_ANNOTATION};
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

/// Annotations the conversions read (scheduler, weights, the slice's trigger time): every
/// other annotation is skipped as an object is decoded, or dropped before it is kept.
pub(crate) const READ_ANNOTATIONS: [&str; 3] = [
    SCHEDULER_ANNOTATION,
    WEIGHTS_ANNOTATION,
    LAST_CHANGE_TRIGGER_TIME_ANNOTATION,
];

/// Labels the conversions read on a Service or an EndpointSlice (the slice's Service, and
/// kube-proxy's two that keep an object away from it): the others (`app`, Helm's, the
/// slice's `managed-by`) are skipped as the object is decoded. The kube module's trimming
/// keeps each kind's own share of them.
pub(crate) const READ_LABELS: [&str; 3] =
    [SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL, HEADLESS_LABEL];

/// The fields of `ObjectMeta` the source and the conversions read; every other field of the
/// text is skipped unread.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMetaFields {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    labels: Kept<ReadLabels>,
    #[serde(default)]
    annotations: Kept<ReadAnnotations>,
}

/// Which keys of a metadata map [`Kept`] keeps.
trait KeptKeys {
    /// The keys kept.
    const KEYS: &'static [&'static str];
    /// What the map is, for a decoding error.
    const WHAT: &'static str;
}

/// [`READ_LABELS`].
struct ReadLabels;

impl KeptKeys for ReadLabels {
    const KEYS: &'static [&'static str] = &READ_LABELS;
    const WHAT: &'static str = "a map of labels, or null";
}

/// [`READ_ANNOTATIONS`].
struct ReadAnnotations;

impl KeptKeys for ReadAnnotations {
    const KEYS: &'static [&'static str] = &READ_ANNOTATIONS;
    const WHAT: &'static str = "a map of annotations, or null";
}

/// The entries of a metadata map (labels, annotations) whose keys `K` names; the values of
/// the others (kubectl's last-applied configuration above all) are skipped unread.
struct Kept<K>(Option<BTreeMap<String, String>>, PhantomData<K>);

impl<K> Default for Kept<K> {
    fn default() -> Self {
        Kept(None, PhantomData)
    }
}

impl<'de, K: KeptKeys> Deserialize<'de> for Kept<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries<K>(PhantomData<K>);
        impl<'de, K: KeptKeys> Visitor<'de> for Entries<K> {
            type Value = Kept<K>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(K::WHAT)
            }

            fn visit_unit<E>(self) -> Result<Kept<K>, E> {
                Ok(Kept::default())
            }

            fn visit_none<E>(self) -> Result<Kept<K>, E> {
                Ok(Kept::default())
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Kept<K>, D::Error> {
                d.deserialize_map(self)
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kept<K>, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    if K::KEYS.contains(&key.as_str()) {
                        kept.insert(key, map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Kept((!kept.is_empty()).then_some(kept), PhantomData))
            }
        }
        deserializer.deserialize_option(Entries(PhantomData))
    }
}

/// Decodes an object's `metadata` keeping only [`LeanMetaFields`].
fn lean_meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let fields = LeanMetaFields::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: fields.name,
        namespace: fields.namespace,
        resource_version: fields.resource_version,
        deletion_timestamp: fields.deletion_timestamp,
        labels: fields.labels.0,
        annotations: fields.annotations.0,
        ..ObjectMeta::default()
    })
}

/// A v1 Service decoded with lean metadata (see the module).
#[derive(Debug, Clone, Deserialize)]
pub struct LeanService {
    #[serde(default, deserialize_with = "lean_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<ServiceSpec>,
    #[serde(default)]
    status: Option<ServiceStatus>,
}

impl From<LeanService> for Service {
    fn from(lean: LeanService) -> Service {
        Service {
            metadata: lean.metadata,
            spec: lean.spec,
            status: lean.status,
        }
    }
}

/// A discovery.k8s.io/v1 EndpointSlice decoded with lean metadata (see the module).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeanSlice {
    #[serde(default, deserialize_with = "lean_meta")]
    metadata: ObjectMeta,
    address_type: String,
    #[serde(default)]
    endpoints: Option<Vec<LeanEndpoint>>,
    #[serde(default)]
    ports: Option<Vec<EndpointPort>>,
}

impl From<LeanSlice> for EndpointSlice {
    fn from(lean: LeanSlice) -> EndpointSlice {
        EndpointSlice {
            metadata: lean.metadata,
            address_type: lean.address_type,
            endpoints: lean
                .endpoints
                .map(|endpoints| endpoints.into_iter().map(Endpoint::from).collect()),
            ports: lean.ports,
        }
    }
}

/// An endpoint of a [`LeanSlice`]: what the conversion reads (its target reference, hostname
/// and deprecated topology are skipped unread).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanEndpoint {
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Option<EndpointConditions>,
    #[serde(default)]
    hints: Option<EndpointHints>,
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    zone: Option<String>,
}

impl From<LeanEndpoint> for Endpoint {
    fn from(lean: LeanEndpoint) -> Endpoint {
        Endpoint {
            addresses: lean.addresses,
            conditions: lean.conditions,
            hints: lean.hints,
            node_name: lean.node_name,
            zone: lean.zone,
            ..Endpoint::default()
        }
    }
}

/// Implements k8s-openapi's `Resource` and `Metadata` for a lean type with its kind's
/// constants: kube's `Api` and watcher then ask for that kind's path.
macro_rules! as_kind {
    ($lean:ty, $kind:ty) => {
        impl k8s_openapi::Resource for $lean {
            const API_VERSION: &'static str = <$kind as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$kind as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$kind as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$kind as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$kind as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$kind as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $lean {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

as_kind!(LeanService, Service);
as_kind!(LeanSlice, EndpointSlice);

/// A Service or an EndpointSlice on the heap, as the source's watchers hand it from layer to
/// layer: a watch event then moves a pointer, where a Service is 824 bytes and a slice 432,
/// moved about ten times on its way from the decoder to the store. In the VM at 10,000
/// Services those moves were most of the daemon's `memmove` time in a restart's adoption
/// (libc was 9.8 % of its CPU samples there, nearly all copying). It is its kind for kube's
/// API and watcher, as the lean types are.
#[derive(Debug, Clone)]
pub(crate) struct Boxed<K>(pub(crate) Box<K>);

impl<K> Boxed<K> {
    /// `object`, boxed.
    pub(crate) fn new(object: K) -> Self {
        Boxed(Box::new(object))
    }
}

impl From<LeanService> for Boxed<Service> {
    fn from(lean: LeanService) -> Self {
        Boxed::new(lean.into())
    }
}

impl From<LeanSlice> for Boxed<EndpointSlice> {
    fn from(lean: LeanSlice) -> Self {
        Boxed::new(lean.into())
    }
}

impl<K: k8s_openapi::Resource> k8s_openapi::Resource for Boxed<K> {
    const API_VERSION: &'static str = K::API_VERSION;
    const GROUP: &'static str = K::GROUP;
    const KIND: &'static str = K::KIND;
    const VERSION: &'static str = K::VERSION;
    const URL_PATH_SEGMENT: &'static str = K::URL_PATH_SEGMENT;
    type Scope = K::Scope;
}

impl<K: k8s_openapi::Metadata<Ty = ObjectMeta>> k8s_openapi::Metadata for Boxed<K> {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        self.0.metadata()
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        self.0.metadata_mut()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A Service as an API server sends it: managedFields, kubectl's annotation, owner
    /// references and finalizers beside what is read.
    fn service_text() -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "42",
                            "uid": "0b1c", "creationTimestamp": "2026-01-01T00:00:00Z",
                            "labels": {"app": "web", "service.kubernetes.io/headless": ""},
                            "annotations": {
                                "kubectl.kubernetes.io/last-applied-configuration": "{\"big\":1}",
                                "ipvs.proxier.io/scheduler": "wrr"},
                            "finalizers": ["x"],
                            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}],
                            "managedFields": [{"manager": "kubectl", "operation": "Apply",
                                               "fieldsType": "FieldsV1",
                                               "fieldsV1": {"f:spec": {"f:ports": {}}}}]},
               "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "type": "ClusterIP",
                        "selector": {"app": "web"},
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
               "status": {"loadBalancer": {}}})
    }

    #[test]
    fn a_lean_service_is_the_service_with_only_the_read_metadata() {
        let text = service_text();
        let lean: Service = serde_json::from_value::<LeanService>(text.clone())
            .expect("lean")
            .into();
        let full: Service = serde_json::from_value(text).expect("full");
        assert_eq!(lean.spec, full.spec);
        assert_eq!(lean.status, full.status);
        let mut expected = full.metadata;
        expected.uid = None;
        expected.creation_timestamp = None;
        expected.finalizers = None;
        expected.owner_references = None;
        expected.managed_fields = None;
        expected
            .annotations
            .as_mut()
            .expect("annotations")
            .remove("kubectl.kubernetes.io/last-applied-configuration");
        // `app` is read by nothing; kube-proxy's headless label is.
        expected.labels.as_mut().expect("labels").remove("app");
        assert_eq!(lean.metadata, expected);
    }

    #[test]
    fn a_boxed_service_is_a_service_for_kube() {
        use kube::Resource as _;
        let lean: LeanService = serde_json::from_value(service_text()).expect("lean");
        let mut boxed = Boxed::<Service>::from(lean.clone());
        assert_eq!(Boxed::<Service>::kind(&()), "Service");
        assert_eq!(Boxed::<Service>::plural(&()), "services");
        assert_eq!(
            Boxed::<EndpointSlice>::api_version(&()),
            "discovery.k8s.io/v1"
        );
        assert_eq!(*boxed.0, Service::from(lean));
        boxed.meta_mut().name = Some("db".into());
        assert_eq!(boxed.0.metadata.name.as_deref(), Some("db"));
    }

    #[test]
    fn a_lean_slice_is_the_slice_with_only_the_read_metadata() {
        let text = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "addressType": "IPv4",
            "metadata": {"name": "web-1", "namespace": "shop", "resourceVersion": "7",
                         "labels": {"kubernetes.io/service-name": "web",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z",
                                         "other": "x"},
                         "managedFields": [{"manager": "m", "fieldsV1": {"f:endpoints": {}}}]},
            "endpoints": [{"addresses": ["10.244.0.5"], "conditions": {"ready": true, "serving": false},
                           "targetRef": {"kind": "Pod", "name": "p"}, "nodeName": "node-a",
                           "zone": "z1", "hints": {"forZones": [{"name": "z1"}]}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]});
        let lean: EndpointSlice = serde_json::from_value::<LeanSlice>(text.clone())
            .expect("lean")
            .into();
        let mut full: EndpointSlice = serde_json::from_value(text).expect("full");
        for endpoint in full.endpoints.iter_mut().flatten() {
            assert!(endpoint.target_ref.take().is_some(), "the text has one");
        }
        assert_eq!(lean.endpoints, full.endpoints);
        assert_eq!(lean.ports, full.ports);
        assert_eq!(lean.address_type, full.address_type);
        let mut labels = full.metadata.labels.expect("labels");
        labels.remove("endpointslice.kubernetes.io/managed-by");
        assert_eq!(
            lean.metadata.labels,
            Some(labels),
            "only the Service's name is kept"
        );
        assert_eq!(
            lean.metadata.annotations.expect("the trigger time").len(),
            1,
            "only the trigger time is kept"
        );
        assert!(lean.metadata.managed_fields.is_none());
    }

    #[test]
    fn null_or_absent_metadata_maps_and_no_read_annotation_decode_to_none() {
        for metadata in [
            json!({"name": "a", "annotations": null, "labels": null}),
            json!({"name": "a"}),
            json!({"name": "a", "annotations": {"other": "x"}}),
        ] {
            let text = json!({"metadata": metadata, "spec": {}});
            let lean: LeanService = serde_json::from_value(text).expect("decodes");
            assert_eq!(lean.metadata.annotations, None, "{metadata}");
            assert_eq!(lean.metadata.labels, None, "{metadata}");
            assert_eq!(lean.metadata.name.as_deref(), Some("a"));
        }
    }

    #[test]
    fn a_malformed_object_is_an_error_not_a_default() {
        for text in [
            json!({"metadata": {"name": 5}}),
            json!({"metadata": {"annotations": {"ipvs.proxier.io/scheduler": 3}}}),
            json!({"metadata": {"annotations": ["not", "a", "map"]}}),
            json!({"metadata": {}, "spec": {"ports": "80"}}),
        ] {
            assert!(
                serde_json::from_value::<LeanService>(text.clone()).is_err(),
                "{text}"
            );
        }
        assert!(
            serde_json::from_value::<LeanSlice>(json!({"metadata": {}})).is_err(),
            "addressType is required"
        );
    }
}
