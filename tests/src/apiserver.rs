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
//! answer is JSON, whole.

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
    /// protobuf list that serves them (and dropped when they change).
    encoded: BTreeMap<(Kind, String), Vec<u8>>,
    /// (kind, resourceVersion, event) for watch replay.
    log: Vec<(Kind, u64, Value)>,
    watchers: Vec<(Kind, Query, mpsc::UnboundedSender<Bytes>)>,
    /// During an outage, what every request gets: (status, reason, message).
    outage: Option<(u16, &'static str, &'static str)>,
    refuse_streaming_lists: bool,
    ignore_streaming_lists: bool,
    /// Bytes of response bodies sent, by kind.
    bytes_served: BTreeMap<Kind, u64>,
    /// List pages served in protobuf, by kind.
    protobuf_pages: BTreeMap<Kind, usize>,
    requests: Vec<String>,
    /// Watches from a resourceVersion older than this get 410 Gone.
    compacted_at: u64,
}

impl State {
    /// Stores `obj` (and its JSON text) under `key`; its protobuf encoding, if any, is stale.
    fn store(&mut self, key: (Kind, String), obj: Value) {
        self.encoded.remove(&key);
        let text = obj.to_string();
        self.objects.insert(key, (obj, text));
    }

    /// Removes the object under `key` with its encodings; returns it.
    fn forget(&mut self, key: &(Kind, String)) -> Option<Value> {
        self.encoded.remove(key);
        self.objects.remove(key).map(|(obj, _)| obj)
    }
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
        for (_, _, tx) in st.watchers.drain(..) {
            let _ = tx.send(Bytes::from(format!("{gone}\n")));
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

    /// List pages served in protobuf so far for `kind`.
    pub fn protobuf_pages(&self, kind: Kind) -> usize {
        self.lock().protobuf_pages.get(&kind).copied().unwrap_or(0)
    }

    /// Bytes of response bodies sent so far for `kind`: list responses and watch event lines.
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
            .filter(|(k, _, tx)| *k == kind && !tx.is_closed())
            .count()
    }
}

fn notify(st: &mut State, kind: Kind, rv: u64, event: Value) {
    st.log.push((kind, rv, event.clone()));
    let line = Bytes::from(format!("{event}\n"));
    let mut sent = 0;
    st.watchers.retain(|(k, q, tx)| {
        if *k != kind || !q.matches(&event["object"]) && event["type"] != "DELETED" {
            return !tx.is_closed();
        }
        sent += line.len() as u64;
        tx.send(line.clone()).is_ok()
    });
    *st.bytes_served.entry(kind).or_default() += sent;
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
        let sent = send_buffered(&tx, initial);
        *st.bytes_served.entry(kind).or_default() += sent;
        st.watchers.push((kind, q, tx));
        return event_stream(rx);
    }
    let since = q.resource_version.unwrap_or(0);
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
        st.watchers.push((kind, q, tx));
    }
    event_stream(rx)
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
            let obj = &st.objects[key].0;
            let encoded = match key.0 {
                Kind::Service => protobuf::service(obj),
                Kind::EndpointSlice => protobuf::endpoint_slice(obj),
                other => panic!("the double encodes no {other:?} in protobuf"),
            };
            st.encoded.insert(key.clone(), encoded);
        }
    }
}

/// Sends `events` (lines) that were queued at once as the API server's writer would: in
/// pieces of [`BUFFERED_WRITE`] bytes, a line split across two pieces wherever the buffer
/// filled. Returns the bytes sent.
fn send_buffered(tx: &mpsc::UnboundedSender<Bytes>, events: String) -> u64 {
    let events = Bytes::from(events);
    for start in (0..events.len()).step_by(BUFFERED_WRITE) {
        let end = (start + BUFFERED_WRITE).min(events.len());
        let _ = tx.send(events.slice(start..end));
    }
    events.len() as u64
}

fn event_stream(rx: mpsc::UnboundedReceiver<Bytes>) -> hyper::Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    let mut resp = hyper::Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}
