//! The edges of the reconciler: traits for the kernel objects it manages, with
//! kernel implementations ([`ipvs`], [`address`]) and in-memory ones ([`memory`])
//! for tests and dry runs.
//!
//! Backends speak proxier-core's own types, so the reconciler never sees netlink.

pub mod address;
pub mod ipvs;
mod link_dump;
pub mod memory;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::time::Duration;

use ipnet::IpNet;

use crate::desired::{RealServerKey, VirtualServerKey};
use crate::observed::{ObservedVirtualServer, VirtualServerSettings};

pub use address::KernelAddressBackend;
pub use ipvs::KernelIpvsBackend;

pub use memory::{MemoryAddressBackend, MemoryIpvsBackend};

/// Default name of the dummy link the proxier binds service addresses on (kube-proxy's name).
pub const DEFAULT_DUMMY_LINK: &str = "kube-ipvs0";

/// Why a backend call failed. Kernel errno values are mapped to the variants that
/// the reconciler reacts to; everything else is carried as text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The object to add already exists.
    #[error("already exists")]
    Exists,
    /// The object (or its virtual server) does not exist.
    #[error("not found")]
    NotFound,
    /// The kernel has no scheduler module of that name.
    #[error("scheduler {0:?} is not available in the kernel")]
    SchedulerNotFound(String),
    /// The caller lacks CAP_NET_ADMIN.
    #[error("permission denied")]
    Permission,
    /// IPVS (or the link type) is not available in this kernel.
    #[error("not available in this kernel: {0}")]
    Unavailable(String),
    /// The kernel refused the request for another reason.
    #[error("{0}")]
    Other(String),
}

/// The kinds of write the reconciler performs, for counting and reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// Create a virtual server.
    AddVirtualServer,
    /// Change a virtual server's scheduler or flags.
    UpdateVirtualServer,
    /// Delete a virtual server (and with it its real servers).
    DeleteVirtualServer,
    /// Add a real server.
    AddRealServer,
    /// Change a real server's weight (including draining to 0 and restoring).
    UpdateRealServer,
    /// Delete a real server.
    DeleteRealServer,
    /// Bind an address on the dummy link.
    BindAddress,
    /// Remove an address from the dummy link.
    UnbindAddress,
}

impl OpKind {
    /// Whether this kind removes something from the kernel.
    pub fn is_delete(self) -> bool {
        matches!(
            self,
            OpKind::DeleteVirtualServer | OpKind::DeleteRealServer | OpKind::UnbindAddress
        )
    }
}

impl OpKind {
    /// A snake_case name, e.g. for a metric label (`add_virtual_server`).
    pub fn label(self) -> &'static str {
        match self {
            OpKind::AddVirtualServer => "add_virtual_server",
            OpKind::UpdateVirtualServer => "update_virtual_server",
            OpKind::DeleteVirtualServer => "delete_virtual_server",
            OpKind::AddRealServer => "add_real_server",
            OpKind::UpdateRealServer => "update_real_server",
            OpKind::DeleteRealServer => "delete_real_server",
            OpKind::BindAddress => "bind_address",
            OpKind::UnbindAddress => "unbind_address",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One IPVS write. Real servers are always masquerading (NAT) destinations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpvsOp {
    /// Create a virtual server.
    AddVirtualServer(VirtualServerKey, VirtualServerSettings),
    /// Replace a virtual server's scheduler and flags.
    UpdateVirtualServer(VirtualServerKey, VirtualServerSettings),
    /// Delete a virtual server.
    DeleteVirtualServer(VirtualServerKey),
    /// Add a masquerading real server with a weight.
    AddRealServer(VirtualServerKey, RealServerKey, u32),
    /// Set a real server's weight (and its forwarding method back to masquerade).
    UpdateRealServer(VirtualServerKey, RealServerKey, u32),
    /// Delete a real server.
    DeleteRealServer(VirtualServerKey, RealServerKey),
}

impl IpvsOp {
    /// The kind of this op.
    pub fn kind(&self) -> OpKind {
        match self {
            IpvsOp::AddVirtualServer(..) => OpKind::AddVirtualServer,
            IpvsOp::UpdateVirtualServer(..) => OpKind::UpdateVirtualServer,
            IpvsOp::DeleteVirtualServer(..) => OpKind::DeleteVirtualServer,
            IpvsOp::AddRealServer(..) => OpKind::AddRealServer,
            IpvsOp::UpdateRealServer(..) => OpKind::UpdateRealServer,
            IpvsOp::DeleteRealServer(..) => OpKind::DeleteRealServer,
        }
    }

    /// The virtual server this op is about.
    pub fn virtual_server(&self) -> &VirtualServerKey {
        match self {
            IpvsOp::AddVirtualServer(key, _)
            | IpvsOp::UpdateVirtualServer(key, _)
            | IpvsOp::DeleteVirtualServer(key)
            | IpvsOp::AddRealServer(key, ..)
            | IpvsOp::UpdateRealServer(key, ..)
            | IpvsOp::DeleteRealServer(key, _) => key,
        }
    }
}

impl fmt::Display for IpvsOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpvsOp::AddVirtualServer(key, s) => {
                write!(f, "add virtual server {key} ({})", s.scheduler)
            }
            IpvsOp::UpdateVirtualServer(key, s) => {
                write!(f, "update virtual server {key} ({})", s.scheduler)
            }
            IpvsOp::DeleteVirtualServer(key) => write!(f, "delete virtual server {key}"),
            IpvsOp::AddRealServer(key, rs, w) => {
                write!(f, "add real server {rs} weight {w} to {key}")
            }
            IpvsOp::UpdateRealServer(key, rs, w) => {
                write!(f, "set weight {w} on real server {rs} of {key}")
            }
            IpvsOp::DeleteRealServer(key, rs) => write!(f, "delete real server {rs} of {key}"),
        }
    }
}

/// How the backend's whole-table reads went, since it was made (counters).
///
/// The kernel's service dump can skip entries while another network namespace changes its
/// IPVS table, so the kernel backend reads the table with repeated dumps until they agree
/// (ipvs-netlink's verified read). An undisturbed read takes [`TableReads::UNDISTURBED_DUMPS`]
/// dumps; every further dump is a retry forced by churn elsewhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableReads {
    /// Whole-table reads.
    pub reads: u64,
    /// Of those, reads whose dumps never agreed within the bound (the merged table was used).
    pub unverified: u64,
    /// Service dumps made by all reads.
    pub dumps: u64,
    /// Dumps beyond the undisturbed [`TableReads::UNDISTURBED_DUMPS`] per read.
    pub retries: u64,
    /// Of the reads, best-effort ones: a single dump, not verified
    /// ([`IpvsBackend::read_table_best_effort`], made when adopting the kernel at start).
    pub best_effort: u64,
}

impl TableReads {
    /// Dumps of an undisturbed verified read: the first, then two that bring nothing new.
    pub const UNDISTURBED_DUMPS: u32 = 3;

    /// Counts one read that took `dumps` dumps and was (or was not) verified.
    pub fn record(&mut self, dumps: u32, verified: bool) {
        self.reads += 1;
        self.unverified += u64::from(!verified);
        self.dumps += u64::from(dumps);
        self.retries += u64::from(dumps.saturating_sub(Self::UNDISTURBED_DUMPS));
    }

    /// Counts one best-effort read ([`IpvsBackend::read_table_best_effort`]): one dump,
    /// neither verified nor a failed verification.
    pub fn record_best_effort(&mut self) {
        self.reads += 1;
        self.best_effort += 1;
        self.dumps += 1;
    }

    /// Reads made with repeated dumps: all but the best-effort ones.
    pub fn verifying_reads(&self) -> u64 {
        self.reads - self.best_effort
    }
}

/// One whole-table read: every tuple virtual server with its real servers, and how the
/// read went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableRead {
    /// The virtual servers read.
    pub virtual_servers: BTreeMap<VirtualServerKey, ObservedVirtualServer>,
    /// Service dumps the read took (0 for backends whose reads are exact).
    pub dumps: u32,
    /// Whether the dumps agreed (always true for exact backends).
    pub verified: bool,
    /// A best-effort read ([`IpvsBackend::read_table_best_effort`]): one dump, which may
    /// have skipped virtual servers that exist; `verified` is then false.
    pub best_effort: bool,
    /// How long the read took, from its first poll to its answer.
    pub took: Duration,
}

/// A whole-table read that borrows nothing of its backend ([`IpvsBackend::read_table`]): it
/// may be spawned and run while the backend keeps writing.
pub type PendingTableRead =
    Pin<Box<dyn Future<Output = Result<TableRead, BackendError>> + Send + 'static>>;

/// Reads and writes IPVS virtual servers and their real servers.
///
/// Only tuple (address, port, protocol) virtual servers are reported; firewall-mark
/// services and protocols outside [`crate::desired::Protocol`] are left out (the proxier never owns them).
pub trait IpvsBackend: Send {
    /// Starts a read of the whole table that holds no borrow of the backend, so a full
    /// resync can read while incremental syncs keep writing through the backend (the
    /// kernel backend reads on sockets of its own). A read sees each virtual server as it
    /// was at some moment between its start and its end; hand the result to
    /// [`IpvsBackend::record_read`] to count it.
    fn read_table(&self) -> PendingTableRead;

    /// A cheaper [`IpvsBackend::read_table`] that may miss virtual servers that exist (the
    /// kernel backend's single service dump, which churn in another network namespace can
    /// disturb) but never shows one that does not: what the first full sync reads, each
    /// planned virtual server the read lacks then read alone before it is created
    /// ([`IpvsBackend::get_virtual_server`]). Backends whose reads are exact keep the
    /// default, [`IpvsBackend::read_table`].
    fn read_table_best_effort(&self) -> PendingTableRead {
        self.read_table()
    }

    /// Counts a finished [`IpvsBackend::read_table`] in [`IpvsBackend::table_reads`].
    fn record_read(&mut self, read: &TableRead) {
        let _ = read;
    }

    /// Every tuple virtual server with its real servers and their connection counts: a
    /// [`IpvsBackend::read_table`], counted.
    fn list_virtual_servers(
        &mut self,
    ) -> impl Future<
        Output = Result<BTreeMap<VirtualServerKey, ObservedVirtualServer>, BackendError>,
    > + Send {
        let read = self.read_table();
        async move {
            let read = read.await?;
            self.record_read(&read);
            Ok(read.virtual_servers)
        }
    }

    /// How the whole-table reads went so far (all zero for backends whose reads are exact,
    /// like the in-memory one).
    fn table_reads(&self) -> TableReads {
        TableReads::default()
    }

    /// One virtual server with its real servers, `None` when it does not exist.
    fn get_virtual_server(
        &mut self,
        key: &VirtualServerKey,
    ) -> impl Future<Output = Result<Option<ObservedVirtualServer>, BackendError>> + Send;

    /// Applies `ops` in order, as one batch; returns one result per op, in the same order.
    /// A failing op does not stop the ones after it.
    fn apply(
        &mut self,
        ops: &[IpvsOp],
    ) -> impl Future<Output = Vec<Result<(), BackendError>>> + Send;
}

/// What a full sync reads of the node's links ([`AddressBackend::read_link`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkRead {
    /// The addresses bound on the dummy link (none when it does not exist).
    pub addresses: BTreeSet<IpAddr>,
    /// The `local` routes through it ([`AddressBackend::list_local_routes`]).
    pub routes: BTreeSet<IpNet>,
    /// The node's own addresses ([`AddressBackend::node_addresses`]).
    pub node_addresses: BTreeSet<IpAddr>,
}

/// A read of the links that borrows nothing of its backend ([`AddressBackend::read_link`]).
pub type PendingLinkRead =
    Pin<Box<dyn Future<Output = Result<LinkRead, BackendError>> + Send + 'static>>;

/// A binding of addresses that borrows nothing of its backend
/// ([`AddressBackend::bind_detached`]): one result per address, in order.
pub type PendingBind =
    Pin<Box<dyn Future<Output = Vec<Result<(), BackendError>>> + Send + 'static>>;

/// The answers of [`AddressBackend::change_addresses`]: one per address bound, one per
/// address removed, each in order.
pub type AddressChanges = (Vec<Result<(), BackendError>>, Vec<Result<(), BackendError>>);

/// Manages the dummy link and the service addresses bound on it (/32 or /128).
pub trait AddressBackend: Send {
    /// Name of the link.
    fn link_name(&self) -> &str;

    /// Reads the dummy link's addresses and routes and the node's addresses without
    /// borrowing the backend, so a full resync reads them beside incremental syncs (with
    /// the IPVS table). `None` (the default): the full sync reads them when it finishes.
    fn read_link(&self) -> Option<PendingLinkRead> {
        None
    }

    /// Binds `addresses` on the link (which must exist) without borrowing the backend, as
    /// [`AddressBackend::add_addresses`] does, so a start binds its ClusterIPs while the
    /// rest of its picture is still being fetched ([`crate::Reconciler::bind_ahead`]).
    /// `None` (the default): the backend cannot, and the first sync binds them.
    fn bind_detached(&self, addresses: Vec<IpAddr>) -> Option<PendingBind> {
        let _ = addresses;
        None
    }

    /// Creates the dummy link if it is missing and brings it up.
    fn ensure_link(&mut self) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Addresses bound on the link (an absent link has none); link-local addresses the
    /// kernel adds by itself are left out, so they are never unbound.
    fn list_addresses(
        &mut self,
    ) -> impl Future<Output = Result<BTreeSet<IpAddr>, BackendError>> + Send;

    /// Whether the link holds any address [`AddressBackend::list_addresses`] would list (an
    /// absent link holds none): what [`crate::Reconciler::bind_ahead`] asks before binding
    /// onto a link. The default lists them all; the kernel backend stops at the first.
    fn holds_addresses(&mut self) -> impl Future<Output = Result<bool, BackendError>> + Send {
        async move { Ok(!self.list_addresses().await?.is_empty()) }
    }

    /// Binds `address` as a host address (/32 or /128).
    fn add_address(
        &mut self,
        address: IpAddr,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Removes `address` from the link.
    fn remove_address(
        &mut self,
        address: IpAddr,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Binds several addresses; one result per address, in order. The kernel backend sends
    /// the requests pipelined on one socket (many in flight), not one request and ack at a
    /// time.
    fn add_addresses(
        &mut self,
        addresses: &[IpAddr],
    ) -> impl Future<Output = Vec<Result<(), BackendError>>> + Send {
        async move {
            let mut results = Vec::with_capacity(addresses.len());
            for address in addresses {
                results.push(self.add_address(*address).await);
            }
            results
        }
    }

    /// Binds `bind`, then removes `unbind`: one result per address of each, in order. The
    /// kernel backend sends both on one socket, pipelined, the removals after the binds, so
    /// a sync that adds one Service and deletes another waits for one exchange, not two.
    fn change_addresses(
        &mut self,
        bind: &[IpAddr],
        unbind: &[IpAddr],
    ) -> impl Future<Output = AddressChanges> + Send {
        async move {
            let bound = if bind.is_empty() {
                Vec::new()
            } else {
                self.add_addresses(bind).await
            };
            let unbound = if unbind.is_empty() {
                Vec::new()
            } else {
                self.remove_addresses(unbind).await
            };
            (bound, unbound)
        }
    }

    /// Removes several addresses; one result per address, in order (pipelined like
    /// [`AddressBackend::add_addresses`]).
    fn remove_addresses(
        &mut self,
        addresses: &[IpAddr],
    ) -> impl Future<Output = Vec<Result<(), BackendError>>> + Send {
        async move {
            let mut results = Vec::with_capacity(addresses.len());
            for address in addresses {
                results.push(self.remove_address(*address).await);
            }
            results
        }
    }

    /// The node's own addresses: every address on the node's interfaces except those on the
    /// dummy link, loopback and IPv6 link-local ones (where NodePorts live; IPv4 link-local
    /// addresses are kept, as kube-proxy keeps them).
    fn node_addresses(
        &mut self,
    ) -> impl Future<Output = Result<BTreeSet<IpAddr>, BackendError>> + Send;

    /// Deletes the link with its addresses; `Ok(false)` when it did not exist.
    fn delete_link(&mut self) -> impl Future<Output = Result<bool, BackendError>> + Send;

    /// The `local` routes through the link in the kernel's `local` table other than the
    /// ones the kernel makes for the link's own addresses: the Service CIDRs the node takes
    /// as its own whole ([`crate::model::Config::service_cidr_routes`]). An absent link has
    /// none.
    fn list_local_routes(
        &mut self,
    ) -> impl Future<Output = Result<BTreeSet<IpNet>, BackendError>> + Send;

    /// Adds `net` as a `local` route through the link in the `local` table (scope host):
    /// the node then takes every address in it as its own, as if each were bound.
    fn add_local_route(
        &mut self,
        net: IpNet,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Removes the `local` route for `net` through the link.
    fn remove_local_route(
        &mut self,
        net: IpNet,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::TableReads;

    #[test]
    fn table_reads_count_dumps_beyond_an_undisturbed_read_as_retries() {
        let mut reads = TableReads::default();
        reads.record(3, true);
        assert_eq!(
            (reads.reads, reads.dumps, reads.retries, reads.unverified),
            (1, 3, 0, 0)
        );
        reads.record(5, true);
        reads.record(8, false);
        assert_eq!(
            (reads.reads, reads.dumps, reads.retries, reads.unverified),
            (3, 16, 7, 1)
        );
        // A single best-effort dump is no retry.
        reads.record(1, false);
        assert_eq!((reads.dumps, reads.retries), (17, 7));
    }
}
