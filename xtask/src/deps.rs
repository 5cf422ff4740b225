//! Host prerequisites of the VM runner: which tools are needed, which Debian
//! package provides each, and installing them when we can.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::guest_kernel;

/// Every Debian package the VM runner (and CI) needs.
pub const DEBIAN_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "linux-image-cloud-amd64",
    "busybox-static",
    "ipvsadm",
    "nftables",
    "socat",
    "conntrack",
    "iproute2",
    "e2fsprogs",
    "cpio",
    "iptables",
    "ipset",
    // The kernels of the matrix other than the host's: depmod for their module trees,
    // xz for their compressed modules.
    "kmod",
    "xz-utils",
    // The real API server's scripts and the test kit.
    "curl",
];

/// A host command the runner uses, and the package that provides it.
struct Tool {
    command: &'static str,
    package: &'static str,
}

const TOOLS: &[Tool] = &[
    Tool {
        command: "qemu-system-x86_64",
        package: "qemu-system-x86",
    },
    Tool {
        command: "ip",
        package: "iproute2",
    },
    Tool {
        command: "ss",
        package: "iproute2",
    },
    Tool {
        command: "bridge",
        package: "iproute2",
    },
    Tool {
        command: "ipvsadm",
        package: "ipvsadm",
    },
    Tool {
        command: "nft",
        package: "nftables",
    },
    Tool {
        command: "socat",
        package: "socat",
    },
    Tool {
        command: "conntrack",
        package: "conntrack",
    },
    Tool {
        command: "iptables-legacy",
        package: "iptables",
    },
    Tool {
        command: "iptables-nft",
        package: "iptables",
    },
    Tool {
        command: "ipset",
        package: "ipset",
    },
    // The real API server's scripts and the test kit's requests, in the guest too.
    Tool {
        command: "curl",
        package: "curl",
    },
    Tool {
        command: "mkfs.ext4",
        package: "e2fsprogs",
    },
    Tool {
        command: "bash",
        package: "bash",
    },
    Tool {
        command: "gzip",
        package: "gzip",
    },
    Tool {
        command: "depmod",
        package: "kmod",
    },
    Tool {
        command: "xz",
        package: "xz-utils",
    },
    Tool {
        command: "ldd",
        package: "libc-bin",
    },
];

/// Paths of the host tools that go into the guest.
#[derive(Debug, Clone)]
pub struct HostTools {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// Statically linked busybox.
    pub busybox: PathBuf,
    /// Real tools copied into the guest (ip, ipvsadm, nft, socat, conntrack, bash, ...).
    pub guest_tools: Vec<PathBuf>,
}

/// Names of the real tools copied into the guest; busybox applets never shadow them.
pub const GUEST_TOOLS: &[&str] = &[
    "bash",
    "ip",
    "ss",
    "bridge",
    "ipvsadm",
    "nft",
    "socat",
    "conntrack",
    // kube-proxy's footprint in the takeover tests, in both iptables flavours.
    "iptables-legacy",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-legacy",
    "ip6tables-legacy-save",
    "ip6tables-legacy-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
    "ipset",
    // The real API server's `start.sh` (which also detaches it with `nohup`, not a busybox
    // applet) and the test kit speak HTTPS with it.
    "curl",
    "nohup",
];

/// Directories of plugins the guest tools load at run time (`dlopen`, so `ldd` does not
/// list them): iptables' match and target extensions. Copied whole when present.
pub const GUEST_PLUGIN_DIRS: &[&str] = &["/usr/lib/x86_64-linux-gnu/xtables"];

/// Finds a command on PATH and in the sbin directories (which a non-root PATH may lack).
pub fn find_command(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A busybox that runs without shared libraries (the `busybox-static` package).
fn find_static_busybox() -> Option<PathBuf> {
    let busybox = find_command("busybox")?;
    let output = Command::new("ldd").arg(&busybox).output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (text.contains("not a dynamic executable") || text.contains("statically linked"))
        .then_some(busybox)
}

/// Packages providing what is missing on this host (empty when all is there).
fn missing_packages() -> Vec<&'static str> {
    let mut missing: Vec<&'static str> = TOOLS
        .iter()
        .filter(|tool| find_command(tool.command).is_none())
        .map(|tool| tool.package)
        .collect();
    if find_static_busybox().is_none() {
        missing.push("busybox-static");
    }
    if guest_kernel::find().is_err() {
        missing.push("linux-image-cloud-amd64");
    }
    missing.sort_unstable();
    missing.dedup();
    missing
}

/// Makes sure every prerequisite is there, installing the missing Debian
/// packages with apt-get when running as root; otherwise says what to install.
pub fn ensure() -> Result<HostTools> {
    let missing = missing_packages();
    if !missing.is_empty() {
        let install = format!("apt-get install -y {}", missing.join(" "));
        let can_install = is_root() && find_command("apt-get").is_some();
        if !can_install {
            bail!(
                "the VM runner needs these Debian packages: {}\n  install them with: \
                 sudo apt-get update && sudo {install}\n  (everything the VM runner uses: {})",
                missing.join(" "),
                DEBIAN_PACKAGES.join(" ")
            );
        }
        println!("xtask: installing missing packages: {}", missing.join(" "));
        run_apt(&["update"])?;
        let mut args = vec!["install", "-y", "--no-install-recommends"];
        args.extend(missing.iter().copied());
        run_apt(&args)?;
        let still = missing_packages();
        if !still.is_empty() {
            bail!("still missing after apt-get install: {}", still.join(" "));
        }
    }
    let qemu = find_command("qemu-system-x86_64").context("qemu-system-x86_64 not found")?;
    let busybox = find_static_busybox().context("static busybox not found")?;
    let guest_tools = GUEST_TOOLS
        .iter()
        .map(|name| find_command(name).with_context(|| format!("{name} not found")))
        .collect::<Result<Vec<_>>>()?;
    Ok(HostTools {
        qemu,
        busybox,
        guest_tools,
    })
}

fn run_apt(args: &[&str]) -> Result<()> {
    let status = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get")?;
    if !status.success() {
        bail!("apt-get {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Whether this process runs as root (effective uid 0), read from /proc.
pub fn is_root() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .is_some_and(|euid| euid == "0")
}
