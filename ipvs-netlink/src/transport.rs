//! Raw netlink framing and a blocking socket, used for family resolution, the batch path
//! and the parallel table dump (where netlink-proto's one-future-per-request path is too
//! slow).

use std::io;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};

use netlink_packet_core::{DecodeError, Emitable, ParseableParametrized};
use netlink_packet_generic::{GenlFamily, GenlHeader};

use crate::message::{self, IpvsMessage, WireError};

/// Version of the IPVS generic-netlink family.
const IPVS_GENL_VERSION: u8 = 1;

/// `struct nlmsghdr` size.
pub(crate) const NLMSG_HDRLEN: usize = 16;
/// `NLMSG_ERROR`.
pub(crate) const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
pub(crate) const NLMSG_DONE: u16 = 3;
/// `NLMSG_OVERRUN`.
pub(crate) const NLMSG_OVERRUN: u16 = 4;
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// Receive buffer asked for (the kernel doubles it); sized so that the acks of a whole
/// batch chunk and large dump replies never overflow.
const RCVBUF: usize = 16 * 1024 * 1024;

/// Appends one generic-netlink request to `buf`.
pub(crate) fn encode_request(
    buf: &mut Vec<u8>,
    family: u16,
    flags: u16,
    seq: u32,
    cmd: u8,
    version: u8,
    attrs: &[u8],
) {
    let len = NLMSG_HDRLEN + 4 + attrs.len();
    let len32 = u32::try_from(len).unwrap_or(u32::MAX);
    buf.extend_from_slice(&len32.to_ne_bytes());
    buf.extend_from_slice(&family.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[cmd, version, 0, 0]);
    buf.extend_from_slice(attrs);
    // Attributes are 4-aligned already; keep the message aligned regardless.
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// Appends an IPVS request, emitting the attributes in place.
pub(crate) fn encode_ipvs(buf: &mut Vec<u8>, family: u16, flags: u16, seq: u32, msg: &IpvsMessage) {
    let start = buf.len();
    encode_request(
        buf,
        family,
        flags,
        seq,
        msg.cmd.number(),
        IPVS_GENL_VERSION,
        &[],
    );
    let attrs = msg.buffer_len();
    let at = buf.len();
    buf.resize(at + attrs, 0);
    msg.emit(&mut buf[at..]);
    let len = u32::try_from(buf.len() - start).unwrap_or(u32::MAX);
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// An IPVS generic-netlink payload kept as bytes, for the netlink-proto connection: parsing
/// it never fails there, so a reply this library cannot decode is reported as a decoding
/// error of the request instead of being dropped by the codec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawIpvs {
    /// `IPVS_CMD_*`.
    pub(crate) cmd: u8,
    /// The attributes.
    pub(crate) attrs: Vec<u8>,
}

impl RawIpvs {
    /// The bytes of a typed message.
    pub(crate) fn from_message(msg: &IpvsMessage) -> Self {
        RawIpvs {
            cmd: msg.cmd.number(),
            attrs: msg.to_bytes(),
        }
    }

    /// The typed message.
    pub(crate) fn parse(&self) -> Result<IpvsMessage, WireError> {
        IpvsMessage::parse(self.cmd, &self.attrs)
    }
}

impl GenlFamily for RawIpvs {
    fn family_name() -> &'static str {
        message::FAMILY_NAME
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        IPVS_GENL_VERSION
    }
}

impl Emitable for RawIpvs {
    fn buffer_len(&self) -> usize {
        self.attrs.len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        let n = self.attrs.len().min(buffer.len());
        buffer[..n].copy_from_slice(&self.attrs[..n]);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for RawIpvs {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(RawIpvs {
            cmd: header.cmd,
            attrs: buf.to_vec(),
        })
    }
}

/// One received netlink message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawMessage<'a> {
    pub(crate) kind: u16,
    pub(crate) seq: u32,
    pub(crate) payload: &'a [u8],
}

impl RawMessage<'_> {
    /// For `NLMSG_ERROR`: the (negative or zero) error code and the sequence number of the
    /// request it answers.
    pub(crate) fn error_code(&self) -> Option<(i32, u32)> {
        if self.kind != NLMSG_ERROR || self.payload.len() < 4 {
            return None;
        }
        let code = i32::from_ne_bytes([
            self.payload[0],
            self.payload[1],
            self.payload[2],
            self.payload[3],
        ]);
        // The echoed request header follows: its seq is at offset 8 of it.
        let seq = self
            .payload
            .get(4 + 8..4 + 12)
            .and_then(|s| <[u8; 4]>::try_from(s).ok())
            .map(u32::from_ne_bytes)
            .unwrap_or(self.seq);
        Some((code, seq))
    }

    /// For a generic-netlink message: the IPVS payload, parsed.
    pub(crate) fn ipvs(&self) -> Option<Result<IpvsMessage, WireError>> {
        if self.payload.len() < 4 {
            return None;
        }
        Some(IpvsMessage::parse(self.payload[0], &self.payload[4..]))
    }
}

/// Splits a datagram into netlink messages; stops at the first malformed header.
pub(crate) fn parse_messages(mut buf: &[u8]) -> impl Iterator<Item = RawMessage<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            buf = &[];
            return None;
        }
        let msg = RawMessage {
            kind: u16::from_ne_bytes([buf[4], buf[5]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
            payload: &buf[NLMSG_HDRLEN..len],
        };
        let advance = ((len + 3) & !3).min(buf.len());
        buf = &buf[advance..];
        Some(msg)
    })
}

/// A blocking generic-netlink socket, opened in the caller thread's network namespace.
pub(crate) struct SyncSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl SyncSocket {
    /// Opens, binds and tunes a socket (`NETLINK_CAP_ACK`, large receive buffer, timeout).
    pub(crate) fn open() -> io::Result<SyncSocket> {
        let mut socket = Socket::new(NETLINK_GENERIC)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // Small error acks (no echo of the request payload); best effort.
        let _ = socket.set_cap_ack(true);
        tune_rcvbuf(&socket);
        nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(30, 0),
        )
        .map_err(io::Error::from)?;
        Ok(SyncSocket {
            socket,
            seq: 1,
            buf: Vec::with_capacity(1 << 20),
        })
    }

    /// The next sequence number (never 0).
    pub(crate) fn next_seq(&mut self) -> u32 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(1).max(1);
        s
    }

    /// Sends one datagram.
    pub(crate) fn send(&self, data: &[u8]) -> io::Result<()> {
        let n = self.socket.send(data, 0)?;
        if n != data.len() {
            return Err(io::Error::other(format!(
                "short netlink send: {n} of {} bytes",
                data.len()
            )));
        }
        Ok(())
    }

    /// Receives one datagram into the internal buffer and returns it.
    pub(crate) fn recv(&mut self) -> io::Result<&[u8]> {
        self.buf.clear();
        if self.buf.capacity() < (1 << 20) {
            self.buf.reserve(1 << 20);
        }
        let n = self.socket.recv(&mut self.buf, 0)?;
        Ok(&self.buf[..n.min(self.buf.len())])
    }

    /// Resolves a generic-netlink family id by name. `Ok(None)` when the family does not
    /// exist.
    pub(crate) fn resolve_family(&mut self, name: &str) -> io::Result<Option<u16>> {
        let mut attrs = Vec::new();
        let value_len = name.len() + 1;
        attrs.extend_from_slice(
            &u16::try_from(4 + value_len)
                .unwrap_or(u16::MAX)
                .to_ne_bytes(),
        );
        attrs.extend_from_slice(&CTRL_ATTR_FAMILY_NAME.to_ne_bytes());
        attrs.extend_from_slice(name.as_bytes());
        attrs.push(0);
        while !attrs.len().is_multiple_of(4) {
            attrs.push(0);
        }
        let seq = self.next_seq();
        let mut req = Vec::new();
        encode_request(
            &mut req,
            GENL_ID_CTRL,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            CTRL_CMD_GETFAMILY,
            1,
            &attrs,
        );
        self.send(&req)?;
        let mut family = None;
        loop {
            let data = self.recv()?;
            for m in parse_messages(data) {
                if m.seq != seq {
                    continue;
                }
                if let Some((code, _)) = m.error_code() {
                    if code == 0 {
                        return Ok(family);
                    }
                    if -code == libc::ENOENT {
                        return Ok(None);
                    }
                    return Err(io::Error::from_raw_os_error(-code));
                }
                if m.kind == GENL_ID_CTRL && m.payload.len() >= 4 {
                    for a in message::nla_buffers(&m.payload[4..]).flatten() {
                        let v = a.value();
                        if a.kind() == CTRL_ATTR_FAMILY_ID && v.len() >= 2 {
                            family = Some(u16::from_ne_bytes([v[0], v[1]]));
                        }
                    }
                }
            }
        }
    }

    /// Runs a dump request, calling `f` for every reply message. Returns the kernel's errno
    /// (positive) if the dump failed.
    pub(crate) fn dump(
        &mut self,
        family: u16,
        msg: &IpvsMessage,
        f: impl FnMut(Result<IpvsMessage, WireError>),
    ) -> io::Result<Result<(), i32>> {
        self.exchange(family, msg, NLM_F_REQUEST | NLM_F_DUMP, f)
    }

    /// Runs a request answered by messages and an ack (`GET` of one object), calling `f`
    /// for every reply message. Returns the kernel's errno (positive) if it failed.
    pub(crate) fn query(
        &mut self,
        family: u16,
        msg: &IpvsMessage,
        f: impl FnMut(Result<IpvsMessage, WireError>),
    ) -> io::Result<Result<(), i32>> {
        self.exchange(family, msg, NLM_F_REQUEST | NLM_F_ACK, f)
    }

    fn exchange(
        &mut self,
        family: u16,
        msg: &IpvsMessage,
        flags: u16,
        mut f: impl FnMut(Result<IpvsMessage, WireError>),
    ) -> io::Result<Result<(), i32>> {
        let seq = self.next_seq();
        let mut req = Vec::with_capacity(64 + msg.buffer_len());
        encode_ipvs(&mut req, family, flags, seq, msg);
        self.send(&req)?;
        loop {
            let data = self.recv()?;
            for m in parse_messages(data) {
                if m.seq != seq {
                    continue;
                }
                match m.kind {
                    NLMSG_DONE => return Ok(Ok(())),
                    NLMSG_ERROR => {
                        let code = m.error_code().map(|c| c.0).unwrap_or(-libc::EIO);
                        return Ok(if code == 0 { Ok(()) } else { Err(-code) });
                    }
                    NLMSG_OVERRUN => return Err(io::Error::from_raw_os_error(libc::ENOBUFS)),
                    _ => {
                        if let Some(ipvs) = m.ipvs() {
                            f(ipvs);
                        }
                    }
                }
            }
        }
    }
}

/// Raises the receive buffer: `SO_RCVBUFFORCE` when privileged, else `SO_RCVBUF`.
pub(crate) fn tune_rcvbuf(socket: &Socket) {
    let forced =
        nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::RcvBufForce, &RCVBUF);
    if forced.is_err() {
        let _ = socket.set_rx_buf_sz(RCVBUF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_layout() {
        let mut buf = Vec::new();
        encode_request(&mut buf, 0x1c, NLM_F_REQUEST | NLM_F_ACK, 7, 17, 1, &[]);
        // nlmsghdr: len 20, type 0x1c, flags 5, seq 7, pid 0; genlmsghdr: cmd 17, version 1.
        let expected: [u8; 20] = [
            20, 0, 0, 0, 0x1c, 0, 5, 0, 7, 0, 0, 0, 0, 0, 0, 0, 17, 1, 0, 0,
        ];
        assert_eq!(buf, expected);
    }

    #[test]
    fn parse_messages_stops_on_garbage() {
        let garbage = [0xffu8; 40];
        assert_eq!(parse_messages(&garbage).count(), 0);
        let ack: [u8; 36] = [
            36, 0, 0, 0, 2, 0, 0, 1, 9, 0, 0, 0, 0, 0, 0, 0, // nlmsghdr (ERROR, CAPPED)
            0xfd, 0xff, 0xff, 0xff, // error -3 (ESRCH)
            20, 0, 0, 0, 0x1c, 0, 5, 0, 42, 0, 0, 0, 0, 0, 0, 0, // echoed request header
        ];
        let msgs: Vec<_> = parse_messages(&ack).collect();
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].error_code(), Some((-3, 42)));
    }
}
