//! Endpoints, grouped in EndpointSlices as the API server publishes them.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use super::error::ModelWarning;
use super::service::ServiceName;
use ipvs_netlink::Protocol;

/// Namespace and name of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceKey {
    /// Namespace (shared, as [`ServiceName`]'s).
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
}

impl SliceKey {
    /// A slice key.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        SliceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for SliceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A port of an EndpointSlice: which Service port it serves and the endpoints' port number.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointPort {
    /// Name of the Service port it serves (empty for unnamed ports).
    pub name: String,
    /// Port number on the endpoints.
    pub port: u16,
    /// Transport protocol.
    pub protocol: Protocol,
}

/// One endpoint (a Pod, usually).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Address (the first of the endpoint's addresses, as kube-proxy uses).
    pub address: IpAddr,
    /// Ready to receive traffic.
    pub ready: bool,
    /// Serving (ready, whether or not it is terminating).
    pub serving: bool,
    /// Terminating.
    pub terminating: bool,
    /// Node hosting it.
    pub node_name: Option<Arc<str>>,
    /// Zone it is in.
    pub zone: Option<Arc<str>>,
    /// Zones it is hinted for (topology-aware routing).
    pub zone_hints: Box<[Arc<str>]>,
    /// Nodes it is hinted for (PreferSameNode traffic distribution).
    pub node_hints: Box<[Arc<str>]>,
    /// IPVS weight from [`super::WEIGHTS_ANNOTATION`]; `None` = 1.
    pub weight: Option<u32>,
}

impl Endpoint {
    /// A ready, serving, non-terminating endpoint with no node, zone, hints or weight.
    pub fn ready(address: IpAddr) -> Self {
        Endpoint {
            address,
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            zone: None,
            zone_hints: Box::default(),
            node_hints: Box::default(),
            weight: None,
        }
    }

    /// Whether the endpoint runs on the node called `node_name`.
    pub fn is_local(&self, node_name: &str) -> bool {
        self.node_name.as_deref() == Some(node_name)
    }
}

/// An EndpointSlice: endpoints of one Service, sharing one list of ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSlice {
    /// Namespace and name of the slice.
    pub key: SliceKey,
    /// The Service it belongs to (label `kubernetes.io/service-name`).
    pub service: ServiceName,
    /// Ports.
    pub ports: Vec<EndpointPort>,
    /// Endpoints.
    pub endpoints: Vec<Endpoint>,
    /// Things ignored while reading the object (it is still used).
    pub warnings: Vec<ModelWarning>,
    /// When the change this slice reflects was made (the EndpointSlice controller's
    /// `endpoints.kubernetes.io/last-change-trigger-time`): the engine measures the network
    /// programming latency from it, and does not keep it once the slice is applied.
    pub trigger_time: Option<SystemTime>,
}

impl EndpointSlice {
    /// The port of this slice serving a Service port.
    pub fn port_for(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| p.name == name && p.protocol == protocol)
            .map(|p| p.port)
    }
}
