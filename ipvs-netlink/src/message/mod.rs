//! The IPVS wire format: the generic-netlink payload type, and attribute encoding and
//! decoding for services, destinations, sync daemons, timeouts, info and statistics.
//!
//! Decoding is written for what real kernels send: dump replies carry `NEW_SERVICE` /
//! `NEW_DEST`, addresses come as 16 bytes, destinations without an address family inherit
//! the service's, unknown attributes are ignored, and malformed input yields an error,
//! never a panic.

pub mod consts;

mod attr;
mod config;
mod daemon;
mod dest;
mod service;
mod stats;

use netlink_packet_core::{DecodeError, Emitable, ParseableParametrized};
use netlink_packet_generic::{GenlFamily, GenlHeader};

pub use config::{decode_info, decode_timeouts, encode_set_timeouts};
pub use daemon::{decode_daemon_message, encode_daemon, encode_daemon_state};
pub use dest::{decode_dest_message, decode_destination, encode_dest_full, encode_dest_key};
pub use service::{
    decode_service, decode_service_message, encode_service_full, encode_service_key,
};
pub use stats::decode_stats;

use consts::*;

/// A wire-level decoding problem (malformed or missing attribute).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed IPVS message: {0}")]
pub struct WireError(String);

impl WireError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        WireError(msg.into())
    }
}

/// One IPVS generic-netlink message: a command and its raw top-level attributes.
///
/// Kept as bytes so that parsing a reply can never fail at the transport layer; the typed
/// decoders in this module interpret the attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpvsMessage {
    /// `IPVS_CMD_*`.
    pub cmd: u8,
    /// Concatenated, padded top-level attributes.
    pub attrs: Vec<u8>,
}

impl IpvsMessage {
    /// A message with no attributes.
    pub fn new(cmd: u8) -> Self {
        IpvsMessage {
            cmd,
            attrs: Vec::new(),
        }
    }

    /// Iterates over the top-level attributes as (type, value).
    pub fn attributes(&self) -> impl Iterator<Item = Result<(u16, &[u8]), WireError>> {
        attr::AttrIter::new(&self.attrs)
    }

    /// The value of the first top-level attribute of this type.
    pub fn attribute(&self, kind: u16) -> Result<Option<&[u8]>, WireError> {
        for a in self.attributes() {
            let (k, v) = a?;
            if k == kind {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// `GET_INFO`.
    pub fn get_info() -> Self {
        IpvsMessage::new(IPVS_CMD_GET_INFO)
    }

    /// `GET_CONFIG` (timeouts).
    pub fn get_config() -> Self {
        IpvsMessage::new(IPVS_CMD_GET_CONFIG)
    }

    /// `FLUSH`.
    pub fn flush() -> Self {
        IpvsMessage::new(IPVS_CMD_FLUSH)
    }

    /// `GET_SERVICE` (dump when no key is given).
    pub fn get_services() -> Self {
        IpvsMessage::new(IPVS_CMD_GET_SERVICE)
    }

    /// `GET_DAEMON` (dump).
    pub fn get_daemons() -> Self {
        IpvsMessage::new(IPVS_CMD_GET_DAEMON)
    }
}

impl GenlFamily for IpvsMessage {
    fn family_name() -> &'static str {
        IPVS_GENL_NAME
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        IPVS_GENL_VERSION
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        self.attrs.len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        let n = self.attrs.len().min(buffer.len());
        buffer[..n].copy_from_slice(&self.attrs[..n]);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(IpvsMessage {
            cmd: header.cmd,
            attrs: buf.to_vec(),
        })
    }
}

/// A client-side validation failure while encoding a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The request makes no sense to the kernel (e.g. fwmark 0, a name too long).
    #[error("{0}")]
    Invalid(String),
    /// A numeric field the kernel cannot hold.
    #[error(transparent)]
    OutOfRange(#[from] crate::error::RangeError),
}

impl EncodeError {
    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        EncodeError::Invalid(reason.into())
    }
}

#[cfg(test)]
mod kernel_captures;
#[cfg(test)]
mod tests;
