//! The planner: a pure function from cluster state, node and configuration to [`Desired`].
//!
//! It follows kube-proxy's IPVS mode:
//! - per address family on its own (a family is planned only when the Service has a
//!   ClusterIP of that family, and an IPv4 virtual server only gets IPv4 real servers);
//! - a virtual server on the ClusterIP, on each ExternalIP, on each load-balancer ingress IP
//!   whose ipMode is VIP, and on every eligible node address for the NodePort;
//! - endpoints chosen as kube-proxy's `CategorizeEndpoints` does: ready endpoints (narrowed by
//!   topology hints when every ready endpoint has one and one matches this node or zone),
//!   falling back to serving-and-terminating endpoints when none is ready; traffic-policy
//!   `Local` virtual servers use this node's endpoints and, when it has none, fall back to the
//!   cluster-wide set (kube-proxy's IPVS behaviour, kubernetes#97081);
//! - ClientIP affinity as persistence on every virtual server of the Service;
//! - Services whose addresses lie in `exclude_cidrs` are planned like any other (as
//!   kube-proxy: the excluded ranges only protect IPVS services the proxier did not create,
//!   see [`crate::diff::Scope::owns`]).
//!
//! Beyond kube-proxy it applies the per-Service scheduler annotation and per-endpoint weights.
//!
//! [`Planner::plan_service`] plans one Service whole, in one pass: with its ports' IPVS
//! plans come its nftables set elements ([`netfilter`]), from the same families, node-owned
//! addresses and endpoints, and its health check. Which UDP flows a change of plan makes
//! stale is decided from the plans ([`crate::flows`]).

pub mod netfilter;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::desired::netfilter::NetfilterPlan;
use crate::desired::{
    Desired, RealServer, RealServerKey, Scheduler, ServicePortName, ServicePortPlan, SortedMap,
    VirtualServer, VirtualServerKey, VirtualServerRole,
};
use crate::health_check::{HealthCheck, NoLocalEndpoints, local_endpoints_of};
use crate::model::{
    AddressFamily, Config, Endpoint, EndpointSlice, FamilyAddresses, NodeContext,
    NodePortAddresses, Service, ServicePortSpec, SessionAffinity, TrafficPolicy,
};
use crate::state::ClusterState;
use netfilter::{FamilyElements, empty_plan};

/// Plans the whole node.
pub fn plan(state: &ClusterState, node: &NodeContext, config: &Config) -> Desired {
    Planner::new(node, config).plan(state)
}

/// Plans one Service port: `None` when the port no longer exists or owns nothing.
pub fn plan_service_port(
    state: &ClusterState,
    name: &ServicePortName,
    node: &NodeContext,
    config: &Config,
) -> Option<ServicePortPlan> {
    Planner::new(node, config).plan_port(state, name)
}

/// Everything one Service asks of the node, planned in one pass ([`Planner::plan_service`]):
/// what the engine applies when the Service or its EndpointSlices change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePlan {
    /// The IPVS plan of each of its ports that owns something (ports that own nothing are
    /// left out, as in [`Desired`]).
    pub ports: BTreeMap<ServicePortName, ServicePortPlan>,
    /// The nftables set elements it contributes: an [`empty_plan`] holding only them.
    pub netfilter: NetfilterPlan,
    /// Its health check, when it needs one ([`crate::health_check::health_check_of`]).
    pub health_check: Option<HealthCheck>,
    /// What it adds to the count of Services with no local endpoint
    /// ([`crate::health_check::no_local_endpoints_of`]).
    pub no_local_endpoints: NoLocalEndpoints,
}

/// A planner for one node and configuration, with the node-wide facts computed once.
#[derive(Debug, Clone)]
pub struct Planner<'a> {
    node: &'a NodeContext,
    config: &'a Config,
    node_port_addresses: [Vec<IpAddr>; 2],
    /// The tables with no element ([`empty_plan`]), which each Service's elements start from.
    empty_netfilter: NetfilterPlan,
}

/// A Service in one family it is planned in: what its IPVS and netfilter intents of that
/// family both start from, decided once for all its ports.
struct ServiceFamily {
    family: AddressFamily,
    addresses: FamilyAddresses,
    /// Its ExternalIPs and load-balancer IPs that the node holds on an interface of its
    /// own: never bound on the dummy link.
    node_owned: BTreeSet<IpAddr>,
}

/// One Service as each of its ports is planned: what is decided once per Service.
struct ServiceContext<'s> {
    service: &'s Service,
    template: VsTemplate,
    /// The families it is planned in: proxied ones where it has a ClusterIP.
    families: Vec<ServiceFamily>,
}

impl<'a> Planner<'a> {
    /// A planner for this node and configuration.
    pub fn new(node: &'a NodeContext, config: &'a Config) -> Self {
        Planner {
            node,
            config,
            node_port_addresses: AddressFamily::ALL
                .map(|family| node_port_addresses(node, config, family)),
            empty_netfilter: empty_plan(config),
        }
    }

    /// Plans every Service port in the state. Ports that own nothing are left out.
    pub fn plan(&self, state: &ClusterState) -> Desired {
        let mut plans = Vec::with_capacity(state.service_count());
        for service in state.services() {
            let context = self.context(service);
            for port in &service.ports {
                let endpoints = endpoints_for_port(port, state.slices_of(&service.name));
                let plan = self.plan_port_endpoints(&context, port, &endpoints, |_, _| {});
                if !plan.virtual_servers.is_empty() {
                    plans.push((service.name.port(&port.name, port.protocol), plan));
                }
            }
        }
        // Collecting sorts once and bulk-builds the map (cheaper than 10k random inserts).
        Desired {
            services: plans.into_iter().collect(),
        }
    }

    /// Plans one Service port of the state: `None` when the port no longer exists or owns
    /// nothing (both mean: remove whatever it had).
    pub fn plan_port(
        &self,
        state: &ClusterState,
        name: &ServicePortName,
    ) -> Option<ServicePortPlan> {
        let service_name = name.service();
        let service = state.service(&service_name)?;
        let port = service.port(&name.port, name.protocol)?;
        let plan = self.plan_service_port(service, port, state.slices_of(&service_name));
        (!plan.virtual_servers.is_empty()).then_some(plan)
    }

    /// Plans a set of Service ports, typically the dirty set returned by
    /// [`ClusterState::apply`]: the incremental path.
    pub fn plan_ports<'n>(
        &self,
        state: &ClusterState,
        names: impl IntoIterator<Item = &'n ServicePortName>,
    ) -> BTreeMap<ServicePortName, Option<ServicePortPlan>> {
        names
            .into_iter()
            .map(|name| (name.clone(), self.plan_port(state, name)))
            .collect()
    }

    /// Applies one change to the state and plans the Service ports it dirtied: one step of
    /// the incremental path, costing the size of the change (not of the cluster).
    pub fn apply_and_plan(
        &self,
        state: &mut ClusterState,
        change: crate::state::Change,
    ) -> BTreeMap<ServicePortName, Option<ServicePortPlan>> {
        let dirty = state.apply(change);
        self.plan_ports(state, &dirty)
    }

    /// Plans one Service of the state whole, in one pass: the IPVS plan of each port, the
    /// nftables set elements, the health check and the no-local-endpoint counts. Each
    /// port's endpoints are gathered once and feed both its real servers and its hairpin
    /// elements.
    pub fn plan_service(&self, state: &ClusterState, service: &Service) -> ServicePlan {
        let mut netfilter = self.empty_netfilter.clone();
        let ports = self.plan_service_into(state, service, &mut netfilter);
        let (health_check, no_local_endpoints) =
            local_endpoints_of(service, state.slices_of(&service.name), &self.node.name);
        ServicePlan {
            ports,
            netfilter,
            health_check,
            no_local_endpoints,
        }
    }

    /// The nftables set elements of every Service in the state, in `config`'s tables.
    pub(crate) fn plan_netfilter(&self, state: &ClusterState) -> NetfilterPlan {
        let mut out = self.empty_netfilter.clone();
        for service in state.services() {
            self.plan_service_into(state, service, &mut out);
        }
        out
    }

    /// Plans the ports of `service` and adds its set elements to `netfilter`.
    fn plan_service_into(
        &self,
        state: &ClusterState,
        service: &Service,
        netfilter: &mut NetfilterPlan,
    ) -> BTreeMap<ServicePortName, ServicePortPlan> {
        let context = self.context(service);
        let elements: Vec<FamilyElements> = context
            .families
            .iter()
            .map(|family| {
                FamilyElements::new(
                    service,
                    family.family,
                    &family.addresses,
                    &family.node_owned,
                    self.node,
                )
            })
            .collect();
        for (family, elements) in context.families.iter().zip(&elements) {
            if let Some(out) = netfilter.family_mut(family.family) {
                elements.add_service(out);
            }
        }
        let mut ports = BTreeMap::new();
        for port in &service.ports {
            let endpoints = endpoints_for_port(port, state.slices_of(&service.name));
            let plan = self.plan_port_endpoints(&context, port, &endpoints, |index, endpoints| {
                if let Some(out) = netfilter.family_mut(context.families[index].family) {
                    elements[index].add_port(out, port, endpoints);
                }
            });
            if !plan.virtual_servers.is_empty() {
                // As `Service::port`: of two ports with one name and protocol, the first.
                ports
                    .entry(service.name.port(&port.name, port.protocol))
                    .or_insert(plan);
            }
        }
        ports
    }

    /// Plans one port of a Service from its EndpointSlices: the pure core of the planner.
    pub fn plan_service_port<'s>(
        &self,
        service: &Service,
        port: &ServicePortSpec,
        slices: impl IntoIterator<Item = &'s EndpointSlice>,
    ) -> ServicePortPlan {
        let endpoints = endpoints_for_port(port, slices);
        self.plan_port_endpoints(&self.context(service), port, &endpoints, |_, _| {})
    }

    /// What is decided once per Service, whichever port is planned.
    fn context<'s>(&self, service: &'s Service) -> ServiceContext<'s> {
        let scheduler = service
            .scheduler
            .clone()
            .unwrap_or_else(|| self.config.scheduler.clone());
        let template = VsTemplate {
            // As kube-proxy: only `mh` gets the source-port flag; `sh` keeps hashing on the
            // source address alone (per-client stickiness).
            hash_source_port: scheduler == Scheduler::MaglevHashing,
            scheduler,
            persistence_timeout: match service.session_affinity {
                SessionAffinity::None => None,
                SessionAffinity::ClientIp { timeout_seconds } => Some(timeout_seconds),
            },
        };
        let families = AddressFamily::ALL
            .into_iter()
            .filter(|family| self.config.families.contains(family))
            .filter_map(|family| {
                let addresses = service.addresses_of(family)?;
                let node_owned = addresses
                    .external_ips
                    .iter()
                    .chain(&addresses.load_balancer_ips)
                    .copied()
                    .filter(|ip| self.node.owns(*ip))
                    .collect();
                Some(ServiceFamily {
                    family,
                    addresses,
                    node_owned,
                })
            })
            .collect();
        ServiceContext {
            service,
            template,
            families,
        }
    }

    /// Plans one port from its endpoints (all families); `each_family` is handed each of
    /// the Service's families (by index) with the endpoints of that family, as the IPVS
    /// plan used them.
    fn plan_port_endpoints(
        &self,
        context: &ServiceContext,
        port: &ServicePortSpec,
        endpoints: &[(RealServerKey, &Endpoint)],
        mut each_family: impl FnMut(usize, &[(RealServerKey, &Endpoint)]),
    ) -> ServicePortPlan {
        let mut plan = ServicePortPlan::default();
        for (index, family) in context.families.iter().enumerate() {
            let family_endpoints: Vec<(RealServerKey, &Endpoint)> = endpoints
                .iter()
                .filter(|(key, _)| AddressFamily::of(key.address) == family.family)
                .copied()
                .collect();
            self.plan_family(context, port, family, &family_endpoints, &mut plan);
            each_family(index, &family_endpoints);
        }
        // Whether every planned ClusterIP lies in a routed Service CIDR (none planned: no).
        plan.cluster_ips_routed = !context.families.is_empty()
            && context
                .families
                .iter()
                .all(|family| self.config.is_routed(family.addresses.cluster_ip));
        plan
    }

    /// The addresses the plans of `service`'s ports bind on the dummy link
    /// ([`ServicePortPlan::bound_addresses`]), decided without its endpoints: each port is
    /// planned with none, which changes which real servers it has, not which addresses it
    /// binds. For binding a start's addresses before the EndpointSlices are in
    /// ([`crate::Proxier::bind_ahead`]).
    pub fn bound_addresses(&self, service: &Service) -> BTreeSet<IpAddr> {
        let context = self.context(service);
        let mut addresses = BTreeSet::new();
        for port in &service.ports {
            let plan = self.plan_port_endpoints(&context, port, &[], |_, _| {});
            addresses.extend(plan.bound_addresses());
        }
        addresses
    }

    fn plan_family(
        &self,
        context: &ServiceContext,
        port: &ServicePortSpec,
        family: &ServiceFamily,
        endpoints: &[(RealServerKey, &Endpoint)],
        plan: &mut ServicePortPlan,
    ) {
        let service = context.service;
        let addresses = &family.addresses;
        let externally_accessible = addresses.externally_accessible(port.node_port);
        let internal_local = service.internal_traffic_policy == TrafficPolicy::Local;
        let external_local = service.external_traffic_policy == TrafficPolicy::Local;
        let policy = EndpointPolicy {
            uses_cluster: !internal_local || externally_accessible,
            uses_local: internal_local || (external_local && externally_accessible),
        };
        let categorized = categorize_endpoints(
            endpoints,
            policy,
            &self.node.name,
            self.node.zone.as_deref(),
        );
        let internal = real_servers(categorized.for_policy(internal_local));
        let mut vs = |address: IpAddr,
                      vport: u16,
                      role: VirtualServerRole,
                      rs: &SortedMap<RealServerKey, RealServer>| {
            let key = VirtualServerKey {
                address,
                port: vport,
                protocol: port.protocol,
            };
            plan.virtual_servers
                .insert(key, context.template.build(role, rs.clone()));
        };
        vs(
            addresses.cluster_ip,
            port.port,
            VirtualServerRole::ClusterIp,
            &internal,
        );
        if !externally_accessible {
            return;
        }
        let external = real_servers(categorized.for_policy(external_local));
        for ip in &addresses.external_ips {
            vs(*ip, port.port, VirtualServerRole::ExternalIp, &external);
        }
        for ip in &addresses.load_balancer_ips {
            vs(*ip, port.port, VirtualServerRole::LoadBalancer, &external);
        }
        if let Some(node_port) = port.node_port {
            let index = family.family as usize;
            for ip in &self.node_port_addresses[index] {
                vs(*ip, node_port, VirtualServerRole::NodePort, &external);
            }
        }
        plan.node_owned_addresses
            .extend(family.node_owned.iter().copied());
    }
}

struct VsTemplate {
    scheduler: Scheduler,
    persistence_timeout: Option<u32>,
    hash_source_port: bool,
}

impl VsTemplate {
    fn build(
        &self,
        role: VirtualServerRole,
        real_servers: SortedMap<RealServerKey, RealServer>,
    ) -> VirtualServer {
        VirtualServer {
            role,
            scheduler: self.scheduler.clone(),
            persistence_timeout: self.persistence_timeout,
            hash_source_port: self.hash_source_port,
            real_servers,
        }
    }
}

fn real_servers(endpoints: &[(RealServerKey, &Endpoint)]) -> SortedMap<RealServerKey, RealServer> {
    endpoints
        .iter()
        .map(|(key, ep)| {
            (
                *key,
                RealServer {
                    weight: ep.weight.unwrap_or(1),
                },
            )
        })
        .collect()
}

/// The endpoints of one Service port across its slices, deduplicated by address and port.
///
/// When two slices list the same address and port (an endpoint moving between slices, or a
/// Pod IP reused while the old Pod terminates), a non-terminating entry wins.
pub fn endpoints_for_port<'s>(
    port: &ServicePortSpec,
    slices: impl IntoIterator<Item = &'s EndpointSlice>,
) -> Vec<(RealServerKey, &'s Endpoint)> {
    let mut all: Vec<(RealServerKey, &Endpoint)> = Vec::new();
    for slice in slices {
        let Some(target_port) = slice.port_for(&port.name, port.protocol) else {
            continue;
        };
        all.extend(slice.endpoints.iter().map(|endpoint| {
            (
                RealServerKey {
                    address: endpoint.address,
                    port: target_port,
                },
                endpoint,
            )
        }));
    }
    // Stable sort: equal keys keep slice order, so the first entry wins unless a later one
    // is not terminating.
    all.sort_by_key(|(key, _)| *key);
    let mut out: Vec<(RealServerKey, &Endpoint)> = Vec::with_capacity(all.len());
    for (key, endpoint) in all {
        match out.last_mut() {
            Some(last) if last.0 == key => {
                if !endpoint.terminating {
                    *last = (key, endpoint);
                }
            }
            _ => out.push((key, endpoint)),
        }
    }
    out
}

/// Which endpoint sets a Service port needs (kube-proxy's `UsesClusterEndpoints` /
/// `UsesLocalEndpoints`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointPolicy {
    /// Some traffic goes to cluster-wide endpoints.
    pub uses_cluster: bool,
    /// Some traffic goes to node-local endpoints.
    pub uses_local: bool,
}

/// The result of [`categorize_endpoints`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CategorizedEndpoints<'e> {
    /// Endpoints for traffic policy Cluster (empty when the port does not use them).
    pub cluster: Vec<(RealServerKey, &'e Endpoint)>,
    /// Endpoints for traffic policy Local (empty when the port does not use them, or when
    /// this node has no usable endpoint).
    pub local: Vec<(RealServerKey, &'e Endpoint)>,
}

impl<'e> CategorizedEndpoints<'e> {
    /// The endpoints a virtual server with this policy uses: Local ones when it is Local and
    /// there are any, otherwise the cluster-wide ones (kube-proxy's IPVS fallback).
    pub fn for_policy(&self, local: bool) -> &[(RealServerKey, &'e Endpoint)] {
        if local && !self.local.is_empty() {
            &self.local
        } else {
            &self.cluster
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopologyMode {
    None,
    PreferSameNode,
    PreferSameZone,
}

fn topology_mode(
    endpoints: &[(RealServerKey, &Endpoint)],
    node: &str,
    zone: Option<&str>,
) -> TopologyMode {
    let mut any_ready = false;
    let (mut all_node_hints, mut hint_for_node) = (true, false);
    let (mut all_zone_hints, mut hint_for_zone) = (true, false);
    for (_, ep) in endpoints.iter().filter(|(_, ep)| ep.ready) {
        any_ready = true;
        if ep.node_hints.is_empty() {
            all_node_hints = false;
        } else if ep.node_hints.iter().any(|h| &**h == node) {
            hint_for_node = true;
        }
        if ep.zone_hints.is_empty() {
            all_zone_hints = false;
        } else if zone.is_some_and(|z| ep.zone_hints.iter().any(|h| &**h == z)) {
            hint_for_zone = true;
        }
    }
    if !any_ready {
        TopologyMode::None
    } else if all_node_hints && hint_for_node {
        TopologyMode::PreferSameNode
    } else if all_zone_hints && hint_for_zone {
        TopologyMode::PreferSameZone
    } else {
        TopologyMode::None
    }
}

/// Splits one family's endpoints into the cluster-wide and node-local sets, as kube-proxy's
/// `CategorizeEndpoints` does (ready first, serving-and-terminating as the fallback, each set
/// on its own; topology hints narrow the cluster-wide set).
pub fn categorize_endpoints<'e>(
    endpoints: &[(RealServerKey, &'e Endpoint)],
    policy: EndpointPolicy,
    node_name: &str,
    zone: Option<&str>,
) -> CategorizedEndpoints<'e> {
    let mut out = CategorizedEndpoints::default();
    if endpoints.is_empty() {
        return out;
    }
    let serving_terminating = |ep: &Endpoint| ep.serving && ep.terminating;
    if policy.uses_cluster {
        let mode = topology_mode(endpoints, node_name, zone);
        let in_topology = |ep: &Endpoint| match mode {
            TopologyMode::None => true,
            TopologyMode::PreferSameNode => ep.node_hints.iter().any(|h| &**h == node_name),
            TopologyMode::PreferSameZone => {
                zone.is_some_and(|z| ep.zone_hints.iter().any(|h| &**h == z))
            }
        };
        out.cluster = endpoints
            .iter()
            .filter(|(_, ep)| ep.ready && in_topology(ep))
            .copied()
            .collect();
        if out.cluster.is_empty() {
            out.cluster = endpoints
                .iter()
                .filter(|(_, ep)| serving_terminating(ep))
                .copied()
                .collect();
        }
    }
    if policy.uses_local {
        let local = |ep: &Endpoint| ep.is_local(node_name);
        let has_local_ready = endpoints.iter().any(|(_, ep)| ep.ready && local(ep));
        out.local = endpoints
            .iter()
            .filter(|(_, ep)| {
                local(ep)
                    && if has_local_ready {
                        ep.ready
                    } else {
                        serving_terminating(ep)
                    }
            })
            .copied()
            .collect();
    }
    out
}

/// Node addresses that serve NodePorts for one family: chosen by
/// [`Config::node_port_addresses`], never loopback, IPv6 link-local, unspecified or
/// multicast.
pub fn node_port_addresses(
    node: &NodeContext,
    config: &Config,
    family: AddressFamily,
) -> Vec<IpAddr> {
    let all: BTreeSet<IpAddr> = node
        .local_addresses
        .iter()
        .chain(&node.primary_ips)
        .copied()
        .filter(|ip| AddressFamily::of(*ip) == family)
        .collect();
    let chosen: Vec<IpAddr> = match &config.node_port_addresses {
        NodePortAddresses::All => all.into_iter().collect(),
        NodePortAddresses::Primary => node
            .primary_ips
            .iter()
            .copied()
            .filter(|ip| AddressFamily::of(*ip) == family)
            .collect(),
        NodePortAddresses::Cidrs(cidrs) => {
            let cidrs: Vec<_> = cidrs
                .iter()
                .filter(|net| AddressFamily::of(net.addr()) == family)
                .collect();
            if cidrs.is_empty() || cidrs.iter().any(|net| net.prefix_len() == 0) {
                all.into_iter().collect()
            } else {
                all.into_iter()
                    .filter(|ip| cidrs.iter().any(|net| net.contains(ip)))
                    .collect()
            }
        }
    };
    let mut seen = BTreeSet::new();
    chosen
        .into_iter()
        .filter(|ip| usable_node_port_address(*ip))
        .filter(|ip| seen.insert(*ip))
        .collect()
}

/// kube-proxy's rule for NodePort addresses: never loopback, unspecified or multicast, nor
/// IPv6 link-local; IPv4 link-local addresses are allowed.
fn usable_node_port_address(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
        return false;
    }
    match ip {
        IpAddr::V4(v4) => !v4.is_broadcast(),
        IpAddr::V6(v6) => !v6.is_unicast_link_local(),
    }
}

#[cfg(test)]
mod tests;
