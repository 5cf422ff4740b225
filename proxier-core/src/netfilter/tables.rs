//! The nf_tables tables present, listed over nfnetlink (an `NFT_MSG_GETTABLE` dump): one
//! message per table, whatever the tables hold.
//!
//! `nft list tables` is not that cheap: nft 1.0.6 (Debian 12) fills its whole cache first,
//! every set element included. In the VM, on an idle node with a table shaped like ours at
//! 10,000 Services (70,000 set elements) it took 3.0 s, against 57 ms for `nft list set` of
//! the one-element digest set; and a full resync lists the tables every period.
//!
//! The request and the replies are encoded here on netlink-packet-core's attribute buffers,
//! as [`crate::conntrack`] does for ctnetlink; the socket is ipvs-netlink's transport.

use std::collections::BTreeSet;
use std::io;

use ipvs_netlink::transport::NetlinkSocket;
use netlink_packet_core::{NetlinkSerializable, NlasIterator};
use netlink_sys::protocols::NETLINK_NETFILTER;

/// The nfnetlink subsystem of nf_tables (`NFNL_SUBSYS_NFTABLES`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// Get (here: dump) tables.
const NFT_MSG_GETTABLE: u16 = 1;
/// A table's name (a NUL-terminated string).
const NFTA_TABLE_NAME: u16 = 1;
/// `struct nfgenmsg`: family, version, resource id.
const NFGENMSG_LEN: usize = 4;
/// Every family (`NFPROTO_UNSPEC`).
const NFPROTO_UNSPEC: u8 = 0;
const NFNETLINK_V0: u8 = 0;

/// The dump request: an nfgenmsg asking for the tables of every family.
struct GetTables;

impl NetlinkSerializable for GetTables {
    fn message_type(&self) -> u16 {
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE
    }

    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[..NFGENMSG_LEN].copy_from_slice(&[NFPROTO_UNSPEC, NFNETLINK_V0, 0, 0]);
    }
}

/// nft's name of an nf_tables family (`NFPROTO_*`), as `nft list tables` prints it.
fn family_name(family: u8) -> Option<&'static str> {
    Some(match family {
        1 => "inet",
        2 => "ip",
        3 => "arp",
        5 => "netdev",
        7 => "bridge",
        10 => "ip6",
        _ => return None,
    })
}

/// One reply of the dump as `family name` (`ip ipvs-proxier`); `None` for a reply without a
/// name or of a family nft has no name for.
fn decode_table(payload: &[u8]) -> Result<Option<String>, String> {
    let (Some(&family), Some(attributes)) = (payload.first(), payload.get(NFGENMSG_LEN..)) else {
        return Err("short nfgenmsg".to_owned());
    };
    for nla in NlasIterator::new(attributes) {
        let nla = nla.map_err(|e| format!("attribute: {e}"))?;
        if nla.kind() == NFTA_TABLE_NAME {
            let name = nla.value().split(|b| *b == 0).next().unwrap_or_default();
            let name = std::str::from_utf8(name).map_err(|e| format!("table name: {e}"))?;
            return Ok(family_name(family).map(|family| format!("{family} {name}")));
        }
    }
    Ok(None)
}

/// Opens an nfnetlink socket in the calling thread's network namespace (as a child `nft`
/// started there would list that namespace's tables).
///
/// Page-sized receive buffers: the socket reads acknowledgements (capped, no request
/// echoed) and the dump of a few tables, never a long dump. With 32 KiB ones the element
/// socket, kept between syncs, held 1 MiB of receive buffers (32 datagrams of 32 KiB) for
/// the daemon's life from its first element batch on: in the VM's soak at 10,000 Services,
/// the heap grew by 1.0 MiB in the first seconds of churn, most of the RSS growth the
/// soak measured (dhat, a snapshot at convergence and one a minute later).
pub(super) fn open() -> io::Result<NetlinkSocket> {
    NetlinkSocket::open_page_sized(NETLINK_NETFILTER)
}

/// Every table present, each as `family name`, as [`super::parse_table_list`] reads them
/// from `nft list tables`.
pub(super) fn list(socket: &mut NetlinkSocket) -> io::Result<BTreeSet<String>> {
    let mut tables = BTreeSet::new();
    let mut malformed = None;
    let answer = socket.dump(GetTables, |reply| {
        if malformed.is_none() {
            match decode_table(reply.payload) {
                Ok(Some(table)) => {
                    tables.insert(table);
                }
                Ok(None) => {}
                Err(detail) => malformed = Some(detail),
            }
        }
    })?;
    if let Err(errno) = answer {
        return Err(io::Error::from_raw_os_error(errno));
    }
    if let Some(detail) = malformed {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a table in the dump: {detail}"),
        ));
    }
    Ok(tables)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as the kernel builds it: nfgenmsg, then the attributes (4-byte aligned).
    fn reply(family: u8, attributes: &[(u16, &[u8])]) -> Vec<u8> {
        let mut out = vec![family, NFNETLINK_V0, 0, 0];
        for (kind, value) in attributes {
            let length = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&length.to_ne_bytes());
            out.extend_from_slice(&kind.to_ne_bytes());
            out.extend_from_slice(value);
            out.resize((out.len() + 3) & !3, 0);
        }
        out
    }

    #[test]
    fn a_reply_names_its_table_with_nfts_family_word() {
        let flags = 0u32.to_be_bytes();
        let cases = [
            (2, "ip ipvs-proxier"),
            (10, "ip6 ipvs-proxier"),
            (1, "inet ipvs-proxier"),
            (7, "bridge ipvs-proxier"),
        ];
        for (family, want) in cases {
            // The name comes after another attribute and keeps its NUL.
            let payload = reply(family, &[(2, &flags), (NFTA_TABLE_NAME, b"ipvs-proxier\0")]);
            assert_eq!(decode_table(&payload), Ok(Some(want.to_owned())));
        }
    }

    #[test]
    fn replies_without_a_name_or_a_known_family_are_skipped_and_short_ones_refused() {
        assert_eq!(decode_table(&reply(2, &[(2, &[0; 4])])), Ok(None));
        assert_eq!(
            decode_table(&reply(4, &[(NFTA_TABLE_NAME, b"x\0")])),
            Ok(None)
        );
        assert!(decode_table(&[2, 0]).is_err());
    }

    #[test]
    fn the_request_asks_for_every_family_of_nf_tables() {
        let mut buffer = [0xff; NFGENMSG_LEN];
        GetTables.serialize(&mut buffer);
        assert_eq!(buffer, [0, 0, 0, 0]);
        assert_eq!(GetTables.message_type(), 0x0a01);
    }
}
