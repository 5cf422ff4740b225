//! The kernel's text listing of a namespace's IPVS table (`/proc/net/ip_vs`), read for every
//! service's destinations at once.
//!
//! Generic netlink has no dump of every destination: a whole-table read makes one
//! destination dump per service, each a request, two kernel buffers and the IPVS family's
//! global lock (at 10,000 services, about two CPU-seconds in the test VM). The listing shows
//! every service with its destinations in one file the kernel writes under RCU, about a
//! seventh of that. It shows less than netlink does: a destination's address, port,
//! forwarding method, weight and connection counts, but no thresholds, tunnel settings or
//! statistics; a service's protocol, address, port, scheduler and persistence, but not its
//! flags, and a firewall-mark service without its address family. So a caller takes the
//! services from a netlink dump ([`IpvsHandle::services`](crate::IpvsHandle::services)) and
//! their destinations from here ([`IpvsHandle::listed_destinations`](crate::IpvsHandle::listed_destinations)).
//!
//! The listing is not atomic, and not always whole: the kernel hands it out a page at a
//! time, and ends each page counting every namespace's services in its global table but
//! resumes the next counting only this namespace's. So while other namespaces have IPVS
//! services it skips about one service of ours for each of theirs it walks past, and a
//! change in the namespace during the read can make it skip or repeat one (the last
//! showing is kept). It never shows a service with another's destinations (a service and
//! its destinations are one record). A caller reads a service the listing does not show
//! with a netlink dump.
//!
//! The format (`ip_vs_info_seq_show` in the kernel's `ip_vs_ctl.c`), after three header lines:
//!
//! ```text
//! TCP  0A600001:01BB rr
//!   -> 0A000001:192B      Masq    1      0          0
//! UDP  [fd00:0000:0000:0000:0000:0000:0000:000a]:0035 sh  persistent 75000 FFFFFFFF
//!   -> [fd00:0001:0000:0000:0000:0000:0000:0001]:0035      Route   0      2          5
//! FWM  00000010 rr
//! ```
//!
//! IPv4 addresses and ports are in hexadecimal, IPv6 addresses in full; a destination line
//! belongs to the service line above it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::forward::ForwardMethod;
use crate::protocol::Protocol;
use crate::service::ServiceKey;

/// A destination as the listing shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedDestination {
    /// Real server address.
    pub addr: IpAddr,
    /// Real server port.
    pub port: u16,
    /// Forwarding method.
    pub forward: ForwardMethod,
    /// Scheduling weight.
    pub weight: u32,
    /// Active connections.
    pub active_conns: u32,
    /// Inactive connections.
    pub inactive_conns: u32,
}

/// Every (address, port, protocol) service the listing shows, with its destinations, in the
/// order shown. Firewall-mark services, and services of a protocol this crate does not know,
/// are left out with their destinations.
pub type Listing = Vec<(ServiceKey, Vec<ListedDestination>)>;

/// A listing that does not read as the kernel writes it: the line (1-based) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("/proc/net/ip_vs line {line}: {reason}")]
pub struct ListingError {
    /// The line, counted from 1.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

/// The three lines the kernel writes before the first service.
const HEADER_LINES: usize = 3;

/// Parses a whole listing (see the module documentation for the format).
pub fn parse_listing(text: &str) -> Result<Listing, ListingError> {
    let mut listing: Listing = Vec::new();
    // Whether a service line came yet, and whether the last one was kept (its destinations
    // follow it).
    let (mut any_service, mut keeping) = (false, false);
    for (index, line) in text.lines().enumerate().skip(HEADER_LINES) {
        let failed = |reason: String| ListingError {
            line: index + 1,
            reason,
        };
        let mut fields = line.split_ascii_whitespace();
        let Some(first) = fields.next() else {
            continue;
        };
        if first == "->" {
            let destination = destination(fields).map_err(failed)?;
            if !any_service {
                return Err(failed("a destination before any service".into()));
            }
            if keeping && let Some((_, destinations)) = listing.last_mut() {
                destinations.push(destination);
            }
            continue;
        }
        any_service = true;
        let protocol = match first {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            // A firewall-mark service (its family is not shown) or another protocol.
            _ => {
                keeping = false;
                continue;
            }
        };
        let Some(address) = fields.next() else {
            return Err(failed("a service line without its address".into()));
        };
        let (addr, port) = endpoint(address).map_err(failed)?;
        let key = ServiceKey::Tuple {
            addr,
            port,
            protocol,
        };
        listing.push((key, Vec::new()));
        keeping = true;
    }
    Ok(last_showings(listing))
}

/// Counts the service lines in `chunk`, the next bytes of a listing read in pieces: lines
/// that start with something other than a space, the two header lines that do among them
/// (`IP Virtual Server ...`, `Prot LocalAddress:Port ...`) when `chunk` holds them.
/// `at_line_start` carries, from one piece to the next, whether the next byte starts a line
/// (`true` before the first piece).
pub(crate) fn count_line_starts(chunk: &[u8], at_line_start: &mut bool) -> usize {
    let mut count = 0;
    for &byte in chunk {
        if *at_line_start && byte != b' ' && byte != b'\n' {
            count += 1;
        }
        *at_line_start = byte == b'\n';
    }
    count
}

/// How many of a listing's lines counted by [`count_line_starts`] are its header's.
pub(crate) const HEADER_LINE_STARTS: usize = 2;

/// A service shown more than once (the listing resumed at a shifted position) counts as
/// last shown, in that place.
fn last_showings(listing: Listing) -> Listing {
    let mut seen = std::collections::HashSet::with_capacity(listing.len());
    let mut kept: Listing = listing
        .into_iter()
        .rev()
        .filter(|(key, _)| seen.insert(*key))
        .collect();
    kept.reverse();
    kept
}

/// The fields of a destination line after `->`.
fn destination<'a>(mut fields: impl Iterator<Item = &'a str>) -> Result<ListedDestination, String> {
    let mut next = |what: &str| {
        fields
            .next()
            .ok_or_else(|| format!("a destination line without its {what}"))
    };
    let (addr, port) = endpoint(next("address")?)?;
    let forward = match next("forwarding method")? {
        "Masq" => ForwardMethod::Masquerade,
        "Route" => ForwardMethod::DirectRoute,
        "Tunnel" => ForwardMethod::Tunnel,
        "Local" => ForwardMethod::Local,
        other => return Err(format!("unknown forwarding method {other:?}")),
    };
    let mut number = |what: &str| -> Result<u32, String> {
        let field = next(what)?;
        field
            .parse()
            .map_err(|_| format!("{what} {field:?} is not a count"))
    };
    Ok(ListedDestination {
        addr,
        port,
        forward,
        weight: number("weight")?,
        active_conns: number("active connections")?,
        inactive_conns: number("inactive connections")?,
    })
}

/// `0A600001:01BB` or `[fd00:…:000a]:01BB`.
fn endpoint(field: &str) -> Result<(IpAddr, u16), String> {
    let bad = || format!("{field:?} is not an address and port");
    let (address, port) = field.rsplit_once(':').ok_or_else(bad)?;
    let port = u16::from_str_radix(port, 16).map_err(|_| bad())?;
    let addr = match address.strip_prefix('[') {
        Some(v6) => {
            let v6 = v6.strip_suffix(']').ok_or_else(bad)?;
            IpAddr::V6(v6.parse::<Ipv6Addr>().map_err(|_| bad())?)
        }
        None if address.len() == 8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(address, 16).map_err(|_| bad())?,
        )),
        None => return Err(bad()),
    };
    Ok((addr, port))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HEADER: &str = "IP Virtual Server version 1.2.1 (size=4096)\n\
        Prot LocalAddress:Port Scheduler Flags\n  \
        -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n";

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    fn dest(addr: IpAddr, port: u16, forward: ForwardMethod, weight: u32) -> ListedDestination {
        ListedDestination {
            addr,
            port,
            forward,
            weight,
            active_conns: 0,
            inactive_conns: 0,
        }
    }

    #[test]
    fn services_and_their_destinations_are_read_as_the_kernel_writes_them() {
        // Lines as the 6.1 kernel wrote them for a table made with ipvsadm (trailing
        // blanks included), and an IPv6 service in the format of its source.
        let text = format!(
            "{HEADER}TCP  0A600001:01BB rr  \n  \
             -> 0A000003:01BB      Tunnel  65535  0          0         \n  \
             -> 0A000001:192B      Masq    1      3          12        \n\
             UDP  0A60000A:0035 sh  persistent 75000 FFFFFFFF\n\
             TCP  0A60001E:0050 rr  \n\
             FWM  00000010 rr \n  \
             -> 0A000301:0000      Route   1      0          0         \n\
             TCP  [fd00:0000:0000:0000:0000:0000:0000:000a]:0050 rr  \n  \
             -> [fd00:0001:0000:0000:0000:0000:0000:0001]:1F90      Local   0      0          0         \n"
        );
        let listing = parse_listing(&text).unwrap();
        let v6 = |s: &str| IpAddr::V6(s.parse().unwrap());
        let mut first = dest(v4(10, 0, 0, 1), 6443, ForwardMethod::Masquerade, 1);
        first.active_conns = 3;
        first.inactive_conns = 12;
        assert_eq!(
            listing,
            vec![
                (
                    ServiceKey::tcp(v4(10, 96, 0, 1), 443),
                    vec![
                        dest(v4(10, 0, 0, 3), 443, ForwardMethod::Tunnel, 65535),
                        first,
                    ]
                ),
                (ServiceKey::udp(v4(10, 96, 0, 10), 53), vec![]),
                (ServiceKey::tcp(v4(10, 96, 0, 30), 80), vec![]),
                // The firewall-mark service and its destination are left out.
                (
                    ServiceKey::tcp(v6("fd00::a"), 80),
                    vec![dest(v6("fd00:1::1"), 8080, ForwardMethod::Local, 0)]
                ),
            ]
        );
    }

    #[test]
    fn a_service_shown_twice_counts_as_last_shown() {
        let text = format!(
            "{HEADER}TCP  0A600001:0050 rr\n  -> 0A000001:0050 Masq 1 0 0\n\
             TCP  0A600002:0050 rr\n\
             TCP  0A600001:0050 rr\n  -> 0A000002:0050 Masq 2 0 0\n"
        );
        let listing = parse_listing(&text).unwrap();
        assert_eq!(
            listing,
            vec![
                (ServiceKey::tcp(v4(10, 96, 0, 2), 80), vec![]),
                (
                    ServiceKey::tcp(v4(10, 96, 0, 1), 80),
                    vec![dest(v4(10, 0, 0, 2), 80, ForwardMethod::Masquerade, 2)]
                ),
            ]
        );
    }

    #[test]
    fn an_empty_table_lists_nothing() {
        assert_eq!(parse_listing(HEADER).unwrap(), Vec::new());
        assert_eq!(parse_listing("").unwrap(), Vec::new());
    }

    #[test]
    fn a_line_the_kernel_would_not_write_is_an_error_naming_it() {
        for (bad, line, says) in [
            ("TCP  0A6000:0050 rr\n", 4, "not an address and port"),
            ("TCP\n", 4, "without its address"),
            (
                "TCP  0A600001:0050 rr\n  -> 0A000001:0050 Masq\n",
                5,
                "without its weight",
            ),
            (
                "TCP  0A600001:0050 rr\n  -> 0A000001:0050 Magic 1 0 0\n",
                5,
                "forwarding method",
            ),
            (
                "TCP  0A600001:0050 rr\n  -> 0A000001:0050 Masq -1 0 0\n",
                5,
                "not a count",
            ),
            ("TCP  [fd00::1:0050 rr\n", 4, "not an address and port"),
            ("  -> 0A000001:0050 Masq 1 0 0\n", 4, "before any service"),
        ] {
            let error = parse_listing(&format!("{HEADER}{bad}")).unwrap_err();
            assert_eq!(error.line, line, "{bad:?}: {error}");
            assert!(error.to_string().contains(says), "{bad:?}: {error}");
        }
    }

    #[test]
    fn service_lines_are_counted_across_the_pieces_of_a_read() {
        let listing = "IP Virtual Server version 1.2.1 (size=4096)\n\
                       Prot LocalAddress:Port Scheduler Flags\n\
                       \x20 -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n\
                       TCP  0A600001:01BB rr\n\
                       \x20 -> 0A000001:192B      Masq    1      0          0\n\
                       UDP  [fd00:0000:0000:0000:0000:0000:0000:000a]:0035 sh  persistent 75000 FFFFFFFF\n\
                       \x20 -> [fd00:0001:0000:0000:0000:0000:0000:0001]:0035      Route   0      2          5\n\
                       FWM  00000010 rr\n";
        assert_eq!(
            parse_listing(listing).unwrap().len(),
            2,
            "the tuple services"
        );
        for piece in [1, 2, 3, 7, 64, listing.len()] {
            let mut at_line_start = true;
            let counted: usize = listing
                .as_bytes()
                .chunks(piece)
                .map(|chunk| count_line_starts(chunk, &mut at_line_start))
                .sum();
            assert_eq!(
                counted - HEADER_LINE_STARTS,
                3,
                "pieces of {piece} bytes: TCP, UDP and FWM"
            );
        }
    }
}
