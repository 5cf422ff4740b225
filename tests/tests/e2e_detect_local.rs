//! `--detect-local-mode`, with real traffic: the real daemon on the e2e node (pods on the
//! bridge `cbr0`, an external client on `vc`), one ClusterIP Service whose endpoint is pod 0,
//! and requests to the ClusterIP from the external client and from pod 1. The backend
//! answers with the peer address it sees: the client's own address means "not masqueraded",
//! the bridge address (the node's address towards the pod) means "masqueraded".
//!
//! Every mode must masquerade the external client and keep a local pod's source. What tells
//! the modes apart is a source the modes judge differently:
//! - a pod on the bridge sending from an address outside the cluster CIDR (`10.250.0.0/24`,
//!   routed to `cbr0` on the node): ClusterCIDR masquerades it, BridgeInterface and
//!   InterfaceNamePrefix (by the interface it arrives on) keep it;
//! - the Node's `spec.podCIDRs` moved away from the pods: NodeCIDR masquerades them although
//!   the cluster CIDR still holds them.
//!
//! The daemon is always started with `--cluster-cidr` (the kit passes it), so the
//! interface and NodeCIDR modes are shown to take over from it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e_support/mod.rs"]
mod e2e_support;

use std::time::{Duration, Instant};

use e2e_support::*;
use ipvs_proxier_tests::require_kernel;

const VIP: &str = "10.96.0.50";
const TARGET: &str = "10.96.0.50:80";
/// The client pod's extra address, outside the cluster CIDR.
const STRAY_IP: &str = "10.250.0.1";

fn service() -> (Svc, Vec<Slice>) {
    let svc = Svc::cluster_ip("web", &[VIP], vec![Port::tcp("http", 80, 8080)]);
    let slice = Slice::of(&svc, false, vec![Ep::ready(&pod_ip(0), NODE_NAME)]);
    (svc, vec![slice])
}

/// Pod 0 serves, pod 1 is the client pod (it also holds [`STRAY_IP`]).
fn topology() -> Topology {
    let mut t = Topology::new(2);
    t.serve_tcp(0, 8080);
    t.pods[1].sh_ok(&format!("ip addr add {STRAY_IP}/32 dev eth0"));
    t.node
        .sh_ok("ip route add 10.250.0.0/24 dev cbr0 && sysctl -qw net.ipv4.conf.all.rp_filter=0");
    t
}

/// The address the backend saw for one request from `who`, or a panic with diagnostics.
fn peer_seen(t: &Topology, who: &str, source: Option<&str>) -> String {
    let answer = if who == "client" {
        t.client_tcp(TARGET, source)
    } else {
        tcp_request(&t.pods[1], TARGET, source)
    };
    let Some(answer) = answer else {
        panic!(
            "no answer from {TARGET} for {who} (source {source:?});\n{}\nnft:\n{}\ndaemon log:\n{}",
            t.diagnostics(),
            nft_table(t),
            t.daemon_log()
        );
    };
    assert!(answer.starts_with("pod-0 "), "{answer}");
    answer["pod-0 ".len()..].trim().to_owned()
}

fn nft_table(t: &Topology) -> String {
    String::from_utf8_lossy(&t.node.sh("nft list table ip ipvs-proxier").stdout).into_owned()
}

/// The nft rule that marks ClusterIP traffic for masquerade.
fn cluster_ip_rule(t: &Topology) -> String {
    nft_table(t)
        .lines()
        .find(|l| l.contains("@cluster-ips") && l.contains("meta mark set"))
        .map(|l| l.trim().to_owned())
        .unwrap_or_default()
}

/// The checks every mode shares: the external client is masqueraded, a pod (cluster-CIDR
/// address, on the bridge) is not.
fn external_masqueraded_pod_kept(t: &mut Topology) {
    t.wait_backends(&format!("TCP  {TARGET}"), &backends(&[0], 8080));
    let external = peer_seen(t, "client", None);
    assert_eq!(
        external, BRIDGE_IP,
        "the external client's request must reach the backend masqueraded"
    );
    let pod = peer_seen(t, "pod", None);
    assert_eq!(pod, pod_ip(1), "a local pod's request must keep its source");
}

#[test]
fn cluster_cidr_mode_is_the_default() {
    require_kernel!();
    let mut t = topology();
    let (svc, slices) = service();
    t.write_source(std::slice::from_ref(&svc), &slices);
    t.start_daemon(&[]);
    external_masqueraded_pod_kept(&mut t);
    assert!(
        cluster_ip_rule(&t).starts_with("ip saddr != 10.244.0.0/16 "),
        "{}",
        nft_table(&t)
    );
    // A bridge source outside the cluster CIDR is not a pod to this mode.
    assert_eq!(peer_seen(&t, "pod", Some(STRAY_IP)), BRIDGE_IP);
    println!(
        "detect-local ClusterCIDR: external masqueraded, pod kept, out-of-CIDR source masqueraded"
    );
}

#[test]
fn bridge_interface_mode_judges_by_the_bridge() {
    require_kernel!();
    let mut t = topology();
    let (svc, slices) = service();
    t.write_source(std::slice::from_ref(&svc), &slices);
    t.start_daemon(&[
        "--detect-local-mode=BridgeInterface",
        "--pod-bridge-interface=cbr0",
    ]);
    external_masqueraded_pod_kept(&mut t);
    assert!(
        cluster_ip_rule(&t).starts_with("iifname != \"cbr0\""),
        "{}",
        nft_table(&t)
    );
    // Arriving on the bridge is what counts, not the address.
    assert_eq!(peer_seen(&t, "pod", Some(STRAY_IP)), STRAY_IP);
    println!(
        "detect-local BridgeInterface: external masqueraded, pods on cbr0 kept whatever their address"
    );
}

#[test]
fn interface_name_prefix_mode_judges_by_the_interface_name() {
    require_kernel!();
    let mut t = topology();
    let (svc, slices) = service();
    t.write_source(std::slice::from_ref(&svc), &slices);
    // The pods' traffic reaches the node's IP stack on the bridge `cbr0`: prefix `cbr`.
    t.start_daemon(&[
        "--detect-local-mode=InterfaceNamePrefix",
        "--pod-interface-name-prefix=cbr",
    ]);
    external_masqueraded_pod_kept(&mut t);
    assert!(
        cluster_ip_rule(&t).starts_with("iifname != \"cbr*\""),
        "{}",
        nft_table(&t)
    );
    assert_eq!(peer_seen(&t, "pod", Some(STRAY_IP)), STRAY_IP);
    println!(
        "detect-local InterfaceNamePrefix: external masqueraded, pods on cbr* kept whatever their address"
    );
}

#[test]
fn node_cidr_mode_follows_the_node_pod_cidrs() {
    require_kernel!();
    let mut t = topology();
    let (svc, slices) = service();
    let node = |cidrs: &[&str]| {
        e2e_support::manifests::node_with_pod_cidrs(NODE_NAME, NODE_IP, NODE_IP6, cidrs)
    };
    t.write_source_with_node(
        &node(&["10.244.0.0/24", "fd00:244::/64"]),
        std::slice::from_ref(&svc),
        &slices,
    );
    t.start_daemon(&["--detect-local-mode=NodeCIDR"]);
    external_masqueraded_pod_kept(&mut t);
    let table = nft_table(&t);
    assert!(
        cluster_ip_rule(&t).starts_with("ip saddr != @node-pod-cidrs"),
        "{table}"
    );
    assert!(table.contains("10.244.0.0/24"), "{table}");

    // The Node's pod CIDR moves away from the pods (the cluster CIDR still holds them): their
    // traffic is not local any more. The set follows the Node; no restart.
    t.write_source_with_node(
        &node(&["10.244.1.0/24", "fd00:244::/64"]),
        std::slice::from_ref(&svc),
        &slices,
    );
    let deadline = Instant::now() + CONVERGE;
    while !nft_table(&t).contains("10.244.1.0/24") {
        t.daemon().assert_running();
        assert!(
            Instant::now() < deadline,
            "node-pod-cidrs never followed the Node:\n{}\n{}",
            nft_table(&t),
            t.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    t.wait_settled();
    assert!(!nft_table(&t).contains("10.244.0.0/24"));
    assert_eq!(peer_seen(&t, "pod", None), BRIDGE_IP);
    assert_eq!(peer_seen(&t, "client", None), BRIDGE_IP);
    println!(
        "detect-local NodeCIDR: external masqueraded, pod kept; Node podCIDRs moved -> pod masqueraded"
    );
}
