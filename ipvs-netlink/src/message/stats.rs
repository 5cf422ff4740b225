//! Statistics attributes (`IPVS_STATS_ATTR_*`, nested in `*_ATTR_STATS` and
//! `*_ATTR_STATS64`).

use netlink_packet_core::{DecodeError, DefaultNla, Nla, NlaBuffer, Parseable};

use super::consts::*;
use super::{WireError, attributes};
use crate::Stats;

/// A counter as sent: 32 bits in most of the `STATS` set, 64 bits in `STATS64` (and for
/// the byte counters of both). The width is kept so that a parsed message is emitted
/// unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// A 32-bit value.
    U32(u32),
    /// A 64-bit value.
    U64(u64),
}

impl Counter {
    /// The value.
    pub fn get(self) -> u64 {
        match self {
            Counter::U32(v) => u64::from(v),
            Counter::U64(v) => v,
        }
    }

    fn len(self) -> usize {
        match self {
            Counter::U32(_) => 4,
            Counter::U64(_) => 8,
        }
    }

    fn emit(self, buffer: &mut [u8]) {
        match self {
            Counter::U32(v) => buffer.copy_from_slice(&v.to_ne_bytes()),
            Counter::U64(v) => buffer.copy_from_slice(&v.to_ne_bytes()),
        }
    }

    fn parse(v: &[u8]) -> Option<Counter> {
        match *v {
            [a, b, c, d] => Some(Counter::U32(u32::from_ne_bytes([a, b, c, d]))),
            [a, b, c, d, e, f, g, h] => {
                Some(Counter::U64(u64::from_ne_bytes([a, b, c, d, e, f, g, h])))
            }
            _ => None,
        }
    }
}

/// A statistics attribute. The kernel's 64-bit alignment padding (`PAD`) and counters of
/// neither 4 nor 8 bytes are kept as [`StatsAttr::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatsAttr {
    /// `CONNS`: connections scheduled.
    Conns(Counter),
    /// `INPKTS`: incoming packets.
    InPackets(Counter),
    /// `OUTPKTS`: outgoing packets.
    OutPackets(Counter),
    /// `INBYTES`: incoming bytes.
    InBytes(Counter),
    /// `OUTBYTES`: outgoing bytes.
    OutBytes(Counter),
    /// `CPS`: current connection rate.
    Cps(Counter),
    /// `INPPS`: current incoming packet rate.
    InPps(Counter),
    /// `OUTPPS`: current outgoing packet rate.
    OutPps(Counter),
    /// `INBPS`: current incoming byte rate.
    InBps(Counter),
    /// `OUTBPS`: current outgoing byte rate.
    OutBps(Counter),
    /// An attribute this library does not know (or `PAD`), kept as it came.
    Other(DefaultNla),
}

impl StatsAttr {
    fn counter(&self) -> Option<Counter> {
        match self {
            StatsAttr::Conns(c)
            | StatsAttr::InPackets(c)
            | StatsAttr::OutPackets(c)
            | StatsAttr::InBytes(c)
            | StatsAttr::OutBytes(c)
            | StatsAttr::Cps(c)
            | StatsAttr::InPps(c)
            | StatsAttr::OutPps(c)
            | StatsAttr::InBps(c)
            | StatsAttr::OutBps(c) => Some(*c),
            StatsAttr::Other(_) => None,
        }
    }
}

impl Nla for StatsAttr {
    fn value_len(&self) -> usize {
        match (self, self.counter()) {
            (_, Some(c)) => c.len(),
            (StatsAttr::Other(a), None) => a.value_len(),
            _ => 0,
        }
    }

    fn kind(&self) -> u16 {
        match self {
            StatsAttr::Conns(_) => IPVS_STATS_ATTR_CONNS,
            StatsAttr::InPackets(_) => IPVS_STATS_ATTR_INPKTS,
            StatsAttr::OutPackets(_) => IPVS_STATS_ATTR_OUTPKTS,
            StatsAttr::InBytes(_) => IPVS_STATS_ATTR_INBYTES,
            StatsAttr::OutBytes(_) => IPVS_STATS_ATTR_OUTBYTES,
            StatsAttr::Cps(_) => IPVS_STATS_ATTR_CPS,
            StatsAttr::InPps(_) => IPVS_STATS_ATTR_INPPS,
            StatsAttr::OutPps(_) => IPVS_STATS_ATTR_OUTPPS,
            StatsAttr::InBps(_) => IPVS_STATS_ATTR_INBPS,
            StatsAttr::OutBps(_) => IPVS_STATS_ATTR_OUTBPS,
            StatsAttr::Other(a) => a.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match (self, self.counter()) {
            (_, Some(c)) => c.emit(buffer),
            (StatsAttr::Other(a), None) => a.emit_value(buffer),
            _ => {}
        }
    }
}

impl<'a> Parseable<NlaBuffer<&'a [u8]>> for StatsAttr {
    fn parse(buf: &NlaBuffer<&'a [u8]>) -> Result<Self, DecodeError> {
        let Some(c) = Counter::parse(buf.value()) else {
            return Ok(StatsAttr::Other(DefaultNla::parse(buf)?));
        };
        Ok(match buf.kind() {
            IPVS_STATS_ATTR_CONNS => StatsAttr::Conns(c),
            IPVS_STATS_ATTR_INPKTS => StatsAttr::InPackets(c),
            IPVS_STATS_ATTR_OUTPKTS => StatsAttr::OutPackets(c),
            IPVS_STATS_ATTR_INBYTES => StatsAttr::InBytes(c),
            IPVS_STATS_ATTR_OUTBYTES => StatsAttr::OutBytes(c),
            IPVS_STATS_ATTR_CPS => StatsAttr::Cps(c),
            IPVS_STATS_ATTR_INPPS => StatsAttr::InPps(c),
            IPVS_STATS_ATTR_OUTPPS => StatsAttr::OutPps(c),
            IPVS_STATS_ATTR_INBPS => StatsAttr::InBps(c),
            IPVS_STATS_ATTR_OUTBPS => StatsAttr::OutBps(c),
            _ => StatsAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// The statistics a list of attributes carries (missing counters are 0).
pub fn stats(nlas: &[StatsAttr]) -> Stats {
    let mut s = Stats::default();
    for a in nlas {
        add(&mut s, a);
    }
    s
}

/// The statistics of a `STATS`/`STATS64` nest's value, read attribute by attribute
/// without building the list: the same as [`stats`] of the parsed list.
pub(crate) fn stats_of_nest(value: &[u8]) -> Result<Stats, WireError> {
    let mut s = Stats::default();
    for attr in attributes(value) {
        let attr = attr?;
        // What `StatsAttr::parse` makes of it: a counter of 4 or 8 bytes, anything else
        // an attribute of no kind known here.
        if let (Some(counter), Some(slot)) = (Counter::parse(attr.value), slot(&mut s, attr.kind)) {
            *slot = counter.get();
        }
    }
    Ok(s)
}

/// Sets the counter `a` carries in `s` (a later attribute of the same kind wins).
fn add(s: &mut Stats, a: &StatsAttr) {
    if let (Some(c), Some(slot)) = (a.counter(), slot(s, a.kind())) {
        *slot = c.get();
    }
}

/// The counter of `s` that the statistics attribute `kind` carries; `None` for a kind not
/// known here.
fn slot(s: &mut Stats, kind: u16) -> Option<&mut u64> {
    Some(match kind {
        IPVS_STATS_ATTR_CONNS => &mut s.conns,
        IPVS_STATS_ATTR_INPKTS => &mut s.in_packets,
        IPVS_STATS_ATTR_OUTPKTS => &mut s.out_packets,
        IPVS_STATS_ATTR_INBYTES => &mut s.in_bytes,
        IPVS_STATS_ATTR_OUTBYTES => &mut s.out_bytes,
        IPVS_STATS_ATTR_CPS => &mut s.cps,
        IPVS_STATS_ATTR_INPPS => &mut s.in_pps,
        IPVS_STATS_ATTR_OUTPPS => &mut s.out_pps,
        IPVS_STATS_ATTR_INBPS => &mut s.in_bps,
        IPVS_STATS_ATTR_OUTBPS => &mut s.out_bps,
        _ => return None,
    })
}
