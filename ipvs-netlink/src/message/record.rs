//! Dump records read straight from the reply bytes, for the table read: the service or
//! destination nest of a reply, decoded into the domain type without building the
//! message's attribute tree, and a service record split into its key and its
//! configuration (statistics left out) for comparing dumps without decoding them.

use super::consts::*;
use super::dest::destination_of_record;
use super::service::service_of_record;
use super::{RawAttr, WireError, attributes};
use crate::DestinationEntry;
use crate::service::{AddressFamily, ServiceEntry};

/// The value of the first top-level attribute `kind` of a generic-netlink payload (genl
/// header, then attributes).
fn nest<'a>(genl_payload: &'a [u8], kind: u16, what: &str) -> Result<&'a [u8], WireError> {
    let attrs = genl_payload
        .get(4..)
        .ok_or_else(|| WireError::new("message shorter than the genl header"))?;
    for attr in attributes(attrs) {
        let attr = attr?;
        if attr.kind == kind {
            return Ok(attr.value);
        }
    }
    Err(WireError::new(format!("reply without a {what} attribute")))
}

/// The service nest (`IPVS_CMD_ATTR_SERVICE`) of a reply.
pub(crate) fn service_record(genl_payload: &[u8]) -> Result<&[u8], WireError> {
    nest(genl_payload, IPVS_CMD_ATTR_SERVICE, "service")
}

/// The destination nest (`IPVS_CMD_ATTR_DEST`) of a reply.
pub(crate) fn destination_record(genl_payload: &[u8]) -> Result<&[u8], WireError> {
    nest(genl_payload, IPVS_CMD_ATTR_DEST, "destination")
}

/// The service of a service nest, as
/// [`IpvsMessage::service_entry`](super::IpvsMessage::service_entry) decodes it, without
/// building the attribute list.
pub(crate) fn decode_service(record: &[u8]) -> Result<ServiceEntry, WireError> {
    service_of_record(record)
}

/// The destination of a destination nest, as
/// [`IpvsMessage::destination_entry`](super::IpvsMessage::destination_entry) decodes it,
/// without building the attribute list.
pub(crate) fn decode_destination(
    record: &[u8],
    service_family: AddressFamily,
) -> Result<DestinationEntry, WireError> {
    destination_of_record(record, service_family)
}

/// Splits a service nest into the bytes of its key attributes (family, protocol, address,
/// port, fwmark) and of the rest of its configuration, statistics left out, each attribute
/// as kind and value in wire order. Two records with equal parts decode to equal
/// [`Service`](crate::Service)s.
pub(crate) fn split_service(
    record: &[u8],
    key: &mut Vec<u8>,
    config: &mut Vec<u8>,
) -> Result<(), WireError> {
    key.clear();
    config.clear();
    for attr in attributes(record) {
        let RawAttr { kind, value, .. } = attr?;
        let out = match kind {
            IPVS_SVC_ATTR_STATS | IPVS_SVC_ATTR_STATS64 => continue,
            IPVS_SVC_ATTR_AF
            | IPVS_SVC_ATTR_PROTOCOL
            | IPVS_SVC_ATTR_ADDR
            | IPVS_SVC_ATTR_PORT
            | IPVS_SVC_ATTR_FWMARK => &mut *key,
            _ => &mut *config,
        };
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&u16::try_from(value.len()).unwrap_or(u16::MAX).to_ne_bytes());
        out.extend_from_slice(value);
    }
    Ok(())
}
