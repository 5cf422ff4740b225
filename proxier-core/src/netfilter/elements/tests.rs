#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use ipnet::IpNet;

use super::*;
use crate::netfilter::{ClusterIpMasquerade, SourceRange};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn addr_port(address: &str, protocol: Protocol, port: u16) -> AddrPort {
    AddrPort {
        address: ip(address),
        protocol,
        port,
    }
}

fn family(family: AddressFamily) -> FamilyPlan {
    FamilyPlan::new(family, ClusterIpMasquerade::All)
}

fn v4_only(plan: FamilyPlan) -> NetfilterPlan {
    NetfilterPlan {
        v4: Some(plan),
        v6: None,
    }
}

fn changes(removed: FamilyPlan, added: FamilyPlan) -> PlanChanges {
    PlanChanges {
        removed: v4_only(removed),
        added: v4_only(added),
    }
}

#[test]
fn keys_are_laid_out_as_nft_lays_concatenations() {
    // 10.96.0.1 . tcp . 80: the address, the protocol byte, the port in network order,
    // each field padded to 4 bytes.
    assert_eq!(
        addr_port_key(&addr_port("10.96.0.1", Protocol::Tcp, 80)),
        [10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]
    );
    let v6 = addr_port_key(&addr_port("fd00::1", Protocol::Udp, 8080));
    assert_eq!(v6.len(), 24);
    assert_eq!(&v6[..2], &[0xfd, 0x00]);
    assert_eq!(v6[15], 1);
    assert_eq!(&v6[16..], &[17, 0, 0, 0, 0x1f, 0x90, 0, 0]);
    assert_eq!(
        proto_port_key(&ProtoPort {
            protocol: Protocol::Sctp,
            port: 30_000
        }),
        [132, 0, 0, 0, 0x75, 0x30, 0, 0]
    );
    // The endpoint's address twice, around its protocol and port.
    assert_eq!(
        hairpin_key(&addr_port("10.0.1.5", Protocol::Tcp, 8443)),
        [10, 0, 1, 5, 6, 0, 0, 0, 0x20, 0xfb, 0, 0, 10, 0, 1, 5]
    );
    // Marks are host-order integers: the high half, then the low.
    let digest = digest_key(0x0102_0304_a0b0_c0d0);
    assert_eq!(&digest[..4], &0x0102_0304u32.to_ne_bytes());
    assert_eq!(&digest[4..], &0xa0b0_c0d0u32.to_ne_bytes());
}

#[test]
fn a_service_change_becomes_deletes_then_adds_per_set_then_the_digest() {
    let mut removed = family(AddressFamily::V4);
    removed
        .cluster_ips
        .insert(addr_port("10.96.0.1", Protocol::Tcp, 80));
    removed.bound_ips.insert(ip("10.96.0.1"));
    let mut added = family(AddressFamily::V4);
    added
        .cluster_ips
        .insert(addr_port("10.96.0.2", Protocol::Tcp, 80));
    added.health_check_node_ports.insert(31_000);
    let plan = v4_only(family(AddressFamily::V4));
    let batch = ElementBatch::of(&plan, &changes(removed, added), Some(7), "t").unwrap();
    let ops: Vec<(&str, Op, usize)> = batch
        .ops
        .iter()
        .map(|op| (op.set, op.op, op.keys.len()))
        .collect();
    assert_eq!(
        ops,
        [
            ("cluster-ips", Op::Delete, 1),
            ("cluster-ips", Op::Add, 1),
            ("health-check-node-ports", Op::Add, 1),
            ("service-ips", Op::Delete, 1),
            (DIGEST_SET, Op::Flush, 0),
            (DIGEST_SET, Op::Add, 1),
        ]
    );
    // A single inet_service is its 2 bytes, a single address its 4.
    assert_eq!(batch.ops[2].keys, [vec![0x79, 0x18]]);
    assert_eq!(batch.ops[3].keys, [vec![10, 96, 0, 1]]);
    // Without a digest to store, the digest set is left alone.
    let plan = v4_only(family(AddressFamily::V4));
    let nothing = changes(family(AddressFamily::V4), family(AddressFamily::V4));
    assert!(
        ElementBatch::of(&plan, &nothing, None, "t")
            .unwrap()
            .is_empty()
    );
}

#[test]
fn interval_sets_a_family_coming_or_going_and_huge_updates_go_by_script() {
    let plan = v4_only(family(AddressFamily::V4));
    let mut ranges = family(AddressFamily::V4);
    ranges.source_ranges.insert(SourceRange {
        target: addr_port("192.0.2.1", Protocol::Tcp, 443),
        source: "198.51.100.0/24".parse::<IpNet>().unwrap(),
    });
    assert!(
        ElementBatch::of(
            &plan,
            &changes(family(AddressFamily::V4), ranges),
            None,
            "t"
        )
        .is_none()
    );
    let mut cidrs = family(AddressFamily::V4);
    cidrs
        .node_pod_cidrs
        .insert("10.244.1.0/24".parse::<IpNet>().unwrap());
    assert!(
        ElementBatch::of(&plan, &changes(cidrs, family(AddressFamily::V4)), None, "t").is_none()
    );
    let new_family = PlanChanges {
        removed: v4_only(family(AddressFamily::V4)),
        added: NetfilterPlan {
            v4: Some(family(AddressFamily::V4)),
            v6: Some(family(AddressFamily::V6)),
        },
    };
    assert!(ElementBatch::of(&plan, &new_family, None, "t").is_none());

    // 4,000 IPv6 hairpin elements (56 bytes each with their headers) pass one datagram.
    let mut many = family(AddressFamily::V6);
    for i in 0..4_000u16 {
        many.hairpin.insert(AddrPort {
            address: IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 1, i)),
            protocol: Protocol::Tcp,
            port: 80,
        });
    }
    let huge = PlanChanges {
        removed: NetfilterPlan {
            v4: None,
            v6: Some(family(AddressFamily::V6)),
        },
        added: NetfilterPlan {
            v4: None,
            v6: Some(many),
        },
    };
    assert!(ElementBatch::of(&plan, &huge, None, "t").is_none());
}

#[test]
fn a_set_of_many_elements_is_split_into_messages_the_16_bit_lengths_can_hold() {
    let mut added = family(AddressFamily::V4);
    for i in 0..2_500u32 {
        added.cluster_ips.insert(AddrPort {
            address: IpAddr::V4(std::net::Ipv4Addr::from(0x0a60_0000 + i)),
            protocol: Protocol::Tcp,
            port: 80,
        });
    }
    let plan = v4_only(family(AddressFamily::V4));
    let batch =
        ElementBatch::of(&plan, &changes(family(AddressFamily::V4), added), None, "t").unwrap();
    let messages = batch.messages();
    // Begin, 1,000 + 1,000 + 500 elements, end.
    assert_eq!(messages.len(), 5);
    for (message, _) in &messages[1..4] {
        assert!(message.body.len() < usize::from(u16::MAX));
    }
}

#[test]
fn the_batch_is_begin_elements_end_on_the_wire() {
    let mut removed = family(AddressFamily::V4);
    removed.bound_ips.insert(ip("10.96.0.9"));
    let plan = v4_only(family(AddressFamily::V4));
    let batch = ElementBatch::of(
        &plan,
        &changes(removed, family(AddressFamily::V4)),
        None,
        "ab",
    )
    .unwrap();
    let messages = batch.messages();
    assert_eq!(messages.len(), 3);
    // Begin and end: AF_UNSPEC, version 0, the nf_tables subsystem as res_id (big endian).
    let (begin, begin_flags) = &messages[0];
    assert_eq!(begin.message_type, 0x10);
    assert_eq!(begin.body, [0, 0, 0, 10]);
    assert_eq!(*begin_flags, NLM_F_REQUEST);
    assert_eq!(messages[2].0.message_type, 0x11);

    // DELSETELEM (subsystem 10 << 8 | 14) in family ip (2): table "ab", set "service-ips",
    // one element whose key is the address.
    let (delete, flags) = &messages[1];
    assert_eq!(delete.message_type, 0x0a0e);
    assert_eq!(*flags, NLM_F_REQUEST);
    let ne = |v: u16| v.to_ne_bytes();
    let mut want = vec![2, 0, 0, 0];
    want.extend(ne(7));
    want.extend(ne(1));
    want.extend(b"ab\0\0");
    want.extend(ne(16));
    want.extend(ne(2));
    want.extend(b"service-ips\0");
    // elements (nested) > element (nested) > key (nested) > value.
    want.extend(ne(20));
    want.extend(ne(0x8003));
    want.extend(ne(16));
    want.extend(ne(0x8001));
    want.extend(ne(12));
    want.extend(ne(0x8001));
    want.extend(ne(8));
    want.extend(ne(1));
    want.extend([10, 96, 0, 9]);
    assert_eq!(delete.body, want);
}

#[test]
fn additions_ask_to_create_and_flushes_carry_no_elements() {
    let plan = v4_only(family(AddressFamily::V4));
    let nothing = changes(family(AddressFamily::V4), family(AddressFamily::V4));
    let batch = ElementBatch::of(&plan, &nothing, Some(1), "t").unwrap();
    let messages = batch.messages();
    let (flush, flush_flags) = &messages[1];
    assert_eq!(flush.message_type, 0x0a0e);
    assert_eq!(*flush_flags, NLM_F_REQUEST);
    // nfgenmsg, table "t", set "plan-digest": no elements attribute.
    assert_eq!(flush.body.len(), 4 + 8 + 16);
    let (add, add_flags) = &messages[2];
    assert_eq!(add.message_type, 0x0a0c);
    assert_eq!(*add_flags, NLM_F_REQUEST | NLM_F_CREATE);
}

/// A `GETSETELEM` reply as the kernel lays it out: nfgenmsg, table, set, then the elements
/// (each a key, and flags the reader skips), written by hand here.
fn set_elements_reply(keys: &[&[u8]]) -> Vec<u8> {
    fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(4 + value.len()).unwrap().to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }
    let nested = |kind: u16, inner: Vec<u8>| attribute(kind | 0x8000, &inner);
    let mut elements = Vec::new();
    for key in keys {
        let value = nested(1, attribute(1, key));
        let flags = attribute(3, &0u32.to_be_bytes());
        elements.extend(nested(1, [value, flags].concat()));
    }
    let mut reply = vec![2, 0, 0, 0x2a];
    reply.extend(attribute(1, b"ipvs-proxier\0"));
    reply.extend(attribute(2, b"plan-digest\0"));
    reply.extend(nested(3, elements));
    reply
}

#[test]
fn the_digest_is_read_back_from_a_set_element_reply() {
    let digest = 0x0102_0304_a0b0_c0d0_u64;
    let mut keys = Vec::new();
    element_keys(&set_elements_reply(&[&digest_key(digest)]), &mut keys).unwrap();
    assert_eq!(keys, vec![digest_key(digest)]);
    assert_eq!(digest_of_key(&keys[0]), Some(digest));
    // Two elements, or a key of another size, hold no digest.
    let mut two = Vec::new();
    element_keys(
        &set_elements_reply(&[&digest_key(1), &digest_key(2)]),
        &mut two,
    )
    .unwrap();
    assert_eq!(two.len(), 2);
    assert_eq!(digest_of_key(&[1, 2, 3, 4]), None);
    // A reply without elements adds none; a truncated one is refused.
    let mut none = Vec::new();
    element_keys(&set_elements_reply(&[]), &mut none).unwrap();
    assert!(none.is_empty());
    assert!(element_keys(&[2, 0], &mut none).is_err());
}

#[test]
fn the_digest_is_asked_for_by_table_and_set() {
    let request = NftMessage::get_elements(10, "ipvs-proxier", "plan-digest");
    assert_eq!(request.message_type, 0x0a0d);
    assert_eq!(&request.body[..4], &[10, 0, 0, 0]);
    let mut names = Vec::new();
    for nla in NlasIterator::new(&request.body[4..]) {
        let nla = nla.unwrap();
        names.push((nla.kind(), nla.value().to_vec()));
    }
    assert_eq!(
        names,
        vec![
            (1, b"ipvs-proxier\0".to_vec()),
            (2, b"plan-digest\0".to_vec())
        ]
    );
}
