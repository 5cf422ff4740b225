#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::*;
use crate::model::{
    AddressFamily, Endpoint, EndpointPort, EndpointSlice, IpMode, LoadBalancerIngress, Protocol,
    ServiceName, ServicePortSpec, SliceKey, TrafficPolicy,
};
use crate::state::Change;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ap(address: &str, protocol: Protocol, port: u16) -> AddrPort {
    AddrPort {
        address: ip(address),
        protocol,
        port,
    }
}

fn node() -> NodeContext {
    NodeContext::new(
        "node-a",
        vec![ip("192.168.1.10"), ip("fd00:1::10")],
        vec![ip("192.168.1.10"), ip("fd00:1::10"), ip("172.16.0.1")],
    )
}

fn port(name: &str, number: u16, protocol: Protocol, node_port: Option<u16>) -> ServicePortSpec {
    ServicePortSpec {
        name: name.into(),
        port: number,
        protocol,
        node_port,
    }
}

fn web() -> Service {
    Service::new(
        ServiceName::new("default", "web"),
        vec![ip("10.96.0.10")],
        vec![port("http", 80, Protocol::Tcp, Some(30080))],
    )
}

fn slice(
    service: &str,
    endpoints: Vec<Endpoint>,
    target: u16,
    protocol: Protocol,
) -> EndpointSlice {
    EndpointSlice {
        key: SliceKey::new("default", format!("{service}-1")),
        service: ServiceName::new("default", service),
        ports: vec![EndpointPort {
            name: "http".into(),
            port: target,
            protocol,
        }],
        endpoints,
        warnings: Vec::new(),
        trigger_time: None,
    }
}

fn endpoint_on(address: &str, node: Option<&str>) -> Endpoint {
    let mut ep = Endpoint::ready(ip(address));
    ep.node_name = node.map(Arc::from);
    ep
}

fn state_of(services: Vec<Service>, slices: Vec<EndpointSlice>) -> ClusterState {
    let mut state = ClusterState::new();
    for s in services {
        state.apply(Change::UpsertService(s));
    }
    for s in slices {
        state.apply(Change::UpsertSlice(s));
    }
    state
}

fn v4(plan: &NetfilterPlan) -> &FamilyPlan {
    plan.v4.as_ref().unwrap()
}

#[test]
fn cluster_ip_is_in_cluster_and_service_sets_and_bound() {
    let state = state_of(vec![web()], vec![]);
    let plan = plan(&state, &node(), &Config::default());
    let p = v4(&plan);
    assert_eq!(
        p.cluster_ips,
        BTreeSet::from([ap("10.96.0.10", Protocol::Tcp, 80)])
    );
    assert_eq!(p.bound_ips, BTreeSet::from([ip("10.96.0.10")]));
    // No IPv6 ClusterIP: the IPv6 table exists (the family is proxied) but is empty.
    assert_eq!(plan.v6.as_ref().unwrap().element_count(), 0);
}

#[test]
fn etp_cluster_node_port_is_masqueraded_and_etp_local_is_not() {
    let mut local = web();
    local.name = ServiceName::new("default", "local");
    local.cluster_ips = vec![ip("10.96.0.11")];
    local.ports = vec![port("dns", 53, Protocol::Udp, Some(30053))];
    local.external_traffic_policy = TrafficPolicy::Local;
    let state = state_of(vec![web(), local], vec![]);
    let p = plan(&state, &node(), &Config::default());
    let p = v4(&p);
    let cluster = ProtoPort {
        protocol: Protocol::Tcp,
        port: 30080,
    };
    let local = ProtoPort {
        protocol: Protocol::Udp,
        port: 30053,
    };
    assert_eq!(p.node_ports, BTreeSet::from([cluster]));
    assert_eq!(p.node_ports_local, BTreeSet::from([local]));
    assert!(
        !p.node_ports.contains(&local),
        "an eTP=Local NodePort must not be masqueraded"
    );
}

#[test]
fn external_and_lb_ips_split_by_traffic_policy() {
    let mut cluster = web();
    cluster.external_ips = vec![ip("203.0.113.5")];
    cluster.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: ip("198.51.100.7"),
        ip_mode: IpMode::Vip,
    }];
    let mut local = cluster.clone();
    local.name = ServiceName::new("default", "local");
    local.cluster_ips = vec![ip("10.96.0.11")];
    local.external_ips = vec![ip("203.0.113.6")];
    local.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: ip("198.51.100.8"),
        ip_mode: IpMode::Vip,
    }];
    local.external_traffic_policy = TrafficPolicy::Local;
    let state = state_of(vec![cluster, local], vec![]);
    let p = plan(&state, &node(), &Config::default());
    let p = v4(&p);
    assert_eq!(
        p.external_ips,
        BTreeSet::from([ap("203.0.113.5", Protocol::Tcp, 80)])
    );
    assert_eq!(
        p.external_ips_local,
        BTreeSet::from([ap("203.0.113.6", Protocol::Tcp, 80)])
    );
    assert_eq!(
        p.load_balancer_ips,
        BTreeSet::from([ap("198.51.100.7", Protocol::Tcp, 80)])
    );
    assert_eq!(
        p.load_balancer_ips_local,
        BTreeSet::from([ap("198.51.100.8", Protocol::Tcp, 80)])
    );
    for addr in ["203.0.113.5", "203.0.113.6", "198.51.100.7", "198.51.100.8"] {
        assert!(p.bound_ips.contains(&ip(addr)), "{addr} should be bound");
    }
}

#[test]
fn proxy_mode_lb_ingress_is_ignored() {
    let mut svc = web();
    svc.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: ip("198.51.100.9"),
        ip_mode: IpMode::Proxy,
    }];
    let p = plan(&state_of(vec![svc], vec![]), &node(), &Config::default());
    let p = v4(&p);
    assert!(p.load_balancer_ips.is_empty());
    assert!(!p.bound_ips.contains(&ip("198.51.100.9")));
}

#[test]
fn node_owned_external_ip_is_served_but_not_bound() {
    let mut svc = web();
    svc.external_ips = vec![ip("172.16.0.1")];
    let p = plan(&state_of(vec![svc], vec![]), &node(), &Config::default());
    let p = v4(&p);
    assert!(
        p.external_ips
            .contains(&ap("172.16.0.1", Protocol::Tcp, 80))
    );
    assert!(
        !p.bound_ips.contains(&ip("172.16.0.1")),
        "a node address must never be in the reject-other-ports set"
    );
}

#[test]
fn source_ranges_aggregate_and_allow_node_when_a_range_holds_its_ip() {
    let mut svc = web();
    svc.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: ip("198.51.100.7"),
        ip_mode: IpMode::Vip,
    }];
    svc.load_balancer_source_ranges = vec![
        net("192.168.1.0/24"),
        net("192.168.1.128/25"), // inside the /24: merged away
        net("10.0.0.0/8"),
        net("fd00::/8"), // other family
    ];
    let p = plan(&state_of(vec![svc], vec![]), &node(), &Config::default());
    let p = v4(&p);
    let target = ap("198.51.100.7", Protocol::Tcp, 80);
    assert_eq!(p.firewalled, BTreeSet::from([target]));
    let ranges: BTreeSet<IpNet> = p.source_ranges.iter().map(|r| r.source).collect();
    assert_eq!(
        ranges,
        BTreeSet::from([net("10.0.0.0/8"), net("192.168.1.0/24")])
    );
    assert!(p.source_ranges.iter().all(|r| r.target == target));
    assert_eq!(
        p.node_allowed,
        BTreeSet::from([target]),
        "node IP 192.168.1.10 is in range"
    );
}

#[test]
fn source_ranges_without_node_ip_block_the_node() {
    let mut svc = web();
    svc.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: ip("198.51.100.7"),
        ip_mode: IpMode::Vip,
    }];
    svc.load_balancer_source_ranges = vec![net("10.1.0.0/16")];
    let p = plan(&state_of(vec![svc], vec![]), &node(), &Config::default());
    let p = v4(&p);
    assert_eq!(p.firewalled.len(), 1);
    assert!(p.node_allowed.is_empty());
}

#[test]
fn zero_prefix_range_means_open() {
    let mut svc = web();
    svc.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: ip("198.51.100.7"),
        ip_mode: IpMode::Vip,
    }];
    svc.load_balancer_source_ranges = vec![net("10.1.0.0/16"), net("0.0.0.0/0")];
    let p = plan(&state_of(vec![svc], vec![]), &node(), &Config::default());
    assert!(v4(&p).firewalled.is_empty());
    assert!(v4(&p).source_ranges.is_empty());
}

#[test]
fn ranges_of_the_other_family_only_fail_closed() {
    let mut svc = web();
    svc.cluster_ips = vec![ip("10.96.0.10"), ip("fd00:96::10")];
    svc.load_balancer_ingress = vec![
        LoadBalancerIngress {
            ip: ip("198.51.100.7"),
            ip_mode: IpMode::Vip,
        },
        LoadBalancerIngress {
            ip: ip("2001:db8::7"),
            ip_mode: IpMode::Vip,
        },
    ];
    svc.load_balancer_source_ranges = vec![net("10.1.0.0/16")];
    let p = plan(&state_of(vec![svc], vec![]), &node(), &Config::default());
    let v6 = p.v6.as_ref().unwrap();
    assert_eq!(
        v6.firewalled,
        BTreeSet::from([ap("2001:db8::7", Protocol::Tcp, 80)])
    );
    assert!(v6.source_ranges.is_empty(), "nobody is allowed over IPv6");
    assert_eq!(v4(&p).source_ranges.len(), 1);
}

#[test]
fn hairpin_holds_local_and_unplaced_endpoints_only() {
    let slices = vec![slice(
        "web",
        vec![
            endpoint_on("10.244.0.5", Some("node-a")),
            endpoint_on("10.244.1.5", Some("node-b")),
            endpoint_on("10.244.0.6", None),
        ],
        8080,
        Protocol::Tcp,
    )];
    let p = plan(&state_of(vec![web()], slices), &node(), &Config::default());
    assert_eq!(
        v4(&p).hairpin,
        BTreeSet::from([
            ap("10.244.0.5", Protocol::Tcp, 8080),
            ap("10.244.0.6", Protocol::Tcp, 8080)
        ])
    );
}

#[test]
fn health_check_node_port_is_listed() {
    let mut svc = web();
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    let p = plan(&state_of(vec![svc], vec![]), &node(), &Config::default());
    assert_eq!(v4(&p).health_check_node_ports, BTreeSet::from([32000]));
}

#[test]
fn excluded_addresses_are_planned_like_any_other() {
    let mut svc = web();
    svc.external_ips = vec![ip("203.0.113.5")];
    let config = Config {
        exclude_cidrs: vec![net("203.0.113.0/24"), net("10.96.0.10/32")],
        ..Config::default()
    };
    let p = plan(&state_of(vec![svc], vec![]), &node(), &config);
    let p = v4(&p);
    assert!(p.bound_ips.contains(&ip("10.96.0.10")));
    assert!(p.bound_ips.contains(&ip("203.0.113.5")));
    assert_eq!(
        p.external_ips,
        BTreeSet::from([ap("203.0.113.5", Protocol::Tcp, 80)])
    );
}

#[test]
fn masquerade_mode_follows_config() {
    let state = state_of(vec![web()], vec![]);
    let default = plan(&state, &node(), &Config::default());
    assert_eq!(
        v4(&default).cluster_ip_masquerade,
        ClusterIpMasquerade::NodeFromVip
    );

    let all = plan(
        &state,
        &node(),
        &Config {
            masquerade_all: true,
            cluster_cidrs: vec![net("10.244.0.0/16")],
            ..Config::default()
        },
    );
    assert_eq!(v4(&all).cluster_ip_masquerade, ClusterIpMasquerade::All);

    let cidrs = plan(
        &state,
        &node(),
        &Config {
            cluster_cidrs: vec![
                net("10.244.0.0/16"),
                net("10.244.3.0/24"),
                net("fd00:244::/56"),
            ],
            ..Config::default()
        },
    );
    assert_eq!(
        v4(&cidrs).cluster_ip_masquerade,
        ClusterIpMasquerade::OutsideCidrs(vec![net("10.244.0.0/16")])
    );
    assert_eq!(
        cidrs.v6.as_ref().unwrap().cluster_ip_masquerade,
        ClusterIpMasquerade::OutsideCidrs(vec![net("fd00:244::/56")])
    );
}

#[test]
fn unproxied_family_has_no_plan() {
    let config = Config {
        families: BTreeSet::from([AddressFamily::V4]),
        ..Config::default()
    };
    let p = plan(&state_of(vec![web()], vec![]), &node(), &config);
    assert!(p.v6.is_none());
    assert!(p.v4.is_some());
}

#[test]
fn dual_stack_service_fills_both_tables_with_their_own_family() {
    let mut svc = web();
    svc.cluster_ips = vec![ip("10.96.0.10"), ip("fd00:96::10")];
    svc.external_ips = vec![ip("203.0.113.5"), ip("2001:db8::5")];
    let p = plan(&state_of(vec![svc], vec![]), &node(), &Config::default());
    let v6 = p.v6.as_ref().unwrap();
    assert_eq!(
        v6.cluster_ips,
        BTreeSet::from([ap("fd00:96::10", Protocol::Tcp, 80)])
    );
    assert_eq!(
        v6.external_ips,
        BTreeSet::from([ap("2001:db8::5", Protocol::Tcp, 80)])
    );
    assert!(v4(&p).external_ips.iter().all(|e| e.address.is_ipv4()));
    assert_eq!(v4(&p).node_ports.len(), 1);
    assert_eq!(v6.node_ports.len(), 1);
}

#[test]
fn same_state_plans_equal() {
    let state = state_of(
        (0..20)
            .map(|i| {
                let mut s = web();
                s.name = ServiceName::new("ns", format!("s{i}"));
                s.cluster_ips = vec![ip(&format!("10.96.1.{i}"))];
                s
            })
            .collect(),
        vec![],
    );
    assert_eq!(
        plan(&state, &node(), &Config::default()),
        plan(&state, &node(), &Config::default())
    );
}

#[test]
fn detect_local_mode_chooses_the_cluster_ip_masquerade_rule() {
    use crate::model::config::{DetectLocal, InterfaceName};
    let state = state_of(vec![web()], vec![]);
    let with = |detect_local: DetectLocal| Config {
        cluster_cidrs: vec![net("10.244.0.0/16")],
        detect_local,
        ..Config::default()
    };
    let cbr0 = InterfaceName::new("cbr0").unwrap();
    let bridge = plan(
        &state,
        &node(),
        &with(DetectLocal::BridgeInterface(cbr0.clone())),
    );
    assert_eq!(
        v4(&bridge).cluster_ip_masquerade,
        ClusterIpMasquerade::NotFromInterface(cbr0.clone())
    );
    // The interface modes are the same in both families.
    assert_eq!(
        bridge.v6.as_ref().unwrap().cluster_ip_masquerade,
        ClusterIpMasquerade::NotFromInterface(cbr0)
    );

    let veth = InterfaceName::new("veth").unwrap();
    let prefix = plan(
        &state,
        &node(),
        &with(DetectLocal::InterfaceNamePrefix(veth.clone())),
    );
    assert_eq!(
        v4(&prefix).cluster_ip_masquerade,
        ClusterIpMasquerade::NotFromInterfacePrefix(veth)
    );
    assert!(v4(&prefix).node_pod_cidrs.is_empty());

    // masquerade-all wins over every mode.
    let all = plan(
        &state,
        &node(),
        &Config {
            masquerade_all: true,
            ..with(DetectLocal::NodeCidr)
        },
    );
    assert_eq!(v4(&all).cluster_ip_masquerade, ClusterIpMasquerade::All);
}

#[test]
fn node_cidr_mode_carries_the_node_pod_cidrs_of_each_family() {
    use crate::model::config::DetectLocal;
    let config = Config {
        // The cluster CIDR is not what NodeCIDR mode uses.
        cluster_cidrs: vec![net("10.244.0.0/16")],
        detect_local: DetectLocal::NodeCidr,
        ..Config::default()
    };
    let mut n = node();
    n.pod_cidrs = vec![net("10.244.1.0/24"), net("fd00:244:1::/64")];
    let mut dual = web();
    dual.cluster_ips = vec![ip("10.96.0.10"), ip("fd00:96::10")];
    let state = state_of(vec![dual.clone()], vec![]);
    let p = plan(&state, &n, &config);
    assert_eq!(
        v4(&p).cluster_ip_masquerade,
        ClusterIpMasquerade::OutsideNodePodCidrs
    );
    assert_eq!(
        v4(&p).node_pod_cidrs,
        BTreeSet::from([net("10.244.1.0/24")])
    );
    assert_eq!(
        p.v6.as_ref().unwrap().node_pod_cidrs,
        BTreeSet::from([net("fd00:244:1::/64")])
    );
    // Each Service's own plan carries them (the incremental path merges those).
    let own = plan_of_service(&state, &dual, &n, &config);
    assert_eq!(own, p);
    // No Service, no element: nothing to masquerade either.
    assert!(
        v4(&plan(&state_of(vec![], vec![]), &n, &config))
            .node_pod_cidrs
            .is_empty()
    );
    // A node without pod CIDRs: an empty set (every source is "not local").
    assert!(
        v4(&plan(&state, &node(), &config))
            .node_pod_cidrs
            .is_empty()
    );
    // Other modes never carry them.
    let cidr_mode = Config {
        detect_local: DetectLocal::ClusterCidr,
        ..config
    };
    assert!(v4(&plan(&state, &n, &cidr_mode)).node_pod_cidrs.is_empty());
}
