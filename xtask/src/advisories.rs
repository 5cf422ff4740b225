//! `cargo deny check advisories` without the network, against the RustSec snapshot that CI
//! has beside the clone (`<clone>/../shared/advisory-db`: the database's `crates/` folder).
//!
//! cargo-deny (0.20) keeps each database of `db-urls` in `<db-path>/<name>-<hash>`: `name`
//! is the URL's last path segment, `hash` the XXH64 (seed `0xca80de71`) of the lowercased
//! URL as 16 hex digits. It reads the advisories from `crates/` there and, with `--offline`,
//! takes the modification time of `.git/FETCH_HEAD` as the time of the last fetch.
//! [`prepare`] builds that folder under the target directory, `crates` a link to the
//! snapshot; `deny.toml` reads `db-path` from [`DB_ROOT_ENV`]. The snapshot's age is its
//! maintainer's business (its README names its commit and date, printed by the step):
//! `FETCH_HEAD` is written at each run, so cargo-deny's staleness limit never trips.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::workspace::Workspace;

/// The snapshot folder (holding `crates/`), when it is not at `<clone>/../shared/advisory-db`.
pub const SNAPSHOT_ENV: &str = "IPVS_PROXIER_ADVISORY_DB";

/// The `db-path` that `deny.toml` reads; set by the CI step to the folder [`prepare`] built.
pub const DB_ROOT_ENV: &str = "IPVS_PROXIER_ADVISORY_DB_ROOT";

/// The database URL, as `db-urls` in `deny.toml` names it (its folder name derives from it).
pub const DB_URL: &str = "https://github.com/rustsec/advisory-db";

/// Where the snapshot is: [`SNAPSHOT_ENV`] when set, else `shared/advisory-db` beside the
/// clone, else beside the main clone of a `git worktree`. `Err` lists the places looked at.
pub fn find_snapshot(workspace: &Workspace) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(SNAPSHOT_ENV) {
        let path = PathBuf::from(path);
        ensure!(
            path.join("crates").is_dir(),
            "{SNAPSHOT_ENV}={} has no crates/ folder",
            path.display()
        );
        return Ok(path);
    }
    let mut tried = vec![workspace.root.join("../shared/advisory-db")];
    if let Some(main_clone) = main_clone_root(&workspace.root) {
        tried.push(main_clone.join("../shared/advisory-db"));
    }
    for path in &tried {
        if path.join("crates").is_dir() {
            return Ok(path.clone());
        }
    }
    let tried: Vec<_> = tried.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "no RustSec snapshot (a folder with crates/) at {}; set {SNAPSHOT_ENV} to one",
        tried.join(" or ")
    )
}

/// The work tree of the repository's main clone, when `root` is a linked worktree (the
/// parent of git's common directory).
fn main_clone_root(root: &Path) -> Option<PathBuf> {
    let output = Command::new("git")
        .args(["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .current_dir(root)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let common_dir = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    common_dir.parent().map(Path::to_path_buf)
}

/// Lays `snapshot` out as cargo-deny's database of [`DB_URL`] under
/// `<target>/advisory-dbs` (rebuilt at each call) and returns that root, for [`DB_ROOT_ENV`].
/// Checks first that `deny.toml` names [`DB_URL`] and reads [`DB_ROOT_ENV`].
pub fn prepare(workspace: &Workspace, snapshot: &Path) -> Result<PathBuf> {
    let config_path = workspace.root.join("deny.toml");
    let config = std::fs::read_to_string(&config_path)
        .with_context(|| format!("reading {}", config_path.display()))?;
    for needed in [format!("\"{DB_URL}\""), format!("${{{DB_ROOT_ENV}")] {
        ensure!(
            config.contains(&needed),
            "deny.toml does not mention {needed}: [advisories] must read db-urls = [\"{DB_URL}\"] \
             and db-path from {DB_ROOT_ENV}, as xtask/src/advisories.rs lays the database out"
        );
    }
    let snapshot = snapshot
        .canonicalize()
        .with_context(|| format!("resolving {}", snapshot.display()))?;
    let root = workspace.target_dir.join("advisory-dbs");
    let db = root.join(db_dir_name(DB_URL));
    if db.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(&db).with_context(|| format!("removing {}", db.display()))?;
    }
    std::fs::create_dir_all(db.join(".git"))
        .with_context(|| format!("creating {}", db.display()))?;
    std::fs::write(db.join(".git/FETCH_HEAD"), b"")
        .with_context(|| format!("writing {}/.git/FETCH_HEAD", db.display()))?;
    std::os::unix::fs::symlink(snapshot.join("crates"), db.join("crates"))
        .with_context(|| format!("linking {}/crates", db.display()))?;
    Ok(root)
}

/// The line of the snapshot's README that names its commit and date, if any.
pub fn snapshot_version(snapshot: &Path) -> Option<String> {
    let readme = std::fs::read_to_string(snapshot.join("README.md")).ok()?;
    let text = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = text.find("commit ")?;
    let end = text[start..].find('.').map_or(text.len(), |i| start + i);
    Some(text[start..end].to_owned())
}

/// The folder name cargo-deny gives the database of `url` under its `db-path`.
fn db_dir_name(url: &str) -> String {
    let url = url.to_lowercase();
    let name = url
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("empty_");
    let hash = twox_hash::XxHash64::oneshot(0xca80_de71, url.as_bytes());
    format!("{name}-{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The folder cargo-deny 0.20.2 looked for, read from its error when the folder was
    /// missing (`cargo deny --offline check advisories`).
    #[test]
    fn database_folder_is_named_as_cargo_deny_names_it() {
        assert_eq!(db_dir_name(DB_URL), "advisory-db-3157b0e258782691");
        assert_eq!(
            db_dir_name("https://github.com/RustSec/advisory-db"),
            db_dir_name(DB_URL)
        );
    }

    #[test]
    fn snapshot_version_is_read_from_the_readme() {
        let dir = std::env::temp_dir().join(format!("xtask-advisories-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(
            dir.join("README.md"),
            "A copy of the `crates/` folder (github: rustsec/advisory-db),\ncommit abc123 of \
             2026-08-21. CI machines cannot fetch it.\n",
        )
        .expect("write");
        assert_eq!(
            snapshot_version(&dir).as_deref(),
            Some("commit abc123 of 2026-08-21")
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
