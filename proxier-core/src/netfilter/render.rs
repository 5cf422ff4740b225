//! The pure half of applying: a [`NetfilterPlan`] in, an `nft -f` script out.
//!
//! The script replaces each family's table in one transaction: `nft -f` sends the whole
//! file to the kernel as one netlink batch, and the batch either commits whole or not at
//! all. Within it, `add table` (a no-op when the table exists) followed by `delete table`
//! removes the old table without failing when there is none, and the `table { ... }` block
//! that follows creates the new one. A reader (`nft list table`, or a packet) sees the old
//! table or the new one, never a mix.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use ipnet::IpNet;

use super::plan::{AddrPort, ClusterIpMasquerade, FamilyPlan, NetfilterPlan, ProtoPort};
use crate::desired::Protocol;
use crate::model::AddressFamily;

/// Default name of the proxier's tables (one in family `ip`, one in `ip6`).
pub const DEFAULT_TABLE_NAME: &str = "ipvs-proxier";

/// The set, in each of the proxier's tables, holding the digest of the tables' contents
/// ([`super::digest`]): one element `0xHIGH . 0xLOW` (type `mark . mark`).
pub const DIGEST_SET: &str = "plan-digest";

/// Names of the sets of each family's table (see the module documentation of
/// [`super`] for what each holds).
pub(super) mod set_name {
    /// `cluster-ips`.
    pub const CLUSTER_IPS: &str = "cluster-ips";
    /// `external-ips`.
    pub const EXTERNAL_IPS: &str = "external-ips";
    /// `external-ips-local`.
    pub const EXTERNAL_IPS_LOCAL: &str = "external-ips-local";
    /// `load-balancer-ips`.
    pub const LOAD_BALANCER_IPS: &str = "load-balancer-ips";
    /// `load-balancer-ips-local`.
    pub const LOAD_BALANCER_IPS_LOCAL: &str = "load-balancer-ips-local";
    /// `node-ports`.
    pub const NODE_PORTS: &str = "node-ports";
    /// `node-ports-local`.
    pub const NODE_PORTS_LOCAL: &str = "node-ports-local";
    /// `load-balancer-firewall`.
    pub const LOAD_BALANCER_FIREWALL: &str = "load-balancer-firewall";
    /// `load-balancer-source-ranges-tcp`, `-udp` and `-sctp`: one interval set per protocol.
    pub fn load_balancer_source_ranges(protocol: crate::desired::Protocol) -> &'static str {
        match protocol {
            crate::desired::Protocol::Tcp => "load-balancer-source-ranges-tcp",
            crate::desired::Protocol::Udp => "load-balancer-source-ranges-udp",
            crate::desired::Protocol::Sctp => "load-balancer-source-ranges-sctp",
        }
    }
    /// `load-balancer-node-allowed`.
    pub const LOAD_BALANCER_NODE_ALLOWED: &str = "load-balancer-node-allowed";
    /// `hairpin`.
    pub const HAIRPIN: &str = "hairpin";
    /// `health-check-node-ports`.
    pub const HEALTH_CHECK_NODE_PORTS: &str = "health-check-node-ports";
    /// `service-ips`.
    pub const SERVICE_IPS: &str = "service-ips";
    /// `node-pod-cidrs`.
    pub const NODE_POD_CIDRS: &str = "node-pod-cidrs";
}

/// Default masquerade mark bit: kube-proxy's `--iptables-masquerade-bit` 14.
pub const DEFAULT_MASQUERADE_MARK: u32 = 0x4000;

/// Priority of the output filter chain: before IPVS's LOCAL_OUT hook (-99), so that it sees
/// node-originated packets still addressed to the load-balancer IP (after conntrack, -200).
const OUTPUT_FILTER_PRIORITY: i32 = -110;

/// Names and marks the rendered tables use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Table name, in both families.
    pub table_name: String,
    /// The packet-mark bit(s) that mean "masquerade this connection".
    pub masquerade_mark: u32,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            table_name: DEFAULT_TABLE_NAME.to_owned(),
            masquerade_mark: DEFAULT_MASQUERADE_MARK,
        }
    }
}

/// Why options cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The table name is not an nft identifier.
    #[error(
        "table name {0:?} is not a valid nft identifier (a letter, then letters, digits, '-' or '_')"
    )]
    InvalidTableName(String),
    /// The masquerade mark is zero.
    #[error("the masquerade mark must have at least one bit set")]
    ZeroMark,
}

impl RenderOptions {
    /// Checks that the options render to a valid script.
    pub fn validate(&self) -> Result<(), RenderError> {
        let mut chars = self.table_name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !first_ok || !rest_ok || self.table_name.len() > 200 {
            return Err(RenderError::InvalidTableName(self.table_name.clone()));
        }
        if self.masquerade_mark == 0 {
            return Err(RenderError::ZeroMark);
        }
        Ok(())
    }
}

/// The nft family keyword of an address family.
pub fn nft_family(family: AddressFamily) -> &'static str {
    match family {
        AddressFamily::V4 => "ip",
        AddressFamily::V6 => "ip6",
    }
}

/// Renders the script that makes the kernel hold exactly `plan`: each planned family's table
/// replaced, each unplanned family's table removed, all in one transaction.
pub fn render_replace(
    plan: &NetfilterPlan,
    options: &RenderOptions,
) -> Result<String, RenderError> {
    options.validate()?;
    let mut out = String::new();
    for family in AddressFamily::ALL {
        remove_table(&mut out, family, &options.table_name);
        if let Some(family_plan) = plan.family(family) {
            render_table(&mut out, family_plan, &set_contents(family_plan), options);
        }
    }
    Ok(out)
}

/// Renders the script that removes the proxier's tables of both families (and everything in
/// them); harmless when they do not exist.
pub fn render_cleanup(table_name: &str) -> Result<String, RenderError> {
    let options = RenderOptions {
        table_name: table_name.to_owned(),
        ..RenderOptions::default()
    };
    options.validate()?;
    let mut out = String::new();
    for family in AddressFamily::ALL {
        remove_table(&mut out, family, table_name);
    }
    Ok(out)
}

fn remove_table(out: &mut String, family: AddressFamily, table: &str) {
    let family = nft_family(family);
    // `add` makes the `delete` safe when the table is absent.
    let _ = writeln!(out, "add table {family} {table}");
    let _ = writeln!(out, "delete table {family} {table}");
}

struct Syntax {
    family: &'static str,
    addr_type: &'static str,
    loopback: &'static str,
}

impl Syntax {
    fn of(family: AddressFamily) -> Self {
        match family {
            AddressFamily::V4 => Syntax {
                family: "ip",
                addr_type: "ipv4_addr",
                loopback: "127.0.0.0/8",
            },
            AddressFamily::V6 => Syntax {
                family: "ip6",
                addr_type: "ipv6_addr",
                loopback: "::1",
            },
        }
    }
}

fn render_table(out: &mut String, plan: &FamilyPlan, sets: &[SetContent], options: &RenderOptions) {
    let s = Syntax::of(plan.family);
    let fam = s.family;
    let mark = format!("{:#010x}", options.masquerade_mark);
    let dst_key = format!("{fam} daddr . meta l4proto . th dport");

    let _ = writeln!(out, "table {fam} {} {{", options.table_name);

    // Sets (the ipsets of kube-proxy's IPVS mode).
    for content in sets {
        set(
            out,
            content.name,
            &content.key_type,
            content.interval,
            &content.elements,
        );
    }
    // What the tables hold, as one number (filled by the caller: `super::digest`).
    set(out, DIGEST_SET, "mark . mark", false, &BTreeSet::new());

    // Masquerade marking, for packets from pods (prerouting) and from the node (output).
    let mark_it = format!("meta mark set meta mark | {mark}");
    let _ = writeln!(out, "  chain mark-for-masquerade {{");
    let _ = writeln!(out, "    {fam} saddr {} return", s.loopback);
    match &plan.cluster_ip_masquerade {
        ClusterIpMasquerade::All => {
            let _ = writeln!(out, "    {dst_key} @cluster-ips {mark_it}");
        }
        ClusterIpMasquerade::OutsideCidrs(cidrs) => {
            let list: Vec<String> = cidrs
                .iter()
                .map(|n| {
                    let mut text = String::new();
                    net_elem(&mut text, *n);
                    text
                })
                .collect();
            let _ = writeln!(
                out,
                "    {fam} saddr != {{ {} }} {dst_key} @cluster-ips {mark_it}",
                list.join(", ")
            );
        }
        ClusterIpMasquerade::OutsideNodePodCidrs => {
            let _ = writeln!(
                out,
                "    {fam} saddr != @node-pod-cidrs {dst_key} @cluster-ips {mark_it}"
            );
        }
        ClusterIpMasquerade::NotFromInterface(name) => {
            // Validated names hold no quote, backslash, whitespace or '*'.
            let _ = writeln!(
                out,
                "    iifname != \"{name}\" {dst_key} @cluster-ips {mark_it}"
            );
        }
        ClusterIpMasquerade::NotFromInterfacePrefix(prefix) => {
            let _ = writeln!(
                out,
                "    iifname != \"{prefix}*\" {dst_key} @cluster-ips {mark_it}"
            );
        }
        ClusterIpMasquerade::NodeFromVip => {}
    }
    let _ = writeln!(out, "    {dst_key} @external-ips {mark_it}");
    let _ = writeln!(out, "    {dst_key} @load-balancer-ips {mark_it}");
    let _ = writeln!(
        out,
        "    fib daddr type local meta l4proto . th dport @node-ports {mark_it}"
    );
    let _ = writeln!(out, "  }}");

    let _ = writeln!(out, "  chain nat-prerouting {{");
    let _ = writeln!(
        out,
        "    type nat hook prerouting priority dstnat; policy accept;"
    );
    let _ = writeln!(out, "    jump mark-for-masquerade");
    let _ = writeln!(out, "  }}");

    let _ = writeln!(out, "  chain nat-output {{");
    let _ = writeln!(
        out,
        "    type nat hook output priority -100; policy accept;"
    );
    if plan.cluster_ip_masquerade == ClusterIpMasquerade::NodeFromVip {
        let _ = writeln!(
            out,
            "    {fam} saddr . meta l4proto . th dport @cluster-ips {mark_it}"
        );
    }
    let _ = writeln!(out, "    jump mark-for-masquerade");
    let _ = writeln!(out, "  }}");

    let _ = writeln!(out, "  chain nat-postrouting {{");
    let _ = writeln!(
        out,
        "    type nat hook postrouting priority srcnat; policy accept;"
    );
    let _ = writeln!(
        out,
        "    {dst_key} . {fam} saddr @hairpin masquerade fully-random"
    );
    let _ = writeln!(out, "    meta mark & {mark} == 0 return");
    let _ = writeln!(out, "    meta mark set meta mark ^ {mark}");
    let _ = writeln!(out, "    masquerade fully-random");
    let _ = writeln!(out, "  }}");

    // Filtering of traffic to service addresses, before IPVS takes it (LOCAL_IN, priority 98).
    // One interval set per protocol, the protocol matched before the lookup: nft before 1.1
    // puts a byte-order conversion of the one-byte `meta l4proto` into an interval
    // concatenation's key, which kernels from 6.12 on refuse (docs/kernels.md).
    let _ = writeln!(out, "  chain source-ranges {{");
    for protocol in PROTOCOLS {
        let _ = writeln!(
            out,
            "    meta l4proto {} {fam} daddr . th dport . {fam} saddr @{} return",
            proto(protocol),
            set_name::load_balancer_source_ranges(protocol)
        );
    }
    let _ = writeln!(out, "    drop");
    let _ = writeln!(out, "  }}");

    // A new connection to a bound address: its Services' ports pass, anything else is
    // rejected. The sets each Service port is in already, rather than a union of them that
    // would hold every ClusterIP port a second time.
    let _ = writeln!(out, "  chain service-address-ports {{");
    for set in [
        set_name::CLUSTER_IPS,
        set_name::EXTERNAL_IPS,
        set_name::EXTERNAL_IPS_LOCAL,
        set_name::LOAD_BALANCER_IPS,
        set_name::LOAD_BALANCER_IPS_LOCAL,
    ] {
        let _ = writeln!(out, "    {dst_key} @{set} accept");
    }
    let _ = writeln!(out, "    reject");
    let _ = writeln!(out, "  }}");

    let _ = writeln!(out, "  chain filter-input {{");
    let _ = writeln!(
        out,
        "    type filter hook input priority filter; policy accept;"
    );
    let _ = writeln!(
        out,
        "    {dst_key} @load-balancer-firewall jump source-ranges"
    );
    let _ = writeln!(out, "    tcp dport @health-check-node-ports accept");
    // Every protocol, as kube-proxy's KUBE-IPVS-FILTER: a VIP answers nothing but its
    // Service ports (no ping either). New connections only, so the ICMP errors of
    // established flows pass; and only they pay the lookups of the ports.
    let _ = writeln!(
        out,
        "    ct state new {fam} daddr @service-ips jump service-address-ports"
    );
    if !plan.routed_service_cidrs.is_empty() {
        // The node takes these CIDRs whole (a local route): an address of them that no
        // Service has must not reach the node's own sockets. New connections only: the
        // ICMP error a reject sends to the node itself (from such an address) must pass.
        let cidrs: Vec<String> = plan
            .routed_service_cidrs
            .iter()
            .map(ToString::to_string)
            .collect();
        let _ = writeln!(
            out,
            "    ct state new {fam} daddr {{ {} }} {fam} daddr != @service-ips reject",
            cidrs.join(", ")
        );
    }
    let _ = writeln!(out, "  }}");

    let _ = writeln!(out, "  chain filter-output {{");
    let _ = writeln!(
        out,
        "    type filter hook output priority {OUTPUT_FILTER_PRIORITY}; policy accept;"
    );
    let _ = writeln!(out, "    {dst_key} @load-balancer-node-allowed accept");
    let _ = writeln!(out, "    {dst_key} @load-balancer-firewall drop");
    let _ = writeln!(out, "  }}");

    let _ = writeln!(out, "}}");
}

/// One set of a family's table, with its elements rendered as nft text.
pub(super) struct SetContent {
    pub(super) name: &'static str,
    key_type: String,
    interval: bool,
    pub(super) elements: BTreeSet<String>,
}

/// What [`visit_sets`] shows each set of a family's table to.
pub(super) trait SetVisitor {
    /// A set begins: its name, its type and whether it holds intervals.
    fn set(&mut self, name: &'static str, key_type: &str, interval: bool);
    /// One element of the set last begun, as nft text.
    fn element(&mut self, element: &str);
}

/// Shows every set of a family's table with its elements to `visitor`, in order, each
/// element rendered into one buffer reused for all: the one definition of what the sets
/// hold, for the script ([`set_contents`]) and for the digest, which hashes the elements
/// without keeping them.
pub(super) fn visit_sets(plan: &FamilyPlan, visitor: &mut impl SetVisitor) {
    let addr = Syntax::of(plan.family).addr_type;
    let addr_port = format!("{addr} . inet_proto . inet_service");
    let proto_port = "inet_proto . inet_service";
    let with_addr = format!("{addr_port} . {addr}");
    let mut buf = String::with_capacity(64);
    let mut sets = SetWriter {
        visitor,
        buf: &mut buf,
    };
    sets.each(
        set_name::CLUSTER_IPS,
        &addr_port,
        false,
        &plan.cluster_ips,
        addr_port_elem,
    );
    sets.each(
        set_name::EXTERNAL_IPS,
        &addr_port,
        false,
        &plan.external_ips,
        addr_port_elem,
    );
    sets.each(
        set_name::EXTERNAL_IPS_LOCAL,
        &addr_port,
        false,
        &plan.external_ips_local,
        addr_port_elem,
    );
    sets.each(
        set_name::LOAD_BALANCER_IPS,
        &addr_port,
        false,
        &plan.load_balancer_ips,
        addr_port_elem,
    );
    sets.each(
        set_name::LOAD_BALANCER_IPS_LOCAL,
        &addr_port,
        false,
        &plan.load_balancer_ips_local,
        addr_port_elem,
    );
    sets.each(
        set_name::NODE_PORTS,
        proto_port,
        false,
        &plan.node_ports,
        proto_port_elem,
    );
    sets.each(
        set_name::NODE_PORTS_LOCAL,
        proto_port,
        false,
        &plan.node_ports_local,
        proto_port_elem,
    );
    sets.each(
        set_name::LOAD_BALANCER_FIREWALL,
        &addr_port,
        false,
        &plan.firewalled,
        addr_port_elem,
    );
    let port_with_addr = format!("{addr} . inet_service . {addr}");
    for protocol in PROTOCOLS {
        sets.each_where(
            set_name::load_balancer_source_ranges(protocol),
            &port_with_addr,
            true,
            &plan.source_ranges,
            |range| range.target.protocol == protocol,
            |buf, range| {
                push_ip(buf, range.target.address);
                buf.push_str(" . ");
                push_decimal(buf, u32::from(range.target.port));
                buf.push_str(" . ");
                net_elem(buf, range.source);
            },
        );
    }
    sets.each(
        set_name::LOAD_BALANCER_NODE_ALLOWED,
        &addr_port,
        false,
        &plan.node_allowed,
        addr_port_elem,
    );
    sets.each(
        set_name::HAIRPIN,
        &with_addr,
        false,
        &plan.hairpin,
        |buf, e| {
            addr_port_elem(buf, e);
            buf.push_str(" . ");
            push_ip(buf, e.address);
        },
    );
    sets.each(
        set_name::HEALTH_CHECK_NODE_PORTS,
        "inet_service",
        false,
        &plan.health_check_node_ports,
        |buf, port| push_decimal(buf, u32::from(*port)),
    );
    sets.each(
        set_name::SERVICE_IPS,
        addr,
        false,
        &plan.bound_ips,
        |buf, ip| {
            push_ip(buf, *ip);
        },
    );
    // Only the NodeCIDR mode has this set: the tables of the other modes stay as they were.
    if plan.cluster_ip_masquerade == ClusterIpMasquerade::OutsideNodePodCidrs {
        sets.each(
            set_name::NODE_POD_CIDRS,
            addr,
            true,
            &plan.node_pod_cidrs,
            |buf, net| {
                net_elem(buf, *net);
            },
        );
    }
}

/// [`visit_sets`]' walk: a visitor and the buffer each element is rendered into.
struct SetWriter<'a, V> {
    visitor: &'a mut V,
    buf: &'a mut String,
}

impl<V: SetVisitor> SetWriter<'_, V> {
    fn each<T>(
        &mut self,
        name: &'static str,
        key_type: &str,
        interval: bool,
        items: &BTreeSet<T>,
        write: impl Fn(&mut String, &T),
    ) {
        self.each_where(name, key_type, interval, items, |_| true, write);
    }

    /// [`Self::each`] for the items `keep` accepts.
    fn each_where<T>(
        &mut self,
        name: &'static str,
        key_type: &str,
        interval: bool,
        items: &BTreeSet<T>,
        keep: impl Fn(&T) -> bool,
        write: impl Fn(&mut String, &T),
    ) {
        self.visitor.set(name, key_type, interval);
        for item in items.iter().filter(|item| keep(item)) {
            self.buf.clear();
            write(self.buf, item);
            self.visitor.element(self.buf);
        }
    }
}

/// Every set of a family's table with its elements, as rendered.
pub(super) fn set_contents(plan: &FamilyPlan) -> Vec<SetContent> {
    let mut sets = Vec::new();
    visit_sets(plan, &mut sets);
    sets
}

/// Collects the sets whole ([`set_contents`]).
impl SetVisitor for Vec<SetContent> {
    fn set(&mut self, name: &'static str, key_type: &str, interval: bool) {
        self.push(SetContent {
            name,
            key_type: key_type.to_owned(),
            interval,
            elements: BTreeSet::new(),
        });
    }

    fn element(&mut self, element: &str) {
        if let Some(set) = self.last_mut() {
            set.elements.insert(element.to_owned());
        }
    }
}

/// Every element `plan` puts in a set that holds single values (the interval sets are left
/// out), as `(family, set, element)` with the element written as `nft list set` prints it:
/// what a reader of the kernel's sets checks membership against.
pub fn set_elements(plan: &NetfilterPlan) -> Vec<(AddressFamily, &'static str, String)> {
    AddressFamily::ALL
        .into_iter()
        .filter_map(|family| plan.family(family))
        .flat_map(|family_plan| {
            set_contents(family_plan)
                .into_iter()
                .filter(|set| !set.interval)
                .flat_map(move |set| {
                    set.elements
                        .into_iter()
                        .map(move |element| (family_plan.family, set.name, element))
                })
        })
        .collect()
}

/// The elements of one set in an `nft list set` listing (`elements = { a, b }`), each written
/// as this module renders it: whitespace made single spaces, and a field of type
/// `inet_proto` (read from the listing's `type` line) as the protocol's name, whether nft
/// printed the name or the number (it prints the number where `/etc/protocols` lacks the
/// protocol). A listing read on any host compares equal to [`set_elements`].
pub fn parse_set_elements(listing: &str) -> BTreeSet<String> {
    let Some(start) = listing.find("elements = {") else {
        return BTreeSet::new();
    };
    let key_type: Vec<&str> = listing[..start]
        .lines()
        .filter_map(|line| line.trim().strip_prefix("type "))
        .next_back()
        .map(|key| {
            key.trim_end_matches(';')
                .split(" . ")
                .map(str::trim)
                .collect()
        })
        .unwrap_or_default();
    let body = &listing[start + "elements = {".len()..];
    let body = body.split('}').next().unwrap_or_default();
    body.split(',')
        .map(|element| listed_element(element, &key_type))
        .filter(|element| !element.is_empty())
        .collect()
}

/// One element of a listing, its fields (`a . b . c`) matched with the set's `key_type`:
/// each `inet_proto` field named as [`proto`] names it. An element whose fields do not
/// match the key type keeps its words as listed.
fn listed_element(element: &str, key_type: &[&str]) -> String {
    let words: Vec<&str> = element.split_whitespace().collect();
    let fields: Vec<&[&str]> = words.split(|word| *word == ".").collect();
    if fields.len() != key_type.len() {
        return words.join(" ");
    }
    let mut out = String::with_capacity(element.len());
    for (i, (field, field_type)) in fields.iter().zip(key_type).enumerate() {
        if i > 0 {
            out.push_str(" . ");
        }
        let name = match field {
            [word] if *field_type == "inet_proto" => listed_protocol(word).map(proto),
            _ => None,
        };
        match name {
            Some(name) => out.push_str(name),
            None => out.push_str(&field.join(" ")),
        }
    }
    out
}

/// The protocol an `inet_proto` field names, written as its name or its IP protocol number.
fn listed_protocol(word: &str) -> Option<Protocol> {
    match word.parse::<u16>() {
        Ok(number) => Protocol::from_number(number),
        Err(_) => [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
            .into_iter()
            .find(|protocol| proto(*protocol) == word),
    }
}

/// Renders the script that turns the tables of `old` (as applied) into those of `new` by
/// adding and deleting set elements only, in one transaction: the cost follows the size of
/// the change, not of the cluster. Falls back to [`render_replace`] when the rules
/// themselves differ (a family added or removed, another masquerade mode). An empty string
/// means nothing to do.
///
/// The script fails as a whole (and changes nothing) if the kernel does not hold `old`
/// exactly, e.g. after someone edited the table: the caller then replaces the table.
pub fn render_update(
    old: &NetfilterPlan,
    new: &NetfilterPlan,
    options: &RenderOptions,
) -> Result<String, RenderError> {
    options.validate()?;
    let same_rules = AddressFamily::ALL.into_iter().all(|family| {
        match (old.family(family), new.family(family)) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.cluster_ip_masquerade == b.cluster_ip_masquerade
                    && a.routed_service_cidrs == b.routed_service_cidrs
            }
            _ => false,
        }
    });
    if !same_rules {
        return render_replace(new, options);
    }
    let mut out = String::new();
    for family in AddressFamily::ALL {
        let (Some(old), Some(new)) = (old.family(family), new.family(family)) else {
            continue;
        };
        let fam = nft_family(family);
        let table = &options.table_name;
        for (before, after) in set_contents(old).into_iter().zip(set_contents(new)) {
            let gone: Vec<&String> = before.elements.difference(&after.elements).collect();
            let added: Vec<&String> = after.elements.difference(&before.elements).collect();
            if !gone.is_empty() {
                let list: Vec<&str> = gone.iter().map(|e| e.as_str()).collect();
                let _ = writeln!(
                    out,
                    "delete element {fam} {table} {} {{ {} }}",
                    before.name,
                    list.join(", ")
                );
            }
            if !added.is_empty() {
                let list: Vec<&str> = added.iter().map(|e| e.as_str()).collect();
                let _ = writeln!(
                    out,
                    "add element {fam} {table} {} {{ {} }}",
                    after.name,
                    list.join(", ")
                );
            }
        }
    }
    Ok(out)
}

fn set(out: &mut String, name: &str, key_type: &str, interval: bool, elements: &BTreeSet<String>) {
    let _ = writeln!(out, "  set {name} {{");
    let _ = writeln!(out, "    type {key_type};");
    if interval {
        let _ = writeln!(out, "    flags interval;");
    }
    if !elements.is_empty() {
        out.push_str("    elements = { ");
        for (i, element) in elements.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(element);
        }
        out.push_str(" };\n");
    }
    let _ = writeln!(out, "  }}");
}

/// The protocols a Service port may have, in the order their sets and rules are written.
const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

fn proto(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

fn addr_port_elem(buf: &mut String, e: &AddrPort) {
    push_ip(buf, e.address);
    buf.push_str(" . ");
    buf.push_str(proto(e.protocol));
    buf.push_str(" . ");
    push_decimal(buf, u32::from(e.port));
}

fn proto_port_elem(buf: &mut String, e: &ProtoPort) {
    buf.push_str(proto(e.protocol));
    buf.push_str(" . ");
    push_decimal(buf, u32::from(e.port));
}

fn net_elem(buf: &mut String, net: IpNet) {
    let net = net.trunc();
    push_ip(buf, net.addr());
    buf.push('/');
    push_decimal(buf, u32::from(net.prefix_len()));
}

/// Appends `address` as its `Display` writes it; an IPv4 address without the formatting
/// machinery (the sets hold tens of thousands, and the digest renders them all at a start).
fn push_ip(buf: &mut String, address: IpAddr) {
    match address {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf.push('.');
                }
                push_decimal(buf, u32::from(octet));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(buf, "{v6}");
        }
    }
}

/// Appends `n` in decimal, as `Display` writes it.
fn push_decimal(buf: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    loop {
        start -= 1;
        // A digit: n % 10 is below 10.
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for digit in &digits[start..] {
        buf.push(char::from(*digit));
    }
}

#[cfg(test)]
mod tests;
