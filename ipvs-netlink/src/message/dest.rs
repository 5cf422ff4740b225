//! Destination attributes (`IPVS_CMD_ATTR_DEST`, `IPVS_DEST_ATTR_*`).

use netlink_packet_core::{DecodeError, DefaultNla, Nla, NlaBuffer, Parseable};

use super::consts::*;
use super::service::InetAddr;
use super::stats::{StatsAttr, stats, stats_of_nest};
use super::{
    EncodeError, Nest, WireError, attributes, emit_nested, get_be16, get_u8, get_u16, get_u32,
    nested_len, parse_nested,
};
use crate::destination::{
    Destination, DestinationEntry, DestinationKey, MAX_WEIGHT, Tunnel, TunnelFlags, TunnelType,
};
use crate::range::RangeError;
use crate::service::AddressFamily;
use crate::{ForwardMethod, Stats};

/// An attribute of a destination (`IPVS_DEST_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DestAttr {
    /// `ADDR`: the real server's address.
    Addr(InetAddr),
    /// `PORT`: the real server's port (big-endian on the wire).
    Port(u16),
    /// `FWD_METHOD`: `IP_VS_CONN_F_*` forwarding bits.
    FwdMethod(u32),
    /// `WEIGHT`.
    Weight(u32),
    /// `U_THRESH`: upper connection threshold.
    UpperThreshold(u32),
    /// `L_THRESH`: lower connection threshold.
    LowerThreshold(u32),
    /// `ACTIVE_CONNS` (reported only).
    ActiveConns(u32),
    /// `INACT_CONNS` (reported only).
    InactiveConns(u32),
    /// `PERSIST_CONNS` (reported only).
    PersistentConns(u32),
    /// `STATS`: 32-bit statistics.
    Stats(Nest<StatsAttr>),
    /// `ADDR_FAMILY`: the address family (may differ from the service's when tunnelling).
    AddressFamily(u16),
    /// `STATS64`: 64-bit statistics.
    Stats64(Nest<StatsAttr>),
    /// `TUN_TYPE`: `IP_VS_CONN_F_TUNNEL_TYPE_*`.
    TunnelType(u8),
    /// `TUN_PORT`: the tunnel's UDP port (big-endian on the wire).
    TunnelPort(u16),
    /// `TUN_FLAGS`: `IP_VS_TUNNEL_ENCAP_FLAG_*`.
    TunnelFlags(u16),
    /// An attribute this library does not know, kept as it came.
    Other(DefaultNla),
}

impl Nla for DestAttr {
    fn value_len(&self) -> usize {
        match self {
            DestAttr::Addr(_) => 16,
            DestAttr::Port(_)
            | DestAttr::AddressFamily(_)
            | DestAttr::TunnelPort(_)
            | DestAttr::TunnelFlags(_) => 2,
            DestAttr::TunnelType(_) => 1,
            DestAttr::FwdMethod(_)
            | DestAttr::Weight(_)
            | DestAttr::UpperThreshold(_)
            | DestAttr::LowerThreshold(_)
            | DestAttr::ActiveConns(_)
            | DestAttr::InactiveConns(_)
            | DestAttr::PersistentConns(_) => 4,
            DestAttr::Stats(v) | DestAttr::Stats64(v) => nested_len(&v.nlas),
            DestAttr::Other(a) => a.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            DestAttr::Addr(_) => IPVS_DEST_ATTR_ADDR,
            DestAttr::Port(_) => IPVS_DEST_ATTR_PORT,
            DestAttr::FwdMethod(_) => IPVS_DEST_ATTR_FWD_METHOD,
            DestAttr::Weight(_) => IPVS_DEST_ATTR_WEIGHT,
            DestAttr::UpperThreshold(_) => IPVS_DEST_ATTR_U_THRESH,
            DestAttr::LowerThreshold(_) => IPVS_DEST_ATTR_L_THRESH,
            DestAttr::ActiveConns(_) => IPVS_DEST_ATTR_ACTIVE_CONNS,
            DestAttr::InactiveConns(_) => IPVS_DEST_ATTR_INACT_CONNS,
            DestAttr::PersistentConns(_) => IPVS_DEST_ATTR_PERSIST_CONNS,
            DestAttr::Stats(_) => IPVS_DEST_ATTR_STATS,
            DestAttr::AddressFamily(_) => IPVS_DEST_ATTR_ADDR_FAMILY,
            DestAttr::Stats64(_) => IPVS_DEST_ATTR_STATS64,
            DestAttr::TunnelType(_) => IPVS_DEST_ATTR_TUN_TYPE,
            DestAttr::TunnelPort(_) => IPVS_DEST_ATTR_TUN_PORT,
            DestAttr::TunnelFlags(_) => IPVS_DEST_ATTR_TUN_FLAGS,
            DestAttr::Other(a) => a.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            DestAttr::Addr(a) => buffer.copy_from_slice(&a.0),
            DestAttr::Port(v) | DestAttr::TunnelPort(v) => buffer.copy_from_slice(&v.to_be_bytes()),
            DestAttr::AddressFamily(v) | DestAttr::TunnelFlags(v) => {
                buffer.copy_from_slice(&v.to_ne_bytes())
            }
            DestAttr::TunnelType(v) => buffer[0] = *v,
            DestAttr::FwdMethod(v)
            | DestAttr::Weight(v)
            | DestAttr::UpperThreshold(v)
            | DestAttr::LowerThreshold(v)
            | DestAttr::ActiveConns(v)
            | DestAttr::InactiveConns(v)
            | DestAttr::PersistentConns(v) => buffer.copy_from_slice(&v.to_ne_bytes()),
            DestAttr::Stats(v) | DestAttr::Stats64(v) => emit_nested(&v.nlas, buffer),
            DestAttr::Other(a) => a.emit_value(buffer),
        }
    }

    fn is_nested(&self) -> bool {
        match self {
            DestAttr::Stats(v) | DestAttr::Stats64(v) => v.nested_flag,
            DestAttr::Other(a) => a.is_nested(),
            _ => false,
        }
    }
}

impl<'a> Parseable<NlaBuffer<&'a [u8]>> for DestAttr {
    fn parse(buf: &NlaBuffer<&'a [u8]>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_DEST_ATTR_ADDR => DestAttr::Addr(InetAddr::parse("destination address", v)?),
            IPVS_DEST_ATTR_PORT => DestAttr::Port(get_be16("destination port", v)?),
            IPVS_DEST_ATTR_FWD_METHOD => DestAttr::FwdMethod(get_u32("forwarding method", v)?),
            IPVS_DEST_ATTR_WEIGHT => DestAttr::Weight(get_u32("weight", v)?),
            IPVS_DEST_ATTR_U_THRESH => DestAttr::UpperThreshold(get_u32("upper threshold", v)?),
            IPVS_DEST_ATTR_L_THRESH => DestAttr::LowerThreshold(get_u32("lower threshold", v)?),
            IPVS_DEST_ATTR_ACTIVE_CONNS => DestAttr::ActiveConns(get_u32("active connections", v)?),
            IPVS_DEST_ATTR_INACT_CONNS => {
                DestAttr::InactiveConns(get_u32("inactive connections", v)?)
            }
            IPVS_DEST_ATTR_PERSIST_CONNS => {
                DestAttr::PersistentConns(get_u32("persistent connections", v)?)
            }
            IPVS_DEST_ATTR_STATS => DestAttr::Stats(parse_nested(buf)?),
            IPVS_DEST_ATTR_ADDR_FAMILY => {
                DestAttr::AddressFamily(get_u16("destination family", v)?)
            }
            IPVS_DEST_ATTR_STATS64 => DestAttr::Stats64(parse_nested(buf)?),
            IPVS_DEST_ATTR_TUN_TYPE => DestAttr::TunnelType(get_u8("tunnel type", v)?),
            IPVS_DEST_ATTR_TUN_PORT => DestAttr::TunnelPort(get_be16("tunnel port", v)?),
            IPVS_DEST_ATTR_TUN_FLAGS => DestAttr::TunnelFlags(get_u16("tunnel flags", v)?),
            _ => DestAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// The attributes identifying a destination (DEL_DEST).
pub(crate) fn key_nlas(key: &DestinationKey) -> Vec<DestAttr> {
    vec![
        DestAttr::Addr(InetAddr::from_ip(key.addr)),
        DestAttr::Port(key.port),
        DestAttr::AddressFamily(AddressFamily::of(&key.addr).number()),
    ]
}

/// The attributes of a destination's full configuration (NEW/SET_DEST), validated.
pub(crate) fn dest_nlas(dest: &Destination) -> Result<Vec<DestAttr>, EncodeError> {
    if dest.forward == ForwardMethod::Bypass {
        return Err(EncodeError::invalid(
            "forwarding method",
            "bypass is only ever reported by the kernel, never configured",
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
    let mut out = Vec::with_capacity(10);
    out.push(DestAttr::Addr(InetAddr::from_ip(dest.addr)));
    out.push(DestAttr::Port(dest.port));
    out.push(DestAttr::FwdMethod(dest.forward.bits()));
    out.push(DestAttr::Weight(dest.weight));
    out.push(DestAttr::UpperThreshold(dest.upper_threshold));
    out.push(DestAttr::LowerThreshold(dest.lower_threshold));
    out.push(DestAttr::AddressFamily(
        AddressFamily::of(&dest.addr).number(),
    ));
    if sends_tunnel {
        out.push(DestAttr::TunnelType(dest.tunnel.kind.number()));
        out.push(DestAttr::TunnelPort(dest.tunnel.port));
        out.push(DestAttr::TunnelFlags(dest.tunnel.flags.0));
    }
    Ok(out)
}

/// A destination as the kernel describes it (the content of `IPVS_CMD_ATTR_DEST` in a
/// reply); `service_family` is used when the kernel does not send
/// `IPVS_DEST_ATTR_ADDR_FAMILY` (kernels before 4.x).
pub fn destination_entry(
    nlas: &[DestAttr],
    service_family: AddressFamily,
) -> Result<DestinationEntry, WireError> {
    let mut fields = DestFields::default();
    for a in nlas {
        fields.take(a)?;
    }
    fields.finish(service_family)
}

/// [`destination_entry`] of the raw `IPVS_CMD_ATTR_DEST` value, attribute by attribute,
/// without building the attribute list (the table read's hot path).
pub(crate) fn destination_of_record(
    record: &[u8],
    service_family: AddressFamily,
) -> Result<DestinationEntry, WireError> {
    let mut fields = DestFields::default();
    for attr in attributes(record) {
        let attr = attr?;
        let v = attr.value;
        // The attributes every destination carries are read in place, as
        // `DestAttr::parse` reads them; the others go through it.
        match attr.kind {
            IPVS_DEST_ATTR_ADDR => fields.addr = Some(InetAddr::parse("destination address", v)?),
            IPVS_DEST_ATTR_PORT => fields.port = Some(get_be16("destination port", v)?),
            IPVS_DEST_ATTR_FWD_METHOD => fields.fwd = get_u32("forwarding method", v)?,
            IPVS_DEST_ATTR_WEIGHT => fields.weight = get_u32("weight", v)?,
            IPVS_DEST_ATTR_U_THRESH => fields.upper = get_u32("upper threshold", v)?,
            IPVS_DEST_ATTR_L_THRESH => fields.lower = get_u32("lower threshold", v)?,
            IPVS_DEST_ATTR_ACTIVE_CONNS => fields.active = get_u32("active connections", v)?,
            IPVS_DEST_ATTR_INACT_CONNS => fields.inactive = get_u32("inactive connections", v)?,
            IPVS_DEST_ATTR_PERSIST_CONNS => {
                fields.persistent = get_u32("persistent connections", v)?;
            }
            IPVS_DEST_ATTR_ADDR_FAMILY => fields.af = Some(get_u16("destination family", v)?),
            IPVS_DEST_ATTR_STATS => fields.stats32 = Some(stats_of_nest(v)?),
            IPVS_DEST_ATTR_STATS64 => fields.stats64 = Some(stats_of_nest(v)?),
            _ => fields.take(&DestAttr::parse(&attr.buffer())?)?,
        }
    }
    fields.finish(service_family)
}

/// The fields of a destination, gathered one attribute at a time.
#[derive(Debug, Default)]
struct DestFields {
    addr: Option<InetAddr>,
    port: Option<u16>,
    fwd: u32,
    weight: u32,
    upper: u32,
    lower: u32,
    active: u32,
    inactive: u32,
    persistent: u32,
    af: Option<u16>,
    stats32: Option<Stats>,
    stats64: Option<Stats>,
    tunnel: Tunnel,
}

impl DestFields {
    fn take(&mut self, a: &DestAttr) -> Result<(), WireError> {
        match a {
            DestAttr::Addr(v) => self.addr = Some(*v),
            DestAttr::Port(v) => self.port = Some(*v),
            DestAttr::FwdMethod(v) => self.fwd = *v,
            DestAttr::Weight(v) => self.weight = *v,
            DestAttr::UpperThreshold(v) => self.upper = *v,
            DestAttr::LowerThreshold(v) => self.lower = *v,
            DestAttr::ActiveConns(v) => self.active = *v,
            DestAttr::InactiveConns(v) => self.inactive = *v,
            DestAttr::PersistentConns(v) => self.persistent = *v,
            DestAttr::AddressFamily(v) => self.af = Some(*v),
            DestAttr::Stats(v) => self.stats32 = Some(stats(&v.nlas)),
            DestAttr::Stats64(v) => self.stats64 = Some(stats(&v.nlas)),
            DestAttr::TunnelType(n) => {
                self.tunnel.kind = TunnelType::from_number(*n)
                    .ok_or_else(|| WireError::new(format!("unknown tunnel type {n}")))?;
            }
            DestAttr::TunnelPort(v) => self.tunnel.port = *v,
            DestAttr::TunnelFlags(v) => self.tunnel.flags = TunnelFlags(*v),
            DestAttr::Other(_) => {}
        }
        Ok(())
    }

    fn finish(self, service_family: AddressFamily) -> Result<DestinationEntry, WireError> {
        let family = match self.af {
            None => service_family,
            Some(n) => AddressFamily::from_number(n).ok_or_else(|| {
                WireError::new(format!("destination address: unknown address family {n}"))
            })?,
        };
        let addr = self
            .addr
            .ok_or_else(|| WireError::new("destination without address"))?
            .to_ip(family);
        let port = self
            .port
            .ok_or_else(|| WireError::new("destination without port"))?;
        let fwd = self.fwd;
        let forward = ForwardMethod::from_bits(fwd)
            .ok_or_else(|| WireError::new(format!("unknown forwarding method {fwd:#x}")))?;
        Ok(DestinationEntry {
            destination: Destination {
                addr,
                port,
                forward,
                weight: self.weight,
                upper_threshold: self.upper,
                lower_threshold: self.lower,
                tunnel: self.tunnel,
            },
            active_conns: self.active,
            inactive_conns: self.inactive,
            persistent_conns: self.persistent,
            stats: self.stats64.or(self.stats32).unwrap_or_default(),
        })
    }
}
