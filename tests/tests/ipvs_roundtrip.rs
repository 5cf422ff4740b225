//! ipvs-netlink against the real kernel: whatever another program configured, read back
//! and written unchanged, leaves the kernel exactly as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ipvs_support;

use std::net::{IpAddr, Ipv4Addr};

use ipvs_netlink::{DestinationEntry, Netmask, Op, Scheduler, ServiceEntry, ServiceKey};
use ipvs_proxier_tests::{Netns, require_kernel};
use ipvs_support::*;

/// A table written by ipvsadm with what a Kubernetes proxier never sets: non-contiguous
/// IPv4 persistence netmasks, an IPv6 prefix, one-packet and scheduler flags, thresholds
/// (up to `INT_MAX`), weights 0 and 65535, direct routing, GUE and GRE tunnels, fwmark services.
const UNUSUAL_TABLE: &str = "\
-A -t 10.0.0.1:80 -s rr -p 60 -M 255.0.255.0
-a -t 10.0.0.1:80 -r 10.1.0.5:8080 -m -w 0
-a -t 10.0.0.1:80 -r 10.1.0.6:8080 -m -w 3 -x 100 -y 10
-A -u 10.0.0.2:53 -s sh -p 3600 -M 255.255.0.255 -o -b sh-fallback,sh-port
-a -u 10.0.0.2:53 -r 10.1.0.7:53 -g -w 2
-A -f 7 -s wlc -p 120 -M 0.255.0.255
-a -f 7 -r 10.1.0.8:0 -i -w 1 --tun-type gue --tun-port 6080 --tun-nocsum
-a -f 7 -r 10.1.0.9:0 -i -w 4 --tun-type gre --tun-csum
-A -f 8 -6 -s mh -p 5 -M 48
-a -f 8 -6 -r [fd00:1::5]:0 -m -w 0
-A --sctp-service [fd00::1]:9 -s lc
-a --sctp-service [fd00::1]:9 -r [fd00:1::7]:9 -m -w 65535 -x 2147483647 -y 7
-A -t 10.0.0.3:443 -s ovf -p 2592000 -M 128.0.0.1
-a -t 10.0.0.3:443 -r 10.1.0.10:443 -m -w 1 -x 5 -y 5
";

fn load_unusual_table() -> Netns {
    let ns = netns_with_routes();
    ns.sh_ok(&format!("ipvsadm -R <<'EOF'\n{UNUSUAL_TABLE}EOF"));
    ns
}

/// What ipvsadm shows of the table: the saved rules, exactly as printed, and the
/// thresholds (which `-S` leaves out).
fn kernel_view(ns: &Netns) -> String {
    format!(
        "{}\n{}",
        ns.sh_ok("ipvsadm -Sn"),
        ns.sh_ok("ipvsadm -Ln --thresholds")
    )
}

type Table = Vec<(ServiceEntry, Vec<DestinationEntry>)>;

/// The configurations only (no counters), sorted.
fn configs(table: &Table) -> Vec<String> {
    let mut out: Vec<String> = table
        .iter()
        .flat_map(|(s, dests)| {
            std::iter::once(format!("{:?}", s.service)).chain(
                dests
                    .iter()
                    .map(move |d| format!("{} {:?}", s.service.key, d.destination)),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn ipvs_foreign_table_rewritten_unchanged_stays_identical() {
    require_kernel!();
    let ns = load_unusual_table();
    let before = kernel_view(&ns);
    assert!(before.contains("-M 255.0.255.0"), "{before}");
    assert!(before.contains("--tun-type gue"), "{before}");
    let (read, reread) = with_handle(&ns, |h| async move {
        let table = h.table().await.unwrap();
        let mut ops = Vec::new();
        for (service, dests) in &table {
            ops.push(Op::UpdateService(service.service.clone()));
            for d in dests {
                ops.push(Op::UpdateDestination(
                    service.service.key,
                    d.destination.clone(),
                ));
            }
        }
        let n = ops.len();
        let results = h.batch(ops).await;
        assert_eq!(results.len(), n);
        for r in &results {
            assert!(r.is_ok(), "{r:?}");
        }
        (table, h.table().await.unwrap())
    });
    assert_eq!(read.len(), 6, "{read:#?}");
    assert_eq!(read.iter().map(|(_, d)| d.len()).sum::<usize>(), 8);
    let odd = read
        .iter()
        .find(|(s, _)| s.service.key == ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 80))
        .unwrap();
    assert_eq!(
        odd.0.service.netmask,
        Netmask::V4(Ipv4Addr::new(255, 0, 255, 0))
    );
    let after = kernel_view(&ns);
    assert_eq!(
        before, after,
        "rewriting the read-back table changed the kernel"
    );
    assert_eq!(configs(&read), configs(&reread));
}

#[test]
fn ipvs_changing_only_the_scheduler_keeps_a_non_contiguous_netmask() {
    require_kernel!();
    let ns = load_unusual_table();
    let key = ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 80);
    let udp = ServiceKey::udp(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 53);
    with_handle(&ns, |h| async move {
        for k in [key, udp] {
            let mut s = h.service(&k).await.unwrap().service;
            s.scheduler = Scheduler::WeightedLeastConnection;
            h.update_service(&s).await.unwrap();
        }
    });
    let saved = saved_rules(&ns);
    assert!(
        saved.contains("-A -t 10.0.0.1:80 -s wlc -p 60 -M 255.0.255.0"),
        "{saved:#?}"
    );
    assert!(
        saved
            .iter()
            .any(|l| l.starts_with("-A -u 10.0.0.2:53 -s wlc -p 3600 -M 255.255.0.255 -o")),
        "{saved:#?}"
    );
}
