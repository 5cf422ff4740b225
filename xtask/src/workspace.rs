//! Where the workspace and its target directory are, and how to call cargo.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The workspace this xtask belongs to.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// Workspace root (the directory of the root Cargo.toml).
    pub root: PathBuf,
    /// Cargo's target directory.
    pub target_dir: PathBuf,
    /// `cargo metadata --no-deps` of the workspace, as read by [`Workspace::locate`].
    pub metadata: serde_json::Value,
    cargo: OsString,
}

impl Workspace {
    /// Locates the workspace (from this crate's manifest dir) and asks cargo
    /// for its target directory.
    pub fn locate() -> Result<Workspace> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("xtask crate has no parent directory")?
            .to_path_buf();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
        let output = Command::new(&cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(&root)
            .output()
            .context("running cargo metadata")?;
        if !output.status.success() {
            bail!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let metadata: serde_json::Value =
            serde_json::from_slice(&output.stdout).context("parsing cargo metadata output")?;
        let target_dir = metadata["target_directory"]
            .as_str()
            .map(PathBuf::from)
            .context("cargo metadata has no target_directory")?;
        Ok(Workspace {
            root,
            target_dir,
            metadata,
            cargo,
        })
    }

    /// A `cargo` command run from the workspace root.
    pub fn cargo(&self) -> Command {
        let mut command = Command::new(&self.cargo);
        command.current_dir(&self.root);
        command
    }

    /// The packages that may be published (`publish` not `false` in their manifest): the
    /// library crates, which CI packages and documents. A new library crate joins by
    /// setting `publish = true`.
    pub fn published_packages(&self) -> Result<Vec<String>> {
        let packages = self.metadata["packages"]
            .as_array()
            .context("cargo metadata has no packages")?;
        let mut names = Vec::new();
        for package in packages {
            // `null`: any registry; a list: those registries; `[]`: `publish = false`.
            let publishable = match &package["publish"] {
                serde_json::Value::Null => true,
                serde_json::Value::Array(registries) => !registries.is_empty(),
                _ => false,
            };
            if publishable {
                let name = package["name"].as_str().context("package without a name")?;
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Directory for the VM runner's files (`target/vm`).
    pub fn vm_dir(&self) -> PathBuf {
        self.target_dir.join("vm")
    }
}
