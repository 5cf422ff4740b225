//! The distribution kernel booted in the VM: its image and module tree.

use std::path::PathBuf;

use anyhow::{Result, bail};

/// A kernel image with its modules.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    /// Release string, e.g. `6.1.0-57-cloud-amd64`.
    pub version: String,
    /// `/boot/vmlinuz-<version>`.
    pub image: PathBuf,
    /// `/lib/modules/<version>`.
    pub modules: PathBuf,
}

/// Finds the newest installed Debian cloud kernel that has its module tree.
pub fn find() -> Result<GuestKernel> {
    let mut versions: Vec<String> = std::fs::read_dir("/boot")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok())
                .filter_map(|entry| entry.file_name().into_string().ok())
                .filter_map(|name| name.strip_prefix("vmlinuz-").map(str::to_owned))
                .filter(|version| version.ends_with("-cloud-amd64"))
                .filter(|version| {
                    PathBuf::from("/lib/modules")
                        .join(version)
                        .join("modules.dep")
                        .is_file()
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by(|a, b| compare_versions(a, b));
    let Some(version) = versions.pop() else {
        bail!(
            "no /boot/vmlinuz-*-cloud-amd64 with a /lib/modules tree (package linux-image-cloud-amd64)"
        );
    };
    Ok(GuestKernel {
        image: PathBuf::from("/boot").join(format!("vmlinuz-{version}")),
        modules: PathBuf::from("/lib/modules").join(&version),
        version,
    })
}

/// Orders kernel release strings by their numeric parts (6.1.0-57 < 6.1.0-100).
fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(v: &str) -> Vec<u64> {
        v.split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.parse().ok())
            .collect()
    }
    parts(a).cmp(&parts(b)).then_with(|| a.cmp(b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn newer_abi_numbers_sort_later() {
        use std::cmp::Ordering::Less;
        assert_eq!(
            compare_versions("6.1.0-57-cloud-amd64", "6.1.0-100-cloud-amd64"),
            Less
        );
        assert_eq!(
            compare_versions("6.1.0-57-cloud-amd64", "6.12.0-1-cloud-amd64"),
            Less
        );
    }
}
