//! `--dry-run`: a [`SyncTarget`] that changes nothing in the kernel and prints what the
//! sources hold at each sync.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::cluster_view::ClusterView;
use crate::runner::{SyncError, SyncKind, SyncTarget};

/// Prints a summary of the cluster view to a writer at every sync.
pub struct DryRunTarget<W> {
    view: Arc<Mutex<ClusterView>>,
    out: W,
}

impl<W: Write + Send> DryRunTarget<W> {
    /// A target reading `view` and printing to `out`.
    pub fn new(view: Arc<Mutex<ClusterView>>, out: W) -> Self {
        DryRunTarget { view, out }
    }

    /// The writer (tests read what was printed).
    pub fn into_inner(self) -> W {
        self.out
    }

    fn report(&mut self, kind: SyncKind) -> std::io::Result<()> {
        let (counts, node) = {
            let view = self
                .view
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let node = view
                .node
                .as_ref()
                .and_then(|n| n.metadata.name.clone())
                .unwrap_or_else(|| "<unknown>".to_owned());
            (view.counts(), node)
        };
        let kind = match kind {
            SyncKind::Full => "full",
            SyncKind::Incremental => "incremental",
        };
        writeln!(
            self.out,
            "dry-run {kind} sync: {} services ({} ports), {} endpoint slices ({} endpoints), node {node}",
            counts.services, counts.service_ports, counts.endpoint_slices, counts.endpoints
        )?;
        self.out.flush()
    }
}

impl<W: Write + Send> SyncTarget for DryRunTarget<W> {
    fn sync(
        &mut self,
        kind: SyncKind,
    ) -> impl std::future::Future<Output = Result<(), SyncError>> + Send {
        let result = self
            .report(kind)
            .map_err(|e| SyncError(format!("writing the dry-run report: {e}")));
        async move { result }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceEvent;
    use crate::source::manifests::parse_manifests;

    #[tokio::test]
    async fn prints_counts_of_the_view() {
        let text = include_str!("../../examples/cluster.yaml");
        let snapshot =
            crate::source::file::snapshot_from_manifests(parse_manifests(text), "node-a");
        let mut view = ClusterView::default();
        view.apply(&SourceEvent::Snapshot(snapshot));
        let expected = view.counts();
        let mut target = DryRunTarget::new(Arc::new(Mutex::new(view)), Vec::new());
        target.sync(SyncKind::Full).await.expect("sync");
        let printed = String::from_utf8(target.into_inner()).expect("utf8");
        assert_eq!(
            printed,
            format!(
                "dry-run full sync: {} services ({} ports), {} endpoint slices ({} endpoints), node node-a\n",
                expected.services,
                expected.service_ports,
                expected.endpoint_slices,
                expected.endpoints
            )
        );
        assert!(
            expected.services >= 10,
            "the example cluster has a dozen services"
        );
    }
}
