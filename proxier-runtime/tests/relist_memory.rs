//! What the Kubernetes source holds while a first list (or a relist) is under way: each object
//! is converted to the engine's model as it arrives, so the heap the list needs is about the
//! converted picture, never every API object of the list at once (trimmed Services and
//! EndpointSlices are twice the size of their conversion). Measured with a counting global
//! allocator, in its own binary so that no other test allocates meanwhile (and its tests
//! one at a time). N Services with
//! one 5-endpoint slice each; `RELIST_SERVICES` for another N than 2,000:
//!
//! `RELIST_SERVICES=10000 cargo test -p proxier-runtime --release --test relist_memory -- --nocapture`
#![allow(clippy::unwrap_used)]

#[path = "../../proxier-core/tests/support/counting_allocator.rs"]
mod counting_allocator;

use counting_allocator::{CountingAllocator, live_bytes, peak_bytes, reset_peak};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use proxier_runtime::source::kube::{KubeSourceState, trim_service, trim_slice};
use serde_json::json;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Held by each test: the allocator counts every thread's allocations.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn services() -> usize {
    std::env::var("RELIST_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000)
}

/// Service `i` as the watcher hands it over: decoded and trimmed.
fn service(i: usize) -> Service {
    let ip = format!("10.96.{}.{}", i / 256, i % 256);
    let mut service: Service = serde_json::from_value(json!({
        "metadata": {"name": format!("svc-{i}"), "namespace": format!("team-{}", i % 100),
                     "resourceVersion": format!("{}", 1000 + i), "uid": format!("uid-svc-{i}"),
                     "creationTimestamp": "2026-11-30T10:00:00Z"},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
                 "sessionAffinity": "None", "ipFamilies": ["IPv4"],
                 "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"}
    }))
    .unwrap();
    trim_service(&mut service);
    service
}

/// Service `i`'s EndpointSlice, 5 ready endpoints on 5 nodes, decoded and trimmed.
fn slice(i: usize) -> EndpointSlice {
    let endpoints: Vec<_> = (0..5)
        .map(|e| {
            let n = i * 5 + e;
            json!({"addresses": [format!("172.16.{}.{}", n / 256 % 256, n % 256)],
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": format!("node-{e}"), "zone": "zone-a",
                   "targetRef": {"kind": "Pod", "namespace": format!("team-{}", i % 100),
                                 "name": format!("pod-{n}"), "uid": format!("uid-pod-{n}")}})
        })
        .collect();
    let mut slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("svc-{i}-abcde"), "namespace": format!("team-{}", i % 100),
                     "resourceVersion": format!("{}", 900_000 + i), "uid": format!("uid-slice-{i}"),
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}"),
                                "endpointslice.kubernetes.io/managed-by":
                                    "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
    .unwrap();
    trim_slice(&mut slice);
    slice
}

/// Begins a (re)list of Services 0..n and their slices and delivers every object, as the
/// watchers do, one at a time, decoded just before; the caller ends it (`InitDone`).
fn list_without_ending(state: &mut KubeSourceState, n: usize) {
    assert!(state.on_service(Event::Init).is_none());
    assert!(state.on_slice(Event::Init).is_none());
    for i in 0..n {
        assert!(state.on_service(Event::InitApply(service(i))).is_none());
        assert!(state.on_slice(Event::InitApply(slice(i))).is_none());
    }
}

#[test]
fn a_first_list_holds_converted_objects_not_the_apis() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let n = services();
    // What the API objects of the whole list take when all are held at once.
    let before = live_bytes();
    let held: Vec<(Service, EndpointSlice)> = (0..n).map(|i| (service(i), slice(i))).collect();
    let objects = live_bytes() - before;
    drop(held);

    // The list as the watchers deliver it: one object at a time, decoded just before.
    let start = live_bytes();
    reset_peak();
    let mut state = KubeSourceState::new(false);
    list_without_ending(&mut state, n);
    assert!(state.on_service(Event::InitDone).is_none());
    let batch = state.on_slice(Event::InitDone).unwrap();
    let peak = peak_bytes() - start;
    let converted = live_bytes() - start;
    assert_eq!(batch.changes.len(), 2 * n);

    let kib = |bytes: isize| bytes / 1024;
    println!(
        "first list of {n} Services + {n} EndpointSlices: the API objects {} KiB, \
         converted (the first batch and the stores) {} KiB, peak while listing {} KiB",
        kib(objects),
        kib(converted),
        kib(peak)
    );
    assert!(
        converted < objects,
        "the conversion ({converted} B) should be smaller than the objects ({objects} B)"
    );
    // The peak is the converted picture plus one object and the buffers' growth; holding
    // every API object until the list ends would add `objects` to it.
    assert!(
        peak < converted + objects / 2,
        "peak {peak} B while listing: more than the converted picture ({converted} B) plus \
         half the API objects ({objects} B)"
    );
}

/// A relist that finds every object at the version known (after a 410 Gone, say) only marks
/// them listed: while it runs it holds nothing per object, so nothing it leaves behind lies
/// between the allocations made meanwhile that live on (the engine's, the watch's).
#[test]
fn an_unchanged_relist_holds_nothing_per_object_while_it_runs() {
    let _alone = ALONE.lock().unwrap_or_else(|p| p.into_inner());
    let n = services();
    let mut state = KubeSourceState::new(false);
    list_without_ending(&mut state, n);
    assert!(state.on_service(Event::InitDone).is_none());
    assert!(state.on_slice(Event::InitDone).is_some(), "the first batch");

    let start = live_bytes();
    list_without_ending(&mut state, n);
    let held = live_bytes() - start;
    let services_done = state.on_service(Event::InitDone);
    let slices_done = state.on_slice(Event::InitDone);
    println!(
        "an unchanged relist of {n} Services + {n} EndpointSlices holds {held} B before it ends"
    );
    assert!(
        services_done.is_none() && slices_done.is_none(),
        "the relist changed nothing"
    );
    // Two relists under way (their bookkeeping), nothing that grows with the objects.
    let per_object = held / (2 * n as isize);
    assert!(
        per_object < 8,
        "an unchanged relist holds {held} B ({per_object} B per object) while it runs"
    );
}
