//! Turns Kubernetes Service state into IPVS virtual servers and keeps the kernel converged.
//!
//! The [`Proxier`] ([`engine`]) owns everything between "something changed" and "the kernel
//! matches", whether the changes come from an API server (the `ipvs-proxier` daemon) or from
//! a CNI that knows its Services by other means:
//!
//! 1. Feed it [`Change`]s: Services, EndpointSlices and the node's facts in this crate's
//!    [`model`] (the `k8s` feature converts k8s-openapi objects, see `k8s`).
//! 2. [`Proxier::sync`] re-plans only the Service ports the changes touched ([`planner`],
//!    pure), converges IPVS and the dummy link ([`Reconciler`], with drains and retries),
//!    updates only the changed nftables set elements ([`netfilter`]), forgets stale UDP
//!    flows ([`flows`] decides which, [`conntrack`] deletes them) and decides the health
//!    checks ([`health_check`]).
//! 3. Or hand it to the [`engine::driver`], which syncs as kube-proxy does (min/max sync
//!    period, burst, full resyncs, drains and retries when due).
//!
//! Backends are traits ([`backend`]): the kernel ones (ipvs-netlink, rtnetlink, `nft`,
//! ctnetlink) or in-memory ones for tests and dry runs. A CNI that does not read Kubernetes
//! objects can depend on this crate with `default-features = false`.
//!
//! ```
//! use proxier_core::model::{Config, Endpoint, EndpointPort, EndpointSlice, Protocol};
//! use proxier_core::model::{Service, ServiceName, ServicePortSpec, SliceKey};
//! use proxier_core::{Backends, Change, Proxier, ProxierConfig, SyncKind};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let backends = Backends::in_memory(); // in production: Backends::kernel("kube-ipvs0")
//! let ipvs = backends.ipvs.clone();
//! let mut proxier = Proxier::new(ProxierConfig::new("node-a", Config::default()), backends)?;
//!
//! let web = ServiceName::new("default", "web");
//! let port = ServicePortSpec { name: "http".into(), port: 80, protocol: Protocol::Tcp, node_port: None };
//! proxier.apply(Change::UpsertService(Service::new(web.clone(), vec!["10.96.0.10".parse()?], vec![port])));
//! let mut slice = EndpointSlice {
//!     key: SliceKey::new("default", "web-abc"),
//!     service: web,
//!     ports: vec![EndpointPort { name: "http".into(), port: 8080, protocol: Protocol::Tcp }],
//!     endpoints: vec![Endpoint::ready("10.244.1.2".parse()?), Endpoint::ready("10.244.2.3".parse()?)],
//!     warnings: Vec::new(),
//!     trigger_time: None,
//! };
//! proxier.apply(Change::UpsertSlice(slice.clone()));
//! let first = proxier.sync(SyncKind::Full).await?; // reads the kernel, adopts, programs
//! assert_eq!(first.ipvs.writes, 4); // virtual server, two real servers, the VIP
//!
//! slice.endpoints.pop(); // one endpoint goes away
//! proxier.apply(Change::UpsertSlice(slice));
//! let second = proxier.sync(SyncKind::Incremental).await?; // only that Service port
//! assert_eq!((second.changed_ports, second.ipvs.deletes), (1, 1));
//! assert_eq!(ipvs.table().values().next().map(|vs| vs.real_servers.len()), Some(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

/// The examples of the crate's README, compiled as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod backend;
pub mod conntrack;
pub mod desired;
pub mod diff;
pub mod drain;
pub mod engine;
pub mod explain;
pub mod flows;
pub mod health_check;
#[cfg(feature = "k8s")]
pub mod k8s;
pub mod kernel_modules;
pub mod model;
pub mod netfilter;
mod netlink_message;
pub mod observed;
pub mod planner;
pub mod priority;
pub mod reconciler;
pub mod sorted_map;
pub mod state;
pub mod sysctl;
pub mod takeover;
#[doc(hidden)]
pub mod testing;
pub mod view;

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
pub use planner::{Planner, ServicePlan, plan, plan_service_port};
pub use reconciler::{
    CleanupReport, ReconcileError, ReconcileReport, ReconcileTimings, Reconciler, ReconcilerConfig,
    ReconcilerStats, ServiceSyncError,
};
pub use state::{Change, ClusterState, DirtyPorts};
