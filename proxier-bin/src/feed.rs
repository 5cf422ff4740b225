//! Turns what a source reports (k8s-openapi objects) into the engine's changes, with
//! proxier-core's `k8s` conversions. An object the conversion rejects is logged and left
//! out: the engine keeps its last accepted version, so bad input never removes what is
//! programmed.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use proxier_core::Change;
use proxier_core::k8s;
use proxier_core::model::{ServiceName, SliceKey};

use crate::source::{ClusterSnapshot, ObjectKey, SourceEvent};

/// Annotation the EndpointSlice controller sets to the time of the change (a Pod or Service
/// update) that the slice reflects.
pub const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The trigger time of a slice, when it carries a valid one.
pub fn trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    let text = slice
        .metadata
        .annotations
        .as_ref()?
        .get(LAST_CHANGE_TRIGGER_TIME)?;
    let at: jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(at))
}

/// The engine's changes for one source event, and the trigger times of the EndpointSlices
/// in it.
#[derive(Debug, Default)]
pub struct Converted {
    /// Changes, in order.
    pub changes: Vec<Change>,
    /// `endpoints.kubernetes.io/last-change-trigger-time` of the slices.
    pub trigger_times: Vec<SystemTime>,
}

/// Converts one source event. A snapshot becomes upserts of everything it holds (sources
/// send one first, then changes).
pub fn convert(event: &SourceEvent) -> Converted {
    let mut out = Converted::default();
    match event {
        SourceEvent::Snapshot(ClusterSnapshot {
            services,
            endpoint_slices,
            node,
        }) => {
            out.changes.push(node_change(node.as_deref()));
            for service in services.values() {
                out.service(service);
            }
            for slice in endpoint_slices.values() {
                out.slice(slice);
            }
        }
        SourceEvent::ServiceUpsert(service) => out.service(service),
        SourceEvent::ServiceDelete(service) => {
            let key = ObjectKey::of(&service.metadata);
            out.changes.push(Change::DeleteService(ServiceName::new(
                key.namespace,
                key.name,
            )));
        }
        SourceEvent::SliceUpsert(slice) => out.slice(slice),
        SourceEvent::SliceDelete(slice) => {
            let key = ObjectKey::of(&slice.metadata);
            out.changes
                .push(Change::DeleteSlice(SliceKey::new(key.namespace, key.name)));
        }
        SourceEvent::NodeUpdate(node) => out.changes.push(node_change(node.as_deref())),
    }
    out
}

impl Converted {
    fn service(&mut self, service: &Service) {
        match k8s::service_change(service) {
            Ok(change) => self.changes.push(change),
            Err(error) => tracing::error!(
                service = %ObjectKey::of(&service.metadata), %error,
                "service rejected; its last accepted version stays"
            ),
        }
    }

    fn slice(&mut self, slice: &EndpointSlice) {
        let key = ObjectKey::of(&slice.metadata);
        match k8s::slice_change(slice) {
            Ok(Some(change)) => {
                self.changes.push(change);
                self.trigger_times.extend(trigger_time(slice));
            }
            // An FQDN slice: never proxied.
            Ok(None) => self
                .changes
                .push(Change::DeleteSlice(SliceKey::new(key.namespace, key.name))),
            Err(error) => tracing::error!(
                slice = %key, %error,
                "endpoint slice rejected; its last accepted version stays"
            ),
        }
    }
}

/// The change for this node's Node object (`None`: none known).
fn node_change(node: Option<&Node>) -> Change {
    match node.map(k8s::node_context) {
        Some(Ok(node)) => Change::UpsertNode(node),
        Some(Err(error)) => {
            tracing::error!(%error, "node object rejected; planning without its addresses");
            Change::DeleteNode
        }
        None => Change::DeleteNode,
    }
}
