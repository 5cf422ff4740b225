//! What a sync did: the figures logs, `--once` and metrics are made of.

use std::fmt;
use std::time::Duration;

use crate::model::ServicePortName;
use crate::reconciler::{ReconcileReport, ReconcileTimings};
use crate::takeover::TakeoverReport;

/// What a sync covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncKind {
    /// Apply only what changed since the last sync, and due drains and retries.
    #[default]
    Incremental,
    /// Re-read the kernel, repair drift, rewrite the nftables tables.
    Full,
}

/// Sizes of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanSize {
    /// Planned virtual servers.
    pub virtual_servers: usize,
    /// Planned real servers over all virtual servers.
    pub real_servers: usize,
    /// Addresses to bind on the dummy link.
    pub bound_addresses: usize,
    /// Real servers draining now.
    pub draining: usize,
}

/// How long each phase of a sync took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncTimings {
    /// Re-planning the changed Service ports (IPVS, nftables elements, health checks).
    pub plan: Duration,
    /// IPVS and dummy-link reads and writes.
    pub ipvs: Duration,
    /// Of those, the reconciler's steps: kernel read, diff, address writes, IPVS writes.
    pub reconcile: ReconcileTimings,
    /// The nftables transaction.
    pub netfilter: Duration,
    /// UDP conntrack cleanup.
    pub conntrack: Duration,
    /// The whole sync.
    pub total: Duration,
}

impl fmt::Display for SyncTimings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plan {:?}, ipvs+addresses {:?} ({}), nftables {:?}, conntrack {:?}, total {:?}",
            self.plan, self.ipvs, self.reconcile, self.netfilter, self.conntrack, self.total
        )
    }
}

/// What one [`super::Proxier::sync`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// The kind of sync that ran (the first is always full).
    pub kind: SyncKind,
    /// IPVS and dummy-link writes, failures and drift.
    pub ipvs: ReconcileReport,
    /// Service ports whose plan changed.
    pub changed_ports: usize,
    /// Which ones (so that an observer keeping something per port updates only those).
    pub changed: Vec<ServicePortName>,
    /// Whether every port was re-planned (the node's facts changed, or the first sync).
    pub replanned_all: bool,
    /// Whether the nftables tables were written.
    pub netfilter_written: bool,
    /// Why the nftables tables could not be written (the next sync replaces them).
    pub netfilter_error: Option<String>,
    /// Whether an incremental nftables update runs on after this sync (started by it, or by
    /// an earlier sync that this one's elements wait for): the backend applies it detached,
    /// and a later sync or the driver takes its answer.
    pub netfilter_pending: bool,
    /// How long the incremental nftables update an earlier sync started took, when this sync
    /// found it ended (a failed one is logged, and this sync replaced the tables).
    pub netfilter_settled: Option<Duration>,
    /// UDP conntrack entries deleted.
    pub conntrack_deleted: usize,
    /// Whether a health check appeared, went or changed its count.
    pub health_checks_changed: bool,
    /// For each change with a recorded trigger time, the time until it was programmed.
    pub programming_latencies: Vec<Duration>,
    /// The plan's size after the sync.
    pub size: PlanSize,
    /// Phase durations.
    pub timings: SyncTimings,
    /// What this sync removed of kube-proxy's iptables chains and ipsets
    /// ([`super::Proxier::take_over_kube_proxy`]); `None` when it did not try.
    pub takeover: Option<TakeoverReport>,
}

impl SyncReport {
    /// Whether everything was applied (no write failed, the nftables tables are current).
    pub fn is_complete(&self) -> bool {
        self.ipvs.failed == 0 && self.ipvs.errors.is_empty() && self.netfilter_error.is_none()
    }
}

impl fmt::Display for SyncReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} writes ({} deletes, {} failed), nftables table {}, {} UDP conntrack entries deleted",
            self.ipvs.writes,
            self.ipvs.deletes,
            self.ipvs.failed,
            match (
                &self.netfilter_error,
                self.netfilter_written,
                self.netfilter_pending
            ) {
                (Some(_), _, _) => "failed",
                (None, true, true) => "being written",
                (None, true, false) => "written",
                (None, false, true) => "waiting for an update in flight",
                (None, false, false) => "unchanged",
            },
            self.conntrack_deleted
        )?;
        if let Some(drift) = self.ipvs.drift {
            write!(f, ", drift repaired {drift}")?;
        }
        if let Some(takeover) = &self.takeover {
            write!(f, ", takeover: {takeover}")?;
        }
        Ok(())
    }
}
