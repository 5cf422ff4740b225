#![allow(clippy::unwrap_used)]

use netlink_packet_core::NetlinkSerializable;

use super::*;

/// An attribute as the kernel lays it out (length, type, value, padding to 4 bytes).
fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    push_attribute(&mut out, kind, value);
    out
}

/// An `RTM_NEWADDR` payload: `ifaddrmsg`, then the attributes.
fn address_message(family: u8, link: u32, attributes: &[(u16, &[u8])]) -> Vec<u8> {
    let mut out = vec![family, 32, 0, 0];
    out.extend_from_slice(&link.to_ne_bytes());
    for (kind, value) in attributes {
        out.extend(attribute(*kind, value));
    }
    out
}

/// An `RTM_NEWROUTE` payload: `rtmsg` (table, protocol, type), then the attributes.
fn route_message(
    family: u8,
    prefix: u8,
    (table, protocol, kind): (u8, u8, u8),
    attributes: &[(u16, &[u8])],
) -> Vec<u8> {
    let mut out = vec![family, prefix, 0, 0, table, protocol, 254, kind];
    out.extend_from_slice(&0u32.to_ne_bytes());
    for (kind, value) in attributes {
        out.extend(attribute(*kind, value));
    }
    out
}

/// A datagram of messages (`nlmsghdr` each, 4-byte aligned).
fn datagram(messages: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (message_type, payload) in messages {
        let length = u32::try_from(NLMSG_HDRLEN + payload.len()).unwrap();
        out.extend_from_slice(&length.to_ne_bytes());
        out.extend_from_slice(&message_type.to_ne_bytes());
        out.extend_from_slice(&[0; 10]);
        out.extend_from_slice(payload);
        out.resize(out.len().next_multiple_of(4), 0);
    }
    out
}

fn v4(address: &str) -> IpAddr {
    address.parse().unwrap()
}

#[test]
fn an_address_is_ifa_local_when_there_is_one_else_ifa_address() {
    let local = [10, 0, 0, 1];
    let peer = [10, 0, 0, 2];
    // Point-to-point: IFA_ADDRESS is the peer's, whichever comes first.
    let message = address_message(
        AF_INET,
        7,
        &[(IFA_ADDRESS, &peer), (IFA_LOCAL, &local), (8, &[0; 4])],
    );
    assert_eq!(address_of(RTM_NEWADDR, &message), Some((7, v4("10.0.0.1"))));
    // IPv6 sends IFA_ADDRESS alone.
    let v6: Ipv6Addr = "fd00::5".parse().unwrap();
    let message = address_message(AF_INET6, 3, &[(IFA_ADDRESS, &v6.octets())]);
    assert_eq!(address_of(RTM_NEWADDR, &message), Some((3, IpAddr::V6(v6))));
    // Not an address message, or an address of the wrong size: none.
    assert_eq!(address_of(RTM_NEWLINK, &message), None);
    let odd = address_message(AF_INET, 3, &[(IFA_ADDRESS, &[1, 2, 3])]);
    assert_eq!(address_of(RTM_NEWADDR, &odd), None);
    assert_eq!(address_of(RTM_NEWADDR, &[2, 32]), None);
}

#[test]
fn a_local_route_counts_when_it_is_ours_through_the_link_in_the_local_table() {
    let oif = 9u32.to_ne_bytes();
    let other_oif = 4u32.to_ne_bytes();
    let table = 255u32.to_ne_bytes();
    let dst = [10, 96, 0, 0];
    let ours = route_message(
        AF_INET,
        12,
        (RT_TABLE_LOCAL, 4, RTN_LOCAL),
        &[(RTA_TABLE, &table), (RTA_DST, &dst), (RTA_OIF, &oif)],
    );
    assert_eq!(
        own_local_route(&ours, 9),
        Some("10.96.0.0/12".parse().unwrap())
    );
    // Through another link, another table, another type, or made by the kernel: not ours.
    let elsewhere = route_message(
        AF_INET,
        12,
        (RT_TABLE_LOCAL, 4, RTN_LOCAL),
        &[(RTA_DST, &dst), (RTA_OIF, &other_oif)],
    );
    assert_eq!(own_local_route(&elsewhere, 9), None);
    let main = 254u32.to_ne_bytes();
    let in_main = route_message(
        AF_INET,
        12,
        (RT_TABLE_LOCAL, 4, RTN_LOCAL),
        &[(RTA_TABLE, &main), (RTA_DST, &dst), (RTA_OIF, &oif)],
    );
    assert_eq!(own_local_route(&in_main, 9), None);
    let unicast = route_message(
        AF_INET,
        12,
        (RT_TABLE_LOCAL, 4, 1),
        &[(RTA_DST, &dst), (RTA_OIF, &oif)],
    );
    assert_eq!(own_local_route(&unicast, 9), None);
    let kernel = route_message(
        AF_INET,
        32,
        (RT_TABLE_LOCAL, RTPROT_KERNEL, RTN_LOCAL),
        &[(RTA_DST, &[10, 96, 0, 10]), (RTA_OIF, &oif)],
    );
    assert_eq!(own_local_route(&kernel, 9), None);
    // IPv6, the table in the header alone.
    let net: Ipv6Addr = "fd00:96::".parse().unwrap();
    let ours6 = route_message(
        AF_INET6,
        108,
        (RT_TABLE_LOCAL, 3, RTN_LOCAL),
        &[(RTA_DST, &net.octets()), (RTA_OIF, &oif)],
    );
    assert_eq!(
        own_local_route(&ours6, 9),
        Some("fd00:96::/108".parse().unwrap())
    );
    assert_eq!(own_local_route(&ours6[..8], 9), None);
}

#[test]
fn the_first_datagram_answers_whether_the_link_holds_an_address() {
    let on_link = address_message(AF_INET, 9, &[(IFA_LOCAL, &[10, 96, 0, 1])]);
    let elsewhere = address_message(AF_INET, 2, &[(IFA_LOCAL, &[192, 168, 1, 5])]);
    let link_local = address_message(AF_INET, 9, &[(IFA_LOCAL, &[169, 254, 3, 3])]);
    let done = 0i32.to_ne_bytes().to_vec();
    assert_eq!(
        first_address(
            &datagram(&[(RTM_NEWADDR, elsewhere.clone()), (RTM_NEWADDR, on_link)]),
            9
        ),
        Datagram::Holds
    );
    // Another link's addresses (a kernel that does not filter) and link-local ones: read on.
    assert_eq!(
        first_address(
            &datagram(&[(RTM_NEWADDR, elsewhere), (RTM_NEWADDR, link_local.clone())]),
            9
        ),
        Datagram::More
    );
    assert_eq!(
        first_address(
            &datagram(&[(RTM_NEWADDR, link_local), (NLMSG_DONE, done)]),
            9
        ),
        Datagram::Done
    );
    // The kernel's refusal carries its errno, negated.
    let refusal = (-libc::EINVAL).to_ne_bytes().to_vec();
    assert_eq!(
        first_address(&datagram(&[(NLMSG_ERROR, refusal)]), 9),
        Datagram::Refused(libc::EINVAL)
    );
    // A message whose length runs past the datagram.
    let mut torn = datagram(&[(NLMSG_DONE, vec![0; 4])]);
    torn[0] = 200;
    assert_eq!(first_address(&torn, 9), Datagram::Refused(libc::EBADMSG));
}

#[test]
fn requests_ask_by_link_family_table_and_name() {
    let link = Request::link("kube-ipvs0");
    assert_eq!(link.message_type(), RTM_GETLINK);
    assert_eq!(&link.body[..IFINFOMSG_LEN], &[0; IFINFOMSG_LEN]);
    assert_eq!(
        &link.body[IFINFOMSG_LEN..],
        attribute(IFLA_IFNAME, b"kube-ipvs0\0").as_slice()
    );
    let addresses = Request::addresses(9);
    assert_eq!(addresses.message_type(), RTM_GETADDR);
    assert_eq!(addresses.body.len(), IFADDRMSG_LEN);
    assert_eq!(link_index_of(&addresses.body), Some(9));
    let routes = Request::local_routes(AF_INET6, 9);
    assert_eq!(routes.message_type(), RTM_GETROUTE);
    assert_eq!(
        &routes.body[..8],
        &[AF_INET6, 0, 0, 0, RT_TABLE_LOCAL, 0, 0, RTN_LOCAL]
    );
    assert_eq!(
        &routes.body[RTMSG_LEN..],
        attribute(RTA_OIF, &9u32.to_ne_bytes()).as_slice()
    );
}
