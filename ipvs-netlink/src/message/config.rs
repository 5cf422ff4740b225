//! Timeouts (`GET/SET_CONFIG`) and info (`GET_INFO`) attributes.

use netlink_packet_core::{DecodeError, DefaultNla, Nla, NlaBuffer, Parseable};

use super::consts::*;
use super::{EncodeError, IpvsAttr, IpvsCmd, IpvsMessage, WireError, get_u32};
use crate::range::RangeError;
use crate::{Info, Timeouts};

/// A top-level attribute of a `GET_INFO` reply (`IPVS_INFO_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InfoAttr {
    /// `VERSION`: `0x00MMmmpp`.
    Version(u32),
    /// `CONN_TAB_SIZE`: connection hash table buckets.
    ConnTabSize(u32),
    /// An attribute this library does not know, kept as it came.
    Other(DefaultNla),
}

impl Nla for InfoAttr {
    fn value_len(&self) -> usize {
        match self {
            InfoAttr::Version(_) | InfoAttr::ConnTabSize(_) => 4,
            InfoAttr::Other(a) => a.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            InfoAttr::Version(_) => IPVS_INFO_ATTR_VERSION,
            InfoAttr::ConnTabSize(_) => IPVS_INFO_ATTR_CONN_TAB_SIZE,
            InfoAttr::Other(a) => a.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            InfoAttr::Version(v) | InfoAttr::ConnTabSize(v) => {
                buffer.copy_from_slice(&v.to_ne_bytes())
            }
            InfoAttr::Other(a) => a.emit_value(buffer),
        }
    }
}

impl<'a> Parseable<NlaBuffer<&'a [u8]>> for InfoAttr {
    fn parse(buf: &NlaBuffer<&'a [u8]>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_INFO_ATTR_VERSION => InfoAttr::Version(get_u32("version", v)?),
            IPVS_INFO_ATTR_CONN_TAB_SIZE => InfoAttr::ConnTabSize(get_u32("conn table size", v)?),
            _ => InfoAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// A `SET_CONFIG` message; zero values are sent too (the kernel keeps the current value).
pub(crate) fn timeouts_message(t: &Timeouts) -> Result<IpvsMessage, EncodeError> {
    let max = u64::from(crate::timeouts::MAX_TIMEOUT);
    RangeError::check("TCP timeout", t.tcp, 0..=max)?;
    RangeError::check("TCP FIN timeout", t.tcp_fin, 0..=max)?;
    RangeError::check("UDP timeout", t.udp, 0..=max)?;
    Ok(IpvsMessage::with_nlas(
        IpvsCmd::SetConfig,
        vec![
            IpvsAttr::TimeoutTcp(t.tcp),
            IpvsAttr::TimeoutTcpFin(t.tcp_fin),
            IpvsAttr::TimeoutUdp(t.udp),
        ],
    ))
}

/// The facts of a `GET_INFO` reply.
pub(crate) fn info(nlas: &[IpvsAttr]) -> Result<Info, WireError> {
    let mut version = None;
    let mut size = None;
    for a in nlas {
        match a {
            IpvsAttr::Info(InfoAttr::Version(v)) => version = Some(*v),
            IpvsAttr::Info(InfoAttr::ConnTabSize(v)) => size = Some(*v),
            _ => {}
        }
    }
    Ok(Info {
        version: version.ok_or_else(|| WireError::new("info without version"))?,
        conn_table_size: size.ok_or_else(|| WireError::new("info without table size"))?,
    })
}
