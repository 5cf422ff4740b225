//! Typed errors: what failed, on which object, and why.

use std::fmt;
use std::io;
use std::ops::RangeInclusive;

pub use crate::range::RangeError;

use crate::destination::DestinationKey;
use crate::message::{EncodeError, WireError};
use crate::service::ServiceKey;
use crate::sync_daemon::SyncState;

/// The operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Opening the netlink socket and resolving the IPVS family.
    Connect,
    /// `GET_INFO`.
    Info,
    /// Listing services.
    ListServices,
    /// Reading one service.
    GetService,
    /// Adding a service.
    AddService,
    /// Changing a service.
    UpdateService,
    /// Deleting a service.
    DeleteService,
    /// Listing a service's destinations.
    ListDestinations,
    /// Adding a destination.
    AddDestination,
    /// Changing a destination.
    UpdateDestination,
    /// Deleting a destination.
    DeleteDestination,
    /// Reading timeouts.
    GetTimeouts,
    /// Setting timeouts.
    SetTimeouts,
    /// Zeroing counters.
    Zero,
    /// Flushing the table.
    Flush,
    /// Starting a sync daemon.
    StartSyncDaemon,
    /// Stopping a sync daemon.
    StopSyncDaemon,
    /// Listing sync daemons.
    ListSyncDaemons,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Connect => "connect to IPVS",
            Operation::Info => "get IPVS info",
            Operation::ListServices => "list services",
            Operation::GetService => "get service",
            Operation::AddService => "add service",
            Operation::UpdateService => "update service",
            Operation::DeleteService => "delete service",
            Operation::ListDestinations => "list destinations",
            Operation::AddDestination => "add destination",
            Operation::UpdateDestination => "update destination",
            Operation::DeleteDestination => "delete destination",
            Operation::GetTimeouts => "get timeouts",
            Operation::SetTimeouts => "set timeouts",
            Operation::Zero => "zero counters",
            Operation::Flush => "flush",
            Operation::StartSyncDaemon => "start sync daemon",
            Operation::StopSyncDaemon => "stop sync daemon",
            Operation::ListSyncDaemons => "list sync daemons",
        })
    }
}

/// The object an operation was about, for error messages and errno mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Object {
    /// The whole IPVS table / global settings.
    Table,
    /// A service, by key.
    Service(ServiceKey),
    /// A service being added or changed, with the modules it names.
    ServiceConfig {
        /// The service.
        key: ServiceKey,
        /// Scheduler name.
        scheduler: String,
        /// Persistence engine name, if any.
        pe: Option<String>,
    },
    /// A destination of a service.
    Destination(ServiceKey, DestinationKey),
    /// A sync daemon.
    SyncDaemon(SyncState),
    /// A sync daemon being started, with the interface it names.
    SyncDaemonConfig {
        /// Master or backup.
        state: SyncState,
        /// The multicast interface.
        interface: String,
    },
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Object::Table => f.write_str("IPVS table"),
            Object::Service(key) | Object::ServiceConfig { key, .. } => write!(f, "service {key}"),
            Object::Destination(svc, dest) => write!(f, "destination {dest} of service {svc}"),
            Object::SyncDaemon(state) => write!(f, "{state:?} sync daemon"),
            Object::SyncDaemonConfig { state, interface } => {
                write!(f, "{state:?} sync daemon on {interface}")
            }
        }
    }
}

/// Everything an IPVS operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The service already exists (`EEXIST`).
    #[error("{op}: service {service} already exists")]
    ServiceExists {
        /// Operation.
        op: Operation,
        /// Service.
        service: ServiceKey,
    },
    /// The service does not exist (`ESRCH`).
    #[error("{op}: service {service} not found")]
    ServiceNotFound {
        /// Operation.
        op: Operation,
        /// Service.
        service: ServiceKey,
    },
    /// The destination already exists (`EEXIST`).
    #[error("{op}: destination {destination} of service {service} already exists")]
    DestinationExists {
        /// Operation.
        op: Operation,
        /// Service.
        service: ServiceKey,
        /// Destination.
        destination: DestinationKey,
    },
    /// The destination does not exist (`ENOENT`).
    #[error("{op}: destination {destination} of service {service} not found")]
    DestinationNotFound {
        /// Operation.
        op: Operation,
        /// Service.
        service: ServiceKey,
        /// Destination.
        destination: DestinationKey,
    },
    /// The kernel has no module for the scheduler or the persistence engine the service
    /// names (`ENOENT`; the kernel does not say which of the two).
    #[error("{op}: service {service}: scheduler {scheduler:?}{} not found", pe.as_ref().map(|p| format!(" or persistence engine {p:?}")).unwrap_or_default())]
    SchedulerNotFound {
        /// Operation.
        op: Operation,
        /// Service.
        service: ServiceKey,
        /// Scheduler name that was asked for.
        scheduler: String,
        /// Persistence engine name that was asked for, if any.
        pe: Option<String>,
    },
    /// A sync daemon of that state is already running (`EEXIST`).
    #[error("{op}: {state:?} sync daemon already running")]
    SyncDaemonExists {
        /// Operation.
        op: Operation,
        /// Master or backup.
        state: SyncState,
    },
    /// No sync daemon of that state is running (`ESRCH`).
    #[error("{op}: no {state:?} sync daemon running")]
    SyncDaemonNotFound {
        /// Operation.
        op: Operation,
        /// Master or backup.
        state: SyncState,
    },
    /// Missing `CAP_NET_ADMIN` (`EPERM`/`EACCES`).
    #[error("{op}: permission denied (CAP_NET_ADMIN is required)")]
    PermissionDenied {
        /// Operation.
        op: Operation,
    },
    /// The kernel has no IPVS (module not loaded or not built).
    #[error("IPVS is not available in this kernel: {reason}")]
    IpvsUnavailable {
        /// What was observed.
        reason: String,
    },
    /// A field of the request holds something the kernel refuses (a name too long, fwmark
    /// 0, a netmask of the other family, ...); refused by this library before anything was
    /// sent. Numeric fields outside their range are [`Error::OutOfRange`].
    #[error("{op}: {object}: invalid {field}: {reason}")]
    InvalidField {
        /// Operation.
        op: Operation,
        /// The object.
        object: Object,
        /// The field, e.g. `"scheduler name"`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A numeric field lies outside the range the kernel can hold; refused by this library
    /// before anything was sent (the kernel would refuse it or silently store another value).
    #[error("{op}: {object}: {field} {value} is outside the range the kernel accepts ({}..={})", range.start(), range.end())]
    OutOfRange {
        /// Operation.
        op: Operation,
        /// The object.
        object: Object,
        /// The field, e.g. `"persistence timeout"`.
        field: &'static str,
        /// The value that was given.
        value: u64,
        /// The values the kernel accepts.
        range: RangeInclusive<u64>,
    },
    /// The kernel refused the request as invalid: `EINVAL` (e.g. a destination of another
    /// family without tunnelling, a masquerading destination without a route),
    /// `ERANGE` (a lower threshold above the upper one) or `EAFNOSUPPORT` (a family this
    /// kernel's IPVS was built without).
    #[error("{op} on {object}: refused by the kernel as invalid ({})", io::Error::from_raw_os_error(*errno))]
    InvalidArgument {
        /// Operation.
        op: Operation,
        /// The object.
        object: Object,
        /// The errno (positive): `EINVAL`, `ERANGE` or `EAFNOSUPPORT`.
        errno: i32,
    },
    /// The network interface a sync daemon was to use does not exist (`ENODEV`).
    #[error("{op}: {state:?} sync daemon: no interface named {interface:?}")]
    InterfaceNotFound {
        /// Operation.
        op: Operation,
        /// Master or backup.
        state: SyncState,
        /// The interface name that was given.
        interface: String,
    },
    /// No dump agreed with the earlier ones: IPVS kept changing in this or another network
    /// namespace while it was read (see [`IpvsHandle::table_verified`](crate::IpvsHandle::table_verified)).
    #[error(
        "{op}: {attempts} dumps in a row all differed (IPVS changing in this or another network namespace)"
    )]
    DumpUnstable {
        /// Operation.
        op: Operation,
        /// How many dumps were made.
        attempts: u32,
    },
    /// Any other errno from the kernel.
    #[error("{op} on {object}: kernel error {errno} ({})", io::Error::from_raw_os_error(*errno))]
    Kernel {
        /// Operation.
        op: Operation,
        /// The object.
        object: Object,
        /// Positive errno.
        errno: i32,
    },
    /// The kernel sent something this library could not decode.
    #[error("{op}: {source}")]
    Decode {
        /// Operation.
        op: Operation,
        /// The decoding problem.
        source: WireError,
    },
    /// Socket I/O failed.
    #[error("{op}: netlink socket I/O failed: {source}")]
    Io {
        /// Operation.
        op: Operation,
        /// The I/O error.
        source: io::Error,
    },
}

impl Error {
    /// Maps a kernel errno (positive) for `op` on `object` to a typed error.
    pub fn from_errno(op: Operation, object: &Object, errno: i32) -> Error {
        use Operation as O;
        match (errno, object) {
            (libc::EPERM | libc::EACCES, _) => Error::PermissionDenied { op },
            (libc::EEXIST, Object::Service(key) | Object::ServiceConfig { key, .. }) => {
                Error::ServiceExists { op, service: *key }
            }
            (libc::EEXIST, Object::Destination(s, d)) => Error::DestinationExists {
                op,
                service: *s,
                destination: *d,
            },
            (libc::EEXIST, Object::SyncDaemon(state) | Object::SyncDaemonConfig { state, .. }) => {
                Error::SyncDaemonExists { op, state: *state }
            }
            (libc::ESRCH, Object::Service(key) | Object::ServiceConfig { key, .. }) => {
                Error::ServiceNotFound { op, service: *key }
            }
            (libc::ESRCH, Object::Destination(s, _)) => Error::ServiceNotFound { op, service: *s },
            (libc::ESRCH, Object::SyncDaemon(state) | Object::SyncDaemonConfig { state, .. }) => {
                Error::SyncDaemonNotFound { op, state: *state }
            }
            (libc::ENOENT, Object::ServiceConfig { key, scheduler, pe })
                if matches!(op, O::AddService | O::UpdateService) =>
            {
                Error::SchedulerNotFound {
                    op,
                    service: *key,
                    scheduler: scheduler.clone(),
                    pe: pe.clone(),
                }
            }
            (libc::ENOENT, Object::Service(key) | Object::ServiceConfig { key, .. }) => {
                Error::ServiceNotFound { op, service: *key }
            }
            (libc::ENOENT, Object::Destination(s, d)) => Error::DestinationNotFound {
                op,
                service: *s,
                destination: *d,
            },
            (libc::ENODEV, Object::SyncDaemonConfig { state, interface }) => {
                Error::InterfaceNotFound {
                    op,
                    state: *state,
                    interface: interface.clone(),
                }
            }
            (libc::EINVAL | libc::ERANGE | libc::EAFNOSUPPORT, obj) => Error::InvalidArgument {
                op,
                object: obj.clone(),
                errno,
            },
            (errno, obj) => Error::Kernel {
                op,
                object: obj.clone(),
                errno,
            },
        }
    }

    /// True for [`Error::ServiceNotFound`] and [`Error::DestinationNotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Error::ServiceNotFound { .. } | Error::DestinationNotFound { .. }
        )
    }

    /// True for [`Error::ServiceExists`] and [`Error::DestinationExists`].
    pub fn is_exists(&self) -> bool {
        matches!(
            self,
            Error::ServiceExists { .. } | Error::DestinationExists { .. }
        )
    }

    pub(crate) fn io(op: Operation, source: io::Error) -> Error {
        Error::Io { op, source }
    }

    /// The error for a request this library refused to encode.
    pub(crate) fn from_encode(op: Operation, object: &Object, error: EncodeError) -> Error {
        match error {
            EncodeError::OutOfRange(RangeError {
                field,
                value,
                range,
            }) => Error::OutOfRange {
                op,
                object: object.clone(),
                field,
                value,
                range,
            },
            EncodeError::Invalid { field, reason } => Error::InvalidField {
                op,
                object: object.clone(),
                field,
                reason,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn key() -> ServiceKey {
        ServiceKey::tcp(Ipv4Addr::new(10, 0, 0, 1).into(), 80)
    }

    #[test]
    fn errno_mapping_follows_the_operation() {
        let svc = Object::ServiceConfig {
            key: key(),
            scheduler: "nope".into(),
            pe: None,
        };
        let dest = Object::Destination(
            key(),
            DestinationKey {
                addr: Ipv4Addr::new(10, 1, 0, 1).into(),
                port: 8080,
            },
        );
        assert!(matches!(
            Error::from_errno(Operation::AddService, &svc, libc::EEXIST),
            Error::ServiceExists { .. }
        ));
        assert!(matches!(
            Error::from_errno(Operation::AddService, &svc, libc::ENOENT),
            Error::SchedulerNotFound { ref scheduler, .. } if scheduler == "nope"
        ));
        assert!(matches!(
            Error::from_errno(Operation::DeleteService, &svc, libc::ESRCH),
            Error::ServiceNotFound { .. }
        ));
        assert!(matches!(
            Error::from_errno(Operation::AddDestination, &dest, libc::ESRCH),
            Error::ServiceNotFound { .. }
        ));
        assert!(matches!(
            Error::from_errno(Operation::DeleteDestination, &dest, libc::ENOENT),
            Error::DestinationNotFound { .. }
        ));
        assert!(matches!(
            Error::from_errno(Operation::AddDestination, &dest, libc::EEXIST),
            Error::DestinationExists { .. }
        ));
        assert!(matches!(
            Error::from_errno(Operation::Flush, &Object::Table, libc::EPERM),
            Error::PermissionDenied { .. }
        ));
        let e = Error::from_errno(Operation::AddDestination, &dest, libc::EINVAL);
        assert!(matches!(
            e,
            Error::InvalidArgument { op: Operation::AddDestination, object: Object::Destination(s, d), errno: libc::EINVAL }
                if s == key() && d.port == 8080
        ));
        assert!(matches!(
            Error::from_errno(Operation::UpdateDestination, &dest, libc::ERANGE),
            Error::InvalidArgument {
                errno: libc::ERANGE,
                ..
            }
        ));
        let daemon = Object::SyncDaemonConfig {
            state: SyncState::Master,
            interface: "nosuch0".into(),
        };
        assert!(matches!(
            Error::from_errno(Operation::StartSyncDaemon, &daemon, libc::ENODEV),
            Error::InterfaceNotFound { ref interface, .. } if interface == "nosuch0"
        ));
        assert!(matches!(
            Error::from_errno(Operation::StartSyncDaemon, &daemon, libc::EEXIST),
            Error::SyncDaemonExists {
                state: SyncState::Master,
                ..
            }
        ));
        let text = e.to_string();
        assert!(text.contains("add destination"), "{text}");
        assert!(text.contains("10.1.0.1:8080"), "{text}");
        assert!(text.contains("TCP 10.0.0.1:80"), "{text}");
    }
}
