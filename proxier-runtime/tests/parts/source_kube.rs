//! Tests of `proxier_runtime::source::kube`.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use proxier_core::Change;
use proxier_runtime::source::{SourceBatch, describe};

use proxier_runtime::source::kube::*;

fn svc(name: &str, rv: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    }))
    .expect("a Service")
}

fn slice(name: &str, rv: &str) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                     "labels": {"kubernetes.io/service-name": "a"}},
        "addressType": "IPv4",
        "endpoints": [],
    }))
    .expect("an EndpointSlice")
}

fn node(name: &str, rv: &str) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    node.metadata.resource_version = Some(rv.into());
    node
}

fn names(batch: Option<SourceBatch>) -> Vec<String> {
    batch
        .map(|b| b.changes.iter().map(describe).collect())
        .unwrap_or_default()
}

#[test]
fn after_the_first_batch_relists_report_only_the_difference() {
    let mut state = KubeSourceState::default();
    for event in [
        Event::Init,
        Event::InitApply(svc("a", "1")),
        Event::InitApply(svc("b", "1")),
        Event::InitDone,
    ] {
        assert!(state.on_service(event).is_none(), "slices not listed yet");
    }
    assert_eq!(
        names(state.on_slice(Event::InitDone)),
        ["service upsert ns/a", "service upsert ns/b"]
    );
    assert_eq!(state.services.len(), 2, "keys and versions kept");

    // A relist: a unchanged, b changed, c new; then one without a.
    for event in [
        Event::Init,
        Event::InitApply(svc("a", "1")),
        Event::InitApply(svc("b", "2")),
        Event::InitApply(svc("c", "1")),
    ] {
        assert!(state.on_service(event).is_none());
    }
    assert_eq!(
        names(state.on_service(Event::InitDone)),
        ["service upsert ns/b", "service upsert ns/c"]
    );
    for event in [
        Event::Init,
        Event::InitApply(svc("b", "2")),
        Event::InitApply(svc("c", "1")),
    ] {
        state.on_service(event);
    }
    assert_eq!(
        names(state.on_service(Event::InitDone)),
        ["service delete ns/a"]
    );
}

#[test]
fn nothing_is_sent_until_services_and_slices_have_listed() {
    let mut st = KubeSourceState::default();
    assert!(st.on_service(Event::Init).is_none());
    assert!(st.on_service(Event::InitApply(svc("a", "1"))).is_none());
    assert!(
        st.on_service(Event::InitDone).is_none(),
        "slices not listed yet"
    );
    assert!(st.on_service(Event::Apply(svc("b", "2"))).is_none());
    assert!(st.on_node(Event::Apply(node("node-a", "1"))).is_none());
    assert!(!st.is_synced());
    assert!(st.on_slice(Event::Init).is_none());
    assert!(st.on_slice(Event::InitApply(slice("a-1", "3"))).is_none());
    let first = st.on_slice(Event::InitDone).expect("the first batch");
    assert!(st.is_synced());
    assert!(
        first
            .changes
            .iter()
            .any(|change| matches!(change, Change::UpsertNode(node) if node.eligible)),
        "the node, eligible"
    );
    assert_eq!(
        names(Some(first)),
        [
            "service upsert ns/a",
            "service upsert ns/b",
            "node update node-a",
            "slice upsert ns/a-1"
        ]
    );
    // After sync: a batch per change.
    assert_eq!(
        names(st.on_service(Event::Apply(svc("c", "4")))),
        ["service upsert ns/c"]
    );
    assert_eq!(
        names(st.on_slice(Event::Delete(slice("a-1", "5")))),
        ["slice delete ns/a-1"]
    );
    assert!(
        st.on_service(Event::Apply(svc("c", "4"))).is_none(),
        "nothing changed: nothing sent"
    );
}

#[test]
fn an_empty_cluster_still_sends_a_first_batch() {
    let mut st = KubeSourceState::default();
    st.on_service(Event::Init);
    st.on_service(Event::InitDone);
    st.on_slice(Event::Init);
    let first = st.on_slice(Event::InitDone).expect("the first batch");
    assert!(first.is_empty());
}

#[test]
fn relist_is_atomic_and_reported_as_a_diff() {
    let mut store = ObjectStore::<Service>::default();
    store.apply(Event::Init);
    store.apply(Event::InitApply(svc("keep", "1")));
    store.apply(Event::InitApply(svc("change", "1")));
    store.apply(Event::InitApply(svc("gone", "1")));
    assert_eq!(store.apply(Event::InitDone).len(), 3);

    // A relist starts (watch restarted after 410 Gone): the store keeps everything while
    // the list is in progress...
    store.apply(Event::Init);
    assert!(store.apply(Event::InitApply(svc("keep", "1"))).is_empty());
    assert_eq!(store.len(), 3, "no object forgotten mid-relist");
    // ...the relist fails midway and starts over: still nothing lost.
    store.apply(Event::Init);
    assert_eq!(store.len(), 3);
    store.apply(Event::InitApply(svc("keep", "1")));
    store.apply(Event::InitApply(svc("change", "7")));
    store.apply(Event::InitApply(svc("new", "8")));
    let changes = store.apply(Event::InitDone);
    let mut described: Vec<String> = changes
        .iter()
        .map(|c| match c {
            StoreChange::Upsert(s) => {
                format!("upsert {}", s.metadata.name.as_deref().unwrap_or(""))
            }
            StoreChange::Delete(key) => format!("delete {key}"),
        })
        .collect();
    described.sort();
    assert_eq!(
        described,
        vec!["delete ns/gone", "upsert change", "upsert new"]
    );
    assert_eq!(store.len(), 3);
}

#[test]
fn a_relist_in_any_order_with_an_object_twice_keeps_its_later_copy() {
    let version = |s: &Service| s.metadata.resource_version.clone().unwrap_or_default();
    let mut store = ObjectStore::<Service>::default();
    store.apply(Event::Init);
    for (name, rv) in [("c", "1"), ("a", "1"), ("b", "1"), ("a", "2")] {
        store.apply(Event::InitApply(svc(name, rv)));
    }
    let changes = store.apply(Event::InitDone);
    let upserts: Vec<(String, String)> = changes
        .iter()
        .map(|c| match c {
            StoreChange::Upsert(s) => (s.metadata.name.clone().unwrap_or_default(), version(s)),
            StoreChange::Delete(key) => panic!("nothing to delete: {key}"),
        })
        .collect();
    assert_eq!(
        upserts,
        [("a", "2"), ("b", "1"), ("c", "1")].map(|(n, v)| (n.to_string(), v.to_string())),
        "each object once, its later copy"
    );
    assert_eq!(store.len(), 3);
    // The store knows the later version: the watch's next event at that version is no change.
    assert!(store.apply(Event::Apply(svc("a", "2"))).is_empty());
    assert_eq!(store.apply(Event::Apply(svc("a", "1"))).len(), 1);
}

#[test]
fn unchanged_resource_version_is_not_a_change() {
    let mut store = ObjectStore::<Service>::default();
    store.apply(Event::Init);
    store.apply(Event::InitDone);
    assert_eq!(store.apply(Event::Apply(svc("a", "1"))).len(), 1);
    assert!(store.apply(Event::Apply(svc("a", "1"))).is_empty());
    assert_eq!(store.apply(Event::Apply(svc("a", "2"))).len(), 1);
}

#[test]
fn node_relist_without_the_node_reports_deletion() {
    let mut st = KubeSourceState::default();
    st.on_service(Event::Init);
    st.on_service(Event::InitDone);
    st.on_slice(Event::Init);
    st.on_slice(Event::InitDone);
    assert_eq!(
        names(st.on_node(Event::Apply(node("node-a", "1")))),
        vec!["node update node-a"]
    );
    st.on_node(Event::Init);
    let batch = st.on_node(Event::InitDone).expect("a batch");
    assert_eq!(names(Some(batch)), vec!["node deleted"]);
}

/// Metadata as the API server sends it: what the conversions read plus what they never read.
fn noisy_meta(
    name: &str,
    labels: serde_json::Value,
    annotations: serde_json::Value,
) -> serde_json::Value {
    let mut annotations = annotations;
    annotations["kubectl.kubernetes.io/last-applied-configuration"] = "{\"big\": \"blob\"}".into();
    serde_json::json!({
        "name": name, "namespace": "shop", "resourceVersion": "42", "uid": "0b0e",
        "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 3,
        "labels": labels, "annotations": annotations,
        "finalizers": ["example.com/keep"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "0b0f",
                             "controller": true, "blockOwnerDeletion": true}],
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                           "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
                           "fieldsType": "FieldsV1",
                           "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}}}],
    })
}

/// A LoadBalancer Service using every field `convert_service` reads, and others it never reads.
fn full_service(labels: serde_json::Value) -> Service {
    let mut meta = noisy_meta(
        "web",
        labels,
        serde_json::json!({"ipvs.proxier.io/scheduler": "wrr"}),
    );
    meta["labels"]["app.kubernetes.io/name"] = "web".into();
    serde_json::from_value(serde_json::json!({
        "metadata": meta,
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10"],
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080,
                 "nodePort": 30080, "appProtocol": "http"},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns", "nodePort": 30053},
            ],
            "externalIPs": ["192.0.2.7"],
            "loadBalancerSourceRanges": ["198.51.100.0/24"],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
            "externalTrafficPolicy": "Local",
            "internalTrafficPolicy": "Local",
            "healthCheckNodePort": 32000,
        },
        "status": {
            "loadBalancer": {"ingress": [
                {"ip": "203.0.113.5", "ipMode": "Proxy", "hostname": "lb.example",
                 "ports": [{"port": 80, "protocol": "TCP"}]},
                {"hostname": "only-a-name.example"},
            ]},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ok", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        },
    }))
    .expect("a Service")
}

#[test]
fn a_trimmed_service_converts_to_the_same_change_without_managed_fields() {
    use proxier_core::Change;
    use proxier_core::k8s::service_change;

    let full = full_service(serde_json::json!({}));
    let mut trimmed = full.clone();
    trim_service(&mut trimmed);

    let change = service_change(&full).expect("converts");
    // The test means something only if the conversion used what it reads.
    let Change::UpsertService(service) = &change else {
        panic!("expected an upsert, got {change:?}");
    };
    assert_eq!(service.cluster_ips.len(), 2);
    assert_eq!(service.ports.len(), 2);
    assert!(
        service.scheduler.is_some(),
        "the scheduler annotation is read"
    );
    assert_eq!(service.load_balancer_ingress.len(), 1);
    assert!(service.health_check_node_port.is_some());
    assert_eq!(service_change(&trimmed).expect("converts"), change);

    let meta = &trimmed.metadata;
    assert!(meta.managed_fields.is_none(), "managedFields dropped");
    assert!(meta.owner_references.is_none() && meta.finalizers.is_none());
    let annotations: Vec<_> = meta
        .annotations
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(annotations, ["ipvs.proxier.io/scheduler"]);
    assert!(meta.labels.is_none(), "no label the conversion reads");
    assert_eq!(meta.resource_version.as_deref(), Some("42"));
    let spec = trimmed.spec.as_ref().expect("spec");
    assert!(spec.selector.is_none());
    assert!(spec.ports.iter().flatten().all(|p| p.target_port.is_none()));
    assert!(
        trimmed
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.is_none())
    );
    let smaller = serde_json::to_vec(&trimmed).expect("json").len();
    assert!(smaller < serde_json::to_vec(&full).expect("json").len());

    // Services another proxy serves, or headless ones, stay skipped once trimmed.
    for label in [
        "service.kubernetes.io/service-proxy-name",
        "service.kubernetes.io/headless",
    ] {
        let full = full_service(serde_json::json!({label: "x"}));
        let mut trimmed = full.clone();
        trim_service(&mut trimmed);
        let skipped = service_change(&full).expect("converts");
        assert!(matches!(skipped, Change::DeleteService(_)), "{label}");
        assert_eq!(
            service_change(&trimmed).expect("converts"),
            skipped,
            "{label}"
        );
    }
}

#[test]
fn a_trimmed_endpoint_slice_converts_to_the_same_change_and_trigger_time() {
    use proxier_core::k8s::{slice_change, trigger_time};

    let meta = noisy_meta(
        "web-abc",
        serde_json::json!({"kubernetes.io/service-name": "web",
                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}),
        serde_json::json!({"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:01Z",
                           "ipvs.proxier.io/weights": "10.244.1.5=3"}),
    );
    let endpoint = |ip: &str, ready: bool, node: &str| {
        serde_json::json!({
            "addresses": [ip], "hostname": "pod",
            "conditions": {"ready": ready, "serving": true, "terminating": !ready},
            "nodeName": node, "zone": "zone-a",
            "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": node}]},
            "targetRef": {"kind": "Pod", "namespace": "shop", "name": format!("web-{ip}"), "uid": "0c0c"},
            "deprecatedTopology": {"kubernetes.io/hostname": node},
        })
    };
    let full: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": meta,
        "addressType": "IPv4",
        "endpoints": [endpoint("10.244.1.5", true, "node-a"), endpoint("10.244.2.6", false, "node-b")],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"},
                  {"name": "dns", "port": 53, "protocol": "UDP"}],
    }))
    .expect("an EndpointSlice");
    let mut trimmed = full.clone();
    trim_slice(&mut trimmed);

    let change = slice_change(&full).expect("converts").expect("not FQDN");
    let proxier_core::Change::UpsertSlice(converted) = &change else {
        panic!("expected a slice upsert, got {change:?}");
    };
    assert_eq!(
        converted.endpoints[0].weight,
        Some(3),
        "the weights annotation is read"
    );
    assert_eq!(converted.endpoints[0].zone_hints.len(), 1);
    assert_eq!(slice_change(&trimmed).expect("converts"), Some(change));
    assert!(trigger_time(&full).is_some());
    assert_eq!(trigger_time(&trimmed), trigger_time(&full));

    assert!(
        trimmed.metadata.managed_fields.is_none(),
        "managedFields dropped"
    );
    let labels: Vec<_> = trimmed
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(labels, ["kubernetes.io/service-name"]);
    assert_eq!(
        trimmed.metadata.annotations.as_ref().map(|a| a.len()),
        Some(2)
    );
    assert!(
        trimmed
            .endpoints
            .iter()
            .flatten()
            .all(|e| e.target_ref.is_none())
    );
}

#[test]
fn a_trimmed_node_gives_the_same_node_context_and_eligibility() {
    use proxier_core::k8s::{node_context, node_eligible};

    let mut meta = noisy_meta(
        "node-a",
        serde_json::json!({"topology.kubernetes.io/zone": "zone-a", "kubernetes.io/hostname": "node-a"}),
        serde_json::json!({"node.alpha.kubernetes.io/ttl": "0"}),
    );
    meta["namespace"] = serde_json::Value::Null;
    let node = |taint: &str| -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": meta,
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:244:1::/64"],
                     "providerID": "kind://docker/kind/node-a",
                     "taints": [{"key": taint, "effect": "NoSchedule"}]},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "192.0.2.10"},
                              {"type": "ExternalIP", "address": "198.51.100.10"},
                              {"type": "Hostname", "address": "node-a"}],
                "images": [{"names": ["registry.example/big:1"], "sizeBytes": 123456789}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "capacity": {"cpu": "8"}, "allocatable": {"cpu": "7"},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                             "kernelVersion": "6.12", "osImage": "x", "containerRuntimeVersion": "c",
                             "kubeletVersion": "v1.35.0", "kubeProxyVersion": "",
                             "operatingSystem": "linux", "architecture": "amd64"},
            },
        }))
        .expect("a Node")
    };
    for taint in ["example.com/dedicated", "ToBeDeletedByClusterAutoscaler"] {
        let full = node(taint);
        let mut trimmed = full.clone();
        trim_node(&mut trimmed);
        let context = node_context(&full).expect("converts");
        assert_eq!(context.primary_ips.len(), 1);
        assert_eq!(context.pod_cidrs.len(), 2);
        assert_eq!(
            node_context(&trimmed).expect("converts"),
            context,
            "{taint}"
        );
        assert_eq!(node_eligible(&trimmed), node_eligible(&full), "{taint}");
        assert!(trimmed.metadata.managed_fields.is_none());
        assert!(trimmed.metadata.annotations.is_none());
        let status = trimmed.status.as_ref().expect("status");
        assert!(status.images.is_none() && status.node_info.is_none());
    }
}
