//! The engine's part of a start (and of a restart's adoption) at 10,000 Services × 5
//! endpoints, on the in-memory backends: the first picture applied to a fresh [`Proxier`],
//! then its first sync (every port planned, the kernel's table diffed, the writes and the
//! nftables tables). In the daemon these run before the ClusterIPs are bound, so every
//! millisecond here is one of the start's.
//!
//! `cargo bench -p proxier-core --bench engine`

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use proxier_core::engine::MemoryProxier;
use proxier_core::{Backends, Change, Proxier, ProxierConfig, SyncKind, testing};

const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 5;

fn picture() -> Vec<Change> {
    (0..SERVICES)
        .flat_map(|i| {
            [
                Change::UpsertService(testing::service(i)),
                Change::UpsertSlice(testing::slice(i, ENDPOINTS, 0)),
            ]
        })
        .collect()
}

fn fresh() -> MemoryProxier {
    Proxier::new(
        ProxierConfig::new(testing::NODE_NAME, testing::config()),
        Backends::in_memory(),
    )
    .unwrap()
}

fn first_picture(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("engine_first_picture");
    group.sample_size(10);
    group.bench_function("apply_10000", |b| {
        b.iter_batched(
            || (fresh(), picture()),
            |(mut proxier, changes)| {
                for change in changes {
                    proxier.apply(change);
                }
                proxier
            },
            BatchSize::LargeInput,
        )
    });
    group.bench_function("first_sync_10000", |b| {
        b.iter_batched(
            || {
                let mut proxier = fresh();
                for change in picture() {
                    proxier.apply(change);
                }
                proxier
            },
            |mut proxier| {
                let report = runtime.block_on(proxier.sync(SyncKind::Full)).unwrap();
                assert_eq!(report.changed_ports, SERVICES);
                black_box(report);
                proxier
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, first_picture);
criterion_main!(benches);
