//! The planner's output: what the kernel should hold, per Service port.
//!
//! This is the contract between [`crate::planner`] (pure, produces it) and the
//! reconciler (diffs it against what the kernel holds and applies the difference). The
//! nftables set elements the planner decides beside it are typed in [`netfilter`] (and
//! re-exported from [`crate::netfilter::plan`](mod@crate::netfilter::plan), next to the code that renders and applies
//! them).
//! Everything is keyed and ordered so that two plans of the same input compare equal.

pub mod netfilter;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

pub use crate::model::{Protocol, Scheduler, ServicePortName};
pub use crate::sorted_map::SortedMap;

/// Identifies an IPVS virtual server of a Service: address, port and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VirtualServerKey {
    /// Virtual address (ClusterIP, node IP, external IP or load-balancer IP).
    pub address: IpAddr,
    /// Virtual port.
    pub port: u16,
    /// Transport protocol.
    pub protocol: Protocol,
}

impl fmt::Display for VirtualServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.address {
            IpAddr::V4(a) => write!(f, "{} {}:{}", self.protocol, a, self.port),
            IpAddr::V6(a) => write!(f, "{} [{}]:{}", self.protocol, a, self.port),
        }
    }
}

/// Identifies a real server (IPVS destination) within a virtual server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RealServerKey {
    /// Endpoint address.
    pub address: IpAddr,
    /// Endpoint port.
    pub port: u16,
}

impl fmt::Display for RealServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.address {
            IpAddr::V4(a) => write!(f, "{}:{}", a, self.port),
            IpAddr::V6(a) => write!(f, "[{}]:{}", a, self.port),
        }
    }
}

/// Desired settings of one real server. Forwarding is always masquerade (NAT), as in kube-proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RealServer {
    /// IPVS weight; kube-proxy uses 1 for every endpoint.
    pub weight: u32,
}

impl Default for RealServer {
    fn default() -> Self {
        RealServer { weight: 1 }
    }
}

/// Why a virtual server exists: which kind of Service address it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VirtualServerRole {
    /// A ClusterIP (bound on the dummy link).
    ClusterIp,
    /// A NodePort on one of the node's own addresses (not bound: the node already has it).
    NodePort,
    /// An ExternalIP (bound on the dummy link).
    ExternalIp,
    /// A LoadBalancer ingress IP (bound on the dummy link).
    LoadBalancer,
}

impl VirtualServerRole {
    /// Whether the virtual address must be bound on the dummy link for IPVS to see the traffic.
    pub fn binds_address(self) -> bool {
        !matches!(self, VirtualServerRole::NodePort)
    }
}

/// Desired settings of one IPVS virtual server and the real servers behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualServer {
    /// Kind of address this virtual server serves.
    pub role: VirtualServerRole,
    /// Scheduler.
    pub scheduler: Scheduler,
    /// ClientIP session affinity: the persistence timeout in seconds (`None` = no persistence).
    pub persistence_timeout: Option<u32>,
    /// Set the source-hash port flag (`mh-port`): kube-proxy sets it for `mh` only.
    pub hash_source_port: bool,
    /// Real servers, by address and port.
    pub real_servers: SortedMap<RealServerKey, RealServer>,
}

/// The whole plan of one Service port: every virtual server it owns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServicePortPlan {
    /// Virtual servers of this Service port.
    pub virtual_servers: SortedMap<VirtualServerKey, VirtualServer>,
    /// Addresses of this plan's ExternalIP / load-balancer virtual servers that the node
    /// already holds on one of its own interfaces. Like kube-proxy, these are never bound on
    /// the dummy link (binding and later unbinding a node address would break it), so
    /// [`ServicePortPlan::bound_addresses`] leaves them out.
    pub node_owned_addresses: BTreeSet<IpAddr>,
    /// Whether every ClusterIP of this plan lies in a Service CIDR the node takes whole
    /// with a local route ([`Config::service_cidr_routes`](crate::model::Config)): its
    /// ClusterIPs are then not bound one by one. (A dual-stack Service with only one
    /// family's CIDR routed keeps binding both: an address under a local route is harmless.)
    pub cluster_ips_routed: bool,
}

impl ServicePortPlan {
    /// Whether the virtual server at `key` needs its address bound on the dummy link: the
    /// one rule every sync and the plan's accounting use.
    pub fn binds(&self, key: &VirtualServerKey, vs: &VirtualServer) -> bool {
        vs.role.binds_address()
            && !(self.cluster_ips_routed && vs.role == VirtualServerRole::ClusterIp)
            && !self.node_owned_addresses.contains(&key.address)
    }

    /// Addresses this Service port needs bound on the dummy link.
    pub fn bound_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.virtual_servers
            .iter()
            .filter(|(key, vs)| self.binds(key, vs))
            .map(|(key, _)| key.address)
    }
}

/// The desired kernel state for the whole node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Desired {
    /// Plans by Service port.
    pub services: BTreeMap<ServicePortName, ServicePortPlan>,
}

impl Desired {
    /// Sets the plan of one Service port (`None` removes it, as [`crate::Planner::plan_port`]
    /// returns for a port that owns nothing) and returns the plan it had.
    pub fn set_plan(
        &mut self,
        name: &ServicePortName,
        plan: Option<ServicePortPlan>,
    ) -> Option<ServicePortPlan> {
        match plan {
            Some(plan) => self.services.insert(name.clone(), plan),
            None => self.services.remove(name),
        }
    }

    /// Sets the plan of one Service port as [`Desired::set_plan`] does, looking the port up
    /// once: `None` when the plan is the one it had (nothing changed), else `Some` of the
    /// plan it had. `changing` sees the new plan and the old one before the change is made.
    pub(crate) fn replace_plan(
        &mut self,
        name: ServicePortName,
        plan: Option<ServicePortPlan>,
        changing: impl FnOnce(Option<&ServicePortPlan>, Option<&ServicePortPlan>),
    ) -> Option<Option<ServicePortPlan>> {
        use std::collections::btree_map::Entry;
        match (self.services.entry(name), plan) {
            (Entry::Vacant(_), None) => None,
            (Entry::Vacant(vacant), Some(plan)) => {
                changing(Some(&plan), None);
                vacant.insert(plan);
                Some(None)
            }
            (Entry::Occupied(occupied), Some(plan)) if *occupied.get() == plan => None,
            (Entry::Occupied(mut occupied), Some(plan)) => {
                changing(Some(&plan), Some(occupied.get()));
                Some(Some(occupied.insert(plan)))
            }
            (Entry::Occupied(occupied), None) => {
                changing(None, Some(occupied.get()));
                Some(Some(occupied.remove()))
            }
        }
    }

    /// Applies the result of [`crate::Planner::plan_ports`]: the incremental path's way of
    /// keeping the whole plan current. Returns the ports whose plan actually changed.
    pub fn apply_plans(
        &mut self,
        plans: BTreeMap<ServicePortName, Option<ServicePortPlan>>,
    ) -> BTreeSet<ServicePortName> {
        let mut changed = BTreeSet::new();
        for (name, plan) in plans {
            let old = self.set_plan(&name, plan);
            if old.as_ref() != self.services.get(&name) {
                changed.insert(name);
            }
        }
        changed
    }

    /// Every address to bind on the dummy link (deduplicated, ordered).
    pub fn bound_addresses(&self) -> BTreeSet<IpAddr> {
        self.services
            .values()
            .flat_map(ServicePortPlan::bound_addresses)
            .collect()
    }

    /// Every virtual server of every Service port, with its owner.
    pub fn virtual_servers(
        &self,
    ) -> impl Iterator<Item = (&ServicePortName, &VirtualServerKey, &VirtualServer)> {
        self.services.iter().flat_map(|(name, plan)| {
            plan.virtual_servers
                .iter()
                .map(move |(key, vs)| (name, key, vs))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str) -> ServicePortName {
        ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: "".into(),
            protocol: Protocol::Tcp,
        }
    }

    #[test]
    fn apply_plans_adds_replaces_removes_and_reports_only_real_changes() {
        let mut desired = Desired::default();
        let same = port("same");
        let gone = port("gone");
        let new = port("new");
        desired.set_plan(&same, Some(ServicePortPlan::default()));
        desired.set_plan(&gone, Some(ServicePortPlan::default()));
        let changed = desired.apply_plans(BTreeMap::from([
            (same.clone(), Some(ServicePortPlan::default())),
            (gone.clone(), None),
            (new.clone(), Some(ServicePortPlan::default())),
            (port("never"), None),
        ]));
        assert_eq!(changed, BTreeSet::from([gone, new.clone()]));
        assert_eq!(
            desired.services.keys().cloned().collect::<BTreeSet<_>>(),
            BTreeSet::from([same, new])
        );
    }

    #[test]
    fn replace_plan_reports_the_old_plan_of_a_change_and_nothing_else() {
        let mut desired = Desired::default();
        let a = port("a");
        let plan = |owned: u8| ServicePortPlan {
            node_owned_addresses: BTreeSet::from([IpAddr::from([192, 0, 2, owned])]),
            ..ServicePortPlan::default()
        };
        let mut seen = Vec::new();
        let mut replace = |desired: &mut Desired, p: Option<ServicePortPlan>| {
            desired.replace_plan(a.clone(), p, |new, old| {
                seen.push((new.cloned(), old.cloned()));
            })
        };
        // Nothing planned, nothing to plan: no change.
        assert_eq!(replace(&mut desired, None), None);
        // A first plan.
        assert_eq!(replace(&mut desired, Some(plan(1))), Some(None));
        // The same again: no change.
        assert_eq!(replace(&mut desired, Some(plan(1))), None);
        // Another: the old one comes back.
        assert_eq!(replace(&mut desired, Some(plan(2))), Some(Some(plan(1))));
        // Gone.
        assert_eq!(replace(&mut desired, None), Some(Some(plan(2))));
        assert!(desired.services.is_empty());
        assert_eq!(
            seen,
            vec![
                (Some(plan(1)), None),
                (Some(plan(2)), Some(plan(1))),
                (None, Some(plan(2))),
            ]
        );
    }
}
