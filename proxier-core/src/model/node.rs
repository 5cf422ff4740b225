//! What the planner knows of the node it runs on.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

/// Label holding a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The node the proxier runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeContext {
    /// Node name (matches endpoints' `nodeName` for local endpoints).
    pub name: String,
    /// The node's primary IPs, at most one per family (from the Node object or `--node-ip`).
    pub primary_ips: Vec<IpAddr>,
    /// Every address on the node's interfaces except the proxier's dummy link: candidates
    /// for NodePorts, and addresses that must never be bound on the dummy link.
    pub local_addresses: Vec<IpAddr>,
    /// Zone (label `topology.kubernetes.io/zone`), for topology hints.
    pub zone: Option<String>,
    /// The node's labels.
    pub labels: BTreeMap<String, String>,
    /// The pod CIDRs allocated to the node (the Node's `spec.podCIDRs`): what
    /// `--detect-local-mode=NodeCIDR` treats as local pod traffic.
    pub pod_cidrs: Vec<IpNet>,
    /// Whether the node may take traffic: `false` while it is being deleted or is about to
    /// be (kube-proxy's `nodeEligible`, see `k8s::node_eligible`). Load balancers read it
    /// through `/healthz`; the plan does not depend on it.
    pub eligible: bool,
}

impl Default for NodeContext {
    /// A node with no name, no address and eligible for traffic.
    fn default() -> Self {
        NodeContext::new(String::new(), Vec::new(), Vec::new())
    }
}

impl NodeContext {
    /// A node with a name and addresses (its zone read from `labels`, if any).
    pub fn new(
        name: impl Into<String>,
        primary_ips: Vec<IpAddr>,
        local_addresses: Vec<IpAddr>,
    ) -> Self {
        NodeContext {
            name: name.into(),
            primary_ips,
            local_addresses,
            zone: None,
            labels: BTreeMap::new(),
            pod_cidrs: Vec::new(),
            eligible: true,
        }
    }

    /// Whether planning for `other` gives the same plan as for this node: every fact but
    /// [`NodeContext::eligible`] is the same.
    pub fn plans_like(&self, other: &NodeContext) -> bool {
        // Compared whole but for eligibility, so that a fact added later counts by default.
        if self.eligible == other.eligible {
            return self == other;
        }
        let mut other = other.clone();
        other.eligible = self.eligible;
        *self == other
    }

    /// Whether `ip` is one of the node's own addresses.
    pub fn owns(&self, ip: IpAddr) -> bool {
        self.local_addresses.contains(&ip) || self.primary_ips.contains(&ip)
    }
}
