//! Service attributes (`IPVS_CMD_ATTR_SERVICE`, `IPVS_SVC_ATTR_*`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{DecodeError, DefaultNla, Nla, NlaBuffer, Parseable};

use super::consts::*;
use super::stats::{StatsAttr, stats, stats_of_nest};
use super::{
    EncodeError, Nest, WireError, attributes, emit_nested, emit_string, get_be16, get_string,
    get_u16, get_u32, nested_len, parse_nested,
};
use crate::range::RangeError;
use crate::service::{
    AddressFamily, MAX_PERSISTENCE_TIMEOUT, Netmask, Service, ServiceEntry, ServiceFlags,
    ServiceKey,
};
use crate::{Protocol, Scheduler, Stats};

/// An address as the kernel carries it (`union nf_inet_addr`): 16 bytes, an IPv4 address
/// in the first 4. Which family it is comes from a sibling attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct InetAddr(pub [u8; 16]);

impl InetAddr {
    /// The wire form of an address.
    pub fn from_ip(addr: IpAddr) -> Self {
        let mut v = [0u8; 16];
        match addr {
            IpAddr::V4(a) => v[..4].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => v.copy_from_slice(&a.octets()),
        }
        InetAddr(v)
    }

    /// The address, read as the given family.
    pub fn to_ip(self, family: AddressFamily) -> IpAddr {
        match family {
            AddressFamily::Inet => {
                IpAddr::V4(Ipv4Addr::new(self.0[0], self.0[1], self.0[2], self.0[3]))
            }
            AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::from(self.0)),
        }
    }

    /// Parses a value of 16 bytes (or 4, an IPv4 address from a short-form sender).
    pub(crate) fn parse(what: &str, v: &[u8]) -> Result<Self, DecodeError> {
        let mut out = [0u8; 16];
        match v.len() {
            16 | 4 => out[..v.len()].copy_from_slice(v),
            n => {
                return Err(DecodeError::from(format!("{what}: need 16 bytes, got {n}")));
            }
        }
        Ok(InetAddr(out))
    }
}

/// An attribute of a service (`IPVS_SVC_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceAttr {
    /// `AF`: the address family (`AF_INET` or `AF_INET6`).
    AddressFamily(u16),
    /// `PROTOCOL`: the IP protocol number of a tuple service.
    Protocol(u16),
    /// `ADDR`: the virtual address of a tuple service.
    Addr(InetAddr),
    /// `PORT`: the virtual port (big-endian on the wire).
    Port(u16),
    /// `FWMARK`: the mark of a firewall-mark service.
    Fwmark(u32),
    /// `SCHED_NAME`: the scheduler module's name (`ip_vs_<name>`).
    SchedName(String),
    /// `FLAGS`: `struct ip_vs_flags` — the flags and the mask of flags to change.
    Flags {
        /// `IP_VS_SVC_F_*` bits.
        flags: u32,
        /// Which bits the kernel changes.
        mask: u32,
    },
    /// `TIMEOUT`: the persistence timeout in seconds.
    Timeout(u32),
    /// `NETMASK`: IPv4 mask in network order, or IPv6 prefix length in host order.
    Netmask([u8; 4]),
    /// `STATS`: 32-bit statistics.
    Stats(Nest<StatsAttr>),
    /// `PE_NAME`: the persistence engine's name.
    PeName(String),
    /// `STATS64`: 64-bit statistics.
    Stats64(Nest<StatsAttr>),
    /// An attribute this library does not know, kept as it came.
    Other(DefaultNla),
}

impl Nla for ServiceAttr {
    fn value_len(&self) -> usize {
        match self {
            ServiceAttr::AddressFamily(_) | ServiceAttr::Protocol(_) | ServiceAttr::Port(_) => 2,
            ServiceAttr::Addr(_) => 16,
            ServiceAttr::Fwmark(_) | ServiceAttr::Timeout(_) | ServiceAttr::Netmask(_) => 4,
            ServiceAttr::SchedName(s) | ServiceAttr::PeName(s) => s.len() + 1,
            ServiceAttr::Flags { .. } => 8,
            ServiceAttr::Stats(v) | ServiceAttr::Stats64(v) => nested_len(&v.nlas),
            ServiceAttr::Other(a) => a.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            ServiceAttr::AddressFamily(_) => IPVS_SVC_ATTR_AF,
            ServiceAttr::Protocol(_) => IPVS_SVC_ATTR_PROTOCOL,
            ServiceAttr::Addr(_) => IPVS_SVC_ATTR_ADDR,
            ServiceAttr::Port(_) => IPVS_SVC_ATTR_PORT,
            ServiceAttr::Fwmark(_) => IPVS_SVC_ATTR_FWMARK,
            ServiceAttr::SchedName(_) => IPVS_SVC_ATTR_SCHED_NAME,
            ServiceAttr::Flags { .. } => IPVS_SVC_ATTR_FLAGS,
            ServiceAttr::Timeout(_) => IPVS_SVC_ATTR_TIMEOUT,
            ServiceAttr::Netmask(_) => IPVS_SVC_ATTR_NETMASK,
            ServiceAttr::Stats(_) => IPVS_SVC_ATTR_STATS,
            ServiceAttr::PeName(_) => IPVS_SVC_ATTR_PE_NAME,
            ServiceAttr::Stats64(_) => IPVS_SVC_ATTR_STATS64,
            ServiceAttr::Other(a) => a.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            ServiceAttr::AddressFamily(v) | ServiceAttr::Protocol(v) => {
                buffer.copy_from_slice(&v.to_ne_bytes())
            }
            ServiceAttr::Port(v) => buffer.copy_from_slice(&v.to_be_bytes()),
            ServiceAttr::Addr(a) => buffer.copy_from_slice(&a.0),
            ServiceAttr::Fwmark(v) | ServiceAttr::Timeout(v) => {
                buffer.copy_from_slice(&v.to_ne_bytes())
            }
            ServiceAttr::Netmask(v) => buffer.copy_from_slice(v),
            ServiceAttr::SchedName(s) | ServiceAttr::PeName(s) => emit_string(s, buffer),
            ServiceAttr::Flags { flags, mask } => {
                buffer[..4].copy_from_slice(&flags.to_ne_bytes());
                buffer[4..].copy_from_slice(&mask.to_ne_bytes());
            }
            ServiceAttr::Stats(v) | ServiceAttr::Stats64(v) => emit_nested(&v.nlas, buffer),
            ServiceAttr::Other(a) => a.emit_value(buffer),
        }
    }

    fn is_nested(&self) -> bool {
        match self {
            ServiceAttr::Stats(v) | ServiceAttr::Stats64(v) => v.nested_flag,
            ServiceAttr::Other(a) => a.is_nested(),
            _ => false,
        }
    }
}

impl<'a> Parseable<NlaBuffer<&'a [u8]>> for ServiceAttr {
    fn parse(buf: &NlaBuffer<&'a [u8]>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_SVC_ATTR_AF => ServiceAttr::AddressFamily(get_u16("service family", v)?),
            IPVS_SVC_ATTR_PROTOCOL => ServiceAttr::Protocol(get_u16("service protocol", v)?),
            IPVS_SVC_ATTR_ADDR => ServiceAttr::Addr(InetAddr::parse("service address", v)?),
            IPVS_SVC_ATTR_PORT => ServiceAttr::Port(get_be16("service port", v)?),
            IPVS_SVC_ATTR_FWMARK => ServiceAttr::Fwmark(get_u32("service fwmark", v)?),
            IPVS_SVC_ATTR_SCHED_NAME => ServiceAttr::SchedName(get_string("scheduler name", v)?),
            IPVS_SVC_ATTR_FLAGS => {
                let b = super::fixed::<8>("service flags", v)?;
                ServiceAttr::Flags {
                    flags: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
                    mask: u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
                }
            }
            IPVS_SVC_ATTR_TIMEOUT => ServiceAttr::Timeout(get_u32("service timeout", v)?),
            IPVS_SVC_ATTR_NETMASK => ServiceAttr::Netmask(super::fixed("service netmask", v)?),
            IPVS_SVC_ATTR_STATS => ServiceAttr::Stats(parse_nested(buf)?),
            IPVS_SVC_ATTR_PE_NAME => ServiceAttr::PeName(get_string("pe name", v)?),
            IPVS_SVC_ATTR_STATS64 => ServiceAttr::Stats64(parse_nested(buf)?),
            _ => ServiceAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// The attributes identifying a service.
pub(crate) fn key_nlas(key: &ServiceKey) -> Result<Vec<ServiceAttr>, EncodeError> {
    let mut out = Vec::with_capacity(4);
    push_key(&mut out, key)?;
    Ok(out)
}

fn push_key(out: &mut Vec<ServiceAttr>, key: &ServiceKey) -> Result<(), EncodeError> {
    out.push(ServiceAttr::AddressFamily(key.family().number()));
    match key {
        ServiceKey::Tuple {
            addr,
            port,
            protocol,
        } => {
            out.push(ServiceAttr::Protocol(protocol.number()));
            out.push(ServiceAttr::Addr(InetAddr::from_ip(*addr)));
            out.push(ServiceAttr::Port(*port));
        }
        ServiceKey::Fwmark { mark: 0, .. } => {
            return Err(EncodeError::invalid(
                "fwmark",
                "0 does not identify a service",
            ));
        }
        ServiceKey::Fwmark { mark, .. } => out.push(ServiceAttr::Fwmark(*mark)),
    }
    Ok(())
}

/// The netmask attribute value: IPv4 as the mask in network order, IPv6 as a host-order
/// prefix length.
fn netmask_value(service: &Service) -> Result<[u8; 4], EncodeError> {
    match (service.key.family(), service.netmask) {
        (AddressFamily::Inet, Netmask::V4(mask)) => Ok(mask.octets()),
        (AddressFamily::Inet6, Netmask::V6Prefix(len)) => {
            RangeError::check("IPv6 netmask prefix length", len, 1..=128)?;
            Ok(u32::from(len).to_ne_bytes())
        }
        (family, netmask) => Err(EncodeError::invalid(
            "netmask",
            format!("{netmask} is not of the service's family {family:?}"),
        )),
    }
}

/// The attributes of a service's full configuration (NEW/SET_SERVICE), validated.
pub(crate) fn service_nlas(service: &Service) -> Result<Vec<ServiceAttr>, EncodeError> {
    service
        .scheduler
        .validate()
        .map_err(|e| EncodeError::invalid("scheduler name", e.to_string()))?;
    if let Some(pe) = &service.pe_name
        && (pe.is_empty() || pe.len() > PE_NAME_MAX || pe.contains('\0'))
    {
        return Err(EncodeError::invalid(
            "persistence engine name",
            format!("{pe:?} must be 1..={PE_NAME_MAX} bytes without NUL"),
        ));
    }
    RangeError::check(
        "persistence timeout",
        service.timeout,
        0..=u64::from(MAX_PERSISTENCE_TIMEOUT),
    )?;
    let netmask = netmask_value(service)?;
    let mut out = Vec::with_capacity(9);
    push_key(&mut out, &service.key)?;
    out.push(ServiceAttr::SchedName(service.scheduler.name().to_owned()));
    if let Some(pe) = &service.pe_name {
        out.push(ServiceAttr::PeName(pe.clone()));
    }
    out.push(ServiceAttr::Flags {
        flags: service.flags.bits() & ServiceFlags::SETTABLE.bits(),
        mask: u32::MAX,
    });
    out.push(ServiceAttr::Timeout(service.timeout));
    out.push(ServiceAttr::Netmask(netmask));
    Ok(out)
}

/// A service as the kernel describes it (the content of `IPVS_CMD_ATTR_SERVICE` in a
/// reply). 64-bit statistics are preferred to 32-bit ones; unknown attributes are ignored.
pub fn service_entry(nlas: &[ServiceAttr]) -> Result<ServiceEntry, WireError> {
    let mut fields = ServiceFields::default();
    for a in nlas {
        fields.take(a);
    }
    fields.finish()
}

/// [`service_entry`] of the raw `IPVS_CMD_ATTR_SERVICE` value, attribute by attribute,
/// without building the attribute list (the table read's hot path).
pub(crate) fn service_of_record(record: &[u8]) -> Result<ServiceEntry, WireError> {
    let mut fields = ServiceFields::default();
    for attr in attributes(record) {
        let attr = attr?;
        match attr.kind {
            IPVS_SVC_ATTR_STATS => fields.stats32 = Some(stats_of_nest(attr.value)?),
            IPVS_SVC_ATTR_STATS64 => fields.stats64 = Some(stats_of_nest(attr.value)?),
            _ => fields.take(&ServiceAttr::parse(&attr.buffer())?),
        }
    }
    fields.finish()
}

/// The fields of a service, gathered one attribute at a time.
#[derive(Debug, Default)]
struct ServiceFields {
    af: Option<u16>,
    protocol: Option<u16>,
    addr: Option<InetAddr>,
    port: Option<u16>,
    fwmark: Option<u32>,
    scheduler: Option<Scheduler>,
    flags: u32,
    timeout: u32,
    netmask: Option<[u8; 4]>,
    pe_name: Option<String>,
    stats32: Option<Stats>,
    stats64: Option<Stats>,
}

impl ServiceFields {
    fn take(&mut self, a: &ServiceAttr) {
        match a {
            ServiceAttr::AddressFamily(v) => self.af = Some(*v),
            ServiceAttr::Protocol(v) => self.protocol = Some(*v),
            ServiceAttr::Addr(v) => self.addr = Some(*v),
            ServiceAttr::Port(v) => self.port = Some(*v),
            ServiceAttr::Fwmark(v) => self.fwmark = Some(*v),
            ServiceAttr::SchedName(v) => self.scheduler = Some(Scheduler::from_name(v)),
            ServiceAttr::Flags { flags: f, .. } => self.flags = *f,
            ServiceAttr::Timeout(v) => self.timeout = *v,
            ServiceAttr::Netmask(v) => self.netmask = Some(*v),
            ServiceAttr::PeName(v) => self.pe_name = Some(v.clone()),
            ServiceAttr::Stats(v) => self.stats32 = Some(stats(&v.nlas)),
            ServiceAttr::Stats64(v) => self.stats64 = Some(stats(&v.nlas)),
            ServiceAttr::Other(_) => {}
        }
    }

    fn finish(self) -> Result<ServiceEntry, WireError> {
        let af = self
            .af
            .ok_or_else(|| WireError::new("service without address family"))?;
        let family = AddressFamily::from_number(af)
            .ok_or_else(|| WireError::new(format!("service with unknown address family {af}")))?;
        let key = match self.fwmark {
            Some(mark) if mark != 0 => ServiceKey::Fwmark { mark, family },
            _ => {
                let number = self
                    .protocol
                    .ok_or_else(|| WireError::new("service without protocol"))?;
                let protocol = Protocol::from_number(number)
                    .ok_or_else(|| WireError::new(format!("service with protocol {number}")))?;
                let addr = self
                    .addr
                    .ok_or_else(|| WireError::new("service without address"))?
                    .to_ip(family);
                let port = self
                    .port
                    .ok_or_else(|| WireError::new("service without port"))?;
                ServiceKey::Tuple {
                    addr,
                    port,
                    protocol,
                }
            }
        };
        let netmask = match self.netmask {
            None => Netmask::host(family),
            Some(v) => match family {
                AddressFamily::Inet => Netmask::V4(Ipv4Addr::from(v)),
                // The kernel only holds 1..=128 here.
                AddressFamily::Inet6 => {
                    Netmask::V6Prefix(u8::try_from(u32::from_ne_bytes(v)).unwrap_or(u8::MAX))
                }
            },
        };
        Ok(ServiceEntry {
            service: Service {
                key,
                scheduler: self
                    .scheduler
                    .unwrap_or_else(|| Scheduler::Other(String::new())),
                flags: ServiceFlags::from_bits(self.flags),
                timeout: self.timeout,
                netmask,
                pe_name: self.pe_name,
            },
            stats: self.stats64.or(self.stats32).unwrap_or_default(),
        })
    }
}
