//! The Kubernetes source against an API server double on 127.0.0.1: kube-proxy's selectors
//! are sent, nothing is reported before Services and EndpointSlices have both listed, changes
//! become events, and watch expiry (410 Gone) and API outages never make it forget objects.
//! With streaming lists (the default) the source sees the same, and falls back to paginated
//! lists when the API server refuses them or ignores them (no end bookmark). With protobuf
//! lists, Services and EndpointSlices list in pages of protobuf, watches stay JSON, and the
//! picture and changes are those of JSON lists.

use std::time::Duration;

use ipvs_proxier_tests::apiserver::{FakeApiServer, Kind};
use proxier_core::Change;
use proxier_core::k8s::PROXIED_OBJECTS_SELECTOR;
use proxier_runtime::source::kube::{KubeSourceConfig, ListMode, client, spawn};
use proxier_runtime::source::{SourceBatch, SourceHandle, describe};
use serde_json::{Value, json};

fn service(ns: &str, name: &str, ip: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": ns, "labels": labels},
           "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

fn slice(ns: &str, name: &str, svc: &str, ip: &str, extra_labels: Value) -> Value {
    let mut labels = json!({"kubernetes.io/service-name": svc});
    if let (Some(l), Some(extra)) = (labels.as_object_mut(), extra_labels.as_object()) {
        l.extend(extra.clone());
    }
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
           "metadata": {"name": name, "namespace": ns, "labels": labels},
           "endpoints": [{"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-a"}],
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}})
}

async fn next_batch(source: &mut SourceHandle) -> SourceBatch {
    tokio::time::timeout(Duration::from_secs(20), source.events.recv())
        .await
        .expect("a batch within 20 s")
        .expect("source still running")
}

fn described(batch: &SourceBatch) -> Vec<String> {
    batch.changes.iter().map(describe).collect()
}

async fn no_batch_for(source: &mut SourceHandle, wait: Duration) {
    if let Ok(Some(batch)) = tokio::time::timeout(wait, source.events.recv()).await {
        panic!("unexpected batch {:?}", described(&batch));
    }
}

async fn start(api: &FakeApiServer) -> SourceHandle {
    start_with(api, ListMode::Paginated).await
}

async fn start_with(api: &FakeApiServer, list_mode: ListMode) -> SourceHandle {
    start_configured(
        api,
        KubeSourceConfig {
            list_mode,
            ..KubeSourceConfig::new("node-a")
        },
    )
    .await
}

async fn start_configured(api: &FakeApiServer, config: KubeSourceConfig) -> SourceHandle {
    let client = client(None, Some(&api.url()))
        .await
        .expect("client for the double");
    spawn(client, config)
}

async fn start_following_service_cidrs(api: &FakeApiServer) -> SourceHandle {
    start_configured(
        api,
        KubeSourceConfig {
            list_mode: ListMode::Paginated,
            service_cidrs: true,
            ..KubeSourceConfig::new("node-a")
        },
    )
    .await
}

fn service_cidr(name: &str, cidrs: &[&str]) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
           "metadata": {"name": name, "finalizers": ["networking.k8s.io/service-cidr-finalizer"]},
           "spec": {"cidrs": cidrs},
           "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "",
                                      "message": "", "lastTransitionTime": "2026-12-01T10:00:00Z"}]}})
}

#[tokio::test]
async fn a_stopped_source_leaves_no_watch_open() {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    let mut source = start(&api).await;
    next_batch(&mut source).await;
    // Each kind's watch runs on a task of its own; all of them are open once listed.
    for kind in [Kind::Service, Kind::EndpointSlice, Kind::Node] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while api.open_watches(kind) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no {kind:?} watch");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    source.task.abort();
    let _ = source.task.await;
    // Aborting the source's task stops its watches' tasks: the connections close.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for kind in [Kind::Service, Kind::EndpointSlice, Kind::Node] {
        while api.open_watches(kind) > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a {kind:?} watch is still open after the source stopped"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn service_cidrs_are_watched_only_when_asked_and_their_changes_sent() {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    api.apply(
        Kind::ServiceCidr,
        service_cidr("kubernetes", &["10.96.0.0/12", "fd00:96::/108"]),
    );

    // Not asked: never listed.
    let mut plain = start(&api).await;
    let first = described(&next_batch(&mut plain).await);
    assert!(
        !first.iter().any(|c| c.starts_with("ServiceCIDR")),
        "{first:?}"
    );
    assert!(
        !api.requests().iter().any(|r| r.contains("servicecidrs")),
        "{:?}",
        api.requests()
    );
    plain.task.abort();

    // Asked: the first picture holds the ServiceCIDRs already.
    let mut source = start_following_service_cidrs(&api).await;
    let first = next_batch(&mut source).await;
    let upsert = first
        .changes
        .iter()
        .find(|c| matches!(c, Change::UpsertServiceCidr(_)))
        .expect("the ServiceCIDR in the first batch");
    let Change::UpsertServiceCidr(object) = upsert else {
        unreachable!()
    };
    assert_eq!(object.name, "kubernetes");
    let cidrs: Vec<String> = object.cidrs.iter().map(ToString::to_string).collect();
    assert_eq!(cidrs, ["10.96.0.0/12", "fd00:96::/108"]);
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("/apis/networking.k8s.io/v1/servicecidrs?")),
        "{:?}",
        api.requests()
    );

    // Added at run time, being deleted (still an upsert), deleted.
    api.apply(Kind::ServiceCidr, service_cidr("extra", &["10.100.0.0/16"]));
    assert_eq!(
        described(&next_batch(&mut source).await),
        ["ServiceCIDR upsert extra"]
    );
    let mut deleting = service_cidr("extra", &["10.100.0.0/16"]);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-01T11:00:00Z");
    api.apply(Kind::ServiceCidr, deleting);
    assert_eq!(
        described(&next_batch(&mut source).await),
        ["ServiceCIDR upsert extra"]
    );
    api.delete(Kind::ServiceCidr, "", "extra");
    assert_eq!(
        described(&next_batch(&mut source).await),
        ["ServiceCIDR delete extra"]
    );

    // A malformed one is left out (its last accepted version stays with the engine).
    api.apply(
        Kind::ServiceCidr,
        service_cidr("kubernetes", &["10.96.0.0/33"]),
    );
    no_batch_for(&mut source, Duration::from_millis(500)).await;
}

#[tokio::test]
async fn initial_sync_uses_kube_proxy_selectors_and_sends_one_snapshot() {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    api.apply(
        Kind::Service,
        service(
            "shop",
            "legacy",
            "10.96.0.21",
            json!({"service.kubernetes.io/service-proxy-name": "other"}),
        ),
    );
    api.apply(
        Kind::EndpointSlice,
        slice("shop", "web-1", "web", "10.244.1.5", json!({})),
    );
    api.apply(
        Kind::EndpointSlice,
        slice(
            "shop",
            "db-1",
            "db",
            "10.244.1.6",
            json!({"service.kubernetes.io/headless": ""}),
        ),
    );
    api.apply(Kind::Node, node("node-a"));
    api.apply(Kind::Node, node("node-b"));

    let mut source = start(&api).await;
    let first = described(&next_batch(&mut source).await);
    assert!(
        *source.synced.borrow(),
        "synced is raised with the first batch"
    );
    let of_kind =
        |kind: &str| -> Vec<&String> { first.iter().filter(|c| c.starts_with(kind)).collect() };
    assert_eq!(of_kind("service "), ["service upsert shop/web"]);
    assert_eq!(of_kind("slice "), ["slice upsert shop/web-1"]);

    let requests = api.requests();
    let encoded_selector: String =
        form_urlencoded::byte_serialize(PROXIED_OBJECTS_SELECTOR.as_bytes()).collect();
    for path in [
        "/api/v1/services?",
        "/apis/discovery.k8s.io/v1/endpointslices?",
    ] {
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with(path)
                    && r.contains(&format!("labelSelector={encoded_selector}"))),
            "{path} must be listed with kube-proxy's selector; requests: {requests:?}"
        );
    }
    assert!(
        requests.iter().any(|r| r.starts_with("/api/v1/nodes?")
            && r.contains("fieldSelector=metadata.name%3Dnode-a")),
        "{requests:?}"
    );
    // The Node may arrive with the first batch or after it, and only this node.
    if of_kind("node ").is_empty() {
        assert_eq!(
            described(&next_batch(&mut source).await),
            ["node update node-a"]
        );
    } else {
        assert_eq!(of_kind("node "), ["node update node-a"]);
    }
}

/// Deletes Service `gone` and adds `shop/new` without telling the watches, then expires them
/// (410 Gone): only a relist reveals the two, and it reports just them.
async fn relist_reveals_silent_changes(api: &FakeApiServer, source: &mut SourceHandle, gone: &str) {
    api.delete_silently(Kind::Service, "shop", gone);
    api.apply_silently(
        Kind::Service,
        service("shop", "new", "10.96.0.22", json!({})),
    );
    api.expire_watches();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.extend(described(&next_batch(source).await));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            format!("service delete shop/{gone}"),
            "service upsert shop/new".to_owned()
        ]
    );
}

async fn synced_source(api: &FakeApiServer) -> SourceHandle {
    let mut source = start(api).await;
    next_batch(&mut source).await; // the first picture
    source
}

#[tokio::test]
async fn watch_changes_become_events() {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    let mut source = synced_source(&api).await;
    no_batch_for(&mut source, Duration::from_millis(300)).await; // let the watches start

    api.apply(
        Kind::EndpointSlice,
        slice("shop", "web-1", "web", "10.244.1.5", json!({})),
    );
    assert_eq!(
        described(&next_batch(&mut source).await),
        ["slice upsert shop/web-1"]
    );
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.30", json!({})),
    );
    match &next_batch(&mut source).await.changes[..] {
        [Change::UpsertService(s)] => {
            assert_eq!(
                s.cluster_ips,
                ["10.96.0.30".parse::<std::net::IpAddr>().expect("ip")]
            )
        }
        other => panic!("expected service upsert, got {other:?}"),
    }
    api.delete(Kind::Service, "shop", "web");
    assert_eq!(
        described(&next_batch(&mut source).await),
        ["service delete shop/web"]
    );
}

#[tokio::test]
async fn expired_watch_relists_and_reports_only_the_difference() {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "keep", "10.96.0.20", json!({})),
    );
    api.apply(
        Kind::Service,
        service("shop", "gone", "10.96.0.21", json!({})),
    );
    let mut source = synced_source(&api).await;
    no_batch_for(&mut source, Duration::from_millis(300)).await;

    // Changes the watch never saw, then 410 Gone: only a relist reveals them.
    relist_reveals_silent_changes(&api, &mut source, "gone").await;
    // "keep" did not change: no change for it.
    no_batch_for(&mut source, Duration::from_millis(500)).await;
}

#[tokio::test]
async fn api_outage_keeps_known_objects() {
    outage_keeps_known_objects(ListMode::Paginated).await;
}

#[tokio::test]
async fn api_outage_keeps_known_objects_with_protobuf_lists() {
    outage_keeps_known_objects(ListMode::Protobuf).await;
}

#[tokio::test]
async fn api_outage_keeps_known_objects_with_protobuf_streaming_lists() {
    outage_keeps_known_objects(ListMode::ProtobufStreaming).await;
}

/// An outage (watches end and fail to restart, 503), then failures whose watches expired
/// first (410 Gone, then 500 Internal Error, which kube's client does not retry: a relist
/// fails), in `mode`: nothing known is deleted, and a change after recovery arrives.
async fn outage_keeps_known_objects(mode: ListMode) {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    api.apply(
        Kind::EndpointSlice,
        slice("shop", "web-1", "web", "10.244.1.5", json!({})),
    );
    let mut source = start_with(&api, mode).await;
    next_batch(&mut source).await; // the first picture
    no_batch_for(&mut source, Duration::from_millis(300)).await;

    api.set_outage(true);
    // Failing relists and watches must not turn into deletions.
    no_batch_for(&mut source, Duration::from_secs(3)).await;
    api.set_outage(false);
    // Back, then expired and down again at once: the relist fails until the end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while api.open_watches(Kind::Service) == 0 || api.open_watches(Kind::EndpointSlice) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watches reopen after the outage"
        );
        no_batch_for(&mut source, Duration::from_millis(100)).await;
    }
    let before = api.requests().len();
    api.expire_watches();
    api.set_failing();
    // Failing until a relist of Services has failed (after the watcher's backoff).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // A relist: a list, or a watch asking for a streaming list.
    while !api.requests()[before..].iter().any(|r| {
        r.starts_with("/api/v1/services?")
            && (!r.contains("watch=true") || r.contains("sendInitialEvents=true"))
    }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a relist during the outage"
        );
        no_batch_for(&mut source, Duration::from_millis(100)).await;
    }
    no_batch_for(&mut source, Duration::from_millis(500)).await;
    api.set_outage(false);
    api.apply(
        Kind::Service,
        service("shop", "db", "10.96.0.40", json!({})),
    );
    // After recovery the new object arrives; the known ones were never deleted.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let batch = tokio::time::timeout_at(deadline, source.events.recv())
            .await
            .expect("recovery within 30 s")
            .expect("source running");
        let changes = described(&batch);
        assert!(
            !changes.iter().any(|c| c.contains(" delete ")),
            "outage must not lose objects: {changes:?}"
        );
        if changes.iter().any(|c| c == "service upsert shop/db") {
            break;
        }
    }
}

/// A double holding two Services (one another proxy's), two slices (one headless) and two
/// Nodes, as in the first test.
async fn populated_double() -> FakeApiServer {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    api.apply(
        Kind::Service,
        service(
            "shop",
            "legacy",
            "10.96.0.21",
            json!({"service.kubernetes.io/service-proxy-name": "other"}),
        ),
    );
    api.apply(
        Kind::EndpointSlice,
        slice("shop", "web-1", "web", "10.244.1.5", json!({})),
    );
    api.apply(
        Kind::EndpointSlice,
        slice(
            "shop",
            "db-1",
            "db",
            "10.244.1.6",
            json!({"service.kubernetes.io/headless": ""}),
        ),
    );
    api.apply(Kind::Node, node("node-a"));
    api.apply(Kind::Node, node("node-b"));
    api
}

/// The first picture, with this node's Node (which may come in the first batch or right
/// after it), as changes sorted by description.
async fn first_picture(source: &mut SourceHandle) -> Vec<(String, Change)> {
    let mut changes = next_batch(source).await.changes;
    if !changes.iter().any(|c| matches!(c, Change::UpsertNode(_))) {
        changes.extend(next_batch(source).await.changes);
    }
    let mut described: Vec<(String, Change)> =
        changes.into_iter().map(|c| (describe(&c), c)).collect();
    described.sort_by(|a, b| a.0.cmp(&b.0));
    described
}

/// Watch requests that asked for a streaming list, and plain list requests, of one path.
fn streaming_and_lists(api: &FakeApiServer, path: &str) -> (usize, usize) {
    let requests = api.requests();
    let of_path = requests.iter().filter(|r| r.starts_with(path));
    let streaming = of_path
        .clone()
        .filter(|r| r.contains("watch=true") && r.contains("sendInitialEvents=true"))
        .count();
    let lists = of_path.filter(|r| !r.contains("watch=true")).count();
    (streaming, lists)
}

const KIND_PATHS: [&str; 3] = [
    "/api/v1/services?",
    "/apis/discovery.k8s.io/v1/endpointslices?",
    "/api/v1/nodes?",
];

/// After the first picture: a slice added, a Service changed, a Service deleted, each
/// reported on its own.
async fn later_changes(api: &FakeApiServer, source: &mut SourceHandle) -> Vec<Vec<Change>> {
    no_batch_for(source, Duration::from_millis(300)).await; // let the watches start
    let mut seen = Vec::new();
    api.apply(
        Kind::EndpointSlice,
        slice("shop", "web-2", "web", "10.244.1.7", json!({})),
    );
    seen.push(next_batch(source).await.changes);
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.30", json!({})),
    );
    seen.push(next_batch(source).await.changes);
    api.delete(Kind::Service, "shop", "web");
    seen.push(next_batch(source).await.changes);
    seen
}

#[tokio::test]
async fn streaming_lists_give_the_same_picture_and_changes_as_paginated_lists() {
    let paginated_api = populated_double().await;
    let mut paginated = start_with(&paginated_api, ListMode::Paginated).await;
    let paginated_first = first_picture(&mut paginated).await;
    let paginated_later = later_changes(&paginated_api, &mut paginated).await;

    let streaming_api = populated_double().await;
    let mut streaming = start_with(&streaming_api, ListMode::Streaming).await;
    let streaming_first = first_picture(&mut streaming).await;
    assert!(*streaming.synced.borrow());
    let streaming_later = later_changes(&streaming_api, &mut streaming).await;

    let names: Vec<&str> = streaming_first.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(
        names,
        [
            "node update node-a",
            "service upsert shop/web",
            "slice upsert shop/web-1"
        ],
        "kube-proxy's selectors apply to streaming lists too"
    );
    assert_eq!(streaming_first, paginated_first);
    assert_eq!(streaming_later, paginated_later);

    for path in KIND_PATHS {
        assert_eq!(
            streaming_and_lists(&streaming_api, path),
            (1, 0),
            "{path}: one streaming list, no list call; {:?}",
            streaming_api.requests()
        );
        assert_eq!(streaming_and_lists(&paginated_api, path), (0, 1), "{path}");
    }
}

#[tokio::test]
async fn streaming_relist_after_expiry_reports_only_the_difference() {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "keep", "10.96.0.20", json!({})),
    );
    api.apply(
        Kind::Service,
        service("shop", "gone", "10.96.0.21", json!({})),
    );
    let mut source = start_with(&api, ListMode::Streaming).await;
    next_batch(&mut source).await;
    no_batch_for(&mut source, Duration::from_millis(300)).await;

    relist_reveals_silent_changes(&api, &mut source, "gone").await;
    no_batch_for(&mut source, Duration::from_millis(500)).await;
    let (streaming, lists) = streaming_and_lists(&api, "/api/v1/services?");
    assert_eq!((streaming, lists), (2, 0), "the relist streams too");
}

#[tokio::test]
async fn a_server_that_refuses_streaming_lists_gets_paginated_lists() {
    let api = populated_double().await;
    api.refuse_streaming_lists();
    let mut source = start_with(&api, ListMode::Streaming).await;
    let first = first_picture(&mut source).await;
    assert_listed_after_one_streaming_list(&api, &source, &first, "refused");
    // Later changes arrive over the plain watch; a relist after expiry lists, never asks
    // for a streaming list again.
    assert_stays_on_paginated_lists(&api, &mut source).await;
}

/// The first picture of `populated_double` after the source fell back from a streaming list
/// (`how`: what the server did with it) to one list of each kind.
fn assert_listed_after_one_streaming_list(
    api: &FakeApiServer,
    source: &SourceHandle,
    first: &[(String, Change)],
    how: &str,
) {
    let names: Vec<&str> = first.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(
        names,
        [
            "node update node-a",
            "service upsert shop/web",
            "slice upsert shop/web-1"
        ],
        "the first picture is one picture, whatever came before the fallback"
    );
    assert!(*source.synced.borrow());
    for path in KIND_PATHS {
        assert_eq!(
            streaming_and_lists(api, path),
            (1, 1),
            "{path}: {how} once, then listed; {:?}",
            api.requests()
        );
    }
}

/// After a fallback, changes arrive over the list's watch and a relist after expiry lists.
async fn assert_stays_on_paginated_lists(api: &FakeApiServer, source: &mut SourceHandle) {
    let later = later_changes(api, source).await;
    assert_eq!(later.len(), 3);
    api.apply_silently(
        Kind::Service,
        service("shop", "new", "10.96.0.22", json!({})),
    );
    api.expire_watches();
    assert_eq!(
        described(&next_batch(source).await),
        ["service upsert shop/new"]
    );
    assert_eq!(streaming_and_lists(api, "/api/v1/services?"), (1, 2));
}

#[tokio::test]
async fn a_server_that_ignores_streaming_lists_gets_paginated_lists_after_the_silence() {
    let api = ignored_streaming_list(ListMode::Streaming).await;
    assert_eq!(api.protobuf_pages(Kind::Service), 0);
    assert_eq!(
        KubeSourceConfig::new("node-a").list_mode,
        ListMode::ProtobufStreaming,
        "streaming lists in protobuf are the default, as kube-proxy's"
    );
}

/// A source in `mode` on a double that ignores streaming lists: its first picture waits for
/// the silence, is one picture (the plain watch's events and the list's are not two), and
/// the source stays on paginated lists. Returns the double.
async fn ignored_streaming_list(mode: ListMode) -> FakeApiServer {
    let api = populated_double().await;
    api.ignore_streaming_lists();
    let silence = Duration::from_millis(400);
    let started = std::time::Instant::now();
    let mut source = start_configured(
        &api,
        KubeSourceConfig {
            list_mode: mode,
            initial_events_silence: silence,
            ..KubeSourceConfig::new("node-a")
        },
    )
    .await;
    let first = first_picture(&mut source).await;
    assert!(
        started.elapsed() >= silence,
        "the picture waited for the silence: {:?}",
        started.elapsed()
    );
    assert_listed_after_one_streaming_list(&api, &source, &first, "ignored");
    assert_stays_on_paginated_lists(&api, &mut source).await;
    api
}

/// A Service and a slice with every field a conversion reads set (load-balancer ingress with
/// an IP mode, affinity timeout, external IPs, source ranges, health-check port, traffic
/// policies, hints, zone, each condition, a read annotation), beside what is not read.
fn rich_objects(api: &FakeApiServer) {
    api.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "lb", "namespace": "shop", "uid": "u-1",
                            "creationTimestamp": "2026-01-01T00:00:00Z",
                            "labels": {"app": "lb"},
                            "annotations": {"ipvs.proxier.io/scheduler": "wrr", "other": "x"},
                            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                                 "uid": "u", "controller": true}],
                            "managedFields": [{"manager": "kubectl", "operation": "Apply",
                                               "time": "2026-01-01T00:00:00Z",
                                               "fieldsType": "FieldsV1",
                                               "fieldsV1": {"f:spec": {"f:ports": {}}}}]},
               "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.50",
                        "clusterIPs": ["10.96.0.50"], "ipFamilies": ["IPv4"],
                        "ipFamilyPolicy": "SingleStack", "selector": {"app": "lb"},
                        "externalIPs": ["192.0.2.80"],
                        "loadBalancerSourceRanges": ["198.51.100.0/24"],
                        "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster",
                        "healthCheckNodePort": 32000, "sessionAffinity": "ClientIP",
                        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                        "allocateLoadBalancerNodePorts": true,
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                                   "targetPort": "web", "nodePort": 30080, "appProtocol": "http"},
                                  {"name": "dns", "port": 53, "protocol": "UDP",
                                   "targetPort": 5353, "nodePort": 30053}]},
               "status": {"loadBalancer": {"ingress": [
                   {"ip": "203.0.113.7", "ipMode": "Proxy"},
                   {"ip": "203.0.113.8", "hostname": "lb.example",
                    "ports": [{"port": 80, "protocol": "TCP"}]}]},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "Up",
                                   "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
    );
    api.apply(
        Kind::EndpointSlice,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "addressType": "IPv4",
               "metadata": {"name": "lb-1", "namespace": "shop",
                            "labels": {"kubernetes.io/service-name": "lb",
                                       "endpointslice.kubernetes.io/managed-by": "controller"},
                            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time":
                                            "2026-01-01T00:00:01Z"}},
               "endpoints": [
                   {"addresses": ["10.244.1.5"],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": "node-a", "zone": "z1", "hostname": "h",
                    "targetRef": {"kind": "Pod", "namespace": "shop", "name": "p1", "uid": "u1"},
                    "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "node-a"}]}},
                   {"addresses": ["10.244.2.5"],
                    "conditions": {"ready": false, "serving": true, "terminating": true},
                    "nodeName": "node-b", "zone": "z2"},
                   {"addresses": ["10.244.3.5"], "nodeName": "node-c"}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"},
                         {"name": "dns", "port": 5353, "protocol": "UDP"}]}),
    );
}

#[tokio::test]
async fn protobuf_lists_give_the_same_picture_and_changes_as_json_lists() {
    let protobuf_api = same_picture_and_changes_as_json_lists(ListMode::Protobuf).await;
    assert_eq!(protobuf_api.protobuf_pages(Kind::Service), 1);
    assert_eq!(protobuf_api.protobuf_pages(Kind::EndpointSlice), 1);
    assert_eq!(
        streaming_and_lists(&protobuf_api, "/api/v1/nodes?"),
        (0, 1),
        "the Node lists paginated, in JSON"
    );
}

/// A source in `mode` (a protobuf one) and one with paginated JSON lists, each on a double
/// of [`rich_objects`]: the same first picture, through kube-proxy's selectors, and the same
/// later changes. Returns the double `mode` read.
async fn same_picture_and_changes_as_json_lists(mode: ListMode) -> FakeApiServer {
    let json_api = populated_double().await;
    rich_objects(&json_api);
    let mut json_source = start_with(&json_api, ListMode::Paginated).await;
    let json_first = first_picture(&mut json_source).await;
    let json_later = later_changes(&json_api, &mut json_source).await;
    assert_eq!(json_api.protobuf_pages(Kind::Service), 0);
    assert_eq!(json_api.protobuf_watches(Kind::Service), 0);

    let protobuf_api = populated_double().await;
    rich_objects(&protobuf_api);
    let mut protobuf_source = start_with(&protobuf_api, mode).await;
    let protobuf_first = first_picture(&mut protobuf_source).await;
    assert!(*protobuf_source.synced.borrow());
    let protobuf_later = later_changes(&protobuf_api, &mut protobuf_source).await;

    let names: Vec<&str> = protobuf_first.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(
        names,
        [
            "node update node-a",
            "service upsert shop/lb",
            "service upsert shop/web",
            "slice upsert shop/lb-1",
            "slice upsert shop/web-1"
        ],
        "{mode:?}: kube-proxy's selectors apply"
    );
    assert_eq!(protobuf_first, json_first, "{mode:?}");
    assert_eq!(protobuf_later, json_later, "{mode:?}");
    protobuf_api
}

/// A double holding 1,201 Services (`shop/svc-0000`...): more than two pages of 500.
async fn double_of_1201_services() -> FakeApiServer {
    let api = FakeApiServer::start().await;
    for i in 0..1201 {
        api.apply_silently(
            Kind::Service,
            service("shop", &format!("svc-{i:04}"), "10.96.0.20", json!({})),
        );
    }
    api
}

/// A change of [`double_of_1201_services`]'s first Service, through the watch, arrives as
/// the source's one next change.
async fn first_service_change_arrives_alone(api: &FakeApiServer, source: &mut SourceHandle) {
    api.apply(
        Kind::Service,
        service("shop", "svc-0000", "10.96.0.21", json!({})),
    );
    assert_eq!(
        described(&next_batch(source).await),
        ["service upsert shop/svc-0000"]
    );
}

/// How many of `batch`'s changes upsert one of [`double_of_1201_services`]'s Services.
fn service_upserts(batch: &SourceBatch) -> usize {
    described(batch)
        .iter()
        .filter(|c| c.starts_with("service upsert shop/svc-"))
        .count()
}

#[tokio::test]
async fn protobuf_lists_come_in_pages_and_relist_after_expiry() {
    let api = double_of_1201_services().await;
    let mut source = start_with(&api, ListMode::Protobuf).await;
    let upserts = service_upserts(&next_batch(&mut source).await);
    assert_eq!(upserts, 1201);
    assert_eq!(api.protobuf_pages(Kind::Service), 3, "pages of 500");
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("/api/v1/services?") && r.contains("continue=")),
        "{:?}",
        api.requests()
    );
    no_batch_for(&mut source, Duration::from_millis(300)).await;

    // A change the watch (JSON) carries.
    first_service_change_arrives_alone(&api, &mut source).await;
    // Changes the watch never saw, then 410 Gone: the protobuf relist reveals them.
    relist_reveals_silent_changes(&api, &mut source, "svc-0001").await;
    assert_eq!(
        api.protobuf_pages(Kind::Service),
        6,
        "the relist in protobuf too"
    );
    no_batch_for(&mut source, Duration::from_millis(500)).await;
}

#[tokio::test]
async fn protobuf_streaming_lists_give_the_same_picture_and_changes_as_json_lists() {
    let protobuf_api = same_picture_and_changes_as_json_lists(ListMode::ProtobufStreaming).await;
    for path in KIND_PATHS {
        assert_eq!(
            streaming_and_lists(&protobuf_api, path),
            (1, 0),
            "{path}: one streaming list, no list call; {:?}",
            protobuf_api.requests()
        );
    }
    // The picture and the changes after it came as protobuf frames, on one watch each.
    for kind in [Kind::Service, Kind::EndpointSlice] {
        assert_eq!(protobuf_api.protobuf_watches(kind), 1, "{kind:?}");
        assert_eq!(protobuf_api.protobuf_pages(kind), 0, "{kind:?}");
    }
    assert_eq!(
        protobuf_api.protobuf_watches(Kind::Node),
        0,
        "the Node streams in JSON"
    );
}

#[tokio::test]
async fn protobuf_streaming_lists_resume_and_relist_after_expiry_in_protobuf() {
    let api = double_of_1201_services().await;
    let mut source = start_with(&api, ListMode::ProtobufStreaming).await;
    let upserts = service_upserts(&next_batch(&mut source).await);
    assert_eq!(upserts, 1201, "every frame, whatever pieces they came in");
    no_batch_for(&mut source, Duration::from_millis(300)).await;

    // The watch ends (the double goes down and comes back): it resumes from the last
    // resourceVersion, and a change made meanwhile arrives, once.
    api.set_outage(true);
    no_batch_for(&mut source, Duration::from_millis(300)).await;
    api.set_outage(false);
    first_service_change_arrives_alone(&api, &mut source).await;
    let resumed = api
        .requests()
        .iter()
        .filter(|r| {
            r.starts_with("/api/v1/services?")
                && r.contains("watch=true")
                && !r.contains("sendInitialEvents")
        })
        .count();
    assert!(resumed >= 1, "a plain watch resumed: {:?}", api.requests());

    // Changes the watch never saw, then 410 Gone (an ERROR frame): the relist streams
    // again, in protobuf, and reveals only them.
    relist_reveals_silent_changes(&api, &mut source, "svc-0001").await;
    no_batch_for(&mut source, Duration::from_millis(500)).await;
    assert_eq!(
        streaming_and_lists(&api, "/api/v1/services?"),
        (2, 0),
        "the relist streams too"
    );
    assert!(api.protobuf_watches(Kind::Service) >= 3);
    assert_eq!(api.protobuf_pages(Kind::Service), 0);
}

#[tokio::test]
async fn a_server_that_refuses_protobuf_streaming_lists_gets_protobuf_pages() {
    let api = populated_double().await;
    api.refuse_streaming_lists();
    let mut source = start_with(&api, ListMode::ProtobufStreaming).await;
    let first = first_picture(&mut source).await;
    assert_listed_after_one_streaming_list(&api, &source, &first, "refused");
    assert_eq!(api.protobuf_pages(Kind::Service), 1);
    assert_eq!(api.protobuf_pages(Kind::EndpointSlice), 1);
    assert_stays_on_paginated_lists(&api, &mut source).await;
}

#[tokio::test]
async fn a_server_that_ignores_protobuf_streaming_lists_gets_protobuf_pages_after_the_silence() {
    let api = ignored_streaming_list(ListMode::ProtobufStreaming).await;
    assert_eq!(
        api.protobuf_pages(Kind::Service),
        2,
        "the list and the relist after expiry, in protobuf"
    );
}

#[tokio::test]
async fn an_unreadable_object_in_a_protobuf_list_starts_the_picture_over() {
    for mode in [ListMode::ProtobufStreaming, ListMode::Protobuf] {
        unreadable_object_starts_the_picture_over(mode).await;
    }
}

/// A source in `mode` on a double whose Service `shop/web` cannot be read in protobuf.
async fn unreadable_object_starts_the_picture_over(mode: ListMode) {
    let api = populated_double().await;
    api.corrupt_protobuf(Kind::Service, "shop", "web");
    let mut source = start_with(&api, mode).await;
    // No picture with a hole (it would delete what the object programs): nothing is handed
    // over while the object cannot be read, and the list starts over.
    no_batch_for(&mut source, Duration::from_secs(2)).await;
    assert!(!*source.synced.borrow(), "{mode:?}");
    let (streaming, lists) = streaming_and_lists(&api, "/api/v1/services?");
    assert!(
        streaming + lists >= 2,
        "{mode:?} started over: {:?}",
        api.requests()
    );
    // Once the object reads, the picture comes whole.
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    let names: Vec<String> = first_picture(&mut source)
        .await
        .into_iter()
        .map(|(d, _)| d)
        .collect();
    assert_eq!(
        names,
        [
            "node update node-a",
            "service upsert shop/web",
            "slice upsert shop/web-1"
        ],
        "{mode:?}"
    );
}
