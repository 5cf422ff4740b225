//! Services and their ports, as the planner needs them.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use ipvs_netlink::{Protocol, Scheduler};

use super::error::ModelWarning;
use super::family::AddressFamily;

/// kube-proxy's default ClientIP affinity timeout (3 hours) when a Service does not set one.
pub const DEFAULT_CLIENT_IP_TIMEOUT_SECONDS: u32 = 10_800;

/// Namespace and name of a Service.
///
/// Both parts are shared strings: the engine keeps a Service's name, and the names of its
/// ports, in several maps (state, plan, reconciler, netfilter tracker), and a clone is two
/// reference counts, not two allocations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceName {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
}

impl ServiceName {
    /// A Service name.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        ServiceName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The name of one port of this Service.
    pub fn port(&self, port_name: &str, protocol: Protocol) -> ServicePortName {
        ServicePortName {
            namespace: Arc::clone(&self.namespace),
            name: Arc::clone(&self.name),
            port: port_name.into(),
            protocol,
        }
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Identifies one port of one Service: `namespace/name:port-name` plus protocol,
/// the unit of planning, change tracking and error reporting. Its strings are shared, as
/// [`ServiceName`]'s are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    /// Namespace of the Service.
    pub namespace: Arc<str>,
    /// Name of the Service.
    pub name: Arc<str>,
    /// Name of the port within the Service (may be empty for single-port Services).
    pub port: Arc<str>,
    /// Transport protocol of the port.
    pub protocol: Protocol,
}

impl ServicePortName {
    /// The Service this port belongs to (sharing its strings).
    pub fn service(&self) -> ServiceName {
        ServiceName {
            namespace: Arc::clone(&self.namespace),
            name: Arc::clone(&self.name),
        }
    }

    /// How this port's Service orders against `service` (the order of [`ServiceName`],
    /// which the port names' own order follows first).
    pub(crate) fn service_cmp(&self, service: &ServiceName) -> std::cmp::Ordering {
        (&self.namespace, &self.name).cmp(&(&service.namespace, &service.name))
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        write!(f, "/{}", self.protocol)
    }
}

/// A traffic policy (`externalTrafficPolicy` / `internalTrafficPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TrafficPolicy {
    /// Any ready endpoint in the cluster (the default).
    #[default]
    Cluster,
    /// Only endpoints on this node, with kube-proxy's fallbacks.
    Local,
}

/// Session affinity of a Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionAffinity {
    /// No affinity.
    #[default]
    None,
    /// ClientIP affinity: IPVS persistence with this timeout.
    ClientIp {
        /// Persistence timeout in seconds (kube-proxy's default is
        /// [`DEFAULT_CLIENT_IP_TIMEOUT_SECONDS`]).
        timeout_seconds: u32,
    },
}

/// How a load balancer delivers traffic for an ingress IP (`status.loadBalancer.ingress[].ipMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IpMode {
    /// Packets arrive addressed to the ingress IP: the node must serve it (the default).
    #[default]
    Vip,
    /// The load balancer proxies to the node: no virtual server for the ingress IP.
    Proxy,
}

/// One load-balancer ingress IP of a Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoadBalancerIngress {
    /// Ingress IP.
    pub ip: IpAddr,
    /// Delivery mode.
    pub ip_mode: IpMode,
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePortSpec {
    /// Port name (may be empty for single-port Services).
    pub name: String,
    /// Service port (the virtual port on ClusterIPs, ExternalIPs and LB IPs).
    pub port: u16,
    /// Transport protocol.
    pub protocol: Protocol,
    /// NodePort, if allocated.
    pub node_port: Option<u16>,
}

/// A Service, as proxied: every field the IPVS planner and netfilter need, already validated.
///
/// Services kube-proxy does not proxy (ExternalName, headless, labelled
/// `service.kubernetes.io/service-proxy-name`) are never represented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Namespace and name.
    pub name: ServiceName,
    /// ClusterIPs, at most one per family, primary first (dual-stack Services have two).
    pub cluster_ips: Vec<IpAddr>,
    /// Ports.
    pub ports: Vec<ServicePortSpec>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress` entries that carry an IP.
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    /// `spec.loadBalancerSourceRanges` (a zero-length prefix means "allow any").
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// Session affinity.
    pub session_affinity: SessionAffinity,
    /// Effective external traffic policy: `Local` only for externally accessible Services
    /// (NodePort, LoadBalancer, or ClusterIP with externalIPs) that ask for it, as kube-proxy
    /// reads it.
    pub external_traffic_policy: TrafficPolicy,
    /// Internal traffic policy.
    pub internal_traffic_policy: TrafficPolicy,
    /// Health-check NodePort (LoadBalancer Services with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<u16>,
    /// Scheduler chosen by [`super::SCHEDULER_ANNOTATION`]; `None` = the configured default.
    pub scheduler: Option<Scheduler>,
    /// Things ignored while reading the object (it is still used).
    pub warnings: Vec<ModelWarning>,
}

impl Service {
    /// A minimal ClusterIP Service with these ClusterIPs and ports and every other field at
    /// its default (handy for embedders and tests).
    pub fn new(name: ServiceName, cluster_ips: Vec<IpAddr>, ports: Vec<ServicePortSpec>) -> Self {
        Service {
            name,
            cluster_ips,
            ports,
            external_ips: Vec::new(),
            load_balancer_ingress: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            session_affinity: SessionAffinity::None,
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            scheduler: None,
            warnings: Vec::new(),
        }
    }

    /// The ClusterIP of one family, if the Service has one.
    pub fn cluster_ip(&self, family: AddressFamily) -> Option<IpAddr> {
        self.cluster_ips
            .iter()
            .copied()
            .find(|ip| AddressFamily::of(*ip) == family)
    }

    /// The Service's addresses in `family`, or `None` when it has no ClusterIP there: a
    /// family is served only when the Service has a ClusterIP in it. The one rule the IPVS
    /// plan and the netfilter plan both follow.
    pub fn addresses_of(&self, family: AddressFamily) -> Option<FamilyAddresses> {
        let in_family = |ip: &IpAddr| AddressFamily::of(*ip) == family;
        Some(FamilyAddresses {
            cluster_ip: self.cluster_ip(family)?,
            external_ips: self
                .external_ips
                .iter()
                .copied()
                .filter(in_family)
                .collect(),
            load_balancer_ips: self.load_balancer_vips().filter(in_family).collect(),
        })
    }

    /// The port with this name and protocol.
    pub fn port(&self, name: &str, protocol: Protocol) -> Option<&ServicePortSpec> {
        self.ports
            .iter()
            .find(|p| p.name == name && p.protocol == protocol)
    }

    /// Names of all ports of this Service.
    pub fn port_names(&self) -> impl Iterator<Item = ServicePortName> + '_ {
        self.ports
            .iter()
            .map(|p| self.name.port(&p.name, p.protocol))
    }

    /// Load-balancer ingress IPs that need a virtual server (ipMode VIP).
    pub fn load_balancer_vips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.load_balancer_ingress
            .iter()
            .filter(|i| i.ip_mode == IpMode::Vip)
            .map(|i| i.ip)
    }
}

/// A Service's addresses in one address family ([`Service::addresses_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyAddresses {
    /// The ClusterIP of the family.
    pub cluster_ip: IpAddr,
    /// `spec.externalIPs` of the family.
    pub external_ips: Vec<IpAddr>,
    /// Load-balancer ingress IPs of the family in `VIP` mode.
    pub load_balancer_ips: Vec<IpAddr>,
}

impl FamilyAddresses {
    /// Whether the Service is reachable from outside the cluster on a port of this family:
    /// it has a NodePort (`node_port`), an external IP or a load-balancer IP.
    pub fn externally_accessible(&self, node_port: Option<u16>) -> bool {
        node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }
}
