//! Deletes stale UDP conntrack entries, through ctnetlink (NETLINK_NETFILTER).
//!
//! Which entries are stale is decided with the plans ([`crate::flows`], re-exported here);
//! this module only applies the [`FlowFilter`]s: [`KernelConntrack`] dumps the conntrack
//! table of its network namespace and deletes the matching entries; [`MemoryConntrack`] is
//! the in-memory stand-in.
//!
//! The ctnetlink messages (`IPCTNL_MSG_CT_GET` dump, `IPCTNL_MSG_CT_DELETE` by original
//! tuple and zone, each an nfgenmsg and attributes) are encoded here on netlink-packet-core's
//! attribute buffers: the few messages involved do not justify a netfilter codec crate in
//! the tree. Framing, dumps and pipelined deletes go through ipvs-netlink's transport, the
//! workspace's one netlink socket layer.

use std::net::{IpAddr, SocketAddr};

use ipvs_netlink::transport::{Answer, NetlinkSocket};
use netlink_packet_core::{NLA_F_NESTED, NetlinkSerializable, NlaBuffer, NlasIterator};
use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::netlink_message::push_attribute;

pub use crate::flows::{
    ConntrackFlow, FlowFilter, FlowTuple, stale_udp_flows, stale_udp_flows_of_port,
};

/// Why conntrack entries could not be listed or deleted.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The netlink socket could not be opened.
    #[error("cannot open a NETLINK_NETFILTER socket: {0}")]
    Socket(std::io::Error),
    /// Sending or receiving failed.
    #[error("ctnetlink {operation}: {source}")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// The kernel answered with an error.
    #[error("ctnetlink {operation}: kernel error {}", std::io::Error::from_raw_os_error(*errno))]
    Kernel {
        /// What was being done.
        operation: &'static str,
        /// The errno (positive).
        errno: i32,
    },
    /// The kernel's answer could not be parsed.
    #[error("ctnetlink {operation}: malformed answer: {detail}")]
    Malformed {
        /// What was being done.
        operation: &'static str,
        /// What was wrong.
        detail: String,
    },
}

/// Lists and deletes conntrack entries.
pub trait ConntrackBackend {
    /// Deletes every entry that matches one of `filters`; returns how many were deleted
    /// (entries that vanished meanwhile are not counted and are not an error).
    fn delete_flows(&mut self, filters: &[FlowFilter]) -> Result<usize, ConntrackError>;
}

/// In-memory conntrack table (tests, `--dry-run`).
#[derive(Debug, Clone, Default)]
pub struct MemoryConntrack {
    /// The entries.
    pub flows: Vec<ConntrackFlow>,
    /// Every filter list passed to [`ConntrackBackend::delete_flows`], in order (none kept
    /// with `forget_calls`).
    pub calls: Vec<Vec<FlowFilter>>,
    /// Keeps no filter list in `calls` (a long-running dry run).
    pub forget_calls: bool,
}

impl ConntrackBackend for MemoryConntrack {
    fn delete_flows(&mut self, filters: &[FlowFilter]) -> Result<usize, ConntrackError> {
        if !self.forget_calls {
            self.calls.push(filters.to_vec());
        }
        let before = self.flows.len();
        self.flows
            .retain(|flow| !filters.iter().any(|f| f.matches(flow)));
        Ok(before - self.flows.len())
    }
}

/// ctnetlink on a NETLINK_NETFILTER socket, bound to the network namespace of the thread
/// that created it. Calls block (a dump walks the whole table of one family): from async
/// code, run them with `tokio::task::spawn_blocking`.
#[derive(Debug)]
pub struct KernelConntrack {
    socket: NetlinkSocket,
}

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NFNETLINK_V0: u8 = 0;
const NFGENMSG_LEN: usize = 4;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

impl KernelConntrack {
    /// Opens a ctnetlink socket in the calling thread's network namespace.
    pub fn new() -> Result<Self, ConntrackError> {
        let socket = NetlinkSocket::open(NETLINK_NETFILTER).map_err(ConntrackError::Socket)?;
        Ok(KernelConntrack { socket })
    }

    /// Every conntrack entry of one family (`V4` or `V6` by `ipv6`).
    pub fn list(&mut self, ipv6: bool) -> Result<Vec<ConntrackFlow>, ConntrackError> {
        const OP: &str = "dump";
        let request = CtRequest {
            kind: IPCTNL_MSG_CT_GET,
            family: if ipv6 { AF_INET6 } else { AF_INET },
            attributes: Vec::new(),
        };
        let mut flows = Vec::new();
        let mut malformed = None;
        let answer = self
            .socket
            .dump(request, |reply| {
                if malformed.is_some() {
                    return;
                }
                match decode_flow(reply.payload) {
                    Ok(Some(flow)) => flows.push(flow),
                    Ok(None) => {}
                    Err(detail) => malformed = Some(detail),
                }
            })
            .map_err(|source| ConntrackError::Io {
                operation: OP,
                source,
            })?;
        if let Err(errno) = answer {
            return Err(ConntrackError::Kernel {
                operation: OP,
                errno,
            });
        }
        if let Some(detail) = malformed {
            return Err(ConntrackError::Malformed {
                operation: OP,
                detail,
            });
        }
        Ok(flows)
    }

    /// Deletes one entry by its original tuple and zone. `Ok(false)`: it was already gone.
    pub fn delete(&mut self, flow: &ConntrackFlow) -> Result<bool, ConntrackError> {
        Ok(self.delete_all(std::slice::from_ref(flow))? == 1)
    }

    /// Deletes entries, pipelined (many per datagram, one acknowledgement each). Entries
    /// already gone are not counted; the first other failure is returned after every
    /// delete was tried.
    fn delete_all(&mut self, flows: &[ConntrackFlow]) -> Result<usize, ConntrackError> {
        const OP: &str = "delete";
        let mut deleted = 0;
        let mut failure = None;
        self.socket.pipeline(
            flows.iter().map(|flow| ((), delete_request(flow))),
            |(), answer| {
                let error = match answer {
                    Answer::Ack => {
                        deleted += 1;
                        return;
                    }
                    Answer::Errno(libc::ENOENT) => return,
                    Answer::Errno(errno) => ConntrackError::Kernel {
                        operation: OP,
                        errno,
                    },
                    Answer::NotSent(e) | Answer::Unanswered(e) => ConntrackError::Io {
                        operation: OP,
                        source: match e.raw_os_error() {
                            Some(errno) => std::io::Error::from_raw_os_error(errno),
                            None => std::io::Error::new(e.kind(), e.to_string()),
                        },
                    },
                };
                if failure.is_none() {
                    failure = Some(error);
                }
            },
        );
        match failure {
            Some(error) => Err(error),
            None => Ok(deleted),
        }
    }
}

impl ConntrackBackend for KernelConntrack {
    fn delete_flows(&mut self, filters: &[FlowFilter]) -> Result<usize, ConntrackError> {
        if filters.is_empty() {
            return Ok(0);
        }
        let mut doomed = Vec::new();
        let wants_v4 = filters.iter().any(|f| !filter_is_v6(f));
        let wants_v6 = filters.iter().any(filter_is_v6);
        for (wanted, ipv6) in [(wants_v4, false), (wants_v6, true)] {
            if !wanted {
                continue;
            }
            doomed.extend(
                self.list(ipv6)?
                    .into_iter()
                    .filter(|flow| filters.iter().any(|f| f.matches(flow))),
            );
        }
        let deleted = self.delete_all(&doomed)?;
        if deleted > 0 {
            tracing::info!(deleted, "deleted stale conntrack entries");
        }
        Ok(deleted)
    }
}

fn filter_is_v6(filter: &FlowFilter) -> bool {
    filter
        .original_destination
        .or(filter.reply_source)
        .is_some_and(|a| a.is_ipv6())
}

/// A ctnetlink request: the message kind (`IPCTNL_MSG_CT_*`), the nfgenmsg family and the
/// attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CtRequest {
    kind: u16,
    family: u8,
    attributes: Vec<u8>,
}

impl NetlinkSerializable for CtRequest {
    fn message_type(&self) -> u16 {
        (NFNL_SUBSYS_CTNETLINK << 8) | self.kind
    }

    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN + self.attributes.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        // nfgenmsg: family, version, resource id 0 (big-endian).
        buffer[..NFGENMSG_LEN].copy_from_slice(&[self.family, NFNETLINK_V0, 0, 0]);
        buffer[NFGENMSG_LEN..].copy_from_slice(&self.attributes);
    }
}

fn push_nested(out: &mut Vec<u8>, kind: u16, build: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    build(&mut inner);
    push_attribute(out, kind | NLA_F_NESTED, &inner);
}

fn encode_tuple(out: &mut Vec<u8>, protocol: u8, tuple: &FlowTuple) {
    push_nested(out, CTA_TUPLE_IP, |ip| {
        match (tuple.source.ip(), tuple.destination.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                push_attribute(ip, CTA_IP_V4_SRC, &s.octets());
                push_attribute(ip, CTA_IP_V4_DST, &d.octets());
            }
            (s, d) => {
                push_attribute(ip, CTA_IP_V6_SRC, &ipv6_octets(s));
                push_attribute(ip, CTA_IP_V6_DST, &ipv6_octets(d));
            }
        }
    });
    push_nested(out, CTA_TUPLE_PROTO, |proto| {
        push_attribute(proto, CTA_PROTO_NUM, &[protocol]);
        push_attribute(
            proto,
            CTA_PROTO_SRC_PORT,
            &tuple.source.port().to_be_bytes(),
        );
        push_attribute(
            proto,
            CTA_PROTO_DST_PORT,
            &tuple.destination.port().to_be_bytes(),
        );
    });
}

fn ipv6_octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn delete_request(flow: &ConntrackFlow) -> CtRequest {
    let family = if flow.original.source.is_ipv6() {
        AF_INET6
    } else {
        AF_INET
    };
    let mut attributes = Vec::new();
    push_nested(&mut attributes, CTA_TUPLE_ORIG, |t| {
        encode_tuple(t, flow.protocol, &flow.original);
    });
    if flow.zone != 0 {
        push_attribute(&mut attributes, CTA_ZONE, &flow.zone.to_be_bytes());
    }
    CtRequest {
        kind: IPCTNL_MSG_CT_DELETE,
        family,
        attributes,
    }
}

/// Decodes one conntrack message payload (nfgenmsg + attributes). `Ok(None)`: an entry the
/// proxier never matches (no ports: ICMP, GRE, ...).
fn decode_flow(payload: &[u8]) -> Result<Option<ConntrackFlow>, String> {
    let attributes = payload
        .get(NFGENMSG_LEN..)
        .ok_or_else(|| "short nfgenmsg".to_owned())?;
    let mut original = None;
    let mut reply = None;
    let mut zone = 0;
    for nla in NlasIterator::new(attributes) {
        let nla = nla.map_err(|e| format!("attribute: {e}"))?;
        match nla.kind() {
            CTA_TUPLE_ORIG => original = decode_tuple(nla.value())?,
            CTA_TUPLE_REPLY => reply = decode_tuple(nla.value())?,
            CTA_ZONE => zone = be_u16(nla.value()).ok_or("CTA_ZONE is not 2 bytes")?,
            _ => {}
        }
    }
    match (original, reply) {
        (Some((protocol, original)), Some((_, reply))) => Ok(Some(ConntrackFlow {
            protocol,
            zone,
            original,
            reply,
        })),
        _ => Ok(None),
    }
}

fn be_u16(bytes: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(..2)?.try_into().ok()?))
}

fn decode_tuple(bytes: &[u8]) -> Result<Option<(u8, FlowTuple)>, String> {
    let (mut source, mut destination) = (None, None);
    let (mut protocol, mut source_port, mut destination_port) = (None, None, None);
    for nla in NlasIterator::new(bytes) {
        let nla: NlaBuffer<&[u8]> = nla.map_err(|e| format!("tuple: {e}"))?;
        match nla.kind() {
            CTA_TUPLE_IP => {
                for ip in NlasIterator::new(nla.value()) {
                    let ip = ip.map_err(|e| format!("tuple ip: {e}"))?;
                    let address = ip_of(ip.value())?;
                    match ip.kind() {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => source = Some(address),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => destination = Some(address),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for p in NlasIterator::new(nla.value()) {
                    let p = p.map_err(|e| format!("tuple proto: {e}"))?;
                    match p.kind() {
                        CTA_PROTO_NUM => protocol = p.value().first().copied(),
                        CTA_PROTO_SRC_PORT => source_port = be_u16(p.value()),
                        CTA_PROTO_DST_PORT => destination_port = be_u16(p.value()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    match (protocol, source, destination, source_port, destination_port) {
        (Some(protocol), Some(s), Some(d), Some(sp), Some(dp)) => Ok(Some((
            protocol,
            FlowTuple {
                source: SocketAddr::new(s, sp),
                destination: SocketAddr::new(d, dp),
            },
        ))),
        _ => Ok(None),
    }
}

fn ip_of(bytes: &[u8]) -> Result<IpAddr, String> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        Ok(IpAddr::from(v4))
    } else if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        Ok(IpAddr::from(v6))
    } else {
        Err(format!("address of {} bytes", bytes.len()))
    }
}

#[cfg(test)]
mod tests;
