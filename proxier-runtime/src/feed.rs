//! Where a source's batches enter the engine: each change is counted for the
//! `*_changes_*` metrics until the next sync ([`crate::observer::RuntimeObserver`] resets the
//! count), and the changes go to the proxier (the first batch, before the first sync) or to
//! its driver ([`forward`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proxier_core::backend::{AddressBackend, IpvsBackend};
use proxier_core::conntrack::ConntrackBackend;
use proxier_core::engine::driver::ProxierHandle;
use proxier_core::netfilter::NetfilterBackend;
use proxier_core::{Change, Proxier};
use tokio::sync::mpsc;

use crate::metrics;
use crate::source::{SourceBatch, describe};

/// Changes counted since the last sync (for the `*_changes_pending` gauges).
#[derive(Debug, Default)]
pub(crate) struct PendingChanges {
    pub(crate) services: AtomicUsize,
    pub(crate) endpoints: AtomicUsize,
}

/// Where a source's batches enter the engine (from
/// [`RuntimeObserver::feed`](crate::observer::RuntimeObserver::feed)): changes are
/// counted for the `*_changes_*` metrics before the engine gets them. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Feed {
    pending: Arc<PendingChanges>,
}

impl Feed {
    pub(crate) fn new(pending: Arc<PendingChanges>) -> Feed {
        Feed { pending }
    }

    /// Applies a source's first batch (its complete picture) to a proxier before its first
    /// sync; returns how many changes it held.
    pub fn apply_first<I, A, N, C>(
        &self,
        proxier: &mut Proxier<I, A, N, C>,
        batch: SourceBatch,
    ) -> usize
    where
        I: IpvsBackend,
        A: AddressBackend,
        N: NetfilterBackend,
        C: ConntrackBackend + Send + 'static,
    {
        let count = batch.changes.len();
        let (services, slices) = batch
            .changes
            .iter()
            .fold((0, 0), |(services, slices), change| match change {
                Change::UpsertService(_) => (services + 1, slices),
                Change::UpsertSlice(_) => (services, slices + 1),
                _ => (services, slices),
            });
        proxier.reserve(services, slices);
        for change in batch.changes {
            proxier.apply(change);
        }
        count
    }

    /// Hands a later batch to a running driver.
    pub fn send(&self, engine: &ProxierHandle, batch: SourceBatch) {
        for change in &batch.changes {
            tracing::debug!(change = %describe(change), "source change");
            match change {
                Change::UpsertService(_) | Change::DeleteService(_) => {
                    let n = self.pending.services.fetch_add(1, Ordering::Relaxed) + 1;
                    metrics::record_service_change(n);
                }
                Change::UpsertSlice(_) | Change::DeleteSlice(_) => {
                    let n = self.pending.endpoints.fetch_add(1, Ordering::Relaxed) + 1;
                    metrics::record_endpoint_change(n);
                }
                Change::UpsertNode(_)
                | Change::DeleteNode
                | Change::UpsertServiceCidr(_)
                | Change::DeleteServiceCidr(_) => {}
            }
        }
        engine.apply(batch.changes);
    }
}

/// Hands every batch of `events` after the first to `engine` through `feed`, until the source
/// ends or the engine's driver is gone.
pub async fn forward(mut events: mpsc::Receiver<SourceBatch>, engine: ProxierHandle, feed: Feed) {
    while let Some(batch) = events.recv().await {
        feed.send(&engine, batch);
    }
}
