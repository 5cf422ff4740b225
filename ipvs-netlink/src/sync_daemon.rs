//! Connection synchronisation daemons (`ipvsadm --start-daemon`).

use std::net::IpAddr;
use std::ops::RangeInclusive;

/// Which side of connection synchronisation a daemon runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SyncState {
    /// Sends connection updates.
    Master,
    /// Receives connection updates.
    Backup,
}

impl SyncState {
    /// The `IP_VS_STATE_*` value.
    pub fn bits(self) -> u32 {
        match self {
            SyncState::Master => 0x0001,
            SyncState::Backup => 0x0002,
        }
    }

    /// The state for an `IP_VS_STATE_*` value.
    pub fn from_bits(bits: u32) -> Option<Self> {
        match bits {
            0x0001 => Some(SyncState::Master),
            0x0002 => Some(SyncState::Backup),
            _ => None,
        }
    }
}

/// A sync daemon's configuration. `None` fields are left to the kernel's defaults when
/// starting; the kernel reports all of them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SyncDaemon {
    /// Master or backup.
    pub state: SyncState,
    /// Multicast interface name (at most 15 bytes).
    pub interface: String,
    /// Sync ID, 0..=255 (sent as a u32, kept by the kernel in one byte).
    pub sync_id: u32,
    /// Maximum sync message length (see [`SyncDaemon::max_len_range`]).
    pub max_len: Option<u16>,
    /// Multicast group (IPv4 or IPv6).
    pub group: Option<IpAddr>,
    /// Multicast UDP port (not 0).
    pub port: Option<u16>,
    /// Multicast TTL (not 0).
    pub ttl: Option<u8>,
}

impl SyncDaemon {
    /// A daemon on `interface` with the kernel's defaults for everything optional.
    pub fn new(state: SyncState, interface: impl Into<String>, sync_id: u32) -> Self {
        SyncDaemon {
            state,
            interface: interface.into(),
            sync_id,
            max_len: None,
            group: None,
            port: None,
            ttl: None,
        }
    }
}

impl SyncDaemon {
    /// The same daemon with a maximum sync message length (see
    /// [`max_len_range`](Self::max_len_range)).
    pub fn with_max_len(mut self, len: u16) -> Self {
        self.max_len = Some(len);
        self
    }

    /// The same daemon with a multicast group (IPv4 or IPv6; the kernel's default is
    /// 224.0.0.81).
    pub fn with_group(mut self, group: IpAddr) -> Self {
        self.group = Some(group);
        self
    }

    /// The same daemon with a multicast UDP port (not 0; the kernel's default is 8848).
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// The same daemon with a multicast TTL (not 0; the kernel's default is 1).
    pub fn with_ttl(mut self, ttl: u8) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The maximum message lengths the kernel keeps as given: from 1 (master) or 1024
    /// (backup) to 65535 less the IP and UDP headers of the group's family.
    pub fn max_len_range(&self) -> RangeInclusive<u64> {
        let headers = match self.group {
            Some(IpAddr::V6(_)) => 40 + 8,
            _ => 20 + 8,
        };
        let min = match self.state {
            SyncState::Master => 1,
            SyncState::Backup => 1024,
        };
        min..=u64::from(u16::MAX) - headers
    }
}
