//! Taking a node over from kube-proxy's IPVS mode without a gap.
//!
//! IPVS and the dummy link need nothing here: kube-proxy's virtual servers, real servers and
//! `kube-ipvs0` addresses are what the planner plans, so the first full sync adopts them in
//! place (zero writes where they match) and changes only what differs. What is left is
//! kube-proxy's netfilter part, its iptables chains and ipsets, which this module removes
//! once the proxier's own nftables table is in place ([`crate::Proxier::take_over_kube_proxy`]):
//!
//! 1. read every iptables flavour the node has (`iptables-legacy-save`, `iptables-nft-save`
//!    and their `ip6tables` forms) and `ipset list -n`;
//! 2. decide, purely ([`iptables::plan_iptables`], [`ipset::plan_ipsets`]), what is
//!    kube-proxy's: the chains its source names ([`names`]), the rules of built-in chains that
//!    jump to them, and its ipsets once no remaining rule uses them. The kubelet's chains
//!    (`KUBE-FIREWALL` in `filter`, `KUBE-KUBELET-CANARY`, `KUBE-MARK-DROP`) and every other
//!    program's chains, rules and sets stay;
//! 3. remove it: one `iptables-restore --noflush` transaction per table (jump rules, then
//!    flush, then delete the chains), then `ipset destroy` per set (a set cannot go while a
//!    rule matches on it).
//!
//! [`KubeProxyTakeover::plan`] only reads: `--dry-run` prints the [`TakeoverPlan`].

pub mod ipset;
pub mod iptables;
pub mod names;

use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

pub use ipset::{IpsetPlan, plan_ipsets};
pub use iptables::{
    IptablesPlan, KeptChain, Rule, SaveParseError, SavedTable, TablePlan, parse_save, plan_iptables,
};

/// Why reading or changing the node's iptables or ipsets failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TakeoverError {
    /// A program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// A program failed.
    #[error("{program} {args} failed ({status}): {stderr}")]
    Failed {
        /// The program.
        program: PathBuf,
        /// Its arguments, joined.
        args: String,
        /// Exit status.
        status: std::process::ExitStatus,
        /// What it printed on standard error.
        stderr: String,
    },
    /// A dump could not be read.
    #[error("reading the output of {program}: {source}")]
    Parse {
        /// The program.
        program: PathBuf,
        /// Where and what.
        source: SaveParseError,
    },
}

/// One iptables flavour and family: the pair of binaries that dump and restore it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesTool {
    /// Its name in reports (`iptables-legacy`, `ip6tables-nft`, ...).
    pub name: String,
    /// The `*-save` binary.
    pub save: PathBuf,
    /// The `*-restore` binary.
    pub restore: PathBuf,
}

impl IptablesTool {
    /// The flavour `name`, run as `name-save` and `name-restore` from `PATH`.
    pub fn named(name: &str) -> Self {
        IptablesTool {
            name: name.to_owned(),
            save: PathBuf::from(format!("{name}-save")),
            restore: PathBuf::from(format!("{name}-restore")),
        }
    }
}

/// Reads and removes kube-proxy's (IPVS mode) iptables chains and ipsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeProxyTakeover {
    /// The iptables flavours to look at; those whose binaries are missing are skipped.
    pub iptables: Vec<IptablesTool>,
    /// The `ipset` binary.
    pub ipset: PathBuf,
}

impl Default for KubeProxyTakeover {
    /// Both iptables backends (legacy and nft) of both families, and `ipset`, from `PATH`:
    /// kube-proxy may have used either backend, and a node can hold rules in both.
    fn default() -> Self {
        KubeProxyTakeover {
            iptables: [
                "iptables-legacy",
                "iptables-nft",
                "ip6tables-legacy",
                "ip6tables-nft",
            ]
            .into_iter()
            .map(IptablesTool::named)
            .collect(),
            ipset: PathBuf::from("ipset"),
        }
    }
}

/// What a takeover would remove (and keep) on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TakeoverPlan {
    /// Per iptables flavour found on the node: what to remove.
    pub iptables: Vec<(IptablesTool, IptablesPlan)>,
    /// The node's kube-proxy ipsets (empty without the `ipset` binary).
    pub ipsets: IpsetPlan,
    /// Binaries not found (their flavour has nothing to remove).
    pub absent: Vec<PathBuf>,
}

impl TakeoverPlan {
    /// Whether nothing is to be removed.
    pub fn is_empty(&self) -> bool {
        self.iptables.iter().all(|(_, plan)| plan.is_empty()) && self.ipsets.destroy.is_empty()
    }

    /// Rules to delete, over every flavour.
    pub fn rules(&self) -> usize {
        self.tables().map(|(_, t)| t.rules.len()).sum()
    }

    /// Chains to delete, over every flavour.
    pub fn chains(&self) -> usize {
        self.tables().map(|(_, t)| t.chains.len()).sum()
    }

    fn tables(&self) -> impl Iterator<Item = (&IptablesTool, &TablePlan)> {
        self.iptables
            .iter()
            .flat_map(|(tool, plan)| plan.tables.iter().map(move |t| (tool, t)))
    }
}

impl fmt::Display for TakeoverPlan {
    /// One line per rule, chain and set to remove, then what stays and why.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (tool, table) in self.tables() {
            for rule in &table.rules {
                writeln!(
                    f,
                    "remove rule   {} -t {} -A {} {}",
                    tool.name, table.table, rule.chain, rule.spec
                )?;
            }
            for chain in &table.chains {
                writeln!(f, "remove chain  {} -t {} {chain}", tool.name, table.table)?;
            }
        }
        for set in &self.ipsets.destroy {
            writeln!(f, "remove ipset  {set}")?;
        }
        for (tool, plan) in &self.iptables {
            for kept in &plan.kept {
                writeln!(
                    f,
                    "keep chain    {} -t {} {} (a rule of {} jumps to it)",
                    tool.name, kept.table, kept.chain, kept.referenced_from
                )?;
            }
        }
        for set in &self.ipsets.kept {
            writeln!(f, "keep ipset    {set} (a remaining rule matches on it)")?;
        }
        if self.is_empty() {
            writeln!(f, "nothing of kube-proxy's IPVS mode found")?;
        }
        Ok(())
    }
}

/// What [`KubeProxyTakeover::apply`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TakeoverReport {
    /// iptables rules deleted (jumps from built-in chains).
    pub rules_deleted: usize,
    /// iptables chains deleted.
    pub chains_deleted: usize,
    /// ipsets destroyed.
    pub sets_destroyed: usize,
    /// kube-proxy chains and sets left because another program's rule uses them.
    pub kept: usize,
    /// What failed, as [`TakeoverError`] messages (the rest was still removed; a later run
    /// can finish the job).
    pub errors: Vec<String>,
}

impl TakeoverReport {
    /// Whether everything planned was removed.
    pub fn is_complete(&self) -> bool {
        self.errors.is_empty()
    }
}

impl fmt::Display for TakeoverReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} jump rules, {} chains and {} ipsets of kube-proxy removed, {} kept",
            self.rules_deleted, self.chains_deleted, self.sets_destroyed, self.kept
        )?;
        for error in &self.errors {
            write!(f, "; {error}")?;
        }
        Ok(())
    }
}

/// The standard output of a program, or `None` when it is not installed.
async fn run(
    program: &PathBuf,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<Option<String>, TakeoverError> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TakeoverError::Spawn {
                program: program.clone(),
                source,
            });
        }
    };
    let io_error = |source| TakeoverError::Spawn {
        program: program.clone(),
        source,
    };
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).await.map_err(io_error)?;
        pipe.shutdown().await.map_err(io_error)?;
    }
    let output = child.wait_with_output().await.map_err(io_error)?;
    if !output.status.success() {
        return Err(TakeoverError::Failed {
            program: program.clone(),
            args: args.join(" "),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(Some(String::from_utf8_lossy(&output.stdout).into_owned()))
}

impl KubeProxyTakeover {
    /// Reads the node (nothing is changed) and decides what to remove.
    pub async fn plan(&self) -> Result<TakeoverPlan, TakeoverError> {
        let mut plan = TakeoverPlan::default();
        let mut sets_in_use = std::collections::BTreeSet::new();
        for tool in &self.iptables {
            let Some(dump) = run(&tool.save, &[], None).await? else {
                plan.absent.push(tool.save.clone());
                continue;
            };
            let tables = parse_save(&dump).map_err(|source| TakeoverError::Parse {
                program: tool.save.clone(),
                source,
            })?;
            let table_plan = plan_iptables(&tables);
            sets_in_use.extend(table_plan.sets_in_use.iter().cloned());
            plan.iptables.push((tool.clone(), table_plan));
        }
        match run(&self.ipset, &["list", "-n"], None).await? {
            Some(names) => plan.ipsets = plan_ipsets(&names, &sets_in_use),
            None => plan.absent.push(self.ipset.clone()),
        }
        Ok(plan)
    }

    /// Removes what `plan` lists: each flavour's tables in one `iptables-restore --noflush`
    /// transaction per call, then the ipsets (skipped when an iptables step failed: their
    /// rules may still use them).
    pub async fn apply(&self, plan: &TakeoverPlan) -> TakeoverReport {
        let mut report = TakeoverReport {
            kept: plan.ipsets.kept.len()
                + plan
                    .iptables
                    .iter()
                    .map(|(_, p)| p.kept.len())
                    .sum::<usize>(),
            ..TakeoverReport::default()
        };
        for (tool, table_plan) in &plan.iptables {
            if table_plan.is_empty() {
                continue;
            }
            let script = table_plan.restore_script();
            match run(&tool.restore, &["--noflush", "--wait=5"], Some(&script)).await {
                Ok(Some(_)) => {
                    for table in &table_plan.tables {
                        report.rules_deleted += table.rules.len();
                        report.chains_deleted += table.chains.len();
                    }
                }
                Ok(None) => report.errors.push(
                    TakeoverError::Spawn {
                        program: tool.restore.clone(),
                        source: std::io::ErrorKind::NotFound.into(),
                    }
                    .to_string(),
                ),
                Err(error) => report.errors.push(error.to_string()),
            }
        }
        if !report.errors.is_empty() {
            return report;
        }
        for set in &plan.ipsets.destroy {
            match run(&self.ipset, &["destroy", set], None).await {
                Ok(Some(_)) => report.sets_destroyed += 1,
                Ok(None) => {}
                Err(error) => report.errors.push(error.to_string()),
            }
        }
        report
    }

    /// Reads the node and removes kube-proxy's part of it.
    pub async fn run(&self) -> TakeoverReport {
        match self.plan().await {
            Ok(plan) => {
                if !plan.is_empty() {
                    tracing::info!(plan = %plan, "taking over from kube-proxy");
                }
                self.apply(&plan).await
            }
            Err(error) => TakeoverReport {
                errors: vec![error.to_string()],
                ..TakeoverReport::default()
            },
        }
    }
}

#[cfg(test)]
mod tests;
