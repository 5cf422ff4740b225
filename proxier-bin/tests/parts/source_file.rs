//! Tests of `proxier_bin::source::file`.

use k8s_openapi::api::core::v1::Service;
use proxier_bin::source::file::*;
use proxier_bin::source::manifests::parse_manifests;
use proxier_bin::source::{ClusterSnapshot, ObjectKey, SourceEvent, SourceHandle};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

const CLUSTER: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.0.20}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: other-proxy\n  namespace: shop\n  labels: {service.kubernetes.io/service-proxy-name: foo}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: headless-x\n  namespace: shop\n  labels: {service.kubernetes.io/headless: \"\"}\nendpoints: []\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-b}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n";

#[test]
fn snapshot_filters_like_kube_proxy_and_picks_this_node() {
    let snap = snapshot_from_manifests(parse_manifests(CLUSTER), "node-a");
    assert_eq!(snap.services.len(), 1);
    assert!(snap.services.contains_key(&ObjectKey {
        namespace: "shop".into(),
        name: "web".into()
    }));
    assert!(snap.endpoint_slices.is_empty());
    assert_eq!(
        snap.node.as_ref().and_then(|n| n.metadata.name.as_deref()),
        Some("node-a")
    );
    let other = snapshot_from_manifests(parse_manifests(CLUSTER), "node-c");
    assert!(other.node.is_none());
}

#[test]
fn example_cluster_parses_cleanly() {
    let manifests = parse_manifests(include_str!("../../../examples/cluster.yaml"));
    assert!(manifests.problems.is_empty(), "{:?}", manifests.problems);
    assert_eq!(manifests.services.len(), 12);
    assert_eq!(manifests.endpoint_slices.len(), 11);
    let snap = snapshot_from_manifests(manifests, "node-a");
    let key = |ns: &str, name: &str| ObjectKey {
        namespace: ns.into(),
        name: name.into(),
    };
    // The other proxy's Service and the headless Service's slice are filtered out; the
    // headless and ExternalName Services themselves are left for the planner to skip.
    assert_eq!(snap.services.len(), 11);
    assert!(!snap.services.contains_key(&key("shop", "legacy-billing")));
    assert!(snap.services.contains_key(&key("shop", "orders-db")));
    assert_eq!(snap.endpoint_slices.len(), 10);
    assert!(
        !snap
            .endpoint_slices
            .contains_key(&key("shop", "orders-db-r7z2x"))
    );
    let checkout = &snap.services[&key("shop", "checkout")];
    let spec = checkout.spec.as_ref().expect("spec");
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(spec.health_check_node_port, Some(32100));
    assert!(snap.node.is_some());
}

fn snapshot_of(events: Vec<SourceEvent>) -> ClusterSnapshot {
    match events.as_slice() {
        [SourceEvent::Snapshot(snapshot)] => snapshot.clone(),
        other => panic!("expected one snapshot, got {} events", other.len()),
    }
}

fn described(events: &[SourceEvent]) -> Vec<String> {
    let mut out: Vec<String> = events.iter().map(SourceEvent::describe).collect();
    out.sort();
    out
}

#[test]
fn empty_and_malformed_texts_are_refused_whole() {
    let mut reader = FileReader::new("/x/cluster.yaml", "node-a");
    assert!(matches!(
        reader.read(""),
        Err(FileSourceError::Empty { .. })
    ));
    let torn = format!("{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: d");
    assert!(matches!(
        reader.read(&torn),
        Err(FileSourceError::Unfinished { .. })
    ));
    match reader.read(&format!("{torn}\n")) {
        Err(FileSourceError::Malformed { first, count, .. }) => {
            assert_eq!(count, 1);
            assert!(first.starts_with("document 5"), "{first}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A kind ipvs-proxier does not use is skipped, not an error.
    let with_deployment =
        format!("{CLUSTER}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: x}}\n");
    let snapshot = snapshot_of(reader.read(&with_deployment).expect("used"));
    assert_eq!(snapshot.services.len(), 1);
    // A file with no object at all is a real empty state: the Service goes.
    let events = reader.read("# nothing\n").expect("used");
    assert_eq!(
        described(&events),
        ["node deleted", "service delete shop/web"]
    );
}

#[test]
fn later_reads_report_only_what_changed_and_parse_only_new_documents() {
    let mut reader = FileReader::new("/x/cluster.yaml", "node-a");
    let first = snapshot_of(reader.read(CLUSTER).expect("used"));
    assert_eq!(first.services.len(), 1);
    assert!(reader.read(CLUSTER).expect("used").is_empty(), "unchanged");

    // One Service changed, one added, the node gone (renamed).
    let text = CLUSTER
        .replace("clusterIP: 10.96.0.20", "clusterIP: 10.96.0.21")
        .replace("name: node-a", "name: node-x")
        + "---\napiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\n";
    let events = reader.read(&text).expect("used");
    assert_eq!(
        described(&events),
        [
            "node deleted",
            "service upsert shop/db",
            "service upsert shop/web"
        ]
    );
    let changed = events.iter().find_map(|e| match e {
        SourceEvent::ServiceUpsert(s) if s.metadata.name.as_deref() == Some("web") => {
            s.spec.as_ref().and_then(|spec| spec.cluster_ip.clone())
        }
        _ => None,
    });
    assert_eq!(changed.as_deref(), Some("10.96.0.21"));

    // Back: the added one is deleted, the others come back.
    let events = reader.read(CLUSTER).expect("used");
    assert_eq!(
        described(&events),
        [
            "node update node-a",
            "service delete shop/db",
            "service upsert shop/web"
        ]
    );
}

#[test]
fn a_duplicate_definition_going_away_reports_the_remaining_one() {
    let svc = |ip: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: a, namespace: x}}\nspec: {{clusterIP: {ip}}}\n"
        )
    };
    let mut reader = FileReader::new("/x/c.yaml", "n");
    let both = format!("{}---\n{}", svc("10.96.0.1"), svc("10.96.0.2"));
    let first = snapshot_of(reader.read(&both).expect("used"));
    let ip_of = |s: &Service| s.spec.as_ref().and_then(|spec| spec.cluster_ip.clone());
    assert_eq!(
        first
            .services
            .values()
            .next()
            .and_then(|s| ip_of(s))
            .as_deref(),
        Some("10.96.0.2"),
        "the later definition wins"
    );
    // The later one goes: the earlier, unchanged document now defines it.
    let events = reader.read(&svc("10.96.0.1")).expect("used");
    match events.as_slice() {
        [SourceEvent::ServiceUpsert(s)] => assert_eq!(ip_of(s).as_deref(), Some("10.96.0.1")),
        other => panic!("{:?}", described(other)),
    }
}

#[test]
fn duplicates_keep_the_later_object() {
    let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec: {clusterIP: 10.96.0.1}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec: {clusterIP: 10.96.0.2}\n";
    let snap = snapshot_from_manifests(parse_manifests(text), "n");
    let svc = snap.services.values().next().expect("one service");
    assert_eq!(
        svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
        Some("10.96.0.2")
    );
}

#[test]
fn change_detector_reads_on_stamp_change_and_compares_content() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
    let s1 = FileStamp {
        modified: Some(t0),
        len: 10,
    };
    let s2 = FileStamp {
        modified: Some(t0 + Duration::from_secs(1)),
        len: 10,
    };
    let mut d = ChangeDetector::new(5);
    assert!(d.needs_read(s1));
    assert!(d.content_changed(s1, b"aaaaaaaaaa"));
    assert!(!d.needs_read(s1), "same stamp: no read");
    assert!(d.needs_read(s2), "touched: read");
    assert!(
        !d.content_changed(s2, b"aaaaaaaaaa"),
        "same content: no change"
    );
    assert!(d.needs_read(FileStamp {
        modified: Some(t0),
        len: 11
    }));
    assert!(d.content_changed(s1, b"bbbbbbbbbb"));
    // Every 5th poll verifies the content even with an unchanged stamp.
    let reads: Vec<bool> = (0..5).map(|_| d.needs_read(s1)).collect();
    assert_eq!(reads, vec![false, false, false, false, true]);
}

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "ipvs-proxier-file-source-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ))
}

async fn next_snapshot(handle: &mut SourceHandle) -> ClusterSnapshot {
    let event = tokio::time::timeout(Duration::from_secs(10), handle.events.recv())
        .await
        .expect("an event within 10 s")
        .expect("channel open");
    match event {
        SourceEvent::Snapshot(s) => s,
        other => panic!("expected a snapshot, got {}", other.describe()),
    }
}

#[tokio::test]
async fn watching_emits_a_snapshot_per_content_change() {
    let path = temp_path("watch");
    std::fs::write(&path, CLUSTER).expect("write");
    let mut handle = spawn(FileSourceConfig {
        path: path.clone(),
        hostname: "node-a".into(),
        poll_interval: Duration::from_millis(20),
    });
    let first = next_snapshot(&mut handle).await;
    assert_eq!(first.services.len(), 1);
    assert!(*handle.synced.borrow());

    // Same content rewritten: no event.
    std::fs::write(&path, CLUSTER).expect("rewrite");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        handle.events.try_recv().is_err(),
        "unchanged content must not emit"
    );

    // File briefly missing: keeps state, no event.
    std::fs::remove_file(&path).expect("remove");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(handle.events.try_recv().is_err());

    // Torn writes: truncated to nothing, then cut inside a document. Neither is used.
    std::fs::write(&path, "").expect("truncate");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        handle.events.try_recv().is_err(),
        "an empty file is a write in progress"
    );
    let torn = format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\n---\nkind: [broken\n"
    );
    std::fs::write(&path, torn).expect("write torn");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        handle.events.try_recv().is_err(),
        "a file with a malformed document is refused whole"
    );

    // The complete file: only the new service is an event.
    let more = format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\n"
    );
    std::fs::write(&path, more).expect("write more");
    handle.task.abort();
    let _ = std::fs::remove_file(&path);
}
