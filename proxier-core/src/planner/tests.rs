#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use super::*;
use crate::desired::Protocol;
use crate::desired::netfilter::{AddrPort, ProtoPort};
use crate::model::{EndpointPort, ServiceName, SliceKey};
use crate::state::Change;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn rs(address: &str, port: u16) -> RealServerKey {
    RealServerKey {
        address: ip(address),
        port,
    }
}

fn vs(address: &str, port: u16, protocol: Protocol) -> VirtualServerKey {
    VirtualServerKey {
        address: ip(address),
        port,
        protocol,
    }
}

fn at(address: &str, protocol: Protocol, port: u16) -> AddrPort {
    AddrPort {
        address: ip(address),
        protocol,
        port,
    }
}

fn endpoint(address: &str, node: &str) -> Endpoint {
    let mut endpoint = Endpoint::ready(ip(address));
    endpoint.node_name = Some(Arc::from(node));
    endpoint
}

fn slice(name: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        key: SliceKey::new("default", name),
        service: ServiceName::new("default", "web"),
        ports: vec![
            EndpointPort {
                name: "http".into(),
                port: 8080,
                protocol: Protocol::Tcp,
            },
            EndpointPort {
                name: "dns".into(),
                port: 5353,
                protocol: Protocol::Udp,
            },
        ],
        endpoints,
        warnings: Vec::new(),
        trigger_time: None,
    }
}

/// Node `node-a` holds 192.168.1.10 and fd00:1::10; both families are proxied.
fn node() -> NodeContext {
    NodeContext::new(
        "node-a",
        vec![ip("192.168.1.10"), ip("fd00:1::10")],
        vec![ip("192.168.1.10"), ip("fd00:1::10")],
    )
}

fn dual_stack() -> Config {
    Config {
        families: BTreeSet::from([AddressFamily::V4, AddressFamily::V6]),
        ..Config::default()
    }
}

/// A dual-stack `externalTrafficPolicy: Local` Service with an HTTP NodePort and a DNS
/// port, one ExternalIP the node holds itself and one it does not, endpoints on this node
/// in both families and one on another node.
fn web_state() -> ClusterState {
    let mut web = Service::new(
        ServiceName::new("default", "web"),
        vec![ip("10.96.0.10"), ip("fd00:96::10")],
        vec![
            ServicePortSpec {
                name: "http".into(),
                port: 80,
                protocol: Protocol::Tcp,
                node_port: Some(30080),
            },
            ServicePortSpec {
                name: "dns".into(),
                port: 53,
                protocol: Protocol::Udp,
                node_port: None,
            },
        ],
    );
    web.external_ips = vec![ip("203.0.113.7"), ip("192.168.1.10")];
    web.external_traffic_policy = TrafficPolicy::Local;
    web.health_check_node_port = Some(32000);
    let mut state = ClusterState::new();
    state.apply(Change::UpsertService(web));
    state.apply(Change::UpsertSlice(slice(
        "web-v4",
        vec![
            endpoint("10.244.1.2", "node-a"),
            endpoint("10.244.2.3", "node-b"),
        ],
    )));
    state.apply(Change::UpsertSlice(slice(
        "web-v6",
        vec![endpoint("fd00:244:1::2", "node-a")],
    )));
    state
}

#[test]
fn one_pass_over_a_service_plans_its_ports_netfilter_elements_and_health_check() {
    let (state, node, config) = (web_state(), node(), dual_stack());
    let web = state.service(&ServiceName::new("default", "web")).unwrap();
    let plan = Planner::new(&node, &config).plan_service(&state, web);

    // IPVS: each port as planned alone, with what the semantics ask for.
    let http = web.name.port("http", Protocol::Tcp);
    let dns = web.name.port("dns", Protocol::Udp);
    assert_eq!(
        plan.ports.keys().cloned().collect::<Vec<_>>(),
        vec![dns.clone(), http.clone()]
    );
    for name in [&http, &dns] {
        assert_eq!(
            plan.ports.get(name),
            plan_service_port(&state, name, &node, &config).as_ref()
        );
    }
    let reals = |port: &ServicePortName, key: VirtualServerKey| {
        plan.ports[port].virtual_servers[&key]
            .real_servers
            .keys()
            .copied()
            .collect::<Vec<_>>()
    };
    // The ClusterIP serves every endpoint of its family; the ExternalIPs (Local) only
    // this node's.
    assert_eq!(
        reals(&http, vs("10.96.0.10", 80, Protocol::Tcp)),
        vec![rs("10.244.1.2", 8080), rs("10.244.2.3", 8080)]
    );
    assert_eq!(
        reals(&http, vs("fd00:96::10", 80, Protocol::Tcp)),
        vec![rs("fd00:244:1::2", 8080)]
    );
    assert_eq!(
        reals(&http, vs("203.0.113.7", 80, Protocol::Tcp)),
        vec![rs("10.244.1.2", 8080)]
    );
    assert_eq!(
        reals(&dns, vs("10.96.0.10", 53, Protocol::Udp)),
        vec![rs("10.244.1.2", 5353), rs("10.244.2.3", 5353)]
    );
    assert_eq!(
        plan.ports[&http].node_owned_addresses,
        BTreeSet::from([ip("192.168.1.10")])
    );
    // Decided from the Service alone: what its ports' plans bind, not the node's address.
    let bound: BTreeSet<IpAddr> = Planner::new(&node, &config)
        .bound_addresses(web)
        .into_iter()
        .collect();
    let planned: BTreeSet<IpAddr> = (plan.ports.values())
        .flat_map(ServicePortPlan::bound_addresses)
        .collect();
    assert_eq!(bound, planned);
    assert!(!bound.contains(&ip("192.168.1.10")), "{bound:?}");

    // nftables: what the Service alone contributes.
    assert_eq!(
        plan.netfilter,
        crate::netfilter::plan_of_service(&state, web, &node, &config)
    );
    assert_eq!(
        plan.netfilter,
        crate::netfilter::plan(&state, &node, &config)
    );
    let v4 = plan.netfilter.v4.as_ref().unwrap();
    let v6 = plan.netfilter.v6.as_ref().unwrap();
    // Hairpin: this node's endpoints of each family, for each port; not node-b's.
    assert_eq!(
        v4.hairpin,
        BTreeSet::from([
            at("10.244.1.2", Protocol::Tcp, 8080),
            at("10.244.1.2", Protocol::Udp, 5353),
        ])
    );
    assert_eq!(
        v6.hairpin,
        BTreeSet::from([
            at("fd00:244:1::2", Protocol::Tcp, 8080),
            at("fd00:244:1::2", Protocol::Udp, 5353),
        ])
    );
    // The ExternalIP the node holds is not bound on the dummy link, as in the IPVS plan.
    assert_eq!(
        v4.bound_ips,
        BTreeSet::from([ip("10.96.0.10"), ip("203.0.113.7")])
    );
    assert_eq!(v6.bound_ips, BTreeSet::from([ip("fd00:96::10")]));
    assert_eq!(
        v4.external_ips_local,
        BTreeSet::from([
            at("192.168.1.10", Protocol::Tcp, 80),
            at("192.168.1.10", Protocol::Udp, 53),
            at("203.0.113.7", Protocol::Tcp, 80),
            at("203.0.113.7", Protocol::Udp, 53),
        ])
    );
    assert!(v4.external_ips.is_empty());
    let node_port = ProtoPort {
        protocol: Protocol::Tcp,
        port: 30080,
    };
    assert_eq!(v4.node_ports_local, BTreeSet::from([node_port]));
    assert_eq!(v6.node_ports_local, BTreeSet::from([node_port]));
    assert_eq!(v4.health_check_node_ports, BTreeSet::from([32000]));

    // Health: two ready endpoints on this node (one per family), so the check passes and
    // the Service is not counted as lacking local endpoints.
    assert_eq!(
        plan.health_check,
        Some(HealthCheck {
            node_port: 32000,
            local_endpoints: 2,
        })
    );
    assert_eq!(
        plan.health_check,
        crate::health_check::health_check_of(&state, web, &node)
    );
    assert_eq!(plan.no_local_endpoints, NoLocalEndpoints::default());
}

#[test]
fn a_service_of_an_unproxied_family_plans_no_port_and_no_element() {
    let state = web_state();
    let node = node();
    let config = Config {
        families: BTreeSet::from([AddressFamily::V4]),
        ..Config::default()
    };
    let mut v6_only = state
        .service(&ServiceName::new("default", "web"))
        .unwrap()
        .clone();
    v6_only.cluster_ips = vec![ip("fd00:96::10")];
    v6_only.external_ips = Vec::new();
    let plan = Planner::new(&node, &config).plan_service(&state, &v6_only);
    assert!(plan.ports.is_empty());
    assert_eq!(plan.netfilter, empty_plan(&config));
    // Health checks do not depend on the family: the Service's endpoints are all counted.
    assert_eq!(
        plan.health_check,
        crate::health_check::health_check_of(&state, &v6_only, &node)
    );
}
