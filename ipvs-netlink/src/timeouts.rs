//! Connection timeouts of the IPVS connection table (`ipvsadm --set`).

/// Longest timeout in seconds: 31 days, ipvsadm's limit for `--set`. The kernel keeps
/// `timeout × HZ` in an `int` and refuses more than `INT_MAX / HZ` seconds with
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (2,147,483 s where HZ is 1000,
/// 8,589,934 s where it is 250), as it refuses them to ipvsadm.
pub const MAX_TIMEOUT: u32 = 31 * 24 * 3600;

/// Timeouts in seconds, each at most [`MAX_TIMEOUT`]. When setting, 0 keeps the kernel's
/// current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Timeouts {
    /// Established TCP sessions.
    pub tcp: u32,
    /// TCP sessions after a FIN.
    pub tcp_fin: u32,
    /// UDP "sessions".
    pub udp: u32,
}

impl Timeouts {
    /// Timeouts in seconds for established TCP, TCP after FIN, and UDP (0 keeps the
    /// kernel's current value when setting).
    pub fn new(tcp: u32, tcp_fin: u32, udp: u32) -> Self {
        Timeouts { tcp, tcp_fin, udp }
    }
}
