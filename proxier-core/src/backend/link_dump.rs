//! The reads of the links a full sync makes ([`AddressBackend::read_link`]) and the start's
//! question whether the dummy link holds any address, on blocking rtnetlink sockets,
//! decoding of each message only the header fields and attributes kept.
//!
//! The dummy link holds one address per ClusterIP, and the `local` routing table one route
//! per address: 10,000 of each at 10,000 Services. Read through rtnetlink's connection,
//! each was decoded whole into netlink-packet-route's messages (every attribute typed, in a
//! vector of its own) and then dropped or reduced to an address. Here an address costs its
//! header and its address attributes, and a route the kernel made for an address (`proto
//! kernel`, most of them) its header alone.
//!
//! rtnetlink's connection also reads a whole dump before its requester sees the first
//! message (it reads the socket until it is empty, and the kernel fills the next part of a
//! dump as each is read), so asking whether the link holds an address decoded all 10,000:
//! about 0.2 CPU-second of a restart in the test VM. [`holds_address`] looks at the first
//! datagram and closes its socket, which ends the dump in the kernel.
//!
//! [`AddressBackend::read_link`]: super::AddressBackend::read_link

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use ipvs_netlink::transport::NetlinkSocket;
use netlink_packet_core::NlasIterator;

use crate::netlink_message::{EncodedMessage, push_attribute};
use netlink_sys::protocols::NETLINK_ROUTE;

/// `RTM_GETLINK`, `RTM_NEWLINK`, `RTM_GETADDR`, `RTM_NEWADDR`, `RTM_GETROUTE`.
const RTM_GETLINK: u16 = 18;
const RTM_NEWLINK: u16 = 16;
const RTM_GETADDR: u16 = 22;
const RTM_NEWADDR: u16 = 20;
const RTM_GETROUTE: u16 = 26;
/// `NLMSG_ERROR`, `NLMSG_DONE`.
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// Address families.
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `IFLA_IFNAME`.
const IFLA_IFNAME: u16 = 3;
/// `IFA_ADDRESS`, `IFA_LOCAL`.
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// `RTA_DST`, `RTA_OIF`, `RTA_TABLE`.
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_TABLE: u16 = 15;
/// The `local` routing table, `local` routes, and routes the kernel made itself.
const RT_TABLE_LOCAL: u8 = 255;
const RTN_LOCAL: u8 = 2;
const RTPROT_KERNEL: u8 = 2;
/// `struct ifinfomsg`, `struct ifaddrmsg`, `struct rtmsg`.
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;
const RTMSG_LEN: usize = 12;
/// `struct nlmsghdr`.
const NLMSG_HDRLEN: usize = 16;

/// One rtnetlink request, encoded when built.
type Request = EncodedMessage;

impl Request {
    /// `RTM_GETLINK` of the link named `name` (not a dump).
    fn link(name: &str) -> Request {
        let mut body = vec![0; IFINFOMSG_LEN];
        let mut value = name.as_bytes().to_vec();
        value.push(0);
        push_attribute(&mut body, IFLA_IFNAME, &value);
        Request {
            message_type: RTM_GETLINK,
            body,
        }
    }

    /// `RTM_GETLINK` of every link (a dump).
    fn links() -> Request {
        Request {
            message_type: RTM_GETLINK,
            body: vec![0; IFINFOMSG_LEN],
        }
    }

    /// `RTM_GETADDR` of every family, asking for link `index`'s addresses (`0`: every
    /// link's). A kernel that checks dump requests strictly sends that link's alone.
    fn addresses(index: u32) -> Request {
        let mut body = vec![AF_UNSPEC, 0, 0, 0];
        body.extend_from_slice(&index.to_ne_bytes());
        Request {
            message_type: RTM_GETADDR,
            body,
        }
    }

    /// `RTM_GETROUTE` of `family`, asking for the `local` routes of the `local` table
    /// through link `index`.
    fn local_routes(family: u8, index: u32) -> Request {
        let mut body = vec![family, 0, 0, 0, RT_TABLE_LOCAL, 0, 0, RTN_LOCAL];
        body.extend_from_slice(&0u32.to_ne_bytes());
        push_attribute(&mut body, RTA_OIF, &index.to_ne_bytes());
        Request {
            message_type: RTM_GETROUTE,
            body,
        }
    }
}

/// A kernel refusal as an I/O error (its errno).
fn refused(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// An rtnetlink socket opened in the calling thread's network namespace, with strict
/// checking of dump requests when the kernel has it.
pub(super) struct LinkSocket {
    socket: NetlinkSocket,
    /// Whether the kernel filters dumps by the request (else the reader filters alone).
    strict: bool,
}

impl LinkSocket {
    /// Opens one.
    pub(super) fn open() -> io::Result<LinkSocket> {
        let mut socket = NetlinkSocket::open(NETLINK_ROUTE)?;
        let strict = socket.set_strict_check().is_ok();
        Ok(LinkSocket { socket, strict })
    }

    /// The index of the link named `name`; `None` when there is none.
    pub(super) fn link_index(&mut self, name: &str) -> io::Result<Option<u32>> {
        let mut index = None;
        let answer = self.socket.request(Request::link(name), |reply| {
            if reply.header.message_type == RTM_NEWLINK {
                index = index.or_else(|| link_index_of(reply.payload));
            }
        })?;
        match answer {
            Ok(()) => Ok(index),
            Err(libc::ENODEV) => Ok(None),
            Err(errno) => Err(refused(errno)),
        }
    }

    /// The addresses bound on link `index`, link-local ones left out.
    pub(super) fn link_addresses(&mut self, index: u32) -> io::Result<BTreeSet<IpAddr>> {
        let mut addresses = BTreeSet::new();
        self.addresses(index, |link, address| {
            if link == index && !is_link_local(&address) {
                addresses.insert(address);
            }
        })?;
        Ok(addresses)
    }

    /// The node's own addresses: every link's but the dummy link's (`dummy`), loopback and
    /// IPv6 link-local ones left out (IPv4 link-local ones can serve NodePorts, as with
    /// kube-proxy). With strict checking, link by link, so the dummy link's are neither
    /// sent nor decoded; else from one dump of every address.
    pub(super) fn node_addresses(&mut self, dummy: Option<u32>) -> io::Result<BTreeSet<IpAddr>> {
        let links = if self.strict {
            let mut links = Vec::new();
            let answer = self.socket.dump(Request::links(), |reply| {
                if reply.header.message_type == RTM_NEWLINK {
                    links.extend(link_index_of(reply.payload));
                }
            })?;
            answer.map_err(refused)?;
            links.retain(|index| Some(*index) != dummy);
            links
        } else {
            vec![0]
        };
        let mut addresses = BTreeSet::new();
        for index in links {
            let result = self.addresses(index, |link, address| {
                if Some(link) != dummy
                    && !matches!(address, IpAddr::V6(v6) if v6.is_unicast_link_local())
                    && !address.is_loopback()
                {
                    addresses.insert(address);
                }
            });
            match result {
                // The link went away since the links were listed: it has none.
                Err(error) if error.raw_os_error() == Some(libc::ENODEV) => {}
                other => other?,
            }
        }
        Ok(addresses)
    }

    /// One address dump (of link `index`, `0`: of every link), handing each address with
    /// its link to `each`.
    fn addresses(&mut self, index: u32, mut each: impl FnMut(u32, IpAddr)) -> io::Result<()> {
        let answer = self.socket.dump(Request::addresses(index), |reply| {
            if let Some((link, address)) = address_of(reply.header.message_type, reply.payload) {
                each(link, address);
            }
        })?;
        answer.map_err(refused)
    }

    /// The `local` routes of the `local` table through link `index` but those the kernel
    /// made for addresses, in both families: the Service CIDRs routed there.
    pub(super) fn local_routes(&mut self, index: u32) -> io::Result<BTreeSet<IpNet>> {
        let mut routes = BTreeSet::new();
        for family in [AF_INET, AF_INET6] {
            let answer = self
                .socket
                .dump(Request::local_routes(family, index), |reply| {
                    routes.extend(own_local_route(reply.payload, index));
                })?;
            answer.map_err(refused)?;
        }
        Ok(routes)
    }
}

/// The index of a link message (`ifinfomsg.ifi_index`).
fn link_index_of(payload: &[u8]) -> Option<u32> {
    let index = payload.get(4..8)?;
    Some(u32::from_ne_bytes(index.try_into().ok()?))
}

/// The link and the node's own address of an address message: `IFA_LOCAL` when it has one,
/// else `IFA_ADDRESS` (on a point-to-point link `IFA_ADDRESS` is the peer's; elsewhere the
/// two are equal, and IPv6 sends only `IFA_ADDRESS`), as Go's `net.Interface.Addrs`, which
/// kube-proxy reads, chooses.
fn address_of(message_type: u16, payload: &[u8]) -> Option<(u32, IpAddr)> {
    if message_type != RTM_NEWADDR {
        return None;
    }
    let family = *payload.first()?;
    let link = u32::from_ne_bytes(payload.get(4..8)?.try_into().ok()?);
    let mut address = None;
    for nla in NlasIterator::new(payload.get(IFADDRMSG_LEN..)?) {
        let Ok(nla) = nla else { break };
        match nla.kind() {
            IFA_LOCAL => return ip_of(family, nla.value()).map(|local| (link, local)),
            IFA_ADDRESS => address = ip_of(family, nla.value()),
            _ => {}
        }
    }
    address.map(|address| (link, address))
}

/// The destination of a route message when it is a `local` route of the `local` table
/// through link `index` that the kernel did not make itself (for an address of the link).
/// Routes of `proto kernel` are passed over on their header.
fn own_local_route(payload: &[u8], index: u32) -> Option<IpNet> {
    let header = payload.get(..RTMSG_LEN)?;
    let (family, destination_len) = (header[0], header[1]);
    let (mut table, protocol, kind) = (u32::from(header[4]), header[5], header[7]);
    if kind != RTN_LOCAL || protocol == RTPROT_KERNEL {
        return None;
    }
    let mut oif = None;
    let mut destination = match family {
        AF_INET => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        AF_INET6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    for nla in NlasIterator::new(&payload[RTMSG_LEN..]) {
        let Ok(nla) = nla else { break };
        let value = nla.value();
        match nla.kind() {
            RTA_TABLE => table = u32::from_ne_bytes(value.try_into().ok()?),
            RTA_OIF => oif = Some(u32::from_ne_bytes(value.try_into().ok()?)),
            RTA_DST => destination = ip_of(family, value)?,
            _ => {}
        }
    }
    if table != u32::from(RT_TABLE_LOCAL) || oif != Some(index) {
        return None;
    }
    IpNet::new(destination, destination_len).ok()
}

/// An address attribute's value in `family`.
fn ip_of(family: u8, value: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(<[u8; 4]>::try_from(value).ok()?.into())),
        AF_INET6 => Some(IpAddr::V6(<[u8; 16]>::try_from(value).ok()?.into())),
        _ => None,
    }
}

/// Link-local addresses are the kernel's own (an IPv6 one appears when the link goes up),
/// never service addresses.
fn is_link_local(address: &IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    }
}

/// Whether the link named `link` holds an address (link-local ones aside), answered from
/// the first part of an address dump where it can be: the socket is closed as soon as an
/// address of the link shows, which ends the dump in the kernel. `false` when the link does
/// not exist. In the calling thread's network namespace, blocking (one short exchange).
pub(super) fn holds_address(link: &str) -> io::Result<bool> {
    let Some(index) = LinkSocket::open()?.link_index(link)? else {
        return Ok(false);
    };
    let mut socket = netlink_sys::Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    // Without strict checking the dump carries every link's addresses: still the first
    // address of this link ends it.
    let _ = socket.set_netlink_get_strict_chk(true);
    let request = Request::addresses(index);
    let mut message = Vec::with_capacity(NLMSG_HDRLEN + request.body.len());
    let length = u32::try_from(NLMSG_HDRLEN + request.body.len()).unwrap_or(u32::MAX);
    let flags = netlink_packet_core::NLM_F_REQUEST | netlink_packet_core::NLM_F_DUMP;
    message.extend_from_slice(&length.to_ne_bytes());
    message.extend_from_slice(&RTM_GETADDR.to_ne_bytes());
    message.extend_from_slice(&flags.to_ne_bytes());
    message.extend_from_slice(&1u32.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes());
    message.extend_from_slice(&request.body);
    socket.send(&message, 0)?;
    let mut buffer = vec![0; 32 * 1024];
    loop {
        let received = socket.recv(&mut &mut buffer[..], 0)?;
        match first_address(&buffer[..received.min(buffer.len())], index) {
            Datagram::Holds => return Ok(true),
            Datagram::Done => return Ok(false),
            Datagram::Refused(errno) => return Err(refused(errno)),
            Datagram::More => {}
        }
    }
}

/// What one datagram of an address dump tells [`holds_address`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Datagram {
    /// It carries an address of the link.
    Holds,
    /// The dump ended without one.
    Done,
    /// The kernel refused the dump (errno).
    Refused(i32),
    /// Neither: read on.
    More,
}

/// Reads the messages of one datagram of link `index`'s address dump.
fn first_address(datagram: &[u8], index: u32) -> Datagram {
    let mut rest = datagram;
    while rest.len() >= NLMSG_HDRLEN {
        let length = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if length < NLMSG_HDRLEN || length > rest.len() {
            return Datagram::Refused(libc::EBADMSG);
        }
        let message_type = u16::from_ne_bytes([rest[4], rest[5]]);
        let payload = &rest[NLMSG_HDRLEN..length];
        match message_type {
            NLMSG_DONE => return Datagram::Done,
            NLMSG_ERROR => {
                let errno = payload
                    .get(..4)
                    .and_then(|code| code.try_into().ok())
                    .map_or(libc::EBADMSG, |code| -i32::from_ne_bytes(code));
                return if errno == 0 {
                    Datagram::Done
                } else {
                    Datagram::Refused(errno)
                };
            }
            RTM_NEWADDR
                if address_of(message_type, payload)
                    .is_some_and(|(link, address)| link == index && !is_link_local(&address)) =>
            {
                return Datagram::Holds;
            }
            _ => {}
        }
        rest = rest.get(length.next_multiple_of(4)..).unwrap_or_default();
    }
    Datagram::More
}

#[cfg(test)]
mod tests;
