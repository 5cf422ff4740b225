//! The engine: one [`Proxier`] that owns everything between "something changed" and "the
//! kernel matches", for the daemon, its dry run and any embedder alike.
//!
//! Feed it [`Change`]s ([`Proxier::apply`]); call [`Proxier::sync`] (or let the [`driver`]
//! decide when). A sync re-plans only the Service ports the changes dirtied, converges IPVS
//! and the dummy link through the [`Reconciler`], adds and deletes only the nftables set
//! elements of the Services that changed, forgets stale UDP conntrack entries, and updates
//! the health-check decisions, all in time proportional to the change. A
//! [`SyncKind::Full`] sync re-reads the kernel and repairs drift: the repair path. Its slow
//! part, the kernel read, can run beside incremental syncs ([`Proxier::begin_full_sync`],
//! [`Proxier::finish_full_sync`]; the [`driver`] does), so no change waits for a resync.
//!
//! ```
//! use proxier_core::engine::{Backends, Proxier, ProxierConfig, SyncKind};
//! use proxier_core::model::{Config, Service, ServiceName, ServicePortSpec, Protocol};
//! use proxier_core::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let backends = Backends::in_memory();
//! let ipvs = backends.ipvs.clone();
//! let mut proxier = Proxier::new(ProxierConfig::new("node-a", Config::default()), backends)?;
//! let port = ServicePortSpec { name: "http".into(), port: 80, protocol: Protocol::Tcp, node_port: None };
//! let web = Service::new(ServiceName::new("default", "web"), vec!["10.96.0.10".parse()?], vec![port]);
//! proxier.apply(Change::UpsertService(web));
//! let report = proxier.sync(SyncKind::Full).await?;
//! assert_eq!(ipvs.table().len(), 1);
//! assert!(report.ipvs.writes > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

pub mod driver;
mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use foldhash::{HashMap, HashMapExt};
use ipnet::IpNet;
use tokio::time::Instant;

pub use driver::{DriverConfig, ProxierHandle, SyncScheduler};
pub use report::{PlanSize, SyncKind, SyncReport, SyncTimings};

use crate::backend::memory::{MemoryAddressBackend, MemoryIpvsBackend};
use crate::backend::{AddressBackend, BackendError, IpvsBackend};
use crate::backend::{KernelAddressBackend, KernelIpvsBackend};
use crate::conntrack::{ConntrackBackend, KernelConntrack, MemoryConntrack};
use crate::desired::{Desired, Protocol, ServicePortPlan};
use crate::flows::{FlowFilter, stale_udp_flows_of_port};
use crate::health_check::{HealthCheck, NoLocalEndpoints};
use crate::model::{
    Config, NodeContext, RefusedRoute, ServiceName, ServicePortName, decide_routes,
};
use crate::netfilter::{
    MemoryNetfilterBackend, Netfilter, NetfilterBackend, NetfilterError, NetfilterPlan,
    NetfilterTracker, NftBackend, RenderError, RenderOptions, StoredTables, empty_plan,
};
use crate::planner::{Planner, ServicePlan};
use crate::reconciler::{
    CleanupReport, FullRead, ReconcileError, ReconcileReport, Reconciler, ReconcilerConfig,
    ReconcilerStats,
};
use crate::state::{Change, ClusterState, DirtyPorts};
use crate::sysctl::{ProcSysctl, SysctlOptions, ensure_sysctls};
use crate::takeover::KubeProxyTakeover;

/// Settings of a [`Proxier`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxierConfig {
    /// This node's name: endpoints on it are local; used until a Node object is applied.
    pub hostname: String,
    /// How Services are planned.
    pub planner: Config,
    /// How the kernel is converged (ownership, drains, retries).
    pub reconciler: ReconcilerConfig,
    /// The nftables tables' name and mark.
    pub netfilter: RenderOptions,
    /// Take the node's local addresses (where NodePorts live) from the address backend,
    /// re-read at every full sync and on [`Proxier::refresh_node_addresses`], instead of from
    /// the Node object (kube-proxy reads the interfaces; a dry run cannot).
    pub node_addresses_from_kernel: bool,
    /// How often a full resync rewrites the nftables tables whole (kube-proxy's nftables
    /// mode: one hour). Between those, a full resync only checks that the tables are there;
    /// a failed update, or a missing table, rewrites them at once.
    pub netfilter_full_sync_period: Duration,
}

impl ProxierConfig {
    /// Defaults for node `hostname` planned with `planner`: its excluded CIDRs are never
    /// touched by the reconciler either, and its Service CIDR routes are kept through the
    /// dummy link.
    pub fn new(hostname: impl Into<String>, planner: Config) -> Self {
        let reconciler = ReconcilerConfig {
            exclude_cidrs: planner.exclude_cidrs.clone(),
            service_cidr_routes: planner.service_cidr_routes.clone(),
            ..ReconcilerConfig::default()
        };
        ProxierConfig {
            hostname: hostname.into(),
            planner,
            reconciler,
            netfilter: RenderOptions::default(),
            node_addresses_from_kernel: false,
            netfilter_full_sync_period: DEFAULT_NETFILTER_FULL_SYNC_PERIOD,
        }
    }
}

/// [`ProxierConfig::netfilter_full_sync_period`]'s default: one hour, as kube-proxy's
/// nftables mode rewrites its table.
pub const DEFAULT_NETFILTER_FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// What a full sync reads before it can repair anything, read by [`FullSyncRead`].
#[derive(Debug)]
pub struct KernelRead {
    kernel: FullRead,
    netfilter_tables_present: bool,
    /// At start: the nftables tables a previous run left and their digests.
    netfilter_stored: Option<StoredTables>,
}

impl KernelRead {
    /// A read that could not be made (its task failed): the full sync then fails, and the
    /// driver retries it.
    pub fn failed(reason: impl Into<String>) -> Self {
        KernelRead {
            kernel: FullRead {
                table: Err(BackendError::Other(reason.into())),
                link: None,
            },
            netfilter_tables_present: false,
            netfilter_stored: None,
        }
    }
}

/// The reads of a full sync in flight ([`Proxier::begin_full_sync`]): a future that borrows
/// nothing of the proxier, to be spawned (or awaited) while incremental syncs go on.
pub struct FullSyncRead(Pin<Box<dyn Future<Output = KernelRead> + Send + 'static>>);

impl std::fmt::Debug for FullSyncRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FullSyncRead")
    }
}

impl FullSyncRead {
    /// Runs the read on a thread of its own named `thread`, at nice value `nice`
    /// ([`crate::priority::spawn_in_background`]), its answer (with the time the read ended)
    /// awaited by a task of the current runtime; a thread that cannot start, or stops, fails
    /// the read. Aborting the task cancels the read.
    pub(crate) fn spawn_in_background(
        self,
        thread: &str,
        nice: i32,
    ) -> tokio::task::JoinHandle<(KernelRead, Instant)> {
        let answer = crate::priority::spawn_in_background(thread, nice, async move {
            (self.await, Instant::now())
        });
        let thread = thread.to_owned();
        tokio::spawn(async move {
            let failed = |reason: String| (KernelRead::failed(reason), Instant::now());
            match answer {
                Ok(answer) => answer
                    .await
                    .unwrap_or_else(|_| failed(format!("the kernel read thread {thread} stopped"))),
                Err(error) => failed(format!(
                    "cannot start the kernel read thread {thread}: {error}"
                )),
            }
        })
    }
}

impl Future for FullSyncRead {
    type Output = KernelRead;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<KernelRead> {
        self.0.as_mut().poll(cx)
    }
}

/// The four edges a [`Proxier`] writes through.
#[derive(Debug)]
pub struct Backends<I, A, N, C> {
    /// IPVS virtual and real servers.
    pub ipvs: I,
    /// The dummy link and its addresses.
    pub addresses: A,
    /// nftables.
    pub netfilter: N,
    /// UDP conntrack cleanup (blocking calls, run on a worker thread).
    pub conntrack: C,
}

/// A [`Proxier`] on in-memory backends: tests, `--dry-run`, embedders' own checks.
pub type MemoryProxier =
    Proxier<MemoryIpvsBackend, MemoryAddressBackend, MemoryNetfilterBackend, MemoryConntrack>;

/// A [`Proxier`] on the kernel of its network namespace.
pub type KernelProxier =
    Proxier<KernelIpvsBackend, KernelAddressBackend, NftBackend, KernelConntrack>;

impl Backends<MemoryIpvsBackend, MemoryAddressBackend, MemoryNetfilterBackend, MemoryConntrack> {
    /// Empty in-memory backends (the IPVS and address ones are shared handles: clone them
    /// before building the proxier to look at what it programmed).
    pub fn in_memory() -> Self {
        Backends {
            ipvs: MemoryIpvsBackend::new(),
            addresses: MemoryAddressBackend::new(),
            netfilter: MemoryNetfilterBackend::default(),
            conntrack: MemoryConntrack::default(),
        }
    }

    /// In-memory backends for a dry run, the dummy link named `link`: like
    /// [`Backends::in_memory`], but keeping no log of the writes, scripts and flushes asked
    /// of them, so that a dry run following its source for days holds only the picture.
    pub fn dry_run(link: &str) -> Self {
        let ipvs = MemoryIpvsBackend::new();
        ipvs.set_recording(false);
        let addresses = MemoryAddressBackend::named(link);
        addresses.set_recording(false);
        Backends {
            ipvs,
            addresses,
            netfilter: MemoryNetfilterBackend {
                forget_scripts: true,
                ..MemoryNetfilterBackend::default()
            },
            conntrack: MemoryConntrack {
                forget_calls: true,
                ..MemoryConntrack::default()
            },
        }
    }
}

impl Backends<KernelIpvsBackend, KernelAddressBackend, NftBackend, KernelConntrack> {
    /// Opens the kernel's IPVS, rtnetlink (dummy link `link`) and conntrack sockets in the
    /// calling thread's network namespace (within a tokio runtime); nftables runs `nft`.
    pub async fn kernel(link: &str) -> Result<Self, EngineError> {
        let ipvs = KernelIpvsBackend::connect()
            .await
            .map_err(EngineError::OpenIpvs)?;
        let addresses =
            KernelAddressBackend::connect(link).map_err(|source| EngineError::OpenLink {
                link: link.to_owned(),
                source,
            })?;
        let conntrack =
            KernelConntrack::new().map_err(|e| EngineError::OpenConntrack(e.to_string()))?;
        Ok(Backends {
            ipvs,
            addresses,
            netfilter: NftBackend::default(),
            conntrack,
        })
    }
}

/// Why a proxier could not be built or a sync could not run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The IPVS netlink family could not be opened.
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
    /// The conntrack netlink socket could not be opened.
    #[error("opening conntrack netlink: {0}")]
    OpenConntrack(String),
    /// The nftables settings are invalid.
    #[error("nftables settings: {0}")]
    Netfilter(#[from] RenderError),
    /// The running kernel refuses the proxier's nftables tables (checked at start, before
    /// anything was written).
    #[error("checking the nftables tables: {0}")]
    NetfilterRefused(NetfilterError),
    /// The kernel could not be read or prepared; nothing was applied.
    #[error("reconciling IPVS: {0}")]
    Reconcile(#[from] ReconcileError),
}

/// Keeps the kernel converged on the cluster state it is fed.
#[derive(Debug)]
pub struct Proxier<I, A, N, C> {
    config: ProxierConfig,
    started: SystemTime,
    state: ClusterState,
    node: NodeContext,
    desired: Desired,
    size: PlanSize,
    bound: HashMap<IpAddr, u32>,
    reconciler: Reconciler<I, A>,
    netfilter: Netfilter<N>,
    netfilter_plan: NetfilterTracker,
    conntrack: Option<C>,
    health_checks: BTreeMap<ServiceName, HealthCheck>,
    no_local: HashMap<ServiceName, NoLocalEndpoints>,
    no_local_total: NoLocalEndpoints,
    /// Ports dirtied by changes since the last sync.
    dirty: DirtyPorts,
    /// Whether every port must be re-planned at the next sync (the node's facts changed).
    replan_all: bool,
    trigger_times: Vec<SystemTime>,
    /// See [`Proxier::node_eligible`].
    node_eligible: bool,
    synced_once: bool,
    /// The node's addresses as last read from the kernel (with `node_addresses_from_kernel`).
    kernel_addresses: Option<Vec<IpAddr>>,
    /// Whether the node's addresses were re-read since the full sync's read began: then
    /// they are newer than the ones that read holds.
    node_addresses_refreshed_during_read: bool,
    /// kube-proxy's netfilter part, still to be removed.
    takeover: Option<KubeProxyTakeover>,
    /// The Service CIDR routes of the settings as given (`config.planner` holds the ones
    /// routed now: these and the ServiceCIDR objects' ranges that pass the rules).
    configured_routes: Vec<IpNet>,
    /// Ranges not routed, and why.
    refused_routes: Vec<RefusedRoute>,
    /// The report of a full sync whose repair goes on in slices ([`Proxier::repair_step`]),
    /// when it started, and how long its read took.
    repairing: Option<(SyncReport, Instant, Duration)>,
    /// The first sync's kernel read, begun ahead of it ([`Proxier::read_ahead`]); its
    /// answer comes with the time it ended.
    read_ahead: Option<tokio::task::JoinHandle<(KernelRead, Instant)>>,
    /// What was re-planned and not yet applied: by the first sync while the read begun
    /// ahead was still running, then by the sync itself.
    planned_ahead: Option<PlannedAhead>,
    /// Whether incremental syncs leave their nftables update running when the backend can
    /// apply it detached (the [`driver`] turns it on while it runs; a bare
    /// [`Proxier::sync`] otherwise returns with the tables written).
    detach_netfilter: bool,
}

/// How long before the first sync a read begun by [`Proxier::read_ahead`] may have ended:
/// an older one is dropped and the kernel read again, so that what others changed meanwhile
/// (kube-proxy stopping during a takeover, an operator) is not missed for long.
pub const READ_AHEAD_MAX_AGE: Duration = Duration::from_secs(10);

/// The nice value of the thread a read begun by [`Proxier::read_ahead`] runs on (and of the
/// dump threads it starts). At a restart the read and the source's first picture overlap,
/// and the picture is the longer chain (decoding, then planning): it takes the CPUs first
/// and the read their leftovers, rather than both sharing them as equals. Not lower: the
/// first sync waits for the read, and on a node whose pods keep every CPU busy the read
/// still gets about a quarter of a CPU.
const READ_AHEAD_NICE: i32 = 5;

/// The name of that thread.
const READ_AHEAD_THREAD: &str = "read-ahead";

/// How many addresses to bind make a start's binding its longest write
/// ([`Proxier::binds_at_length`]).
const MANY_ADDRESSES: usize = 1_000;

/// What the re-plans before a sync found: the ports whose plan changed, with the plans they
/// had before the first, and how long those done ahead of the sync took.
#[derive(Debug, Default)]
struct PlannedAhead {
    changed: DirtyPorts,
    before: BTreeMap<ServicePortName, Option<ServicePortPlan>>,
    replanned_all: bool,
    health_checks_changed: bool,
    took: Duration,
}

impl<I, A, N, C> Proxier<I, A, N, C>
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    /// A proxier with an empty state over `backends`. It reads the kernel on its first sync.
    pub fn new(
        mut config: ProxierConfig,
        backends: Backends<I, A, N, C>,
    ) -> Result<Self, EngineError> {
        let netfilter = Netfilter::new(backends.netfilter, config.netfilter.clone())?;
        let node = NodeContext::new(config.hostname.clone(), Vec::new(), Vec::new());
        let configured_routes = config.planner.service_cidr_routes.clone();
        let routes = decide_routes(&configured_routes, [], &config.planner, &node);
        for refused in &routes.refused {
            tracing::warn!(cidr = %refused.cidr, origin = %refused.origin, reason = %refused.reason, "Service CIDR not routed");
        }
        config
            .planner
            .service_cidr_routes
            .clone_from(&routes.routed);
        config.reconciler.service_cidr_routes = routes.routed;
        Ok(Proxier {
            configured_routes,
            refused_routes: routes.refused,
            reconciler: Reconciler::new(
                backends.ipvs,
                backends.addresses,
                config.reconciler.clone(),
            ),
            netfilter,
            netfilter_plan: NetfilterTracker::new(empty_plan(&config.planner)),
            conntrack: Some(backends.conntrack),
            started: SystemTime::now(),
            state: ClusterState::new(),
            node,
            desired: Desired::default(),
            size: PlanSize::default(),
            bound: HashMap::new(),
            health_checks: BTreeMap::new(),
            no_local: HashMap::new(),
            no_local_total: NoLocalEndpoints::default(),
            dirty: DirtyPorts::new(),
            replan_all: true,
            trigger_times: Vec::new(),
            node_eligible: true,
            synced_once: false,
            kernel_addresses: None,
            node_addresses_refreshed_during_read: false,
            takeover: None,
            repairing: None,
            read_ahead: None,
            planned_ahead: None,
            detach_netfilter: false,
            config,
        })
    }

    /// Applies one change to the cluster state; returns whether it changed anything. The
    /// kernel follows at the next [`Proxier::sync`].
    ///
    /// An EndpointSlice's trigger time is taken out of it and recorded when the slice changed
    /// something ([`Proxier::record_trigger_time`]); the node's eligibility is kept for
    /// [`Proxier::node_eligible`] (a deleted Node object makes the node ineligible).
    pub fn apply(&mut self, mut change: Change) -> bool {
        let mut trigger_time = None;
        let eligible = match &mut change {
            Change::UpsertSlice(slice) => {
                trigger_time = slice.trigger_time.take();
                None
            }
            Change::UpsertNode(node) => Some(node.eligible),
            Change::DeleteNode => Some(false),
            _ => None,
        };
        let service_cidr_changed = matches!(
            change,
            Change::UpsertServiceCidr(_) | Change::DeleteServiceCidr(_)
        );
        let dirty = self.state.apply(change);
        if service_cidr_changed {
            return self.refresh_routes();
        }
        // As kube-proxy: only a slice that changes something is measured (a resent,
        // unchanged one would wait for an unrelated sync and inflate the latency).
        if let Some(at) = trigger_time
            && !dirty.is_empty()
        {
            self.record_trigger_time(at);
        }
        if let Some(eligible) = eligible {
            self.node_eligible = eligible;
            let node = self.node_facts();
            if !node.plans_like(&self.node) {
                self.replan_all = true;
            }
            // A change of eligibility alone needs no re-plan, but still asks for a (cheap)
            // sync, so that observers see it.
            let changed = node != self.node;
            self.node = node;
            return self.refresh_routes() || changed;
        }
        let changed = !dirty.is_empty();
        // A re-plan of every port is due (the first sync, new node facts): it covers these.
        if !self.replan_all {
            self.dirty.extend(dirty);
        }
        changed
    }

    /// Makes room for `services` more Services and `slices` more EndpointSlices before a
    /// batch of them is applied ([`Proxier::apply`]); a source's first picture, counted, is
    /// applied without its tables growing step by step.
    pub fn reserve(&mut self, services: usize, slices: usize) {
        self.state.reserve(services, slices);
    }

    /// Notes when a change that is being applied was made (an EndpointSlice's
    /// `endpoints.kubernetes.io/last-change-trigger-time`): the next sync reports the
    /// time from it to the kernel being programmed. Times before this proxier was built are
    /// ignored (they would measure the downtime, not the programming). [`Proxier::apply`]
    /// records the trigger time a slice carries; this is for changes made another way.
    pub fn record_trigger_time(&mut self, at: SystemTime) {
        if at >= self.started {
            self.trigger_times.push(at);
        }
    }

    /// Whether the node may take traffic, as its Node object last said (`true` until one
    /// is known, `false` once it is deleted): what `/healthz` reports to load balancers.
    pub fn node_eligible(&self) -> bool {
        self.node_eligible
    }

    /// Takes the node over from kube-proxy's IPVS mode: after the next full sync that left
    /// this proxier's nftables tables in place, `takeover` removes kube-proxy's iptables
    /// chains, their jump rules and its ipsets (see [`crate::takeover`]); until that
    /// succeeds whole, each full sync tries again. Its virtual servers and `kube-ipvs0`
    /// addresses need nothing: the full sync adopts those that match the plan.
    pub fn take_over_kube_proxy(&mut self, takeover: KubeProxyTakeover) {
        self.takeover = Some(takeover);
    }

    /// Whether changes wait for a sync.
    pub fn has_pending_changes(&self) -> bool {
        self.replan_all || !self.dirty.is_empty()
    }

    /// The node as the planner sees it: its Node object's facts, or only its name; with no
    /// local addresses known, its primary IPs stand for them.
    fn node_facts(&self) -> NodeContext {
        let mut node = self.state.node().cloned().unwrap_or_else(|| {
            NodeContext::new(self.config.hostname.clone(), Vec::new(), Vec::new())
        });
        node.eligible = self.node_eligible;
        if let Some(addresses) = &self.kernel_addresses {
            node.local_addresses = addresses.clone();
        } else if node.local_addresses.is_empty() {
            node.local_addresses = node.primary_ips.clone();
        }
        node
    }

    /// Re-reads the node's addresses from the address backend (with
    /// [`ProxierConfig::node_addresses_from_kernel`]); returns whether they changed, in which
    /// case the next sync re-plans every port (NodePorts follow the addresses).
    pub async fn refresh_node_addresses(&mut self) -> bool {
        if !self.config.node_addresses_from_kernel {
            return false;
        }
        self.node_addresses_refreshed_during_read = true;
        let addresses: Vec<IpAddr> = match self.reconciler.node_addresses().await {
            Ok(addresses) => addresses.into_iter().collect(),
            Err(error) => {
                tracing::warn!(%error, "cannot read the node's addresses; keeping the last ones");
                return false;
            }
        };
        self.apply_node_addresses(addresses)
    }

    /// Takes the node's addresses as read from the kernel; returns whether the node's facts
    /// changed (then the next sync re-plans every port).
    fn apply_node_addresses(&mut self, addresses: Vec<IpAddr>) -> bool {
        if !self.config.node_addresses_from_kernel {
            return false;
        }
        if self.kernel_addresses.as_ref() == Some(&addresses) {
            return false;
        }
        tracing::info!(addresses = ?addresses, "node addresses");
        self.kernel_addresses = Some(addresses);
        let node = self.node_facts();
        if node != self.node {
            self.node = node;
            self.replan_all = true;
            self.refresh_routes();
            return true;
        }
        false
    }

    /// Decides again which Service CIDRs are routed ([`decide_routes`]: the configured ones
    /// and the ServiceCIDR objects' ranges, on this node's addresses); returns whether the
    /// routed or the refused ones changed. A change of the routed ones re-plans every port
    /// at the next sync (which ClusterIPs are bound one by one), rewrites the nftables
    /// tables (their rule over the routed ranges) and has the reconciler add the new routes
    /// before it unbinds the addresses under them and remove the old ones after it binds
    /// the addresses they covered.
    fn refresh_routes(&mut self) -> bool {
        let decision = decide_routes(
            &self.configured_routes,
            self.state.service_cidrs(),
            &self.config.planner,
            &self.node,
        );
        let refused_changed = decision.refused != self.refused_routes;
        for refused in decision
            .refused
            .iter()
            .filter(|refused| !self.refused_routes.contains(refused))
        {
            tracing::warn!(cidr = %refused.cidr, origin = %refused.origin, reason = %refused.reason, "Service CIDR not routed");
        }
        self.refused_routes = decision.refused;
        if decision.routed == self.config.planner.service_cidr_routes {
            return refused_changed;
        }
        tracing::info!(routes = ?decision.routed, "Service CIDRs routed through the dummy link");
        self.netfilter_plan
            .set_routed_service_cidrs(&decision.routed);
        self.netfilter.invalidate();
        self.reconciler
            .set_service_cidr_routes(decision.routed.clone());
        self.config
            .reconciler
            .service_cidr_routes
            .clone_from(&decision.routed);
        self.config.planner.service_cidr_routes = decision.routed;
        self.replan_all = true;
        true
    }

    /// The Service CIDRs routed through the dummy link now (also in
    /// [`Proxier::config`]'s planner settings).
    pub fn routed_service_cidrs(&self) -> &[IpNet] {
        &self.config.planner.service_cidr_routes
    }

    /// The Service CIDRs not routed (configured or from ServiceCIDR objects), and why: their
    /// ClusterIPs are bound one by one.
    pub fn refused_service_cidrs(&self) -> &[RefusedRoute] {
        &self.refused_routes
    }

    /// Converges the kernel. `Incremental` applies the Service ports changed since the last
    /// sync and runs due drain checks and retries; `Full` (and the first sync) re-reads the
    /// kernel, adopting what matches and repairing drift, and checks the nftables tables
    /// (rewriting them when one is missing or [`ProxierConfig::netfilter_full_sync_period`]
    /// passed). Per-Service failures do not fail the sync: they are in the report and
    /// retried.
    ///
    /// A `Full` sync here awaits its kernel read; the [`driver`] instead splits it in
    /// [`Proxier::begin_full_sync`] and [`Proxier::finish_full_sync`] and keeps syncing
    /// changes while the read runs.
    pub async fn sync(&mut self, kind: SyncKind) -> Result<SyncReport, EngineError> {
        if kind == SyncKind::Full || !self.synced_once {
            let read = match self.take_read_ahead().await {
                Some(read) => read,
                None => self.begin_full_sync().await,
            };
            return self.finish_full_sync(read).await;
        }
        self.run_sync(None, false).await
    }

    /// Begins the first sync's kernel read now, on a thread of its own at a lower CPU
    /// priority (nice 5) whose answer a task awaits (so within a Tokio
    /// runtime), for it to run while the source fetches its first picture: at 10,000
    /// Services both take seconds, the read mostly in the kernel and the picture in the API
    /// server and its decoding. Nothing writes to the kernel before the first sync, so that sync
    /// uses the read as its own (waiting for it if it is still going), unless it ended more
    /// than [`READ_AHEAD_MAX_AGE`] before. Does nothing after the first sync or when a read
    /// is already ahead.
    pub fn read_ahead(&mut self) {
        if self.synced_once || self.read_ahead.is_some() {
            return;
        }
        let read = self.begin_full_sync();
        self.read_ahead = Some(read.spawn_in_background(READ_AHEAD_THREAD, READ_AHEAD_NICE));
    }

    /// Binds the addresses the changes applied so far plan on the dummy link (the
    /// Services' ClusterIPs, external and load-balancer IPs), ahead of the first sync and
    /// on a task of its own ([`Reconciler::bind_ahead`]): for a caller that has the
    /// Services' complete list before the EndpointSlices', so that a start's longest write,
    /// binding thousands of ClusterIPs one at a time in the kernel, runs while the rest of
    /// its picture comes. The addresses are decided from the Services alone
    /// ([`Planner::bound_addresses`], on the node's addresses read now), without planning
    /// their ports, which the first sync does once the endpoints are in. Only onto a link
    /// that holds no address yet (a fresh start); returns how many addresses are on their
    /// way. Does nothing after the first sync.
    pub async fn bind_ahead(&mut self) -> usize {
        if !self.can_bind_ahead().await {
            return 0;
        }
        self.refresh_node_addresses().await;
        let planner = Planner::new(&self.node, &self.config.planner);
        // The reconciler sorts them and drops repeats (a ClusterIP of several Services).
        let addresses: Vec<IpAddr> = self
            .state
            .services()
            .flat_map(|service| planner.bound_addresses(service))
            .collect();
        self.reconciler.bind_ahead(addresses).await
    }

    /// Whether [`Proxier::bind_ahead`] would bind anything now: before the first sync, onto
    /// a link that holds no address ([`Reconciler::can_bind_ahead`]). A cheap question (the
    /// link's first address answers it), for a caller to ask before it applies the Services
    /// it would bind ahead: a restart finds its link full and leaves them to its first
    /// batch.
    pub async fn can_bind_ahead(&mut self) -> bool {
        !self.synced_once && self.reconciler.can_bind_ahead().await
    }

    /// The read begun by [`Proxier::read_ahead`], when there is one young enough for the
    /// first sync.
    async fn take_read_ahead(&mut self) -> Option<KernelRead> {
        let task = self.read_ahead.take()?;
        if self.synced_once {
            task.abort();
            return None;
        }
        if !task.is_finished() {
            // Planning needs no kernel read: it is done while the read goes on.
            self.plan_ahead().await;
        }
        match task.await {
            Ok((_, ended)) if ended.elapsed() > READ_AHEAD_MAX_AGE => {
                tracing::info!(
                    ended_ago = ?ended.elapsed(),
                    "the kernel read begun ahead is too old; reading again"
                );
                None
            }
            Ok((read, _)) => Some(read),
            Err(error) => {
                tracing::warn!(%error, "the kernel read begun ahead failed; reading again");
                None
            }
        }
    }

    /// Whether this sync (the first) binds so many addresses on the dummy link, on a machine
    /// of so few CPUs, that its nftables rewrite waits for its IPVS writes instead of
    /// running beside them and the binding. Binding is a start's longest write (the kernel
    /// walks the link's address list for every address it adds: 10,000 ClusterIPs take
    /// seconds), one chain that keeps one CPU busy; with fewer than three CPUs, the IPVS
    /// writes and the `nft` process then share the other one in turn rather than all three
    /// sharing both.
    fn binds_at_length(&self) -> bool {
        !self.synced_once
            && self.bound.len() >= MANY_ADDRESSES
            && std::thread::available_parallelism().map_or(1, std::num::NonZero::get) < 3
    }

    /// Re-plans what changed before the sync that applies it (the first one, while its
    /// kernel read runs): the node's addresses are read first, as the sync would take them
    /// from its read. The next sync adds what this found to what it plans itself.
    async fn plan_ahead(&mut self) {
        let started = Instant::now();
        self.refresh_node_addresses().await;
        self.replan_pending();
        if let Some(ahead) = &mut self.planned_ahead {
            ahead.took += started.elapsed();
        }
    }

    /// Re-plans what changed ([`Proxier::replan`]) and adds it to what was planned ahead of
    /// the sync that applies it.
    fn replan_pending(&mut self) {
        let mut report = SyncReport::default();
        let (mut changed, mut before) = self.replan(&mut report);
        let ahead = self.planned_ahead.get_or_insert_default();
        ahead.changed.append(&mut changed);
        // The plan a port had before the first re-plan is the one it had before the sync:
        // the entries already ahead are appended last, so theirs win.
        before.append(&mut ahead.before);
        ahead.before = before;
        ahead.replanned_all |= report.replanned_all;
        ahead.health_checks_changed |= report.health_checks_changed;
    }

    /// Whether an incremental sync's nftables update is still on its way to the kernel (or
    /// ended and waits for the next sync to take its answer): the elements of later changes
    /// wait for it, their IPVS writes do not.
    pub fn netfilter_updating(&self) -> bool {
        self.netfilter.updating()
    }

    /// Whether the nftables update in flight has ended (the next sync takes its answer at
    /// once: ask for one).
    pub fn netfilter_update_finished(&self) -> bool {
        self.netfilter.update_finished()
    }

    /// Lets incremental syncs, and full syncs ended with [`Proxier::start_repair`] that
    /// replace no table, leave their nftables update running (`true`; the [`driver`]
    /// does while it runs), or makes every sync return with the tables written (`false`,
    /// the default; an update in flight is waited for by the next sync).
    pub fn detach_netfilter_updates(&mut self, detach: bool) {
        self.detach_netfilter = detach;
    }

    /// Waits for the nftables update in flight, if any (a failure is logged; the next sync
    /// replaces the tables).
    pub async fn finish_netfilter_update(&mut self) {
        self.netfilter.settle().await;
    }

    /// Notified each time an nftables update in flight ends (a permit is kept when nobody
    /// waits): a loop waiting for something else wakes and runs an incremental sync, which
    /// takes the update's answer, and brings in the elements that waited for it (or, after a
    /// failure, replaces the tables).
    pub fn netfilter_update_ended(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.netfilter.update_ended()
    }

    /// Whether a full sync may read while incremental syncs go on: only after the first
    /// sync (before it, every sync is the first, full one).
    pub fn reads_concurrently(&self) -> bool {
        self.synced_once
    }

    /// Starts a full sync: its kernel reads (the IPVS table, seconds at 10,000 Services;
    /// the nftables tables present), as a future that borrows nothing of the proxier. Spawn
    /// it, keep feeding changes and running [`SyncKind::Incremental`] syncs meanwhile, and
    /// hand its answer to [`Proxier::finish_full_sync`]: what those syncs wrote is not
    /// mistaken for drift (see [`Reconciler::begin_full_sync`]).
    pub fn begin_full_sync(&mut self) -> FullSyncRead {
        // A new read supersedes a repair left unfinished.
        self.repairing = None;
        self.node_addresses_refreshed_during_read = false;
        let kernel = self.reconciler.begin_full_sync();
        let tables = self.netfilter.check_tables();
        // At start, what a previous run left (read beside the IPVS table, so that adopting
        // the tables needs no listing of its own).
        let stored = self.netfilter.read_stored();
        FullSyncRead(Box::pin(async move {
            let (kernel, netfilter_tables_present, netfilter_stored) =
                futures::join!(kernel, tables, stored);
            KernelRead {
                kernel,
                netfilter_tables_present,
                netfilter_stored,
            }
        }))
    }

    /// Ends a full sync begun with [`Proxier::begin_full_sync`]: re-plans what changed,
    /// repairs drift between the plan and what was read, rewrites the nftables tables when
    /// due, runs the takeover's next step.
    pub async fn finish_full_sync(&mut self, read: KernelRead) -> Result<SyncReport, EngineError> {
        self.run_sync(Some(read), false).await
    }

    /// Ends a full sync begun with [`Proxier::begin_full_sync`] as the [`driver`] does: as
    /// [`Proxier::finish_full_sync`], but after the first sync the comparison of the plan
    /// with the IPVS table is left in slices to [`Proxier::repair_step`], between which
    /// incremental syncs run (see [`Reconciler::repair_slice`]). Returns the full sync's
    /// report when nothing is left to repair, `None` when slices remain.
    pub async fn start_repair(
        &mut self,
        read: KernelRead,
    ) -> Result<Option<SyncReport>, EngineError> {
        let started = Instant::now();
        let report = self.run_sync(Some(read), true).await?;
        if !self.reconciler.repairing() {
            return Ok(Some(report));
        }
        let read_took = report.timings.total.saturating_sub(started.elapsed());
        self.repairing = Some((report, started, read_took));
        Ok(None)
    }

    /// Whether a full sync's repair is left for [`Proxier::repair_step`].
    pub fn repairing(&self) -> bool {
        self.repairing.is_some() && self.reconciler.repairing()
    }

    /// Repairs the next slice of a full sync started with [`Proxier::start_repair`] (at
    /// most [`ReconcilerConfig::repair_slice`] virtual servers); returns the full sync's
    /// report with its last slice, `None` before (or with no repair in progress).
    pub async fn repair_step(&mut self) -> Option<Result<SyncReport, EngineError>> {
        if !self.repairing() {
            self.repairing = None;
            return None;
        }
        let slice = self.config.reconciler.repair_slice;
        let started = Instant::now();
        let done = self.reconciler.repair_slice(&self.desired, slice).await;
        let took = started.elapsed();
        let (report, _, _) = self.repairing.as_mut()?;
        report.timings.ipvs += took;
        let ipvs = done?;
        let (mut report, started, read_took) = self.repairing.take()?;
        log_errors(&ipvs);
        report.ipvs += ipvs;
        report.timings.reconcile = report.ipvs.timings;
        report.size = self.plan_size();
        report.timings.total = started.elapsed() + read_took;
        tracing::debug!(kind = ?report.kind, %report, "sync done");
        Some(Ok(report))
    }

    /// One sync: full with the kernel's read, incremental without. A full one with
    /// `sliced` leaves the IPVS repair to [`Proxier::repair_step`] (after the first).
    async fn run_sync(
        &mut self,
        read: Option<KernelRead>,
        sliced: bool,
    ) -> Result<SyncReport, EngineError> {
        let started = Instant::now();
        let kind = if read.is_some() {
            SyncKind::Full
        } else {
            SyncKind::Incremental
        };
        let mut report = SyncReport {
            kind,
            ..SyncReport::default()
        };
        let (kernel_read, tables_present) = match read {
            Some(read) => {
                if let Some(stored) = read.netfilter_stored {
                    self.netfilter.use_stored(stored);
                }
                (Some(read.kernel), read.netfilter_tables_present)
            }
            None => (None, true),
        };
        // The table read ran before (beside incremental syncs); it is part of this sync.
        let read_took = kernel_read
            .as_ref()
            .and_then(|read| read.table.as_ref().ok())
            .map_or(Duration::ZERO, |read| read.took);
        if let Some(read) = &kernel_read {
            // The node's addresses as read beside the table, unless a refresh since (on an
            // address event) is newer; read now when the backend did not read them.
            match &read.link {
                Some(Ok(link)) => {
                    if !self.node_addresses_refreshed_during_read {
                        self.apply_node_addresses(link.node_addresses.iter().copied().collect());
                    }
                }
                _ => {
                    self.refresh_node_addresses().await;
                }
            }
        }

        self.replan_pending();
        let PlannedAhead {
            changed,
            before,
            replanned_all,
            health_checks_changed,
            took,
        } = self.planned_ahead.take().unwrap_or_default();
        report.replanned_all = replanned_all;
        report.health_checks_changed = health_checks_changed;
        report.timings.plan = started.elapsed() + took;
        report.changed_ports = changed.len();

        // A full sync replaces the nftables tables when one is missing or the last
        // replacement is older than the period.
        let replace_netfilter = kind == SyncKind::Full
            && (!tables_present
                || self
                    .netfilter
                    .replaced_before(self.config.netfilter_full_sync_period));
        // Whether this sync's nftables update runs detached, as an incremental one does: a
        // full sync whose repair goes on in slices does too when it replaces nothing (it
        // would otherwise hold every change behind `nft` for a few hundred milliseconds).
        let detached = self.detach_netfilter
            && (kind == SyncKind::Incremental || (sliced && !replace_netfilter));
        // An incremental nftables update started by an earlier sync and still on its way: a
        // detached sync's elements wait for it (the tracker keeps them), its IPVS changes do
        // not. Any other sync waits for it.
        let settled = if !detached || self.netfilter.update_finished() {
            self.netfilter.settle().await
        } else {
            None
        };
        // A failure was logged; this sync's update replaces the tables.
        report.netfilter_settled = settled.and_then(Result::ok);
        let netfilter_busy = self.netfilter.updating();

        // IPVS and the dummy link (netlink) and the nftables transaction (`nft`) are
        // independent: they are written at the same time.
        if replace_netfilter {
            self.netfilter.invalidate();
        }
        let netfilter_changes = (!netfilter_busy).then(|| self.netfilter_plan.take_changes());
        // When the nftables rewrite waits for the IPVS writes: notified when they are
        // answered (or the reconcile returns).
        let ipvs_written = (replace_netfilter && !detached && self.binds_at_length())
            .then(|| std::sync::Arc::new(tokio::sync::Notify::new()));
        self.reconciler.signal_ipvs_written(ipvs_written.clone());
        let reconciler = &mut self.reconciler;
        let desired = &self.desired;
        let netfilter = &mut self.netfilter;
        let netfilter_plan = self.netfilter_plan.plan();
        let (ipvs, (netfilter_result, netfilter_time)) = tokio::join!(
            async {
                let started = Instant::now();
                let report = match kernel_read {
                    Some(read) => full_reconcile(reconciler, desired, read, &changed, sliced).await,
                    None => incremental_reconcile(reconciler, desired, &changed).await,
                };
                if let Some(signal) = &ipvs_written {
                    signal.notify_one();
                }
                report.map(|report| (report, started.elapsed()))
            },
            async {
                if let Some(signal) = &ipvs_written {
                    signal.notified().await;
                }
                let started = Instant::now();
                let result = match &netfilter_changes {
                    None => Ok(false),
                    Some(changes) if detached => {
                        netfilter.start_changes(netfilter_plan, changes).await
                    }
                    Some(changes) => netfilter.sync_changes(netfilter_plan, changes).await,
                };
                (result, started.elapsed())
            }
        );
        self.reconciler.signal_ipvs_written(None);
        let (ipvs, ipvs_time) = ipvs?;
        report.changed = changed.into_iter().collect();
        report.ipvs = ipvs;
        report.timings.ipvs = ipvs_time;
        report.timings.reconcile = report.ipvs.timings;
        log_errors(&report.ipvs);
        match netfilter_result {
            Ok(written) => report.netfilter_written = written,
            Err(error) => {
                tracing::error!(%error, "nftables tables not updated");
                report.netfilter_error = Some(error.to_string());
            }
        }
        report.timings.netfilter = netfilter_time;
        report.netfilter_pending = self.netfilter.updating();

        // Only with our own table in place: kube-proxy's rules go after ours are there.
        if kind == SyncKind::Full
            && report.netfilter_error.is_none()
            && let Some(takeover) = &self.takeover
        {
            let result = takeover.run().await;
            if result.is_complete() {
                tracing::info!(%result, "took over from kube-proxy");
                self.takeover = None;
            } else {
                tracing::warn!(%result, "kube-proxy's netfilter rules not all removed; the next full sync tries again");
            }
            report.takeover = Some(result);
        }

        let conntrack_started = Instant::now();
        // Only a UDP port's virtual servers are UDP: the others are not looked up (at a
        // start every port is in `before`).
        let filters: BTreeSet<FlowFilter> = before
            .iter()
            .filter(|(name, _)| name.protocol == Protocol::Udp)
            .flat_map(|(name, old)| {
                stale_udp_flows_of_port(old.as_ref(), self.desired.services.get(name))
            })
            .collect();
        report.conntrack_deleted = self.clear_flows(filters).await;
        report.timings.conntrack = conntrack_started.elapsed();

        self.synced_once = true;
        let programmed = SystemTime::now();
        report.programming_latencies = self
            .trigger_times
            .drain(..)
            .filter_map(|at| programmed.duration_since(at).ok())
            .collect();
        report.size = self.plan_size();
        report.timings.total = started.elapsed() + read_took;
        tracing::debug!(kind = ?kind, %report, "sync done");
        Ok(report)
    }

    /// Re-plans what changed, one Service at a time: returns the ports whose plan differs
    /// and the plans they had.
    fn replan(
        &mut self,
        report: &mut SyncReport,
    ) -> (
        DirtyPorts,
        BTreeMap<ServicePortName, Option<ServicePortPlan>>,
    ) {
        // Elements that come and go are kept only for an incremental nftables update; while
        // the tables are to be written whole (a start, a failure), the whole plan is enough.
        let incremental = self.netfilter.tracks_changes();
        self.netfilter_plan.record_changes(incremental);
        let by_service = if std::mem::take(&mut self.replan_all) {
            report.replanned_all = true;
            self.dirty.clear();
            every_port_by_service(&self.state, &self.desired)
        } else {
            by_service(std::mem::take(&mut self.dirty))
        };
        // The planner reads its own copy of the node and the settings, so that the plans
        // of a chunk of Services are applied as soon as they are made.
        let (node, config) = (self.node.clone(), self.config.planner.clone());
        let planner = Planner::new(&node, &config);
        // Filled in the names' order, so collected into their trees in one pass at the end;
        // made for every port (a start re-plans them all).
        let ports = by_service.iter().map(|(_, ports)| ports.len()).sum();
        let mut changed = Vec::with_capacity(ports);
        let mut before = Vec::with_capacity(ports);
        let mut health_changed = false;
        let mut services = by_service.into_iter().peekable();
        while services.peek().is_some() {
            let chunk: Vec<ServicePorts> = services.by_ref().take(REPLAN_CHUNK).collect();
            for ((name, ports), plan) in plan_chunk(&planner, &self.state, chunk) {
                health_changed |=
                    self.apply_service_plan(&name, ports, plan, &mut changed, &mut before);
            }
        }
        report.health_checks_changed = health_changed;
        (changed.into_iter().collect(), before.into_iter().collect())
    }

    /// Applies the plan of Service `name` (`None`: it is gone): each of `ports`, its ports
    /// to re-plan, takes the plan the Service's plan holds for it (none: the port is gone or
    /// owns nothing), recorded in `changed` and `before` (with its old plan) when it
    /// differs; its nftables elements, health check and no-local counts are replaced.
    /// Returns whether its health check changed.
    fn apply_service_plan(
        &mut self,
        name: &ServiceName,
        ports: Vec<ServicePortName>,
        plan: Option<ServicePlan>,
        changed: &mut Vec<ServicePortName>,
        before: &mut Vec<(ServicePortName, Option<ServicePortPlan>)>,
    ) -> bool {
        let (mut port_plans, netfilter, health_check, no_local_endpoints) = match plan {
            Some(plan) => (
                plan.ports,
                Some(plan.netfilter),
                plan.health_check,
                plan.no_local_endpoints,
            ),
            None => (BTreeMap::new(), None, None, NoLocalEndpoints::default()),
        };
        for port in ports {
            let plan = port_plans.remove(&port);
            let (size, bound) = (&mut self.size, &mut self.bound);
            let replaced = self.desired.replace_plan(port.clone(), plan, |new, old| {
                if let Some(new) = new {
                    account(size, bound, new, true);
                }
                if let Some(old) = old {
                    account(size, bound, old, false);
                }
            });
            if let Some(old) = replaced {
                changed.push(port.clone());
                before.push((port, old));
            }
        }
        self.netfilter_plan.set_service(name, netfilter);

        let old = match health_check {
            Some(check) => self.health_checks.insert(name.clone(), check),
            None => self.health_checks.remove(name),
        };

        if let Some(old) = self.no_local.remove(name) {
            self.no_local_total.adjust(old, false);
        }
        if no_local_endpoints != NoLocalEndpoints::default() {
            self.no_local_total.adjust(no_local_endpoints, true);
            self.no_local.insert(name.clone(), no_local_endpoints);
        }
        old != health_check
    }

    /// Deletes conntrack entries matching `filters` on a worker thread (ctnetlink calls
    /// block). Failures are logged, never fatal.
    async fn clear_flows(&mut self, filters: BTreeSet<FlowFilter>) -> usize {
        if filters.is_empty() {
            return 0;
        }
        let Some(mut conntrack) = self.conntrack.take() else {
            return 0;
        };
        let filters: Vec<FlowFilter> = filters.into_iter().collect();
        let task = tokio::task::spawn_blocking(move || {
            let result = conntrack.delete_flows(&filters);
            (conntrack, result)
        });
        match task.await {
            Ok((conntrack, result)) => {
                self.conntrack = Some(conntrack);
                match result {
                    Ok(deleted) => deleted,
                    Err(error) => {
                        tracing::warn!(%error, "stale UDP conntrack entries not deleted");
                        0
                    }
                }
            }
            Err(error) => {
                tracing::error!(%error, "conntrack cleanup task failed; UDP flows are no longer cleaned up");
                0
            }
        }
    }

    /// When drains or retries need a sync next (compare with [`tokio::time::Instant`]).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.reconciler.next_deadline()
    }

    /// Removes everything this proxier owns from the kernel (by the reconciler's one
    /// ownership rule), the dummy link and the nftables tables (`--cleanup`).
    pub async fn cleanup(&mut self) -> CleanupReport {
        let mut report = self.reconciler.remove_owned().await;
        if let Err(error) = self.netfilter.cleanup().await {
            report
                .errors
                .push(format!("removing nftables tables: {error}"));
        }
        self.synced_once = false;
        report
    }

    /// The cluster state as applied.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// The node as the planner sees it.
    pub fn node(&self) -> &NodeContext {
        &self.node
    }

    /// The settings, with the Service CIDRs routed now as the planner's and the
    /// reconciler's routes ([`Proxier::routed_service_cidrs`]).
    pub fn config(&self) -> &ProxierConfig {
        &self.config
    }

    /// The plan as of the last sync.
    pub fn desired(&self) -> &Desired {
        &self.desired
    }

    /// Asks the kernel whether it takes this configuration's nftables tables (rules and
    /// sets, as with no Service), writing nothing; `Ok` for backends with no kernel.
    pub async fn check_netfilter(&self) -> Result<(), EngineError> {
        self.netfilter
            .check_plan(&empty_plan(&self.config.planner))
            .await
            .map_err(EngineError::NetfilterRefused)
    }

    /// The nftables contents as of the last sync.
    pub fn netfilter_plan(&self) -> &NetfilterPlan {
        self.netfilter_plan.plan()
    }

    /// The health checks this node serves, as of the last sync.
    pub fn health_checks(&self) -> &BTreeMap<ServiceName, HealthCheck> {
        &self.health_checks
    }

    /// Services with a Local policy and no local endpoint, as of the last sync.
    pub fn no_local_endpoints(&self) -> NoLocalEndpoints {
        self.no_local_total
    }

    /// The plan's size as of the last sync (and the real servers draining now).
    pub fn plan_size(&self) -> PlanSize {
        PlanSize {
            bound_addresses: self.bound.len(),
            draining: self.reconciler.drain_queue().len(),
            ..self.size
        }
    }

    /// The reconciler's counters (writes by kind and result, drift, retries).
    pub fn reconciler_stats(&self) -> &ReconcilerStats {
        self.reconciler.stats()
    }

    /// The reconciler (its backends, its cached view of the kernel).
    pub fn reconciler(&self) -> &Reconciler<I, A> {
        &self.reconciler
    }
}

impl KernelProxier {
    /// Opens the kernel backends in the calling thread's network namespace, sets the
    /// sysctls IPVS mode needs and the configured IPVS timeouts (failures are logged: the
    /// proxier goes on), and builds a proxier. Touches no virtual server, address or table.
    pub async fn open(config: ProxierConfig, link: &str) -> Result<Self, EngineError> {
        let proxier = KernelProxier::connect(config, link).await?;
        proxier.set_kernel_settings().await;
        Ok(proxier)
    }

    /// Opens the kernel backends in the calling thread's network namespace and builds a
    /// proxier, writing nothing to the node: a program can begin the first sync's kernel
    /// read ([`Proxier::read_ahead`]) before it knows its source can start (a restart's
    /// longest read then runs while the API client is built and the lists come), and set
    /// the node's sysctls ([`KernelProxier::set_kernel_settings`]) only once it does.
    /// [`KernelProxier::open`] does both at once.
    ///
    /// Before it returns, the running kernel is asked (`nft --check`, nothing written)
    /// whether it takes the nftables tables of this configuration as the node's `nft`
    /// writes them: a refusal ([`EngineError::NetfilterRefused`]) names the rule, the
    /// kernel's release and nft's version.
    pub async fn connect(config: ProxierConfig, link: &str) -> Result<Self, EngineError> {
        let backends = Backends::kernel(link).await?;
        let proxier = Proxier::new(config, backends)?;
        proxier.check_netfilter().await?;
        Ok(proxier)
    }

    /// Sets the sysctls IPVS mode needs and the configured IPVS timeouts; failures are
    /// logged, and the proxier goes on (traffic may then not flow as planned).
    pub async fn set_kernel_settings(&self) {
        let started = std::time::Instant::now();
        let sysctls = ensure_sysctls(
            &ProcSysctl::default(),
            SysctlOptions {
                strict_arp: self.config.planner.strict_arp,
            },
        );
        if !sysctls.failures.is_empty() {
            tracing::warn!(
                failed = sysctls.failures.len(),
                essential = sysctls.essential_failures().count(),
                "some sysctls could not be set; continuing (traffic may not flow as planned)"
            );
        }
        set_ipvs_timeouts(self.reconciler.ipvs(), &self.config.planner).await;
        tracing::info!(took = ?started.elapsed(), "sysctls and IPVS timeouts set");
    }
}

/// Sets the configured IPVS connection timeouts (unset ones keep the kernel's value).
async fn set_ipvs_timeouts(ipvs: &KernelIpvsBackend, config: &Config) {
    let secs =
        |d: Option<Duration>| d.map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
    let timeouts = ipvs_netlink::Timeouts {
        tcp: secs(config.timeouts.tcp),
        tcp_fin: secs(config.timeouts.tcp_fin),
        udp: secs(config.timeouts.udp),
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

/// Logs the errors of a sync's IPVS part.
fn log_errors(report: &ReconcileReport) {
    for (service, error) in &report.errors {
        match service {
            Some(service) => {
                tracing::error!(service = %service, %error, "service port not programmed")
            }
            None => tracing::error!(%error, "cleanup of unplanned kernel objects failed"),
        }
    }
}

/// A full sync's IPVS part: the repair with the kernel's read, whole or (`sliced`, after
/// the first) started only, then the changed service ports, which a sliced repair compares
/// with their claims as they were before.
async fn full_reconcile<I: IpvsBackend, A: AddressBackend>(
    reconciler: &mut Reconciler<I, A>,
    desired: &Desired,
    read: FullRead,
    changed: &DirtyPorts,
    sliced: bool,
) -> Result<ReconcileReport, ReconcileError> {
    if !sliced {
        return reconciler.finish_full_sync(desired, read).await;
    }
    if let Some(report) = reconciler.start_repair(desired, read).await? {
        return Ok(report);
    }
    // As an incremental sync: Service CIDR routes that changed go in around the changed
    // ports' writes, or alone.
    if changed.is_empty() {
        return Ok(reconciler.sync_routes().await);
    }
    reconciler.sync_services(desired, changed).await
}

/// An incremental sync's IPVS part: the changed service ports, then due drains and retries.
async fn incremental_reconcile<I: IpvsBackend, A: AddressBackend>(
    reconciler: &mut Reconciler<I, A>,
    desired: &Desired,
    changed: &DirtyPorts,
) -> Result<ReconcileReport, ReconcileError> {
    // Service CIDR routes that changed go in around the changed ports' writes, or alone.
    let mut ipvs = if changed.is_empty() {
        reconciler.sync_routes().await
    } else {
        reconciler.sync_services(desired, changed).await?
    };
    if reconciler
        .next_deadline()
        .is_some_and(|at| at <= Instant::now())
        || !reconciler.drain_queue().is_empty()
    {
        ipvs += reconciler.tick(desired).await?;
    }
    Ok(ipvs)
}

/// A Service to re-plan and its ports to re-plan.
type ServicePorts = (ServiceName, Vec<ServicePortName>);

/// Keeps the plan's sizes and the count of ports binding each address current as one
/// port's plan comes (`up`) or goes.
fn account(
    size: &mut PlanSize,
    bound: &mut HashMap<IpAddr, u32>,
    plan: &ServicePortPlan,
    up: bool,
) {
    let servers = plan.virtual_servers.len();
    let reals: usize = plan
        .virtual_servers
        .values()
        .map(|vs| vs.real_servers.len())
        .sum();
    if up {
        size.virtual_servers += servers;
        size.real_servers += reals;
    } else {
        size.virtual_servers -= servers;
        size.real_servers -= reals;
    }
    for address in plan.bound_addresses() {
        let entry = bound.entry(address).or_insert(0);
        if up {
            *entry += 1;
        } else {
            *entry -= 1;
            if *entry == 0 {
                bound.remove(&address);
            }
        }
    }
}

/// Sorted port names grouped by Service, in order (each Service's ports come one after
/// the other).
fn by_service(names: DirtyPorts) -> Vec<ServicePorts> {
    let mut by_service: Vec<ServicePorts> = Vec::new();
    for name in names {
        match by_service.last_mut() {
            Some((service, ports))
                if service.namespace == name.namespace && service.name == name.name =>
            {
                ports.push(name);
            }
            _ => by_service.push((name.service(), vec![name])),
        }
    }
    by_service
}

/// Every port to re-plan when all are, grouped by Service in order: those the state's
/// Services have, and those planned for Services or ports the state no longer has. The
/// state's Services come unordered from their map and are sorted by name once, their ports
/// within each; the plan's ports, in order already, are merged in. (Collecting every port
/// name into a sorted set and grouping that took twice the sorting and two tree builds: a
/// tenth of the main thread's work at a start of 10,000 Services.)
fn every_port_by_service(state: &ClusterState, desired: &Desired) -> Vec<ServicePorts> {
    let mut from_state: Vec<ServicePorts> = state
        .services()
        .filter(|service| !service.ports.is_empty())
        .map(|service| {
            let mut ports: Vec<ServicePortName> = service.port_names().collect();
            ports.sort_unstable();
            ports.dedup();
            (service.name.clone(), ports)
        })
        .collect();
    from_state.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    if desired.services.is_empty() {
        return from_state;
    }
    let mut merged: Vec<ServicePorts> = Vec::with_capacity(from_state.len());
    let mut planned = desired.services.keys().peekable();
    for (service, mut ports) in from_state {
        // Planned ports of Services before this one that the state does not have.
        while let Some(name) = planned.next_if(|name| name.service_cmp(&service).is_lt()) {
            push_port(&mut merged, name.clone());
        }
        let known = ports.len();
        while let Some(name) = planned.next_if(|name| name.service_cmp(&service).is_eq()) {
            if ports[..known].binary_search(name).is_err() {
                ports.push(name.clone());
            }
        }
        if ports.len() > known {
            ports.sort_unstable();
        }
        merged.push((service, ports));
    }
    for name in planned {
        push_port(&mut merged, name.clone());
    }
    merged
}

/// Appends `name` to the last group when it is of the same Service, else as a group of
/// its own.
fn push_port(groups: &mut Vec<ServicePorts>, name: ServicePortName) {
    match groups.last_mut() {
        Some((service, ports)) if name.service_cmp(service).is_eq() => ports.push(name),
        _ => groups.push((name.service(), vec![name])),
    }
}

/// How many Services a re-plan plans before applying their plans: bounds the plans held at
/// once (a full re-plan at 10,000 Services holds 512, not 10,000).
const REPLAN_CHUNK: usize = 512;

/// Below this many Services a chunk is planned on the calling thread alone: a second thread
/// costs more than it saves (an incremental sync plans one or a few).
const PARALLEL_REPLAN_MIN: usize = 64;

/// The plans of a chunk of Services (`None`: the Service is gone), in the chunk's order. A
/// large chunk is planned in two halves, the second on a scoped thread beside the calling
/// one: planning is pure (it reads the state), and a full re-plan (the first sync, a
/// restart's adoption) is seconds of one CPU at 10,000 Services, on the critical path, while
/// the other CPU waits.
fn plan_chunk(
    planner: &Planner<'_>,
    state: &ClusterState,
    chunk: Vec<ServicePorts>,
) -> Vec<(ServicePorts, Option<ServicePlan>)> {
    let plan_one = |name: &ServiceName| {
        state
            .service(name)
            .map(|service| planner.plan_service(state, service))
    };
    if chunk.len() < PARALLEL_REPLAN_MIN || !parallel_planning() {
        return chunk
            .into_iter()
            .map(|entry| {
                let plan = plan_one(&entry.0);
                (entry, plan)
            })
            .collect();
    }
    let middle = chunk.len() / 2;
    let (first, second) = chunk.split_at(middle);
    let (first_plans, second_plans) = std::thread::scope(|scope| {
        let second = scope.spawn(|| second.iter().map(|(name, _)| plan_one(name)).collect());
        let first: Vec<Option<ServicePlan>> =
            first.iter().map(|(name, _)| plan_one(name)).collect();
        // A panic in the planner is a bug: it propagates as it would on one thread.
        let second: Vec<Option<ServicePlan>> = match second.join() {
            Ok(plans) => plans,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (first, second)
    });
    chunk
        .into_iter()
        .zip(first_plans.into_iter().chain(second_plans))
        .collect()
}

/// Whether the machine has a second CPU for [`plan_chunk`].
fn parallel_planning() -> bool {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get)) > 1
}

#[cfg(test)]
mod tests;
