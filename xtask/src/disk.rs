//! The ext4 disk image carrying the (large) binaries and the run script
//! into the guest, built with `mkfs.ext4 -d` (no mount needed).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Files to put on the disk, staged in a directory first.
#[derive(Debug)]
pub struct DiskStaging {
    root: PathBuf,
    bytes: u64,
}

impl DiskStaging {
    /// An empty staging directory (removed first if it exists).
    pub fn new(root: PathBuf) -> Result<DiskStaging> {
        if root.exists() {
            std::fs::remove_dir_all(&root)
                .with_context(|| format!("removing {}", root.display()))?;
        }
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        Ok(DiskStaging { root, bytes: 0 })
    }

    /// Places a host file at `relative` on the disk: with `strip_debug`, a
    /// copy without DWARF sections (`objcopy --strip-debug`: symbols stay, so
    /// backtraces keep function names; panics keep their file:line), else a
    /// hard link (or a copy).
    pub fn add_file(&mut self, host: &Path, relative: &Path, strip_debug: bool) -> Result<()> {
        let destination = self.root.join(relative);
        if destination.exists() {
            return Ok(());
        }
        if let Some(parent) = destination.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let stripped = strip_debug
            && Command::new("objcopy")
                .arg("--strip-debug")
                .arg(host)
                .arg(&destination)
                .output()
                .is_ok_and(|o| o.status.success());
        if !stripped {
            let _ = std::fs::remove_file(&destination);
            if std::fs::hard_link(host, &destination).is_err() {
                std::fs::copy(host, &destination).with_context(|| {
                    format!("copying {} to {}", host.display(), destination.display())
                })?;
            }
        }
        self.bytes += std::fs::metadata(&destination)?.len();
        Ok(())
    }

    /// Writes a file with the given content.
    pub fn add_content(&mut self, relative: &str, content: &str, executable: bool) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let destination = self.root.join(relative);
        std::fs::write(&destination, content)?;
        let mode = if executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&destination, std::fs::Permissions::from_mode(mode))?;
        self.bytes += content.len() as u64;
        Ok(())
    }

    /// Builds `image` from the staged files and removes the staging directory.
    pub fn build_image(self, image: &Path) -> Result<u64> {
        let size = image_size(self.bytes);
        let _ = std::fs::remove_file(image);
        let file = std::fs::File::create(image)
            .with_context(|| format!("creating {}", image.display()))?;
        file.set_len(size)?;
        drop(file);
        let output = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "root_owner=0:0", "-d"])
            .arg(&self.root)
            .arg(image)
            .output()
            .context("running mkfs.ext4 (package e2fsprogs)")?;
        if !output.status.success() {
            bail!(
                "mkfs.ext4 -d {} failed: {}",
                self.root.display(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::fs::remove_dir_all(&self.root)
            .with_context(|| format!("removing {}", self.root.display()))?;
        Ok(size)
    }
}

/// Image size for this many bytes of files: 25% + 64 MiB of room for
/// metadata and tests writing files, rounded to MiB.
fn image_size(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let wanted = bytes + bytes / 4 + 64 * MIB;
    wanted.div_ceil(MIB) * MIB
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn image_has_room_beyond_the_files() {
        let size = image_size(400 << 20);
        assert!(size >= (500 << 20) + (64 << 20));
        assert_eq!(size % (1 << 20), 0);
        assert_eq!(image_size(0), 64 << 20);
    }
}
