//! Sources of cluster objects: the Kubernetes API server ([`kube`]) or a YAML file
//! ([`file`]). Both produce the same [`SourceEvent`]s on a channel and raise the same
//! "synced" signal once they hold a complete picture.

pub mod file;
pub mod kube;
pub mod manifests;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Label of Services (and their slices) that another proxy handles; kube-proxy ignores them.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label the EndpointSlice controller sets on objects of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label of an EndpointSlice naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// kube-proxy's label selector for Services and EndpointSlices (both informers use it).
pub const PROXIED_OBJECTS_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// Whether an object passes [`PROXIED_OBJECTS_SELECTOR`]: the same filter kube-proxy asks the
/// API server for, applied locally where there is no server (the file source).
pub fn is_proxied(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_none_or(|labels| {
        !labels.contains_key(LABEL_SERVICE_PROXY_NAME) && !labels.contains_key(LABEL_HEADLESS)
    })
}

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

/// A complete picture of what a source knows.
#[derive(Debug, Clone, Default)]
pub struct ClusterSnapshot {
    /// Services, by namespace/name.
    pub services: BTreeMap<ObjectKey, Arc<Service>>,
    /// EndpointSlices, by namespace/name.
    pub endpoint_slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    /// This node, when known.
    pub node: Option<Arc<Node>>,
}

/// What a source reports. After a [`SourceEvent::Snapshot`], the other variants are
/// incremental changes against it; a later `Snapshot` replaces everything.
#[derive(Debug, Clone)]
pub enum SourceEvent {
    /// Everything the source knows; replaces any earlier state.
    Snapshot(ClusterSnapshot),
    /// A Service was added or changed.
    ServiceUpsert(Arc<Service>),
    /// A Service was deleted (its last known state).
    ServiceDelete(Arc<Service>),
    /// An EndpointSlice was added or changed.
    SliceUpsert(Arc<EndpointSlice>),
    /// An EndpointSlice was deleted (its last known state, whose
    /// `kubernetes.io/service-name` label names its Service).
    SliceDelete(Arc<EndpointSlice>),
    /// This node changed; `None` when it was deleted.
    NodeUpdate(Option<Arc<Node>>),
}

impl SourceEvent {
    /// A short description for logs: kind of change and object.
    pub fn describe(&self) -> String {
        match self {
            SourceEvent::Snapshot(s) => format!(
                "snapshot ({} services, {} endpoint slices, node {})",
                s.services.len(),
                s.endpoint_slices.len(),
                if s.node.is_some() { "known" } else { "unknown" }
            ),
            SourceEvent::ServiceUpsert(s) => {
                format!("service upsert {}", ObjectKey::of(&s.metadata))
            }
            SourceEvent::ServiceDelete(s) => {
                format!("service delete {}", ObjectKey::of(&s.metadata))
            }
            SourceEvent::SliceUpsert(s) => format!("slice upsert {}", ObjectKey::of(&s.metadata)),
            SourceEvent::SliceDelete(s) => format!("slice delete {}", ObjectKey::of(&s.metadata)),
            SourceEvent::NodeUpdate(Some(n)) => {
                format!("node update {}", ObjectKey::of(&n.metadata))
            }
            SourceEvent::NodeUpdate(None) => "node deleted".to_owned(),
        }
    }
}

/// A running source: its events, its synced signal and its task.
#[derive(Debug)]
pub struct SourceHandle {
    /// Events, in order.
    pub events: mpsc::Receiver<SourceEvent>,
    /// Becomes `true` once the source has delivered a complete first picture (Services and
    /// EndpointSlices both listed). Nothing should be programmed before.
    pub synced: watch::Receiver<bool>,
    /// The source's task; aborting it stops the source.
    pub task: JoinHandle<()>,
}

/// Channel capacity between a source and the daemon.
pub const EVENT_CHANNEL_CAPACITY: usize = 1024;
