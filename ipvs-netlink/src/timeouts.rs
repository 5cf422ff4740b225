//! Connection timeouts of the IPVS connection table (`ipvsadm --set`).

/// Timeouts in seconds. When setting, 0 keeps the kernel's current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Timeouts {
    /// Established TCP sessions.
    pub tcp: u32,
    /// TCP sessions after a FIN.
    pub tcp_fin: u32,
    /// UDP "sessions".
    pub udp: u32,
}
