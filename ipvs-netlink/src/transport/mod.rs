//! The crate's one netlink transport: framing, a blocking socket with pipelined requests
//! and dumps, generic-netlink family resolution, and the async connection behind
//! [`IpvsHandle`](crate::IpvsHandle)'s single requests.
//!
//! Requests are netlink-packet-core [`NetlinkMessage`]s of any protocol's payload
//! ([`NetlinkSerializable`]: an IPVS `GenlMessage`, a ctnetlink request, ...); replies are
//! handed out as [`Reply`]s (header and raw payload), so callers decode only what they
//! need. Nothing here knows IPVS: proxier-core's ctnetlink client uses the same
//! [`NetlinkSocket`] on a `NETLINK_NETFILTER` socket.
//!
//! - [`NetlinkSocket::pipeline`]: many requests per `sendmsg`, one acknowledgement each,
//!   matched back by sequence number (the kernel handles every message of a datagram in
//!   turn and acknowledges each, continuing after errors).
//! - [`NetlinkSocket::dump`] and [`NetlinkSocket::request`]: one request and its replies.
//! - [`resolve_family`]: a generic-netlink family id by name.
//!
//! **Requests the kernel does not answer.** The kernel acknowledges a request unless its
//! handler returns `-EINTR`, which netlink reserves for "a dump was started" (the dump's
//! own messages follow). A handler that returns `-EINTR` for any other reason gets no
//! reply at all: IPVS's `DEL_DAEMON` does when the sync thread it stops had not run yet
//! (`kthread_stop` of a thread that never started says `-EINTR`), which happens when the
//! daemon is stopped right after it was started. So every request that is not a dump is
//! sent with an acknowledged `NLMSG_NOOP` (a barrier) behind it in the same datagram: the kernel handles the messages
//! of a datagram in order, synchronously, and queues each one's replies before it handles
//! the next, so once the barrier is acknowledged, a request still without its end will
//! never get one; it ends with `EINTR`, the only errno the kernel swallows.

mod connection;
mod socket;

use netlink_packet_core::{
    ErrorBuffer, NLM_F_ACK, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN,
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable, Parseable,
};

pub(crate) use connection::{Connection, ConnectionHandle, Part};
#[cfg(test)]
use connection::{Counts, InFlight};
pub use socket::{Answer, NetlinkSocket};

/// `struct nlmsghdr` size.
const NLMSG_HDRLEN: usize = 16;

/// `GENL_ID_CTRL`: the generic-netlink controller.
const GENL_ID_CTRL: u16 = 0x10;
/// `CTRL_CMD_GETFAMILY`.
const CTRL_CMD_GETFAMILY: u8 = 3;
/// `CTRL_ATTR_FAMILY_ID`.
const CTRL_ATTR_FAMILY_ID: u16 = 1;
/// `CTRL_ATTR_FAMILY_NAME`.
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// `payload` as one netlink message with the given flags and sequence number, as the
/// transport sends it (for tests of a protocol's wire layout).
pub fn encode<P: NetlinkSerializable>(payload: P, flags: u16, sequence: u32) -> Vec<u8> {
    let mut buf = Vec::new();
    push_message(&mut buf, payload, flags, sequence);
    buf
}

/// Appends `payload` as one netlink message with the given flags and sequence number.
pub(crate) fn push_message<P: NetlinkSerializable>(
    buf: &mut Vec<u8>,
    payload: P,
    flags: u16,
    sequence: u32,
) {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = sequence;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
    message.finalize();
    let at = buf.len();
    let len = message.header.length as usize;
    // Messages are 4-aligned in a datagram.
    buf.resize(at + ((len + 3) & !3), 0);
    message.serialize(&mut buf[at..at + len]);
}

/// An `NLMSG_NOOP` asking for an acknowledgement, sent right behind a request in the same
/// datagram: its acknowledgement comes after every reply of the request, or proves that
/// the request will get none (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Barrier;

impl NetlinkSerializable for Barrier {
    fn message_type(&self) -> u16 {
        NLMSG_NOOP
    }

    fn buffer_len(&self) -> usize {
        0
    }

    fn serialize(&self, _buffer: &mut [u8]) {}
}

/// Whether a request with these flags needs a [`Barrier`] behind it: it asks for an
/// acknowledgement and is not a dump (a dump's start is the kernel's own `-EINTR`; its
/// messages come after the barrier's acknowledgement).
pub(crate) fn needs_barrier(flags: u16) -> bool {
    flags & NLM_F_ACK != 0 && flags & NLM_F_DUMP != NLM_F_DUMP
}

/// One message of a datagram the kernel sent.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    /// Its header.
    pub header: NetlinkHeader,
    /// What follows the header (for a generic-netlink message: the genl header and the
    /// attributes).
    pub payload: &'a [u8],
}

/// How a request ended, as a reply says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Not the end: a data message.
    No,
    /// `NLMSG_DONE`, or an ack (`NLMSG_ERROR` with code 0).
    Done,
    /// `NLMSG_ERROR` (or `NLMSG_DONE` of a failed dump) with this errno (positive).
    Errno(i32),
    /// `NLMSG_OVERRUN`: data was lost.
    Overrun,
}

impl Reply<'_> {
    /// Whether this message ends its request, and how.
    pub(crate) fn end(&self) -> End {
        match self.header.message_type {
            NLMSG_ERROR => match ErrorBuffer::new_checked(self.payload) {
                Ok(e) => match e.code() {
                    None => End::Done,
                    Some(code) => End::Errno(code.get().saturating_neg()),
                },
                Err(_) => End::Errno(libc::EBADMSG),
            },
            // A dump that failed part way ends with its (negative) error in the DONE.
            NLMSG_DONE => match self
                .payload
                .get(..4)
                .map(|b| i32::from_ne_bytes(<[u8; 4]>::try_from(b).unwrap_or_default()))
            {
                Some(code) if code < 0 => End::Errno(code.saturating_neg()),
                _ => End::Done,
            },
            NLMSG_OVERRUN => End::Overrun,
            _ => End::No,
        }
    }

    /// For an acknowledgement: `Some(Ok(()))` or `Some(Err(errno))`; `None` for any other
    /// message.
    pub fn ack(&self) -> Option<Result<(), i32>> {
        if self.header.message_type != NLMSG_ERROR {
            return None;
        }
        match self.end() {
            End::Errno(errno) => Some(Err(errno)),
            _ => Some(Ok(())),
        }
    }
}

/// Splits a datagram into messages; stops at the first malformed header.
pub(crate) fn replies(datagram: &[u8]) -> impl Iterator<Item = Reply<'_>> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        let buffer = NetlinkBuffer::new_checked(rest).ok()?;
        let header = NetlinkHeader::parse(&buffer).ok()?;
        let len = header.length as usize;
        if len < NLMSG_HDRLEN {
            rest = &[];
            return None;
        }
        let reply = Reply {
            header,
            payload: &rest[NLMSG_HDRLEN..len],
        };
        rest = &rest[((len + 3) & !3).min(rest.len())..];
        Some(reply)
    })
}

/// A `CTRL_CMD_GETFAMILY` request for a family name.
#[derive(Debug)]
struct GetFamily<'a>(&'a str);

impl GetFamily<'_> {
    fn attr_len(&self) -> usize {
        4 + self.0.len() + 1
    }
}

impl NetlinkSerializable for GetFamily<'_> {
    fn message_type(&self) -> u16 {
        GENL_ID_CTRL
    }

    fn buffer_len(&self) -> usize {
        4 + ((self.attr_len() + 3) & !3)
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.fill(0);
        // genlmsghdr: command, version 1.
        buffer[0] = CTRL_CMD_GETFAMILY;
        buffer[1] = 1;
        let len = u16::try_from(self.attr_len()).unwrap_or(u16::MAX);
        buffer[4..6].copy_from_slice(&len.to_ne_bytes());
        buffer[6..8].copy_from_slice(&CTRL_ATTR_FAMILY_NAME.to_ne_bytes());
        buffer[8..8 + self.0.len()].copy_from_slice(self.0.as_bytes());
    }
}

/// The id the kernel gave the generic-netlink family `name`; `Ok(None)` when no such
/// family is registered.
pub fn resolve_family(socket: &mut NetlinkSocket, name: &str) -> std::io::Result<Option<u16>> {
    let mut family = None;
    let answer = socket.request(GetFamily(name), |reply| {
        if reply.header.message_type != GENL_ID_CTRL {
            return;
        }
        let attrs = reply.payload.get(4..).unwrap_or_default();
        for nla in netlink_packet_core::NlasIterator::new(attrs).flatten() {
            let v = nla.value();
            if nla.kind() == CTRL_ATTR_FAMILY_ID && v.len() >= 2 {
                family = Some(u16::from_ne_bytes([v[0], v[1]]));
            }
        }
    })?;
    match answer {
        Ok(()) => Ok(family),
        Err(libc::ENOENT) => Ok(None),
        Err(errno) => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(test)]
mod tests;
