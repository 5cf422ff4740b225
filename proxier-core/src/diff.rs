//! Pure comparison of the plan ([`Desired`]) with the kernel ([`Observed`]):
//! which IPVS writes and address changes converge the kernel, touching only
//! what the proxier owns ([`Scope::owns`], the one ownership rule every sync and `--cleanup`
//! use).
//!
//! Removed real servers are drained rather than deleted when they still carry TCP
//! connections: their weight goes to 0 and they join the [`DrainQueue`] until their
//! connections end or the drain bound passes.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use ipnet::IpNet;
use tokio::time::Instant;

use crate::backend::IpvsOp;
use crate::desired::{
    Desired, Protocol, RealServerKey, ServicePortName, ServicePortPlan, VirtualServer,
    VirtualServerKey,
};
use crate::drain::DrainQueue;
use crate::observed::{Forwarding, Observed, ObservedVirtualServer, VirtualServerSettings};

/// What the proxier may change in the kernel besides what it plans.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// Addresses never touched: no virtual server on them is created or deleted, none is unbound.
    pub exclude_cidrs: &'a [IpNet],
    /// Addresses bound on the proxier's dummy link: virtual servers on them are the proxier's.
    pub link_addresses: &'a BTreeSet<IpAddr>,
    /// Networks routed to the proxier's dummy link (Service CIDRs taken whole): virtual
    /// servers in them are the proxier's too.
    pub link_routes: &'a [IpNet],
    /// Node addresses on which NodePort virtual servers are the proxier's.
    pub node_port_addresses: &'a BTreeSet<IpAddr>,
    /// Ports of NodePort virtual servers (`None`: any port on a node-port address).
    pub node_port_range: Option<&'a RangeInclusive<u16>>,
    /// Virtual servers the proxier planned before (in this process): still its own.
    pub previously_planned: &'a HashSet<VirtualServerKey>,
}

impl Scope<'_> {
    /// Whether `address` lies in an excluded CIDR.
    pub fn is_excluded(&self, address: IpAddr) -> bool {
        self.exclude_cidrs.iter().any(|net| net.contains(&address))
    }

    /// Whether an unplanned virtual server is the proxier's to delete: one it planned in
    /// this process, or, outside the excluded CIDRs, one on its dummy link's addresses or
    /// routes or a
    /// NodePort on the node's addresses. Within the excluded CIDRs only what it planned itself
    /// (kube-proxy's `--ipvs-exclude-cidrs`).
    pub fn owns(&self, key: &VirtualServerKey) -> bool {
        if self.previously_planned.contains(key) {
            return true;
        }
        if self.is_excluded(key.address) {
            return false;
        }
        if self.link_addresses.contains(&key.address)
            || self
                .link_routes
                .iter()
                .any(|net| net.contains(&key.address))
        {
            return true;
        }
        self.node_port_addresses.contains(&key.address)
            && self
                .node_port_range
                .is_none_or(|range| range.contains(&key.port))
    }
}

/// The clock and bound deciding when a draining real server is deleted.
#[derive(Debug, Clone, Copy)]
pub struct DrainPolicy {
    /// Now.
    pub now: Instant,
    /// How long a removed real server may keep its connections.
    pub timeout: Duration,
}

/// A planned virtual server the reconciler will not apply for a service port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Two service ports plan the same virtual server: the first by name wins.
    #[error("virtual server {key} of {service} is already planned by {winner}, which comes first")]
    Conflict {
        /// The service port that loses.
        service: ServicePortName,
        /// The contested virtual server.
        key: VirtualServerKey,
        /// The service port that owns it.
        winner: ServicePortName,
    },
}

impl Rejection {
    /// The service port whose plan is rejected.
    pub fn service(&self) -> &ServicePortName {
        match self {
            Rejection::Conflict { service, .. } => service,
        }
    }
}

/// An IPVS write with the service port it is done for (`None`: cleanup of an
/// unplanned virtual server the proxier owns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedOp {
    /// The service port the write is for.
    pub owner: Option<ServicePortName>,
    /// The write.
    pub op: IpvsOp,
}

/// IPVS writes and drain-queue changes that converge some virtual servers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Writes, in the order to apply them once [`Changes::order`] ran.
    pub ops: Vec<OwnedOp>,
    /// Real servers that start draining (weight 0, waiting for their connections).
    pub drain_started: Vec<(VirtualServerKey, RealServerKey)>,
    /// Draining real servers that are planned again.
    pub drain_stopped: Vec<(VirtualServerKey, RealServerKey)>,
}

impl Changes {
    /// Puts the writes in a safe order, keeping the relative order within a phase:
    /// virtual servers are added, then updated, then real servers are added, updated
    /// and deleted, and virtual servers are deleted last.
    pub fn order(&mut self) {
        fn phase(op: &IpvsOp) -> u8 {
            match op {
                IpvsOp::AddVirtualServer(..) => 0,
                IpvsOp::UpdateVirtualServer(..) => 1,
                IpvsOp::AddRealServer(..)
                | IpvsOp::UpdateRealServer(..)
                | IpvsOp::DeleteRealServer(..) => 2,
                IpvsOp::DeleteVirtualServer(..) => 3,
            }
        }
        self.ops.sort_by_key(|owned| phase(&owned.op));
    }

    /// Whether nothing is to be written or queued.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.drain_started.is_empty() && self.drain_stopped.is_empty()
    }
}

/// Adds to `out` what converges one virtual server from `observed` to `desired`
/// (either may be absent: absent desired means delete, so call it only for
/// virtual servers the proxier owns).
pub fn diff_virtual_server(
    key: &VirtualServerKey,
    desired: Option<&VirtualServer>,
    observed: Option<&ObservedVirtualServer>,
    owner: Option<&ServicePortName>,
    drains: &DrainQueue,
    policy: &DrainPolicy,
    out: &mut Changes,
) {
    let mut push = |op: IpvsOp| {
        out.ops.push(OwnedOp {
            owner: owner.cloned(),
            op,
        })
    };
    match (desired, observed) {
        (None, None) => {}
        (None, Some(_)) => push(IpvsOp::DeleteVirtualServer(*key)),
        (Some(want), None) => {
            push(IpvsOp::AddVirtualServer(
                *key,
                VirtualServerSettings::of(want),
            ));
            for (rs, real) in &want.real_servers {
                push(IpvsOp::AddRealServer(*key, *rs, real.weight));
            }
        }
        (Some(want), Some(have)) => {
            let settings = VirtualServerSettings::of(want);
            if settings != have.settings {
                push(IpvsOp::UpdateVirtualServer(*key, settings));
            }
            for (rs, real) in &want.real_servers {
                match have.real_servers.get(rs) {
                    None => push(IpvsOp::AddRealServer(*key, *rs, real.weight)),
                    Some(current)
                        if current.weight != real.weight
                            || current.forward != Forwarding::Masquerade =>
                    {
                        push(IpvsOp::UpdateRealServer(*key, *rs, real.weight))
                    }
                    Some(_) => {}
                }
                if drains.since(key, rs).is_some() {
                    out.drain_stopped.push((*key, *rs));
                }
            }
            for (rs, current) in &have.real_servers {
                if want.real_servers.contains_key(rs) {
                    continue;
                }
                let since = drains.since(key, rs);
                let expired = match since {
                    Some(start) => policy.now.saturating_duration_since(start) >= policy.timeout,
                    None => policy.timeout.is_zero(),
                };
                if key.protocol != Protocol::Tcp || current.connections() == 0 || expired {
                    push(IpvsOp::DeleteRealServer(*key, *rs));
                } else {
                    if current.weight != 0 {
                        push(IpvsOp::UpdateRealServer(*key, *rs, 0));
                    }
                    if since.is_none() {
                        out.drain_started.push((*key, *rs));
                    }
                }
            }
        }
    }
}

/// The whole difference between a plan and a kernel snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// IPVS writes and drain-queue changes (ordered).
    pub changes: Changes,
    /// Addresses to bind on the dummy link.
    pub bind: Vec<IpAddr>,
    /// Addresses to remove from the dummy link.
    pub unbind: Vec<IpAddr>,
    /// Planned virtual servers that are not applied, with the reason.
    pub rejected: Vec<Rejection>,
}

/// A planned virtual server with the service port that owns it.
#[derive(Debug, Clone, Copy)]
pub struct Winner<'d> {
    /// The owning service port.
    pub service: &'d ServicePortName,
    /// Its plan.
    pub plan: &'d ServicePortPlan,
    /// The virtual server.
    pub vs: &'d VirtualServer,
}

/// Which service port owns each planned virtual server: the first by
/// [`ServicePortName`] order among those planning it. Losing claims are returned as
/// rejections.
pub fn winners<'d>(
    desired: &'d Desired,
) -> (BTreeMap<VirtualServerKey, Winner<'d>>, Vec<Rejection>) {
    let mut won: BTreeMap<VirtualServerKey, Winner<'d>> = BTreeMap::new();
    let mut rejected = Vec::new();
    for (service, plan) in &desired.services {
        for (key, vs) in &plan.virtual_servers {
            match won.entry(*key) {
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(Winner { service, plan, vs });
                }
                std::collections::btree_map::Entry::Occupied(taken) => {
                    rejected.push(Rejection::Conflict {
                        service: service.clone(),
                        key: *key,
                        winner: taken.get().service.clone(),
                    });
                }
            }
        }
    }
    (won, rejected)
}

/// Compares `desired` with `observed` and returns what converges the kernel.
///
/// Virtual servers of service ports `held` accepts (waiting for a retry) are left as they are.
/// Unplanned virtual servers are deleted only when `scope` owns them; addresses on the
/// link that no planned virtual server needs are unbound unless excluded.
pub fn diff(
    desired: &Desired,
    observed: &Observed,
    scope: &Scope<'_>,
    drains: &DrainQueue,
    policy: &DrainPolicy,
    held: impl Fn(&ServicePortName) -> bool,
) -> Diff {
    let (won, rejected) = winners(desired);
    let mut changes = Changes::default();
    let mut wanted_addresses = BTreeSet::new();
    for (key, winner) in &won {
        if winner.plan.binds(key, winner.vs) {
            wanted_addresses.insert(key.address);
        }
        if held(winner.service) {
            continue;
        }
        diff_virtual_server(
            key,
            Some(winner.vs),
            observed.virtual_servers.get(key),
            Some(winner.service),
            drains,
            policy,
            &mut changes,
        );
    }
    for (key, have) in &observed.virtual_servers {
        if !won.contains_key(key) && scope.owns(key) {
            diff_virtual_server(key, None, Some(have), None, drains, policy, &mut changes);
        }
    }
    changes.order();
    let bind = wanted_addresses
        .difference(&observed.bound_addresses)
        .copied()
        .collect();
    let unbind = observed
        .bound_addresses
        .difference(&wanted_addresses)
        .filter(|address| !scope.is_excluded(**address))
        .copied()
        .collect();
    Diff {
        changes,
        bind,
        unbind,
        rejected,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::desired::{RealServer, Scheduler, SortedMap, VirtualServerRole};
    use crate::observed::ObservedRealServer;

    fn vkey(address: &str, port: u16, protocol: Protocol) -> VirtualServerKey {
        VirtualServerKey {
            address: address.parse().unwrap(),
            port,
            protocol,
        }
    }

    fn rkey(last: u8) -> RealServerKey {
        RealServerKey {
            address: IpAddr::from([10, 1, 0, last]),
            port: 80,
        }
    }

    fn planned(real_servers: &[u8]) -> VirtualServer {
        VirtualServer {
            role: VirtualServerRole::ClusterIp,
            scheduler: Scheduler::RoundRobin,
            persistence_timeout: None,
            hash_source_port: false,
            real_servers: real_servers
                .iter()
                .map(|last| (rkey(*last), RealServer { weight: 1 }))
                .collect(),
        }
    }

    fn kernel(real_servers: &[(u8, u32, u32)]) -> ObservedVirtualServer {
        ObservedVirtualServer {
            settings: VirtualServerSettings::default(),
            real_servers: real_servers
                .iter()
                .map(|(last, weight, conns)| {
                    let mut real = ObservedRealServer::new(*weight);
                    real.inactive_connections = *conns;
                    (rkey(*last), real)
                })
                .collect(),
        }
    }

    fn name(n: &str) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: n.into(),
            port: "".into(),
            protocol: Protocol::Tcp,
        }
    }

    /// Runs the per-virtual-server diff for the removal of real server 2 (with `conns`
    /// connections, draining since `since` seconds ago if `Some`).
    fn removal(protocol: Protocol, conns: u32, weight: u32, since: Option<u64>) -> Changes {
        let key = vkey("10.96.0.1", 80, protocol);
        let now = Instant::now() + Duration::from_secs(3600);
        let mut drains = DrainQueue::new();
        if let Some(ago) = since {
            drains.start(key, rkey(2), now - Duration::from_secs(ago));
        }
        let policy = DrainPolicy {
            now,
            timeout: Duration::from_secs(900),
        };
        let mut out = Changes::default();
        diff_virtual_server(
            &key,
            Some(&planned(&[1])),
            Some(&kernel(&[(1, 1, 0), (2, weight, conns)])),
            None,
            &drains,
            &policy,
            &mut out,
        );
        out
    }

    fn ops(changes: &Changes) -> Vec<IpvsOp> {
        changes.ops.iter().map(|o| o.op.clone()).collect()
    }

    #[test]
    fn removed_real_servers_drain_or_go_by_protocol_connections_and_age() {
        let tcp = vkey("10.96.0.1", 80, Protocol::Tcp);
        let busy = removal(Protocol::Tcp, 3, 1, None);
        assert_eq!(ops(&busy), vec![IpvsOp::UpdateRealServer(tcp, rkey(2), 0)]);
        assert_eq!(busy.drain_started, vec![(tcp, rkey(2))]);

        let still_busy = removal(Protocol::Tcp, 3, 0, Some(899));
        assert!(still_busy.is_empty(), "{still_busy:?}");

        let expired = removal(Protocol::Tcp, 3, 0, Some(900));
        assert_eq!(ops(&expired), vec![IpvsOp::DeleteRealServer(tcp, rkey(2))]);

        let idle = removal(Protocol::Tcp, 0, 1, None);
        assert_eq!(ops(&idle), vec![IpvsOp::DeleteRealServer(tcp, rkey(2))]);
        assert!(idle.drain_started.is_empty());

        for protocol in [Protocol::Udp, Protocol::Sctp] {
            let key = vkey("10.96.0.1", 80, protocol);
            let out = removal(protocol, 3, 1, None);
            assert_eq!(ops(&out), vec![IpvsOp::DeleteRealServer(key, rkey(2))]);
        }
    }

    #[test]
    fn a_draining_real_server_planned_again_is_restored() {
        let key = vkey("10.96.0.1", 80, Protocol::Tcp);
        let now = Instant::now();
        let mut drains = DrainQueue::new();
        drains.start(key, rkey(2), now);
        let mut out = Changes::default();
        diff_virtual_server(
            &key,
            Some(&planned(&[1, 2])),
            Some(&kernel(&[(1, 1, 0), (2, 0, 5)])),
            None,
            &drains,
            &DrainPolicy {
                now,
                timeout: Duration::from_secs(900),
            },
            &mut out,
        );
        assert_eq!(ops(&out), vec![IpvsOp::UpdateRealServer(key, rkey(2), 1)]);
        assert_eq!(out.drain_stopped, vec![(key, rkey(2))]);
    }

    #[test]
    fn order_adds_virtual_servers_first_and_deletes_them_last() {
        let a = vkey("10.96.0.1", 80, Protocol::Tcp);
        let b = vkey("10.96.0.2", 80, Protocol::Tcp);
        let mut changes = Changes::default();
        for op in [
            IpvsOp::DeleteVirtualServer(b),
            IpvsOp::AddRealServer(a, rkey(1), 1),
            IpvsOp::UpdateVirtualServer(b, VirtualServerSettings::default()),
            IpvsOp::AddVirtualServer(a, VirtualServerSettings::default()),
            IpvsOp::DeleteRealServer(b, rkey(2)),
        ] {
            changes.ops.push(OwnedOp { owner: None, op });
        }
        changes.order();
        assert_eq!(
            ops(&changes),
            vec![
                IpvsOp::AddVirtualServer(a, VirtualServerSettings::default()),
                IpvsOp::UpdateVirtualServer(b, VirtualServerSettings::default()),
                IpvsOp::AddRealServer(a, rkey(1), 1),
                IpvsOp::DeleteRealServer(b, rkey(2)),
                IpvsOp::DeleteVirtualServer(b),
            ]
        );
    }

    #[test]
    fn scope_owns_link_addresses_and_node_ports_in_range_only() {
        let excluded = [IpNet::new("10.200.0.0".parse().unwrap(), 16).unwrap()];
        let link = BTreeSet::from(["10.96.0.1".parse().unwrap(), "10.200.0.1".parse().unwrap()]);
        let nodes = BTreeSet::from(["192.168.1.5".parse().unwrap()]);
        let range = 30000..=32767;
        let before = HashSet::from([vkey("192.168.1.9", 80, Protocol::Tcp)]);
        // A Service CIDR routed to the link, partly excluded.
        let routes = [
            IpNet::new("10.97.0.0".parse().unwrap(), 16).unwrap(),
            IpNet::new("10.200.0.0".parse().unwrap(), 12).unwrap(),
        ];
        let scope = Scope {
            exclude_cidrs: &excluded,
            link_addresses: &link,
            link_routes: &routes,
            node_port_addresses: &nodes,
            node_port_range: Some(&range),
            previously_planned: &before,
        };
        assert!(scope.owns(&vkey("10.96.0.1", 5, Protocol::Udp)));
        assert!(!scope.owns(&vkey("10.96.0.2", 5, Protocol::Udp)));
        assert!(scope.owns(&vkey("10.97.3.4", 443, Protocol::Tcp)));
        assert!(scope.owns(&vkey("10.201.0.1", 80, Protocol::Tcp)));
        assert!(!scope.owns(&vkey("10.200.0.2", 80, Protocol::Tcp)));
        assert!(!scope.owns(&vkey("10.200.0.1", 80, Protocol::Tcp)));
        assert!(scope.owns(&vkey("192.168.1.5", 30000, Protocol::Tcp)));
        assert!(!scope.owns(&vkey("192.168.1.5", 22, Protocol::Tcp)));
        assert!(!scope.owns(&vkey("192.168.50.1", 80, Protocol::Tcp)));
        assert!(scope.owns(&vkey("192.168.1.9", 80, Protocol::Tcp)));
    }

    #[test]
    fn full_diff_resolves_conflicts_by_name_and_never_unbinds_excluded_addresses() {
        let shared = vkey("10.96.0.1", 80, Protocol::Tcp);
        let mut desired = Desired::default();
        for (n, rs) in [("b", 2u8), ("a", 1u8)] {
            desired.services.insert(
                name(n),
                ServicePortPlan {
                    virtual_servers: SortedMap::from([(shared, planned(&[rs]))]),
                    ..Default::default()
                },
            );
        }
        let observed = Observed {
            virtual_servers: BTreeMap::new(),
            bound_addresses: BTreeSet::from([
                "10.96.0.9".parse().unwrap(),
                "10.200.0.1".parse().unwrap(),
            ]),
        };
        let excluded = [IpNet::new("10.200.0.0".parse().unwrap(), 16).unwrap()];
        let nodes = BTreeSet::new();
        let before = HashSet::new();
        let scope = Scope {
            exclude_cidrs: &excluded,
            link_addresses: &observed.bound_addresses,
            link_routes: &[],
            node_port_addresses: &nodes,
            node_port_range: None,
            previously_planned: &before,
        };
        let policy = DrainPolicy {
            now: Instant::now(),
            timeout: Duration::from_secs(1),
        };
        let out = diff(
            &desired,
            &observed,
            &scope,
            &DrainQueue::new(),
            &policy,
            |_| false,
        );
        assert_eq!(
            ops(&out.changes),
            vec![
                IpvsOp::AddVirtualServer(shared, VirtualServerSettings::default()),
                IpvsOp::AddRealServer(shared, rkey(1), 1),
            ]
        );
        assert_eq!(
            out.rejected,
            vec![Rejection::Conflict {
                service: name("b"),
                key: shared,
                winner: name("a"),
            }]
        );
        assert_eq!(out.bind, vec!["10.96.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(out.unbind, vec!["10.96.0.9".parse::<IpAddr>().unwrap()]);
    }
}
