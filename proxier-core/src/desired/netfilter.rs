//! The planner's netfilter output: the contents of one nftables table per address family.
//!
//! Every set here stands where kube-proxy's IPVS mode keeps an ipset; the rules that use
//! them are fixed and live with the rendering ([`crate::netfilter::render`]). The planner
//! fills them in the same pass as the IPVS plan ([`crate::planner::Planner::plan_service`]);
//! the netfilter module, which renders and applies them, re-exports them
//! ([`crate::netfilter::plan`](mod@crate::netfilter::plan)).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::config::InterfaceName;
use crate::model::{AddressFamily, Protocol};

/// A virtual address, protocol and port: one element of the `ip . proto . port` sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddrPort {
    /// Address (ClusterIP, ExternalIP, load-balancer IP or endpoint IP).
    pub address: IpAddr,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
}

/// A protocol and port with no address: one element of the NodePort sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtoPort {
    /// Transport protocol.
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
}

/// One allowed source range of one load-balancer IP and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceRange {
    /// The load-balancer IP, protocol and port it guards.
    pub target: AddrPort,
    /// Sources allowed to reach it.
    pub source: IpNet,
}

/// What the masquerade rule for ClusterIP traffic matches: kube-proxy's three cases
/// (`--masquerade-all`; a local-traffic detector; neither), with one variant per
/// `--detect-local-mode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterIpMasquerade {
    /// `--masquerade-all`: every packet to a ClusterIP is masqueraded.
    All,
    /// `ClusterCIDR` mode with `--cluster-cidr` set: packets from outside these CIDRs (this
    /// family only) are masqueraded.
    OutsideCidrs(Vec<IpNet>),
    /// `NodeCIDR` mode: packets from outside the node's pod CIDRs are masqueraded. The
    /// CIDRs are set elements ([`FamilyPlan::node_pod_cidrs`], set `node-pod-cidrs`), so
    /// they follow the Node object without a rule change; while the set is empty every
    /// packet to a ClusterIP is masqueraded.
    OutsideNodePodCidrs,
    /// `BridgeInterface` mode: packets that did not arrive on this interface are
    /// masqueraded (node-originated packets arrive on none, so they are masqueraded too).
    NotFromInterface(InterfaceName),
    /// `InterfaceNamePrefix` mode: packets that did not arrive on an interface whose name
    /// starts with this prefix are masqueraded.
    NotFromInterfacePrefix(InterfaceName),
    /// No detector (`ClusterCIDR` mode without a cluster CIDR of the family): only
    /// node-originated packets whose source is a ClusterIP (the kernel picks the VIP itself
    /// as the source address when the node talks to a VIP it holds).
    NodeFromVip,
}

/// The contents of one family's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPlan {
    /// The family.
    pub family: AddressFamily,
    /// How ClusterIP traffic is chosen for masquerade.
    pub cluster_ip_masquerade: ClusterIpMasquerade,
    /// Every ClusterIP, protocol and port (kube-proxy's `KUBE-CLUSTER-IP`).
    pub cluster_ips: BTreeSet<AddrPort>,
    /// ExternalIPs of externalTrafficPolicy Cluster Services: masqueraded (`KUBE-EXTERNAL-IP`).
    pub external_ips: BTreeSet<AddrPort>,
    /// ExternalIPs of externalTrafficPolicy Local Services: not masqueraded
    /// (`KUBE-EXTERNAL-IP-LOCAL`).
    pub external_ips_local: BTreeSet<AddrPort>,
    /// Load-balancer IPs of externalTrafficPolicy Cluster Services: masqueraded
    /// (`KUBE-LOAD-BALANCER` minus `KUBE-LOAD-BALANCER-LOCAL`).
    pub load_balancer_ips: BTreeSet<AddrPort>,
    /// Load-balancer IPs of externalTrafficPolicy Local Services (`KUBE-LOAD-BALANCER-LOCAL`).
    pub load_balancer_ips_local: BTreeSet<AddrPort>,
    /// NodePorts of externalTrafficPolicy Cluster Services: masqueraded
    /// (`KUBE-NODE-PORT-TCP/UDP/SCTP`, one set keyed by protocol and port).
    pub node_ports: BTreeSet<ProtoPort>,
    /// NodePorts of externalTrafficPolicy Local Services (`KUBE-NODE-PORT-LOCAL-*`).
    pub node_ports_local: BTreeSet<ProtoPort>,
    /// Load-balancer IPs and ports that have source ranges (`KUBE-LOAD-BALANCER-FW`).
    pub firewalled: BTreeSet<AddrPort>,
    /// Allowed sources of firewalled load-balancer IPs (`KUBE-LOAD-BALANCER-SOURCE-CIDR`),
    /// aggregated so that no two ranges of one target overlap.
    pub source_ranges: BTreeSet<SourceRange>,
    /// Firewalled load-balancer IPs and ports the node itself may reach, because a source
    /// range holds one of the node's primary IPs (`KUBE-LOAD-BALANCER-SOURCE-IP`).
    pub node_allowed: BTreeSet<AddrPort>,
    /// Endpoint address, protocol and port of endpoints that may run on this node: a packet
    /// from the endpoint to itself through its Service is hairpin traffic (`KUBE-LOOP-BACK`).
    pub hairpin: BTreeSet<AddrPort>,
    /// Health-check NodePorts (TCP), accepted (`KUBE-HEALTH-CHECK-NODE-PORT`).
    pub health_check_node_ports: BTreeSet<u16>,
    /// Every address bound on the dummy link (`KUBE-IPVS-IPS`).
    pub bound_ips: BTreeSet<IpAddr>,
    /// The node's pod CIDRs of this family, with
    /// [`ClusterIpMasquerade::OutsideNodePodCidrs`] only (set `node-pod-cidrs`). Every
    /// Service contributes them, so that the per-Service plans of the incremental path
    /// carry them (a table with no Service needs none: no ClusterIP to masquerade).
    pub node_pod_cidrs: BTreeSet<IpNet>,
    /// Service CIDRs of this family the node takes whole with a local route
    /// ([`Config::service_cidr_routes`](crate::model::Config::service_cidr_routes)): traffic to an address in them that is not in
    /// [`FamilyPlan::bound_ips`] (no Service has it) is rejected. A rule, not set elements.
    pub routed_service_cidrs: Vec<IpNet>,
}

impl FamilyPlan {
    /// An empty plan for one family.
    pub fn new(family: AddressFamily, cluster_ip_masquerade: ClusterIpMasquerade) -> Self {
        FamilyPlan {
            family,
            cluster_ip_masquerade,
            cluster_ips: BTreeSet::new(),
            external_ips: BTreeSet::new(),
            external_ips_local: BTreeSet::new(),
            load_balancer_ips: BTreeSet::new(),
            load_balancer_ips_local: BTreeSet::new(),
            node_ports: BTreeSet::new(),
            node_ports_local: BTreeSet::new(),
            firewalled: BTreeSet::new(),
            source_ranges: BTreeSet::new(),
            node_allowed: BTreeSet::new(),
            hairpin: BTreeSet::new(),
            health_check_node_ports: BTreeSet::new(),
            bound_ips: BTreeSet::new(),
            node_pod_cidrs: BTreeSet::new(),
            routed_service_cidrs: Vec::new(),
        }
    }

    /// Total number of set elements in this plan (what a full listing of the table holds).
    pub fn element_count(&self) -> usize {
        self.cluster_ips.len()
            + self.external_ips.len()
            + self.external_ips_local.len()
            + self.load_balancer_ips.len()
            + self.load_balancer_ips_local.len()
            + self.node_ports.len()
            + self.node_ports_local.len()
            + self.firewalled.len()
            + self.source_ranges.len()
            + self.node_allowed.len()
            + self.hairpin.len()
            + self.health_check_node_ports.len()
            + self.bound_ips.len()
            + self.node_pod_cidrs.len()
    }
}

/// The netfilter plan of the node: one table per proxied family. A family missing here has
/// no table (rendering removes any left from before).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetfilterPlan {
    /// IPv4 table contents, when IPv4 is proxied.
    pub v4: Option<FamilyPlan>,
    /// IPv6 table contents, when IPv6 is proxied.
    pub v6: Option<FamilyPlan>,
}

impl NetfilterPlan {
    /// The plan of one family.
    pub fn family(&self, family: AddressFamily) -> Option<&FamilyPlan> {
        match family {
            AddressFamily::V4 => self.v4.as_ref(),
            AddressFamily::V6 => self.v6.as_ref(),
        }
    }

    pub(crate) fn family_mut(&mut self, family: AddressFamily) -> Option<&mut FamilyPlan> {
        match family {
            AddressFamily::V4 => self.v4.as_mut(),
            AddressFamily::V6 => self.v6.as_mut(),
        }
    }
}
