//! Netlink requests the crate encodes by hand on netlink-packet-core's traits (nf_tables
//! element batches and reads, ctnetlink, the lean rtnetlink reads): a message type with its
//! encoded body, and the attribute layout they share.

use netlink_packet_core::NetlinkSerializable;

/// One netlink message, encoded when built: its type, then its body (the family header and
/// the attributes), sent as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EncodedMessage {
    pub(crate) message_type: u16,
    pub(crate) body: Vec<u8>,
}

impl NetlinkSerializable for EncodedMessage {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        self.body.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[..self.body.len()].copy_from_slice(&self.body);
    }
}

/// Appends one attribute (length, type, value, padding to 4 bytes).
pub(crate) fn push_attribute(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let length = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&length.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
}
