//! Turns Kubernetes Service state into IPVS virtual servers and keeps the kernel converged.

pub mod backend;
pub mod desired;
pub mod diff;
pub mod drain;
pub mod observed;
pub mod reconciler;

pub use desired::{
    Desired, RealServer, RealServerKey, ServicePortName, ServicePortPlan, VirtualServer,
    VirtualServerKey, VirtualServerRole,
};
pub use reconciler::{
    ReconcileError, Reconciler, ReconcilerConfig, ReconcilerStats, ServiceSyncError, SyncReport,
};
