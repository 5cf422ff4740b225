//! `--dry-run`: the engine on proxier-core's in-memory backends instead of the kernel; after
//! every sync this prints what it would program: a summary, the writes a real sync would
//! make, and a table of virtual servers, real servers and the addresses bound on the dummy
//! link.

use std::fmt::Write as _;
use std::io::Write;

use proxier_core::backend::AddressBackend;
use proxier_core::engine::driver::{SyncObserver, SyncOutcome};
use proxier_core::{Desired, MemoryProxier, SyncKind, VirtualServerRole};

use crate::sync_observer::DaemonObserver;

fn role_name(role: VirtualServerRole) -> &'static str {
    match role {
        VirtualServerRole::ClusterIp => "ClusterIP",
        VirtualServerRole::NodePort => "NodePort",
        VirtualServerRole::ExternalIp => "ExternalIP",
        VirtualServerRole::LoadBalancer => "LoadBalancer",
    }
}

/// A table of the plan: one row per virtual server, then the addresses to bind.
pub fn render_plan(desired: &Desired, dummy_interface: &str) -> String {
    let header = [
        "SERVICE PORT",
        "ROLE",
        "VIRTUAL SERVER",
        "SCHED",
        "PERSIST",
        "REAL SERVERS",
    ];
    let mut rows: Vec<[String; 6]> = Vec::new();
    for (name, key, vs) in desired.virtual_servers() {
        let real_servers = if vs.real_servers.is_empty() {
            "(none)".to_owned()
        } else {
            vs.real_servers
                .iter()
                .map(|(rs, settings)| {
                    if settings.weight == 1 {
                        rs.to_string()
                    } else {
                        format!("{rs} (w{})", settings.weight)
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        rows.push([
            name.to_string(),
            role_name(vs.role).to_owned(),
            key.to_string(),
            vs.scheduler.to_string(),
            vs.persistence_timeout
                .map_or_else(|| "-".to_owned(), |t| format!("{t}s")),
            real_servers,
        ]);
    }
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; 6]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header);
    for row in &rows {
        line([&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]]);
    }
    let bound: Vec<String> = desired
        .bound_addresses()
        .iter()
        .map(ToString::to_string)
        .collect();
    let _ = writeln!(
        out,
        "addresses on {dummy_interface}: {}",
        if bound.is_empty() {
            "(none)".to_owned()
        } else {
            bound.join(", ")
        }
    );
    out
}

/// The summary and table of one dry-run sync.
pub fn render_report(proxier: &MemoryProxier, outcome: &SyncOutcome<'_>) -> String {
    let kind = match outcome.kind {
        SyncKind::Full => "full",
        SyncKind::Incremental => "incremental",
    };
    let state = proxier.state();
    let ports: usize = state.services().map(|s| s.ports.len()).sum();
    let slices: Vec<_> = state
        .services()
        .flat_map(|s| state.slices_of(&s.name))
        .collect();
    let endpoints: usize = slices.iter().map(|s| s.endpoints.len()).sum();
    let node = if state.node().is_some() {
        proxier.node().name.clone()
    } else {
        format!("{} (no Node object)", proxier.node().name)
    };
    let mut text = format!(
        "dry-run {kind} sync: {} services ({ports} ports), {} endpoint slices ({endpoints} endpoints), node {node}\n",
        state.service_count(),
        state.slice_count(),
    );
    let link = proxier
        .reconciler()
        .address_backend()
        .link_name()
        .to_owned();
    let size = proxier.plan_size();
    match outcome.result {
        Ok(report) => {
            let _ = writeln!(
                text,
                "plan: {} virtual servers, {} real servers, {} addresses on {link}; a real sync would make {} writes ({} deletes)",
                size.virtual_servers,
                size.real_servers,
                size.bound_addresses,
                report.ipvs.writes,
                report.ipvs.deletes
            );
        }
        Err(error) => {
            let _ = writeln!(text, "plan could not be applied in memory: {error}");
        }
    }
    text.push_str(&render_plan(proxier.desired(), &link));
    text
}

/// Prints every sync of an in-memory proxier (and reports it like the daemon does).
#[derive(Debug)]
pub struct DryRunObserver<W> {
    daemon: DaemonObserver,
    out: W,
}

impl<W: Write> DryRunObserver<W> {
    /// Prints to `out`; metrics and health go through `daemon`.
    pub fn new(daemon: DaemonObserver, out: W) -> Self {
        DryRunObserver { daemon, out }
    }

    /// The writer (tests read what was printed).
    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write> SyncObserver<MemoryProxier> for DryRunObserver<W> {
    fn queued(&mut self) {
        SyncObserver::<MemoryProxier>::queued(&mut self.daemon);
    }

    fn synced(&mut self, proxier: &MemoryProxier, outcome: &SyncOutcome<'_>) {
        self.daemon.synced(proxier, outcome);
        let text = render_report(proxier, outcome);
        if let Err(error) = self
            .out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
        {
            tracing::error!(%error, "writing the dry-run report");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proxier_core::engine::driver::{self, DriverConfig, ProxierHandle};
    use proxier_core::model::Config;
    use proxier_core::{Backends, Change, Proxier, ProxierConfig};
    use tokio::sync::watch;

    use super::*;
    use crate::health::ProxyHealth;
    use crate::source::SourceEvent;
    use crate::source::manifests::parse_manifests;

    fn example_changes() -> Vec<Change> {
        let text = include_str!("../../examples/cluster.yaml");
        let snapshot =
            crate::source::file::snapshot_from_manifests(parse_manifests(text), "node-a");
        crate::feed::convert(&SourceEvent::Snapshot(snapshot)).changes
    }

    fn proxier() -> MemoryProxier {
        let config = ProxierConfig::new("node-a", Config::default());
        let mut proxier = Proxier::new(config, Backends::in_memory()).expect("proxier");
        for change in example_changes() {
            proxier.apply(change);
        }
        proxier
    }

    fn row<'a>(table: &'a str, service_port: &str, vip: &str) -> &'a str {
        table
            .lines()
            .find(|l| l.starts_with(service_port) && l.contains(vip))
            .unwrap_or_else(|| panic!("no row for {service_port} {vip} in:\n{table}"))
    }

    #[tokio::test]
    async fn example_cluster_plan_table() {
        let mut proxier = proxier();
        proxier.sync(SyncKind::Full).await.expect("sync");
        assert_eq!(
            proxier.node().primary_ips.len(),
            2,
            "IPv4 and IPv6 InternalIPs"
        );
        let table = render_plan(proxier.desired(), "kube-ipvs0");

        // ClusterIP with the API server behind it.
        assert!(
            row(&table, "default/kubernetes", "TCP 10.96.0.1:443").contains("192.0.2.100:6443")
        );
        // DNS over UDP and TCP.
        assert!(
            row(&table, "kube-system/kube-dns:dns/UDP", "10.96.0.10:53").contains("10.244.2.3:53")
        );
        assert!(
            row(&table, "kube-system/kube-dns:dns-tcp/TCP", "10.96.0.10:53")
                .contains("10.244.1.2:53")
        );
        // ClientIP affinity becomes persistence.
        assert!(row(&table, "shop/cart", "10.96.12.51:7070").contains("600s"));
        // NodePort on the node's address; LoadBalancer ingress.
        assert!(row(&table, "shop/web", "192.0.2.10:30080").contains("NodePort"));
        assert!(row(&table, "shop/storefront", "203.0.113.10:443").contains("LoadBalancer"));
        // eTP=Local: the load balancer VIP only has the local endpoint.
        let lb_local = row(&table, "shop/checkout", "203.0.113.11:443");
        assert!(
            lb_local.contains("10.244.1.41:8443") && !lb_local.contains("10.244.2.42"),
            "{lb_local}"
        );
        // Dual-stack: one virtual server per family.
        assert!(
            row(&table, "monitoring/prometheus", "[fd00:10:96::28]:9090")
                .contains("[fd00:10:244:1::7]:9090")
        );
        assert!(
            row(&table, "monitoring/prometheus", "10.96.40.5:9090").contains("10.244.1.7:9090")
        );
        // Skipped: headless, ExternalName, other proxy.
        for skipped in [
            "shop/orders-db",
            "shop/payments-gateway",
            "shop/legacy-billing",
        ] {
            assert!(
                !table.contains(skipped),
                "{skipped} must not be planned:\n{table}"
            );
        }
        let vips = table.lines().last().expect("addresses line");
        assert!(vips.starts_with("addresses on kube-ipvs0: "), "{vips}");
        assert!(
            vips.contains("10.96.0.1,")
                && vips.contains("203.0.113.11")
                && vips.contains("192.0.2.50"),
            "{vips}"
        );
        assert!(
            !vips.contains("192.0.2.10,") && !vips.ends_with("192.0.2.10"),
            "node IPs are not bound: {vips}"
        );
    }

    #[tokio::test]
    async fn the_driver_prints_each_sync_and_a_removed_service_deletes() {
        let mut proxier = proxier();
        let (handle, commands) = ProxierHandle::new();
        let (stop, shutdown) = watch::channel(false);
        let daemon = DaemonObserver::new(
            ProxyHealth::new(std::time::Duration::from_secs(60)),
            Arc::default(),
        );
        let mut observer = DryRunObserver::new(daemon, Vec::new());
        let config = DriverConfig::new(
            std::time::Duration::from_secs(3600),
            std::time::Duration::ZERO,
            2,
        );
        let feeder = async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            handle.apply(vec![Change::DeleteService(
                proxier_core::model::ServiceName::new("shop", "cart"),
            )]);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            stop.send_replace(true);
        };
        tokio::join!(
            driver::run(&mut proxier, config, commands, &mut observer, shutdown),
            feeder
        );
        let printed = String::from_utf8(observer.into_inner()).expect("utf8");
        let plans: Vec<&str> = printed
            .lines()
            .filter(|l| l.starts_with("plan: "))
            .collect();
        assert_eq!(plans.len(), 2, "{printed}");
        assert!(!plans[0].contains("would make 0 writes"), "{}", plans[0]);
        assert!(
            !plans[1].ends_with("(0 deletes)"),
            "removing a Service deletes: {}",
            plans[1]
        );
        let second = printed.split("plan: ").nth(2).expect("second report");
        assert!(!second.contains("shop/cart"), "{second}");
        let first = printed.lines().next().expect("summary");
        // The example's 11 Services less the headless and the ExternalName one; the slice
        // of the headless Service is filtered by the file source.
        assert_eq!(
            first,
            "dry-run full sync: 9 services (11 ports), 10 endpoint slices (18 endpoints), node node-a"
        );
    }
}
