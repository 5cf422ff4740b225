//! The objects a source has delivered so far, kept as the source sent them (k8s-openapi
//! types). It only mirrors [`SourceEvent`]s; it decides nothing. Used by the dry run and for
//! counting pending changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::source::{ClusterSnapshot, ObjectKey, SourceEvent};

/// What kind of object an event touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    /// The source's first snapshot filled the view.
    Everything,
    /// A later snapshot changed nothing.
    Nothing,
    /// A Service.
    Service,
    /// An EndpointSlice.
    EndpointSlice,
    /// The Node.
    Node,
}

/// Object counts of a [`ClusterView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ViewCounts {
    /// Services.
    pub services: usize,
    /// Service ports over all Services.
    pub service_ports: usize,
    /// EndpointSlices.
    pub endpoint_slices: usize,
    /// Endpoints over all slices.
    pub endpoints: usize,
    /// Whether this node's Node object is known.
    pub node_known: bool,
}

/// Keys of the objects that changed since the consumer last took them
/// ([`ClusterView::take_changes`]): what an incremental sync has to look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewChanges {
    /// Services added, changed or deleted.
    pub services: BTreeSet<ObjectKey>,
    /// EndpointSlices added, changed or deleted.
    pub endpoint_slices: BTreeSet<ObjectKey>,
    /// Whether the Node object changed (or appeared, or went away).
    pub node: bool,
}

impl ViewChanges {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.endpoint_slices.is_empty() && !self.node
    }
}

/// The current objects.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// Services by namespace/name.
    pub services: BTreeMap<ObjectKey, Arc<Service>>,
    /// EndpointSlices by namespace/name.
    pub endpoint_slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    /// This node.
    pub node: Option<Arc<Node>>,
    /// Whether a snapshot filled the view.
    filled: bool,
    /// What changed since [`ClusterView::take_changes`] was last called.
    changes: ViewChanges,
}

/// Keys whose object differs between `old` and `new` (added, removed or changed).
fn changed_keys<T: PartialEq>(
    old: &BTreeMap<ObjectKey, Arc<T>>,
    new: &BTreeMap<ObjectKey, Arc<T>>,
) -> BTreeSet<ObjectKey> {
    let same = |a: &Arc<T>, b: &Arc<T>| Arc::ptr_eq(a, b) || **a == **b;
    let mut out: BTreeSet<ObjectKey> = old
        .iter()
        .filter(|(key, a)| !new.get(*key).is_some_and(|b| same(a, b)))
        .map(|(key, _)| key.clone())
        .collect();
    out.extend(
        new.iter()
            .filter(|(key, _)| !old.contains_key(*key))
            .map(|(key, _)| key.clone()),
    );
    out
}

impl ClusterView {
    /// Applies one event; returns what it touched. The source's first snapshot touches
    /// `Everything`; a later one (a file re-read, a relist) touches only what differs.
    pub fn apply(&mut self, event: &SourceEvent) -> Touched {
        match event {
            SourceEvent::Snapshot(ClusterSnapshot {
                services,
                endpoint_slices,
                node,
            }) => {
                let services_changed = changed_keys(&self.services, services);
                let slices_changed = changed_keys(&self.endpoint_slices, endpoint_slices);
                let node_changed = self.node != *node;
                let first = !self.filled;
                let touched = if first {
                    Touched::Everything
                } else if node_changed {
                    Touched::Node
                } else if !services_changed.is_empty() {
                    Touched::Service
                } else if !slices_changed.is_empty() {
                    Touched::EndpointSlice
                } else {
                    Touched::Nothing
                };
                self.changes.services.extend(services_changed);
                self.changes.endpoint_slices.extend(slices_changed);
                self.changes.node |= node_changed || first;
                self.services = services.clone();
                self.endpoint_slices = endpoint_slices.clone();
                self.node = node.clone();
                self.filled = true;
                touched
            }
            SourceEvent::ServiceUpsert(s) => {
                let key = ObjectKey::of(&s.metadata);
                self.changes.services.insert(key.clone());
                self.services.insert(key, Arc::clone(s));
                Touched::Service
            }
            SourceEvent::ServiceDelete(s) => {
                let key = ObjectKey::of(&s.metadata);
                self.services.remove(&key);
                self.changes.services.insert(key);
                Touched::Service
            }
            SourceEvent::SliceUpsert(s) => {
                let key = ObjectKey::of(&s.metadata);
                self.changes.endpoint_slices.insert(key.clone());
                self.endpoint_slices.insert(key, Arc::clone(s));
                Touched::EndpointSlice
            }
            SourceEvent::SliceDelete(s) => {
                let key = ObjectKey::of(&s.metadata);
                self.endpoint_slices.remove(&key);
                self.changes.endpoint_slices.insert(key);
                Touched::EndpointSlice
            }
            SourceEvent::NodeUpdate(n) => {
                self.node = n.clone();
                self.changes.node = true;
                Touched::Node
            }
        }
    }

    /// Returns and forgets the keys changed since the last call.
    pub fn take_changes(&mut self) -> ViewChanges {
        std::mem::take(&mut self.changes)
    }

    /// Counts of what the view holds.
    pub fn counts(&self) -> ViewCounts {
        ViewCounts {
            services: self.services.len(),
            service_ports: self
                .services
                .values()
                .map(|s| {
                    s.spec
                        .as_ref()
                        .and_then(|sp| sp.ports.as_ref())
                        .map_or(0, Vec::len)
                })
                .sum(),
            endpoint_slices: self.endpoint_slices.len(),
            endpoints: self
                .endpoint_slices
                .values()
                .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
                .sum(),
            node_known: self.node.is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::Endpoint;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn mirrors_events_and_counts() {
        let mut view = ClusterView::default();
        let svc = Arc::new(Service {
            metadata: meta("a"),
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort::default(), ServicePort::default()]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        });
        let slice = Arc::new(EndpointSlice {
            metadata: meta("a-1"),
            endpoints: Some(vec![Endpoint::default(); 3]),
            ..EndpointSlice::default()
        });
        assert_eq!(
            view.apply(&SourceEvent::ServiceUpsert(Arc::clone(&svc))),
            Touched::Service
        );
        assert_eq!(
            view.apply(&SourceEvent::SliceUpsert(Arc::clone(&slice))),
            Touched::EndpointSlice
        );
        assert_eq!(
            view.counts(),
            ViewCounts {
                services: 1,
                service_ports: 2,
                endpoint_slices: 1,
                endpoints: 3,
                node_known: false
            }
        );
        view.apply(&SourceEvent::SliceDelete(slice));
        assert_eq!(view.counts().endpoints, 0);
        assert_eq!(
            view.apply(&SourceEvent::Snapshot(ClusterSnapshot::default())),
            Touched::Everything
        );
        assert_eq!(view.counts(), ViewCounts::default());
    }
}
