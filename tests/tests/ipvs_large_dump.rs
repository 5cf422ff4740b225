//! ipvs-netlink against the real kernel: a dump of 10,000 services.
//!
//! In a binary of its own so that no other test changes IPVS (in any namespace) while it
//! dumps: the kernel resumes service dumps by position in a table shared by all
//! namespaces.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ipvs_support;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt;
use ipvs_netlink::{Op, Scheduler, Service, ServiceKey};
use ipvs_proxier_tests::require_kernel;
use ipvs_support::*;

#[test]
fn ipvs_dump_of_10000_services() {
    require_kernel!();
    let ns = netns_with_routes();
    let keys: Vec<ServiceKey> = (0..10_000u32)
        .map(|i| {
            let [_, _, hi, lo] = i.to_be_bytes();
            ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 60, hi, lo)), 80)
        })
        .collect();
    let k = keys.clone();
    with_handle(&ns, |h| async move {
        let ops: Vec<Op> = k
            .iter()
            .map(|key| Op::AddService(Service::new(*key, Scheduler::RoundRobin)))
            .collect();
        let results = h.batch(ops).await;
        assert_eq!(results.len(), 10_000);
        assert!(
            results.iter().all(|r| r.is_ok()),
            "{:?}",
            results.iter().find(|r| r.is_err())
        );
        let dumped: Vec<_> = h.services().try_collect().await.unwrap();
        assert_eq!(dumped.len(), 10_000);
        let unique: HashSet<ServiceKey> = dumped.iter().map(|e| e.service.key).collect();
        assert_eq!(unique, k.iter().copied().collect::<HashSet<_>>());
        let table = h.table().await.unwrap();
        assert_eq!(table.len(), 10_000);
        let unique: HashSet<ServiceKey> = table.iter().map(|e| e.0.service.key).collect();
        assert_eq!(unique.len(), 10_000);
    });
    let count = ns.sh_ok("ipvsadm -Sn | grep -c '^-A'");
    assert_eq!(count.trim(), "10000");
}
