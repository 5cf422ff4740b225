//! Helpers shared by the ipvs-netlink kernel suites (`mod ipvs_support;`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::future::Future;

use ipvs_netlink::IpvsHandle;
use ipvs_proxier_tests::Netns;

/// A multi-threaded runtime for tests that drive handles from the root namespace.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs `f` with a handle built inside `ns` from the (root-namespace) test thread.
pub fn with_handle<F, Fut, T>(ns: &Netns, f: F) -> T
where
    F: FnOnce(IpvsHandle) -> Fut,
    Fut: Future<Output = T>,
{
    let rt = runtime();
    let path = ns.path();
    rt.block_on(async move {
        let h = IpvsHandle::new_in_netns(path)
            .await
            .expect("handle in netns");
        f(h).await
    })
}

/// A namespace with a dummy link carrying 10.1.0.254/16 and fd00:1::fe/64, so that
/// masquerading destinations in those ranges are routable.
pub fn netns_with_routes() -> Netns {
    let ns = Netns::new();
    ns.sh_ok(
        "ip link add d0 type dummy && ip link set d0 up && \
         ip addr add 10.1.0.254/16 dev d0 && ip -6 addr add fd00:1::fe/64 dev d0 nodad",
    );
    ns
}

/// `ipvsadm -Sn` in `ns`, as a set of whitespace-normalised lines.
pub fn saved_rules(ns: &Netns) -> BTreeSet<String> {
    ns.sh_ok("ipvsadm -Sn")
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// The set of the given lines.
pub fn lines(ls: &[&str]) -> BTreeSet<String> {
    ls.iter().map(|s| s.to_string()).collect()
}
