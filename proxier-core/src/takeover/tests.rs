//! The pure part on real dumps: `testdata/*.save` were written by `iptables-legacy-save` and
//! `iptables-nft-save` (1.8.9) in a namespace holding kube-proxy's IPVS footprint as
//! `tests/tests/takeover_support/kube_proxy_ipvs.sh` builds it, the kubelet's chains, and a
//! foreign chain `FOREIGN-INPUT` matching the foreign set `foreign-allow`.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use super::*;

const LEGACY: &str = include_str!("testdata/iptables-legacy-current.save");
const NFT: &str = include_str!("testdata/iptables-nft-current.save");
const IPSETS: &str = include_str!("testdata/ipset-list-n.txt");

fn chains(plan: &IptablesPlan) -> BTreeSet<String> {
    plan.tables
        .iter()
        .flat_map(|t| t.chains.iter().map(move |c| format!("{} {c}", t.table)))
        .collect()
}

fn jumps(plan: &IptablesPlan) -> BTreeSet<String> {
    plan.tables
        .iter()
        .flat_map(|t| {
            t.rules
                .iter()
                .map(move |r| format!("{} {} -> {}", t.table, r.chain, r.target.clone().unwrap()))
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// Every chain and jump kube-proxy 1.31's IPVS mode makes, as its source lists them.
fn current_chains() -> BTreeSet<String> {
    set(&[
        "mangle KUBE-PROXY-CANARY",
        "nat KUBE-PROXY-CANARY",
        "nat KUBE-SERVICES",
        "nat KUBE-POSTROUTING",
        "nat KUBE-NODE-PORT",
        "nat KUBE-LOAD-BALANCER",
        "nat KUBE-MARK-MASQ",
        "filter KUBE-PROXY-CANARY",
        "filter KUBE-FORWARD",
        "filter KUBE-NODE-PORT",
        "filter KUBE-PROXY-FIREWALL",
        "filter KUBE-SOURCE-RANGES-FIREWALL",
        "filter KUBE-IPVS-FILTER",
        "filter KUBE-IPVS-OUT-FILTER",
    ])
}

fn current_jumps() -> BTreeSet<String> {
    set(&[
        "nat PREROUTING -> KUBE-SERVICES",
        "nat OUTPUT -> KUBE-SERVICES",
        "nat POSTROUTING -> KUBE-POSTROUTING",
        "filter INPUT -> KUBE-IPVS-FILTER",
        "filter INPUT -> KUBE-PROXY-FIREWALL",
        "filter INPUT -> KUBE-NODE-PORT",
        "filter FORWARD -> KUBE-PROXY-FIREWALL",
        "filter FORWARD -> KUBE-FORWARD",
        "filter OUTPUT -> KUBE-IPVS-OUT-FILTER",
    ])
}

#[test]
fn current_kube_proxy_is_removed_whole_in_both_flavours() {
    for dump in [LEGACY, NFT] {
        let plan = plan_iptables(&parse_save(dump).unwrap());
        assert_eq!(chains(&plan), current_chains());
        assert_eq!(jumps(&plan), current_jumps());
        assert!(plan.kept.is_empty(), "{:?}", plan.kept);
        // Only the foreign chain's set is still in use.
        assert_eq!(plan.sets_in_use, set(&["foreign-allow"]));
    }
}

#[test]
fn the_kubelets_and_foreign_chains_and_rules_stay() {
    let tables = parse_save(LEGACY).unwrap();
    let plan = plan_iptables(&tables);
    let removed = chains(&plan);
    for kept in [
        "filter KUBE-FIREWALL",
        "filter KUBE-KUBELET-CANARY",
        "nat KUBE-KUBELET-CANARY",
        "mangle KUBE-KUBELET-CANARY",
        "filter FOREIGN-INPUT",
        "filter INPUT",
    ] {
        assert!(!removed.contains(kept), "{kept} must stay");
    }
    let deleted: Vec<&Rule> = plan.tables.iter().flat_map(|t| &t.rules).collect();
    assert!(
        deleted
            .iter()
            .all(|r| r.target.as_deref() != Some("KUBE-FIREWALL"))
    );
    assert!(
        deleted
            .iter()
            .all(|r| r.target.as_deref() != Some("FOREIGN-INPUT"))
    );
}

#[test]
fn the_restore_script_deletes_jumps_then_flushes_then_deletes_chains() {
    let plan = plan_iptables(&parse_save(NFT).unwrap());
    let script = plan.restore_script();
    let nat: Vec<&str> = script
        .split("*nat\n")
        .nth(1)
        .unwrap()
        .split("COMMIT")
        .next()
        .unwrap()
        .lines()
        .collect();
    let first_flush = nat.iter().position(|l| l.starts_with("-F ")).unwrap();
    let first_delete = nat.iter().position(|l| l.starts_with("-X ")).unwrap();
    assert!(nat[..first_flush].iter().all(|l| l.starts_with("-D ")));
    assert!(
        nat[first_flush..first_delete]
            .iter()
            .all(|l| l.starts_with("-F "))
    );
    assert!(nat[first_delete..].iter().all(|l| l.starts_with("-X ")));
    // Jump rules are deleted by their exact specification, quotes as iptables-save wrote them.
    assert!(nat.contains(
        &"-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
    ));
    assert_eq!(script.matches("COMMIT\n").count(), 3);
}

#[test]
fn ipsets_go_unless_a_remaining_rule_uses_them() {
    let mut in_use = BTreeSet::new();
    for dump in [LEGACY, NFT] {
        in_use.extend(plan_iptables(&parse_save(dump).unwrap()).sets_in_use);
    }
    let plan = plan_ipsets(IPSETS, &in_use);
    assert_eq!(plan.destroy.len(), 17, "{:?}", plan.destroy);
    assert!(!plan.destroy.contains(&"foreign-allow".to_owned()));
    assert!(plan.kept.is_empty());
}

/// An older node (kube-proxy about 1.20, kubelet before 1.24): the load-balancer chain is
/// `nat KUBE-FIREWALL`, the kubelet also made `KUBE-MARK-DROP`, `KUBE-MARK-MASQ` and
/// `KUBE-POSTROUTING`, and its hostport chain jumps to `KUBE-MARK-MASQ`.
const OLDER: &str = r#"# Generated by iptables-save v1.8.4 on Mon Mar  1 10:00:00 2021
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-HOSTPORTS - [0:0]
:KUBE-HP-ABCDEFGHIJKLMNOP - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-DROP - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m comment --comment "kube hostport portals" -m addrtype --dst-type LOCAL -j KUBE-HOSTPORTS
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-FIREWALL -j KUBE-MARK-DROP
-A KUBE-HOSTPORTS -p tcp -m comment --comment "default/web hostport 8080" -m tcp --dport 8080 -j KUBE-HP-ABCDEFGHIJKLMNOP
-A KUBE-HP-ABCDEFGHIJKLMNOP -s 10.244.0.5/32 -m comment --comment "default/web hostport 8080" -j KUBE-MARK-MASQ
-A KUBE-HP-ABCDEFGHIJKLMNOP -p tcp -m comment --comment "default/web hostport 8080" -m tcp -j DNAT --to-destination 10.244.0.5:80
-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port for load balancer with sourceRange" -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-FIREWALL
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" -m mark --mark 0x8000/0x8000 -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
COMMIT
"#;

#[test]
fn older_releases_lose_their_chains_but_a_chain_another_program_uses_stays() {
    let plan = plan_iptables(&parse_save(OLDER).unwrap());
    // The hostport chain's rule keeps KUBE-MARK-MASQ: deleting it would break hostports.
    assert_eq!(plan.kept.len(), 1, "{:?}", plan.kept);
    assert_eq!(plan.kept[0].chain, "KUBE-MARK-MASQ");
    assert_eq!(plan.kept[0].referenced_from, "KUBE-HP-ABCDEFGHIJKLMNOP");
    assert_eq!(
        chains(&plan),
        set(&[
            "nat KUBE-FIREWALL",
            "nat KUBE-LOAD-BALANCER",
            "nat KUBE-NODE-PORT",
            "nat KUBE-POSTROUTING",
            "nat KUBE-SERVICES",
            "filter KUBE-FORWARD",
        ])
    );
    // The kubelet's KUBE-MARK-DROP (in nat) and KUBE-FIREWALL (in filter) stay, with the
    // jumps to them; so does the hostport jump.
    assert_eq!(
        jumps(&plan),
        set(&[
            "nat PREROUTING -> KUBE-SERVICES",
            "nat OUTPUT -> KUBE-SERVICES",
            "nat POSTROUTING -> KUBE-POSTROUTING",
            "filter FORWARD -> KUBE-FORWARD",
        ])
    );
    assert!(plan.sets_in_use.is_empty(), "{:?}", plan.sets_in_use);
}

#[test]
fn a_kept_chain_keeps_what_it_leads_to() {
    let dump = "*nat\n:PREROUTING ACCEPT [0:0]\n:OTHER - [0:0]\n:KUBE-SERVICES - [0:0]\n\
                :KUBE-NODE-PORT - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A OTHER -j KUBE-SERVICES\n\
                -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-NODE-PORT\nCOMMIT\n";
    let plan = plan_iptables(&parse_save(dump).unwrap());
    assert!(plan.is_empty(), "{plan:?}");
    let kept: BTreeSet<&str> = plan.kept.iter().map(|k| k.chain.as_str()).collect();
    assert_eq!(
        kept,
        ["KUBE-NODE-PORT", "KUBE-SERVICES"].into_iter().collect()
    );
    assert_eq!(plan.sets_in_use, set(&["KUBE-CLUSTER-IP"]));
    let ipsets = plan_ipsets("KUBE-CLUSTER-IP\n", &plan.sets_in_use);
    assert_eq!(ipsets.kept, ["KUBE-CLUSTER-IP"]);
    assert!(ipsets.destroy.is_empty());
}

#[test]
fn the_plan_lists_what_goes_and_what_stays() {
    let mut plan = TakeoverPlan {
        iptables: vec![(
            IptablesTool::named("iptables-legacy"),
            plan_iptables(&parse_save(OLDER).unwrap()),
        )],
        ..TakeoverPlan::default()
    };
    plan.ipsets = plan_ipsets("KUBE-CLUSTER-IP\nforeign\n", &BTreeSet::new());
    let text = plan.to_string();
    assert!(text.contains(
        "remove rule   iptables-legacy -t nat -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
    ));
    assert!(text.contains("remove chain  iptables-legacy -t filter KUBE-FORWARD\n"));
    assert!(text.contains("remove ipset  KUBE-CLUSTER-IP\n"));
    assert!(text.contains(
        "keep chain    iptables-legacy -t nat KUBE-MARK-MASQ (a rule of KUBE-HP-ABCDEFGHIJKLMNOP jumps to it)\n"
    ));
    assert!(!text.contains("foreign"));
    assert_eq!((plan.rules(), plan.chains()), (4, 6));
    assert!(
        TakeoverPlan::default()
            .to_string()
            .contains("nothing of kube-proxy")
    );
}
