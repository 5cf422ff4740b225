//! Timeouts (`GET/SET_CONFIG`) and info (`GET_INFO`) attributes.

use super::attr::{AttrIter, AttrWriter, get_u32};
use super::consts::*;
use super::{EncodeError, IpvsMessage, WireError};
use crate::error::RangeError;
use crate::{Info, Timeouts};

/// A `SET_CONFIG` message; zero values are sent too (the kernel keeps the current value).
/// Each timeout must be at most [`MAX_TIMEOUT`](crate::timeouts::MAX_TIMEOUT).
pub fn encode_set_timeouts(t: &Timeouts) -> Result<IpvsMessage, EncodeError> {
    let max = u64::from(crate::timeouts::MAX_TIMEOUT);
    RangeError::check("TCP timeout", t.tcp, 0..=max)?;
    RangeError::check("TCP FIN timeout", t.tcp_fin, 0..=max)?;
    RangeError::check("UDP timeout", t.udp, 0..=max)?;
    let mut w = AttrWriter::new();
    w.u32(IPVS_CMD_ATTR_TIMEOUT_TCP, t.tcp);
    w.u32(IPVS_CMD_ATTR_TIMEOUT_TCP_FIN, t.tcp_fin);
    w.u32(IPVS_CMD_ATTR_TIMEOUT_UDP, t.udp);
    Ok(IpvsMessage {
        cmd: IPVS_CMD_SET_CONFIG,
        attrs: w.buf,
    })
}

/// Decodes the reply to `GET_CONFIG`.
pub fn decode_timeouts(msg: &IpvsMessage) -> Result<Timeouts, WireError> {
    let mut t = Timeouts::default();
    for a in AttrIter::new(&msg.attrs) {
        let (kind, v) = a?;
        match kind {
            IPVS_CMD_ATTR_TIMEOUT_TCP => t.tcp = get_u32("tcp timeout", v)?,
            IPVS_CMD_ATTR_TIMEOUT_TCP_FIN => t.tcp_fin = get_u32("tcp fin timeout", v)?,
            IPVS_CMD_ATTR_TIMEOUT_UDP => t.udp = get_u32("udp timeout", v)?,
            _ => {}
        }
    }
    Ok(t)
}

/// Decodes the reply to `GET_INFO`.
pub fn decode_info(msg: &IpvsMessage) -> Result<Info, WireError> {
    let mut version = None;
    let mut size = None;
    for a in AttrIter::new(&msg.attrs) {
        let (kind, v) = a?;
        match kind {
            IPVS_INFO_ATTR_VERSION => version = Some(get_u32("version", v)?),
            IPVS_INFO_ATTR_CONN_TAB_SIZE => size = Some(get_u32("conn table size", v)?),
            _ => {}
        }
    }
    Ok(Info {
        version: version.ok_or_else(|| WireError::new("info without version"))?,
        conn_table_size: size.ok_or_else(|| WireError::new("info without table size"))?,
    })
}
