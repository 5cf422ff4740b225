//! Health checks of `externalTrafficPolicy: Local` Services.
//!
//! A load balancer in front of such a Service probes `spec.healthCheckNodePort` on every node
//! and sends traffic only to nodes that answer 200, that is nodes with at least one ready
//! endpoint of the Service. This module decides which health checks a node serves and what
//! each one reports; serving them (HTTP) is the embedder's job.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::model::{EndpointSlice, NodeContext, Service, ServiceName, TrafficPolicy};
use crate::state::ClusterState;

/// The health check of one Service on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthCheck {
    /// `spec.healthCheckNodePort`.
    pub node_port: u16,
    /// Ready endpoints of the Service on this node (distinct addresses over all its slices).
    pub local_endpoints: usize,
}

impl HealthCheck {
    /// Whether the check passes (the node has a local endpoint to send traffic to).
    pub fn passes(&self) -> bool {
        self.local_endpoints > 0
    }
}

/// The health checks this node serves: one per Service with `externalTrafficPolicy: Local` and
/// a health-check node port, with its count of ready endpoints on `node` (as kube-proxy
/// counts them: ready, on this node; terminating endpoints do not count).
pub fn health_checks(
    state: &ClusterState,
    node: &NodeContext,
) -> BTreeMap<ServiceName, HealthCheck> {
    state
        .services()
        .filter_map(|service| {
            health_check_of(state, service, node).map(|check| (service.name.clone(), check))
        })
        .collect()
}

/// The health check of one Service, when it needs one (see [`health_checks`]).
pub fn health_check_of(
    state: &ClusterState,
    service: &Service,
    node: &NodeContext,
) -> Option<HealthCheck> {
    local_endpoints_of(service, state.slices_of(&service.name), &node.name).0
}

/// What a Service's ready endpoints say about this node, from one walk over its slices: its
/// health check ([`health_check_of`]) and what it adds to the no-local-endpoint counts
/// ([`no_local_endpoints_of`]).
pub(crate) fn local_endpoints_of<'s>(
    service: &Service,
    slices: impl IntoIterator<Item = &'s EndpointSlice>,
    node_name: &str,
) -> (Option<HealthCheck>, NoLocalEndpoints) {
    let internal = service.internal_traffic_policy == TrafficPolicy::Local;
    let external = service.external_traffic_policy == TrafficPolicy::Local;
    if !internal && !external {
        return (None, NoLocalEndpoints::default());
    }
    let mut has_ready = false;
    let mut local: BTreeSet<IpAddr> = BTreeSet::new();
    let ready = slices
        .into_iter()
        .flat_map(|slice| slice.endpoints.iter())
        .filter(|endpoint| endpoint.ready);
    for endpoint in ready {
        has_ready = true;
        if endpoint.is_local(node_name) {
            local.insert(endpoint.address);
        }
    }
    // As kube-proxy counts them: ready, on this node, each address once; terminating
    // endpoints are not ready.
    let check = service
        .health_check_node_port
        .filter(|_| external)
        .map(|node_port| HealthCheck {
            node_port,
            local_endpoints: local.len(),
        });
    let gaps = if has_ready && local.is_empty() {
        NoLocalEndpoints {
            internal: usize::from(internal),
            external: usize::from(external),
        }
    } else {
        NoLocalEndpoints::default()
    };
    (check, gaps)
}

/// Counts of Services whose Local traffic policy leaves this node with nothing to send to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoLocalEndpoints {
    /// `internalTrafficPolicy: Local` Services with ready endpoints, none on this node.
    pub internal: usize,
    /// `externalTrafficPolicy: Local` Services with ready endpoints, none on this node.
    pub external: usize,
}

impl NoLocalEndpoints {
    /// Adds (`up`) or takes away another count.
    pub fn adjust(&mut self, other: NoLocalEndpoints, up: bool) {
        if up {
            self.internal += other.internal;
            self.external += other.external;
        } else {
            self.internal = self.internal.saturating_sub(other.internal);
            self.external = self.external.saturating_sub(other.external);
        }
    }
}

/// Services with a Local traffic policy whose ready endpoints are all on other nodes: their
/// traffic of that kind is dropped on this node (kube-proxy's
/// `sync_proxy_rules_no_local_endpoints_total`).
pub fn services_without_local_endpoints(
    state: &ClusterState,
    node: &NodeContext,
) -> NoLocalEndpoints {
    let mut out = NoLocalEndpoints::default();
    for service in state.services() {
        out.adjust(no_local_endpoints_of(state, service, node), true);
    }
    out
}

/// What one Service adds to [`services_without_local_endpoints`] (each field 0 or 1).
pub fn no_local_endpoints_of(
    state: &ClusterState,
    service: &Service,
    node: &NodeContext,
) -> NoLocalEndpoints {
    local_endpoints_of(service, state.slices_of(&service.name), &node.name).1
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::desired::Protocol;
    use crate::model::{Endpoint, EndpointPort, EndpointSlice, Service, ServicePortSpec, SliceKey};
    use crate::state::Change;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn lb_service(name: &str, policy: TrafficPolicy, hc_port: Option<u16>) -> Service {
        let mut service = Service::new(
            ServiceName::new("default", name),
            vec![ip("10.96.0.10")],
            vec![ServicePortSpec {
                name: String::new(),
                port: 80,
                protocol: Protocol::Tcp,
                node_port: Some(30080),
            }],
        );
        service.external_traffic_policy = policy;
        service.health_check_node_port = hc_port;
        service
    }

    fn endpoint(addr: &str, node: &str, ready: bool) -> Endpoint {
        let mut endpoint = Endpoint::ready(ip(addr));
        endpoint.node_name = Some(Arc::from(node));
        endpoint.ready = ready;
        endpoint
    }

    fn slice(service: &str, slice: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            key: SliceKey::new("default", slice),
            service: ServiceName::new("default", service),
            ports: vec![EndpointPort {
                name: String::new(),
                port: 8080,
                protocol: Protocol::Tcp,
            }],
            endpoints,
            warnings: Vec::new(),
            trigger_time: None,
        }
    }

    fn node() -> NodeContext {
        NodeContext::new("node-a", vec![ip("192.168.0.1")], vec![ip("192.168.0.1")])
    }

    #[test]
    fn only_local_policy_services_with_a_port_get_a_check() {
        let mut state = ClusterState::new();
        state.apply(Change::UpsertService(lb_service(
            "local",
            TrafficPolicy::Local,
            Some(32000),
        )));
        state.apply(Change::UpsertService(lb_service(
            "cluster",
            TrafficPolicy::Cluster,
            Some(32001),
        )));
        state.apply(Change::UpsertService(lb_service(
            "no-port",
            TrafficPolicy::Local,
            None,
        )));
        let checks = health_checks(&state, &node());
        assert_eq!(
            checks.keys().cloned().collect::<Vec<_>>(),
            vec![ServiceName::new("default", "local")]
        );
        assert_eq!(
            checks[&ServiceName::new("default", "local")].node_port,
            32000
        );
    }

    #[test]
    fn counts_ready_endpoints_on_this_node_once_each() {
        let mut state = ClusterState::new();
        state.apply(Change::UpsertService(lb_service(
            "web",
            TrafficPolicy::Local,
            Some(32000),
        )));
        state.apply(Change::UpsertSlice(slice(
            "web",
            "web-1",
            vec![
                endpoint("10.244.0.2", "node-a", true),
                endpoint("10.244.0.3", "node-a", false),
                endpoint("10.244.1.2", "node-b", true),
            ],
        )));
        // The same endpoint listed in a second slice counts once.
        state.apply(Change::UpsertSlice(slice(
            "web",
            "web-2",
            vec![
                endpoint("10.244.0.2", "node-a", true),
                endpoint("10.244.0.4", "node-a", true),
            ],
        )));
        let check = health_checks(&state, &node())[&ServiceName::new("default", "web")];
        assert_eq!(check.local_endpoints, 2);
        assert!(check.passes());
    }

    #[test]
    fn services_whose_ready_endpoints_are_all_remote_are_counted_per_policy() {
        let mut state = ClusterState::new();
        let mut internal = lb_service("internal", TrafficPolicy::Cluster, None);
        internal.internal_traffic_policy = TrafficPolicy::Local;
        state.apply(Change::UpsertService(internal));
        state.apply(Change::UpsertService(lb_service(
            "external",
            TrafficPolicy::Local,
            None,
        )));
        state.apply(Change::UpsertService(lb_service(
            "served",
            TrafficPolicy::Local,
            None,
        )));
        state.apply(Change::UpsertService(lb_service(
            "empty",
            TrafficPolicy::Local,
            None,
        )));
        state.apply(Change::UpsertService(lb_service(
            "cluster",
            TrafficPolicy::Cluster,
            None,
        )));
        for name in ["internal", "external", "cluster"] {
            state.apply(Change::UpsertSlice(slice(
                name,
                &format!("{name}-1"),
                vec![
                    endpoint("10.244.1.2", "node-b", true),
                    endpoint("10.244.0.9", "node-a", false),
                ],
            )));
        }
        state.apply(Change::UpsertSlice(slice(
            "served",
            "served-1",
            vec![endpoint("10.244.0.2", "node-a", true)],
        )));
        assert_eq!(
            services_without_local_endpoints(&state, &node()),
            NoLocalEndpoints {
                internal: 1,
                external: 1
            }
        );
    }

    #[test]
    fn no_local_endpoint_fails_the_check() {
        let mut state = ClusterState::new();
        state.apply(Change::UpsertService(lb_service(
            "web",
            TrafficPolicy::Local,
            Some(32000),
        )));
        state.apply(Change::UpsertSlice(slice(
            "web",
            "web-1",
            vec![endpoint("10.244.1.2", "node-b", true)],
        )));
        let check = health_checks(&state, &node())[&ServiceName::new("default", "web")];
        assert_eq!(check.local_endpoints, 0);
        assert!(!check.passes());
    }
}
