//! The pure half of the netfilter companion: cluster state + node + configuration in, the
//! contents of one nftables table per address family out.
//!
//! Every set here stands where kube-proxy's IPVS mode keeps an ipset; the rules that use
//! them are fixed and live in [`super::render`]. Planning reads the model directly (it does
//! not need the IPVS plan) and applies the same family, exclusion and NodePort-address
//! choices as [`crate::planner`].

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::desired::Protocol;
use crate::model::config::{DetectLocal, InterfaceName};
use crate::model::{AddressFamily, Config, FamilyAddresses, NodeContext, Service, TrafficPolicy};
use crate::planner::endpoints_for_port;
use crate::state::ClusterState;

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
    /// Every service address, protocol and port on a bound address: new connections to a
    /// bound address on anything else are rejected.
    pub service_ports: BTreeSet<AddrPort>,
    /// The node's pod CIDRs of this family, with
    /// [`ClusterIpMasquerade::OutsideNodePodCidrs`] only (set `node-pod-cidrs`). Every
    /// Service contributes them, so that the per-Service plans of the incremental path
    /// carry them (a table with no Service needs none: no ClusterIP to masquerade).
    pub node_pod_cidrs: BTreeSet<IpNet>,
    /// Service CIDRs of this family the node takes whole with a local route
    /// ([`Config::service_cidr_routes`]): traffic to an address in them that is not in
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
            service_ports: BTreeSet::new(),
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
            + self.service_ports.len()
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

/// Plans the netfilter tables of the node.
pub fn plan(state: &ClusterState, node: &NodeContext, config: &Config) -> NetfilterPlan {
    let mut out = empty_plan(config);
    for service in state.services() {
        for family in AddressFamily::ALL {
            if let Some(family_plan) = out.family_mut(family) {
                plan_service(state, service, node, family_plan);
            }
        }
    }
    out
}

/// The tables of `config`'s families with their rules and no set element: what the node
/// holds with no Service.
pub fn empty_plan(config: &Config) -> NetfilterPlan {
    let mut out = NetfilterPlan::default();
    for family in AddressFamily::ALL {
        if !config.families.contains(&family) {
            continue;
        }
        let mut family_plan = FamilyPlan::new(family, cluster_ip_masquerade(config, family));
        family_plan.routed_service_cidrs = config
            .service_cidr_routes
            .iter()
            .filter(|net| AddressFamily::of(net.addr()) == family)
            .copied()
            .collect();
        match family {
            AddressFamily::V4 => out.v4 = Some(family_plan),
            AddressFamily::V6 => out.v6 = Some(family_plan),
        }
    }
    out
}

/// The set elements one Service contributes (an [`empty_plan`] holding only them): the
/// incremental path re-plans only the Services that changed and merges the results
/// ([`super::NetfilterTracker`]).
pub fn plan_of_service(
    state: &ClusterState,
    service: &Service,
    node: &NodeContext,
    config: &Config,
) -> NetfilterPlan {
    let mut out = empty_plan(config);
    for family in AddressFamily::ALL {
        if let Some(family_plan) = out.family_mut(family) {
            plan_service(state, service, node, family_plan);
        }
    }
    out
}

fn cluster_ip_masquerade(config: &Config, family: AddressFamily) -> ClusterIpMasquerade {
    if config.masquerade_all {
        return ClusterIpMasquerade::All;
    }
    match &config.detect_local {
        DetectLocal::ClusterCidr => {
            let cidrs: Vec<IpNet> = config
                .cluster_cidrs
                .iter()
                .copied()
                .filter(|net| AddressFamily::of(net.addr()) == family)
                .collect();
            if cidrs.is_empty() {
                ClusterIpMasquerade::NodeFromVip
            } else {
                ClusterIpMasquerade::OutsideCidrs(IpNet::aggregate(&cidrs))
            }
        }
        DetectLocal::NodeCidr => ClusterIpMasquerade::OutsideNodePodCidrs,
        DetectLocal::BridgeInterface(name) => ClusterIpMasquerade::NotFromInterface(name.clone()),
        DetectLocal::InterfaceNamePrefix(prefix) => {
            ClusterIpMasquerade::NotFromInterfacePrefix(prefix.clone())
        }
    }
}

fn plan_service(state: &ClusterState, service: &Service, node: &NodeContext, out: &mut FamilyPlan) {
    let family = out.family;
    let Some(FamilyAddresses {
        cluster_ip,
        external_ips,
        load_balancer_ips: lb_ips,
    }) = service.addresses_of(family)
    else {
        return;
    };
    let in_family = |ip: &IpAddr| AddressFamily::of(*ip) == family;
    let external_local = service.external_traffic_policy == TrafficPolicy::Local;
    let ranges = source_ranges_of(service, family);
    let node_allowed_by_ranges = ranges.as_ref().is_some_and(|ranges| {
        node.primary_ips
            .iter()
            .filter(|ip| in_family(ip))
            .any(|ip| ranges.iter().any(|net| net.contains(ip)))
    });

    out.bound_ips.insert(cluster_ip);
    if out.cluster_ip_masquerade == ClusterIpMasquerade::OutsideNodePodCidrs {
        let of_family: Vec<IpNet> = node
            .pod_cidrs
            .iter()
            .copied()
            .filter(|net| AddressFamily::of(net.addr()) == family)
            .map(|net| net.trunc())
            .collect();
        // Aggregated: an nft interval set refuses overlapping elements.
        out.node_pod_cidrs.extend(IpNet::aggregate(&of_family));
    }
    for ip in &external_ips {
        if !node.owns(*ip) {
            out.bound_ips.insert(*ip);
        }
    }
    for ip in &lb_ips {
        if !node.owns(*ip) {
            out.bound_ips.insert(*ip);
        }
    }
    if let Some(port) = service.health_check_node_port {
        out.health_check_node_ports.insert(port);
    }

    for port in &service.ports {
        let at = |address: IpAddr, number: u16| AddrPort {
            address,
            protocol: port.protocol,
            port: number,
        };
        out.cluster_ips.insert(at(cluster_ip, port.port));
        out.service_ports.insert(at(cluster_ip, port.port));
        for ip in &external_ips {
            let entry = at(*ip, port.port);
            out.service_ports.insert(entry);
            if external_local {
                out.external_ips_local.insert(entry);
            } else {
                out.external_ips.insert(entry);
            }
        }
        for ip in &lb_ips {
            let entry = at(*ip, port.port);
            out.service_ports.insert(entry);
            if external_local {
                out.load_balancer_ips_local.insert(entry);
            } else {
                out.load_balancer_ips.insert(entry);
            }
            if let Some(ranges) = &ranges {
                out.firewalled.insert(entry);
                for source in ranges {
                    out.source_ranges.insert(SourceRange {
                        target: entry,
                        source: *source,
                    });
                }
                if node_allowed_by_ranges {
                    out.node_allowed.insert(entry);
                }
            }
        }
        if let Some(node_port) = port.node_port {
            let entry = ProtoPort {
                protocol: port.protocol,
                port: node_port,
            };
            if external_local {
                out.node_ports_local.insert(entry);
            } else {
                out.node_ports.insert(entry);
            }
        }
        for (key, endpoint) in endpoints_for_port(port, state.slices_of(&service.name)) {
            let on_this_node = match &endpoint.node_name {
                Some(name) => **name == *node.name,
                // Unknown placement (e.g. an embedder that does not set it): keep it; the
                // element only matches a packet whose source and destination are both this
                // endpoint, which can only be hairpin traffic.
                None => true,
            };
            if on_this_node && in_family(&key.address) {
                out.hairpin.insert(at(key.address, key.port));
            }
        }
    }
}

/// The source ranges of a Service in one family: `None` when the Service is open to all
/// (no ranges, or a zero-length prefix among them).
///
/// A Service that lists ranges of the other family only gets an empty list here: its
/// load-balancer IPs of this family accept nobody (fail closed). kube-proxy instead drops
/// ranges of the wrong family and leaves that family open; we deliberately do not.
fn source_ranges_of(service: &Service, family: AddressFamily) -> Option<Vec<IpNet>> {
    let all = &service.load_balancer_source_ranges;
    if all.is_empty() || all.iter().any(|net| net.prefix_len() == 0) {
        return None;
    }
    let of_family: Vec<IpNet> = all
        .iter()
        .copied()
        .filter(|net| AddressFamily::of(net.addr()) == family)
        .map(|net| net.trunc())
        .collect();
    Some(IpNet::aggregate(&of_family))
}

#[cfg(test)]
mod tests;
