//! Tests of `proxier_runtime::source::kube`.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
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
    assert_eq!(first.node_eligible, Some(true));
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
    assert_eq!(batch.node_eligible, Some(false));
    assert_eq!(names(Some(batch)), vec!["node deleted"]);
}
