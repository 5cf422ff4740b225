//! Table tests of the planner: kube-proxy IPVS scenarios, expectations written from the
//! semantics (kube-proxy's documentation and code), never from our own output.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use proxier_core::desired::{Protocol, Scheduler};
use proxier_core::model::{
    AddressFamily, Config, Endpoint, EndpointPort, EndpointSlice, IpMode, LoadBalancerIngress,
    NodeContext, NodePortAddresses, Service, ServiceName, ServicePortSpec, SessionAffinity,
    SliceKey, TrafficPolicy,
};
use proxier_core::{
    Change, ClusterState, Desired, Planner, RealServerKey, ServicePortName, VirtualServerKey,
    VirtualServerRole, plan, plan_service_port,
};

const NODE: &str = "this-node";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn vs(addr: &str, port: u16, protocol: Protocol) -> VirtualServerKey {
    VirtualServerKey {
        address: ip(addr),
        port,
        protocol,
    }
}

fn rs(addr: &str, port: u16) -> RealServerKey {
    RealServerKey {
        address: ip(addr),
        port,
    }
}

fn tcp_port(name: &str, port: u16, node_port: Option<u16>) -> ServicePortSpec {
    ServicePortSpec {
        name: name.into(),
        port,
        protocol: Protocol::Tcp,
        node_port,
    }
}

fn svc(name: &str, cluster_ips: &[&str], ports: Vec<ServicePortSpec>) -> Service {
    Service::new(
        ServiceName::new("ns1", name),
        cluster_ips.iter().map(|s| ip(s)).collect(),
        ports,
    )
}

fn ep(addr: &str) -> Endpoint {
    Endpoint::ready(ip(addr))
}

fn local(mut e: Endpoint) -> Endpoint {
    e.node_name = Some(Arc::from(NODE));
    e
}

fn remote(mut e: Endpoint) -> Endpoint {
    e.node_name = Some(Arc::from("other-node"));
    e
}

fn terminating(mut e: Endpoint, serving: bool) -> Endpoint {
    e.ready = false;
    e.serving = serving;
    e.terminating = true;
    e
}

fn not_ready(mut e: Endpoint) -> Endpoint {
    e.ready = false;
    e.serving = false;
    e
}

fn zone_hints(mut e: Endpoint, zones: &[&str]) -> Endpoint {
    e.zone_hints = zones.iter().map(|z| Arc::from(*z)).collect();
    e
}

fn slice(
    service: &str,
    slice_name: &str,
    ports: &[(&str, u16, Protocol)],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        key: SliceKey::new("ns1", slice_name),
        service: ServiceName::new("ns1", service),
        ports: ports
            .iter()
            .map(|(name, port, protocol)| EndpointPort {
                name: (*name).into(),
                port: *port,
                protocol: *protocol,
            })
            .collect(),
        endpoints,
        warnings: Vec::new(),
        trigger_time: None,
    }
}

fn node(addresses: &[&str]) -> NodeContext {
    let ips: Vec<IpAddr> = addresses.iter().map(|s| ip(s)).collect();
    NodeContext::new(NODE, ips.clone(), ips)
}

fn state(services: Vec<Service>, slices: Vec<EndpointSlice>) -> ClusterState {
    let mut state = ClusterState::new();
    for s in services {
        state.apply(Change::UpsertService(s));
    }
    for s in slices {
        state.apply(Change::UpsertSlice(s));
    }
    state
}

fn port_name(service: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "ns1".into(),
        name: service.into(),
        port: port.into(),
        protocol,
    }
}

/// Virtual servers of the whole plan with their sorted real servers (weights included).
fn table(
    desired: &Desired,
) -> BTreeMap<VirtualServerKey, (VirtualServerRole, Vec<(RealServerKey, u32)>)> {
    desired
        .virtual_servers()
        .map(|(_, key, vs)| {
            (
                *key,
                (
                    vs.role,
                    vs.real_servers
                        .iter()
                        .map(|(k, r)| (*k, r.weight))
                        .collect(),
                ),
            )
        })
        .collect()
}

fn keys(desired: &Desired) -> BTreeSet<VirtualServerKey> {
    desired.virtual_servers().map(|(_, k, _)| *k).collect()
}

fn real_servers(desired: &Desired, key: &VirtualServerKey) -> BTreeSet<RealServerKey> {
    desired
        .virtual_servers()
        .find(|(_, k, _)| *k == key)
        .map(|(_, _, vs)| vs.real_servers.keys().copied().collect())
        .unwrap_or_else(|| panic!("no virtual server {key}"))
}

fn set(items: &[RealServerKey]) -> BTreeSet<RealServerKey> {
    items.iter().copied().collect()
}

// ---------------------------------------------------------------- ClusterIP / NodePort

#[test]
fn cluster_ip_service_gets_one_virtual_server_with_every_ready_endpoint() {
    let st = state(
        vec![svc(
            "web",
            &["10.20.30.41"],
            vec![tcp_port("p80", 80, None)],
        )],
        vec![slice(
            "web",
            "web-1",
            &[("p80", 8080, Protocol::Tcp)],
            vec![ep("10.180.0.1"), ep("10.180.1.1")],
        )],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    let t = table(&desired);
    assert_eq!(t.len(), 1);
    let (role, servers) = &t[&vs("10.20.30.41", 80, Protocol::Tcp)];
    assert_eq!(*role, VirtualServerRole::ClusterIp);
    assert_eq!(
        servers,
        &vec![(rs("10.180.0.1", 8080), 1), (rs("10.180.1.1", 8080), 1)]
    );
    let vsd = desired.virtual_servers().next().unwrap().2;
    assert_eq!(vsd.scheduler, Scheduler::RoundRobin);
    assert_eq!(vsd.persistence_timeout, None);
    assert!(!vsd.hash_source_port);
    assert_eq!(desired.bound_addresses(), [ip("10.20.30.41")].into());
}

fn node_port_case(protocol: Protocol) {
    let mut port = tcp_port("p80", 80, Some(3001));
    port.protocol = protocol;
    let st = state(
        vec![svc("np", &["10.20.30.41"], vec![port])],
        vec![slice(
            "np",
            "np-1",
            &[("p80", 80, protocol)],
            vec![ep("10.180.0.1"), ep("1002:ab8::2:1")],
        )],
    );
    // Loopback, IPv6 link-local and the other family's addresses never carry this NodePort;
    // IPv4 link-local does (kube-proxy's isValidForSet allows it).
    let n = node(&[
        "100.101.102.103",
        "127.0.0.1",
        "169.254.1.1",
        "2001:db8::1:1",
        "fe80::1",
    ]);
    let desired = plan(&st, &n, &Config::default());
    let t = table(&desired);
    let expected: BTreeSet<_> = [
        vs("10.20.30.41", 80, protocol),
        vs("100.101.102.103", 3001, protocol),
        vs("169.254.1.1", 3001, protocol),
    ]
    .into();
    assert_eq!(keys(&desired), expected, "{protocol}");
    let (role, servers) = &t[&vs("100.101.102.103", 3001, protocol)];
    assert_eq!(*role, VirtualServerRole::NodePort);
    assert_eq!(servers, &vec![(rs("10.180.0.1", 80), 1)]);
    // NodePorts sit on the node's own address: only the ClusterIP is bound.
    assert_eq!(desired.bound_addresses(), [ip("10.20.30.41")].into());
}

#[test]
fn node_port_ipv4_tcp() {
    node_port_case(Protocol::Tcp);
}

#[test]
fn node_port_ipv4_udp() {
    node_port_case(Protocol::Udp);
}

#[test]
fn node_port_ipv4_sctp() {
    node_port_case(Protocol::Sctp);
}

#[test]
fn node_port_ipv6_only_uses_ipv6_addresses_and_endpoints() {
    for protocol in [Protocol::Tcp, Protocol::Sctp] {
        let mut port = tcp_port("p80", 80, Some(3001));
        port.protocol = protocol;
        let st = state(
            vec![svc("np6", &["2020::1"], vec![port])],
            vec![
                slice(
                    "np6",
                    "np6-v6",
                    &[("p80", 80, protocol)],
                    vec![ep("1002:ab8::2:1")],
                ),
                slice(
                    "np6",
                    "np6-v4",
                    &[("p80", 80, protocol)],
                    vec![ep("10.180.0.1")],
                ),
            ],
        );
        let n = node(&["100.101.102.103", "2001:db8::1:1", "fe80::1", "::1"]);
        let desired = plan(&st, &n, &Config::default());
        let expected: BTreeSet<_> = [
            vs("2020::1", 80, protocol),
            vs("2001:db8::1:1", 3001, protocol),
        ]
        .into();
        assert_eq!(keys(&desired), expected);
        for key in &expected {
            assert_eq!(real_servers(&desired, key), set(&[rs("1002:ab8::2:1", 80)]));
        }
    }
}

#[test]
fn node_port_addresses_cidrs_filter_per_family() {
    let st = state(
        vec![svc(
            "np",
            &["10.20.30.41", "fd00::41"],
            vec![tcp_port("", 80, Some(3001))],
        )],
        vec![],
    );
    let n = node(&[
        "100.101.102.103",
        "192.168.0.5",
        "2001:db8::1",
        "2001:db9::1",
    ]);
    // Only an IPv4 CIDR: IPv4 is filtered, IPv6 (no CIDR of its family) uses every address.
    let config = Config {
        node_port_addresses: NodePortAddresses::Cidrs(vec![net("100.101.102.0/24")]),
        ..Config::default()
    };
    let node_ports: BTreeSet<IpAddr> = plan(&st, &n, &config)
        .virtual_servers()
        .filter(|(_, _, v)| v.role == VirtualServerRole::NodePort)
        .map(|(_, k, _)| k.address)
        .collect();
    assert_eq!(
        node_ports,
        [ip("100.101.102.103"), ip("2001:db8::1"), ip("2001:db9::1")].into()
    );

    let config = Config {
        node_port_addresses: NodePortAddresses::Cidrs(vec![
            net("192.168.0.0/16"),
            net("2001:db9::/32"),
        ]),
        ..Config::default()
    };
    let node_ports: BTreeSet<IpAddr> = plan(&st, &n, &config)
        .virtual_servers()
        .filter(|(_, _, v)| v.role == VirtualServerRole::NodePort)
        .map(|(_, k, _)| k.address)
        .collect();
    assert_eq!(node_ports, [ip("192.168.0.5"), ip("2001:db9::1")].into());
}

#[test]
fn node_port_addresses_primary_uses_only_primary_ips() {
    let st = state(
        vec![svc(
            "np",
            &["10.20.30.41"],
            vec![tcp_port("", 80, Some(3001))],
        )],
        vec![],
    );
    let mut n = node(&["100.101.102.103", "192.168.0.5"]);
    n.primary_ips = vec![ip("192.168.0.5")];
    let config = Config {
        node_port_addresses: NodePortAddresses::Primary,
        ..Config::default()
    };
    let node_ports: BTreeSet<IpAddr> = plan(&st, &n, &config)
        .virtual_servers()
        .filter(|(_, _, v)| v.role == VirtualServerRole::NodePort)
        .map(|(_, k, _)| k.address)
        .collect();
    assert_eq!(node_ports, [ip("192.168.0.5")].into());
}

// ---------------------------------------------------------------- ExternalIPs

#[test]
fn external_ips_without_endpoints_still_get_virtual_servers() {
    let mut s = svc("ext", &["10.20.30.41"], vec![tcp_port("p80", 80, None)]);
    s.external_ips = vec![ip("50.60.70.81"), ip("2012::51")];
    let st = state(vec![s], vec![]);
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    let t = table(&desired);
    // The IPv6 external IP has no IPv6 ClusterIP to go with: that family is not proxied.
    assert_eq!(
        keys(&desired),
        [
            vs("10.20.30.41", 80, Protocol::Tcp),
            vs("50.60.70.81", 80, Protocol::Tcp)
        ]
        .into()
    );
    let (role, servers) = &t[&vs("50.60.70.81", 80, Protocol::Tcp)];
    assert_eq!(*role, VirtualServerRole::ExternalIp);
    assert!(servers.is_empty());
    assert_eq!(
        desired.bound_addresses(),
        [ip("10.20.30.41"), ip("50.60.70.81")].into()
    );
}

#[test]
fn external_ips_with_endpoints() {
    let mut s = svc("ext", &["10.20.30.41"], vec![tcp_port("p80", 80, None)]);
    s.external_ips = vec![ip("50.60.70.81"), ip("2012::51"), ip("127.0.0.1")];
    let st = state(
        vec![s],
        vec![slice(
            "ext",
            "ext-1",
            &[("p80", 80, Protocol::Tcp)],
            vec![ep("10.180.0.1"), ep("10.180.1.1")],
        )],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    let all = set(&[rs("10.180.0.1", 80), rs("10.180.1.1", 80)]);
    for addr in ["10.20.30.41", "50.60.70.81", "127.0.0.1"] {
        assert_eq!(
            real_servers(&desired, &vs(addr, 80, Protocol::Tcp)),
            all,
            "{addr}"
        );
    }
    assert_eq!(keys(&desired).len(), 3);
}

#[test]
fn external_ip_that_is_a_node_address_is_served_but_not_bound() {
    let mut s = svc("ext", &["10.20.30.41"], vec![tcp_port("p80", 80, None)]);
    s.external_ips = vec![ip("100.101.102.103"), ip("50.60.70.81")];
    let st = state(vec![s], vec![]);
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert!(keys(&desired).contains(&vs("100.101.102.103", 80, Protocol::Tcp)));
    assert_eq!(
        desired.bound_addresses(),
        [ip("10.20.30.41"), ip("50.60.70.81")].into()
    );
}

#[test]
fn cluster_ips_in_routed_service_cidrs_are_served_but_not_bound() {
    // --bind-service-cidrs: the node takes the CIDR whole with one local route, so a
    // ClusterIP inside it needs no address of its own; an external IP still does, and so
    // does a dual-stack Service whose IPv6 ClusterIP lies in no routed CIDR.
    let mut inside = svc("in", &["10.96.0.10"], vec![tcp_port("p80", 80, None)]);
    inside.external_ips = vec![ip("50.60.70.81")];
    let outside = svc("out", &["10.20.30.41"], vec![tcp_port("p80", 80, None)]);
    let dual = svc(
        "dual",
        &["10.96.0.11", "fd00::11"],
        vec![tcp_port("p80", 80, None)],
    );
    let st = state(vec![inside, outside, dual], vec![]);
    let config = Config {
        service_cidr_routes: vec![net("10.96.0.0/12")],
        ..Config::default()
    };
    let desired = plan(&st, &node(&["100.101.102.103"]), &config);
    for addr in ["10.96.0.10", "50.60.70.81", "10.20.30.41", "10.96.0.11"] {
        assert!(
            keys(&desired).contains(&vs(addr, 80, Protocol::Tcp)),
            "{addr}"
        );
    }
    assert_eq!(
        desired.bound_addresses(),
        [
            ip("50.60.70.81"),
            ip("10.20.30.41"),
            ip("10.96.0.11"),
            ip("fd00::11")
        ]
        .into()
    );
    // Without the option every ClusterIP is bound.
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert!(desired.bound_addresses().contains(&ip("10.96.0.10")));
}

// ---------------------------------------------------------------- traffic policies

fn local_policy_state(
    configure: impl FnOnce(&mut Service),
    endpoints: Vec<Endpoint>,
) -> ClusterState {
    let mut s = svc(
        "lcl",
        &["10.20.30.41"],
        vec![tcp_port("p80", 80, Some(3001))],
    );
    configure(&mut s);
    state(
        vec![s],
        vec![slice(
            "lcl",
            "lcl-1",
            &[("p80", 80, Protocol::Tcp)],
            endpoints,
        )],
    )
}

#[test]
fn external_policy_local_node_port_lb_and_external_ip_use_local_endpoints_only() {
    let st = local_policy_state(
        |s| {
            s.external_traffic_policy = TrafficPolicy::Local;
            s.external_ips = vec![ip("50.60.70.81")];
            s.load_balancer_ingress = vec![LoadBalancerIngress {
                ip: ip("1.2.3.4"),
                ip_mode: IpMode::Vip,
            }];
            s.health_check_node_port = Some(30000);
        },
        vec![local(ep("10.180.0.1")), remote(ep("10.180.2.1"))],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    let only_local = set(&[rs("10.180.0.1", 80)]);
    for key in [
        vs("100.101.102.103", 3001, Protocol::Tcp),
        vs("50.60.70.81", 80, Protocol::Tcp),
        vs("1.2.3.4", 80, Protocol::Tcp),
    ] {
        assert_eq!(real_servers(&desired, &key), only_local, "{key}");
    }
    // externalTrafficPolicy does not apply to the ClusterIP.
    assert_eq!(
        real_servers(&desired, &vs("10.20.30.41", 80, Protocol::Tcp)),
        set(&[rs("10.180.0.1", 80), rs("10.180.2.1", 80)])
    );
}

#[test]
fn external_policy_local_without_local_endpoints_falls_back_to_cluster_endpoints() {
    // kube-proxy's IPVS mode keeps serving local Pods when the node has no local endpoint.
    let st = local_policy_state(
        |s| s.external_traffic_policy = TrafficPolicy::Local,
        vec![remote(ep("10.180.2.1")), remote(ep("10.180.3.1"))],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert_eq!(
        real_servers(&desired, &vs("100.101.102.103", 3001, Protocol::Tcp)),
        set(&[rs("10.180.2.1", 80), rs("10.180.3.1", 80)])
    );
}

#[test]
fn internal_policy_local_cluster_ip_uses_local_endpoints() {
    let mut s = svc("itp", &["10.20.30.41"], vec![tcp_port("p80", 80, None)]);
    s.internal_traffic_policy = TrafficPolicy::Local;
    let endpoints = vec![local(ep("10.180.0.1")), remote(ep("10.180.2.1"))];
    let st = state(
        vec![s.clone()],
        vec![slice(
            "itp",
            "itp-1",
            &[("p80", 80, Protocol::Tcp)],
            endpoints,
        )],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert_eq!(
        real_servers(&desired, &vs("10.20.30.41", 80, Protocol::Tcp)),
        set(&[rs("10.180.0.1", 80)])
    );

    // No local endpoint and no external access: the Service never uses cluster endpoints,
    // so the ClusterIP has no real server at all.
    let st = state(
        vec![s],
        vec![slice(
            "itp",
            "itp-1",
            &[("p80", 80, Protocol::Tcp)],
            vec![remote(ep("10.180.2.1"))],
        )],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert!(real_servers(&desired, &vs("10.20.30.41", 80, Protocol::Tcp)).is_empty());
}

#[test]
fn internal_policy_local_with_node_port_falls_back_to_cluster_endpoints() {
    // Externally accessible, so cluster endpoints exist and the ClusterIP falls back to them.
    let st = local_policy_state(
        |s| s.internal_traffic_policy = TrafficPolicy::Local,
        vec![remote(ep("10.180.2.1"))],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert_eq!(
        real_servers(&desired, &vs("10.20.30.41", 80, Protocol::Tcp)),
        set(&[rs("10.180.2.1", 80)])
    );
    assert_eq!(
        real_servers(&desired, &vs("100.101.102.103", 3001, Protocol::Tcp)),
        set(&[rs("10.180.2.1", 80)])
    );
}

// ---------------------------------------------------------------- LoadBalancer

#[test]
fn load_balancer_vip_gets_a_virtual_server_and_proxy_mode_does_not() {
    let mut s = svc(
        "lb",
        &["10.20.30.41"],
        vec![tcp_port("p80", 80, Some(3001))],
    );
    s.load_balancer_ingress = vec![
        LoadBalancerIngress {
            ip: ip("1.2.3.4"),
            ip_mode: IpMode::Vip,
        },
        LoadBalancerIngress {
            ip: ip("5.6.7.8"),
            ip_mode: IpMode::Proxy,
        },
    ];
    s.load_balancer_source_ranges = vec![net("1.2.3.0/24")];
    let st = state(
        vec![s],
        vec![slice(
            "lb",
            "lb-1",
            &[("p80", 80, Protocol::Tcp)],
            vec![ep("10.180.0.1")],
        )],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    let t = table(&desired);
    assert_eq!(
        keys(&desired),
        [
            vs("10.20.30.41", 80, Protocol::Tcp),
            vs("1.2.3.4", 80, Protocol::Tcp),
            vs("100.101.102.103", 3001, Protocol::Tcp),
        ]
        .into()
    );
    assert_eq!(
        t[&vs("1.2.3.4", 80, Protocol::Tcp)].0,
        VirtualServerRole::LoadBalancer
    );
    assert_eq!(
        t[&vs("1.2.3.4", 80, Protocol::Tcp)].1,
        vec![(rs("10.180.0.1", 80), 1)]
    );
    assert_eq!(
        desired.bound_addresses(),
        [ip("10.20.30.41"), ip("1.2.3.4")].into()
    );
}

// ---------------------------------------------------------------- affinity, scheduler, weights

#[test]
fn client_ip_affinity_sets_persistence_on_every_virtual_server() {
    let mut s = svc(
        "aff",
        &["10.20.30.41"],
        vec![tcp_port("p80", 80, Some(3001))],
    );
    s.session_affinity = SessionAffinity::ClientIp {
        timeout_seconds: 10800,
    };
    s.external_ips = vec![ip("50.60.70.81")];
    s.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: ip("1.2.3.4"),
        ip_mode: IpMode::Vip,
    }];
    let st = state(vec![s], vec![]);
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert_eq!(desired.virtual_servers().count(), 4);
    for (_, key, v) in desired.virtual_servers() {
        assert_eq!(v.persistence_timeout, Some(10800), "{key}");
    }
}

#[test]
fn scheduler_comes_from_annotation_or_default_and_only_maglev_hashes_the_port() {
    // kube-proxy sets the source-hash flag (mh-port) for `mh` only; `sh` hashes the source
    // address alone.
    let cases: [(Option<Scheduler>, Scheduler, Scheduler, bool); 5] = [
        (None, Scheduler::RoundRobin, Scheduler::RoundRobin, false),
        (
            None,
            Scheduler::MaglevHashing,
            Scheduler::MaglevHashing,
            true,
        ),
        (
            None,
            Scheduler::SourceHashing,
            Scheduler::SourceHashing,
            false,
        ),
        (
            Some(Scheduler::MaglevHashing),
            Scheduler::RoundRobin,
            Scheduler::MaglevHashing,
            true,
        ),
        (
            Some(Scheduler::WeightedLeastConnection),
            Scheduler::MaglevHashing,
            Scheduler::WeightedLeastConnection,
            false,
        ),
    ];
    for (annotation, default, expected, hash) in cases {
        let mut s = svc(
            "sch",
            &["10.20.30.41"],
            vec![tcp_port("p80", 80, Some(3001))],
        );
        s.scheduler = annotation.clone();
        let st = state(vec![s], vec![]);
        let config = Config {
            scheduler: default.clone(),
            ..Config::default()
        };
        let desired = plan(&st, &node(&["100.101.102.103"]), &config);
        assert_eq!(desired.virtual_servers().count(), 2);
        for (_, key, v) in desired.virtual_servers() {
            assert_eq!(v.scheduler, expected, "{annotation:?}/{default:?} {key}");
            assert_eq!(v.hash_source_port, hash, "{annotation:?}/{default:?} {key}");
        }
    }
}

#[test]
fn weights_default_to_one_and_follow_the_endpoint_weight() {
    let mut heavy = ep("10.180.0.1");
    heavy.weight = Some(5);
    let st = state(
        vec![svc("w", &["10.20.30.41"], vec![tcp_port("p80", 80, None)])],
        vec![slice(
            "w",
            "w-1",
            &[("p80", 80, Protocol::Tcp)],
            vec![heavy, ep("10.180.1.1")],
        )],
    );
    let desired = plan(&st, &node(&[]), &Config::default());
    assert_eq!(
        table(&desired)[&vs("10.20.30.41", 80, Protocol::Tcp)].1,
        vec![(rs("10.180.0.1", 80), 5), (rs("10.180.1.1", 80), 1)]
    );
}

// ---------------------------------------------------------------- multi-port, dual-stack

#[test]
fn multi_port_service_plans_each_port_and_binds_the_address_once() {
    let st = state(
        vec![svc(
            "multi",
            &["10.20.30.41"],
            vec![tcp_port("http", 80, None), tcp_port("https", 443, None), {
                let mut p = tcp_port("dns", 53, None);
                p.protocol = Protocol::Udp;
                p
            }],
        )],
        vec![slice(
            "multi",
            "multi-1",
            &[
                ("http", 8080, Protocol::Tcp),
                ("https", 8443, Protocol::Tcp),
                ("dns", 5353, Protocol::Udp),
            ],
            vec![ep("10.180.0.1")],
        )],
    );
    let desired = plan(&st, &node(&[]), &Config::default());
    assert_eq!(desired.services.len(), 3);
    let http = &desired.services[&port_name("multi", "http", Protocol::Tcp)];
    assert_eq!(
        http.virtual_servers[&vs("10.20.30.41", 80, Protocol::Tcp)]
            .real_servers
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        vec![rs("10.180.0.1", 8080)]
    );
    let dns = &desired.services[&port_name("multi", "dns", Protocol::Udp)];
    assert!(
        dns.virtual_servers[&vs("10.20.30.41", 53, Protocol::Udp)]
            .real_servers
            .contains_key(&rs("10.180.0.1", 5353))
    );
    assert_eq!(desired.bound_addresses(), [ip("10.20.30.41")].into());
}

#[test]
fn dual_stack_plans_each_family_with_its_own_endpoints() {
    let mut s = svc(
        "ds",
        &["10.20.30.41", "fd00::41"],
        vec![tcp_port("p80", 80, Some(3001))],
    );
    s.external_ips = vec![ip("50.60.70.81"), ip("2012::51")];
    let st = state(
        vec![s],
        vec![
            slice(
                "ds",
                "ds-v4",
                &[("p80", 80, Protocol::Tcp)],
                vec![ep("10.180.0.1")],
            ),
            slice(
                "ds",
                "ds-v6",
                &[("p80", 80, Protocol::Tcp)],
                vec![ep("fd00:1::1")],
            ),
        ],
    );
    let n = node(&["100.101.102.103", "2001:db8::1"]);
    let desired = plan(&st, &n, &Config::default());
    let v4 = set(&[rs("10.180.0.1", 80)]);
    let v6 = set(&[rs("fd00:1::1", 80)]);
    for (addr, port, want) in [
        ("10.20.30.41", 80, &v4),
        ("50.60.70.81", 80, &v4),
        ("100.101.102.103", 3001, &v4),
        ("fd00::41", 80, &v6),
        ("2012::51", 80, &v6),
        ("2001:db8::1", 3001, &v6),
    ] {
        assert_eq!(
            &real_servers(&desired, &vs(addr, port, Protocol::Tcp)),
            want,
            "{addr}"
        );
    }
    assert_eq!(keys(&desired).len(), 6);

    // A node proxying IPv4 only plans nothing of IPv6.
    let config = Config {
        families: [AddressFamily::V4].into(),
        ..Config::default()
    };
    assert!(
        keys(&plan(&st, &n, &config))
            .iter()
            .all(|k| k.address.is_ipv4())
    );
    assert_eq!(keys(&plan(&st, &n, &config)).len(), 3);
}

// ---------------------------------------------------------------- readiness and topology

#[test]
fn ready_endpoints_first_then_serving_terminating_for_cluster_policy() {
    let cases: Vec<(&str, Vec<Endpoint>, Vec<RealServerKey>)> = vec![
        (
            "ready ones win over terminating ones",
            vec![
                ep("10.0.1.1"),
                ep("10.0.1.2"),
                terminating(ep("10.0.1.3"), true),
                terminating(ep("10.0.1.4"), false),
                not_ready(ep("10.0.1.5")),
            ],
            vec![rs("10.0.1.1", 80), rs("10.0.1.2", 80)],
        ),
        (
            "no ready endpoint: serving terminating ones",
            vec![
                terminating(ep("10.0.1.3"), true),
                terminating(ep("10.0.1.4"), false),
                not_ready(ep("10.0.1.5")),
            ],
            vec![rs("10.0.1.3", 80)],
        ),
        (
            "nothing usable",
            vec![
                terminating(ep("10.0.1.4"), false),
                not_ready(ep("10.0.1.5")),
            ],
            vec![],
        ),
    ];
    for (what, endpoints, want) in cases {
        let st = state(
            vec![svc("rt", &["172.30.1.1"], vec![tcp_port("", 80, None)])],
            vec![slice("rt", "rt-1", &[("", 80, Protocol::Tcp)], endpoints)],
        );
        let desired = plan(&st, &node(&[]), &Config::default());
        assert_eq!(
            real_servers(&desired, &vs("172.30.1.1", 80, Protocol::Tcp)),
            set(&want),
            "{what}"
        );
    }
}

#[test]
fn ready_and_terminating_with_local_policy_fall_back_independently() {
    // Local: only a serving-terminating local endpoint; cluster: a ready remote one.
    let st = local_policy_state(
        |s| s.external_traffic_policy = TrafficPolicy::Local,
        vec![
            local(terminating(ep("10.0.1.1"), true)),
            local(terminating(ep("10.0.1.2"), false)),
            remote(ep("10.0.1.3")),
        ],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert_eq!(
        real_servers(&desired, &vs("100.101.102.103", 3001, Protocol::Tcp)),
        set(&[rs("10.0.1.1", 80)])
    );
    assert_eq!(
        real_servers(&desired, &vs("10.20.30.41", 80, Protocol::Tcp)),
        set(&[rs("10.0.1.3", 80)])
    );

    // A ready local endpoint beats the terminating local one.
    let st = local_policy_state(
        |s| s.external_traffic_policy = TrafficPolicy::Local,
        vec![
            local(ep("10.0.1.5")),
            local(terminating(ep("10.0.1.1"), true)),
            remote(ep("10.0.1.3")),
        ],
    );
    let desired = plan(&st, &node(&["100.101.102.103"]), &Config::default());
    assert_eq!(
        real_servers(&desired, &vs("100.101.102.103", 3001, Protocol::Tcp)),
        set(&[rs("10.0.1.5", 80)])
    );
}

#[test]
fn zone_hints_apply_only_when_every_ready_endpoint_has_one_and_one_matches() {
    let z = |addr: &str, zones: &[&str]| zone_hints(ep(addr), zones);
    // (what, node zone, endpoints, expected addresses)
    type Case<'a> = (&'a str, Option<&'a str>, Vec<Endpoint>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "hints for this zone",
            Some("zone-a"),
            vec![
                z("10.1.2.3", &["zone-a"]),
                z("10.1.2.4", &["zone-b"]),
                z("10.1.2.5", &["zone-a", "zone-c"]),
            ],
            vec!["10.1.2.3", "10.1.2.5"],
        ),
        (
            "one ready endpoint lacks a hint",
            Some("zone-a"),
            vec![z("10.1.2.3", &["zone-a"]), ep("10.1.2.4")],
            vec!["10.1.2.3", "10.1.2.4"],
        ),
        (
            "a not-ready endpoint without hint does not count",
            Some("zone-a"),
            vec![
                z("10.1.2.3", &["zone-a"]),
                z("10.1.2.4", &["zone-b"]),
                not_ready(ep("10.1.2.6")),
            ],
            vec!["10.1.2.3"],
        ),
        (
            "no hint for this zone",
            Some("zone-c"),
            vec![z("10.1.2.3", &["zone-a"]), z("10.1.2.4", &["zone-b"])],
            vec!["10.1.2.3", "10.1.2.4"],
        ),
        (
            "node zone unknown",
            None,
            vec![z("10.1.2.3", &["zone-a"]), z("10.1.2.4", &["zone-b"])],
            vec!["10.1.2.3", "10.1.2.4"],
        ),
    ];
    for (what, zone, endpoints, want) in cases {
        let st = state(
            vec![svc("topo", &["10.96.0.1"], vec![tcp_port("", 80, None)])],
            vec![slice(
                "topo",
                "topo-1",
                &[("", 80, Protocol::Tcp)],
                endpoints,
            )],
        );
        let mut n = node(&[]);
        n.zone = zone.map(str::to_owned);
        let want: Vec<RealServerKey> = want.iter().map(|a| rs(a, 80)).collect();
        assert_eq!(
            real_servers(
                &plan(&st, &n, &Config::default()),
                &vs("10.96.0.1", 80, Protocol::Tcp)
            ),
            set(&want),
            "{what}"
        );
    }
}

#[test]
fn node_hints_prefer_same_node() {
    let mut a = ep("10.1.2.3");
    a.node_hints = Box::new([Arc::from(NODE)]);
    a.zone_hints = Box::new([Arc::from("zone-a")]);
    let mut b = ep("10.1.2.4");
    b.node_hints = Box::new([Arc::from("other-node")]);
    b.zone_hints = Box::new([Arc::from("zone-a")]);
    let st = state(
        vec![svc("topo", &["10.96.0.1"], vec![tcp_port("", 80, None)])],
        vec![slice(
            "topo",
            "topo-1",
            &[("", 80, Protocol::Tcp)],
            vec![a, b],
        )],
    );
    let mut n = node(&[]);
    n.zone = Some("zone-a".into());
    assert_eq!(
        real_servers(
            &plan(&st, &n, &Config::default()),
            &vs("10.96.0.1", 80, Protocol::Tcp)
        ),
        set(&[rs("10.1.2.3", 80)])
    );
}

#[test]
fn duplicate_endpoint_across_slices_prefers_the_non_terminating_entry() {
    let st = state(
        vec![svc("dup", &["10.96.0.1"], vec![tcp_port("", 80, None)])],
        vec![
            slice(
                "dup",
                "dup-a",
                &[("", 80, Protocol::Tcp)],
                vec![terminating(ep("10.1.2.3"), false)],
            ),
            slice(
                "dup",
                "dup-b",
                &[("", 80, Protocol::Tcp)],
                vec![ep("10.1.2.3")],
            ),
        ],
    );
    assert_eq!(
        real_servers(
            &plan(&st, &node(&[]), &Config::default()),
            &vs("10.96.0.1", 80, Protocol::Tcp)
        ),
        set(&[rs("10.1.2.3", 80)])
    );
}

// ---------------------------------------------------------------- stale services, exclusions

#[test]
fn removed_service_leaves_nothing_planned() {
    let mut s = svc(
        "gone",
        &["10.20.30.41"],
        vec![tcp_port("p80", 80, Some(3001))],
    );
    s.external_ips = vec![ip("50.60.70.81")];
    let mut st = state(
        vec![
            s,
            svc("kept", &["10.20.30.42"], vec![tcp_port("p80", 80, None)]),
        ],
        vec![slice(
            "gone",
            "gone-1",
            &[("p80", 80, Protocol::Tcp)],
            vec![ep("10.180.0.1")],
        )],
    );
    let n = node(&["100.101.102.103"]);
    assert_eq!(
        plan(&st, &n, &Config::default()).virtual_servers().count(),
        4
    );

    let dirty = st.apply(Change::DeleteService(ServiceName::new("ns1", "gone")));
    let name = port_name("gone", "p80", Protocol::Tcp);
    assert_eq!(dirty, [name.clone()].into());
    assert_eq!(plan_service_port(&st, &name, &n, &Config::default()), None);
    let desired = plan(&st, &n, &Config::default());
    assert_eq!(
        keys(&desired),
        [vs("10.20.30.42", 80, Protocol::Tcp)].into()
    );
    assert_eq!(desired.bound_addresses(), [ip("10.20.30.42")].into());
}

#[test]
fn services_in_excluded_cidrs_are_still_planned() {
    let mut s = svc(
        "ex",
        &["10.20.30.41"],
        vec![tcp_port("p80", 80, Some(3001))],
    );
    s.external_ips = vec![ip("50.60.70.81"), ip("10.20.99.1")];
    let st = state(
        vec![s],
        vec![slice(
            "ex",
            "ex-1",
            &[("p80", 80, Protocol::Tcp)],
            vec![ep("10.180.0.1")],
        )],
    );
    let config = Config {
        exclude_cidrs: vec![net("10.20.0.0/16"), net("192.168.0.0/24")],
        ..Config::default()
    };
    let desired = plan(&st, &node(&["100.101.102.103", "192.168.0.7"]), &config);
    // kube-proxy programs every Service; --ipvs-exclude-cidrs only keeps its cleanup away
    // from IPVS services it did not create there.
    assert_eq!(
        keys(&desired),
        [
            vs("10.20.30.41", 80, Protocol::Tcp),
            vs("50.60.70.81", 80, Protocol::Tcp),
            vs("10.20.99.1", 80, Protocol::Tcp),
            vs("100.101.102.103", 3001, Protocol::Tcp),
            vs("192.168.0.7", 3001, Protocol::Tcp),
        ]
        .into()
    );
    assert_eq!(
        desired.bound_addresses(),
        [ip("10.20.30.41"), ip("50.60.70.81"), ip("10.20.99.1")].into()
    );
}

#[test]
fn incremental_plans_match_the_full_plan_after_every_change() {
    let n = node(&["100.101.102.103"]);
    let config = Config::default();
    let planner = Planner::new(&n, &config);
    let mut st = ClusterState::new();
    let mut assembled = Desired::default();
    let mut with_np = svc("a", &["10.0.0.1"], vec![tcp_port("http", 80, Some(30080))]);
    with_np.external_traffic_policy = TrafficPolicy::Local;
    let changes = vec![
        // A slice that arrives before its Service plans nothing yet.
        Change::UpsertSlice(slice(
            "a",
            "a-1",
            &[("http", 8080, Protocol::Tcp)],
            vec![local(ep("10.1.0.1"))],
        )),
        Change::UpsertService(with_np.clone()),
        Change::UpsertSlice(slice(
            "a",
            "a-2",
            &[("http", 8080, Protocol::Tcp)],
            vec![remote(ep("10.1.0.2"))],
        )),
        Change::UpsertService(svc("b", &["10.0.0.2"], vec![tcp_port("", 53, None)])),
        Change::UpsertSlice(slice(
            "b",
            "b-1",
            &[("", 5353, Protocol::Tcp)],
            vec![ep("10.1.0.3")],
        )),
        // Slice a-2 is relabelled to Service b: a loses it, b gains it.
        Change::UpsertSlice(slice(
            "b",
            "a-2",
            &[("", 5353, Protocol::Tcp)],
            vec![ep("10.1.0.4")],
        )),
        Change::UpsertSlice(slice(
            "a",
            "a-1",
            &[("http", 8080, Protocol::Tcp)],
            vec![not_ready(local(ep("10.1.0.1")))],
        )),
        Change::UpsertService(svc("a", &["10.0.0.1"], vec![tcp_port("web", 80, None)])),
        Change::DeleteSlice(SliceKey::new("ns1", "b-1")),
        Change::DeleteService(ServiceName::new("ns1", "b")),
        Change::DeleteSlice(SliceKey::new("ns1", "missing")),
    ];
    for (step, change) in changes.into_iter().enumerate() {
        for (name, port_plan) in planner.apply_and_plan(&mut st, change) {
            match port_plan {
                Some(p) => assembled.services.insert(name, p),
                None => assembled.services.remove(&name),
            };
        }
        assert_eq!(assembled, planner.plan(&st), "after step {step}");
    }
    assert_eq!(
        keys(&assembled),
        [vs("10.0.0.1", 80, Protocol::Tcp)].into(),
        "only Service a (renamed port, no NodePort) remains"
    );
}

#[test]
fn no_op_updates_dirty_nothing() {
    let s = svc("a", &["10.0.0.1"], vec![tcp_port("http", 80, None)]);
    let sl = slice(
        "a",
        "a-1",
        &[("http", 8080, Protocol::Tcp)],
        vec![ep("10.1.0.1")],
    );
    let mut st = state(vec![s.clone()], vec![sl.clone()]);
    assert!(st.apply(Change::UpsertService(s)).is_empty());
    assert!(st.apply(Change::UpsertSlice(sl)).is_empty());
    let other = slice(
        "zzz",
        "z-1",
        &[("http", 8080, Protocol::Tcp)],
        vec![ep("10.1.0.9")],
    );
    assert!(
        st.apply(Change::UpsertSlice(other)).is_empty(),
        "a slice of an unknown Service dirties no port"
    );
}
