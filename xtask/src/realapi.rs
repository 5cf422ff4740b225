//! The real Kubernetes API server (`../shared/realapi`: `mini-apiserver` on etcd) on the
//! guest's disk, for the VM tests that run the daemon against it.
//!
//! The shipped binaries are unpacked on the host into `target/vm/realapi/<stamp>/` beside
//! copies of `start.sh` and `stop.sh`, the layout the test kit (`tests/src/realapi.rs`) reads
//! from `$IPVS_PROXIER_REALAPI`; the guest sees the directory at the same path through the
//! target directory's link. A missing `realapi` directory leaves those tests skipping on a
//! developer machine, and fails the run in CI.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::workspace::Workspace;

/// Environment variable naming the `realapi` directory (the test kit reads the same).
pub const REALAPI_ENV: &str = "IPVS_PROXIER_REALAPI";

/// The scripts copied beside the binaries.
const SCRIPTS: [&str; 2] = ["start.sh", "stop.sh"];

/// The server's files, ready for the guest's disk.
#[derive(Debug)]
pub struct RealApiFiles {
    /// The directory the guest's `$IPVS_PROXIER_REALAPI` names (under the target directory).
    pub dir: PathBuf,
    /// Every file in it.
    pub files: Vec<PathBuf>,
}

/// The `realapi` directory: `$IPVS_PROXIER_REALAPI`, else `../shared/realapi` beside the
/// workspace.
fn source_dir(workspace: &Workspace) -> PathBuf {
    std::env::var_os(REALAPI_ENV)
        .map_or_else(|| workspace.root.join("../shared/realapi"), PathBuf::from)
}

/// Unpacks the server for the guest, or `None` (with a note) when there is no `realapi`
/// directory outside CI.
///
/// # Errors
/// When the directory is missing in CI (`CI` set), or unpacking fails.
pub fn stage(workspace: &Workspace) -> Result<Option<RealApiFiles>> {
    let source = source_dir(workspace);
    let shipped = ["mini-apiserver.xz", "etcd.xz"].map(|name| source.join("bin").join(name));
    let present = shipped.iter().all(|f| f.is_file())
        && SCRIPTS.iter().all(|script| source.join(script).is_file());
    if !present {
        let reason = format!(
            "no real API server at {} (start.sh, stop.sh, bin/*.xz; set {REALAPI_ENV})",
            source.display()
        );
        if std::env::var_os("CI").is_some() {
            bail!("CI must run the real API server's VM tests: {reason}");
        }
        println!("xtask: {reason}: its VM tests will skip");
        return Ok(None);
    }
    let dir = workspace
        .target_dir
        .join("vm/realapi")
        .join(stamp(&shipped));
    let binaries = [dir.join("mini-apiserver"), dir.join("root/usr/bin/etcd")];
    if !binaries.iter().all(|b| b.is_file()) {
        let scratch = dir.with_extension(format!("unpacking-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let out = Command::new(source.join("unpack-prebuilt.sh"))
            .arg(&scratch)
            .output()
            .context("running unpack-prebuilt.sh")?;
        if !out.status.success() {
            bail!(
                "unpack-prebuilt.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Another run may have put its copy in place meanwhile: then that one is used.
        if std::fs::rename(&scratch, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&scratch);
            anyhow::ensure!(
                binaries.iter().all(|b| b.is_file()),
                "no unpacked server at {}",
                dir.display()
            );
        }
    }
    let mut files = binaries.to_vec();
    for script in SCRIPTS {
        let copy = dir.join(script);
        let original =
            std::fs::read(source.join(script)).with_context(|| format!("reading {script}"))?;
        // Boots running at once stage the same directory: a copy already in place stays.
        if std::fs::read(&copy).ok().as_ref() != Some(&original) {
            let partial = copy.with_extension(format!("partial-{}", std::process::id()));
            std::fs::copy(source.join(script), &partial)
                .and_then(|_| std::fs::rename(&partial, &copy))
                .with_context(|| format!("copying {script} to {}", dir.display()))?;
        }
        files.push(copy);
    }
    Ok(Some(RealApiFiles { dir, files }))
}

/// A name for the shipped binaries: their compressed sizes and modification times.
fn stamp(shipped: &[PathBuf]) -> String {
    shipped
        .iter()
        .map(|file| {
            let meta = std::fs::metadata(file).ok();
            let size = meta.as_ref().map_or(0, std::fs::Metadata::len);
            let time = meta
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |t| t.as_secs());
            format!("{size}-{time}")
        })
        .collect::<Vec<_>>()
        .join("-")
}
