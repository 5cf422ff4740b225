//! proxier-core's sysctl module against a real kernel: every setting lands in the network
//! namespace it runs in (checked with `sysctl`, the oracle), strict ARP included, and a
//! second run changes nothing.

#![allow(clippy::unwrap_used)]

use ipvs_proxier_tests::{Netns, require_kernel};
use proxier_core::sysctl::{
    KernelVersion, ProcSysctl, SysctlOptions, ensure_sysctls, kernel_version,
};

const KEYS: &str = "net.ipv4.ip_forward net.ipv4.vs.conntrack net.ipv4.vs.expire_nodest_conn \
                    net.ipv4.vs.expire_quiescent_template net.ipv4.conf.all.arp_ignore \
                    net.ipv4.conf.all.arp_announce";

#[test]
fn sysctls_are_set_in_the_namespace_and_reported() {
    require_kernel!();
    let netns = Netns::new();
    // Start from the opposite of what the proxier wants.
    netns.sh_ok(
        "sysctl -w net.ipv4.ip_forward=0 net.ipv4.vs.conntrack=0 net.ipv4.vs.expire_nodest_conn=0 \
         net.ipv4.vs.expire_quiescent_template=0 net.ipv4.conf.all.arp_ignore=0 \
         net.ipv4.conf.all.arp_announce=0 >/dev/null",
    );
    let (first, second, version) = netns.block_on(|| async {
        let store = ProcSysctl::default();
        let options = SysctlOptions { strict_arp: true };
        let first = ensure_sysctls(&store, options);
        let second = ensure_sysctls(&store, options);
        (first, second, kernel_version(&store))
    });
    assert!(first.failures.is_empty(), "{:?}", first.failures);
    assert_eq!(first.changed.len(), 6, "changed: {:?}", first.changed);
    assert!(second.changed.is_empty() && second.failures.is_empty());
    assert_eq!(second.unchanged.len(), 6);

    let values = netns.sh_ok(&format!("sysctl -n {KEYS}"));
    assert_eq!(
        values.split_whitespace().collect::<Vec<_>>(),
        ["1", "1", "1", "1", "1", "2"],
        "{values}"
    );
    // The VM's 6.1 kernel fixed conn_reuse_mode: it is left alone and reported as such.
    let version = version.unwrap();
    assert!(version >= KernelVersion { major: 5, minor: 9 }, "{version}");
    assert!(
        first
            .skipped
            .iter()
            .any(|s| s.key == "net/ipv4/vs/conn_reuse_mode"),
        "{:?}",
        first.skipped
    );

    // Another namespace was not touched.
    let other = Netns::new();
    let untouched = other.sh_ok("sysctl -n net.ipv4.vs.conntrack");
    assert_eq!(untouched.trim(), "0");
}
