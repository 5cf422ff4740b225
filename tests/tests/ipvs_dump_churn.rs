//! ipvs-netlink against the real kernel: a full read stays complete while IPVS services
//! come and go in another network namespace.
//!
//! The kernel resumes a multi-part service dump by a position counting the services of
//! every namespace, so churn elsewhere makes single dumps skip services of ours. In a
//! binary of its own: the churn disturbs every service dump on the machine (ipvsadm's
//! too), so no other test may dump while it runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ipvs_support;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ipvs_netlink::{Destination, IpvsHandle, Op, Scheduler, Service, ServiceKey, Table};
use ipvs_proxier_tests::{Netns, require_kernel};
use ipvs_support::*;

/// Services in the namespace that is read.
const SERVICES: u32 = 3000;
/// Services of those with one destination.
const WITH_DESTINATION: u32 = 20;
/// Pause between two changes of the churn (one add or one delete).
const CHURN_PAUSE: Duration = Duration::from_millis(10);
/// Single dumps and verified reads made under churn.
const RAW_READS: usize = 12;
const VERIFIED_READS: usize = 3;

fn key(i: u32) -> ServiceKey {
    let [_, _, hi, lo] = i.to_be_bytes();
    ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 70, hi, lo)), 80)
}

/// The table in `ipvsadm -Sn` form (every service here is a TCP service without flags).
fn as_rules(table: &Table) -> BTreeSet<String> {
    let mut rules = BTreeSet::new();
    for (s, dests) in table {
        let ServiceKey::Tuple { addr, port, .. } = s.service.key else {
            panic!("unexpected service {:?}", s.service.key);
        };
        rules.insert(format!("-A -t {addr}:{port} -s {}", s.service.scheduler));
        for d in dests {
            let d = &d.destination;
            rules.insert(format!(
                "-a -t {addr}:{port} -r {}:{} -m -w {}",
                d.addr, d.port, d.weight
            ));
        }
    }
    rules
}

/// Adds and deletes services in `ns`, one change every [`CHURN_PAUSE`], until `stop`;
/// counts the changes made.
fn start_churn(
    ns: &Netns,
    stop: Arc<AtomicBool>,
    changes: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let path = ns.path();
    std::thread::spawn(move || {
        let rt = runtime();
        rt.block_on(async move {
            let h = IpvsHandle::new_in_netns(path).await.unwrap();
            let mut n: u32 = 0;
            while !stop.load(Ordering::Relaxed) {
                // Spread over the kernel's hash table, like real services.
                let [_, _, hi, lo] = n.wrapping_mul(2_654_435_761).to_be_bytes();
                let k = ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 99, hi, lo)), 80);
                h.add_service(&Service::new(k, Scheduler::RoundRobin))
                    .await
                    .unwrap();
                changes.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(CHURN_PAUSE).await;
                h.delete_service(&k).await.unwrap();
                changes.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(CHURN_PAUSE).await;
                n = n.wrapping_add(1);
            }
        });
    })
}

/// A line on the real stderr (libtest captures `eprintln!` of passing tests).
fn report(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

#[test]
fn ipvs_verified_table_is_complete_under_churn_in_another_namespace() {
    require_kernel!();
    let started = Instant::now();
    let ns = netns_with_routes();
    let other = Netns::new();
    with_handle(&ns, |h| async move {
        let mut ops: Vec<Op> = (0..SERVICES)
            .map(|i| Op::AddService(Service::new(key(i), Scheduler::RoundRobin)))
            .collect();
        for i in 0..WITH_DESTINATION {
            let [_, _, hi, lo] = (i + 1).to_be_bytes();
            let d = Destination::new(IpAddr::V4(Ipv4Addr::new(10, 1, hi, lo)), 8080);
            ops.push(Op::AddDestination(key(i * 97), d));
        }
        let results = h.batch(ops).await;
        assert!(
            results.iter().all(|r| r.is_ok()),
            "{:?}",
            results.iter().find(|r| r.is_err())
        );
    });
    let truth = saved_rules(&ns);
    assert_eq!(
        truth.len(),
        (SERVICES + WITH_DESTINATION) as usize,
        "ipvsadm without churn"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(AtomicU64::new(0));
    let churn = start_churn(&other, stop.clone(), changes.clone());
    let t = truth.clone();
    let c = changes.clone();
    let (raw_wrong, attempts, changes_during) = with_handle(&ns, |h| async move {
        while c.load(Ordering::Relaxed) < 20 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let at_start = c.load(Ordering::Relaxed);
        let mut raw_wrong = Vec::new();
        let mut attempts = Vec::new();
        for round in 0..RAW_READS {
            let raw = as_rules(&h.table_best_effort().await.unwrap());
            if raw != t {
                raw_wrong.push(t.difference(&raw).count());
            }
            if round % (RAW_READS / VERIFIED_READS) == 0 {
                let read = h.table_verified().await.unwrap();
                assert!(
                    read.verified,
                    "no two of {} dumps agreed under churn",
                    read.attempts
                );
                attempts.push(read.attempts);
                let got = as_rules(&read.table);
                assert_eq!(
                    got.len(),
                    t.len(),
                    "verified read after {} dumps: missing {:?}, extra {:?}",
                    read.attempts,
                    t.difference(&got).take(5).collect::<Vec<_>>(),
                    got.difference(&t).take(5).collect::<Vec<_>>()
                );
                assert_eq!(got, t, "verified read after {} dumps", read.attempts);
            }
        }
        // `table()` is the verified read.
        assert_eq!(as_rules(&h.table().await.unwrap()), t);
        (raw_wrong, attempts, c.load(Ordering::Relaxed) - at_start)
    });
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    // With the churn stopped, ipvsadm's own dump is reliable again.
    assert_eq!(saved_rules(&ns), truth, "ipvsadm -Sn after the churn");
    assert!(
        changes_during >= 20,
        "only {changes_during} changes in the other namespace during the reads"
    );
    report(&format!(
        "ipvs_dump_churn: {changes_during} changes in another namespace during the reads; \
         {} of {RAW_READS} single dumps incomplete (services missing: {raw_wrong:?}); \
         verified reads took {attempts:?} dumps; {:.1} s",
        raw_wrong.len(),
        started.elapsed().as_secs_f64()
    ));
}
