//! ipvs-netlink against the real kernel: every error case maps to its typed error.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Confining one test thread (`unshare`) takes a system call std does not wrap.
#![allow(unsafe_code)]

mod ipvs_support;

use std::net::IpAddr;

use futures::TryStreamExt;
use ipvs_netlink::message::IpvsMessage;
use ipvs_netlink::transport::NetlinkSocket;
use ipvs_netlink::{
    AddressFamily, Destination, DestinationKey, Error, ForwardMethod, IpvsHandle, Object, Op,
    Operation, Scheduler, Service, ServiceKey, SyncDaemon, SyncState,
};
use ipvs_proxier_tests::{Netns, require_kernel};
use ipvs_support::*;
use netlink_packet_generic::GenlMessage;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Both tests make the kernel look for a scheduler module that does not exist (it runs
/// `modprobe ip_vs_nosuch` while holding the IPVS mutex); they take turns.
static MODPROBING: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn ipvs_errors_are_typed_per_operation() {
    require_kernel!();
    let _turn = MODPROBING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ns = netns_with_routes();
    ns.sh_ok("ipvsadm -A -t 10.0.0.1:80 -s rr && ipvsadm -a -t 10.0.0.1:80 -r 10.1.0.5:8080 -m");
    let existing = ServiceKey::tcp(ip("10.0.0.1"), 80);
    let missing = ServiceKey::tcp(ip("10.0.0.2"), 80);
    with_handle(&ns, |h| async move {
        let e = h
            .step(
                "add_service",
                h.add_service(&Service::new(existing, Scheduler::RoundRobin)),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::ServiceExists { op: Operation::AddService, service } if service == existing),
            "{e:?}"
        );
        let e = h
            .step("delete_service", h.delete_service(&missing))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::ServiceNotFound {
                    op: Operation::DeleteService,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = h
            .step(
                "update_service",
                h.update_service(&Service::new(missing, Scheduler::RoundRobin)),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::ServiceNotFound {
                    op: Operation::UpdateService,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = h.step("service", h.service(&missing)).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::ServiceNotFound {
                    op: Operation::GetService,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = h.step("zero", h.zero(Some(&missing))).await.unwrap_err();
        assert!(
            matches!(
                e,
                Error::ServiceNotFound {
                    op: Operation::Zero,
                    ..
                }
            ),
            "{e:?}"
        );
        let nosuch = Service::new(missing, Scheduler::Other("nosuch".into()));
        let e = h
            .step("add_service (unknown scheduler)", h.add_service(&nosuch))
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::SchedulerNotFound { ref scheduler, .. } if scheduler == "nosuch"),
            "{e:?}"
        );
        let nosuch = Service::new(existing, Scheduler::Other("nosuch".into()));
        let e = h
            .step(
                "update_service (unknown scheduler)",
                h.update_service(&nosuch),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::SchedulerNotFound {
                    op: Operation::UpdateService,
                    ..
                }
            ),
            "{e:?}"
        );
        // Client-side: names over 15 bytes never reach the kernel.
        let too_long = Service::new(missing, Scheduler::Other("a-name-of-16-byt".into()));
        let e = h
            .step("add_service (long name)", h.add_service(&too_long))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidField {
                    op: Operation::AddService,
                    field: "scheduler name",
                    ..
                }
            ),
            "{e:?}"
        );

        let dest = Destination::new(ip("10.1.0.5"), 8080);
        let e = h
            .step("add_destination", h.add_destination(&missing, &dest))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::ServiceNotFound {
                    op: Operation::AddDestination,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = h
            .step("add_destination", h.add_destination(&existing, &dest))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::DestinationExists {
                    op: Operation::AddDestination,
                    ..
                }
            ),
            "{e:?}"
        );
        let gone = Destination::new(ip("10.1.0.9"), 1);
        let e = h
            .step("update_destination", h.update_destination(&existing, &gone))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::DestinationNotFound {
                    op: Operation::UpdateDestination,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = h
            .step(
                "delete_destination",
                h.delete_destination(
                    &existing,
                    &DestinationKey {
                        addr: ip("10.1.0.9"),
                        port: 1,
                    },
                ),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::DestinationNotFound {
                    op: Operation::DeleteDestination,
                    ..
                }
            ),
            "{e:?}"
        );

        // Mixed family is only allowed with tunnelling: EINVAL names op and object.
        let e = h
            .step(
                "add_destination",
                h.add_destination(&existing, &Destination::new(ip("fd00:1::9"), 80)),
            )
            .await
            .unwrap_err();
        match &e {
            Error::InvalidArgument {
                op,
                object: Object::Destination(service, dest),
                errno,
            } => {
                assert_eq!(*op, Operation::AddDestination);
                assert_eq!(*errno, libc::EINVAL);
                assert_eq!(*service, existing);
                assert_eq!(dest.to_string(), "[fd00:1::9]:80");
                let text = e.to_string();
                assert!(
                    text.contains("[fd00:1::9]:80") && text.contains("TCP 10.0.0.1:80"),
                    "{text}"
                );
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        // An IPv6 service with a /0 prefix is refused before it is sent.
        let mut v6 = Service::new(ServiceKey::tcp(ip("fd00::1"), 80), Scheduler::RoundRobin);
        v6.netmask = ipvs_netlink::Netmask::V6Prefix(0);
        assert!(matches!(
            h.step("add_service", h.add_service(&v6)).await,
            Err(Error::OutOfRange { .. })
        ));
        let e = h
            .step(
                "stop_sync_daemon (backup, none running)",
                h.stop_sync_daemon(SyncState::Backup),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::SyncDaemonNotFound {
                    state: SyncState::Backup,
                    ..
                }
            ),
            "{e:?}"
        );
        h.step(
            "start_sync_daemon",
            h.start_sync_daemon(&SyncDaemon::new(SyncState::Master, "d0", 1)),
        )
        .await
        .unwrap();
        let e = h
            .step(
                "start_sync_daemon",
                h.start_sync_daemon(&SyncDaemon::new(SyncState::Master, "d0", 1)),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::SyncDaemonExists {
                    state: SyncState::Master,
                    ..
                }
            ),
            "{e:?}"
        );
        h.step(
            "stop_sync_daemon (master, running)",
            h.stop_sync_daemon(SyncState::Master),
        )
        .await
        .unwrap();
        // An interface that does not exist: ENODEV, its own variant.
        let e = h
            .step(
                "start_sync_daemon",
                h.start_sync_daemon(&SyncDaemon::new(SyncState::Backup, "nosuch0", 1)),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InterfaceNotFound {
                    op: Operation::StartSyncDaemon,
                    state: SyncState::Backup,
                    ref interface,
                } if interface == "nosuch0"
            ),
            "{e:?}"
        );

        // The dump of a missing service's destinations is empty, not an error.
        let none: Vec<_> = h
            .step("destinations", h.destinations(&missing).try_collect())
            .await
            .unwrap();
        assert!(none.is_empty());
    });
    // Nothing above changed the table.
    assert_eq!(
        saved_rules(&ns),
        lines(&[
            "-A -t 10.0.0.1:80 -s rr",
            "-a -t 10.0.0.1:80 -r 10.1.0.5:8080 -m -w 1"
        ])
    );
}

#[test]
fn ipvs_batch_reports_each_failure_and_applies_the_rest() {
    require_kernel!();
    let _turn = MODPROBING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ns = netns_with_routes();
    let a = ServiceKey::tcp(ip("10.0.0.1"), 80);
    let b = ServiceKey::udp(ip("10.0.0.2"), 53);
    with_handle(&ns, |h| async move {
        let ops = vec![
            Op::AddService(Service::new(a, Scheduler::RoundRobin)),
            Op::AddService(Service::new(a, Scheduler::RoundRobin)), // exists
            Op::AddDestination(a, Destination::new(ip("10.1.0.5"), 8080)),
            Op::AddDestination(b, Destination::new(ip("10.1.0.5"), 53)), // no service b
            Op::AddService(Service::new(b, Scheduler::Other("nosuch".into()))),
            Op::AddService(Service::new(b, Scheduler::WeightedRoundRobin)),
            Op::AddDestination(b, Destination::new(ip("10.1.0.6"), 53).with_weight(3)),
            Op::DeleteDestination(
                a,
                DestinationKey {
                    addr: ip("10.1.0.99"),
                    port: 1,
                },
            ),
            Op::UpdateDestination(a, Destination::new(ip("10.1.0.5"), 8080).with_weight(7)),
            Op::DeleteService(ServiceKey::fwmark(9, AddressFamily::Inet)),
            Op::AddService(Service::new(
                b,
                Scheduler::Other("way-too-long-name".into()),
            )),
        ];
        let r = h.step("batch", h.batch(ops)).await;
        assert_eq!(r.len(), 11);
        assert!(r[0].is_ok(), "{:?}", r[0]);
        assert!(
            matches!(r[1], Err(Error::ServiceExists { .. })),
            "{:?}",
            r[1]
        );
        assert!(r[2].is_ok(), "{:?}", r[2]);
        assert!(
            matches!(
                r[3],
                Err(Error::ServiceNotFound {
                    op: Operation::AddDestination,
                    ..
                })
            ),
            "{:?}",
            r[3]
        );
        assert!(
            matches!(r[4], Err(Error::SchedulerNotFound { .. })),
            "{:?}",
            r[4]
        );
        assert!(r[5].is_ok(), "{:?}", r[5]);
        assert!(r[6].is_ok(), "{:?}", r[6]);
        assert!(
            matches!(r[7], Err(Error::DestinationNotFound { .. })),
            "{:?}",
            r[7]
        );
        assert!(r[8].is_ok(), "{:?}", r[8]);
        assert!(
            matches!(
                r[9],
                Err(Error::ServiceNotFound {
                    op: Operation::DeleteService,
                    ..
                })
            ),
            "{:?}",
            r[9]
        );
        assert!(
            matches!(
                r[10],
                Err(Error::InvalidField {
                    field: "scheduler name",
                    ..
                })
            ),
            "{:?}",
            r[10]
        );
    });
    assert_eq!(
        saved_rules(&ns),
        lines(&[
            "-A -t 10.0.0.1:80 -s rr",
            "-a -t 10.0.0.1:80 -r 10.1.0.5:8080 -m -w 7",
            "-A -u 10.0.0.2:53 -s wrr",
            "-a -u 10.0.0.2:53 -r 10.1.0.6:53 -m -w 3",
        ])
    );
}

/// One IPVS request for ipvs-netlink's blocking socket.
fn genl(family: u16, msg: IpvsMessage) -> GenlMessage<IpvsMessage> {
    let mut genl = GenlMessage::from_payload(msg);
    genl.set_resolved_family_id(family);
    genl
}

/// A sync daemon stopped right after it was started may not have run yet: the kernel stops
/// it all the same but answers -EINTR (stopping a kernel thread that never ran), and netlink
/// sends no reply at all for that errno. Such a stop once left `stop_sync_daemon` waiting
/// forever (the 60 s stall of CI). Every stop must be answered, and mean stopped: on the
/// handle's connection, one request at a time, and pipelined on the blocking socket, where
/// the kernel handles each stop right behind its start, before the new thread can run.
#[test]
fn ipvs_sync_daemons_stopped_before_they_ran_are_answered() {
    require_kernel!();
    const ROUNDS: usize = 30;
    let ns = netns_with_routes();
    let master = SyncDaemon::new(SyncState::Master, "d0", 1);
    let (family, counts) = with_handle(&ns, |h| {
        let master = master.clone();
        async move {
            for round in 0..ROUNDS {
                h.step("start_sync_daemon", h.start_sync_daemon(&master))
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: start: {e}"));
                h.step(
                    "stop_sync_daemon (just started)",
                    h.stop_sync_daemon(SyncState::Master),
                )
                .await
                .unwrap_or_else(|e| panic!("round {round}: stop: {e}"));
            }
            let left = h.step("sync_daemons", h.sync_daemons()).await.unwrap();
            assert!(left.is_empty(), "{left:?}");
            (h.family_id(), format!("{h:?}"))
        }
    });
    println!("ipvs_errors: {ROUNDS} starts and stops, one at a time: {counts}");

    let (answers, took) = ns.block_on(|| async move {
        let mut socket = NetlinkSocket::open(libc::NETLINK_GENERIC as isize).expect("socket");
        let requests = (0..ROUNDS).flat_map(|round| {
            [
                (
                    (round, "start"),
                    genl(family, IpvsMessage::new_daemon(&master).unwrap()),
                ),
                (
                    (round, "stop"),
                    genl(family, IpvsMessage::del_daemon(SyncState::Master)),
                ),
            ]
        });
        let started = std::time::Instant::now();
        let mut answers = Vec::new();
        socket.pipeline(requests, |tag, answer| {
            answers.push((tag, format!("{answer:?}")))
        });
        (answers, started.elapsed())
    });
    // Exactly one answer per request (a stop without a reply is answered last, when the
    // barrier's acknowledgement comes).
    let mut tags: Vec<_> = answers.iter().map(|(tag, _)| *tag).collect();
    tags.sort();
    let expected: Vec<_> = (0..ROUNDS)
        .flat_map(|round| [(round, "start"), (round, "stop")])
        .collect();
    assert_eq!(tags, expected, "{answers:?}");
    let mut swallowed = 0;
    for ((round, what), answer) in &answers {
        match (*what, answer.as_str()) {
            (_, "Ack") => {}
            ("stop", "Errno(4)") => swallowed += 1,
            _ => panic!("round {round}: {what}: {answer}"),
        }
    }
    // Without the barrier the pipeline waited for the swallowed acks until its 30 s
    // receive timeout.
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    assert_eq!(ns.sh_ok("ipvsadm -L --daemon").trim(), "");
    println!(
        "ipvs_errors: {ROUNDS} starts and stops pipelined in {took:?}: {swallowed} stops \
         before the thread ran (no reply from the kernel, answered by the barrier)"
    );
}

/// The range error of a result, as (field, value, last accepted value).
fn out_of_range(r: &Result<(), Error>) -> (&'static str, u64, u64) {
    match r {
        Err(Error::OutOfRange {
            field,
            value,
            range,
            ..
        }) => (field, *value, *range.end()),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
}

#[test]
fn ipvs_values_the_kernel_cannot_hold_are_refused_before_sending() {
    require_kernel!();
    let ns = netns_with_routes();
    let a = ServiceKey::tcp(ip("10.0.0.1"), 80);
    with_handle(&ns, |h| async move {
        // The kernel would store timeout x HZ in 32 bits: 20,000,000 s reads back changed.
        let wrapping = Service::new(a, Scheduler::RoundRobin).persistent(20_000_000);
        let r = h.step("add_service", h.add_service(&wrapping)).await;
        assert_eq!(
            out_of_range(&r),
            ("persistence timeout", 20_000_000, 4_294_967)
        );
        // The longest accepted timeout is stored as given.
        let longest = Service::new(a, Scheduler::RoundRobin).persistent(4_294_967);
        h.step("add_service", h.add_service(&longest))
            .await
            .unwrap();
        let got = h.step("service", h.service(&a)).await.unwrap();
        assert_eq!(got.service, longest);
        let r = h.step("update_service", h.update_service(&wrapping)).await;
        assert_eq!(out_of_range(&r).0, "persistence timeout");

        // The sync ID is one byte in the kernel: 300 would become 44.
        let r = h
            .step(
                "start_sync_daemon",
                h.start_sync_daemon(&SyncDaemon::new(SyncState::Backup, "d0", 300)),
            )
            .await;
        assert_eq!(out_of_range(&r), ("sync ID", 300, 255));
        assert!(
            h.step("sync_daemons", h.sync_daemons())
                .await
                .unwrap()
                .is_empty()
        );

        let before = h.step("timeouts", h.timeouts()).await.unwrap();
        let r = h
            .step(
                "set_timeouts",
                h.set_timeouts(&ipvs_netlink::Timeouts {
                    tcp: 3_000_000,
                    tcp_fin: 0,
                    udp: 0,
                }),
            )
            .await;
        assert_eq!(out_of_range(&r), ("TCP timeout", 3_000_000, 2_678_400));
        assert_eq!(h.step("timeouts", h.timeouts()).await.unwrap(), before);

        // In a batch, each invalid op gets its own error and the others still go.
        let mut low_above_high = Destination::new(ip("10.1.0.7"), 80);
        low_above_high.upper_threshold = 5;
        low_above_high.lower_threshold = 6;
        let mut gue_port_0 =
            Destination::new(ip("10.1.0.8"), 80).with_forward(ForwardMethod::Tunnel);
        gue_port_0.tunnel.kind = ipvs_netlink::TunnelType::Gue;
        let r = h
            .step(
                "batch",
                h.batch(vec![
                    Op::AddDestination(a, Destination::new(ip("10.1.0.5"), 80)),
                    Op::AddDestination(
                        a,
                        Destination::new(ip("10.1.0.6"), 80).with_weight(1 << 31),
                    ),
                    Op::AddDestination(a, low_above_high),
                    Op::AddDestination(a, gue_port_0),
                    Op::UpdateService(wrapping),
                    Op::AddDestination(a, Destination::new(ip("10.1.0.9"), 80).with_weight(0)),
                ]),
            )
            .await;
        assert_eq!(r.len(), 6);
        assert!(r[0].is_ok(), "{:?}", r[0]);
        assert_eq!(out_of_range(&r[1]), ("weight", 1 << 31, i32::MAX as u64));
        assert_eq!(out_of_range(&r[2]), ("lower threshold", 6, 5));
        assert_eq!(out_of_range(&r[3]), ("GUE tunnel port", 0, 65535));
        assert_eq!(out_of_range(&r[4]).0, "persistence timeout");
        assert!(r[5].is_ok(), "{:?}", r[5]);
    });
    assert_eq!(
        saved_rules(&ns),
        lines(&[
            "-A -t 10.0.0.1:80 -s rr -p 4294967",
            "-a -t 10.0.0.1:80 -r 10.1.0.5:80 -m -w 1",
            "-a -t 10.0.0.1:80 -r 10.1.0.9:80 -m -w 0",
        ])
    );
}

/// Runs on the host too: where the kernel has no IPVS (`/proc/net/ip_vs` absent, as on
/// the development machines) the handle fails with `IpvsUnavailable`; where it has IPVS
/// (the VM) the handle works.
#[test]
fn ipvs_unavailable_is_reported_exactly_when_ipvs_is_missing() {
    let has_ipvs = std::path::Path::new("/proc/net/ip_vs").exists();
    let rt = runtime();
    let result = rt.block_on(IpvsHandle::new());
    match (has_ipvs, result) {
        (false, Err(Error::IpvsUnavailable { reason })) => {
            assert!(reason.contains("IPVS"), "{reason}")
        }
        (false, other) => panic!("kernel without IPVS, expected IpvsUnavailable, got {other:?}"),
        (true, Ok(h)) => {
            let info = rt.block_on(h.info()).unwrap();
            assert!(info.conn_table_size > 0);
        }
        (true, Err(e)) => panic!("kernel with IPVS, handle failed: {e}"),
    }
    let _ = (Netns::new, ForwardMethod::Masquerade);
}

#[test]
fn a_batch_without_cap_net_admin_is_refused_op_by_op() {
    // A caller without CAP_NET_ADMIN: its receive buffer cannot be forced up, so a datagram
    // of requests must stay small enough for all of its acks to be queued. Every op must
    // come back as PermissionDenied, none as an I/O error.
    require_kernel!();
    let results = std::thread::spawn(|| {
        // Network namespace and capabilities are per thread, and inherited by the threads
        // this one starts (the runtime's, and the library's socket threads).
        // SAFETY: unshare(2) moves only this thread to a new network namespace.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        ipvs_proxier_tests::set_thread_capabilities(0).expect("capset");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let h = IpvsHandle::new()
                .await
                .expect("connecting needs no capability");
            let ops: Vec<Op> = (0..1_000u32)
                .map(|i| {
                    let [_, _, hi, lo] = i.to_be_bytes();
                    let address = IpAddr::from([10, 62, hi, lo]);
                    Op::AddService(Service::new(
                        ServiceKey::tcp(address, 80),
                        Scheduler::RoundRobin,
                    ))
                })
                .collect();
            h.batch(ops).await
        })
    })
    .join()
    .unwrap();
    assert_eq!(results.len(), 1_000);
    let others: Vec<(usize, &Result<(), Error>)> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| !matches!(r, Err(Error::PermissionDenied { .. })))
        .collect();
    assert!(
        others.is_empty(),
        "{} of 1,000 ops not refused as PermissionDenied; the first: {:?}",
        others.len(),
        others.first()
    );
}
