#![allow(clippy::unwrap_used)]

use ipvs_netlink::transport::encode;
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

use super::*;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Original tuple 10.0.0.1:40000 -> 10.96.0.10:53, UDP, as nested attributes (little-endian
/// lengths and types, big-endian ports), written out from the ctnetlink uapi layout.
const ORIG_TUPLE: [u8; 52] = [
    0x34, 0x00, 0x01, 0x80, // CTA_TUPLE_ORIG | NESTED, len 52
    0x14, 0x00, 0x01, 0x80, // CTA_TUPLE_IP | NESTED, len 20
    0x08, 0x00, 0x01, 0x00, 10, 0, 0, 1, // CTA_IP_V4_SRC
    0x08, 0x00, 0x02, 0x00, 10, 96, 0, 10, // CTA_IP_V4_DST
    0x1c, 0x00, 0x02, 0x80, // CTA_TUPLE_PROTO | NESTED, len 28
    0x05, 0x00, 0x01, 0x00, 17, 0, 0, 0, // CTA_PROTO_NUM udp + pad
    0x06, 0x00, 0x02, 0x00, 0x9c, 0x40, 0, 0, // CTA_PROTO_SRC_PORT 40000
    0x06, 0x00, 0x03, 0x00, 0x00, 0x35, 0, 0, // CTA_PROTO_DST_PORT 53
];

const REPLY_TUPLE: [u8; 52] = [
    0x34, 0x00, 0x02, 0x80, // CTA_TUPLE_REPLY | NESTED
    0x14, 0x00, 0x01, 0x80, //
    0x08, 0x00, 0x01, 0x00, 10, 244, 0, 5, // src: the endpoint
    0x08, 0x00, 0x02, 0x00, 10, 0, 0, 1, //
    0x1c, 0x00, 0x02, 0x80, //
    0x05, 0x00, 0x01, 0x00, 17, 0, 0, 0, //
    0x06, 0x00, 0x02, 0x00, 0x00, 0x35, 0, 0, //
    0x06, 0x00, 0x03, 0x00, 0x9c, 0x40, 0, 0, //
];

fn flow() -> ConntrackFlow {
    ConntrackFlow {
        protocol: 17,
        zone: 0,
        original: FlowTuple {
            source: sa("10.0.0.1:40000"),
            destination: sa("10.96.0.10:53"),
        },
        reply: FlowTuple {
            source: sa("10.244.0.5:53"),
            destination: sa("10.0.0.1:40000"),
        },
    }
}

#[test]
fn delete_request_matches_the_uapi_layout() {
    let bytes = encode(delete_request(&flow()), NLM_F_REQUEST | NLM_F_ACK, 7);
    let mut expected = vec![
        0x48, 0x00, 0x00, 0x00, // length 72
        0x02, 0x01, // type: CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE
        0x05, 0x00, // NLM_F_REQUEST | NLM_F_ACK
        0x07, 0x00, 0x00, 0x00, // sequence
        0x00, 0x00, 0x00, 0x00, // port id
        0x02, 0x00, 0x00, 0x00, // nfgenmsg: AF_INET, v0, res_id 0
    ];
    expected.extend_from_slice(&ORIG_TUPLE);
    assert_eq!(bytes, expected);
}

#[test]
fn delete_request_carries_a_nonzero_zone() {
    let mut f = flow();
    f.zone = 5;
    let bytes = encode(delete_request(&f), NLM_F_REQUEST | NLM_F_ACK, 1);
    assert_eq!(
        &bytes[bytes.len() - 8..],
        &[0x06, 0x00, 0x12, 0x00, 0x00, 0x05, 0, 0]
    );
    assert_eq!(bytes[0], 80);
}

#[test]
fn dump_request_is_a_bare_get_with_dump_flags() {
    let request = CtRequest {
        kind: IPCTNL_MSG_CT_GET,
        family: AF_INET6,
        attributes: Vec::new(),
    };
    let bytes = encode(request, NLM_F_REQUEST | NLM_F_DUMP, 9);
    assert_eq!(
        bytes,
        vec![
            20, 0, 0, 0, 0x01, 0x01, 0x01, 0x03, 9, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0
        ]
    );
}

#[test]
fn decodes_a_dump_entry_with_zone_and_unknown_attributes() {
    let mut payload = vec![0x02, 0x00, 0x00, 0x00];
    payload.extend_from_slice(&ORIG_TUPLE);
    payload.extend_from_slice(&REPLY_TUPLE);
    payload.extend_from_slice(&[0x08, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x8e]); // CTA_STATUS
    payload.extend_from_slice(&[0x06, 0x00, 0x12, 0x00, 0x00, 0x05, 0, 0]); // CTA_ZONE 5
    let decoded = decode_flow(&payload).unwrap().unwrap();
    let mut expected = flow();
    expected.zone = 5;
    assert_eq!(decoded, expected);
}

#[test]
fn entries_without_ports_are_skipped() {
    // ICMP: CTA_TUPLE_PROTO holds no ports.
    let tuple = |kind: u8| {
        vec![
            0x24, 0x00, kind, 0x80, //
            0x14, 0x00, 0x01, 0x80, //
            0x08, 0x00, 0x01, 0x00, 10, 0, 0, 1, //
            0x08, 0x00, 0x02, 0x00, 10, 0, 0, 2, //
            0x0c, 0x00, 0x02, 0x80, //
            0x05, 0x00, 0x01, 0x00, 1, 0, 0, 0, //
        ]
    };
    let mut payload = vec![0x02, 0x00, 0x00, 0x00];
    payload.extend(tuple(1));
    payload.extend(tuple(2));
    assert_eq!(decode_flow(&payload).unwrap(), None);
}

#[test]
fn malformed_attributes_are_an_error() {
    let payload = [0x02, 0x00, 0x00, 0x00, 0xff, 0x00, 0x01, 0x80, 0x00];
    assert!(decode_flow(&payload).is_err());
}

#[test]
fn memory_backend_deletes_matching_entries() {
    let mut keep = flow();
    keep.original.source = sa("10.0.0.2:40001");
    keep.reply.source = sa("10.244.0.6:53");
    let mut backend = MemoryConntrack {
        flows: vec![flow(), keep],
        ..MemoryConntrack::default()
    };
    let filter = FlowFilter::to_removed_endpoint(sa("10.96.0.10:53"), sa("10.244.0.5:53"));
    assert_eq!(backend.delete_flows(&[filter]).unwrap(), 1);
    assert_eq!(backend.flows, vec![keep]);
}
