//! Tests of `proxier_bin::source::kube`.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use proxier_bin::source::{ObjectKey, SourceEvent};

use proxier_bin::source::kube::*;

fn svc(name: &str, rv: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some(rv.into()),
            ..ObjectMeta::default()
        },
        ..Service::default()
    }
}

#[test]
fn after_the_snapshot_the_stores_keep_only_versions_and_relists_still_diff() {
    let mut state = KubeSourceState::default();
    for event in [
        Event::Init,
        Event::InitApply(svc("a", "1")),
        Event::InitApply(svc("b", "1")),
        Event::InitDone,
    ] {
        state.on_service(event);
    }
    let events = state.on_slice(Event::InitDone);
    assert!(matches!(events.as_slice(), [SourceEvent::Snapshot(s)] if s.services.len() == 2));
    assert!(state.services.objects().is_empty(), "objects forgotten");
    assert_eq!(state.services.len(), 2, "keys and versions kept");

    // A relist: a unchanged, b changed, c new; then one without a, whose delete carries
    // its key.
    for event in [
        Event::Init,
        Event::InitApply(svc("a", "1")),
        Event::InitApply(svc("b", "2")),
        Event::InitApply(svc("c", "1")),
    ] {
        assert!(state.on_service(event).is_empty());
    }
    assert_eq!(
        names(&state.on_service(Event::InitDone)),
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
        names(&state.on_service(Event::InitDone)),
        ["service delete ns/a"]
    );
    assert!(state.services.objects().is_empty());
}

fn slice(name: &str, rv: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some(rv.into()),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        ..EndpointSlice::default()
    }
}

fn names(events: &[SourceEvent]) -> Vec<String> {
    events.iter().map(SourceEvent::describe).collect()
}

#[test]
fn nothing_is_sent_until_services_and_slices_have_listed() {
    let mut st = KubeSourceState::default();
    assert!(st.on_service(Event::Init).is_empty());
    assert!(st.on_service(Event::InitApply(svc("a", "1"))).is_empty());
    assert!(
        st.on_service(Event::InitDone).is_empty(),
        "slices not listed yet"
    );
    assert!(st.on_service(Event::Apply(svc("b", "2"))).is_empty());
    assert!(st.on_node(Event::Apply(Node::default())).is_empty());
    assert!(!st.is_synced());
    assert!(st.on_slice(Event::Init).is_empty());
    assert!(st.on_slice(Event::InitApply(slice("a-1", "3"))).is_empty());
    let events = st.on_slice(Event::InitDone);
    assert!(st.is_synced());
    assert_eq!(events.len(), 1);
    match &events[0] {
        SourceEvent::Snapshot(s) => {
            assert_eq!(s.services.len(), 2);
            assert_eq!(s.endpoint_slices.len(), 1);
            assert!(s.node.is_some());
        }
        other => panic!("expected snapshot, got {}", other.describe()),
    }
    // After sync: incremental events.
    let events = st.on_service(Event::Apply(svc("c", "4")));
    assert_eq!(names(&events), vec!["service upsert ns/c"]);
    let events = st.on_slice(Event::Delete(slice("a-1", "5")));
    assert_eq!(names(&events), vec!["slice delete ns/a-1"]);
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
    store.apply(Event::InitApply(svc("keep", "1")));
    assert_eq!(store.objects().len(), 3, "no object forgotten mid-relist");
    // ...the relist fails midway and starts over: still nothing lost.
    store.apply(Event::Init);
    assert_eq!(store.objects().len(), 3);
    store.apply(Event::InitApply(svc("keep", "1")));
    store.apply(Event::InitApply(svc("change", "7")));
    store.apply(Event::InitApply(svc("new", "8")));
    let changes = store.apply(Event::InitDone);
    let mut described: Vec<String> = changes
        .iter()
        .map(|c| match c {
            StoreChange::Upsert(s) => format!("upsert {}", ObjectKey::of(&s.metadata)),
            StoreChange::Delete(s) => format!("delete {}", ObjectKey::of(&s.metadata)),
        })
        .collect();
    described.sort();
    assert_eq!(
        described,
        vec!["delete ns/gone", "upsert ns/change", "upsert ns/new"]
    );
    assert_eq!(store.objects().len(), 3);
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
fn delete_reports_the_last_known_state() {
    let mut store = ObjectStore::<Service>::default();
    let mut known = svc("a", "1");
    known.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
        cluster_ip: Some("10.96.0.9".into()),
        ..Default::default()
    });
    store.apply(Event::Apply(known));
    // A delete event may carry a stripped object; the store's copy is reported.
    let changes = store.apply(Event::Delete(svc("a", "2")));
    match &changes[..] {
        [StoreChange::Delete(s)] => assert_eq!(
            s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
            Some("10.96.0.9")
        ),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn node_relist_without_the_node_reports_deletion() {
    let mut st = KubeSourceState::default();
    st.on_service(Event::Init);
    st.on_service(Event::InitDone);
    st.on_slice(Event::Init);
    st.on_slice(Event::InitDone);
    let mut node = Node::default();
    node.metadata.name = Some("node-a".into());
    node.metadata.resource_version = Some("1".into());
    assert_eq!(
        names(&st.on_node(Event::Apply(node))),
        vec!["node update node-a"]
    );
    st.on_node(Event::Init);
    assert_eq!(names(&st.on_node(Event::InitDone)), vec!["node deleted"]);
}
