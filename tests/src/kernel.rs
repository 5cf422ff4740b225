//! Detection of a kernel that can run IPVS tests.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Environment variable set to `1` in the VM: kernel tests must run there,
/// and a kernel without IPVS is a test failure rather than a skip.
pub const KERNEL_TESTS_ENV: &str = "IPVS_PROXIER_KERNEL_TESTS";

/// Environment variable holding the path of the `ipvs-proxier` binary in the VM.
pub const PROXIER_BIN_ENV: &str = "IPVS_PROXIER_BIN";

/// Why kernel tests cannot run here.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Unusable {
    NotRoot,
    NoIpvs,
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::NotRoot => f.write_str("not running as root (euid != 0)"),
            Unusable::NoIpvs => f.write_str(
                "IPVS is not available in this kernel (/proc/net/ip_vs missing); \
                 run kernel tests with `cargo xtask vm-test`",
            ),
        }
    }
}

/// Checks the facts that kernel tests depend on, in order.
fn check_kernel(is_root: bool, ipvs_proc: &Path) -> Result<(), Unusable> {
    if !is_root {
        return Err(Unusable::NotRoot);
    }
    if !ipvs_proc.exists() {
        return Err(Unusable::NoIpvs);
    }
    Ok(())
}

/// Whether the environment demands that kernel tests run (`IPVS_PROXIER_KERNEL_TESTS=1`).
fn kernel_tests_required(value: Option<&str>) -> bool {
    matches!(value.map(str::trim), Some("1" | "true" | "yes"))
}

/// True when kernel (IPVS) tests can run here. Otherwise writes
/// `SKIP <test>: <reason>` to the real stderr and returns false.
///
/// # Panics
/// When env `IPVS_PROXIER_KERNEL_TESTS=1` is set (as in the VM) but IPVS is
/// unusable: there the skip would hide a broken test environment.
pub fn kernel_tests_enabled(test: &str) -> bool {
    let is_root = nix::unistd::geteuid().is_root();
    let verdict = check_kernel(is_root, Path::new("/proc/net/ip_vs"));
    let required = kernel_tests_required(std::env::var(KERNEL_TESTS_ENV).ok().as_deref());
    match verdict {
        Ok(()) => true,
        Err(reason) if required => {
            panic!("{test}: {KERNEL_TESTS_ENV}=1 but kernel tests cannot run: {reason}")
        }
        Err(reason) => {
            // Written straight to the process's stderr: libtest captures the
            // eprintln! family, and a skip must stay visible.
            let line = format!("SKIP {test}: {reason}\n");
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            false
        }
    }
}

/// Path of the `ipvs-proxier` daemon binary, from env `IPVS_PROXIER_BIN`
/// (set by the VM runner).
///
/// # Panics
/// When the variable is not set.
pub fn proxier_bin() -> PathBuf {
    match std::env::var_os(PROXIER_BIN_ENV) {
        Some(path) => PathBuf::from(path),
        None => panic!("{PROXIER_BIN_ENV} is not set; run under `cargo xtask vm-test`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_root_is_unusable_before_ipvs_is_looked_at() {
        assert_eq!(check_kernel(false, Path::new("/")), Err(Unusable::NotRoot));
    }

    #[test]
    fn root_without_ipvs_proc_file_is_unusable() {
        let missing = Path::new("/proc/net/definitely-not-ip_vs");
        assert_eq!(check_kernel(true, missing), Err(Unusable::NoIpvs));
    }

    #[test]
    fn root_with_ipvs_proc_file_is_usable() {
        // Any existing path stands in for /proc/net/ip_vs.
        assert_eq!(check_kernel(true, Path::new("/")), Ok(()));
    }

    #[test]
    fn only_explicit_values_require_kernel_tests() {
        assert!(kernel_tests_required(Some("1")));
        assert!(kernel_tests_required(Some("true")));
        assert!(!kernel_tests_required(Some("0")));
        assert!(!kernel_tests_required(Some("")));
        assert!(!kernel_tests_required(None));
    }
}
