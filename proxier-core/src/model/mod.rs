//! The proxier's own view of Services, endpoints, the node and its configuration.
//!
//! These types carry no Kubernetes client types, so an embedder (a CNI, a test, a YAML
//! file source) can build them directly; [`crate::k8s`] converts k8s-openapi objects into them.
//!
//! # Annotations understood beyond kube-proxy
//!
//! - [`SCHEDULER_ANNOTATION`] (`ipvs.proxier.io/scheduler`) on a Service picks the IPVS
//!   scheduler for every virtual server of that Service, e.g. `mh` or `wlc`. Only the
//!   schedulers the kernel ships (`rr wrr lc wlc lblc lblcr dh sh sed nq mh fo ovf`) are
//!   accepted; any other value is ignored with a [`ModelWarning`] and the configured default
//!   scheduler is used.
//! - [`WEIGHTS_ANNOTATION`] (`ipvs.proxier.io/weights`) on an EndpointSlice gives IPVS
//!   weights to its endpoints, as a comma-separated list of `address=weight`
//!   (`10.1.0.5=3,10.1.0.6=1`, IPv6 addresses bare: `fd00::5=2`). Weights are 1..=65535;
//!   endpoints not listed, and malformed entries (reported as [`ModelWarning`]s), get weight 1.

pub mod config;
pub mod endpoint;
pub mod error;
pub mod family;
pub mod node;
pub mod service;
pub mod service_cidr;

pub use config::{Config, ConfigError, IpvsTimeouts, NodePortAddresses};
pub use endpoint::{Endpoint, EndpointPort, EndpointSlice, SliceKey};
pub use error::{ConversionError, ModelWarning, ObjectKind, ObjectRef};
pub use family::AddressFamily;
pub use ipvs_netlink::{Protocol, Scheduler};
pub use node::NodeContext;
pub use service::{
    DEFAULT_CLIENT_IP_TIMEOUT_SECONDS, FamilyAddresses, IpMode, LoadBalancerIngress, Service,
    ServiceName, ServicePortName, ServicePortSpec, SessionAffinity, TrafficPolicy,
};
pub use service_cidr::{
    RefusedRoute, RouteDecision, RouteOrigin, RouteRefusal, ServiceCidr, check_route, decide_routes,
};

/// Service annotation choosing the IPVS scheduler of that Service (see the module docs).
pub const SCHEDULER_ANNOTATION: &str = "ipvs.proxier.io/scheduler";

/// EndpointSlice annotation giving per-endpoint IPVS weights (see the module docs).
pub const WEIGHTS_ANNOTATION: &str = "ipvs.proxier.io/weights";

/// Highest weight accepted from [`WEIGHTS_ANNOTATION`].
pub const MAX_WEIGHT: u32 = 65_535;
