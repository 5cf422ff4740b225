//! The I/O edge: hands a rendered script to the kernel.
//!
//! [`NftBackend`] runs `nft -f -` with the script on its standard input, in the network
//! namespace of the calling thread (a child process inherits it). [`MemoryNetfilterBackend`]
//! records scripts for tests and dry runs.

use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

/// Why a script could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum NetfilterError {
    /// The `nft` binary could not be started (missing, not executable).
    #[error("cannot run {nft}: {source} (the node needs the nft binary from nftables)")]
    Spawn {
        /// Path of the binary.
        nft: PathBuf,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// Writing the script to `nft` or waiting for it failed.
    #[error("talking to {nft}: {source}")]
    Io {
        /// Path of the binary.
        nft: PathBuf,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// `nft` refused the script; nothing of it was applied.
    #[error("{nft} -f - refused the script ({status}): {stderr}")]
    Rejected {
        /// Path of the binary.
        nft: PathBuf,
        /// Exit status.
        status: std::process::ExitStatus,
        /// What it printed on standard error (names the offending line).
        stderr: String,
    },
    /// The options cannot be rendered.
    #[error(transparent)]
    Render(#[from] super::render::RenderError),
}

/// Applies nft scripts, each as one transaction.
pub trait NetfilterBackend: Send {
    /// Applies `script` atomically: all of it or none.
    fn apply(&mut self, script: &str) -> impl Future<Output = Result<(), NetfilterError>> + Send;
}

/// Runs the `nft` binary.
#[derive(Debug, Clone)]
pub struct NftBackend {
    nft: PathBuf,
}

impl Default for NftBackend {
    fn default() -> Self {
        NftBackend::new("nft")
    }
}

impl NftBackend {
    /// A backend running `nft` (a path, or a name looked up in `PATH`).
    pub fn new(nft: impl Into<PathBuf>) -> Self {
        NftBackend { nft: nft.into() }
    }

    /// The binary this backend runs.
    pub fn binary(&self) -> &std::path::Path {
        &self.nft
    }
}

impl NetfilterBackend for NftBackend {
    async fn apply(&mut self, script: &str) -> Result<(), NetfilterError> {
        let mut child = tokio::process::Command::new(&self.nft)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| NetfilterError::Spawn {
                nft: self.nft.clone(),
                source,
            })?;
        let io_error = |source| NetfilterError::Io {
            nft: self.nft.clone(),
            source,
        };
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes()).await.map_err(io_error)?;
            stdin.shutdown().await.map_err(io_error)?;
        }
        let output = child.wait_with_output().await.map_err(io_error)?;
        if output.status.success() {
            Ok(())
        } else {
            Err(NetfilterError::Rejected {
                nft: self.nft.clone(),
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }
}

/// Records every script instead of applying it (tests, `--dry-run`).
#[derive(Debug, Clone, Default)]
pub struct MemoryNetfilterBackend {
    /// Scripts applied so far, oldest first.
    pub scripts: Vec<String>,
    /// When set, the next `apply` fails with this message (and records nothing).
    pub fail_next: Option<String>,
}

impl NetfilterBackend for MemoryNetfilterBackend {
    async fn apply(&mut self, script: &str) -> Result<(), NetfilterError> {
        if let Some(message) = self.fail_next.take() {
            return Err(NetfilterError::Io {
                nft: PathBuf::from("memory"),
                source: std::io::Error::other(message),
            });
        }
        self.scripts.push(script.to_owned());
        Ok(())
    }
}
