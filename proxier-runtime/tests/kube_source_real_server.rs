//! The Kubernetes source against a real API server (k8s.io/apiserver on etcd, from
//! `ipvs_proxier_tests::realapi`): what it asks for (resourceVersions, User-Agent, as the
//! server logged each request), how it reads the server's errors in the encoding the server
//! chose, that every list mode reaches the same picture and follows the same changes, the
//! fallback to paginated lists on a server without WatchList, and the relist after a 410 Gone
//! (after a restart, and after a compaction) coming at once. Each test starts a server of its
//! own and prints `SKIP` where there is none (outside CI).
//!
//! The faults a real server cannot make (torn responses, hung connections, a server ignoring
//! `sendInitialEvents`) are tested against the double, in `parts/kube_source.rs`.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipvs_proxier_tests::RealApiServer;
use ipvs_proxier_tests::realapi::LoggedRequest;
use proxier_runtime::source::api_client::user_agent;
use proxier_runtime::source::kube::{KubeSourceConfig, ListMode, client, spawn};
use proxier_runtime::source::{SourceBatch, SourceHandle, describe};
use serde_json::{Value, json};

const SERVICES: &str = "/api/v1/namespaces/default/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";
const NODES: &str = "/api/v1/nodes";
const NAMESPACES: &str = "/api/v1/namespaces";

const ALL_MODES: [ListMode; 4] = [
    ListMode::Paginated,
    ListMode::Streaming,
    ListMode::Protobuf,
    ListMode::ProtobufStreaming,
];

fn service(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "annotations": {"note": "not read"}},
           "spec": {"clusterIP": ip, "selector": {"app": name},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                              {"name": "dns", "port": 53, "protocol": "UDP"}]}})
}

fn slice(name: &str, service: &str, ips: &[&str]) -> Value {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| {
            json!({"addresses": [ip], "conditions": {"ready": true, "serving": true},
                   "nodeName": "node-a", "zone": "z1",
                   "targetRef": {"kind": "Pod", "namespace": "default", "name": format!("pod-{ip}")}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
           "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
           "endpoints": endpoints,
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                     {"name": "dns", "port": 53, "protocol": "UDP"}]})
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"zone": "z1"}},
           "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}})
}

/// A Node, a Service and its EndpointSlice.
fn populate(api: &RealApiServer) {
    api.create(NODES, &node("node-a"));
    api.create(SERVICES, &service("web", "10.96.0.10"));
    api.create(
        SLICES,
        &slice("web-1", "web", &["10.244.0.1", "10.244.0.2"]),
    );
}

/// Writes two objects no source watches: etcd's revision moves past what the sources have
/// seen, and no watch of theirs hears of it. Two, so that a compaction to the revision reached
/// removes the revision after the sources' last one too (a watch starting at the compacted
/// revision itself is served).
fn move_past_the_sources(api: &RealApiServer, name: &str) {
    for n in 1..=2 {
        api.create(
            NAMESPACES,
            &json!({"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": format!("{name}-{n}")}}),
        );
    }
}

async fn start(api: &RealApiServer, list_mode: ListMode) -> Running {
    start_with(&api.kubeconfig(), list_mode).await
}

async fn start_with(kubeconfig: &std::path::Path, list_mode: ListMode) -> Running {
    let client = client(Some(kubeconfig), None)
        .await
        .expect("a client for the real server");
    Running(spawn(
        client,
        KubeSourceConfig {
            list_mode,
            ..KubeSourceConfig::new("node-a")
        },
    ))
}

/// A source stopped when dropped: its watches do not hold up the server's shutdown.
struct Running(SourceHandle);

impl std::ops::Deref for Running {
    type Target = SourceHandle;
    fn deref(&self) -> &SourceHandle {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut SourceHandle {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.task.abort();
    }
}

async fn next_batch(source: &mut SourceHandle) -> SourceBatch {
    tokio::time::timeout(Duration::from_secs(20), source.events.recv())
        .await
        .expect("a batch within 20 s")
        .expect("the source still running")
}

/// Every change of `batch`, whole, sorted: what the engine would be told.
fn contents(batch: &SourceBatch) -> Vec<String> {
    let mut changes: Vec<String> = batch.changes.iter().map(|c| format!("{c:?}")).collect();
    changes.sort();
    changes
}

fn described(batch: &SourceBatch) -> Vec<String> {
    batch.changes.iter().map(describe).collect()
}

/// Batches until one has a change whose description contains `wanted`, within `limit`.
async fn batch_with(source: &mut SourceHandle, wanted: &str, limit: Duration) -> SourceBatch {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let batch = tokio::time::timeout_at(deadline, source.events.recv())
            .await
            .unwrap_or_else(|_| panic!("no change with {wanted:?} within {limit:?}"))
            .expect("the source still running");
        if described(&batch).iter().any(|c| c.contains(wanted)) {
            return batch;
        }
    }
}

/// The requests for `path` (a collection) logged after the first `skip`.
fn requests_for(api: &RealApiServer, path: &str, skip: usize) -> Vec<LoggedRequest> {
    api.requests()
        .into_iter()
        .skip(skip)
        .filter(|r| r.path() == path || r.path().ends_with(path))
        .collect()
}

/// The requests for `path` logged after the first `skip`, once `enough` says they are,
/// waiting up to `limit` for it.
async fn requests_until(
    api: &RealApiServer,
    path: &str,
    skip: usize,
    enough: impl Fn(&[LoggedRequest]) -> bool,
    limit: Duration,
) -> Vec<LoggedRequest> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let requests = requests_for(api, path, skip);
        if enough(&requests) {
            return requests;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path}: not the requests expected within {limit:?}: {requests:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the source logs, captured for one test: the test's runtime runs every task on the
/// test's thread, where the subscriber is the default.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The first line with every one of `parts`, waiting up to `limit` for it.
    async fn line_with(&self, parts: &[&str], limit: Duration) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(line) = self
                .text()
                .lines()
                .find(|line| parts.iter().all(|p| line.contains(p)))
            {
                return line.to_owned();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {parts:?} within {limit:?}:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut logs) = self.0.lock() {
            logs.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn an_error_the_server_answers_in_protobuf_is_read_as_its_status() {
    let Some(api) = RealApiServer::start(&[]) else {
        return;
    };
    let (logs, _guard) = Logs::capture();
    let bad_token = api.kubeconfig_with_token("not-the-token");
    // Streaming lists (a watch asking for protobuf) and paginated lists (a list asking for
    // protobuf): the server answers both with a protobuf Status.
    for mode in [ListMode::ProtobufStreaming, ListMode::Protobuf] {
        let source = start_with(&bad_token, mode).await;
        let line = logs
            .line_with(&["watch failed", "Service"], Duration::from_secs(20))
            .await;
        drop(source);
        assert!(
            line.contains("401 Unauthorized: Unauthorized"),
            "{mode:?}: the Status's code, reason and message: {line}"
        );
        assert!(
            !line.contains("Failed to parse") && !line.contains("k8s\\0"),
            "{mode:?}: {line}"
        );
        *logs.0.lock().expect("logs") = Vec::new();
    }
}

#[tokio::test]
async fn streaming_lists_ask_for_a_consistent_picture_and_so_does_the_relist_after_a_410() {
    // Without the watch cache, a watch from a compacted resourceVersion is answered 410 Gone.
    let Some(api) = RealApiServer::start(&["--watch-cache=false"]) else {
        return;
    };
    populate(&api);
    let mut source = start(&api, ListMode::ProtobufStreaming).await;
    let first = next_batch(&mut source).await;
    assert!(described(&first).contains(&"service upsert default/web".to_owned()));
    let listed = api.requests().len();

    move_past_the_sources(&api, "elsewhere");
    api.compact();
    api.close_watches();
    api.create(SERVICES, &service("after", "10.96.0.11"));
    batch_with(&mut source, "default/after", Duration::from_secs(10)).await;

    for path in [
        "/api/v1/services",
        "/apis/discovery.k8s.io/v1/endpointslices",
        NODES,
    ] {
        // Each kind relists on its own: the Services' being done says nothing of the others.
        let relisted = |requests: &[LoggedRequest]| {
            requests.iter().filter(|r| r.is_streaming_list()).count() >= 2
        };
        let streaming: Vec<LoggedRequest> =
            requests_until(&api, path, 0, relisted, Duration::from_secs(10))
                .await
                .into_iter()
                .filter(LoggedRequest::is_streaming_list)
                .collect();
        for request in &streaming {
            // client-go's reflector: a streaming list asks for "" (a consistent read) with
            // NotOlderThan, and after a 410 it never asks for an older picture than that.
            assert_eq!(
                (
                    request.query("resourceVersion"),
                    request.query("resourceVersionMatch")
                ),
                (Some(""), Some("NotOlderThan")),
                "{path}: {}",
                request.uri
            );
        }
        let relists = requests_for(&api, path, listed)
            .into_iter()
            .filter(LoggedRequest::is_streaming_list)
            .count();
        assert!(relists >= 1, "{path}: no relist after the 410");
    }
}

#[tokio::test]
async fn every_request_carries_the_proxiers_user_agent() {
    let Some(api) = RealApiServer::start(&[]) else {
        return;
    };
    populate(&api);
    for mode in [ListMode::ProtobufStreaming, ListMode::Paginated] {
        let mut source = start(&api, mode).await;
        next_batch(&mut source).await;
        drop(source);
    }
    let version = env!("CARGO_PKG_VERSION");
    let requests: Vec<LoggedRequest> = api
        .requests()
        .into_iter()
        .filter(|r| matches!(r.verb.as_str(), "list" | "watch"))
        .collect();
    assert!(requests.len() >= 6, "{requests:#?}");
    for request in &requests {
        let agent = &request.user_agent;
        assert_eq!(agent, &user_agent(), "{}", request.uri);
        assert!(
            agent.starts_with(&format!("ipvs-proxier/v{version} (linux/")),
            "{agent:?} for {}",
            request.uri
        );
        if cfg!(target_arch = "x86_64") {
            assert!(
                agent.ends_with("(linux/amd64)"),
                "Go's name of the arch: {agent:?}"
            );
        }
    }
}

#[tokio::test]
async fn the_relist_after_a_410_comes_at_once_whatever_backoff_an_outage_left() {
    let Some(mut api) = RealApiServer::start(&[]) else {
        return;
    };
    populate(&api);
    let mut source = start(&api, ListMode::ProtobufStreaming).await;
    next_batch(&mut source).await;

    // The restarted server's watch cache begins past every resourceVersion the source saw:
    // its re-watch is answered 410 Gone. The outage before it leaves the watch backing off
    // from a few connection errors.
    move_past_the_sources(&api, "elsewhere");
    api.stop();
    let restarted = api.requests().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    api.start_again();
    api.create(SERVICES, &service("after", "10.96.0.11"));
    batch_with(&mut source, "default/after", Duration::from_secs(30)).await;

    let requests = requests_for(&api, "/api/v1/services", restarted);
    let rewatch = requests
        .iter()
        .position(|r| r.verb == "watch" && !r.is_streaming_list())
        .unwrap_or_else(|| panic!("no re-watch after the restart: {requests:#?}"));
    let relist = requests[rewatch..]
        .iter()
        .find(|r| r.is_streaming_list())
        .unwrap_or_else(|| panic!("no relist after the re-watch: {requests:#?}"));
    let waited = relist.at.saturating_sub(requests[rewatch].at);
    assert!(
        waited < Duration::from_secs(1),
        "the relist came {waited:?} after the re-watch that got 410: {requests:#?}"
    );
}

#[tokio::test]
async fn a_watch_cut_mid_stream_resumes_from_its_last_version_without_a_relist() {
    let Some(api) = RealApiServer::start(&[]) else {
        return;
    };
    populate(&api);
    for mode in [ListMode::ProtobufStreaming, ListMode::Paginated] {
        let mut source = start(&api, mode).await;
        next_batch(&mut source).await;
        let before_cut = api.requests().len();

        // The server ends every watch cleanly (as a load balancer or its timeout would); a
        // change made after it must still arrive, through a watch that resumes from the
        // source's last resourceVersion rather than a list of everything.
        assert!(
            api.close_watches() >= 3,
            "{mode:?}: the source's watches were open"
        );
        let name = format!(
            "after-{}",
            if mode == ListMode::Paginated {
                "pages"
            } else {
                "stream"
            }
        );
        api.create(SERVICES, &service(&name, "10.96.0.11"));
        batch_with(
            &mut source,
            &format!("default/{name}"),
            Duration::from_secs(20),
        )
        .await;

        let after: Vec<LoggedRequest> = requests_for(&api, "/api/v1/services", before_cut);
        let resumed = after
            .iter()
            .find(|r| r.verb == "watch" && !r.is_streaming_list())
            .unwrap_or_else(|| panic!("{mode:?}: no re-watch after the cut: {after:#?}"));
        let version = resumed.query("resourceVersion").unwrap_or_default();
        assert!(
            !version.is_empty() && version != "0",
            "{mode:?}: the re-watch resumes from a version it saw: {}",
            resumed.uri
        );
        assert!(
            !after
                .iter()
                .any(|r| r.verb == "list" || r.is_streaming_list()),
            "{mode:?}: a clean end of a watch needs no relist: {after:#?}"
        );
        drop(source);
        api.delete(&format!("{SERVICES}/{name}"));
    }
}

#[tokio::test]
async fn every_list_mode_reaches_the_same_picture_and_follows_the_same_changes() {
    let Some(api) = RealApiServer::start(&[]) else {
        return;
    };
    populate(&api);
    api.create(SERVICES, &service("db", "10.96.0.20"));
    api.create(SLICES, &slice("db-1", "db", &["10.244.1.1"]));
    let mut sources = Vec::new();
    for mode in ALL_MODES {
        sources.push((mode, start(&api, mode).await));
    }
    // The first batch holds the Services and EndpointSlices; the Node may come with it or
    // after it.
    let picture = [
        "node update node-a",
        "service upsert default/db",
        "service upsert default/web",
        "slice upsert default/db-1",
        "slice upsert default/web-1",
    ];
    let mut firsts = Vec::new();
    for (mode, source) in &mut sources {
        firsts.push((*mode, changes_until(source, &picture).await));
    }
    for (mode, first) in &firsts[1..] {
        assert_eq!(first, &firsts[0].1, "{mode:?} against {:?}", firsts[0].0);
    }

    // A change of each kind; each source sees it as the others do.
    api.merge_patch(
        &format!("{SLICES}/web-1"),
        &slice("web-1", "web", &["10.244.0.2", "10.244.0.3"]),
    );
    api.delete(&format!("{SERVICES}/db"));
    api.merge_patch(
        &format!("{NODES}/node-a"),
        &json!({"metadata": {"labels": {"zone": "z2"}}}),
    );
    let changes = [
        "node update node-a",
        "service delete default/db",
        "slice upsert default/web-1",
    ];
    let mut seen = Vec::new();
    for (mode, source) in &mut sources {
        seen.push((*mode, changes_until(source, &changes).await));
    }
    for (mode, changes) in &seen[1..] {
        assert_eq!(changes, &seen[0].1, "{mode:?} against {:?}", seen[0].0);
    }
    let web = seen[0].1.iter().find(|c| c.contains("web-1"));
    assert!(
        web.is_some_and(|c| c.contains("10.244.0.3") && !c.contains("10.244.0.1")),
        "{web:?}"
    );
}

/// The changes of the batches `source` sends until their descriptions are `wanted` (sorted),
/// each whole ([`contents`]), sorted.
async fn changes_until(source: &mut SourceHandle, wanted: &[&str]) -> Vec<String> {
    let (mut names, mut changes) = (Vec::new(), Vec::new());
    while names.len() < wanted.len() {
        let batch = next_batch(source).await;
        names.extend(described(&batch));
        changes.extend(contents(&batch));
    }
    names.sort();
    assert_eq!(names, wanted);
    changes.sort();
    changes
}

#[tokio::test]
async fn a_server_without_watch_list_is_listed_in_pages_in_every_mode() {
    let Some(api) = RealApiServer::start(&["--feature-gates=WatchList=false"]) else {
        return;
    };
    populate(&api);
    for mode in [ListMode::ProtobufStreaming, ListMode::Streaming] {
        let skip = api.requests().len();
        let mut source = start(&api, mode).await;
        let first = described(&next_batch(&mut source).await);
        assert!(
            first.contains(&"service upsert default/web".to_owned()),
            "{mode:?}: {first:?}"
        );
        api.merge_patch(
            &format!("{SLICES}/web-1"),
            &json!({"metadata": {"annotations": {"touched": format!("{mode:?}")}},
                    "endpoints": [{"addresses": ["10.244.0.9"], "conditions": {"ready": true},
                                   "nodeName": "node-a"}]}),
        );
        batch_with(
            &mut source,
            "slice upsert default/web-1",
            Duration::from_secs(10),
        )
        .await;
        drop(source);
        for path in [
            "/api/v1/services",
            "/apis/discovery.k8s.io/v1/endpointslices",
        ] {
            let requests = requests_for(&api, path, skip);
            let verbs: Vec<(&str, bool)> = requests
                .iter()
                .map(|r| (r.verb.as_str(), r.is_streaming_list()))
                .collect();
            assert_eq!(
                verbs[..3],
                [("watch", true), ("list", false), ("watch", false)],
                "{mode:?} {path}: refused streaming list, list, watch: {requests:#?}"
            );
            assert_eq!(requests[1].query("limit"), Some("500"), "{mode:?} {path}");
        }
    }
}

#[tokio::test]
async fn a_410_after_a_compaction_relists_and_the_source_converges_at_once() {
    let Some(api) = RealApiServer::start(&["--watch-cache=false"]) else {
        return;
    };
    populate(&api);
    for mode in [
        ListMode::ProtobufStreaming,
        ListMode::Protobuf,
        ListMode::Paginated,
    ] {
        let mut source = start(&api, mode).await;
        next_batch(&mut source).await;
        let before = api.requests().len();
        move_past_the_sources(
            &api,
            &format!("elsewhere-{}", format!("{mode:?}").to_lowercase()),
        );
        api.compact();
        api.close_watches();
        api.merge_patch(
            &format!("{SLICES}/web-1"),
            &json!({"endpoints": [{"addresses": [format!("10.244.0.{}", before % 200)],
                                   "conditions": {"ready": true}, "nodeName": "node-a"}]}),
        );
        let started = std::time::Instant::now();
        let batch = batch_with(
            &mut source,
            "slice upsert default/web-1",
            Duration::from_secs(10),
        )
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{mode:?}: the change came {:?} after the compaction",
            started.elapsed()
        );
        assert!(
            !described(&batch).iter().any(|c| c.contains("delete")),
            "{mode:?}: the relist deleted nothing: {:?}",
            described(&batch)
        );
        let requests = requests_for(&api, "/apis/discovery.k8s.io/v1/endpointslices", before);
        assert!(
            requests
                .iter()
                .any(|r| r.verb == "list" || r.is_streaming_list()),
            "{mode:?}: no relist after the 410: {requests:#?}"
        );
        drop(source);
    }
}
