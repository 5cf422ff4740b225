//! Sources of cluster objects: the Kubernetes API server (`kube`, feature `kube`) or a YAML
//! file (`file`, feature `file`). Both convert what they read into the engine's changes at
//! their edge (with proxier-core's `k8s` conversions), send them as [`SourceBatch`]es on a
//! channel and raise the same "synced" signal once they hold a complete picture;
//! [`crate::feed`] hands them to the engine.

#[cfg(feature = "kube")]
pub mod api_client;
#[cfg(feature = "file")]
pub mod file;
#[cfg(feature = "kube")]
pub mod kube;
#[cfg(feature = "kube")]
pub mod lean;
#[cfg(feature = "file")]
pub mod manifests;
#[cfg(feature = "kube")]
pub mod protobuf;
#[cfg(feature = "kube")]
mod protobuf_stream;
#[cfg(feature = "kube")]
mod protobuf_watch;

use std::fmt;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proxier_core::model::{NodeContext, ServiceName, SliceKey};
use proxier_core::{Change, k8s};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Namespace and name of an object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// The key of an object's metadata (missing fields become empty strings).
    pub fn of(meta: &ObjectMeta) -> ObjectKey {
        ObjectKey {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// What a source sends: the engine's changes for one thing it saw (a watch event, a new
/// version of the file), converted at the source's edge. The first batch of a source is its
/// complete first picture.
#[derive(Debug, Default)]
pub struct SourceBatch {
    /// Changes, in order. The facts the engine measures and reports come inside them: an
    /// EndpointSlice's trigger time, the node's eligibility for traffic.
    pub changes: Vec<Change>,
}

impl SourceBatch {
    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Adds what `later` holds after what this one holds (taking its vector whole when
    /// this one has none made: a first picture's list is not copied, and a batch made at
    /// its size keeps its room).
    pub fn append(&mut self, mut later: SourceBatch) {
        if self.changes.capacity() == 0 {
            self.changes = later.changes;
        } else {
            self.changes.append(&mut later.changes);
        }
    }

    /// A Service was added or changed. One the conversion rejects is logged and left out:
    /// the engine keeps its last accepted version, so bad input never removes what is
    /// programmed.
    pub fn upsert_service(&mut self, service: &Service) {
        match k8s::service_change(service) {
            Ok(change) => self.changes.push(change),
            Err(error) => tracing::error!(
                service = %ObjectKey::of(&service.metadata), %error,
                "service rejected; its last accepted version stays"
            ),
        }
    }

    /// A Service was deleted.
    pub fn delete_service(&mut self, key: ObjectKey) {
        let name = ServiceName::new(key.namespace, key.name);
        self.changes.push(Change::DeleteService(name));
    }

    /// An EndpointSlice was added or changed (rejected ones as [`SourceBatch::upsert_service`]).
    pub fn upsert_slice(&mut self, slice: &EndpointSlice) {
        match k8s::slice_change(slice) {
            Ok(Some(change)) => self.changes.push(change),
            // An FQDN slice: never proxied.
            Ok(None) => self.delete_slice(ObjectKey::of(&slice.metadata)),
            Err(error) => tracing::error!(
                slice = %ObjectKey::of(&slice.metadata), %error,
                "endpoint slice rejected; its last accepted version stays"
            ),
        }
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, key: ObjectKey) {
        let key = SliceKey::new(key.namespace, key.name);
        self.changes.push(Change::DeleteSlice(key));
    }

    /// A ServiceCIDR was added or changed (rejected ones as [`SourceBatch::upsert_service`]:
    /// the ranges it last had stay routed).
    pub fn upsert_service_cidr(&mut self, object: &ServiceCIDR) {
        match k8s::service_cidr_change(object) {
            Ok(change) => self.changes.push(change),
            Err(error) => tracing::error!(
                service_cidr = %ObjectKey::of(&object.metadata), %error,
                "ServiceCIDR rejected; its last accepted version stays"
            ),
        }
    }

    /// A ServiceCIDR was deleted.
    pub fn delete_service_cidr(&mut self, key: ObjectKey) {
        self.changes.push(Change::DeleteServiceCidr(key.name));
    }

    /// This node's Node object changed (`None`: deleted).
    pub fn node(&mut self, node: Option<&Node>) {
        self.changes.push(match node {
            Some(node) => match k8s::node_context(node) {
                Ok(context) => Change::UpsertNode(context),
                Err(error) => {
                    tracing::error!(%error, "node object rejected; planning without its addresses");
                    // Its name and eligibility still hold: planning as with no Node object,
                    // while `/healthz` keeps telling load balancers whether to send traffic.
                    let mut context = NodeContext::new(
                        node.metadata.name.clone().unwrap_or_default(),
                        Vec::new(),
                        Vec::new(),
                    );
                    context.eligible = k8s::node_eligible(node);
                    Change::UpsertNode(context)
                }
            },
            None => Change::DeleteNode,
        });
    }
}

/// A short description of a change for logs: kind of change and object.
pub fn describe(change: &Change) -> String {
    match change {
        Change::UpsertService(service) => format!("service upsert {}", service.name),
        Change::DeleteService(name) => format!("service delete {name}"),
        Change::UpsertSlice(slice) => format!("slice upsert {}", slice.key),
        Change::DeleteSlice(key) => format!("slice delete {key}"),
        Change::UpsertNode(node) => format!("node update {}", node.name),
        Change::DeleteNode => "node deleted".to_owned(),
        Change::UpsertServiceCidr(object) => format!("ServiceCIDR upsert {}", object.name),
        Change::DeleteServiceCidr(name) => format!("ServiceCIDR delete {name}"),
    }
}

/// A running source: its events, its synced signal and its task.
#[derive(Debug)]
pub struct SourceHandle {
    /// Batches of changes, in order; the first is the complete first picture.
    pub events: mpsc::Receiver<SourceBatch>,
    /// Becomes `true` when the source holds a complete first picture (Services and
    /// EndpointSlices both listed, and ServiceCIDRs when followed), before it sends the batch that completes it: whoever
    /// receives that batch sees it `true`. Nothing should be programmed before.
    pub synced: watch::Receiver<bool>,
    /// The first picture's Services (with what else had listed by then: the Node,
    /// ServiceCIDRs when followed), sent once they are listed if the EndpointSlices are
    /// not yet, for binding their addresses ahead of the first sync
    /// ([`Proxier::bind_ahead`](proxier_core::Proxier::bind_ahead)). The first batch on
    /// `events` holds them all the same; nothing comes (the sender is dropped) when
    /// everything listed at once. Drop it when they are not wanted: the source then does
    /// not copy them. `None` for a source that reads its picture whole.
    pub services_ahead: Option<oneshot::Receiver<SourceBatch>>,
    /// The source's task; aborting it stops the source.
    pub task: JoinHandle<()>,
}

/// Channel capacity between a source and the daemon.
pub const EVENT_CHANNEL_CAPACITY: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn deletes(names: &[&str]) -> SourceBatch {
        let mut batch = SourceBatch::default();
        for name in names {
            batch.delete_service(ObjectKey {
                namespace: "default".to_owned(),
                name: (*name).to_owned(),
            });
        }
        batch
    }

    fn names(batch: &SourceBatch) -> Vec<String> {
        batch
            .changes
            .iter()
            .map(|change| match change {
                Change::DeleteService(name) => name.name.to_string(),
                other => panic!("unexpected change {other:?}"),
            })
            .collect()
    }

    #[test]
    fn appending_keeps_the_order_whether_or_not_the_batch_held_anything() {
        let mut batch = SourceBatch::default();
        batch.append(deletes(&["a", "b"]));
        assert_eq!(names(&batch), ["a", "b"]);
        batch.append(deletes(&["c"]));
        batch.append(SourceBatch::default());
        batch.append(deletes(&["d", "e"]));
        assert_eq!(names(&batch), ["a", "b", "c", "d", "e"]);
    }
}
