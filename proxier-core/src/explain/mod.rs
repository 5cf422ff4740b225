//! Why a Service does or does not answer on this node: its plan next to what the kernel
//! holds now, and every reason a client would not get through, in plain words.
//!
//! [`explain`] is pure: it takes the engine's picture (state, node, configuration, the
//! node's whole plan) and the [`KernelFacts`] read for the Service ([`kernel::read`]), and
//! returns an [`Explanation`], a document for programs (schema in `docs/explain.md`) that
//! [`render::render_text`] turns into text for people. `ipvs-proxier explain` is built on it.

pub mod kernel;
pub mod render;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use kernel::{HealthAnswer, KernelFacts, NetfilterSetRead};

use crate::desired::{
    Desired, ServicePortPlan, VirtualServer, VirtualServerKey, VirtualServerRole,
};
use crate::kernel_modules::{ModuleStatus, scheduler_module};
use crate::model::{AddressFamily, Config, NodeContext, ServiceName, TrafficPolicy};
use crate::netfilter::render::set_elements;
use crate::observed::{ObservedVirtualServer, VirtualServerSettings};
use crate::planner::{EndpointPolicy, Planner, categorize_endpoints, endpoints_for_port};
use crate::state::ClusterState;
use crate::view::role_name;

/// The `apiVersion` of every explanation document.
pub const EXPLAIN_API_VERSION: &str = "ipvs-proxier.explain/v1";

/// Everything [`explain`] reads of the engine: its picture of the cluster and of the node,
/// and the node's whole plan (to tell a foreign virtual server from another Service's).
#[derive(Debug, Clone, Copy)]
pub struct EnginePicture<'a> {
    /// Services and EndpointSlices.
    pub state: &'a ClusterState,
    /// The node.
    pub node: &'a NodeContext,
    /// The planner's configuration.
    pub config: &'a Config,
    /// The plan of every Service on this node.
    pub desired: &'a Desired,
}

/// How much a reason matters to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Severity {
    /// Worth knowing; clients get through.
    Info,
    /// Clients get through, but not as the Service asks, or not for long.
    Warning,
    /// Clients do not get through (on this path).
    Blocking,
}

/// The classes of reasons [`explain`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReasonKind {
    /// The source has no such Service (or it is not proxied: headless, ExternalName, or
    /// another proxy's).
    ServiceNotFound,
    /// A port has no endpoints at all.
    NoEndpoints,
    /// A port has endpoints, but none is ready and none is serving while terminating.
    NoReadyEndpoints,
    /// A port's only usable endpoints are terminating (still serving).
    OnlyTerminatingEndpoints,
    /// `externalTrafficPolicy: Local` and no usable endpoint on this node.
    ExternalPolicyLocalNoLocalEndpoints,
    /// `internalTrafficPolicy: Local` and no usable endpoint on this node.
    InternalPolicyLocalNoLocalEndpoints,
    /// `loadBalancerSourceRanges` leave the given client out.
    SourceRangesExcludeClient,
    /// `loadBalancerSourceRanges` restrict who reaches the load-balancer IPs.
    SourceRangesRestrict,
    /// The kernel cannot provide the IPVS scheduler a virtual server needs.
    SchedulerModuleMissing,
    /// The kernel differs from the plan (a virtual server, real server, address or set
    /// element missing or different).
    Drift,
    /// A virtual server on one of the Service's addresses that no Service plans.
    ForeignVirtualServer,
    /// The Service's health check does not answer as planned.
    HealthCheckMismatch,
    /// The running kernel refuses the proxier's nftables tables as the node's `nft` writes
    /// them: the daemon does not start.
    NetfilterRefused,
    /// A part of the kernel could not be read (IPVS, the dummy link, an nftables set): what
    /// depends on it is not checked.
    KernelUnreadable,
    /// The node is not eligible for traffic (its Node is being deleted): `/healthz` fails,
    /// so load balancers leave it.
    NodeNotEligible,
}

/// One reason, with where it applies and what it means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reason {
    /// Its class.
    pub kind: ReasonKind,
    /// How much it matters.
    pub severity: Severity,
    /// The Service port it concerns (`namespace/name:port/PROTOCOL`), if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// The virtual server it concerns (`ClusterIP 10.96.0.10:80/TCP`), if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_server: Option<String>,
    /// What it means for a client, in plain words.
    pub message: String,
}

/// Endpoints of one Service port, as the planner sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointCounts {
    /// All endpoints.
    pub total: usize,
    /// Ready ones.
    pub ready: usize,
    /// Not ready, but serving while terminating (used when none is ready).
    pub serving_terminating: usize,
    /// Usable endpoints on this node (ready, or serving-terminating when none is ready).
    pub local_usable: usize,
}

/// A real server, planned or in the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RealServerState {
    /// Endpoint address.
    pub address: IpAddr,
    /// Endpoint port.
    pub port: u16,
    /// Planned weight, `null` when the plan has no such real server.
    pub planned_weight: Option<u32>,
    /// Weight in the kernel, `null` when the kernel has none.
    pub kernel_weight: Option<u32>,
    /// Active connections (kernel).
    pub active_connections: u32,
    /// Inactive connections (kernel).
    pub inactive_connections: u32,
    /// Kept at weight 0 for its established connections only (no longer planned).
    pub draining: bool,
}

/// Settings of a virtual server (planned or in the kernel).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualServerSettingsDoc {
    /// IPVS scheduler name.
    pub scheduler: String,
    /// Persistence timeout in seconds (ClientIP affinity), `null` when none.
    pub persistence_timeout_seconds: Option<u32>,
    /// Source-port hashing flag.
    pub hash_source_port: bool,
}

impl VirtualServerSettingsDoc {
    fn of(settings: &VirtualServerSettings) -> Self {
        VirtualServerSettingsDoc {
            scheduler: settings.scheduler.name().to_owned(),
            persistence_timeout_seconds: settings.persistence_timeout,
            hash_source_port: settings.hash_source_port,
        }
    }
}

/// Where a virtual server's address is on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AddressState {
    /// Bound on the dummy link, as planned.
    Bound,
    /// Covered by a Service CIDR's local route, as planned.
    Routed,
    /// One of the node's own addresses (NodePorts, node-owned ExternalIPs): nothing to bind.
    NodeAddress,
    /// Planned on the dummy link, but not there.
    Missing,
    /// The link could not be read.
    Unknown,
}

/// One planned virtual server of a Service port, next to the kernel's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualServerState {
    /// `ClusterIP`, `NodePort`, `ExternalIP` or `LoadBalancer`.
    pub role: String,
    /// Virtual address.
    pub address: IpAddr,
    /// Virtual port.
    pub port: u16,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The planned settings.
    pub planned: VirtualServerSettingsDoc,
    /// The kernel's settings, `null` when the kernel has no such virtual server.
    pub kernel: Option<VirtualServerSettingsDoc>,
    /// Where its address is.
    pub address_state: AddressState,
    /// Real servers of the plan and of the kernel, by address and port.
    pub real_servers: Vec<RealServerState>,
}

/// One Service port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortState {
    /// `namespace/name:port/PROTOCOL`.
    pub name: String,
    /// Its endpoints.
    pub endpoints: EndpointCounts,
    /// Its planned virtual servers.
    pub virtual_servers: Vec<VirtualServerState>,
}

/// One element the plan puts in an nftables set for this Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetMembership {
    /// `ip` or `ip6`.
    pub family: String,
    /// Set name in the proxier's table.
    pub set: String,
    /// The element as `nft list set` prints it.
    pub element: String,
    /// Whether the kernel's set holds it (`null`: the set could not be read).
    pub present: Option<bool>,
}

/// The Service's health check (`externalTrafficPolicy: Local` with a health-check node port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheckState {
    /// `spec.healthCheckNodePort`.
    pub node_port: u16,
    /// Ready local endpoints, as planned.
    pub local_endpoints: usize,
    /// The status the plan says it answers: 200 with local endpoints, 503 without.
    pub expected_status: u16,
    /// The status it answered, `null` when it did not answer.
    pub answered_status: Option<u16>,
    /// Why it did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a Service does or does not answer on this node: the document of `ipvs-proxier
/// explain` (schema in `docs/explain.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Explanation {
    /// Always [`EXPLAIN_API_VERSION`].
    pub api_version: String,
    /// `namespace/name`.
    pub service: String,
    /// The node explained for.
    pub node: String,
    /// The client address asked about (`--client`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<IpAddr>,
    /// True when no reason is a warning or blocking.
    pub healthy: bool,
    /// Every reason, most severe first.
    pub reasons: Vec<Reason>,
    /// The Service's ports.
    pub ports: Vec<PortState>,
    /// The elements the plan puts in nftables sets for this Service.
    pub netfilter: Vec<SetMembership>,
    /// The health check, `null` when the Service has none.
    pub health_check: Option<HealthCheckState>,
    /// Virtual servers on the Service's addresses that no Service plans.
    pub foreign_virtual_servers: Vec<String>,
}

impl Explanation {
    /// The most severe reason's severity, `None` when there is no reason at all.
    pub fn worst(&self) -> Option<Severity> {
        self.reasons.iter().map(|r| r.severity).max()
    }
}

fn vs_label(role: VirtualServerRole, key: &VirtualServerKey) -> String {
    let address = match key.address {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    };
    format!(
        "{} {address}:{}/{}",
        role_name(role),
        key.port,
        key.protocol
    )
}

/// Collects reasons for one Service.
struct Reasons(Vec<Reason>);

impl Reasons {
    fn push(
        &mut self,
        kind: ReasonKind,
        severity: Severity,
        port: Option<&str>,
        vs: Option<&str>,
        message: String,
    ) {
        self.0.push(Reason {
            kind,
            severity,
            port: port.map(str::to_owned),
            virtual_server: vs.map(str::to_owned),
            message,
        });
    }
}

/// Explains `name` on this node: the plan the engine makes for it, next to `kernel`, and
/// every reason a client would not get through. `client` narrows the source-range check to
/// one caller.
pub fn explain(
    picture: EnginePicture<'_>,
    name: &ServiceName,
    kernel: &KernelFacts,
    client: Option<IpAddr>,
) -> Explanation {
    let mut reasons = Reasons(Vec::new());
    let mut out = Explanation {
        api_version: EXPLAIN_API_VERSION.to_owned(),
        service: name.to_string(),
        node: picture.node.name.clone(),
        client,
        healthy: false,
        reasons: Vec::new(),
        ports: Vec::new(),
        netfilter: Vec::new(),
        health_check: None,
        foreign_virtual_servers: Vec::new(),
    };
    if !picture.node.eligible {
        reasons.push(
            ReasonKind::NodeNotEligible,
            Severity::Warning,
            None,
            None,
            "the node is being deleted: /healthz answers 503, so load balancers send it \
             nothing"
                .to_owned(),
        );
    }
    let Some(service) = picture.state.service(name) else {
        reasons.push(
            ReasonKind::ServiceNotFound,
            Severity::Blocking,
            None,
            None,
            format!(
                "no proxied Service {name}: it does not exist, or it is headless, \
                 ExternalName or left to another proxy"
            ),
        );
        return finish(out, reasons);
    };
    unreadable_reasons(&mut reasons, kernel);
    let planner = Planner::new(picture.node, picture.config);
    let plan = planner.plan_service(picture.state, service);
    let node_name = picture.node.name.as_str();
    let zone = picture.node.zone.as_deref();

    for spec in &service.ports {
        let port_name = service.name.port(&spec.name, spec.protocol);
        let label = port_name.to_string();
        let endpoints = endpoints_for_port(spec, picture.state.slices_of(name));
        let both = EndpointPolicy {
            uses_cluster: true,
            uses_local: true,
        };
        let categorized = categorize_endpoints(&endpoints, both, node_name, zone);
        let counts = EndpointCounts {
            total: endpoints.len(),
            ready: endpoints.iter().filter(|(_, e)| e.ready).count(),
            serving_terminating: endpoints
                .iter()
                .filter(|(_, e)| !e.ready && e.serving && e.terminating)
                .count(),
            local_usable: categorized.local.len(),
        };
        endpoint_reasons(&mut reasons, &label, &counts);
        let port_plan = plan.ports.get(&port_name);
        let externally_accessible = AddressFamily::ALL.into_iter().any(|family| {
            service
                .addresses_of(family)
                .is_some_and(|a| a.externally_accessible(spec.node_port))
        });
        let usable = counts.ready + counts.serving_terminating;
        if usable > 0 && counts.local_usable == 0 {
            if service.external_traffic_policy == TrafficPolicy::Local && externally_accessible {
                let check = service
                    .health_check_node_port
                    .map(|p| format!(" its health check (node port {p}) answers 503, so"))
                    .unwrap_or_default();
                reasons.push(
                    ReasonKind::ExternalPolicyLocalNoLocalEndpoints,
                    Severity::Blocking,
                    Some(&label),
                    None,
                    format!(
                        "externalTrafficPolicy: Local and no usable endpoint on node \
                         {node_name}:{check} load balancers should not send traffic here; \
                         NodePort, ExternalIP and load-balancer traffic that still arrives \
                         goes to other nodes' endpoints without masquerade, so the replies \
                         do not come back through this node"
                    ),
                );
            }
            if service.internal_traffic_policy == TrafficPolicy::Local {
                let empty = port_plan.is_some_and(|p| {
                    p.virtual_servers.iter().any(|(_, vs)| {
                        vs.role == VirtualServerRole::ClusterIp && vs.real_servers.is_empty()
                    })
                });
                let (severity, what) = if empty {
                    (
                        Severity::Blocking,
                        "connections from this node to the ClusterIP find no real server",
                    )
                } else {
                    (
                        Severity::Warning,
                        "the ClusterIP falls back to the cluster's endpoints because the \
                         Service is reachable from outside",
                    )
                };
                reasons.push(
                    ReasonKind::InternalPolicyLocalNoLocalEndpoints,
                    severity,
                    Some(&label),
                    None,
                    format!(
                        "internalTrafficPolicy: Local and no usable endpoint on node \
                         {node_name}: {what}"
                    ),
                );
            }
        }
        let virtual_servers = port_plan
            .map(|p| virtual_server_states(&mut reasons, &label, p, service, kernel, client))
            .unwrap_or_default();
        out.ports.push(PortState {
            name: label,
            endpoints: counts,
            virtual_servers,
        });
    }

    out.netfilter = set_memberships(&mut reasons, &plan.netfilter, kernel);
    out.health_check = plan.health_check.map(|check| {
        let expected_status = if check.passes() { 200 } else { 503 };
        let (answered_status, error) = match kernel.health_checks.get(&check.node_port) {
            Some(Ok(answer)) => (Some(answer.status), None),
            Some(Err(error)) => (None, Some(error.clone())),
            None => (None, Some("not probed".to_owned())),
        };
        if answered_status != Some(expected_status) {
            let answered = answered_status
                .map(|s| s.to_string())
                .unwrap_or_else(|| format!("nothing ({})", error.as_deref().unwrap_or("")));
            reasons.push(
                ReasonKind::HealthCheckMismatch,
                Severity::Warning,
                None,
                None,
                format!(
                    "the health check on node port {} should answer {expected_status} \
                     ({} local endpoints) but answered {answered}: is the daemon running \
                     with this configuration?",
                    check.node_port, check.local_endpoints
                ),
            );
        }
        HealthCheckState {
            node_port: check.node_port,
            local_endpoints: check.local_endpoints,
            expected_status,
            answered_status,
            error,
        }
    });
    out.foreign_virtual_servers = foreign(&mut reasons, &picture, service, kernel);
    finish(out, reasons)
}

fn finish(mut out: Explanation, reasons: Reasons) -> Explanation {
    let mut reasons = reasons.0;
    // Most severe first; within a severity, in the order found.
    reasons.sort_by_key(|r| std::cmp::Reverse(r.severity));
    out.healthy = reasons.iter().all(|r| r.severity == Severity::Info);
    out.reasons = reasons;
    out
}

fn unreadable_reasons(reasons: &mut Reasons, kernel: &KernelFacts) {
    if let Some(refusal) = &kernel.netfilter_refused {
        reasons.push(
            ReasonKind::NetfilterRefused,
            Severity::Blocking,
            None,
            None,
            format!("the daemon cannot start on this node: {refusal}"),
        );
    }
    let mut unreadable = Vec::new();
    if let Err(error) = &kernel.virtual_servers {
        unreadable.push(format!("the IPVS table ({error})"));
    }
    match (&kernel.link_addresses, &kernel.local_routes) {
        (Err(error), _) | (_, Err(error)) => {
            unreadable.push(format!("the addresses of {} ({error})", kernel.link));
        }
        _ => {}
    }
    match &kernel.missing_tables {
        Err(error) => unreadable.push(format!("the nftables tables ({error})")),
        Ok(missing) => {
            for table in missing {
                reasons.push(
                    ReasonKind::Drift,
                    Severity::Blocking,
                    None,
                    None,
                    format!(
                        "nftables table {table} is missing: the proxier's filtering and \
                         masquerading are not in place (has the daemon programmed this node?)"
                    ),
                );
            }
        }
    }
    for ((family, set), read) in &kernel.netfilter_sets {
        if let Err(error) = read {
            unreadable.push(format!("nftables set {family} {set} ({error})"));
        }
    }
    for what in unreadable {
        reasons.push(
            ReasonKind::KernelUnreadable,
            Severity::Warning,
            None,
            None,
            format!("cannot read {what}: what depends on it is not checked"),
        );
    }
}

fn endpoint_reasons(reasons: &mut Reasons, label: &str, counts: &EndpointCounts) {
    if counts.total == 0 {
        reasons.push(
            ReasonKind::NoEndpoints,
            Severity::Blocking,
            Some(label),
            None,
            "no endpoints: no EndpointSlice lists an endpoint for this port (does the \
             selector match any Pod?)"
                .to_owned(),
        );
    } else if counts.ready == 0 && counts.serving_terminating == 0 {
        reasons.push(
            ReasonKind::NoReadyEndpoints,
            Severity::Blocking,
            Some(label),
            None,
            format!(
                "none of its {} endpoints is ready (or serving while terminating): \
                 connections find no real server",
                counts.total
            ),
        );
    } else if counts.ready == 0 {
        reasons.push(
            ReasonKind::OnlyTerminatingEndpoints,
            Severity::Warning,
            Some(label),
            None,
            format!(
                "only terminating endpoints: traffic goes to {} endpoints that are shutting \
                 down, and stops when they are gone",
                counts.serving_terminating
            ),
        );
    }
}

fn virtual_server_states(
    reasons: &mut Reasons,
    label: &str,
    plan: &ServicePortPlan,
    service: &crate::model::Service,
    kernel: &KernelFacts,
    client: Option<IpAddr>,
) -> Vec<VirtualServerState> {
    let mut out = Vec::new();
    for (key, vs) in plan.virtual_servers.iter() {
        let vs_text = vs_label(vs.role, key);
        let observed = match &kernel.virtual_servers {
            Ok(table) => table.get(key),
            Err(_) => None,
        };
        scheduler_reason(reasons, label, &vs_text, vs, observed, kernel);
        if kernel.virtual_servers.is_ok() {
            drift_reasons(reasons, label, &vs_text, vs, observed);
        }
        let address_state = address_state(plan, key, vs, kernel);
        if address_state == AddressState::Missing {
            reasons.push(
                ReasonKind::Drift,
                Severity::Blocking,
                Some(label),
                Some(&vs_text),
                format!(
                    "{} is not bound on {}: the node does not take traffic for it",
                    key.address, kernel.link
                ),
            );
        }
        if vs.role == VirtualServerRole::LoadBalancer {
            source_range_reasons(
                reasons,
                label,
                &vs_text,
                &service.load_balancer_source_ranges,
                client,
            );
        }
        out.push(VirtualServerState {
            role: role_name(vs.role).to_owned(),
            address: key.address,
            port: key.port,
            protocol: key.protocol.to_string(),
            planned: VirtualServerSettingsDoc::of(&VirtualServerSettings::of(vs)),
            kernel: observed.map(|o| VirtualServerSettingsDoc::of(&o.settings)),
            address_state,
            real_servers: real_server_states(vs, observed),
        });
    }
    out
}

fn scheduler_reason(
    reasons: &mut Reasons,
    label: &str,
    vs_text: &str,
    vs: &VirtualServer,
    observed: Option<&ObservedVirtualServer>,
    kernel: &KernelFacts,
) {
    let name = vs.scheduler.name();
    if observed.is_some_and(|o| o.settings.scheduler == vs.scheduler) {
        return; // the kernel runs it
    }
    if let Some(ModuleStatus::Missing) = kernel.scheduler_modules.get(name) {
        reasons.push(
            ReasonKind::SchedulerModuleMissing,
            Severity::Blocking,
            Some(label),
            Some(vs_text),
            format!(
                "the kernel cannot provide the IPVS scheduler {name:?}: module {} is neither \
                 loaded, built in nor installed, so the virtual server cannot be made",
                scheduler_module(name)
            ),
        );
    }
}

fn drift_reasons(
    reasons: &mut Reasons,
    label: &str,
    vs_text: &str,
    vs: &VirtualServer,
    observed: Option<&ObservedVirtualServer>,
) {
    let mut drift = |severity, message: String| {
        reasons.push(
            ReasonKind::Drift,
            severity,
            Some(label),
            Some(vs_text),
            message,
        );
    };
    let Some(observed) = observed else {
        drift(
            Severity::Blocking,
            "planned, but the kernel has no such virtual server".to_owned(),
        );
        return;
    };
    let planned = VirtualServerSettings::of(vs);
    if observed.settings != planned {
        let (p, k) = (
            VirtualServerSettingsDoc::of(&planned),
            VirtualServerSettingsDoc::of(&observed.settings),
        );
        drift(
            Severity::Warning,
            format!(
                "the kernel's settings differ from the plan: scheduler {} (planned {}), \
                 persistence {:?} (planned {:?}), source-port hashing {} (planned {})",
                k.scheduler,
                p.scheduler,
                k.persistence_timeout_seconds,
                p.persistence_timeout_seconds,
                k.hash_source_port,
                p.hash_source_port
            ),
        );
    }
    let missing: Vec<String> = vs
        .real_servers
        .iter()
        .filter(|(key, _)| observed.real_servers.get(key).is_none())
        .map(|(key, _)| key.to_string())
        .collect();
    let mut extra = Vec::new();
    let mut weights = Vec::new();
    for (key, rs) in observed.real_servers.iter() {
        match vs.real_servers.get(key) {
            None if rs.weight > 0 => extra.push(key.to_string()),
            Some(planned) if planned.weight != rs.weight => weights.push(format!(
                "{key} weight {} (planned {})",
                rs.weight, planned.weight
            )),
            _ => {}
        }
    }
    for (found, what) in [
        (missing, "planned real servers missing from the kernel"),
        (
            extra,
            "real servers in the kernel that the plan does not have, taking new connections",
        ),
        (weights, "weights differ"),
    ] {
        if !found.is_empty() {
            drift(Severity::Warning, format!("{what}: {}", found.join(", ")));
        }
    }
}

fn address_state(
    plan: &ServicePortPlan,
    key: &VirtualServerKey,
    vs: &VirtualServer,
    kernel: &KernelFacts,
) -> AddressState {
    if !vs.role.binds_address() || plan.node_owned_addresses.contains(&key.address) {
        return AddressState::NodeAddress;
    }
    if !plan.binds(key, vs) {
        let routed = kernel
            .local_routes
            .as_ref()
            .map(|routes| routes.iter().any(|net: &IpNet| net.contains(&key.address)));
        return match routed {
            Ok(true) => AddressState::Routed,
            Ok(false) => AddressState::Missing,
            Err(_) => AddressState::Unknown,
        };
    }
    match &kernel.link_addresses {
        Ok(addresses) if addresses.contains(&key.address) => AddressState::Bound,
        Ok(_) => AddressState::Missing,
        Err(_) => AddressState::Unknown,
    }
}

fn source_range_reasons(
    reasons: &mut Reasons,
    label: &str,
    vs_text: &str,
    ranges: &[IpNet],
    client: Option<IpAddr>,
) {
    if ranges.is_empty() {
        return;
    }
    let list = ranges
        .iter()
        .map(IpNet::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match client {
        Some(client) if !ranges.iter().any(|net| net.contains(&client)) => reasons.push(
            ReasonKind::SourceRangesExcludeClient,
            Severity::Blocking,
            Some(label),
            Some(vs_text),
            format!(
                "loadBalancerSourceRanges ({list}) do not hold the client {client}: its \
                 packets to the load-balancer IP are dropped"
            ),
        ),
        _ => reasons.push(
            ReasonKind::SourceRangesRestrict,
            Severity::Info,
            Some(label),
            Some(vs_text),
            format!("only clients in loadBalancerSourceRanges ({list}) reach the load-balancer IP"),
        ),
    }
}

fn real_server_states(
    vs: &VirtualServer,
    observed: Option<&ObservedVirtualServer>,
) -> Vec<RealServerState> {
    let mut keys: BTreeSet<_> = vs.real_servers.iter().map(|(k, _)| *k).collect();
    if let Some(observed) = observed {
        keys.extend(observed.real_servers.iter().map(|(k, _)| *k));
    }
    keys.into_iter()
        .map(|key| {
            let planned_weight = vs.real_servers.get(&key).map(|rs| rs.weight);
            let kernel = observed.and_then(|o| o.real_servers.get(&key));
            RealServerState {
                address: key.address,
                port: key.port,
                planned_weight,
                kernel_weight: kernel.map(|rs| rs.weight),
                active_connections: kernel.map_or(0, |rs| rs.active_connections),
                inactive_connections: kernel.map_or(0, |rs| rs.inactive_connections),
                draining: planned_weight.is_none() && kernel.is_some_and(|rs| rs.weight == 0),
            }
        })
        .collect()
}

fn set_memberships(
    reasons: &mut Reasons,
    plan: &crate::desired::netfilter::NetfilterPlan,
    kernel: &KernelFacts,
) -> Vec<SetMembership> {
    let mut out = Vec::new();
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (family, set, element) in set_elements(plan) {
        let family = crate::netfilter::render::nft_family(family).to_owned();
        let present = match kernel.netfilter_sets.get(&(family.clone(), set.to_owned())) {
            Some(Ok(elements)) => Some(elements.contains(&element)),
            _ => None,
        };
        if present == Some(false) {
            missing
                .entry(format!("{family} {set}"))
                .or_default()
                .push(element.clone());
        }
        out.push(SetMembership {
            family,
            set: set.to_owned(),
            element,
            present,
        });
    }
    for (set, elements) in missing {
        reasons.push(
            ReasonKind::Drift,
            Severity::Warning,
            None,
            None,
            format!(
                "nftables set {set} lacks the Service's elements: {}",
                elements.join(", ")
            ),
        );
    }
    out
}

fn foreign(
    reasons: &mut Reasons,
    picture: &EnginePicture<'_>,
    service: &crate::model::Service,
    kernel: &KernelFacts,
) -> Vec<String> {
    let Ok(table) = &kernel.virtual_servers else {
        return Vec::new();
    };
    let addresses: BTreeSet<IpAddr> = service
        .cluster_ips
        .iter()
        .chain(&service.external_ips)
        .copied()
        .chain(service.load_balancer_vips())
        .collect();
    let planned: BTreeSet<&VirtualServerKey> = picture
        .desired
        .virtual_servers()
        .map(|(_, key, _)| key)
        .collect();
    let mut out = Vec::new();
    for key in table.keys() {
        if !addresses.contains(&key.address) || planned.contains(key) {
            continue;
        }
        let text = key.to_string();
        reasons.push(
            ReasonKind::ForeignVirtualServer,
            Severity::Warning,
            None,
            Some(&text),
            format!(
                "the kernel has virtual server {text} on the Service's address, and no \
                 Service plans it: connections to that port go to its real servers, not to \
                 this Service's"
            ),
        );
        out.push(text);
    }
    out
}
