//! Statistics attributes (`*_ATTR_STATS` and `*_ATTR_STATS64`).

use super::WireError;
use super::attr::AttrIter;
use super::consts::*;
use crate::Stats;

/// Decodes a nested stats attribute. Values of 4 bytes (32-bit set) and 8 bytes (64-bit
/// set) are both accepted; `PAD` and unknown attributes are skipped.
pub fn decode_stats(buf: &[u8]) -> Result<Stats, WireError> {
    let mut s = Stats::default();
    for a in AttrIter::new(buf) {
        let (kind, v) = a?;
        let value = match v.len() {
            4 => u64::from(u32::from_ne_bytes([v[0], v[1], v[2], v[3]])),
            8 => u64::from_ne_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]),
            _ => continue,
        };
        match kind {
            IPVS_STATS_ATTR_CONNS => s.conns = value,
            IPVS_STATS_ATTR_INPKTS => s.in_packets = value,
            IPVS_STATS_ATTR_OUTPKTS => s.out_packets = value,
            IPVS_STATS_ATTR_INBYTES => s.in_bytes = value,
            IPVS_STATS_ATTR_OUTBYTES => s.out_bytes = value,
            IPVS_STATS_ATTR_CPS => s.cps = value,
            IPVS_STATS_ATTR_INPPS => s.in_pps = value,
            IPVS_STATS_ATTR_OUTPPS => s.out_pps = value,
            IPVS_STATS_ATTR_INBPS => s.in_bps = value,
            IPVS_STATS_ATTR_OUTBPS => s.out_bps = value,
            _ => {}
        }
    }
    Ok(s)
}
