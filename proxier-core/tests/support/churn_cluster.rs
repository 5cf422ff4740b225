//! The synthetic cluster of the memory tests: Service `i` is `churn/{name}` with ClusterIP
//! `10.96.0.0 + i` and one TCP port `http` (80 → 8080); its one EndpointSlice `{name}-abc`
//! holds `ENDPOINTS` ready endpoints from `10.128.0.0 + first_pod`, with no node name (as an
//! embedder that does not track placement sends them). Shared by the test binaries that
//! measure heap sizes (`#[path]`-included).

use std::net::{IpAddr, Ipv4Addr};

use proxier_core::conntrack::{ConntrackBackend, ConntrackError, FlowFilter};
use proxier_core::model::{Endpoint, EndpointPort, EndpointSlice, Protocol};
use proxier_core::model::{Service, ServiceName, ServicePortSpec, SliceKey};
use proxier_core::netfilter::{NetfilterBackend, NetfilterError};

/// Endpoints per Service.
pub const ENDPOINTS: u32 = 5;

/// ClusterIP of Service `i`.
pub fn cluster_ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i))
}

/// Pod address number `n`.
pub fn pod_ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + n))
}

/// Service `churn/{name}` on ClusterIP number `i`.
pub fn service(name: &str, i: u32) -> Service {
    let port = ServicePortSpec {
        name: "http".into(),
        port: 80,
        protocol: Protocol::Tcp,
        node_port: None,
    };
    Service::new(
        ServiceName::new("churn", name),
        vec![cluster_ip(i)],
        vec![port],
    )
}

/// The EndpointSlice of Service `churn/{name}`, its endpoints from pod number `first_pod`.
pub fn slice(name: &str, first_pod: u32) -> EndpointSlice {
    EndpointSlice {
        key: SliceKey::new("churn", format!("{name}-abc")),
        service: ServiceName::new("churn", name),
        ports: vec![EndpointPort {
            name: "http".into(),
            port: 8080,
            protocol: Protocol::Tcp,
        }],
        endpoints: (0..ENDPOINTS)
            .map(|e| Endpoint::ready(pod_ip(first_pod + e)))
            .collect(),
        warnings: Vec::new(),
        trigger_time: None,
    }
}

/// nftables that accepts every script and keeps none of them (the in-memory backend keeps
/// them all, for tests that read them, which would count against the engine).
pub struct Accepting;

impl NetfilterBackend for Accepting {
    async fn apply(&mut self, _script: &str) -> Result<(), NetfilterError> {
        Ok(())
    }
}

/// A conntrack table with no entries.
pub struct Empty;

impl ConntrackBackend for Empty {
    fn delete_flows(&mut self, _filters: &[FlowFilter]) -> Result<usize, ConntrackError> {
        Ok(0)
    }
}
