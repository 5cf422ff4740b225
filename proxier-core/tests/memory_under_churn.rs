//! The engine's heap does not grow under endpoint and Service churn: what it holds after
//! thousands of changes is what a cluster of the same size needs, not a history of them, and
//! that stays under a bound per Service (the daemon's memory goal).
//!
//! A counting global allocator (this test binary's own) measures the live heap; the churn is
//! the soak benchmark's (`vm-bench soak`) in miniature: one endpoint replaced per change, a
//! Service added and deleted now and then, incremental syncs, a full resync every few hundred
//! changes.
#![allow(clippy::unwrap_used)]

use proxier_core::model::{Config, Endpoint, ServiceName, SliceKey};
use proxier_core::{Backends, Change, Proxier, ProxierConfig, SyncKind};

#[path = "support/churn_cluster.rs"]
mod churn_cluster;
#[path = "support/counting_allocator.rs"]
mod counting_allocator;

use churn_cluster::{Accepting, ENDPOINTS, Empty, pod_ip, service, slice};
use counting_allocator::{CountingAllocator, live_bytes};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn live_kib() -> isize {
    live_bytes() / 1024
}

const SERVICES: u32 = 1_000;
/// Heap per Service (5 endpoints) the engine may hold, with its in-memory backends and this
/// test's own copy of the slices: 5.0 KiB when this bound was set (10.6 KiB before the
/// compaction that bounds it).
const KIB_PER_SERVICE: isize = 6;

#[test]
fn the_engines_heap_does_not_grow_under_churn() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let memory = Backends::in_memory();
        let (ipvs, addresses) = (memory.ipvs.clone(), memory.addresses.clone());
        ipvs.set_recording(false);
        let backends = Backends {
            ipvs: memory.ipvs,
            addresses: memory.addresses,
            netfilter: Accepting,
            conntrack: Empty,
        };
        let mut proxier =
            Proxier::new(ProxierConfig::new("node-a", Config::default()), backends).unwrap();
        let mut slices = Vec::new();
        for i in 0..SERVICES {
            let name = format!("svc-{i}");
            proxier.apply(Change::UpsertService(service(&name, i)));
            let s = slice(&name, i * ENDPOINTS);
            proxier.apply(Change::UpsertSlice(s.clone()));
            slices.push(s);
        }
        proxier.sync(SyncKind::Full).await.unwrap();

        let mut next_pod = SERVICES * ENDPOINTS;
        let mut round = |proxier: &mut proxier_core::Proxier<_, _, _, _>, step: u32| {
            // One endpoint replaced.
            let s = &mut slices[(step % SERVICES) as usize];
            let at = (step / SERVICES % ENDPOINTS) as usize;
            s.endpoints[at] = Endpoint::ready(pod_ip(next_pod));
            next_pod += 1;
            proxier.apply(Change::UpsertSlice(s.clone()));
            // Every tenth change, a Service that comes and goes (a new name each time).
            if step.is_multiple_of(10) {
                let name = format!("tmp-{step}");
                proxier.apply(Change::UpsertService(service(&name, SERVICES + step % 100)));
                proxier.apply(Change::UpsertSlice(slice(&name, 1_000_000 + step)));
            }
            if step % 10 == 5 {
                let name = format!("tmp-{}", step - 5);
                proxier.apply(Change::DeleteSlice(SliceKey::new(
                    "churn",
                    format!("{name}-abc"),
                )));
                proxier.apply(Change::DeleteService(ServiceName::new("churn", name)));
            }
            if step % 500 == 499 {
                SyncKind::Full
            } else {
                SyncKind::Incremental
            }
        };

        let mut checkpoints = Vec::new();
        for step in 0..20_000 {
            let kind = round(&mut proxier, step);
            proxier.sync(kind).await.unwrap();
            addresses.take_applied_ops();
            if step % 5_000 == 4_999 {
                checkpoints.push(live_kib());
            }
        }
        println!("live heap after 5k, 10k, 15k, 20k changes: {checkpoints:?} KiB");
        let (warm, end) = (checkpoints[0], checkpoints[checkpoints.len() - 1]);
        let bound = KIB_PER_SERVICE * isize::try_from(SERVICES).unwrap();
        assert!(
            warm <= bound,
            "the heap holds {warm} KiB for {SERVICES} Services, more than {KIB_PER_SERVICE} KiB each"
        );
        assert!(
            end - warm <= warm / 50,
            "the heap grew from {warm} KiB to {end} KiB over 15,000 changes: {checkpoints:?}"
        );
    });
}
