//! The engine's full syncs against a kernel whose IPVS dumps are disturbed by another network
//! namespace: the kernel resumes a multi-part service dump by a position that counts the
//! services of every namespace, so while another namespace adds and deletes services a dump
//! of ours can skip entries. A full sync that believes a programmed virtual server missing
//! gets "exists" on its add; that must mean "re-read and converge", never a failed sync.
//! Oracle: `ipvsadm -Sn` taken with the churn stopped.

#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use ipvs_proxier_tests::{Background, Netns, require_kernel};
use proxier_core::model::{
    Config, Endpoint, EndpointPort, EndpointSlice, Protocol, Service, ServiceName, ServicePortSpec,
    SliceKey,
};
use proxier_core::{Backends, Change, KernelProxier, Proxier, ProxierConfig, SyncKind};

const SERVICES: u32 = 500;

fn service(i: u32) -> (Service, EndpointSlice) {
    let name = ServiceName::new("churn", format!("svc-{i}"));
    let vip = IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i));
    let endpoint = IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 2)) + i));
    let port = ServicePortSpec {
        name: "p".into(),
        port: 80,
        protocol: Protocol::Tcp,
        node_port: None,
    };
    let mut ready = Endpoint::ready(endpoint);
    ready.node_name = Some(Arc::from("node-a"));
    let slice = EndpointSlice {
        key: SliceKey::new("churn", format!("svc-{i}-0")),
        service: name.clone(),
        ports: vec![EndpointPort {
            name: "p".into(),
            port: 8080,
            protocol: Protocol::Tcp,
        }],
        endpoints: vec![ready],
        warnings: Vec::new(),
        trigger_time: None,
    };
    (Service::new(name, vec![vip], vec![port]), slice)
}

/// A proxier on this namespace's kernel with every Service and slice applied, not synced.
async fn proxier_with_every_service() -> KernelProxier {
    let backends = Backends::kernel("kube-ipvs0").await.unwrap();
    let config = ProxierConfig::new("node-a", Config::default());
    let mut proxier = Proxier::new(config, backends).unwrap();
    for i in 0..SERVICES {
        let (svc, slice) = service(i);
        proxier.apply(Change::UpsertService(svc));
        proxier.apply(Change::UpsertSlice(slice));
    }
    proxier
}

/// `ipvsadm -Sn` lines of what the first `n` services plan.
fn expected_rules(services: impl Iterator<Item = u32>) -> Vec<String> {
    let mut lines = Vec::new();
    for i in services {
        let vip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i);
        let endpoint = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 2)) + i);
        lines.push(format!("-A -t {vip}:80 -s rr"));
        lines.push(format!("-a -t {vip}:80 -r {endpoint}:8080 -m -w 1"));
    }
    lines.sort();
    lines
}

fn rules(netns: &Netns) -> Vec<String> {
    let mut lines: Vec<String> = netns
        .sh_ok("ipvsadm -Sn")
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

#[test]
fn full_syncs_under_foreign_ipvs_churn_never_fail_and_end_exact() {
    require_kernel!();
    let node = Netns::new();
    node.sh_ok(
        "ip link set lo up && ip link add pods0 type dummy && ip link set pods0 up \
         && ip addr add 10.244.0.1/16 dev pods0",
    );
    let other = Netns::new();
    let mut churn = Background::default();
    churn.spawn(
        &other,
        "bash -c 'while true; do for i in $(seq 1 60); do ipvsadm -A -t 10.9.0.$i:80 -s rr; done; \
         ipvsadm -C; done'",
    );

    let (reports, contradictions, reads, (adoption, adoption_reads)) = node.block_on(|| async {
        let mut proxier = proxier_with_every_service().await;
        let mut reports = vec![proxier.sync(SyncKind::Full).await.unwrap()];
        for round in 0..8 {
            // Every other round removes one Service, so a skipped stale entry is exercised
            // as well as a skipped wanted one.
            if round % 2 == 1 {
                proxier.apply(Change::DeleteService(ServiceName::new(
                    "churn",
                    format!("svc-{round}"),
                )));
            }
            reports.push(proxier.sync(SyncKind::Full).await.unwrap());
        }
        // One more full sync with no change: whatever a skip left is repaired by now.
        reports.push(proxier.sync(SyncKind::Full).await.unwrap());
        let (contradictions, table_reads) = {
            let stats = proxier.reconciler_stats();
            (stats.contradictions, stats.table_reads)
        };
        drop(proxier);

        // A restart under the same churn adopts the kernel: its first sync reads best-effort
        // (one dump, which the churn disturbs) and looks up each planned virtual server the
        // read lacks, so it writes nothing.
        let mut restarted = proxier_with_every_service().await;
        for round in [1, 3, 5, 7] {
            restarted.apply(Change::DeleteService(ServiceName::new(
                "churn",
                format!("svc-{round}"),
            )));
        }
        let adoption = restarted.sync(SyncKind::Full).await.unwrap();
        let adoption_reads = restarted.reconciler_stats().table_reads;
        (
            reports,
            contradictions,
            table_reads,
            (adoption, adoption_reads),
        )
    });
    let churn_pid = churn.last();
    churn.kill(churn_pid);
    // The loop's last ipvsadm may still be running: let it finish.
    std::thread::sleep(std::time::Duration::from_millis(500));

    eprintln!(
        "engine_dump_churn: {} full syncs, {} contradicted writes re-read, table reads {reads:?}",
        reports.len(),
        contradictions
    );
    // Every full sync read the table once, verified (three dumps at least; how many more the
    // churn forces depends on timing), and the counters the daemon exports say so; the
    // first one read best-effort before: that read lacked the whole plan (nothing was
    // programmed yet), so the table was read again, verified.
    assert_eq!(reads.best_effort, 1, "{reads:?}");
    assert_eq!(
        reads.verifying_reads(),
        u64::try_from(reports.len()).unwrap(),
        "{reads:?}"
    );
    assert_eq!(reads.unverified, 0, "{reads:?}");
    assert_eq!(
        reads.dumps,
        3 * reads.verifying_reads() + reads.retries + reads.best_effort,
        "{reads:?}"
    );
    eprintln!(
        "engine_dump_churn: adoption under churn: {} writes, table reads {adoption_reads:?}",
        adoption.ipvs.writes
    );
    assert!(
        adoption.is_complete(),
        "the adoption failed: {:?} {:?}",
        adoption.ipvs.errors,
        adoption.netfilter_error
    );
    assert_eq!(adoption.ipvs.writes, 0, "the adoption wrote: {adoption:?}");
    assert_eq!(adoption_reads.best_effort, 1, "{adoption_reads:?}");
    for (i, report) in reports.iter().enumerate() {
        assert!(
            report.is_complete(),
            "full sync {i} failed: {:?} {:?}",
            report.ipvs.errors,
            report.netfilter_error
        );
    }
    assert_eq!(
        reports[0].ipvs.writes,
        usize::try_from(SERVICES * 3).unwrap(),
        "virtual server, real server and VIP per service"
    );
    let removed = [1, 3, 5, 7];
    let kept = (0..SERVICES).filter(|i| !removed.contains(i));
    assert_eq!(rules(&node), expected_rules(kept));
    let addresses = node.sh_ok("ip -o -4 addr show dev kube-ipvs0 | wc -l");
    assert_eq!(
        addresses.trim(),
        (SERVICES - 4).to_string(),
        "one VIP per remaining service"
    );
}
