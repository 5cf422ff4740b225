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
        }
    }
}

impl Config {
    /// Whether `ip` falls in one of the excluded CIDRs.
    pub fn is_excluded(&self, ip: IpAddr) -> bool {
        self.exclude_cidrs.iter().any(|net| net.contains(&ip))
    }
}
