//! The pure part for ipsets: which of the node's sets (`ipset list -n`) are kube-proxy's and
//! can go.

use std::collections::BTreeSet;

use super::names::is_kube_proxy_set;

/// What to do with the node's ipsets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpsetPlan {
    /// kube-proxy's sets no remaining rule uses: destroy them.
    pub destroy: Vec<String>,
    /// kube-proxy's sets a rule that stays still matches on: they stay.
    pub kept: Vec<String>,
}

/// Decides from `ipset list -n` output (one name per line) and the sets that rules staying
/// in place use ([`super::iptables::IptablesPlan::sets_in_use`], over every dump).
pub fn plan_ipsets(list_names: &str, sets_in_use: &BTreeSet<String>) -> IpsetPlan {
    let mut plan = IpsetPlan::default();
    let names: BTreeSet<&str> = list_names
        .lines()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect();
    for name in names.into_iter().filter(|name| is_kube_proxy_set(name)) {
        if sets_in_use.contains(name) {
            plan.kept.push(name.to_owned());
        } else {
            plan.destroy.push(name.to_owned());
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kube_proxys_unused_sets_go() {
        let listed =
            "KUBE-CLUSTER-IP\nKUBE-6-CLUSTER-IP\nKUBE-LOOP-BACK\nKUBE-SRC-ABC\nmy-allowlist\n\n";
        let in_use: BTreeSet<String> = ["KUBE-LOOP-BACK".to_owned(), "my-allowlist".to_owned()]
            .into_iter()
            .collect();
        let plan = plan_ipsets(listed, &in_use);
        assert_eq!(plan.destroy, ["KUBE-6-CLUSTER-IP", "KUBE-CLUSTER-IP"]);
        assert_eq!(plan.kept, ["KUBE-LOOP-BACK"]);
    }
}
