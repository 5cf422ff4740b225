#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use super::*;
use crate::netfilter::plan::SourceRange;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ap(address: &str, protocol: Protocol, port: u16) -> AddrPort {
    AddrPort {
        address: ip(address),
        protocol,
        port,
    }
}

fn sample_v4() -> FamilyPlan {
    let mut p = FamilyPlan::new(AddressFamily::V4, ClusterIpMasquerade::NodeFromVip);
    p.cluster_ips.insert(ap("10.96.0.10", Protocol::Tcp, 80));
    p.cluster_ips.insert(ap("10.96.0.11", Protocol::Udp, 53));
    p.node_ports.insert(ProtoPort {
        protocol: Protocol::Tcp,
        port: 30080,
    });
    p.node_ports_local.insert(ProtoPort {
        protocol: Protocol::Sctp,
        port: 30099,
    });
    let lb = ap("198.51.100.7", Protocol::Tcp, 443);
    p.load_balancer_ips.insert(lb);
    p.firewalled.insert(lb);
    p.source_ranges.insert(SourceRange {
        target: lb,
        source: "192.168.7.0/24".parse().unwrap(),
    });
    p.hairpin.insert(ap("10.244.0.5", Protocol::Tcp, 8080));
    p.health_check_node_ports.insert(32000);
    p.bound_ips.insert(ip("10.96.0.10"));
    p
}

#[test]
fn replace_is_one_script_deleting_then_defining_each_table() {
    let plan = NetfilterPlan {
        v4: Some(sample_v4()),
        v6: Some(FamilyPlan::new(AddressFamily::V6, ClusterIpMasquerade::All)),
    };
    let script = render_replace(&plan, &RenderOptions::default()).unwrap();
    let lines: Vec<&str> = script.lines().collect();
    assert_eq!(lines[0], "add table ip ipvs-proxier");
    assert_eq!(lines[1], "delete table ip ipvs-proxier");
    assert_eq!(lines[2], "table ip ipvs-proxier {");
    let v6_add = lines
        .iter()
        .position(|l| *l == "add table ip6 ipvs-proxier")
        .unwrap();
    assert_eq!(lines[v6_add + 1], "delete table ip6 ipvs-proxier");
    assert_eq!(lines[v6_add + 2], "table ip6 ipvs-proxier {");
    // Exactly two table definitions and nothing outside them but the add/delete pairs.
    assert_eq!(lines.iter().filter(|l| l.starts_with("table ")).count(), 2);
    assert!(
        !script.contains("flush ruleset"),
        "must never touch other tables"
    );
    // Braces balance: the script is one well-formed unit.
    assert_eq!(script.matches('{').count(), script.matches('}').count());
}

#[test]
fn closing_braces_follow_a_newline_or_semicolon() {
    let plan = NetfilterPlan {
        v4: Some(sample_v4()),
        v6: None,
    };
    let script = render_replace(&plan, &RenderOptions::default()).unwrap();
    for (i, line) in script.lines().enumerate() {
        let t = line.trim_end();
        if let Some(before) = t.strip_suffix('}') {
            let before = before.trim_end();
            assert!(
                before.is_empty()
                    || before.ends_with(';')
                    || before.ends_with('{')
                    || before.contains("elements")
                    || before.contains("!= {"),
                "line {i}: `}}` not preceded by newline or `;` (nft 1.0.6): {line}"
            );
        }
    }
}

#[test]
fn elements_are_rendered_as_concatenations() {
    let plan = NetfilterPlan {
        v4: Some(sample_v4()),
        v6: None,
    };
    let script = render_replace(&plan, &RenderOptions::default()).unwrap();
    assert!(script.contains("elements = { 10.96.0.10 . tcp . 80, 10.96.0.11 . udp . 53 };"));
    assert!(script.contains("elements = { tcp . 30080 };"));
    assert!(script.contains("elements = { sctp . 30099 };"));
    assert!(script.contains("elements = { 198.51.100.7 . 443 . 192.168.7.0/24 };"));
    assert!(script.contains("elements = { 10.244.0.5 . tcp . 8080 . 10.244.0.5 };"));
    assert!(script.contains("elements = { 32000 };"));
    // The source ranges are interval sets, one per protocol, keyed without the protocol.
    let set_body = |name: &str| {
        let body = script.split(&format!("set {name} {{")).nth(1).unwrap();
        body[..body.find("  }").unwrap()].to_owned()
    };
    let tcp = set_body("load-balancer-source-ranges-tcp");
    assert!(tcp.contains("flags interval;"));
    assert!(tcp.contains("type ipv4_addr . inet_service . ipv4_addr;"));
    assert!(tcp.contains("198.51.100.7 . 443 . 192.168.7.0/24"));
    let udp = set_body("load-balancer-source-ranges-udp");
    assert!(udp.contains("flags interval;") && !udp.contains("elements"));
    assert!(!set_body("load-balancer-source-ranges-sctp").contains("elements"));
}

#[test]
fn source_ranges_match_the_protocol_before_an_interval_lookup_without_it() {
    let plan = NetfilterPlan {
        v4: Some(sample_v4()),
        v6: Some(FamilyPlan::new(AddressFamily::V6, ClusterIpMasquerade::All)),
    };
    let script = render_replace(&plan, &RenderOptions::default()).unwrap();
    for (fam, proto) in [("ip", "tcp"), ("ip", "udp"), ("ip", "sctp"), ("ip6", "tcp")] {
        let rule = format!(
            "    meta l4proto {proto} {fam} daddr . th dport . {fam} saddr @load-balancer-source-ranges-{proto} return\n"
        );
        assert!(script.contains(&rule), "missing: {rule}");
    }
    // No interval set's key holds the protocol (nft before 1.1 converts its byte order,
    // which 6.12 refuses).
    for set in script.split("  set ").skip(1) {
        let body = &set[..set.find("  }").unwrap()];
        if body.contains("flags interval;") {
            assert!(
                !body.contains("inet_proto"),
                "interval set keyed by protocol: {body}"
            );
        }
    }
}

#[test]
fn empty_sets_have_no_elements_clause() {
    let plan = NetfilterPlan {
        v4: Some(FamilyPlan::new(
            AddressFamily::V4,
            ClusterIpMasquerade::NodeFromVip,
        )),
        v6: None,
    };
    let script = render_replace(&plan, &RenderOptions::default()).unwrap();
    assert!(!script.contains("elements"));
    assert!(script.contains("set cluster-ips {"));
}

#[test]
fn unplanned_family_table_is_only_removed() {
    let plan = NetfilterPlan {
        v4: Some(sample_v4()),
        v6: None,
    };
    let script = render_replace(&plan, &RenderOptions::default()).unwrap();
    assert!(script.contains("add table ip6 ipvs-proxier\ndelete table ip6 ipvs-proxier\n"));
    assert!(!script.contains("table ip6 ipvs-proxier {"));
}

#[test]
fn masquerade_rules_follow_the_cluster_ip_mode() {
    let mut p = sample_v4();
    let render = |p: &FamilyPlan| {
        render_replace(
            &NetfilterPlan {
                v4: Some(p.clone()),
                v6: None,
            },
            &RenderOptions::default(),
        )
        .unwrap()
    };
    let node_from_vip = render(&p);
    assert!(node_from_vip.contains(
        "ip saddr . meta l4proto . th dport @cluster-ips meta mark set meta mark | 0x00004000"
    ));
    assert!(!node_from_vip.contains("ip daddr . meta l4proto . th dport @cluster-ips meta mark"));

    p.cluster_ip_masquerade = ClusterIpMasquerade::All;
    let all = render(&p);
    assert!(all.contains(
        "    ip daddr . meta l4proto . th dport @cluster-ips meta mark set meta mark | 0x00004000"
    ));
    assert!(!all.contains("ip saddr . meta l4proto . th dport @cluster-ips"));

    p.cluster_ip_masquerade =
        ClusterIpMasquerade::OutsideCidrs(vec!["10.244.0.0/16".parse().unwrap()]);
    let cidrs = render(&p);
    assert!(cidrs.contains(
        "ip saddr != { 10.244.0.0/16 } ip daddr . meta l4proto . th dport @cluster-ips meta mark set"
    ));
}

#[test]
fn local_sets_are_never_marked() {
    let script = render_replace(
        &NetfilterPlan {
            v4: Some(sample_v4()),
            v6: None,
        },
        &RenderOptions::default(),
    )
    .unwrap();
    for line in script
        .lines()
        .filter(|l| l.contains("meta mark set meta mark |"))
    {
        assert!(
            !line.contains("-local"),
            "eTP=Local set marked for masquerade: {line}"
        );
    }
    assert!(script.contains(
        "fib daddr type local meta l4proto . th dport @node-ports meta mark set meta mark | 0x00004000"
    ));
}

#[test]
fn ipv6_table_uses_ipv6_types_and_loopback() {
    let mut p = FamilyPlan::new(AddressFamily::V6, ClusterIpMasquerade::NodeFromVip);
    p.cluster_ips.insert(ap("fd00:96::10", Protocol::Tcp, 80));
    p.bound_ips.insert(ip("fd00:96::10"));
    let script = render_replace(
        &NetfilterPlan {
            v4: None,
            v6: Some(p),
        },
        &RenderOptions::default(),
    )
    .unwrap();
    assert!(script.contains("type ipv6_addr . inet_proto . inet_service;"));
    assert!(script.contains("elements = { fd00:96::10 . tcp . 80 };"));
    assert!(script.contains("ip6 saddr ::1 return"));
    assert!(script.contains("ct state new ip6 daddr @service-ips"));
    assert!(!script.contains("ipv4_addr"));
}

#[test]
fn custom_table_name_and_mark() {
    let options = RenderOptions {
        table_name: "my-proxy".into(),
        masquerade_mark: 0x8000,
    };
    let script = render_replace(
        &NetfilterPlan {
            v4: Some(sample_v4()),
            v6: None,
        },
        &options,
    )
    .unwrap();
    assert!(
        script.starts_with("add table ip my-proxy\ndelete table ip my-proxy\ntable ip my-proxy {")
    );
    assert!(script.contains("meta mark & 0x00008000 == 0 return"));
    assert!(script.contains("meta mark set meta mark ^ 0x00008000"));
    assert!(!script.contains("ipvs-proxier"));
}

#[test]
fn invalid_options_are_refused() {
    let plan = NetfilterPlan::default();
    for name in ["", "1abc", "a b", "a;b", "x}"] {
        let options = RenderOptions {
            table_name: name.into(),
            ..RenderOptions::default()
        };
        assert!(
            matches!(
                render_replace(&plan, &options),
                Err(RenderError::InvalidTableName(_))
            ),
            "{name:?} accepted"
        );
    }
    let zero = RenderOptions {
        masquerade_mark: 0,
        ..RenderOptions::default()
    };
    assert_eq!(render_replace(&plan, &zero), Err(RenderError::ZeroMark));
}

#[test]
fn cleanup_removes_both_families_and_nothing_else() {
    let script = render_cleanup("ipvs-proxier").unwrap();
    assert_eq!(
        script,
        "add table ip ipvs-proxier\ndelete table ip ipvs-proxier\n\
         add table ip6 ipvs-proxier\ndelete table ip6 ipvs-proxier\n"
    );
}

fn v4_plan(p: FamilyPlan) -> NetfilterPlan {
    NetfilterPlan {
        v4: Some(p),
        v6: None,
    }
}

#[test]
fn update_adds_and_deletes_only_changed_elements() {
    let old = sample_v4();
    let mut new = old.clone();
    new.cluster_ips.remove(&ap("10.96.0.11", Protocol::Udp, 53));
    new.cluster_ips.insert(ap("10.96.0.12", Protocol::Tcp, 443));
    new.health_check_node_ports.insert(32001);
    let script = render_update(&v4_plan(old), &v4_plan(new), &RenderOptions::default()).unwrap();
    assert_eq!(
        script,
        "delete element ip ipvs-proxier cluster-ips { 10.96.0.11 . udp . 53 }\n\
         add element ip ipvs-proxier cluster-ips { 10.96.0.12 . tcp . 443 }\n\
         add element ip ipvs-proxier health-check-node-ports { 32001 }\n"
    );
}

#[test]
fn update_of_equal_plans_is_empty() {
    let plan = v4_plan(sample_v4());
    assert_eq!(
        render_update(&plan, &plan, &RenderOptions::default()).unwrap(),
        ""
    );
}

#[test]
fn update_replaces_when_the_rules_change() {
    let old = v4_plan(sample_v4());
    let mut changed_mode = sample_v4();
    changed_mode.cluster_ip_masquerade = ClusterIpMasquerade::All;
    let options = RenderOptions::default();
    let script = render_update(&old, &v4_plan(changed_mode.clone()), &options).unwrap();
    assert_eq!(
        script,
        render_replace(&v4_plan(changed_mode), &options).unwrap()
    );
    // A family appearing also needs the full script.
    let dual = NetfilterPlan {
        v4: Some(sample_v4()),
        v6: Some(FamilyPlan::new(AddressFamily::V6, ClusterIpMasquerade::All)),
    };
    assert!(
        render_update(&old, &dual, &options)
            .unwrap()
            .contains("table ip6 ipvs-proxier {")
    );
}

fn iface(name: &str) -> crate::model::config::InterfaceName {
    crate::model::config::InterfaceName::new(name).unwrap()
}

fn render_v4(p: &FamilyPlan) -> String {
    render_replace(
        &NetfilterPlan {
            v4: Some(p.clone()),
            v6: None,
        },
        &RenderOptions::default(),
    )
    .unwrap()
}

/// The one line that marks ClusterIP traffic for masquerade.
fn cluster_ip_mark_line(script: &str) -> Vec<&str> {
    script
        .lines()
        .filter(|l| l.contains("@cluster-ips meta mark set"))
        .map(str::trim)
        .collect()
}

#[test]
fn detect_local_bridge_interface_masquerades_what_does_not_arrive_on_the_bridge() {
    let mut p = sample_v4();
    p.cluster_ip_masquerade = ClusterIpMasquerade::NotFromInterface(iface("cbr0"));
    let script = render_v4(&p);
    assert_eq!(
        cluster_ip_mark_line(&script),
        vec![
            "iifname != \"cbr0\" ip daddr . meta l4proto . th dport @cluster-ips meta mark set meta mark | 0x00004000"
        ]
    );
    assert!(!script.contains("node-pod-cidrs"));
}

#[test]
fn detect_local_interface_name_prefix_is_a_wildcard_match() {
    let mut p = sample_v4();
    p.cluster_ip_masquerade = ClusterIpMasquerade::NotFromInterfacePrefix(iface("veth"));
    let script = render_v4(&p);
    assert_eq!(
        cluster_ip_mark_line(&script),
        vec![
            "iifname != \"veth*\" ip daddr . meta l4proto . th dport @cluster-ips meta mark set meta mark | 0x00004000"
        ]
    );
}

#[test]
fn detect_local_node_cidr_matches_the_node_pod_cidrs_set() {
    let mut p = sample_v4();
    p.cluster_ip_masquerade = ClusterIpMasquerade::OutsideNodePodCidrs;
    p.node_pod_cidrs.insert("10.244.1.0/24".parse().unwrap());
    let script = render_v4(&p);
    assert_eq!(
        cluster_ip_mark_line(&script),
        vec![
            "ip saddr != @node-pod-cidrs ip daddr . meta l4proto . th dport @cluster-ips meta mark set meta mark | 0x00004000"
        ]
    );
    assert!(script.contains(
        "  set node-pod-cidrs {\n    type ipv4_addr;\n    flags interval;\n    elements = { 10.244.1.0/24 };\n  }\n"
    ));

    // The Node's pod CIDR changing is a set update, not a table replace.
    let mut moved = p.clone();
    moved.node_pod_cidrs.clear();
    moved
        .node_pod_cidrs
        .insert("10.244.2.0/24".parse().unwrap());
    let old = NetfilterPlan {
        v4: Some(p),
        v6: None,
    };
    let new = NetfilterPlan {
        v4: Some(moved),
        v6: None,
    };
    assert_eq!(
        render_update(&old, &new, &RenderOptions::default()).unwrap(),
        "delete element ip ipvs-proxier node-pod-cidrs { 10.244.1.0/24 }\n\
         add element ip ipvs-proxier node-pod-cidrs { 10.244.2.0/24 }\n"
    );
}

#[test]
fn detect_local_ipv6_uses_ip6_syntax() {
    let mut p = FamilyPlan::new(AddressFamily::V6, ClusterIpMasquerade::OutsideNodePodCidrs);
    p.node_pod_cidrs.insert("fd00:244:1::/64".parse().unwrap());
    let script = render_replace(
        &NetfilterPlan {
            v4: None,
            v6: Some(p),
        },
        &RenderOptions::default(),
    )
    .unwrap();
    assert!(script.contains(
        "ip6 saddr != @node-pod-cidrs ip6 daddr . meta l4proto . th dport @cluster-ips meta mark set"
    ));
    assert!(
        script.contains(
            "    type ipv6_addr;\n    flags interval;\n    elements = { fd00:244:1::/64 };"
        )
    );
}

#[test]
fn every_detect_local_mode_keeps_the_other_rules() {
    // Only the ClusterIP marking differs between modes; node-originated traffic from a
    // VIP is handled by the node-from-VIP rule only when there is no detector.
    for mode in [
        ClusterIpMasquerade::NotFromInterface(iface("cbr0")),
        ClusterIpMasquerade::NotFromInterfacePrefix(iface("cali")),
        ClusterIpMasquerade::OutsideNodePodCidrs,
    ] {
        let mut p = sample_v4();
        p.cluster_ip_masquerade = mode.clone();
        let script = render_v4(&p);
        assert!(
            !script.contains("ip saddr . meta l4proto . th dport @cluster-ips"),
            "{mode:?}"
        );
        assert!(script.contains("ip daddr . meta l4proto . th dport @external-ips meta mark set"));
        assert!(script.contains("masquerade fully-random"));
        // A mode change is a rule change: the update replaces the tables.
        let mut other = p.clone();
        other.cluster_ip_masquerade = ClusterIpMasquerade::All;
        let update = render_update(
            &NetfilterPlan {
                v4: Some(p),
                v6: None,
            },
            &NetfilterPlan {
                v4: Some(other),
                v6: None,
            },
            &RenderOptions::default(),
        )
        .unwrap();
        assert!(update.starts_with("add table ip ipvs-proxier\ndelete table ip ipvs-proxier\n"));
    }
}

#[test]
fn routed_service_cidrs_reject_addresses_no_service_has() {
    let plain = render_replace(&v4_plan(sample_v4()), &RenderOptions::default()).unwrap();
    assert!(!plain.contains("!= @service-ips"), "{plain}");

    let mut routed = sample_v4();
    routed.routed_service_cidrs = vec![
        "10.96.0.0/12".parse().unwrap(),
        "172.30.0.0/16".parse().unwrap(),
    ];
    let script = render_replace(&v4_plan(routed.clone()), &RenderOptions::default()).unwrap();
    let input = script
        .split("chain filter-input {")
        .nth(1)
        .and_then(|rest| rest.split("\n  }").next())
        .unwrap();
    let rule =
        "ct state new ip daddr { 10.96.0.0/12, 172.30.0.0/16 } ip daddr != @service-ips reject";
    assert!(input.contains(rule), "{input}");
    // After the service addresses' ports are accepted: a Service's own address and port
    // gets through.
    assert!(input.find("jump service-address-ports").unwrap() < input.find(rule).unwrap());

    // Changing the CIDRs is a rule change: the table is replaced, not patched.
    let options = RenderOptions::default();
    let update = render_update(&v4_plan(sample_v4()), &v4_plan(routed.clone()), &options).unwrap();
    assert_eq!(update, render_replace(&v4_plan(routed), &options).unwrap());
}

#[test]
fn new_connections_to_a_bound_address_pass_on_its_service_ports_only() {
    let script = render_replace(&v4_plan(sample_v4()), &RenderOptions::default()).unwrap();
    let chain = |name: &str| {
        script
            .split(&format!("chain {name} {{"))
            .nth(1)
            .and_then(|rest| rest.split("\n  }").next())
            .unwrap_or_else(|| panic!("no chain {name}:\n{script}"))
            .to_owned()
    };
    let input = chain("filter-input");
    assert!(
        input.contains("ct state new ip daddr @service-ips jump service-address-ports"),
        "{input}"
    );
    let ports_chain = chain("service-address-ports");
    let ports: Vec<&str> = ports_chain
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    // Every set of service addresses and ports is accepted, the rest rejected, in that order.
    let accepted: BTreeSet<&str> = ports[..ports.len() - 1]
        .iter()
        .map(|line| {
            line.strip_prefix("ip daddr . meta l4proto . th dport @")
                .and_then(|rest| rest.strip_suffix(" accept"))
                .unwrap_or_else(|| panic!("not an accept of a set: {line}"))
        })
        .collect();
    assert_eq!(
        accepted,
        BTreeSet::from([
            "cluster-ips",
            "external-ips",
            "external-ips-local",
            "load-balancer-ips",
            "load-balancer-ips-local",
        ])
    );
    assert_eq!(ports.last(), Some(&"reject"));
    // The ClusterIP's port is in the table once: no second set repeats the first.
    assert_eq!(
        script.matches("10.96.0.10 . tcp . 80").count(),
        1,
        "{script}"
    );
}

#[test]
fn addresses_and_numbers_are_written_as_display_writes_them() {
    let mut addresses: Vec<IpAddr> = ["0.0.0.0", "255.255.255.255", "10.96.0.1", "1.20.100.9"]
        .into_iter()
        .map(ip)
        .collect();
    // Every octet value in every position.
    addresses.extend((0..=255u8).map(|o| IpAddr::from([o, 255 - o, o / 7, o.wrapping_mul(3)])));
    addresses.extend(["::1", "fd00::10", "2001:db8::ff:1"].into_iter().map(ip));
    for address in addresses {
        let mut text = String::new();
        push_ip(&mut text, address);
        assert_eq!(text, address.to_string());
    }
    for n in [
        0,
        1,
        9,
        10,
        99,
        100,
        30080,
        65535,
        u32::from(u16::MAX) + 1,
        u32::MAX,
    ] {
        let mut text = String::from("x");
        push_decimal(&mut text, n);
        assert_eq!(text, format!("x{n}"));
    }
}
