//! End-to-end proof of the kernel test harness: IPVS, dummy links and
//! `Netns::block_on` work inside the VM.

#![allow(clippy::unwrap_used)]

use ipvs_proxier_tests::{Netns, require_kernel};

/// Names of the links in the network namespace of the calling thread
/// (`/proc/thread-self/net/dev` follows the thread's namespace, unlike
/// `/sys/class/net`, which follows the mount).
fn links_of_this_thread() -> Vec<String> {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
    dev.lines()
        .skip(2)
        .filter_map(|line| line.split(':').next())
        .map(|name| name.trim().to_owned())
        .collect()
}

#[test]
fn ipvs_is_available_in_a_fresh_netns() {
    require_kernel!();
    let netns = Netns::new();
    // An empty table in a new namespace: the header only, no services.
    let listing = netns.sh_ok("ipvsadm -Ln");
    assert!(
        listing.contains("IP Virtual Server version"),
        "ipvsadm -Ln said: {listing}"
    );
    assert!(
        !listing.contains("TCP  ") && !listing.contains("UDP  "),
        "fresh netns has services: {listing}"
    );
    let proc_table = netns.sh_ok("cat /proc/net/ip_vs");
    assert!(
        proc_table.contains("IP Virtual Server version"),
        "{proc_table}"
    );
}

#[test]
fn ipvs_service_added_in_netns_is_listed_there_only() {
    require_kernel!();
    let netns = Netns::new();
    netns.sh_ok(
        "ipvsadm -A -t 10.96.0.10:80 -s rr && ipvsadm -a -t 10.96.0.10:80 -r 10.1.0.2:8080 -m",
    );
    let listing = netns.sh_ok("ipvsadm -Ln");
    assert!(listing.contains("10.96.0.10:80 rr"), "{listing}");
    assert!(listing.contains("10.1.0.2:8080"), "{listing}");
    let other = Netns::new();
    let elsewhere = other.sh_ok("ipvsadm -Ln");
    assert!(
        !elsewhere.contains("10.96.0.10"),
        "service leaked to another netns: {elsewhere}"
    );
}

#[test]
fn dummy_link_can_be_created_and_shows_up() {
    require_kernel!();
    let netns = Netns::new();
    netns.sh_ok("ip link add kube-ipvs0 type dummy && ip addr add 10.96.0.1/32 dev kube-ipvs0");
    let link = netns.sh_ok("ip -o link show kube-ipvs0");
    assert!(link.contains("kube-ipvs0"), "{link}");
    assert!(
        link.contains("link/ether"),
        "not a dummy (ether) link: {link}"
    );
    let addr = netns.sh_ok("ip -o -4 addr show dev kube-ipvs0");
    assert!(addr.contains("10.96.0.1/32"), "{addr}");
}

#[test]
fn block_on_runs_inside_the_namespace() {
    require_kernel!();
    let netns = Netns::new();
    netns.sh_ok("ip link add smoke-dummy0 type dummy && ip addr add 192.0.2.77/32 dev smoke-dummy0 && ip link set smoke-dummy0 up");

    let (links, bound) = netns.block_on(|| async {
        // Binding succeeds only where 192.0.2.77 is a local address.
        let bound = tokio::net::UdpSocket::bind("192.0.2.77:0").await.is_ok();
        (links_of_this_thread(), bound)
    });
    assert!(
        links.iter().any(|l| l == "smoke-dummy0"),
        "links seen by block_on: {links:?}"
    );
    assert!(bound, "could not bind 192.0.2.77 inside the netns");

    // The calling thread stayed in its own namespace.
    assert!(!links_of_this_thread().iter().any(|l| l == "smoke-dummy0"));
    assert!(std::net::UdpSocket::bind("192.0.2.77:0").is_err());
}

#[test]
fn block_on_propagates_the_value_and_panics() {
    require_kernel!();
    let netns = Netns::new();
    assert_eq!(netns.block_on(|| async { 41 + 1 }), 42);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        netns.block_on(|| async { panic!("inside the netns") })
    }));
    assert!(caught.is_err());
}
