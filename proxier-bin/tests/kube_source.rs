//! The Kubernetes source against an API server double on 127.0.0.1: kube-proxy's selectors
//! are sent, nothing is reported before Services and EndpointSlices have both listed, changes
//! become events, and watch expiry (410 Gone) and API outages never make it forget objects.

mod support;

use std::time::Duration;

use proxier_bin::source::kube::{KubeSourceConfig, client, spawn};
use proxier_bin::source::{ObjectKey, PROXIED_OBJECTS_SELECTOR, SourceEvent, SourceHandle};
use serde_json::{Value, json};
use support::apiserver::{FakeApiServer, Kind};

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

async fn next_event(source: &mut SourceHandle) -> SourceEvent {
    tokio::time::timeout(Duration::from_secs(20), source.events.recv())
        .await
        .expect("an event within 20 s")
        .expect("source still running")
}

async fn no_event_for(source: &mut SourceHandle, wait: Duration) {
    if let Ok(Some(event)) = tokio::time::timeout(wait, source.events.recv()).await {
        panic!("unexpected event {}", event.describe());
    }
}

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey {
        namespace: ns.into(),
        name: name.into(),
    }
}

async fn start(api: &FakeApiServer) -> SourceHandle {
    let client = client(None, Some(&api.url()))
        .await
        .expect("client for the double");
    spawn(
        client,
        KubeSourceConfig {
            hostname: "node-a".into(),
        },
    )
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
    let snapshot = match next_event(&mut source).await {
        SourceEvent::Snapshot(s) => s,
        other => panic!("first event must be the snapshot, got {}", other.describe()),
    };
    assert!(
        *source.synced.borrow(),
        "synced is raised with the snapshot"
    );
    assert_eq!(
        snapshot.services.keys().collect::<Vec<_>>(),
        vec![&key("shop", "web")]
    );
    assert_eq!(
        snapshot.endpoint_slices.keys().collect::<Vec<_>>(),
        vec![&key("shop", "web-1")]
    );

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
    // The Node may arrive before or after the snapshot, and only this node.
    if snapshot.node.is_none() {
        match next_event(&mut source).await {
            SourceEvent::NodeUpdate(Some(n)) => {
                assert_eq!(n.metadata.name.as_deref(), Some("node-a"))
            }
            other => panic!("expected this node, got {}", other.describe()),
        }
    } else {
        assert_eq!(
            snapshot
                .node
                .as_ref()
                .and_then(|n| n.metadata.name.as_deref()),
            Some("node-a")
        );
    }
}

async fn synced_source(api: &FakeApiServer) -> SourceHandle {
    let mut source = start(api).await;
    loop {
        if let SourceEvent::Snapshot(_) = next_event(&mut source).await {
            return source;
        }
    }
}

#[tokio::test]
async fn watch_changes_become_events() {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    let mut source = synced_source(&api).await;
    no_event_for(&mut source, Duration::from_millis(300)).await; // let the watches start

    api.apply(
        Kind::EndpointSlice,
        slice("shop", "web-1", "web", "10.244.1.5", json!({})),
    );
    match next_event(&mut source).await {
        SourceEvent::SliceUpsert(s) => assert_eq!(s.metadata.name.as_deref(), Some("web-1")),
        other => panic!("expected slice upsert, got {}", other.describe()),
    }
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.30", json!({})),
    );
    match next_event(&mut source).await {
        SourceEvent::ServiceUpsert(s) => {
            assert_eq!(
                s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
                Some("10.96.0.30")
            )
        }
        other => panic!("expected service upsert, got {}", other.describe()),
    }
    api.delete(Kind::Service, "shop", "web");
    match next_event(&mut source).await {
        SourceEvent::ServiceDelete(s) => assert_eq!(s.metadata.name.as_deref(), Some("web")),
        other => panic!("expected service delete, got {}", other.describe()),
    }
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
    no_event_for(&mut source, Duration::from_millis(300)).await;

    // Changes the watch never saw, then 410 Gone: only a relist reveals them.
    api.delete_silently(Kind::Service, "shop", "gone");
    api.apply_silently(
        Kind::Service,
        service("shop", "new", "10.96.0.22", json!({})),
    );
    api.expire_watches();

    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(next_event(&mut source).await.describe());
    }
    seen.sort();
    assert_eq!(
        seen,
        vec!["service delete shop/gone", "service upsert shop/new"]
    );
    // "keep" did not change: no event for it, and no snapshot that would reset everything.
    no_event_for(&mut source, Duration::from_millis(500)).await;
}

#[tokio::test]
async fn api_outage_keeps_known_objects() {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        service("shop", "web", "10.96.0.20", json!({})),
    );
    api.apply(
        Kind::EndpointSlice,
        slice("shop", "web-1", "web", "10.244.1.5", json!({})),
    );
    let mut source = synced_source(&api).await;
    no_event_for(&mut source, Duration::from_millis(300)).await;

    api.set_outage(true);
    // Failing relists and watches must not turn into deletions.
    no_event_for(&mut source, Duration::from_secs(3)).await;
    api.set_outage(false);
    api.apply(
        Kind::Service,
        service("shop", "db", "10.96.0.40", json!({})),
    );
    // After recovery the new object arrives; the known ones were never deleted.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let event = tokio::time::timeout_at(deadline, source.events.recv())
            .await
            .expect("recovery within 30 s")
            .expect("source running");
        match &event {
            SourceEvent::ServiceUpsert(s) if s.metadata.name.as_deref() == Some("db") => break,
            SourceEvent::ServiceDelete(_)
            | SourceEvent::SliceDelete(_)
            | SourceEvent::Snapshot(_) => {
                panic!("outage must not lose objects: {}", event.describe())
            }
            _ => {}
        }
    }
}
