//! In-memory backends: a model of the kernel's IPVS table and dummy link, used by
//! unit tests and by the daemon's dry run.
//!
//! Both are cheap handles on shared state: clone one, give the clone to the
//! reconciler, and keep the other to seed state, inspect what was applied and
//! inject failures. They follow the kernel's rules where the reconciler relies
//! on them (adding what exists fails with [`BackendError::Exists`], touching what
//! is missing fails with [`BackendError::NotFound`], a deleted virtual server takes
//! its real servers with it).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use ipnet::IpNet;

use super::{
    AddressBackend, BackendError, DEFAULT_DUMMY_LINK, IpvsBackend, IpvsOp, LinkRead, PendingBind,
    PendingLinkRead, PendingTableRead, TableRead,
};
use crate::desired::{RealServerKey, SortedMap, VirtualServerKey};
use crate::observed::{Forwarding, ObservedRealServer, ObservedVirtualServer};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the model half-updated in a way
    // that matters to a test; keep going with the inner value.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[derive(Debug, Default)]
struct IpvsState {
    table: BTreeMap<VirtualServerKey, ObservedVirtualServer>,
    applied: Vec<IpvsOp>,
    not_recording: bool,
    failures: BTreeMap<VirtualServerKey, BackendError>,
    hidden_from_next_list: BTreeSet<VirtualServerKey>,
    list_calls: usize,
    get_calls: usize,
}

/// An in-memory IPVS table.
#[derive(Debug, Clone, Default)]
pub struct MemoryIpvsBackend {
    state: Arc<Mutex<IpvsState>>,
}

impl MemoryIpvsBackend {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table holding `table` (for example a snapshot read from the kernel).
    pub fn with_table(table: BTreeMap<VirtualServerKey, ObservedVirtualServer>) -> Self {
        let backend = Self::new();
        lock(&backend.state).table = table;
        backend
    }

    /// The current table.
    pub fn table(&self) -> BTreeMap<VirtualServerKey, ObservedVirtualServer> {
        lock(&self.state).table.clone()
    }

    /// Every op asked of [`IpvsBackend::apply`] so far, failed ones included.
    pub fn applied_ops(&self) -> Vec<IpvsOp> {
        lock(&self.state).applied.clone()
    }

    /// Returns and forgets the ops recorded so far.
    pub fn take_applied_ops(&self) -> Vec<IpvsOp> {
        std::mem::take(&mut lock(&self.state).applied)
    }

    /// Turns the op log on (the default) or off (long-running benchmarks, dry runs).
    pub fn set_recording(&self, recording: bool) {
        lock(&self.state).not_recording = !recording;
    }

    /// How many full listings and single-virtual-server reads were made.
    pub fn read_calls(&self) -> (usize, usize) {
        let state = lock(&self.state);
        (state.list_calls, state.get_calls)
    }

    /// Inserts or replaces a virtual server behind the reconciler's back (drift, foreign services).
    pub fn insert_virtual_server(&self, key: VirtualServerKey, vs: ObservedVirtualServer) {
        lock(&self.state).table.insert(key, vs);
    }

    /// Removes a virtual server behind the reconciler's back.
    pub fn remove_virtual_server(&self, key: &VirtualServerKey) -> Option<ObservedVirtualServer> {
        lock(&self.state).table.remove(key)
    }

    /// Sets the connection counts of a real server; returns false when it does not exist.
    pub fn set_connections(
        &self,
        vs: &VirtualServerKey,
        rs: &RealServerKey,
        active: u32,
        inactive: u32,
    ) -> bool {
        let mut state = lock(&self.state);
        match state
            .table
            .get_mut(vs)
            .and_then(|v| v.real_servers.get_mut(rs))
        {
            Some(real) => {
                real.active_connections = active;
                real.inactive_connections = inactive;
                true
            }
            None => false,
        }
    }

    /// Makes every op on virtual server `key` (and reading it) fail with `error` until cleared.
    pub fn fail_virtual_server(&self, key: VirtualServerKey, error: BackendError) {
        lock(&self.state).failures.insert(key, error);
    }

    /// Leaves `key` out of the next listing only, as the kernel's dump does when another
    /// network namespace changes its IPVS table meanwhile.
    pub fn hide_from_next_list(&self, key: VirtualServerKey) {
        lock(&self.state).hidden_from_next_list.insert(key);
    }

    /// Stops failing ops on `key`.
    pub fn clear_failure(&self, key: &VirtualServerKey) {
        lock(&self.state).failures.remove(key);
    }

    fn apply_one(state: &mut IpvsState, op: &IpvsOp) -> Result<(), BackendError> {
        if let Some(error) = state.failures.get(op.virtual_server()) {
            return Err(error.clone());
        }
        let table = &mut state.table;
        match op {
            IpvsOp::AddVirtualServer(key, settings) => {
                if table.contains_key(key) {
                    return Err(BackendError::Exists);
                }
                table.insert(
                    *key,
                    ObservedVirtualServer {
                        settings: settings.clone(),
                        real_servers: SortedMap::new(),
                    },
                );
            }
            IpvsOp::UpdateVirtualServer(key, settings) => {
                table.get_mut(key).ok_or(BackendError::NotFound)?.settings = settings.clone();
            }
            IpvsOp::DeleteVirtualServer(key) => {
                table.remove(key).ok_or(BackendError::NotFound)?;
            }
            IpvsOp::AddRealServer(key, rs, weight) => {
                let vs = table.get_mut(key).ok_or(BackendError::NotFound)?;
                if vs.real_servers.contains_key(rs) {
                    return Err(BackendError::Exists);
                }
                vs.real_servers
                    .insert(*rs, ObservedRealServer::new(*weight));
            }
            IpvsOp::UpdateRealServer(key, rs, weight) => {
                let real = table
                    .get_mut(key)
                    .and_then(|vs| vs.real_servers.get_mut(rs))
                    .ok_or(BackendError::NotFound)?;
                real.weight = *weight;
                real.forward = Forwarding::Masquerade;
            }
            IpvsOp::DeleteRealServer(key, rs) => {
                table
                    .get_mut(key)
                    .and_then(|vs| vs.real_servers.remove(rs))
                    .ok_or(BackendError::NotFound)?;
            }
        }
        Ok(())
    }

    /// The table as it is now, less what [`MemoryIpvsBackend::hide_from_next_list`] hid;
    /// flagged best-effort or verified.
    fn read(&self, best_effort: bool) -> PendingTableRead {
        let mut state = lock(&self.state);
        state.list_calls += 1;
        let hidden = std::mem::take(&mut state.hidden_from_next_list);
        let mut table = state.table.clone();
        table.retain(|key, _| !hidden.contains(key));
        Box::pin(std::future::ready(Ok(TableRead {
            virtual_servers: table,
            dumps: 0,
            verified: !best_effort,
            best_effort,
            took: std::time::Duration::ZERO,
        })))
    }
}

impl IpvsBackend for MemoryIpvsBackend {
    /// The table as it is when the read starts (the stalest answer a kernel read may give).
    fn read_table(&self) -> PendingTableRead {
        self.read(false)
    }

    /// As the kernel backend's: flagged best-effort (the first full sync then reads each
    /// planned virtual server it lacks alone), and like [`IpvsBackend::read_table`] it
    /// leaves out what [`MemoryIpvsBackend::hide_from_next_list`] hid, as a disturbed dump
    /// would.
    fn read_table_best_effort(&self) -> PendingTableRead {
        self.read(true)
    }

    async fn get_virtual_server(
        &mut self,
        key: &VirtualServerKey,
    ) -> Result<Option<ObservedVirtualServer>, BackendError> {
        let mut state = lock(&self.state);
        state.get_calls += 1;
        if let Some(error) = state.failures.get(key) {
            return Err(error.clone());
        }
        Ok(state.table.get(key).cloned())
    }

    async fn apply(&mut self, ops: &[IpvsOp]) -> Vec<Result<(), BackendError>> {
        let mut state = lock(&self.state);
        if !state.not_recording {
            state.applied.extend(ops.iter().cloned());
        }
        ops.iter()
            .map(|op| Self::apply_one(&mut state, op))
            .collect()
    }
}

/// A write asked of a [`MemoryAddressBackend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressOp {
    /// The link was created.
    CreateLink,
    /// An address was bound.
    Add(IpAddr),
    /// An address was removed.
    Remove(IpAddr),
    /// The link was deleted.
    DeleteLink,
    /// A `local` route was added through the link.
    AddRoute(IpNet),
    /// A `local` route through the link was removed.
    RemoveRoute(IpNet),
}

#[derive(Debug, Default)]
struct AddressState {
    link_exists: bool,
    addresses: BTreeSet<IpAddr>,
    routes: BTreeSet<IpNet>,
    node_addresses: BTreeSet<IpAddr>,
    applied: Vec<AddressOp>,
    not_recording: bool,
    failures: BTreeMap<IpAddr, BackendError>,
}

impl AddressState {
    /// Adds `op` to the write log, unless it is off.
    fn record(&mut self, op: AddressOp) {
        if !self.not_recording {
            self.applied.push(op);
        }
    }
}

/// An in-memory dummy link.
#[derive(Debug, Clone)]
pub struct MemoryAddressBackend {
    link: String,
    state: Arc<Mutex<AddressState>>,
}

impl Default for MemoryAddressBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryAddressBackend {
    /// No link yet; it is named [`DEFAULT_DUMMY_LINK`].
    pub fn new() -> Self {
        MemoryAddressBackend {
            link: DEFAULT_DUMMY_LINK.to_owned(),
            state: Arc::default(),
        }
    }

    /// No link yet; it is named `link`.
    pub fn named(link: impl Into<String>) -> Self {
        MemoryAddressBackend {
            link: link.into(),
            state: Arc::default(),
        }
    }

    /// An existing link holding `addresses`.
    pub fn with_addresses(addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        let backend = Self::new();
        {
            let mut state = lock(&backend.state);
            state.link_exists = true;
            state.addresses = addresses.into_iter().collect();
        }
        backend
    }

    /// Whether the link exists.
    pub fn link_exists(&self) -> bool {
        lock(&self.state).link_exists
    }

    /// Addresses currently bound.
    pub fn addresses(&self) -> BTreeSet<IpAddr> {
        lock(&self.state).addresses.clone()
    }

    /// `local` routes currently through the link.
    pub fn local_routes(&self) -> BTreeSet<IpNet> {
        lock(&self.state).routes.clone()
    }

    /// Adds a `local` route behind the reconciler's back.
    pub fn add_route_behind_back(&self, net: IpNet) -> bool {
        let mut state = lock(&self.state);
        state.link_exists = true;
        state.routes.insert(net)
    }

    /// Every write asked so far, failed ones included.
    pub fn applied_ops(&self) -> Vec<AddressOp> {
        lock(&self.state).applied.clone()
    }

    /// Returns and forgets the writes recorded so far.
    pub fn take_applied_ops(&self) -> Vec<AddressOp> {
        std::mem::take(&mut lock(&self.state).applied)
    }

    /// Turns the write log on (the default) or off (long-running benchmarks, dry runs).
    pub fn set_recording(&self, recording: bool) {
        lock(&self.state).not_recording = !recording;
    }

    /// Removes an address behind the reconciler's back.
    pub fn remove_behind_back(&self, address: &IpAddr) -> bool {
        lock(&self.state).addresses.remove(address)
    }

    /// Binds an address behind the reconciler's back.
    pub fn add_behind_back(&self, address: IpAddr) -> bool {
        let mut state = lock(&self.state);
        state.link_exists = true;
        state.addresses.insert(address)
    }

    /// Makes adding or removing `address` fail with `error` until cleared.
    pub fn fail_address(&self, address: IpAddr, error: BackendError) {
        lock(&self.state).failures.insert(address, error);
    }

    /// Stops failing writes of `address`.
    pub fn clear_failure(&self, address: &IpAddr) {
        lock(&self.state).failures.remove(address);
    }

    /// Sets the node's own addresses (what [`AddressBackend::node_addresses`] reports).
    pub fn set_node_addresses(&self, addresses: impl IntoIterator<Item = IpAddr>) {
        lock(&self.state).node_addresses = addresses.into_iter().collect();
    }
}

impl AddressBackend for MemoryAddressBackend {
    fn link_name(&self) -> &str {
        &self.link
    }

    /// The link as it is when the read starts (the stalest answer a kernel read may give).
    fn read_link(&self) -> Option<PendingLinkRead> {
        let state = lock(&self.state);
        let read = LinkRead {
            addresses: state.addresses.clone(),
            routes: state.routes.clone(),
            node_addresses: state.node_addresses.clone(),
        };
        Some(Box::pin(std::future::ready(Ok(read))))
    }

    /// On the same link (the clones share it), one address at a time.
    fn bind_detached(&self, addresses: Vec<IpAddr>) -> Option<PendingBind> {
        let mut link = self.clone();
        Some(Box::pin(
            async move { link.add_addresses(&addresses).await },
        ))
    }

    async fn ensure_link(&mut self) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        if !state.link_exists {
            state.link_exists = true;
            state.record(AddressOp::CreateLink);
        }
        Ok(())
    }

    async fn list_addresses(&mut self) -> Result<BTreeSet<IpAddr>, BackendError> {
        Ok(lock(&self.state).addresses.clone())
    }

    async fn add_address(&mut self, address: IpAddr) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        state.record(AddressOp::Add(address));
        if let Some(error) = state.failures.get(&address) {
            return Err(error.clone());
        }
        if !state.link_exists {
            return Err(BackendError::NotFound);
        }
        if !state.addresses.insert(address) {
            return Err(BackendError::Exists);
        }
        Ok(())
    }

    async fn node_addresses(&mut self) -> Result<BTreeSet<IpAddr>, BackendError> {
        Ok(lock(&self.state).node_addresses.clone())
    }

    async fn delete_link(&mut self) -> Result<bool, BackendError> {
        let mut state = lock(&self.state);
        if !state.link_exists {
            return Ok(false);
        }
        state.link_exists = false;
        state.addresses.clear();
        state.routes.clear();
        state.record(AddressOp::DeleteLink);
        Ok(true)
    }

    async fn remove_address(&mut self, address: IpAddr) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        state.record(AddressOp::Remove(address));
        if let Some(error) = state.failures.get(&address) {
            return Err(error.clone());
        }
        if !state.addresses.remove(&address) {
            return Err(BackendError::NotFound);
        }
        // As the kernel: the link's last IPv4 address gone, IPv4 is disabled on it and every
        // IPv4 route through it dropped.
        if address.is_ipv4() && !state.addresses.iter().any(IpAddr::is_ipv4) {
            state.routes.retain(|net| !matches!(net, IpNet::V4(_)));
        }
        Ok(())
    }

    async fn list_local_routes(&mut self) -> Result<BTreeSet<IpNet>, BackendError> {
        Ok(lock(&self.state).routes.clone())
    }

    async fn add_local_route(&mut self, net: IpNet) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        state.record(AddressOp::AddRoute(net));
        if !state.link_exists {
            return Err(BackendError::NotFound);
        }
        if !state.routes.insert(net) {
            return Err(BackendError::Exists);
        }
        Ok(())
    }

    async fn remove_local_route(&mut self, net: IpNet) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        state.record(AddressOp::RemoveRoute(net));
        if !state.routes.remove(&net) {
            return Err(BackendError::NotFound);
        }
        Ok(())
    }
}
