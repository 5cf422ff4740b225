//! Whether the running kernel can provide an IPVS scheduler, decided from files before the
//! first write needs it: a scheduler `x` is the module `ip_vs_x`, usable when it is loaded
//! (`/proc/modules`), built in (`modules.builtin`) or installed (`modules.dep`, from which
//! the kernel autoloads it on first use) under `/lib/modules/<release>/`.

use std::path::{Path, PathBuf};

/// Where the module facts are read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleFiles {
    /// The loaded modules (`/proc/modules`).
    pub loaded: PathBuf,
    /// The running kernel's module directory (`/lib/modules/<release>`).
    pub installed: PathBuf,
}

impl ModuleFiles {
    /// The real files for the kernel release `release` (`uname -r`).
    pub fn for_release(release: &str) -> Self {
        ModuleFiles {
            loaded: PathBuf::from("/proc/modules"),
            installed: Path::new("/lib/modules").join(release.trim()),
        }
    }
}

/// What the files say about one module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleStatus {
    /// Loaded now.
    Loaded,
    /// Compiled into the kernel.
    BuiltIn,
    /// Installed; the kernel loads it when first used.
    Installed,
    /// Neither loaded, nor built in, nor installed: the kernel cannot provide it.
    Missing,
    /// Not loaded, and the module directory cannot be read (a container without
    /// `/lib/modules`): the files cannot tell.
    Unknown {
        /// Why the installed modules could not be read.
        reason: String,
    },
}

/// The module that implements IPVS scheduler `name` (`rr` → `ip_vs_rr`).
pub fn scheduler_module(name: &str) -> String {
    format!("ip_vs_{name}")
}

/// Looks `module` up in `files`.
pub fn module_status(files: &ModuleFiles, module: &str) -> ModuleStatus {
    let loaded = std::fs::read_to_string(&files.loaded).unwrap_or_default();
    if loaded
        .lines()
        .any(|line| line.split_whitespace().next() == Some(module))
    {
        return ModuleStatus::Loaded;
    }
    // Module files may name it with dashes or underscores; the kernel treats them alike.
    let file_name = |path: &str| {
        let name = path.rsplit('/').next().unwrap_or(path);
        let stem = name.split(".ko").next().unwrap_or(name);
        stem.replace('-', "_") == module
    };
    let listed = |text: &str, field: fn(&str) -> &str| {
        text.lines().any(|line| file_name(field(line.trim())))
    };
    let builtin = std::fs::read_to_string(files.installed.join("modules.builtin"));
    if builtin
        .as_deref()
        .is_ok_and(|text| listed(text, |line| line))
    {
        return ModuleStatus::BuiltIn;
    }
    match std::fs::read_to_string(files.installed.join("modules.dep")) {
        Ok(dep) if listed(&dep, |line| line.split(':').next().unwrap_or("")) => {
            ModuleStatus::Installed
        }
        Ok(_) => ModuleStatus::Missing,
        Err(error) => ModuleStatus::Unknown {
            reason: format!(
                "cannot read {}: {error}",
                files.installed.join("modules.dep").display()
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let path =
                std::env::temp_dir().join(format!("proxier-kmod-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(path.join("release")).unwrap();
            Dir(path)
        }
        fn files(&self, loaded: &str, builtin: Option<&str>, dep: Option<&str>) -> ModuleFiles {
            std::fs::write(self.0.join("modules"), loaded).unwrap();
            let installed = self.0.join("release");
            if let Some(text) = builtin {
                std::fs::write(installed.join("modules.builtin"), text).unwrap();
            }
            if let Some(text) = dep {
                std::fs::write(installed.join("modules.dep"), text).unwrap();
            }
            ModuleFiles {
                loaded: self.0.join("modules"),
                installed,
            }
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const DEP: &str = "kernel/net/netfilter/ipvs/ip_vs.ko: kernel/net/netfilter/nf_conntrack.ko\n\
                       kernel/net/netfilter/ipvs/ip_vs_rr.ko.xz: kernel/net/netfilter/ipvs/ip_vs.ko\n";

    #[test]
    fn loaded_built_in_installed_or_missing() {
        let dir = Dir::new("status");
        let files = dir.files(
            "ip_vs_wrr 16384 0 - Live 0x0\nip_vs 192512 2 ip_vs_wrr, Live 0x0\n",
            Some("kernel/net/netfilter/ipvs/ip_vs_sh.ko\n"),
            Some(DEP),
        );
        assert_eq!(module_status(&files, "ip_vs_wrr"), ModuleStatus::Loaded);
        assert_eq!(module_status(&files, "ip_vs_sh"), ModuleStatus::BuiltIn);
        assert_eq!(module_status(&files, "ip_vs_rr"), ModuleStatus::Installed);
        assert_eq!(module_status(&files, "ip_vs_twos"), ModuleStatus::Missing);
        // A module that names another as a dependency does not count for it.
        assert_eq!(module_status(&files, "nf_conntrack"), ModuleStatus::Missing);
        assert_eq!(scheduler_module("mh"), "ip_vs_mh");
    }

    #[test]
    fn without_module_files_the_answer_is_unknown() {
        let dir = Dir::new("unknown");
        let files = dir.files("", None, None);
        assert!(matches!(
            module_status(&files, "ip_vs_rr"),
            ModuleStatus::Unknown { .. }
        ));
    }
}
