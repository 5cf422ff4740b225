//! The file source: Services, EndpointSlices and Nodes read from a YAML file (see
//! [`super::manifests`]) and re-read whenever its content changes. Each good read becomes a
//! [`SourceBatch`] of the changes since the last one (the first: everything).

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::{mpsc, watch};

use super::manifests::{Manifests, parse_in_parallel, split_documents};
use super::{EVENT_CHANNEL_CAPACITY, ObjectKey, SourceBatch, SourceHandle};
use proxier_core::k8s::is_proxied;

/// How often the file is looked at even without a change notification (a file system
/// without inotify, a missed event).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// How long the file must stay quiet after a change notification before it is read: a
/// writer usually writes in several calls.
pub const SETTLE_DELAY: Duration = Duration::from_millis(100);

/// Why a read of the file is not used. Whatever the reason, the last good state stays.
#[derive(Debug, thiserror::Error)]
pub enum FileSourceError {
    /// The file could not be read.
    #[error("reading source file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file has no bytes: a write in progress (`kubectl get -o yaml > file` truncates
    /// before it writes), not "no services".
    #[error("source file {path} is empty (a write in progress?); the last good state stays")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file does not end with a newline: it stops mid-line, a write in progress.
    #[error("source file {path} ends mid-line (a write in progress?); the last good state stays")]
    Unfinished {
        /// The file.
        path: PathBuf,
    },
    /// Some document is not valid YAML or not a valid object: the file is refused whole
    /// (a half-written file must not remove what the rest no longer lists).
    #[error(
        "source file {path} refused whole, the last good state stays: {first} ({count} malformed documents in all)"
    )]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The first problem, with its position.
        first: String,
        /// How many problems.
        count: usize,
    },
}

/// What one document of the last good read defined (only keys: the objects themselves
/// live in the engine's model once converted).
#[derive(Debug, Default)]
struct Defined {
    services: Vec<ObjectKey>,
    slices: Vec<ObjectKey>,
    /// Whether it holds this node's Node object.
    node: bool,
}

/// Reads successive versions of the file and turns each into the changes since the last
/// good read (the first: every object). Objects that another proxy handles (see
/// [`is_proxied`]) are left out, as the API server would filter them for kube-proxy; when a
/// key is defined twice, the later object wins.
///
/// It keeps no parsed object between reads: only, per document (by a hash of its text),
/// the keys it defined, and which document each object came from. A document whose text is
/// unchanged is neither parsed again nor reported.
#[derive(Debug)]
pub struct FileReader {
    path: PathBuf,
    hostname: String,
    documents: HashMap<u64, Defined>,
    services: HashMap<ObjectKey, u64>,
    slices: HashMap<ObjectKey, u64>,
    node: Option<u64>,
}

fn document_hash(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    text.len().hash(&mut hasher);
    hasher.finish()
}

impl FileReader {
    /// A reader of `path` for node `hostname` that has read nothing yet.
    pub fn new(path: impl Into<PathBuf>, hostname: impl Into<String>) -> Self {
        FileReader {
            path: path.into(),
            hostname: hostname.into(),
            documents: HashMap::new(),
            services: HashMap::new(),
            slices: HashMap::new(),
            node: None,
        }
    }

    /// The changes that bring the consumer from the last good read to `text`, or why `text`
    /// is refused whole (nothing changes then): no bytes, a last line without its newline,
    /// or any malformed document. Objects of kinds ipvs-proxier does not use are skipped.
    pub fn read(&mut self, text: &str) -> Result<SourceBatch, FileSourceError> {
        if text.is_empty() {
            return Err(FileSourceError::Empty {
                path: self.path.clone(),
            });
        }
        if !text.ends_with('\n') {
            // YAML writers (kubectl, editors, templating tools) end files with a newline; a
            // file that stops mid-line is still being written.
            return Err(FileSourceError::Unfinished {
                path: self.path.clone(),
            });
        }
        let documents = split_documents(text);
        let hashes: Vec<u64> = documents.iter().map(|d| document_hash(d)).collect();
        let mut seen = HashSet::new();
        let fresh: Vec<usize> = (0..documents.len())
            .filter(|&i| !self.documents.contains_key(&hashes[i]) && seen.insert(hashes[i]))
            .collect();
        let parsed: HashMap<u64, Manifests> = parse_in_parallel(&documents, &fresh)
            .into_iter()
            .map(|(i, manifests)| (hashes[i], manifests))
            .collect();
        let mut malformed = parsed
            .values()
            .flat_map(|m| m.problems.iter())
            .filter(|p| !p.is_unknown_kind());
        if let Some(first) = malformed.next() {
            return Err(FileSourceError::Malformed {
                path: self.path.clone(),
                first: first.to_string(),
                count: 1 + malformed.count(),
            });
        }
        for problem in parsed.values().flat_map(|m| m.problems.iter()) {
            tracing::warn!(%problem, "source file: skipped object");
        }

        let old_services = std::mem::take(&mut self.services);
        let old_slices = std::mem::take(&mut self.slices);
        let old_node = self.node.take();
        self.remember(&hashes, &parsed);
        // Objects whose defining document is new or moved; a move to an unchanged document
        // needs that document parsed again (rare: a duplicate definition went away).
        let moved_to_old = |new: &HashMap<ObjectKey, u64>, old: &HashMap<ObjectKey, u64>| {
            new.iter()
                .filter(|(key, hash)| !parsed.contains_key(*hash) && old.get(*key) != Some(*hash))
                .map(|(_, hash)| *hash)
                .collect::<Vec<u64>>()
        };
        let mut reparse: HashSet<u64> = moved_to_old(&self.services, &old_services)
            .into_iter()
            .chain(moved_to_old(&self.slices, &old_slices))
            .collect();
        if self
            .node
            .is_some_and(|h| Some(h) != old_node && !parsed.contains_key(&h))
        {
            reparse.extend(self.node);
        }
        let indices: Vec<usize> = (0..documents.len())
            .filter(|&i| reparse.remove(&hashes[i]))
            .collect();
        let reparsed: HashMap<u64, Manifests> = parse_in_parallel(&documents, &indices)
            .into_iter()
            .map(|(i, manifests)| (hashes[i], manifests))
            .collect();
        let object_of = |hash: &u64| parsed.get(hash).or_else(|| reparsed.get(hash));
        let documents_read = || parsed.iter().chain(reparsed.iter());
        let services_by_key = by_key(
            documents_read().map(|(hash, m)| (*hash, &m.services)),
            |s| &s.metadata,
        );
        let slices_by_key = by_key(
            documents_read().map(|(hash, m)| (*hash, &m.endpoint_slices)),
            |s| &s.metadata,
        );

        let mut batch = SourceBatch::default();
        if self.node != old_node {
            let node = self.node.as_ref().and_then(object_of).and_then(|m| {
                m.nodes
                    .iter()
                    .rfind(|n| n.metadata.name.as_deref() == Some(self.hostname.as_str()))
            });
            batch.node(node);
        }
        for (key, hash) in &self.services {
            if old_services.get(key) == Some(hash) {
                continue;
            }
            let found = services_by_key.get(hash).and_then(|m| m.get(key));
            if let Some(service) = found {
                batch.upsert_service(service);
            }
        }
        for (key, _) in old_services
            .into_iter()
            .filter(|(k, _)| !self.services.contains_key(k))
        {
            batch.delete_service(key);
        }
        for (key, hash) in &self.slices {
            if old_slices.get(key) == Some(hash) {
                continue;
            }
            let found = slices_by_key.get(hash).and_then(|m| m.get(key));
            if let Some(slice) = found {
                batch.upsert_slice(slice);
            }
        }
        for (key, _) in old_slices
            .into_iter()
            .filter(|(k, _)| !self.slices.contains_key(k))
        {
            batch.delete_slice(key);
        }
        Ok(batch)
    }

    /// Records what the documents of this read define and which document owns each object.
    fn remember(&mut self, hashes: &[u64], parsed: &HashMap<u64, Manifests>) {
        let mut documents = HashMap::with_capacity(hashes.len());
        for hash in hashes {
            if documents.contains_key(hash) {
                continue;
            }
            let defined = match (self.documents.remove(hash), parsed.get(hash)) {
                (Some(defined), _) => defined,
                (None, Some(manifests)) => Defined {
                    services: manifests
                        .services
                        .iter()
                        .filter(|s| is_proxied(&s.metadata))
                        .map(|s| ObjectKey::of(&s.metadata))
                        .collect(),
                    slices: manifests
                        .endpoint_slices
                        .iter()
                        .filter(|s| is_proxied(&s.metadata))
                        .map(|s| ObjectKey::of(&s.metadata))
                        .collect(),
                    node: manifests
                        .nodes
                        .iter()
                        .any(|n| n.metadata.name.as_deref() == Some(self.hostname.as_str())),
                },
                (None, None) => Defined::default(),
            };
            documents.insert(*hash, defined);
        }
        self.services.clear();
        self.slices.clear();
        self.node = None;
        for hash in hashes {
            let Some(defined) = documents.get(hash) else {
                continue;
            };
            for key in &defined.services {
                if self.services.insert(key.clone(), *hash).is_some() {
                    tracing::warn!(service = %key, "source file: service defined twice, using the later one");
                }
            }
            for key in &defined.slices {
                if self.slices.insert(key.clone(), *hash).is_some() {
                    tracing::warn!(slice = %key, "source file: endpoint slice defined twice, using the later one");
                }
            }
            if defined.node {
                self.node = Some(*hash);
            }
        }
        self.documents = documents;
    }
}

/// The objects of each parsed document (by document hash) by key; when a document defines a
/// key twice, the later object wins. A lookup per key keeps a read linear in the number of
/// objects, also when one document (a `kind: List`) holds them all.
fn by_key<'a, T>(
    documents: impl Iterator<Item = (u64, &'a Vec<T>)>,
    meta: impl Fn(&T) -> &ObjectMeta,
) -> HashMap<u64, HashMap<ObjectKey, &'a T>> {
    documents
        .map(|(hash, objects)| {
            let mut keyed = HashMap::with_capacity(objects.len());
            for object in objects {
                keyed.insert(ObjectKey::of(meta(object)), object);
            }
            (hash, keyed)
        })
        .collect()
}

/// Reads and parses the file once into the changes it amounts to; a file that is empty or
/// has a malformed document is an error.
pub fn load(path: &Path, hostname: &str) -> Result<SourceBatch, FileSourceError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileSourceError::Read {
        path: path.to_owned(),
        source,
    })?;
    FileReader::new(path, hostname).read(&text)
}

/// Cheap identity of the file on disk: when it is unchanged, the content need not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    /// Modification time.
    pub modified: Option<SystemTime>,
    /// Size in bytes.
    pub len: u64,
}

/// Decides whether the file changed: by stamp first, then by a hash of the content (a
/// rewrite with the same content is not a change). Every `verify_every` polls the content is
/// hashed even when the stamp is unchanged, to catch same-size rewrites within the
/// timestamp's granularity. The file source records every content it reads, refused ones
/// too, so a refused content is parsed and counted once, not at every look.
#[derive(Debug, Clone)]
pub struct ChangeDetector {
    stamp: Option<FileStamp>,
    content_hash: Option<u64>,
    polls_since_verify: u32,
    verify_every: u32,
}

impl ChangeDetector {
    /// A detector that has seen nothing yet.
    pub fn new(verify_every: u32) -> ChangeDetector {
        ChangeDetector {
            stamp: None,
            content_hash: None,
            polls_since_verify: 0,
            verify_every: verify_every.max(1),
        }
    }

    /// Whether the content must be read for this stamp.
    pub fn needs_read(&mut self, stamp: FileStamp) -> bool {
        self.polls_since_verify += 1;
        if self.stamp != Some(stamp) || self.polls_since_verify >= self.verify_every {
            self.polls_since_verify = 0;
            return true;
        }
        false
    }

    /// Records the content read for `stamp`; returns whether it differs from the last content.
    pub fn content_changed(&mut self, stamp: FileStamp, content: &[u8]) -> bool {
        let mut hasher = DefaultHasher::new();
        content.hash(&mut hasher);
        let hash = hasher.finish();
        self.stamp = Some(stamp);
        let changed = self.content_hash != Some(hash);
        self.content_hash = Some(hash);
        changed
    }
}

/// Settings of a running file source.
#[derive(Debug, Clone)]
pub struct FileSourceConfig {
    /// The file.
    pub path: PathBuf,
    /// This node's name (selects its Node object).
    pub hostname: String,
    /// How often to look at the file.
    pub poll_interval: Duration,
}

impl FileSourceConfig {
    /// Follows `path` for node `hostname`, polling every [`DEFAULT_POLL_INTERVAL`] besides
    /// inotify.
    pub fn new(path: impl Into<PathBuf>, hostname: impl Into<String>) -> FileSourceConfig {
        FileSourceConfig {
            path: path.into(),
            hostname: hostname.into(),
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }
}

fn stamp_of(path: &Path) -> std::io::Result<FileStamp> {
    let meta = std::fs::metadata(path)?;
    Ok(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
    })
}

/// Starts watching the file. Everything is sent at once (when the file is readable and
/// well-formed), then the changes of each new version; `synced` turns true after the first.
/// A file that disappears or cannot be read keeps the last good state in force (a warning is
/// logged) until it is back.
pub fn spawn(config: FileSourceConfig) -> SourceHandle {
    let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
    let (synced_tx, synced_rx) = watch::channel(false);
    let task = tokio::spawn(run(config, tx, synced_tx));
    SourceHandle {
        events: rx,
        synced: synced_rx,
        services_ahead: None,
        task,
    }
}

/// Whether an event on the file's name may mean its content changed: a write or the close
/// after one, a creation, a rename onto or away from the name, a removal. Opens, reads, the
/// close after a read (the source's own reads cause all three) and metadata changes do not.
fn may_change_content(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) => true,
        EventKind::Any | EventKind::Other => true,
    }
}

/// Wakes the source when the file's directory changes (rename-into-place replaces the file's
/// inode, so the directory is watched) in a way that may change the file's content, or when
/// the kernel dropped events. `None` when inotify is unavailable: polling only.
fn watch_directory(
    path: &Path,
) -> Option<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>)> {
    use notify::Watcher;
    let (tx, rx) = mpsc::unbounded_channel();
    let name = path.file_name()?.to_owned();
    let directory = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let handler = move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && (event.need_rescan()
                || may_change_content(&event.kind)
                    && event
                        .paths
                        .iter()
                        .any(|p| p.file_name() == Some(name.as_os_str())))
        {
            let _ = tx.send(());
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::warn!(%error, "cannot watch the source file; polling it");
            return None;
        }
    };
    if let Err(error) = watcher.watch(&directory, notify::RecursiveMode::NonRecursive) {
        tracing::warn!(directory = %directory.display(), %error, "cannot watch the source file's directory; polling it");
        return None;
    }
    Some((watcher, rx))
}

async fn run(config: FileSourceConfig, tx: mpsc::Sender<SourceBatch>, synced: watch::Sender<bool>) {
    let mut detector = ChangeDetector::new(10);
    let mut reader = FileReader::new(&config.path, &config.hostname);
    let mut ticker = tokio::time::interval(config.poll_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (_watcher, mut notified) = match watch_directory(&config.path) {
        Some((watcher, rx)) => (Some(watcher), Some(rx)),
        None => (None, None),
    };
    let mut reported: Option<String> = None;
    loop {
        match notified.as_mut() {
            Some(rx) => tokio::select! {
                _ = ticker.tick() => {}
                woke = rx.recv() => {
                    if woke.is_none() {
                        notified = None;
                        continue;
                    }
                    // Let the writer finish: read once the file has been quiet a moment.
                    while let Ok(Some(())) = tokio::time::timeout(SETTLE_DELAY, rx.recv()).await {}
                }
            },
            None => {
                ticker.tick().await;
            }
        }
        let read_started = std::time::Instant::now();
        let read = stamp_of(&config.path).and_then(|stamp| {
            if detector.needs_read(stamp) {
                std::fs::read(&config.path).map(|content| Some((stamp, content)))
            } else {
                Ok(None)
            }
        });
        let result = match read {
            Ok(None) => continue,
            Ok(Some((stamp, content))) => {
                if !detector.content_changed(stamp, &content) {
                    continue;
                }
                let text = String::from_utf8_lossy(&content);
                reader.read(&text)
            }
            Err(source) => Err(FileSourceError::Read {
                path: config.path.clone(),
                source,
            }),
        };
        let batch = match result {
            Ok(batch) => batch,
            Err(error) => {
                // A refused content stays recorded in the detector: the same bytes are neither
                // parsed nor counted again, whatever wakes the source, until they change.
                let message = error.to_string();
                crate::metrics::record_rejected_source_file();
                // Logged once per distinct problem, not on every poll.
                if reported.as_deref() != Some(message.as_str()) {
                    match error {
                        FileSourceError::Empty { .. } => tracing::info!("{message}"),
                        _ => tracing::error!("{message}"),
                    }
                    reported = Some(message);
                }
                continue;
            }
        };
        if reported.take().is_some() {
            tracing::info!(path = %config.path.display(), "source file readable and well-formed again");
        }
        tracing::info!(path = %config.path.display(), changes = batch.changes.len(), took = ?read_started.elapsed(), "source file loaded");
        // The first batch goes even when empty: it is the first picture. The flag is up
        // before it goes, so that whoever receives it sees the source synced.
        let first = !*synced.borrow();
        synced.send_replace(true);
        if (!batch.is_empty() || first) && tx.send(batch).await.is_err() {
            return; // the daemon is gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::may_change_content;
    use notify::event::{
        AccessKind, AccessMode, CreateKind, DataChange, EventKind, MetadataKind, ModifyKind,
        RemoveKind, RenameMode,
    };

    #[test]
    fn only_events_that_may_change_the_content_wake_the_source() {
        let wake = [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Modify(ModifyKind::Name(RenameMode::From)),
            EventKind::Remove(RemoveKind::File),
        ];
        for kind in wake {
            assert!(may_change_content(&kind), "{kind:?} must wake the source");
        }
        // What a read causes (inotify's IN_OPEN, IN_ACCESS, IN_CLOSE_NOWRITE), and a chmod.
        let ignore = [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
        ];
        for kind in ignore {
            assert!(
                !may_change_content(&kind),
                "{kind:?} must not wake the source"
            );
        }
    }
}
