//! Where the engine's heap goes, structure by structure, for a cluster of 1,000 Services × 5
//! endpoints (`MEMORY_SERVICES=10000` for another size): each part is built on its own through
//! the public API, as the [`Proxier`] builds it, and measured with a counting global allocator
//! (live bytes after minus before). Prints the breakdown in KiB and per Service
//! (`cargo test -p proxier-core --release --test memory_breakdown -- --nocapture`) and fails
//! when a part grows past its budget.
#![allow(clippy::unwrap_used)]

use proxier_core::backend::{MemoryAddressBackend, MemoryIpvsBackend};
use proxier_core::model::{Config, NodeContext};
use proxier_core::netfilter::{NetfilterTracker, empty_plan, plan_of_service};
use proxier_core::state::{Change, ClusterState};
use proxier_core::{Backends, Planner, Proxier, ProxierConfig, Reconciler, SyncKind};

#[path = "support/churn_cluster.rs"]
mod churn_cluster;
#[path = "support/counting_allocator.rs"]
mod counting_allocator;

use churn_cluster::{Accepting, ENDPOINTS, Empty, service, slice};
use counting_allocator::{CountingAllocator, live_bytes, peak_bytes, reset_peak};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn services() -> u32 {
    std::env::var("MEMORY_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000)
}

/// Bytes allocated by `build` and still live in what it returns.
fn measure<T>(build: impl FnOnce() -> T) -> (T, isize) {
    let before = live_bytes();
    let value = build();
    (value, live_bytes() - before)
}

fn changes(services: u32) -> Vec<Change> {
    (0..services)
        .flat_map(|i| {
            let name = format!("svc-{i}");
            [
                Change::UpsertService(service(&name, i)),
                Change::UpsertSlice(slice(&name, i * ENDPOINTS)),
            ]
        })
        .collect()
}

struct Row {
    part: &'static str,
    bytes: isize,
    /// Bytes per Service this part may hold (at 5 endpoints) before the test fails.
    budget_per_service: isize,
}

#[test]
fn the_engines_heap_by_structure() {
    let n = services();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = Config::default();
    let node = NodeContext::new("node-a", Vec::new(), Vec::new());
    let mut rows = Vec::new();

    let (state, bytes) = measure(|| {
        let mut state = ClusterState::new();
        for change in changes(n) {
            state.apply(change);
        }
        state
    });
    rows.push(Row {
        part: "cluster state (Services, EndpointSlices)",
        bytes,
        budget_per_service: 1_700,
    });

    let (desired, bytes) = measure(|| Planner::new(&node, &config).plan(&state));
    rows.push(Row {
        part: "IPVS plan (Desired)",
        bytes,
        budget_per_service: 450,
    });

    let (tracker, bytes) = measure(|| {
        let mut tracker = NetfilterTracker::new(empty_plan(&config));
        for service in state.services() {
            let fragment = plan_of_service(&state, service, &node, &config);
            tracker.set_service(&service.name, Some(fragment));
        }
        tracker.take_changes();
        tracker
    });
    rows.push(Row {
        part: "netfilter tracker",
        bytes,
        budget_per_service: 800,
    });

    // The reconciler over backends that already hold the plan (an adopting restart): what it
    // keeps beyond the backends' own tables.
    let (ipvs, addresses) = runtime.block_on(async {
        let ipvs = MemoryIpvsBackend::new();
        let addresses = MemoryAddressBackend::new();
        let mut seed = Reconciler::new(ipvs.clone(), addresses.clone(), Default::default());
        seed.full_sync(&desired).await.unwrap();
        ipvs.take_applied_ops();
        addresses.take_applied_ops();
        (ipvs, addresses)
    });
    let (reconciler, bytes) = measure(|| {
        runtime.block_on(async {
            let mut reconciler =
                Reconciler::new(ipvs.clone(), addresses.clone(), Default::default());
            let report = reconciler.full_sync(&desired).await.unwrap();
            assert_eq!(report.writes, 0, "the backends hold the plan already");
            reconciler
        })
    });
    let (_, cache) = measure(|| reconciler.cached_kernel().clone());
    rows.push(Row {
        part: "reconciler: cached kernel picture",
        bytes: cache,
        budget_per_service: 450,
    });
    rows.push(Row {
        part: "reconciler: claims and the rest",
        bytes: bytes - cache,
        budget_per_service: 650,
    });
    let (_, backend) = measure(|| ipvs.table());
    rows.push(Row {
        part: "in-memory IPVS backend's table (not the engine's)",
        bytes: backend,
        budget_per_service: 400,
    });
    drop((reconciler, tracker, desired));

    // The whole engine as the daemon runs it, for comparison with the sum of the parts; the
    // first sync's peak above what it leaves live is its transient allocations.
    let mut sync_peak = 0;
    let (proxier, total) = measure(|| {
        runtime.block_on(async {
            let memory = Backends::in_memory();
            memory.ipvs.set_recording(false);
            let addresses = memory.addresses.clone();
            let backends = Backends {
                ipvs: memory.ipvs,
                addresses: memory.addresses,
                netfilter: Accepting,
                conntrack: Empty,
            };
            let mut proxier =
                Proxier::new(ProxierConfig::new("node-a", Config::default()), backends).unwrap();
            for change in changes(n) {
                proxier.apply(change);
            }
            reset_peak();
            let before = live_bytes();
            proxier.sync(SyncKind::Full).await.unwrap();
            addresses.take_applied_ops();
            sync_peak = peak_bytes() - before.max(live_bytes());
            proxier
        })
    });
    let parts: isize = rows.iter().map(|row| row.bytes).sum();
    rows.push(Row {
        part: "the rest (Proxier's own maps, its backends' tables)",
        bytes: total - parts,
        budget_per_service: 400,
    });
    drop(proxier);

    let per = |bytes: isize| bytes / isize::try_from(n).unwrap();
    println!("engine heap at {n} Services x {ENDPOINTS} endpoints:");
    for row in &rows {
        println!(
            "  {:<58} {:>8} KiB  {:>6} B/Service",
            row.part,
            row.bytes / 1024,
            per(row.bytes)
        );
    }
    println!(
        "  {:<58} {:>8} KiB  {:>6} B/Service",
        "total (Proxier on in-memory backends, synced)",
        total / 1024,
        per(total)
    );
    println!(
        "  {:<58} {:>8} KiB  {:>6} B/Service",
        "first sync's transient peak (above what it leaves)",
        sync_peak / 1024,
        per(sync_peak)
    );
    for row in &rows {
        assert!(
            per(row.bytes) <= row.budget_per_service,
            "{}: {} B per Service, budget {}",
            row.part,
            per(row.bytes),
            row.budget_per_service
        );
    }
}
