//! What one proxier costs the API server, measured with the double: bytes the double sends
//! for the first picture of N Services, N/2 EndpointSlices and this node's Node, with
//! paginated and with streaming lists, and the size of each object before and after the
//! source trims it. Objects are shaped as an API server returns them (uid, timestamps,
//! managedFields, kubectl's last-applied annotation on Services, owner references and Pod
//! target references on slices, images and node info on the Node). The numbers in
//! docs/api-server-cost.md come from N = 10,000:
//!
//! `API_COST_SERVICES=10000 cargo test -p proxier-runtime --test parts -- --nocapture api_cost`
//!
//! The test suite runs it at N = 1,000 (the same checks, a smaller picture).

use std::time::{Duration, Instant};

use ipvs_proxier_tests::apiserver::{FakeApiServer, Kind};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proxier_core::Change;
use proxier_runtime::source::kube::{
    KubeSourceConfig, ListMode, client, spawn, trim_node, trim_service, trim_slice,
};
use serde_json::{Value, json};

const ENDPOINTS_PER_SLICE: usize = 4;

/// N: `API_COST_SERVICES`, 1,000 unless set.
fn service_count() -> usize {
    std::env::var("API_COST_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000)
}

fn managed_fields(manager: &str, fields: Value) -> Value {
    json!([{"manager": manager, "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-30T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields}])
}

fn service(i: usize) -> Value {
    let (ns, name) = (format!("team-{}", i % 100), format!("svc-{i}"));
    let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
    let spec = json!({"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None",
        "internalTrafficPolicy": "Cluster", "selector": {"app": name},
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                  {"name": "metrics", "port": 9090, "protocol": "TCP", "targetPort": 9090}]});
    let applied = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}}, "spec": spec});
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "uid": format!("5b0c{i:032x}"),
            "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"app": name, "app.kubernetes.io/name": name,
                       "app.kubernetes.io/part-of": "shop"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied.to_string()},
            "managedFields": managed_fields("kubectl-client-side-apply", json!({
                "f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}},
                               "f:labels": {".": {}, "f:app": {}, "f:app.kubernetes.io/name": {}, "f:app.kubernetes.io/part-of": {}}},
                "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {},
                    "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}},
                    "k:{\"port\":9090,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
                    "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}}))},
        "spec": spec, "status": {"loadBalancer": {}}})
}

fn slice(i: usize) -> Value {
    // Half as many slices as Services: every other Service has one.
    let service = i * 2;
    let (ns, svc) = (format!("team-{}", service % 100), format!("svc-{service}"));
    let endpoints: Vec<Value> = (0..ENDPOINTS_PER_SLICE)
        .map(|e| {
            let pod = format!("{svc}-7d9f8c6b5-{e:05}");
            json!({"addresses": [format!("10.{}.{}.{}", 64 + i / 65536 % 64, i / 256 % 256, (i * 4 + e) % 256)],
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": format!("node-{:04}", (i + e) % 5000), "zone": "zone-a",
                   "targetRef": {"kind": "Pod", "namespace": ns, "name": pod,
                                 "uid": format!("9a1e{:028x}{e:04x}", i)}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": format!("{svc}-{i:05x}"), "generateName": format!("{svc}-"),
            "namespace": ns, "uid": format!("e5e5{i:032x}"), "generation": 7,
            "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"kubernetes.io/service-name": svc, "app": svc,
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-30T10:00:00Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": svc,
                                 "uid": format!("5b0c{service:032x}"), "controller": true,
                                 "blockOwnerDeletion": true}],
            "managedFields": managed_fields("kube-controller-manager", json!({
                "f:addressType": {}, "f:endpoints": {},
                "f:metadata": {"f:annotations": {".": {}, "f:endpoints.kubernetes.io/last-change-trigger-time": {}},
                               "f:generateName": {},
                               "f:labels": {".": {}, "f:app": {}, "f:endpointslice.kubernetes.io/managed-by": {}, "f:kubernetes.io/service-name": {}},
                               "f:ownerReferences": {".": {}, "k:{\"uid\":\"...\"}": {}}},
                "f:ports": {}}))},
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                  {"name": "metrics", "port": 9090, "protocol": "TCP"}]})
}

fn node() -> Value {
    let images: Vec<Value> = (0..20)
        .map(|i| {
            json!({"names": [format!("registry.example/team/app-{i}@sha256:{i:064x}"),
                                  format!("registry.example/team/app-{i}:v1.{i}.0")],
                        "sizeBytes": 50_000_000 + i})
        })
        .collect();
    let conditions: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|c| {
            json!({"type": c, "status": "False", "lastHeartbeatTime": "2026-11-30T10:00:00Z",
                        "lastTransitionTime": "2026-11-30T10:00:00Z",
                        "reason": format!("Kubelet{c}"), "message": format!("kubelet reports {c}")})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "uid": "0d0d", "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"kubernetes.io/hostname": "node-a", "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": "zone-a",
                       "topology.kubernetes.io/region": "region-1",
                       "node.kubernetes.io/instance-type": "m6i.2xlarge"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                            "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock"},
            "managedFields": managed_fields("kubelet", json!({"f:status": {"f:images": {}, "f:conditions": {}, "f:nodeInfo": {}}}))},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"], "providerID": "aws:///zone-a/i-0123"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"},
                                 {"type": "Hostname", "address": "node-a"}],
                   "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                   "allocatable": {"cpu": "7800m", "memory": "31Gi", "pods": "110"},
                   "conditions": conditions, "images": images,
                   "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                                "kernelVersion": "6.12.0", "osImage": "Debian GNU/Linux 13",
                                "containerRuntimeVersion": "containerd://2.1.0",
                                "kubeletVersion": "v1.35.0", "kubeProxyVersion": "",
                                "operatingSystem": "linux", "architecture": "amd64"}}})
}

/// JSON bytes of an object as received and as kept after trimming.
fn sizes<K: serde::Serialize + serde::de::DeserializeOwned + Clone>(
    value: &Value,
    trim: fn(&mut K),
) -> (usize, usize) {
    let object: K = serde_json::from_value(value.clone()).expect("object");
    let mut trimmed = object.clone();
    trim(&mut trimmed);
    let len = |o: &K| serde_json::to_vec(o).expect("json").len();
    (len(&object), len(&trimmed))
}

async fn first_picture_bytes(mode: ListMode) -> ([u64; 3], usize, Duration, Vec<String>) {
    let api = FakeApiServer::start().await;
    let services = service_count();
    for i in 0..services {
        api.apply(Kind::Service, service(i));
    }
    for i in 0..services / 2 {
        api.apply(Kind::EndpointSlice, slice(i));
    }
    api.apply(Kind::Node, node());
    let client = client(None, Some(&api.url())).await.expect("client");
    let started = Instant::now();
    let mut source = spawn(
        client,
        KubeSourceConfig {
            list_mode: mode,
            ..KubeSourceConfig::new("node-a")
        },
    );
    let mut changes = 0;
    let mut node_seen = false;
    // The source sends its first picture, then says it is synced: wait for both (checking
    // the flag only when a batch arrives would miss it when it comes after the last one).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while !node_seen || !*source.synced.borrow() {
        tokio::select! {
            batch = source.events.recv() => {
                let batch = batch.expect("source running");
                node_seen |= batch
                    .changes
                    .iter()
                    .any(|c| matches!(c, Change::UpsertNode(_)));
                changes += batch.changes.len();
            }
            changed = source.synced.changed() => changed.expect("source running"),
            () = tokio::time::sleep_until(deadline) => panic!("not synced within 5 minutes"),
        }
    }
    let took = started.elapsed();
    let bytes = [Kind::Service, Kind::EndpointSlice, Kind::Node].map(|k| api.bytes_served(k));
    (bytes, changes, took, api.requests())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_cost_of_the_first_picture() {
    let (svc_full, svc_trimmed) = sizes::<Service>(&service(1234), trim_service);
    let (slice_full, slice_trimmed) = sizes::<EndpointSlice>(&slice(1234), trim_slice);
    let (node_full, node_trimmed) = sizes::<Node>(&node(), trim_node);
    println!("object JSON bytes, as received -> as kept after trimming:");
    println!("  Service        {svc_full} -> {svc_trimmed}");
    println!("  EndpointSlice  {slice_full} -> {slice_trimmed} ({ENDPOINTS_PER_SLICE} endpoints)");
    println!("  Node           {node_full} -> {node_trimmed}");

    for mode in [
        ListMode::Paginated,
        ListMode::Streaming,
        ListMode::ProtobufStreaming,
    ] {
        let ([service_bytes, slice_bytes, node_bytes], changes, took, requests) =
            first_picture_bytes(mode).await;
        let (services, slices) = (service_count(), service_count() / 2);
        println!(
            "{mode:?}: bytes served for the first picture: {services} Services {service_bytes}, \
             {slices} EndpointSlices {slice_bytes}, Node {node_bytes}; {changes} changes; synced in {took:?}"
        );
        for r in requests
            .iter()
            .filter(|r| !r.contains("watch=true") || r.contains("sendInitialEvents"))
        {
            println!("  request {r}");
        }
        if mode == ListMode::Paginated {
            assert!(
                requests
                    .iter()
                    .any(|r| r.starts_with("/api/v1/services?") && r.contains("limit=500")),
                "kube-runtime's page size: {requests:?}"
            );
        }
        assert_eq!(changes, services + slices + 1);
    }
}
