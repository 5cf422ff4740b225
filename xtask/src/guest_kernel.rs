//! The distribution kernel booted in the VM (its image and module tree) and the `nft` the
//! guest runs: the matrix of Debian cloud kernels and nft releases the project is tested on.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::debian_archive::{self, Archive};

/// A kernel of the matrix: Debian's `linux-image-cloud-amd64` of one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelChoice {
    /// Debian 11 (bullseye), 5.10: fetched from the archive.
    #[value(name = "5.10")]
    Bullseye,
    /// Debian 12 (bookworm), 6.1: the host's installed package.
    #[value(name = "6.1")]
    Bookworm,
    /// Debian 13 (trixie), 6.12: fetched from the archive.
    #[value(name = "6.12")]
    Trixie,
}

impl KernelChoice {
    /// The release's short name, as `--kernel` takes it.
    pub fn name(self) -> &'static str {
        match self {
            KernelChoice::Bullseye => "5.10",
            KernelChoice::Bookworm => "6.1",
            KernelChoice::Trixie => "6.12",
        }
    }

    /// The Debian suite to fetch it from; `None` for the host's own kernel.
    fn suite(self) -> Option<&'static str> {
        match self {
            KernelChoice::Bullseye => Some("bullseye"),
            KernelChoice::Bookworm => None,
            KernelChoice::Trixie => Some("trixie"),
        }
    }
}

/// The `nft` the guest runs: the host's (Debian 12, 1.0.6) or trixie's 1.1.x.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NftChoice {
    /// The host's `nft` (Debian 12: 1.0.6).
    #[value(name = "host")]
    Host,
    /// Debian 13's `nft` (1.1.x) with its own libraries and loader.
    #[value(name = "trixie")]
    Trixie,
}

impl NftChoice {
    /// The name `--nft` takes.
    pub fn name(self) -> &'static str {
        match self {
            NftChoice::Host => "host",
            NftChoice::Trixie => "trixie",
        }
    }
}

/// A kernel image with its modules.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    /// Release string, e.g. `6.1.0-57-cloud-amd64`.
    pub version: String,
    /// The image to boot (`boot/vmlinuz-<version>`).
    pub image: PathBuf,
    /// The module tree on the host (`lib/modules/<version>`, with `modules.dep`).
    pub modules: PathBuf,
}

impl GuestKernel {
    /// Where the guest finds the module tree (archive path, no leading `/`; `/lib` is a
    /// link to `usr/lib` in the guest as on the host).
    pub fn guest_modules_dir(&self) -> String {
        format!("usr/lib/modules/{}", self.version)
    }
}

/// A root holding trixie's `nft` with its libraries and loader.
#[derive(Debug, Clone)]
pub struct GuestNft {
    /// The unpacked root on the host (`usr/sbin/nft`, `usr/lib/x86_64-linux-gnu/...`).
    pub root: PathBuf,
}

/// Where the guest gets trixie's nft root, and the wrapper that runs it as `nft`.
pub const GUEST_NFT_ROOT: &str = "opt/nft-trixie";

impl GuestNft {
    /// `/usr/sbin/nft` in the guest: runs the root's binary through the root's own loader
    /// and libraries (Debian 12's glibc is too old for it).
    pub fn wrapper_script() -> String {
        let lib = format!("/{GUEST_NFT_ROOT}/usr/lib/x86_64-linux-gnu");
        format!(
            "#!/bin/bash\nexec {lib}/ld-linux-x86-64.so.2 --library-path {lib} \
             /{GUEST_NFT_ROOT}/usr/sbin/nft \"$@\"\n"
        )
    }
}

/// Debian 13's nft and the libraries it loads (glibc included): unpacked together, they
/// run on any host through their own loader.
const TRIXIE_NFT_PACKAGES: &[&str] = &[
    "nftables",
    "libnftables1",
    "libnftnl11",
    "libmnl0",
    "libjansson4",
    "libedit2",
    "libgmp10",
    "libxtables12",
    "libc6",
    "libbsd0",
    "libtinfo6",
    "libmd0",
];

/// The kernel `choice`, fetched and unpacked under `vm_dir/debian/` when it is not the host's.
pub fn resolve(choice: KernelChoice, vm_dir: &Path) -> Result<GuestKernel> {
    let Some(suite) = choice.suite() else {
        return find();
    };
    let archive = Archive::open(&vm_dir.join("debian").join("apt"))?;
    let package = archive
        .depends_of("linux-image-cloud-amd64", suite, "linux-image-")
        .with_context(|| format!("kernel {} (Debian {suite})", choice.name()))?;
    let root = vm_dir.join("debian").join(&package);
    if let Some(kernel) = unpacked(&root)? {
        return Ok(kernel);
    }
    let deb = archive
        .download(&package, suite)
        .with_context(|| format!("kernel {} (Debian {suite})", choice.name()))?;
    println!(
        "xtask: unpacking {} for kernel {}",
        deb.display(),
        choice.name()
    );
    let partial = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    debian_archive::unpack(&deb, &partial)?;
    prepare_modules(&partial)?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&partial, &root)
        .with_context(|| format!("moving {} into place", partial.display()))?;
    unpacked(&root)?.with_context(|| format!("{} holds no kernel after unpacking", root.display()))
}

/// The kernel unpacked at `root` (`boot/vmlinuz-*` and its module tree with `modules.dep`).
fn unpacked(root: &Path) -> Result<Option<GuestKernel>> {
    let Ok(entries) = std::fs::read_dir(root.join("boot")) else {
        return Ok(None);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(version) = name.strip_prefix("vmlinuz-") else {
            continue;
        };
        let modules = root.join("lib/modules").join(version);
        if modules.join("modules.dep").is_file() {
            return Ok(Some(GuestKernel {
                version: version.to_owned(),
                image: entry.path(),
                modules,
            }));
        }
    }
    Ok(None)
}

/// Makes an unpacked kernel package's module tree what modprobe reads: under
/// `lib/modules/<version>` (trixie ships it under `usr/lib`), decompressed (busybox's
/// modprobe loads plain `.ko`), with `modules.dep` from `depmod -b`.
fn prepare_modules(root: &Path) -> Result<()> {
    let version = std::fs::read_dir(root.join("boot"))
        .with_context(|| format!("{} has no boot/", root.display()))?
        .flatten()
        .find_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("vmlinuz-")
                .map(str::to_owned)
        })
        .with_context(|| format!("{} has no boot/vmlinuz-*", root.display()))?;
    let wanted = root.join("lib/modules").join(&version);
    let merged = root.join("usr/lib/modules").join(&version);
    if !wanted.is_dir() && merged.is_dir() {
        std::fs::create_dir_all(root.join("lib/modules"))?;
        std::fs::rename(&merged, &wanted)
            .with_context(|| format!("moving {} to lib/modules", merged.display()))?;
    }
    anyhow::ensure!(wanted.is_dir(), "{} has no module tree", root.display());
    let status = Command::new("find")
        .arg(&wanted)
        .args(["-name", "*.ko.xz", "-exec", "xz", "-d", "{}", "+"])
        .status()
        .context("running find -exec xz -d")?;
    anyhow::ensure!(
        status.success(),
        "decompressing the modules failed ({status})"
    );
    let depmod =
        crate::deps::find_command("depmod").context("depmod not found (Debian package kmod)")?;
    let status = Command::new(depmod)
        .arg("-b")
        .arg(root)
        .arg(&version)
        .status()
        .context("running depmod")?;
    anyhow::ensure!(
        status.success(),
        "depmod -b {} {version} failed ({status})",
        root.display()
    );
    Ok(())
}

/// The guest's `nft`: `None` for the host's (copied like the other tools), else trixie's
/// root, fetched and unpacked under `vm_dir/debian/nft-trixie` once.
pub fn resolve_nft(choice: NftChoice, vm_dir: &Path) -> Result<Option<GuestNft>> {
    if choice == NftChoice::Host {
        return Ok(None);
    }
    let root = vm_dir.join("debian").join("nft-trixie");
    if root.join("usr/sbin/nft").is_file() {
        return Ok(Some(GuestNft { root }));
    }
    let archive = Archive::open(&vm_dir.join("debian").join("apt"))?;
    let partial = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    for package in TRIXIE_NFT_PACKAGES {
        let deb = archive
            .download(package, "trixie")
            .with_context(|| format!("nft of Debian trixie: {package}"))?;
        debian_archive::unpack(&deb, &partial)?;
    }
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&partial, &root)
        .with_context(|| format!("moving {} into place", partial.display()))?;
    Ok(Some(GuestNft { root }))
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

    #[test]
    fn the_nft_wrapper_runs_the_binary_through_its_own_loader() {
        let script = GuestNft::wrapper_script();
        assert!(script.starts_with("#!/bin/bash\n"));
        assert!(script.contains(
            "exec /opt/nft-trixie/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path /opt/nft-trixie/usr/lib/x86_64-linux-gnu /opt/nft-trixie/usr/sbin/nft \"$@\""
        ));
    }
}
