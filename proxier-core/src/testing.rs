//! Synthetic clusters for tests and benchmarks (not a stable API).
//!
//! Service `i` is `ns-{i/100}/svc-{i}` with ClusterIP `10.96.0.0 + i`, one TCP port `http`
//! (80 → 8080) and, for every tenth Service, NodePort `30000 + i % 2768`. Its one EndpointSlice
//! `svc-{i}-0` holds `n` ready endpoints with pod IPs from `10.128.0.0 + i*n + j`, spread over
//! 50 nodes and 3 zones.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::desired::Protocol;
use crate::model::{
    Config, Endpoint, EndpointPort, EndpointSlice, NodeContext, Service, ServiceName,
    ServicePortSpec, SliceKey,
};
use crate::state::{Change, ClusterState};

/// Name of the node the synthetic cluster is planned for.
pub const NODE_NAME: &str = "node-0";

fn v4(base: Ipv4Addr, offset: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(base).wrapping_add(offset)))
}

/// The name of synthetic Service `i`.
pub fn service_name(i: usize) -> ServiceName {
    ServiceName::new(format!("ns-{}", i / 100), format!("svc-{i}"))
}

/// Synthetic Service `i`.
pub fn service(i: usize) -> Service {
    let index = u32::try_from(i).unwrap_or(u32::MAX);
    let node_port = i
        .is_multiple_of(10)
        .then(|| 30_000 + u16::try_from(i % 2768).unwrap_or(0));
    Service::new(
        service_name(i),
        vec![v4(Ipv4Addr::new(10, 96, 0, 0), index)],
        vec![ServicePortSpec {
            name: "http".into(),
            port: 80,
            protocol: Protocol::Tcp,
            node_port,
        }],
    )
}

/// The EndpointSlice of synthetic Service `i` with `n` endpoints. `round` varies the
/// readiness of endpoint 0 (ready on even rounds), so successive rounds are real changes.
pub fn slice(i: usize, n: usize, round: u64) -> EndpointSlice {
    let name = service_name(i);
    let first = u32::try_from(i * n).unwrap_or(u32::MAX);
    let endpoints = (0..n)
        .map(|j| {
            let offset = first.wrapping_add(u32::try_from(j).unwrap_or(0));
            let mut ep = Endpoint::ready(v4(Ipv4Addr::new(10, 128, 0, 0), offset));
            ep.node_name = Some(Arc::from(format!("node-{}", (i + j) % 50)));
            ep.zone = Some(Arc::from(format!("zone-{}", (i + j) % 3)));
            if j == 0 && !round.is_multiple_of(2) {
                ep.ready = false;
            }
            ep
        })
        .collect();
    EndpointSlice {
        key: SliceKey::new(Arc::clone(&name.namespace), format!("{}-0", name.name)),
        service: name,
        ports: vec![EndpointPort {
            name: "http".into(),
            port: 8080,
            protocol: Protocol::Tcp,
        }],
        endpoints,
        warnings: Vec::new(),
        trigger_time: None,
    }
}

/// A state with `services` synthetic Services of `endpoints` endpoints each.
pub fn state(services: usize, endpoints: usize) -> ClusterState {
    let mut state = ClusterState::new();
    for i in 0..services {
        state.apply(Change::UpsertService(service(i)));
        state.apply(Change::UpsertSlice(slice(i, endpoints, 0)));
    }
    state
}

/// The node the synthetic cluster is planned for (one IPv4 address, zone `zone-0`).
pub fn node() -> NodeContext {
    let mut node = NodeContext::new(
        NODE_NAME,
        vec![IpAddr::V4(Ipv4Addr::new(192, 168, 0, 10))],
        vec![IpAddr::V4(Ipv4Addr::new(192, 168, 0, 10))],
    );
    node.zone = Some("zone-0".into());
    node
}

/// The default configuration.
pub fn config() -> Config {
    Config::default()
}
