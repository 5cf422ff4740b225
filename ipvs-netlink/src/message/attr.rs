//! Netlink attribute (TLV) writing and tolerant reading.
//!
//! Layout (`struct nlattr`): `u16 nla_len` (header + value, unpadded), `u16 nla_type`,
//! then the value padded to a multiple of 4 bytes. Integers are host order (little-endian on
//! the machines this targets) unless the attribute is documented as big-endian (ports, IPv4
//! netmask).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::WireError;

/// `NLA_F_NESTED`: set by some senders on nested attributes.
const NLA_F_NESTED: u16 = 0x8000;
/// Mask selecting the attribute type.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// Rounds up to the 4-byte netlink alignment.
pub(crate) fn align4(len: usize) -> usize {
    (len + 3) & !3
}

/// Appends attributes to a byte buffer.
#[derive(Debug, Default)]
pub(crate) struct AttrWriter {
    pub(crate) buf: Vec<u8>,
}

impl AttrWriter {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn bytes(&mut self, kind: u16, value: &[u8]) {
        let len = 4 + value.len();
        // Attribute values we emit are all tiny; saturate rather than wrap if misused.
        let len16 = u16::try_from(len).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len16.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(self.buf.len() + (align4(len) - len), 0);
    }

    pub(crate) fn u8(&mut self, kind: u16, v: u8) {
        self.bytes(kind, &[v]);
    }

    pub(crate) fn u16(&mut self, kind: u16, v: u16) {
        self.bytes(kind, &v.to_ne_bytes());
    }

    pub(crate) fn be16(&mut self, kind: u16, v: u16) {
        self.bytes(kind, &v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, kind: u16, v: u32) {
        self.bytes(kind, &v.to_ne_bytes());
    }

    /// A NUL-terminated string.
    pub(crate) fn string(&mut self, kind: u16, s: &str) {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.bytes(kind, &v);
    }

    /// An address as `union nf_inet_addr` (16 bytes; IPv4 in the first 4).
    pub(crate) fn inet_addr(&mut self, kind: u16, addr: IpAddr) {
        let mut v = [0u8; 16];
        match addr {
            IpAddr::V4(a) => v[..4].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => v.copy_from_slice(&a.octets()),
        }
        self.bytes(kind, &v);
    }

    /// A nested attribute whose content `f` writes.
    pub(crate) fn nested(&mut self, kind: u16, f: impl FnOnce(&mut AttrWriter)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        f(self);
        let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }
}

/// Iterates over attributes; stops with an error at the first malformed header.
pub(crate) struct AttrIter<'a> {
    rest: &'a [u8],
    failed: bool,
}

impl<'a> AttrIter<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self {
            rest: buf,
            failed: false,
        }
    }
}

impl<'a> Iterator for AttrIter<'a> {
    type Item = Result<(u16, &'a [u8]), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.len() < 4 {
            // Fewer than 4 trailing bytes can only be padding.
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([self.rest[0], self.rest[1]]));
        let kind = u16::from_ne_bytes([self.rest[2], self.rest[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > self.rest.len() {
            self.failed = true;
            return Some(Err(WireError::new(format!(
                "attribute type {kind} has length {len} with {} bytes left",
                self.rest.len()
            ))));
        }
        let value = &self.rest[4..len];
        let advance = align4(len).min(self.rest.len());
        self.rest = &self.rest[advance..];
        Some(Ok((kind, value)))
    }
}

/// Whether the type field had `NLA_F_NESTED` (kept for completeness of the layout).
#[allow(dead_code)]
pub(crate) fn is_nested(kind_field: u16) -> bool {
    kind_field & NLA_F_NESTED != 0
}

fn fixed<const N: usize>(what: &str, v: &[u8]) -> Result<[u8; N], WireError> {
    v.get(..N)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or_else(|| WireError::new(format!("{what}: need {N} bytes, got {}", v.len())))
}

pub(crate) fn get_u8(what: &str, v: &[u8]) -> Result<u8, WireError> {
    Ok(fixed::<1>(what, v)?[0])
}

pub(crate) fn get_u16(what: &str, v: &[u8]) -> Result<u16, WireError> {
    Ok(u16::from_ne_bytes(fixed(what, v)?))
}

pub(crate) fn get_be16(what: &str, v: &[u8]) -> Result<u16, WireError> {
    Ok(u16::from_be_bytes(fixed(what, v)?))
}

pub(crate) fn get_u32(what: &str, v: &[u8]) -> Result<u32, WireError> {
    Ok(u32::from_ne_bytes(fixed(what, v)?))
}

/// A string, up to the first NUL (or the end of the value).
pub(crate) fn get_string(what: &str, v: &[u8]) -> Result<String, WireError> {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    String::from_utf8(v[..end].to_vec()).map_err(|_| WireError::new(format!("{what}: not UTF-8")))
}

/// An address of the given family from a value of 4 or 16 bytes.
pub(crate) fn get_addr(what: &str, family: u16, v: &[u8]) -> Result<IpAddr, WireError> {
    match family {
        super::consts::AF_INET => Ok(IpAddr::V4(Ipv4Addr::from(fixed::<4>(what, v)?))),
        super::consts::AF_INET6 => Ok(IpAddr::V6(Ipv6Addr::from(fixed::<16>(what, v)?))),
        other => Err(WireError::new(format!(
            "{what}: unknown address family {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iter_rejects_bad_lengths_without_panicking() {
        let bad = [0xff, 0xff, 1, 0, 0, 0, 0, 0];
        let items: Vec<_> = AttrIter::new(&bad).collect();
        assert_eq!(items.len(), 1);
        assert!(items[0].is_err());
        let short = [3u8, 0, 1, 0];
        assert!(AttrIter::new(&short).next().is_some_and(|r| r.is_err()));
    }

    #[test]
    fn iter_handles_unpadded_tail() {
        // One u8 attribute (len 5) with its padding cut off by the buffer end.
        let buf = [5u8, 0, 7, 0, 42];
        let items: Vec<_> = AttrIter::new(&buf)
            .collect::<Result<_, _>>()
            .expect("valid");
        assert_eq!(items, vec![(7u16, &[42u8][..])]);
    }
}
