//! Sync daemon attributes (`IPVS_CMD_ATTR_DAEMON`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::attr::{AttrIter, AttrWriter, get_string, get_u8, get_u16, get_u32};
use super::consts::*;
use super::{EncodeError, IpvsMessage, WireError};
use crate::error::RangeError;
use crate::sync_daemon::{SyncDaemon, SyncState};

/// Appends `IPVS_CMD_ATTR_DAEMON` with a daemon's configuration (NEW_DAEMON).
pub fn encode_daemon(msg: &mut IpvsMessage, d: &SyncDaemon) -> Result<(), EncodeError> {
    if d.interface.is_empty() || d.interface.len() > IFNAME_MAX || d.interface.contains('\0') {
        return Err(EncodeError::invalid(format!(
            "interface name {:?} must be 1..={IFNAME_MAX} bytes without NUL",
            d.interface
        )));
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
    let mut w = AttrWriter::new();
    w.nested(IPVS_CMD_ATTR_DAEMON, |w| {
        w.u32(IPVS_DAEMON_ATTR_STATE, d.state.bits());
        w.string(IPVS_DAEMON_ATTR_MCAST_IFN, &d.interface);
        w.u32(IPVS_DAEMON_ATTR_SYNC_ID, d.sync_id);
        if let Some(len) = d.max_len {
            w.u16(IPVS_DAEMON_ATTR_SYNC_MAXLEN, len);
        }
        match d.group {
            Some(IpAddr::V4(g)) => w.bytes(IPVS_DAEMON_ATTR_MCAST_GROUP, &g.octets()),
            Some(IpAddr::V6(g)) => w.bytes(IPVS_DAEMON_ATTR_MCAST_GROUP6, &g.octets()),
            None => {}
        }
        if let Some(port) = d.port {
            w.u16(IPVS_DAEMON_ATTR_MCAST_PORT, port);
        }
        if let Some(ttl) = d.ttl {
            w.u8(IPVS_DAEMON_ATTR_MCAST_TTL, ttl);
        }
    });
    msg.attrs.extend_from_slice(&w.buf);
    Ok(())
}

/// Appends `IPVS_CMD_ATTR_DAEMON` with only the state (DEL_DAEMON).
pub fn encode_daemon_state(msg: &mut IpvsMessage, state: SyncState) {
    let mut w = AttrWriter::new();
    w.nested(IPVS_CMD_ATTR_DAEMON, |w| {
        w.u32(IPVS_DAEMON_ATTR_STATE, state.bits());
    });
    msg.attrs.extend_from_slice(&w.buf);
}

fn decode_daemon(buf: &[u8]) -> Result<SyncDaemon, WireError> {
    let mut state = None;
    let mut ifn = None;
    let mut sync_id = 0;
    let mut d = SyncDaemon::new(SyncState::Master, String::new(), 0);
    for a in AttrIter::new(buf) {
        let (kind, v) = a?;
        match kind {
            IPVS_DAEMON_ATTR_STATE => state = Some(get_u32("daemon state", v)?),
            IPVS_DAEMON_ATTR_MCAST_IFN => ifn = Some(get_string("daemon interface", v)?),
            IPVS_DAEMON_ATTR_SYNC_ID => sync_id = get_u32("sync id", v)?,
            IPVS_DAEMON_ATTR_SYNC_MAXLEN => d.max_len = Some(get_u16("sync maxlen", v)?),
            IPVS_DAEMON_ATTR_MCAST_GROUP => {
                let b: [u8; 4] = v
                    .get(..4)
                    .and_then(|s| s.try_into().ok())
                    .ok_or_else(|| WireError::new("mcast group: need 4 bytes"))?;
                d.group = Some(IpAddr::V4(Ipv4Addr::from(b)));
            }
            IPVS_DAEMON_ATTR_MCAST_GROUP6 => {
                let b: [u8; 16] = v
                    .get(..16)
                    .and_then(|s| s.try_into().ok())
                    .ok_or_else(|| WireError::new("mcast group6: need 16 bytes"))?;
                d.group = Some(IpAddr::V6(Ipv6Addr::from(b)));
            }
            IPVS_DAEMON_ATTR_MCAST_PORT => d.port = Some(get_u16("mcast port", v)?),
            IPVS_DAEMON_ATTR_MCAST_TTL => d.ttl = Some(get_u8("mcast ttl", v)?),
            _ => {}
        }
    }
    let state = state.ok_or_else(|| WireError::new("daemon without state"))?;
    d.state = SyncState::from_bits(state)
        .ok_or_else(|| WireError::new(format!("unknown daemon state {state}")))?;
    d.interface = ifn.ok_or_else(|| WireError::new("daemon without interface"))?;
    d.sync_id = sync_id;
    Ok(d)
}

/// Decodes a `NEW_DAEMON` dump part.
pub fn decode_daemon_message(msg: &IpvsMessage) -> Result<SyncDaemon, WireError> {
    let v = msg
        .attribute(IPVS_CMD_ATTR_DAEMON)?
        .ok_or_else(|| WireError::new("reply without a daemon attribute"))?;
    decode_daemon(v)
}
