//! The pure part for iptables: reads `iptables-save` output, decides which of its rules and
//! chains are kube-proxy's, and writes the `iptables-restore --noflush` script that removes
//! exactly those.
//!
//! The rule: a chain is removed when kube-proxy names it ([`super::names`]) and nothing but
//! a built-in chain's rule (its jump rules) or another removed chain leads to it. A rule of
//! another program's chain that jumps to one of kube-proxy's chains (an old kubelet's
//! hostport chains use `KUBE-MARK-MASQ`) keeps that chain, and what it leads to, in place:
//! removing it would change that program's rules.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::names::is_kube_proxy_chain;

/// A line of `iptables-save` output that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line} of the iptables-save output: {message}: {text:?}")]
pub struct SaveParseError {
    /// 1-based line number.
    pub line: usize,
    /// The line.
    pub text: String,
    /// What is wrong with it.
    pub message: &'static str,
}

/// One rule: the chain it is in and its specification as `iptables-save` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The chain holding the rule.
    pub chain: String,
    /// Everything after `-A <chain> `, as printed (re-readable by `iptables-restore`).
    pub spec: String,
    /// The `-j`/`-g` target, if any.
    pub target: Option<String>,
    /// The ipsets the rule matches on (`--match-set NAME`).
    pub sets: Vec<String>,
}

/// One table of a dump.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTable {
    /// `nat`, `filter`, ...
    pub name: String,
    /// Chains, in dump order, with whether each is built in (has a policy).
    pub chains: Vec<(String, bool)>,
    /// Rules, in dump order.
    pub rules: Vec<Rule>,
}

impl SavedTable {
    fn is_builtin(&self, chain: &str) -> bool {
        self.chains
            .iter()
            .any(|(c, builtin)| c == chain && *builtin)
    }
}

/// Splits a rule specification into words the way `iptables-restore` does: whitespace
/// separates, double quotes group (a backslash escapes the next character inside them).
fn words(spec: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = spec.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            c => {
                current.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(current);
    }
    out
}

fn parse_rule(chain: String, spec: &str) -> Rule {
    let words = words(spec);
    let mut target = None;
    let mut sets = Vec::new();
    for pair in words.windows(2) {
        match pair[0].as_str() {
            "-j" | "--jump" | "-g" | "--goto" => target = Some(pair[1].clone()),
            "--match-set" | "--set" => sets.push(pair[1].clone()),
            _ => {}
        }
    }
    Rule {
        chain,
        spec: spec.to_owned(),
        target,
        sets,
    }
}

/// Reads `iptables-save` (or `ip6tables-save`, legacy or nft) output.
pub fn parse_save(text: &str) -> Result<Vec<SavedTable>, SaveParseError> {
    let mut tables = Vec::new();
    let mut current: Option<SavedTable> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        let error = |message| SaveParseError {
            line: index + 1,
            text: line.to_owned(),
            message,
        };
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            if current.is_some() {
                return Err(error("a table starts before the previous one's COMMIT"));
            }
            current = Some(SavedTable {
                name: name.trim().to_owned(),
                ..SavedTable::default()
            });
            continue;
        }
        let Some(table) = current.as_mut() else {
            return Err(error("outside of a table"));
        };
        if line == "COMMIT" {
            tables.extend(current.take());
        } else if let Some(declaration) = line.strip_prefix(':') {
            let mut fields = declaration.split_whitespace();
            let (Some(name), Some(policy)) = (fields.next(), fields.next()) else {
                return Err(error("a chain line needs a name and a policy"));
            };
            table.chains.push((name.to_owned(), policy != "-"));
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
            table
                .rules
                .push(parse_rule(chain.to_owned(), spec.trim_start()));
        } else {
            return Err(error("not a chain, rule or COMMIT line"));
        }
    }
    if current.is_some() {
        return Err(SaveParseError {
            line: text.lines().count(),
            text: String::new(),
            message: "the last table has no COMMIT",
        });
    }
    Ok(tables)
}

/// A kube-proxy chain that stays, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptChain {
    /// The table.
    pub table: String,
    /// The chain.
    pub chain: String,
    /// The chain whose rule leads to it.
    pub referenced_from: String,
}

/// What to remove from one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TablePlan {
    /// The table.
    pub table: String,
    /// Rules of built-in chains that jump to removed chains.
    pub rules: Vec<Rule>,
    /// Chains to flush and delete.
    pub chains: Vec<String>,
}

/// What to remove from one dump (one iptables binary, one family).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IptablesPlan {
    /// Per table, only tables with something to remove.
    pub tables: Vec<TablePlan>,
    /// kube-proxy chains kept because another program's rule leads to them.
    pub kept: Vec<KeptChain>,
    /// Every ipset a rule that stays matches on: those sets cannot (and must not) go.
    pub sets_in_use: BTreeSet<String>,
}

impl IptablesPlan {
    /// Whether nothing is to be removed.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The `iptables-restore --noflush` input that removes the plan's rules and chains,
    /// one transaction per table: jump rules first, then every chain flushed, then deleted.
    pub fn restore_script(&self) -> String {
        let mut script = String::new();
        for table in &self.tables {
            let _ = writeln!(script, "*{}", table.table);
            for rule in &table.rules {
                let _ = writeln!(script, "-D {} {}", rule.chain, rule.spec);
            }
            for chain in &table.chains {
                let _ = writeln!(script, "-F {chain}");
            }
            for chain in &table.chains {
                let _ = writeln!(script, "-X {chain}");
            }
            script.push_str("COMMIT\n");
        }
        script
    }
}

/// Decides what of kube-proxy's IPVS mode to remove from one dump.
pub fn plan_iptables(tables: &[SavedTable]) -> IptablesPlan {
    let mut plan = IptablesPlan::default();
    for table in tables {
        let candidates: BTreeSet<&str> = table
            .chains
            .iter()
            .filter(|(chain, builtin)| !builtin && is_kube_proxy_chain(&table.name, chain))
            .map(|(chain, _)| chain.as_str())
            .collect();
        // Kept: reached from a chain of another program, or from a kept chain.
        let mut kept: Vec<KeptChain> = Vec::new();
        loop {
            let is_kept = |chain: &str| kept.iter().any(|k| k.chain == chain);
            let next = table.rules.iter().find_map(|rule| {
                let target = rule.target.as_deref()?;
                let from_other =
                    !candidates.contains(rule.chain.as_str()) && !table.is_builtin(&rule.chain);
                let pinned = from_other || is_kept(&rule.chain);
                (pinned && candidates.contains(target) && !is_kept(target)).then(|| KeptChain {
                    table: table.name.clone(),
                    chain: target.to_owned(),
                    referenced_from: rule.chain.clone(),
                })
            });
            match next {
                Some(k) => kept.push(k),
                None => break,
            }
        }
        let removed: Vec<String> = candidates
            .iter()
            .filter(|chain| !kept.iter().any(|k| k.chain == **chain))
            .map(|chain| (*chain).to_owned())
            .collect();
        let jumps: Vec<Rule> = table
            .rules
            .iter()
            .filter(|rule| {
                !removed.contains(&rule.chain)
                    && rule.target.as_ref().is_some_and(|t| removed.contains(t))
            })
            .cloned()
            .collect();
        for rule in &table.rules {
            if !removed.contains(&rule.chain) && !jumps.contains(rule) {
                plan.sets_in_use.extend(rule.sets.iter().cloned());
            }
        }
        if !removed.is_empty() {
            plan.tables.push(TablePlan {
                table: table.name.clone(),
                rules: jumps,
                chains: removed,
            });
        }
        plan.kept.extend(kept);
    }
    plan
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn words_follow_iptables_quoting() {
        assert_eq!(
            words(r#"-m comment --comment "a \"b\" c" -j X"#),
            ["-m", "comment", "--comment", r#"a "b" c"#, "-j", "X"]
        );
        assert_eq!(words(r#"--comment """#), ["--comment", ""]);
    }

    #[test]
    fn a_rule_knows_its_target_and_sets() {
        let rule = parse_rule(
            "KUBE-SERVICES".into(),
            r#"-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"#,
        );
        assert_eq!(rule.target.as_deref(), Some("KUBE-MARK-MASQ"));
        assert_eq!(rule.sets, ["KUBE-CLUSTER-IP"]);
        let goto = parse_rule("X".into(), "-g KUBE-NODE-PORT");
        assert_eq!(goto.target.as_deref(), Some("KUBE-NODE-PORT"));
    }

    #[test]
    fn unreadable_dumps_are_refused_with_the_line() {
        let err =
            parse_save("*nat\n:PREROUTING ACCEPT [0:0]\n-I PREROUTING -j X\nCOMMIT\n").unwrap_err();
        assert_eq!(err.line, 3);
        assert!(parse_save("*nat\n:PREROUTING ACCEPT [0:0]\n").is_err());
        assert!(parse_save("-A X -j Y\n").is_err());
        assert_eq!(parse_save("").unwrap_or_default(), Vec::new());
    }
}
