//! Service attributes (`IPVS_CMD_ATTR_SERVICE`).

use std::net::Ipv4Addr;

use super::attr::{AttrIter, AttrWriter, get_addr, get_be16, get_string, get_u16, get_u32};
use super::consts::*;
use super::stats::decode_stats;
use super::{EncodeError, IpvsMessage, WireError};
use crate::error::RangeError;
use crate::service::{
    AddressFamily, MAX_PERSISTENCE_TIMEOUT, Netmask, Service, ServiceEntry, ServiceFlags,
    ServiceKey,
};
use crate::{Protocol, Scheduler, Stats};

fn key_attrs(w: &mut AttrWriter, key: &ServiceKey) {
    w.u16(IPVS_SVC_ATTR_AF, key.family().number());
    match key {
        ServiceKey::Tuple {
            addr,
            port,
            protocol,
        } => {
            w.u16(IPVS_SVC_ATTR_PROTOCOL, protocol.number());
            w.inet_addr(IPVS_SVC_ATTR_ADDR, *addr);
            w.be16(IPVS_SVC_ATTR_PORT, *port);
        }
        ServiceKey::Fwmark { mark, .. } => {
            w.u32(IPVS_SVC_ATTR_FWMARK, *mark);
        }
    }
}

/// Appends `IPVS_CMD_ATTR_SERVICE` holding only what identifies the service.
pub fn encode_service_key(msg: &mut IpvsMessage, key: &ServiceKey) -> Result<(), EncodeError> {
    if let ServiceKey::Fwmark { mark: 0, .. } = key {
        return Err(EncodeError::invalid("fwmark 0 does not identify a service"));
    }
    let mut w = AttrWriter::new();
    w.nested(IPVS_CMD_ATTR_SERVICE, |w| key_attrs(w, key));
    msg.attrs.extend_from_slice(&w.buf);
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
        (family, netmask) => Err(EncodeError::Invalid(format!(
            "netmask {netmask} is not of the service's family {family:?}"
        ))),
    }
}

/// Appends `IPVS_CMD_ATTR_SERVICE` with the full configuration (for NEW/SET_SERVICE).
pub fn encode_service_full(msg: &mut IpvsMessage, service: &Service) -> Result<(), EncodeError> {
    if let ServiceKey::Fwmark { mark: 0, .. } = service.key {
        return Err(EncodeError::invalid("fwmark 0 does not identify a service"));
    }
    service
        .scheduler
        .validate()
        .map_err(|e| EncodeError::invalid(e.to_string()))?;
    if let Some(pe) = &service.pe_name
        && (pe.is_empty() || pe.len() > PE_NAME_MAX || pe.contains('\0'))
    {
        return Err(EncodeError::invalid(format!(
            "persistence engine name {pe:?} must be 1..={PE_NAME_MAX} bytes without NUL"
        )));
    }
    RangeError::check(
        "persistence timeout",
        service.timeout,
        0..=u64::from(MAX_PERSISTENCE_TIMEOUT),
    )?;
    let netmask = netmask_value(service)?;
    let mut flags = [0u8; 8];
    let settable = service.flags.bits() & ServiceFlags::SETTABLE.bits();
    flags[..4].copy_from_slice(&settable.to_ne_bytes());
    flags[4..].copy_from_slice(&u32::MAX.to_ne_bytes());
    let mut w = AttrWriter::new();
    w.nested(IPVS_CMD_ATTR_SERVICE, |w| {
        key_attrs(w, &service.key);
        w.string(IPVS_SVC_ATTR_SCHED_NAME, service.scheduler.name());
        if let Some(pe) = &service.pe_name {
            w.string(IPVS_SVC_ATTR_PE_NAME, pe);
        }
        w.bytes(IPVS_SVC_ATTR_FLAGS, &flags);
        w.u32(IPVS_SVC_ATTR_TIMEOUT, service.timeout);
        w.bytes(IPVS_SVC_ATTR_NETMASK, &netmask);
    });
    msg.attrs.extend_from_slice(&w.buf);
    Ok(())
}

/// Decodes the content of an `IPVS_CMD_ATTR_SERVICE` attribute.
pub fn decode_service(buf: &[u8]) -> Result<ServiceEntry, WireError> {
    let mut af = None;
    let mut protocol = None;
    let mut addr = None;
    let mut port = None;
    let mut fwmark = None;
    let mut sched = None;
    let mut flags = 0u32;
    let mut timeout = 0u32;
    let mut netmask = None;
    let mut pe_name = None;
    let mut stats32 = None;
    let mut stats64 = None;
    for a in AttrIter::new(buf) {
        let (kind, v) = a?;
        match kind {
            IPVS_SVC_ATTR_AF => af = Some(get_u16("service family", v)?),
            IPVS_SVC_ATTR_PROTOCOL => protocol = Some(get_u16("service protocol", v)?),
            IPVS_SVC_ATTR_ADDR => addr = Some(v),
            IPVS_SVC_ATTR_PORT => port = Some(get_be16("service port", v)?),
            IPVS_SVC_ATTR_FWMARK => fwmark = Some(get_u32("service fwmark", v)?),
            IPVS_SVC_ATTR_SCHED_NAME => sched = Some(get_string("scheduler name", v)?),
            IPVS_SVC_ATTR_FLAGS => flags = get_u32("service flags", v)?,
            IPVS_SVC_ATTR_TIMEOUT => timeout = get_u32("service timeout", v)?,
            IPVS_SVC_ATTR_NETMASK => netmask = Some(v),
            IPVS_SVC_ATTR_PE_NAME => pe_name = Some(get_string("pe name", v)?),
            IPVS_SVC_ATTR_STATS => stats32 = Some(v),
            IPVS_SVC_ATTR_STATS64 => stats64 = Some(v),
            _ => {}
        }
    }
    let af = af.ok_or_else(|| WireError::new("service without address family"))?;
    let family = AddressFamily::from_number(af)
        .ok_or_else(|| WireError::new(format!("service with unknown address family {af}")))?;
    let key = match fwmark {
        Some(mark) if mark != 0 => ServiceKey::Fwmark { mark, family },
        _ => {
            let number = protocol.ok_or_else(|| WireError::new("service without protocol"))?;
            let protocol = Protocol::from_number(number)
                .ok_or_else(|| WireError::new(format!("service with protocol {number}")))?;
            let addr = get_addr(
                "service address",
                af,
                addr.ok_or_else(|| WireError::new("service without address"))?,
            )?;
            let port = port.ok_or_else(|| WireError::new("service without port"))?;
            ServiceKey::Tuple {
                addr,
                port,
                protocol,
            }
        }
    };
    let netmask = match netmask {
        None => Netmask::host(family),
        Some(v) => match family {
            AddressFamily::Inet => Netmask::V4(Ipv4Addr::from(
                v.get(..4)
                    .and_then(|s| <[u8; 4]>::try_from(s).ok())
                    .ok_or_else(|| WireError::new("service netmask: need 4 bytes"))?,
            )),
            AddressFamily::Inet6 => {
                // The kernel only holds 1..=128 here.
                let len = get_u32("service netmask", v)?;
                Netmask::V6Prefix(u8::try_from(len).unwrap_or(u8::MAX))
            }
        },
    };
    let scheduler = match sched {
        Some(name) => Scheduler::from_name(&name),
        None => Scheduler::Other(String::new()),
    };
    let stats = match (stats64, stats32) {
        (Some(v), _) | (None, Some(v)) => decode_stats(v)?,
        (None, None) => Stats::default(),
    };
    Ok(ServiceEntry {
        service: Service {
            key,
            scheduler,
            flags: ServiceFlags::from_bits(flags),
            timeout,
            netmask,
            pe_name,
        },
        stats,
    })
}

/// Decodes a `NEW_SERVICE` reply (dump part or `GET_SERVICE` answer).
pub fn decode_service_message(msg: &IpvsMessage) -> Result<ServiceEntry, WireError> {
    let v = msg
        .attribute(IPVS_CMD_ATTR_SERVICE)?
        .ok_or_else(|| WireError::new("reply without a service attribute"))?;
    decode_service(v)
}
