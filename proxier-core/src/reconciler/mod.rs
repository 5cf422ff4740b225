//! Keeps the kernel converged on the plan: a full sync that re-reads the kernel and
//! repairs drift, an incremental sync per dirty service port over a cached view of
//! the kernel, graceful draining of removed real servers, and per-service retries
//! with exponential backoff.
//!
//! # What it owns: the one ownership rule
//! It creates, changes and deletes only: virtual servers it plans; unplanned virtual
//! servers whose address is bound on its dummy link; unplanned NodePort virtual servers
//! on node addresses ([`ReconcilerConfig::node_port_addresses`] plus every address it
//! planned a NodePort on) within [`ReconcilerConfig::node_port_range`]; virtual servers
//! it planned earlier in this process, until it has seen them deleted. Nothing in
//! [`ReconcilerConfig::exclude_cidrs`] is ever touched, and no address in them is unbound.
//! Virtual servers on other addresses (keepalived, another proxier) and firewall-mark
//! services are left alone. Full syncs, incremental syncs and [`Reconciler::remove_owned`]
//! (`--cleanup`) all decide by this one rule ([`crate::diff::Scope::owns`]).
//!
//! # Driving it
//! Run [`Reconciler::full_sync`] at start and periodically, [`Reconciler::sync_services`]
//! with the service ports whose plan changed, and [`Reconciler::tick`] when
//! [`Reconciler::next_deadline`] says (drain checks, retries).
//!
//! ```
//! use std::collections::BTreeSet;
//! use proxier_core::backend::{MemoryAddressBackend, MemoryIpvsBackend};
//! use proxier_core::{Desired, Reconciler, ReconcilerConfig};
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! runtime.block_on(async {
//!     let ipvs = MemoryIpvsBackend::new();
//!     let mut reconciler =
//!         Reconciler::new(ipvs.clone(), MemoryAddressBackend::new(), ReconcilerConfig::default());
//!     let desired = Desired::default(); // from proxier_core::plan(...)
//!     let report = reconciler.full_sync(&desired).await.unwrap();
//!     assert_eq!(report.writes, 0);
//!     reconciler.sync_services(&desired, &BTreeSet::new()).await.unwrap();
//!     if reconciler.next_deadline().is_some() {
//!         reconciler.tick(&desired).await.unwrap();
//!     }
//!     println!("drift repaired: {:?}", reconciler.stats().last_full_sync_drift);
//! });
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use ipnet::IpNet;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{
    AddressBackend, BackendError, IpvsBackend, IpvsOp, LinkRead, OpKind, TableRead, TableReads,
};
use crate::desired::{
    Desired, Protocol, ServicePortName, ServicePortPlan, SortedMap, VirtualServer,
    VirtualServerKey, VirtualServerRole,
};
use crate::diff::{self, Changes, DrainPolicy, OwnedOp, Rejection, Scope};
use crate::drain::{DEFAULT_DRAIN_TIMEOUT, DrainQueue};
use crate::observed::{Forwarding, Observed, ObservedRealServer, ObservedVirtualServer};

mod repair;
mod sorted_set;

use repair::Repair;
use sorted_set::SortedVecSet;

/// Settings of a [`Reconciler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcilerConfig {
    /// Addresses never touched (`--ipvs-exclude-cidrs`).
    pub exclude_cidrs: Vec<IpNet>,
    /// Node addresses on which unplanned NodePort virtual servers are the proxier's to
    /// delete (addresses of planned NodePorts are added automatically).
    pub node_port_addresses: BTreeSet<IpAddr>,
    /// Port range of NodePorts; unplanned virtual servers on node addresses outside it
    /// are left alone. `None` owns every port on those addresses.
    pub node_port_range: Option<RangeInclusive<u16>>,
    /// How long a removed TCP real server may keep its connections before it is deleted
    /// ([`DEFAULT_DRAIN_TIMEOUT`]: as long as they last).
    pub drain_timeout: Duration,
    /// How often [`Reconciler::tick`] should run while real servers are draining.
    pub drain_check_interval: Duration,
    /// First retry delay of a failed service port.
    pub initial_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// Test hook, `None` in production: after this many IPVS writes the reconciler stops
    /// forever inside its batch (the part before the limit applied), so a test can kill the
    /// process with part of the table programmed.
    pub pause_after_ops: Option<u64>,
    /// Service CIDRs taken whole with a `local` route each through the dummy link
    /// ([`crate::model::Config::service_cidr_routes`]); other routes through the link (but
    /// the kernel's own for its addresses) are removed at full syncs.
    pub service_cidr_routes: Vec<IpNet>,
    /// Virtual servers a full sync's repair compares with the plan per slice when it runs
    /// in slices ([`Reconciler::repair_slice`], the driver's full resyncs): the longest a
    /// change waits behind a full resync.
    pub repair_slice: usize,
}

/// [`ReconcilerConfig::repair_slice`]'s default.
pub const DEFAULT_REPAIR_SLICE: usize = 256;

impl Default for ReconcilerConfig {
    fn default() -> Self {
        ReconcilerConfig {
            exclude_cidrs: Vec::new(),
            node_port_addresses: BTreeSet::new(),
            node_port_range: Some(30000..=32767),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            drain_check_interval: Duration::from_secs(5),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            pause_after_ops: None,
            service_cidr_routes: Vec::new(),
            repair_slice: DEFAULT_REPAIR_SLICE,
        }
    }
}

/// Why the reconciler could not apply part of a service port's plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceSyncError {
    /// An IPVS write failed.
    #[error("{op}: {source}")]
    Op {
        /// The write.
        op: IpvsOp,
        /// The kernel's answer.
        source: BackendError,
    },
    /// Binding the virtual address on the dummy link failed.
    #[error("binding {address} on {link}: {source}")]
    Bind {
        /// The address.
        address: IpAddr,
        /// The link.
        link: String,
        /// The kernel's answer.
        source: BackendError,
    },
    /// Removing an address from the dummy link failed.
    #[error("removing {address} from {link}: {source}")]
    Unbind {
        /// The address.
        address: IpAddr,
        /// The link.
        link: String,
        /// The kernel's answer.
        source: BackendError,
    },
    /// Adding or removing a Service CIDR's `local` route through the dummy link failed.
    #[error("{} local route {net} through {link}: {source}", if *.adding { "adding" } else { "removing" })]
    Route {
        /// The route's network.
        net: IpNet,
        /// Whether it was being added (else removed).
        adding: bool,
        /// The link.
        link: String,
        /// The kernel's answer.
        source: BackendError,
    },
    /// A configured Service CIDR holds one of the node's own addresses: routing it through
    /// the dummy link would make the node take its neighbours for itself, so it is not.
    #[error("not routing {net} through {link}: it holds the node's address {address}")]
    RouteOverNodeAddress {
        /// The configured network.
        net: IpNet,
        /// The node address in it.
        address: IpAddr,
        /// The link.
        link: String,
    },
    /// Reading a virtual server back from the kernel failed.
    #[error("reading virtual server {key}: {source}")]
    Read {
        /// The virtual server.
        key: VirtualServerKey,
        /// The kernel's answer.
        source: BackendError,
    },
    /// The plan is not applied (conflict, excluded address).
    #[error(transparent)]
    Rejected(#[from] Rejection),
}

/// A failure of a whole sync: the kernel could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReconcileError {
    /// Creating or bringing up the dummy link failed.
    #[error("ensuring dummy link {link}: {source}")]
    Link {
        /// The link.
        link: String,
        /// The kernel's answer.
        source: BackendError,
    },
    /// Listing the addresses of the dummy link failed.
    #[error("listing addresses of {link}: {source}")]
    ListAddresses {
        /// The link.
        link: String,
        /// The kernel's answer.
        source: BackendError,
    },
    /// Listing the `local` routes through the dummy link failed.
    #[error("listing local routes through {link}: {source}")]
    ListRoutes {
        /// The link.
        link: String,
        /// The kernel's answer.
        source: BackendError,
    },
    /// Listing IPVS virtual servers failed.
    #[error("listing IPVS virtual servers: {source}")]
    ListVirtualServers {
        /// The kernel's answer.
        source: BackendError,
    },
}

/// Successes and failures of one kind of write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Writes the kernel accepted.
    pub succeeded: u64,
    /// Writes the kernel refused.
    pub failed: u64,
}

/// Counters the daemon exports as metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcilerStats {
    /// Writes by kind and result, since start.
    pub ops: BTreeMap<OpKind, OpCounts>,
    /// Full syncs run.
    pub full_syncs: u64,
    /// Incremental syncs and ticks run.
    pub incremental_syncs: u64,
    /// Real servers draining now.
    pub drain_queue_len: usize,
    /// Objects (virtual servers, real servers, addresses) the last full sync found
    /// changed behind the proxier's back; `None` before the second full sync.
    pub last_full_sync_drift: Option<usize>,
    /// Service ports waiting for a retry.
    pub retries_pending: usize,
    /// The current error of each service port that has one.
    pub last_errors: BTreeMap<ServicePortName, ServiceSyncError>,
    /// The last error cleaning up something no service port owns (stale virtual
    /// servers, unused addresses), if the last attempt failed.
    pub cleanup_error: Option<ServiceSyncError>,
    /// Writes the kernel refused because the cached picture was wrong (an add of something
    /// that exists, e.g. after a dump skipped it), each followed by a re-read and a fresh
    /// diff of that virtual server.
    pub contradictions: u64,
    /// How the IPVS backend's whole-table reads went (dumps, retries forced by churn in
    /// other network namespaces, reads that never verified).
    pub table_reads: TableReads,
}

/// What one sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Writes attempted (IPVS ops, address binds and unbinds).
    pub writes: usize,
    /// Of those, deletions (virtual servers, real servers, addresses).
    pub deletes: usize,
    /// Of those, failed ones.
    pub failed: usize,
    /// Kernel objects found changed behind the proxier's back (full sync only).
    pub drift: Option<usize>,
    /// Errors of this sync, by service port (`None`: cleanup).
    pub errors: Vec<(Option<ServicePortName>, ServiceSyncError)>,
    /// How long each step took.
    pub timings: ReconcileTimings,
}

impl std::ops::AddAssign for ReconcileReport {
    /// Adds the counts, errors and timings of a later step of the same sync (the drift
    /// stays the first one's, if it has one).
    fn add_assign(&mut self, more: ReconcileReport) {
        self.writes += more.writes;
        self.deletes += more.deletes;
        self.failed += more.failed;
        self.drift = self.drift.or(more.drift);
        self.errors.extend(more.errors);
        self.timings.read += more.timings.read;
        self.timings.diff += more.timings.diff;
        self.timings.addresses += more.timings.addresses;
        self.timings.ipvs += more.timings.ipvs;
    }
}

/// How long each step of a reconciler sync took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconcileTimings {
    /// Reading the kernel: the link, its addresses and the IPVS table on a full sync; the
    /// virtual servers the cache cannot answer on an incremental one.
    pub read: Duration,
    /// Comparing the plan with the kernel's picture into ordered writes.
    pub diff: Duration,
    /// Binding and unbinding addresses on the dummy link.
    pub addresses: Duration,
    /// IPVS writes (with the re-reads of virtual servers the kernel contradicted).
    pub ipvs: Duration,
}

impl std::fmt::Display for ReconcileTimings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernel read {:?}, diff {:?}, address writes {:?}, ipvs writes {:?}",
            self.read, self.diff, self.addresses, self.ipvs
        )
    }
}

/// Full-sync listings in a row that must miss a retired virtual server before it is
/// forgotten.
const RETIRED_LISTINGS: u8 = 3;

/// What [`Reconciler::remove_owned`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Virtual servers deleted.
    pub virtual_servers: usize,
    /// Whether the dummy link existed and was deleted.
    pub link_deleted: bool,
    /// What could not be listed or removed.
    pub errors: Vec<String>,
}

/// A failed write or read: the service port it was for, the virtual server, the error.
type Failed = (Option<ServicePortName>, VirtualServerKey, ServiceSyncError);

/// One result per address bound, then one per address unbound.
type AddressResults = (Vec<Result<(), BackendError>>, Vec<Result<(), BackendError>>);

#[derive(Debug, Clone)]
struct Failure {
    attempts: u32,
    retry_at: Instant,
    keys: BTreeSet<VirtualServerKey>,
    error: ServiceSyncError,
}

/// Converges the kernel on a [`Desired`] plan through an [`IpvsBackend`] and an
/// [`AddressBackend`], owning the drain queue and the retry state.
#[derive(Debug)]
pub struct Reconciler<I, A> {
    ipvs: I,
    addresses: A,
    config: ReconcilerConfig,
    /// The kernel as last read, updated with every accepted write.
    kernel: Observed,
    synced: bool,
    /// Virtual servers each service port plans (winning or not).
    claims: HashMap<ServicePortName, Vec<VirtualServerKey>>,
    /// Service ports planning each virtual server; the first one wins.
    claimants: HashMap<VirtualServerKey, SortedVecSet<ServicePortName>>,
    /// Planned (winning) virtual servers that need their address bound, by address.
    binders: HashMap<IpAddr, SortedVecSet<VirtualServerKey>>,
    /// Node addresses whose NodePort virtual servers are the proxier's.
    node_port_addresses: BTreeSet<IpAddr>,
    /// Networks routed to the dummy link (as last read, and the configured ones): virtual
    /// servers in them are the proxier's, like those on the link's addresses.
    routed: Vec<IpNet>,
    /// Whether [`ReconcilerConfig::service_cidr_routes`] changed since routes were last
    /// synced.
    routes_changed: bool,
    drains: DrainQueue,
    /// When draining real servers were last looked at (a sync or a tick): the next drain
    /// check is due one [`ReconcilerConfig::drain_check_interval`] after it.
    drains_checked_at: Instant,
    failures: BTreeMap<ServicePortName, Failure>,
    rejections: BTreeMap<VirtualServerKey, Vec<Rejection>>,
    /// Virtual servers whose cached state may be wrong (a write on them failed).
    suspect: HashSet<VirtualServerKey>,
    /// Virtual servers planned earlier and planned no more, until they are seen deleted (a
    /// dump that skipped one must not make it foreign), with the full-sync listings in a
    /// row that did not show them.
    retired: HashMap<VirtualServerKey, u8>,
    /// IPVS writes sent so far (for [`ReconcilerConfig::pause_after_ops`]).
    ops_sent: u64,
    /// While a full sync's table read is in flight: the virtual servers incremental syncs
    /// looked at or wrote since it started, whose cached state is newer than the read.
    touched_since_read: Option<HashSet<VirtualServerKey>>,
    /// The same for addresses on the dummy link.
    addresses_touched_since_read: Option<HashSet<IpAddr>>,
    /// The same for Service CIDR routes through the dummy link.
    routes_touched_since_read: Option<BTreeSet<IpNet>>,
    /// A full sync's repair still to finish, one slice at a time
    /// ([`Reconciler::repair_slice`]).
    repair: Option<Repair>,
    /// Notified once the next batch of IPVS writes is answered
    /// ([`Reconciler::signal_ipvs_written`]).
    ipvs_written: Option<Arc<Notify>>,
    /// Addresses being bound ahead of the first sync ([`Reconciler::bind_ahead`]).
    binding_ahead: Option<BindingAhead>,
    stats: ReconcilerStats,
}

/// Addresses being bound ahead of the first sync, on a task of their own.
#[derive(Debug)]
struct BindingAhead {
    /// Sorted; the task's results are in the same order.
    addresses: Vec<IpAddr>,
    task: tokio::task::JoinHandle<Vec<Result<(), BackendError>>>,
}

impl BindingAhead {
    /// The results, one per address (every one failed when the task did not end).
    async fn results(self) -> (Vec<IpAddr>, Vec<Result<(), BackendError>>) {
        let results = match self.task.await {
            Ok(results) => results,
            Err(error) => vec![
                Err(BackendError::Other(format!(
                    "the binding ahead ended: {error}"
                )));
                self.addresses.len()
            ],
        };
        (self.addresses, results)
    }
}

/// A full sync's reads ([`Reconciler::begin_full_sync`]): the IPVS table and, when the
/// address backend reads them beside it, the links.
#[derive(Debug)]
pub struct FullRead {
    /// The IPVS table.
    pub table: Result<TableRead, BackendError>,
    /// The links ([`AddressBackend::read_link`]); `None`: read at the finish.
    pub link: Option<Result<LinkRead, BackendError>>,
}

/// The reads of a full sync in flight, borrowing nothing of the reconciler.
pub type PendingFullRead = Pin<Box<dyn Future<Output = FullRead> + Send + 'static>>;

impl<I: IpvsBackend, A: AddressBackend> Reconciler<I, A> {
    /// A reconciler over the given backends. It reads the kernel on its first sync.
    pub fn new(ipvs: I, addresses: A, config: ReconcilerConfig) -> Self {
        let node_port_addresses = config.node_port_addresses.clone();
        let routed = config.service_cidr_routes.clone();
        Reconciler {
            ipvs,
            addresses,
            config,
            kernel: Observed::default(),
            synced: false,
            claims: HashMap::new(),
            claimants: HashMap::new(),
            binders: HashMap::new(),
            node_port_addresses,
            routed,
            routes_changed: false,
            drains: DrainQueue::new(),
            drains_checked_at: Instant::now(),
            failures: BTreeMap::new(),
            rejections: BTreeMap::new(),
            suspect: HashSet::new(),
            retired: HashMap::new(),
            ops_sent: 0,
            touched_since_read: None,
            addresses_touched_since_read: None,
            routes_touched_since_read: None,
            repair: None,
            ipvs_written: None,
            binding_ahead: None,
            stats: ReconcilerStats::default(),
        }
    }

    /// Has `signal` notified as soon as the next batch of IPVS writes is answered, while
    /// the addresses bound beside it may still be on their way (`None`: no signal). A
    /// caller with other kernel work for the same sync (the engine's nftables rewrite) can
    /// start it then rather than beside both. A sync that writes no IPVS never notifies:
    /// the caller also notifies when the sync returns.
    pub(crate) fn signal_ipvs_written(&mut self, signal: Option<Arc<Notify>>) {
        self.ipvs_written = signal;
    }

    /// Binds `addresses` on the dummy link ahead of the first sync, on a task of its own
    /// ([`AddressBackend::bind_detached`]), so that a start binds its ClusterIPs, its
    /// longest write, while the rest of its picture is still coming. Only onto a link that
    /// holds no address yet ([`Reconciler::can_bind_ahead`]; created here when missing): a
    /// restart or a takeover finds its addresses bound and leaves them to the first sync's
    /// comparison. The first sync takes these addresses as bound, writes its IPVS rules
    /// meanwhile, then counts the answers as its own writes: one that failed is a failed
    /// bind of that sync, retried as any other, and one the sync no longer plans is unbound
    /// by it. Returns how many are on their way; 0 after the first sync, when a binding is
    /// already ahead, or when the link cannot be read (the first sync binds them then).
    /// Needs a Tokio runtime.
    pub async fn bind_ahead(&mut self, mut addresses: Vec<IpAddr>) -> usize {
        if addresses.is_empty() || !self.can_bind_ahead().await {
            return 0;
        }
        let link = self.addresses.link_name().to_owned();
        if let Err(error) = self.addresses.ensure_link().await {
            tracing::warn!(%link, %error, "not binding ahead: the link cannot be created");
            return 0;
        }
        addresses.sort_unstable();
        addresses.dedup();
        let Some(binding) = self.addresses.bind_detached(addresses.clone()) else {
            return 0;
        };
        let count = addresses.len();
        self.binding_ahead = Some(BindingAhead {
            addresses,
            task: tokio::spawn(binding),
        });
        count
    }

    /// Whether [`Reconciler::bind_ahead`] would bind now: no sync has run, nothing is
    /// being bound ahead already, and the link holds no address
    /// ([`AddressBackend::holds_addresses`]; an absent link holds none): a fresh start, not
    /// a restart or a takeover, whose link is full. Cheap, so that a caller asks before it
    /// decides the addresses.
    pub async fn can_bind_ahead(&mut self) -> bool {
        if self.synced || self.binding_ahead.is_some() {
            return false;
        }
        match self.addresses.holds_addresses().await {
            Ok(holds) => !holds,
            Err(error) => {
                let link = self.addresses.link_name();
                tracing::warn!(%link, %error, "not binding ahead: the link cannot be listed");
                false
            }
        }
    }

    /// The IPVS backend.
    pub(crate) fn ipvs(&self) -> &I {
        &self.ipvs
    }

    /// Counters for metrics.
    pub fn stats(&self) -> &ReconcilerStats {
        &self.stats
    }

    /// The settings.
    pub fn config(&self) -> &ReconcilerConfig {
        &self.config
    }

    /// The kernel as the reconciler believes it is (last read plus accepted writes).
    pub fn cached_kernel(&self) -> &Observed {
        &self.kernel
    }

    /// The graceful-termination queue.
    pub fn drain_queue(&self) -> &DrainQueue {
        &self.drains
    }

    /// The node's own addresses as the address backend reads them (see
    /// [`AddressBackend::node_addresses`]).
    pub async fn node_addresses(&mut self) -> Result<BTreeSet<IpAddr>, BackendError> {
        self.addresses.node_addresses().await
    }

    /// The IPVS backend.
    pub fn ipvs_backend(&self) -> &I {
        &self.ipvs
    }

    /// The address backend.
    pub fn address_backend(&self) -> &A {
        &self.addresses
    }

    /// When [`Reconciler::tick`] has work next: the earliest retry, or a drain check (one
    /// check interval after drains were last looked at). A fixed instant: callers may keep
    /// it and compare it with the clock.
    pub fn next_deadline(&self) -> Option<Instant> {
        let retry = self.failures.values().map(|failure| failure.retry_at).min();
        let drain = (!self.drains.is_empty())
            .then(|| self.drains_checked_at + self.config.drain_check_interval);
        match (retry, drain) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Re-reads the kernel, adopts what already matches the plan and applies only the
    /// differences: creates the dummy link if missing, binds and unbinds addresses,
    /// deletes owned virtual servers nobody plans, drains removed real servers.
    /// Service ports waiting for a retry are left as they are until it is due.
    ///
    /// The same as [`Reconciler::begin_full_sync`], the read awaited, then
    /// [`Reconciler::finish_full_sync`].
    pub async fn full_sync(
        &mut self,
        desired: &Desired,
    ) -> Result<ReconcileReport, ReconcileError> {
        let read = self.begin_full_sync().await;
        self.finish_full_sync(desired, read).await
    }

    /// Starts a full sync by reading the IPVS table, the slow part (seconds at 10,000
    /// Services), and the links ([`AddressBackend::read_link`]) as a future that borrows
    /// nothing: run it (spawn it) while incremental syncs ([`Reconciler::sync_services`],
    /// [`Reconciler::tick`]) go on, then hand its result to
    /// [`Reconciler::finish_full_sync`]. Virtual servers and addresses those syncs look at
    /// in the meantime are remembered: for them the cache, which holds their writes, is
    /// newer than the read, so they are never mistaken for drift and no write is undone.
    pub fn begin_full_sync(&mut self) -> PendingFullRead {
        // A new read supersedes a repair left unfinished.
        self.repair = None;
        self.touched_since_read = Some(HashSet::new());
        self.addresses_touched_since_read = Some(HashSet::new());
        self.routes_touched_since_read = Some(BTreeSet::new());
        // The first full sync reads best-effort and confirms what the read lacks
        // ([`Reconciler::confirm_best_effort`]); a resync's repair trusts its read whole.
        let table = if self.synced {
            self.ipvs.read_table()
        } else {
            self.ipvs.read_table_best_effort()
        };
        let link = self.addresses.read_link();
        Box::pin(async move {
            let started = std::time::Instant::now();
            let table = async move {
                let mut read = table.await?;
                read.took = read.took.max(started.elapsed());
                Ok(read)
            };
            let link = async move {
                match link {
                    Some(link) => Some(link.await),
                    None => None,
                }
            };
            let (table, link) = futures::join!(table, link);
            FullRead { table, link }
        })
    }

    /// Ends a full sync begun with [`Reconciler::begin_full_sync`], given its read: the
    /// read, with the virtual servers and addresses touched since it started taken from
    /// the cache, is the kernel (the link's addresses and routes are read now when the
    /// backend did not read them beside the table); then drift is repaired as in
    /// [`Reconciler::full_sync`]. A link deleted while the read ran is re-created here and
    /// its addresses re-bound by the next full sync.
    ///
    /// [`Reconciler::start_repair`] and [`Reconciler::repair_slice`] do the same in slices
    /// (after the first full sync), for a caller that keeps syncing changes meanwhile.
    pub async fn finish_full_sync(
        &mut self,
        desired: &Desired,
        read: FullRead,
    ) -> Result<ReconcileReport, ReconcileError> {
        let report = self.start_full_repair(desired, read, false).await?;
        Ok(report.unwrap_or_default())
    }

    /// Applies the plans of the `dirty` service ports only (new, changed or removed),
    /// working on the cached view of the kernel: the cost follows the size of the
    /// change, not of the cluster. Also retries service ports whose backoff is over.
    /// Runs a full sync instead when none ran yet.
    pub async fn sync_services(
        &mut self,
        desired: &Desired,
        dirty: &BTreeSet<ServicePortName>,
    ) -> Result<ReconcileReport, ReconcileError> {
        if !self.synced {
            return self.full_sync(desired).await;
        }
        let now = Instant::now();
        let mut keys: BTreeMap<VirtualServerKey, Option<ServicePortName>> = BTreeMap::new();
        let mut attempted = BTreeSet::new();
        for service in dirty {
            let old = self.claims.remove(service).unwrap_or_default();
            for key in &old {
                if let Some(set) = self.claimants.get_mut(key) {
                    set.remove(service);
                    if set.is_empty() {
                        self.claimants.remove(key);
                        self.retired.entry(*key).or_insert(0);
                    }
                }
                keys.entry(*key).or_insert_with(|| Some(service.clone()));
            }
            match desired.services.get(service) {
                Some(plan) => {
                    let new: Vec<VirtualServerKey> = plan.virtual_servers.keys().copied().collect();
                    for (key, vs) in &plan.virtual_servers {
                        self.claimants
                            .entry(*key)
                            .or_default()
                            .insert(service.clone());
                        keys.entry(*key).or_insert_with(|| Some(service.clone()));
                        if vs.role == VirtualServerRole::NodePort {
                            self.node_port_addresses.insert(key.address);
                        }
                    }
                    if !new.is_empty() {
                        self.claims.insert(service.clone(), new);
                    }
                    attempted.insert(service.clone());
                }
                None => {
                    self.failures.remove(service);
                }
            }
        }
        self.add_due_retries(now, &mut keys, &mut attempted);
        // New Service CIDR routes before the addresses under them are unbound, old ones
        // after the addresses under them are bound.
        let mut report = self.sync_changed_routes(true).await;
        report += self.sync_keys(desired, keys, &attempted, now).await;
        report += self.sync_changed_routes(false).await;
        self.stats.incremental_syncs += 1;
        self.refresh_stats();
        Ok(report)
    }

    /// Periodic work between syncs: deletes draining real servers whose connections
    /// ended or whose bound passed (reading only the virtual servers that drain), and
    /// retries service ports whose backoff is over.
    pub async fn tick(&mut self, desired: &Desired) -> Result<ReconcileReport, ReconcileError> {
        if !self.synced {
            return self.full_sync(desired).await;
        }
        let now = Instant::now();
        self.drains_checked_at = now;
        let mut keys: BTreeMap<VirtualServerKey, Option<ServicePortName>> = self
            .drains
            .virtual_servers()
            .map(|key| (*key, None))
            .collect();
        let mut attempted = BTreeSet::new();
        self.add_due_retries(now, &mut keys, &mut attempted);
        let report = self.sync_keys(desired, keys, &attempted, now).await;
        self.stats.incremental_syncs += 1;
        self.refresh_stats();
        Ok(report)
    }

    /// Removes everything the proxier owns, by the same ownership rule every sync uses
    /// ([`Scope::owns`]): virtual servers on the dummy link's addresses or in the networks
    /// routed to it (listed or configured, never one over a node address), NodePort virtual
    /// servers on the node's own addresses within [`ReconcilerConfig::node_port_range`],
    /// virtual servers planned in this process; then the dummy link itself. Nothing in
    /// [`ReconcilerConfig::exclude_cidrs`] and nothing else is touched (`--cleanup`).
    pub async fn remove_owned(&mut self) -> CleanupReport {
        let mut report = CleanupReport::default();
        let link = self.addresses.link_name().to_owned();
        let link_addresses = match self.addresses.list_addresses().await {
            Ok(addresses) => addresses,
            Err(source) => {
                report
                    .errors
                    .push(ReconcileError::ListAddresses { link, source }.to_string());
                return report;
            }
        };
        let node = match self.addresses.node_addresses().await {
            Ok(addresses) => addresses,
            Err(error) => {
                report
                    .errors
                    .push(format!("listing the node's addresses: {error}"));
                BTreeSet::new()
            }
        };
        self.node_port_addresses.extend(node.iter().copied());
        match self.addresses.list_local_routes().await {
            Ok(routes) => {
                let configured = self.config.service_cidr_routes.iter().copied();
                let (routed, _) = routable(routes.into_iter().chain(configured), &node);
                self.routed = routed.into_iter().collect();
            }
            Err(source) => report.errors.push(
                ReconcileError::ListRoutes {
                    link: self.addresses.link_name().to_owned(),
                    source,
                }
                .to_string(),
            ),
        }
        let listed = self.ipvs.list_virtual_servers().await;
        self.stats.table_reads = self.ipvs.table_reads();
        match listed {
            Ok(table) => {
                let planned: std::collections::HashSet<VirtualServerKey> = self
                    .claimants
                    .keys()
                    .chain(self.retired.keys())
                    .copied()
                    .collect();
                let scope = self.scope(&link_addresses, &planned);
                let ops: Vec<IpvsOp> = table
                    .keys()
                    .filter(|key| scope.owns(key))
                    .map(|key| IpvsOp::DeleteVirtualServer(*key))
                    .collect();
                let results = self.ipvs.apply(&ops).await;
                for (op, result) in ops.iter().zip(results) {
                    match result {
                        Ok(()) | Err(BackendError::NotFound) => report.virtual_servers += 1,
                        Err(error) => report.errors.push(format!("{op}: {error}")),
                    }
                }
            }
            Err(source) => report
                .errors
                .push(ReconcileError::ListVirtualServers { source }.to_string()),
        }
        match self.addresses.delete_link().await {
            Ok(deleted) => report.link_deleted = deleted,
            Err(error) => report.errors.push(format!("deleting link {link}: {error}")),
        }
        self.kernel = Observed::default();
        self.synced = false;
        self.repair = None;
        self.claims.clear();
        self.claimants.clear();
        self.binders.clear();
        self.retired.clear();
        self.drains = DrainQueue::new();
        report
    }

    fn add_due_retries(
        &self,
        now: Instant,
        keys: &mut BTreeMap<VirtualServerKey, Option<ServicePortName>>,
        attempted: &mut BTreeSet<ServicePortName>,
    ) {
        for (service, failure) in &self.failures {
            if failure.retry_at > now || attempted.contains(service) {
                continue;
            }
            attempted.insert(service.clone());
            let claimed = self.claims.get(service).into_iter().flatten();
            for key in claimed.chain(failure.keys.iter()) {
                keys.entry(*key).or_insert_with(|| Some(service.clone()));
            }
        }
    }

    /// Adds the configured Service CIDR routes missing from `present` (the link's routes as
    /// read, or as last known) and remembers every route through the link for the
    /// ownership rule. Returns the routes wanted: the configured ones but those over a node
    /// address, which are reported. Routes no longer wanted are removed by
    /// [`Reconciler::remove_unwanted_routes`], once the addresses they covered are bound.
    async fn add_routes(
        &mut self,
        link: &str,
        present: &BTreeSet<IpNet>,
        report: &mut ReconcileReport,
    ) -> BTreeSet<IpNet> {
        let configured = &self.config.service_cidr_routes;
        let node = if configured.is_empty() {
            BTreeSet::new()
        } else {
            self.addresses.node_addresses().await.unwrap_or_default()
        };
        // A configured network over a node address is refused, reported, and its route
        // removed (the engine refuses such ranges before they get here; this is the rule
        // on the addresses as read, e.g. for a reconciler used on its own).
        let (wanted, refused) = routable(configured.iter().copied(), &node);
        for (net, address) in refused {
            report.failed += 1;
            report.errors.push((
                None,
                ServiceSyncError::RouteOverNodeAddress {
                    net,
                    address,
                    link: link.to_owned(),
                },
            ));
        }
        for net in wanted.difference(present) {
            if let Some(touched) = &mut self.routes_touched_since_read {
                touched.insert(*net);
            }
            report.writes += 1;
            match self.addresses.add_local_route(*net).await {
                Ok(()) | Err(BackendError::Exists) => {}
                Err(source) => {
                    report.failed += 1;
                    report.errors.push((
                        None,
                        ServiceSyncError::Route {
                            net: *net,
                            adding: true,
                            link: link.to_owned(),
                            source,
                        },
                    ));
                }
            }
        }
        self.routed = present.union(&wanted).copied().collect();
        wanted
    }

    /// Adds the IPv4 Service CIDR routes through the link again after its last IPv4 address
    /// went: the kernel then disables IPv4 on the link and drops every route through it, the
    /// proxier's `local` routes included (traffic to the ranges would no longer be taken in
    /// until the next full resync).
    async fn restore_ipv4_routes(&mut self, link: &str, report: &mut ReconcileReport) {
        let routes: Vec<IpNet> = self
            .routed
            .iter()
            .filter(|net| matches!(net, IpNet::V4(_)))
            .copied()
            .collect();
        for net in routes {
            if let Some(touched) = &mut self.routes_touched_since_read {
                touched.insert(net);
            }
            // Still there (a kernel that kept it, or another IPv4 address): no write.
            match self.addresses.add_local_route(net).await {
                Ok(()) => report.writes += 1,
                Err(BackendError::Exists) => {}
                Err(source) => {
                    report.writes += 1;
                    report.failed += 1;
                    report.errors.push((
                        None,
                        ServiceSyncError::Route {
                            net,
                            adding: true,
                            link: link.to_owned(),
                            source,
                        },
                    ));
                }
            }
        }
    }

    /// Removes the routes through the link that are not `wanted` (see
    /// [`Reconciler::add_routes`]); one that cannot be removed stays in the ownership rule.
    async fn remove_unwanted_routes(
        &mut self,
        link: &str,
        wanted: &BTreeSet<IpNet>,
        report: &mut ReconcileReport,
    ) {
        let unwanted: Vec<IpNet> = self
            .routed
            .iter()
            .filter(|net| !wanted.contains(*net))
            .copied()
            .collect();
        for net in unwanted {
            if let Some(touched) = &mut self.routes_touched_since_read {
                touched.insert(net);
            }
            report.writes += 1;
            report.deletes += 1;
            match self.addresses.remove_local_route(net).await {
                Ok(()) | Err(BackendError::NotFound) => self.routed.retain(|n| *n != net),
                Err(source) => {
                    report.failed += 1;
                    report.errors.push((
                        None,
                        ServiceSyncError::Route {
                            net,
                            adding: false,
                            link: link.to_owned(),
                            source,
                        },
                    ));
                }
            }
        }
    }

    /// Follows a change of [`ReconcilerConfig::service_cidr_routes`] between full syncs:
    /// call with `adding` before the changed service ports are synced (new routes go in
    /// before the addresses under them are unbound), then without it after (old routes go
    /// once the addresses under them are bound). Does nothing unless the routes changed
    /// since the last full sync or incremental route sync.
    async fn sync_changed_routes(&mut self, adding: bool) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        if !self.synced || !self.routes_changed {
            return report;
        }
        let link = self.addresses.link_name().to_owned();
        let present: BTreeSet<IpNet> = self.routed.iter().copied().collect();
        let wanted = self.add_routes(&link, &present, &mut report).await;
        if !adding {
            self.remove_unwanted_routes(&link, &wanted, &mut report)
                .await;
            self.routes_changed = false;
        }
        report
    }

    /// Routes these Service CIDRs through the dummy link from now on (the ones of
    /// [`ReconcilerConfig::service_cidr_routes`] until now): a full sync, or
    /// [`Reconciler::sync_services`] / [`Reconciler::sync_routes`], follows.
    pub fn set_service_cidr_routes(&mut self, routes: Vec<IpNet>) {
        if self.config.service_cidr_routes != routes {
            self.config.service_cidr_routes = routes;
            self.routes_changed = true;
        }
    }

    /// Applies a change of [`Reconciler::set_service_cidr_routes`] that no service port
    /// change carries: adds the new routes and removes the old ones. (With changed service
    /// ports, [`Reconciler::sync_services`] does it around their writes.)
    pub async fn sync_routes(&mut self) -> ReconcileReport {
        let mut report = self.sync_changed_routes(true).await;
        report += self.sync_changed_routes(false).await;
        report
    }

    /// The ownership rule's view of this reconciler (its sets of previously planned
    /// virtual servers are std's: the type [`Scope`] takes).
    fn scope<'s>(
        &'s self,
        link_addresses: &'s BTreeSet<IpAddr>,
        previously_planned: &'s std::collections::HashSet<VirtualServerKey>,
    ) -> Scope<'s> {
        Scope {
            exclude_cidrs: &self.config.exclude_cidrs,
            link_routes: &self.routed,
            link_addresses,
            node_port_addresses: &self.node_port_addresses,
            node_port_range: self.config.node_port_range.as_ref(),
            previously_planned,
        }
    }

    fn drain_policy(&self, now: Instant) -> DrainPolicy {
        DrainPolicy {
            now,
            timeout: self.config.drain_timeout,
        }
    }

    fn is_excluded(&self, address: IpAddr) -> bool {
        self.config
            .exclude_cidrs
            .iter()
            .any(|net| net.contains(&address))
    }

    fn winner(&self, key: &VirtualServerKey) -> Option<&ServicePortName> {
        self.claimants.get(key).and_then(|set| set.first())
    }

    /// The planned virtual server at `key`, from the service port that wins it.
    fn planned<'d>(
        &self,
        desired: &'d Desired,
        key: &VirtualServerKey,
    ) -> Option<&'d VirtualServer> {
        self.planned_with_plan(desired, key).map(|(_, vs)| vs)
    }

    fn planned_with_plan<'d>(
        &self,
        desired: &'d Desired,
        key: &VirtualServerKey,
    ) -> Option<(&'d ServicePortPlan, &'d VirtualServer)> {
        let winner = self.winner(key)?;
        let plan = desired.services.get(winner)?;
        Some((plan, plan.virtual_servers.get(key)?))
    }

    async fn sync_keys(
        &mut self,
        desired: &Desired,
        keys: BTreeMap<VirtualServerKey, Option<ServicePortName>>,
        attempted: &BTreeSet<ServicePortName>,
        now: Instant,
    ) -> ReconcileReport {
        if let Some(touched) = &mut self.touched_since_read {
            touched.extend(keys.keys().copied());
        }
        let read_started = std::time::Instant::now();
        let mut read_errors: Vec<Failed> = Vec::new();
        let mut unreadable = HashSet::new();
        // Re-read what the cache cannot answer: virtual servers whose last write failed,
        // and those losing real servers (deciding drain or delete needs fresh counts).
        let mut reread = Vec::new();
        let mut quiesce = Vec::new();
        for key in keys.keys() {
            let planned = self.planned(desired, key);
            let cached = self.kernel.virtual_servers.get(key);
            // A TCP real server that may drain stops taking new connections before its
            // count is read: a connection scheduled to it between the read and a delete
            // would lose its destination.
            let drains = key.protocol == Protocol::Tcp && !self.config.drain_timeout.is_zero();
            let mut loses_real_servers = false;
            if let (Some(want), Some(have)) = (planned, cached) {
                for (rs, real) in &have.real_servers {
                    if want.real_servers.contains_key(rs) {
                        continue;
                    }
                    loses_real_servers = true;
                    if drains && real.weight != 0 {
                        quiesce.push(IpvsOp::UpdateRealServer(*key, *rs, 0));
                    }
                }
            }
            if loses_real_servers
                || self.suspect.contains(key)
                || self.drains.has_virtual_server(key)
            {
                reread.push(*key);
            }
        }
        let mut quiesced = 0;
        if !quiesce.is_empty() {
            // A failure leaves the real server as it was: the re-read shows it, and the
            // diff deletes or drains it as before.
            let results = self.ipvs.apply(&quiesce).await;
            for (op, result) in quiesce.iter().zip(results) {
                self.count(op.kind(), result.is_ok());
                if result.is_ok() {
                    quiesced += 1;
                    self.record_write(op);
                }
            }
        }
        for key in &reread {
            let fallback = &keys[key];
            match self.ipvs.get_virtual_server(key).await {
                Ok(Some(fresh)) => {
                    self.kernel.virtual_servers.insert(*key, fresh);
                    self.suspect.remove(key);
                }
                Ok(None) => {
                    self.kernel.virtual_servers.remove(key);
                    self.drains.stop_virtual_server(key);
                    self.suspect.remove(key);
                }
                Err(source) => {
                    let owner = self.winner(key).cloned().or_else(|| fallback.clone());
                    read_errors.push((owner, *key, ServiceSyncError::Read { key: *key, source }));
                    unreadable.insert(*key);
                }
            }
        }

        let read = read_started.elapsed();
        let diff_started = std::time::Instant::now();
        let policy = self.drain_policy(now);
        let mut changes = Changes::default();
        let mut addresses = BTreeSet::new();
        for (key, fallback) in &keys {
            self.rejections.remove(key);
            if let Some(set) = self.binders.get_mut(&key.address) {
                set.remove(key);
            }
            addresses.insert(key.address);
            let claimants: Vec<ServicePortName> = self
                .claimants
                .get(key)
                .map(|set| set.iter().cloned().collect())
                .unwrap_or_default();
            if let Some((winner, losers)) = claimants.split_first()
                && !losers.is_empty()
            {
                let rejected = losers
                    .iter()
                    .map(|service| Rejection::Conflict {
                        service: service.clone(),
                        key: *key,
                        winner: winner.clone(),
                    })
                    .collect();
                self.rejections.insert(*key, rejected);
            }
            let planned_with_plan = self.planned_with_plan(desired, key);
            if planned_with_plan.is_some_and(|(plan, vs)| plan.binds(key, vs)) {
                self.binders.entry(key.address).or_default().insert(*key);
            }
            let planned = planned_with_plan.map(|(_, vs)| vs);
            if unreadable.contains(key) {
                continue;
            }
            let owner = claimants.first().cloned().or_else(|| fallback.clone());
            diff::diff_virtual_server(
                key,
                planned,
                self.kernel.virtual_servers.get(key),
                owner.as_ref(),
                &self.drains,
                &policy,
                &mut changes,
            );
        }
        changes.order();
        if let Some(touched) = &mut self.addresses_touched_since_read {
            touched.extend(addresses.iter().copied());
        }
        let mut bind = Vec::new();
        let mut unbind = Vec::new();
        for address in addresses {
            let needed = self
                .binders
                .get(&address)
                .is_some_and(|set| !set.is_empty());
            if !needed {
                self.binders.remove(&address);
            }
            let bound = self.kernel.bound_addresses.contains(&address);
            if needed && !bound {
                bind.push(address);
            } else if !needed && bound && !self.is_excluded(address) {
                unbind.push(address);
            }
        }
        let diff = diff_started.elapsed();
        let mut report = self
            .apply(desired, changes, bind, unbind, attempted, now, read_errors)
            .await;
        report.timings.read = read;
        report.timings.diff = diff;
        report.writes += quiesced;
        report
    }

    fn count(&mut self, kind: OpKind, ok: bool) {
        let counts = self.stats.ops.entry(kind).or_default();
        if ok {
            counts.succeeded += 1;
        } else {
            counts.failed += 1;
        }
    }

    fn backoff(&self, attempts: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempts.saturating_sub(1));
        self.config
            .initial_backoff
            .saturating_mul(factor)
            .min(self.config.max_backoff)
    }

    fn record_failure(
        &mut self,
        service: &ServicePortName,
        key: VirtualServerKey,
        error: ServiceSyncError,
        now: Instant,
    ) {
        if let Some(failure) = self.failures.get_mut(service)
            && failure.retry_at > now
        {
            // Already recorded in this sync: keep the first error, collect the key.
            failure.keys.insert(key);
            return;
        }
        let attempts = self.failures.get(service).map_or(0, |f| f.attempts) + 1;
        let retry_at = now + self.backoff(attempts);
        self.failures.insert(
            service.clone(),
            Failure {
                attempts,
                retry_at,
                keys: BTreeSet::from([key]),
                error,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    async fn apply(
        &mut self,
        desired: &Desired,
        changes: Changes,
        bind: Vec<IpAddr>,
        unbind: Vec<IpAddr>,
        attempted: &BTreeSet<ServicePortName>,
        now: Instant,
        mut failed: Vec<Failed>,
    ) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let link = self.addresses.link_name().to_owned();

        // Addresses are bound and unbound while the IPVS writes go out (two sockets, two
        // kernel subsystems): neither waits for the other. At 10,000 addresses on the link
        // the kernel's work for each address grows with the addresses it holds, and a sync
        // adding one Service and deleting another spent more on the two address writes
        // than on all its IPVS writes.
        let mut contradicted = BTreeMap::new();
        // Addresses bound ahead of the first sync: answered after this sync's writes, or
        // before them when one of them is to be unbound (the unbinding must come last).
        let mut ahead = self.binding_ahead.take();
        let mut answered_ahead = (Vec::new(), Vec::new());
        if let Some(binding) = ahead.take_if(|binding| {
            unbind
                .iter()
                .any(|address| binding.addresses.binary_search(address).is_ok())
        }) {
            let started = std::time::Instant::now();
            answered_ahead = binding.results().await;
            report.timings.addresses += started.elapsed();
        }
        let (bound, unbound) = self
            .apply_ops(
                changes,
                (&bind, &unbind),
                now,
                &mut report,
                &mut failed,
                Some(&mut contradicted),
            )
            .await;
        if let Some(binding) = ahead {
            let started = std::time::Instant::now();
            answered_ahead = binding.results().await;
            report.timings.addresses += started.elapsed();
        }
        let (bound_ahead, answers_ahead) = answered_ahead;
        for (address, result) in bound_ahead
            .into_iter()
            .zip(answers_ahead)
            .chain(bind.into_iter().zip(bound))
        {
            report.writes += 1;
            let result = match result {
                Err(BackendError::Exists) => Ok(()),
                other => other,
            };
            self.count(OpKind::BindAddress, result.is_ok());
            match result {
                Ok(()) => {
                    self.kernel.bound_addresses.insert(address);
                }
                Err(source) => {
                    // Taken as bound while it was being bound ahead.
                    self.kernel.bound_addresses.remove(&address);
                    let error = ServiceSyncError::Bind {
                        address,
                        link: link.clone(),
                        source,
                    };
                    let keys: Vec<VirtualServerKey> = self
                        .binders
                        .get(&address)
                        .map(|set| set.iter().copied().collect())
                        .unwrap_or_default();
                    for key in keys {
                        let owner = self.winner(&key).cloned();
                        failed.push((owner, key, error.clone()));
                    }
                }
            }
        }

        let retry_started = std::time::Instant::now();
        if !contradicted.is_empty() {
            // The kernel contradicted our picture ("exists" on an add, "not found" on an
            // update): a dump skipped it, or someone changed it. Re-read those virtual
            // servers, diff them again and converge; only a second refusal is a failure.
            self.stats.contradictions += contradicted.len() as u64;
            let policy = self.drain_policy(now);
            let mut again = Changes::default();
            for (key, owner) in contradicted {
                tracing::info!(virtual_server = %key, "kernel differs from the cached picture; re-reading it");
                match self.ipvs.get_virtual_server(&key).await {
                    Ok(Some(fresh)) => {
                        self.kernel.virtual_servers.insert(key, fresh);
                    }
                    Ok(None) => {
                        self.kernel.virtual_servers.remove(&key);
                        self.drains.stop_virtual_server(&key);
                    }
                    Err(source) => {
                        failed.push((owner, key, ServiceSyncError::Read { key, source }));
                        continue;
                    }
                }
                self.suspect.remove(&key);
                let planned = self.planned(desired, &key);
                let owner = self.winner(&key).cloned().or(owner);
                diff::diff_virtual_server(
                    &key,
                    planned,
                    self.kernel.virtual_servers.get(&key),
                    owner.as_ref(),
                    &self.drains,
                    &policy,
                    &mut again,
                );
            }
            again.order();
            self.apply_ops(again, (&[], &[]), now, &mut report, &mut failed, None)
                .await;
        }
        report.timings.ipvs += retry_started.elapsed();

        let mut cleanup_failed = false;
        let routes_started = std::time::Instant::now();
        let unbinds_ipv4 = unbind.iter().any(IpAddr::is_ipv4);
        for (address, result) in unbind.into_iter().zip(unbound) {
            report.writes += 1;
            report.deletes += 1;
            let result = match result {
                Err(BackendError::NotFound) => Ok(()),
                other => other,
            };
            self.count(OpKind::UnbindAddress, result.is_ok());
            match result {
                Ok(()) => {
                    self.kernel.bound_addresses.remove(&address);
                }
                Err(source) => {
                    cleanup_failed = true;
                    let error = ServiceSyncError::Unbind {
                        address,
                        link: link.clone(),
                        source,
                    };
                    report.failed += 1;
                    self.stats.cleanup_error = Some(error.clone());
                    report.errors.push((None, error));
                }
            }
        }
        if unbinds_ipv4 && !self.kernel.bound_addresses.iter().any(IpAddr::is_ipv4) {
            self.restore_ipv4_routes(&link, &mut report).await;
        }
        report.timings.addresses += routes_started.elapsed();

        let failed_services: HashSet<ServicePortName> = failed
            .iter()
            .filter_map(|(owner, ..)| owner.clone())
            .collect();
        for service in attempted {
            if !failed_services.contains(service) {
                self.failures.remove(service);
            }
        }
        let mut cleanup_ok = !cleanup_failed;
        for (owner, key, error) in failed {
            report.failed += 1;
            match &owner {
                Some(service) => self.record_failure(service, key, error.clone(), now),
                None => {
                    cleanup_ok = false;
                    self.stats.cleanup_error = Some(error.clone());
                }
            }
            tracing::warn!(
                service = owner.as_ref().map(ToString::to_string).unwrap_or_default(),
                error = %error,
                "IPVS sync failed"
            );
            report.errors.push((owner, error));
        }
        if cleanup_ok && report.writes > 0 {
            self.stats.cleanup_error = None;
        }
        report
    }

    /// Applies IPVS writes as one batch, updating the cache with the accepted ones. With
    /// `contradicted`, a write the kernel refuses because our picture was wrong (an add
    /// that exists, an update of something gone) is collected there instead of failing; a
    /// delete of something already gone counts as done.
    ///
    /// Meanwhile binds `bind` on the dummy link, then unbinds `unbind` (pipelined on the
    /// rtnetlink socket); returns one result per address of each.
    #[allow(clippy::too_many_arguments)]
    async fn apply_ops(
        &mut self,
        changes: Changes,
        (bind, unbind): (&[IpAddr], &[IpAddr]),
        now: Instant,
        report: &mut ReconcileReport,
        failed: &mut Vec<Failed>,
        mut contradicted: Option<&mut BTreeMap<VirtualServerKey, Option<ServicePortName>>>,
    ) -> AddressResults {
        let (owners, ops): (Vec<Option<ServicePortName>>, Vec<IpvsOp>) = changes
            .ops
            .into_iter()
            .map(|OwnedOp { owner, op }| (owner, op))
            .unzip();
        if let Some(limit) = self.config.pause_after_ops
            && self.ops_sent + ops.len() as u64 > limit
        {
            let _ = self.addresses.add_addresses(bind).await;
            let allowed = usize::try_from(limit.saturating_sub(self.ops_sent)).unwrap_or(0);
            let _ = self.ipvs.apply(&ops[..allowed.min(ops.len())]).await;
            tracing::warn!(
                limit,
                "test hook: paused inside an IPVS batch after {limit} writes"
            );
            std::future::pending::<()>().await;
        }
        self.ops_sent += ops.len() as u64;
        let addresses = &mut self.addresses;
        let ipvs = &mut self.ipvs;
        let ipvs_written = self.ipvs_written.take();
        // The IPVS writes are polled first: the kernel backend hands them to a thread of
        // their own at once, while the address writes are sent from this task and the
        // kernel carries each out inside the send (10,000 addresses on the link: milliseconds
        // each). Polled second, they would wait for the addresses. So, as kube-proxy orders
        // them, a new virtual server is in before its address is bound and an old one is
        // gone before its address is unbound.
        let ((results, ipvs_time), (bound, unbound, address_time)) = tokio::join!(
            async {
                let started = std::time::Instant::now();
                let results = if ops.is_empty() {
                    Vec::new()
                } else {
                    ipvs.apply(&ops).await
                };
                if let Some(signal) = ipvs_written {
                    signal.notify_one();
                }
                (results, started.elapsed())
            },
            async {
                let started = std::time::Instant::now();
                let (bound, unbound) = addresses.change_addresses(bind, unbind).await;
                (bound, unbound, started.elapsed())
            }
        );
        report.timings.addresses += address_time;
        report.timings.ipvs += ipvs_time;
        if !ops.is_empty() {
            let mut results = results;
            results.resize(
                ops.len(),
                Err(BackendError::Other(
                    "the backend returned no result for this op".into(),
                )),
            );
            for ((owner, op), result) in owners.into_iter().zip(ops).zip(results) {
                let key = *op.virtual_server();
                let result = match result {
                    Err(BackendError::NotFound) if op.kind().is_delete() => Ok(()),
                    Err(BackendError::Exists | BackendError::NotFound)
                        if contradicted.is_some() =>
                    {
                        if let Some(contradicted) = contradicted.as_deref_mut() {
                            contradicted.entry(key).or_insert(owner);
                        }
                        continue;
                    }
                    other => other,
                };
                report.writes += 1;
                if op.kind().is_delete() {
                    report.deletes += 1;
                }
                self.count(op.kind(), result.is_ok());
                match result {
                    Ok(()) => self.record_write(&op),
                    Err(source) => {
                        self.suspect.insert(key);
                        failed.push((owner, key, ServiceSyncError::Op { op, source }));
                    }
                }
            }
        }
        for (vs, rs) in changes.drain_started {
            self.drains.start(vs, rs, now);
        }
        for (vs, rs) in changes.drain_stopped {
            self.drains.stop(&vs, &rs);
        }
        (bound, unbound)
    }

    /// Updates the cache after the kernel accepted `op`.
    fn record_write(&mut self, op: &IpvsOp) {
        let table = &mut self.kernel.virtual_servers;
        match op {
            IpvsOp::AddVirtualServer(key, settings) => {
                table.insert(
                    *key,
                    ObservedVirtualServer {
                        settings: settings.clone(),
                        real_servers: SortedMap::new(),
                    },
                );
            }
            IpvsOp::UpdateVirtualServer(key, settings) => {
                if let Some(vs) = table.get_mut(key) {
                    vs.settings = settings.clone();
                }
            }
            IpvsOp::DeleteVirtualServer(key) => {
                table.remove(key);
                self.retired.remove(key);
                self.drains.stop_virtual_server(key);
            }
            IpvsOp::AddRealServer(key, rs, weight) => {
                if let Some(vs) = table.get_mut(key) {
                    vs.real_servers
                        .insert(*rs, ObservedRealServer::new(*weight));
                }
            }
            IpvsOp::UpdateRealServer(key, rs, weight) => {
                if let Some(real) = table
                    .get_mut(key)
                    .and_then(|vs| vs.real_servers.get_mut(rs))
                {
                    real.weight = *weight;
                    real.forward = Forwarding::Masquerade;
                }
            }
            IpvsOp::DeleteRealServer(key, rs) => {
                if let Some(vs) = table.get_mut(key) {
                    vs.real_servers.remove(rs);
                }
                self.drains.stop(key, rs);
            }
        }
    }

    fn refresh_stats(&mut self) {
        self.stats.drain_queue_len = self.drains.len();
        self.stats.retries_pending = self.failures.len();
        let mut errors: BTreeMap<ServicePortName, ServiceSyncError> = BTreeMap::new();
        for rejection in self.rejections.values().flatten() {
            errors
                .entry(rejection.service().clone())
                .or_insert_with(|| ServiceSyncError::Rejected(rejection.clone()));
        }
        for (service, failure) in &self.failures {
            errors.insert(service.clone(), failure.error.clone());
        }
        self.stats.last_errors = errors;
    }
}

/// The networks of `nets` that may be routed to the dummy link, and apart, each one that
/// holds a node address (with the address): such a network is never routed, as its gateway
/// and neighbours would become local. The one rule for which routes the proxier keeps and
/// owns what lies in: full syncs and [`Reconciler::remove_owned`] both apply it.
fn routable(
    nets: impl IntoIterator<Item = IpNet>,
    node: &BTreeSet<IpAddr>,
) -> (BTreeSet<IpNet>, Vec<(IpNet, IpAddr)>) {
    let mut routed = BTreeSet::new();
    let mut refused = Vec::new();
    for net in nets.into_iter().collect::<BTreeSet<_>>() {
        match node.iter().find(|address| net.contains(*address)) {
            Some(address) => refused.push((net, *address)),
            None => {
                routed.insert(net);
            }
        }
    }
    (routed, refused)
}

/// Rebuilds from `desired` who plans what, into the maps a [`Reconciler`] keeps (their
/// capacity kept): the virtual servers each service port plans (`claims`), the service ports
/// planning each virtual server, the first of which wins (`claimants`), and the winning
/// virtual servers whose address is bound, by address (`binders`).
fn rebuild_claims(
    desired: &Desired,
    claims: &mut HashMap<ServicePortName, Vec<VirtualServerKey>>,
    claimants: &mut HashMap<VirtualServerKey, SortedVecSet<ServicePortName>>,
    binders: &mut HashMap<IpAddr, SortedVecSet<VirtualServerKey>>,
) {
    claims.clear();
    claimants.clear();
    binders.clear();
    for (service, plan) in &desired.services {
        let keys: Vec<VirtualServerKey> = plan.virtual_servers.keys().copied().collect();
        for (key, vs) in &plan.virtual_servers {
            let set = claimants.entry(*key).or_default();
            let wins = set.is_empty();
            set.insert(service.clone());
            if wins && plan.binds(key, vs) {
                binders.entry(key.address).or_default().insert(*key);
            }
        }
        if !keys.is_empty() {
            claims.insert(service.clone(), keys);
        }
    }
}

#[cfg(test)]
mod tests;
