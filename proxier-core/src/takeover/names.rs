//! What kube-proxy's IPVS mode owns on a node, by name: its iptables chains (per table) and
//! its ipsets, in the current release and in older ones.
//!
//! Facts from kube-proxy's source (`pkg/proxy/ipvs/proxier.go` and `ipset.go`):
//!
//! - current releases create, in `nat`: `KUBE-SERVICES`, `KUBE-POSTROUTING`,
//!   `KUBE-NODE-PORT`, `KUBE-LOAD-BALANCER`, `KUBE-MARK-MASQ`; in `filter`: `KUBE-FORWARD`,
//!   `KUBE-NODE-PORT`, `KUBE-PROXY-FIREWALL`, `KUBE-SOURCE-RANGES-FIREWALL`,
//!   `KUBE-IPVS-FILTER`, `KUBE-IPVS-OUT-FILTER`; and the canary `KUBE-PROXY-CANARY` in
//!   `mangle`, `nat` and `filter`;
//! - releases up to about 1.24 had the load-balancer source-range chain in `nat` as
//!   `KUBE-FIREWALL` (1.10: `KUBE-FIRE-WALL`). `filter`'s `KUBE-FIREWALL` is the kubelet's
//!   and is never ours to remove;
//! - `KUBE-MARK-DROP` was ensured by old kube-proxy releases too, but the kubelet owns it
//!   (kube-proxy's own cleanup never deleted it): it stays, as does `KUBE-KUBELET-CANARY`;
//! - ipsets: every name of its `ipsetInfo` table, and for IPv6 the same names with `KUBE-`
//!   replaced by `KUBE-6-`, cut to 31 characters (the kernel's limit).

/// kube-proxy's (IPVS mode) chains per iptables table, over current and older releases.
const CHAINS: &[(&str, &[&str])] = &[
    (
        "nat",
        &[
            "KUBE-SERVICES",
            "KUBE-POSTROUTING",
            "KUBE-NODE-PORT",
            "KUBE-LOAD-BALANCER",
            "KUBE-MARK-MASQ",
            "KUBE-FIREWALL",
            "KUBE-FIRE-WALL",
            "KUBE-PROXY-CANARY",
        ],
    ),
    (
        "filter",
        &[
            "KUBE-FORWARD",
            "KUBE-NODE-PORT",
            "KUBE-PROXY-FIREWALL",
            "KUBE-SOURCE-RANGES-FIREWALL",
            "KUBE-IPVS-FILTER",
            "KUBE-IPVS-OUT-FILTER",
            "KUBE-PROXY-CANARY",
        ],
    ),
    ("mangle", &["KUBE-PROXY-CANARY"]),
];

/// kube-proxy's (IPVS mode) IPv4 ipset names, current and older releases.
pub const KUBE_PROXY_IPSETS: &[&str] = &[
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
    // Older releases: the SCTP NodePort sets before they became hash:ip,port.
    "KUBE-NODE-PORT-SCTP",
    "KUBE-NODE-PORT-LOCAL-SCTP",
];

/// The kernel's limit on an ipset name (IPSET_MAXNAMELEN 32, with the terminating NUL).
const IPSET_NAME_MAX: usize = 31;

/// Whether chain `chain` of iptables table `table` is one kube-proxy's IPVS mode creates.
pub fn is_kube_proxy_chain(table: &str, chain: &str) -> bool {
    CHAINS
        .iter()
        .any(|(t, chains)| *t == table && chains.contains(&chain))
}

/// The IPv6 name kube-proxy gives the set it calls `name` (`KUBE-` becomes `KUBE-6-`, cut
/// to 31 characters).
fn ipv6_set_name(name: &str) -> String {
    let mut v6 = match name.strip_prefix("KUBE-") {
        Some(rest) => format!("KUBE-6-{rest}"),
        None => name.to_owned(),
    };
    v6.truncate(IPSET_NAME_MAX);
    v6
}

/// Whether ipset `name` is one kube-proxy's IPVS mode creates (either family).
pub fn is_kube_proxy_set(name: &str) -> bool {
    KUBE_PROXY_IPSETS
        .iter()
        .any(|set| *set == name || ipv6_set_name(set) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_are_owned_per_table() {
        assert!(is_kube_proxy_chain("nat", "KUBE-SERVICES"));
        assert!(is_kube_proxy_chain("filter", "KUBE-IPVS-OUT-FILTER"));
        assert!(is_kube_proxy_chain("mangle", "KUBE-PROXY-CANARY"));
        // Old kube-proxy's nat KUBE-FIREWALL, but never the kubelet's filter KUBE-FIREWALL.
        assert!(is_kube_proxy_chain("nat", "KUBE-FIREWALL"));
        assert!(!is_kube_proxy_chain("filter", "KUBE-FIREWALL"));
        for table in ["nat", "filter", "mangle"] {
            assert!(!is_kube_proxy_chain(table, "KUBE-MARK-DROP"));
            assert!(!is_kube_proxy_chain(table, "KUBE-KUBELET-CANARY"));
        }
        // iptables mode's per-service chains are not IPVS mode's.
        assert!(!is_kube_proxy_chain("nat", "KUBE-SVC-ABCDEFGHIJKLMNOP"));
        assert!(!is_kube_proxy_chain("raw", "KUBE-SERVICES"));
    }

    #[test]
    fn ipv6_names_are_prefixed_and_cut_to_31_characters() {
        assert_eq!(ipv6_set_name("KUBE-CLUSTER-IP"), "KUBE-6-CLUSTER-IP");
        assert_eq!(
            ipv6_set_name("KUBE-LOAD-BALANCER-SOURCE-CIDR"),
            "KUBE-6-LOAD-BALANCER-SOURCE-CID"
        );
        assert!(is_kube_proxy_set("KUBE-6-LOAD-BALANCER-SOURCE-CID"));
        assert!(is_kube_proxy_set("KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"));
        assert!(is_kube_proxy_set("KUBE-LOOP-BACK"));
    }

    #[test]
    fn other_programs_sets_are_not_kube_proxys() {
        // kube-router's network policy sets share the prefix.
        assert!(!is_kube_proxy_set("KUBE-SRC-UHEGEAMOVK2QAVZB"));
        assert!(!is_kube_proxy_set("KUBE-DST-4ISZUHOULV6VZD2P"));
        assert!(!is_kube_proxy_set("KUBE-6-SRC-UHEGEAMOVK2QAVZB"));
        assert!(!is_kube_proxy_set("cali40all-ipam-pools"));
        assert!(!is_kube_proxy_set("KUBE-CLUSTER-IP-OLD"));
    }
}
