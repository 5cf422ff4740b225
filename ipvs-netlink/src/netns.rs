//! Running socket creation inside another network namespace without moving the caller.
//!
//! A socket stays in the namespace it was created in, so a short-lived helper thread
//! enters the target namespace (`setns(2)`), opens the sockets and hands them back.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A network namespace to build a handle in: a path (e.g. `/run/netns/blue`,
/// `/proc/<pid>/ns/net`) or an open file descriptor.
#[derive(Debug)]
pub enum NetnsTarget {
    /// Path to a namespace file.
    Path(PathBuf),
    /// An open namespace file descriptor.
    Fd(OwnedFd),
}

impl From<PathBuf> for NetnsTarget {
    fn from(p: PathBuf) -> Self {
        NetnsTarget::Path(p)
    }
}

impl From<&Path> for NetnsTarget {
    fn from(p: &Path) -> Self {
        NetnsTarget::Path(p.to_path_buf())
    }
}

impl From<&str> for NetnsTarget {
    fn from(p: &str) -> Self {
        NetnsTarget::Path(PathBuf::from(p))
    }
}

impl From<OwnedFd> for NetnsTarget {
    fn from(fd: OwnedFd) -> Self {
        NetnsTarget::Fd(fd)
    }
}

impl From<File> for NetnsTarget {
    fn from(f: File) -> Self {
        NetnsTarget::Fd(f.into())
    }
}

impl NetnsTarget {
    /// Opens the namespace file (keeps an fd so later sockets land in the same namespace).
    pub(crate) fn open(self) -> io::Result<OwnedFd> {
        match self {
            NetnsTarget::Path(p) => Ok(File::open(p)?.into()),
            NetnsTarget::Fd(fd) => Ok(fd),
        }
    }
}

/// Runs `f` in the namespace `ns` (or in the current one when `None`) on a helper thread,
/// waiting for it without blocking the async runtime.
pub(crate) async fn run_in<T, F>(ns: Option<Arc<OwnedFd>>, f: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> io::Result<T> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("ipvs-netns".into())
        .spawn(move || {
            let result = (|| {
                if let Some(fd) = &ns {
                    nix::sched::setns(fd.as_ref(), nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(io::Error::from)?;
                }
                f()
            })();
            let _ = tx.send(result);
        })?;
    rx.await
        .map_err(|_| io::Error::other("namespace helper thread died"))?
}
