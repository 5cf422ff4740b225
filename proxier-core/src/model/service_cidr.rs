//! Service CIDRs the node takes whole with a `local` route through the dummy link, and the
//! rules that decide whether a range may be routed at all.
//!
//! Ranges come from two places: the configuration ([`Config::service_cidr_routes`], the
//! `--bind-service-cidrs` list) and the cluster's `networking.k8s.io/v1` ServiceCIDR objects
//! ([`ServiceCidr`], fed as [`crate::Change::UpsertServiceCidr`]). [`decide_routes`] applies
//! the same rules to both: a range is routed only with strict ARP on, never when it holds one
//! of the node's own addresses, never over a cluster (pod) CIDR, and only for a family the
//! node proxies. A refused range is reported with its reason and its ClusterIPs stay bound
//! one by one.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::{AddressFamily, Config, NodeContext};

/// A `networking.k8s.io/v1` ServiceCIDR object, as the engine needs it: its name and its
/// ranges (at most one per family). An object being deleted keeps its ranges until it is
/// gone: the API server holds the deletion while Services still have addresses in them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceCidr {
    /// The object's name (ServiceCIDRs are cluster-scoped; the default one is `kubernetes`).
    pub name: String,
    /// Its ranges (`spec.cidrs`), with host bits cleared.
    pub cidrs: Vec<IpNet>,
}

/// Where a routed range comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteOrigin {
    /// The configuration ([`Config::service_cidr_routes`], `--bind-service-cidrs`).
    Configured,
    /// The ServiceCIDR object of this name.
    ServiceCidr(String),
}

impl fmt::Display for RouteOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteOrigin::Configured => f.write_str("--bind-service-cidrs"),
            RouteOrigin::ServiceCidr(name) => write!(f, "ServiceCIDR {name}"),
        }
    }
}

/// Why a range is not routed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, thiserror::Error)]
pub enum RouteRefusal {
    /// Strict ARP is off: the node would answer ARP for every address of the range.
    #[error(
        "strict ARP (--ipvs-strict-arp) is off: the node would answer ARP for every address of the range"
    )]
    StrictArpOff,
    /// The range holds one of the node's own addresses: its gateway and neighbours would
    /// become local.
    #[error("it holds the node's address {0}")]
    HoldsNodeAddress(IpAddr),
    /// The range overlaps a pod network (`--cluster-cidr`).
    #[error("it overlaps the cluster CIDR {0}: the node would take pod addresses as its own")]
    OverlapsClusterCidr(IpNet),
    /// The node does not proxy this family: no netfilter rule would guard the range.
    #[error("the node does not proxy {0}")]
    FamilyNotProxied(AddressFamily),
}

/// A range that is not routed, where it comes from and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RefusedRoute {
    /// The range.
    pub cidr: IpNet,
    /// Where it comes from.
    pub origin: RouteOrigin,
    /// Why it is refused.
    pub reason: RouteRefusal,
}

impl fmt::Display for RefusedRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} not routed: {}",
            self.cidr, self.origin, self.reason
        )
    }
}

/// The ranges to route and the ones refused, as [`decide_routes`] found them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteDecision {
    /// Ranges to route, sorted, each once.
    pub routed: Vec<IpNet>,
    /// Ranges refused, sorted.
    pub refused: Vec<RefusedRoute>,
}

/// Whether two networks share an address.
pub(crate) fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Whether `cidr` may be routed to the dummy link under `config` on `node`: the one rule for
/// configured and ServiceCIDR ranges alike.
pub fn check_route(cidr: &IpNet, config: &Config, node: &NodeContext) -> Result<(), RouteRefusal> {
    let family = AddressFamily::of(cidr.addr());
    if !config.families.contains(&family) {
        return Err(RouteRefusal::FamilyNotProxied(family));
    }
    if let Some(pods) = config
        .cluster_cidrs
        .iter()
        .find(|pods| overlaps(cidr, pods))
    {
        return Err(RouteRefusal::OverlapsClusterCidr(*pods));
    }
    let node_addresses = node.primary_ips.iter().chain(&node.local_addresses);
    if let Some(address) = node_addresses.copied().find(|ip| cidr.contains(ip)) {
        return Err(RouteRefusal::HoldsNodeAddress(address));
    }
    if !config.strict_arp {
        return Err(RouteRefusal::StrictArpOff);
    }
    Ok(())
}

/// Decides which of the `configured` ranges and the ranges of the ServiceCIDR `objects` are
/// routed ([`check_route`] for each). A range listed by several origins is routed once, and
/// refused once per origin.
pub fn decide_routes<'a>(
    configured: &[IpNet],
    objects: impl IntoIterator<Item = &'a ServiceCidr>,
    config: &Config,
    node: &NodeContext,
) -> RouteDecision {
    let candidates = configured
        .iter()
        .map(|cidr| (cidr.trunc(), RouteOrigin::Configured))
        .chain(objects.into_iter().flat_map(|object| {
            object
                .cidrs
                .iter()
                .map(|cidr| (cidr.trunc(), RouteOrigin::ServiceCidr(object.name.clone())))
        }));
    let mut routed = BTreeSet::new();
    let mut refused = BTreeSet::new();
    for (cidr, origin) in candidates {
        match check_route(&cidr, config, node) {
            Ok(()) => {
                routed.insert(cidr);
            }
            Err(reason) => {
                refused.insert(RefusedRoute {
                    cidr,
                    origin,
                    reason,
                });
            }
        }
    }
    RouteDecision {
        routed: routed.into_iter().collect(),
        refused: refused.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    fn config() -> Config {
        Config {
            strict_arp: true,
            cluster_cidrs: vec![net("10.244.0.0/16")],
            ..Config::default()
        }
    }

    fn node() -> NodeContext {
        NodeContext::new(
            "node-a",
            vec!["192.168.1.10".parse().unwrap()],
            vec![
                "192.168.1.10".parse().unwrap(),
                "172.18.0.3".parse().unwrap(),
            ],
        )
    }

    fn object(name: &str, cidrs: &[&str]) -> ServiceCidr {
        ServiceCidr {
            name: name.to_owned(),
            cidrs: cidrs.iter().map(|c| net(c)).collect(),
        }
    }

    #[test]
    fn a_range_clear_of_the_node_and_the_pods_is_routed_with_strict_arp() {
        assert_eq!(
            check_route(&net("10.96.0.0/12"), &config(), &node()),
            Ok(())
        );
        assert_eq!(
            check_route(&net("fd00:96::/108"), &config(), &node()),
            Ok(())
        );
    }

    #[test]
    fn a_range_is_refused_without_strict_arp() {
        let config = Config {
            strict_arp: false,
            ..config()
        };
        assert_eq!(
            check_route(&net("10.96.0.0/12"), &config, &node()),
            Err(RouteRefusal::StrictArpOff)
        );
    }

    #[test]
    fn a_range_holding_a_node_address_is_refused_whichever_list_holds_it() {
        assert_eq!(
            check_route(&net("192.168.0.0/16"), &config(), &node()),
            Err(RouteRefusal::HoldsNodeAddress(
                "192.168.1.10".parse().unwrap()
            ))
        );
        // Only among the interface addresses, not a primary IP.
        assert_eq!(
            check_route(&net("172.18.0.0/24"), &config(), &node()),
            Err(RouteRefusal::HoldsNodeAddress(
                "172.18.0.3".parse().unwrap()
            ))
        );
    }

    #[test]
    fn a_range_overlapping_a_cluster_cidr_either_way_is_refused() {
        for cidr in ["10.0.0.0/8", "10.244.3.0/24", "10.244.0.0/16"] {
            assert_eq!(
                check_route(&net(cidr), &config(), &node()),
                Err(RouteRefusal::OverlapsClusterCidr(net("10.244.0.0/16"))),
                "{cidr}"
            );
        }
    }

    #[test]
    fn a_range_of_a_family_the_node_does_not_proxy_is_refused() {
        let config = Config {
            families: [AddressFamily::V4].into_iter().collect(),
            ..config()
        };
        assert_eq!(
            check_route(&net("fd00:96::/108"), &config, &node()),
            Err(RouteRefusal::FamilyNotProxied(AddressFamily::V6))
        );
    }

    #[test]
    fn configured_and_object_ranges_are_merged_and_the_unsafe_ones_refused_with_their_origin() {
        let decision = decide_routes(
            &[net("10.96.0.0/16")],
            &[
                object("kubernetes", &["10.96.0.0/16", "fd00:96::/108"]),
                object("extra", &["10.100.0.7/24"]),
                object("bad", &["192.168.0.0/16", "10.244.0.0/20"]),
            ],
            &config(),
            &node(),
        );
        assert_eq!(
            decision.routed,
            vec![
                net("10.96.0.0/16"),
                net("10.100.0.0/24"),
                net("fd00:96::/108")
            ]
        );
        assert_eq!(
            decision.refused,
            vec![
                RefusedRoute {
                    cidr: net("10.244.0.0/20"),
                    origin: RouteOrigin::ServiceCidr("bad".into()),
                    reason: RouteRefusal::OverlapsClusterCidr(net("10.244.0.0/16")),
                },
                RefusedRoute {
                    cidr: net("192.168.0.0/16"),
                    origin: RouteOrigin::ServiceCidr("bad".into()),
                    reason: RouteRefusal::HoldsNodeAddress("192.168.1.10".parse().unwrap()),
                },
            ]
        );
        assert_eq!(
            decision.refused[1].to_string(),
            "192.168.0.0/16 of ServiceCIDR bad not routed: it holds the node's address 192.168.1.10"
        );
    }
}
