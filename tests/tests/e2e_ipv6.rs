//! Conformance suite, address families: an IPv6-only Service and a dual-stack Service, served
//! by the real daemon and reached with real traffic from the external client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e_support/mod.rs"]
mod e2e_support;

use e2e_support::*;
use ipvs_proxier_tests::require_kernel;

const REQUESTS: usize = 6;

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
    let np4 = t.client_tcp(&hostport(NODE_IP, 30090), None);
    let np6 = t.client_tcp(&hostport(NODE_IP6, 30090), None);
    assert!(np4.is_some_and(|a| a.starts_with("pod-")));
    assert!(np6.is_some_and(|a| a.starts_with("pod-")));
}
