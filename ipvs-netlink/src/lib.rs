//! Async client for the Linux kernel's IPVS generic-netlink family.

pub mod forward;
pub mod protocol;
pub mod scheduler;

pub use forward::ForwardMethod;
pub use protocol::Protocol;
pub use scheduler::{Scheduler, SchedulerNameError};
