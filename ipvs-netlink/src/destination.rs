//! Real servers (destinations) of a virtual service.

use std::fmt;
use std::net::IpAddr;

use crate::{ForwardMethod, Stats};

/// Largest weight and largest upper threshold the kernel accepts (`INT_MAX`: it keeps the
/// weight in an `int`, and newer kernels refuse larger upper thresholds).
pub const MAX_WEIGHT: u32 = i32::MAX as u32;

/// Encapsulation of tunnel-forwarded packets (`IP_VS_CONN_F_TUNNEL_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum TunnelType {
    /// IP-in-IP (the default).
    #[default]
    Ipip,
    /// Generic UDP encapsulation.
    Gue,
    /// GRE.
    Gre,
}

impl TunnelType {
    /// Wire value.
    pub fn number(self) -> u8 {
        match self {
            TunnelType::Ipip => 0,
            TunnelType::Gue => 1,
            TunnelType::Gre => 2,
        }
    }

    /// The type for a wire value.
    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            0 => Some(TunnelType::Ipip),
            1 => Some(TunnelType::Gue),
            2 => Some(TunnelType::Gre),
            _ => None,
        }
    }
}

/// Tunnel encapsulation flags (`IP_VS_TUNNEL_ENCAP_FLAG_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TunnelFlags(pub u16);

impl TunnelFlags {
    /// No checksum (the default).
    pub const NOCSUM: TunnelFlags = TunnelFlags(0);
    /// Outer checksum.
    pub const CSUM: TunnelFlags = TunnelFlags(1 << 0);
    /// Remote checksum offload.
    pub const REMCSUM: TunnelFlags = TunnelFlags(1 << 1);
}

/// Tunnel parameters, used with [`ForwardMethod::Tunnel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Tunnel {
    /// Encapsulation.
    pub kind: TunnelType,
    /// Destination UDP port (GUE; must not be 0 with [`TunnelType::Gue`]).
    pub port: u16,
    /// Encapsulation flags.
    pub flags: TunnelFlags,
}

impl Tunnel {
    /// IP-in-IP, no checksum (the kernel's default).
    pub fn ipip() -> Self {
        Tunnel::default()
    }

    /// GRE encapsulation, no checksum.
    pub fn gre() -> Self {
        Tunnel {
            kind: TunnelType::Gre,
            ..Tunnel::default()
        }
    }

    /// Generic UDP encapsulation to `port` (not 0), no checksum.
    pub fn gue(port: u16) -> Self {
        Tunnel {
            kind: TunnelType::Gue,
            port,
            flags: TunnelFlags::NOCSUM,
        }
    }

    /// The same tunnel with another checksum mode.
    pub fn with_checksum(mut self, flags: TunnelFlags) -> Self {
        self.flags = flags;
        self
    }
}

/// A real server's configuration (what `add_destination`/`update_destination` send). Its
/// address family is the address's; it may differ from the service's only with tunnelling.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    /// Real server address.
    pub addr: IpAddr,
    /// Real server port (ignored by the kernel for fwmark services with port 0).
    pub port: u16,
    /// Forwarding method.
    pub forward: ForwardMethod,
    /// Weight (0 stops new connections), at most [`MAX_WEIGHT`].
    pub weight: u32,
    /// Upper connection threshold (0 = none), at most [`MAX_WEIGHT`].
    pub upper_threshold: u32,
    /// Lower connection threshold (0 = none); never above the upper threshold.
    pub lower_threshold: u32,
    /// Tunnel parameters.
    pub tunnel: Tunnel,
}

impl Destination {
    /// A masquerading (NAT) destination with weight 1 and no thresholds. (ipvsadm's default
    /// is direct routing, `-g`, for which it also sets the destination's port to the
    /// service's; this crate sends the port as given.)
    pub fn new(addr: IpAddr, port: u16) -> Self {
        Destination {
            addr,
            port,
            forward: ForwardMethod::Masquerade,
            weight: 1,
            upper_threshold: 0,
            lower_threshold: 0,
            tunnel: Tunnel::default(),
        }
    }

    /// The same destination with another weight.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The same destination with another forwarding method.
    pub fn with_forward(mut self, forward: ForwardMethod) -> Self {
        self.forward = forward;
        self
    }

    /// The same destination with another port.
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Connection thresholds: the kernel stops sending new connections when the
    /// destination has more than `upper` and resumes below `lower` (0 = no limit; `lower`
    /// must not exceed `upper`, both at most [`MAX_WEIGHT`]).
    pub fn with_thresholds(mut self, upper: u32, lower: u32) -> Self {
        self.upper_threshold = upper;
        self.lower_threshold = lower;
        self
    }

    /// The upper connection threshold alone (see [`with_thresholds`](Self::with_thresholds)).
    pub fn with_upper_threshold(mut self, upper: u32) -> Self {
        self.upper_threshold = upper;
        self
    }

    /// The lower connection threshold alone (see [`with_thresholds`](Self::with_thresholds)).
    pub fn with_lower_threshold(mut self, lower: u32) -> Self {
        self.lower_threshold = lower;
        self
    }

    /// Tunnel forwarding with these parameters (sets [`ForwardMethod::Tunnel`]).
    pub fn with_tunnel(mut self, tunnel: Tunnel) -> Self {
        self.forward = ForwardMethod::Tunnel;
        self.tunnel = tunnel;
        self
    }

    /// The tunnel's encapsulation (IPIP, GUE, GRE), keeping the other tunnel parameters.
    pub fn with_tunnel_type(mut self, kind: TunnelType) -> Self {
        self.tunnel.kind = kind;
        self
    }

    /// The tunnel's destination UDP port (needed, not 0, with [`TunnelType::Gue`]).
    pub fn with_tunnel_port(mut self, port: u16) -> Self {
        self.tunnel.port = port;
        self
    }

    /// The tunnel's checksum mode: [`TunnelFlags::NOCSUM`], [`TunnelFlags::CSUM`] or
    /// [`TunnelFlags::REMCSUM`].
    pub fn with_tunnel_checksum(mut self, flags: TunnelFlags) -> Self {
        self.tunnel.flags = flags;
        self
    }
}

/// What identifies a destination within its service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestinationKey {
    /// Real server address.
    pub addr: IpAddr,
    /// Real server port.
    pub port: u16,
}

impl From<&Destination> for DestinationKey {
    fn from(d: &Destination) -> Self {
        DestinationKey {
            addr: d.addr,
            port: d.port,
        }
    }
}

impl fmt::Display for DestinationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

/// A destination as read from the kernel: configuration, connection counts, statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationEntry {
    /// The configuration.
    pub destination: Destination,
    /// Active connections.
    pub active_conns: u32,
    /// Inactive connections.
    pub inactive_conns: u32,
    /// Persistent connection templates.
    pub persistent_conns: u32,
    /// Traffic statistics.
    pub stats: Stats,
}
