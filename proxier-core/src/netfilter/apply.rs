//! The I/O edge: hands a rendered script to the kernel.
//!
//! [`NftBackend`] runs `nft -f -` with the script on its standard input, in the network
//! namespace of the calling thread (a child process inherits it), and sends incremental
//! set-element updates as nf_tables batches over nfnetlink ([`ElementBatch`]) on a socket
//! opened there. [`MemoryNetfilterBackend`] records scripts for tests and dry runs.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;

use ipvs_netlink::transport::NetlinkSocket;
use tokio::io::AsyncWriteExt;

use super::digest::parse_digest;
use super::elements::ElementBatch;
use super::render::DIGEST_SET;

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
    /// The running kernel refused the proxier's tables as this `nft` writes them, when
    /// checked before anything was written ([`NetfilterBackend::check`]).
    #[error(
        "kernel {kernel} refuses the proxier's nftables tables as {nft} ({version}) writes them; \
         nothing was written. nft said: {stderr}. Run nft 1.1 or newer on this node (the \
         ipvs-proxier image ships one), or see docs/kernels.md for the kernels and nft \
         releases tested together"
    )]
    TablesRefused {
        /// Path of the binary.
        nft: PathBuf,
        /// What `nft --version` printed.
        version: String,
        /// The running kernel's release.
        kernel: String,
        /// What nft printed on standard error: the refused rule, marked.
        stderr: String,
    },
    /// The tables could not be listed over nfnetlink ([`NftBackend::list_tables`]).
    #[error("listing the nftables tables over netlink: {0}")]
    Listing(std::io::Error),
    /// The digest set could not be read over nfnetlink ([`NftBackend::read_digest`]).
    #[error("reading the nftables digest set over netlink: {0}")]
    DigestRead(std::io::Error),
    /// A set-element update sent over nfnetlink ([`ElementBatch`]) was refused (nothing of
    /// it was applied) or could not be sent.
    #[error("updating the nftables set elements over netlink: {0}")]
    ElementBatch(std::io::Error),
}

/// The tables present in the kernel, each as `family name` (`ip ipvs-proxier`), read by a
/// future that borrows nothing of its backend ([`NetfilterBackend::list_tables`]).
pub type PendingTableList =
    Pin<Box<dyn Future<Output = Result<BTreeSet<String>, NetfilterError>> + Send + 'static>>;

/// One set as `nft list set` prints it, read by a future that borrows nothing of its
/// backend ([`NetfilterBackend::list_set`]).
pub type PendingSetList =
    Pin<Box<dyn Future<Output = Result<String, NetfilterError>> + Send + 'static>>;

/// The digest one of the proxier's tables holds (`None`: none readable), read by a future
/// that borrows nothing of its backend ([`NetfilterBackend::read_digest`]).
pub type PendingDigest =
    Pin<Box<dyn Future<Output = Result<Option<u64>, NetfilterError>> + Send + 'static>>;

/// A script being applied by [`NetfilterBackend::apply_detached`], as a future that borrows
/// nothing of its backend.
pub type PendingApply = Pin<Box<dyn Future<Output = Result<(), NetfilterError>> + Send + 'static>>;

/// Applies nft scripts, each as one transaction.
pub trait NetfilterBackend: Send {
    /// Applies `script` atomically: all of it or none.
    fn apply(&mut self, script: &str) -> impl Future<Output = Result<(), NetfilterError>> + Send;

    /// Starts applying `script` as [`NetfilterBackend::apply`] does, and returns a future
    /// that borrows nothing of the backend and ends when the kernel took it (or refused it),
    /// so that an incremental update runs on while the next sync goes on. Whatever depends on
    /// the calling thread (its network namespace) is settled before this returns. `None`
    /// (the default): this backend cannot, and updates are applied within the sync.
    fn apply_detached(&self, script: String) -> Option<PendingApply> {
        let _ = script;
        None
    }

    /// Starts applying an incremental set-element update sent as one nf_tables batch
    /// ([`ElementBatch`]), as [`NetfilterBackend::apply_detached`] starts a script: the same
    /// transaction, without a process. `None` (the default): this backend cannot, and the
    /// update goes by script.
    fn apply_elements_detached(&self, batch: ElementBatch) -> Option<PendingApply> {
        let _ = batch;
        None
    }

    /// Checks `script` against the running kernel without applying it (the kernel evaluates
    /// the whole transaction and discards it): an error names what the kernel refused.
    /// `None` (the default): this backend has no kernel to ask.
    fn check(&self, script: String) -> Option<PendingApply> {
        let _ = script;
        None
    }

    /// Lists the tables present (not their contents: cheap at any size), without borrowing
    /// the backend, so a full resync can check that its tables are still there while
    /// changes go on. `None` (the default): this backend cannot look, so every full resync
    /// rewrites the tables.
    fn list_tables(&self) -> Option<PendingTableList> {
        None
    }

    /// Lists one set of one table (`table` as `family name`), as `nft list set` prints it;
    /// an error when the table or the set does not exist. `None` (the default): this
    /// backend cannot look, so the tables are rewritten at start.
    fn list_set(&self, table: &str, set: &str) -> Option<PendingSetList> {
        let _ = (table, set);
        None
    }

    /// Reads the digest a table (`table` as `family name`) holds in its [`DIGEST_SET`]
    /// (see [`super::digest`]); `Ok(None)` when the set holds none; an error when the table
    /// or the set does not exist. The default reads it from [`NetfilterBackend::list_set`];
    /// `None`: this backend cannot look, so the tables are rewritten at start.
    fn read_digest(&self, table: &str) -> Option<PendingDigest> {
        let listing = self.list_set(table, DIGEST_SET)?;
        Some(Box::pin(async move {
            listing.await.map(|listing| parse_digest(&listing))
        }))
    }
}

/// The `family name` of each `table family name` line of `nft list tables`.
pub fn parse_table_list(listing: &str) -> BTreeSet<String> {
    listing
        .lines()
        .filter_map(|line| line.trim().strip_prefix("table "))
        .map(|table| table.trim_end_matches('{').trim().to_owned())
        .collect()
}

/// Runs the `nft` binary; lists the tables over nfnetlink ([`NftBackend::list_tables`]).
#[derive(Debug)]
pub struct NftBackend {
    nft: PathBuf,
    /// The nfnetlink socket element batches go on, kept between them
    /// ([`NftBackend::apply_elements_detached`]); `None` until the first batch, and after
    /// one that failed.
    element_socket: ElementSocket,
}

/// Where the element batches' socket waits between batches (taken by the batch in flight).
type ElementSocket = std::sync::Arc<std::sync::Mutex<Option<NetlinkSocket>>>;

impl Clone for NftBackend {
    /// The same binary; a socket of its own, opened where the clone first sends a batch
    /// (a clone may be used in another network namespace).
    fn clone(&self) -> Self {
        NftBackend::new(self.nft.clone())
    }
}

impl Default for NftBackend {
    fn default() -> Self {
        NftBackend::new("nft")
    }
}

impl NftBackend {
    /// A backend running `nft` (a path, or a name looked up in `PATH`).
    pub fn new(nft: impl Into<PathBuf>) -> Self {
        NftBackend {
            nft: nft.into(),
            element_socket: ElementSocket::default(),
        }
    }

    /// The binary this backend runs.
    pub fn binary(&self) -> &std::path::Path {
        &self.nft
    }
}

impl NetfilterBackend for NftBackend {
    async fn apply(&mut self, script: &str) -> Result<(), NetfilterError> {
        let child = self.spawn_apply()?;
        finish_apply(self.nft.clone(), child, script).await
    }

    fn apply_detached(&self, script: String) -> Option<PendingApply> {
        // The child starts here, in the calling thread's network namespace; only the
        // writing of the script and the wait run in the future.
        Some(match self.spawn_apply() {
            Ok(child) => Box::pin(finish_apply(self.nft.clone(), child, script)),
            Err(error) => Box::pin(std::future::ready(Err(error))),
        })
    }

    /// Sends the batch over nfnetlink, on the socket the last batch left, or one opened
    /// here, in the calling thread's network namespace. Opening one costs more than the
    /// batch: measured in the VM at 10,000 Services, about 10 ms of the sync adding a
    /// Service went to opening a socket (its receive buffers) for one element. The kernel
    /// takes (or refuses) the whole batch within the `sendmsg`, so the future blocks its
    /// thread only for that. A socket that failed is not kept.
    fn apply_elements_detached(&self, batch: ElementBatch) -> Option<PendingApply> {
        let kept = self
            .element_socket
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let socket = kept.map_or_else(super::tables::open, Ok);
        let slot = std::sync::Arc::clone(&self.element_socket);
        Some(Box::pin(async move {
            let mut socket = socket.map_err(NetfilterError::ElementBatch)?;
            let result = match batch.send(&mut socket) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(errno)) => Err(NetfilterError::ElementBatch(
                    std::io::Error::from_raw_os_error(errno),
                )),
                Err(error) => Err(NetfilterError::ElementBatch(error)),
            };
            if result.is_ok() {
                *slot
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(socket);
            }
            result
        }))
    }

    /// Lists the tables over nfnetlink, not with `nft list tables`, which fills nft's whole
    /// cache first (every set element: seconds of CPU at 10,000 Services, see
    /// `netfilter/tables.rs`). The socket is opened here, in the calling thread's network
    /// namespace. The dump runs where the future is polled, blocking: the kernel answers a
    /// few tables in one datagram, at once (a full resync polls it on its read's thread).
    fn list_tables(&self) -> Option<PendingTableList> {
        let socket = super::tables::open();
        Some(Box::pin(async move {
            let mut socket = socket.map_err(NetfilterError::Listing)?;
            super::tables::list(&mut socket).map_err(NetfilterError::Listing)
        }))
    }

    /// Reads the digest set over nfnetlink (one `GETSETELEM` dump), not with `nft list
    /// set`: a restart checks each of its tables this way, and a process each cost the VM
    /// about 0.1 CPU-second at 10,000 Services (nft loading its libraries and cache). The
    /// socket is opened here, in the calling thread's network namespace; the dump runs
    /// where the future is polled, blocking (one short datagram).
    fn read_digest(&self, table: &str) -> Option<PendingDigest> {
        let socket = super::tables::open();
        let table = table.to_owned();
        Some(Box::pin(async move {
            let mut socket = socket.map_err(NetfilterError::DigestRead)?;
            super::elements::read_digest(&mut socket, &table).map_err(NetfilterError::DigestRead)
        }))
    }

    /// `nft --check -f -`: nft builds the transaction, the kernel evaluates it and aborts it.
    /// A refusal comes back as [`NetfilterError::TablesRefused`], with nft's version and the
    /// kernel's release.
    fn check(&self, script: String) -> Option<PendingApply> {
        let nft = self.nft.clone();
        let child = self.spawn_nft(&["--check", "-f", "-"]);
        Some(Box::pin(async move {
            match finish_apply(nft.clone(), child?, script).await {
                Err(NetfilterError::Rejected { stderr, .. }) => {
                    let version = nft_version(&nft).await;
                    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
                        .map(|release| release.trim().to_owned())
                        .unwrap_or_else(|_| "(release unknown)".to_owned());
                    Err(NetfilterError::TablesRefused {
                        nft,
                        version,
                        kernel,
                        stderr,
                    })
                }
                other => other,
            }
        }))
    }

    fn list_set(&self, table: &str, set: &str) -> Option<PendingSetList> {
        let mut what = vec!["set".to_owned()];
        what.extend(table.split_whitespace().map(str::to_owned));
        what.push(set.to_owned());
        Some(Box::pin(nft_list(self.nft.clone(), what)))
    }
}

impl NftBackend {
    /// Starts `nft -f -`, reading the script from its standard input.
    fn spawn_apply(&self) -> Result<tokio::process::Child, NetfilterError> {
        self.spawn_nft(&["-f", "-"])
    }

    /// Starts nft with `args`, its standard input piped for a script, its errors captured.
    fn spawn_nft(&self, args: &[&str]) -> Result<tokio::process::Child, NetfilterError> {
        tokio::process::Command::new(&self.nft)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| NetfilterError::Spawn {
                nft: self.nft.clone(),
                source,
            })
    }
}

/// Feeds `script` to an `nft -f -` started by [`NftBackend::spawn_apply`] and waits for its
/// answer. The process is killed when the future is dropped before it ended (nothing of
/// the transaction is applied unless the kernel already committed it whole).
async fn finish_apply(
    nft: PathBuf,
    mut child: tokio::process::Child,
    script: impl AsRef<[u8]>,
) -> Result<(), NetfilterError> {
    let io_error = |source| NetfilterError::Io {
        nft: nft.clone(),
        source,
    };
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_ref()).await.map_err(io_error)?;
        stdin.shutdown().await.map_err(io_error)?;
    }
    let output = child.wait_with_output().await.map_err(io_error)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(NetfilterError::Rejected {
            nft,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// What `nft --version` prints (`nftables v1.0.6 (Lester Gooch #5)`), or why it printed nothing.
async fn nft_version(nft: &std::path::Path) -> String {
    match tokio::process::Command::new(nft)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .await
    {
        Ok(output) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).trim().to_owned()
        }
        Ok(output) => format!("version unknown: --version exited with {}", output.status),
        Err(error) => format!("version unknown: {error}"),
    }
}

/// `nft list WHAT...`: its standard output, or why it failed. The process is killed when the
/// future is dropped (a listing abandoned after a timeout).
async fn nft_list(nft: PathBuf, what: Vec<String>) -> Result<String, NetfilterError> {
    let output = tokio::process::Command::new(&nft)
        .arg("list")
        .args(&what)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| NetfilterError::Spawn {
            nft: nft.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(NetfilterError::Rejected {
            nft,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Records every script instead of applying it (tests, `--dry-run`).
#[derive(Debug, Clone, Default)]
pub struct MemoryNetfilterBackend {
    /// Scripts applied so far, oldest first (none kept with `forget_scripts`).
    pub scripts: Vec<String>,
    /// Keeps no script in `scripts` (a long-running dry run, whose memory must not grow
    /// with every update); the tables and set elements are followed all the same.
    pub forget_scripts: bool,
    /// When set, the next `apply` fails with this message (and records nothing).
    pub fail_next: Option<String>,
    /// The tables the scripts left, as `family name` (`add table`, a `table … {` block and
    /// `delete table` lines followed in order); tests may remove one to play a flush.
    pub tables: BTreeSet<String>,
    /// Elements added by one-line `add element FAMILY TABLE SET { … }` commands, by
    /// `family table set` (less those of one-line `delete element` commands, emptied by
    /// `flush set` and with their table); elements inside `table … {` blocks are not
    /// followed.
    pub set_elements: BTreeMap<String, Vec<String>>,
}

impl NetfilterBackend for MemoryNetfilterBackend {
    async fn apply(&mut self, script: &str) -> Result<(), NetfilterError> {
        if let Some(message) = self.fail_next.take() {
            return Err(NetfilterError::Io {
                nft: PathBuf::from("memory"),
                source: std::io::Error::other(message),
            });
        }
        for line in script.lines() {
            let line = line.trim();
            if let Some(table) = line.strip_prefix("delete table ") {
                let table = table.trim();
                self.tables.remove(table);
                let prefix = format!("{table} ");
                self.set_elements.retain(|set, _| !set.starts_with(&prefix));
            } else if let Some(set) = line.strip_prefix("flush set ") {
                self.set_elements.remove(set.trim());
            } else if let Some(rest) = line.strip_prefix("add element ")
                && let Some((set, elements)) = rest.split_once('{')
            {
                let elements = elements.trim_end_matches('}').trim();
                self.set_elements
                    .entry(set.trim().to_owned())
                    .or_default()
                    .extend(elements.split(',').map(|e| e.trim().to_owned()));
            } else if let Some(rest) = line.strip_prefix("delete element ")
                && let Some((set, elements)) = rest.split_once('{')
                && let Some(held) = self.set_elements.get_mut(set.trim())
            {
                let gone: BTreeSet<&str> = elements
                    .trim_end_matches('}')
                    .split(',')
                    .map(str::trim)
                    .collect();
                held.retain(|element| !gone.contains(element.as_str()));
            } else if let Some(table) = line
                .strip_prefix("add table ")
                .or_else(|| line.strip_prefix("table "))
            {
                self.tables
                    .insert(table.trim_end_matches('{').trim().to_owned());
            }
        }
        if !self.forget_scripts {
            self.scripts.push(script.to_owned());
        }
        Ok(())
    }

    fn list_tables(&self) -> Option<PendingTableList> {
        Some(Box::pin(std::future::ready(Ok(self.tables.clone()))))
    }

    /// The set as `nft list set` would print it, with the elements of one-line
    /// `add element` commands only.
    fn list_set(&self, table: &str, set: &str) -> Option<PendingSetList> {
        let listing = if self.tables.contains(table) {
            let elements = self
                .set_elements
                .get(&format!("{table} {set}"))
                .cloned()
                .unwrap_or_default();
            let mut listing = format!("table {table} {{\n\tset {set} {{\n");
            if !elements.is_empty() {
                listing.push_str(&format!("\t\telements = {{ {} }}\n", elements.join(", ")));
            }
            listing.push_str("\t}\n}\n");
            Ok(listing)
        } else {
            Err(NetfilterError::Io {
                nft: PathBuf::from("memory"),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })
        };
        Some(Box::pin(std::future::ready(listing)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn table_listings_name_family_and_table() {
        let listing = "table ip filter\ntable ip ipvs-proxier\ntable ip6 ipvs-proxier\n";
        let tables = parse_table_list(listing);
        assert_eq!(
            tables.into_iter().collect::<Vec<_>>(),
            ["ip filter", "ip ipvs-proxier", "ip6 ipvs-proxier"]
        );
        assert!(parse_table_list("").is_empty());
    }

    #[tokio::test]
    async fn the_memory_backend_follows_added_and_deleted_elements_with_or_without_scripts() {
        for forget_scripts in [false, true] {
            let mut backend = MemoryNetfilterBackend {
                forget_scripts,
                ..MemoryNetfilterBackend::default()
            };
            backend
                .apply("add table ip t\nadd element ip t s { 10.0.0.1, 10.0.0.2, 10.0.0.3 }\n")
                .await
                .unwrap();
            backend
                .apply("delete element ip t s { 10.0.0.2 }\nadd element ip t s { 10.0.0.4 }\n")
                .await
                .unwrap();
            assert_eq!(
                backend.set_elements["ip t s"],
                ["10.0.0.1", "10.0.0.3", "10.0.0.4"]
            );
            assert!(backend.tables.contains("ip t"));
            assert_eq!(backend.scripts.len(), if forget_scripts { 0 } else { 2 });
        }
    }
}
