//! Tests of `proxier_runtime::source`: what a source batch makes of the objects it is given.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proxier_core::Change;
use proxier_runtime::source::{ObjectKey, SourceBatch, describe};
use std::time::{Duration, SystemTime};

fn service(spec: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop"}, "spec": spec,
    }))
    .expect("a Service")
}

fn slice(address_type: &str, annotations: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "shop", "annotations": annotations,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": address_type,
        "endpoints": [{"addresses": ["10.244.1.5"]}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .expect("an EndpointSlice")
}

fn described(batch: &SourceBatch) -> Vec<String> {
    batch.changes.iter().map(describe).collect()
}

#[test]
fn objects_become_the_engine_s_changes() {
    let mut batch = SourceBatch::default();
    batch.upsert_service(&service(serde_json::json!({
        "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
    })));
    batch.upsert_slice(&slice("IPv4", serde_json::json!({})));
    batch.delete_slice(ObjectKey {
        namespace: "shop".into(),
        name: "web-2".into(),
    });
    batch.delete_service(ObjectKey {
        namespace: "shop".into(),
        name: "db".into(),
    });
    assert_eq!(
        described(&batch),
        [
            "service upsert shop/web",
            "slice upsert shop/web-1",
            "slice delete shop/web-2",
            "service delete shop/db"
        ]
    );
    let Change::UpsertSlice(slice) = &batch.changes[1] else {
        panic!("a slice upsert: {:?}", described(&batch));
    };
    assert_eq!(slice.trigger_time, None, "no annotation, no time");
}

#[test]
fn a_rejected_object_produces_no_change() {
    let mut batch = SourceBatch::default();
    batch.upsert_service(&service(serde_json::json!({
        "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
        "ports": [{"name": "http", "port": 80, "protocol": "QUIC"}],
    })));
    batch.upsert_slice(&slice("IPv5", serde_json::json!({})));
    assert!(batch.changes.is_empty(), "{:?}", described(&batch));
    assert!(batch.is_empty());
}

#[test]
fn an_fqdn_slice_is_never_proxied() {
    let mut batch = SourceBatch::default();
    batch.upsert_slice(&slice("FQDN", serde_json::json!({})));
    assert_eq!(described(&batch), ["slice delete shop/web-1"]);
}

#[test]
fn trigger_times_come_with_their_slices() {
    let mut batch = SourceBatch::default();
    batch.upsert_slice(&slice(
        "IPv4",
        serde_json::json!({proxier_core::k8s::LAST_CHANGE_TRIGGER_TIME_ANNOTATION: "2030-01-01T00:00:00Z"}),
    ));
    let [Change::UpsertSlice(slice)] = &batch.changes[..] else {
        panic!("one slice upsert: {:?}", described(&batch));
    };
    let expected = SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_456_000);
    assert_eq!(slice.trigger_time, Some(expected));
}

fn eligibility(change: &Change) -> Option<bool> {
    match change {
        Change::UpsertNode(node) => Some(node.eligible),
        Change::DeleteNode => Some(false),
        _ => None,
    }
}

#[test]
fn the_node_comes_with_its_eligibility() {
    let mut batch = SourceBatch::default();
    let mut node = Node::default();
    node.metadata.name = Some("node-a".into());
    batch.node(Some(&node));
    assert_eq!(described(&batch), ["node update node-a"]);
    assert_eq!(eligibility(&batch.changes[0]), Some(true));
    let mut later = SourceBatch::default();
    later.node(None);
    batch.append(later);
    assert_eq!(described(&batch), ["node update node-a", "node deleted"]);
    assert_eq!(eligibility(&batch.changes[1]), Some(false));
}

#[test]
fn a_rejected_node_still_says_whether_it_takes_traffic() {
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-a", "deletionTimestamp": "2030-01-01T00:00:00Z"},
        "spec": {"podCIDRs": ["not-a-cidr"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.10"}]},
    }))
    .expect("a Node");
    let mut batch = SourceBatch::default();
    batch.node(Some(&node));
    let [Change::UpsertNode(context)] = &batch.changes[..] else {
        panic!("one node change: {:?}", described(&batch));
    };
    assert_eq!(context.name, "node-a");
    assert!(
        context.primary_ips.is_empty(),
        "planned without its addresses"
    );
    assert!(!context.eligible, "being deleted");
}
