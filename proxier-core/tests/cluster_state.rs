//! Change tracking of the cluster state: which Service ports each change dirties.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::sync::Arc;

use proxier_core::desired::Protocol;
use proxier_core::model::{
    Endpoint, EndpointPort, EndpointSlice, ModelWarning, ObjectKind, ObjectRef, Service,
    ServiceName, ServicePortSpec, SliceKey,
};
use proxier_core::{Change, ClusterState, DirtyPorts, ServicePortName};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn port(name: &str, number: u16) -> ServicePortSpec {
    ServicePortSpec {
        name: name.into(),
        port: number,
        protocol: Protocol::Tcp,
        node_port: None,
    }
}

fn service(name: &str, ports: Vec<ServicePortSpec>) -> Service {
    Service::new(ServiceName::new("ns", name), vec![ip("10.96.0.1")], ports)
}

fn slice(service: &str, name: &str, addresses: &[&str]) -> EndpointSlice {
    EndpointSlice {
        key: SliceKey::new("ns", name),
        service: ServiceName::new("ns", service),
        ports: vec![EndpointPort {
            name: "http".into(),
            port: 8080,
            protocol: Protocol::Tcp,
        }],
        endpoints: addresses
            .iter()
            .map(|a| {
                let mut e = Endpoint::ready(ip(a));
                e.node_name = Some(Arc::from(format!("node-{a}")));
                e
            })
            .collect(),
        warnings: Vec::new(),
        trigger_time: None,
    }
}

fn names(service: &str, ports: &[&str]) -> DirtyPorts {
    ports
        .iter()
        .map(|p| ServicePortName {
            namespace: "ns".into(),
            name: service.into(),
            port: (*p).into(),
            protocol: Protocol::Tcp,
        })
        .collect()
}

#[test]
fn service_changes_dirty_old_and_new_ports() {
    let mut st = ClusterState::new();
    assert_eq!(
        st.apply(Change::UpsertService(service(
            "a",
            vec![port("http", 80), port("admin", 9000)]
        ))),
        names("a", &["http", "admin"])
    );
    // A renamed port: both the removed and the added name must be re-planned.
    assert_eq!(
        st.apply(Change::UpsertService(service(
            "a",
            vec![port("http", 80), port("metrics", 9100)]
        ))),
        names("a", &["http", "admin", "metrics"])
    );
    assert_eq!(
        st.apply(Change::DeleteService(ServiceName::new("ns", "a"))),
        names("a", &["http", "metrics"])
    );
    assert!(
        st.apply(Change::DeleteService(ServiceName::new("ns", "a")))
            .is_empty()
    );
    assert_eq!(st.service_count(), 0);
}

#[test]
fn slice_changes_dirty_only_their_service() {
    let mut st = ClusterState::new();
    st.apply(Change::UpsertService(service("a", vec![port("http", 80)])));
    st.apply(Change::UpsertService(service("b", vec![port("http", 80)])));
    assert_eq!(
        st.apply(Change::UpsertSlice(slice("a", "a-1", &["10.1.0.1"]))),
        names("a", &["http"])
    );
    assert_eq!(
        st.apply(Change::UpsertSlice(slice("a", "a-1", &["10.1.0.2"]))),
        names("a", &["http"])
    );
    assert!(
        st.apply(Change::UpsertSlice(slice("a", "a-1", &["10.1.0.2"])))
            .is_empty()
    );
    // Moving the slice to Service b dirties both.
    let mut dirty = names("a", &["http"]);
    dirty.extend(names("b", &["http"]));
    assert_eq!(
        st.apply(Change::UpsertSlice(slice("b", "a-1", &["10.1.0.2"]))),
        dirty
    );
    assert_eq!(st.slices_of(&ServiceName::new("ns", "a")).count(), 0);
    assert_eq!(st.slices_of(&ServiceName::new("ns", "b")).count(), 1);
    assert_eq!(
        st.apply(Change::DeleteSlice(SliceKey::new("ns", "a-1"))),
        names("b", &["http"])
    );
    assert!(
        st.apply(Change::DeleteSlice(SliceKey::new("ns", "a-1")))
            .is_empty()
    );
}

#[test]
fn slices_are_kept_in_name_order() {
    let mut st = ClusterState::new();
    for name in ["a-3", "a-1", "a-2"] {
        st.apply(Change::UpsertSlice(slice("a", name, &["10.1.0.1"])));
    }
    let order: Vec<String> = st
        .slices_of(&ServiceName::new("ns", "a"))
        .map(|s| s.key.name.to_string())
        .collect();
    assert_eq!(order, ["a-1", "a-2", "a-3"]);
}

#[test]
fn node_names_are_shared_between_endpoints() {
    let mut st = ClusterState::new();
    st.apply(Change::UpsertSlice(slice("a", "a-1", &["10.1.0.1"])));
    let mut other = slice("b", "b-1", &["10.1.0.1"]);
    // Same node name, separately allocated.
    other.endpoints[0].node_name = Some(Arc::from("node-10.1.0.1"));
    st.apply(Change::UpsertSlice(other));
    let a = st.slices_of(&ServiceName::new("ns", "a")).next().unwrap();
    let b = st.slices_of(&ServiceName::new("ns", "b")).next().unwrap();
    let (na, nb) = (
        a.endpoints[0].node_name.as_ref().unwrap(),
        b.endpoints[0].node_name.as_ref().unwrap(),
    );
    assert!(Arc::ptr_eq(na, nb));
}

#[test]
fn warnings_of_objects_in_the_state_are_listed() {
    let mut st = ClusterState::new();
    let mut s = service("a", vec![port("http", 80)]);
    s.warnings.push(ModelWarning::InvalidScheduler {
        object: ObjectRef::new(ObjectKind::Service, "ns", "a"),
        value: "bogus".into(),
    });
    st.apply(Change::UpsertService(s));
    assert_eq!(st.warnings().count(), 1);
    st.apply(Change::DeleteService(ServiceName::new("ns", "a")));
    assert_eq!(st.warnings().count(), 0);
}
