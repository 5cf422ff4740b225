//! Turns Kubernetes Service state into IPVS virtual servers and keeps the kernel converged.

pub mod backend;
pub mod conntrack;
pub mod desired;
pub mod diff;
pub mod drain;
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
pub use planner::{Planner, plan, plan_service_port};
pub use reconciler::{
    ReconcileError, Reconciler, ReconcilerConfig, ReconcilerStats, ServiceSyncError, SyncReport,
};
pub use state::{Change, ClusterState, DirtyPorts};
