//! The plan as documents: what the proxier has planned (and what one sync changed), in a
//! schema for programs (JSON / YAML, written down in `docs/dry-run.md`) and as tables for
//! people ([`render`]).
//!
//! Built from any [`Proxier`] after a sync; `ipvs-proxier --dry-run` prints these for a
//! proxier on in-memory backends, an embedder can print them for its kernel proxier.

pub mod render;
#[cfg(test)]
mod tests;

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::backend::{AddressBackend, IpvsBackend};
use crate::conntrack::ConntrackBackend;
use crate::desired::{
    Desired, ServicePortName, VirtualServer, VirtualServerKey, VirtualServerRole,
};
use crate::engine::driver::SyncOutcome;
use crate::engine::{Proxier, SyncKind};
use crate::netfilter::NetfilterBackend;

/// The `apiVersion` of every dry-run document.
pub const DOCUMENT_API_VERSION: &str = "ipvs-proxier.dry-run/v1";

pub(crate) fn role_name(role: VirtualServerRole) -> &'static str {
    match role {
        VirtualServerRole::ClusterIp => "ClusterIP",
        VirtualServerRole::NodePort => "NodePort",
        VirtualServerRole::ExternalIp => "ExternalIP",
        VirtualServerRole::LoadBalancer => "LoadBalancer",
    }
}

/// One real server of a virtual server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RealServerDoc {
    /// Endpoint address.
    pub address: IpAddr,
    /// Endpoint port.
    pub port: u16,
    /// IPVS weight (0: draining, kept for established connections only).
    pub weight: u32,
}

/// One IPVS virtual server and its real servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualServerDoc {
    /// The Service port it implements: `namespace/name[:port]/PROTOCOL`.
    pub service_port: String,
    /// `ClusterIP`, `NodePort`, `ExternalIP` or `LoadBalancer`.
    pub role: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// Virtual address.
    pub address: IpAddr,
    /// Virtual port.
    pub port: u16,
    /// IPVS scheduler name (`rr`, `wrr`, `mh`, ...).
    pub scheduler: String,
    /// ClientIP session affinity: the IPVS persistence timeout in seconds, or `null`.
    pub persistence_timeout_seconds: Option<u32>,
    /// Whether the scheduler hashes the source port too (`mh`/`sh` flag).
    pub hash_source_port: bool,
    /// Real servers, ordered by address and port.
    pub real_servers: Vec<RealServerDoc>,
}

impl VirtualServerDoc {
    pub(crate) fn of(name: &ServicePortName, key: &VirtualServerKey, vs: &VirtualServer) -> Self {
        VirtualServerDoc {
            service_port: name.to_string(),
            role: role_name(vs.role).to_owned(),
            protocol: key.protocol.to_string(),
            address: key.address,
            port: key.port,
            scheduler: vs.scheduler.to_string(),
            persistence_timeout_seconds: vs.persistence_timeout,
            hash_source_port: vs.hash_source_port,
            real_servers: vs
                .real_servers
                .iter()
                .map(|(rs, settings)| RealServerDoc {
                    address: rs.address,
                    port: rs.port,
                    weight: settings.weight,
                })
                .collect(),
        }
    }

    /// `PROTOCOL address:port` (IPv6 in brackets), as tables show it.
    pub fn key(&self) -> String {
        match self.address {
            IpAddr::V4(a) => format!("{} {}:{}", self.protocol, a, self.port),
            IpAddr::V6(a) => format!("{} [{}]:{}", self.protocol, a, self.port),
        }
    }
}

/// The node the plan is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeDoc {
    /// Node name (`--hostname-override`).
    pub name: String,
    /// Whether the source held a Node object of that name (without one there are no
    /// NodePorts: the node's addresses are unknown).
    pub node_object: bool,
    /// The node's primary IPs (from its Node object).
    #[serde(rename = "primaryIPs")]
    pub primary_ips: Vec<IpAddr>,
}

/// What a real sync of this plan would write to the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WritesDoc {
    /// IPVS and address writes (adds, updates, deletes).
    pub total: usize,
    /// Of those, deletes.
    pub deletes: usize,
    /// Whether the nftables tables would be written.
    pub nftables: bool,
}

/// Counts of the source and the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SummaryDoc {
    /// Services planned.
    pub services: usize,
    /// Their ports.
    pub service_ports: usize,
    /// EndpointSlices of those Services.
    pub endpoint_slices: usize,
    /// Endpoints in them.
    pub endpoints: usize,
    /// Virtual servers in the plan.
    pub virtual_servers: usize,
    /// Real servers in the plan.
    pub real_servers: usize,
    /// Addresses bound on the dummy link.
    pub bound_addresses: usize,
}

/// The whole plan (`kind: Plan`): what `--dry-run` prints, and the first document of
/// `--dry-run --watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanDocument {
    /// [`DOCUMENT_API_VERSION`].
    pub api_version: String,
    /// `Plan`.
    pub kind: String,
    /// `full` or `incremental`.
    pub sync: String,
    /// The node.
    pub node: NodeDoc,
    /// The dummy link VIPs are bound on.
    pub dummy_interface: String,
    /// Counts.
    pub summary: SummaryDoc,
    /// Writes a real sync would make; `null` when the plan could not be applied.
    pub writes: Option<WritesDoc>,
    /// Why the plan could not be applied in memory, or `null`.
    pub error: Option<String>,
    /// Every virtual server, ordered by Service port then address.
    pub virtual_servers: Vec<VirtualServerDoc>,
    /// Every address bound on the dummy link, ordered.
    pub bound_addresses: Vec<IpAddr>,
    /// Service CIDRs taken whole with a `local` route through the dummy link
    /// (`--bind-service-cidrs`); left out of the document when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_routes: Vec<IpNet>,
}

/// A virtual server whose settings or real servers changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualServerChangeDoc {
    /// Before the sync.
    pub before: VirtualServerDoc,
    /// After it.
    pub after: VirtualServerDoc,
}

/// Virtual servers that came, went or changed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualServerChangesDoc {
    /// New virtual servers.
    pub added: Vec<VirtualServerDoc>,
    /// Virtual servers no longer planned.
    pub removed: Vec<VirtualServerDoc>,
    /// Virtual servers with other settings or real servers.
    pub changed: Vec<VirtualServerChangeDoc>,
}

/// Addresses bound or unbound on the dummy link.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddressChangesDoc {
    /// Newly bound.
    pub added: Vec<IpAddr>,
    /// No longer bound.
    pub removed: Vec<IpAddr>,
}

/// What one sync changed (`kind: PlanChange`): every document of `--dry-run --watch` after
/// the first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanChangeDocument {
    /// [`DOCUMENT_API_VERSION`].
    pub api_version: String,
    /// `PlanChange`.
    pub kind: String,
    /// `full` or `incremental`.
    pub sync: String,
    /// Counts after the sync.
    pub summary: SummaryDoc,
    /// Writes a real sync would make; `null` when the plan could not be applied.
    pub writes: Option<WritesDoc>,
    /// Why the plan could not be applied in memory, or `null`.
    pub error: Option<String>,
    /// Virtual server changes.
    pub virtual_servers: VirtualServerChangesDoc,
    /// Dummy-link address changes.
    pub bound_addresses: AddressChangesDoc,
}

impl PlanChangeDocument {
    /// Whether the plan stayed the same.
    pub fn is_empty(&self) -> bool {
        self.virtual_servers == VirtualServerChangesDoc::default()
            && self.bound_addresses == AddressChangesDoc::default()
    }
}

pub(crate) fn sync_name(kind: SyncKind) -> &'static str {
    match kind {
        SyncKind::Full => "full",
        SyncKind::Incremental => "incremental",
    }
}

/// The dummy link `proxier` binds its addresses on.
pub fn link_name<I, A, N, C>(proxier: &Proxier<I, A, N, C>) -> String
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    proxier
        .reconciler()
        .address_backend()
        .link_name()
        .to_owned()
}

fn summary_of<I, A, N, C>(proxier: &Proxier<I, A, N, C>) -> SummaryDoc
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    let state = proxier.state();
    let service_ports: usize = state.services().map(|s| s.ports.len()).sum();
    let slices: Vec<_> = state
        .services()
        .flat_map(|s| state.slices_of(&s.name))
        .collect();
    let endpoints: usize = slices.iter().map(|s| s.endpoints.len()).sum();
    let size = proxier.plan_size();
    SummaryDoc {
        services: state.service_count(),
        service_ports,
        endpoint_slices: state.slice_count(),
        endpoints,
        virtual_servers: size.virtual_servers,
        real_servers: size.real_servers,
        bound_addresses: size.bound_addresses,
    }
}

fn writes_of(outcome: &SyncOutcome<'_>) -> (Option<WritesDoc>, Option<String>) {
    match outcome.result {
        Ok(report) => (
            Some(WritesDoc {
                total: report.ipvs.writes,
                deletes: report.ipvs.deletes,
                nftables: report.netfilter_written,
            }),
            None,
        ),
        Err(error) => (None, Some(error.to_string())),
    }
}

/// The plan of `proxier` after the sync of `outcome`, as a document.
pub fn plan_document<I, A, N, C>(
    proxier: &Proxier<I, A, N, C>,
    outcome: &SyncOutcome<'_>,
) -> PlanDocument
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    let (writes, error) = writes_of(outcome);
    PlanDocument {
        api_version: DOCUMENT_API_VERSION.to_owned(),
        kind: "Plan".to_owned(),
        sync: sync_name(outcome.kind).to_owned(),
        node: NodeDoc {
            name: proxier.node().name.clone(),
            node_object: proxier.state().node().is_some(),
            primary_ips: proxier.node().primary_ips.clone(),
        },
        dummy_interface: link_name(proxier),
        summary: summary_of(proxier),
        writes,
        error,
        virtual_servers: proxier
            .desired()
            .virtual_servers()
            .map(|(name, key, vs)| VirtualServerDoc::of(name, key, vs))
            .collect(),
        bound_addresses: proxier.desired().bound_addresses().into_iter().collect(),
        local_routes: proxier.config().planner.service_cidr_routes.clone(),
    }
}

/// What changed from `before` to the plan of `proxier` after the sync of `outcome`.
pub fn change_document<I, A, N, C>(
    before: &Desired,
    proxier: &Proxier<I, A, N, C>,
    outcome: &SyncOutcome<'_>,
) -> PlanChangeDocument
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    let after = proxier.desired();
    let (writes, error) = writes_of(outcome);
    let mut virtual_servers = VirtualServerChangesDoc::default();
    // Both sides are ordered by Service port then key: one merge pass.
    let mut old = before.virtual_servers().peekable();
    let mut new = after.virtual_servers().peekable();
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((on, ok, _)), Some((nn, nk, _))) => (on, ok).cmp(&(nn, nk)),
        };
        match order {
            std::cmp::Ordering::Less => {
                if let Some((n, k, vs)) = old.next() {
                    virtual_servers.removed.push(VirtualServerDoc::of(n, k, vs));
                }
            }
            std::cmp::Ordering::Greater => {
                if let Some((n, k, vs)) = new.next() {
                    virtual_servers.added.push(VirtualServerDoc::of(n, k, vs));
                }
            }
            std::cmp::Ordering::Equal => {
                if let (Some((on, ok, ovs)), Some((nn, nk, nvs))) = (old.next(), new.next())
                    && ovs != nvs
                {
                    virtual_servers.changed.push(VirtualServerChangeDoc {
                        before: VirtualServerDoc::of(on, ok, ovs),
                        after: VirtualServerDoc::of(nn, nk, nvs),
                    });
                }
            }
        }
    }
    let old_bound = before.bound_addresses();
    let new_bound = after.bound_addresses();
    PlanChangeDocument {
        api_version: DOCUMENT_API_VERSION.to_owned(),
        kind: "PlanChange".to_owned(),
        sync: sync_name(outcome.kind).to_owned(),
        summary: summary_of(proxier),
        writes,
        error,
        virtual_servers,
        bound_addresses: AddressChangesDoc {
            added: new_bound.difference(&old_bound).copied().collect(),
            removed: old_bound.difference(&new_bound).copied().collect(),
        },
    }
}
