//! Connection timeouts of the IPVS connection table (`ipvsadm --set`).

/// Longest timeout in seconds the kernel accepts on every configuration: it keeps
/// `timeout × HZ` in an `int` and refuses larger values (`INT_MAX / HZ`, HZ at most 1000).
pub const MAX_TIMEOUT: u32 = i32::MAX as u32 / 1000;

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
