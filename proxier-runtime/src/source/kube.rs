//! The Kubernetes source: kube-runtime watchers of v1 Services and discovery.k8s.io/v1
//! EndpointSlices (both with kube-proxy's label selector) and of this node's Node.
//!
//! Each kind has an [`ObjectStore`]: a relist (initial list, restart after 410 Gone, after an
//! outage) is buffered and swapped in whole when it completes, so the daemon never forgets
//! objects halfway; the swap is reported as the upserts and deletes it amounts to. Until
//! Services and EndpointSlices have both listed once, nothing is sent; then the first
//! [`SourceBatch`] with everything and the `synced` signal, then a batch per change.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as make_watcher};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use super::{EVENT_CHANNEL_CAPACITY, ObjectKey, SourceBatch, SourceHandle};
use proxier_core::k8s::PROXIED_OBJECTS_SELECTOR;

/// The API server could not be configured or reached.
#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    /// The kubeconfig file could not be read or used.
    #[error("loading kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// `--master` is not a URL.
    #[error("--master {master:?} is not a valid URL: {message}")]
    Master {
        /// The value.
        master: String,
        /// What went wrong.
        message: String,
    },
    /// Neither in-cluster configuration nor a default kubeconfig was found.
    #[error(
        "no API server configuration: not running in a cluster and no kubeconfig found ({0}); use --kubeconfig or --master"
    )]
    Infer(String),
    /// The client could not be built (TLS setup, ...).
    #[error("building the API client: {0}")]
    Client(String),
}

/// Builds a client as kube-proxy does: `--kubeconfig` (with `--master` overriding its server),
/// `--master` alone (no credentials), or in-cluster configuration, then the default kubeconfig.
pub async fn client(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
) -> Result<kube::Client, KubeSourceError> {
    let master_uri = master
        .map(|m| {
            m.parse::<http::Uri>().map_err(|e| KubeSourceError::Master {
                master: m.to_owned(),
                message: e.to_string(),
            })
        })
        .transpose()?;
    let config = match (kubeconfig, master_uri) {
        (Some(path), master_uri) => {
            let kubeconfig_err = |message: String| KubeSourceError::Kubeconfig {
                path: path.to_owned(),
                message,
            };
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| kubeconfig_err(e.to_string()))?;
            let mut config = kube::Config::from_custom_kubeconfig(
                kc,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| kubeconfig_err(e.to_string()))?;
            if let Some(uri) = master_uri {
                config.cluster_url = uri;
            }
            config
        }
        (None, Some(uri)) => kube::Config::new(uri),
        (None, None) => match kube::Config::incluster() {
            Ok(config) => config,
            Err(_) => kube::Config::infer()
                .await
                .map_err(|e| KubeSourceError::Infer(e.to_string()))?,
        },
    };
    // The API-client metrics (`rest_client_*`) wrap the default stack.
    let metrics = crate::api_metrics::ApiMetricsLayer::for_server(&config.cluster_url);
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| KubeSourceError::Client(e.to_string()))?;
    Ok(builder.with_layer(&metrics).build())
}

/// A change an [`ObjectStore`] reports.
#[derive(Debug, Clone)]
pub enum StoreChange<K> {
    /// Added or changed.
    Upsert(K),
    /// Gone.
    Delete(ObjectKey),
}

/// The objects of one kind as last listed/watched, with relists applied atomically. It keeps
/// only each object's key and resource version (what a relist needs to tell changes apart):
/// the objects themselves live on, converted, in the engine's model.
#[derive(Debug)]
pub struct ObjectStore<K> {
    versions: BTreeMap<ObjectKey, Option<String>>,
    relist: Option<BTreeMap<ObjectKey, K>>,
    listed: bool,
}

impl<K> Default for ObjectStore<K> {
    fn default() -> Self {
        ObjectStore {
            versions: BTreeMap::new(),
            relist: None,
            listed: false,
        }
    }
}

impl<K: Resource> ObjectStore<K> {
    /// Whether `object` is the version already known (same resource version).
    fn known(&self, key: &ObjectKey, object: &K) -> bool {
        self.versions
            .get(key)
            .is_some_and(|version| version.is_some() && *version == object.meta().resource_version)
    }

    /// Applies one watcher event and returns what changed. `Init..InitDone` is buffered:
    /// nothing changes until `InitDone`, and then the whole list replaces the store.
    pub fn apply(&mut self, event: Event<K>) -> Vec<StoreChange<K>> {
        match event {
            Event::Init => {
                // A new (re)list; an unfinished earlier one is dropped, the store stays.
                self.relist = Some(BTreeMap::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                let key = ObjectKey::of(obj.meta());
                self.relist.get_or_insert_default().insert(key, obj);
                Vec::new()
            }
            Event::InitDone => {
                let fresh = self.relist.take().unwrap_or_default();
                let mut changes: Vec<StoreChange<K>> = (self.versions.keys())
                    .filter(|key| !fresh.contains_key(*key))
                    .map(|key| StoreChange::Delete(key.clone()))
                    .collect();
                let mut versions = BTreeMap::new();
                for (key, object) in fresh {
                    versions.insert(key.clone(), object.meta().resource_version.clone());
                    if !self.known(&key, &object) {
                        changes.push(StoreChange::Upsert(object));
                    }
                }
                self.versions = versions;
                self.listed = true;
                changes
            }
            Event::Apply(obj) => {
                let key = ObjectKey::of(obj.meta());
                let unchanged = self.known(&key, &obj);
                self.versions
                    .insert(key, obj.meta().resource_version.clone());
                if unchanged {
                    Vec::new()
                } else {
                    vec![StoreChange::Upsert(obj)]
                }
            }
            Event::Delete(obj) => {
                let key = ObjectKey::of(obj.meta());
                self.versions.remove(&key);
                vec![StoreChange::Delete(key)]
            }
        }
    }

    /// Whether a complete list has been applied at least once.
    pub fn is_listed(&self) -> bool {
        self.listed
    }

    /// How many objects it knows.
    pub fn len(&self) -> usize {
        self.versions.len()
    }

    /// Whether it knows no object.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }
}

/// The state of the Kubernetes source, independent of any API connection: what the three
/// stores hold, and which batches they produce. Until Services and EndpointSlices have both
/// listed, changes are collected into the first batch.
#[derive(Debug, Default)]
pub struct KubeSourceState {
    /// Services.
    pub services: ObjectStore<Service>,
    /// EndpointSlices.
    pub slices: ObjectStore<EndpointSlice>,
    /// This node (at most one object, by field selector).
    pub nodes: ObjectStore<Node>,
    first: SourceBatch,
    synced: bool,
}

impl KubeSourceState {
    /// Whether the first batch has been produced.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    fn deliver(&mut self, batch: SourceBatch) -> Option<SourceBatch> {
        if self.synced {
            return (!batch.is_empty()).then_some(batch);
        }
        self.first.append(batch);
        if self.services.is_listed() && self.slices.is_listed() {
            self.synced = true;
            return Some(std::mem::take(&mut self.first));
        }
        None
    }

    /// Applies a Service watcher event.
    pub fn on_service(&mut self, event: Event<Service>) -> Option<SourceBatch> {
        let mut batch = SourceBatch::default();
        for change in self.services.apply(event) {
            match change {
                StoreChange::Upsert(service) => batch.upsert_service(&service),
                StoreChange::Delete(key) => batch.delete_service(key),
            }
        }
        self.deliver(batch)
    }

    /// Applies an EndpointSlice watcher event.
    pub fn on_slice(&mut self, event: Event<EndpointSlice>) -> Option<SourceBatch> {
        let mut batch = SourceBatch::default();
        for change in self.slices.apply(event) {
            match change {
                StoreChange::Upsert(slice) => batch.upsert_slice(&slice),
                StoreChange::Delete(key) => batch.delete_slice(key),
            }
        }
        self.deliver(batch)
    }

    /// Applies a Node watcher event.
    pub fn on_node(&mut self, event: Event<Node>) -> Option<SourceBatch> {
        let mut batch = SourceBatch::default();
        for change in self.nodes.apply(event) {
            match change {
                StoreChange::Upsert(node) => batch.node(Some(&node)),
                StoreChange::Delete(_) => batch.node(None),
            }
        }
        self.deliver(batch)
    }
}

/// Settings of the Kubernetes source.
#[derive(Debug, Clone)]
pub struct KubeSourceConfig {
    /// This node's name.
    pub hostname: String,
}

fn watch_stream<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    make_watcher(api, config).default_backoff()
}

/// Starts the watchers. Watch errors (API outages, expired resource versions) are logged and
/// retried with backoff; the stores keep their objects meanwhile.
pub fn spawn(client: kube::Client, config: KubeSourceConfig) -> SourceHandle {
    let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
    let (synced_tx, synced_rx) = watch::channel(false);
    let services = watch_stream(
        Api::<Service>::all(client.clone()),
        watcher::Config::default().labels(PROXIED_OBJECTS_SELECTOR),
    );
    let slices = watch_stream(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default().labels(PROXIED_OBJECTS_SELECTOR),
    );
    let nodes = watch_stream(
        Api::<Node>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={}", config.hostname)),
    );
    let task = tokio::spawn(run(services, slices, nodes, tx, synced_tx));
    SourceHandle {
        events: rx,
        synced: synced_rx,
        task,
    }
}

fn log_watch_error(kind: &'static str, error: &watcher::Error) {
    tracing::warn!(kind, %error, "watch failed; retrying with backoff, keeping known objects");
    crate::metrics::record_watch_error(kind);
}

async fn run(
    services: impl Stream<Item = watcher::Result<Event<Service>>> + Send,
    slices: impl Stream<Item = watcher::Result<Event<EndpointSlice>>> + Send,
    nodes: impl Stream<Item = watcher::Result<Event<Node>>> + Send,
    tx: mpsc::Sender<SourceBatch>,
    synced: watch::Sender<bool>,
) {
    let mut services = std::pin::pin!(services);
    let mut slices = std::pin::pin!(slices);
    let mut nodes = std::pin::pin!(nodes);
    let mut state = KubeSourceState::default();
    let started = std::time::Instant::now();
    loop {
        let batch = tokio::select! {
            Some(ev) = services.next() => match ev {
                Ok(ev) => state.on_service(ev),
                Err(e) => { log_watch_error("Service", &e); continue; }
            },
            Some(ev) = slices.next() => match ev {
                Ok(ev) => state.on_slice(ev),
                Err(e) => { log_watch_error("EndpointSlice", &e); continue; }
            },
            Some(ev) = nodes.next() => match ev {
                Ok(ev) => state.on_node(ev),
                Err(e) => { log_watch_error("Node", &e); continue; }
            },
            else => return,
        };
        let Some(batch) = batch else {
            continue;
        };
        let became_synced = state.is_synced() && !*synced.borrow();
        for change in &batch.changes {
            tracing::debug!(change = %super::describe(change), "kube source");
        }
        if tx.send(batch).await.is_err() {
            return; // the daemon is gone
        }
        if became_synced {
            tracing::info!(
                services = state.services.len(),
                endpoint_slices = state.slices.len(),
                took = ?started.elapsed(),
                "Services and EndpointSlices synced"
            );
            synced.send_replace(true);
        }
    }
}
