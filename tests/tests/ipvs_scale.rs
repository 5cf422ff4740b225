//! ipvs-netlink against the real kernel: namespace isolation, concurrency, large dumps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ipvs_support;

use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt;
use ipvs_netlink::{Destination, IpvsHandle, Scheduler, Service, ServiceKey};
use ipvs_proxier_tests::require_kernel;
use ipvs_support::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn ipvs_namespaces_are_isolated() {
    require_kernel!();
    let a = netns_with_routes();
    let b = netns_with_routes();
    b.sh_ok("ipvsadm -A -t 10.9.9.9:80 -s rr && ipvsadm -a -t 10.9.9.9:80 -r 10.1.0.9:80 -m");
    let key_a = ServiceKey::tcp(ip("10.0.0.1"), 80);
    // Handle A from a path, built from this (root-namespace) thread.
    with_handle(&a, |h| async move {
        h.add_service(&Service::new(key_a, Scheduler::RoundRobin))
            .await
            .unwrap();
        let seen: Vec<_> = h.services().try_collect().await.unwrap();
        assert_eq!(seen.len(), 1, "A sees only its own service: {seen:?}");
        assert_eq!(seen[0].service.key, key_a);
        let table = h.table().await.unwrap();
        assert_eq!(table.len(), 1);
        h.flush().await.unwrap();
    });
    assert!(saved_rules(&a).is_empty());
    assert_eq!(
        saved_rules(&b),
        lines(&[
            "-A -t 10.9.9.9:80 -s rr",
            "-a -t 10.9.9.9:80 -r 10.1.0.9:80 -m -w 1"
        ]),
        "flush in A left B untouched"
    );
    // Handle B from an fd.
    let fd = std::fs::File::open(b.path()).unwrap();
    let rt = runtime();
    let seen_b = rt.block_on(async move {
        let h = IpvsHandle::new_in_netns(fd).await.unwrap();
        h.services().try_collect::<Vec<_>>().await.unwrap()
    });
    assert_eq!(seen_b.len(), 1);
    assert_eq!(seen_b[0].service.key, ServiceKey::tcp(ip("10.9.9.9"), 80));
    // A handle built on a thread that itself entered B (IpvsHandle::new) sees B.
    let seen_b_inside = b.block_on(|| async {
        let h = IpvsHandle::new().await.unwrap();
        h.services().try_collect::<Vec<_>>().await.unwrap().len()
    });
    assert_eq!(seen_b_inside, 1);
    // The root namespace saw none of it.
    let root = rt.block_on(async {
        let h = IpvsHandle::new().await.unwrap();
        h.services().try_collect::<Vec<_>>().await.unwrap()
    });
    assert!(root.iter().all(|e| e.service.key != key_a
        && e.service.key != ServiceKey::tcp(ip("10.9.9.9"), 80)));
}

#[test]
fn ipvs_many_tasks_share_one_handle() {
    require_kernel!();
    let ns = netns_with_routes();
    const TASKS: u8 = 16;
    const PER_TASK: u8 = 20;
    with_handle(&ns, |h| async move {
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let h = h.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..PER_TASK {
                    let key = ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 50, t, i + 1)), 80);
                    let sched = if i % 2 == 0 {
                        Scheduler::RoundRobin
                    } else {
                        Scheduler::LeastConnection
                    };
                    h.add_service(&Service::new(key, sched.clone()))
                        .await
                        .unwrap();
                    h.add_destination(
                        &key,
                        &Destination::new(IpAddr::V4(Ipv4Addr::new(10, 1, t, i + 1)), 8080),
                    )
                    .await
                    .unwrap();
                    // The reply must be about the service this task asked for.
                    let got = h.service(&key).await.unwrap();
                    assert_eq!(got.service.key, key);
                    assert_eq!(got.service.scheduler, sched);
                    let dests: Vec<_> = h.destinations(&key).try_collect().await.unwrap();
                    assert_eq!(dests.len(), 1);
                    assert_eq!(
                        dests[0].destination.addr,
                        IpAddr::V4(Ipv4Addr::new(10, 1, t, i + 1))
                    );
                    if i % 5 == 0 {
                        // Full dumps interleaved with other tasks' requests.
                        let all: Vec<_> = h.services().try_collect().await.unwrap();
                        assert!(all.iter().any(|e| e.service.key == key));
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let all: Vec<_> = h.services().try_collect().await.unwrap();
        assert_eq!(all.len(), usize::from(TASKS) * usize::from(PER_TASK));
    });
    let saved = saved_rules(&ns);
    assert_eq!(saved.iter().filter(|l| l.starts_with("-A ")).count(), 320);
    assert_eq!(saved.iter().filter(|l| l.starts_with("-a ")).count(), 320);
}
