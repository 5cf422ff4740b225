//! Services and EndpointSlices read from Kubernetes' protobuf encoding
//! (`application/vnd.kubernetes.protobuf`, the content type kube-proxy asks for by default).
//!
//! A list in that encoding is the magic `k8s\0`, then a `runtime.Unknown` message whose `raw`
//! field holds the list (`ServiceList`, `EndpointSliceList`: list metadata, then each item).
//! Field numbers are those of the API's `generated.proto` files. Only what the conversions
//! read is decoded, as [`super::lean`] does for JSON: a field that is not read is skipped by
//! its length without being looked at, which is where this encoding saves the CPU that
//! decoding JSON text costs (the object's managed fields, owner references, the Pod reference
//! of each endpoint).
//!
//! The API server writes a Go value's fields even when they are empty (`""`, `0`, `false`
//! where the field is not a pointer), where its JSON leaves them out (`omitempty`): an empty
//! string, a zero number or a false flag in an optional field decodes to `None`, as the JSON
//! text would. Fields that are pointers in Go (a condition, `allocateLoadBalancerNodePorts`,
//! an EndpointSlice port's number) keep what was sent.

use std::borrow::BorrowMut;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec,
    ServiceStatus, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::lean::{READ_ANNOTATIONS, READ_LABELS};

/// The content type of Kubernetes' protobuf encoding.
pub const PROTOBUF_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The four bytes every protobuf-encoded object or list starts with.
const MAGIC: &[u8; 4] = b"k8s\0";

/// Why a protobuf body could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtobufError {
    /// The body does not start with `k8s\0`.
    #[error("not Kubernetes protobuf: the body does not start with the k8s magic")]
    Magic,
    /// The body ends inside a field.
    #[error("truncated protobuf message in {message}")]
    Truncated {
        /// The message being read.
        message: &'static str,
    },
    /// A field has a wire type its declaration does not allow.
    #[error("{message}.{field}: unexpected protobuf wire type {wire_type}")]
    WireType {
        /// The message being read.
        message: &'static str,
        /// The field's name.
        field: &'static str,
        /// The wire type found.
        wire_type: u8,
    },
    /// A string field is not UTF-8.
    #[error("{message}.{field}: not UTF-8")]
    Utf8 {
        /// The message being read.
        message: &'static str,
        /// The field's name.
        field: &'static str,
    },
    /// A timestamp out of range.
    #[error("{message}.{field}: timestamp out of range")]
    Timestamp {
        /// The message being read.
        message: &'static str,
        /// The field's name.
        field: &'static str,
    },
}

/// A list read from a protobuf body: the items as they were encoded, and the list's
/// metadata.
#[derive(Debug, Default)]
pub struct ProtobufList<'a> {
    /// Each item's message, undecoded.
    pub items: Vec<&'a [u8]>,
    /// The list's resourceVersion.
    pub resource_version: Option<String>,
    /// The token that asks for the next page.
    pub continue_token: Option<String>,
}

/// Reads a list (`ServiceList`, `EndpointSliceList`, ...) from a whole protobuf body.
pub fn read_list(body: &[u8]) -> Result<ProtobufList<'_>, ProtobufError> {
    let list = unknown_raw(body)?;
    let mut out = ProtobufList::default();
    for field in Fields::new(list, "List") {
        let (number, value) = field?;
        match number {
            1 => {
                for meta in Fields::new(value.bytes("List", "metadata")?, "ListMeta") {
                    match meta? {
                        (2, v) => {
                            out.resource_version = v.opt_string("ListMeta", "resourceVersion")?
                        }
                        (3, v) => out.continue_token = v.opt_string("ListMeta", "continue")?,
                        _ => {}
                    }
                }
            }
            2 => out.items.push(value.bytes("List", "items")?),
            _ => {}
        }
    }
    Ok(out)
}

/// One event of a watch answered in protobuf (`application/vnd.kubernetes.protobuf;stream=watch`):
/// a `metav1.WatchEvent`, whose object is encoded as a list body is (the magic, then
/// `runtime.Unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WatchFrame<'a> {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK` or `ERROR`.
    pub(crate) event_type: &'a str,
    /// The object's message, undecoded (a Service, an EndpointSlice, a `Status`).
    pub(crate) object: &'a [u8],
}

/// Reads one frame of a protobuf watch stream (the frame's bytes after its length).
pub(crate) fn read_watch_frame(frame: &[u8]) -> Result<WatchFrame<'_>, ProtobufError> {
    const M: &str = "WatchEvent";
    let mut event_type = "";
    let mut object: &[u8] = &[];
    for field in Fields::new(frame, M) {
        match field? {
            (1, v) => event_type = utf8(v.bytes(M, "type")?, M, "type")?,
            (2, v) => {
                for raw in Fields::new(v.bytes(M, "object")?, "RawExtension") {
                    if let (1, v) = raw? {
                        object = v.bytes("RawExtension", "raw")?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(WatchFrame {
        event_type,
        object: unknown_raw(object)?,
    })
}

/// A bookmark's object (of any kind: the metadata is every kind's field 1): its
/// resourceVersion, and whether it marks the end of a streaming list's initial events
/// (annotated `k8s.io/initial-events-end: "true"`).
pub(crate) fn read_bookmark(object: &[u8]) -> Result<(Option<String>, bool), ProtobufError> {
    const M: &str = "ObjectMeta";
    let (mut resource_version, mut initial_events_end) = (None, false);
    for field in Fields::new(object, "Bookmark") {
        let (1, meta) = field? else { continue };
        for field in Fields::new(meta.bytes("Bookmark", "metadata")?, M) {
            match field? {
                (6, v) => resource_version = v.opt_string(M, "resourceVersion")?,
                (12, v) => {
                    let (key, value) =
                        map_entry_bytes(v.bytes(M, "annotations")?, M, "annotations")?;
                    if key == INITIAL_EVENTS_END.as_bytes() && value == b"true" {
                        initial_events_end = true;
                    }
                }
                _ => {}
            }
        }
    }
    Ok((resource_version, initial_events_end))
}

/// The annotation on the bookmark that ends a streaming list's initial events.
pub(crate) const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// A `metav1.Status`, as a watch's `ERROR` event carries it and as the API server answers
/// an error to a request that prefers protobuf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProtobufStatus {
    /// `Failure` (or `Success`).
    pub(crate) status: String,
    /// The server's words.
    pub(crate) message: String,
    /// Why, in one CamelCase word (`Expired`, `Gone`, `Invalid`, `Unauthorized`, ...).
    pub(crate) reason: String,
    /// The HTTP status code it stands for (410 when the resourceVersion is too old).
    pub(crate) code: u16,
    /// The object the status is about and the causes, when the server gave them.
    pub(crate) details: Option<ProtobufStatusDetails>,
}

/// A `metav1.StatusDetails`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProtobufStatusDetails {
    pub(crate) name: String,
    pub(crate) group: String,
    pub(crate) kind: String,
    pub(crate) uid: String,
    pub(crate) retry_after_seconds: u32,
    pub(crate) causes: Vec<ProtobufStatusCause>,
}

/// A `metav1.StatusCause`: for an invalid request, the field at fault.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProtobufStatusCause {
    pub(crate) reason: String,
    pub(crate) message: String,
    pub(crate) field: String,
}

/// Reads a `metav1.Status` message (the object of a watch's `ERROR` event, out of its
/// envelope).
pub(crate) fn read_status(object: &[u8]) -> Result<ProtobufStatus, ProtobufError> {
    const M: &str = "Status";
    let mut status = ProtobufStatus::default();
    for field in Fields::new(object, M) {
        match field? {
            (2, v) => status.status = v.string(M, "status")?,
            (3, v) => status.message = v.string(M, "message")?,
            (4, v) => status.reason = v.string(M, "reason")?,
            (5, v) => status.details = Some(status_details(v.bytes(M, "details")?)?),
            (6, v) => status.code = u16::try_from(v.varint(M, "code")?).unwrap_or(0),
            _ => {}
        }
    }
    Ok(status)
}

/// Reads a whole body holding a `metav1.Status` (the magic, `runtime.Unknown`, the Status):
/// how the API server answers an error in protobuf. `None` when the envelope names another
/// kind.
pub(crate) fn read_status_body(body: &[u8]) -> Result<Option<ProtobufStatus>, ProtobufError> {
    let (kind, raw) = unknown_kind_and_raw(body)?;
    if !kind.is_empty() && kind != "Status" {
        return Ok(None);
    }
    read_status(raw).map(Some)
}

fn status_details(message: &[u8]) -> Result<ProtobufStatusDetails, ProtobufError> {
    const M: &str = "StatusDetails";
    let mut details = ProtobufStatusDetails::default();
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => details.name = v.string(M, "name")?,
            (2, v) => details.group = v.string(M, "group")?,
            (3, v) => details.kind = v.string(M, "kind")?,
            (4, v) => {
                const C: &str = "StatusCause";
                let mut cause = ProtobufStatusCause::default();
                for field in Fields::new(v.bytes(M, "causes")?, C) {
                    match field? {
                        (1, v) => cause.reason = v.string(C, "reason")?,
                        (2, v) => cause.message = v.string(C, "message")?,
                        (3, v) => cause.field = v.string(C, "field")?,
                        _ => {}
                    }
                }
                details.causes.push(cause);
            }
            (5, v) => {
                details.retry_after_seconds =
                    u32::try_from(v.varint(M, "retryAfterSeconds")?).unwrap_or(0);
            }
            (6, v) => details.uid = v.string(M, "uid")?,
            _ => {}
        }
    }
    Ok(details)
}

/// The `raw` field of the `runtime.Unknown` envelope after the magic.
fn unknown_raw(body: &[u8]) -> Result<&[u8], ProtobufError> {
    unknown_kind_and_raw(body).map(|(_, raw)| raw)
}

/// The kind named in the `runtime.Unknown` envelope after the magic (empty when not named),
/// and its `raw` field.
fn unknown_kind_and_raw(body: &[u8]) -> Result<(&str, &[u8]), ProtobufError> {
    let envelope = body.strip_prefix(MAGIC).ok_or(ProtobufError::Magic)?;
    let (mut kind, mut raw): (&str, &[u8]) = ("", &[]);
    for field in Fields::new(envelope, "Unknown") {
        match field? {
            (1, type_meta) => {
                for field in Fields::new(type_meta.bytes("Unknown", "typeMeta")?, "TypeMeta") {
                    if let (2, value) = field? {
                        kind = utf8(value.bytes("TypeMeta", "kind")?, "TypeMeta", "kind")?;
                    }
                }
            }
            (2, value) => raw = value.bytes("Unknown", "raw")?,
            _ => {}
        }
    }
    Ok((kind, raw))
}

/// Decodes a v1 Service (an item of a `ServiceList`) with what the conversion reads (see the
/// module); what `trim_service` drops is not decoded.
pub fn decode_service(message: &[u8]) -> Result<Service, ProtobufError> {
    decoded(message, service_into)
}

/// [`decode_service`] into a box made first, the Service decoded where it stays: a Service
/// is a kilobyte, and decoding each part on the stack and returning it moved every one
/// about four times.
pub(crate) fn decode_service_boxed(message: &[u8]) -> Result<Box<Service>, ProtobufError> {
    decoded(message, service_into)
}

/// An object decoded by `into` from its default, in `T` (the object itself, or a box made
/// first).
fn decoded<T: Default + BorrowMut<K>, K>(
    message: &[u8],
    into: fn(&[u8], &mut K) -> Result<(), ProtobufError>,
) -> Result<T, ProtobufError> {
    let mut object = T::default();
    into(message, object.borrow_mut())?;
    Ok(object)
}

/// Decodes a Service's fields into `service` (a field sent twice is merged, as protobuf
/// merges a message field that comes again).
fn service_into(message: &[u8], service: &mut Service) -> Result<(), ProtobufError> {
    const M: &str = "Service";
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => object_meta(v.bytes(M, "metadata")?, &mut service.metadata)?,
            (2, v) => service_spec(v.bytes(M, "spec")?, service.spec.get_or_insert_default())?,
            (3, v) => {
                service_status(
                    v.bytes(M, "status")?,
                    service.status.get_or_insert_default(),
                )?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Decodes a discovery.k8s.io/v1 EndpointSlice (an item of an `EndpointSliceList`) with what
/// the conversion reads (see the module).
pub fn decode_slice(message: &[u8]) -> Result<EndpointSlice, ProtobufError> {
    decoded(message, slice_into)
}

/// [`decode_slice`] into a box made first (see [`decode_service_boxed`]).
pub(crate) fn decode_slice_boxed(message: &[u8]) -> Result<Box<EndpointSlice>, ProtobufError> {
    decoded(message, slice_into)
}

/// Decodes an EndpointSlice's fields into `slice`, each endpoint where it stays in the
/// vector.
fn slice_into(message: &[u8], slice: &mut EndpointSlice) -> Result<(), ProtobufError> {
    const M: &str = "EndpointSlice";
    // The endpoints are counted first, so that their vector is made once: an endpoint is
    // hundreds of bytes, and a vector grown by pushes copies them at each doubling.
    let endpoints = Fields::new(message, M)
        .filter(|field| matches!(field, Ok((2, _))))
        .count();
    if endpoints > 0 {
        slice
            .endpoints
            .get_or_insert_default()
            .reserve_exact(endpoints);
    }
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => object_meta(v.bytes(M, "metadata")?, &mut slice.metadata)?,
            (2, v) => {
                let endpoints = slice.endpoints.get_or_insert_default();
                endpoints.push(Endpoint::default());
                if let Some(last) = endpoints.last_mut() {
                    endpoint(v.bytes(M, "endpoints")?, last)?;
                }
            }
            (3, v) => slice
                .ports
                .get_or_insert_default()
                .push(endpoint_port(v.bytes(M, "ports")?)?),
            (4, v) => slice.address_type = v.string(M, "addressType")?,
            _ => {}
        }
    }
    Ok(())
}

fn object_meta(message: &[u8], meta: &mut ObjectMeta) -> Result<(), ProtobufError> {
    const M: &str = "ObjectMeta";
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => meta.name = v.opt_string(M, "name")?,
            (3, v) => meta.namespace = v.opt_string(M, "namespace")?,
            (6, v) => meta.resource_version = v.opt_string(M, "resourceVersion")?,
            (9, v) => meta.deletion_timestamp = Some(time(v.bytes(M, "deletionTimestamp")?)?),
            // Only the labels and annotations the conversions read are kept: the others
            // (kubectl's last-applied configuration, the whole object again) are not copied.
            (11, v) => keep_entry(
                v.bytes(M, "labels")?,
                "labels",
                &READ_LABELS,
                &mut meta.labels,
            )?,
            (12, v) => keep_entry(
                v.bytes(M, "annotations")?,
                "annotations",
                &READ_ANNOTATIONS,
                &mut meta.annotations,
            )?,
            _ => {}
        }
    }
    Ok(())
}

fn time(message: &[u8]) -> Result<Time, ProtobufError> {
    const M: &str = "Time";
    let (mut seconds, mut nanos) = (0i64, 0i32);
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => seconds = v.varint(M, "seconds")? as i64,
            (2, v) => nanos = v.varint(M, "nanos")? as i32,
            _ => {}
        }
    }
    k8s_openapi::jiff::Timestamp::new(seconds, nanos)
        .map(Time)
        .map_err(|_| ProtobufError::Timestamp {
            message: M,
            field: "seconds",
        })
}

/// Adds the map entry `entry` of ObjectMeta's `field` (labels, annotations) to `map` when its
/// key is one of `keys`; the value of any other is not copied.
fn keep_entry(
    entry: &[u8],
    field: &'static str,
    keys: &[&str],
    map: &mut Option<BTreeMap<String, String>>,
) -> Result<(), ProtobufError> {
    const M: &str = "ObjectMeta";
    let (key, value) = map_entry_bytes(entry, M, field)?;
    let key = utf8(key, M, field)?;
    if keys.contains(&key) {
        map.get_or_insert_default()
            .insert(key.to_owned(), utf8(value, M, field)?.to_owned());
    }
    Ok(())
}

/// A map entry's key and value as the wire carries them (empty when absent).
fn map_entry_bytes<'a>(
    message: &'a [u8],
    owner: &'static str,
    field: &'static str,
) -> Result<(&'a [u8], &'a [u8]), ProtobufError> {
    let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
    for entry in Fields::new(message, owner) {
        match entry? {
            (1, v) => key = v.bytes(owner, field)?,
            (2, v) => value = v.bytes(owner, field)?,
            _ => {}
        }
    }
    Ok((key, value))
}

/// `bytes` as text, or the error that names the field.
fn utf8<'a>(
    bytes: &'a [u8],
    message: &'static str,
    field: &'static str,
) -> Result<&'a str, ProtobufError> {
    std::str::from_utf8(bytes).map_err(|_| ProtobufError::Utf8 { message, field })
}

fn service_spec(message: &[u8], spec: &mut ServiceSpec) -> Result<(), ProtobufError> {
    const M: &str = "ServiceSpec";
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => spec
                .ports
                .get_or_insert_default()
                .push(service_port(v.bytes(M, "ports")?)?),
            (3, v) => spec.cluster_ip = v.opt_string(M, "clusterIP")?,
            (4, v) => spec.type_ = v.opt_string(M, "type")?,
            (5, v) => spec
                .external_ips
                .get_or_insert_default()
                .push(v.string(M, "externalIPs")?),
            (7, v) => spec.session_affinity = v.opt_string(M, "sessionAffinity")?,
            (8, v) => spec.load_balancer_ip = v.opt_string(M, "loadBalancerIP")?,
            (9, v) => spec
                .load_balancer_source_ranges
                .get_or_insert_default()
                .push(v.string(M, "loadBalancerSourceRanges")?),
            (10, v) => spec.external_name = v.opt_string(M, "externalName")?,
            (11, v) => spec.external_traffic_policy = v.opt_string(M, "externalTrafficPolicy")?,
            (12, v) => spec.health_check_node_port = v.opt_int32(M, "healthCheckNodePort")?,
            (13, v) => {
                spec.publish_not_ready_addresses =
                    Some(v.varint(M, "publishNotReadyAddresses")? != 0).filter(|b| *b)
            }
            (14, v) => {
                spec.session_affinity_config = Some(session_affinity_config(
                    v.bytes(M, "sessionAffinityConfig")?,
                )?)
            }
            (17, v) => spec.ip_family_policy = v.opt_string(M, "ipFamilyPolicy")?,
            (18, v) => spec
                .cluster_ips
                .get_or_insert_default()
                .push(v.string(M, "clusterIPs")?),
            (19, v) => spec
                .ip_families
                .get_or_insert_default()
                .push(v.string(M, "ipFamilies")?),
            (20, v) => {
                spec.allocate_load_balancer_node_ports =
                    Some(v.varint(M, "allocateLoadBalancerNodePorts")? != 0)
            }
            (21, v) => spec.load_balancer_class = v.opt_string(M, "loadBalancerClass")?,
            (22, v) => spec.internal_traffic_policy = v.opt_string(M, "internalTrafficPolicy")?,
            (23, v) => spec.traffic_distribution = v.opt_string(M, "trafficDistribution")?,
            // 2: the Pod selector, which no conversion reads.
            _ => {}
        }
    }
    Ok(())
}

fn service_port(message: &[u8]) -> Result<ServicePort, ProtobufError> {
    const M: &str = "ServicePort";
    let mut port = ServicePort::default();
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => port.name = v.opt_string(M, "name")?,
            (2, v) => port.protocol = v.opt_string(M, "protocol")?,
            (3, v) => port.port = v.varint(M, "port")? as i32,
            (5, v) => port.node_port = v.opt_int32(M, "nodePort")?,
            // 4 and 6: the target port and the application protocol, not read.
            _ => {}
        }
    }
    Ok(port)
}

fn session_affinity_config(message: &[u8]) -> Result<SessionAffinityConfig, ProtobufError> {
    const M: &str = "SessionAffinityConfig";
    let mut config = SessionAffinityConfig::default();
    for field in Fields::new(message, M) {
        if let (1, v) = field? {
            let mut client_ip = ClientIPConfig::default();
            for inner in Fields::new(v.bytes(M, "clientIP")?, "ClientIPConfig") {
                if let (1, t) = inner? {
                    client_ip.timeout_seconds =
                        Some(t.varint("ClientIPConfig", "timeoutSeconds")? as i32);
                }
            }
            config.client_ip = Some(client_ip);
        }
    }
    Ok(config)
}

fn service_status(message: &[u8], status: &mut ServiceStatus) -> Result<(), ProtobufError> {
    const M: &str = "ServiceStatus";
    for field in Fields::new(message, M) {
        if let (1, v) = field? {
            let mut load_balancer = LoadBalancerStatus::default();
            for ingress in Fields::new(v.bytes(M, "loadBalancer")?, "LoadBalancerStatus") {
                if let (1, i) = ingress? {
                    load_balancer
                        .ingress
                        .get_or_insert_default()
                        .push(load_balancer_ingress(
                            i.bytes("LoadBalancerStatus", "ingress")?,
                        )?);
                }
            }
            status.load_balancer = Some(load_balancer);
        }
        // 2: conditions, not read.
    }
    Ok(())
}

fn load_balancer_ingress(message: &[u8]) -> Result<LoadBalancerIngress, ProtobufError> {
    const M: &str = "LoadBalancerIngress";
    let mut ingress = LoadBalancerIngress::default();
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => ingress.ip = v.opt_string(M, "ip")?,
            (3, v) => ingress.ip_mode = v.opt_string(M, "ipMode")?,
            // 2 and 4: hostname and port statuses, not read.
            _ => {}
        }
    }
    Ok(ingress)
}

fn endpoint(message: &[u8], endpoint: &mut Endpoint) -> Result<(), ProtobufError> {
    const M: &str = "Endpoint";
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => endpoint.addresses.push(v.string(M, "addresses")?),
            (2, v) => endpoint.conditions = Some(endpoint_conditions(v.bytes(M, "conditions")?)?),
            (6, v) => endpoint.node_name = v.opt_string(M, "nodeName")?,
            (7, v) => endpoint.zone = v.opt_string(M, "zone")?,
            (8, v) => endpoint.hints = Some(endpoint_hints(v.bytes(M, "hints")?)?),
            // 3, 4, 5: hostname, the Pod reference, the deprecated topology; not read.
            _ => {}
        }
    }
    Ok(())
}

fn endpoint_conditions(message: &[u8]) -> Result<EndpointConditions, ProtobufError> {
    const M: &str = "EndpointConditions";
    let mut conditions = EndpointConditions::default();
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => conditions.ready = Some(v.varint(M, "ready")? != 0),
            (2, v) => conditions.serving = Some(v.varint(M, "serving")? != 0),
            (3, v) => conditions.terminating = Some(v.varint(M, "terminating")? != 0),
            _ => {}
        }
    }
    Ok(conditions)
}

fn endpoint_hints(message: &[u8]) -> Result<EndpointHints, ProtobufError> {
    const M: &str = "EndpointHints";
    let mut hints = EndpointHints::default();
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => hints.for_zones.get_or_insert_default().push(ForZone {
                name: named(v.bytes(M, "forZones")?, "ForZone")?,
            }),
            (2, v) => hints.for_nodes.get_or_insert_default().push(ForNode {
                name: named(v.bytes(M, "forNodes")?, "ForNode")?,
            }),
            _ => {}
        }
    }
    Ok(hints)
}

/// The `name` (field 1) of a message that holds only a name.
fn named(message: &[u8], owner: &'static str) -> Result<String, ProtobufError> {
    let mut name = String::new();
    for field in Fields::new(message, owner) {
        if let (1, v) = field? {
            name = v.string(owner, "name")?;
        }
    }
    Ok(name)
}

fn endpoint_port(message: &[u8]) -> Result<EndpointPort, ProtobufError> {
    const M: &str = "EndpointPort";
    let mut port = EndpointPort::default();
    for field in Fields::new(message, M) {
        match field? {
            (1, v) => port.name = v.opt_string(M, "name")?,
            (2, v) => port.protocol = v.opt_string(M, "protocol")?,
            (3, v) => port.port = Some(v.varint(M, "port")? as i32),
            // 4: the application protocol, not read.
            _ => {}
        }
    }
    Ok(port)
}

/// One field's value as the wire carries it.
#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32,
}

impl<'a> Wire<'a> {
    fn wire_type(self) -> u8 {
        match self {
            Wire::Varint(_) => 0,
            Wire::Fixed64 => 1,
            Wire::Bytes(_) => 2,
            Wire::Fixed32 => 5,
        }
    }

    fn unexpected(self, message: &'static str, field: &'static str) -> ProtobufError {
        ProtobufError::WireType {
            message,
            field,
            wire_type: self.wire_type(),
        }
    }

    fn bytes(self, message: &'static str, field: &'static str) -> Result<&'a [u8], ProtobufError> {
        match self {
            Wire::Bytes(bytes) => Ok(bytes),
            other => Err(other.unexpected(message, field)),
        }
    }

    fn varint(self, message: &'static str, field: &'static str) -> Result<u64, ProtobufError> {
        match self {
            Wire::Varint(value) => Ok(value),
            other => Err(other.unexpected(message, field)),
        }
    }

    fn string(self, message: &'static str, field: &'static str) -> Result<String, ProtobufError> {
        utf8(self.bytes(message, field)?, message, field).map(str::to_owned)
    }

    /// An optional string: empty is `None`, as JSON's `omitempty` leaves it out.
    fn opt_string(
        self,
        message: &'static str,
        field: &'static str,
    ) -> Result<Option<String>, ProtobufError> {
        Ok(Some(self.string(message, field)?).filter(|s| !s.is_empty()))
    }

    /// An optional int32: zero is `None`, as JSON's `omitempty` leaves it out.
    fn opt_int32(
        self,
        message: &'static str,
        field: &'static str,
    ) -> Result<Option<i32>, ProtobufError> {
        Ok(Some(self.varint(message, field)? as i32).filter(|n| *n != 0))
    }
}

/// The fields of one message, in wire order.
struct Fields<'a> {
    rest: &'a [u8],
    message: &'static str,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8], message: &'static str) -> Fields<'a> {
        Fields {
            rest: bytes,
            message,
        }
    }

    fn truncated(&mut self) -> ProtobufError {
        self.rest = &[];
        ProtobufError::Truncated {
            message: self.message,
        }
    }

    fn varint(&mut self) -> Option<u64> {
        // Most varints on this wire are one byte: field keys, the lengths of names and
        // addresses, ports below 128, flags.
        if let Some((&byte, rest)) = self.rest.split_first()
            && byte < 0x80
        {
            self.rest = rest;
            return Some(u64::from(byte));
        }
        let mut value = 0u64;
        for (i, byte) in self.rest.iter().take(10).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return Some(value);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(taken)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Wire<'a>), ProtobufError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let Some(key) = self.varint() else {
            return Some(Err(self.truncated()));
        };
        let number = (key >> 3) as u32;
        let value = match key & 7 {
            0 => self.varint().map(Wire::Varint),
            1 => self.take(8).map(|_| Wire::Fixed64),
            2 => match self.varint() {
                Some(len) => usize::try_from(len)
                    .ok()
                    .and_then(|len| self.take(len))
                    .map(Wire::Bytes),
                None => None,
            },
            5 => self.take(4).map(|_| Wire::Fixed32),
            wire_type => {
                self.rest = &[];
                return Some(Err(ProtobufError::WireType {
                    message: self.message,
                    field: "?",
                    wire_type: wire_type as u8,
                }));
            }
        };
        Some(match value {
            Some(value) => Ok((number, value)),
            None => Err(self.truncated()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message built field by field, as the wire carries it.
    #[derive(Default)]
    struct Message(Vec<u8>);

    impl Message {
        fn key(mut self, number: u32, wire_type: u8) -> Self {
            self.put_varint((u64::from(number) << 3) | u64::from(wire_type));
            self
        }

        fn put_varint(&mut self, mut value: u64) {
            while value >= 0x80 {
                self.0.push((value as u8) | 0x80);
                value >>= 7;
            }
            self.0.push(value as u8);
        }

        fn varint(self, number: u32, value: u64) -> Self {
            let mut m = self.key(number, 0);
            m.put_varint(value);
            m
        }

        fn bytes(self, number: u32, value: &[u8]) -> Self {
            let mut m = self.key(number, 2);
            m.put_varint(value.len() as u64);
            m.0.extend_from_slice(value);
            m
        }

        fn string(self, number: u32, value: &str) -> Self {
            self.bytes(number, value.as_bytes())
        }

        fn message(self, number: u32, value: Message) -> Self {
            self.bytes(number, &value.0)
        }

        fn fixed32(self, number: u32) -> Self {
            let mut m = self.key(number, 5);
            m.0.extend_from_slice(&[1, 2, 3, 4]);
            m
        }

        fn fixed64(self, number: u32) -> Self {
            let mut m = self.key(number, 1);
            m.0.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
            m
        }
    }

    fn entry(key: &str, value: &str) -> Message {
        Message::default().string(1, key).string(2, value)
    }

    #[test]
    fn empty_strings_and_zero_numbers_of_optional_fields_decode_as_absent_like_json() {
        // What the API server writes for a Go value with empty non-pointer fields.
        let port = Message::default()
            .string(1, "")
            .string(2, "TCP")
            .string(6, "")
            .varint(3, 80)
            .varint(5, 0);
        let spec = Message::default()
            .message(1, port)
            .string(3, "10.96.0.1")
            .string(4, "")
            .string(7, "None")
            .varint(12, 0)
            .varint(13, 0)
            .string(22, "");
        let meta = Message::default()
            .string(1, "web")
            .string(2, "")
            .string(3, "shop")
            .string(5, "")
            .string(6, "7");
        let service = Message::default().message(1, meta).message(2, spec);
        let service = decode_service(&service.0).expect("decodes");
        let spec = service.spec.expect("spec");
        let port = &spec.ports.as_deref().expect("ports")[0];
        assert_eq!(
            (port.name.as_deref(), port.port, port.node_port),
            (None, 80, None)
        );
        assert_eq!(port.protocol.as_deref(), Some("TCP"));
        assert_eq!(spec.type_, None);
        assert_eq!(spec.health_check_node_port, None);
        assert_eq!(spec.publish_not_ready_addresses, None);
        assert_eq!(spec.internal_traffic_policy, None);
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
        assert_eq!(spec.session_affinity.as_deref(), Some("None"));
        assert_eq!(service.metadata.name.as_deref(), Some("web"));
        assert_eq!(service.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(service.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(service.metadata.uid, None);
    }

    #[test]
    fn pointer_fields_keep_what_was_sent() {
        let conditions = Message::default().varint(1, 0).varint(3, 1);
        let endpoint = Message::default()
            .string(1, "10.244.0.5")
            .message(2, conditions)
            .string(6, "node-a");
        let bare = Message::default().string(1, "10.244.0.6");
        let port = Message::default().string(1, "").varint(3, 0);
        let slice = Message::default()
            .string(4, "IPv4")
            .message(2, endpoint)
            .message(2, bare)
            .message(3, port);
        let slice = decode_slice(&slice.0).expect("decodes");
        let endpoints = slice.endpoints.expect("endpoints");
        let conditions = endpoints[0].conditions.as_ref().expect("conditions");
        assert_eq!(
            (conditions.ready, conditions.serving, conditions.terminating),
            (Some(false), None, Some(true))
        );
        assert_eq!(endpoints[0].node_name.as_deref(), Some("node-a"));
        assert!(endpoints[1].conditions.is_none());
        assert_eq!(endpoints[1].addresses, ["10.244.0.6"]);
        let port = &slice.ports.expect("ports")[0];
        assert_eq!((port.name.as_deref(), port.port), (None, Some(0)));
        assert_eq!(slice.address_type, "IPv4");
    }

    #[test]
    fn fields_not_read_are_skipped_whatever_their_wire_type() {
        let managed = Message::default()
            .string(1, "kubectl")
            .message(7, Message::default().bytes(1, b"{\"f:spec\":{}}"));
        let meta = Message::default()
            .fixed64(99)
            .string(1, "web")
            .message(17, managed)
            .message(11, entry("app", "web"))
            .message(11, entry(READ_LABELS[0], "web"))
            .message(
                12,
                entry("kubectl.kubernetes.io/last-applied-configuration", "{}"),
            )
            .message(12, entry(READ_ANNOTATIONS[0], "wrr"))
            .fixed32(98)
            .varint(97, 5)
            .message(9, Message::default().varint(1, 1_767_225_600).varint(2, 5));
        let service = Message::default()
            .message(1, meta)
            .string(50, "future field");
        let service = decode_service(&service.0).expect("decodes");
        let meta = service.metadata;
        assert_eq!(meta.name.as_deref(), Some("web"));
        assert_eq!(meta.managed_fields, None);
        let labels = meta.labels.expect("the read label");
        assert_eq!(labels.len(), 1, "only what is read is kept");
        assert_eq!(labels[READ_LABELS[0]], "web");
        let annotations = meta.annotations.expect("the read annotation");
        assert_eq!(annotations.len(), 1, "only what is read is kept");
        assert_eq!(annotations[READ_ANNOTATIONS[0]], "wrr");
        let deletion = meta.deletion_timestamp.expect("deletion timestamp").0;
        assert_eq!(deletion.as_second(), 1_767_225_600);
        assert_eq!(deletion.subsec_nanosecond(), 5);
    }

    #[test]
    fn lengths_and_numbers_of_one_byte_and_of_several_decode_alike() {
        // 127 is the last one-byte varint, 128 the first of two; 65535 takes three.
        for (length, port) in [(1, 1u64), (127, 127), (128, 128), (300, 65535)] {
            let name = "n".repeat(length);
            let port_message = Message::default().varint(3, port).string(2, "TCP");
            let spec = Message::default().message(1, port_message);
            let service = Message::default()
                .message(1, Message::default().string(1, &name))
                .message(2, spec);
            let service = decode_service(&service.0).expect("decodes");
            assert_eq!(service.metadata.name.as_deref(), Some(name.as_str()));
            let ports = service.spec.expect("spec").ports.expect("ports");
            assert_eq!(i64::from(ports[0].port), port as i64, "{length}");
        }
        // A length whose second byte is missing.
        let torn = [0x0a, 0x80];
        assert!(matches!(
            decode_service(&torn),
            Err(ProtobufError::Truncated { .. })
        ));
    }

    fn list_body(list: Message) -> Vec<u8> {
        let type_meta = Message::default().string(1, "v1").string(2, "ServiceList");
        let unknown = Message::default()
            .message(1, type_meta)
            .message(2, list)
            .string(3, "")
            .string(4, "");
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&unknown.0);
        body
    }

    #[test]
    fn a_list_gives_its_items_resource_version_and_continue_token() {
        let item = |name: &str| Message::default().message(1, Message::default().string(1, name));
        let list = Message::default()
            .message(
                1,
                Message::default()
                    .string(1, "")
                    .string(2, "42")
                    .string(3, "tok"),
            )
            .message(2, item("a"))
            .message(2, item("b"));
        let body = list_body(list);
        let list = read_list(&body).expect("reads");
        assert_eq!(list.resource_version.as_deref(), Some("42"));
        assert_eq!(list.continue_token.as_deref(), Some("tok"));
        let names: Vec<Option<String>> = list
            .items
            .iter()
            .map(|item| decode_service(item).expect("item").metadata.name)
            .collect();
        assert_eq!(names, [Some("a".to_owned()), Some("b".to_owned())]);

        let last_page =
            list_body(Message::default().message(1, Message::default().string(2, "43")));
        let list = read_list(&last_page).expect("reads");
        assert_eq!(list.continue_token, None, "an empty token is no token");
        assert!(list.items.is_empty());
    }

    #[test]
    fn a_message_field_sent_twice_is_merged_and_boxed_decoding_is_the_same() {
        let meta = Message::default().string(1, "web").string(3, "default");
        let ports = Message::default().message(1, Message::default().varint(3, 80));
        let service = Message::default()
            .message(1, meta)
            .message(2, Message::default().string(3, "10.96.0.1"))
            .message(2, ports)
            .message(1, Message::default().string(6, "7"));
        let decoded = decode_service(&service.0).expect("decodes");
        assert_eq!(decoded.metadata.name.as_deref(), Some("web"));
        assert_eq!(decoded.metadata.resource_version.as_deref(), Some("7"));
        let spec = decoded.spec.as_ref().expect("a spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
        assert_eq!(spec.ports.as_ref().map(|p| p[0].port), Some(80));
        assert_eq!(*decode_service_boxed(&service.0).expect("decodes"), decoded);

        let endpoint = |address: &str| Message::default().string(1, address);
        let slice = Message::default()
            .message(2, endpoint("10.244.0.1"))
            .message(2, endpoint("10.244.0.2"))
            .string(4, "IPv4");
        let decoded = decode_slice(&slice.0).expect("decodes");
        let addresses: Vec<&str> = decoded
            .endpoints
            .iter()
            .flatten()
            .map(|e| e.addresses[0].as_str())
            .collect();
        assert_eq!(addresses, ["10.244.0.1", "10.244.0.2"]);
        assert_eq!(*decode_slice_boxed(&slice.0).expect("decodes"), decoded);
    }

    #[test]
    fn a_torn_or_malformed_body_is_an_error_naming_the_message() {
        assert_eq!(
            read_list(b"{\"kind\":\"ServiceList\"}").err(),
            Some(ProtobufError::Magic)
        );
        let body = list_body(Message::default().message(
            2,
            Message::default().message(1, Message::default().string(1, "web")),
        ));
        for cut in [5, body.len() - 1] {
            let torn = &body[..cut];
            let error = read_list(torn)
                .and_then(|list| {
                    list.items
                        .iter()
                        .map(|item| decode_service(item))
                        .collect::<Result<Vec<_>, _>>()
                        .map(|_| ())
                })
                .expect_err("torn");
            assert!(
                matches!(error, ProtobufError::Truncated { .. }),
                "{cut}: {error}"
            );
        }
        // A name sent as a number.
        let meta = Message::default().varint(1, 5);
        let error = decode_service(&Message::default().message(1, meta).0).expect_err("wire type");
        assert_eq!(
            error.to_string(),
            "ObjectMeta.name: unexpected protobuf wire type 0"
        );
        // A name that is not UTF-8.
        let meta = Message::default().bytes(1, &[0xff, 0xfe]);
        let error = decode_service(&Message::default().message(1, meta).0).expect_err("utf-8");
        assert_eq!(
            error,
            ProtobufError::Utf8 {
                message: "ObjectMeta",
                field: "name"
            }
        );
        // A group (wire type 3), which Kubernetes never sends.
        let error = decode_slice(&Message::default().key(4, 3).0).expect_err("group");
        assert!(
            matches!(error, ProtobufError::WireType { wire_type: 3, .. }),
            "{error}"
        );
        // A varint longer than ten bytes.
        let error = decode_slice(&[
            0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ])
        .expect_err("varint");
        assert!(matches!(error, ProtobufError::Truncated { .. }), "{error}");
    }

    /// An object as a watch event carries it: the magic, then `runtime.Unknown`.
    fn wrapped(kind: &str, object: Message) -> Vec<u8> {
        let type_meta = Message::default().string(1, "v1").string(2, kind);
        let unknown = Message::default().message(1, type_meta).message(2, object);
        let mut raw = MAGIC.to_vec();
        raw.extend_from_slice(&unknown.0);
        raw
    }

    fn watch_event(event_type: &str, object: &[u8]) -> Vec<u8> {
        Message::default()
            .string(1, event_type)
            .message(2, Message::default().bytes(1, object))
            .0
    }

    #[test]
    fn a_watch_frame_gives_its_type_and_its_object_out_of_the_envelope() {
        let service = Message::default().message(1, Message::default().string(1, "web"));
        let frame = watch_event("MODIFIED", &wrapped("Service", service));
        let event = read_watch_frame(&frame).expect("reads");
        assert_eq!(event.event_type, "MODIFIED");
        let service = decode_service(event.object).expect("a Service");
        assert_eq!(service.metadata.name.as_deref(), Some("web"));

        // An object not in the envelope, or a frame cut short, is an error.
        let bare = watch_event("ADDED", &Message::default().string(1, "x").0);
        assert_eq!(read_watch_frame(&bare), Err(ProtobufError::Magic));
        let torn = &frame[..frame.len() - 3];
        assert!(matches!(
            read_watch_frame(torn),
            Err(ProtobufError::Truncated { .. })
        ));
    }

    #[test]
    fn a_bookmark_gives_its_resource_version_and_whether_the_initial_events_end() {
        let meta = |annotation: Option<(&str, &str)>| {
            let mut meta = Message::default().string(1, "").string(6, "4711");
            if let Some((key, value)) = annotation {
                meta = meta.message(12, entry(key, value));
            }
            Message::default().message(1, meta).0
        };
        assert_eq!(
            read_bookmark(&meta(Some((INITIAL_EVENTS_END, "true")))),
            Ok((Some("4711".to_owned()), true))
        );
        assert_eq!(
            read_bookmark(&meta(None)),
            Ok((Some("4711".to_owned()), false))
        );
        assert_eq!(
            read_bookmark(&meta(Some((INITIAL_EVENTS_END, "false")))),
            Ok((Some("4711".to_owned()), false))
        );
        assert_eq!(
            read_bookmark(&meta(Some(("other", "true")))),
            Ok((Some("4711".to_owned()), false))
        );
    }

    #[test]
    fn an_error_event_gives_the_status_code_reason_and_message() {
        let status = Message::default()
            .message(1, Message::default())
            .string(2, "Failure")
            .string(3, "too old resource version: 1 (42)")
            .string(4, "Expired")
            .varint(6, 410);
        let frame = watch_event("ERROR", &wrapped("Status", status));
        let event = read_watch_frame(&frame).expect("reads");
        assert_eq!(
            read_status(event.object),
            Ok(ProtobufStatus {
                status: "Failure".to_owned(),
                message: "too old resource version: 1 (42)".to_owned(),
                reason: "Expired".to_owned(),
                code: 410,
                details: None,
            })
        );
    }

    #[test]
    fn an_error_answer_gives_its_status_with_the_causes() {
        let cause = Message::default()
            .string(1, "FieldValueForbidden")
            .string(2, "Forbidden: sendInitialEvents is forbidden")
            .string(3, "sendInitialEvents");
        let details = Message::default()
            .string(1, "")
            .string(2, "meta.k8s.io")
            .string(3, "ListOptions")
            .message(4, cause)
            .varint(5, 0)
            .string(6, "");
        let status = Message::default()
            .message(1, Message::default())
            .string(2, "Failure")
            .string(3, "ListOptions.meta.k8s.io \"\" is invalid")
            .string(4, "Invalid")
            .message(5, details)
            .varint(6, 422);
        let read = read_status_body(&wrapped("Status", status))
            .expect("reads")
            .expect("a Status");
        assert_eq!((read.code, read.reason.as_str()), (422, "Invalid"));
        assert_eq!(read.message, "ListOptions.meta.k8s.io \"\" is invalid");
        let details = read.details.expect("details");
        assert_eq!(
            (details.group.as_str(), details.kind.as_str()),
            ("meta.k8s.io", "ListOptions")
        );
        assert_eq!(
            details.causes,
            [ProtobufStatusCause {
                reason: "FieldValueForbidden".to_owned(),
                message: "Forbidden: sendInitialEvents is forbidden".to_owned(),
                field: "sendInitialEvents".to_owned(),
            }]
        );

        // Another kind is not taken for a Status; a body not in the envelope is an error.
        let service = Message::default().message(1, Message::default().string(1, "web"));
        assert_eq!(read_status_body(&wrapped("Service", service)), Ok(None));
        assert_eq!(
            read_status_body(b"{\"kind\":\"Status\"}"),
            Err(ProtobufError::Magic)
        );
    }
}
