//! Golden bytes for encoding and decoding. The expected bytes are written by hand from
//! the layout in the kernel's `include/uapi/linux/ip_vs.h` and `struct nlattr` (u16 length
//! without padding, u16 type, value padded to 4), not produced by this encoder.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::consts::*;
use super::*;
use crate::batch::Op;
use crate::destination::{Destination, DestinationKey, TunnelFlags, TunnelType};
use crate::service::{AddressFamily, Netmask, Service, ServiceFlags, ServiceKey};
use crate::sync_daemon::{SyncDaemon, SyncState};
use crate::{ForwardMethod, Protocol, Scheduler, Timeouts};

/// Parses "0a 00 ff" style hex, ignoring whitespace and `|` separators.
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).expect("ascii"), 16).expect("hex"))
        .collect()
}

/// The emitted attributes of a message.
trait Attrs {
    fn attrs(&self) -> Vec<u8>;
}

impl Attrs for IpvsMessage {
    fn attrs(&self) -> Vec<u8> {
        self.to_bytes()
    }
}

/// A message parsed from attribute bytes (which must parse).
fn raw(cmd: u8, attrs: Vec<u8>) -> IpvsMessage {
    IpvsMessage::parse(cmd, &attrs).expect("parses")
}

// The decoders of the domain types, from nested attribute bytes or from messages.
fn decode_service(buf: &[u8]) -> Result<ServiceEntry, WireError> {
    service_entry(&parse_nlas::<ServiceAttr>(buf)?)
}

fn decode_destination(buf: &[u8], family: AddressFamily) -> Result<DestinationEntry, WireError> {
    destination_entry(&parse_nlas::<DestAttr>(buf)?, family)
}

fn decode_stats(buf: &[u8]) -> Result<crate::Stats, WireError> {
    Ok(stats(&parse_nlas::<StatsAttr>(buf)?))
}

fn decode_service_message(msg: &IpvsMessage) -> Result<ServiceEntry, WireError> {
    msg.service_entry()
}

fn decode_dest_message(msg: &IpvsMessage, key: &ServiceKey) -> Result<DestinationEntry, WireError> {
    msg.destination_entry(key.family())
}

fn decode_daemon_message(msg: &IpvsMessage) -> Result<SyncDaemon, WireError> {
    msg.sync_daemon()
}

fn decode_info(msg: &IpvsMessage) -> Result<crate::Info, WireError> {
    msg.info()
}

fn decode_timeouts(msg: &IpvsMessage) -> Result<Timeouts, WireError> {
    Ok(msg.timeouts())
}

fn encode_set_timeouts(t: &Timeouts) -> Result<IpvsMessage, EncodeError> {
    IpvsMessage::set_timeouts(t)
}

fn encode_daemon(msg: &mut IpvsMessage, d: &SyncDaemon) -> Result<(), EncodeError> {
    *msg = IpvsMessage::new_daemon(d)?;
    Ok(())
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn tcp_10_0_0_1_80() -> ServiceKey {
    ServiceKey::tcp(v4(10, 0, 0, 1), 80)
}

#[test]
fn encode_add_service_tcp_v4() {
    let svc = Service::new(tcp_10_0_0_1_80(), Scheduler::RoundRobin);
    let msg = Op::AddService(svc).encode().expect("valid");
    assert_eq!(msg.cmd.number(), IPVS_CMD_NEW_SERVICE);
    let expected = hex("54 00 01 00
         06 00 01 00 02 00 00 00
         06 00 02 00 06 00 00 00
         14 00 03 00 0a 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00
         06 00 04 00 00 50 00 00
         07 00 06 00 72 72 00 00
         0c 00 07 00 00 00 00 00 ff ff ff ff
         08 00 08 00 00 00 00 00
         08 00 09 00 ff ff ff ff");
    assert_eq!(msg.attrs(), expected);
}

#[test]
fn encode_persistent_udp_v4_with_netmask_and_pe() {
    let mut svc = Service::new(
        ServiceKey::udp(v4(192, 168, 1, 2), 53),
        Scheduler::SourceHashing,
    )
    .persistent(300);
    svc.flags |= ServiceFlags::SH_PORT | ServiceFlags::HASHED;
    svc.netmask = Netmask::v4_prefix(24).expect("valid");
    svc.pe_name = Some("sip".into());
    let msg = Op::UpdateService(svc).encode().expect("valid");
    assert_eq!(msg.cmd.number(), IPVS_CMD_SET_SERVICE);
    // flags: PERSISTENT|SCHED2 = 0x11 (HASHED is never sent); timeout 300 = 0x12c;
    // netmask 255.255.255.0 in network order.
    let expected = hex("5c 00 01 00
         06 00 01 00 02 00 00 00
         06 00 02 00 11 00 00 00
         14 00 03 00 c0 a8 01 02 00 00 00 00 00 00 00 00 00 00 00 00
         06 00 04 00 00 35 00 00
         07 00 06 00 73 68 00 00
         08 00 0b 00 73 69 70 00
         0c 00 07 00 11 00 00 00 ff ff ff ff
         08 00 08 00 2c 01 00 00
         08 00 09 00 ff ff ff 00");
    assert_eq!(msg.attrs(), expected);
}

#[test]
fn encode_fwmark_v6_service_sends_prefix_length() {
    let mut svc = Service::new(
        ServiceKey::fwmark(7, AddressFamily::Inet6),
        Scheduler::WeightedLeastConnection,
    );
    svc.netmask = Netmask::V6Prefix(64);
    let msg = Op::AddService(svc).encode().expect("valid");
    let expected = hex("38 00 01 00
         06 00 01 00 0a 00 00 00
         08 00 05 00 07 00 00 00
         08 00 06 00 77 6c 63 00
         0c 00 07 00 00 00 00 00 ff ff ff ff
         08 00 08 00 00 00 00 00
         08 00 09 00 40 00 00 00");
    assert_eq!(msg.attrs(), expected);
}

#[test]
fn encode_add_destination() {
    let dest = Destination::new(v4(10, 1, 0, 5), 8080);
    let msg = Op::AddDestination(tcp_10_0_0_1_80(), dest)
        .encode()
        .expect("valid");
    assert_eq!(msg.cmd.number(), IPVS_CMD_NEW_DEST);
    let expected = hex("30 00 01 00
         06 00 01 00 02 00 00 00
         06 00 02 00 06 00 00 00
         14 00 03 00 0a 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00
         06 00 04 00 00 50 00 00
         48 00 02 00
         14 00 01 00 0a 01 00 05 00 00 00 00 00 00 00 00 00 00 00 00
         06 00 02 00 1f 90 00 00
         08 00 03 00 00 00 00 00
         08 00 04 00 01 00 00 00
         08 00 05 00 00 00 00 00
         08 00 06 00 00 00 00 00
         06 00 0b 00 02 00 00 00");
    assert_eq!(msg.attrs(), expected);
}

#[test]
fn encode_mixed_family_gue_tunnel_destination() {
    let mut dest = Destination::new(IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)), 80)
        .with_forward(ForwardMethod::Tunnel)
        .with_weight(3);
    dest.tunnel.kind = TunnelType::Gue;
    dest.tunnel.port = 6080;
    dest.tunnel.flags = TunnelFlags::CSUM;
    let msg = Op::UpdateDestination(tcp_10_0_0_1_80(), dest)
        .encode()
        .expect("valid");
    assert_eq!(msg.cmd.number(), IPVS_CMD_SET_DEST);
    let bytes = msg.attrs();
    let dest_part = &bytes[0x30..];
    let expected = hex("60 00 02 00
         14 00 01 00 fd 00 00 00 00 00 00 00 00 00 00 00 00 00 00 02
         06 00 02 00 00 50 00 00
         08 00 03 00 02 00 00 00
         08 00 04 00 03 00 00 00
         08 00 05 00 00 00 00 00
         08 00 06 00 00 00 00 00
         06 00 0b 00 0a 00 00 00
         05 00 0d 00 01 00 00 00
         06 00 0e 00 17 c0 00 00
         06 00 0f 00 01 00 00 00");
    assert_eq!(dest_part, &expected[..]);
}

#[test]
fn encode_delete_destination_and_service_send_keys_only() {
    let key = tcp_10_0_0_1_80();
    let del = Op::DeleteDestination(
        key,
        DestinationKey {
            addr: v4(10, 1, 0, 5),
            port: 8080,
        },
    )
    .encode()
    .expect("valid");
    assert_eq!(del.cmd.number(), IPVS_CMD_DEL_DEST);
    assert_eq!(
        &del.attrs()[0x30..],
        &hex("28 00 02 00
             14 00 01 00 0a 01 00 05 00 00 00 00 00 00 00 00 00 00 00 00
             06 00 02 00 1f 90 00 00
             06 00 0b 00 02 00 00 00")[..]
    );
    let del_svc = Op::DeleteService(ServiceKey::sctp(v4(1, 2, 3, 4), 9))
        .encode()
        .expect("ok");
    assert_eq!(del_svc.cmd.number(), IPVS_CMD_DEL_SERVICE);
    assert_eq!(
        del_svc.attrs(),
        hex("30 00 01 00
             06 00 01 00 02 00 00 00
             06 00 02 00 84 00 00 00
             14 00 03 00 01 02 03 04 00 00 00 00 00 00 00 00 00 00 00 00
             06 00 04 00 00 09 00 00")
    );
}

#[test]
fn encode_timeouts_and_daemon() {
    let msg = encode_set_timeouts(&Timeouts {
        tcp: 900,
        tcp_fin: 0,
        udp: 300,
    })
    .expect("valid");
    assert_eq!(msg.cmd.number(), IPVS_CMD_SET_CONFIG);
    assert_eq!(
        msg.attrs(),
        hex("08 00 04 00 84 03 00 00  08 00 05 00 00 00 00 00  08 00 06 00 2c 01 00 00")
    );
    let mut d = SyncDaemon::new(SyncState::Backup, "eth0", 5);
    d.group = Some(v4(224, 0, 0, 81));
    d.port = Some(8848);
    d.ttl = Some(1);
    let mut msg = IpvsMessage::new(IpvsCmd::NewDaemon);
    encode_daemon(&mut msg, &d).expect("valid");
    assert_eq!(
        msg.attrs(),
        hex("38 00 03 00
             08 00 01 00 02 00 00 00
             09 00 02 00 65 74 68 30 00 00 00 00
             08 00 03 00 05 00 00 00
             08 00 05 00 e0 00 00 51
             06 00 07 00 90 22 00 00
             05 00 08 00 01 00 00 00")
    );
}

#[test]
fn client_side_validation() {
    let long = Service::new(
        tcp_10_0_0_1_80(),
        Scheduler::Other("sixteen-bytes-xx".into()),
    );
    assert!(Op::AddService(long).encode().is_err());
    let mut bad_v6 = Service::new(
        ServiceKey::tcp("fd00::1".parse().expect("addr"), 80),
        Scheduler::RoundRobin,
    );
    bad_v6.netmask = Netmask::V6Prefix(0);
    assert!(Op::AddService(bad_v6).encode().is_err());
    let mut bad_v4 = Service::new(tcp_10_0_0_1_80(), Scheduler::RoundRobin);
    bad_v4.netmask = Netmask::V6Prefix(24);
    assert!(Op::AddService(bad_v4).encode().is_err());
    let zero_mark = Service::new(
        ServiceKey::fwmark(0, AddressFamily::Inet),
        Scheduler::RoundRobin,
    );
    assert!(Op::AddService(zero_mark).encode().is_err());
    let heavy = Destination::new(v4(1, 1, 1, 1), 1).with_weight(u32::MAX);
    assert!(
        Op::AddDestination(tcp_10_0_0_1_80(), heavy)
            .encode()
            .is_err()
    );
}

/// The range error `encode` gives, with its field, value and range.
fn range_error(result: Result<IpvsMessage, EncodeError>) -> (&'static str, u64, u64, u64) {
    match result {
        Err(EncodeError::OutOfRange(e)) => (e.field, e.value, *e.range.start(), *e.range.end()),
        other => panic!("expected an out-of-range error, got {other:?}"),
    }
}

#[test]
fn values_the_kernel_cannot_hold_are_refused() {
    // Persistence: the kernel keeps timeout x HZ in 32 bits; 20,000,000 s would read back
    // as 2,820,130 s (HZ 250).
    let svc = Service::new(tcp_10_0_0_1_80(), Scheduler::RoundRobin).persistent(20_000_000);
    assert_eq!(
        range_error(Op::AddService(svc.clone()).encode()),
        ("persistence timeout", 20_000_000, 0, 4_294_967)
    );
    assert_eq!(
        range_error(Op::UpdateService(svc).encode()).0,
        "persistence timeout"
    );
    let longest = Service::new(tcp_10_0_0_1_80(), Scheduler::RoundRobin).persistent(4_294_967);
    assert!(Op::AddService(longest).encode().is_ok());

    let key = tcp_10_0_0_1_80();
    let d = Destination::new(v4(10, 1, 0, 5), 80);
    let heavy = d.clone().with_weight(i32::MAX as u32 + 1);
    assert_eq!(
        range_error(Op::AddDestination(key, heavy).encode()),
        ("weight", 1 << 31, 0, i32::MAX as u64)
    );
    assert!(
        Op::AddDestination(key, d.clone().with_weight(i32::MAX as u32))
            .encode()
            .is_ok()
    );
    let mut upper = d.clone();
    upper.upper_threshold = u32::MAX;
    assert_eq!(
        range_error(Op::UpdateDestination(key, upper).encode()).0,
        "upper threshold"
    );
    let mut lower = d.clone();
    lower.upper_threshold = 10;
    lower.lower_threshold = 11;
    assert_eq!(
        range_error(Op::AddDestination(key, lower).encode()),
        ("lower threshold", 11, 0, 10)
    );
    let mut gue = d.clone().with_forward(ForwardMethod::Tunnel);
    gue.tunnel.kind = TunnelType::Gue;
    assert_eq!(
        range_error(Op::AddDestination(key, gue.clone()).encode()),
        ("GUE tunnel port", 0, 1, 65535)
    );
    gue.tunnel.port = 1;
    assert!(Op::AddDestination(key, gue).encode().is_ok());

    let mut m = IpvsMessage::new(IpvsCmd::NewDaemon);
    let daemon =
        |r: Result<(), EncodeError>| range_error(r.map(|()| IpvsMessage::new(IpvsCmd::NewDaemon)));
    assert_eq!(
        daemon(encode_daemon(
            &mut m,
            &SyncDaemon::new(SyncState::Master, "eth0", 300)
        )),
        ("sync ID", 300, 0, 255)
    );
    assert!(encode_daemon(&mut m, &SyncDaemon::new(SyncState::Master, "eth0", 255)).is_ok());
    let mut d0 = SyncDaemon::new(SyncState::Backup, "eth0", 1);
    d0.port = Some(0);
    assert_eq!(daemon(encode_daemon(&mut m, &d0)).0, "multicast port");
    d0.port = None;
    d0.ttl = Some(0);
    assert_eq!(daemon(encode_daemon(&mut m, &d0)).0, "multicast TTL");
    d0.ttl = None;
    d0.max_len = Some(1000);
    assert_eq!(
        daemon(encode_daemon(&mut m, &d0)),
        ("sync message maximum length", 1000, 1024, 65507)
    );
    d0.group = Some("ff02::1".parse().expect("addr"));
    d0.max_len = Some(65500);
    assert_eq!(
        daemon(encode_daemon(&mut m, &d0)),
        ("sync message maximum length", 65500, 1024, 65487)
    );

    let t = Timeouts {
        tcp: 2_678_401,
        ..Timeouts::default()
    };
    assert_eq!(
        range_error(encode_set_timeouts(&t)),
        ("TCP timeout", 2_678_401, 0, 2_678_400)
    );
    let t = Timeouts {
        udp: u32::MAX,
        ..Timeouts::default()
    };
    assert_eq!(range_error(encode_set_timeouts(&t)).0, "UDP timeout");
}

/// A NEW_SERVICE dump part laid out like the kernel's `ip_vs_genl_fill_service`: AF,
/// PROTOCOL, 16-byte ADDR, PORT, SCHED_NAME, FLAGS (HASHED set), TIMEOUT, NETMASK, then
/// 32-bit STATS and STATS64 (with PAD before each u64), and an unknown attribute 99.
fn kernel_style_service() -> Vec<u8> {
    hex("06 00 01 00 02 00 00 00
         06 00 02 00 06 00 00 00
         14 00 03 00 0a 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00
         06 00 04 00 00 50 00 00
         07 00 06 00 72 72 00 00
         0c 00 07 00 03 00 00 00 ff ff ff ff
         08 00 08 00 2c 01 00 00
         08 00 09 00 ff ff ff ff
         20 00 0a 00
            08 00 01 00 05 00 00 00
            0c 00 04 00 e8 03 00 00 00 00 00 00
            08 00 06 00 01 00 00 00
         24 00 0c 00
            04 00 0b 00
            0c 00 01 00 07 00 00 00 00 00 00 00
            04 00 0b 00
            0c 00 05 00 00 00 00 00 01 00 00 00
         08 00 63 00 de ad be ef")
}

#[test]
fn decode_kernel_style_service_prefers_stats64() {
    let entry = decode_service(&kernel_style_service()).expect("decodes");
    let expected = Service::new(tcp_10_0_0_1_80(), Scheduler::RoundRobin).persistent(300);
    assert_eq!(entry.service, expected, "HASHED is ignored by equality");
    assert!(entry.service.flags.is_hashed());
    assert_eq!(entry.stats.conns, 7, "64-bit set wins");
    assert_eq!(entry.stats.out_bytes, 1 << 32);
    assert_eq!(entry.stats.in_bytes, 0, "the 64-bit set had no in_bytes");
}

/// The table read's decoders (attribute by attribute, no attribute list) give what the
/// typed ones give, on the kernel-style and the captured replies.
#[test]
fn record_decoders_agree_with_the_typed_ones() {
    let service = kernel_style_service();
    assert_eq!(
        record::decode_service(&service).expect("decodes"),
        decode_service(&service).expect("decodes")
    );
    for (cmd, s) in [
        (IPVS_CMD_NEW_SERVICE, kernel_captures::KERNEL_SVC_SCTP_V6_MH),
        (
            IPVS_CMD_NEW_SERVICE,
            kernel_captures::KERNEL_SVC_UDP_SH_PERSISTENT,
        ),
        (IPVS_CMD_NEW_SERVICE, kernel_captures::KERNEL_SVC_FWMARK_V6),
        (IPVS_CMD_NEW_DEST, kernel_captures::KERNEL_DEST_V6_MASQ),
        (IPVS_CMD_NEW_DEST, kernel_captures::KERNEL_DEST_GUE),
        (
            IPVS_CMD_NEW_DEST,
            kernel_captures::KERNEL_DEST_MASQ_THRESHOLDS,
        ),
    ] {
        let mut payload = vec![cmd, 1, 0, 0];
        payload.extend(hex(s));
        let msg = IpvsMessage::from_genl(&payload).expect("parses");
        if cmd == IPVS_CMD_NEW_SERVICE {
            let rec = record::service_record(&payload).expect("has a service");
            assert_eq!(
                record::decode_service(rec).expect("decodes"),
                msg.service_entry().expect("decodes")
            );
        } else {
            let rec = record::destination_record(&payload).expect("has a destination");
            for family in [AddressFamily::Inet, AddressFamily::Inet6] {
                assert_eq!(
                    record::decode_destination(rec, family).expect("decodes"),
                    msg.destination_entry(family).expect("decodes")
                );
            }
        }
    }
}

/// A service record split into key and configuration: statistics do not count, the
/// scheduler and the address do.
#[test]
fn split_service_leaves_statistics_out() {
    let (mut key, mut config) = (Vec::new(), Vec::new());
    let base = kernel_style_service();
    record::split_service(&base, &mut key, &mut config).expect("splits");
    let split = |service: &Service| {
        let msg = IpvsMessage::new_service(service).expect("valid");
        let IpvsAttr::Service(Nest { mut nlas, .. }) = msg.nlas[0].clone() else {
            panic!("no service attribute");
        };
        let unsplit = |nlas: &[ServiceAttr]| {
            let mut buf = vec![0; nlas.buffer_len()];
            nlas.emit(&mut buf);
            let (mut k, mut c) = (Vec::new(), Vec::new());
            record::split_service(&buf, &mut k, &mut c).expect("splits");
            (k, c)
        };
        let plain = unsplit(&nlas);
        nlas.insert(
            2,
            ServiceAttr::Stats64(vec![StatsAttr::InPackets(Counter::U64(99))].into()),
        );
        assert_eq!(unsplit(&nlas), plain, "statistics are left out");
        plain
    };
    let svc = Service::new(tcp_10_0_0_1_80(), Scheduler::RoundRobin);
    let (k1, c1) = split(&svc);
    let (k2, c2) = split(
        &svc.clone()
            .with_scheduler(Scheduler::WeightedLeastConnection),
    );
    assert_eq!(k1, k2);
    assert_ne!(c1, c2);
    let other = Service::new(ServiceKey::tcp(v4(10, 0, 0, 2), 80), Scheduler::RoundRobin);
    let (k3, c3) = split(&other);
    assert_ne!(k1, k3);
    assert_eq!(c1, c3);
    assert!(record::split_service(&[0xff; 7], &mut key, &mut config).is_err());
}

#[test]
fn unknown_attributes_survive_a_round_trip() {
    let buf = kernel_style_service();
    let nlas = parse_nlas::<ServiceAttr>(&buf).expect("parses");
    let unknown = DefaultNla::new(99, hex("de ad be ef"));
    assert_eq!(nlas.last(), Some(&ServiceAttr::Other(unknown)));
    // The stats' padding attributes are kept too.
    assert!(nlas.iter().any(|a| matches!(a,
        ServiceAttr::Stats64(s) if s.nlas.iter().any(|x| matches!(x, StatsAttr::Other(_))))));
    let msg = IpvsMessage::with_nlas(IpvsCmd::NewService, vec![IpvsAttr::Service(nlas.into())]);
    assert_eq!(&msg.to_bytes()[4..], &buf[..]);
    // Unknown top-level attributes and commands too.
    let top = hex("08 00 2a 00 01 02 03 04  08 00 04 00 84 03 00 00");
    let m = IpvsMessage::parse(0x42, &top).expect("parses");
    assert_eq!(m.cmd, IpvsCmd::Other(0x42));
    assert_eq!(
        m.nlas[0],
        IpvsAttr::Other(DefaultNla::new(42, hex("01 02 03 04")))
    );
    assert_eq!(m.nlas[1], IpvsAttr::TimeoutTcp(900));
    assert_eq!(m.to_bytes(), top);
    // Unknown attributes keep their type flags, alone or together, top-level and nested.
    for flags in ["40", "80", "c0"] {
        let top = hex(&format!("08 00 2a {flags} 01 02 03 04"));
        let m = IpvsMessage::parse(IPVS_CMD_NEW_SERVICE, &top).expect("parses");
        assert_eq!(m.to_bytes(), top, "top-level type flags 0x{flags}00");
        let nested = hex(&format!("0c 00 01 00 08 00 2a {flags} 01 02 03 04"));
        let m = IpvsMessage::parse(IPVS_CMD_NEW_SERVICE, &nested).expect("parses");
        assert_eq!(m.to_bytes(), nested, "nested type flags 0x{flags}00");
    }
}

#[test]
fn decode_falls_back_to_32bit_stats() {
    let mut buf = kernel_style_service();
    // Drop STATS64 (0x24 bytes) and the unknown attribute (8 bytes) at the end.
    buf.truncate(buf.len() - 0x24 - 8);
    let entry = decode_service(&buf).expect("decodes");
    assert_eq!(entry.stats.conns, 5);
    assert_eq!(entry.stats.in_bytes, 1000);
    assert_eq!(entry.stats.cps, 1);
}

#[test]
fn decode_fwmark_v6_service() {
    let buf = hex("06 00 01 00 0a 00 00 00
         08 00 05 00 07 00 00 00
         08 00 06 00 77 6c 63 00
         0c 00 07 00 02 00 00 00 ff ff ff ff
         08 00 08 00 00 00 00 00
         08 00 09 00 40 00 00 00");
    let entry = decode_service(&buf).expect("decodes");
    assert_eq!(
        entry.service.key,
        ServiceKey::fwmark(7, AddressFamily::Inet6)
    );
    assert_eq!(entry.service.netmask, Netmask::V6Prefix(64));
    assert_eq!(entry.service.scheduler, Scheduler::WeightedLeastConnection);
}

#[test]
fn decode_destination_inherits_service_family() {
    // No IPVS_DEST_ATTR_ADDR_FAMILY (pre-4.x kernels): the family comes from the service.
    let buf = hex("14 00 01 00 0a 01 00 05 00 00 00 00 00 00 00 00 00 00 00 00
         06 00 02 00 1f 90 00 00
         08 00 03 00 03 00 00 00
         08 00 04 00 02 00 00 00
         08 00 05 00 0a 00 00 00
         08 00 06 00 01 00 00 00
         08 00 07 00 04 00 00 00
         08 00 08 00 09 00 00 00
         08 00 09 00 01 00 00 00");
    let entry = decode_destination(&buf, AddressFamily::Inet).expect("decodes");
    let d = &entry.destination;
    assert_eq!(d.addr, v4(10, 1, 0, 5));
    assert_eq!(d.port, 8080);
    assert_eq!(d.forward, ForwardMethod::DirectRoute);
    assert_eq!((d.weight, d.upper_threshold, d.lower_threshold), (2, 10, 1));
    assert_eq!(
        (
            entry.active_conns,
            entry.inactive_conns,
            entry.persistent_conns
        ),
        (4, 9, 1)
    );
}

#[test]
fn decode_info_and_timeouts() {
    let info = decode_info(&raw(
        IPVS_CMD_SET_INFO,
        hex("08 00 01 00 01 02 01 00 08 00 02 00 00 10 00 00"),
    ))
    .expect("decodes");
    assert_eq!(info.version_triple(), (1, 2, 1));
    assert_eq!(info.conn_table_size, 4096);
    let t = decode_timeouts(&raw(
        IPVS_CMD_SET_CONFIG,
        hex("08 00 04 00 84 03 00 00 08 00 05 00 78 00 00 00 08 00 06 00 2c 01 00 00"),
    ))
    .expect("decodes");
    assert_eq!(
        t,
        Timeouts {
            tcp: 900,
            tcp_fin: 120,
            udp: 300
        }
    );
}

#[test]
fn decode_rejects_truncated_input() {
    let buf = kernel_style_service();
    for cut in 0..buf.len() {
        // Never panics; a cut inside the key attributes is an error.
        let _ = decode_service(&buf[..cut]);
    }
    assert!(decode_service(&buf[..20]).is_err());
    assert!(decode_service(&[]).is_err());
    let _ = Protocol::Tcp;
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_service(&bytes);
            let _ = decode_destination(&bytes, AddressFamily::Inet);
            let _ = decode_destination(&bytes, AddressFamily::Inet6);
            for cmd in [IPVS_CMD_NEW_SERVICE, IPVS_CMD_SET_INFO, 0xee] {
                // Whatever parses is emitted back unchanged (up to padding); the
                // decoders never panic on it.
                if let Ok(msg) = IpvsMessage::parse(cmd, &bytes) {
                    let _ = decode_service_message(&msg);
                    let _ = decode_dest_message(&msg, &tcp_10_0_0_1_80());
                    let _ = decode_daemon_message(&msg);
                    let _ = decode_info(&msg);
                    let _ = decode_timeouts(&msg);
                    let again = IpvsMessage::parse(cmd, &msg.to_bytes()).expect("reparses");
                    prop_assert_eq!(again, msg);
                }
            }
            let _ = decode_stats(&bytes);
        }

        #[test]
        fn record_decoders_agree_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            prop_assert_eq!(record::decode_service(&bytes).ok(), decode_service(&bytes).ok());
            for family in [AddressFamily::Inet, AddressFamily::Inet6] {
                prop_assert_eq!(
                    record::decode_destination(&bytes, family).ok(),
                    decode_destination(&bytes, family).ok()
                );
            }
        }

        /// The kernel's own records, one byte changed and cut anywhere: the record decoders
        /// (which read attributes in place) and the typed ones agree on every outcome:
        /// the same entry, or both an error. Random bytes rarely make a record; these nearly always do.
        #[test]
        fn record_decoders_agree_on_damaged_kernel_records(
            pick in 0usize..6,
            at in any::<proptest::sample::Index>(),
            byte in any::<u8>(),
            cut in any::<proptest::sample::Index>(),
        ) {
            let (cmd, capture) = [
                (IPVS_CMD_NEW_SERVICE, kernel_captures::KERNEL_SVC_SCTP_V6_MH),
                (IPVS_CMD_NEW_SERVICE, kernel_captures::KERNEL_SVC_UDP_SH_PERSISTENT),
                (IPVS_CMD_NEW_SERVICE, kernel_captures::KERNEL_SVC_FWMARK_V6),
                (IPVS_CMD_NEW_DEST, kernel_captures::KERNEL_DEST_V6_MASQ),
                (IPVS_CMD_NEW_DEST, kernel_captures::KERNEL_DEST_GUE),
                (IPVS_CMD_NEW_DEST, kernel_captures::KERNEL_DEST_MASQ_THRESHOLDS),
            ][pick];
            let mut payload = vec![cmd, 1, 0, 0];
            payload.extend(hex(capture));
            let mut rec = if cmd == IPVS_CMD_NEW_SERVICE {
                record::service_record(&payload).expect("has a service").to_vec()
            } else {
                record::destination_record(&payload).expect("has a destination").to_vec()
            };
            let i = at.index(rec.len());
            rec[i] = byte;
            rec.truncate(cut.index(rec.len() + 1));
            if cmd == IPVS_CMD_NEW_SERVICE {
                prop_assert_eq!(record::decode_service(&rec).ok(), decode_service(&rec).ok());
                prop_assert_eq!(
                    record::decode_service(&rec).is_err(),
                    decode_service(&rec).is_err()
                );
            } else {
                for family in [AddressFamily::Inet, AddressFamily::Inet6] {
                    prop_assert_eq!(
                        record::decode_destination(&rec, family).ok(),
                        decode_destination(&rec, family).ok()
                    );
                    prop_assert_eq!(
                        record::decode_destination(&rec, family).is_err(),
                        decode_destination(&rec, family).is_err()
                    );
                }
            }
        }

        #[test]
        fn equal_splits_mean_equal_services(a in service(), b in service(), packets in any::<u64>()) {
            let nest = |svc: &Service, packets: u64| {
                let msg = IpvsMessage::new_service(svc).expect("valid");
                let IpvsAttr::Service(Nest { mut nlas, .. }) = msg.nlas[0].clone() else {
                    panic!("no service attribute");
                };
                nlas.push(ServiceAttr::Stats64(vec![StatsAttr::Conns(Counter::U64(packets))].into()));
                let mut buf = vec![0; nlas.as_slice().buffer_len()];
                nlas.as_slice().emit(&mut buf);
                buf
            };
            let split = |buf: &[u8]| {
                let (mut k, mut c) = (Vec::new(), Vec::new());
                record::split_service(buf, &mut k, &mut c).expect("splits");
                (k, c)
            };
            let (na, na2, nb) = (nest(&a, 0), nest(&a, packets), nest(&b, packets));
            prop_assert_eq!(split(&na), split(&na2));
            let same_split = split(&na) == split(&nb);
            let same_service =
                record::decode_service(&na).expect("decodes").service
                    == record::decode_service(&nb).expect("decodes").service;
            prop_assert_eq!(same_split, same_service);
        }

        #[test]
        fn service_round_trips(svc in service()) {
            for op in [Op::AddService(svc.clone()), Op::UpdateService(svc.clone())] {
                let msg = op.encode().expect("valid");
                let decoded = decode_service_message(&msg).expect("decodes");
                prop_assert_eq!(&decoded.service, &svc);
                // `==` on flags ignores HASHED only, which is never sent.
                prop_assert_eq!(
                    decoded.service.flags.bits(),
                    svc.flags.bits() & !ServiceFlags::HASHED.bits()
                );
                prop_assert_eq!(decoded.service.scheduler.name(), svc.scheduler.name());
                // Writing the decoded service back sends the same bytes.
                prop_assert_eq!(&Op::AddService(decoded.service).encode().expect("valid"),
                    &Op::AddService(svc.clone()).encode().expect("valid"));
            }
        }

        #[test]
        fn destination_round_trips(d in destination(), v6 in any::<bool>()) {
            let key = if v6 {
                ServiceKey::tcp("fd00::1".parse().expect("addr"), 80)
            } else {
                tcp_10_0_0_1_80()
            };
            for op in [Op::AddDestination(key, d.clone()), Op::UpdateDestination(key, d.clone())] {
                let msg = op.encode().expect("valid");
                let decoded = decode_dest_message(&msg, &key).expect("decodes");
                prop_assert_eq!(&decoded.destination, &d);
                prop_assert_eq!(&Op::UpdateDestination(key, decoded.destination).encode().expect("valid"),
                    &Op::UpdateDestination(key, d.clone()).encode().expect("valid"));
            }
        }

        #[test]
        fn sync_daemon_round_trips(d in sync_daemon()) {
            let mut msg = IpvsMessage::new(IpvsCmd::NewDaemon);
            encode_daemon(&mut msg, &d).expect("valid");
            prop_assert_eq!(decode_daemon_message(&msg).expect("decodes"), d);
        }

        #[test]
        fn timeouts_round_trip(
            tcp in 0..=crate::timeouts::MAX_TIMEOUT,
            tcp_fin in 0..=crate::timeouts::MAX_TIMEOUT,
            udp in 0..=crate::timeouts::MAX_TIMEOUT,
        ) {
            let t = Timeouts { tcp, tcp_fin, udp };
            let msg = encode_set_timeouts(&t).expect("valid");
            prop_assert_eq!(decode_timeouts(&msg).expect("decodes"), t);
        }
    }

    fn addr() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(|a| IpAddr::V4(a.into())),
            any::<[u8; 16]>().prop_map(|a| IpAddr::V6(a.into())),
        ]
    }

    fn family() -> impl Strategy<Value = AddressFamily> {
        prop_oneof![Just(AddressFamily::Inet), Just(AddressFamily::Inet6)]
    }

    fn scheduler() -> impl Strategy<Value = Scheduler> {
        prop_oneof![
            "(rr|wrr|lc|wlc|lblc|lblcr|dh|sh|sed|nq|mh|fo|ovf)"
                .prop_map(|n| Scheduler::from_name(&n)),
            // Other names, and known names wrapped in Other by hand.
            "[a-z0-9_]{1,15}".prop_map(Scheduler::Other),
        ]
    }

    /// Every service configuration the kernel accepts.
    fn service() -> impl Strategy<Value = Service> {
        let key = prop_oneof![
            (addr(), any::<u16>(), 0usize..3).prop_map(|(addr, port, p)| ServiceKey::Tuple {
                addr,
                port,
                protocol: [Protocol::Tcp, Protocol::Udp, Protocol::Sctp][p],
            }),
            (1..=u32::MAX, family()).prop_map(|(mark, family)| ServiceKey::fwmark(mark, family)),
        ];
        (
            key,
            scheduler(),
            any::<u32>(),
            any::<bool>(),
            0..=crate::service::MAX_PERSISTENCE_TIMEOUT,
            any::<u32>(),
            1u8..=128,
            proptest::option::of("[a-z0-9_]{1,15}"),
        )
            .prop_map(
                |(key, scheduler, flags, hashed, timeout, mask4, plen6, pe_name)| {
                    let mut flags = ServiceFlags::from_bits(flags & ServiceFlags::SETTABLE.bits());
                    if hashed {
                        flags |= ServiceFlags::HASHED;
                    }
                    let netmask = match key.family() {
                        AddressFamily::Inet => Netmask::V4(mask4.into()),
                        AddressFamily::Inet6 => Netmask::V6Prefix(plen6),
                    };
                    Service {
                        key,
                        scheduler,
                        flags,
                        timeout,
                        netmask,
                        pe_name,
                    }
                },
            )
    }

    /// Every destination configuration the kernel accepts.
    fn destination() -> impl Strategy<Value = Destination> {
        let tunnel = (0u8..3, any::<u16>(), any::<u16>()).prop_map(|(kind, port, flags)| {
            let kind = TunnelType::from_number(kind).expect("known");
            // A GUE tunnel needs a port.
            let port = if kind == TunnelType::Gue {
                port.max(1)
            } else {
                port
            };
            crate::destination::Tunnel {
                kind,
                port,
                flags: TunnelFlags(flags),
            }
        });
        (
            addr(),
            any::<u16>(),
            0usize..4,
            0..=crate::destination::MAX_WEIGHT,
            (0..=crate::destination::MAX_WEIGHT).prop_flat_map(|u| (Just(u), 0..=u)),
            prop_oneof![Just(Default::default()), tunnel],
        )
            .prop_map(
                |(addr, port, fwd, weight, (upper, lower), tunnel)| Destination {
                    addr,
                    port,
                    forward: [
                        ForwardMethod::Masquerade,
                        ForwardMethod::Local,
                        ForwardMethod::Tunnel,
                        ForwardMethod::DirectRoute,
                    ][fwd],
                    weight,
                    upper_threshold: upper,
                    lower_threshold: lower,
                    tunnel,
                },
            )
    }

    /// Every sync daemon configuration the kernel keeps as given.
    fn sync_daemon() -> impl Strategy<Value = SyncDaemon> {
        (
            any::<bool>(),
            "[a-z0-9]{1,15}",
            0u32..=255,
            proptest::option::of(addr()),
            proptest::option::of(1024u16..=65487),
            proptest::option::of(1u16..),
            proptest::option::of(1u8..),
        )
            .prop_map(|(master, interface, sync_id, group, max_len, port, ttl)| {
                SyncDaemon {
                    state: if master {
                        SyncState::Master
                    } else {
                        SyncState::Backup
                    },
                    interface,
                    sync_id,
                    max_len,
                    group,
                    port,
                    ttl,
                }
            })
    }
}

/// Decoding of payloads the real kernel sent; expectations come from the ipvsadm commands
/// that built the table (see `kernel_captures.rs`).
mod real_kernel {
    use super::super::kernel_captures::*;
    use super::*;

    fn msg(cmd: u8, s: &str) -> IpvsMessage {
        raw(cmd, hex(s))
    }

    #[test]
    fn sctp_v6_service() {
        let e = decode_service_message(&msg(IPVS_CMD_NEW_SERVICE, KERNEL_SVC_SCTP_V6_MH))
            .expect("decodes");
        let key = ServiceKey::sctp("fd00::1".parse().expect("addr"), 9);
        assert_eq!(e.service, Service::new(key, Scheduler::MaglevHashing));
        assert!(e.service.flags.is_hashed());
    }

    #[test]
    fn persistent_udp_service_with_scheduler_flags() {
        let e = decode_service_message(&msg(IPVS_CMD_NEW_SERVICE, KERNEL_SVC_UDP_SH_PERSISTENT))
            .expect("decodes");
        let mut expected = Service::new(
            ServiceKey::udp(v4(192, 168, 1, 2), 53),
            Scheduler::SourceHashing,
        )
        .persistent(300);
        expected.netmask = Netmask::v4_prefix(24).expect("valid");
        expected.flags |=
            ServiceFlags::ONE_PACKET | ServiceFlags::SH_FALLBACK | ServiceFlags::SH_PORT;
        assert_eq!(e.service, expected);
    }

    /// `ipvsadm -A -u 192.168.1.2:53 -s sh -p 300 -M 255.0.255.0 ...`: the capture above
    /// with the netmask the kernel keeps for `-M 255.0.255.0`.
    #[test]
    fn non_contiguous_netmask_survives_read_modify_write() {
        let kernel = KERNEL_SVC_UDP_SH_PERSISTENT.replacen(
            "08 00 09 00 ff ff ff 00",
            "08 00 09 00 ff 00 ff 00",
            1,
        );
        assert_ne!(kernel, KERNEL_SVC_UDP_SH_PERSISTENT);
        let mut svc = decode_service_message(&msg(IPVS_CMD_NEW_SERVICE, &kernel))
            .expect("decodes")
            .service;
        assert_eq!(svc.netmask, Netmask::V4(Ipv4Addr::new(255, 0, 255, 0)));
        assert_eq!(svc.netmask.prefix_len(), None);
        // Change only the scheduler and write it back: the mask goes out as it came in.
        svc.scheduler = Scheduler::MaglevHashing;
        let sent = Op::UpdateService(svc).encode().expect("valid");
        let netmask_attr = hex("08 00 09 00 ff 00 ff 00");
        assert!(
            sent.attrs()
                .windows(netmask_attr.len())
                .any(|w| w == netmask_attr.as_slice()),
            "netmask changed: {:02x?}",
            sent.attrs()
        );
    }

    /// A masquerading destination whose tunnel fields another client set is written back
    /// with them.
    #[test]
    fn tunnel_fields_of_a_non_tunnel_destination_survive_a_rewrite() {
        let tcp = tcp_10_0_0_1_80();
        let mut d = Destination::new(v4(10, 1, 0, 5), 8080);
        d.tunnel.kind = TunnelType::Gue;
        d.tunnel.port = 6080;
        let sent = Op::UpdateDestination(tcp, d.clone())
            .encode()
            .expect("valid");
        let back =
            decode_dest_message(&raw(IPVS_CMD_NEW_DEST, sent.attrs()[0x30..].to_vec()), &tcp)
                .expect("decodes");
        assert_eq!(back.destination, d);
    }

    #[test]
    fn fwmark_v6_service() {
        let e = decode_service_message(&msg(IPVS_CMD_NEW_SERVICE, KERNEL_SVC_FWMARK_V6))
            .expect("decodes");
        let mut expected = Service::new(
            ServiceKey::fwmark(7, AddressFamily::Inet6),
            Scheduler::WeightedLeastConnection,
        )
        .persistent(60);
        expected.netmask = Netmask::V6Prefix(64);
        assert_eq!(e.service, expected);
    }

    #[test]
    fn destinations() {
        let tcp = tcp_10_0_0_1_80();
        let masq = decode_dest_message(&msg(IPVS_CMD_NEW_DEST, KERNEL_DEST_MASQ_THRESHOLDS), &tcp)
            .expect("decodes");
        let mut expected = Destination::new(v4(10, 1, 0, 5), 8080).with_weight(2);
        expected.upper_threshold = 10;
        expected.lower_threshold = 1;
        assert_eq!(masq.destination, expected);

        let gue =
            decode_dest_message(&msg(IPVS_CMD_NEW_DEST, KERNEL_DEST_GUE), &tcp).expect("decodes");
        let mut expected =
            Destination::new(v4(10, 1, 0, 6), 80).with_forward(ForwardMethod::Tunnel);
        expected.tunnel.kind = TunnelType::Gue;
        expected.tunnel.port = 6080;
        expected.tunnel.flags = TunnelFlags::NOCSUM;
        assert_eq!(gue.destination, expected);

        let sctp = ServiceKey::sctp("fd00::1".parse().expect("addr"), 9);
        let v6 = decode_dest_message(&msg(IPVS_CMD_NEW_DEST, KERNEL_DEST_V6_MASQ), &sctp)
            .expect("decodes");
        assert_eq!(
            v6.destination,
            Destination::new("fd00:1::5".parse().expect("addr"), 9)
        );
    }

    #[test]
    fn sync_daemon() {
        let d = decode_daemon_message(&msg(IPVS_CMD_NEW_DAEMON, KERNEL_DAEMON_MASTER))
            .expect("decodes");
        // ipvsadm -Ln --daemon: mcast=d0, syncid=5, maxlen=1472, group=224.0.0.81,
        // port=8848, ttl=1
        let mut expected = SyncDaemon::new(SyncState::Master, "d0", 5);
        expected.max_len = Some(1472);
        expected.group = Some(v4(224, 0, 0, 81));
        expected.port = Some(8848);
        expected.ttl = Some(1);
        assert_eq!(d, expected);
    }

    /// Every captured reply, parsed into typed attributes and emitted again, gives the
    /// kernel's bytes back.
    #[test]
    fn real_replies_round_trip_byte_for_byte() {
        for (cmd, s) in [
            (IPVS_CMD_NEW_SERVICE, KERNEL_SVC_SCTP_V6_MH),
            (IPVS_CMD_NEW_SERVICE, KERNEL_SVC_UDP_SH_PERSISTENT),
            (IPVS_CMD_NEW_SERVICE, KERNEL_SVC_FWMARK_V6),
            (IPVS_CMD_NEW_DEST, KERNEL_DEST_V6_MASQ),
            (IPVS_CMD_NEW_DEST, KERNEL_DEST_GUE),
            (IPVS_CMD_NEW_DEST, KERNEL_DEST_MASQ_THRESHOLDS),
            (IPVS_CMD_NEW_DAEMON, KERNEL_DAEMON_MASTER),
        ] {
            let m = msg(cmd, s);
            assert!(
                !m.nlas.iter().any(|a| matches!(a, IpvsAttr::Other(_))),
                "every top-level attribute is known"
            );
            assert_eq!(m.to_bytes(), hex(s));
        }
    }

    /// Every capture, with the command of its reply.
    const CAPTURES: [(u8, &str); 7] = [
        (IPVS_CMD_NEW_SERVICE, KERNEL_SVC_SCTP_V6_MH),
        (IPVS_CMD_NEW_SERVICE, KERNEL_SVC_UDP_SH_PERSISTENT),
        (IPVS_CMD_NEW_SERVICE, KERNEL_SVC_FWMARK_V6),
        (IPVS_CMD_NEW_DEST, KERNEL_DEST_V6_MASQ),
        (IPVS_CMD_NEW_DEST, KERNEL_DEST_GUE),
        (IPVS_CMD_NEW_DEST, KERNEL_DEST_MASQ_THRESHOLDS),
        (IPVS_CMD_NEW_DAEMON, KERNEL_DAEMON_MASTER),
    ];

    /// `attrs` with `NLA_F_NESTED` set in the type of every top-level attribute whose
    /// kind is in `outer` and of every attribute directly inside one whose kind is in
    /// `inner`: what a sender building its nests with `nla_nest_start()` sends. Walks the
    /// headers by hand (little-endian length and type, values padded to 4).
    fn with_nested_flags(attrs: &[u8], outer: &[u16], inner: &[u16]) -> Vec<u8> {
        fn walk(buf: &mut [u8], kinds: &[u16], inner: Option<&[u16]>) {
            let mut at = 0;
            while at + 4 <= buf.len() {
                let len = usize::from(u16::from_le_bytes([buf[at], buf[at + 1]]));
                let kind = u16::from_le_bytes([buf[at + 2], buf[at + 3]]);
                if kinds.contains(&kind) {
                    buf[at + 3] |= 0x80;
                    if let Some(inner) = inner {
                        walk(&mut buf[at + 4..at + len], inner, None);
                    }
                }
                at += (len + 3) & !3;
            }
        }
        let mut out = attrs.to_vec();
        walk(&mut out, outer, Some(inner));
        out
    }

    /// The flagged form of a capture: every nest the kernel may send (service,
    /// destination and daemon at the top; 32- and 64-bit statistics inside).
    fn all_nests_flagged(s: &str) -> Vec<u8> {
        let outer = [
            IPVS_CMD_ATTR_SERVICE,
            IPVS_CMD_ATTR_DEST,
            IPVS_CMD_ATTR_DAEMON,
        ];
        let inner = [IPVS_SVC_ATTR_STATS, IPVS_SVC_ATTR_STATS64];
        // The destination's statistics have the service's kinds.
        assert_eq!(
            (IPVS_DEST_ATTR_STATS, IPVS_DEST_ATTR_STATS64),
            (inner[0], inner[1])
        );
        with_nested_flags(&hex(s), &outer, &inner)
    }

    /// The `NLA_F_NESTED` flags of a message's nests, in wire order, depth first.
    fn nest_flags(m: &IpvsMessage) -> Vec<bool> {
        let mut out = Vec::new();
        for a in &m.nlas {
            match a {
                IpvsAttr::Service(n) => {
                    out.push(n.nested_flag);
                    for s in &n.nlas {
                        if let ServiceAttr::Stats(v) | ServiceAttr::Stats64(v) = s {
                            out.push(v.nested_flag);
                        }
                    }
                }
                IpvsAttr::Dest(n) => {
                    out.push(n.nested_flag);
                    for d in &n.nlas {
                        if let DestAttr::Stats(v) | DestAttr::Stats64(v) = d {
                            out.push(v.nested_flag);
                        }
                    }
                }
                IpvsAttr::Daemon(n) => out.push(n.nested_flag),
                _ => {}
            }
        }
        out
    }

    /// The kernel sends its nests without `NLA_F_NESTED`; they are parsed as such and
    /// emitted again without it.
    #[test]
    fn nests_without_the_nested_flag_round_trip_without_it() {
        for (cmd, s) in CAPTURES {
            let m = msg(cmd, s);
            let flags = nest_flags(&m);
            assert!(!flags.is_empty(), "the capture has nests");
            assert!(
                flags.iter().all(|f| !f),
                "no nest of the capture is flagged"
            );
            assert_eq!(m.to_bytes(), hex(s));
        }
    }

    /// A sender that builds its nests with `nla_nest_start()` sets `NLA_F_NESTED` on each:
    /// every nest remembers it and is emitted with it, byte for byte, and the flag changes
    /// nothing in what the message means.
    #[test]
    fn nests_with_the_nested_flag_round_trip_with_it() {
        for (cmd, s) in CAPTURES {
            let flagged = all_nests_flagged(s);
            assert_ne!(flagged, hex(s), "the capture has nests to flag");
            let m = raw(cmd, flagged.clone());
            let flags = nest_flags(&m);
            assert!(flags.iter().all(|f| *f), "every nest is flagged: {flags:?}");
            assert_eq!(flags.len(), nest_flags(&msg(cmd, s)).len());
            assert_eq!(m.to_bytes(), flagged);

            // Same meaning as the unflagged capture, through the typed and the record
            // decoders alike.
            let plain = msg(cmd, s);
            let payload = |attrs: &[u8]| [&[cmd, 1, 0, 0][..], attrs].concat();
            match cmd {
                IPVS_CMD_NEW_SERVICE => {
                    let e = decode_service_message(&m).expect("decodes");
                    assert_eq!(e, decode_service_message(&plain).expect("decodes"));
                    let p = payload(&flagged);
                    let r = record::service_record(&p).expect("has a service nest");
                    assert_eq!(record::decode_service(r).expect("decodes"), e);
                }
                IPVS_CMD_NEW_DEST => {
                    let key = tcp_10_0_0_1_80();
                    let e = decode_dest_message(&m, &key).expect("decodes");
                    assert_eq!(e, decode_dest_message(&plain, &key).expect("decodes"));
                    let p = payload(&flagged);
                    let r = record::destination_record(&p).expect("has a destination nest");
                    let d = record::decode_destination(r, key.family()).expect("decodes");
                    assert_eq!(d, e);
                }
                _ => assert_eq!(
                    decode_daemon_message(&m).expect("decodes"),
                    decode_daemon_message(&plain).expect("decodes")
                ),
            }
        }
    }

    /// Each nest keeps its own flag: a flagged service nest with unflagged statistics,
    /// and the other way round, both come back as they were.
    #[test]
    fn each_nest_keeps_its_own_nested_flag() {
        let s = KERNEL_SVC_UDP_SH_PERSISTENT;
        let outer_only = with_nested_flags(&hex(s), &[IPVS_CMD_ATTR_SERVICE], &[]);
        let m = raw(IPVS_CMD_NEW_SERVICE, outer_only.clone());
        assert_eq!(nest_flags(&m), [true, false, false]);
        assert_eq!(m.to_bytes(), outer_only);

        // Only the 64-bit statistics: flag the service nest to reach inside, then clear
        // its own flag again (the service header is the first attribute).
        let mut stats64_only =
            with_nested_flags(&hex(s), &[IPVS_CMD_ATTR_SERVICE], &[IPVS_SVC_ATTR_STATS64]);
        stats64_only[3] &= !0x80;
        let m = raw(IPVS_CMD_NEW_SERVICE, stats64_only.clone());
        assert_eq!(nest_flags(&m), [false, false, true]);
        assert_eq!(m.to_bytes(), stats64_only);
    }

    /// A message built here sends its nests without `NLA_F_NESTED`, as the kernel's own
    /// replies; set on a nest by hand, the flag is emitted.
    #[test]
    fn built_nests_leave_the_nested_flag_off_unless_asked() {
        let svc = Service::new(tcp_10_0_0_1_80(), Scheduler::RoundRobin);
        let dest = Destination::new(v4(10, 1, 0, 5), 8080);
        let mut m = IpvsMessage::new_destination(&svc.key, &dest).expect("valid");
        assert_eq!(nest_flags(&m), [false, false]);
        let bytes = m.to_bytes();
        // The service nest first (type 1), then the destination nest (type 2).
        assert_eq!(&bytes[2..4], &[0x01, 0x00]);
        let dest_at = usize::from(u16::from_le_bytes([bytes[0], bytes[1]]));
        assert_eq!(&bytes[dest_at + 2..dest_at + 4], &[0x02, 0x00]);

        if let IpvsAttr::Dest(n) = &mut m.nlas[1] {
            n.nested_flag = true;
        }
        let flagged = m.to_bytes();
        assert_eq!(&flagged[2..4], &[0x01, 0x00]);
        assert_eq!(&flagged[dest_at + 2..dest_at + 4], &[0x02, 0x80]);
        assert_eq!(flagged.len(), bytes.len());
        assert!(!Nest::from(vec![StatsAttr::Conns(Counter::U32(1))]).nested_flag);
    }

    #[test]
    fn every_truncation_of_real_replies_is_safe() {
        for s in [
            KERNEL_SVC_SCTP_V6_MH,
            KERNEL_SVC_UDP_SH_PERSISTENT,
            KERNEL_DEST_GUE,
            KERNEL_DAEMON_MASTER,
        ] {
            let full = hex(s);
            for cut in 0..full.len() {
                let Ok(m) = IpvsMessage::parse(1, &full[..cut]) else {
                    continue;
                };
                let _ = decode_service_message(&m);
                let _ = decode_dest_message(&m, &tcp_10_0_0_1_80());
                let _ = decode_daemon_message(&m);
            }
        }
    }
}

/// The builders set exactly the fields their names say, and what they build encodes as
/// the hand-written golden bytes above.
#[test]
fn builders_set_every_field() {
    let dest = Destination::new(IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)), 80)
        .with_weight(3)
        .with_tunnel(crate::Tunnel::gue(6080).with_checksum(TunnelFlags::CSUM));
    let mut by_hand = Destination::new(IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)), 80)
        .with_forward(ForwardMethod::Tunnel)
        .with_weight(3);
    by_hand.tunnel.kind = TunnelType::Gue;
    by_hand.tunnel.port = 6080;
    by_hand.tunnel.flags = TunnelFlags::CSUM;
    assert_eq!(dest, by_hand);
    let d = Destination::new(v4(10, 1, 0, 5), 1)
        .with_port(8080)
        .with_thresholds(10, 1)
        .with_tunnel_type(TunnelType::Gre)
        .with_tunnel_port(7)
        .with_tunnel_checksum(TunnelFlags::REMCSUM);
    assert_eq!(
        (d.port, d.upper_threshold, d.lower_threshold),
        (8080, 10, 1)
    );
    assert_eq!(d.forward, ForwardMethod::Masquerade);
    assert_eq!(
        d.tunnel,
        crate::Tunnel {
            kind: TunnelType::Gre,
            port: 7,
            flags: TunnelFlags::REMCSUM
        }
    );
    assert_eq!(
        d.clone().with_upper_threshold(20).with_lower_threshold(5),
        d.with_thresholds(20, 5)
    );

    let svc = Service::new(
        ServiceKey::udp(v4(192, 168, 1, 2), 53),
        Scheduler::RoundRobin,
    )
    .with_scheduler(Scheduler::SourceHashing)
    .persistent(300)
    .sh_port()
    .with_netmask(Netmask::v4_prefix(24).expect("valid"))
    .with_persistence_engine("sip");
    let msg = Op::UpdateService(svc.clone()).encode().expect("valid");
    // The same bytes as `encode_persistent_udp_v4_with_netmask_and_pe`.
    assert_eq!(&msg.attrs()[..8], &hex("5c 00 01 00 06 00 01 00")[..]);
    assert!(
        msg.attrs()
            .windows(12)
            .any(|w| w == hex("0c 00 07 00 11 00 00 00 ff ff ff ff"))
    );
    let mh = Service::new(tcp_10_0_0_1_80(), Scheduler::MaglevHashing)
        .mh_fallback()
        .mh_port()
        .one_packet()
        .with_timeout(9);
    assert_eq!(
        mh.flags,
        ServiceFlags::SH_FALLBACK | ServiceFlags::SH_PORT | ServiceFlags::ONE_PACKET
    );
    assert_eq!(mh.timeout, 9);
    assert_eq!(
        mh.clone().with_flags(ServiceFlags::empty()).flags,
        ServiceFlags::empty()
    );

    let daemon = SyncDaemon::new(SyncState::Backup, "eth0", 5)
        .with_group(v4(224, 0, 0, 81))
        .with_port(8848)
        .with_ttl(1)
        .with_max_len(1500);
    assert_eq!(
        (daemon.group, daemon.port, daemon.ttl, daemon.max_len),
        (Some(v4(224, 0, 0, 81)), Some(8848), Some(1), Some(1500))
    );
    assert_eq!(
        Timeouts::new(900, 120, 300),
        Timeouts {
            tcp: 900,
            tcp_fin: 120,
            udp: 300
        }
    );
}
