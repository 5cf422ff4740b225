//! Traffic statistics of services and destinations.

/// Counters and rate estimates (`struct ip_vs_stats64` semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stats {
    /// Connections scheduled.
    pub conns: u64,
    /// Incoming packets.
    pub in_packets: u64,
    /// Outgoing packets.
    pub out_packets: u64,
    /// Incoming bytes.
    pub in_bytes: u64,
    /// Outgoing bytes.
    pub out_bytes: u64,
    /// Current connection rate (per second).
    pub cps: u64,
    /// Current incoming packet rate.
    pub in_pps: u64,
    /// Current outgoing packet rate.
    pub out_pps: u64,
    /// Current incoming byte rate.
    pub in_bps: u64,
    /// Current outgoing byte rate.
    pub out_bps: u64,
}
