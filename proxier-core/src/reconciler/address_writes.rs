//! Address writes that outlive the incremental sync that asked for them.
//!
//! Binding or unbinding one address on a dummy link that holds thousands costs the kernel a
//! walk of the link's address list, and at 10,000 ClusterIPs a sync adding one Service and
//! deleting another spent more on its two address writes than on all its IPVS writes; every
//! change that arrived meanwhile waited for them. With
//! [`Reconciler::detach_address_writes`](super::Reconciler::detach_address_writes), an
//! incremental sync starts its binds and unbinds on a task of their own
//! ([`AddressBackend::write_detached`](crate::backend::AddressBackend::write_detached)) and
//! returns once its IPVS writes are answered. The reconciler's picture of the link takes the
//! writes as done when they start; a later sync takes their answers
//! ([`DetachedAddressWrites::answers`]) and corrects the picture, records a failed bind as
//! its service ports' failure (retried like any) and a failed unbind as a cleanup error.
//!
//! Writes started while others are on their way run after them, on the same task chain: the
//! kernel sees every bind and unbind in the order the syncs asked for them.

use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::AddressResults;
use crate::backend::PendingAddressWrites;

/// The addresses one sync asked to bind and unbind, and the kernel's answers.
#[derive(Debug)]
pub(super) struct AddressBatch {
    /// Addresses bound, in order.
    pub bind: Vec<IpAddr>,
    /// Addresses unbound, in order.
    pub unbind: Vec<IpAddr>,
    /// One result per address of `bind`, then one per address of `unbind`; `None` when the
    /// task that wrote them ended without answering (its runtime shutting down).
    pub results: Option<AddressResults>,
}

/// Address writes on their way: one task per batch, each awaiting the one before.
#[derive(Debug)]
pub(super) struct DetachedAddressWrites {
    /// The batches started, oldest first.
    batches: Vec<(Vec<IpAddr>, Vec<IpAddr>)>,
    /// The last batch's task: it answers for every batch before it too.
    task: JoinHandle<Vec<Option<AddressResults>>>,
}

impl DetachedAddressWrites {
    /// Starts `write` (binding `bind`, then unbinding `unbind`) after `before`, the writes
    /// still on their way; `ended` is notified when it has answered.
    pub(super) fn start(
        before: Option<DetachedAddressWrites>,
        bind: Vec<IpAddr>,
        unbind: Vec<IpAddr>,
        write: PendingAddressWrites,
        ended: Arc<Notify>,
    ) -> Self {
        let (mut batches, earlier) = match before {
            Some(before) => (before.batches, Some(before.task)),
            None => (Vec::new(), None),
        };
        let earlier_batches = batches.len();
        batches.push((bind, unbind));
        let task = tokio::spawn(async move {
            let mut answers = match earlier {
                // Those that did not answer (their task ended early) stay unanswered.
                Some(task) => task
                    .await
                    .unwrap_or_else(|_| (0..earlier_batches).map(|_| None).collect()),
                None => Vec::new(),
            };
            answers.push(Some(write.await));
            ended.notify_one();
            answers
        });
        DetachedAddressWrites { batches, task }
    }

    /// Every address a batch on its way binds or unbinds.
    pub(super) fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.batches
            .iter()
            .flat_map(|(bind, unbind)| bind.iter().chain(unbind))
            .copied()
    }

    /// Whether every batch has been answered.
    pub(super) fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for every batch's answers, oldest first.
    pub(super) async fn answers(self) -> Vec<AddressBatch> {
        let count = self.batches.len();
        let mut results = self.task.await.unwrap_or_else(|error| {
            tracing::error!(%error, "the task writing addresses ended without answering");
            Vec::new()
        });
        results.resize_with(count, || None);
        self.batches
            .into_iter()
            .zip(results)
            .map(|((bind, unbind), results)| AddressBatch {
                bind,
                unbind,
                results,
            })
            .collect()
    }
}
