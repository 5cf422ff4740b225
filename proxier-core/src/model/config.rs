//! Proxier configuration that affects planning and the kernel settings around it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use ipvs_netlink::Scheduler;

use super::family::AddressFamily;

/// Which node addresses NodePorts are served on (`--nodeport-addresses`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    /// Every address of the node (kube-proxy's behaviour with no flag).
    #[default]
    All,
    /// Only the node's primary IPs (`--nodeport-addresses primary`).
    Primary,
    /// Node addresses inside these CIDRs. A family with no CIDR in the list uses all its
    /// addresses, and a zero-length prefix matches everything (as kube-proxy reads the flag).
    Cidrs(Vec<IpNet>),
}

/// IPVS connection timeouts (`--ipvs-tcp-timeout` and friends); `None` leaves the kernel's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpvsTimeouts {
    /// Idle TCP sessions.
    pub tcp: Option<Duration>,
    /// TCP sessions after a FIN.
    pub tcp_fin: Option<Duration>,
    /// UDP.
    pub udp: Option<Duration>,
}

/// A network interface name, as a Linux kernel accepts one: 1 to 15 bytes, none of them
/// whitespace, `/`, `:`, a quote, a backslash or `*` (so it can be written into an nft
/// rule as a quoted string, and a prefix can be given a wildcard).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InterfaceName(String);

/// Why a string is not an [`InterfaceName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a network interface name (1 to 15 characters, no whitespace, '/', ':', quotes, '\\' or '*')"
)]
pub struct InvalidInterfaceName(pub String);

impl InterfaceName {
    /// Longest name the kernel accepts (`IFNAMSIZ` - 1).
    pub const MAX_LEN: usize = 15;

    /// Checks `name`.
    pub fn new(name: &str) -> Result<Self, InvalidInterfaceName> {
        let ok = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && name != "."
            && name != ".."
            && name
                .chars()
                .all(|c| c.is_ascii_graphic() && !matches!(c, '/' | ':' | '"' | '\'' | '\\' | '*'));
        if ok {
            Ok(InterfaceName(name.to_owned()))
        } else {
            Err(InvalidInterfaceName(name.to_owned()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for InterfaceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for InterfaceName {
    type Err = InvalidInterfaceName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        InterfaceName::new(s)
    }
}

/// How traffic from this node's pods is told apart from other traffic (kube-proxy's
/// `--detect-local-mode`): a packet to a ClusterIP that does not come from a local pod is
/// masqueraded, so that the answer comes back through this node. With
/// [`Config::masquerade_all`] every packet is masqueraded and the mode does not matter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DetectLocal {
    /// `ClusterCIDR`: sources inside [`Config::cluster_cidrs`] are pods. A family with no
    /// cluster CIDR detects nothing: only node traffic sourced from a VIP is masqueraded
    /// (kube-proxy's behaviour with no `--cluster-cidr`).
    #[default]
    ClusterCidr,
    /// `NodeCIDR`: sources inside the node's pod CIDRs (the Node's `spec.podCIDRs`,
    /// [`crate::model::NodeContext::pod_cidrs`]) are pods. Followed as the Node changes;
    /// while the node has no pod CIDR of a family, every packet of that family to a
    /// ClusterIP is masqueraded.
    NodeCidr,
    /// `BridgeInterface`: packets arriving on this interface (the pods' bridge) are from
    /// pods.
    BridgeInterface(InterfaceName),
    /// `InterfaceNamePrefix`: packets arriving on an interface whose name starts with this
    /// prefix (the pods' veths, e.g. `veth` or `cali`) are from pods.
    InterfaceNamePrefix(InterfaceName),
}

/// Proxier configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Default scheduler (`--ipvs-scheduler`, `rr` by default).
    pub scheduler: Scheduler,
    /// Addresses the proxier never plans nor touches (`--ipvs-exclude-cidrs`).
    pub exclude_cidrs: Vec<IpNet>,
    /// Node addresses that serve NodePorts.
    pub node_port_addresses: NodePortAddresses,
    /// `--ipvs-strict-arp`.
    pub strict_arp: bool,
    /// IPVS timeouts.
    pub timeouts: IpvsTimeouts,
    /// Masquerade all traffic to Service addresses (`--masquerade-all`).
    pub masquerade_all: bool,
    /// Pod network CIDRs (`--cluster-cidr`), to tell off-cluster traffic that needs masquerade.
    pub cluster_cidrs: Vec<IpNet>,
    /// Address families the node proxies (both by default).
    pub families: BTreeSet<AddressFamily>,
    /// How traffic from local pods is recognised (`--detect-local-mode`).
    pub detect_local: DetectLocal,
    /// Service CIDRs the node takes as its own whole, each with one `local` route through
    /// the dummy link, instead of binding every ClusterIP in them as an address
    /// (`--bind-service-cidrs`, opt-in; empty by default). A Service whose ClusterIPs all lie
    /// in these is not bound one by one; addresses in them that no Service has are rejected
    /// by the netfilter companion, and strict ARP keeps the node from answering ARP for them.
    ///
    /// A [`crate::Proxier`] routes these plus the ranges of the ServiceCIDR objects it is fed
    /// ([`crate::Change::UpsertServiceCidr`]), each only if it passes
    /// [`crate::model::check_route`]; the planner's copy in
    /// [`crate::Proxier::config`] holds the ranges routed now.
    pub service_cidr_routes: Vec<IpNet>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            scheduler: Scheduler::RoundRobin,
            exclude_cidrs: Vec::new(),
            node_port_addresses: NodePortAddresses::All,
            strict_arp: false,
            timeouts: IpvsTimeouts::default(),
            masquerade_all: false,
            cluster_cidrs: Vec::new(),
            families: AddressFamily::ALL.into_iter().collect(),
            detect_local: DetectLocal::ClusterCidr,
            service_cidr_routes: Vec::new(),
        }
    }
}

/// Why a [`Config`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A Service CIDR route overlaps a pod network.
    #[error(
        "{routed} overlaps the cluster CIDR {pods}: the node would take pod addresses as its own"
    )]
    RouteOverClusterCidr {
        /// The Service CIDR.
        routed: IpNet,
        /// The pod network (`--cluster-cidr`).
        pods: IpNet,
    },
    /// Service CIDR routes without strict ARP.
    #[error(
        "Service CIDR routes (--bind-service-cidrs) need strict ARP (--ipvs-strict-arp): without it the node answers ARP for every address of the CIDRs"
    )]
    RoutesWithoutStrictArp,
}

impl Config {
    /// Checks the rules of [`Config::service_cidr_routes`]: no route over a cluster CIDR,
    /// and strict ARP on when there are routes. The daemon refuses a configuration that
    /// fails it; an embedder should too.
    pub fn check(&self) -> Result<(), ConfigError> {
        use super::service_cidr::overlaps;
        for routed in &self.service_cidr_routes {
            if let Some(pods) = self
                .cluster_cidrs
                .iter()
                .find(|pods| overlaps(routed, pods))
            {
                return Err(ConfigError::RouteOverClusterCidr {
                    routed: *routed,
                    pods: *pods,
                });
            }
        }
        if !self.service_cidr_routes.is_empty() && !self.strict_arp {
            return Err(ConfigError::RoutesWithoutStrictArp);
        }
        Ok(())
    }

    /// Whether `ip` falls in one of the excluded CIDRs.
    pub fn is_excluded(&self, ip: IpAddr) -> bool {
        self.exclude_cidrs.iter().any(|net| net.contains(&ip))
    }

    /// Whether `ip` lies in a Service CIDR bound as a local route
    /// ([`Config::service_cidr_routes`]).
    pub fn is_routed(&self, ip: IpAddr) -> bool {
        self.service_cidr_routes.iter().any(|net| net.contains(&ip))
    }
}

#[cfg(test)]
mod tests {
    use super::InterfaceName;

    #[test]
    fn interface_names_are_checked() {
        for good in ["cbr0", "veth", "cali", "eth0.100", "br-1234567890ab", "a"] {
            assert_eq!(
                InterfaceName::new(good).map(|n| n.to_string()),
                Ok(good.to_owned())
            );
        }
        for bad in [
            "",
            "0123456789abcdef",
            "a b",
            "a/b",
            "a:b",
            "a\"b",
            "veth*",
            ".",
            "..",
            "tab\t",
            "\u{e9}",
        ] {
            assert!(InterfaceName::new(bad).is_err(), "{bad:?}");
        }
    }
}
