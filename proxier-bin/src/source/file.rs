//! The file source: Services, EndpointSlices and Nodes read from a YAML file (see
//! [`super::manifests`]) and re-read whenever its content changes. The first read produces a
//! [`SourceEvent::Snapshot`]; later ones produce an event per object that differs.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::manifests::{Manifests, parse_in_parallel, split_documents};
use super::{
    ClusterSnapshot, EVENT_CHANNEL_CAPACITY, ObjectKey, SourceEvent, SourceHandle, is_proxied,
};

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

/// Reads successive versions of the file and turns each into events: the first good read
/// into a [`SourceEvent::Snapshot`], later ones into an event per object that changed.
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
    read_once: bool,
}

fn document_hash(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    text.len().hash(&mut hasher);
    hasher.finish()
}

/// A stand-in carrying only the key, for delete events of objects no longer kept.
fn meta_of(key: &ObjectKey) -> ObjectMeta {
    ObjectMeta {
        name: Some(key.name.clone()),
        namespace: Some(key.namespace.clone()),
        ..ObjectMeta::default()
    }
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
            read_once: false,
        }
    }

    /// The events that bring the consumer from the last good read to `text`, or why `text`
    /// is refused whole (nothing changes then): no bytes, a last line without its newline,
    /// or any malformed document. Objects of kinds ipvs-proxier does not use are skipped.
    pub fn read(&mut self, text: &str) -> Result<Vec<SourceEvent>, FileSourceError> {
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

        if !self.read_once {
            // The first picture: every object, in file order (later definitions win).
            let mut all = Manifests::default();
            for hash in &hashes {
                if let Some(manifests) = parsed.get(hash) {
                    all.services.extend(manifests.services.iter().cloned());
                    all.endpoint_slices
                        .extend(manifests.endpoint_slices.iter().cloned());
                    all.nodes.extend(manifests.nodes.iter().cloned());
                }
            }
            self.remember(&hashes, &parsed);
            self.read_once = true;
            return Ok(vec![SourceEvent::Snapshot(snapshot_from_manifests(
                all,
                &self.hostname,
            ))]);
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

        let mut events = Vec::new();
        if self.node != old_node {
            let node = self.node.as_ref().and_then(object_of).and_then(|m| {
                m.nodes
                    .iter()
                    .rfind(|n| n.metadata.name.as_deref() == Some(self.hostname.as_str()))
                    .cloned()
            });
            events.push(SourceEvent::NodeUpdate(node));
        }
        for (key, hash) in &self.services {
            if old_services.get(key) == Some(hash) {
                continue;
            }
            let found = object_of(hash).and_then(|m| {
                m.services
                    .iter()
                    .rfind(|s| ObjectKey::of(&s.metadata) == *key)
            });
            if let Some(service) = found {
                events.push(SourceEvent::ServiceUpsert(Arc::clone(service)));
            }
        }
        for key in old_services
            .keys()
            .filter(|k| !self.services.contains_key(*k))
        {
            events.push(SourceEvent::ServiceDelete(Arc::new(Service {
                metadata: meta_of(key),
                ..Service::default()
            })));
        }
        for (key, hash) in &self.slices {
            if old_slices.get(key) == Some(hash) {
                continue;
            }
            let found = object_of(hash).and_then(|m| {
                m.endpoint_slices
                    .iter()
                    .rfind(|s| ObjectKey::of(&s.metadata) == *key)
            });
            if let Some(slice) = found {
                events.push(SourceEvent::SliceUpsert(Arc::clone(slice)));
            }
        }
        for key in old_slices.keys().filter(|k| !self.slices.contains_key(*k)) {
            events.push(SourceEvent::SliceDelete(Arc::new(EndpointSlice {
                metadata: meta_of(key),
                ..EndpointSlice::default()
            })));
        }
        Ok(events)
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
                self.services.insert(key.clone(), *hash);
            }
            for key in &defined.slices {
                self.slices.insert(key.clone(), *hash);
            }
            if defined.node {
                self.node = Some(*hash);
            }
        }
        self.documents = documents;
    }
}

/// Builds the snapshot a file's manifests describe for node `hostname`. Objects that another
/// proxy handles (see [`is_proxied`]) are left out, as the API server would filter them for
/// kube-proxy. Problems are logged. When a key appears twice, the later object wins.
pub fn snapshot_from_manifests(manifests: Manifests, hostname: &str) -> ClusterSnapshot {
    let mut snap = ClusterSnapshot::default();
    for problem in &manifests.problems {
        if problem.is_unknown_kind() {
            tracing::warn!(%problem, "source file: skipped object");
        } else {
            tracing::error!(%problem, "source file: skipped malformed object");
        }
    }
    for svc in manifests.services {
        let key = ObjectKey::of(&svc.metadata);
        if !is_proxied(&svc.metadata) {
            tracing::debug!(service = %key, "source file: service handled by another proxy, skipped");
            continue;
        }
        if snap.services.insert(key.clone(), svc).is_some() {
            tracing::warn!(service = %key, "source file: service defined twice, using the later one");
        }
    }
    for slice in manifests.endpoint_slices {
        let key = ObjectKey::of(&slice.metadata);
        if !is_proxied(&slice.metadata) {
            tracing::debug!(slice = %key, "source file: slice of a headless or foreign service, skipped");
            continue;
        }
        if snap.endpoint_slices.insert(key.clone(), slice).is_some() {
            tracing::warn!(slice = %key, "source file: endpoint slice defined twice, using the later one");
        }
    }
    let node_count = manifests.nodes.len();
    snap.node = manifests
        .nodes
        .into_iter()
        .rfind(|n| n.metadata.name.as_deref() == Some(hostname));
    if snap.node.is_none() && node_count > 0 {
        tracing::warn!(
            hostname,
            "source file has Nodes but none named like this node"
        );
    }
    snap
}

/// Reads and parses the file once; a file that is empty or has a malformed document is an
/// error.
pub fn load_snapshot(path: &Path, hostname: &str) -> Result<ClusterSnapshot, FileSourceError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileSourceError::Read {
        path: path.to_owned(),
        source,
    })?;
    let events = FileReader::new(path, hostname).read(&text)?;
    Ok(events
        .into_iter()
        .find_map(|event| match event {
            SourceEvent::Snapshot(snapshot) => Some(snapshot),
            _ => None,
        })
        .unwrap_or_default())
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
/// timestamp's granularity.
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

fn stamp_of(path: &Path) -> std::io::Result<FileStamp> {
    let meta = std::fs::metadata(path)?;
    Ok(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
    })
}

/// Starts watching the file. A snapshot is sent at once (when the file is readable and
/// well-formed), then an event per object that changed; `synced` turns true after the first. A file that disappears or
/// cannot be read keeps the last snapshot in force (a warning is logged) until it is back.
pub fn spawn(config: FileSourceConfig) -> SourceHandle {
    let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
    let (synced_tx, synced_rx) = watch::channel(false);
    let task = tokio::spawn(run(config, tx, synced_tx));
    SourceHandle {
        events: rx,
        synced: synced_rx,
        task,
    }
}

/// Wakes the source when the file's directory changes (rename-into-place replaces the file's
/// inode, so the directory is watched). `None` when inotify is unavailable: polling only.
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
            && event
                .paths
                .iter()
                .any(|p| p.file_name() == Some(name.as_os_str()))
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

async fn run(config: FileSourceConfig, tx: mpsc::Sender<SourceEvent>, synced: watch::Sender<bool>) {
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
        let events = match result {
            Ok(events) => events,
            Err(error) => {
                let message = error.to_string();
                if !matches!(error, FileSourceError::Empty { .. }) {
                    crate::metrics::record_rejected_source_file();
                }
                // Logged once per distinct problem, not on every poll.
                if reported.as_deref() != Some(message.as_str()) {
                    match error {
                        FileSourceError::Empty { .. } => tracing::info!("{message}"),
                        _ => tracing::error!("{message}"),
                    }
                    reported = Some(message);
                }
                // Read again at the next look even if the bytes stay the same.
                detector = ChangeDetector::new(10);
                continue;
            }
        };
        if reported.take().is_some() {
            tracing::info!(path = %config.path.display(), "source file readable and well-formed again");
        }
        tracing::info!(path = %config.path.display(), changes = events.len(), took = ?read_started.elapsed(), "source file loaded");
        for event in events {
            if tx.send(event).await.is_err() {
                return; // the daemon is gone
            }
        }
        synced.send_replace(true);
    }
}
