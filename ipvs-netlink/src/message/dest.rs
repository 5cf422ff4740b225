//! Destination attributes (`IPVS_CMD_ATTR_DEST`).

use super::attr::{AttrIter, AttrWriter, get_addr, get_be16, get_u8, get_u16, get_u32};
use super::consts::*;
use super::stats::decode_stats;
use super::{EncodeError, IpvsMessage, WireError};
use crate::destination::MAX_WEIGHT;
use crate::destination::{
    Destination, DestinationEntry, DestinationKey, Tunnel, TunnelFlags, TunnelType,
};
use crate::error::RangeError;
use crate::service::{AddressFamily, ServiceKey};
use crate::{ForwardMethod, Stats};

/// Appends `IPVS_CMD_ATTR_DEST` holding only what identifies the destination (DEL_DEST).
pub fn encode_dest_key(msg: &mut IpvsMessage, key: &DestinationKey) -> Result<(), EncodeError> {
    let mut w = AttrWriter::new();
    w.nested(IPVS_CMD_ATTR_DEST, |w| {
        w.inet_addr(IPVS_DEST_ATTR_ADDR, key.addr);
        w.be16(IPVS_DEST_ATTR_PORT, key.port);
        w.u16(
            IPVS_DEST_ATTR_ADDR_FAMILY,
            AddressFamily::of(&key.addr).number(),
        );
    });
    msg.attrs.extend_from_slice(&w.buf);
    Ok(())
}

/// Appends `IPVS_CMD_ATTR_DEST` with the full configuration (NEW/SET_DEST).
pub fn encode_dest_full(msg: &mut IpvsMessage, dest: &Destination) -> Result<(), EncodeError> {
    if dest.forward == ForwardMethod::Bypass {
        return Err(EncodeError::invalid(
            "the bypass method cannot be configured",
        ));
    }
    let max = u64::from(MAX_WEIGHT);
    RangeError::check("weight", dest.weight, 0..=max)?;
    RangeError::check("upper threshold", dest.upper_threshold, 0..=max)?;
    // The kernel refuses a lower threshold above the upper one (ERANGE), even when the
    // upper one is 0 (no limit).
    RangeError::check(
        "lower threshold",
        dest.lower_threshold,
        0..=u64::from(dest.upper_threshold),
    )?;
    // Tunnel parameters go with tunnelling, and whenever they are not the defaults, so
    // that a destination read back is written back unchanged.
    let sends_tunnel = dest.forward == ForwardMethod::Tunnel || dest.tunnel != Tunnel::default();
    if sends_tunnel && dest.tunnel.kind == TunnelType::Gue {
        RangeError::check("GUE tunnel port", dest.tunnel.port, 1..=u64::from(u16::MAX))?;
    }
    let mut w = AttrWriter::new();
    w.nested(IPVS_CMD_ATTR_DEST, |w| {
        w.inet_addr(IPVS_DEST_ATTR_ADDR, dest.addr);
        w.be16(IPVS_DEST_ATTR_PORT, dest.port);
        w.u32(IPVS_DEST_ATTR_FWD_METHOD, dest.forward.bits());
        w.u32(IPVS_DEST_ATTR_WEIGHT, dest.weight);
        w.u32(IPVS_DEST_ATTR_U_THRESH, dest.upper_threshold);
        w.u32(IPVS_DEST_ATTR_L_THRESH, dest.lower_threshold);
        w.u16(
            IPVS_DEST_ATTR_ADDR_FAMILY,
            AddressFamily::of(&dest.addr).number(),
        );
        if sends_tunnel {
            w.u8(IPVS_DEST_ATTR_TUN_TYPE, dest.tunnel.kind.number());
            w.be16(IPVS_DEST_ATTR_TUN_PORT, dest.tunnel.port);
            w.u16(IPVS_DEST_ATTR_TUN_FLAGS, dest.tunnel.flags.0);
        }
    });
    msg.attrs.extend_from_slice(&w.buf);
    Ok(())
}

/// Decodes the content of an `IPVS_CMD_ATTR_DEST`; `service_family` is used when the
/// kernel does not send `IPVS_DEST_ATTR_ADDR_FAMILY` (kernels before 4.x).
pub fn decode_destination(
    buf: &[u8],
    service_family: AddressFamily,
) -> Result<DestinationEntry, WireError> {
    let mut addr = None;
    let mut port = None;
    let mut fwd = 0u32;
    let mut weight = 0u32;
    let mut upper = 0u32;
    let mut lower = 0u32;
    let mut active = 0u32;
    let mut inactive = 0u32;
    let mut persistent = 0u32;
    let mut af = None;
    let mut stats32 = None;
    let mut stats64 = None;
    let mut tunnel = Tunnel::default();
    for a in AttrIter::new(buf) {
        let (kind, v) = a?;
        match kind {
            IPVS_DEST_ATTR_ADDR => addr = Some(v),
            IPVS_DEST_ATTR_PORT => port = Some(get_be16("destination port", v)?),
            IPVS_DEST_ATTR_FWD_METHOD => fwd = get_u32("forwarding method", v)?,
            IPVS_DEST_ATTR_WEIGHT => weight = get_u32("weight", v)?,
            IPVS_DEST_ATTR_U_THRESH => upper = get_u32("upper threshold", v)?,
            IPVS_DEST_ATTR_L_THRESH => lower = get_u32("lower threshold", v)?,
            IPVS_DEST_ATTR_ACTIVE_CONNS => active = get_u32("active connections", v)?,
            IPVS_DEST_ATTR_INACT_CONNS => inactive = get_u32("inactive connections", v)?,
            IPVS_DEST_ATTR_PERSIST_CONNS => persistent = get_u32("persistent connections", v)?,
            IPVS_DEST_ATTR_ADDR_FAMILY => af = Some(get_u16("destination family", v)?),
            IPVS_DEST_ATTR_STATS => stats32 = Some(v),
            IPVS_DEST_ATTR_STATS64 => stats64 = Some(v),
            IPVS_DEST_ATTR_TUN_TYPE => {
                let n = get_u8("tunnel type", v)?;
                tunnel.kind = TunnelType::from_number(n)
                    .ok_or_else(|| WireError::new(format!("unknown tunnel type {n}")))?;
            }
            IPVS_DEST_ATTR_TUN_PORT => tunnel.port = get_be16("tunnel port", v)?,
            IPVS_DEST_ATTR_TUN_FLAGS => tunnel.flags = TunnelFlags(get_u16("tunnel flags", v)?),
            _ => {}
        }
    }
    let af = af.unwrap_or(service_family.number());
    let addr = get_addr(
        "destination address",
        af,
        addr.ok_or_else(|| WireError::new("destination without address"))?,
    )?;
    let port = port.ok_or_else(|| WireError::new("destination without port"))?;
    let forward = ForwardMethod::from_bits(fwd)
        .ok_or_else(|| WireError::new(format!("unknown forwarding method {fwd:#x}")))?;
    let stats = match (stats64, stats32) {
        (Some(v), _) | (None, Some(v)) => decode_stats(v)?,
        (None, None) => Stats::default(),
    };
    Ok(DestinationEntry {
        destination: Destination {
            addr,
            port,
            forward,
            weight,
            upper_threshold: upper,
            lower_threshold: lower,
            tunnel,
        },
        active_conns: active,
        inactive_conns: inactive,
        persistent_conns: persistent,
        stats,
    })
}

/// Decodes a `NEW_DEST` dump part of a destination dump for `service`.
pub fn decode_dest_message(
    msg: &IpvsMessage,
    service: &ServiceKey,
) -> Result<DestinationEntry, WireError> {
    let v = msg
        .attribute(IPVS_CMD_ATTR_DEST)?
        .ok_or_else(|| WireError::new("reply without a destination attribute"))?;
    decode_destination(v, service.family())
}
