//! How IPVS forwards packets to a real server.

use std::fmt;

/// Packet forwarding method of a destination (`IP_VS_CONN_F_FWD_MASK` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ForwardMethod {
    /// NAT ("masquerading", `ipvsadm -m`), kube-proxy's choice.
    #[default]
    Masquerade,
    /// Local node (`IP_VS_CONN_F_LOCALNODE`).
    Local,
    /// IP-in-IP or other encapsulation (`ipvsadm -i`).
    Tunnel,
    /// Direct routing (`ipvsadm -g`).
    DirectRoute,
    /// Bypass (`IP_VS_CONN_F_BYPASS`), only ever reported by the kernel.
    Bypass,
}

impl ForwardMethod {
    /// The value in the low bits of `IPVS_DEST_ATTR_FWD_METHOD`.
    pub fn bits(self) -> u32 {
        match self {
            ForwardMethod::Masquerade => 0,
            ForwardMethod::Local => 1,
            ForwardMethod::Tunnel => 2,
            ForwardMethod::DirectRoute => 3,
            ForwardMethod::Bypass => 4,
        }
    }

    /// The method for the low bits of `IPVS_DEST_ATTR_FWD_METHOD` (mask `0x7`).
    pub fn from_bits(bits: u32) -> Option<Self> {
        match bits & 0x7 {
            0 => Some(ForwardMethod::Masquerade),
            1 => Some(ForwardMethod::Local),
            2 => Some(ForwardMethod::Tunnel),
            3 => Some(ForwardMethod::DirectRoute),
            4 => Some(ForwardMethod::Bypass),
            _ => None,
        }
    }
}

impl fmt::Display for ForwardMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The words ipvsadm prints in its "Forward" column.
        f.write_str(match self {
            ForwardMethod::Masquerade => "Masq",
            ForwardMethod::Local => "Local",
            ForwardMethod::Tunnel => "Tunnel",
            ForwardMethod::DirectRoute => "Route",
            ForwardMethod::Bypass => "Bypass",
        })
    }
}
