use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_core::Emitable;

use super::*;
use crate::message::{Counter, IpvsAttr, ServiceAttr, StatsAttr};
use crate::{Scheduler, Service, Stats};

fn entry(i: u8, scheduler: Scheduler, packets: u64) -> ServiceEntry {
    let key = ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)), 80);
    ServiceEntry {
        service: Service::new(key, scheduler),
        stats: Stats {
            in_packets: packets,
            ..Stats::default()
        },
    }
}

/// The service nest the kernel would send for `entry` (configuration, then 64-bit
/// statistics with the entry's packet count).
fn record_of(entry: &ServiceEntry) -> Vec<u8> {
    let msg = IpvsMessage::new_service(&entry.service).expect("encodable");
    let Some(IpvsAttr::Service(mut nest)) = msg.nlas.into_iter().next() else {
        panic!("NEW_SERVICE without a service attribute");
    };
    nest.nlas.push(ServiceAttr::Stats64(
        vec![StatsAttr::InPackets(Counter::U64(entry.stats.in_packets))].into(),
    ));
    let slice = nest.nlas.as_slice();
    let mut buf = vec![0; slice.buffer_len()];
    slice.emit(&mut buf);
    buf
}

/// Runs `merge_dumps` over a fixed sequence of dumps (the last one repeated), with
/// `exists` answering the exact reads; also returns the keys read exactly.
fn run(
    dumps: Vec<Vec<ServiceEntry>>,
    exists: &[ServiceEntry],
    max: u32,
) -> (Vec<ServiceEntry>, u32, bool, Vec<ServiceKey>) {
    let mut i = 0;
    let mut asked = Vec::new();
    let mut found = Vec::new();
    let merge = merge_dumps(
        max,
        |each| {
            for entry in &dumps[i.min(dumps.len() - 1)] {
                each(Ok(&record_of(entry)));
            }
            i += 1;
            Ok(())
        },
        |key| {
            asked.push(*key);
            Ok(exists.iter().find(|e| e.service.key == *key).cloned())
        },
        |keys| found.extend_from_slice(keys),
    )
    .expect("no error");
    // Every key merged was handed to the destination workers, once.
    let mut handed = found.clone();
    handed.sort();
    handed.dedup();
    assert_eq!(handed.len(), found.len(), "a key handed out twice");
    for key in merge.services.keys() {
        assert!(found.contains(key), "{key} never handed out");
    }
    let (attempts, verified) = (merge.attempts, merge.verified());
    let got = merge.services.into_values().collect();
    (got, attempts, verified, asked)
}

fn keys(entries: &[ServiceEntry]) -> Vec<ServiceKey> {
    let mut k: Vec<ServiceKey> = entries.iter().map(|e| e.service.key).collect();
    k.sort();
    k
}

#[test]
fn skipped_services_are_found_by_merging_dumps() {
    let rr = Scheduler::RoundRobin;
    let all: Vec<ServiceEntry> = (1..=5).map(|i| entry(i, rr.clone(), 0)).collect();
    let without = |skip: &[u8]| -> Vec<ServiceEntry> {
        all.iter()
            .filter(|e| {
                !skip
                    .iter()
                    .any(|&i| e.service.key == entry(i, rr.clone(), 0).service.key)
            })
            .cloned()
            .collect()
    };
    // Nothing disturbed: two dumps in a row bring nothing new, nothing is read one by one.
    let (got, attempts, verified, asked) = run(vec![all.clone()], &all, 8);
    assert_eq!((attempts, verified), (3, true));
    assert_eq!(got, all);
    assert!(asked.is_empty());

    // Every dump skips something, never the same service twice: the third and fourth
    // dumps bring nothing new; what the last one skipped is read exactly.
    let (got, attempts, verified, asked) = run(
        vec![without(&[2]), without(&[4]), without(&[1, 5])],
        &all,
        8,
    );
    assert_eq!((attempts, verified), (4, true));
    assert_eq!(keys(&got), keys(&all));
    assert_eq!(asked.len(), 2);

    // Counters differ between dumps: not a disagreement.
    let mut busier = all.clone();
    busier[0].stats.in_packets = 7;
    let (_, attempts, verified, _) = run(vec![all.clone(), busier], &all, 8);
    assert_eq!((attempts, verified), (3, true));

    // A configuration change is new information: one more dump.
    let mut changed = all.clone();
    changed[1].service.scheduler = Scheduler::WeightedLeastConnection;
    let (got, attempts, verified, _) = run(vec![all.clone(), changed.clone()], &changed, 8);
    assert_eq!((attempts, verified), (4, true));
    assert_eq!(got, changed);

    // A service deleted meanwhile (in an earlier dump, not in the last ones, and gone
    // when read) is dropped.
    let gone = without(&[3]);
    let (got, _, verified, asked) = run(vec![all.clone(), gone.clone()], &gone, 8);
    assert!(verified);
    assert_eq!(keys(&got), keys(&gone));
    assert_eq!(asked, vec![all[2].service.key]);

    // New services in every dump: bounded, unverified.
    let growing: Vec<Vec<ServiceEntry>> = (1..=10)
        .map(|n| (1..=n).map(|i| entry(i, rr.clone(), 0)).collect())
        .collect();
    let (got, attempts, verified, _) = run(growing, &all, 8);
    assert_eq!((attempts, verified), (8, false));
    assert_eq!(got.len(), 8);

    // A single dump is taken as it is.
    let (got, attempts, verified, asked) = run(vec![without(&[2])], &all, 1);
    assert_eq!((attempts, verified, got.len()), (1, false, 4));
    assert!(asked.is_empty());
}

#[test]
fn a_single_dump_that_repeats_a_service_keeps_its_last_configuration_and_hands_it_out_once() {
    let rr = Scheduler::RoundRobin;
    let mut dump: Vec<ServiceEntry> = (1..=3).map(|i| entry(i, rr.clone(), 0)).collect();
    // A disturbed dump shows service 2 again (resumed at a shifted position), changed since.
    let mut again = entry(2, Scheduler::WeightedLeastConnection, 0);
    again.stats.in_packets = 9;
    dump.push(again.clone());
    let (got, attempts, verified, asked) = run(vec![dump], &[], 1);
    assert_eq!((attempts, verified), (1, false));
    assert!(asked.is_empty());
    let expected = vec![entry(1, rr.clone(), 0), again, entry(3, rr, 0)];
    assert_eq!(got, expected);
}

#[test]
fn dumped_destinations_join_their_services_and_a_dump_of_a_service_gone_is_dropped() {
    let rr = Scheduler::RoundRobin;
    let dest = |last: u8| DestinationEntry {
        destination: crate::Destination::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, last)), 8080),
        active_conns: 0,
        inactive_conns: 0,
        persistent_conns: 0,
        stats: Stats::default(),
    };
    let services: BTreeMap<ServiceKey, ServiceEntry> = [1, 3, 4, 6]
        .into_iter()
        .map(|i| {
            let e = entry(i, rr.clone(), 0);
            (e.service.key, e)
        })
        .collect();
    let key = |i| entry(i, rr.clone(), 0).service.key;
    // As the workers hand them in: out of order; 2 and 5 were dumped, then left the list;
    // 4 was never dumped.
    let dumped = vec![
        (key(6), vec![dest(61)]),
        (key(2), vec![dest(21)]),
        (key(1), vec![dest(11), dest(12)]),
        (key(5), vec![dest(51)]),
        (key(3), vec![]),
    ];
    let table = join(services.into_values(), dumped);
    let got: Vec<(ServiceKey, Vec<DestinationEntry>)> = table
        .into_iter()
        .map(|(service, dests)| (service.service.key, dests))
        .collect();
    assert_eq!(
        got,
        vec![
            (key(1), vec![dest(11), dest(12)]),
            (key(3), vec![]),
            (key(4), vec![]),
            (key(6), vec![dest(61)]),
        ]
    );
}
