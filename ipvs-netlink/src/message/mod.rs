//! The IPVS wire format, typed: the command ([`IpvsCmd`]), the generic-netlink payload
//! ([`IpvsMessage`]) and one attribute enum per nesting level ([`IpvsAttr`],
//! [`ServiceAttr`], [`DestAttr`], [`DaemonAttr`], [`StatsAttr`], [`InfoAttr`]), each
//! implementing netlink-packet-core's [`Nla`] and
//! [`Parseable`] (or, for the top level, which depends on
//! the command, [`ParseableParametrized`]), as netlink-packet-route does for rtnetlink.
//!
//! Attributes this library does not know (a newer kernel's) are kept as `Other`
//! ([`DefaultNla`]), and every nest remembers whether it came with `NLA_F_NESTED`
//! ([`Nest`]), so parsing a message and emitting it again gives the same bytes.
//!
//! The conversions to and from the crate's domain types live here too: constructors such
//! as [`IpvsMessage::new_service`] validate and encode, and accessors such as
//! [`IpvsMessage::service_entry`] decode. Decoding is written for what real kernels send:
//! dump replies carry `NEW_SERVICE` / `NEW_DEST`, addresses come as 16 bytes, destinations
//! without an address family inherit the service's, and malformed input yields an error,
//! never a panic.

mod config;
mod consts;
mod daemon;
mod dest;
pub(crate) mod record;
mod service;
mod stats;

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NLA_F_NET_BYTEORDER, NLA_TYPE_MASK, Nla, NlaBuffer,
    Parseable, ParseableParametrized,
};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};

pub use config::InfoAttr;
pub use daemon::{DaemonAttr, sync_daemon};
pub use dest::{DestAttr, destination_entry};
pub use service::{InetAddr, ServiceAttr, service_entry};
pub use stats::{Counter, StatsAttr, stats};

use consts::*;

use crate::destination::{Destination, DestinationKey};
use crate::service::{AddressFamily, Service, ServiceEntry, ServiceKey};
use crate::sync_daemon::{SyncDaemon, SyncState};
use crate::{DestinationEntry, Info, Timeouts};

/// Name of the IPVS generic-netlink family, as the kernel registers it.
pub const FAMILY_NAME: &str = IPVS_GENL_NAME;

/// A wire-level decoding problem (malformed or missing attribute).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed IPVS message: {0}")]
pub struct WireError(String);

impl WireError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        WireError(msg.into())
    }
}

impl From<DecodeError> for WireError {
    fn from(e: DecodeError) -> Self {
        WireError(e.to_string())
    }
}

/// A client-side validation failure while encoding a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A field holds something the kernel refuses or cannot hold (e.g. fwmark 0, a name
    /// too long, a netmask of the other family).
    #[error("{field}: {reason}")]
    Invalid {
        /// The field, e.g. `"scheduler name"`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A numeric field the kernel cannot hold.
    #[error(transparent)]
    OutOfRange(#[from] crate::range::RangeError),
}

impl EncodeError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        EncodeError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// An IPVS generic-netlink command (`IPVS_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IpvsCmd {
    /// Add a service; also the command of every service in a reply.
    NewService,
    /// Change a service.
    SetService,
    /// Delete a service and its destinations.
    DelService,
    /// Read one service, or dump them all.
    GetService,
    /// Add a destination; also the command of every destination in a reply.
    NewDest,
    /// Change a destination.
    SetDest,
    /// Delete a destination.
    DelDest,
    /// Dump a service's destinations.
    GetDest,
    /// Start a sync daemon; also the command of every daemon in a reply.
    NewDaemon,
    /// Stop a sync daemon.
    DelDaemon,
    /// Dump the sync daemons.
    GetDaemon,
    /// Set the connection timeouts; also the command of the `GetConfig` reply.
    SetConfig,
    /// Read the connection timeouts.
    GetConfig,
    /// The command of the `GetInfo` reply (the kernel accepts no request with it).
    SetInfo,
    /// Read the IPVS version and connection table size.
    GetInfo,
    /// Zero the counters of one service or of all.
    Zero,
    /// Delete every service of the network namespace.
    Flush,
    /// A command this library does not know.
    Other(u8),
}

impl IpvsCmd {
    /// The `IPVS_CMD_*` number.
    pub fn number(self) -> u8 {
        match self {
            IpvsCmd::NewService => IPVS_CMD_NEW_SERVICE,
            IpvsCmd::SetService => IPVS_CMD_SET_SERVICE,
            IpvsCmd::DelService => IPVS_CMD_DEL_SERVICE,
            IpvsCmd::GetService => IPVS_CMD_GET_SERVICE,
            IpvsCmd::NewDest => IPVS_CMD_NEW_DEST,
            IpvsCmd::SetDest => IPVS_CMD_SET_DEST,
            IpvsCmd::DelDest => IPVS_CMD_DEL_DEST,
            IpvsCmd::GetDest => IPVS_CMD_GET_DEST,
            IpvsCmd::NewDaemon => IPVS_CMD_NEW_DAEMON,
            IpvsCmd::DelDaemon => IPVS_CMD_DEL_DAEMON,
            IpvsCmd::GetDaemon => IPVS_CMD_GET_DAEMON,
            IpvsCmd::SetConfig => IPVS_CMD_SET_CONFIG,
            IpvsCmd::GetConfig => IPVS_CMD_GET_CONFIG,
            IpvsCmd::SetInfo => IPVS_CMD_SET_INFO,
            IpvsCmd::GetInfo => IPVS_CMD_GET_INFO,
            IpvsCmd::Zero => IPVS_CMD_ZERO,
            IpvsCmd::Flush => IPVS_CMD_FLUSH,
            IpvsCmd::Other(n) => n,
        }
    }

    /// The command for an `IPVS_CMD_*` number ([`IpvsCmd::Other`] when unknown).
    pub fn from_number(n: u8) -> Self {
        match n {
            IPVS_CMD_NEW_SERVICE => IpvsCmd::NewService,
            IPVS_CMD_SET_SERVICE => IpvsCmd::SetService,
            IPVS_CMD_DEL_SERVICE => IpvsCmd::DelService,
            IPVS_CMD_GET_SERVICE => IpvsCmd::GetService,
            IPVS_CMD_NEW_DEST => IpvsCmd::NewDest,
            IPVS_CMD_SET_DEST => IpvsCmd::SetDest,
            IPVS_CMD_DEL_DEST => IpvsCmd::DelDest,
            IPVS_CMD_GET_DEST => IpvsCmd::GetDest,
            IPVS_CMD_NEW_DAEMON => IpvsCmd::NewDaemon,
            IPVS_CMD_DEL_DAEMON => IpvsCmd::DelDaemon,
            IPVS_CMD_GET_DAEMON => IpvsCmd::GetDaemon,
            IPVS_CMD_SET_CONFIG => IpvsCmd::SetConfig,
            IPVS_CMD_GET_CONFIG => IpvsCmd::GetConfig,
            IPVS_CMD_SET_INFO => IpvsCmd::SetInfo,
            IPVS_CMD_GET_INFO => IpvsCmd::GetInfo,
            IPVS_CMD_ZERO => IpvsCmd::Zero,
            IPVS_CMD_FLUSH => IpvsCmd::Flush,
            n => IpvsCmd::Other(n),
        }
    }

    /// Whether the top-level attributes of this command are [`InfoAttr`]s (`GET_INFO` and
    /// its `SET_INFO` reply) rather than the `IPVS_CMD_ATTR_*` set.
    fn carries_info(self) -> bool {
        matches!(self, IpvsCmd::GetInfo | IpvsCmd::SetInfo)
    }
}

/// A top-level attribute of an IPVS message (`IPVS_CMD_ATTR_*`, or `IPVS_INFO_ATTR_*` in
/// `GET_INFO` replies).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpvsAttr {
    /// `IPVS_CMD_ATTR_SERVICE`: a service (key only, or full configuration).
    Service(Nest<ServiceAttr>),
    /// `IPVS_CMD_ATTR_DEST`: a destination.
    Dest(Nest<DestAttr>),
    /// `IPVS_CMD_ATTR_DAEMON`: a sync daemon.
    Daemon(Nest<DaemonAttr>),
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP`, in seconds.
    TimeoutTcp(u32),
    /// `IPVS_CMD_ATTR_TIMEOUT_TCP_FIN`, in seconds.
    TimeoutTcpFin(u32),
    /// `IPVS_CMD_ATTR_TIMEOUT_UDP`, in seconds.
    TimeoutUdp(u32),
    /// An attribute of a `GET_INFO` reply.
    Info(InfoAttr),
    /// An attribute this library does not know, kept as it came.
    Other(DefaultNla),
}

/// The attributes of a nest (service, destination, daemon, statistics), and whether its
/// header carried `NLA_F_NESTED`.
///
/// The kernel's IPVS family reads nests without looking at the flag (its requests are
/// parsed with the non-strict `nla_parse_nested_deprecated`) and leaves it off in its own
/// replies (`nla_nest_start_noflag`). So a nest built here ([`Nest::new`], `From<Vec<T>>`)
/// leaves it off too, and a parsed nest keeps what it came with: a sender that sets it
/// (`nla_nest_start`) gets it back when the message is emitted again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Nest<T> {
    /// The nested attributes, in wire order.
    pub nlas: Vec<T>,
    /// Whether the nest's type carries `NLA_F_NESTED` (0x8000).
    pub nested_flag: bool,
}

impl<T> Nest<T> {
    /// A nest of these attributes, without `NLA_F_NESTED`.
    pub fn new(nlas: Vec<T>) -> Self {
        Nest {
            nlas,
            nested_flag: false,
        }
    }

    /// The same nest with `NLA_F_NESTED` set or cleared.
    pub fn with_nested_flag(mut self, nested_flag: bool) -> Self {
        self.nested_flag = nested_flag;
        self
    }
}

impl<T> From<Vec<T>> for Nest<T> {
    fn from(nlas: Vec<T>) -> Self {
        Nest::new(nlas)
    }
}

/// Emitted length of a list of attributes.
fn nested_len<T: Nla>(nlas: &[T]) -> usize {
    nlas.iter().map(Emitable::buffer_len).sum()
}

/// Emits a list of attributes into `buffer` (exactly [`nested_len`] bytes).
///
/// An attribute that carries both `NLA_F_NESTED` and `NLA_F_NET_BYTEORDER` keeps both:
/// `netlink-packet-core` sets the nested flag from the masked type and so drops the byte
/// order flag it set just before, which is put back here.
fn emit_nested<T: Nla>(nlas: &[T], buffer: &mut [u8]) {
    let mut at = 0;
    for nla in nlas {
        let len = nla.buffer_len();
        nla.emit(&mut buffer[at..at + len]);
        if nla.is_network_byteorder() {
            let kind = u16::from_ne_bytes([buffer[at + 2], buffer[at + 3]]) | NLA_F_NET_BYTEORDER;
            buffer[at + 2..at + 4].copy_from_slice(&kind.to_ne_bytes());
        }
        at += len;
    }
}

/// One attribute of a buffer, borrowed: what [`attributes`] yields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawAttr<'a> {
    /// Its type, without the `NLA_F_NESTED` and `NLA_F_NET_BYTEORDER` flags.
    pub(crate) kind: u16,
    /// Its value (the bytes after the header, up to its length).
    pub(crate) value: &'a [u8],
    /// The whole attribute, header included, up to its length (no padding).
    pub(crate) bytes: &'a [u8],
}

impl<'a> RawAttr<'a> {
    /// The attribute as `netlink-packet-core` sees it, for the typed parsers.
    pub(crate) fn buffer(&self) -> NlaBuffer<&'a [u8]> {
        NlaBuffer::new(self.bytes)
    }
}

/// Splits `buf` into attributes, each header read once (the dump decoders' hot path, where
/// `NlaBuffer`'s accessors would re-read and re-check it on every call); an error at the
/// first malformed header, with `netlink-packet-core`'s checks and words. Fewer than 4
/// trailing bytes can only be padding and are ignored.
pub(crate) fn attributes(buf: &[u8]) -> impl Iterator<Item = Result<RawAttr<'_>, WireError>> + '_ {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let &[l0, l1, k0, k1, ..] = rest else {
            return None;
        };
        let length = usize::from(u16::from_ne_bytes([l0, l1]));
        if rest.len() < length {
            let e = DecodeError::nla_length_mismatch(rest.len(), length);
            rest = &[];
            return Some(Err(WireError::from(e)));
        }
        if length < 4 {
            let e = DecodeError::nla_invalid_length(rest.len(), length);
            rest = &[];
            return Some(Err(WireError::from(e)));
        }
        let bytes = &rest[..length];
        let attr = RawAttr {
            kind: u16::from_ne_bytes([k0, k1]) & NLA_TYPE_MASK,
            value: &bytes[4..],
            bytes,
        };
        rest = &rest[((length + 3) & !3).min(rest.len())..];
        Some(Ok(attr))
    })
}

/// [`attributes`] as `netlink-packet-core` buffers, for the typed parsers.
pub(crate) fn nla_buffers(
    buf: &[u8],
) -> impl Iterator<Item = Result<NlaBuffer<&[u8]>, WireError>> + '_ {
    attributes(buf).map(|attr| attr.map(|attr| attr.buffer()))
}

/// Parses every attribute of `buf` as `T`.
pub fn parse_nlas<T>(buf: &[u8]) -> Result<Vec<T>, WireError>
where
    T: for<'a> Parseable<NlaBuffer<&'a [u8]>>,
{
    nla_buffers(buf)
        .map(|nla| T::parse(&nla?).map_err(WireError::from))
        .collect()
}

/// The attributes nested in `nla`, with its `NLA_F_NESTED` flag.
fn parse_nested<T>(nla: &NlaBuffer<&[u8]>) -> Result<Nest<T>, DecodeError>
where
    T: for<'a> Parseable<NlaBuffer<&'a [u8]>>,
{
    let nlas = parse_nlas(nla.value()).map_err(|e| DecodeError::from(e.to_string()))?;
    Ok(Nest::new(nlas).with_nested_flag(nla.nested_flag()))
}

/// A value of exactly `N` bytes.
fn fixed<const N: usize>(what: &str, v: &[u8]) -> Result<[u8; N], DecodeError> {
    <[u8; N]>::try_from(v)
        .map_err(|_| DecodeError::from(format!("{what}: need {N} bytes, got {}", v.len())))
}

fn get_u8(what: &str, v: &[u8]) -> Result<u8, DecodeError> {
    Ok(fixed::<1>(what, v)?[0])
}

fn get_u16(what: &str, v: &[u8]) -> Result<u16, DecodeError> {
    Ok(u16::from_ne_bytes(fixed(what, v)?))
}

fn get_be16(what: &str, v: &[u8]) -> Result<u16, DecodeError> {
    Ok(u16::from_be_bytes(fixed(what, v)?))
}

fn get_u32(what: &str, v: &[u8]) -> Result<u32, DecodeError> {
    Ok(u32::from_ne_bytes(fixed(what, v)?))
}

/// A NUL-terminated string, up to the first NUL (or the end of the value).
fn get_string(what: &str, v: &[u8]) -> Result<String, DecodeError> {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    String::from_utf8(v[..end].to_vec())
        .map_err(|_| DecodeError::from(format!("{what}: not UTF-8")))
}

/// Emits a string with its NUL.
fn emit_string(s: &str, buffer: &mut [u8]) {
    buffer[..s.len()].copy_from_slice(s.as_bytes());
    buffer[s.len()] = 0;
}

impl Nla for IpvsAttr {
    fn value_len(&self) -> usize {
        match self {
            IpvsAttr::Service(v) => nested_len(&v.nlas),
            IpvsAttr::Dest(v) => nested_len(&v.nlas),
            IpvsAttr::Daemon(v) => nested_len(&v.nlas),
            IpvsAttr::TimeoutTcp(_) | IpvsAttr::TimeoutTcpFin(_) | IpvsAttr::TimeoutUdp(_) => 4,
            IpvsAttr::Info(a) => a.value_len(),
            IpvsAttr::Other(a) => a.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            IpvsAttr::Service(_) => IPVS_CMD_ATTR_SERVICE,
            IpvsAttr::Dest(_) => IPVS_CMD_ATTR_DEST,
            IpvsAttr::Daemon(_) => IPVS_CMD_ATTR_DAEMON,
            IpvsAttr::TimeoutTcp(_) => IPVS_CMD_ATTR_TIMEOUT_TCP,
            IpvsAttr::TimeoutTcpFin(_) => IPVS_CMD_ATTR_TIMEOUT_TCP_FIN,
            IpvsAttr::TimeoutUdp(_) => IPVS_CMD_ATTR_TIMEOUT_UDP,
            IpvsAttr::Info(a) => a.kind(),
            IpvsAttr::Other(a) => a.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            IpvsAttr::Service(v) => emit_nested(&v.nlas, buffer),
            IpvsAttr::Dest(v) => emit_nested(&v.nlas, buffer),
            IpvsAttr::Daemon(v) => emit_nested(&v.nlas, buffer),
            IpvsAttr::TimeoutTcp(t) | IpvsAttr::TimeoutTcpFin(t) | IpvsAttr::TimeoutUdp(t) => {
                buffer.copy_from_slice(&t.to_ne_bytes())
            }
            IpvsAttr::Info(a) => a.emit_value(buffer),
            IpvsAttr::Other(a) => a.emit_value(buffer),
        }
    }

    fn is_nested(&self) -> bool {
        match self {
            IpvsAttr::Service(v) => v.nested_flag,
            IpvsAttr::Dest(v) => v.nested_flag,
            IpvsAttr::Daemon(v) => v.nested_flag,
            IpvsAttr::TimeoutTcp(_) | IpvsAttr::TimeoutTcpFin(_) | IpvsAttr::TimeoutUdp(_) => false,
            IpvsAttr::Info(a) => a.is_nested(),
            IpvsAttr::Other(a) => a.is_nested(),
        }
    }
}

impl<'a> ParseableParametrized<NlaBuffer<&'a [u8]>, IpvsCmd> for IpvsAttr {
    fn parse_with_param(buf: &NlaBuffer<&'a [u8]>, cmd: IpvsCmd) -> Result<Self, DecodeError> {
        if cmd.carries_info() {
            return Ok(IpvsAttr::Info(InfoAttr::parse(buf)?));
        }
        let v = buf.value();
        Ok(match buf.kind() {
            IPVS_CMD_ATTR_SERVICE => IpvsAttr::Service(parse_nested(buf)?),
            IPVS_CMD_ATTR_DEST => IpvsAttr::Dest(parse_nested(buf)?),
            IPVS_CMD_ATTR_DAEMON => IpvsAttr::Daemon(parse_nested(buf)?),
            IPVS_CMD_ATTR_TIMEOUT_TCP => IpvsAttr::TimeoutTcp(get_u32("TCP timeout", v)?),
            IPVS_CMD_ATTR_TIMEOUT_TCP_FIN => {
                IpvsAttr::TimeoutTcpFin(get_u32("TCP FIN timeout", v)?)
            }
            IPVS_CMD_ATTR_TIMEOUT_UDP => IpvsAttr::TimeoutUdp(get_u32("UDP timeout", v)?),
            _ => IpvsAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// One IPVS generic-netlink message: a command and its typed top-level attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsMessage {
    /// The command.
    pub cmd: IpvsCmd,
    /// Top-level attributes, in wire order.
    pub nlas: Vec<IpvsAttr>,
}

impl IpvsMessage {
    /// A message with no attributes.
    pub fn new(cmd: IpvsCmd) -> Self {
        IpvsMessage {
            cmd,
            nlas: Vec::new(),
        }
    }

    /// A message with the given attributes.
    pub fn with_nlas(cmd: IpvsCmd, nlas: Vec<IpvsAttr>) -> Self {
        IpvsMessage { cmd, nlas }
    }

    /// Parses a message: `buf` holds the attributes that follow the generic-netlink
    /// header, `cmd` is the header's command.
    pub fn parse(cmd: u8, buf: &[u8]) -> Result<Self, WireError> {
        let cmd = IpvsCmd::from_number(cmd);
        let nlas = nla_buffers(buf)
            .map(|nla| IpvsAttr::parse_with_param(&nla?, cmd).map_err(WireError::from))
            .collect::<Result<_, _>>()?;
        Ok(IpvsMessage { cmd, nlas })
    }

    /// Parses a generic-netlink payload: the genl header (whose command is used), then the
    /// attributes.
    pub(crate) fn from_genl(payload: &[u8]) -> Result<Self, WireError> {
        match payload {
            [cmd, _version, _, _, attrs @ ..] => IpvsMessage::parse(*cmd, attrs),
            _ => Err(WireError::new("message shorter than the genl header")),
        }
    }

    /// The emitted attributes (what follows the generic-netlink header).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut buf = vec![0; self.buffer_len()];
        self.emit(&mut buf);
        buf
    }

    /// `GET_INFO`: the kernel answers with the IPVS version and connection table size.
    pub fn get_info() -> Self {
        IpvsMessage::new(IpvsCmd::GetInfo)
    }

    /// `GET_CONFIG`: the kernel answers with the connection timeouts.
    pub fn get_config() -> Self {
        IpvsMessage::new(IpvsCmd::GetConfig)
    }

    /// `FLUSH`: the kernel deletes every service of the network namespace.
    pub fn flush() -> Self {
        IpvsMessage::new(IpvsCmd::Flush)
    }

    /// `GET_SERVICE` without a key: as a dump, every service.
    pub fn get_services() -> Self {
        IpvsMessage::new(IpvsCmd::GetService)
    }

    /// `GET_DAEMON`: as a dump, every running sync daemon.
    pub fn get_daemons() -> Self {
        IpvsMessage::new(IpvsCmd::GetDaemon)
    }

    /// `GET_SERVICE` of one service (exact; `ESRCH` when it does not exist).
    pub fn get_service(key: &ServiceKey) -> Result<Self, EncodeError> {
        Self::keyed(IpvsCmd::GetService, key)
    }

    /// `GET_DEST`: as a dump, the destinations of one service.
    pub fn get_destinations(key: &ServiceKey) -> Result<Self, EncodeError> {
        Self::keyed(IpvsCmd::GetDest, key)
    }

    /// `NEW_SERVICE`: the kernel adds the service (`EEXIST` if it exists).
    pub fn new_service(service: &Service) -> Result<Self, EncodeError> {
        Ok(Self::with_nlas(
            IpvsCmd::NewService,
            vec![IpvsAttr::Service(service::service_nlas(service)?.into())],
        ))
    }

    /// `SET_SERVICE`: the kernel replaces the service's configuration (`ESRCH` if it does
    /// not exist).
    pub fn set_service(service: &Service) -> Result<Self, EncodeError> {
        Ok(Self::with_nlas(
            IpvsCmd::SetService,
            vec![IpvsAttr::Service(service::service_nlas(service)?.into())],
        ))
    }

    /// `DEL_SERVICE`: the kernel deletes the service and its destinations.
    pub fn del_service(key: &ServiceKey) -> Result<Self, EncodeError> {
        Self::keyed(IpvsCmd::DelService, key)
    }

    /// `NEW_DEST`: the kernel adds a destination to the service.
    pub fn new_destination(key: &ServiceKey, dest: &Destination) -> Result<Self, EncodeError> {
        Self::with_dest(IpvsCmd::NewDest, key, dest)
    }

    /// `SET_DEST`: the kernel replaces a destination's configuration.
    pub fn set_destination(key: &ServiceKey, dest: &Destination) -> Result<Self, EncodeError> {
        Self::with_dest(IpvsCmd::SetDest, key, dest)
    }

    /// `DEL_DEST`: the kernel deletes a destination (it may linger in the destination
    /// trash while connections use it).
    pub fn del_destination(key: &ServiceKey, dest: &DestinationKey) -> Result<Self, EncodeError> {
        Ok(Self::with_nlas(
            IpvsCmd::DelDest,
            vec![
                IpvsAttr::Service(service::key_nlas(key)?.into()),
                IpvsAttr::Dest(dest::key_nlas(dest).into()),
            ],
        ))
    }

    /// `ZERO`: the kernel zeroes the counters of one service, or of all with `None`.
    pub fn zero(key: Option<&ServiceKey>) -> Result<Self, EncodeError> {
        match key {
            Some(key) => Self::keyed(IpvsCmd::Zero, key),
            None => Ok(IpvsMessage::new(IpvsCmd::Zero)),
        }
    }

    /// `SET_CONFIG`: the kernel sets the connection timeouts (a 0 keeps the current value).
    /// Each must be at most [`MAX_TIMEOUT`](crate::timeouts::MAX_TIMEOUT).
    pub fn set_timeouts(t: &Timeouts) -> Result<Self, EncodeError> {
        config::timeouts_message(t)
    }

    /// `NEW_DAEMON`: the kernel starts a sync daemon.
    pub fn new_daemon(d: &SyncDaemon) -> Result<Self, EncodeError> {
        Ok(Self::with_nlas(
            IpvsCmd::NewDaemon,
            vec![IpvsAttr::Daemon(daemon::daemon_nlas(d)?.into())],
        ))
    }

    /// `DEL_DAEMON`: the kernel stops the sync daemon of that state.
    pub fn del_daemon(state: SyncState) -> Self {
        Self::with_nlas(
            IpvsCmd::DelDaemon,
            vec![IpvsAttr::Daemon(
                vec![DaemonAttr::State(daemon::state_bits(state))].into(),
            )],
        )
    }

    fn keyed(cmd: IpvsCmd, key: &ServiceKey) -> Result<Self, EncodeError> {
        Ok(Self::with_nlas(
            cmd,
            vec![IpvsAttr::Service(service::key_nlas(key)?.into())],
        ))
    }

    fn with_dest(cmd: IpvsCmd, key: &ServiceKey, dest: &Destination) -> Result<Self, EncodeError> {
        Ok(Self::with_nlas(
            cmd,
            vec![
                IpvsAttr::Service(service::key_nlas(key)?.into()),
                IpvsAttr::Dest(dest::dest_nlas(dest)?.into()),
            ],
        ))
    }

    /// The first service attribute.
    pub fn service_nlas(&self) -> Option<&[ServiceAttr]> {
        self.nlas.iter().find_map(|a| match a {
            IpvsAttr::Service(v) => Some(v.nlas.as_slice()),
            _ => None,
        })
    }

    /// The first destination attribute.
    pub fn dest_nlas(&self) -> Option<&[DestAttr]> {
        self.nlas.iter().find_map(|a| match a {
            IpvsAttr::Dest(v) => Some(v.nlas.as_slice()),
            _ => None,
        })
    }

    /// The first daemon attribute.
    pub fn daemon_nlas(&self) -> Option<&[DaemonAttr]> {
        self.nlas.iter().find_map(|a| match a {
            IpvsAttr::Daemon(v) => Some(v.nlas.as_slice()),
            _ => None,
        })
    }

    /// The service of a `NEW_SERVICE` reply (dump part or `GET_SERVICE` answer).
    pub fn service_entry(&self) -> Result<ServiceEntry, WireError> {
        service_entry(
            self.service_nlas()
                .ok_or_else(|| WireError::new("reply without a service attribute"))?,
        )
    }

    /// The destination of a `NEW_DEST` part of a destination dump; `service_family` is used
    /// when the kernel does not send the destination's family (kernels before 4.x).
    pub fn destination_entry(
        &self,
        service_family: AddressFamily,
    ) -> Result<DestinationEntry, WireError> {
        destination_entry(
            self.dest_nlas()
                .ok_or_else(|| WireError::new("reply without a destination attribute"))?,
            service_family,
        )
    }

    /// The daemon of a `NEW_DAEMON` dump part.
    pub fn sync_daemon(&self) -> Result<SyncDaemon, WireError> {
        sync_daemon(
            self.daemon_nlas()
                .ok_or_else(|| WireError::new("reply without a daemon attribute"))?,
        )
    }

    /// The timeouts of a `GET_CONFIG` reply (missing ones are 0).
    pub fn timeouts(&self) -> Timeouts {
        let mut t = Timeouts::default();
        for a in &self.nlas {
            match a {
                IpvsAttr::TimeoutTcp(v) => t.tcp = *v,
                IpvsAttr::TimeoutTcpFin(v) => t.tcp_fin = *v,
                IpvsAttr::TimeoutUdp(v) => t.udp = *v,
                _ => {}
            }
        }
        t
    }

    /// The facts of a `GET_INFO` reply.
    pub fn info(&self) -> Result<Info, WireError> {
        config::info(&self.nlas)
    }
}

/// `msg` as a generic-netlink message of the family the kernel gave IPVS.
pub(crate) fn genl(family: u16, msg: IpvsMessage) -> GenlMessage<IpvsMessage> {
    let mut genl = GenlMessage::from_payload(msg);
    genl.set_resolved_family_id(family);
    genl
}

impl GenlFamily for IpvsMessage {
    fn family_name() -> &'static str {
        IPVS_GENL_NAME
    }

    fn command(&self) -> u8 {
        self.cmd.number()
    }

    fn version(&self) -> u8 {
        IPVS_GENL_VERSION
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        nested_len(&self.nlas)
    }

    fn emit(&self, buffer: &mut [u8]) {
        emit_nested(&self.nlas, buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        IpvsMessage::parse(header.cmd, buf).map_err(|e| DecodeError::from(e.to_string()))
    }
}

#[cfg(test)]
mod kernel_captures;
#[cfg(test)]
mod tests;
