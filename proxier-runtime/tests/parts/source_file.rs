//! Tests of `proxier_runtime::source::file`.

use proxier_core::Change;
use proxier_runtime::source::file::*;
use proxier_runtime::source::manifests::parse_manifests;
use proxier_runtime::source::{SourceBatch, SourceHandle, describe};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

const CLUSTER: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.0.20}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: other-proxy\n  namespace: shop\n  labels: {service.kubernetes.io/service-proxy-name: foo}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: headless-x\n  namespace: shop\n  labels: {service.kubernetes.io/headless: \"\"}\nendpoints: []\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-b}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n";

fn described(batch: &SourceBatch) -> Vec<String> {
    let mut out: Vec<String> = batch.changes.iter().map(describe).collect();
    out.sort();
    out
}

fn first_read(text: &str, hostname: &str) -> Vec<String> {
    let batch = FileReader::new("/x/cluster.yaml", hostname).read(text);
    described(&batch.expect("used"))
}

#[test]
fn the_first_read_filters_like_kube_proxy_and_picks_this_node() {
    assert_eq!(
        first_read(CLUSTER, "node-a"),
        ["node update node-a", "service upsert shop/web"]
    );
    assert_eq!(first_read(CLUSTER, "node-c"), ["service upsert shop/web"]);
}

#[test]
fn example_cluster_parses_cleanly() {
    let text = include_str!("../../../examples/cluster.yaml");
    let manifests = parse_manifests(text);
    assert!(manifests.problems.is_empty(), "{:?}", manifests.problems);
    assert_eq!(manifests.services.len(), 12);
    assert_eq!(manifests.endpoint_slices.len(), 11);
    let changes = first_read(text, "node-a");
    let count = |prefix: &str| changes.iter().filter(|c| c.starts_with(prefix)).count();
    // The other proxy's Service and the headless Service's slice are filtered out; the
    // headless and ExternalName Services are skipped by the conversion (deletes).
    assert_eq!(count("service "), 11);
    assert!(!changes.iter().any(|c| c.ends_with("shop/legacy-billing")));
    assert!(changes.contains(&"service delete shop/orders-db".to_owned()));
    assert_eq!(count("slice "), 10);
    assert!(!changes.iter().any(|c| c.ends_with("shop/orders-db-r7z2x")));
    assert_eq!(count("node update node-a"), 1);
    let batch = FileReader::new("/x/cluster.yaml", "node-a")
        .read(text)
        .expect("used");
    let checkout = batch.changes.iter().find_map(|c| match c {
        Change::UpsertService(s) if &*s.name.name == "checkout" => Some(s),
        _ => None,
    });
    assert_eq!(
        checkout.and_then(|s| s.health_check_node_port),
        Some(32100),
        "externalTrafficPolicy: Local with its health check port"
    );
}

fn cluster_ip(batch: &SourceBatch, name: &str) -> Option<String> {
    batch.changes.iter().find_map(|c| match c {
        Change::UpsertService(s) if &*s.name.name == name => {
            s.cluster_ips.first().map(|ip| ip.to_string())
        }
        _ => None,
    })
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
    let first = reader.read(&with_deployment).expect("used");
    assert_eq!(
        described(&first),
        ["node update node-a", "service upsert shop/web"]
    );
    // A file with no object at all is a real empty state: the Service goes.
    let batch = reader.read("# nothing\n").expect("used");
    assert_eq!(
        described(&batch),
        ["node deleted", "service delete shop/web"]
    );
}

#[test]
fn later_reads_report_only_what_changed_and_parse_only_new_documents() {
    let mut reader = FileReader::new("/x/cluster.yaml", "node-a");
    let first = reader.read(CLUSTER).expect("used");
    assert_eq!(cluster_ip(&first, "web").as_deref(), Some("10.96.0.20"));
    assert!(reader.read(CLUSTER).expect("used").is_empty(), "unchanged");

    // One Service changed, one added, the node gone (renamed).
    let text = CLUSTER
        .replace("clusterIP: 10.96.0.20", "clusterIP: 10.96.0.21")
        .replace("name: node-a", "name: node-x")
        + "---\napiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec: {clusterIP: 10.96.0.30}\n";
    let batch = reader.read(&text).expect("used");
    assert_eq!(
        described(&batch),
        [
            "node deleted",
            "service upsert shop/db",
            "service upsert shop/web"
        ]
    );
    assert_eq!(cluster_ip(&batch, "web").as_deref(), Some("10.96.0.21"));

    // Back: the added one is deleted, the others come back.
    let batch = reader.read(CLUSTER).expect("used");
    assert_eq!(
        described(&batch),
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
    let first = reader.read(&both).expect("used");
    assert_eq!(described(&first), ["service upsert x/a"]);
    assert_eq!(
        cluster_ip(&first, "a").as_deref(),
        Some("10.96.0.2"),
        "the later definition wins"
    );
    // The later one goes: the earlier, unchanged document now defines it.
    let batch = reader.read(&svc("10.96.0.1")).expect("used");
    assert_eq!(described(&batch), ["service upsert x/a"]);
    assert_eq!(cluster_ip(&batch, "a").as_deref(), Some("10.96.0.1"));
}

#[test]
fn in_one_list_the_later_item_of_a_key_wins() {
    let item = |ip: &str| {
        format!(
            "- apiVersion: v1\n  kind: Service\n  metadata: {{name: a, namespace: x}}\n  spec: {{clusterIP: {ip}}}\n"
        )
    };
    let text = format!(
        "apiVersion: v1\nkind: List\nitems:\n{}{}{}",
        item("10.96.0.1"),
        item("10.96.0.2"),
        item("10.96.0.3")
    );
    let batch = FileReader::new("/x/c.yaml", "n").read(&text).expect("used");
    assert_eq!(described(&batch), ["service upsert x/a"]);
    assert_eq!(cluster_ip(&batch, "a").as_deref(), Some("10.96.0.3"));
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

async fn next_batch(handle: &mut SourceHandle) -> SourceBatch {
    tokio::time::timeout(Duration::from_secs(10), handle.events.recv())
        .await
        .expect("a batch within 10 s")
        .expect("channel open")
}

#[tokio::test]
async fn watching_emits_a_batch_per_content_change() {
    let path = temp_path("watch");
    std::fs::write(&path, CLUSTER).expect("write");
    let mut handle = spawn(FileSourceConfig {
        path: path.clone(),
        hostname: "node-a".into(),
        poll_interval: Duration::from_millis(20),
    });
    let first = next_batch(&mut handle).await;
    assert_eq!(
        described(&first),
        ["node update node-a", "service upsert shop/web"]
    );
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

    // The complete file: only the new service is a change.
    let more = format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\nspec: {{clusterIP: 10.96.0.30}}\n"
    );
    std::fs::write(&path, more).expect("write more");
    let batch = next_batch(&mut handle).await;
    assert_eq!(described(&batch), ["service upsert shop/db"]);
    handle.task.abort();
    let _ = std::fs::remove_file(&path);
}

/// How many reads of the source file were refused, as `ipvs_proxier_source_file_rejected_total`
/// renders in `handle` (0 before the first).
fn refusals(handle: &metrics_exporter_prometheus::PrometheusHandle) -> u64 {
    handle
        .render()
        .lines()
        .find_map(|line| line.strip_prefix("ipvs_proxier_source_file_rejected_total "))
        .map_or(0, |value| value.trim().parse().expect("a counter value"))
}

/// A file cut inside its last document: it ends with a newline but does not parse.
fn torn() -> String {
    format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\n---\nkind: [broken\n"
    )
}

/// The cluster with one more Service, `shop/db`.
fn with_db() -> String {
    format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\nspec: {{clusterIP: 10.96.0.30}}\n"
    )
}

/// The next batch, which must come within `within` (well under the 5 s poll interval: only a
/// change notification brings it that soon).
async fn batch_within(handle: &mut SourceHandle, within: Duration) -> SourceBatch {
    tokio::time::timeout(within, handle.events.recv())
        .await
        .unwrap_or_else(|_| panic!("a batch within {within:?}"))
        .expect("channel open")
}

// The source runs on this test's thread (a current-thread runtime), so the thread's default
// recorder sees its metrics and no other test's.
#[tokio::test(flavor = "current_thread")]
async fn a_torn_file_left_in_place_is_refused_and_counted_once() {
    let recorder = crate::metrics::build_recorder();
    let counted = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let path = temp_path("torn-left");
    std::fs::write(&path, CLUSTER).expect("write");
    let mut handle = spawn(FileSourceConfig::new(&path, "node-a"));
    next_batch(&mut handle).await;

    std::fs::write(&path, torn()).expect("write torn");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        refusals(&counted),
        1,
        "the same refused content is refused once, however long it stays"
    );
    assert!(
        handle.events.try_recv().is_err(),
        "the last good state stays in force"
    );
    handle.task.abort();
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "current_thread")]
async fn an_empty_file_is_refused_and_counted_once() {
    let recorder = crate::metrics::build_recorder();
    let counted = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let path = temp_path("empty-left");
    std::fs::write(&path, CLUSTER).expect("write");
    // Frequent looks: every one finds the same stamp, every tenth reads the bytes again.
    let mut handle = spawn(FileSourceConfig {
        path: path.clone(),
        hostname: "node-a".into(),
        poll_interval: Duration::from_millis(20),
    });
    next_batch(&mut handle).await;

    std::fs::write(&path, "").expect("truncate");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        refusals(&counted),
        1,
        "an empty file is a refusal, counted once"
    );
    assert!(
        handle.events.try_recv().is_err(),
        "the last good state stays in force"
    );
    handle.task.abort();
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "current_thread")]
async fn each_new_refused_content_is_counted_once() {
    let recorder = crate::metrics::build_recorder();
    let counted = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let path = temp_path("refused-in-turn");
    std::fs::write(&path, CLUSTER).expect("write");
    let mut handle = spawn(FileSourceConfig {
        path: path.clone(),
        hostname: "node-a".into(),
        poll_interval: Duration::from_millis(20),
    });
    next_batch(&mut handle).await;

    std::fs::write(&path, torn()).expect("write torn");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(refusals(&counted), 1);
    std::fs::write(&path, "").expect("truncate");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(refusals(&counted), 2, "new content: a new refusal");
    let unfinished = CLUSTER.trim_end_matches('\n');
    std::fs::write(&path, unfinished).expect("write unfinished");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(refusals(&counted), 3, "new content: a new refusal");
    assert!(
        handle.events.try_recv().is_err(),
        "the last good state stays in force"
    );
    handle.task.abort();
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "current_thread")]
async fn a_good_file_written_after_a_torn_one_is_picked_up_within_two_seconds() {
    let path = temp_path("torn-then-good");
    std::fs::write(&path, CLUSTER).expect("write");
    let mut handle = spawn(FileSourceConfig::new(&path, "node-a"));
    next_batch(&mut handle).await;

    std::fs::write(&path, torn()).expect("write torn");
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::write(&path, with_db()).expect("write good");
    let batch = batch_within(&mut handle, Duration::from_secs(2)).await;
    assert_eq!(described(&batch), ["service upsert shop/db"]);
    handle.task.abort();
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "current_thread")]
async fn a_good_file_renamed_over_a_torn_one_is_picked_up_within_two_seconds() {
    let path = temp_path("torn-then-renamed");
    let temporary = temp_path("torn-then-renamed-next");
    std::fs::write(&path, CLUSTER).expect("write");
    let mut handle = spawn(FileSourceConfig::new(&path, "node-a"));
    next_batch(&mut handle).await;

    std::fs::write(&path, torn()).expect("write torn");
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::write(&temporary, with_db()).expect("write temporary");
    std::fs::rename(&temporary, &path).expect("rename over");
    let batch = batch_within(&mut handle, Duration::from_secs(2)).await;
    assert_eq!(described(&batch), ["service upsert shop/db"]);
    handle.task.abort();
    let _ = std::fs::remove_file(&path);
}
