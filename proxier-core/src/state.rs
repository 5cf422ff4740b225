//! Cluster state and change tracking.
//!
//! [`ClusterState`] holds the proxied Services and their EndpointSlices, indexed by Service, so
//! applying one [`Change`] costs the size of that change (plus the affected Service's slices),
//! never the size of the cluster. [`ClusterState::apply`] answers which Service ports must be
//! re-planned; planning only those (see [`crate::planner::Planner::plan_ports`]) is the
//! incremental path of the reconciler.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use foldhash::{HashMap, HashSet};

use crate::model::ServicePortName;
use crate::model::{
    EndpointSlice, ModelWarning, NodeContext, Service, ServiceCidr, ServiceName, SliceKey,
};

/// One change to the cluster state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A Service was added or updated.
    UpsertService(Service),
    /// A Service was deleted, or is no longer proxied (e.g. it became headless).
    DeleteService(ServiceName),
    /// An EndpointSlice was added or updated.
    UpsertSlice(EndpointSlice),
    /// An EndpointSlice was deleted.
    DeleteSlice(SliceKey),
    /// The facts of the node the proxier runs on changed (its Node object, its addresses).
    UpsertNode(NodeContext),
    /// The node's Node object is gone: plan with its name only.
    DeleteNode,
    /// A ServiceCIDR object was added or updated (one being deleted still counts: its
    /// ranges hold live Services until it is gone).
    UpsertServiceCidr(ServiceCidr),
    /// The ServiceCIDR object of this name is gone.
    DeleteServiceCidr(String),
}

/// Service ports whose plan may have changed.
pub type DirtyPorts = BTreeSet<ServicePortName>;

/// Services and EndpointSlices, indexed by Service. The hash tables use foldhash (seeded per
/// process): hashing names with std's SipHash was a third of applying a first picture.
#[derive(Debug, Default)]
pub struct ClusterState {
    node: Option<NodeContext>,
    /// ServiceCIDR objects by name.
    service_cidrs: BTreeMap<String, ServiceCidr>,
    /// Boxed: a hash table keeps spare slots, each as large as its value.
    services: HashMap<ServiceName, Box<Service>>,
    /// Slices of each Service, sorted by slice name (a Service has few slices: a sorted
    /// vector, exactly sized, is much smaller than a tree map and as fast at this size).
    slices: HashMap<ServiceName, Vec<EndpointSlice>>,
    slice_owner: HashMap<SliceKey, ServiceName>,
    strings: HashSet<Arc<str>>,
    /// Size of `strings` at which unused entries are dropped next.
    prune_strings_at: usize,
}

impl ClusterState {
    /// An empty state.
    pub fn new() -> Self {
        ClusterState::default()
    }

    /// Makes room for `services` more Services and `slices` more EndpointSlices, so that a
    /// whole picture applied at once does not grow (and rehash) the tables step by step.
    pub fn reserve(&mut self, services: usize, slices: usize) {
        self.services.reserve(services);
        self.slices.reserve(services);
        self.slice_owner.reserve(slices);
    }

    /// Applies one change and returns the Service ports whose plan may have changed
    /// (including ports that no longer exist: their plan is now empty). A change that leaves
    /// the state as it was returns an empty set. A ServiceCIDR change dirties no port by
    /// itself: which ranges are routed also depends on the node and the settings, so the
    /// engine decides that ([`crate::model::decide_routes`]) and re-plans when they change.
    pub fn apply(&mut self, change: Change) -> DirtyPorts {
        match change {
            Change::UpsertService(service) => self.upsert_service(service),
            Change::DeleteService(name) => self.delete_service(&name),
            Change::UpsertSlice(slice) => self.upsert_slice(slice),
            Change::DeleteSlice(key) => self.delete_slice(&key),
            Change::UpsertNode(node) => self.set_node(Some(node)),
            Change::DeleteNode => self.set_node(None),
            Change::UpsertServiceCidr(object) => {
                self.service_cidrs.insert(object.name.clone(), object);
                DirtyPorts::new()
            }
            Change::DeleteServiceCidr(name) => {
                self.service_cidrs.remove(&name);
                DirtyPorts::new()
            }
        }
    }

    /// The ServiceCIDR objects, by name.
    pub fn service_cidrs(&self) -> impl Iterator<Item = &ServiceCidr> {
        self.service_cidrs.values()
    }

    /// The node's facts as last set (`None`: no Node object known).
    pub fn node(&self) -> Option<&NodeContext> {
        self.node.as_ref()
    }

    /// Every plan may depend on the node's addresses and labels: a change dirties every port.
    fn set_node(&mut self, node: Option<NodeContext>) -> DirtyPorts {
        if self.node == node {
            return DirtyPorts::new();
        }
        self.node = node;
        self.port_names()
    }

    /// Number of EndpointSlices.
    pub fn slice_count(&self) -> usize {
        self.slice_owner.len()
    }

    /// A Service by name.
    pub fn service(&self, name: &ServiceName) -> Option<&Service> {
        self.services.get(name).map(|service| &**service)
    }

    /// Every Service (in no particular order).
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values().map(|service| &**service)
    }

    /// Number of Services.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// The EndpointSlices of a Service, ordered by slice name.
    pub fn slices_of(&self, service: &ServiceName) -> impl Iterator<Item = &EndpointSlice> {
        self.slices.get(service).into_iter().flatten()
    }

    /// Every Service port currently known.
    pub fn port_names(&self) -> DirtyPorts {
        self.services
            .values()
            .flat_map(|service| service.port_names())
            .collect()
    }

    /// Warnings of every object in the state (ignored annotations, ignored ports, ...).
    pub fn warnings(&self) -> impl Iterator<Item = &ModelWarning> {
        self.services
            .values()
            .flat_map(|s| s.warnings.iter())
            .chain(
                self.slices
                    .values()
                    .flatten()
                    .flat_map(|s| s.warnings.iter()),
            )
    }

    fn upsert_service(&mut self, service: Service) -> DirtyPorts {
        for warning in &service.warnings {
            tracing::warn!(service = %service.name, "{warning}");
        }
        let mut dirty: DirtyPorts = service.port_names().collect();
        match self.services.get_mut(&service.name) {
            Some(old) if **old == service => DirtyPorts::new(),
            Some(old) => {
                dirty.extend(old.port_names());
                **old = service;
                dirty
            }
            None => {
                self.services
                    .insert(service.name.clone(), Box::new(service));
                dirty
            }
        }
    }

    fn delete_service(&mut self, name: &ServiceName) -> DirtyPorts {
        match self.services.remove(name) {
            Some(old) => old.port_names().collect(),
            None => DirtyPorts::new(),
        }
    }

    fn upsert_slice(&mut self, mut slice: EndpointSlice) -> DirtyPorts {
        for warning in &slice.warnings {
            tracing::warn!(slice = %slice.key, "{warning}");
        }
        self.intern(&mut slice);
        let mut dirty = DirtyPorts::new();
        // A slice whose service label changed leaves its old Service.
        if let Some(old_owner) = self.slice_owner.get(&slice.key)
            && *old_owner != slice.service
        {
            let old_owner = old_owner.clone();
            self.remove_slice_from(&old_owner, &slice.key.name);
            dirty.extend(self.ports_of(&old_owner));
        }
        self.slice_owner
            .insert(slice.key.clone(), slice.service.clone());
        let owner = slice.service.clone();
        let by_name = self.slices.entry(owner.clone()).or_default();
        match by_name.binary_search_by(|s| s.key.name.cmp(&slice.key.name)) {
            Ok(i) if by_name[i] == slice => return dirty,
            Ok(i) => by_name[i] = slice,
            Err(i) => {
                by_name.reserve_exact(1);
                by_name.insert(i, slice);
            }
        }
        dirty.extend(self.ports_of(&owner));
        dirty
    }

    fn delete_slice(&mut self, key: &SliceKey) -> DirtyPorts {
        let Some(owner) = self.slice_owner.remove(key) else {
            return DirtyPorts::new();
        };
        self.remove_slice_from(&owner, &key.name);
        self.ports_of(&owner).collect()
    }

    fn remove_slice_from(&mut self, owner: &ServiceName, slice_name: &str) {
        if let Some(by_name) = self.slices.get_mut(owner) {
            by_name.retain(|s| &*s.key.name != slice_name);
            if by_name.is_empty() {
                self.slices.remove(owner);
            } else {
                by_name.shrink_to_fit();
            }
        }
    }

    fn ports_of(&self, service: &ServiceName) -> impl Iterator<Item = ServicePortName> + '_ {
        self.services
            .get(service)
            .into_iter()
            .flat_map(|service| service.port_names())
    }

    /// Shares node names, zones and hints between endpoints: a cluster has few distinct ones.
    fn intern(&mut self, slice: &mut EndpointSlice) {
        // Forget names nobody uses any more (nodes and zones that went away), amortised.
        if self.strings.len() >= self.prune_strings_at.max(1024) {
            self.strings.retain(|s| Arc::strong_count(s) > 1);
            self.prune_strings_at = self.strings.len() * 2;
        }
        let strings = &mut self.strings;
        let mut intern = |s: &mut Arc<str>| {
            if let Some(existing) = strings.get(s) {
                *s = Arc::clone(existing);
            } else {
                strings.insert(Arc::clone(s));
            }
        };
        for endpoint in &mut slice.endpoints {
            if let Some(node) = endpoint.node_name.as_mut() {
                intern(node);
            }
            if let Some(zone) = endpoint.zone.as_mut() {
                intern(zone);
            }
            endpoint.zone_hints.iter_mut().for_each(&mut intern);
            endpoint.node_hints.iter_mut().for_each(&mut intern);
        }
    }
}
