//! Turns Kubernetes Service state into IPVS virtual servers and keeps the kernel converged.
//!
//! The flow is the same whether the state comes from an API server (the `ipvs-proxier`
//! daemon) or from a CNI that knows its Services by other means:
//!
//! 1. [`ClusterState`] holds Services and EndpointSlices ([`model`] types; the `k8s` feature
//!    converts k8s-openapi objects) and reports which Service ports each [`Change`] dirtied.
//! 2. The pure [`planner`] turns it, with the node's facts ([`model::NodeContext`]) and
//!    [`model::Config`], into a [`Desired`] table: virtual servers, real servers, addresses
//!    to bind on the dummy link.
//! 3. The [`Reconciler`] diffs that against what the kernel holds ([`observed`]) and applies
//!    the minimal changes through its backends ([`backend`]: ipvs-netlink and rtnetlink in
//!    production, in-memory for tests), draining removed real servers gracefully ([`drain`]).
//!
//! [`netfilter`], [`sysctl`], [`conntrack`] and [`health_check`] cover the rest of the data
//! plane a Service proxy needs.
//!
//! A CNI that does not read Kubernetes objects can depend on this crate with
//! `default-features = false`: the `k8s` feature (on by default) only adds the k8s-openapi
//! conversions. `examples/src/bin/cni-proxier.rs` in the repository is a complete embedder.
//!
//! ```
//! use std::net::IpAddr;
//! use proxier_core::backend::memory::{MemoryAddressBackend, MemoryIpvsBackend};
//! use proxier_core::desired::Protocol;
//! use proxier_core::model::{
//!     Config, Endpoint, EndpointPort, EndpointSlice, NodeContext, Service, ServiceName,
//!     ServicePortSpec, SliceKey,
//! };
//! use proxier_core::{Change, ClusterState, Reconciler, ReconcilerConfig};
//!
//! # fn ip(s: &str) -> IpAddr { s.parse().expect("address") }
//! let web = ServiceName::new("default", "web");
//! let mut state = ClusterState::new();
//! state.apply(Change::UpsertService(Service::new(
//!     web.clone(),
//!     vec![ip("10.96.0.10")],
//!     vec![ServicePortSpec { name: "http".into(), port: 80, protocol: Protocol::Tcp, node_port: None }],
//! )));
//! state.apply(Change::UpsertSlice(EndpointSlice {
//!     key: SliceKey::new("default", "web-abc"),
//!     service: web,
//!     ports: vec![EndpointPort { name: "http".into(), port: 8080, protocol: Protocol::Tcp }],
//!     endpoints: vec![Endpoint::ready(ip("10.244.1.2")), Endpoint::ready(ip("10.244.2.3"))],
//!     warnings: Vec::new(),
//! }));
//!
//! let node = NodeContext::new("node-a", vec![ip("192.168.0.10")], vec![ip("192.168.0.10")]);
//! let desired = proxier_core::plan(&state, &node, &Config::default());
//!
//! // In production: KernelIpvsBackend and KernelAddressBackend.
//! let ipvs = MemoryIpvsBackend::new();
//! let mut reconciler = Reconciler::new(
//!     ipvs.clone(),
//!     MemoryAddressBackend::new(),
//!     ReconcilerConfig::default(),
//! );
//! let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
//! runtime.block_on(reconciler.full_sync(&desired)).expect("converged");
//! let table = ipvs.table();
//! assert_eq!(table.len(), 1);
//! assert_eq!(table.values().next().map(|vs| vs.real_servers.len()), Some(2));
//! ```

pub mod backend;
pub mod conntrack;
pub mod desired;
pub mod diff;
pub mod drain;
pub mod engine;
pub mod health_check;
#[cfg(feature = "k8s")]
pub mod k8s;
pub mod model;
pub mod netfilter;
pub mod observed;
pub mod planner;
pub mod reconciler;
pub mod state;
pub mod sysctl;
#[doc(hidden)]
pub mod testing;

pub use desired::{
    Desired, RealServer, RealServerKey, ServicePortName, ServicePortPlan, VirtualServer,
    VirtualServerKey, VirtualServerRole,
};
pub use engine::{
    Backends, EngineError, KernelProxier, MemoryProxier, Proxier, ProxierConfig, SyncKind,
};
pub use health_check::{
    HealthCheck, NoLocalEndpoints, health_checks, services_without_local_endpoints,
};
pub use planner::{Planner, plan, plan_service_port};
pub use reconciler::{
    CleanupReport, ReconcileError, ReconcileReport, Reconciler, ReconcilerConfig, ReconcilerStats,
    ServiceSyncError,
};
pub use state::{Change, ClusterState, DirtyPorts};
