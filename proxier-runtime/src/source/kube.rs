//! The Kubernetes source: watchers of v1 Services and discovery.k8s.io/v1
//! EndpointSlices (both with kube-proxy's label selector), of this node's Node and, when
//! asked ([`KubeSourceConfig::service_cidrs`]), of networking.k8s.io/v1 ServiceCIDRs.
//!
//! Each kind has an [`ObjectStore`]: a relist (initial list, restart after 410 Gone, after an
//! outage) is buffered and swapped in whole when it completes, so the daemon never forgets
//! objects halfway; the swap is reported as the upserts and deletes it amounts to. Until
//! Services and EndpointSlices (and ServiceCIDRs, when followed) have all listed once,
//! nothing is sent; then the first
//! [`SourceBatch`] with everything and the `synced` signal, then a batch per change.
//!
//! Services and EndpointSlices are decoded with only what the conversions read
//! ([`super::lean`]: managedFields, kubectl's last-applied annotation and the like are skipped
//! in the text, never allocated), and every object is trimmed to what the conversions read
//! ([`trim_service`], [`trim_slice`], [`trim_node`]) as it arrives, before anything keeps it.
//!
//! [`ListMode`] picks streaming lists (as client-go's since Kubernetes 1.35), which fall back
//! to paginated ones on an API server that refuses or ignores them, or paginated lists; for
//! Services and EndpointSlices, either in Kubernetes' protobuf encoding
//! ([`super::protobuf`]; the default, streaming, as kube-proxy's) or in JSON. What this costs
//! the API server per node: `docs/api-server-cost.md`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::Api;
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher as make_watcher;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot, watch};

use super::lean::{Boxed, LeanService, LeanSlice, READ_ANNOTATIONS, READ_LABELS};
use super::protobuf::{ProtobufError, decode_service_boxed, decode_slice_boxed};
use super::protobuf_stream::{json_stream_watcher, protobuf_stream_watcher};
use super::protobuf_watch::{protobuf_list_watcher, within};
use super::{EVENT_CHANNEL_CAPACITY, ObjectKey, SourceBatch, SourceHandle};
use proxier_core::k8s::{HEADLESS_LABEL, PROXIED_OBJECTS_SELECTOR, SERVICE_PROXY_NAME_LABEL};

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
    super::api_client::build(config)
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
/// the objects themselves live on, converted, in the engine's model. `T` is what an object is
/// converted to as it arrives (the object itself unless [`ObjectStore::apply_with`] is given a
/// conversion), so a relist under way holds converted objects, never the API's.
#[derive(Debug)]
pub struct ObjectStore<K, T = K> {
    /// Every known object's resource version, and the last relist that listed it.
    versions: BTreeMap<ObjectKey, Known>,
    /// The relist under way.
    relist: Option<Relist<T>>,
    /// How many relists have begun: each marks the known objects it lists with its number.
    relists: u64,
    listed: bool,
    kind: PhantomData<fn(K)>,
}

/// What the store keeps of one object.
#[derive(Debug)]
struct Known {
    version: Option<String>,
    /// The number of the last relist that listed it.
    listed_by: u64,
}

/// A relist under way. A listed object whose version is the one known is only marked as
/// listed, in place: nothing of it is kept, so its key and version are not copied while the
/// relist runs (after a 410 Gone, every object), and nothing the relist leaves behind sits
/// between allocations made meanwhile that live on. The others are kept until `InitDone`,
/// in the order they came; sorted once then (an API server lists in key order, and the
/// sort of a sorted run is one pass).
#[derive(Debug)]
struct Relist<T> {
    number: u64,
    changed: Vec<(ObjectKey, Listed<T>)>,
}

/// One new or changed object of a relist under way.
#[derive(Debug)]
struct Listed<T> {
    version: Option<String>,
    converted: T,
}

impl<K, T> Default for ObjectStore<K, T> {
    fn default() -> Self {
        ObjectStore {
            versions: BTreeMap::new(),
            relist: None,
            relists: 0,
            listed: false,
            kind: PhantomData,
        }
    }
}

impl<K: Resource> ObjectStore<K> {
    /// Applies one watcher event and returns what changed, the objects unconverted (see
    /// [`ObjectStore::apply_with`]).
    pub fn apply(&mut self, event: Event<K>) -> Vec<StoreChange<K>> {
        self.apply_with(event, |object| object)
    }
}

impl<K: Resource, T> ObjectStore<K, T> {
    /// Whether `object` is the version already known (same resource version).
    fn known(&self, key: &ObjectKey, object: &K) -> bool {
        self.versions.get(key).is_some_and(|known| {
            known.version.is_some() && known.version == object.meta().resource_version
        })
    }

    /// Begins a relist, superseding an unfinished one (the store stays as it is).
    fn begin_relist(&mut self) {
        self.relists += 1;
        self.relist = Some(Relist {
            number: self.relists,
            changed: Vec::new(),
        });
    }

    /// Applies one watcher event and returns what changed, each added or changed object
    /// passed through `convert` as it arrives. `Init..InitDone` is buffered: nothing changes
    /// until `InitDone`, and then the whole list replaces the store.
    pub fn apply_with(
        &mut self,
        event: Event<K>,
        mut convert: impl FnMut(K) -> T,
    ) -> Vec<StoreChange<T>> {
        match event {
            Event::Init => {
                self.begin_relist();
                Vec::new()
            }
            Event::InitApply(mut obj) => {
                if self.relist.is_none() {
                    self.begin_relist();
                }
                let number = self.relists;
                // The key is the object's own strings, lent and given back if it is kept:
                // the versions known do not change until InitDone, so whether this one is
                // known can be told now, and only a new version is converted and kept.
                let meta = obj.meta_mut();
                let (had_namespace, had_name) = (meta.namespace.is_some(), meta.name.is_some());
                let key = ObjectKey {
                    namespace: meta.namespace.take().unwrap_or_default(),
                    name: meta.name.take().unwrap_or_default(),
                };
                if let Some(known) = self.versions.get_mut(&key)
                    && known.version.is_some()
                    && known.version == obj.meta().resource_version
                {
                    known.listed_by = number;
                    return Vec::new();
                }
                let meta = obj.meta_mut();
                meta.namespace = had_namespace.then(|| key.namespace.clone());
                meta.name = had_name.then(|| key.name.clone());
                let version = obj.meta().resource_version.clone();
                if let Some(relist) = &mut self.relist {
                    relist.changed.push((
                        key,
                        Listed {
                            version,
                            converted: convert(obj),
                        },
                    ));
                }
                Vec::new()
            }
            Event::InitDone => {
                let Relist {
                    number,
                    changed: mut fresh,
                } = match self.relist.take() {
                    Some(relist) => relist,
                    // Nothing listed: every object known is gone.
                    None => Relist {
                        number: self.relists + 1,
                        changed: Vec::new(),
                    },
                };
                // Stable: an object listed twice with new versions keeps its later copy
                // (moved into the slot the dedup keeps).
                fresh.sort_by(|a, b| a.0.cmp(&b.0));
                fresh.dedup_by(|later, earlier| {
                    let same = later.0 == earlier.0;
                    if same {
                        std::mem::swap(later, earlier);
                    }
                    same
                });
                let mut upserts = Vec::with_capacity(fresh.len());
                let mut changes: Vec<StoreChange<T>> = Vec::new();
                if self.versions.is_empty() {
                    // The first list: sorted and unique, collected into the tree in one pass.
                    self.versions = fresh
                        .into_iter()
                        .map(|(key, Listed { version, converted })| {
                            upserts.push(StoreChange::Upsert(converted));
                            (
                                key,
                                Known {
                                    version,
                                    listed_by: number,
                                },
                            )
                        })
                        .collect();
                } else {
                    // A relist changes the tree in place: the entries of unchanged objects
                    // stay where they are. Gone: what it neither marked nor changed.
                    let changed =
                        |key: &ObjectKey| fresh.binary_search_by(|(k, _)| k.cmp(key)).is_ok();
                    self.versions.retain(|key, known| {
                        let keep = known.listed_by == number || changed(key);
                        if !keep {
                            changes.push(StoreChange::Delete(key.clone()));
                        }
                        keep
                    });
                    for (key, Listed { version, converted }) in fresh {
                        upserts.push(StoreChange::Upsert(converted));
                        self.versions.insert(
                            key,
                            Known {
                                version,
                                listed_by: number,
                            },
                        );
                    }
                }
                self.listed = true;
                // Deletions first; usually there are none, and the upserts are the changes.
                if changes.is_empty() {
                    return upserts;
                }
                changes.append(&mut upserts);
                changes
            }
            Event::Apply(obj) => {
                let key = ObjectKey::of(obj.meta());
                let unchanged = self.known(&key, &obj);
                self.versions.insert(
                    key,
                    Known {
                        version: obj.meta().resource_version.clone(),
                        listed_by: self.relists,
                    },
                );
                if unchanged {
                    Vec::new()
                } else {
                    vec![StoreChange::Upsert(convert(obj))]
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

/// The state of the Kubernetes source, independent of any API connection: what the stores
/// hold, and which batches they produce. Until Services and EndpointSlices (and
/// ServiceCIDRs, when followed) have all listed, changes are collected into the first batch.
/// [`spawn`] runs the same steps split: each kind's store on the task of the kind's watch,
/// the first batch on the source's task.
#[derive(Debug, Default)]
pub struct KubeSourceState {
    /// Services.
    pub services: ObjectStore<Service, SourceBatch>,
    /// EndpointSlices.
    pub slices: ObjectStore<EndpointSlice, SourceBatch>,
    /// This node (at most one object, by field selector).
    pub nodes: ObjectStore<Node, SourceBatch>,
    /// ServiceCIDRs (empty unless followed).
    pub service_cidrs: ObjectStore<ServiceCIDR, SourceBatch>,
    picture: FirstPicture,
}

impl KubeSourceState {
    /// An empty state; `service_cidrs`: whether ServiceCIDRs are followed (the default
    /// state follows none).
    pub fn new(service_cidrs: bool) -> Self {
        KubeSourceState {
            picture: FirstPicture::new(service_cidrs, None),
            ..KubeSourceState::default()
        }
    }

    /// Whether the first batch has been produced.
    pub fn is_synced(&self) -> bool {
        self.picture.synced
    }

    /// Applies a Service watcher event.
    pub fn on_service(&mut self, event: Event<Service>) -> Option<SourceBatch> {
        let batch = changes_of(&mut self.services, event);
        self.picture
            .deliver(Watched::Services, self.services.is_listed(), batch)
    }

    /// Applies an EndpointSlice watcher event.
    pub fn on_slice(&mut self, event: Event<EndpointSlice>) -> Option<SourceBatch> {
        let batch = changes_of(&mut self.slices, event);
        self.picture
            .deliver(Watched::Slices, self.slices.is_listed(), batch)
    }

    /// Applies a ServiceCIDR watcher event.
    pub fn on_service_cidr(&mut self, event: Event<ServiceCIDR>) -> Option<SourceBatch> {
        let batch = changes_of(&mut self.service_cidrs, event);
        self.picture
            .deliver(Watched::ServiceCidrs, self.service_cidrs.is_listed(), batch)
    }

    /// Applies a Node watcher event.
    pub fn on_node(&mut self, event: Event<Node>) -> Option<SourceBatch> {
        let batch = changes_of(&mut self.nodes, event);
        self.picture
            .deliver(Watched::Node, self.nodes.is_listed(), batch)
    }
}

/// The kinds the source watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watched {
    Services,
    Slices,
    Node,
    ServiceCidrs,
}

impl Watched {
    /// The kind's name, as the log and the watch-error metric give it.
    fn name(self) -> &'static str {
        match self {
            Watched::Services => "Service",
            Watched::Slices => "EndpointSlice",
            Watched::Node => "Node",
            Watched::ServiceCidrs => "ServiceCIDR",
        }
    }
}

/// How a watched kind's objects become changes.
trait KindChanges: Resource + Sized {
    /// Adds the changes of `self` added or changed.
    fn upsert(&self, batch: &mut SourceBatch);
    /// Adds the change of the object `key` deleted.
    fn delete(key: ObjectKey, batch: &mut SourceBatch);
}

impl KindChanges for Service {
    fn upsert(&self, batch: &mut SourceBatch) {
        batch.upsert_service(self);
    }
    fn delete(key: ObjectKey, batch: &mut SourceBatch) {
        batch.delete_service(key);
    }
}

impl KindChanges for EndpointSlice {
    fn upsert(&self, batch: &mut SourceBatch) {
        batch.upsert_slice(self);
    }
    fn delete(key: ObjectKey, batch: &mut SourceBatch) {
        batch.delete_slice(key);
    }
}

impl<K: KindChanges + k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta>> KindChanges
    for Boxed<K>
{
    fn upsert(&self, batch: &mut SourceBatch) {
        self.0.upsert(batch);
    }
    fn delete(key: ObjectKey, batch: &mut SourceBatch) {
        K::delete(key, batch);
    }
}

impl KindChanges for ServiceCIDR {
    fn upsert(&self, batch: &mut SourceBatch) {
        batch.upsert_service_cidr(self);
    }
    fn delete(key: ObjectKey, batch: &mut SourceBatch) {
        batch.delete_service_cidr(key);
    }
}

impl KindChanges for Node {
    fn upsert(&self, batch: &mut SourceBatch) {
        batch.node(Some(self));
    }
    fn delete(_key: ObjectKey, batch: &mut SourceBatch) {
        batch.node(None);
    }
}

/// Applies one watcher event to a kind's `store` and returns the changes it makes (each
/// object converted as it arrives; nothing until a list is done).
fn changes_of<K: KindChanges>(
    store: &mut ObjectStore<K, SourceBatch>,
    event: Event<K>,
) -> SourceBatch {
    let converted = store.apply_with(event, |object| {
        // Room for the one change an object makes (a change is 216 bytes; a vector's
        // first growth makes room for four): a list keeps every object's until it ends.
        let mut one = SourceBatch {
            changes: Vec::with_capacity(1),
        };
        object.upsert(&mut one);
        one
    });
    // Made once at its size rather than doubled while a list's objects are appended.
    let mut batch = SourceBatch {
        changes: Vec::with_capacity(converted.len()),
    };
    for change in converted {
        match change {
            StoreChange::Upsert(one) => batch.append(one),
            StoreChange::Delete(key) => K::delete(key, &mut batch),
        }
    }
    batch
}

/// Which kinds have listed, and the changes gathered into the first batch until all those
/// the picture needs have.
#[derive(Debug, Default)]
struct FirstPicture {
    services_listed: bool,
    slices_listed: bool,
    service_cidrs_listed: bool,
    /// Whether ServiceCIDRs are followed: then the first batch waits for their list too, so
    /// that the first sync already routes their ranges.
    follows_service_cidrs: bool,
    first: SourceBatch,
    synced: bool,
    /// Where the Services go once listed, when the EndpointSlices are not yet
    /// ([`SourceHandle::services_ahead`]).
    ahead: Option<oneshot::Sender<SourceBatch>>,
}

impl FirstPicture {
    fn new(
        follows_service_cidrs: bool,
        ahead: Option<oneshot::Sender<SourceBatch>>,
    ) -> FirstPicture {
        FirstPicture {
            follows_service_cidrs,
            ahead,
            ..FirstPicture::default()
        }
    }

    /// Takes a kind's `batch` (`listed`: whether that kind has listed): the batch to send,
    /// if any (the first batch once the picture is complete, later ones as they come).
    fn deliver(&mut self, kind: Watched, listed: bool, batch: SourceBatch) -> Option<SourceBatch> {
        match kind {
            Watched::Services => self.services_listed = listed,
            Watched::Slices => self.slices_listed = listed,
            Watched::ServiceCidrs => self.service_cidrs_listed = listed,
            Watched::Node => {}
        }
        if self.synced {
            return (!batch.is_empty()).then_some(batch);
        }
        self.first.append(batch);
        let services_ready =
            self.services_listed && (!self.follows_service_cidrs || self.service_cidrs_listed);
        if services_ready && self.slices_listed {
            self.synced = true;
            // Too late to be ahead of anything.
            self.ahead = None;
            return Some(std::mem::take(&mut self.first));
        }
        // Copied only for a receiver still waiting: a restart drops it (its link is full).
        if services_ready
            && let Some(ahead) = self.ahead.take()
            && !ahead.is_closed()
        {
            let _ = ahead.send(SourceBatch {
                changes: self.first.changes.clone(),
            });
        }
        None
    }
}

/// Drops what no conversion reads from any kind's metadata: managed fields, owner references,
/// finalizers, annotations other than [`READ_ANNOTATIONS`] and, unless `keep_labels` is
/// `None`, the labels it does not name. Name, namespace, resource version and deletion
/// timestamp stay.
fn trim_meta(meta: &mut ObjectMeta, keep_labels: Option<&[&str]>) {
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.retain(|key, _| READ_ANNOTATIONS.contains(&key.as_str()));
    }
    if meta.annotations.as_ref().is_some_and(BTreeMap::is_empty) {
        meta.annotations = None;
    }
    if let (Some(labels), Some(keep)) = (&mut meta.labels, keep_labels) {
        labels.retain(|key, _| keep.contains(&key.as_str()));
    }
    if meta.labels.as_ref().is_some_and(BTreeMap::is_empty) {
        meta.labels = None;
    }
}

/// Drops from a Service what [`proxier_core::k8s::convert_service`] never reads, before the
/// source keeps it: see `trim_meta`, plus labels other than kube-proxy's two, the pod
/// selector, each port's target port and application protocol, status conditions and the
/// load-balancer ingress' hostnames and ports. What remains converts to the same change.
pub fn trim_service(service: &mut Service) {
    trim_meta(
        &mut service.metadata,
        Some(&[SERVICE_PROXY_NAME_LABEL, HEADLESS_LABEL]),
    );
    if let Some(spec) = &mut service.spec {
        spec.selector = None;
        for port in spec.ports.iter_mut().flatten() {
            port.target_port = None;
            port.app_protocol = None;
        }
    }
    if let Some(status) = &mut service.status {
        status.conditions = None;
        let ingress = status
            .load_balancer
            .as_mut()
            .and_then(|lb| lb.ingress.as_mut());
        for entry in ingress.into_iter().flatten() {
            entry.hostname = None;
            entry.ports = None;
        }
    }
}

/// Drops from an EndpointSlice what [`proxier_core::k8s::convert_endpoint_slice`] never reads:
/// see `trim_meta`, plus labels other than the Service name (and kube-proxy's two), each
/// endpoint's target reference, hostname and deprecated topology, and each port's application
/// protocol. What remains converts to the same change and trigger time.
pub fn trim_slice(slice: &mut EndpointSlice) {
    trim_meta(&mut slice.metadata, Some(&READ_LABELS));
    for endpoint in slice.endpoints.iter_mut().flatten() {
        endpoint.target_ref = None;
        endpoint.hostname = None;
        endpoint.deprecated_topology = None;
    }
    for port in slice.ports.iter_mut().flatten() {
        port.app_protocol = None;
    }
}

/// Drops from this node's Node what [`proxier_core::k8s::node_context`] and
/// [`proxier_core::k8s::node_eligible`] never read: see `trim_meta` (every annotation goes;
/// all labels stay, the engine keeps them), the spec but for pod CIDRs and taints, and the
/// status but for addresses (images, conditions, capacity, node info, volumes).
pub fn trim_node(node: &mut Node) {
    trim_meta(&mut node.metadata, None);
    node.spec = node.spec.take().map(|spec| NodeSpec {
        pod_cidr: spec.pod_cidr,
        pod_cidrs: spec.pod_cidrs,
        taints: spec.taints,
        ..NodeSpec::default()
    });
    node.status = node.status.take().map(|status| NodeStatus {
        addresses: status.addresses,
        ..NodeStatus::default()
    });
}

/// Drops from a ServiceCIDR what [`proxier_core::k8s::convert_service_cidr`] never reads:
/// see `trim_meta` (every annotation and label goes), and the status (its conditions).
pub fn trim_service_cidr(object: &mut ServiceCIDR) {
    trim_meta(&mut object.metadata, Some(&[]));
    object.status = None;
}

/// How a watcher fetches its first picture of a kind (and the picture after a relist).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListMode {
    /// A paginated list (kube-runtime's default page size, 500 objects), then a watch from
    /// the list's resource version: kube-proxy's way before Kubernetes 1.35.
    Paginated,
    /// A streaming list (Kubernetes' WatchList: one watch with `sendInitialEvents=true`,
    /// answered from the API server's watch cache, ending with a bookmark annotated
    /// `k8s.io/initial-events-end`), as client-go does by default since Kubernetes 1.35. The
    /// objects are decoded one event at a time, never as a whole list, which is what keeps the
    /// first sync's peak memory down. That kind falls back to [`ListMode::Paginated`] for the
    /// life of the source, with a warning in the log, when the API server refuses it (422
    /// Invalid: the WatchList feature gate off, or a server older than 1.27) or when its
    /// initial events go silent for [`KubeSourceConfig::initial_events_silence`] without the
    /// bookmark (a server or proxy that ignores `sendInitialEvents` and serves a plain watch).
    Streaming,
    /// Paginated lists of Services and EndpointSlices asked for in Kubernetes' protobuf
    /// encoding (`application/vnd.kubernetes.protobuf`, kube-proxy's `--kube-api-content-type`
    /// default), read with only what the conversions read ([`super::protobuf`]); their watches,
    /// one change at a time, stay JSON, and so do the Node's and ServiceCIDRs' lists
    /// (paginated). A list the server answers in JSON anyway is read as JSON. Decoding a
    /// protobuf list costs a fraction of the CPU its JSON text does, which is what a restart
    /// at 10,000 Services spends most on.
    Protobuf,
    /// Streaming lists of Services and EndpointSlices in Kubernetes' protobuf encoding, as
    /// kube-proxy makes them since Kubernetes 1.35 (client-go's streaming lists in its default
    /// content type): the API server's cost of [`ListMode::Streaming`] and the node's decoding
    /// of [`ListMode::Protobuf`]. Every event of their watches, the picture's and the changes
    /// after it, is a length-prefixed protobuf `WatchEvent` frame; the Node's and
    /// ServiceCIDRs' lists stream in JSON. A kind whose streaming list is refused or ignored
    /// falls back (as in [`ListMode::Streaming`]) to [`ListMode::Protobuf`]'s paginated lists.
    /// The default.
    #[default]
    ProtobufStreaming,
}

impl ListMode {
    /// Whether kinds listed in JSON (every kind but Services and EndpointSlices in the
    /// protobuf modes) make streaming lists.
    fn streams_json(self) -> bool {
        matches!(self, ListMode::Streaming | ListMode::ProtobufStreaming)
    }
}

/// How long a streaming list may stay silent before its `initial-events-end` bookmark
/// before the source gives up on it: [`KubeSourceConfig::initial_events_silence`]'s default.
pub const DEFAULT_INITIAL_EVENTS_SILENCE: Duration = Duration::from_secs(10);

/// Settings of the Kubernetes source.
#[derive(Debug, Clone)]
pub struct KubeSourceConfig {
    /// This node's name.
    pub hostname: String,
    /// How lists and relists are made.
    pub list_mode: ListMode,
    /// With [`ListMode::Streaming`]: how long the initial events of a streaming list may
    /// pause (from the watch's start, or since the last event) before the source takes the
    /// server for one that ignores `sendInitialEvents` and falls back to paginated lists.
    pub initial_events_silence: Duration,
    /// Also watch networking.k8s.io/v1 ServiceCIDRs (cluster-scoped; needs list and watch
    /// on `servicecidrs`) and send their changes, for a proxier that routes the Service
    /// CIDRs the cluster has (`--bind-service-cidrs=auto`).
    pub service_cidrs: bool,
}

impl KubeSourceConfig {
    /// Settings for the node `hostname`: streaming lists, Services and EndpointSlices in
    /// protobuf (falling back to paginated lists), no ServiceCIDRs.
    pub fn new(hostname: impl Into<String>) -> KubeSourceConfig {
        KubeSourceConfig {
            hostname: hostname.into(),
            list_mode: ListMode::default(),
            initial_events_silence: DEFAULT_INITIAL_EVENTS_SILENCE,
            service_cidrs: false,
        }
    }
}

/// Whether a watcher error is the API server refusing a streaming list: 422 Invalid (or 400
/// Bad Request) naming `sendInitialEvents` (1.27 and later with the WatchList gate off) or
/// `resourceVersionMatch` on a watch (servers older than 1.27) as the field at fault, in the
/// Status's causes or, where a server gives none, in its message.
fn refuses_streaming_list(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => status,
        _ => return false,
    };
    const FIELDS: [&str; 2] = ["sendInitialEvents", "resourceVersionMatch"];
    let refused = matches!(
        (status.code, status.reason.as_str()),
        (422, "Invalid" | "") | (400, "BadRequest" | "")
    );
    let causes = status.details.iter().flat_map(|details| &details.causes);
    let named = causes
        .map(|cause| cause.field.as_str())
        .chain(std::iter::once(status.message.as_str()))
        .any(|text| FIELDS.iter().any(|field| text.contains(field)));
    refused && named
}

type WatchStream<K> = BoxStream<'static, watcher::Result<Event<K>>>;

/// How a kind lists when its streaming list is refused or ignored, made when it falls back.
type Fallback<K> = Box<dyn FnOnce() -> WatchStream<K> + Send>;

/// The watcher for `config` in `mode`: a streaming list in JSON
/// ([`super::protobuf_stream::json_stream_watcher`], with the fallback to kube-runtime's
/// paginated lists) when `mode` streams JSON, kube-runtime's paginated lists otherwise.
fn watcher_with_fallback<K>(
    api: Api<K>,
    config: watcher::Config,
    mode: ListMode,
    silence: Duration,
    kind: &'static str,
) -> WatchStream<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    if !mode.streams_json() {
        return make_watcher(api, config).boxed();
    }
    let streaming =
        json_stream_watcher(api.clone().into_client(), api.clone(), config.clone()).boxed();
    with_fallback(
        streaming,
        Box::new(move || make_watcher(api, config).boxed()),
        silence,
        kind,
    )
}

/// A streaming watcher that falls back to `fallback`'s paginated lists. Neither
/// kube-runtime's streaming watcher nor ours has a fallback of its own: it would retry a
/// refused watch forever, and wait forever for the `initial-events-end` bookmark from a
/// server that ignores `sendInitialEvents`. So this one switches that kind to paginated lists
/// for good at the first refusal (swallowing the error: the list follows at once, without a
/// backoff) or when the initial events pause for `silence` (the paginated list's `Init` then
/// starts the picture over).
fn with_fallback<K: Send + 'static>(
    streaming: WatchStream<K>,
    fallback: Fallback<K>,
    silence: Duration,
    kind: &'static str,
) -> WatchStream<K> {
    futures::stream::unfold(
        StreamingWatch {
            stream: streaming,
            fallback: Some(fallback),
            initial_events: false,
        },
        move |mut watch| async move {
            loop {
                let next = if watch.initial_events && watch.fallback.is_some() {
                    within(silence, watch.stream.next()).await
                } else {
                    Ok(watch.stream.next().await)
                };
                let item = match next {
                    Ok(item) => item?,
                    Err(_elapsed) => {
                        tracing::warn!(
                            kind,
                            ?silence,
                            "a streaming list's initial events stopped without their end \
                             bookmark (the API server ignores sendInitialEvents); falling back \
                             to paginated lists"
                        );
                        watch.fall_back();
                        continue;
                    }
                };
                if let Err(error) = &item
                    && refuses_streaming_list(error)
                    && watch.fallback.is_some()
                {
                    tracing::warn!(
                        kind, %error,
                        "the API server refuses streaming lists; falling back to paginated lists"
                    );
                    watch.fall_back();
                    continue;
                }
                match &item {
                    Ok(Event::Init) => watch.initial_events = true,
                    Ok(Event::InitDone) => watch.initial_events = false,
                    _ => {}
                }
                return Some((item, watch));
            }
        },
    )
    .boxed()
}

/// A streaming watcher with what its fallback needs.
struct StreamingWatch<K> {
    stream: WatchStream<K>,
    /// Makes the paginated watcher; taken when the kind falls back.
    fallback: Option<Fallback<K>>,
    /// Between `Init` and `InitDone`: a pause here is the silence the fallback watches for.
    initial_events: bool,
}

impl<K> StreamingWatch<K> {
    /// Replaces the streaming watcher with a paginated one, for good (nothing when it already
    /// fell back).
    fn fall_back(&mut self) {
        if let Some(fallback) = self.fallback.take() {
            self.stream = fallback();
            self.initial_events = false;
        }
    }
}

/// One watcher event, its object converted from how it was decoded (`W`, a
/// [`super::lean`] type or the kind itself) into the kind.
fn into_kind<W, K: From<W>>(event: Event<W>) -> Event<K> {
    match event {
        Event::Apply(object) => Event::Apply(object.into()),
        Event::Delete(object) => Event::Delete(object.into()),
        Event::Init => Event::Init,
        Event::InitApply(object) => Event::InitApply(object.into()),
        Event::InitDone => Event::InitDone,
    }
}

/// A kind's watch: the watcher (with the fallback) decoding objects as `W`, each converted to
/// the kind `K` and trimmed by `trim` as it arrives, with [`backoff_between_errors`].
fn watch_stream<W, K>(
    api: Api<W>,
    config: watcher::Config,
    mode: ListMode,
    silence: Duration,
    kind: &'static str,
    trim: fn(&mut K),
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: From<W> + Send + 'static,
{
    backoff_between_errors(
        watcher_with_fallback(api, config, mode, silence, kind)
            .map(move |event| event.map(|event| into_kind(event).modify(trim))),
    )
}

/// `events` paused after each error for kube-runtime's default backoff (client-go's
/// reflector's: 800 ms doubling up to 30 s, with jitter), which every event resets. A 410
/// Gone resets it too and is followed by no pause: the server asks for a relist, and the
/// errors before it (an API server restart's) say nothing about how soon to make one.
fn backoff_between_errors<K: Send + 'static>(
    events: impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
) -> BoxStream<'static, watcher::Result<Event<K>>> {
    let backoff = watcher::DefaultBackoff::default();
    futures::stream::unfold(
        (events.boxed(), backoff, None::<Duration>),
        |(mut events, mut backoff, pause)| async move {
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            let item = events.next().await?;
            let pause = match &item {
                Err(error) if !resource_version_gone(error) => backoff.next(),
                _ => {
                    backoff.reset();
                    None
                }
            };
            Some((item, (events, backoff, pause)))
        },
    )
    .boxed()
}

/// Whether a watcher error is the API server's 410 Gone: the resourceVersion asked for is
/// no longer served (compacted, or older than a new watch cache), and the watcher relists.
fn resource_version_gone(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => status.code == 410,
        _ => false,
    }
}

/// [`watch_stream`] for a kind with a protobuf decoder: with [`ListMode::Protobuf`], its lists
/// are asked for in protobuf and read by `decode`
/// ([`super::protobuf_watch::protobuf_list_watcher`]); with [`ListMode::ProtobufStreaming`],
/// its streaming lists and watches ([`super::protobuf_stream::protobuf_stream_watcher`],
/// falling back to the former); in other modes, as [`watch_stream`].
fn large_kind_stream<W, K>(
    client: kube::Client,
    config: watcher::Config,
    mode: ListMode,
    silence: Duration,
    kind: &'static str,
    trim: fn(&mut K),
    decode: fn(&[u8]) -> Result<K, ProtobufError>,
) -> BoxStream<'static, watcher::Result<Event<K>>>
where
    W: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
    K: From<W> + Resource + Send + 'static,
{
    let api = Api::<W>::all(client.clone());
    let watcher = match mode {
        ListMode::Protobuf => protobuf_list_watcher(client, api, config, decode).boxed(),
        ListMode::ProtobufStreaming => {
            let streaming =
                protobuf_stream_watcher(client.clone(), api.clone(), config.clone(), decode);
            let fallback = move || protobuf_list_watcher(client, api, config, decode).boxed();
            with_fallback(streaming.boxed(), Box::new(fallback), silence, kind)
        }
        ListMode::Paginated | ListMode::Streaming => {
            return watch_stream(api, config, mode, silence, kind, trim).boxed();
        }
    };
    backoff_between_errors(watcher.map(move |event| event.map(|event| event.modify(trim))))
}

/// Starts the watchers. Watch errors (API outages, expired resource versions) are logged and
/// retried with backoff; the stores keep their objects meanwhile.
pub fn spawn(client: kube::Client, config: KubeSourceConfig) -> SourceHandle {
    let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
    let (synced_tx, synced_rx) = watch::channel(false);
    let mode = config.list_mode;
    let silence = config.initial_events_silence;
    // Services and slices travel boxed (see `Boxed`).
    let services = large_kind_stream::<LeanService, Boxed<Service>>(
        client.clone(),
        watcher::Config::default().labels(PROXIED_OBJECTS_SELECTOR),
        mode,
        silence,
        "Service",
        |service| trim_service(&mut service.0),
        |message| decode_service_boxed(message).map(Boxed),
    );
    let slices = large_kind_stream::<LeanSlice, Boxed<EndpointSlice>>(
        client.clone(),
        watcher::Config::default().labels(PROXIED_OBJECTS_SELECTOR),
        mode,
        silence,
        "EndpointSlice",
        |slice| trim_slice(&mut slice.0),
        |message| decode_slice_boxed(message).map(Boxed),
    );
    let nodes = watch_stream(
        Api::<Node>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", config.hostname)),
        mode,
        silence,
        "Node",
        trim_node,
    );
    let service_cidrs = if config.service_cidrs {
        watch_stream(
            Api::<ServiceCIDR>::all(client),
            watcher::Config::default(),
            mode,
            silence,
            "ServiceCIDR",
            trim_service_cidr,
        )
        .boxed()
    } else {
        futures::stream::pending().boxed()
    };
    // Each kind on a task of its own, made into changes by its own store there: the Service
    // and EndpointSlice lists (the big ones) are then received, decoded, trimmed and
    // converted in parallel, on the runtime's workers.
    let (services, services_task) = on_own_task(kind_changes(services, Watched::Services));
    let (slices, slices_task) = on_own_task(kind_changes(slices, Watched::Slices));
    let (nodes, nodes_task) = on_own_task(kind_changes(nodes, Watched::Node));
    let (service_cidrs, service_cidrs_task) =
        on_own_task(kind_changes(service_cidrs, Watched::ServiceCidrs));
    let (ahead_tx, ahead_rx) = oneshot::channel();
    let picture = FirstPicture::new(config.service_cidrs, Some(ahead_tx));
    let task = tokio::spawn(run(
        Watches {
            services,
            slices,
            nodes,
            service_cidrs,
            tasks: vec![services_task, slices_task, nodes_task, service_cidrs_task],
        },
        picture,
        tx,
        synced_tx,
    ));
    SourceHandle {
        events: rx,
        synced: synced_rx,
        services_ahead: Some(ahead_rx),
        task,
    }
}

/// The changes one watcher event of a kind made, as the kind's task hands them over.
struct KindBatch {
    /// Whether the kind has listed.
    listed: bool,
    /// How many objects the kind's store knows.
    objects: usize,
    batch: SourceBatch,
}

/// A kind's watch made into changes by a store of its own, where the watch runs. Only the
/// events that change something are kept: the events of a list become one [`KindBatch`],
/// when the list is done, instead of one hand-over each.
fn kind_changes<K: KindChanges>(
    events: impl Stream<Item = watcher::Result<Event<K>>> + Send,
    kind: Watched,
) -> impl Stream<Item = watcher::Result<KindBatch>> + Send {
    let mut store = ObjectStore::<K, SourceBatch>::default();
    let started = std::time::Instant::now();
    events.filter_map(move |event| {
        let item = match event {
            Err(error) => Some(Err(error)),
            Ok(event) => {
                let was_listed = store.is_listed();
                let batch = changes_of(&mut store, event);
                let listed = store.is_listed();
                if listed && !was_listed {
                    tracing::info!(
                        kind = kind.name(),
                        objects = store.len(),
                        took = ?started.elapsed(),
                        "first list received"
                    );
                }
                (!batch.is_empty() || listed != was_listed).then(|| {
                    Ok(KindBatch {
                        listed,
                        objects: store.len(),
                        batch,
                    })
                })
            }
        };
        futures::future::ready(item)
    })
}

fn log_watch_error(kind: &'static str, error: &watcher::Error) {
    tracing::warn!(
        kind,
        error = %WatchErrorText(error),
        "watch failed; retrying with backoff, keeping known objects"
    );
    crate::metrics::record_watch_error(kind);
}

/// A watcher error as the log gives it: what failed, then the API server's `Status` as
/// `CODE Reason: message` (kube's own text repeats the Status in Rust's debug form).
struct WatchErrorText<'a>(&'a watcher::Error);

impl std::fmt::Display for WatchErrorText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, status) = match self.0 {
            watcher::Error::InitialListFailed(kube::Error::Api(status)) => ("listing", status),
            watcher::Error::WatchStartFailed(kube::Error::Api(status)) => {
                ("starting the watch", status)
            }
            watcher::Error::WatchFailed(kube::Error::Api(status)) => ("watching", status),
            watcher::Error::WatchError(status) => ("the watch ended with an error", status),
            other => return write!(f, "{other}"),
        };
        write!(
            f,
            "{what}: {} {}: {}",
            status.code, status.reason, status.message
        )
    }
}

/// The watch streams the source follows, and the tasks that run them.
struct Watches<S, E, N, C> {
    services: S,
    slices: E,
    nodes: N,
    service_cidrs: C,
    tasks: Vec<WatchTask>,
}

/// How many events of one kind may wait between its watch's task and the source's.
const WATCH_EVENTS_WAITING: usize = 256;

/// A task running one kind's watch; aborted when dropped (with the source's task).
struct WatchTask(tokio::task::JoinHandle<()>);

impl Drop for WatchTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `stream` on a task of its own and returns its items as they come, in order.
fn on_own_task<T: Send + 'static>(
    stream: impl Stream<Item = T> + Send + 'static,
) -> (impl Stream<Item = T> + Send, WatchTask) {
    let (tx, rx) = mpsc::channel(WATCH_EVENTS_WAITING);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).await.is_err() {
                return; // the source is gone
            }
        }
    });
    let items = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (items, WatchTask(task))
}

async fn run(
    watches: Watches<
        impl Stream<Item = watcher::Result<KindBatch>> + Send,
        impl Stream<Item = watcher::Result<KindBatch>> + Send,
        impl Stream<Item = watcher::Result<KindBatch>> + Send,
        impl Stream<Item = watcher::Result<KindBatch>> + Send,
    >,
    mut picture: FirstPicture,
    tx: mpsc::Sender<SourceBatch>,
    synced: watch::Sender<bool>,
) {
    let mut services = std::pin::pin!(watches.services);
    let mut slices = std::pin::pin!(watches.slices);
    let mut nodes = std::pin::pin!(watches.nodes);
    let mut service_cidrs = std::pin::pin!(watches.service_cidrs);
    let _tasks = watches.tasks;
    let started = std::time::Instant::now();
    let (mut service_objects, mut slice_objects) = (0, 0);
    loop {
        let (kind, item) = tokio::select! {
            Some(item) = services.next() => (Watched::Services, item),
            Some(item) = slices.next() => (Watched::Slices, item),
            Some(item) = nodes.next() => (Watched::Node, item),
            Some(item) = service_cidrs.next() => (Watched::ServiceCidrs, item),
            else => return,
        };
        let update = match item {
            Ok(update) => update,
            Err(error) => {
                log_watch_error(kind.name(), &error);
                continue;
            }
        };
        match kind {
            Watched::Services => service_objects = update.objects,
            Watched::Slices => slice_objects = update.objects,
            Watched::Node | Watched::ServiceCidrs => {}
        }
        let Some(batch) = picture.deliver(kind, update.listed, update.batch) else {
            continue;
        };
        let became_synced = picture.synced && !*synced.borrow();
        for change in &batch.changes {
            tracing::debug!(change = %super::describe(change), "kube source");
        }
        // Raised before the batch that completes the picture goes: whoever receives that
        // batch sees the flag up.
        if became_synced {
            tracing::info!(
                services = service_objects,
                endpoint_slices = slice_objects,
                took = ?started.elapsed(),
                "Services and EndpointSlices synced"
            );
            synced.send_replace(true);
        }
        if tx.send(batch).await.is_err() {
            return; // the daemon is gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, version: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
            "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        }))
        .expect("a Service")
    }

    /// What [`kind_changes`] hands over for `events`: (listed, objects, changes) each.
    fn handovers(events: Vec<watcher::Result<Event<Service>>>) -> Vec<(bool, usize, usize)> {
        let stream = kind_changes(futures::stream::iter(events), Watched::Services);
        futures::executor::block_on(stream.collect::<Vec<_>>())
            .into_iter()
            .map(|item| match item {
                Ok(update) => (update.listed, update.objects, update.batch.changes.len()),
                Err(_) => (false, usize::MAX, 0),
            })
            .collect()
    }

    #[test]
    fn a_list_crosses_once_and_an_unchanged_relist_not_at_all() {
        let list = |version: &str| {
            vec![
                Ok(Event::Init),
                Ok(Event::InitApply(service("a", version))),
                Ok(Event::InitApply(service("b", "1"))),
                Ok(Event::InitDone),
            ]
        };
        assert_eq!(handovers(list("1")), [(true, 2, 2)], "the list, when done");

        let mut events = list("1");
        events.extend(list("1"));
        assert_eq!(
            handovers(events),
            [(true, 2, 2)],
            "the relist changed nothing"
        );

        let mut events = list("1");
        events.extend(list("2"));
        events.push(Ok(Event::Delete(service("b", "1"))));
        assert_eq!(
            handovers(events),
            [(true, 2, 2), (true, 2, 1), (true, 1, 1)],
            "a's new version, then b's deletion"
        );
    }

    /// A relist keeps the entries of the objects it did not change where they are (their
    /// keys' strings not made anew), changes the changed one, and removes the unlisted one.
    #[test]
    fn a_relist_changes_the_store_in_place() {
        let mut store: ObjectStore<Service> = ObjectStore::default();
        let list = |store: &mut ObjectStore<Service>, services: &[(&str, &str)]| {
            let mut changes = store.apply(Event::Init);
            for &(name, version) in services {
                changes.extend(store.apply(Event::InitApply(service(name, version))));
            }
            changes.extend(store.apply(Event::InitDone));
            changes
        };
        let name_at = |store: &ObjectStore<Service>, name: &str| {
            let (key, _) = store
                .versions
                .iter()
                .find(|(key, _)| key.name == name)
                .expect("listed");
            key.name.as_ptr()
        };
        assert_eq!(
            list(&mut store, &[("a", "1"), ("b", "1"), ("c", "1")]).len(),
            3
        );
        let (a, b) = (name_at(&store, "a"), name_at(&store, "b"));

        let changes = list(&mut store, &[("a", "1"), ("b", "2")]);
        assert!(
            matches!(&changes[..], [StoreChange::Delete(gone), StoreChange::Upsert(changed)]
                if gone.name == "c" && changed.metadata.name.as_deref() == Some("b")
                    && changed.metadata.namespace.as_deref() == Some("ns")),
            "{changes:?}"
        );
        let versions: Vec<_> = store
            .versions
            .iter()
            .map(|(key, known)| (key.name.as_str(), known.version.as_deref()))
            .collect();
        assert_eq!(versions, [("a", Some("1")), ("b", Some("2"))]);
        assert_eq!(name_at(&store, "a"), a, "a unchanged entry was made anew");
        assert_eq!(name_at(&store, "b"), b, "a changed entry keeps its key");
    }

    fn one_change() -> SourceBatch {
        SourceBatch {
            changes: vec![proxier_core::Change::DeleteNode],
        }
    }

    #[test]
    fn the_services_go_ahead_when_they_list_before_the_endpoint_slices() {
        let (tx, mut ahead) = oneshot::channel();
        let mut picture = FirstPicture::new(false, Some(tx));
        assert!(picture.deliver(Watched::Node, true, one_change()).is_none());
        assert!(
            ahead.try_recv().is_err(),
            "nothing before the Services list"
        );
        assert!(
            picture
                .deliver(Watched::Services, true, one_change())
                .is_none()
        );
        let sent = ahead.try_recv().expect("the Services, once listed");
        assert_eq!(sent.changes.len(), 2, "with the Node listed before them");
        let first = picture.deliver(Watched::Slices, true, one_change());
        assert_eq!(
            first.map(|batch| batch.changes.len()),
            Some(3),
            "the first batch has all"
        );
    }

    #[test]
    fn nothing_goes_ahead_of_slices_listed_first_or_of_service_cidrs_still_listing() {
        let (tx, mut ahead) = oneshot::channel();
        let mut picture = FirstPicture::new(false, Some(tx));
        assert!(
            picture
                .deliver(Watched::Slices, true, one_change())
                .is_none()
        );
        assert!(
            picture
                .deliver(Watched::Services, true, one_change())
                .is_some()
        );
        assert!(ahead.try_recv().is_err(), "complete at once: nothing ahead");

        let (tx, mut ahead) = oneshot::channel();
        let mut picture = FirstPicture::new(true, Some(tx));
        assert!(
            picture
                .deliver(Watched::Services, true, one_change())
                .is_none()
        );
        assert!(
            ahead.try_recv().is_err(),
            "ServiceCIDRs decide which ClusterIPs are bound"
        );
        assert!(
            picture
                .deliver(Watched::ServiceCidrs, true, one_change())
                .is_none()
        );
        assert_eq!(
            ahead.try_recv().map(|batch| batch.changes.len()).ok(),
            Some(2)
        );
    }

    #[test]
    fn watch_errors_cross_as_they_come() {
        let events = vec![
            Ok(Event::Init),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::InitApply(service("a", "1"))),
            Ok(Event::InitDone),
        ];
        assert_eq!(handovers(events), [(false, usize::MAX, 0), (true, 1, 1)]);
    }
}
