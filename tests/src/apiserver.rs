//! A Kubernetes API server double for tests: serves list and watch of Services,
//! EndpointSlices and Nodes over plain HTTP on 127.0.0.1, applies `!label` label selectors
//! and `metadata.name=` field selectors like the real server, and lets a test add and delete
//! objects, expire watches (410 Gone) and simulate an outage (every request fails).
//!
//! It answers streaming lists (a watch with `sendInitialEvents=true`) as an API server with
//! the WatchList feature does: every current object as ADDED, then a BOOKMARK annotated
//! `k8s.io/initial-events-end`, then changes; or, after
//! [`FakeApiServer::refuse_streaming_lists`], as one without it (422 Invalid), or, after
//! [`FakeApiServer::ignore_streaming_lists`], as a plain watch (no end bookmark). It counts the
//! bytes of every response body it sends, by kind ([`FakeApiServer::bytes_served`]).
//!
//! A list of Services or EndpointSlices whose request accepts
//! `application/vnd.kubernetes.protobuf` is answered in that encoding ([`protobuf`]), in
//! pages of `limit` objects with a `continue` token as the real server pages; every other
//! list is JSON, whole. A watch (streaming lists included) of Services or EndpointSlices
//! whose request accepts protobuf is answered in Kubernetes' protobuf watch encoding
//! (`application/vnd.kubernetes.protobuf;stream=watch`: length-prefixed `WatchEvent` frames,
//! [`protobuf::watch_frame`]), its 410 Gone as an ERROR frame; every other watch in JSON
//! lines. Errors that end a request before it streams (404, 422, an outage) are JSON.

#![allow(dead_code)]

pub mod protobuf;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The kinds the double serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// v1 Service.
    Service,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
    /// v1 Node.
    Node,
    /// networking.k8s.io/v1 ServiceCIDR (cluster-scoped).
    ServiceCidr,
}

impl Kind {
    fn from_path(path: &str) -> Option<Kind> {
        match path {
            "/api/v1/services" => Some(Kind::Service),
            "/apis/discovery.k8s.io/v1/endpointslices" => Some(Kind::EndpointSlice),
            "/api/v1/nodes" => Some(Kind::Node),
            "/apis/networking.k8s.io/v1/servicecidrs" => Some(Kind::ServiceCidr),
            _ => None,
        }
    }

    /// Whether its lists are served in protobuf to a request that accepts it.
    fn in_protobuf(self) -> bool {
        matches!(self, Kind::Service | Kind::EndpointSlice)
    }

    /// (apiVersion, kind) of one object.
    fn object_kind(self) -> (&'static str, &'static str) {
        match self {
            Kind::Service => ("v1", "Service"),
            Kind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
            Kind::Node => ("v1", "Node"),
            Kind::ServiceCidr => ("networking.k8s.io/v1", "ServiceCIDR"),
        }
    }

    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            Kind::Service => ("v1", "ServiceList"),
            Kind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSliceList"),
            Kind::Node => ("v1", "NodeList"),
            Kind::ServiceCidr => ("networking.k8s.io/v1", "ServiceCIDRList"),
        }
    }
}

#[derive(Default)]
struct State {
    resource_version: u64,
    /// Each object with its JSON text, written once when it is stored: a list is then the
    /// stored texts joined, so serving 10,000 objects to the daemon under test costs the
    /// double little of the CPU they share (a real API server serves lists from its cache,
    /// on another machine).
    objects: BTreeMap<(Kind, String), (Value, String)>,
    /// The protobuf encoding of stored Services and EndpointSlices, made at the first
    /// protobuf list or streaming list that serves them, or by the change that a protobuf
    /// watch is told of (and dropped when they change).
    encoded: BTreeMap<(Kind, String), Vec<u8>>,
    /// (kind, resourceVersion, event) for watch replay.
    log: Vec<(Kind, u64, Value)>,
    watchers: Vec<Watcher>,
    /// During an outage, what every request gets: (status, reason, message).
    outage: Option<(u16, &'static str, &'static str)>,
    refuse_streaming_lists: bool,
    ignore_streaming_lists: bool,
    /// Bytes of response bodies sent, by kind.
    bytes_served: BTreeMap<Kind, u64>,
    /// List pages served in protobuf, by kind.
    protobuf_pages: BTreeMap<Kind, usize>,
    /// Watch requests answered in protobuf, by kind.
    protobuf_watches: BTreeMap<Kind, usize>,
    requests: Vec<String>,
    /// Watches from a resourceVersion older than this get 410 Gone.
    compacted_at: u64,
    /// The initial events of the streaming lists served since the objects last changed, kept
    /// to serve the same list again as it was: a real API server serves them from its watch
    /// cache on another machine, while the double shares the CPUs of the daemon under test,
    /// which asks for the same two lists at every restart.
    streamed: Vec<StreamedList>,
}

/// The initial events (and closing bookmark) of one streaming list, as sent.
struct StreamedList {
    kind: Kind,
    protobuf: bool,
    label_selector: Option<String>,
    field_selector: Option<String>,
    resource_version: u64,
    events: Bytes,
}

impl State {
    /// Stores `obj` (and its JSON text) under `key`; its protobuf encoding, if any, is stale.
    fn store(&mut self, key: (Kind, String), obj: Value) {
        self.encoded.remove(&key);
        self.streamed.clear();
        let text = obj.to_string();
        self.objects.insert(key, (obj, text));
    }

    /// Removes the object under `key` with its encodings; returns it.
    fn forget(&mut self, key: &(Kind, String)) -> Option<Value> {
        self.encoded.remove(key);
        self.streamed.clear();
        self.objects.remove(key).map(|(obj, _)| obj)
    }

    /// Keeps `tx` to tell it of `kind`'s changes matching `query`, in protobuf frames or JSON
    /// lines.
    fn watch(
        &mut self,
        kind: Kind,
        query: Query,
        protobuf: bool,
        tx: mpsc::UnboundedSender<Bytes>,
    ) {
        self.watchers.push(Watcher {
            kind,
            query,
            protobuf,
            tx,
        });
    }

    /// The initial events of a streaming list of `kind` for `query` served before, if
    /// nothing has changed since.
    fn streamed(&self, kind: Kind, protobuf: bool, query: &Query) -> Option<Bytes> {
        self.streamed
            .iter()
            .find(|list| {
                list.kind == kind
                    && list.protobuf == protobuf
                    && list.label_selector == query.label_selector
                    && list.field_selector == query.field_selector
                    && list.resource_version == self.resource_version
            })
            .map(|list| list.events.clone())
    }

    /// Keeps the initial events of a streaming list just made (see [`State::streamed`]).
    fn remember_streamed(&mut self, kind: Kind, protobuf: bool, query: &Query, events: Bytes) {
        self.streamed.push(StreamedList {
            kind,
            protobuf,
            label_selector: query.label_selector.clone(),
            field_selector: query.field_selector.clone(),
            resource_version: self.resource_version,
            events,
        });
    }
}

/// An open watch.
struct Watcher {
    kind: Kind,
    query: Query,
    /// Whether it is answered in protobuf frames (else JSON lines).
    protobuf: bool,
    tx: mpsc::UnboundedSender<Bytes>,
}

#[derive(Debug, Clone, Default)]
struct Query {
    watch: bool,
    send_initial_events: bool,
    resource_version_match: Option<String>,
    resource_version: Option<u64>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    limit: Option<usize>,
    continue_token: Option<String>,
}

impl Query {
    fn parse(query: &str) -> Query {
        let mut q = Query::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "watch" => q.watch = v == "true" || v == "1",
                "sendInitialEvents" => q.send_initial_events = v == "true",
                "resourceVersionMatch" => q.resource_version_match = Some(v.into_owned()),
                "resourceVersion" => q.resource_version = v.parse().ok(),
                "labelSelector" => q.label_selector = Some(v.into_owned()),
                "fieldSelector" => q.field_selector = Some(v.into_owned()),
                "limit" => q.limit = v.parse().ok().filter(|n| *n > 0),
                "continue" => q.continue_token = Some(v.into_owned()),
                _ => {}
            }
        }
        q
    }

    /// Supports the selector forms the proxier uses: `!label` and `metadata.name=x`.
    fn matches(&self, obj: &Value) -> bool {
        let meta = &obj["metadata"];
        if let Some(sel) = &self.label_selector {
            for part in sel.split(',').filter(|p| !p.is_empty()) {
                if let Some(label) = part.strip_prefix('!') {
                    if meta["labels"].get(label).is_some() {
                        return false;
                    }
                } else {
                    panic!("label selector form not supported by the double: {part}");
                }
            }
        }
        if let Some(sel) = &self.field_selector {
            for part in sel.split(',').filter(|p| !p.is_empty()) {
                match part.split_once('=') {
                    Some(("metadata.name", name)) => {
                        if meta["name"].as_str() != Some(name) {
                            return false;
                        }
                    }
                    _ => panic!("field selector form not supported by the double: {part}"),
                }
            }
        }
        true
    }
}

fn key_of(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj["metadata"]["namespace"].as_str().unwrap_or(""),
        obj["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// A running API server double. Stops when dropped.
pub struct FakeApiServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, Infallible>;

/// How much of a watch's events the double hands to the connection at once while more
/// wait: the size of the buffer Go's HTTP/1.1 server writes a response through
/// (`bufferBeforeChunkingSize` in net/http), which the API server's watch handler flushes
/// only when no event waits. A streaming list's initial events therefore reach the client
/// in pieces of this size, not an event each; a change that comes alone goes alone.
const BUFFERED_WRITE: usize = 2048;

fn full(status: u16, value: &Value) -> hyper::Response<Body> {
    full_text(status, value.to_string())
}

fn full_text(status: u16, text: String) -> hyper::Response<Body> {
    let mut resp = hyper::Response::new(Full::new(Bytes::from(text)).boxed());
    *resp.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn status_object(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

impl FakeApiServer {
    /// Starts on 127.0.0.1 with a free port.
    pub async fn start() -> FakeApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State {
            resource_version: 100,
            ..State::default()
        }));
        let st = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = Arc::clone(&st);
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let protobuf = req
                            .headers()
                            .get(hyper::header::ACCEPT)
                            .and_then(|accept| accept.to_str().ok())
                            .is_some_and(|accept| accept.contains(protobuf::CONTENT_TYPE));
                        let resp = handle(
                            &st,
                            req.uri().path(),
                            req.uri().query().unwrap_or(""),
                            protobuf,
                        );
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeApiServer { addr, state, task }
    }

    /// The URL to give as `--master`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("double state")
    }

    /// Adds or replaces an object and notifies watchers.
    pub fn apply(&self, kind: Kind, mut obj: Value) {
        let mut st = self.lock();
        st.resource_version += 1;
        let rv = st.resource_version;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = (kind, key_of(&obj));
        let kind_of_event = if st.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.store(key, obj.clone());
        let event = json!({"type": kind_of_event, "object": obj});
        notify(&mut st, kind, rv, event);
    }

    /// Deletes an object (by namespace/name) and notifies watchers.
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        let mut st = self.lock();
        let Some(mut obj) = st.forget(&(kind, format!("{namespace}/{name}"))) else {
            panic!("no {kind:?} {namespace}/{name} to delete");
        };
        st.resource_version += 1;
        let rv = st.resource_version;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        notify(&mut st, kind, rv, json!({"type": "DELETED", "object": obj}));
    }

    /// Ends every open watch with 410 Gone and forgets the event history, so clients must
    /// relist (as after etcd compaction).
    pub fn expire_watches(&self) {
        let mut st = self.lock();
        st.log.clear();
        st.compacted_at = st.resource_version;
        let gone = json!({"type": "ERROR", "object": status_object(410, "Expired", "too old resource version")});
        let gone = Bytes::from(format!("{gone}\n"));
        let gone_frame = Bytes::from(gone_frame());
        for watcher in st.watchers.drain(..) {
            let event = if watcher.protobuf { &gone_frame } else { &gone };
            let _ = watcher.tx.send(event.clone());
        }
    }

    /// Changes objects without telling any watcher (as if the events were compacted away),
    /// then expires the watches: only a relist can show the change.
    pub fn apply_silently(&self, kind: Kind, mut obj: Value) {
        let mut st = self.lock();
        st.resource_version += 1;
        obj["metadata"]["resourceVersion"] = json!(st.resource_version.to_string());
        st.store((kind, key_of(&obj)), obj);
    }

    /// Deletes without telling watchers (see [`FakeApiServer::apply_silently`]).
    pub fn delete_silently(&self, kind: Kind, namespace: &str, name: &str) {
        let mut st = self.lock();
        st.resource_version += 1;
        st.forget(&(kind, format!("{namespace}/{name}")));
    }

    /// While on, every request fails with 503 and open watches are cut.
    pub fn set_outage(&self, on: bool) {
        let mut st = self.lock();
        st.outage = on.then_some((503, "ServiceUnavailable", "the double is down"));
        if on {
            st.watchers.clear(); // dropping the senders ends the streams
        }
    }

    /// Every request fails with 500 Internal Error (which kube's client does not retry, as
    /// it retries a 503) until `set_outage(false)`; watches end.
    pub fn set_failing(&self) {
        self.set_outage(true);
        self.lock().outage = Some((500, "InternalError", "the double is failing"));
    }

    /// From now on, refuse streaming lists as an API server without the WatchList feature
    /// does: 422 Invalid, naming `sendInitialEvents`.
    pub fn refuse_streaming_lists(&self) {
        self.lock().refuse_streaming_lists = true;
    }

    /// From now on, serve a streaming list as a plain watch, as a server (or a proxy in front
    /// of one) that ignores `sendInitialEvents` does: the watch's events from the
    /// resourceVersion asked for, and no `initial-events-end` bookmark.
    pub fn ignore_streaming_lists(&self) {
        self.lock().ignore_streaming_lists = true;
    }

    /// Encodes every stored Service and EndpointSlice in protobuf now, as a real API server's
    /// cache holds its objects ready to serve: a benchmark's first protobuf list then costs
    /// the double no more than a JSON one (an object that changes later is encoded again
    /// when a list next serves it).
    pub fn prepare_protobuf(&self) {
        let mut st = self.lock();
        let keys: Vec<(Kind, String)> = st
            .objects
            .keys()
            .filter(|(kind, _)| kind.in_protobuf())
            .cloned()
            .collect();
        encode_protobuf(&mut st, &keys);
    }

    /// Makes the protobuf encoding of one stored Service or EndpointSlice unreadable (a
    /// field whose length runs past the message's end) until the object is applied again: a
    /// reader of protobuf lists and watches must not hand out a picture without it.
    pub fn corrupt_protobuf(&self, kind: Kind, namespace: &str, name: &str) {
        let mut st = self.lock();
        let key = (kind, format!("{namespace}/{name}"));
        assert!(
            st.objects.contains_key(&key),
            "no {kind:?} {namespace}/{name}"
        );
        st.encoded.insert(key, vec![0x0a, 0x7f]);
        st.streamed.clear();
    }

    /// List pages served in protobuf so far for `kind`.
    pub fn protobuf_pages(&self, kind: Kind) -> usize {
        self.lock().protobuf_pages.get(&kind).copied().unwrap_or(0)
    }

    /// Watch requests of `kind` (streaming lists included) answered so far in protobuf frames
    /// rather than JSON lines.
    pub fn protobuf_watches(&self, kind: Kind) -> usize {
        self.lock()
            .protobuf_watches
            .get(&kind)
            .copied()
            .unwrap_or(0)
    }

    /// Bytes of response bodies sent so far for `kind`: list responses and watch event lines
    /// or frames (their length prefixes included).
    pub fn bytes_served(&self, kind: Kind) -> u64 {
        self.lock().bytes_served.get(&kind).copied().unwrap_or(0)
    }

    /// Requests seen so far (`path?query`).
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// Watches of `kind` whose client is still connected.
    pub fn open_watches(&self, kind: Kind) -> usize {
        let st = self.lock();
        st.watchers
            .iter()
            .filter(|watcher| watcher.kind == kind && !watcher.tx.is_closed())
            .count()
    }
}

fn notify(st: &mut State, kind: Kind, rv: u64, event: Value) {
    let line = Bytes::from(format!("{event}\n"));
    // The object's protobuf encoding, made for the first protobuf watcher that gets it.
    let mut message: Option<Vec<u8>> = None;
    let mut frame: Option<Bytes> = None;
    let mut sent = 0;
    st.watchers.retain(|watcher| {
        let q = &watcher.query;
        if watcher.kind != kind || !q.matches(&event["object"]) && event["type"] != "DELETED" {
            return !watcher.tx.is_closed();
        }
        let bytes = if watcher.protobuf {
            frame.get_or_insert_with(|| {
                let encoded = message.insert(encode_object(kind, &event["object"]));
                Bytes::from(event_frame(kind, &event, encoded))
            })
        } else {
            &line
        };
        sent += bytes.len() as u64;
        watcher.tx.send(bytes.clone()).is_ok()
    });
    *st.bytes_served.entry(kind).or_default() += sent;
    // The object stored is the one just encoded: keep its encoding for lists and watches.
    if let Some(message) = message
        && event["type"] != "DELETED"
    {
        let key = (kind, key_of(&event["object"]));
        if st.objects.contains_key(&key) {
            st.encoded.insert(key, message);
        }
    }
    st.log.push((kind, rv, event));
}

/// A watch event (JSON `{"type": ..., "object": ...}` of `kind`) as a protobuf frame, its
/// object's message `encoded`.
fn event_frame(kind: Kind, event: &Value, encoded: &[u8]) -> Vec<u8> {
    let (api_version, object_kind) = kind.object_kind();
    protobuf::watch_frame(
        event["type"].as_str().expect("an event type"),
        &protobuf::object_body(api_version, object_kind, encoded),
    )
}

/// The ERROR frame of a protobuf watch that is too old: 410 Gone, Expired.
fn gone_frame() -> Vec<u8> {
    protobuf::watch_frame(
        "ERROR",
        &protobuf::status_body(410, "Expired", "too old resource version"),
    )
}

/// The refusal of a streaming list by an API server without the WatchList feature, as
/// kube-apiserver words it.
fn watch_list_refusal() -> Value {
    let message =
        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: {message}"),
           "reason": "Invalid",
           "details": {"group": "meta.k8s.io", "kind": "ListOptions",
                       "causes": [{"reason": "FieldValueForbidden", "field": "sendInitialEvents",
                                   "message": format!("Forbidden: {message}")}]},
           "code": 422})
}

fn handle(
    state: &Arc<Mutex<State>>,
    path: &str,
    query: &str,
    protobuf: bool,
) -> hyper::Response<Body> {
    let mut st = state.lock().expect("double state");
    st.requests.push(format!("{path}?{query}"));
    if let Some((code, reason, message)) = st.outage {
        return full(code, &status_object(code, reason, message));
    }
    let Some(kind) = Kind::from_path(path) else {
        return full(404, &status_object(404, "NotFound", "unknown path"));
    };
    let q = Query::parse(query);
    if !q.watch && protobuf && kind.in_protobuf() {
        return protobuf_list(&mut st, kind, &q);
    }
    if !q.watch {
        let (api_version, list_kind) = kind.list_kind();
        let items: Vec<&str> = st
            .objects
            .iter()
            .filter(|((k, _), (obj, _))| *k == kind && q.matches(obj))
            .map(|(_, (_, text))| text.as_str())
            .collect();
        let head = json!({"apiVersion": api_version, "kind": list_kind,
                          "metadata": {"resourceVersion": st.resource_version.to_string()}});
        // `{...head fields..., "items": [stored texts]}`
        let head = head.to_string();
        let list = format!(
            "{},\"items\":[{}]}}",
            head.strip_suffix('}').expect("a JSON object"),
            items.join(",")
        );
        *st.bytes_served.entry(kind).or_default() += list.len() as u64;
        return full_text(200, list);
    }
    let in_protobuf = protobuf && kind.in_protobuf();
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    if q.send_initial_events && !st.ignore_streaming_lists {
        // A streaming list: the state now (whatever resourceVersion asked for, as
        // NotOlderThan allows), its end marked by a bookmark, then changes.
        if st.refuse_streaming_lists {
            return full(422, &watch_list_refusal());
        }
        if q.resource_version_match.as_deref() != Some("NotOlderThan") {
            let message = "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan";
            return full(422, &status_object(422, "Invalid", message));
        }
        if let Some(events) = st.streamed(kind, in_protobuf, &q) {
            if in_protobuf {
                *st.protobuf_watches.entry(kind).or_default() += 1;
            }
            let sent = send_buffered(&tx, events);
            *st.bytes_served.entry(kind).or_default() += sent;
            st.watch(kind, q, in_protobuf, tx);
            return event_stream(rx, in_protobuf);
        }
        if in_protobuf {
            *st.protobuf_watches.entry(kind).or_default() += 1;
            // Those not encoded since they changed (usually none: see prepare_protobuf).
            let stale: Vec<(Kind, String)> = st
                .objects
                .range((kind, String::new())..)
                .take_while(|((k, _), _)| *k == kind)
                .filter(|(key, (obj, _))| !st.encoded.contains_key(key) && q.matches(obj))
                .map(|(key, _)| key.clone())
                .collect();
            encode_protobuf(&mut st, &stale);
            let (api_version, object_kind) = kind.object_kind();
            let State {
                objects, encoded, ..
            } = &*st;
            let messages: Vec<&[u8]> = objects
                .range((kind, String::new())..)
                .take_while(|((k, _), _)| *k == kind)
                .filter(|(_, (obj, _))| q.matches(obj))
                .map(|(key, _)| encoded[key].as_slice())
                .collect();
            // Each frame written in place, into one buffer sized once.
            let mut initial =
                Vec::with_capacity(messages.iter().map(|m| m.len() + 64).sum::<usize>());
            for message in messages {
                protobuf::append_watch_frame(
                    &mut initial,
                    "ADDED",
                    api_version,
                    object_kind,
                    message,
                );
            }
            let bookmark = protobuf::bookmark(&st.resource_version.to_string(), true);
            let object = protobuf::object_body(api_version, object_kind, &bookmark);
            initial.extend_from_slice(&protobuf::watch_frame("BOOKMARK", &object));
            let initial = Bytes::from(initial);
            st.remember_streamed(kind, true, &q, initial.clone());
            let sent = send_buffered(&tx, initial);
            *st.bytes_served.entry(kind).or_default() += sent;
            st.watch(kind, q, true, tx);
            return event_stream(rx, true);
        }
        // Every current object, then the bookmark, queued at once.
        let mut initial = String::new();
        for ((k, _), (obj, text)) in &st.objects {
            if *k == kind && q.matches(obj) {
                let _ = writeln!(initial, "{{\"type\":\"ADDED\",\"object\":{text}}}");
            }
        }
        let (api_version, list_kind) = kind.list_kind();
        let bookmark = json!({"type": "BOOKMARK", "object": {
            "apiVersion": api_version, "kind": list_kind.trim_end_matches("List"),
            "metadata": {"resourceVersion": st.resource_version.to_string(),
                         "annotations": {"k8s.io/initial-events-end": "true"}}}});
        let _ = writeln!(initial, "{bookmark}");
        let initial = Bytes::from(initial);
        st.remember_streamed(kind, false, &q, initial.clone());
        let sent = send_buffered(&tx, initial);
        *st.bytes_served.entry(kind).or_default() += sent;
        st.watch(kind, q, false, tx);
        return event_stream(rx, false);
    }
    let since = q.resource_version.unwrap_or(0);
    if in_protobuf {
        *st.protobuf_watches.entry(kind).or_default() += 1;
        if since < st.compacted_at {
            let _ = tx.send(Bytes::from(gone_frame()));
            drop(tx);
        } else {
            // The changes since `since`, queued at once.
            let mut missed = Vec::new();
            for (k, rv, event) in &st.log {
                if *k == kind && *rv > since && q.matches(&event["object"]) {
                    let encoded = encode_object(kind, &event["object"]);
                    missed.extend_from_slice(&event_frame(kind, event, &encoded));
                }
            }
            let sent = send_buffered(&tx, missed);
            *st.bytes_served.entry(kind).or_default() += sent;
            st.watch(kind, q, true, tx);
        }
        return event_stream(rx, true);
    }
    if since < st.compacted_at {
        let gone = json!({"type": "ERROR", "object": status_object(410, "Expired", "too old resource version")});
        let _ = tx.send(Bytes::from(format!("{gone}\n")));
        drop(tx);
    } else {
        // The changes since `since`, queued at once.
        let mut missed = String::new();
        for (k, rv, event) in &st.log {
            if *k == kind && *rv > since && q.matches(&event["object"]) {
                let _ = writeln!(missed, "{event}");
            }
        }
        let sent = send_buffered(&tx, missed);
        *st.bytes_served.entry(kind).or_default() += sent;
        st.watch(kind, q, false, tx);
    }
    event_stream(rx, false)
}

/// A list of `kind` in protobuf: the objects after the `continue` token (the last key of the
/// page before), at most `limit` of them, with a token when more remain.
fn protobuf_list(st: &mut State, kind: Kind, q: &Query) -> hyper::Response<Body> {
    use std::ops::Bound;
    let start = match &q.continue_token {
        Some(after) => Bound::Excluded((kind, after.clone())),
        None => Bound::Included((kind, String::new())),
    };
    let limit = q.limit.unwrap_or(usize::MAX);
    let mut keys: Vec<(Kind, String)> = st
        .objects
        .range((start, Bound::Unbounded))
        .take_while(|((k, _), _)| *k == kind)
        .filter(|(_, (obj, _))| q.matches(obj))
        .map(|(key, _)| key.clone())
        .take(limit.saturating_add(1))
        .collect();
    let more = keys.len() > limit;
    keys.truncate(limit);
    encode_protobuf(st, &keys);
    let items: Vec<&[u8]> = keys.iter().map(|key| st.encoded[key].as_slice()).collect();
    let continue_token = more
        .then(|| keys.last().map(|(_, key)| key.as_str()))
        .flatten();
    let (api_version, list_kind) = kind.list_kind();
    let body = protobuf::list_body(
        api_version,
        list_kind,
        &st.resource_version.to_string(),
        continue_token,
        &items,
    );
    *st.bytes_served.entry(kind).or_default() += body.len() as u64;
    *st.protobuf_pages.entry(kind).or_default() += 1;
    let mut resp = hyper::Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(protobuf::CONTENT_TYPE),
    );
    resp
}

/// Encodes in protobuf those of `keys` (Services and EndpointSlices) not encoded since they
/// last changed.
fn encode_protobuf(st: &mut State, keys: &[(Kind, String)]) {
    for key in keys {
        if !st.encoded.contains_key(key) {
            let encoded = encode_object(key.0, &st.objects[key].0);
            st.encoded.insert(key.clone(), encoded);
        }
    }
}

/// The protobuf message of `obj`, a Service or an EndpointSlice.
fn encode_object(kind: Kind, obj: &Value) -> Vec<u8> {
    match kind {
        Kind::Service => protobuf::service(obj),
        Kind::EndpointSlice => protobuf::endpoint_slice(obj),
        other => panic!("the double encodes no {other:?} in protobuf"),
    }
}

/// Sends `events` (lines, or protobuf frames) that were queued at once as the API server's
/// writer would: in pieces of [`BUFFERED_WRITE`] bytes, an event split across two pieces
/// wherever the buffer filled. Returns the bytes sent.
fn send_buffered(tx: &mpsc::UnboundedSender<Bytes>, events: impl Into<Bytes>) -> u64 {
    let events: Bytes = events.into();
    for start in (0..events.len()).step_by(BUFFERED_WRITE) {
        let end = (start + BUFFERED_WRITE).min(events.len());
        let _ = tx.send(events.slice(start..end));
    }
    events.len() as u64
}

/// The response of a watch: what `rx` receives, as JSON lines or (`protobuf`) frames.
fn event_stream(rx: mpsc::UnboundedReceiver<Bytes>, protobuf: bool) -> hyper::Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    let mut resp = hyper::Response::new(StreamBody::new(stream).boxed());
    let content_type = if protobuf {
        protobuf::WATCH_CONTENT_TYPE
    } else {
        "application/json"
    };
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::{BodyExt, Empty};
    use hyper::body::{Bytes, Incoming};
    use hyper_util::rt::TokioIo;
    use serde_json::{Value, json};

    use super::protobuf::wire;
    use super::{FakeApiServer, Kind, protobuf};

    const STREAMING_LIST: &str = "/api/v1/services?watch=1&sendInitialEvents=true\
        &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";

    fn service(name: &str, port: u16) -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": "default",
                            "annotations": {"note": "x".repeat(100)}},
               "spec": {"clusterIP": "10.96.0.10", "type": "ClusterIP",
                        "ports": [{"name": "http", "port": port, "protocol": "TCP",
                                   "targetPort": 8080}]}})
    }

    /// A watch's response: its Content-Type, and its body read frame by frame.
    struct Watch {
        content_type: String,
        body: Incoming,
        buffer: Vec<u8>,
        received: u64,
        chunks: usize,
    }

    impl Watch {
        async fn open(api: &FakeApiServer, path: &str, accept: &str) -> Watch {
            let stream = tokio::net::TcpStream::connect(api.addr)
                .await
                .expect("connect");
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            let req = http::Request::get(path)
                .header(http::header::HOST, api.addr.to_string())
                .header(http::header::ACCEPT, accept)
                .body(Empty::<Bytes>::new())
                .expect("request");
            let resp = sender.send_request(req).await.expect("response");
            assert_eq!(resp.status(), 200);
            let content_type = resp.headers()[http::header::CONTENT_TYPE]
                .to_str()
                .expect("text")
                .to_owned();
            Watch {
                content_type,
                body: resp.into_body(),
                buffer: Vec::new(),
                received: 0,
                chunks: 0,
            }
        }

        /// Reads until `buffer` holds a whole frame or the body ends.
        async fn fill(&mut self) -> bool {
            while wire::frame(&self.buffer).is_none() {
                let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                    .await
                    .expect("a frame within 5 s");
                let Some(frame) = frame else {
                    return false;
                };
                let data = frame.expect("body").into_data().expect("data");
                self.received += data.len() as u64;
                self.chunks += 1;
                self.buffer.extend_from_slice(&data);
            }
            true
        }

        /// The next event: (type, apiVersion, kind, message).
        async fn next(&mut self) -> (String, String, String, Vec<u8>) {
            assert!(self.fill().await, "the watch ended");
            let (event, taken) = wire::frame(&self.buffer).expect("a whole frame");
            let next = (
                event.event_type.to_owned(),
                event.api_version.to_owned(),
                event.kind.to_owned(),
                event.message.to_vec(),
            );
            self.buffer.drain(..taken);
            next
        }

        /// Whether the body ends with no more bytes.
        async fn ends(&mut self) -> bool {
            !self.fill().await && self.buffer.is_empty()
        }
    }

    fn name_of(message: &[u8]) -> String {
        wire::text(wire::one(message, 1), 1).to_owned()
    }

    #[tokio::test]
    async fn a_streaming_list_accepting_protobuf_is_answered_in_frames() {
        let api = FakeApiServer::start().await;
        let names: Vec<String> = (0..20).map(|i| format!("svc-{i:02}")).collect();
        for name in &names {
            api.apply(Kind::Service, service(name, 80));
        }
        let accept = format!("{}, application/json", protobuf::CONTENT_TYPE);
        let mut watch = Watch::open(&api, STREAMING_LIST, &accept).await;
        assert_eq!(watch.content_type, protobuf::WATCH_CONTENT_TYPE);
        assert_eq!(api.protobuf_watches(Kind::Service), 1);
        assert_eq!(api.protobuf_watches(Kind::EndpointSlice), 0);
        for name in &names {
            let (event_type, api_version, kind, message) = watch.next().await;
            assert_eq!((event_type.as_str(), api_version.as_str()), ("ADDED", "v1"));
            assert_eq!(kind, "Service");
            assert_eq!(&name_of(&message), name);
        }
        let (event_type, _, kind, message) = watch.next().await;
        assert_eq!(
            (event_type.as_str(), kind.as_str()),
            ("BOOKMARK", "Service")
        );
        let meta = wire::one(&message, 1);
        let rv = api.lock().resource_version.to_string();
        assert_eq!(wire::text(meta, 6), rv);
        assert_eq!(
            wire::annotations(meta),
            vec![(protobuf::INITIAL_EVENTS_END, "true")]
        );
        // The initial events came in pieces of the writer's buffer, frames split across
        // them, and reassembled whole.
        let pieces = (watch.received as usize).div_ceil(super::BUFFERED_WRITE);
        assert!(pieces > 1);
        assert!(watch.chunks > 1 && watch.chunks <= pieces);
        assert!(watch.buffer.is_empty());

        api.apply(Kind::Service, service("svc-00", 81));
        let (event_type, _, _, message) = watch.next().await;
        assert_eq!(event_type, "MODIFIED");
        assert_eq!(name_of(&message), "svc-00");
        let port = wire::one(wire::one(&message, 2), 1);
        assert_eq!(wire::number(port, 3), 81);
        // The object encoded for the watch is the one a list serves.
        assert_eq!(
            api.lock().encoded[&(Kind::Service, "default/svc-00".to_owned())],
            message
        );
        api.apply(Kind::Service, service("new", 80));
        let (event_type, _, _, message) = watch.next().await;
        assert_eq!(
            (event_type.as_str(), name_of(&message).as_str()),
            ("ADDED", "new")
        );
        api.delete(Kind::Service, "default", "svc-01");
        let (event_type, _, _, message) = watch.next().await;
        assert_eq!(event_type, "DELETED");
        assert_eq!(name_of(&message), "svc-01");
        assert_eq!(api.bytes_served(Kind::Service), watch.received);

        api.expire_watches();
        let (event_type, api_version, kind, message) = watch.next().await;
        assert_eq!(
            (event_type.as_str(), api_version.as_str(), kind.as_str()),
            ("ERROR", "v1", "Status")
        );
        assert_eq!(wire::number(&message, 6), 410);
        assert_eq!(wire::text(&message, 4), "Expired");
        assert!(watch.ends().await);
    }

    /// The initial events of a streaming list until its bookmark: (name, first port) of each
    /// object, and the bookmark's resourceVersion.
    async fn initial_events(watch: &mut Watch) -> (Vec<(String, u64)>, String) {
        let mut objects = Vec::new();
        loop {
            let (event_type, _, _, message) = watch.next().await;
            if event_type == "BOOKMARK" {
                return (objects, wire::text(wire::one(&message, 1), 6).to_owned());
            }
            assert_eq!(event_type, "ADDED");
            let port = wire::number(wire::one(wire::one(&message, 2), 1), 3);
            objects.push((name_of(&message), port));
        }
    }

    #[tokio::test]
    async fn a_streaming_list_asked_again_serves_what_is_stored_now() {
        let api = FakeApiServer::start().await;
        for name in ["a", "b", "c"] {
            api.apply(Kind::Service, service(name, 80));
        }
        let rv = api.lock().resource_version.to_string();
        let at_80 = |names: &[&str]| -> Vec<(String, u64)> {
            names.iter().map(|n| ((*n).to_owned(), 80)).collect()
        };
        let first =
            initial_events(&mut Watch::open(&api, STREAMING_LIST, protobuf::CONTENT_TYPE).await)
                .await;
        assert_eq!(first, (at_80(&["a", "b", "c"]), rv.clone()));
        // Again, unchanged: the same events; another selector gets its own.
        let again =
            initial_events(&mut Watch::open(&api, STREAMING_LIST, protobuf::CONTENT_TYPE).await)
                .await;
        assert_eq!(again, first);
        let one_name = format!("{STREAMING_LIST}&fieldSelector=metadata.name%3Db");
        let b =
            initial_events(&mut Watch::open(&api, &one_name, protobuf::CONTENT_TYPE).await).await;
        assert_eq!(b, (at_80(&["b"]), rv));
        // A change, a deletion, an unreadable encoding: each shows in the next list.
        api.apply(Kind::Service, service("b", 81));
        let changed =
            initial_events(&mut Watch::open(&api, STREAMING_LIST, protobuf::CONTENT_TYPE).await)
                .await;
        let rv = api.lock().resource_version.to_string();
        assert_eq!(
            changed,
            (
                vec![
                    ("a".to_owned(), 80),
                    ("b".to_owned(), 81),
                    ("c".to_owned(), 80)
                ],
                rv
            )
        );
        api.delete(Kind::Service, "default", "a");
        let deleted =
            initial_events(&mut Watch::open(&api, STREAMING_LIST, protobuf::CONTENT_TYPE).await)
                .await;
        assert_eq!(deleted.0, vec![("b".to_owned(), 81), ("c".to_owned(), 80)]);
        api.corrupt_protobuf(Kind::Service, "default", "c");
        let mut corrupt = Watch::open(&api, STREAMING_LIST, protobuf::CONTENT_TYPE).await;
        let _ = corrupt.next().await;
        let (_, _, _, message) = corrupt.next().await;
        assert_eq!(message, vec![0x0a, 0x7f]);
    }

    #[tokio::test]
    async fn a_plain_watch_accepting_protobuf_replays_in_frames_and_json_stays_json() {
        let api = FakeApiServer::start().await;
        api.apply(Kind::Service, service("a", 80));
        let since = api.lock().resource_version;
        api.apply(Kind::Service, service("b", 80));
        api.apply(Kind::Service, service("a", 81));
        let path = format!("/api/v1/services?watch=1&resourceVersion={since}");
        let mut watch = Watch::open(&api, &path, protobuf::CONTENT_TYPE).await;
        assert_eq!(watch.content_type, protobuf::WATCH_CONTENT_TYPE);
        let (event_type, _, _, message) = watch.next().await;
        assert_eq!(
            (event_type.as_str(), name_of(&message).as_str()),
            ("ADDED", "b")
        );
        let (event_type, _, _, message) = watch.next().await;
        assert_eq!(
            (event_type.as_str(), name_of(&message).as_str()),
            ("MODIFIED", "a")
        );

        // The same watch in JSON, and a Node watch that asks for protobuf, are JSON lines.
        let mut json_watch = Watch::open(&api, &path, "application/json").await;
        assert_eq!(json_watch.content_type, "application/json");
        let chunk = json_watch
            .body
            .frame()
            .await
            .expect("a chunk")
            .expect("body");
        let data = chunk.into_data().expect("data");
        let line = data.split(|b| *b == b'\n').next().expect("a line");
        let first: Value = serde_json::from_slice(line).expect("a JSON event");
        assert_eq!(first["type"], "ADDED");
        let node_watch = Watch::open(&api, "/api/v1/nodes?watch=1", protobuf::CONTENT_TYPE).await;
        assert_eq!(node_watch.content_type, "application/json");
        assert_eq!(api.protobuf_watches(Kind::Service), 1);
        assert_eq!(api.protobuf_watches(Kind::Node), 0);

        // Too old: one ERROR frame, then the end.
        api.expire_watches();
        let mut gone = Watch::open(&api, &path, protobuf::CONTENT_TYPE).await;
        let (event_type, _, kind, message) = gone.next().await;
        assert_eq!((event_type.as_str(), kind.as_str()), ("ERROR", "Status"));
        assert_eq!(wire::number(&message, 6), 410);
        assert!(gone.ends().await);
        assert_eq!(api.protobuf_watches(Kind::Service), 2);
    }

    #[tokio::test]
    async fn an_ignored_streaming_list_is_a_plain_watch_in_frames() {
        let api = FakeApiServer::start().await;
        api.ignore_streaming_lists();
        let mut watch = Watch::open(&api, STREAMING_LIST, protobuf::CONTENT_TYPE).await;
        assert_eq!(watch.content_type, protobuf::WATCH_CONTENT_TYPE);
        api.apply(Kind::Service, service("a", 80));
        let (event_type, _, _, message) = watch.next().await;
        assert_eq!(
            (event_type.as_str(), name_of(&message).as_str()),
            ("ADDED", "a")
        );
    }
}
