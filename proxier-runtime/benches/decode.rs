//! Decoding the Kubernetes source's watch events: 1,000 Services and 1,000 EndpointSlices of
//! 5 endpoints, shaped as the VM benchmarks' API double serves them
//! (`ipvs_proxier_tests::bench::cluster`), each a watch-event line as a streaming list sends
//! it, decoded as kube does (`serde_json::from_slice` into a `WatchEvent`):
//!
//! - `full`: into k8s-openapi's `Service` / `EndpointSlice` (every field of the text);
//! - `lean`: into `source::lean`'s types (the metadata the conversions read, the rest skipped);
//! - `protobuf`: the same objects as one protobuf list each (the double's encoding,
//!   `ipvs_proxier_tests::apiserver::protobuf`), read and decoded by `source::protobuf` into
//!   the kinds with what the conversions read.
//!
//! The ratios lean/full and protobuf/lean of the medians are printed at the end.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use criterion::Criterion;
use ipvs_proxier_tests::apiserver::protobuf as encode;
use ipvs_proxier_tests::bench::cluster::{service_object, slice_object};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::WatchEvent;
use proxier_runtime::source::lean::{LeanService, LeanSlice};
use proxier_runtime::source::protobuf::{ProtobufError, decode_service, decode_slice, read_list};
use serde::de::DeserializeOwned;

const OBJECTS: usize = 1_000;

/// One watch-event line per object.
fn lines() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    // `type` first, as API servers write it (a `json!` map would sort `object` first, and
    // kube's `WatchEvent` would then buffer the whole object before decoding it).
    let event = |object: serde_json::Value| {
        format!("{{\"type\":\"ADDED\",\"object\":{object}}}").into_bytes()
    };
    let services = (0..OBJECTS).map(|i| event(service_object(i))).collect();
    let slices = (0..OBJECTS)
        .map(|i| {
            let endpoints: Vec<Ipv4Addr> = (0..5u8)
                .map(|e| Ipv4Addr::new(10, 244, (i / 250) as u8, e * 50 + (i % 50) as u8))
                .collect();
            event(slice_object(i, &endpoints))
        })
        .collect();
    (services, slices)
}

/// The objects of `lines` as one protobuf list body.
fn protobuf_list(lines: &[Vec<u8>], kind: &str) -> Vec<u8> {
    let items: Vec<Vec<u8>> = lines
        .iter()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_slice(line).expect("an event");
            match kind {
                "ServiceList" => encode::service(&event["object"]),
                _ => encode::endpoint_slice(&event["object"]),
            }
        })
        .collect();
    let items: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
    encode::list_body("v1", kind, "1", None, &items)
}

fn decode_list<K>(body: &[u8], decode: fn(&[u8]) -> Result<K, ProtobufError>) -> usize {
    let list = read_list(body).expect("a protobuf list");
    for item in &list.items {
        black_box(decode(item).expect("an object"));
    }
    list.items.len()
}

/// The median of `runs` timed decodings of the list `body`.
fn median_list<K>(
    body: &[u8],
    decode: fn(&[u8]) -> Result<K, ProtobufError>,
    runs: usize,
) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            decode_list(body, decode);
            started.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn decode_all<K: DeserializeOwned>(lines: &[Vec<u8>]) -> usize {
    lines
        .iter()
        .map(|line| {
            let event: WatchEvent<K> = serde_json::from_slice(line).expect("a watch event");
            black_box(event);
        })
        .count()
}

/// The median of `runs` timed decodings of `lines` as `K`.
fn median<K: DeserializeOwned>(lines: &[Vec<u8>], runs: usize) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            decode_all::<K>(lines);
            started.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn main() {
    let (services, slices) = lines();
    let (services_pb, slices_pb) = (
        protobuf_list(&services, "ServiceList"),
        protobuf_list(&slices, "EndpointSliceList"),
    );
    assert_eq!(decode_list(&services_pb, decode_service), OBJECTS);
    assert_eq!(decode_list(&slices_pb, decode_slice), OBJECTS);
    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("decode_1000_events");
    group.bench_function("services/full", |b| {
        b.iter(|| decode_all::<Service>(&services))
    });
    group.bench_function("services/lean", |b| {
        b.iter(|| decode_all::<LeanService>(&services))
    });
    group.bench_function("slices/full", |b| {
        b.iter(|| decode_all::<EndpointSlice>(&slices))
    });
    group.bench_function("slices/lean", |b| {
        b.iter(|| decode_all::<LeanSlice>(&slices))
    });
    group.bench_function("services/protobuf", |b| {
        b.iter(|| decode_list(&services_pb, decode_service))
    });
    group.bench_function("slices/protobuf", |b| {
        b.iter(|| decode_list(&slices_pb, decode_slice))
    });
    group.finish();
    criterion.final_summary();

    let ratio = |full: Duration, lean: Duration| lean.as_secs_f64() / full.as_secs_f64();
    let (services_full, services_lean) = (
        median::<Service>(&services, 51),
        median::<LeanService>(&services, 51),
    );
    let (slices_full, slices_lean) = (
        median::<EndpointSlice>(&slices, 51),
        median::<LeanSlice>(&slices, 51),
    );
    let (services_protobuf, slices_protobuf) = (
        median_list(&services_pb, decode_service, 51),
        median_list(&slices_pb, decode_slice, 51),
    );
    println!(
        "services: full {services_full:?}, lean {services_lean:?} (lean/full {:.2}), \
         protobuf {services_protobuf:?} (protobuf/lean {:.2}); \
         slices: full {slices_full:?}, lean {slices_lean:?} (lean/full {:.2}), \
         protobuf {slices_protobuf:?} (protobuf/lean {:.2})",
        ratio(services_full, services_lean),
        ratio(services_lean, services_protobuf),
        ratio(slices_full, slices_lean),
        ratio(slices_lean, slices_protobuf)
    );
}
