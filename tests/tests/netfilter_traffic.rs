//! Real traffic through IPVS and proxier-core's nftables table, between network namespaces
//! inside the VM: hairpin, NodePort SNAT by traffic policy, load-balancer source ranges
//! (clients and the node itself), and rejection of VIP ports without a Service.
//!
//! Each test first shows the failure without our table where one exists, then applies the
//! table (planned from a model of the Services, rendered and applied by proxier-core) and
//! shows the behaviour.

#![allow(clippy::unwrap_used)]

mod netfilter_support;

use ipvs_proxier_tests::require_kernel;
use netfilter_support::*;
use proxier_core::desired::Protocol;
use proxier_core::model::{IpMode, LoadBalancerIngress, TrafficPolicy};

#[test]
fn hairpin_pod_reaches_itself_through_its_service() {
    require_kernel!();
    let mut t = Topology::new(1);
    t.serve_peer_echo(0, 8080);
    t.bind_vip("10.96.0.10");
    t.tcp_service("10.96.0.10", 80, &[0], 8080);
    let pod = &t.pods[0];

    // Without masquerade the pod talks to itself from its own address: the answer goes
    // straight back inside the pod, IPVS never sees it, and the connection never completes.
    let before = request(pod, "TCP:10.96.0.10:80,connect-timeout=3");
    assert_eq!(before, None, "hairpin worked without our table: {before:?}");

    let svc = service("web", "10.96.0.10", 80, Protocol::Tcp, None);
    let plan = t.apply_netfilter(
        &state(vec![svc], vec![slice("web", &[0], 8080, Protocol::Tcp)]),
        &config(),
    );
    assert_eq!(plan.v4.as_ref().unwrap().hairpin.len(), 1);

    let after = request_retrying(pod, "TCP:10.96.0.10:80,connect-timeout=3");
    // Masqueraded to the node's address on the bridge.
    assert_eq!(peer(&after), Some(BRIDGE_IP), "hairpin answer: {after:?}");
}

fn node_port_topology(policy: TrafficPolicy) -> Topology {
    let mut t = Topology::new(1);
    t.serve_peer_echo(0, 8080);
    t.bind_vip("10.96.0.10");
    t.tcp_service("10.96.0.10", 80, &[0], 8080);
    t.tcp_service(NODE_IP, 30080, &[0], 8080);
    let mut svc = service("web", "10.96.0.10", 80, Protocol::Tcp, Some(30080));
    svc.external_traffic_policy = policy;
    t.apply_netfilter(
        &state(vec![svc], vec![slice("web", &[0], 8080, Protocol::Tcp)]),
        &config(),
    );
    t
}

#[test]
fn node_port_with_cluster_policy_is_snated_to_the_node() {
    require_kernel!();
    let t = node_port_topology(TrafficPolicy::Cluster);
    let answer = t.client_request_ok(CLIENT_IP, NODE_IP, 30080);
    assert_eq!(
        peer(&answer),
        Some(BRIDGE_IP),
        "eTP=Cluster: the backend must see the node's address, saw {answer:?}"
    );
    // The NodePort is in the masquerade set, and conntrack shows the SNAT.
    let ct = t
        .node
        .sh_ok("conntrack -L -p tcp --orig-dst 192.168.50.1 2>/dev/null");
    assert!(ct.contains("dst=10.244.0.1"), "no SNAT in conntrack: {ct}");
}

#[test]
fn node_port_with_local_policy_keeps_the_client_address() {
    require_kernel!();
    let t = node_port_topology(TrafficPolicy::Local);
    let answer = t.client_request_ok(CLIENT_IP, NODE_IP, 30080);
    assert_eq!(
        peer(&answer),
        Some(CLIENT_IP),
        "eTP=Local: the backend must see the client's address, saw {answer:?}"
    );
}

#[test]
fn load_balancer_source_ranges_allow_one_client_and_drop_another() {
    require_kernel!();
    let mut t = Topology::new(1);
    t.serve_peer_echo(0, 8080);
    t.client
        .sh_ok("ip route add 192.168.60.0/24 via 192.168.50.1");
    t.bind_vip("10.96.0.10");
    t.bind_vip("192.168.60.10");
    t.tcp_service("10.96.0.10", 80, &[0], 8080);
    t.tcp_service("192.168.60.10", 80, &[0], 8080);
    // A second LB Service whose range holds the node's IP: the node may reach it.
    t.bind_vip("10.96.0.11");
    t.bind_vip("192.168.60.11");
    t.tcp_service("10.96.0.11", 80, &[0], 8080);
    t.tcp_service("192.168.60.11", 80, &[0], 8080);

    // Both clients and the node get through before the table.
    assert!(
        t.client_request_ok(OTHER_CLIENT_IP, "192.168.60.10", 80)
            .is_some()
    );
    assert!(request_retrying(&t.node, "TCP:192.168.60.10:80,connect-timeout=3").is_some());

    let lb = |name: &str, cluster_ip: &str, vip: &str, ranges: &[&str]| {
        let mut svc = service(name, cluster_ip, 80, Protocol::Tcp, None);
        svc.load_balancer_ingress = vec![LoadBalancerIngress {
            ip: ip(vip),
            ip_mode: IpMode::Vip,
        }];
        svc.load_balancer_source_ranges = ranges.iter().map(|r| r.parse().unwrap()).collect();
        svc
    };
    let services = vec![
        lb(
            "only-client",
            "10.96.0.10",
            "192.168.60.10",
            &["192.168.50.2/32"],
        ),
        lb(
            "with-node",
            "10.96.0.11",
            "192.168.60.11",
            &["192.168.50.0/31", "10.0.0.0/8"],
        ),
    ];
    let slices = vec![
        slice("only-client", &[0], 8080, Protocol::Tcp),
        slice("with-node", &[0], 8080, Protocol::Tcp),
    ];
    t.apply_netfilter(&state(services, slices), &config());

    let allowed = t.client_request_ok(CLIENT_IP, "192.168.60.10", 80);
    assert!(allowed.is_some(), "client in range was refused");
    let dropped = t.client_request(OTHER_CLIENT_IP, "192.168.60.10", 80);
    assert_eq!(dropped, None, "client outside the range got through");
    let from_node = request(&t.node, "TCP:192.168.60.10:80,connect-timeout=3");
    assert_eq!(
        from_node, None,
        "the node is outside the range but got through"
    );

    // The node's IP 192.168.50.1 is in 192.168.50.0/31: the node may reach the second LB,
    // the other client (.3) may not.
    let node_allowed = request_retrying(&t.node, "TCP:192.168.60.11:80,connect-timeout=3");
    assert!(node_allowed.is_some(), "node in range was refused");
    assert_eq!(t.client_request(OTHER_CLIENT_IP, "192.168.60.11", 80), None);
    // The ClusterIP of the firewalled Service is not firewalled.
    assert!(
        t.client_request_ok(OTHER_CLIENT_IP, "10.96.0.10", 80)
            .is_some()
    );
}

#[test]
fn vip_port_without_a_service_is_rejected() {
    require_kernel!();
    let mut t = Topology::new(1);
    t.serve_peer_echo(0, 8080);
    t.bind_vip("10.96.0.10");
    t.tcp_service("10.96.0.10", 80, &[0], 8080);
    // A node-local daemon listening on every address, port 81 (kubernetes#72236).
    t.background.spawn(
        &t.node,
        "socat TCP-LISTEN:81,fork,reuseaddr SYSTEM:'echo node-daemon'",
    );
    wait_listening(&t.node, 81);

    // Without our table the VIP exposes the node's daemon, and answers pings.
    assert_eq!(
        t.client_request_ok(CLIENT_IP, "10.96.0.10", 81).as_deref(),
        Some("node-daemon")
    );
    assert!(
        t.client.sh("ping -c1 -W2 10.96.0.10").status.success(),
        "the control ping got no answer"
    );

    let svc = service("web", "10.96.0.10", 80, Protocol::Tcp, None);
    t.apply_netfilter(
        &state(vec![svc], vec![slice("web", &[0], 8080, Protocol::Tcp)]),
        &config(),
    );

    let (ok, out, err) = request_verbose(
        &t.client,
        "TCP:10.96.0.10:81,bind=192.168.50.2,connect-timeout=3",
    );
    assert!(!ok && out.is_empty(), "VIP port 81 still answered: {out}");
    assert!(
        err.contains("refused") || err.contains("unreachable"),
        "expected an active reject, got: {err}"
    );
    // Nor does it answer another protocol: as kube-proxy, a ping is refused too (the
    // client's kernel counts the ICMP "unreachable" that comes back).
    let unreachables_before = icmp_in_dest_unreachs(&t.client);
    let ping = t.client.sh("ping -c1 -W2 10.96.0.10");
    assert!(
        !ping.status.success(),
        "the VIP answered a ping: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    assert!(
        icmp_in_dest_unreachs(&t.client) > unreachables_before,
        "the ping was dropped, not rejected"
    );
    // The node's own address still reaches the daemon, and the service port still works.
    assert_eq!(
        t.client_request_ok(CLIENT_IP, NODE_IP, 81).as_deref(),
        Some("node-daemon")
    );
    assert_eq!(
        peer(&t.client_request_ok(CLIENT_IP, "10.96.0.10", 80)),
        Some(BRIDGE_IP),
        "ClusterIP from outside the cluster CIDR is masqueraded"
    );
}

/// The `Icmp: InDestUnreachs` counter of `netns` (from its `/proc/net/snmp`).
fn icmp_in_dest_unreachs(netns: &ipvs_proxier_tests::Netns) -> u64 {
    let snmp = netns.sh_ok("cat /proc/net/snmp");
    let mut icmp = snmp.lines().filter(|l| l.starts_with("Icmp: "));
    let (names, values) = (icmp.next().unwrap(), icmp.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "InDestUnreachs")
        .unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}
