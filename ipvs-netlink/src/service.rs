//! Virtual services: what identifies them and how they are configured.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr};

use crate::range::RangeError;
use crate::{Protocol, Scheduler, Stats};

/// An address family, for fwmark services (tuple services take it from their address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum AddressFamily {
    /// IPv4 (`AF_INET`).
    #[default]
    Inet,
    /// IPv6 (`AF_INET6`).
    Inet6,
}

impl AddressFamily {
    /// The `AF_*` number (`AF_INET` 2, `AF_INET6` 10).
    pub fn number(self) -> u16 {
        match self {
            AddressFamily::Inet => 2,
            AddressFamily::Inet6 => 10,
        }
    }

    /// The family for an `AF_*` number.
    pub fn from_number(n: u16) -> Option<Self> {
        match n {
            2 => Some(AddressFamily::Inet),
            10 => Some(AddressFamily::Inet6),
            _ => None,
        }
    }

    /// The family of an address.
    pub fn of(addr: &IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        }
    }

    /// Longest prefix length in this family (32 or 128).
    pub fn max_prefix(self) -> u8 {
        match self {
            AddressFamily::Inet => 32,
            AddressFamily::Inet6 => 128,
        }
    }
}

/// What identifies a virtual service in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceKey {
    /// A (virtual address, port, protocol) service, like `ipvsadm -t/-u/--sctp-service`.
    Tuple {
        /// Virtual IP address.
        addr: IpAddr,
        /// Virtual port.
        port: u16,
        /// Transport protocol.
        protocol: Protocol,
    },
    /// A firewall-mark service, like `ipvsadm -f`.
    Fwmark {
        /// The packet mark.
        mark: u32,
        /// Address family of the traffic it matches.
        family: AddressFamily,
    },
}

impl ServiceKey {
    /// A TCP service.
    pub fn tcp(addr: IpAddr, port: u16) -> Self {
        ServiceKey::Tuple {
            addr,
            port,
            protocol: Protocol::Tcp,
        }
    }

    /// A UDP service.
    pub fn udp(addr: IpAddr, port: u16) -> Self {
        ServiceKey::Tuple {
            addr,
            port,
            protocol: Protocol::Udp,
        }
    }

    /// An SCTP service.
    pub fn sctp(addr: IpAddr, port: u16) -> Self {
        ServiceKey::Tuple {
            addr,
            port,
            protocol: Protocol::Sctp,
        }
    }

    /// A firewall-mark service.
    pub fn fwmark(mark: u32, family: AddressFamily) -> Self {
        ServiceKey::Fwmark { mark, family }
    }

    /// The address family of the service.
    pub fn family(&self) -> AddressFamily {
        match self {
            ServiceKey::Tuple { addr, .. } => AddressFamily::of(addr),
            ServiceKey::Fwmark { family, .. } => *family,
        }
    }
}

impl fmt::Display for ServiceKey {
    /// Formats like ipvsadm: `TCP 10.0.0.1:80`, `UDP [fd00::1]:53`, `FWM 7 IPv6`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceKey::Tuple {
                addr: IpAddr::V4(a),
                port,
                protocol,
            } => write!(f, "{protocol} {a}:{port}"),
            ServiceKey::Tuple {
                addr: IpAddr::V6(a),
                port,
                protocol,
            } => write!(f, "{protocol} [{a}]:{port}"),
            ServiceKey::Fwmark {
                mark,
                family: AddressFamily::Inet,
            } => write!(f, "FWM {mark}"),
            ServiceKey::Fwmark {
                mark,
                family: AddressFamily::Inet6,
            } => write!(f, "FWM {mark} IPv6"),
        }
    }
}

const F_PERSISTENT: u32 = 0x0001;
const F_HASHED: u32 = 0x0002;
const F_ONEPACKET: u32 = 0x0004;
const F_SCHED1: u32 = 0x0008;
const F_SCHED2: u32 = 0x0010;
const F_SCHED3: u32 = 0x0020;

/// Service flags (`IP_VS_SVC_F_*`). The kernel-internal `HASHED` bit is kept but ignored by
/// `==` and `Hash`, so a service read back from the kernel equals the one that was written.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceFlags(u32);

impl ServiceFlags {
    /// Persistent service (`-p`).
    pub const PERSISTENT: ServiceFlags = ServiceFlags(F_PERSISTENT);
    /// Set by the kernel on every hashed (installed) service; never sent.
    pub const HASHED: ServiceFlags = ServiceFlags(F_HASHED);
    /// One-packet scheduling (`-o`).
    pub const ONE_PACKET: ServiceFlags = ServiceFlags(F_ONEPACKET);
    /// Scheduler flag 1 for `sh`: `sh-fallback` (pick another server when the hashed one
    /// is unavailable).
    pub const SH_FALLBACK: ServiceFlags = ServiceFlags(F_SCHED1);
    /// Scheduler flag 2 for `sh`: `sh-port` (hash the source port too).
    pub const SH_PORT: ServiceFlags = ServiceFlags(F_SCHED2);
    /// Scheduler flag 1 for `mh`: `mh-fallback` (the same bit as [`SH_FALLBACK`](Self::SH_FALLBACK)).
    pub const MH_FALLBACK: ServiceFlags = ServiceFlags(F_SCHED1);
    /// Scheduler flag 2 for `mh`: `mh-port` (the same bit as [`SH_PORT`](Self::SH_PORT)).
    pub const MH_PORT: ServiceFlags = ServiceFlags(F_SCHED2);
    /// Scheduler flag 3.
    pub const SCHED3: ServiceFlags = ServiceFlags(F_SCHED3);
    /// Every flag a client may set (everything but `HASHED`).
    pub const SETTABLE: ServiceFlags =
        ServiceFlags(F_PERSISTENT | F_ONEPACKET | F_SCHED1 | F_SCHED2 | F_SCHED3);

    /// No flags.
    pub const fn empty() -> Self {
        ServiceFlags(0)
    }

    /// Flags from raw bits (unknown bits are kept).
    pub const fn from_bits(bits: u32) -> Self {
        ServiceFlags(bits)
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: ServiceFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the kernel reported the service as hashed.
    pub const fn is_hashed(self) -> bool {
        self.0 & F_HASHED != 0
    }

    /// These flags with `other` set too.
    pub const fn with(self, other: ServiceFlags) -> Self {
        ServiceFlags(self.0 | other.0)
    }

    fn comparable(self) -> u32 {
        self.0 & !F_HASHED
    }
}

impl std::ops::BitOr for ServiceFlags {
    type Output = ServiceFlags;
    fn bitor(self, rhs: Self) -> Self {
        ServiceFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for ServiceFlags {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl PartialEq for ServiceFlags {
    fn eq(&self, other: &Self) -> bool {
        self.comparable() == other.comparable()
    }
}

impl Eq for ServiceFlags {}

impl Hash for ServiceFlags {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.comparable().hash(state);
    }
}

/// Persistence granularity of a service: which client addresses share a persistence
/// template. Holds every value the kernel accepts, so a service read back and written
/// unchanged leaves the kernel as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Netmask {
    /// An IPv4 mask, sent as given: any 32 bits (the kernel keeps non-contiguous masks
    /// such as 255.0.255.0 as they are).
    V4(Ipv4Addr),
    /// An IPv6 prefix length; the kernel accepts 1..=128.
    V6Prefix(u8),
}

impl Netmask {
    /// The host netmask of a family: 255.255.255.255 or /128 (the default).
    pub fn host(family: AddressFamily) -> Netmask {
        match family {
            AddressFamily::Inet => Netmask::V4(Ipv4Addr::BROADCAST),
            AddressFamily::Inet6 => Netmask::V6Prefix(128),
        }
    }

    /// The netmask of a prefix length: 0..=32 for IPv4 (as a contiguous mask), 1..=128
    /// for IPv6.
    pub fn from_prefix(family: AddressFamily, len: u8) -> Result<Netmask, RangeError> {
        match family {
            AddressFamily::Inet => {
                RangeError::check("IPv4 netmask prefix length", len, 0..=32)?;
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                Ok(Netmask::V4(Ipv4Addr::from(mask)))
            }
            AddressFamily::Inet6 => {
                RangeError::check("IPv6 netmask prefix length", len, 1..=128)?;
                Ok(Netmask::V6Prefix(len))
            }
        }
    }

    /// An IPv4 netmask of prefix length `len` (0..=32).
    pub fn v4_prefix(len: u8) -> Result<Netmask, RangeError> {
        Netmask::from_prefix(AddressFamily::Inet, len)
    }

    /// An IPv6 netmask of prefix length `len` (1..=128).
    pub fn v6_prefix(len: u8) -> Result<Netmask, RangeError> {
        Netmask::from_prefix(AddressFamily::Inet6, len)
    }

    /// The family this netmask is for.
    pub fn family(&self) -> AddressFamily {
        match self {
            Netmask::V4(_) => AddressFamily::Inet,
            Netmask::V6Prefix(_) => AddressFamily::Inet6,
        }
    }

    /// The prefix length, or `None` for a non-contiguous IPv4 mask.
    pub fn prefix_len(&self) -> Option<u8> {
        match *self {
            Netmask::V4(mask) => {
                let bits = u32::from(mask);
                let ones = bits.leading_ones();
                (bits.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
            }
            Netmask::V6Prefix(len) => Some(len),
        }
    }
}

impl fmt::Display for Netmask {
    /// Formats like ipvsadm's `-M`: a dotted mask for IPv4, a prefix length for IPv6.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Netmask::V4(mask) => write!(f, "{mask}"),
            Netmask::V6Prefix(len) => write!(f, "{len}"),
        }
    }
}

/// Longest persistence timeout in seconds the kernel holds on every configuration: it keeps
/// `timeout × HZ` in 32 bits, and HZ is at most 1000 (a larger value wraps silently;
/// `ipvsadm` refuses it).
pub const MAX_PERSISTENCE_TIMEOUT: u32 = u32::MAX / 1000;

/// The configuration of a virtual service (what `add_service`/`update_service` send).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Service {
    /// What identifies the service.
    pub key: ServiceKey,
    /// Scheduling algorithm.
    pub scheduler: Scheduler,
    /// Flags (persistence, one-packet, scheduler flags).
    pub flags: ServiceFlags,
    /// Persistence timeout in seconds (meaningful with [`ServiceFlags::PERSISTENT`]), at most
    /// [`MAX_PERSISTENCE_TIMEOUT`].
    pub timeout: u32,
    /// Persistence granularity, of the service's family. Defaults to a host
    /// ([`Netmask::host`]).
    pub netmask: Netmask,
    /// Persistence engine (e.g. `sip`), if any.
    pub pe_name: Option<String>,
}

impl Service {
    /// A service with the given key and scheduler, no flags, no persistence, host netmask.
    pub fn new(key: ServiceKey, scheduler: Scheduler) -> Self {
        Service {
            netmask: Netmask::host(key.family()),
            key,
            scheduler,
            flags: ServiceFlags::empty(),
            timeout: 0,
            pe_name: None,
        }
    }

    /// Makes the service persistent for `timeout` seconds (at most
    /// [`MAX_PERSISTENCE_TIMEOUT`]; a larger value is refused when the service is sent).
    pub fn persistent(mut self, timeout: u32) -> Self {
        self.flags |= ServiceFlags::PERSISTENT;
        self.timeout = timeout;
        self
    }

    /// The same service with another persistence netmask (of the service's family; which
    /// client addresses share a persistence template).
    pub fn with_netmask(mut self, netmask: Netmask) -> Self {
        self.netmask = netmask;
        self
    }

    /// The same service with another scheduler.
    pub fn with_scheduler(mut self, scheduler: Scheduler) -> Self {
        self.scheduler = scheduler;
        self
    }

    /// The same service with exactly these flags (replacing the current ones).
    pub fn with_flags(mut self, flags: ServiceFlags) -> Self {
        self.flags = flags;
        self
    }

    /// The same service with these flags set too.
    pub fn with_flag(mut self, flag: ServiceFlags) -> Self {
        self.flags |= flag;
        self
    }

    /// One-packet scheduling (`ipvsadm -o`): the kernel schedules every UDP datagram on its
    /// own instead of keeping a connection entry.
    pub fn one_packet(self) -> Self {
        self.with_flag(ServiceFlags::ONE_PACKET)
    }

    /// `mh-fallback` (for the `mh` scheduler): the kernel picks another destination when
    /// the hashed one is unavailable (weight 0 or overloaded).
    pub fn mh_fallback(self) -> Self {
        self.with_flag(ServiceFlags::MH_FALLBACK)
    }

    /// `mh-port` (for the `mh` scheduler): the kernel hashes the source port too.
    pub fn mh_port(self) -> Self {
        self.with_flag(ServiceFlags::MH_PORT)
    }

    /// `sh-fallback` (for the `sh` scheduler): like [`mh_fallback`](Self::mh_fallback).
    pub fn sh_fallback(self) -> Self {
        self.with_flag(ServiceFlags::SH_FALLBACK)
    }

    /// `sh-port` (for the `sh` scheduler): like [`mh_port`](Self::mh_port).
    pub fn sh_port(self) -> Self {
        self.with_flag(ServiceFlags::SH_PORT)
    }

    /// The persistence timeout in seconds without changing the flags (at most
    /// [`MAX_PERSISTENCE_TIMEOUT`]); see [`persistent`](Self::persistent).
    pub fn with_timeout(mut self, timeout: u32) -> Self {
        self.timeout = timeout;
        self
    }

    /// A persistence engine (e.g. `sip`, module `ip_vs_pe_sip`): the kernel groups
    /// connections into persistence templates by what the engine extracts. At most 15
    /// bytes; the kernel answers `ENOENT` ([`Error::SchedulerNotFound`](crate::Error::SchedulerNotFound))
    /// when it has no such module.
    pub fn with_persistence_engine(mut self, name: impl Into<String>) -> Self {
        self.pe_name = Some(name.into());
        self
    }
}

/// A service as read from the kernel: its configuration and its statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    /// The configuration.
    pub service: Service,
    /// Traffic statistics (64-bit when the kernel sends them).
    pub stats: Stats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netmask_prefixes() {
        let v4 = |len| Netmask::v4_prefix(len).map(|m| m.to_string());
        assert_eq!(v4(0).as_deref(), Ok("0.0.0.0"));
        assert_eq!(v4(8).as_deref(), Ok("255.0.0.0"));
        assert_eq!(v4(24).as_deref(), Ok("255.255.255.0"));
        assert_eq!(v4(32).as_deref(), Ok("255.255.255.255"));
        assert!(Netmask::v4_prefix(33).is_err());
        assert!(Netmask::v6_prefix(0).is_err());
        assert!(Netmask::v6_prefix(129).is_err());
        assert_eq!(Netmask::v6_prefix(64), Ok(Netmask::V6Prefix(64)));
        for len in 0..=32 {
            assert_eq!(
                Netmask::v4_prefix(len).map(|m| m.prefix_len()),
                Ok(Some(len))
            );
        }
        let odd = Netmask::V4(Ipv4Addr::new(255, 0, 255, 0));
        assert_eq!(odd.prefix_len(), None);
        assert_ne!(odd, Netmask::v4_prefix(8).expect("valid"));
        assert_eq!(Netmask::host(AddressFamily::Inet6), Netmask::V6Prefix(128));
    }
}
