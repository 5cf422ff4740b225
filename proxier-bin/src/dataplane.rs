//! The kernel data plane the daemon drives: proxier-core's reconciler over the kernel IPVS
//! backend (ipvs-netlink) and the rtnetlink address backend (the dummy link), the nftables
//! table, the sysctls set at start, and UDP conntrack cleanup when endpoints go away.
//!
//! Every sync converts and replans only the objects that changed since the last one
//! ([`TrackedState`]) and hands the reconciler only the Service ports whose plan changed
//! (incremental), or everything with a fresh read of the kernel (full). `--cleanup` lives
//! here too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::TryStreamExt;
use proxier_core::VirtualServerKey;
use proxier_core::backend::address::KernelAddressBackend;
use proxier_core::backend::ipvs::KernelIpvsBackend;
use proxier_core::backend::{AddressBackend, BackendError, IpvsBackend, IpvsOp, OpKind};
use proxier_core::conntrack::{ConntrackBackend, FlowFilter, KernelConntrack};
use proxier_core::model::ServiceName;
use proxier_core::netfilter::{Netfilter, NftBackend, RenderOptions};
use proxier_core::reconciler::OpCounts;
use proxier_core::sysctl::{ProcSysctl, SysctlOptions, ensure_sysctls};
use proxier_core::{HealthCheck, Reconciler, ReconcilerConfig, SyncReport};

use crate::cluster_view::ClusterView;
use crate::dry_run::plan_size;
use crate::health::ServiceHealthServers;
use crate::metrics::{
    DataPlaneSize, OpResult, TrafficPolicy, record_netlink_operations, record_network_programming,
    set_data_plane_size, set_full_resync_drift_repaired, set_no_local_endpoints,
};
use crate::runner::{RunnerHandle, SyncError, SyncKind, SyncTarget};
use crate::settings::Settings;
use crate::source::ObjectKey;
use crate::tracked_state::TrackedState;

/// Why the data plane could not be opened, synced or cleaned up.
#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    /// The IPVS netlink handle could not be opened.
    #[error("opening IPVS (generic netlink): {0}")]
    OpenIpvs(BackendError),
    /// The rtnetlink connection could not be opened.
    #[error("opening rtnetlink for link {link}: {source}")]
    OpenLink {
        /// The dummy link.
        link: String,
        /// The error.
        source: BackendError,
    },
    /// The netfilter options were invalid.
    #[error("netfilter table settings: {0}")]
    NetfilterOptions(#[from] proxier_core::netfilter::RenderError),
    /// The reconciler could not read or prepare the kernel (nothing was applied).
    #[error("reconciling IPVS: {0}")]
    Reconcile(#[from] proxier_core::ReconcileError),
    /// The nftables table could not be replaced.
    #[error("replacing the nftables table: {0}")]
    Netfilter(#[from] proxier_core::netfilter::NetfilterError),
    /// Some service ports could not be programmed (the others were).
    #[error("{failed} kernel writes failed ({services} service ports with errors); see the log")]
    PartialFailure {
        /// Failed writes.
        failed: usize,
        /// Service ports (or cleanup) with errors.
        services: usize,
    },
    /// `--cleanup` could not remove something.
    #[error("cleanup: {0}")]
    Cleanup(String),
}

/// What one sync did, for logs and for `--once`'s summary line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// The reconciler's report (IPVS and address writes).
    pub report: SyncReport,
    /// Whether the nftables table was rewritten.
    pub netfilter_replaced: bool,
    /// UDP conntrack entries deleted.
    pub conntrack_deleted: usize,
}

impl std::fmt::Display for SyncOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} writes ({} deletes, {} failed), nftables table {}, {} UDP conntrack entries deleted",
            self.report.writes,
            self.report.deletes,
            self.report.failed,
            if self.netfilter_replaced {
                "replaced"
            } else {
                "unchanged"
            },
            self.conntrack_deleted
        )?;
        if let Some(drift) = self.report.drift {
            write!(f, ", drift repaired {drift}")?;
        }
        Ok(())
    }
}

/// The label of an op kind for `ipvs_proxier_netlink_operations_total`.
fn op_label(kind: OpKind) -> &'static str {
    match kind {
        OpKind::AddVirtualServer => "add_virtual_server",
        OpKind::UpdateVirtualServer => "update_virtual_server",
        OpKind::DeleteVirtualServer => "delete_virtual_server",
        OpKind::AddRealServer => "add_real_server",
        OpKind::UpdateRealServer => "update_real_server",
        OpKind::DeleteRealServer => "delete_real_server",
        OpKind::BindAddress => "bind_address",
        OpKind::UnbindAddress => "unbind_address",
    }
}

/// Sets the sysctls IPVS mode needs; each failure is logged (by proxier-core) and the
/// daemon goes on.
pub fn apply_sysctls(strict_arp: bool) {
    let report = ensure_sysctls(&ProcSysctl::default(), SysctlOptions { strict_arp });
    // proxier-core logs each change, skip and failure itself.
    let essential = report.essential_failures().count();
    if !report.failures.is_empty() {
        tracing::warn!(
            failed = report.failures.len(),
            essential,
            "some sysctls could not be set; continuing (traffic may not flow as planned)"
        );
    }
}

/// Sets `--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout` and `--ipvs-udp-timeout` (0 keeps
/// the kernel's value). A failure is logged; the daemon goes on.
async fn set_ipvs_timeouts(ipvs: &KernelIpvsBackend, settings: &Settings) {
    let secs = |d: std::time::Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
    let timeouts = ipvs_netlink::Timeouts {
        tcp: secs(settings.ipvs.tcp_timeout),
        tcp_fin: secs(settings.ipvs.tcp_fin_timeout),
        udp: secs(settings.ipvs.udp_timeout),
    };
    if timeouts.tcp == 0 && timeouts.tcp_fin == 0 && timeouts.udp == 0 {
        return;
    }
    match ipvs.handle().set_timeouts(&timeouts).await {
        Ok(()) => tracing::info!(
            tcp = timeouts.tcp,
            tcp_fin = timeouts.tcp_fin,
            udp = timeouts.udp,
            "IPVS connection timeouts set"
        ),
        Err(error) => tracing::warn!(%error, "cannot set IPVS connection timeouts; continuing"),
    }
}

/// The kernel data plane.
pub struct DataPlane {
    view: Arc<Mutex<ClusterView>>,
    reconciler: Reconciler<KernelIpvsBackend, KernelAddressBackend>,
    netfilter: Netfilter<NftBackend>,
    /// Cluster state and plan, updated from the view's changes on every sync.
    tracked: TrackedState,
    /// Whether a sync has run (the first one is always full).
    synced_once: bool,
    /// Op counters already exported to the metrics.
    exported_ops: BTreeMap<OpKind, OpCounts>,
    /// Asks the runner for a sync when drains or retries are due.
    wake: Option<RunnerHandle>,
    /// The pending wake-up.
    wake_task: Option<tokio::task::JoinHandle<()>>,
    /// Health-check servers of `externalTrafficPolicy: Local` Services, kept in step with
    /// every sync (`None`: not served).
    health_checks: Option<Arc<ServiceHealthServers>>,
}

impl DataPlane {
    /// Opens the kernel backends in the process's network namespace (within a tokio runtime)
    /// and sets the sysctls. Touches no IPVS service, address or table yet.
    pub async fn open(
        settings: &Settings,
        view: Arc<Mutex<ClusterView>>,
    ) -> Result<DataPlane, DataPlaneError> {
        let config = settings.planner_config();
        let ipvs = KernelIpvsBackend::connect()
            .await
            .map_err(DataPlaneError::OpenIpvs)?;
        // Only once IPVS is known to be there: a machine without it keeps its sysctls.
        apply_sysctls(settings.ipvs.strict_arp);
        set_ipvs_timeouts(&ipvs, settings).await;
        let addresses =
            KernelAddressBackend::connect(settings.dummy_interface.clone()).map_err(|source| {
                DataPlaneError::OpenLink {
                    link: settings.dummy_interface.clone(),
                    source,
                }
            })?;
        let reconciler_config = ReconcilerConfig {
            exclude_cidrs: config.exclude_cidrs.clone(),
            ..ReconcilerConfig::default()
        };
        let netfilter = Netfilter::new(NftBackend::default(), RenderOptions::default())?;
        Ok(DataPlane {
            view,
            reconciler: Reconciler::new(ipvs, addresses, reconciler_config),
            netfilter,
            tracked: TrackedState::new(&settings.hostname, config),
            synced_once: false,
            exported_ops: BTreeMap::new(),
            wake: None,
            wake_task: None,
            health_checks: None,
        })
    }

    /// Lets the data plane ask `runner` for a sync when draining real servers need a check
    /// or a failed service port's retry is due (the runner otherwise only syncs on changes
    /// and on the periodic full resync).
    pub fn wake_runner_with(&mut self, runner: RunnerHandle) {
        self.wake = Some(runner);
    }

    /// Serves the health checks of `externalTrafficPolicy: Local` Services through
    /// `servers`: each sync opens and closes their ports and updates their endpoint counts.
    pub fn serve_health_checks_with(&mut self, servers: Arc<ServiceHealthServers>) {
        self.health_checks = Some(servers);
    }

    /// Opens, closes and updates the health-check servers for the checks of this sync. A port
    /// that cannot be bound is logged (by the servers) and retried on the next sync.
    async fn sync_health_checks(&self, checks: &BTreeMap<ServiceName, HealthCheck>) {
        let Some(servers) = &self.health_checks else {
            return;
        };
        let key = |name: &ServiceName| ObjectKey {
            namespace: name.namespace.clone(),
            name: name.name.clone(),
        };
        let ports: HashMap<ObjectKey, u16> = checks
            .iter()
            .map(|(name, check)| (key(name), check.node_port))
            .collect();
        let counts: HashMap<ObjectKey, usize> = checks
            .iter()
            .map(|(name, check)| (key(name), check.local_endpoints))
            .collect();
        servers.sync_services(&ports).await;
        servers.sync_endpoints(&counts).await;
    }

    fn schedule_wake(&mut self) {
        let Some(runner) = &self.wake else { return };
        if let Some(task) = self.wake_task.take() {
            task.abort();
        }
        if let Some(at) = self.reconciler.next_deadline() {
            let runner = runner.clone();
            self.wake_task = Some(tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                runner.request_sync();
            }));
        }
    }

    /// Plans the current view and converges the kernel on it. `Full` re-reads the kernel
    /// (adopting what matches, repairing drift) and rewrites the nftables table; `Incremental`
    /// applies only the Service ports whose plan changed and runs due drains and retries.
    /// Per-service failures do not stop the others: they are logged, counted and returned
    /// as [`DataPlaneError::PartialFailure`] after everything else was applied.
    pub async fn sync(&mut self, kind: SyncKind) -> Result<SyncOutcome, DataPlaneError> {
        let update = {
            let mut view = self
                .view
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let changes = view.take_changes();
            self.tracked.update(&view, &changes)
        };
        let desired = self.tracked.desired();
        let Some(node) = self.tracked.node() else {
            return Ok(SyncOutcome::default());
        };
        let netfilter_plan =
            proxier_core::netfilter::plan(self.tracked.state(), node, self.tracked.config());
        let health_checks = proxier_core::health_checks(self.tracked.state(), node);
        let no_local = proxier_core::services_without_local_endpoints(self.tracked.state(), node);
        set_no_local_endpoints(TrafficPolicy::Internal, no_local.internal);
        set_no_local_endpoints(TrafficPolicy::External, no_local.external);

        let mut report = match kind {
            SyncKind::Incremental if self.synced_once => {
                let mut report = if update.changed.is_empty() {
                    SyncReport::default()
                } else {
                    self.reconciler
                        .sync_services(desired, &update.changed)
                        .await?
                };
                // Draining real servers are checked on every incremental sync (the wake-up
                // below makes one happen while any drain); retries when their backoff is over.
                let due = !self.reconciler.drain_queue().is_empty()
                    || self
                        .reconciler
                        .next_deadline()
                        .is_some_and(|at| at <= tokio::time::Instant::now());
                if due {
                    merge(&mut report, self.reconciler.tick(desired).await?);
                }
                report
            }
            _ => {
                self.netfilter.invalidate();
                self.reconciler.full_sync(desired).await?
            }
        };
        for (service, error) in &report.errors {
            match service {
                Some(service) => {
                    tracing::error!(service = %service, %error, "service port not programmed")
                }
                None => tracing::error!(%error, "cleanup of unplanned kernel objects failed"),
            }
        }
        let size = plan_size(desired);
        self.export_metrics(size, &report);

        let netfilter_result = self.netfilter.sync(&netfilter_plan).await;
        let netfilter_replaced = match &netfilter_result {
            Ok(replaced) => *replaced,
            Err(error) => {
                tracing::error!(%error, "nftables table not replaced");
                false
            }
        };

        // Stale UDP flows: only against plans this process made (a restart does not flush
        // the flows of services that were already programmed).
        let conntrack_deleted =
            clear_stale_udp_flows(update.stale_udp_flows(self.tracked.desired())).await;
        self.synced_once = true;
        self.schedule_wake();
        // From the change in the cluster to rules programmed, as kube-proxy measures it.
        let programmed = std::time::SystemTime::now();
        for at in &update.trigger_times {
            if let Ok(latency) = programmed.duration_since(*at) {
                record_network_programming(latency);
            }
        }
        self.sync_health_checks(&health_checks).await;
        netfilter_result?;
        let outcome = SyncOutcome {
            report: std::mem::take(&mut report),
            netfilter_replaced,
            conntrack_deleted,
        };
        if outcome.report.failed > 0 || !outcome.report.errors.is_empty() {
            let services = outcome.report.errors.len();
            tracing::warn!(%outcome, "sync finished with errors");
            return Err(DataPlaneError::PartialFailure {
                failed: outcome.report.failed,
                services,
            });
        }
        tracing::info!(kind = ?kind, %outcome, "sync done");
        Ok(outcome)
    }

    fn export_metrics(&mut self, mut size: DataPlaneSize, report: &SyncReport) {
        let stats = self.reconciler.stats();
        for (kind, counts) in &stats.ops {
            let before = self.exported_ops.get(kind).copied().unwrap_or_default();
            let label = op_label(*kind);
            let ok = counts.succeeded.saturating_sub(before.succeeded);
            let failed = counts.failed.saturating_sub(before.failed);
            if ok > 0 {
                record_netlink_operations(label, OpResult::Success, ok);
            }
            if failed > 0 {
                record_netlink_operations(label, OpResult::Error, failed);
            }
        }
        self.exported_ops = stats.ops.clone();
        size.draining = stats.drain_queue_len;
        set_data_plane_size(size);
        if let Some(drift) = report.drift {
            set_full_resync_drift_repaired(drift);
        }
    }
}

fn merge(into: &mut SyncReport, more: SyncReport) {
    into.writes += more.writes;
    into.deletes += more.deletes;
    into.failed += more.failed;
    into.errors.extend(more.errors);
}

/// Deletes conntrack entries matching `filters` (blocking ctnetlink calls on a worker thread,
/// which shares the process's network namespace). Failures are logged, never fatal.
async fn clear_stale_udp_flows(filters: BTreeSet<FlowFilter>) -> usize {
    if filters.is_empty() {
        return 0;
    }
    let filters: Vec<FlowFilter> = filters.into_iter().collect();
    let count = filters.len();
    let result = tokio::task::spawn_blocking(move || {
        let mut conntrack = KernelConntrack::new()?;
        conntrack.delete_flows(&filters)
    })
    .await;
    match result {
        Ok(Ok(deleted)) => {
            tracing::debug!(
                filters = count,
                deleted,
                "stale UDP conntrack entries deleted"
            );
            deleted
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "stale UDP conntrack entries not deleted");
            0
        }
        Err(error) => {
            tracing::warn!(%error, "conntrack cleanup task failed");
            0
        }
    }
}

impl SyncTarget for DataPlane {
    async fn sync(&mut self, kind: SyncKind) -> Result<(), SyncError> {
        let started = Instant::now();
        let result = DataPlane::sync(self, kind).await;
        tracing::debug!(took = ?started.elapsed(), "kernel sync");
        match result {
            Ok(_) => Ok(()),
            // The rest of the data plane is programmed and the reconciler retries the failed
            // service ports with backoff (logged and counted): not a failed sync, so health
            // stays good and the runner does not force full resyncs over one bad Service.
            Err(DataPlaneError::PartialFailure { .. }) => Ok(()),
            Err(error) => Err(SyncError(error.to_string())),
        }
    }
}

/// What `--cleanup` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Virtual servers deleted.
    pub virtual_servers: usize,
    /// Whether the dummy link existed and was deleted.
    pub link_deleted: bool,
}

/// `--cleanup`: deletes every IPVS virtual server whose address is bound on the dummy link,
/// the link itself and the proxier's nftables tables. NodePort virtual servers on the node's
/// own addresses are not removed: after a restart nothing records which ones the proxier
/// created, and they cannot be told apart from someone else's.
pub async fn cleanup(settings: &Settings) -> Result<CleanupReport, DataPlaneError> {
    let link = settings.dummy_interface.clone();
    let mut addresses =
        KernelAddressBackend::connect(link.clone()).map_err(|source| DataPlaneError::OpenLink {
            link: link.clone(),
            source,
        })?;
    let bound: BTreeSet<IpAddr> = addresses
        .list_addresses()
        .await
        .map_err(|e| DataPlaneError::Cleanup(format!("listing addresses on {link}: {e}")))?;
    // NodePorts (ours or kube-proxy's) sit on the node's own addresses, not on the link.
    let node_addresses: BTreeSet<IpAddr> = addresses
        .node_addresses()
        .await
        .map_err(|e| DataPlaneError::Cleanup(format!("listing the node's addresses: {e}")))?;
    let owned = |key: &VirtualServerKey| {
        bound.contains(&key.address)
            || (node_addresses.contains(&key.address) && NODE_PORT_RANGE.contains(&key.port))
    };
    let mut errors = Vec::new();
    let mut report = CleanupReport::default();

    match KernelIpvsBackend::connect().await {
        Ok(mut ipvs) => match ipvs.list_virtual_servers().await {
            Ok(table) => {
                let ops: Vec<IpvsOp> = table
                    .keys()
                    .filter(|key| owned(key))
                    .map(|key| IpvsOp::DeleteVirtualServer(*key))
                    .collect();
                let results = ipvs.apply(&ops).await;
                for (op, result) in ops.iter().zip(results) {
                    match result {
                        Ok(()) | Err(BackendError::NotFound) => report.virtual_servers += 1,
                        Err(error) => errors.push(format!("{op}: {error}")),
                    }
                }
            }
            Err(error) => errors.push(format!("listing IPVS virtual servers: {error}")),
        },
        Err(error) => errors.push(format!("opening IPVS: {error}")),
    }

    match delete_link(&link).await {
        Ok(deleted) => report.link_deleted = deleted,
        Err(error) => errors.push(format!("deleting link {link}: {error}")),
    }

    let mut netfilter = Netfilter::new(NftBackend::default(), RenderOptions::default())?;
    if let Err(error) = netfilter.cleanup().await {
        errors.push(format!("removing nftables tables: {error}"));
    }
    tracing::info!(
        virtual_servers = report.virtual_servers,
        link_deleted = report.link_deleted,
        "cleanup done"
    );
    if errors.is_empty() {
        Ok(report)
    } else {
        Err(DataPlaneError::Cleanup(errors.join("; ")))
    }
}

/// NodePorts kube-proxy and this daemon allocate from (the API server's default
/// `--service-node-port-range`): `--cleanup` deletes virtual servers on node addresses in it.
const NODE_PORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

/// Deletes the link named `name`; `Ok(false)` when it does not exist.
async fn delete_link(name: &str) -> Result<bool, String> {
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(|e| format!("opening rtnetlink: {e}"))?;
    let driver = tokio::spawn(connection);
    let result = async {
        let mut links = handle.link().get().match_name(name.to_owned()).execute();
        let index = match links.try_next().await {
            Ok(Some(link)) => link.header.index,
            Ok(None) => return Ok(false),
            Err(rtnetlink::Error::NetlinkError(message)) if -message.raw_code() == ENODEV => {
                return Ok(false);
            }
            Err(error) => return Err(error.to_string()),
        };
        handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(|e| e.to_string())?;
        Ok(true)
    }
    .await;
    driver.abort();
    result
}

/// ENODEV: the kernel's answer when a link name is unknown.
const ENODEV: i32 = 19;
