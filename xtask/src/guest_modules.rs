//! Which kernel modules go into the guest: the networking parts of the
//! module tree plus everything they depend on (from `modules.dep`), and a
//! `modules.dep` trimmed to match.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail};

use crate::guest_kernel::GuestKernel;

/// Parts of the module tree (paths relative to `/lib/modules/<version>`, as
/// prefixes) the guest gets, with their dependencies: networking,
/// netfilter/IPVS, virtual links and the virtio disk.
const KEPT_MODULE_PREFIXES: &[&str] = &[
    "kernel/net/netfilter/",
    "kernel/net/ipv4/",
    "kernel/net/ipv6/",
    "kernel/net/bridge/",
    "kernel/net/sched/",
    "kernel/net/sctp/",
    "kernel/net/core/",
    "kernel/net/8021q/",
    "kernel/net/802/",
    "kernel/net/llc/",
    "kernel/net/packet/",
    "kernel/net/xfrm/",
    "kernel/drivers/net/dummy.ko",
    "kernel/drivers/net/veth.ko",
    "kernel/drivers/net/macvlan.ko",
    "kernel/drivers/net/ipvlan/",
    "kernel/drivers/net/vxlan",
    "kernel/drivers/net/geneve.ko",
    "kernel/drivers/net/tun.ko",
    "kernel/drivers/net/ifb.ko",
    "kernel/drivers/net/nlmon.ko",
    "kernel/drivers/net/wireguard/",
    "kernel/drivers/virtio/",
    "kernel/drivers/block/virtio_blk.ko",
];

/// Modules left out of every guest although their directory is kept: the IPVS `twos`
/// scheduler (6.7 and later), so that on every kernel of the matrix the guest lacks one
/// scheduler the daemon knows, as a node whose kernel lacks it does.
const EXCLUDED_MODULES: &[&str] = &["ip_vs_twos"];

/// Index files copied as they are (busybox modprobe reads the text forms).
const INDEX_FILES: &[&str] = &[
    "modules.alias",
    "modules.builtin",
    "modules.softdep",
    "modules.order",
];

/// Module name as modprobe and modules.dep spell it (`-` and `_` are the same).
pub fn module_name(file: &str) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    let stem = base.split(".ko").next().unwrap_or(base);
    stem.replace('-', "_")
}

/// One `modules.dep` line: a module file and the files it needs.
#[derive(Debug, Clone)]
struct DepLine {
    file: String,
    needs: Vec<String>,
}

/// Parses `modules.dep` (`kernel/a.ko: kernel/b.ko kernel/c.ko`).
fn parse_modules_dep(text: &str) -> Vec<DepLine> {
    text.lines()
        .filter_map(|line| {
            let (file, needs) = line.split_once(':')?;
            Some(DepLine {
                file: file.trim().to_owned(),
                needs: needs.split_whitespace().map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// What the guest gets.
#[derive(Debug, Clone)]
pub struct ModuleSelection {
    /// Module files, relative to the module tree.
    pub files: BTreeSet<String>,
    /// `modules.dep` listing only those files.
    pub modules_dep: String,
    /// Index files to copy as they are.
    pub index_files: Vec<&'static str>,
    /// Modules `/init` loads up front (present in this kernel as modules, in order).
    pub load: Vec<String>,
}

/// Selects the kept module files with their dependency closure, and checks
/// that every module to load is there (or built in).
fn select_from(
    dep_lines: &[DepLine],
    builtin: &BTreeSet<String>,
    prefixes: &[&str],
    to_load: &[&str],
    required: &[&str],
) -> Result<ModuleSelection, String> {
    let by_file: BTreeMap<&str, &DepLine> =
        dep_lines.iter().map(|d| (d.file.as_str(), d)).collect();
    let by_name: BTreeMap<String, &DepLine> = dep_lines
        .iter()
        .map(|d| (module_name(&d.file), d))
        .collect();
    let mut files = BTreeSet::new();
    let mut pending: Vec<&str> = dep_lines
        .iter()
        .filter(|d| prefixes.iter().any(|p| d.file.starts_with(p)))
        .filter(|d| !EXCLUDED_MODULES.contains(&module_name(&d.file).as_str()))
        .map(|d| d.file.as_str())
        .collect();
    let mut load = Vec::new();
    for wanted in to_load.iter().chain(required) {
        let name = module_name(wanted);
        match by_name.get(&name) {
            Some(line) => {
                pending.push(line.file.as_str());
                if to_load.contains(wanted) && !load.contains(&name) {
                    load.push(name);
                }
            }
            None if builtin.contains(&name) => {}
            None if required.contains(wanted) => {
                return Err(format!("the kernel has no module {wanted}"));
            }
            None => {}
        }
    }
    while let Some(file) = pending.pop() {
        if !files.insert(file.to_owned()) {
            continue;
        }
        if let Some(line) = by_file.get(file) {
            pending.extend(line.needs.iter().map(String::as_str));
        }
    }
    let mut modules_dep = String::new();
    for line in dep_lines.iter().filter(|d| files.contains(&d.file)) {
        modules_dep.push_str(&line.file);
        modules_dep.push(':');
        for need in &line.needs {
            modules_dep.push(' ');
            modules_dep.push_str(need);
        }
        modules_dep.push('\n');
    }
    Ok(ModuleSelection {
        files,
        modules_dep,
        index_files: INDEX_FILES.to_vec(),
        load,
    })
}

/// The selection for `kernel`.
pub fn select(
    kernel: &GuestKernel,
    to_load: &[&str],
    required: &[&str],
) -> Result<ModuleSelection> {
    let dep_text = std::fs::read_to_string(kernel.modules.join("modules.dep"))
        .with_context(|| format!("reading modules.dep of {}", kernel.version))?;
    let builtin_text =
        std::fs::read_to_string(kernel.modules.join("modules.builtin")).unwrap_or_default();
    let builtin: BTreeSet<String> = builtin_text.lines().map(module_name).collect();
    let dep_lines = parse_modules_dep(&dep_text);
    match select_from(
        &dep_lines,
        &builtin,
        KEPT_MODULE_PREFIXES,
        to_load,
        required,
    ) {
        Ok(selection) => Ok(selection),
        Err(reason) => bail!("kernel {}: {reason}", kernel.version),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const DEP: &str = "kernel/net/netfilter/ipvs/ip_vs.ko: kernel/net/netfilter/nf_conntrack.ko kernel/lib/libcrc32c.ko\n\
                       kernel/net/netfilter/ipvs/ip_vs_rr.ko: kernel/net/netfilter/ipvs/ip_vs.ko kernel/net/netfilter/nf_conntrack.ko kernel/lib/libcrc32c.ko\n\
                       kernel/net/netfilter/nf_conntrack.ko: kernel/lib/libcrc32c.ko\n\
                       kernel/lib/libcrc32c.ko:\n\
                       kernel/drivers/net/dummy.ko:\n\
                       kernel/drivers/gpu/drm/drm.ko:\n\
                       kernel/sound/snd.ko:\n";

    #[test]
    fn kept_modules_bring_their_dependencies_and_nothing_else() {
        let lines = parse_modules_dep(DEP);
        let selection = select_from(
            &lines,
            &BTreeSet::new(),
            &["kernel/net/netfilter/"],
            &["dummy"],
            &["ip_vs"],
        )
        .unwrap();
        let files: Vec<&str> = selection.files.iter().map(String::as_str).collect();
        assert_eq!(
            files,
            vec![
                "kernel/drivers/net/dummy.ko",
                "kernel/lib/libcrc32c.ko",
                "kernel/net/netfilter/ipvs/ip_vs.ko",
                "kernel/net/netfilter/ipvs/ip_vs_rr.ko",
                "kernel/net/netfilter/nf_conntrack.ko",
            ]
        );
        assert!(!selection.modules_dep.contains("drm"));
        assert!(selection.modules_dep.contains("kernel/lib/libcrc32c.ko:\n"));
        assert_eq!(selection.load, vec!["dummy".to_owned()]);
    }

    #[test]
    fn a_missing_required_module_is_an_error_unless_built_in() {
        let lines = parse_modules_dep(DEP);
        assert!(select_from(&lines, &BTreeSet::new(), &[], &[], &["veth"]).is_err());
        let builtin: BTreeSet<String> = ["veth".to_owned()].into();
        let selection = select_from(&lines, &builtin, &[], &["veth", "sctp"], &["veth"]).unwrap();
        assert!(
            selection.load.is_empty(),
            "built-in or absent modules are not loaded"
        );
    }

    #[test]
    fn module_names_match_modprobe_spelling() {
        assert_eq!(
            module_name("kernel/net/netfilter/ipvs/ip_vs_rr.ko"),
            "ip_vs_rr"
        );
        assert_eq!(module_name("kernel/drivers/net/nlmon.ko.xz"), "nlmon");
        assert_eq!(module_name("nf-conntrack-netlink"), "nf_conntrack_netlink");
    }
}
