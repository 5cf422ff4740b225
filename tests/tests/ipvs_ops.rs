//! ipvs-netlink against the real kernel: every operation, checked with ipvsadm.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ipvs_support;

use std::net::IpAddr;

use futures::TryStreamExt;
use ipvs_netlink::{
    AddressFamily, Destination, DestinationKey, ForwardMethod, Netmask, Scheduler, Service,
    ServiceFlags, ServiceKey, SyncDaemon, SyncState, Timeouts, TunnelFlags, TunnelType,
};
use ipvs_proxier_tests::{Netns, require_kernel};
use ipvs_support::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn services_under_test() -> Vec<Service> {
    let mut udp = Service::new(
        ServiceKey::udp(ip("192.168.1.2"), 53),
        Scheduler::SourceHashing,
    )
    .persistent(300);
    udp.netmask = Netmask::v4_prefix(24).unwrap();
    udp.flags |= ServiceFlags::ONE_PACKET | ServiceFlags::SH_FALLBACK | ServiceFlags::SH_PORT;
    let mut fwm6 = Service::new(
        ServiceKey::fwmark(7, AddressFamily::Inet6),
        Scheduler::WeightedLeastConnection,
    )
    .persistent(60);
    fwm6.netmask = Netmask::V6Prefix(64);
    vec![
        Service::new(ServiceKey::tcp(ip("10.0.0.1"), 80), Scheduler::RoundRobin),
        udp,
        Service::new(ServiceKey::sctp(ip("fd00::1"), 9), Scheduler::MaglevHashing),
        fwm6,
        Service::new(
            ServiceKey::fwmark(3, AddressFamily::Inet),
            Scheduler::RoundRobin,
        ),
        Service::new(
            ServiceKey::tcp(ip("fd00::2"), 443),
            Scheduler::WeightedRoundRobin,
        ),
    ]
}

#[test]
fn ipvs_services_add_get_dump_update_delete() {
    require_kernel!();
    let ns = netns_with_routes();
    let wanted = services_under_test();
    let w = wanted.clone();
    with_handle(&ns, |h| async move {
        for s in &w {
            h.add_service(s).await.unwrap();
        }
        // Dump and get return exactly what was written (HASHED is hidden by ==).
        let dumped: Vec<_> = h.services().try_collect().await.unwrap();
        assert_eq!(dumped.len(), w.len());
        for s in &w {
            assert!(
                dumped.iter().any(|e| &e.service == s),
                "{s:?} not in dump {dumped:#?}"
            );
            let got = h.service(&s.key).await.unwrap();
            assert_eq!(&got.service, s);
            assert!(got.service.flags.is_hashed(), "the kernel reports HASHED");
        }
    });
    assert_eq!(
        saved_rules(&ns),
        lines(&[
            "-A -t 10.0.0.1:80 -s rr",
            "-A -u 192.168.1.2:53 -s sh -p 300 -M 255.255.255.0 -o -b sh-fallback,sh-port",
            "-A --sctp-service [fd00::1]:9 -s mh",
            "-A -f 7 -6 -s wlc -p 60 -M 64",
            "-A -f 3 -s rr",
            "-A -t [fd00::2]:443 -s wrr",
        ])
    );
    with_handle(&ns, |h| async move {
        let tcp = ServiceKey::tcp(ip("10.0.0.1"), 80);
        let updated = Service::new(tcp, Scheduler::LeastConnection).persistent(120);
        h.update_service(&updated).await.unwrap();
        assert_eq!(h.service(&tcp).await.unwrap().service, updated);
        // Clearing flags works too (flags are sent with a full mask).
        let mut udp = wanted[1].clone();
        udp.flags = ServiceFlags::empty();
        udp.timeout = 0;
        udp.netmask = Netmask::v4_prefix(32).unwrap();
        h.update_service(&udp).await.unwrap();
        h.delete_service(&ServiceKey::fwmark(3, AddressFamily::Inet))
            .await
            .unwrap();
        h.delete_service(&ServiceKey::tcp(ip("fd00::2"), 443))
            .await
            .unwrap();
    });
    assert_eq!(
        saved_rules(&ns),
        lines(&[
            "-A -t 10.0.0.1:80 -s lc -p 120",
            "-A -u 192.168.1.2:53 -s sh",
            "-A --sctp-service [fd00::1]:9 -s mh",
            "-A -f 7 -6 -s wlc -p 60 -M 64",
        ])
    );
}

#[test]
fn ipvs_service_read_back_matches_ipvsadm_configuration() {
    require_kernel!();
    // The other direction: ipvsadm writes, ipvs-netlink reads.
    let ns = netns_with_routes();
    ns.sh_ok(
        "ipvsadm -A -t 10.0.0.1:80 -s rr
         ipvsadm -A -u 192.168.1.2:53 -s sh -p 300 -M 255.255.255.0 -b sh-fallback,sh-port -o
         ipvsadm -A -f 7 -6 -s wlc -p 60 -M 64
         ipvsadm -A --sctp-service [fd00::1]:9 -s mh
         ipvsadm -A -f 3 -s rr
         ipvsadm -A -t [fd00::2]:443 -s wrr",
    );
    let dumped = with_handle(&ns, |h| async move {
        h.services().try_collect::<Vec<_>>().await.unwrap()
    });
    assert_eq!(dumped.len(), services_under_test().len());
    for s in services_under_test() {
        assert!(
            dumped.iter().any(|e| e.service == s),
            "{s:?} missing from {dumped:#?}"
        );
    }
}

#[test]
fn ipvs_service_with_persistence_engine() {
    require_kernel!();
    let ns = netns_with_routes();
    let mut sip =
        Service::new(ServiceKey::udp(ip("10.0.0.5"), 5060), Scheduler::RoundRobin).persistent(360);
    sip.pe_name = Some("sip".into());
    // ipvsadm is the oracle for whether this kernel can load the SIP persistence engine.
    let ipvsadm_ok = ns
        .sh("ipvsadm -A -u 10.0.0.6:5060 -s rr -p 360 --pe sip")
        .status
        .success();
    let s = sip.clone();
    let result = with_handle(&ns, |h| async move {
        let added = h.add_service(&s).await;
        let read = match added {
            Ok(()) => Some(h.service(&s.key).await.unwrap().service),
            Err(_) => None,
        };
        (added, read)
    });
    if ipvsadm_ok {
        assert!(result.0.is_ok(), "{:?}", result.0);
        assert_eq!(result.1, Some(sip));
        assert!(
            saved_rules(&ns).contains("-A -u 10.0.0.5:5060 -s rr -p 360 --pe sip"),
            "{:?}",
            saved_rules(&ns)
        );
    } else {
        // No ip_vs_pe_sip module here: the kernel answers ENOENT, reported as a missing
        // scheduler/persistence-engine module naming both.
        match result.0 {
            Err(ipvs_netlink::Error::SchedulerNotFound { scheduler, pe, .. }) => {
                assert_eq!(scheduler, "rr");
                assert_eq!(pe.as_deref(), Some("sip"));
            }
            other => panic!("expected SchedulerNotFound, got {other:?}"),
        }
        assert!(saved_rules(&ns).is_empty());
    }
}

#[test]
fn ipvs_destinations_add_dump_update_delete() {
    require_kernel!();
    let ns = netns_with_routes();
    let svc = ServiceKey::tcp(ip("10.0.0.1"), 80);
    let mut masq = Destination::new(ip("10.1.0.5"), 8080).with_weight(2);
    masq.upper_threshold = 10;
    masq.lower_threshold = 1;
    let mut gue = Destination::new(ip("10.1.0.6"), 80).with_forward(ForwardMethod::Tunnel);
    gue.tunnel.kind = TunnelType::Gue;
    gue.tunnel.port = 6080;
    gue.tunnel.flags = TunnelFlags::NOCSUM;
    let route = Destination::new(ip("10.1.0.7"), 80).with_forward(ForwardMethod::DirectRoute);
    // Mixed family: an IPv6 real server behind an IPv4 service, IPIP-tunnelled.
    let ipip6 = Destination::new(ip("fd00:1::7"), 80).with_forward(ForwardMethod::Tunnel);
    let mut gre = Destination::new(ip("10.1.0.8"), 80).with_forward(ForwardMethod::Tunnel);
    gre.tunnel.kind = TunnelType::Gre;
    gre.tunnel.flags = TunnelFlags::CSUM;
    let all = vec![masq.clone(), gue, route.clone(), ipip6, gre];
    let a = all.clone();
    with_handle(&ns, |h| async move {
        h.add_service(&Service::new(svc, Scheduler::WeightedRoundRobin))
            .await
            .unwrap();
        for d in &a {
            h.add_destination(&svc, d).await.unwrap();
        }
        let dumped: Vec<_> = h.destinations(&svc).try_collect().await.unwrap();
        assert_eq!(dumped.len(), a.len());
        for d in &a {
            assert!(
                dumped.iter().any(|e| &e.destination == d),
                "{d:?} not in {dumped:#?}"
            );
        }
    });
    let saved = saved_rules(&ns);
    for line in [
        "-A -t 10.0.0.1:80 -s wrr",
        "-a -t 10.0.0.1:80 -r 10.1.0.5:8080 -m -w 2",
        "-a -t 10.0.0.1:80 -r 10.1.0.6:80 -i -w 1 --tun-type gue --tun-port 6080 --tun-nocsum",
        "-a -t 10.0.0.1:80 -r 10.1.0.7:80 -g -w 1",
    ] {
        assert!(saved.contains(line), "{line:?} not in {saved:#?}");
    }
    assert!(
        saved
            .iter()
            .any(|l| l.starts_with("-a -t 10.0.0.1:80 -r [fd00:1::7]:80 -i -w 1")),
        "{saved:#?}"
    );
    assert!(
        saved.iter().any(
            |l| l.starts_with("-a -t 10.0.0.1:80 -r 10.1.0.8:80 -i -w 1")
                && l.contains("--tun-type gre")
        ),
        "{saved:#?}"
    );
    let thresholds = ns.sh_ok("ipvsadm -Ln --thresholds");
    let row: Vec<&str> = thresholds
        .lines()
        .find(|l| l.contains("10.1.0.5:8080"))
        .expect("masq row")
        .split_whitespace()
        .collect();
    assert_eq!(row[2..4], ["10", "1"], "{thresholds}");

    with_handle(&ns, |h| async move {
        let mut changed = masq.clone().with_weight(5);
        changed.upper_threshold = 0;
        changed.lower_threshold = 0;
        h.update_destination(&svc, &changed).await.unwrap();
        h.update_destination(&svc, &route.clone().with_weight(0))
            .await
            .unwrap();
        for key in [("10.1.0.6", 80), ("fd00:1::7", 80), ("10.1.0.8", 80)] {
            h.delete_destination(
                &svc,
                &DestinationKey {
                    addr: ip(key.0),
                    port: key.1,
                },
            )
            .await
            .unwrap();
        }
        let left: Vec<_> = h.destinations(&svc).try_collect().await.unwrap();
        assert_eq!(left.len(), 2);
    });
    assert_eq!(
        saved_rules(&ns),
        lines(&[
            "-A -t 10.0.0.1:80 -s wrr",
            "-a -t 10.0.0.1:80 -r 10.1.0.5:8080 -m -w 5",
            "-a -t 10.0.0.1:80 -r 10.1.0.7:80 -g -w 0",
        ])
    );
}

/// Parses `ipvsadm -Ln --stats --exact` rows into (name, [conns, inpkts, outpkts, inbytes,
/// outbytes]).
fn stats_rows(text: &str) -> Vec<(String, Vec<u64>)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (name, nums) = match f.first() {
                Some(&"->") => (f.get(1)?.to_string(), f.get(2..7)?),
                Some(&"TCP") | Some(&"UDP") => (f.get(1)?.to_string(), f.get(2..7)?),
                _ => return None,
            };
            let nums: Option<Vec<u64>> = nums.iter().map(|n| n.parse().ok()).collect();
            Some((name, nums?))
        })
        .collect()
}

/// Waits until `ipvsadm -Ln --stats --exact` shows `conns` for each service and then stays the
/// same across one more estimator period, and returns that listing.
///
/// The kernel sums its per-CPU counters into the numbers it reports only when a service's rate
/// estimator runs (every 2 s, services spread over that period), so right after traffic the
/// reported counters of different services can be from before and after it.
fn settled_stats(ns: &Netns, conns: &[(&str, u64)]) -> String {
    let mut last = String::new();
    for _ in 0..20 {
        let listing = ns.sh_ok("ipvsadm -Ln --stats --exact");
        let rows = stats_rows(&listing);
        let counted = conns.iter().all(|(name, want)| {
            rows.iter()
                .find(|r| r.0 == *name)
                .is_some_and(|r| r.1[0] == *want)
        });
        if counted && listing == last {
            return listing;
        }
        last = listing;
        std::thread::sleep(std::time::Duration::from_millis(2500));
    }
    panic!("stats did not settle at {conns:?}:\n{last}");
}

#[test]
fn ipvs_stats_zero_timeouts_info_daemons_flush() {
    require_kernel!();
    let ns = netns_with_routes();
    // A service on a local VIP whose destination is a local socat server: connections from
    // inside the namespace go through IPVS and count.
    ns.sh_ok(
        "ip addr add 10.0.0.1/32 dev d0
         ipvsadm -A -t 10.0.0.1:80 -s rr
         ipvsadm -a -t 10.0.0.1:80 -r 10.1.0.254:8080 -m
         ipvsadm -A -t 10.0.0.2:80 -s rr
         ipvsadm -a -t 10.0.0.2:80 -r 10.1.0.254:8080 -m
         ip addr add 10.0.0.2/32 dev d0
         (socat TCP-LISTEN:8080,bind=10.1.0.254,fork,reuseaddr SYSTEM:'echo hello' </dev/null >/dev/null 2>&1 &)
         sleep 1
         for i in 1 2 3; do socat -T3 - TCP:10.0.0.1:80 </dev/null >/dev/null; done
         socat -T3 - TCP:10.0.0.2:80 </dev/null >/dev/null",
    );
    let listing = settled_stats(&ns, &[("10.0.0.1:80", 3), ("10.0.0.2:80", 1)]);
    let rows = stats_rows(&listing);
    let vip1 = ServiceKey::tcp(ip("10.0.0.1"), 80);
    let vip2 = ServiceKey::tcp(ip("10.0.0.2"), 80);
    let (ours1, ours2, dests1) = with_handle(&ns, |h| async move {
        let s1 = h.service(&vip1).await.unwrap().stats;
        let s2 = h.service(&vip2).await.unwrap().stats;
        let d: Vec<_> = h.destinations(&vip1).try_collect().await.unwrap();
        (s1, s2, d)
    });
    let row = |name: &str, nth: usize| {
        rows.iter()
            .filter(|r| r.0 == name)
            .nth(nth)
            .unwrap_or_else(|| panic!("{name} not in {listing}"))
            .1
            .clone()
    };
    let as_vec = |s: ipvs_netlink::Stats| {
        vec![
            s.conns,
            s.in_packets,
            s.out_packets,
            s.in_bytes,
            s.out_bytes,
        ]
    };
    assert_eq!(as_vec(ours1), row("10.0.0.1:80", 0), "{listing}");
    assert_eq!(ours1.conns, 3, "{listing}");
    assert_eq!(as_vec(ours2), row("10.0.0.2:80", 0), "{listing}");
    assert_eq!(
        as_vec(dests1[0].stats),
        row("10.1.0.254:8080", 0),
        "{listing}"
    );
    assert_eq!(dests1[0].destination.addr, ip("10.1.0.254"));

    // Zero one service, then all.
    with_handle(&ns, |h| async move {
        h.zero(Some(&vip1)).await.unwrap();
        assert_eq!(h.service(&vip1).await.unwrap().stats.conns, 0);
        assert_eq!(h.service(&vip2).await.unwrap().stats.conns, 1);
    });
    let rows = stats_rows(&ns.sh_ok("ipvsadm -Ln --stats --exact"));
    assert_eq!(rows.iter().find(|r| r.0 == "10.0.0.1:80").unwrap().1[0], 0);
    assert_eq!(rows.iter().find(|r| r.0 == "10.0.0.2:80").unwrap().1[0], 1);
    with_handle(&ns, |h| async move { h.zero(None).await.unwrap() });
    let rows = stats_rows(&ns.sh_ok("ipvsadm -Ln --stats --exact"));
    assert!(rows.iter().all(|r| r.1[0] == 0), "{rows:?}");

    // Info, as ipvsadm prints it.
    let header = ns.sh_ok("ipvsadm -Ln");
    let info = with_handle(&ns, |h| async move { h.info().await.unwrap() });
    assert_eq!(header.lines().next().unwrap(), info.to_string());

    // Timeouts: 0 keeps the current value.
    let before = with_handle(&ns, |h| async move { h.timeouts().await.unwrap() });
    assert_eq!(
        ns.sh_ok("ipvsadm -Ln --timeout").trim(),
        format!(
            "Timeout (tcp tcpfin udp): {} {} {}",
            before.tcp, before.tcp_fin, before.udp
        )
    );
    let after = with_handle(&ns, |h| async move {
        h.set_timeouts(&Timeouts {
            tcp: 1000,
            tcp_fin: 0,
            udp: 200,
        })
        .await
        .unwrap();
        h.timeouts().await.unwrap()
    });
    assert_eq!(
        after,
        Timeouts {
            tcp: 1000,
            tcp_fin: before.tcp_fin,
            udp: 200
        }
    );
    assert_eq!(
        ns.sh_ok("ipvsadm -Ln --timeout").trim(),
        format!("Timeout (tcp tcpfin udp): 1000 {} 200", before.tcp_fin)
    );
    // ipvsadm's longest timeout (31 days): taken wherever this kernel takes it from ipvsadm
    // (it refuses more than INT_MAX / HZ seconds), and refused the same way otherwise.
    let ipvsadm_took_it = ns.sh("ipvsadm --set 2678400 0 0").status.success();
    ns.sh_ok("ipvsadm --set 1000 0 200");
    let ours = with_handle(&ns, |h| async move {
        h.set_timeouts(&Timeouts::new(2_678_400, 0, 0)).await
    });
    assert_eq!(ours.is_ok(), ipvsadm_took_it, "{ours:?}");
    if ipvsadm_took_it {
        assert_eq!(
            ns.sh_ok("ipvsadm -Ln --timeout").trim(),
            format!("Timeout (tcp tcpfin udp): 2678400 {} 200", before.tcp_fin)
        );
    } else {
        assert!(
            matches!(ours, Err(ipvs_netlink::Error::InvalidArgument { .. })),
            "{ours:?}"
        );
    }

    // Sync daemons.
    let daemons = with_handle(&ns, |h| async move {
        let mut backup = SyncDaemon::new(SyncState::Backup, "d0", 9);
        backup.port = Some(9000);
        backup.ttl = Some(2);
        h.start_sync_daemon(&backup).await.unwrap();
        h.sync_daemons().await.unwrap()
    });
    assert_eq!(daemons.len(), 1);
    assert_eq!(daemons[0].state, SyncState::Backup);
    assert_eq!(
        (daemons[0].interface.as_str(), daemons[0].sync_id),
        ("d0", 9)
    );
    let listed = ns.sh_ok("ipvsadm -Ln --daemon");
    assert!(
        listed.contains("backup sync daemon (mcast=d0, syncid=9") && listed.contains("port=9000"),
        "{listed}"
    );
    with_handle(&ns, |h| async move {
        h.stop_sync_daemon(SyncState::Backup).await.unwrap();
        assert!(h.sync_daemons().await.unwrap().is_empty());
    });
    assert_eq!(ns.sh_ok("ipvsadm -Ln --daemon").trim(), "");

    // Flush.
    with_handle(&ns, |h| async move { h.flush().await.unwrap() });
    assert!(saved_rules(&ns).is_empty());
}

/// A connection the caller spawns itself (as rtnetlink's `new_connection`): the handle
/// works once the connection runs, on a current-thread runtime too.
#[test]
fn ipvs_new_connection_driven_by_the_caller() {
    require_kernel!();
    let ns = Netns::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let path = ns.path();
    rt.block_on(async move {
        let (connection, h) = ipvs_netlink::new_connection_in_netns(path)
            .await
            .expect("connection in netns");
        let driver = tokio::spawn(connection);
        let key = ServiceKey::udp("10.0.0.7".parse().expect("addr"), 53);
        h.add_service(&Service::new(key, Scheduler::RoundRobin))
            .await
            .expect("add");
        let services: Vec<_> = h.services().try_collect().await.expect("dump");
        assert_eq!(services.len(), 1);
        assert_eq!(services[0].service.key, key);
        assert!(h.info().await.expect("info").version > 0);
        drop(h);
        // The connection ends once every handle is gone.
        tokio::time::timeout(std::time::Duration::from_secs(10), driver)
            .await
            .expect("connection ends")
            .expect("connection task");
    });
}
