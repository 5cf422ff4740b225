//! proxier-core's [`ClusterState`] and plan, kept in step with the [`ClusterView`] by
//! converting and replanning only the objects that changed since the last sync: a sync costs
//! the size of the change, not of the cluster. Only a change of the node's facts (its
//! addresses or labels) replans every Service port.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use proxier_core::conntrack::{FlowFilter, stale_udp_flows_of_port};
use proxier_core::model::{Config, NodeContext, ServiceName, SliceKey};
use proxier_core::{
    Change, ClusterState, Desired, DirtyPorts, Planner, ServicePortName, ServicePortPlan,
};

use crate::cluster_view::{ClusterView, ViewChanges};
use crate::dry_run::node_context;

/// What one [`TrackedState::update`] changed in the plan.
#[derive(Debug, Default)]
pub struct PlanUpdate {
    /// Service ports whose plan changed (added, removed or different).
    pub changed: DirtyPorts,
    /// The plans these ports had before (`None`: the port had none).
    pub before: BTreeMap<ServicePortName, Option<ServicePortPlan>>,
    /// Whether every port was replanned (first update, or the node's facts changed).
    pub replanned_all: bool,
    /// When the changes of the EndpointSlices in this update were triggered (their
    /// `endpoints.kubernetes.io/last-change-trigger-time`), for the network programming
    /// latency; only changes made after this process started.
    pub trigger_times: Vec<SystemTime>,
}

impl PlanUpdate {
    /// UDP flows to forget: endpoints a changed UDP port no longer sends to.
    pub fn stale_udp_flows(&self, desired: &Desired) -> std::collections::BTreeSet<FlowFilter> {
        self.before
            .iter()
            .flat_map(|(name, old)| {
                stale_udp_flows_of_port(old.as_ref(), desired.services.get(name))
            })
            .collect()
    }
}

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

/// The cluster state, the node's facts and the plan, as of the last update.
#[derive(Debug)]
pub struct TrackedState {
    /// Trigger times before this are from before the process started (kube-proxy ignores
    /// them too: they would measure the downtime, not the programming).
    started: SystemTime,
    hostname: String,
    config: Config,
    state: ClusterState,
    node: Option<NodeContext>,
    desired: Desired,
}

impl TrackedState {
    /// Empty state for the node called `hostname`, planned with `config`.
    pub fn new(hostname: &str, config: Config) -> TrackedState {
        TrackedState {
            started: SystemTime::now(),
            hostname: hostname.to_owned(),
            config,
            state: ClusterState::new(),
            node: None,
            desired: Desired::default(),
        }
    }

    /// The cluster state.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// The node's facts (`None` before the first update).
    pub fn node(&self) -> Option<&NodeContext> {
        self.node.as_ref()
    }

    /// The plan of the current state.
    pub fn desired(&self) -> &Desired {
        &self.desired
    }

    /// The planner configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Applies the objects named in `changes`, as `view` holds them now, and replans the
    /// Service ports they touch. An object the model rejects is logged and its last accepted
    /// version stays in effect: bad input never removes what is programmed.
    pub fn update(&mut self, view: &ClusterView, changes: &ViewChanges) -> PlanUpdate {
        let mut dirty = DirtyPorts::new();
        let trigger_times: Vec<SystemTime> = changes
            .endpoint_slices
            .iter()
            .filter_map(|key| view.endpoint_slices.get(key))
            .filter_map(|slice| trigger_time(slice))
            .filter(|at| *at >= self.started)
            .collect();
        for key in &changes.services {
            let change = match view.services.get(key) {
                Some(service) => match proxier_core::k8s::service_change(service) {
                    Ok(change) => change,
                    Err(error) => {
                        tracing::error!(service = %key, %error, "service rejected; its last accepted version stays");
                        continue;
                    }
                },
                None => Change::DeleteService(ServiceName::new(&key.namespace, &key.name)),
            };
            dirty.extend(self.state.apply(change));
        }
        for key in &changes.endpoint_slices {
            let change = match view.endpoint_slices.get(key) {
                Some(slice) => match proxier_core::k8s::slice_change(slice) {
                    Ok(Some(change)) => change,
                    // An FQDN slice: never proxied.
                    Ok(None) => Change::DeleteSlice(SliceKey::new(&key.namespace, &key.name)),
                    Err(error) => {
                        tracing::error!(slice = %key, %error, "endpoint slice rejected; its last accepted version stays");
                        continue;
                    }
                },
                None => Change::DeleteSlice(SliceKey::new(&key.namespace, &key.name)),
            };
            dirty.extend(self.state.apply(change));
        }

        let node = node_context(view, &self.hostname);
        if self.node.as_ref() != Some(&node) {
            // Every plan may depend on the node's addresses and labels.
            self.node = Some(node);
            let mut update = self.replan_all();
            update.trigger_times = trigger_times;
            return update;
        }
        let Some(node) = &self.node else {
            return PlanUpdate::default();
        };
        let planner = Planner::new(node, &self.config);
        let mut update = PlanUpdate {
            trigger_times,
            ..PlanUpdate::default()
        };
        for (name, plan) in planner.plan_ports(&self.state, &dirty) {
            let old = self.desired.set_plan(&name, plan);
            if old.as_ref() != self.desired.services.get(&name) {
                update.changed.insert(name.clone());
                update.before.insert(name, old);
            }
        }
        update
    }

    fn replan_all(&mut self) -> PlanUpdate {
        let Some(node) = &self.node else {
            return PlanUpdate::default();
        };
        let new = proxier_core::plan(&self.state, node, &self.config);
        let old = std::mem::replace(&mut self.desired, new);
        let mut update = PlanUpdate {
            replanned_all: true,
            ..PlanUpdate::default()
        };
        let names: std::collections::BTreeSet<&ServicePortName> = old
            .services
            .keys()
            .chain(self.desired.services.keys())
            .collect();
        for name in names {
            let before = old.services.get(name);
            if before != self.desired.services.get(name) {
                update.changed.insert(name.clone());
                update.before.insert(name.clone(), before.cloned());
            }
        }
        update
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use super::*;
    use crate::dry_run::cluster_state;
    use crate::source::manifests::parse_manifests;
    use crate::source::{ClusterSnapshot, ObjectKey, SourceEvent};

    const NODE: &str = "node-a";

    fn example() -> ClusterSnapshot {
        let text = include_str!("../../examples/cluster.yaml");
        crate::source::file::snapshot_from_manifests(parse_manifests(text), NODE)
    }

    /// The reference: the whole view converted and planned from scratch.
    fn planned_from_scratch(view: &ClusterView) -> Desired {
        proxier_core::plan(
            &cluster_state(view),
            &node_context(view, NODE),
            &Config::default(),
        )
    }

    /// Ports whose plan differs between two whole plans.
    fn differing_ports(old: &Desired, new: &Desired) -> BTreeSet<ServicePortName> {
        old.services
            .keys()
            .chain(new.services.keys())
            .filter(|name| old.services.get(*name) != new.services.get(*name))
            .cloned()
            .collect()
    }

    /// Applies `event` to the view and the tracker; checks the tracker against the reference.
    fn step(view: &mut ClusterView, tracked: &mut TrackedState, event: SourceEvent) -> PlanUpdate {
        let before = tracked.desired().clone();
        view.apply(&event);
        let changes = view.take_changes();
        let update = tracked.update(view, &changes);
        let reference = planned_from_scratch(view);
        assert_eq!(tracked.desired(), &reference, "after {}", event.describe());
        assert_eq!(
            update.changed,
            differing_ports(&before, &reference),
            "after {}",
            event.describe()
        );
        update
    }

    fn service(snapshot: &ClusterSnapshot, namespace: &str, name: &str) -> Service {
        let key = ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        };
        (*snapshot.services[&key]).clone()
    }

    fn slice_of(snapshot: &ClusterSnapshot, service: &str) -> EndpointSlice {
        snapshot
            .endpoint_slices
            .values()
            .find(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .is_some_and(|n| n == service)
                    && s.endpoints.as_ref().is_some_and(|e| e.len() > 1)
            })
            .map(|s| (**s).clone())
            .expect("a slice with two endpoints or more")
    }

    #[test]
    fn incremental_updates_match_planning_from_scratch() {
        let snapshot = example();
        let mut view = ClusterView::default();
        let mut tracked = TrackedState::new(NODE, Config::default());

        let first = step(
            &mut view,
            &mut tracked,
            SourceEvent::Snapshot(snapshot.clone()),
        );
        assert!(first.replanned_all);
        assert!(!tracked.desired().services.is_empty());

        // An endpoint goes away.
        let mut slice = slice_of(&snapshot, "frontend");
        slice.endpoints.as_mut().expect("endpoints").remove(0);
        let update = step(
            &mut view,
            &mut tracked,
            SourceEvent::SliceUpsert(Arc::new(slice.clone())),
        );
        assert!(!update.replanned_all);
        assert_eq!(update.changed.len(), 1, "{:?}", update.changed);

        // A Service changes its port.
        let mut frontend = service(&snapshot, "shop", "frontend");
        if let Some(port) = frontend
            .spec
            .as_mut()
            .and_then(|s| s.ports.as_mut())
            .and_then(|p| p.first_mut())
        {
            port.port += 1000;
        }
        step(
            &mut view,
            &mut tracked,
            SourceEvent::ServiceUpsert(Arc::new(frontend.clone())),
        );

        // The slice, then the Service, are deleted.
        step(
            &mut view,
            &mut tracked,
            SourceEvent::SliceDelete(Arc::new(slice)),
        );
        let update = step(
            &mut view,
            &mut tracked,
            SourceEvent::ServiceDelete(Arc::new(frontend)),
        );
        assert!(update.changed.iter().all(|p| p.name == "frontend"));

        // The node loses its Node object: every plan is looked at again.
        let update = step(&mut view, &mut tracked, SourceEvent::NodeUpdate(None));
        assert!(update.replanned_all);

        // The original snapshot again (a relist, a file re-read): back to the first plan.
        step(&mut view, &mut tracked, SourceEvent::Snapshot(snapshot));
    }

    #[test]
    fn trigger_times_of_changed_slices_after_start_are_reported() {
        let snapshot = example();
        let mut view = ClusterView::default();
        let mut tracked = TrackedState::new(NODE, Config::default());
        step(
            &mut view,
            &mut tracked,
            SourceEvent::Snapshot(snapshot.clone()),
        );
        let at = |text: &str| {
            let mut slice = slice_of(&snapshot, "frontend");
            slice
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(LAST_CHANGE_TRIGGER_TIME.into(), text.into());
            slice
        };
        // Before the process started: not measured.
        let update = step(
            &mut view,
            &mut tracked,
            SourceEvent::SliceUpsert(Arc::new(at("2020-01-01T00:00:00Z"))),
        );
        assert!(update.trigger_times.is_empty());
        // Now (second precision, as the controller writes it): measured.
        let later = SystemTime::now() + std::time::Duration::from_secs(2);
        let text = jiff::Timestamp::try_from(later)
            .expect("a valid time")
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let mut slice = at(&text);
        slice.endpoints.as_mut().expect("endpoints").remove(0);
        let update = step(
            &mut view,
            &mut tracked,
            SourceEvent::SliceUpsert(Arc::new(slice)),
        );
        assert_eq!(update.trigger_times.len(), 1);
        let measured = update.trigger_times[0];
        assert!(
            measured <= later
                && later.duration_since(measured).expect("after")
                    < std::time::Duration::from_secs(1)
        );
    }

    #[test]
    fn a_repeated_snapshot_changes_nothing() {
        let snapshot = example();
        let mut view = ClusterView::default();
        let mut tracked = TrackedState::new(NODE, Config::default());
        step(
            &mut view,
            &mut tracked,
            SourceEvent::Snapshot(snapshot.clone()),
        );
        assert_eq!(
            view.apply(&SourceEvent::Snapshot(snapshot)),
            crate::cluster_view::Touched::Nothing
        );
        let changes = view.take_changes();
        assert!(changes.is_empty(), "{changes:?}");
        let update = tracked.update(&view, &changes);
        assert!(update.changed.is_empty() && !update.replanned_all);
    }

    #[test]
    fn a_rejected_update_keeps_the_last_accepted_version() {
        let snapshot = example();
        let mut view = ClusterView::default();
        let mut tracked = TrackedState::new(NODE, Config::default());
        step(
            &mut view,
            &mut tracked,
            SourceEvent::Snapshot(snapshot.clone()),
        );
        let before = tracked.desired().clone();
        let mut broken = service(&snapshot, "shop", "cart");
        if let Some(port) = broken
            .spec
            .as_mut()
            .and_then(|s| s.ports.as_mut())
            .and_then(|p| p.first_mut())
        {
            port.protocol = Some("QUIC".into());
        }
        view.apply(&SourceEvent::ServiceUpsert(Arc::new(broken)));
        let changes = view.take_changes();
        let update = tracked.update(&view, &changes);
        assert!(update.changed.is_empty(), "{:?}", update.changed);
        assert_eq!(tracked.desired(), &before);
        assert!(tracked.desired().services.keys().any(|p| p.name == "cart"));
    }
}
