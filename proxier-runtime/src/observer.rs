//! What a program around the engine does after each sync the driver runs
//! ([`RuntimeObserver`]): metrics, the health state, the health-check servers of
//! `externalTrafficPolicy: Local` Services.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use proxier_core::backend::{AddressBackend, IpvsBackend, OpKind};
use proxier_core::conntrack::ConntrackBackend;
use proxier_core::engine::driver::{SyncObserver, SyncOutcome};
use proxier_core::model::ServiceName;
use proxier_core::netfilter::NetfilterBackend;
use proxier_core::reconciler::OpCounts;
use proxier_core::{HealthCheck, Proxier, SyncKind};
use tokio::sync::watch;

use crate::feed::{Feed, PendingChanges};
use crate::health::ProxyHealth;
#[cfg(feature = "http")]
use crate::health::servers::ServiceHealthServers;
use crate::metrics::{self, OpResult, SyncScope, TrafficPolicy};
use crate::traffic::SharedDirectory;

/// Records each sync in the metrics and the health state, and hands the health checks to
/// their servers.
#[derive(Debug)]
pub struct RuntimeObserver {
    health: ProxyHealth,
    pending: Arc<PendingChanges>,
    exported_ops: BTreeMap<OpKind, OpCounts>,
    health_checks: Option<watch::Sender<BTreeMap<ServiceName, HealthCheck>>>,
    /// The traffic metrics' directory, and whether it was filled from a whole plan yet.
    traffic: Option<(SharedDirectory, bool)>,
}

impl RuntimeObserver {
    /// An observer reporting to `health`.
    pub fn new(health: ProxyHealth) -> Self {
        RuntimeObserver {
            health,
            pending: Arc::default(),
            exported_ops: BTreeMap::new(),
            health_checks: None,
            traffic: None,
        }
    }

    /// Keeps a [`TrafficDirectory`](crate::traffic::TrafficDirectory) current for
    /// [`TrafficMetrics`](crate::traffic::TrafficMetrics): after each sync, only the ports
    /// whose plan changed are looked at.
    pub fn track_traffic(&mut self) -> SharedDirectory {
        let directory = SharedDirectory::default();
        self.traffic = Some((Arc::clone(&directory), false));
        directory
    }

    /// Where a source's batches go in: counted as pending changes until the next sync.
    pub fn feed(&self) -> Feed {
        Feed::new(Arc::clone(&self.pending))
    }

    /// Serves the health checks through `servers` (a tokio task; call it inside the runtime):
    /// a task opens and closes their ports and
    /// updates their counts after every sync that changed them.
    #[cfg(feature = "http")]
    pub fn serve_health_checks(&mut self, servers: Arc<ServiceHealthServers>) {
        let (tx, mut rx) = watch::channel(BTreeMap::<ServiceName, HealthCheck>::new());
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let checks = rx.borrow_and_update().clone();
                let ports: std::collections::HashMap<ServiceName, u16> = checks
                    .iter()
                    .map(|(name, check)| (name.clone(), check.node_port))
                    .collect();
                let counts: std::collections::HashMap<ServiceName, usize> = checks
                    .iter()
                    .map(|(name, check)| (name.clone(), check.local_endpoints))
                    .collect();
                servers.sync_services(&ports).await;
                servers.sync_endpoints(&counts).await;
            }
        });
        self.health_checks = Some(tx);
    }
}

impl<I, A, N, C> SyncObserver<Proxier<I, A, N, C>> for RuntimeObserver
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    fn queued(&mut self) {
        metrics::record_sync_queued(SystemTime::now());
        self.health.queued_update(SystemTime::now());
    }

    fn synced(&mut self, proxier: &Proxier<I, A, N, C>, outcome: &SyncOutcome<'_>) {
        let scope = match outcome.kind {
            SyncKind::Full => SyncScope::Full,
            SyncKind::Incremental => SyncScope::Partial,
        };
        metrics::record_sync(scope, outcome.took, outcome.succeeded, SystemTime::now());
        self.health.set_node_eligible(proxier.node_eligible());
        if !outcome.changes_pending {
            self.pending.services.store(0, Ordering::Relaxed);
            self.pending.endpoints.store(0, Ordering::Relaxed);
            metrics::set_pending_changes(0, 0);
            if outcome.succeeded {
                self.health.updated(SystemTime::now());
            }
        }
        let stats = proxier.reconciler_stats();
        for (kind, counts) in &stats.ops {
            let before = self.exported_ops.get(kind).copied().unwrap_or_default();
            let ok = counts.succeeded.saturating_sub(before.succeeded);
            let failed = counts.failed.saturating_sub(before.failed);
            if ok > 0 {
                metrics::record_netlink_operations(kind.label(), OpResult::Success, ok);
            }
            if failed > 0 {
                metrics::record_netlink_operations(kind.label(), OpResult::Error, failed);
            }
        }
        self.exported_ops = stats.ops.clone();
        metrics::set_table_reads(stats.table_reads);
        metrics::set_data_plane_size(proxier.plan_size());
        metrics::set_service_cidr_routes(
            proxier.routed_service_cidrs().len(),
            proxier.refused_service_cidrs().len(),
        );
        let no_local = proxier.no_local_endpoints();
        metrics::set_no_local_endpoints(TrafficPolicy::Internal, no_local.internal);
        metrics::set_no_local_endpoints(TrafficPolicy::External, no_local.external);
        let Ok(report) = outcome.result else {
            return;
        };
        if let Some((directory, filled)) = &mut self.traffic {
            let mut directory = directory
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *filled {
                for name in &report.changed {
                    directory.update_port(name, proxier.desired().services.get(name));
                }
            } else {
                directory.rebuild(proxier.desired());
                *filled = true;
            }
        }
        if let Some(drift) = report.ipvs.drift {
            metrics::set_full_resync_drift_repaired(drift);
        }
        for latency in &report.programming_latencies {
            metrics::record_network_programming(*latency);
        }
        if let Some(tx) = &self.health_checks
            && (report.health_checks_changed || report.kind == SyncKind::Full)
        {
            tx.send_replace(proxier.health_checks().clone());
        }
        if report.is_complete() {
            let t = &report.timings;
            tracing::info!(
                kind = ?report.kind,
                %report,
                phases = %report.timings,
                writes = report.ipvs.writes,
                deletes = report.ipvs.deletes,
                failed = report.ipvs.failed,
                plan_s = t.plan.as_secs_f64(),
                kernel_read_s = t.reconcile.read.as_secs_f64(),
                diff_s = t.reconcile.diff.as_secs_f64(),
                address_writes_s = t.reconcile.addresses.as_secs_f64(),
                ipvs_writes_s = t.reconcile.ipvs.as_secs_f64(),
                nftables_s = t.netfilter.as_secs_f64(),
                nftables_written = report.netfilter_written,
                nftables_pending = report.netfilter_pending,
                nftables_update_s = report.netfilter_settled.map(|took| took.as_secs_f64()),
                conntrack_s = t.conntrack.as_secs_f64(),
                total_s = t.total.as_secs_f64(),
                "sync done"
            );
        } else {
            tracing::warn!(kind = ?report.kind, %report, phases = %report.timings, "sync finished with errors; failed service ports are retried");
        }
    }
}
