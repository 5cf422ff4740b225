//! What the kernel holds: IPVS virtual servers with their real servers, and
//! the addresses bound on the dummy link, as read back through the backends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::desired::{RealServerKey, Scheduler, SortedMap, VirtualServer, VirtualServerKey};

/// How a real server is reached, as far as the proxier cares: masquerade (NAT), the only
/// method it creates, or some other method someone else set (which it repairs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Forwarding {
    /// NAT (IPVS masquerade).
    #[default]
    Masquerade,
    /// Direct routing, tunnelling or local delivery.
    Other,
}

/// The settings of a virtual server that the proxier manages (everything but its real servers).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct VirtualServerSettings {
    /// Scheduler.
    pub scheduler: Scheduler,
    /// Persistence (ClientIP affinity) timeout in seconds; `None` when not persistent.
    pub persistence_timeout: Option<u32>,
    /// Source-hash port flag (`IP_VS_SVC_F_SCHED_SH_PORT` / `..._MH_PORT`).
    pub hash_source_port: bool,
}

impl VirtualServerSettings {
    /// The settings a planned virtual server asks for.
    pub fn of(vs: &VirtualServer) -> Self {
        VirtualServerSettings {
            scheduler: vs.scheduler.clone(),
            persistence_timeout: vs.persistence_timeout,
            hash_source_port: vs.hash_source_port,
        }
    }
}

/// A real server as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObservedRealServer {
    /// Current weight (0 while draining).
    pub weight: u32,
    /// Forwarding method (the proxier only ever creates [`Forwarding::Masquerade`]).
    pub forward: Forwarding,
    /// Active (established) connections.
    pub active_connections: u32,
    /// Inactive connections (e.g. TIME_WAIT, UDP).
    pub inactive_connections: u32,
}

impl ObservedRealServer {
    /// A masquerading real server with the given weight and no connections.
    pub fn new(weight: u32) -> Self {
        ObservedRealServer {
            weight,
            forward: Forwarding::Masquerade,
            active_connections: 0,
            inactive_connections: 0,
        }
    }

    /// Active plus inactive connections.
    pub fn connections(&self) -> u64 {
        u64::from(self.active_connections) + u64::from(self.inactive_connections)
    }
}

/// A virtual server as the kernel reports it, with its real servers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObservedVirtualServer {
    /// Scheduler and flags.
    pub settings: VirtualServerSettings,
    /// Real servers by address and port.
    pub real_servers: SortedMap<RealServerKey, ObservedRealServer>,
}

impl ObservedVirtualServer {
    /// Takes `read`'s settings and real servers' figures in place when `read` has the same
    /// real servers (the usual case: a full sync's read of a converged virtual server);
    /// `false`, leaving `self` as it was, when they differ.
    ///
    /// A read is built by the thread that read the table, among its transient buffers, and
    /// a full sync's read thread exits: a cache that kept the read's entries would move into
    /// those sparse pages at every resync. Refreshed in place, it stays where it was built.
    pub fn refresh_from(&mut self, read: &ObservedVirtualServer) -> bool {
        if !self.real_servers.keys().eq(read.real_servers.keys()) {
            return false;
        }
        self.settings.clone_from(&read.settings);
        for (cached, fresh) in self
            .real_servers
            .values_mut()
            .zip(read.real_servers.values())
        {
            *cached = *fresh;
        }
        true
    }

    /// Whether two snapshots hold the same configuration (connection counts ignored).
    pub fn same_configuration(&self, other: &ObservedVirtualServer) -> bool {
        self.settings == other.settings
            && self.real_servers.len() == other.real_servers.len()
            && self
                .real_servers
                .iter()
                .zip(other.real_servers.iter())
                .all(|((ka, a), (kb, b))| {
                    ka == kb && a.weight == b.weight && a.forward == b.forward
                })
    }
    /// Counts the objects whose configuration differs between two snapshots of one virtual
    /// server (`None`: absent), as [`Observed::count_differences`] does: one for a virtual
    /// server in only one snapshot or with other settings, one per real server in only one
    /// or with another weight or forwarding method.
    pub fn differences(
        a: Option<&ObservedVirtualServer>,
        b: Option<&ObservedVirtualServer>,
    ) -> usize {
        let (Some(a), Some(b)) = (a, b) else {
            return usize::from(a.is_some() || b.is_some());
        };
        let mut differences = usize::from(a.settings != b.settings);
        let rs_keys: BTreeSet<&RealServerKey> =
            a.real_servers.keys().chain(b.real_servers.keys()).collect();
        for rs in rs_keys {
            match (a.real_servers.get(rs), b.real_servers.get(rs)) {
                (Some(x), Some(y)) if x.weight == y.weight && x.forward == y.forward => {}
                _ => differences += 1,
            }
        }
        differences
    }
}

/// A snapshot of the kernel state the reconciler works on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    /// Every tuple (address, port, protocol) virtual server in the namespace, owned or not.
    pub virtual_servers: BTreeMap<VirtualServerKey, ObservedVirtualServer>,
    /// Addresses bound on the dummy link.
    pub bound_addresses: BTreeSet<IpAddr>,
}

impl Observed {
    /// Counts the objects whose configuration differs between `self` and `other`,
    /// looking only at virtual servers `considered` accepts and at addresses:
    /// one per virtual server present in only one snapshot or with other settings,
    /// one per real server present in only one or with another weight or
    /// forwarding method, one per address bound in only one.
    pub fn count_differences(
        &self,
        other: &Observed,
        considered: impl Fn(&VirtualServerKey) -> bool,
    ) -> usize {
        let mut differences = self
            .bound_addresses
            .symmetric_difference(&other.bound_addresses)
            .count();
        let keys: BTreeSet<&VirtualServerKey> = self
            .virtual_servers
            .keys()
            .chain(other.virtual_servers.keys())
            .filter(|key| considered(key))
            .collect();
        for key in keys {
            differences += ObservedVirtualServer::differences(
                self.virtual_servers.get(key),
                other.virtual_servers.get(key),
            );
        }
        differences
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::RealServerKey;

    fn vs(real_servers: &[(&str, u32, u32)]) -> ObservedVirtualServer {
        ObservedVirtualServer {
            settings: VirtualServerSettings::default(),
            real_servers: real_servers
                .iter()
                .map(|&(address, weight, active)| {
                    let key = RealServerKey {
                        address: address.parse().expect("address"),
                        port: 8080,
                    };
                    let mut rs = ObservedRealServer::new(weight);
                    rs.active_connections = active;
                    (key, rs)
                })
                .collect(),
        }
    }

    #[test]
    fn a_read_with_the_same_real_servers_refreshes_the_cache_in_place() {
        let mut cached = vs(&[("10.0.0.1", 1, 0), ("10.0.0.2", 1, 3)]);
        let mut read = vs(&[("10.0.0.1", 0, 7), ("10.0.0.2", 1, 0)]);
        read.settings.persistence_timeout = Some(60);
        assert!(cached.refresh_from(&read));
        assert_eq!(cached, read);
    }

    #[test]
    fn a_read_with_other_real_servers_leaves_the_cache_as_it_was() {
        let before = vs(&[("10.0.0.1", 1, 0), ("10.0.0.2", 1, 3)]);
        for read in [
            vs(&[("10.0.0.1", 1, 0)]),
            vs(&[("10.0.0.1", 1, 0), ("10.0.0.3", 1, 3)]),
            vs(&[("10.0.0.1", 1, 0), ("10.0.0.2", 1, 3), ("10.0.0.3", 1, 0)]),
        ] {
            let mut cached = before.clone();
            assert!(!cached.refresh_from(&read), "{read:?}");
            assert_eq!(cached, before);
        }
    }
}
