//! Tests of `proxier_bin::feed`.

use proxier_bin::source::{ClusterSnapshot, SourceEvent};
use proxier_core::Change;
use std::sync::Arc;
use std::time::SystemTime;

use proxier_bin::feed::*;
use proxier_bin::source::manifests::parse_manifests;

fn example() -> ClusterSnapshot {
    let text = include_str!("../../../examples/cluster.yaml");
    proxier_bin::source::file::snapshot_from_manifests(parse_manifests(text), "node-a")
}

#[test]
fn a_snapshot_becomes_the_node_then_every_object() {
    let snapshot = example();
    let converted = convert(&SourceEvent::Snapshot(snapshot.clone()));
    assert!(matches!(converted.changes[0], Change::UpsertNode(_)));
    let services = converted
        .changes
        .iter()
        .filter(|c| matches!(c, Change::UpsertService(_) | Change::DeleteService(_)))
        .count();
    assert_eq!(services, snapshot.services.len());
    let slices = converted
        .changes
        .iter()
        .filter(|c| matches!(c, Change::UpsertSlice(_) | Change::DeleteSlice(_)))
        .count();
    assert_eq!(slices, snapshot.endpoint_slices.len());
}

#[test]
fn a_rejected_object_produces_no_change() {
    let snapshot = example();
    let mut broken = (**snapshot.services.values().next().expect("a service")).clone();
    if let Some(port) = broken
        .spec
        .as_mut()
        .and_then(|s| s.ports.as_mut())
        .and_then(|p| p.first_mut())
    {
        port.protocol = Some("QUIC".into());
    }
    let converted = convert(&SourceEvent::ServiceUpsert(Arc::new(broken)));
    assert!(converted.changes.is_empty(), "{:?}", converted.changes);
}

#[test]
fn trigger_times_come_with_their_slices() {
    let snapshot = example();
    let mut slice = (**snapshot.endpoint_slices.values().next().expect("a slice")).clone();
    slice
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            LAST_CHANGE_TRIGGER_TIME.into(),
            "2030-01-01T00:00:00Z".into(),
        );
    let converted = convert(&SourceEvent::SliceUpsert(Arc::new(slice)));
    assert_eq!(converted.changes.len(), 1);
    let expected = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_893_456_000);
    assert_eq!(converted.trigger_times, vec![expected]);
}
