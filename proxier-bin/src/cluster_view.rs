//! The objects a source has delivered so far, kept as the source sent them (k8s-openapi
//! types). It only mirrors [`SourceEvent`]s; it decides nothing. Used by the dry run and for
//! counting pending changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::source::{ClusterSnapshot, ObjectKey, SourceEvent};

/// What kind of object an event touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched {
    /// A full snapshot replaced everything.
    Everything,
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

/// The current objects.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// Services by namespace/name.
    pub services: BTreeMap<ObjectKey, Arc<Service>>,
    /// EndpointSlices by namespace/name.
    pub endpoint_slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    /// This node.
    pub node: Option<Arc<Node>>,
}

impl ClusterView {
    /// Applies one event; returns what it touched.
    pub fn apply(&mut self, event: &SourceEvent) -> Touched {
        match event {
            SourceEvent::Snapshot(ClusterSnapshot {
                services,
                endpoint_slices,
                node,
            }) => {
                self.services = services.clone();
                self.endpoint_slices = endpoint_slices.clone();
                self.node = node.clone();
                Touched::Everything
            }
            SourceEvent::ServiceUpsert(s) => {
                self.services
                    .insert(ObjectKey::of(&s.metadata), Arc::clone(s));
                Touched::Service
            }
            SourceEvent::ServiceDelete(s) => {
                self.services.remove(&ObjectKey::of(&s.metadata));
                Touched::Service
            }
            SourceEvent::SliceUpsert(s) => {
                self.endpoint_slices
                    .insert(ObjectKey::of(&s.metadata), Arc::clone(s));
                Touched::EndpointSlice
            }
            SourceEvent::SliceDelete(s) => {
                self.endpoint_slices.remove(&ObjectKey::of(&s.metadata));
                Touched::EndpointSlice
            }
            SourceEvent::NodeUpdate(n) => {
                self.node = n.clone();
                Touched::Node
            }
        }
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
