//! `--dry-run`: a [`SyncTarget`] that plans with proxier-core and applies the plan to
//! proxier-core's in-memory backends instead of the kernel, then prints what it would program:
//! a summary, the writes a real sync would make, and a table of virtual servers, real servers
//! and the addresses bound on the dummy link.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Arc, Mutex};

use proxier_core::backend::memory::{MemoryAddressBackend, MemoryIpvsBackend};
use proxier_core::model::{Config, NodeContext};
use proxier_core::{ClusterState, Desired, Reconciler, ReconcilerConfig, VirtualServerRole};

use crate::cluster_view::ClusterView;
use crate::metrics::{DataPlaneSize, set_data_plane_size};
use crate::runner::{SyncError, SyncKind, SyncTarget};

/// Feeds proxier-core's [`ClusterState`] with every object of the view. Objects proxier-core
/// rejects are logged and left out; the others are kept.
pub fn cluster_state(view: &ClusterView) -> ClusterState {
    let mut state = ClusterState::new();
    for (key, service) in &view.services {
        match proxier_core::k8s::service_change(service) {
            Ok(change) => {
                state.apply(change);
            }
            Err(error) => tracing::error!(service = %key, %error, "service rejected"),
        }
    }
    for (key, slice) in &view.endpoint_slices {
        match proxier_core::k8s::slice_change(slice) {
            Ok(Some(change)) => {
                state.apply(change);
            }
            Ok(None) => {}
            Err(error) => tracing::error!(slice = %key, %error, "endpoint slice rejected"),
        }
    }
    state
}

/// What the planner knows of this node: from its Node object when the source has it, else
/// only its name. The dry run does not read interfaces: the node's primary IPs stand for its
/// local addresses.
pub fn node_context(view: &ClusterView, hostname: &str) -> NodeContext {
    let from_node = view
        .node
        .as_ref()
        .map(|n| proxier_core::k8s::node_context(n));
    let mut node = match from_node {
        Some(Ok(node)) => node,
        Some(Err(error)) => {
            tracing::error!(%error, "node object rejected; planning without its addresses");
            NodeContext::new(hostname, Vec::new(), Vec::new())
        }
        None => NodeContext::new(hostname, Vec::new(), Vec::new()),
    };
    if node.local_addresses.is_empty() {
        node.local_addresses = node.primary_ips.clone();
    }
    node
}

fn role_name(role: VirtualServerRole) -> &'static str {
    match role {
        VirtualServerRole::ClusterIp => "ClusterIP",
        VirtualServerRole::NodePort => "NodePort",
        VirtualServerRole::ExternalIp => "ExternalIP",
        VirtualServerRole::LoadBalancer => "LoadBalancer",
    }
}

/// Sizes of a plan.
pub fn plan_size(desired: &Desired) -> DataPlaneSize {
    DataPlaneSize {
        virtual_servers: desired.virtual_servers().count(),
        real_servers: desired
            .virtual_servers()
            .map(|(_, _, vs)| vs.real_servers.len())
            .sum(),
        bound_addresses: desired.bound_addresses().len(),
        draining: 0,
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

/// Plans at every sync, applies the plan to in-memory backends and prints the result.
pub struct DryRunTarget<W> {
    view: Arc<Mutex<ClusterView>>,
    config: Config,
    hostname: String,
    dummy_interface: String,
    reconciler: Reconciler<MemoryIpvsBackend, MemoryAddressBackend>,
    out: W,
}

impl<W: Write + Send> DryRunTarget<W> {
    /// A target reading `view`, planning for node `hostname` with `config`, printing to `out`.
    pub fn new(
        view: Arc<Mutex<ClusterView>>,
        config: Config,
        hostname: &str,
        dummy_interface: &str,
        out: W,
    ) -> Self {
        let reconciler_config = ReconcilerConfig {
            exclude_cidrs: config.exclude_cidrs.clone(),
            ..ReconcilerConfig::default()
        };
        DryRunTarget {
            view,
            config,
            hostname: hostname.to_owned(),
            dummy_interface: dummy_interface.to_owned(),
            reconciler: Reconciler::new(
                MemoryIpvsBackend::new(),
                MemoryAddressBackend::new(),
                reconciler_config,
            ),
            out,
        }
    }

    /// The writer (tests read what was printed).
    pub fn into_inner(self) -> W {
        self.out
    }

    async fn sync_once(&mut self, kind: SyncKind) -> Result<(), SyncError> {
        let (state, node, counts) = {
            let view = self
                .view
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (
                cluster_state(&view),
                node_context(&view, &self.hostname),
                view.counts(),
            )
        };
        let desired = proxier_core::plan(&state, &node, &self.config);
        let report = self
            .reconciler
            .full_sync(&desired)
            .await
            .map_err(|e| SyncError(format!("in-memory reconcile: {e}")))?;
        let size = plan_size(&desired);
        set_data_plane_size(size);

        let kind = match kind {
            SyncKind::Full => "full",
            SyncKind::Incremental => "incremental",
        };
        let node_name = if counts.node_known {
            node.name.clone()
        } else {
            format!("{} (no Node object)", self.hostname)
        };
        let mut text = format!(
            "dry-run {kind} sync: {} services ({} ports), {} endpoint slices ({} endpoints), node {node_name}\n",
            counts.services, counts.service_ports, counts.endpoint_slices, counts.endpoints
        );
        let _ = writeln!(
            text,
            "plan: {} virtual servers, {} real servers, {} addresses on {}; a real sync would make {} writes ({} deletes)",
            size.virtual_servers,
            size.real_servers,
            size.bound_addresses,
            self.dummy_interface,
            report.writes,
            report.deletes
        );
        text.push_str(&render_plan(&desired, &self.dummy_interface));
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|e| SyncError(format!("writing the dry-run report: {e}")))
    }
}

impl<W: Write + Send> SyncTarget for DryRunTarget<W> {
    fn sync(
        &mut self,
        kind: SyncKind,
    ) -> impl std::future::Future<Output = Result<(), SyncError>> + Send {
        self.sync_once(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::manifests::parse_manifests;
    use crate::source::{ObjectKey, SourceEvent};

    fn example_view() -> ClusterView {
        let text = include_str!("../../examples/cluster.yaml");
        let snapshot =
            crate::source::file::snapshot_from_manifests(parse_manifests(text), "node-a");
        let mut view = ClusterView::default();
        view.apply(&SourceEvent::Snapshot(snapshot));
        view
    }

    fn row<'a>(table: &'a str, service_port: &str, vip: &str) -> &'a str {
        table
            .lines()
            .find(|l| l.starts_with(service_port) && l.contains(vip))
            .unwrap_or_else(|| panic!("no row for {service_port} {vip} in:\n{table}"))
    }

    #[test]
    fn example_cluster_plan_table() {
        let view = example_view();
        let state = cluster_state(&view);
        let node = node_context(&view, "node-a");
        assert_eq!(node.primary_ips.len(), 2, "IPv4 and IPv6 InternalIPs");
        let desired = proxier_core::plan(&state, &node, &Config::default());
        let table = render_plan(&desired, "kube-ipvs0");

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
    async fn second_sync_of_the_same_view_writes_nothing() {
        let view = Arc::new(Mutex::new(example_view()));
        let mut target = DryRunTarget::new(
            Arc::clone(&view),
            Config::default(),
            "node-a",
            "kube-ipvs0",
            Vec::new(),
        );
        target.sync(SyncKind::Full).await.expect("first sync");
        target.sync(SyncKind::Full).await.expect("second sync");
        // A Service goes away: the next sync deletes its virtual server.
        view.lock().expect("lock").services.remove(&ObjectKey {
            namespace: "shop".into(),
            name: "cart".into(),
        });
        target
            .sync(SyncKind::Incremental)
            .await
            .expect("third sync");
        let printed = String::from_utf8(target.into_inner()).expect("utf8");
        let plans: Vec<&str> = printed
            .lines()
            .filter(|l| l.starts_with("plan: "))
            .collect();
        assert_eq!(plans.len(), 3);
        assert!(!plans[0].contains("would make 0 writes"), "{}", plans[0]);
        assert!(
            plans[1].ends_with("would make 0 writes (0 deletes)"),
            "{}",
            plans[1]
        );
        assert!(
            !plans[2].ends_with("(0 deletes)"),
            "removing a Service deletes: {}",
            plans[2]
        );
        let third_table = printed.split("plan: ").nth(3).expect("third report");
        assert!(!third_table.contains("shop/cart"), "{third_table}");
        let first = printed.lines().next().expect("summary");
        assert_eq!(
            first,
            "dry-run full sync: 11 services (12 ports), 10 endpoint slices (18 endpoints), node node-a"
        );
    }
}
