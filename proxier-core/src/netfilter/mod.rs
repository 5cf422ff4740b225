//! The netfilter companion of IPVS: masquerade, hairpin, NodePort, load-balancer source
//! ranges and VIP filtering, in one nftables table per address family.
//!
//! IPVS alone cannot implement Services: kube-proxy's IPVS mode adds iptables rules and
//! ipsets around it. This module does the same with nftables, as three steps:
//!
//! - [`plan::plan`] (pure): cluster state + node + configuration → [`NetfilterPlan`], the
//!   elements of every set, per family;
//! - [`render::render_replace`] (pure): plan → an `nft -f` script replacing the tables in
//!   one transaction;
//! - [`apply::NetfilterBackend`] (I/O): hands the script to the kernel ([`NftBackend`] runs
//!   the `nft` binary; [`MemoryNetfilterBackend`] records scripts).
//!
//! [`Netfilter`] ties them together and skips no-op syncs. An incremental update may run
//! detached ([`Netfilter::start_changes`]) while the caller goes on writing IPVS; the next
//! update waits for it ([`Netfilter::settle`]). An incremental update of single-value sets
//! (a Service or endpoint change) does not start `nft` at all: [`NftBackend`] sends it as
//! one nf_tables batch of set elements over nfnetlink ([`ElementBatch`]), the same
//! transaction without a process; the rest (the first write, a repair, a change of an
//! interval set or of the rules) goes by script. At start it adopts tables that
//! already hold its plan (a restart with nothing changed) instead of rewriting them: each
//! table carries a digest of its contents ([`digest`]), kept current by every update.
//!
//! # Mechanism: nft script text through `nft -f`
//!
//! We generate nft's own text syntax and pipe it to `nft -f -`, rather than drive `nft`
//! through the `nftables` crate's JSON. Both need the `nft` binary (the crate runs it too),
//! so the choice is about the representation: the text is what operators read in
//! `nft list table ip ipvs-proxier`, what nft's documentation describes, and what error
//! messages quote back (with the offending line); a golden test of the text is a review
//! of the real rules. The JSON schema adds a dependency (and serde types for every
//! expression) without adding safety: our rules are a fixed skeleton, and the only variable
//! parts (set elements: addresses, protocols, ports, CIDRs) are typed values rendered by
//! `Display`, so nothing from the API server is ever spliced into the script as text.
//! nft 1.0.6 (Debian 12) needs a newline or `;` before a closing `}`: the renderer always
//! ends statements with newlines.
//!
//! **The node needs the `nft` binary** (package `nftables`), and a kernel with nf_tables,
//! `nft_nat`, `nft_chain_nat`, `nft_masq`, `nft_ct`, `nft_fib` and `nft_reject`.
//!
//! # Table layout (family `ip`; `ip6` is the same with IPv6 types)
//!
//! Sets (kube-proxy's ipset in parentheses), keyed `address . inet_proto . inet_service`
//! unless noted:
//!
//! | set | holds |
//! | --- | --- |
//! | `cluster-ips` | every ClusterIP:port (`KUBE-CLUSTER-IP`) |
//! | `external-ips` / `external-ips-local` | ExternalIP:port with eTP Cluster / Local (`KUBE-EXTERNAL-IP(-LOCAL)`) |
//! | `load-balancer-ips` / `load-balancer-ips-local` | LB ingress IP:port with eTP Cluster / Local (`KUBE-LOAD-BALANCER(-LOCAL)`) |
//! | `node-ports` / `node-ports-local` | `inet_proto . inet_service`: NodePorts with eTP Cluster / Local (`KUBE-NODE-PORT-{TCP,UDP,SCTP}` and `-LOCAL-`) |
//! | `load-balancer-firewall` | LB IP:port that have source ranges (`KUBE-LOAD-BALANCER-FW`) |
//! | `load-balancer-source-ranges-{tcp,udp,sctp}` | `address . inet_service . address` interval sets, one per protocol: allowed sources (`KUBE-LOAD-BALANCER-SOURCE-CIDR`) |
//! | `load-balancer-node-allowed` | firewalled LB IP:port the node itself may reach (`KUBE-LOAD-BALANCER-SOURCE-IP`) |
//! | `hairpin` | `… . address`: endpoint ip:port plus the same ip as source (`KUBE-LOOP-BACK`) |
//! | `health-check-node-ports` | `inet_service`: health-check NodePorts (`KUBE-HEALTH-CHECK-NODE-PORT`) |
//! | `service-ips` | `address`: every VIP bound on the dummy link (`KUBE-IPVS-IPS`) |
//! | `plan-digest` | `mark . mark`: one element, the digest of the tables' contents ([`digest`]) |
//!
//! Chains:
//!
//! - `nat-prerouting` (nat, prerouting, dstnat) and `nat-output` (nat, output, dstnat) jump to
//!   `mark-for-masquerade`, which sets the masquerade mark bit on the first packet of a
//!   connection when it goes to a ClusterIP and masquerade is due (masqueradeAll; or source
//!   outside the cluster CIDRs; or, with neither configured, node traffic sourced from the
//!   VIP itself), to an ExternalIP or LB IP of an eTP=Cluster Service, or to a local address
//!   on an eTP=Cluster NodePort (`fib daddr type local`). eTP=Local entries are never marked:
//!   the backend sees the client's address.
//! - `nat-postrouting` (nat, postrouting, srcnat) masquerades hairpin packets (destination
//!   endpoint ip:port with the same ip as source, i.e. a pod reaching itself through its
//!   Service) and marked packets, clearing the bit first. IPVS rewrites the destination at
//!   LOCAL_IN/LOCAL_OUT and the packet then crosses postrouting; with `net.ipv4.vs.conntrack=1`
//!   (see [`crate::sysctl`]) conntrack knows the connection and the NAT binding holds for its
//!   life.
//! - `filter-input` (filter, input, priority filter: before IPVS's LOCAL_IN hook at 98)
//!   sends LB IP:port with source ranges through `source-ranges` (allowed source → return,
//!   else drop), accepts health-check NodePorts, and sends new connections to a bound VIP
//!   through `service-address-ports`, which accepts the VIP:ports of `cluster-ips`,
//!   `external-ips(-local)` and `load-balancer-ips(-local)` and rejects any other port and
//!   protocol (kubernetes#72236). Established traffic pays none of these lookups.
//! - `filter-output` (filter, output, priority -110: before IPVS's LOCAL_OUT hook at -99)
//!   drops node-originated connections to a firewalled LB IP:port unless a source range holds
//!   one of the node's primary IPs.
//!
//! Accepting in our table does not override a drop in another table (nftables evaluates
//! every base chain of a hook); a node firewall with a drop policy must allow Service
//! traffic itself.
//!
//! # How the daemon drives it
//!
//! 1. At start, after the IPVS handle is open (it loads `ip_vs`, which creates the `vs/*`
//!    sysctls): [`crate::sysctl::ensure_sysctls`]; refuse to start on
//!    [`crate::sysctl::SysctlReport::essential_failures`].
//! 2. Build `Netfilter::new(NftBackend::default(), RenderOptions::default())` (or
//!    [`MemoryNetfilterBackend`] for `--dry-run`) and a
//!    [`crate::conntrack::KernelConntrack`] (or [`crate::conntrack::MemoryConntrack`]).
//! 3. Every sync, after the reconciler applied IPVS:
//!    `netfilter.sync(&netfilter::plan(&state, &node, &config)).await` (a no-op when the plan
//!    did not change); on a periodic full resync, when [`Netfilter::check_tables`] finds a
//!    table missing or [`Netfilter::replaced_before`] the rewrite period (an hour, as
//!    kube-proxy's nftables mode), call [`Netfilter::invalidate`] first, so drift is
//!    repaired.
//! 4. After the reconciler removed real servers: the filters of
//!    [`crate::flows::stale_udp_flows_of_port`] (incremental, old and new plan of each
//!    dirty port) or [`crate::flows::stale_udp_flows`] (full sync) go to
//!    `delete_flows` (blocking: `spawn_blocking`).
//! 5. `--cleanup`: [`Netfilter::cleanup`].

pub mod apply;
pub mod digest;
mod elements;
pub mod plan;
pub mod render;
mod tables;
pub mod tracker;

pub use apply::{
    MemoryNetfilterBackend, NetfilterBackend, NetfilterError, NftBackend, PendingApply,
    PendingDigest, PendingSetList, PendingTableList, parse_table_list,
};
pub use digest::{changed_digest, parse_digest, plan_digest, render_digest};
pub use elements::ElementBatch;
pub use plan::{
    AddrPort, ClusterIpMasquerade, FamilyPlan, NetfilterPlan, ProtoPort, SourceRange, empty_plan,
    plan, plan_of_service,
};
pub use render::{
    DEFAULT_MASQUERADE_MARK, DEFAULT_TABLE_NAME, DIGEST_SET, RenderError, RenderOptions,
    render_cleanup, render_replace, render_update,
};
pub use tracker::{NetfilterTracker, PlanChanges};

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, Instant};

use crate::model::AddressFamily;
use render::nft_family;

/// How long a resync's listing of the tables ([`Netfilter::check_tables`]) may take before
/// it is abandoned (a listing future is dropped then).
pub const LISTING_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the listing of what a previous run left ([`Netfilter::read_stored`], at start)
/// may take. Longer than [`LISTING_TIMEOUT`]: nothing of ours changes the ruleset before the
/// first sync, so the listing ends, but it runs beside the source's first picture and the
/// IPVS read, and under that load (seconds at 10,000 Services in the VM) a listing cut at
/// [`LISTING_TIMEOUT`] was listed again within the first sync.
pub const START_LISTING_TIMEOUT: Duration = Duration::from_secs(10);

/// Keeps the node's nftables tables equal to the latest plan.
#[derive(Debug)]
pub struct Netfilter<B> {
    backend: B,
    options: RenderOptions,
    last_applied: Option<NetfilterPlan>,
    /// The tables hold what [`Netfilter::sync_changes`] was last given.
    tracked_in_sync: bool,
    /// The tables (`family name`) the last replace wrote (or the start adopted), and when.
    replaced: Option<(BTreeSet<String>, Instant)>,
    /// The digest the tables hold ([`digest`]), while they hold what
    /// [`Netfilter::sync_changes`] was last given.
    digest: Option<u64>,
    /// What a previous run left, as the first full sync's read saw it
    /// ([`Netfilter::use_stored`]); taken by the first sync.
    stored: Option<StoredTables>,
    /// An incremental update handed to the kernel without waiting
    /// ([`Netfilter::start_changes`]), until [`Netfilter::settle`] takes its answer.
    in_flight: Option<InFlight>,
    /// Woken when an update in flight ends (see [`Netfilter::update_ended`]).
    update_ended: std::sync::Arc<tokio::sync::Notify>,
}

/// An incremental update on its way to the kernel.
#[derive(Debug)]
struct InFlight {
    /// Its answer and when it came.
    task: tokio::task::JoinHandle<(Result<(), NetfilterError>, Instant)>,
    /// The digest the tables hold once it is applied.
    digest: Option<u64>,
    started: Instant,
}

/// The proxier's tables a previous run left and the digest each holds, as
/// [`Netfilter::read_stored`] lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredTables {
    /// The digest in each of the proxier's tables present (`family name`); `None` when it
    /// could not be read.
    digests: BTreeMap<String, Option<u64>>,
}

impl<B: NetfilterBackend> Netfilter<B> {
    /// A netfilter manager with these options.
    pub fn new(backend: B, options: RenderOptions) -> Result<Self, RenderError> {
        options.validate()?;
        Ok(Netfilter {
            backend,
            options,
            last_applied: None,
            tracked_in_sync: false,
            replaced: None,
            digest: None,
            stored: None,
            in_flight: None,
            update_ended: std::sync::Arc::default(),
        })
    }

    /// Asks the running kernel whether it takes the tables of `plan` as this backend writes
    /// them, writing nothing ([`NetfilterBackend::check`]): a start checks its rules this
    /// way before its first write, so that a kernel and nft that refuse them stop the start
    /// with the refused rule instead of leaving a node with IPVS and no netfilter. `Ok` when
    /// the backend has no kernel to ask.
    pub async fn check_plan(&self, plan: &NetfilterPlan) -> Result<(), NetfilterError> {
        let script = render::render_replace(plan, &self.options)?;
        match self.backend.check(script) {
            Some(check) => check.await,
            None => Ok(()),
        }
    }

    /// Lists what a previous run left (the proxier's tables and the digest each holds),
    /// as a future that borrows nothing, so that the first full sync's read can take it
    /// beside the IPVS table; `None` when the backend cannot look or the listing fails,
    /// and at once after the tables were written or adopted (only a start needs it).
    pub fn read_stored(&self) -> impl Future<Output = Option<StoredTables>> + Send + 'static {
        let needed = self.replaced.is_none();
        let listing = if needed {
            self.backend.list_tables()
        } else {
            None
        };
        let sets: Vec<(String, Option<PendingDigest>)> = if needed {
            AddressFamily::ALL
                .into_iter()
                .map(|family| format!("{} {}", nft_family(family), self.options.table_name))
                .map(|table| {
                    let digest = self.backend.read_digest(&table);
                    (table, digest)
                })
                .collect()
        } else {
            Vec::new()
        };
        async move {
            let listing = listing?;
            let present = match tokio::time::timeout(START_LISTING_TIMEOUT, listing).await {
                Ok(Ok(present)) => present,
                Ok(Err(error)) => {
                    tracing::info!(%error, "cannot list the nftables tables a previous run left");
                    return None;
                }
                Err(_) => {
                    tracing::info!(
                        timeout = ?START_LISTING_TIMEOUT,
                        "the nftables tables a previous run left not listed in time"
                    );
                    return None;
                }
            };
            let mut stored = StoredTables::default();
            for (table, set) in sets {
                if !present.contains(&table) {
                    continue;
                }
                let digest = match set {
                    Some(read) => match tokio::time::timeout(START_LISTING_TIMEOUT, read).await {
                        Ok(Ok(digest)) => digest,
                        _ => None,
                    },
                    None => None,
                };
                stored.digests.insert(table, digest);
            }
            Some(stored)
        }
    }

    /// Hands the next [`Netfilter::sync_changes`] what [`Netfilter::read_stored`] listed, for
    /// a start to judge the tables by without listing them again.
    pub fn use_stored(&mut self, stored: StoredTables) {
        self.stored = Some(stored);
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, to play with it in tests (a table deleted behind the proxier's back).
    #[cfg(test)]
    pub(crate) fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The options.
    pub fn options(&self) -> &RenderOptions {
        &self.options
    }

    /// Makes the tables hold `plan`, in one transaction. After a successful sync, the next
    /// one only adds and deletes the set elements that changed ([`render_update`]); the
    /// first sync, a change of the rules themselves, or a failed update (the kernel did not
    /// hold what we last applied) replace the whole tables ([`render_replace`]).
    ///
    /// Returns `false` without touching the kernel when `plan` equals the last plan applied
    /// (call [`Netfilter::invalidate`] to force a full replace, e.g. on the periodic resync).
    pub async fn sync(&mut self, plan: &NetfilterPlan) -> Result<bool, NetfilterError> {
        self.settle().await;
        self.tracked_in_sync = false;
        if self.last_applied.as_ref() == Some(plan) {
            return Ok(false);
        }
        if let Some(old) = self.last_applied.take() {
            let script = render_update(&old, plan, &self.options)?;
            match self.backend.apply(&script).await {
                Ok(()) => {
                    self.applied(plan, "updated");
                    return Ok(true);
                }
                Err(err) => tracing::warn!(
                    table = %self.options.table_name,
                    "incremental nftables update failed, replacing the tables: {err}"
                ),
            }
        }
        let script = render_replace(plan, &self.options)?;
        self.backend.apply(&script).await?;
        self.note_replaced(plan);
        self.applied(plan, "replaced");
        Ok(true)
    }

    /// Makes the tables hold `plan` given only what changed since the last call
    /// (`changes`, from a [`NetfilterTracker`]): one transaction adding and deleting those
    /// elements, so the cost follows the size of the change. The first call, a call after
    /// [`Netfilter::invalidate`], or a failed update replaces the whole tables with `plan`.
    /// Returns whether the kernel was written.
    pub async fn sync_changes(
        &mut self,
        plan: &NetfilterPlan,
        changes: &PlanChanges,
    ) -> Result<bool, NetfilterError> {
        // In order: after any update in flight (its failure makes this a replace).
        self.settle().await;
        self.last_applied = None;
        if self.tracked_in_sync {
            if changes.is_empty() {
                return Ok(false);
            }
            match self.apply_update(plan, changes).await {
                Ok(digest) => {
                    self.digest = digest;
                    tracing::debug!(table = %self.options.table_name, "nftables set elements updated");
                    return Ok(true);
                }
                Err(err) => tracing::warn!(
                    table = %self.options.table_name,
                    "incremental nftables update failed, replacing the tables: {err}"
                ),
            }
        }
        self.tracked_in_sync = false;
        self.digest = None;
        let started = std::time::Instant::now();
        let digest = plan_digest(plan, &self.options)?;
        let digested = started.elapsed();
        if self.replaced.is_none() && self.tables_hold(plan, digest).await {
            // A restart: the tables a previous run left already hold this plan.
            self.tracked_in_sync = true;
            self.digest = Some(digest);
            self.note_replaced(plan);
            tracing::info!(
                table = %self.options.table_name,
                digest_took = ?digested,
                listing_took = ?started.elapsed().saturating_sub(digested),
                "nftables tables already hold the plan: adopted without a rewrite"
            );
            return Ok(false);
        }
        let mut script = render_replace(plan, &self.options)?;
        script.push_str(&render_digest(plan, &self.options, digest));
        self.backend.apply(&script).await?;
        self.tracked_in_sync = true;
        self.digest = Some(digest);
        self.note_replaced(plan);
        tracing::debug!(
            table = %self.options.table_name,
            v4_elements = plan.v4.as_ref().map_or(0, FamilyPlan::element_count),
            v6_elements = plan.v6.as_ref().map_or(0, FamilyPlan::element_count),
            "nftables tables replaced"
        );
        Ok(true)
    }

    /// As [`Netfilter::sync_changes`], but an incremental update (the tables already hold
    /// what the last call gave, and `changes` is not empty) is only started when the backend
    /// can apply it detached ([`NetfilterBackend::apply_detached`]): it runs on its own
    /// while the caller goes on (an IPVS change does not wait for `nft`), and
    /// [`Netfilter::settle`] takes its answer. Call it only when nothing is in flight
    /// ([`Netfilter::updating`]). Returns whether the kernel was (or is being) written.
    pub async fn start_changes(
        &mut self,
        plan: &NetfilterPlan,
        changes: &PlanChanges,
    ) -> Result<bool, NetfilterError> {
        debug_assert!(self.in_flight.is_none(), "an nftables update is in flight");
        if self.tracked_in_sync && !changes.is_empty() && self.in_flight.is_none() {
            let digest = self.next_digest(changes);
            let pending = match self.element_batch(plan, changes, digest) {
                Some(pending) => Some(pending),
                None => {
                    let script = self.update_script(plan, changes, digest)?;
                    self.backend.apply_detached(script)
                }
            };
            if let Some(pending) = pending {
                let ended = std::sync::Arc::clone(&self.update_ended);
                let task = tokio::spawn(async move {
                    let result = pending.await;
                    ended.notify_one();
                    (result, Instant::now())
                });
                // Until it is settled, the tables hold either digest.
                self.digest = None;
                self.in_flight = Some(InFlight {
                    task,
                    digest,
                    started: Instant::now(),
                });
                return Ok(true);
            }
        }
        self.sync_changes(plan, changes).await
    }

    /// Applies the update taking the tables from what the last call gave to `plan` by
    /// `changes` alone, as one element batch when it can ([`Netfilter::element_batch`]),
    /// else by script; returns the digest the tables then hold.
    async fn apply_update(
        &mut self,
        plan: &NetfilterPlan,
        changes: &PlanChanges,
    ) -> Result<Option<u64>, NetfilterError> {
        let digest = self.next_digest(changes);
        match self.element_batch(plan, changes, digest) {
            Some(pending) => pending.await?,
            None => {
                let script = self.update_script(plan, changes, digest)?;
                self.backend.apply(&script).await?;
            }
        }
        Ok(digest)
    }

    /// The digest the tables hold once `changes` are applied (none when the stored one is
    /// unknown).
    fn next_digest(&self, changes: &PlanChanges) -> Option<u64> {
        self.digest.map(|digest| changed_digest(digest, changes))
    }

    /// The update of [`Netfilter::update_script`] started as one nf_tables batch of set
    /// elements ([`ElementBatch`]), without `nft`; `None` when the change needs the script
    /// (an interval set, a family added) or the backend cannot send batches.
    fn element_batch(
        &self,
        plan: &NetfilterPlan,
        changes: &PlanChanges,
        digest: Option<u64>,
    ) -> Option<PendingApply> {
        let batch = ElementBatch::of(plan, changes, digest, &self.options.table_name)?;
        self.backend.apply_elements_detached(batch)
    }

    /// The transaction taking the tables from what the last call gave to `plan` by
    /// `changes` alone, storing `digest` ([`Netfilter::next_digest`]) when it is known.
    fn update_script(
        &self,
        plan: &NetfilterPlan,
        changes: &PlanChanges,
        digest: Option<u64>,
    ) -> Result<String, NetfilterError> {
        let mut script = render_update(&changes.removed, &changes.added, &self.options)?;
        if let Some(digest) = digest {
            script.push_str(&render_digest(plan, &self.options, digest));
        }
        Ok(script)
    }

    /// Whether an update started by [`Netfilter::start_changes`] has not been settled yet.
    pub fn updating(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether an update in flight has ended and waits for [`Netfilter::settle`].
    pub fn update_finished(&self) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|in_flight| in_flight.task.is_finished())
    }

    /// Notified each time an update in flight ends (a permit is kept when nobody waits),
    /// for a loop to call [`Netfilter::settle`] then; cheap to clone.
    pub fn update_ended(&self) -> std::sync::Arc<tokio::sync::Notify> {
        std::sync::Arc::clone(&self.update_ended)
    }

    /// Waits for the update in flight, if any, and takes its answer: after a success the
    /// tables hold what [`Netfilter::start_changes`] was given; after a failure (logged) the
    /// next [`Netfilter::sync_changes`] or [`Netfilter::start_changes`] replaces the tables
    /// whole, as a failed update within a sync does. Returns how long the update took, or
    /// why it failed; `None` when nothing was in flight.
    pub async fn settle(&mut self) -> Option<Result<Duration, NetfilterError>> {
        let in_flight = self.in_flight.take()?;
        let (result, ended) = match in_flight.task.await {
            Ok(answer) => answer,
            Err(error) => (
                Err(NetfilterError::Io {
                    nft: "nft".into(),
                    source: std::io::Error::other(format!("the update task failed: {error}")),
                }),
                Instant::now(),
            ),
        };
        let took = ended.saturating_duration_since(in_flight.started);
        match result {
            Ok(()) => {
                if self.tracked_in_sync {
                    self.digest = in_flight.digest;
                }
                tracing::debug!(
                    table = %self.options.table_name,
                    ?took,
                    "nftables set elements updated (detached)"
                );
                Some(Ok(took))
            }
            Err(error) => {
                tracing::warn!(
                    table = %self.options.table_name,
                    "incremental nftables update failed, the next sync replaces the tables: {error}"
                );
                self.tracked_in_sync = false;
                self.digest = None;
                Some(Err(error))
            }
        }
    }

    fn applied(&mut self, plan: &NetfilterPlan, how: &'static str) {
        tracing::debug!(
            table = %self.options.table_name,
            v4_elements = plan.v4.as_ref().map_or(0, FamilyPlan::element_count),
            v6_elements = plan.v6.as_ref().map_or(0, FamilyPlan::element_count),
            "nftables tables {how}"
        );
        self.last_applied = Some(plan.clone());
    }

    /// Forgets the last applied plan, so the next [`Netfilter::sync`] rewrites the tables
    /// (repairs drift: someone deleting or editing them).
    pub fn invalidate(&mut self) {
        self.last_applied = None;
        self.tracked_in_sync = false;
        self.digest = None;
    }

    /// Whether the next [`Netfilter::sync_changes`] can be an incremental update (the tables
    /// hold what it was last given, or an update of them is on its way), rather than writing
    /// the tables whole from the plan.
    pub(crate) fn tracks_changes(&self) -> bool {
        self.tracked_in_sync || self.in_flight.is_some()
    }

    /// The digest the tables hold ([`digest`]) while they hold what
    /// [`Netfilter::sync_changes`] was last given; `None` before that or after a failure.
    pub fn digest(&self) -> Option<u64> {
        self.digest
    }

    /// Whether the kernel holds exactly the proxier's tables of `plan`'s families (none of
    /// another family), each with `digest` in its [`DIGEST_SET`]: what a previous run left
    /// when nothing changed since. Any doubt (a backend that cannot look, a listing that
    /// fails) answers `false`, and the tables are rewritten.
    async fn tables_hold(&mut self, plan: &NetfilterPlan, digest: u64) -> bool {
        let stored = match self.stored.take() {
            Some(stored) => stored,
            None => match self.read_stored().await {
                Some(stored) => stored,
                None => return false,
            },
        };
        let wanted: BTreeSet<String> = AddressFamily::ALL
            .into_iter()
            .filter(|family| plan.family(*family).is_some())
            .map(|family| format!("{} {}", nft_family(family), self.options.table_name))
            .collect();
        stored.digests.keys().eq(wanted.iter())
            && stored.digests.values().all(|held| *held == Some(digest))
    }

    fn note_replaced(&mut self, plan: &NetfilterPlan) {
        let tables = AddressFamily::ALL
            .into_iter()
            .filter(|family| plan.family(*family).is_some())
            .map(|family| format!("{} {}", nft_family(family), self.options.table_name))
            .collect();
        self.replaced = Some((tables, Instant::now()));
    }

    /// Whether the tables were last replaced (rewritten whole) longer than `period` ago, or
    /// never: a periodic resync rewrites them then, to repair edits inside them.
    pub fn replaced_before(&self, period: Duration) -> bool {
        self.replaced
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() >= period)
    }

    /// Checks, without borrowing `self`, that every table the last replace wrote is still
    /// in the kernel (a `nft flush ruleset` or a deleted table is then repaired at the next
    /// resync, without rewriting tables that are there). Answers `false` when the tables
    /// cannot be listed (or the backend cannot list them), and `true` before the first
    /// replace (there is nothing to miss).
    ///
    /// A listing that takes longer than [`LISTING_TIMEOUT`] is abandoned and the tables are
    /// taken as present ([`NftBackend`] lists them with one nfnetlink dump, but a backend
    /// running `nft list tables` would read every set element, and start again whenever
    /// the ruleset changed meanwhile). A missing table is found anyway: the next
    /// incremental update fails on it and replaces the tables.
    pub fn check_tables(&self) -> impl Future<Output = bool> + Send + 'static {
        let expected = self.replaced.as_ref().map(|(tables, _)| tables.clone());
        let listing = self.backend.list_tables();
        async move {
            let Some(expected) = expected else {
                return true;
            };
            let Some(listing) = listing else {
                return false;
            };
            let Ok(listing) = tokio::time::timeout(LISTING_TIMEOUT, listing).await else {
                tracing::info!(
                    timeout = ?LISTING_TIMEOUT,
                    "nftables tables not listed in time (the ruleset kept changing); taken as present"
                );
                return true;
            };
            match listing {
                Ok(present) => {
                    let missing: Vec<&String> = expected.difference(&present).collect();
                    if !missing.is_empty() {
                        tracing::warn!(?missing, "nftables tables missing; rewriting them");
                    }
                    missing.is_empty()
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot list the nftables tables; rewriting them");
                    false
                }
            }
        }
    }

    /// Removes the proxier's tables of both families completely (`--cleanup`).
    pub async fn cleanup(&mut self) -> Result<(), NetfilterError> {
        self.settle().await;
        let script = render_cleanup(&self.options.table_name)?;
        self.last_applied = None;
        self.tracked_in_sync = false;
        self.backend.apply(&script).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::desired::Protocol;
    use crate::model::AddressFamily;

    fn plan_with(ports: &[u16]) -> NetfilterPlan {
        let mut p = FamilyPlan::new(AddressFamily::V4, ClusterIpMasquerade::NodeFromVip);
        for port in ports {
            p.cluster_ips.insert(AddrPort {
                address: "10.96.0.10".parse().unwrap(),
                protocol: Protocol::Tcp,
                port: *port,
            });
        }
        NetfilterPlan {
            v4: Some(p),
            v6: None,
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn changes(added: &[u16], removed: &[u16]) -> PlanChanges {
        PlanChanges {
            added: plan_with(added),
            removed: plan_with(removed),
        }
    }

    #[test]
    fn a_restart_adopts_tables_that_hold_its_plan_and_rewrites_any_other() {
        let options = RenderOptions::default();
        let mut first = Netfilter::new(MemoryNetfilterBackend::default(), options.clone()).unwrap();
        let plan = plan_with(&[80, 443]);
        assert!(block_on(first.sync_changes(&plan, &changes(&[80, 443], &[]))).unwrap());
        // Churn after the replace keeps the digest of the whole plan in the tables.
        let plan = plan_with(&[80, 8443]);
        assert!(block_on(first.sync_changes(&plan, &changes(&[8443], &[443]))).unwrap());
        assert_eq!(first.digest(), Some(plan_digest(&plan, &options).unwrap()));

        // The next process, same plan: nothing is written.
        let kernel = first.backend().clone();
        let mut second = Netfilter::new(kernel.clone(), options.clone()).unwrap();
        assert!(!block_on(second.sync_changes(&plan, &changes(&[80, 8443], &[]))).unwrap());
        assert_eq!(second.backend().scripts.len(), kernel.scripts.len());
        assert!(!second.replaced_before(Duration::from_secs(60)));
        // ... and it goes on with updates.
        let next = plan_with(&[80]);
        assert!(block_on(second.sync_changes(&next, &changes(&[], &[8443]))).unwrap());
        assert!(
            second
                .backend()
                .scripts
                .last()
                .unwrap()
                .starts_with("delete element")
        );

        // Another plan, other options, or a table of another family: rewritten whole.
        let rewrites = |netfilter: &mut Netfilter<MemoryNetfilterBackend>, plan: &NetfilterPlan| {
            let before = netfilter.backend().scripts.len();
            assert!(block_on(netfilter.sync_changes(plan, &changes(&[], &[]))).unwrap());
            assert_eq!(netfilter.backend().scripts.len(), before + 1);
            assert!(
                netfilter
                    .backend()
                    .scripts
                    .last()
                    .unwrap()
                    .contains("delete table")
            );
        };
        let mut other_plan = Netfilter::new(kernel.clone(), options.clone()).unwrap();
        rewrites(&mut other_plan, &plan_with(&[80, 443]));
        let renamed_mark = RenderOptions {
            masquerade_mark: 0x8000,
            ..options.clone()
        };
        rewrites(
            &mut Netfilter::new(kernel.clone(), renamed_mark).unwrap(),
            &plan,
        );
        let mut stray = kernel.clone();
        stray.tables.insert(format!("ip6 {}", options.table_name));
        rewrites(&mut Netfilter::new(stray, options.clone()).unwrap(), &plan);
        let mut flushed = kernel.clone();
        flushed.set_elements.clear();
        rewrites(
            &mut Netfilter::new(flushed, options.clone()).unwrap(),
            &plan,
        );
        // A backend that cannot look always rewrites.
        let mut blind = Netfilter::new(Blind(kernel), options).unwrap();
        assert!(block_on(blind.sync_changes(&plan, &changes(&[], &[]))).unwrap());
        assert!(
            blind
                .backend()
                .0
                .scripts
                .last()
                .unwrap()
                .contains("delete table")
        );
    }

    /// A backend whose listings never end (`nft` restarting its listing under changes).
    struct Stuck(MemoryNetfilterBackend);

    impl NetfilterBackend for Stuck {
        async fn apply(&mut self, script: &str) -> Result<(), NetfilterError> {
            self.0.apply(script).await
        }

        fn list_tables(&self) -> Option<PendingTableList> {
            Some(Box::pin(std::future::pending()))
        }

        fn list_set(&self, _: &str, _: &str) -> Option<PendingSetList> {
            Some(Box::pin(std::future::pending()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn listings_that_do_not_end_are_abandoned() {
        let mut nf = Netfilter::new(
            Stuck(MemoryNetfilterBackend::default()),
            RenderOptions::default(),
        )
        .unwrap();
        let plan = plan_with(&[80]);
        // At start the digest cannot be read: the tables are written.
        let started = tokio::time::Instant::now();
        assert!(nf.sync_changes(&plan, &changes(&[80], &[])).await.unwrap());
        assert_eq!(started.elapsed(), START_LISTING_TIMEOUT);
        assert_eq!(nf.backend().0.scripts.len(), 1);
        // A resync's check gives up and takes the tables as present.
        let started = tokio::time::Instant::now();
        assert!(nf.check_tables().await);
        assert_eq!(started.elapsed(), LISTING_TIMEOUT);
    }

    /// A backend that applies but cannot list.
    struct Blind(MemoryNetfilterBackend);

    impl NetfilterBackend for Blind {
        async fn apply(&mut self, script: &str) -> Result<(), NetfilterError> {
            self.0.apply(script).await
        }
    }

    #[test]
    fn first_sync_replaces_then_updates_then_skips() {
        let mut nf =
            Netfilter::new(MemoryNetfilterBackend::default(), RenderOptions::default()).unwrap();
        assert!(block_on(nf.sync(&plan_with(&[80]))).unwrap());
        assert!(block_on(nf.sync(&plan_with(&[80, 443]))).unwrap());
        assert!(!block_on(nf.sync(&plan_with(&[80, 443]))).unwrap());
        let scripts = &nf.backend().scripts;
        assert_eq!(scripts.len(), 2);
        assert!(scripts[0].contains("table ip ipvs-proxier {"));
        assert_eq!(
            scripts[1],
            "add element ip ipvs-proxier cluster-ips { 10.96.0.10 . tcp . 443 }\n"
        );
    }

    #[test]
    fn failed_update_falls_back_to_a_full_replace() {
        let mut nf =
            Netfilter::new(MemoryNetfilterBackend::default(), RenderOptions::default()).unwrap();
        block_on(nf.sync(&plan_with(&[80]))).unwrap();
        nf.backend.fail_next = Some("No such file or directory".into());
        assert!(block_on(nf.sync(&plan_with(&[81]))).unwrap());
        let last = nf.backend().scripts.last().unwrap();
        assert!(last.starts_with("add table ip ipvs-proxier\ndelete table ip ipvs-proxier\n"));
        assert!(last.contains("10.96.0.10 . tcp . 81"));
    }

    #[test]
    fn invalidate_forces_a_full_replace_and_cleanup_removes_tables() {
        let mut nf =
            Netfilter::new(MemoryNetfilterBackend::default(), RenderOptions::default()).unwrap();
        block_on(nf.sync(&plan_with(&[80]))).unwrap();
        nf.invalidate();
        assert!(block_on(nf.sync(&plan_with(&[80]))).unwrap());
        assert!(nf.backend().scripts[1].contains("table ip ipvs-proxier {"));
        block_on(nf.cleanup()).unwrap();
        assert_eq!(
            nf.backend().scripts.last().unwrap(),
            &render_cleanup(DEFAULT_TABLE_NAME).unwrap()
        );
    }

    /// A backend that sends element batches (recording them; the next one may be refused)
    /// and applies scripts in memory.
    #[derive(Default)]
    struct Batching {
        memory: MemoryNetfilterBackend,
        batches: std::sync::Arc<std::sync::Mutex<Vec<ElementBatch>>>,
        refuse: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl NetfilterBackend for Batching {
        async fn apply(&mut self, script: &str) -> Result<(), NetfilterError> {
            self.memory.apply(script).await
        }

        fn apply_elements_detached(&self, batch: ElementBatch) -> Option<PendingApply> {
            self.batches.lock().unwrap().push(batch);
            let refused = self
                .refuse
                .swap(false, std::sync::atomic::Ordering::Relaxed);
            Some(Box::pin(async move {
                if refused {
                    Err(NetfilterError::ElementBatch(
                        std::io::Error::from_raw_os_error(libc::ENOENT),
                    ))
                } else {
                    Ok(())
                }
            }))
        }
    }

    #[tokio::test]
    async fn element_updates_go_as_batches_and_interval_sets_or_a_refusal_as_scripts() {
        let backend = Batching::default();
        let (batches, refuse) = (backend.batches.clone(), backend.refuse.clone());
        let mut nf = Netfilter::new(backend, RenderOptions::default()).unwrap();
        // The first write replaces the tables by script.
        let plan = plan_with(&[80]);
        assert!(nf.sync_changes(&plan, &changes(&[80], &[])).await.unwrap());
        assert_eq!(nf.backend().memory.scripts.len(), 1);
        assert!(batches.lock().unwrap().is_empty());

        // An update of single-value sets: one batch, detached or within the sync, no script.
        let plan = plan_with(&[80, 443]);
        assert!(
            nf.start_changes(&plan, &changes(&[443], &[]))
                .await
                .unwrap()
        );
        assert!(nf.settle().await.unwrap().is_ok());
        let plan = plan_with(&[443]);
        assert!(nf.sync_changes(&plan, &changes(&[], &[80])).await.unwrap());
        assert_eq!(batches.lock().unwrap().len(), 2);
        assert_eq!(nf.backend().memory.scripts.len(), 1);
        assert_eq!(
            nf.digest(),
            Some(plan_digest(&plan, &RenderOptions::default()).unwrap())
        );

        // A source range (an interval set) goes by script.
        let mut ranged = changes(&[], &[]);
        ranged
            .added
            .v4
            .as_mut()
            .unwrap()
            .source_ranges
            .insert(SourceRange {
                target: AddrPort {
                    address: "192.0.2.1".parse().unwrap(),
                    protocol: Protocol::Tcp,
                    port: 443,
                },
                source: "198.51.100.0/24".parse().unwrap(),
            });
        let mut with_range = plan.clone();
        with_range.v4.as_mut().unwrap().source_ranges =
            ranged.added.v4.as_ref().unwrap().source_ranges.clone();
        assert!(nf.sync_changes(&with_range, &ranged).await.unwrap());
        assert_eq!(batches.lock().unwrap().len(), 2);
        assert_eq!(nf.backend().memory.scripts.len(), 2);
        assert!(
            nf.backend().memory.scripts[1]
                .starts_with("add element ip ipvs-proxier load-balancer-source-ranges-tcp")
        );

        // A refused batch: the next sync replaces the tables whole.
        refuse.store(true, std::sync::atomic::Ordering::Relaxed);
        let next = with_range.clone();
        let mut more = next.clone();
        more.v4
            .as_mut()
            .unwrap()
            .cluster_ips
            .extend(plan_with(&[8080]).v4.unwrap().cluster_ips);
        assert!(
            nf.start_changes(&more, &changes(&[8080], &[]))
                .await
                .unwrap()
        );
        assert!(nf.settle().await.unwrap().is_err());
        assert_eq!(nf.digest(), None);
        assert!(nf.sync_changes(&more, &changes(&[], &[])).await.unwrap());
        assert_eq!(batches.lock().unwrap().len(), 3);
        assert_eq!(nf.backend().memory.scripts.len(), 3);
        assert!(nf.backend().memory.scripts[2].contains("delete table ip ipvs-proxier"));
    }
}
