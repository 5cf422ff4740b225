//! Planner benchmarks on synthetic clusters (see `proxier_core::testing`).
//!
//! - `one_endpoint_change/{100,1000,10000}`: apply one EndpointSlice update to the state and
//!   plan the dirtied Service port, at 100, 1,000 and 10,000 Services x 5 endpoints. The time
//!   must not grow with the cluster; the ratio 10k/100 is printed at the end.
//! - `full_plan/10000`: plan every Service of a 10,000 x 5 cluster.
//! - State size: bytes held by a 10,000 x 5 `ClusterState`, measured with a counting global
//!   allocator (live bytes after building minus before), printed per endpoint.
//!
//! The reconciler's diff step can be added after [`Planner::apply_and_plan`] in
//! [`one_change`].

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use proxier_core::state::Change;
use proxier_core::{ClusterState, Planner, ServicePortName, ServicePortPlan, testing};

#[path = "../tests/support/counting_allocator.rs"]
mod counting_allocator;

use counting_allocator::{CountingAllocator, live_bytes};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const ENDPOINTS: usize = 5;
const SIZES: [usize; 3] = [100, 1_000, 10_000];

/// One incremental step: apply one endpoint change, plan the dirty Service port(s).
fn one_change(
    planner: &Planner<'_>,
    state: &mut ClusterState,
    change: Change,
) -> BTreeMap<ServicePortName, Option<ServicePortPlan>> {
    planner.apply_and_plan(state, change)
}

/// The change for step `round`: endpoint 0 of a Service in the middle of the cluster flips
/// readiness (so every step is a real change).
fn change_for(services: usize, round: u64) -> Change {
    Change::UpsertSlice(testing::slice(services / 2, ENDPOINTS, round))
}

fn bench_one_change(c: &mut Criterion) {
    let node = testing::node();
    let config = testing::config();
    let planner = Planner::new(&node, &config);
    let mut group = c.benchmark_group("one_endpoint_change");
    for services in SIZES {
        let mut state = testing::state(services, ENDPOINTS);
        let mut round = 1u64;
        group.bench_with_input(BenchmarkId::from_parameter(services), &services, |b, &n| {
            b.iter_batched(
                || {
                    round += 1;
                    change_for(n, round)
                },
                |change| black_box(one_change(&planner, &mut state, change)),
                criterion::BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

fn bench_full_plan(c: &mut Criterion) {
    let node = testing::node();
    let config = testing::config();
    let planner = Planner::new(&node, &config);
    let state = testing::state(10_000, ENDPOINTS);
    let mut group = c.benchmark_group("full_plan");
    group.sample_size(10);
    group.bench_function("10000", |b| b.iter(|| black_box(planner.plan(&state))));
    group.finish();
}

/// Median time of one incremental step, measured directly (for the 10k/100 ratio).
fn median_step(services: usize) -> Duration {
    let node = testing::node();
    let config = testing::config();
    let planner = Planner::new(&node, &config);
    let mut state = testing::state(services, ENDPOINTS);
    let mut samples = Vec::with_capacity(2_000);
    for round in 0..2_000u64 {
        let change = change_for(services, round + 1);
        let start = Instant::now();
        black_box(one_change(&planner, &mut state, change));
        samples.push(start.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn report() {
    let before = live_bytes();
    let state = testing::state(10_000, ENDPOINTS);
    let after = live_bytes();
    let bytes = after - before;
    let endpoints = 10_000 * ENDPOINTS;
    println!(
        "state size: {} bytes for {} Services x {} endpoints = {:.1} bytes per endpoint \
         (everything the state holds, Services included; counting allocator)",
        bytes,
        state.service_count(),
        ENDPOINTS,
        bytes as f64 / endpoints as f64
    );
    drop(state);
    let before = live_bytes();
    let state = testing::state(1_000, 100);
    let after = live_bytes();
    println!(
        "state size for comparison: 1000 Services x 100 endpoints = {:.1} bytes per endpoint",
        (after - before) as f64 / 100_000.0
    );
    drop(state);

    let medians: Vec<(usize, Duration)> = SIZES.iter().map(|&n| (n, median_step(n))).collect();
    for (n, d) in &medians {
        println!("one endpoint change at {n} Services: median {d:?}");
    }
    let ratio = medians[2].1.as_secs_f64() / medians[0].1.as_secs_f64();
    println!("ratio 10k/100 (median one-change time): {ratio:.2} (target < 2)");
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench_one_change(&mut criterion);
    bench_full_plan(&mut criterion);
    criterion.final_summary();
    report();
}
