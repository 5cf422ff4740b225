//! The nftables set elements of a Service: decided in the pass that plans its IPVS virtual
//! servers ([`super::Planner::plan_service`]), from the same families, node-owned addresses
//! and endpoints.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::desired::RealServerKey;
use crate::desired::netfilter::{
    AddrPort, ClusterIpMasquerade, FamilyPlan, NetfilterPlan, ProtoPort, SourceRange,
};
use crate::model::config::DetectLocal;
use crate::model::{
    AddressFamily, Config, Endpoint, FamilyAddresses, NodeContext, Service, ServicePortSpec,
    TrafficPolicy,
};

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

/// One Service in one of its families, as its set elements need it: the load-balancer
/// source ranges are decided once for all its ports.
pub(super) struct FamilyElements<'a> {
    service: &'a Service,
    family: AddressFamily,
    addresses: &'a FamilyAddresses,
    /// Its ExternalIPs and load-balancer IPs that the node holds itself (not bound).
    node_owned: &'a BTreeSet<IpAddr>,
    node: &'a NodeContext,
    /// `None`: the load-balancer IPs are open to all.
    ranges: Option<Vec<IpNet>>,
    /// A source range holds one of the node's primary IPs of the family.
    node_allowed: bool,
}

impl<'a> FamilyElements<'a> {
    pub(super) fn new(
        service: &'a Service,
        family: AddressFamily,
        addresses: &'a FamilyAddresses,
        node_owned: &'a BTreeSet<IpAddr>,
        node: &'a NodeContext,
    ) -> Self {
        let ranges = source_ranges_of(service, family);
        let node_allowed = ranges.as_ref().is_some_and(|ranges| {
            node.primary_ips
                .iter()
                .filter(|ip| AddressFamily::of(**ip) == family)
                .any(|ip| ranges.iter().any(|net| net.contains(ip)))
        });
        FamilyElements {
            service,
            family,
            addresses,
            node_owned,
            node,
            ranges,
            node_allowed,
        }
    }

    /// Adds the elements of the Service as a whole (not of one port) to its family's table.
    pub(super) fn add_service(&self, out: &mut FamilyPlan) {
        let addresses = self.addresses;
        out.bound_ips.insert(addresses.cluster_ip);
        if out.cluster_ip_masquerade == ClusterIpMasquerade::OutsideNodePodCidrs {
            let of_family: Vec<IpNet> = self
                .node
                .pod_cidrs
                .iter()
                .copied()
                .filter(|net| AddressFamily::of(net.addr()) == self.family)
                .map(|net| net.trunc())
                .collect();
            // Aggregated: an nft interval set refuses overlapping elements.
            out.node_pod_cidrs.extend(IpNet::aggregate(&of_family));
        }
        for ip in addresses
            .external_ips
            .iter()
            .chain(&addresses.load_balancer_ips)
        {
            if !self.node_owned.contains(ip) {
                out.bound_ips.insert(*ip);
            }
        }
        if let Some(port) = self.service.health_check_node_port {
            out.health_check_node_ports.insert(port);
        }
    }

    /// Adds the elements of one port to its family's table; `endpoints` are the port's
    /// endpoints of this family.
    pub(super) fn add_port(
        &self,
        out: &mut FamilyPlan,
        port: &ServicePortSpec,
        endpoints: &[(RealServerKey, &Endpoint)],
    ) {
        let addresses = self.addresses;
        let external_local = self.service.external_traffic_policy == TrafficPolicy::Local;
        let at = |address: IpAddr, number: u16| AddrPort {
            address,
            protocol: port.protocol,
            port: number,
        };
        out.cluster_ips.insert(at(addresses.cluster_ip, port.port));
        for ip in &addresses.external_ips {
            let entry = at(*ip, port.port);
            if external_local {
                out.external_ips_local.insert(entry);
            } else {
                out.external_ips.insert(entry);
            }
        }
        for ip in &addresses.load_balancer_ips {
            let entry = at(*ip, port.port);
            if external_local {
                out.load_balancer_ips_local.insert(entry);
            } else {
                out.load_balancer_ips.insert(entry);
            }
            if let Some(ranges) = &self.ranges {
                out.firewalled.insert(entry);
                for source in ranges {
                    out.source_ranges.insert(SourceRange {
                        target: entry,
                        source: *source,
                    });
                }
                if self.node_allowed {
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
        for (key, endpoint) in endpoints {
            let on_this_node = match &endpoint.node_name {
                Some(name) => **name == *self.node.name,
                // Unknown placement (e.g. an embedder that does not set it): keep it; the
                // element only matches a packet whose source and destination are both this
                // endpoint, which can only be hairpin traffic.
                None => true,
            };
            if on_this_node {
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
