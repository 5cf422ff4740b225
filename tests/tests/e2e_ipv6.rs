//! Conformance suite, address families: an IPv6-only Service, a dual-stack Service and an
//! IPv6 NodePort with each external traffic policy (the `ip6` nftables table at work), served
//! by the real daemon and reached with real traffic from the external client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e_support/mod.rs"]
mod e2e_support;

use std::net::IpAddr;

use e2e_support::*;
use ipvs_proxier_tests::require_kernel;

const REQUESTS: usize = 6;

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

/// The client address a pod reports (`pod-N <peer address>`), however socat spells it (it
/// writes IPv6 addresses in full, maybe in brackets).
fn peer_ip(answer: &str) -> Option<IpAddr> {
    let raw = answer.split_whitespace().nth(1)?;
    raw.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

#[test]
fn ipv6_cluster_ip_reaches_all_endpoints() {
    require_kernel!();
    let mut t = Topology::new(2);
    for i in 0..2 {
        t.serve_tcp(i, 8080);
    }
    let svc = Svc::cluster_ip("web6", &["fd00:96::30"], vec![Port::tcp("http", 80, 8080)]);
    let eps = (0..2).map(|i| Ep::ready(&pod_ip6(i), NODE_NAME)).collect();
    t.write_one(&svc, &[Slice::of(&svc, true, eps)]);
    t.start_daemon(&[]);
    t.wait_backends("TCP  [fd00:96::30]:80", &backends6(&[0, 1], 8080));
    let answers = all_answer(REQUESTS, "IPv6 ClusterIP", || {
        t.client_tcp("[fd00:96::30]:80", None)
    });
    assert_eq!(name_set(&answers), pods(&[0, 1]), "{answers:?}");
    let addrs = t.node.sh_ok("ip -o -6 addr show dev kube-ipvs0");
    assert!(addrs.contains("fd00:96::30/128"), "{addrs}");
}

#[test]
fn dual_stack_service_is_reachable_on_both_families() {
    require_kernel!();
    let mut t = Topology::new(2);
    for i in 0..2 {
        t.serve_tcp(i, 8080);
    }
    let mut svc = Svc::cluster_ip(
        "dual",
        &["10.96.0.31", "fd00:96::31"],
        vec![Port::tcp("http", 80, 8080).node_port(30090)],
    );
    svc.kind = "NodePort";
    let v4 = (0..2).map(|i| Ep::ready(&pod_ip(i), NODE_NAME)).collect();
    let v6 = (0..2).map(|i| Ep::ready(&pod_ip6(i), NODE_NAME)).collect();
    t.write_one(
        &svc,
        &[Slice::of(&svc, false, v4), Slice::of(&svc, true, v6)],
    );
    t.start_daemon(&[]);
    t.wait_backends("TCP  10.96.0.31:80", &backends(&[0, 1], 8080));
    t.wait_backends("TCP  [fd00:96::31]:80", &backends6(&[0, 1], 8080));
    let v4 = all_answer(REQUESTS, "dual-stack v4", || {
        t.client_tcp("10.96.0.31:80", None)
    });
    let v6 = all_answer(REQUESTS, "dual-stack v6", || {
        t.client_tcp("[fd00:96::31]:80", None)
    });
    assert_eq!(name_set(&v4), pods(&[0, 1]), "{v4:?}");
    assert_eq!(name_set(&v6), pods(&[0, 1]), "{v6:?}");
    // The NodePort on the node's address of each family.
    t.wait_backends(&format!("TCP  {NODE_IP}:30090"), &backends(&[0, 1], 8080));
    t.wait_backends(
        &format!("TCP  [{NODE_IP6}]:30090"),
        &backends6(&[0, 1], 8080),
    );
    let np4 = t
        .client_tcp(&hostport(NODE_IP, 30090), None)
        .unwrap_or_default();
    let np6 = t
        .client_tcp(&hostport(NODE_IP6, 30090), None)
        .unwrap_or_default();
    assert!(np4.starts_with("pod-"), "{np4:?}");
    assert!(np6.starts_with("pod-"), "{np6:?}");
    // eTP=Cluster: the nftables masquerade of each family hides the client from the pod.
    let seen4 = peer_ip(&np4).expect("a peer address");
    let seen6 = peer_ip(&np6).expect("a peer address");
    assert_ne!(seen4, ip(CLIENT_IP), "IPv4 NodePort not masqueraded: {np4}");
    assert_ne!(
        seen6,
        ip(CLIENT_IP6),
        "IPv6 NodePort not masqueraded: {np6}"
    );
}

#[test]
fn ipv6_node_port_with_local_policy_keeps_the_client_address() {
    require_kernel!();
    let mut t = Topology::new(2);
    for i in 0..2 {
        t.serve_tcp(i, 8080);
    }
    let mut svc = Svc::cluster_ip(
        "local6",
        &["fd00:96::41"],
        vec![Port::tcp("http", 80, 8080).node_port(30091)],
    );
    svc.kind = "NodePort";
    svc.external_traffic_local = true;
    // pod-1 runs on another node: external traffic must not go there.
    let eps = vec![
        Ep::ready(&pod_ip6(0), NODE_NAME),
        Ep::ready(&pod_ip6(1), OTHER_NODE),
    ];
    t.write_one(&svc, &[Slice::of(&svc, true, eps)]);
    t.start_daemon(&[]);
    t.wait_backends(&format!("TCP  [{NODE_IP6}]:30091"), &backends6(&[0], 8080));
    let answers = all_answer(REQUESTS, "IPv6 NodePort eTP=Local", || {
        t.client_tcp(&hostport(NODE_IP6, 30091), None)
    });
    assert_eq!(name_set(&answers), pods(&[0]), "{answers:?}");
    assert!(
        answers.iter().all(|a| peer_ip(a) == Some(ip(CLIENT_IP6))),
        "the pod must see the client's IPv6 address: {answers:?}"
    );
}
