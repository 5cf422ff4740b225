//! The kernel IPVS backend, over [`ipvs_netlink::IpvsHandle`].
//!
//! Virtual servers map to tuple services; real servers to masquerading destinations.
//! Firewall-mark services are never reported (the proxier does not own them).

use std::collections::{BTreeMap, HashMap};

use futures::TryStreamExt;
use ipvs_netlink::{
    Destination, DestinationEntry, DestinationKey, IpvsHandle, ListedDestination, Listing,
    NetnsTarget, Op, Service, ServiceEntry, ServiceFlags, ServiceKey, Table,
};

use super::{BackendError, IpvsBackend, IpvsOp, PendingTableRead, TableRead, TableReads};
use crate::desired::{RealServerKey, VirtualServerKey};
use crate::observed::{
    Forwarding, ObservedRealServer, ObservedVirtualServer, VirtualServerSettings,
};

/// Maps an ipvs-netlink error to the variants the reconciler reacts to.
fn map_error(error: ipvs_netlink::Error) -> BackendError {
    use ipvs_netlink::Error as E;
    match error {
        E::ServiceExists { .. } | E::DestinationExists { .. } => BackendError::Exists,
        E::ServiceNotFound { .. } | E::DestinationNotFound { .. } => BackendError::NotFound,
        E::SchedulerNotFound { scheduler, .. } => BackendError::SchedulerNotFound(scheduler),
        E::PermissionDenied { .. } => BackendError::Permission,
        E::IpvsUnavailable { reason } => BackendError::Unavailable(reason),
        other => BackendError::Other(other.to_string()),
    }
}

fn service_key(key: &VirtualServerKey) -> ServiceKey {
    ServiceKey::Tuple {
        addr: key.address,
        port: key.port,
        protocol: key.protocol,
    }
}

fn virtual_server_key(key: &ServiceKey) -> Option<VirtualServerKey> {
    match *key {
        ServiceKey::Tuple {
            addr,
            port,
            protocol,
        } => Some(VirtualServerKey {
            address: addr,
            port,
            protocol,
        }),
        ServiceKey::Fwmark { .. } => None,
    }
}

/// The kernel service for a virtual server: persistence with a host netmask (as
/// kube-proxy), and the source-port hashing flag for `sh` / `mh`.
fn service(key: &VirtualServerKey, settings: &VirtualServerSettings) -> Service {
    let mut service = Service::new(service_key(key), settings.scheduler.clone());
    if let Some(timeout) = settings.persistence_timeout {
        service = service.persistent(timeout);
    }
    if settings.hash_source_port {
        service.flags |= ServiceFlags::SH_PORT;
    }
    service
}

fn settings(service: &Service) -> VirtualServerSettings {
    VirtualServerSettings {
        scheduler: service.scheduler.clone(),
        persistence_timeout: service
            .flags
            .contains(ServiceFlags::PERSISTENT)
            .then_some(service.timeout),
        hash_source_port: service.flags.contains(ServiceFlags::SH_PORT),
    }
}

/// The tuple virtual servers of a table read, with their real servers.
fn observed_table(table: &Table) -> BTreeMap<VirtualServerKey, ObservedVirtualServer> {
    table
        .iter()
        .filter_map(|(entry, destinations)| {
            let key = virtual_server_key(&entry.service.key)?;
            Some((
                key,
                ObservedVirtualServer {
                    settings: settings(&entry.service),
                    real_servers: destinations.iter().map(real_server).collect(),
                },
            ))
        })
        .collect()
}

/// The most services whose destinations a table read takes from the kernel's listing
/// (`IpvsHandle::listed_destinations_up_to`); beyond, it dumps every service's. The
/// kernel's work for the listing grows with the square of the services, a destination
/// dump per service with their number: at 10,000 services × 5 the listing costs the
/// kernel a seventh of the dumps' work, at 50,000 about three times their time (a restart's
/// read in the test VM: 22.2 s against 7.5 s). Half-way on that curve, and where route
/// mode takes over in docs/migration.md. Once a read has found more, the next ones do not
/// read the listing at all (a full resync's every 30 s would read this much of it only to
/// stop there), until one finds fewer again.
const LISTING_MOST_SERVICES: usize = 20_000;

/// The listing read, or `None` when it could not be (logged) or shows more than
/// [`LISTING_MOST_SERVICES`]: the caller then dumps every service's destinations.
fn usable(listing: Result<Option<Listing>, ipvs_netlink::Error>) -> Option<Listing> {
    match listing {
        Ok(Some(listing)) => Some(listing),
        Ok(None) => {
            tracing::debug!(
                most = LISTING_MOST_SERVICES,
                "more services than the kernel's IPVS listing is read for: dumping every service's destinations"
            );
            None
        }
        Err(error) => {
            tracing::warn!(%error, "the kernel's IPVS listing could not be read: dumping every service's destinations instead");
            None
        }
    }
}

/// The tuple virtual servers of a service read, with their real servers: those the listing
/// shows when it is usable and leaves out few of them ([`listed_table`]), otherwise every
/// service's destinations dumped on the handle's parallel sockets
/// (`IpvsHandle::table_of`: the services already read are not dumped again).
async fn read_with_listing(
    handle: &IpvsHandle,
    services: Vec<ServiceEntry>,
    listing: Option<Listing>,
) -> Result<BTreeMap<VirtualServerKey, ObservedVirtualServer>, BackendError> {
    if let Some(listing) = listing {
        let listed: HashMap<ServiceKey, Vec<ListedDestination>> = listing.into_iter().collect();
        let unlisted = services
            .iter()
            .filter(|entry| {
                matches!(entry.service.key, ServiceKey::Tuple { .. })
                    && !listed.contains_key(&entry.service.key)
            })
            .count();
        if unlisted <= MOST_UNLISTED.max(services.len() / 50) {
            return listed_table(handle, services, listed).await;
        }
        tracing::info!(
            unlisted,
            services = services.len(),
            "the kernel's IPVS listing left out services (other namespaces have IPVS services): dumping every service's destinations instead"
        );
    }
    let table = handle.table_of(services).await.map_err(map_error)?;
    Ok(observed_table(&table))
}

/// The tuple virtual servers of a service read, with the real servers the listing shows for
/// each; those of a service it does not show are dumped. [`read_with_listing`] takes it
/// only when the listing leaves out at most [`MOST_UNLISTED`] of them: the kernel resumes
/// each page of the listing by counting only this namespace's services, but counts every
/// namespace's to end it, so while other namespaces have IPVS services it skips some at
/// every page; their destinations are then better dumped all at once, on parallel sockets.
async fn listed_table(
    handle: &IpvsHandle,
    services: Vec<ServiceEntry>,
    mut listed: HashMap<ServiceKey, Vec<ListedDestination>>,
) -> Result<BTreeMap<VirtualServerKey, ObservedVirtualServer>, BackendError> {
    let mut table = BTreeMap::new();
    for entry in services {
        let Some(key) = virtual_server_key(&entry.service.key) else {
            continue;
        };
        let real_servers = match listed.remove(&entry.service.key) {
            Some(destinations) => destinations.iter().map(listed_real_server).collect(),
            None => {
                let destinations: Vec<DestinationEntry> = handle
                    .destinations(&entry.service.key)
                    .try_collect()
                    .await
                    .or_else(|error| match map_error(error) {
                        // Deleted since the service dump.
                        BackendError::NotFound => Ok(Vec::new()),
                        other => Err(other),
                    })?;
                destinations.iter().map(real_server).collect()
            }
        };
        table.insert(
            key,
            ObservedVirtualServer {
                settings: settings(&entry.service),
                real_servers,
            },
        );
    }
    Ok(table)
}

/// Services left out of the listing whose destinations are dumped one by one (or 2 % of the
/// services, if more); with more, every service's are dumped on parallel sockets.
const MOST_UNLISTED: usize = 32;

/// A real server as the kernel's listing shows it.
fn listed_real_server(destination: &ListedDestination) -> (RealServerKey, ObservedRealServer) {
    (
        RealServerKey {
            address: destination.addr,
            port: destination.port,
        },
        ObservedRealServer {
            weight: destination.weight,
            forward: forwarding(destination.forward),
            active_connections: destination.active_conns,
            inactive_connections: destination.inactive_conns,
        },
    )
}

fn forwarding(method: ipvs_netlink::ForwardMethod) -> Forwarding {
    match method {
        ipvs_netlink::ForwardMethod::Masquerade => Forwarding::Masquerade,
        _ => Forwarding::Other,
    }
}

fn real_server(entry: &DestinationEntry) -> (RealServerKey, ObservedRealServer) {
    let d = &entry.destination;
    (
        RealServerKey {
            address: d.addr,
            port: d.port,
        },
        ObservedRealServer {
            weight: d.weight,
            forward: forwarding(d.forward),
            active_connections: entry.active_conns,
            inactive_connections: entry.inactive_conns,
        },
    )
}

fn op(op: &IpvsOp) -> Op {
    match op {
        IpvsOp::AddVirtualServer(key, s) => Op::AddService(service(key, s)),
        IpvsOp::UpdateVirtualServer(key, s) => Op::UpdateService(service(key, s)),
        IpvsOp::DeleteVirtualServer(key) => Op::DeleteService(service_key(key)),
        IpvsOp::AddRealServer(key, rs, weight) => Op::AddDestination(
            service_key(key),
            Destination::new(rs.address, rs.port).with_weight(*weight),
        ),
        IpvsOp::UpdateRealServer(key, rs, weight) => Op::UpdateDestination(
            service_key(key),
            Destination::new(rs.address, rs.port).with_weight(*weight),
        ),
        IpvsOp::DeleteRealServer(key, rs) => Op::DeleteDestination(
            service_key(key),
            DestinationKey {
                addr: rs.address,
                port: rs.port,
            },
        ),
    }
}

/// IPVS in the network namespace the handle was opened in.
#[derive(Debug, Clone)]
pub struct KernelIpvsBackend {
    handle: IpvsHandle,
    reads: TableReads,
    /// Virtual servers the last recorded read found: past [`LISTING_MOST_SERVICES`], the
    /// next reads do not start the kernel's listing only to stop it at that bound.
    last_read_size: usize,
}

impl KernelIpvsBackend {
    /// Wraps an open handle.
    pub fn new(handle: IpvsHandle) -> Self {
        KernelIpvsBackend {
            handle,
            reads: TableReads::default(),
            last_read_size: 0,
        }
    }

    /// Connects in the caller's network namespace (within a tokio runtime).
    pub async fn connect() -> Result<Self, BackendError> {
        IpvsHandle::new().await.map(Self::new).map_err(map_error)
    }

    /// Connects inside another network namespace (a path like `/run/netns/x`, or an fd).
    pub async fn connect_in_netns(target: impl Into<NetnsTarget>) -> Result<Self, BackendError> {
        IpvsHandle::new_in_netns(target)
            .await
            .map(Self::new)
            .map_err(map_error)
    }

    /// The underlying handle.
    pub fn handle(&self) -> &IpvsHandle {
        &self.handle
    }

    /// The kernel's listing for a read's destinations, up to [`LISTING_MOST_SERVICES`]
    /// services; `None` when it could not be read or showed more, or, without reading it,
    /// when the last recorded read found more.
    fn listing(&self) -> impl Future<Output = Option<Listing>> + Send + 'static {
        let handle = self.handle.clone();
        let worth_reading = self.last_read_size <= LISTING_MOST_SERVICES;
        async move {
            if !worth_reading {
                tracing::debug!(
                    most = LISTING_MOST_SERVICES,
                    "the last table read found more services than the kernel's IPVS listing is read for: dumping every service's destinations"
                );
                return None;
            }
            usable(
                handle
                    .listed_destinations_up_to(LISTING_MOST_SERVICES)
                    .await,
            )
        }
    }
}

impl IpvsBackend for KernelIpvsBackend {
    /// A verified read (every full resync's): the service list verified
    /// (`IpvsHandle::services_verified`: dumps repeated until two agree), beside the kernel's
    /// listing of the namespace for the destinations, as the best-effort read takes them
    /// ([`IpvsBackend::read_table_best_effort`]). A full resync then holds the kernel's IPVS
    /// lock for three service dumps, not for a destination dump per service besides, while
    /// the incremental syncs beside it write. When the listing cannot be read or leaves out
    /// too many services, or shows more than 20,000 services, every verified service's
    /// destinations are dumped (`IpvsHandle::table_of`, the service list is not dumped
    /// again): by the first such read on the library's parallel dump sockets, by later ones
    /// (beside incremental syncs) on one.
    fn read_table(&self) -> PendingTableRead {
        let handle = if self.reads.verifying_reads() > 0 {
            self.handle.with_read_sockets(1)
        } else {
            self.handle.clone()
        };
        let listing = self.listing();
        Box::pin(async move {
            let started = std::time::Instant::now();
            let (services, listing) = tokio::join!(handle.services_verified(), listing);
            let services = services.map_err(map_error)?;
            let (dumps, verified) = (services.attempts, services.verified);
            let virtual_servers = read_with_listing(&handle, services.services, listing).await?;
            // Verified, but an unverified merged read is still used (and counted): every
            // service in it exists, and one a dump skipped throughout is found by a later sync.
            if !verified {
                tracing::warn!(
                    dumps,
                    "IPVS service dumps kept changing (churn in another network namespace?): using the merged table"
                );
            }
            Ok(TableRead {
                virtual_servers,
                dumps,
                verified,
                best_effort: false,
                took: started.elapsed(),
            })
        })
    }

    /// A best-effort read (what the first sync adopts): one service dump for the services'
    /// settings, beside the kernel's text listing of the namespace for their destinations
    /// (`IpvsHandle::listed_destinations`: one file instead of a destination dump per
    /// service, about a seventh of the kernel's work at 10,000 services). A service the
    /// listing does not show (created while it was read, or skipped by it) has its
    /// destinations dumped on its own. When the listing cannot be read or shows more than
    /// 20,000 services (its cost grows with their square), every dumped service's
    /// destinations are dumped on the library's parallel dump sockets instead
    /// (`IpvsHandle::table_of`).
    fn read_table_best_effort(&self) -> PendingTableRead {
        let handle = self.handle.clone();
        let listing = self.listing();
        Box::pin(async move {
            let started = std::time::Instant::now();
            let (services, listing) =
                tokio::join!(handle.services().try_collect::<Vec<_>>(), listing);
            let services = services.map_err(map_error)?;
            let virtual_servers = read_with_listing(&handle, services, listing).await?;
            Ok(TableRead {
                virtual_servers,
                dumps: 1,
                verified: false,
                best_effort: true,
                took: started.elapsed(),
            })
        })
    }

    fn record_read(&mut self, read: &TableRead) {
        self.last_read_size = read.virtual_servers.len();
        if read.best_effort {
            self.reads.record_best_effort();
        } else {
            self.reads.record(read.dumps, read.verified);
        }
    }

    fn table_reads(&self) -> TableReads {
        self.reads
    }

    async fn get_virtual_server(
        &mut self,
        key: &VirtualServerKey,
    ) -> Result<Option<ObservedVirtualServer>, BackendError> {
        let service_key = service_key(key);
        // Both requests go out at once (one round trip, not two): the service's settings,
        // and its destinations, which the kernel lists empty for a service that is gone.
        let (entry, destinations) = futures::join!(
            self.handle.service(&service_key),
            self.handle
                .destinations(&service_key)
                .try_collect::<Vec<DestinationEntry>>()
        );
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) if error.is_not_found() => return Ok(None),
            Err(error) => return Err(map_error(error)),
        };
        let destinations = destinations.map_err(map_error)?;
        Ok(Some(ObservedVirtualServer {
            settings: settings(&entry.service),
            real_servers: destinations.iter().map(real_server).collect(),
        }))
    }

    async fn apply(&mut self, ops: &[IpvsOp]) -> Vec<Result<(), BackendError>> {
        let batch = ops.iter().map(op).collect();
        self.handle
            .batch(batch)
            .await
            .into_iter()
            .map(|result| result.map_err(map_error))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{Protocol, Scheduler};
    use std::net::{IpAddr, Ipv6Addr};

    #[test]
    fn settings_round_trip_through_kernel_services() {
        let key = VirtualServerKey {
            address: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 10)),
            port: 443,
            protocol: Protocol::Sctp,
        };
        for wanted in [
            VirtualServerSettings::default(),
            VirtualServerSettings {
                scheduler: Scheduler::MaglevHashing,
                persistence_timeout: Some(10800),
                hash_source_port: true,
            },
        ] {
            let kernel = service(&key, &wanted);
            assert_eq!(kernel.netmask, ipvs_netlink::Netmask::V6Prefix(128));
            assert_eq!(settings(&kernel), wanted);
            assert_eq!(virtual_server_key(&kernel.key), Some(key));
        }
        let sticky = service(
            &key,
            &VirtualServerSettings {
                persistence_timeout: Some(60),
                ..VirtualServerSettings::default()
            },
        );
        assert!(sticky.flags.contains(ServiceFlags::PERSISTENT));
        assert_eq!(sticky.timeout, 60);
        assert!(!sticky.flags.contains(ServiceFlags::SH_PORT));
    }
}
