//! Conntrack intent: which UDP flows a change of plan makes stale.
//!
//! UDP has no connection teardown: a client that keeps sending from the same source port
//! keeps its conntrack entry alive forever. When that entry points at an endpoint that is
//! gone, or was created before the Service could be served (so it carries no NAT), the
//! client is blackholed. The entries to delete are decided here, from the old and new plan
//! of each Service port (pure), as [`FlowFilter`]s:
//!
//! - when a UDP real server is removed from a virtual server: entries whose original
//!   destination is the virtual address:port and whose reply source is the endpoint
//!   ([`FlowFilter::to_removed_endpoint`]);
//! - when a UDP virtual server gets its first real server (or appears): entries whose
//!   original destination is the virtual address:port ([`FlowFilter::to_service`]).
//!
//! Deleting them is a backend's job ([`crate::conntrack`]).

use std::collections::BTreeSet;
use std::net::SocketAddr;

use crate::desired::{Desired, Protocol, ServicePortPlan};

/// One conntrack entry's tuple, as far as the proxier cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowTuple {
    /// Source address and port.
    pub source: SocketAddr,
    /// Destination address and port.
    pub destination: SocketAddr,
}

/// A conntrack entry: its transport protocol (IP protocol number), zone and both tuples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConntrackFlow {
    /// IP protocol number (17 = UDP).
    pub protocol: u8,
    /// Conntrack zone (0 unless zones are in use).
    pub zone: u16,
    /// Original direction: client → service address.
    pub original: FlowTuple,
    /// Reply direction: after DNAT, the source is the endpoint.
    pub reply: FlowTuple,
}

/// Which entries to delete: all given conditions must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowFilter {
    /// Transport protocol.
    pub protocol: Protocol,
    /// Original destination (the service address and port), if constrained.
    pub original_destination: Option<SocketAddr>,
    /// Reply source (the endpoint the flow was sent to), if constrained.
    pub reply_source: Option<SocketAddr>,
}

impl FlowFilter {
    /// UDP flows to `service` that were sent to `endpoint`: stale once the endpoint is gone.
    pub fn to_removed_endpoint(service: SocketAddr, endpoint: SocketAddr) -> Self {
        FlowFilter {
            protocol: Protocol::Udp,
            original_destination: Some(service),
            reply_source: Some(endpoint),
        }
    }

    /// Every UDP flow to `service`: stale when they were set up before it had endpoints.
    pub fn to_service(service: SocketAddr) -> Self {
        FlowFilter {
            protocol: Protocol::Udp,
            original_destination: Some(service),
            reply_source: None,
        }
    }

    /// Whether `flow` matches.
    pub fn matches(&self, flow: &ConntrackFlow) -> bool {
        u16::from(flow.protocol) == self.protocol.number()
            && self
                .original_destination
                .is_none_or(|d| d == flow.original.destination)
            && self.reply_source.is_none_or(|s| s == flow.reply.source)
    }
}

/// The UDP flows made stale by going from `old` to `new` for one Service port (either may be
/// absent: created or deleted).
pub fn stale_udp_flows_of_port(
    old: Option<&ServicePortPlan>,
    new: Option<&ServicePortPlan>,
) -> BTreeSet<FlowFilter> {
    let mut out = BTreeSet::new();
    let empty = ServicePortPlan::default();
    let old = old.unwrap_or(&empty);
    let new = new.unwrap_or(&empty);
    for (key, old_vs) in &old.virtual_servers {
        if key.protocol != Protocol::Udp {
            continue;
        }
        let service = SocketAddr::new(key.address, key.port);
        let remaining = new.virtual_servers.get(key);
        for rs in old_vs.real_servers.keys() {
            if remaining.is_none_or(|vs| !vs.real_servers.contains_key(rs)) {
                out.insert(FlowFilter::to_removed_endpoint(
                    service,
                    SocketAddr::new(rs.address, rs.port),
                ));
            }
        }
    }
    for (key, new_vs) in &new.virtual_servers {
        if key.protocol != Protocol::Udp || new_vs.real_servers.is_empty() {
            continue;
        }
        let had_none = old
            .virtual_servers
            .get(key)
            .is_none_or(|vs| vs.real_servers.is_empty());
        if had_none {
            out.insert(FlowFilter::to_service(SocketAddr::new(
                key.address,
                key.port,
            )));
        }
    }
    out
}

/// The UDP flows made stale by going from plan `old` to plan `new` for the whole node.
pub fn stale_udp_flows(old: &Desired, new: &Desired) -> BTreeSet<FlowFilter> {
    let names: BTreeSet<_> = old.services.keys().chain(new.services.keys()).collect();
    names
        .into_iter()
        .flat_map(|name| stale_udp_flows_of_port(old.services.get(name), new.services.get(name)))
        .collect()
}

#[cfg(test)]
mod tests;
