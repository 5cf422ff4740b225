#![allow(clippy::unwrap_used)]

use super::*;
use crate::desired::{
    RealServer, RealServerKey, Scheduler, ServicePortName, SortedMap, VirtualServer,
    VirtualServerKey, VirtualServerRole,
};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// UDP from 10.0.0.1:40000 to the Service at 10.96.0.10:53, answered by 10.244.0.5:53.
fn flow() -> ConntrackFlow {
    ConntrackFlow {
        protocol: 17,
        zone: 0,
        original: FlowTuple {
            source: sa("10.0.0.1:40000"),
            destination: sa("10.96.0.10:53"),
        },
        reply: FlowTuple {
            source: sa("10.244.0.5:53"),
            destination: sa("10.0.0.1:40000"),
        },
    }
}

#[test]
fn filters_match_on_every_given_field() {
    let f = flow();
    let removed = FlowFilter::to_removed_endpoint(sa("10.96.0.10:53"), sa("10.244.0.5:53"));
    assert!(removed.matches(&f));
    let other_endpoint = FlowFilter::to_removed_endpoint(sa("10.96.0.10:53"), sa("10.244.0.6:53"));
    assert!(!other_endpoint.matches(&f));
    // Same endpoint behind another Service: not this filter's business.
    let other_service = FlowFilter::to_removed_endpoint(sa("10.96.0.11:53"), sa("10.244.0.5:53"));
    assert!(!other_service.matches(&f));
    assert!(FlowFilter::to_service(sa("10.96.0.10:53")).matches(&f));
    assert!(!FlowFilter::to_service(sa("10.96.0.10:54")).matches(&f));
    let mut tcp = f;
    tcp.protocol = 6;
    assert!(!removed.matches(&tcp), "only UDP entries are deleted");
}

fn udp_plan(vip: &str, port: u16, endpoints: &[&str]) -> ServicePortPlan {
    let key = VirtualServerKey {
        address: vip.parse().unwrap(),
        port,
        protocol: Protocol::Udp,
    };
    let real_servers: SortedMap<RealServerKey, RealServer> = endpoints
        .iter()
        .map(|e| {
            let a = sa(e);
            (
                RealServerKey {
                    address: a.ip(),
                    port: a.port(),
                },
                RealServer::default(),
            )
        })
        .collect();
    let mut plan = ServicePortPlan::default();
    plan.virtual_servers.insert(
        key,
        VirtualServer {
            role: VirtualServerRole::ClusterIp,
            scheduler: Scheduler::RoundRobin,
            persistence_timeout: None,
            hash_source_port: false,
            real_servers,
        },
    );
    plan
}

#[test]
fn replaced_endpoint_is_stale_and_the_new_one_is_not() {
    let old = udp_plan("10.96.0.10", 53, &["10.244.0.5:53"]);
    let new = udp_plan("10.96.0.10", 53, &["10.244.0.6:53"]);
    let stale = stale_udp_flows_of_port(Some(&old), Some(&new));
    assert_eq!(
        stale,
        BTreeSet::from([FlowFilter::to_removed_endpoint(
            sa("10.96.0.10:53"),
            sa("10.244.0.5:53")
        )])
    );
}

#[test]
fn first_endpoint_clears_flows_to_the_service() {
    let old = udp_plan("10.96.0.10", 53, &[]);
    let new = udp_plan("10.96.0.10", 53, &["10.244.0.6:53"]);
    assert_eq!(
        stale_udp_flows_of_port(Some(&old), Some(&new)),
        BTreeSet::from([FlowFilter::to_service(sa("10.96.0.10:53"))])
    );
    // A brand-new Service port too.
    assert_eq!(
        stale_udp_flows_of_port(None, Some(&new)),
        BTreeSet::from([FlowFilter::to_service(sa("10.96.0.10:53"))])
    );
}

#[test]
fn deleted_service_stales_all_its_endpoints_and_unchanged_is_quiet() {
    let old = udp_plan("10.96.0.10", 53, &["10.244.0.5:53", "10.244.0.6:53"]);
    assert_eq!(stale_udp_flows_of_port(Some(&old), None).len(), 2);
    assert!(stale_udp_flows_of_port(Some(&old), Some(&old)).is_empty());
}

#[test]
fn tcp_changes_never_stale_flows() {
    let mut old = udp_plan("10.96.0.10", 80, &["10.244.0.5:80"]);
    let (key, vs) = old.virtual_servers.pop_first().unwrap();
    old.virtual_servers.insert(
        VirtualServerKey {
            protocol: Protocol::Tcp,
            ..key
        },
        vs,
    );
    assert!(stale_udp_flows_of_port(Some(&old), None).is_empty());
}

#[test]
fn whole_plan_diff_covers_every_port() {
    let name = |n: &str| ServicePortName {
        namespace: "default".into(),
        name: n.into(),
        port: "dns".into(),
        protocol: Protocol::Udp,
    };
    let mut old = Desired::default();
    old.services
        .insert(name("a"), udp_plan("10.96.0.10", 53, &["10.244.0.5:53"]));
    old.services
        .insert(name("gone"), udp_plan("10.96.0.12", 53, &["10.244.0.9:53"]));
    let mut new = Desired::default();
    new.services
        .insert(name("a"), udp_plan("10.96.0.10", 53, &["10.244.0.5:53"]));
    new.services
        .insert(name("b"), udp_plan("10.96.0.11", 53, &["10.244.0.7:53"]));
    assert_eq!(
        stale_udp_flows(&old, &new),
        BTreeSet::from([
            FlowFilter::to_service(sa("10.96.0.11:53")),
            FlowFilter::to_removed_endpoint(sa("10.96.0.12:53"), sa("10.244.0.9:53")),
        ])
    );
}
