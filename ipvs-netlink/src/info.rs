//! Global IPVS facts (`IPVS_CMD_GET_INFO`).

use std::fmt;

/// The kernel's IPVS version and connection table size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Info {
    /// Version as `0x00MMmmpp` (e.g. `0x010201` for 1.2.1).
    pub version: u32,
    /// Number of connection hash table buckets.
    pub conn_table_size: u32,
}

impl Info {
    /// The version as (major, minor, patch).
    pub fn version_triple(&self) -> (u8, u8, u8) {
        let [_, major, minor, patch] = self.version.to_be_bytes();
        (major, minor, patch)
    }
}

impl fmt::Display for Info {
    /// Like ipvsadm's header: `IP Virtual Server version 1.2.1 (size=4096)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = self.version_triple();
        write!(
            f,
            "IP Virtual Server version {a}.{b}.{c} (size={})",
            self.conn_table_size
        )
    }
}
