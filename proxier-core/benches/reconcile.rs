//! Reconciler cost of one endpoint change as the cluster grows (diff + apply through
//! the in-memory backends), and of a full sync that adopts an unchanged kernel.
//!
//! `cargo bench -p proxier-core --bench reconcile`. The incremental figure should not
//! grow with the number of services: compare 10000 with 100.

#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use proxier_core::backend::{MemoryAddressBackend, MemoryIpvsBackend};
use proxier_core::desired::{Protocol, Scheduler, SortedMap};
use proxier_core::{
    Desired, RealServer, RealServerKey, Reconciler, ReconcilerConfig, ServicePortName,
    ServicePortPlan, VirtualServer, VirtualServerKey, VirtualServerRole,
};

const ENDPOINTS: u32 = 5;

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

fn service_name(i: u32) -> ServicePortName {
    ServicePortName {
        namespace: format!("ns-{}", i % 50).into(),
        name: format!("svc-{i}").into(),
        port: "http".into(),
        protocol: Protocol::Tcp,
    }
}

fn endpoint(i: u32, e: u32) -> RealServerKey {
    RealServerKey {
        address: v4(0x0af4_0000 + i * 8 + e), // 10.244.x.y
        port: 8080,
    }
}

/// `services` ClusterIP services with [`ENDPOINTS`] endpoints each.
fn cluster(services: u32) -> Desired {
    let mut desired = Desired::default();
    for i in 0..services {
        let key = VirtualServerKey {
            address: v4(0x0a60_0000 + i), // 10.96.x.y
            port: 80,
            protocol: Protocol::Tcp,
        };
        let vs = VirtualServer {
            role: VirtualServerRole::ClusterIp,
            scheduler: Scheduler::RoundRobin,
            persistence_timeout: None,
            hash_source_port: false,
            real_servers: (0..ENDPOINTS)
                .map(|e| (endpoint(i, e), RealServer { weight: 1 }))
                .collect(),
        };
        desired.services.insert(
            service_name(i),
            ServicePortPlan {
                virtual_servers: SortedMap::from([(key, vs)]),
                ..Default::default()
            },
        );
    }
    desired
}

fn one_endpoint_change(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("reconcile_one_endpoint_change");
    for services in [100u32, 1_000, 10_000] {
        let mut desired = cluster(services);
        let ipvs = MemoryIpvsBackend::new();
        ipvs.set_recording(false);
        let mut reconciler = Reconciler::new(
            ipvs,
            MemoryAddressBackend::new(),
            ReconcilerConfig::default(),
        );
        runtime.block_on(reconciler.full_sync(&desired)).unwrap();
        let target = services / 2;
        let name = service_name(target);
        let dirty = BTreeSet::from([name.clone()]);
        let moving = endpoint(target, ENDPOINTS - 1);
        let mut present = true;
        group.bench_function(BenchmarkId::from_parameter(services), |b| {
            b.iter(|| {
                // Alternately remove and re-add one endpoint of one service.
                let real_servers = &mut desired
                    .services
                    .get_mut(&name)
                    .unwrap()
                    .virtual_servers
                    .values_mut()
                    .next()
                    .unwrap()
                    .real_servers;
                if present {
                    real_servers.remove(&moving);
                } else {
                    real_servers.insert(moving, RealServer { weight: 1 });
                }
                present = !present;
                let report = runtime
                    .block_on(reconciler.sync_services(&desired, &dirty))
                    .unwrap();
                // A TCP real server that goes takes weight 0 before it is deleted.
                assert_eq!(report.writes, if present { 1 } else { 2 });
                black_box(report)
            })
        });
    }
    group.finish();
}

fn full_sync_adoption(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("reconcile_full_sync_unchanged");
    group.sample_size(10);
    let services = 10_000;
    let desired = cluster(services);
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let mut reconciler = Reconciler::new(ipvs, addresses, ReconcilerConfig::default());
    runtime.block_on(reconciler.full_sync(&desired)).unwrap();
    group.bench_function(BenchmarkId::from_parameter(services), |b| {
        b.iter(|| {
            let report = runtime.block_on(reconciler.full_sync(&desired)).unwrap();
            assert_eq!(report.writes, 0);
            black_box(report)
        })
    });
    group.finish();
}

criterion_group!(benches, one_endpoint_change, full_sync_adoption);
criterion_main!(benches);
