//! Sync daemon attributes (`IPVS_CMD_ATTR_DAEMON`, `IPVS_DAEMON_ATTR_*`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{DecodeError, DefaultNla, Nla, NlaBuffer, Parseable};

use super::consts::*;
use super::{EncodeError, WireError, emit_string, fixed, get_string, get_u8, get_u16, get_u32};
use crate::range::RangeError;
use crate::sync_daemon::{SyncDaemon, SyncState};

/// An attribute of a sync daemon (`IPVS_DAEMON_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DaemonAttr {
    /// `STATE`: `IP_VS_STATE_MASTER` or `IP_VS_STATE_BACKUP`.
    State(u32),
    /// `MCAST_IFN`: the multicast interface's name.
    McastIfn(String),
    /// `SYNC_ID`.
    SyncId(u32),
    /// `SYNC_MAXLEN`: the largest sync message.
    SyncMaxLen(u16),
    /// `MCAST_GROUP`: an IPv4 multicast group.
    McastGroup(Ipv4Addr),
    /// `MCAST_GROUP6`: an IPv6 multicast group.
    McastGroup6(Ipv6Addr),
    /// `MCAST_PORT`: the UDP port.
    McastPort(u16),
    /// `MCAST_TTL`.
    McastTtl(u8),
    /// An attribute this library does not know, kept as it came.
    Other(DefaultNla),
}

impl Nla for DaemonAttr {
    fn value_len(&self) -> usize {
        match self {
            DaemonAttr::State(_) | DaemonAttr::SyncId(_) | DaemonAttr::McastGroup(_) => 4,
            DaemonAttr::McastIfn(s) => s.len() + 1,
            DaemonAttr::SyncMaxLen(_) | DaemonAttr::McastPort(_) => 2,
            DaemonAttr::McastGroup6(_) => 16,
            DaemonAttr::McastTtl(_) => 1,
            DaemonAttr::Other(a) => a.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            DaemonAttr::State(_) => IPVS_DAEMON_ATTR_STATE,
            DaemonAttr::McastIfn(_) => IPVS_DAEMON_ATTR_MCAST_IFN,
            DaemonAttr::SyncId(_) => IPVS_DAEMON_ATTR_SYNC_ID,
            DaemonAttr::SyncMaxLen(_) => IPVS_DAEMON_ATTR_SYNC_MAXLEN,
            DaemonAttr::McastGroup(_) => IPVS_DAEMON_ATTR_MCAST_GROUP,
            DaemonAttr::McastGroup6(_) => IPVS_DAEMON_ATTR_MCAST_GROUP6,
            DaemonAttr::McastPort(_) => IPVS_DAEMON_ATTR_MCAST_PORT,
            DaemonAttr::McastTtl(_) => IPVS_DAEMON_ATTR_MCAST_TTL,
            DaemonAttr::Other(a) => a.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            DaemonAttr::State(v) | DaemonAttr::SyncId(v) => {
                buffer.copy_from_slice(&v.to_ne_bytes())
            }
            DaemonAttr::McastIfn(s) => emit_string(s, buffer),
            DaemonAttr::SyncMaxLen(v) | DaemonAttr::McastPort(v) => {
                buffer.copy_from_slice(&v.to_ne_bytes())
            }
            DaemonAttr::McastGroup(g) => buffer.copy_from_slice(&g.octets()),
            DaemonAttr::McastGroup6(g) => buffer.copy_from_slice(&g.octets()),
            DaemonAttr::McastTtl(v) => buffer[0] = *v,
            DaemonAttr::Other(a) => a.emit_value(buffer),
        }
    }
}

impl<'a> Parseable<NlaBuffer<&'a [u8]>> for DaemonAttr {
    fn parse(buf: &NlaBuffer<&'a [u8]>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_DAEMON_ATTR_STATE => DaemonAttr::State(get_u32("daemon state", v)?),
            IPVS_DAEMON_ATTR_MCAST_IFN => DaemonAttr::McastIfn(get_string("daemon interface", v)?),
            IPVS_DAEMON_ATTR_SYNC_ID => DaemonAttr::SyncId(get_u32("sync id", v)?),
            IPVS_DAEMON_ATTR_SYNC_MAXLEN => DaemonAttr::SyncMaxLen(get_u16("sync maxlen", v)?),
            IPVS_DAEMON_ATTR_MCAST_GROUP => {
                DaemonAttr::McastGroup(Ipv4Addr::from(fixed::<4>("mcast group", v)?))
            }
            IPVS_DAEMON_ATTR_MCAST_GROUP6 => {
                DaemonAttr::McastGroup6(Ipv6Addr::from(fixed::<16>("mcast group6", v)?))
            }
            IPVS_DAEMON_ATTR_MCAST_PORT => DaemonAttr::McastPort(get_u16("mcast port", v)?),
            IPVS_DAEMON_ATTR_MCAST_TTL => DaemonAttr::McastTtl(get_u8("mcast ttl", v)?),
            _ => DaemonAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// The `IP_VS_STATE_*` value of a state.
pub(crate) fn state_bits(state: SyncState) -> u32 {
    match state {
        SyncState::Master => IP_VS_STATE_MASTER,
        SyncState::Backup => IP_VS_STATE_BACKUP,
    }
}

/// The attributes of a daemon's configuration (NEW_DAEMON), validated.
pub(crate) fn daemon_nlas(d: &SyncDaemon) -> Result<Vec<DaemonAttr>, EncodeError> {
    if d.interface.is_empty() || d.interface.len() > IFNAME_MAX || d.interface.contains('\0') {
        return Err(EncodeError::invalid(
            "interface name",
            format!(
                "{:?} must be 1..={IFNAME_MAX} bytes without NUL",
                d.interface
            ),
        ));
    }
    // The kernel keeps the sync ID in one byte, and replaces a 0 port, TTL or maximum
    // length by its default and clamps the maximum length: refuse what would be changed.
    RangeError::check("sync ID", d.sync_id, 0..=u64::from(u8::MAX))?;
    if let Some(port) = d.port {
        RangeError::check("multicast port", port, 1..=u64::from(u16::MAX))?;
    }
    if let Some(ttl) = d.ttl {
        RangeError::check("multicast TTL", ttl, 1..=u64::from(u8::MAX))?;
    }
    if let Some(len) = d.max_len {
        RangeError::check("sync message maximum length", len, d.max_len_range())?;
    }
    let mut out = vec![
        DaemonAttr::State(state_bits(d.state)),
        DaemonAttr::McastIfn(d.interface.clone()),
        DaemonAttr::SyncId(d.sync_id),
    ];
    if let Some(len) = d.max_len {
        out.push(DaemonAttr::SyncMaxLen(len));
    }
    match d.group {
        Some(IpAddr::V4(g)) => out.push(DaemonAttr::McastGroup(g)),
        Some(IpAddr::V6(g)) => out.push(DaemonAttr::McastGroup6(g)),
        None => {}
    }
    if let Some(port) = d.port {
        out.push(DaemonAttr::McastPort(port));
    }
    if let Some(ttl) = d.ttl {
        out.push(DaemonAttr::McastTtl(ttl));
    }
    Ok(out)
}

/// A sync daemon as the kernel describes it (the content of `IPVS_CMD_ATTR_DAEMON`).
pub fn sync_daemon(nlas: &[DaemonAttr]) -> Result<SyncDaemon, WireError> {
    let mut state = None;
    let mut ifn = None;
    let mut d = SyncDaemon::new(SyncState::Master, String::new(), 0);
    for a in nlas {
        match a {
            DaemonAttr::State(v) => state = Some(*v),
            DaemonAttr::McastIfn(v) => ifn = Some(v.clone()),
            DaemonAttr::SyncId(v) => d.sync_id = *v,
            DaemonAttr::SyncMaxLen(v) => d.max_len = Some(*v),
            DaemonAttr::McastGroup(g) => d.group = Some(IpAddr::V4(*g)),
            DaemonAttr::McastGroup6(g) => d.group = Some(IpAddr::V6(*g)),
            DaemonAttr::McastPort(v) => d.port = Some(*v),
            DaemonAttr::McastTtl(v) => d.ttl = Some(*v),
            DaemonAttr::Other(_) => {}
        }
    }
    let state = state.ok_or_else(|| WireError::new("daemon without state"))?;
    d.state = match state {
        IP_VS_STATE_MASTER => SyncState::Master,
        IP_VS_STATE_BACKUP => SyncState::Backup,
        other => return Err(WireError::new(format!("unknown daemon state {other}"))),
    };
    d.interface = ifn.ok_or_else(|| WireError::new("daemon without interface"))?;
    Ok(d)
}
