//! ipvs-netlink against the real kernel: large dumps (10,000 services), dumps of one handle
//! read at once, and dumps abandoned part way.
//!
//! In a binary of its own so that no other test changes IPVS (in any namespace) while it
//! dumps: the kernel resumes service dumps by position in a table shared by all
//! namespaces. Its tests take [`ALONE`] for the same reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ipvs_support;

use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::Duration;

use futures::TryStreamExt;
use ipvs_netlink::{Destination, Op, Scheduler, Service, ServiceKey};
use ipvs_proxier_tests::require_kernel;
use ipvs_support::*;

/// Held by each test: one test's IPVS changes would disturb another's dumps.
static ALONE: Mutex<()> = Mutex::new(());

#[test]
fn ipvs_dump_of_10000_services() {
    require_kernel!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
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

#[test]
fn ipvs_a_table_read_on_one_socket_is_the_same_table_as_on_several() {
    require_kernel!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = netns_with_routes();
    with_handle(&ns, |h| async move {
        let mut ops = Vec::new();
        for i in 0..300u32 {
            let [_, _, hi, lo] = i.to_be_bytes();
            let key = ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 61, hi, lo)), 80);
            ops.push(Op::AddService(Service::new(key, Scheduler::RoundRobin)));
            for d in 1..=3u8 {
                ops.push(Op::AddDestination(
                    key,
                    Destination::new(IpAddr::V4(Ipv4Addr::new(10, 62, lo, d)), 8080),
                ));
            }
        }
        assert!(h.batch(ops).await.iter().all(|r| r.is_ok()));
        let several = h.table().await.unwrap();
        let one = h.with_read_sockets(1).table().await.unwrap();
        assert_eq!(several.len(), 300);
        let destinations: usize = one.iter().map(|(_, d)| d.len()).sum();
        assert_eq!(destinations, 900);
        let shape = |table: &ipvs_netlink::Table| -> BTreeSet<(ServiceKey, Vec<(IpAddr, u16)>)> {
            table
                .iter()
                .map(|(entry, dests)| {
                    let mut d: Vec<(IpAddr, u16)> = dests
                        .iter()
                        .map(|d| (d.destination.addr, d.destination.port))
                        .collect();
                    d.sort();
                    (entry.service.key, d)
                })
                .collect()
        };
        assert_eq!(shape(&one), shape(&several));
    });
    // And the kernel agrees: 300 services and 900 destinations.
    assert_eq!(ns.sh_ok("ipvsadm -Sn | grep -c '^-A'").trim(), "300");
    assert_eq!(ns.sh_ok("ipvsadm -Sn | grep -c '^-a'").trim(), "900");
}

/// A service's destinations come in page-sized parts to the pooled sockets (see
/// `NetlinkSocket::open_page_sized`): 2,000 destinations take some 80 parts, more than one
/// `recvmmsg` takes, and a table read, a best-effort one and a single dump must still see
/// every one of them, as `ipvsadm` does.
#[test]
fn ipvs_thousands_of_destinations_of_one_service_come_whole_in_page_sized_parts() {
    require_kernel!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = netns_with_routes();
    let big = ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 63, 0, 1)), 80);
    let small = ServiceKey::udp(IpAddr::V4(Ipv4Addr::new(10, 63, 0, 2)), 53);
    let expected: BTreeSet<(IpAddr, u16)> = (0..2_000u16)
        .map(|i| {
            let [hi, lo] = i.to_be_bytes();
            (IpAddr::V4(Ipv4Addr::new(10, 64, hi, lo)), 8000 + i % 7)
        })
        .collect();
    let want = expected.clone();
    with_handle(&ns, |h| async move {
        let mut ops = vec![
            Op::AddService(Service::new(big, Scheduler::RoundRobin)),
            Op::AddService(Service::new(small, Scheduler::RoundRobin)),
            Op::AddDestination(
                small,
                Destination::new(IpAddr::V4(Ipv4Addr::new(10, 65, 0, 1)), 53),
            ),
        ];
        ops.extend(
            want.iter()
                .map(|(addr, port)| Op::AddDestination(big, Destination::new(*addr, *port))),
        );
        assert!(h.batch(ops).await.iter().all(|r| r.is_ok()));
        let of = |dests: &[ipvs_netlink::DestinationEntry]| -> BTreeSet<(IpAddr, u16)> {
            dests
                .iter()
                .map(|d| (d.destination.addr, d.destination.port))
                .collect()
        };
        for table in [
            h.table().await.unwrap(),
            h.table_best_effort().await.unwrap(),
            h.with_read_sockets(1).table().await.unwrap(),
        ] {
            assert_eq!(table.len(), 2);
            for (entry, dests) in &table {
                if entry.service.key == big {
                    assert_eq!(dests.len(), 2_000);
                    assert_eq!(of(dests), want);
                } else {
                    assert_eq!(dests.len(), 1, "{:?}", entry.service.key);
                }
            }
        }
        let single: Vec<_> = h.destinations(&big).try_collect().await.unwrap();
        assert_eq!(of(&single), want);
    });
    let listed: BTreeSet<String> = ns
        .sh_ok("ipvsadm -Ln -t 10.63.0.1:80 | awk '$1 == \"->\" && $2 != \"RemoteAddress:Port\" {print $2}'")
        .lines()
        .map(str::to_owned)
        .collect();
    let expected: BTreeSet<String> = expected
        .iter()
        .map(|(addr, port)| format!("{addr}:{port}"))
        .collect();
    assert_eq!(listed, expected);
}

#[test]
fn ipvs_dumps_of_one_handle_nest_and_an_abandoned_dump_does_not_hold_up_the_next() {
    require_kernel!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = netns_with_routes();
    // 1,000 services (a dump of about a dozen datagrams), one destination each.
    let keys: Vec<ServiceKey> = (0..1_000u32)
        .map(|i| {
            let [_, _, hi, lo] = i.to_be_bytes();
            ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 61, hi, lo)), 80)
        })
        .collect();
    let k = keys.clone();
    with_handle(&ns, |h| async move {
        let ops: Vec<Op> = k
            .iter()
            .flat_map(|key| {
                let dest = Destination::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, 7)), 8080);
                [
                    Op::AddService(Service::new(*key, Scheduler::RoundRobin)),
                    Op::AddDestination(*key, dest),
                ]
            })
            .collect();
        assert!(h.batch(ops).await.iter().all(Result::is_ok));

        // Each service's destinations listed while the walk of the services is still open,
        // as `ipvsadm -Ln` lists them (and as the crate's README shows).
        let walk = async {
            let mut rows = BTreeSet::new();
            let mut services = h.services();
            while let Some(entry) = services.try_next().await.unwrap() {
                let dests: Vec<_> = h
                    .destinations(&entry.service.key)
                    .try_collect()
                    .await
                    .unwrap();
                assert_eq!(dests.len(), 1, "{:?}", entry.service.key);
                rows.insert((entry.service.key, dests[0].destination.addr));
            }
            rows
        };
        let rows = tokio::time::timeout(Duration::from_secs(120), walk)
            .await
            .expect("a dump started while another was being read never ended");
        let expected: BTreeSet<_> = k
            .iter()
            .map(|key| (*key, IpAddr::V4(Ipv4Addr::new(10, 1, 0, 7))))
            .collect();
        assert_eq!(rows, expected);

        // A dump dropped after its first item, then another at once: the kernel is still
        // sending the first one's rest, and would refuse a second dump on that socket.
        for round in 0..20 {
            let mut services = h.services();
            assert!(services.try_next().await.unwrap().is_some());
            drop(services);
            let all: Vec<_> = h.services().try_collect().await.unwrap_or_else(|e| {
                panic!("round {round}: a dump after an abandoned one failed: {e}")
            });
            assert_eq!(all.len(), 1_000, "round {round}");
        }
        // And the shared connection serves dumps again once the abandoned one has ended.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let all: Vec<_> = h.services().try_collect().await.unwrap();
        assert_eq!(all.len(), 1_000);
    });
    let saved = saved_rules(&ns);
    assert_eq!(saved.iter().filter(|l| l.starts_with("-A ")).count(), 1_000);
    assert_eq!(saved.iter().filter(|l| l.starts_with("-a ")).count(), 1_000);
}

/// The kernel's text listing (`IpvsHandle::listed_destinations`) shows a tuple service's
/// destinations as the netlink table read does (address, port, forwarding method, weight,
/// connection counts), across many of the listing's pages; it leaves firewall-mark services
/// out and shows the handle's own namespace, not the caller's. While another namespace has
/// IPVS services the kernel's listing skips some of ours at page boundaries (it ends a page
/// counting every namespace's services, and resumes counting only ours): the engine's
/// best-effort read built on it still finds every service and destination (it dumps the
/// ones the listing left out), as the verified netlink read does.
#[test]
fn ipvs_the_listing_shows_destinations_as_a_table_read_does() {
    use ipvs_netlink::{ForwardMethod, ListedDestination};
    use proxier_core::backend::{IpvsBackend, KernelIpvsBackend};
    use std::collections::BTreeMap;

    require_kernel!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = netns_with_routes();
    // Every kind of line the listing has, made with ipvsadm.
    ns.sh_ok(
        "modprobe ip_vs_sh 2>/dev/null; modprobe ip_vs_wlc 2>/dev/null; \
         ipvsadm -A -t 10.96.0.1:443 -s rr && \
         ipvsadm -a -t 10.96.0.1:443 -r 10.1.0.1:6443 -m -w 1 && \
         ipvsadm -a -t 10.96.0.1:443 -r 10.1.0.2:6443 -g -w 0 && \
         ipvsadm -a -t 10.96.0.1:443 -r 10.1.0.3:6443 -i -w 65535 && \
         ipvsadm -A -u 10.96.0.10:53 -s sh -b sh-port -p 300 && \
         ipvsadm -a -u 10.96.0.10:53 -r 10.1.1.1:53 -m && \
         ipvsadm -A --sctp-service 10.96.0.20:9000 -s wlc && \
         ipvsadm -a --sctp-service 10.96.0.20:9000 -r 10.1.2.1:9000 -m -x 10 -y 5 && \
         ipvsadm -A -t [fd00::a]:80 -s rr && \
         ipvsadm -a -t [fd00::a]:80 -r [fd00:1::1]:8080 -m -w 3 && \
         ipvsadm -A -f 16 -s rr && ipvsadm -a -f 16 -r 10.1.3.1:0 -g && \
         ipvsadm -A -t 10.96.0.30:80 -s rr",
    );
    // Another namespace's services, which the handle must not see.
    let other = netns_with_routes();
    other.sh_ok(
        "for i in $(seq 1 40); do ipvsadm -A -t 10.96.9.$i:80 -s rr && \
         ipvsadm -a -t 10.96.9.$i:80 -r 10.1.9.9:80 -m || exit 1; done",
    );
    with_handle(&ns, |h| async move {
        // Enough services for the listing to take a few hundred of the kernel's pages.
        let mut ops = Vec::new();
        for i in 0..2_000u32 {
            let [_, _, hi, lo] = i.to_be_bytes();
            let key = ServiceKey::udp(IpAddr::V4(Ipv4Addr::new(10, 63, hi, lo)), 53);
            ops.push(Op::AddService(Service::new(key, Scheduler::RoundRobin)));
            for d in 1..=(u8::try_from(i % 4).unwrap()) {
                let mut destination =
                    Destination::new(IpAddr::V4(Ipv4Addr::new(10, 64, lo, d)), 5353);
                destination.weight = u32::from(d) * 7;
                ops.push(Op::AddDestination(key, destination));
            }
        }
        assert!(h.batch(ops).await.iter().all(|r| r.is_ok()));

        let listing = h.listed_destinations().await.unwrap();
        // Bounded: read no further than the services asked for, whole when they are enough
        // (the 2,006 of this namespace, or fewer when the other's make it skip some).
        assert!(
            h.listed_destinations_up_to(1_000).await.unwrap().is_none(),
            "a listing of about 2,000 services read whole for at most 1,000"
        );
        assert_eq!(
            h.listed_destinations_up_to(2_006)
                .await
                .unwrap()
                .map(|l| l.len()),
            Some(listing.len()),
            "a listing bounded by its own size read whole"
        );
        let table = h.table().await.unwrap();
        type Shown = Vec<(IpAddr, u16, ForwardMethod, u32, u32, u32)>;
        let sorted = |mut shown: Shown| {
            shown.sort();
            shown
        };
        let from_listing: BTreeMap<ServiceKey, Shown> = listing
            .into_iter()
            .map(|(key, destinations)| {
                let shown = destinations
                    .iter()
                    .map(|d: &ListedDestination| {
                        (
                            d.addr,
                            d.port,
                            d.forward,
                            d.weight,
                            d.active_conns,
                            d.inactive_conns,
                        )
                    })
                    .collect();
                (key, sorted(shown))
            })
            .collect();
        let from_table: BTreeMap<ServiceKey, Shown> = table
            .into_iter()
            .filter(|(entry, _)| matches!(entry.service.key, ServiceKey::Tuple { .. }))
            .map(|(entry, destinations)| {
                let shown = destinations
                    .iter()
                    .map(|d| {
                        let c = &d.destination;
                        (
                            c.addr,
                            c.port,
                            c.forward,
                            c.weight,
                            d.active_conns,
                            d.inactive_conns,
                        )
                    })
                    .collect();
                (entry.service.key, sorted(shown))
            })
            .collect();
        assert_eq!(from_table.len(), 2_000 + 5);
        // Whatever the listing shows is what the table read shows.
        for (key, shown) in &from_listing {
            assert_eq!(Some(shown), from_table.get(key), "{key}");
        }
        // Most of it: the listing skips about one of ours for each service of the other
        // namespace it walks past (40).
        assert!(
            from_listing.len() * 10 >= from_table.len() * 9,
            "the listing shows {} of {} services",
            from_listing.len(),
            from_table.len()
        );
        println!(
            "the listing showed {} of {} services (another namespace has 40)",
            from_listing.len(),
            from_table.len()
        );
        let varied = [
            ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)), 443),
            ServiceKey::tcp("fd00::a".parse().unwrap(), 80),
        ];
        for key in varied {
            if let Some(shown) = from_listing.get(&key) {
                assert!(!shown.is_empty(), "{key}");
            }
        }

        // The engine's reads on the listing (best-effort and verified) find every service
        // and destination, with the settings, that the netlink table read shows.
        type Flat = Vec<(
            IpAddr,
            u16,
            ipvs_netlink::Protocol,
            String,
            Option<u32>,
            bool,
            Shown,
        )>;
        let oracle: Flat = h
            .table()
            .await
            .unwrap()
            .into_iter()
            .filter_map(|(entry, destinations)| {
                let ServiceKey::Tuple {
                    addr,
                    port,
                    protocol,
                } = entry.service.key
                else {
                    return None;
                };
                let flags = entry.service.flags;
                let shown = destinations
                    .iter()
                    .map(|d| {
                        let c = &d.destination;
                        // The engine tells masquerading from any other method.
                        let forward = if c.forward == ForwardMethod::Masquerade {
                            ForwardMethod::Masquerade
                        } else {
                            ForwardMethod::DirectRoute
                        };
                        (
                            c.addr,
                            c.port,
                            forward,
                            c.weight,
                            d.active_conns,
                            d.inactive_conns,
                        )
                    })
                    .collect();
                Some((
                    addr,
                    port,
                    protocol,
                    entry.service.scheduler.to_string(),
                    flags
                        .contains(ipvs_netlink::ServiceFlags::PERSISTENT)
                        .then_some(entry.service.timeout),
                    flags.contains(ipvs_netlink::ServiceFlags::SH_PORT),
                    sorted(shown),
                ))
            })
            .collect();
        let flat = |read: proxier_core::backend::TableRead| -> Flat {
            read.virtual_servers
                .iter()
                .map(|(key, vs)| {
                    let shown = vs
                        .real_servers
                        .iter()
                        .map(|(rs, real)| {
                            let forward =
                                if real.forward == proxier_core::observed::Forwarding::Masquerade {
                                    ForwardMethod::Masquerade
                                } else {
                                    ForwardMethod::DirectRoute
                                };
                            (
                                rs.address,
                                rs.port,
                                forward,
                                real.weight,
                                real.active_connections,
                                real.inactive_connections,
                            )
                        })
                        .collect();
                    (
                        key.address,
                        key.port,
                        key.protocol,
                        vs.settings.scheduler.to_string(),
                        vs.settings.persistence_timeout,
                        vs.settings.hash_source_port,
                        sorted(shown),
                    )
                })
                .collect()
        };
        let mut oracle = oracle;
        oracle.sort();
        let backend = KernelIpvsBackend::new(h.clone());
        for read in [
            backend.read_table_best_effort().await.unwrap(),
            backend.read_table().await.unwrap(),
        ] {
            let mut got = flat(read);
            got.sort();
            assert_eq!(got.len(), 2_000 + 5);
            assert_eq!(got, oracle);
        }
    });
    // The oracle's own count of destinations, firewall-mark service aside.
    let dests = ns.sh_ok("ipvsadm -Sn | grep '^-a' | grep -vc '^-a -f'");
    let expected = 3 + 1 + 1 + 1 + (0..2_000u32).map(|i| i % 4).sum::<u32>();
    assert_eq!(dests.trim(), expected.to_string());
}

/// The destinations of services already read (`IpvsHandle::table_of`): every service's are
/// dumped without dumping the service list again, and a service deleted since it was read
/// (and one listed twice) is shown once, with no destinations. The engine's reads past the most services it reads the kernel's listing
/// for (20,000; its cost grows with their square) take that way, and find the table the
/// library's verified read finds, as `ipvsadm` counts it.
#[test]
fn ipvs_destinations_of_services_already_read_and_reads_past_the_listing_bound() {
    use proxier_core::backend::{IpvsBackend, KernelIpvsBackend};
    use std::collections::BTreeMap;

    require_kernel!();
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = netns_with_routes();
    const SERVICES: u32 = 20_010;
    let key_of = |i: u32| {
        let [_, _, hi, lo] = i.to_be_bytes();
        ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 65, hi, lo)), 80)
    };
    let gone = key_of(7);
    with_handle(&ns, |h| async move {
        let mut ops = Vec::new();
        for i in 0..SERVICES {
            let key = key_of(i);
            ops.push(Op::AddService(Service::new(key, Scheduler::RoundRobin)));
            let [_, _, hi, lo] = i.to_be_bytes();
            for d in 1..=u8::try_from(i % 3).unwrap() {
                let mut destination =
                    Destination::new(IpAddr::V4(Ipv4Addr::new(10, 66 + hi, lo, d)), 8080);
                destination.weight = u32::from(d);
                ops.push(Op::AddDestination(key, destination));
            }
        }
        assert!(h.batch(ops).await.iter().all(|r| r.is_ok()));
        let mut services: Vec<ipvs_netlink::ServiceEntry> =
            h.services().try_collect().await.unwrap();
        assert_eq!(services.len(), SERVICES as usize);
        h.delete_service(&gone).await.unwrap();
        // As a dump disturbed by another namespace may show one.
        let twice = services[SERVICES as usize / 2].clone();
        services.push(twice);

        type Shape = BTreeMap<ServiceKey, Vec<(IpAddr, u16, u32)>>;
        let shape = |table: &ipvs_netlink::Table| -> Shape {
            table
                .iter()
                .map(|(entry, dests)| {
                    let mut d: Vec<(IpAddr, u16, u32)> = dests
                        .iter()
                        .map(|d| {
                            let c = &d.destination;
                            (c.addr, c.port, c.weight)
                        })
                        .collect();
                    d.sort();
                    (entry.service.key, d)
                })
                .collect()
        };
        let whole = shape(&h.table().await.unwrap());
        assert_eq!(whole.len(), SERVICES as usize - 1);
        assert!(!whole.contains_key(&gone));
        let of = h.table_of(services).await.unwrap();
        assert!(
            of.windows(2)
                .all(|w| w[0].0.service.key < w[1].0.service.key),
            "sorted by service key, each once"
        );
        let mut of = shape(&of);
        assert_eq!(of.remove(&gone), Some(Vec::new()), "the deleted service");
        assert_eq!(of, whole);

        // The engine's reads, of more services than it reads the listing for (20,000).
        // The first reads try the listing and stop at the bound; once a recorded read has
        // found more services, the next ones do not read it at all.
        let mut backend = KernelIpvsBackend::new(h.clone());
        let reads = [
            backend
                .read_table_best_effort()
                .await
                .unwrap()
                .virtual_servers,
            backend.list_virtual_servers().await.unwrap(),
            backend.read_table().await.unwrap().virtual_servers,
        ];
        for (n, read) in reads.into_iter().enumerate() {
            let got: Shape = read
                .iter()
                .map(|(key, vs)| {
                    let mut d: Vec<(IpAddr, u16, u32)> = vs
                        .real_servers
                        .iter()
                        .map(|(rs, real)| (rs.address, rs.port, real.weight))
                        .collect();
                    d.sort();
                    (ServiceKey::tcp(key.address, key.port), d)
                })
                .collect();
            assert_eq!(got, whole, "read {n}");
        }
    });
    // ipvsadm's own count: every service but the deleted one, and its destinations.
    let dests: u32 = (0..SERVICES).filter(|&i| i != 7).map(|i| i % 3).sum();
    assert_eq!(
        ns.sh_ok("ipvsadm -Sn | awk '/^-A/ { s++ } /^-a/ { d++ } END { print s, d }'")
            .trim(),
        format!("{} {dests}", SERVICES - 1)
    );
}
