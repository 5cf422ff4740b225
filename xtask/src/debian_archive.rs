//! Packages of other Debian releases, fetched from the archive the host's apt sources name,
//! through an apt state of our own under `target/vm/debian/` (the system's sources, lists
//! and cache are never touched), and unpacked with `dpkg -x`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The Debian releases the VM matrix takes packages from (besides the host's own).
pub const SUITES: &[&str] = &["bullseye", "trixie"];

/// A private apt state: its own sources list (the host's archive, our suites), lists and cache.
#[derive(Debug)]
pub struct Archive {
    dir: PathBuf,
}

impl Archive {
    /// Opens (and on first use, creates and updates) the apt state under `dir`.
    pub fn open(dir: &Path) -> Result<Archive> {
        for sub in ["lists/partial", "cache/archives/partial", "debs"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let archive = Archive {
            dir: dir.to_path_buf(),
        };
        let uri = host_archive_uri()?;
        let sources = format!(
            "Types: deb\nURIs: {uri}\nSuites: {}\nComponents: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
            SUITES.join(" ")
        );
        let sources_path = dir.join("archive.sources");
        let changed = std::fs::read_to_string(&sources_path).ok().as_deref() != Some(&sources);
        if changed {
            std::fs::write(&sources_path, &sources)
                .with_context(|| format!("writing {}", sources_path.display()))?;
        }
        if changed || !archive.has_lists() {
            println!(
                "xtask: apt-get update of Debian {} (private state in {})",
                SUITES.join(", "),
                dir.display()
            );
            archive.apt("apt-get", &["update", "-q"])?;
        }
        Ok(archive)
    }

    fn has_lists(&self) -> bool {
        std::fs::read_dir(self.dir.join("lists")).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().contains("Packages"))
        })
    }

    fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        vec![
            format!("-oDir::State::Lists={d}/lists"),
            format!("-oDir::Cache={d}/cache"),
            format!("-oDir::Etc::SourceList={d}/archive.sources"),
            "-oDir::Etc::SourceParts=/dev/null".to_owned(),
            "-oAPT::Get::List-Cleanup=0".to_owned(),
        ]
    }

    fn apt(&self, program: &str, args: &[&str]) -> Result<String> {
        let output = Command::new(program)
            .args(self.options())
            .args(args)
            .current_dir(self.dir.join("debs"))
            .output()
            .with_context(|| format!("running {program}"))?;
        if !output.status.success() {
            bail!(
                "{program} {} failed ({}): {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The first `linux-image-*` package the metapackage `name` of `suite` depends on
    /// (e.g. `linux-image-cloud-amd64` of trixie -> `linux-image-6.12.57+deb13-cloud-amd64`).
    pub fn depends_of(&self, name: &str, suite: &str, prefix: &str) -> Result<String> {
        let text = self.apt("apt-cache", &["depends", &format!("{name}/{suite}")])?;
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("Depends:"))
            .map(str::trim)
            .find(|dep| dep.starts_with(prefix))
            .map(str::to_owned)
            .with_context(|| format!("{name} of Debian {suite} depends on no {prefix}* package"))
    }

    /// Downloads `name` of `suite` (once) and returns the `.deb`.
    pub fn download(&self, name: &str, suite: &str) -> Result<PathBuf> {
        if let Some(existing) = self.downloaded(name, suite) {
            return Ok(existing);
        }
        self.apt("apt-get", &["download", "-q", &format!("{name}/{suite}")])
            .with_context(|| format!("downloading {name} of Debian {suite}"))?;
        let version = self.candidate(name, suite)?;
        self.downloaded(name, suite)
            .or_else(|| self.deb_named(name, &version))
            .with_context(|| format!("apt-get downloaded no .deb for {name} of Debian {suite}"))
    }

    /// The version of `name` that `suite` has.
    fn candidate(&self, name: &str, suite: &str) -> Result<String> {
        let text = self.apt(
            "apt-cache",
            &["show", "--no-all-versions", &format!("{name}/{suite}")],
        )?;
        text.lines()
            .find_map(|line| line.strip_prefix("Version:"))
            .map(|v| v.trim().to_owned())
            .with_context(|| format!("no version of {name} in Debian {suite}"))
    }

    fn downloaded(&self, name: &str, suite: &str) -> Option<PathBuf> {
        let version = self.candidate(name, suite).ok()?;
        self.deb_named(name, &version)
    }

    /// `NAME_VERSION_ARCH.deb` in the download directory (apt writes `:` as `%3a`).
    fn deb_named(&self, name: &str, version: &str) -> Option<PathBuf> {
        let version = version.replace(':', "%3a");
        let prefix = format!("{name}_{version}_");
        std::fs::read_dir(self.dir.join("debs"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with(&prefix) && n.ends_with(".deb")
                })
            })
    }
}

/// Unpacks `deb` into `root` (`dpkg -x`).
pub fn unpack(deb: &Path, root: &Path) -> Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let status = Command::new("dpkg")
        .arg("-x")
        .arg(deb)
        .arg(root)
        .status()
        .context("running dpkg -x")?;
    anyhow::ensure!(
        status.success(),
        "dpkg -x {} failed ({status})",
        deb.display()
    );
    Ok(())
}

/// The archive URI the host's apt sources use (its first deb822 `URIs:` line, else the first
/// `deb` line of `sources.list`).
fn host_archive_uri() -> Result<String> {
    let mut deb822: Vec<PathBuf> = std::fs::read_dir("/etc/apt/sources.list.d")
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    deb822.retain(|p| p.extension().is_some_and(|e| e == "sources"));
    deb822.sort();
    for path in deb822 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(uri) = first_uri(&text) {
            return Ok(uri);
        }
    }
    let list = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    list.lines()
        .map(str::trim)
        .filter(|line| line.starts_with("deb "))
        .find_map(|line| {
            line.split_whitespace()
                .skip(1)
                .find(|word| !word.starts_with('['))
                .map(str::to_owned)
        })
        .context("the host's apt sources name no Debian archive (/etc/apt/sources.list{,.d})")
}

/// The first URI of a deb822 sources file.
fn first_uri(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("URIs:"))
        .and_then(|uris| uris.split_whitespace().next())
        .map(str::to_owned)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_first_uri_of_a_deb822_file_is_its_archive() {
        let text =
            "Types: deb\nURIs: http://deb.example/debian http://other/debian\nSuites: bookworm\n";
        assert_eq!(first_uri(text).unwrap(), "http://deb.example/debian");
        assert_eq!(first_uri("Types: deb\n"), None);
    }
}
