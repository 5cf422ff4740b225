//! Async client for the Linux kernel's IPVS generic-netlink family.
//!
//! See the README for the three common tasks (listing, programming a table, batching);
//! the crate has no Cargo features and needs a tokio runtime.
//!
//! Covers the whole protocol: services (tuple and fwmark, IPv4 and IPv6), destinations
//! (all forwarding methods, mixed-family tunnels), statistics, timeouts, counters, flush,
//! sync daemons and global info; with typed errors per operation, network-namespace-aware
//! construction, dumps as streams, and a pipelined batch call for bulk changes.
//!
//! ```no_run
//! use std::net::Ipv4Addr;
//! use futures::TryStreamExt;
//! use ipvs_netlink::{Destination, IpvsHandle, Op, Scheduler, Service, ServiceKey};
//!
//! # async fn example() -> Result<(), ipvs_netlink::Error> {
//! let ipvs = IpvsHandle::new().await?;
//! let key = ServiceKey::tcp(Ipv4Addr::new(10, 96, 0, 1).into(), 443);
//! ipvs.add_service(&Service::new(key, Scheduler::RoundRobin)).await?;
//! ipvs.add_destination(&key, &Destination::new(Ipv4Addr::new(10, 244, 1, 7).into(), 8443))
//!     .await?;
//!
//! // Many changes in few round trips, one result per op.
//! let results = ipvs
//!     .batch(vec![Op::AddDestination(
//!         key,
//!         Destination::new(Ipv4Addr::new(10, 244, 2, 9).into(), 8443).with_weight(2),
//!     )])
//!     .await;
//! assert!(results.iter().all(|r| r.is_ok()));
//!
//! let services: Vec<_> = ipvs.services().try_collect().await?;
//! for entry in &services {
//!     println!("{} {}", entry.service.key, entry.service.scheduler);
//! }
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

/// The examples of the crate's README, compiled as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod batch;
pub mod destination;
pub mod error;
pub mod forward;
pub mod handle;
pub mod info;
pub mod listing;
pub mod message;
pub mod netns;
pub mod protocol;
pub mod range;
pub mod scheduler;
pub mod service;
pub mod stats;
pub mod sync_daemon;
mod table;
pub mod timeouts;
pub mod transport;

pub use batch::Op;
pub use destination::{
    Destination, DestinationEntry, DestinationKey, Tunnel, TunnelFlags, TunnelType,
};
pub use error::{Error, Object, Operation, RangeError};
pub use forward::ForwardMethod;
pub use handle::{
    IpvsConnection, IpvsHandle, MAX_TABLE_ATTEMPTS, Table, VerifiedServices, VerifiedTable,
    new_connection, new_connection_in_netns,
};
pub use info::Info;
pub use listing::{ListedDestination, Listing, ListingError};
pub use netns::NetnsTarget;
pub use protocol::Protocol;
pub use scheduler::{Scheduler, SchedulerNameError};
pub use service::{AddressFamily, Netmask, Service, ServiceEntry, ServiceFlags, ServiceKey};
pub use stats::Stats;
pub use sync_daemon::{SyncDaemon, SyncState};
pub use timeouts::Timeouts;
