//! The graceful-termination queue: real servers that are no longer planned, held
//! at weight 0 until their connections end (or a time bound, when one is set, passes).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::desired::{RealServerKey, VirtualServerKey};

/// Default bound on how long a removed real server is kept for its connections: none
/// (`Duration::MAX`), as kube-proxy keeps them for as long as they last. A connection that
/// goes quiet still ends: IPVS expires an idle entry after its own timeout (`ipvsadm
/// --set`, 15 minutes for established TCP by default).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::MAX;

/// Real servers being drained, with the time each one started draining.
#[derive(Debug, Clone, Default)]
pub struct DrainQueue {
    entries: BTreeMap<VirtualServerKey, BTreeMap<RealServerKey, Instant>>,
    len: usize,
}

impl DrainQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of real servers draining.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is draining.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Starts draining `rs` at `now`; keeps the original start if it is already draining.
    pub fn start(&mut self, vs: VirtualServerKey, rs: RealServerKey, now: Instant) {
        let per_vs = self.entries.entry(vs).or_default();
        if let std::collections::btree_map::Entry::Vacant(slot) = per_vs.entry(rs) {
            slot.insert(now);
            self.len += 1;
        }
    }

    /// Forgets `rs` (deleted, or planned again); returns whether it was draining.
    pub fn stop(&mut self, vs: &VirtualServerKey, rs: &RealServerKey) -> bool {
        let Some(per_vs) = self.entries.get_mut(vs) else {
            return false;
        };
        let removed = per_vs.remove(rs).is_some();
        if removed {
            self.len -= 1;
        }
        if per_vs.is_empty() {
            self.entries.remove(vs);
        }
        removed
    }

    /// Forgets every real server of `vs` (the virtual server was deleted).
    pub fn stop_virtual_server(&mut self, vs: &VirtualServerKey) {
        if let Some(per_vs) = self.entries.remove(vs) {
            self.len -= per_vs.len();
        }
    }

    /// When `rs` started draining, if it is draining.
    pub fn since(&self, vs: &VirtualServerKey, rs: &RealServerKey) -> Option<Instant> {
        self.entries
            .get(vs)
            .and_then(|per_vs| per_vs.get(rs))
            .copied()
    }

    /// Whether any real server of `vs` is draining.
    pub fn has_virtual_server(&self, vs: &VirtualServerKey) -> bool {
        self.entries.contains_key(vs)
    }

    /// Virtual servers with at least one draining real server.
    pub fn virtual_servers(&self) -> impl Iterator<Item = &VirtualServerKey> {
        self.entries.keys()
    }

    /// Every draining real server with its start time.
    pub fn iter(&self) -> impl Iterator<Item = (&VirtualServerKey, &RealServerKey, Instant)> {
        self.entries
            .iter()
            .flat_map(|(vs, per_vs)| per_vs.iter().map(move |(rs, since)| (vs, rs, *since)))
    }

    /// Keeps only the entries `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&VirtualServerKey, &RealServerKey) -> bool) {
        let mut len = 0;
        self.entries.retain(|vs, per_vs| {
            per_vs.retain(|rs, _| keep(vs, rs));
            len += per_vs.len();
            !per_vs.is_empty()
        });
        self.len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::Protocol;
    use std::net::{IpAddr, Ipv4Addr};

    fn vs(last: u8) -> VirtualServerKey {
        VirtualServerKey {
            address: IpAddr::V4(Ipv4Addr::new(10, 96, 0, last)),
            port: 80,
            protocol: Protocol::Tcp,
        }
    }

    fn rs(last: u8) -> RealServerKey {
        RealServerKey {
            address: IpAddr::V4(Ipv4Addr::new(10, 1, 0, last)),
            port: 8080,
        }
    }

    #[test]
    fn start_keeps_the_first_time_and_counts_once() {
        let mut queue = DrainQueue::new();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(5);
        queue.start(vs(1), rs(1), t0);
        queue.start(vs(1), rs(1), t1);
        queue.start(vs(1), rs(2), t1);
        queue.start(vs(2), rs(1), t1);
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.since(&vs(1), &rs(1)), Some(t0));
        assert!(queue.stop(&vs(1), &rs(1)));
        assert!(!queue.stop(&vs(1), &rs(1)));
        assert_eq!(queue.len(), 2);
        queue.stop_virtual_server(&vs(1));
        assert_eq!(queue.len(), 1);
        assert!(!queue.has_virtual_server(&vs(1)));
        queue.retain(|_, _| false);
        assert!(queue.is_empty());
        assert_eq!(queue.virtual_servers().count(), 0);
    }
}
