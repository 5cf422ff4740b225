//! Turns Kubernetes Service state into IPVS virtual servers and keeps the kernel converged.

pub mod desired;

pub use desired::{
    Desired, RealServer, RealServerKey, ServicePortName, ServicePortPlan, VirtualServer,
    VirtualServerKey, VirtualServerRole,
};
