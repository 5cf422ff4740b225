#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::backend::memory::AddressOp;
use crate::desired::VirtualServerKey;
use crate::health_check::{health_checks, services_without_local_endpoints};
use crate::model::{
    Endpoint, EndpointPort, EndpointSlice, Protocol, RouteOrigin, RouteRefusal, Service,
    ServiceCidr, ServicePortSpec, SliceKey, TrafficPolicy,
};
use crate::netfilter;
use crate::observed::ObservedVirtualServer;

const NODE: &str = "node-a";

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 96, 0, last))
}

fn memory_proxier() -> (MemoryProxier, MemoryIpvsBackend, MemoryAddressBackend) {
    memory_proxier_on(&MemoryIpvsBackend::new(), MemoryNetfilterBackend::default())
}

/// A proxier on `ipvs` (shared: a restart finds what the last one programmed), the tables
/// `netfilter` holds, and a fresh address backend.
fn memory_proxier_on(
    ipvs: &MemoryIpvsBackend,
    netfilter: MemoryNetfilterBackend,
) -> (MemoryProxier, MemoryIpvsBackend, MemoryAddressBackend) {
    let backends = Backends {
        ipvs: ipvs.clone(),
        netfilter,
        ..Backends::in_memory()
    };
    let ipvs = backends.ipvs.clone();
    let addresses = backends.addresses.clone();
    // Strict ARP: the generated ServiceCIDRs may be routed.
    let planner = Config {
        strict_arp: true,
        ..Config::default()
    };
    let config = ProxierConfig::new(NODE, planner);
    (Proxier::new(config, backends).unwrap(), ipvs, addresses)
}

/// One generated Service: which ClusterIP (from a pool small enough to collide), ports,
/// policy, an ExternalIP, a health-check port.
#[derive(Debug, Clone)]
struct ServiceSpec {
    id: u8,
    vip: u8,
    udp: bool,
    node_port: Option<u16>,
    local: bool,
    external_ip: Option<u8>,
}

/// One generated slice of a Service: endpoints as (address, ready, on this node).
#[derive(Debug, Clone)]
struct SliceSpec {
    service: u8,
    slice: u8,
    endpoints: Vec<(u8, bool, bool)>,
}

#[derive(Debug, Clone)]
enum Step {
    UpsertService(ServiceSpec),
    DeleteService(u8),
    UpsertSlice(SliceSpec),
    DeleteSlice(u8, u8),
    Node(Option<u8>),
    /// ServiceCIDR object `a` or `b` takes one of [`SERVICE_CIDR_RANGES`] (`None`: deleted).
    ServiceCidr(u8, Option<u8>),
    Sync,
    /// A full resync's kernel read starts (the memory backend answers with the table as
    /// it is now: the stalest a kernel read can be).
    BeginFullSync,
    /// The read in flight, if any, ends and the full resync finishes with it: at once
    /// (`false`, [`Proxier::finish_full_sync`]) or in slices (`true`,
    /// [`Proxier::start_repair`], as the driver does).
    FinishFullSync(bool),
    /// The next slice of a sliced repair, if one is in progress.
    RepairSlice,
}

fn service_name(id: u8) -> ServiceName {
    ServiceName::new("prop", format!("svc-{id}"))
}

impl ServiceSpec {
    /// Service `id`, a TCP ClusterIP 10.96.0.(id + 1):80 with nothing else.
    fn cluster_ip(id: u8) -> ServiceSpec {
        ServiceSpec {
            id,
            vip: id + 1,
            udp: false,
            node_port: None,
            local: false,
            external_ip: None,
        }
    }

    fn model(&self) -> Service {
        let protocol = if self.udp {
            Protocol::Udp
        } else {
            Protocol::Tcp
        };
        let mut service = Service::new(
            service_name(self.id),
            vec![ip(self.vip)],
            vec![ServicePortSpec {
                name: "p".into(),
                port: 80,
                protocol,
                node_port: self.node_port,
            }],
        );
        if self.local && self.node_port.is_some() {
            service.external_traffic_policy = TrafficPolicy::Local;
            service.health_check_node_port = Some(32_000 + u16::from(self.id));
        }
        if let Some(last) = self.external_ip {
            service.external_ips = vec![IpAddr::V4(Ipv4Addr::new(203, 0, 113, last))];
        }
        service
    }
}

impl SliceSpec {
    fn model(&self, udp: bool) -> EndpointSlice {
        let protocol = if udp { Protocol::Udp } else { Protocol::Tcp };
        EndpointSlice {
            key: SliceKey::new("prop", format!("svc-{}-{}", self.service, self.slice)),
            service: service_name(self.service),
            ports: vec![EndpointPort {
                name: "p".into(),
                port: 8080,
                protocol,
            }],
            endpoints: self
                .endpoints
                .iter()
                .map(|&(last, ready, here)| {
                    let mut endpoint = Endpoint::ready(IpAddr::V4(Ipv4Addr::new(10, 244, 0, last)));
                    endpoint.ready = ready;
                    endpoint.serving = ready;
                    endpoint.node_name = Some(Arc::from(if here { NODE } else { "node-b" }));
                    endpoint
                })
                .collect(),
            warnings: Vec::new(),
            trigger_time: None,
        }
    }
}

fn node_change(address: Option<u8>) -> Change {
    match address {
        Some(last) => {
            let address = IpAddr::V4(Ipv4Addr::new(192, 168, 0, last));
            Change::UpsertNode(NodeContext::new(NODE, vec![address], vec![address]))
        }
        None => Change::DeleteNode,
    }
}

/// Ranges the generated ServiceCIDRs take: one with some of the ClusterIPs, one with the
/// others, one with all, and one holding the node's address (refused while the node has it).
const SERVICE_CIDR_RANGES: [&str; 4] = [
    "10.96.0.0/30",
    "10.96.0.4/30",
    "10.96.0.0/24",
    "192.168.0.0/24",
];

fn service_cidr_change(object: u8, range: Option<u8>) -> Change {
    let name = if object == 0 { "a" } else { "b" };
    match range {
        Some(range) => Change::UpsertServiceCidr(ServiceCidr {
            name: name.to_owned(),
            cidrs: vec![SERVICE_CIDR_RANGES[usize::from(range)].parse().unwrap()],
        }),
        None => Change::DeleteServiceCidr(name.to_owned()),
    }
}

fn step() -> impl Strategy<Value = Step> {
    let service = (
        0u8..4,
        1u8..5,
        any::<bool>(),
        prop::option::of(30_000u16..30_004),
        any::<bool>(),
        prop::option::of(1u8..3),
    )
        .prop_map(|(id, vip, udp, node_port, local, external_ip)| {
            Step::UpsertService(ServiceSpec {
                id,
                vip,
                udp,
                node_port,
                local,
                external_ip,
            })
        });
    let slice = (
        0u8..4,
        0u8..2,
        prop::collection::vec((1u8..8, any::<bool>(), any::<bool>()), 0..4),
    )
        .prop_map(|(service, slice, endpoints)| {
            Step::UpsertSlice(SliceSpec {
                service,
                slice,
                endpoints,
            })
        });
    prop_oneof![
        4 => service,
        1 => (0u8..4).prop_map(Step::DeleteService),
        5 => slice,
        1 => (0u8..4, 0u8..2).prop_map(|(s, n)| Step::DeleteSlice(s, n)),
        1 => prop::option::of(10u8..12).prop_map(Step::Node),
        1 => (0u8..2, prop::option::of(0u8..4)).prop_map(|(o, r)| Step::ServiceCidr(o, r)),
        3 => Just(Step::Sync),
        1 => Just(Step::BeginFullSync),
        1 => any::<bool>().prop_map(Step::FinishFullSync),
        3 => Just(Step::RepairSlice),
    ]
}

/// The protocol each Service was last given, so its slices speak the same one.
fn apply_step(proxier: &mut MemoryProxier, udp: &mut [bool; 4], step: &Step) -> Option<Change> {
    Some(match step {
        Step::UpsertService(spec) => {
            udp[usize::from(spec.id)] = spec.udp;
            Change::UpsertService(spec.model())
        }
        Step::DeleteService(id) => Change::DeleteService(service_name(*id)),
        Step::UpsertSlice(spec) => Change::UpsertSlice(spec.model(udp[usize::from(spec.service)])),
        Step::DeleteSlice(service, slice) => {
            Change::DeleteSlice(SliceKey::new("prop", format!("svc-{service}-{slice}")))
        }
        Step::Node(address) => node_change(*address),
        Step::ServiceCidr(object, range) => service_cidr_change(*object, *range),
        Step::Sync | Step::BeginFullSync | Step::FinishFullSync(_) | Step::RepairSlice => {
            let _ = proxier;
            return None;
        }
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A virtual server another program made, on an address the proxier does not own.
fn foreign() -> (VirtualServerKey, ObservedVirtualServer) {
    let key = VirtualServerKey {
        address: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77)),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let mut vs = ObservedVirtualServer::default();
    vs.real_servers.insert(
        crate::desired::RealServerKey {
            address: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 78)),
            port: 8080,
        },
        crate::observed::ObservedRealServer::new(1),
    );
    (key, vs)
}

/// The kernel a fresh proxier leaves after one full sync of `changes` (with the foreign
/// virtual server beside).
fn fresh_kernel(
    rt: &tokio::runtime::Runtime,
    changes: &[Change],
) -> (MemoryProxier, MemoryIpvsBackend, MemoryAddressBackend) {
    let (mut fresh, fresh_ipvs, fresh_addresses) = memory_proxier();
    let (key, vs) = foreign();
    fresh_ipvs.insert_virtual_server(key, vs);
    for change in changes {
        fresh.apply(change.clone());
    }
    rt.block_on(fresh.sync(SyncKind::Full)).unwrap();
    (fresh, fresh_ipvs, fresh_addresses)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Incremental syncs after any sequence of changes, interleaved with full resyncs whose
    /// kernel read runs across them, leave the kernel as one full sync of the final state
    /// does, and a full sync after them writes nothing. Every full resync that finishes
    /// leaves the kernel as a fresh full sync of the state at that moment (no write of a
    /// change undone by a read older than it, no change lost), and the foreign virtual
    /// server stays as it was.
    #[test]
    fn incremental_syncs_converge_like_a_fresh_full_sync(
        steps in prop::collection::vec(step(), 1..40),
        slice in 1usize..4,
    ) {
        let rt = runtime();
        let (mut incremental, ipvs, addresses) = memory_proxier();
        incremental.config.reconciler.repair_slice = slice;
        let (foreign_key, foreign_vs) = foreign();
        ipvs.insert_virtual_server(foreign_key, foreign_vs.clone());
        let mut udp = [false; 4];
        let mut changes = Vec::new();
        // How many of `changes` the last sync took (a repair's slice takes none).
        let mut synced = 0;
        let mut reading = None;
        rt.block_on(incremental.sync(SyncKind::Full)).unwrap();
        // A full resync that finished: complete, no drift, the kernel as a fresh full sync
        // of the state now leaves it.
        let check_full = |report: &SyncReport, changes: &[Change]| -> Result<(), TestCaseError> {
            prop_assert!(report.is_complete(), "{:?}", report.ipvs.errors);
            prop_assert_eq!(report.kind, SyncKind::Full);
            prop_assert_eq!(report.ipvs.drift, Some(0), "nothing changed behind the proxier's back");
            let (_, fresh_ipvs, fresh_addresses) = fresh_kernel(&rt, changes);
            prop_assert_eq!(ipvs.table(), fresh_ipvs.table());
            prop_assert_eq!(addresses.addresses(), fresh_addresses.addresses());
            prop_assert_eq!(addresses.local_routes(), fresh_addresses.local_routes());
            Ok(())
        };
        for step in &steps {
            match step {
                Step::BeginFullSync => {
                    // As the driver: no new read while one runs or its repair goes on.
                    if reading.is_none() && !incremental.repairing() {
                        reading = Some(incremental.begin_full_sync());
                    }
                }
                Step::FinishFullSync(sliced) => {
                    if let Some(read) = reading.take() {
                        let read = rt.block_on(read);
                        synced = changes.len();
                        if *sliced {
                            let started = rt.block_on(incremental.start_repair(read)).unwrap();
                            if let Some(report) = started {
                                check_full(&report, &changes)?;
                            }
                        } else {
                            let report = rt.block_on(incremental.finish_full_sync(read)).unwrap();
                            check_full(&report, &changes)?;
                        }
                    }
                }
                Step::RepairSlice => {
                    if let Some(report) = rt.block_on(incremental.repair_step()) {
                        check_full(&report.unwrap(), &changes[..synced])?;
                    }
                }
                _ => match apply_step(&mut incremental, &mut udp, step) {
                    Some(change) => {
                        incremental.apply(change.clone());
                        changes.push(change);
                    }
                    None => {
                        rt.block_on(incremental.sync(SyncKind::Incremental)).unwrap();
                        synced = changes.len();
                    }
                },
            }
        }
        if let Some(read) = reading.take() {
            let read = rt.block_on(read);
            rt.block_on(incremental.finish_full_sync(read)).unwrap();
        }
        while incremental.repairing() {
            if let Some(report) = rt.block_on(incremental.repair_step()) {
                report.unwrap();
            }
        }
        let last = rt.block_on(incremental.sync(SyncKind::Incremental)).unwrap();
        prop_assert!(last.is_complete(), "{:?}", last.ipvs.errors);

        let (fresh, fresh_ipvs, fresh_addresses) = fresh_kernel(&rt, &changes);

        prop_assert_eq!(ipvs.table(), fresh_ipvs.table());
        let table = ipvs.table();
        prop_assert_eq!(table.get(&foreign_key), Some(&foreign_vs));
        prop_assert_eq!(addresses.addresses(), fresh_addresses.addresses());
        prop_assert_eq!(addresses.local_routes(), fresh_addresses.local_routes());
        prop_assert_eq!(incremental.routed_service_cidrs(), fresh.routed_service_cidrs());
        prop_assert_eq!(incremental.refused_service_cidrs(), fresh.refused_service_cidrs());
        prop_assert_eq!(incremental.desired(), fresh.desired());
        prop_assert_eq!(incremental.plan_size(), fresh.plan_size());
        // The per-Service bookkeeping equals the whole-state functions.
        let (state, node, config) = (incremental.state(), incremental.node(), &incremental.config().planner);
        prop_assert_eq!(incremental.netfilter_plan(), &netfilter::plan(state, node, config));
        // The digest the tables carry, kept by sums over the changes, is the whole plan's.
        let whole = netfilter::plan_digest(incremental.netfilter_plan(), incremental.netfilter.options()).unwrap();
        prop_assert_eq!(incremental.netfilter.digest(), Some(whole));
        prop_assert_eq!(incremental.health_checks(), &health_checks(state, node));
        prop_assert_eq!(incremental.no_local_endpoints(), services_without_local_endpoints(state, node));
        // The addresses decided from the Services alone (to bind them ahead of a start)
        // are those the plans bind.
        let planner = Planner::new(node, config);
        let from_services: std::collections::BTreeSet<IpAddr> =
            state.services().flat_map(|service| planner.bound_addresses(service)).collect();
        prop_assert_eq!(from_services, incremental.desired().bound_addresses());

        ipvs.take_applied_ops();
        addresses.take_applied_ops();
        let full = rt.block_on(incremental.sync(SyncKind::Full)).unwrap();
        prop_assert_eq!(full.ipvs.writes, 0);
        prop_assert!(ipvs.applied_ops().is_empty());
        prop_assert!(addresses.applied_ops().is_empty());
    }
}

/// Services 0 to `n - 1`, each a TCP ClusterIP 10.96.0.(id + 1):80 with one ready local
/// endpoint (10.244.0.1:8080).
fn add_cluster_ip_services(proxier: &mut MemoryProxier, n: u8) {
    for id in 0..n {
        proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(id).model()));
        let slice = SliceSpec {
            service: id,
            slice: 0,
            endpoints: vec![(1, true, true)],
        };
        proxier.apply(Change::UpsertSlice(slice.model(false)));
    }
}

#[test]
fn a_change_synced_during_a_full_resyncs_read_is_kept_and_drift_before_it_repaired() {
    let rt = runtime();
    let (mut proxier, ipvs, _) = memory_proxier();
    add_cluster_ip_services(&mut proxier, 3);
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    let key = |vip: u8| VirtualServerKey {
        address: ip(vip),
        port: 80,
        protocol: Protocol::Tcp,
    };
    // Drift before the read: someone deletes Service 2's virtual server.
    ipvs.remove_virtual_server(&key(3)).unwrap();
    let read = proxier.begin_full_sync();
    // While the read runs: Service 0 gets a second endpoint, Service 1 loses its own.
    let grown = SliceSpec {
        service: 0,
        slice: 0,
        endpoints: vec![(1, true, true), (2, true, true)],
    };
    proxier.apply(Change::UpsertSlice(grown.model(false)));
    proxier.apply(Change::DeleteSlice(SliceKey::new("prop", "svc-1-0")));
    let incremental = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(incremental.ipvs.writes >= 2, "{incremental:?}");
    ipvs.take_applied_ops();

    let report = rt
        .block_on(proxier.finish_full_sync(rt.block_on(read)))
        .unwrap();
    assert_eq!(report.kind, SyncKind::Full);
    assert_eq!(
        report.ipvs.drift,
        Some(1),
        "only the deleted virtual server drifted"
    );
    let ops = ipvs.take_applied_ops();
    assert!(
        ops.iter().all(|op| *op.virtual_server() == key(3)),
        "the full sync writes only the drifted virtual server, undoing nothing: {ops:?}"
    );
    let table = ipvs.table();
    assert_eq!(
        table[&key(1)].real_servers.len(),
        2,
        "the new endpoint stays"
    );
    assert!(
        table[&key(2)].real_servers.is_empty(),
        "the removed endpoint stays removed"
    );
    assert!(table.contains_key(&key(3)), "the drift is repaired");
}

/// The first sync takes the read begun ahead of it while the picture came, when that read
/// ended at most [`READ_AHEAD_MAX_AGE`] before; an older one is dropped and the kernel read
/// again. Which read a sync used shows in what it repairs: a virtual server deleted behind
/// the proxier's back after the read is repaired only by a read made after the deletion.
#[tokio::test(start_paused = true)]
async fn the_first_sync_uses_the_read_begun_ahead_unless_it_is_too_old() {
    let key = VirtualServerKey {
        address: ip(1),
        port: 80,
        protocol: Protocol::Tcp,
    };
    for (wait, reads_again) in [
        (Duration::from_secs(1), false),
        (READ_AHEAD_MAX_AGE + Duration::from_secs(1), true),
    ] {
        // A kernel already holding the plan (a restart), adopted by a first sync.
        let (mut proxier, ipvs, _) = memory_proxier();
        add_cluster_ip_services(&mut proxier, 1);
        proxier.sync(SyncKind::Full).await.unwrap();
        let (mut restarted, _, _) = memory_proxier_on(&ipvs, MemoryNetfilterBackend::default());
        restarted.read_ahead();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let listings = ipvs.read_calls().0;
        // After the read: the virtual server deleted behind the proxier's back; then the
        // first picture arrives.
        ipvs.remove_virtual_server(&key).unwrap();
        tokio::time::sleep(wait).await;
        add_cluster_ip_services(&mut restarted, 1);
        restarted.sync(SyncKind::Full).await.unwrap();
        assert_eq!(
            ipvs.read_calls().0 - listings,
            usize::from(reads_again),
            "after {wait:?}: the kernel listed again only for a read too old"
        );
        assert_eq!(
            ipvs.table().contains_key(&key),
            reads_again,
            "after {wait:?}: the deletion is seen (and repaired) only by a new read"
        );
    }
}

/// The first sync plans while the read begun ahead still runs, on the node's addresses read
/// for it (the plan of a NodePort depends on them): a restart on the kernel the last run
/// left then adopts it with no write, as a sync that planned after its read does.
#[tokio::test]
async fn the_first_sync_plans_while_the_read_begun_ahead_runs_and_adopts_what_it_planned() {
    let node_a = IpAddr::V4(Ipv4Addr::new(192, 168, 0, 10));
    let second = IpAddr::V4(Ipv4Addr::new(172, 20, 0, 10));
    let backends = Backends::in_memory();
    backends.addresses.set_node_addresses([node_a, second]);
    let (ipvs, addresses) = (backends.ipvs.clone(), backends.addresses.clone());
    let proxier_on = |ipvs: &MemoryIpvsBackend, addresses: &MemoryAddressBackend| {
        let mut config = ProxierConfig::new(NODE, Config::default());
        config.node_addresses_from_kernel = true;
        let backends = Backends {
            ipvs: ipvs.clone(),
            addresses: addresses.clone(),
            ..Backends::in_memory()
        };
        Proxier::new(config, backends).unwrap()
    };
    let services = |proxier: &mut MemoryProxier| {
        for id in 0..3 {
            let spec = ServiceSpec {
                id,
                vip: id + 1,
                udp: id == 1,
                node_port: Some(30_000 + u16::from(id)),
                local: false,
                external_ip: None,
            };
            proxier.apply(Change::UpsertService(spec.model()));
        }
    };
    let mut first = proxier_on(&ipvs, &addresses);
    services(&mut first);
    first.sync(SyncKind::Full).await.unwrap();
    let programmed = ipvs.table();
    let node_ports = programmed.keys().filter(|key| key.port >= 30_000).count();
    assert_eq!(
        node_ports, 6,
        "three NodePorts on each of the node's two addresses"
    );

    let listed = ipvs.read_calls().0;
    let mut restarted = proxier_on(&ipvs, &addresses);
    restarted.read_ahead();
    // The first picture arrives before the read's task has run at all.
    services(&mut restarted);
    assert!(
        restarted
            .read_ahead
            .as_ref()
            .is_some_and(|task| !task.is_finished())
    );
    let report = restarted.sync(SyncKind::Full).await.unwrap();
    assert!(report.replanned_all);
    assert_eq!(report.changed_ports, 3, "each Service's one port");
    assert_eq!(
        report.ipvs.writes, 0,
        "the kernel adopted as it was: {report}"
    );
    assert_eq!(ipvs.table(), programmed);
    assert!(
        restarted.planned_ahead.is_none(),
        "the sync took what was planned ahead"
    );
    assert_eq!(
        ipvs.read_calls().0 - listed,
        1,
        "one read, the one begun ahead"
    );
}

/// One ready endpoint (10.244.0.1:8080, on this node) for Service `id`.
fn one_endpoint(id: u8) -> Change {
    let slice = SliceSpec {
        service: id,
        slice: 0,
        endpoints: vec![(1, true, true)],
    };
    Change::UpsertSlice(slice.model(false))
}

/// How many times each of `addresses` was bound.
fn binds_of(addresses: &MemoryAddressBackend, of: &[IpAddr]) -> Vec<usize> {
    let ops = addresses.applied_ops();
    of.iter()
        .map(|address| {
            ops.iter()
                .filter(|op| **op == AddressOp::Add(*address))
                .count()
        })
        .collect()
}

/// A start binds the addresses of the Services it has before their endpoints come: each is
/// bound once, the first sync takes them as bound (writing its IPVS rules meanwhile, then
/// counting their answers as its writes) and leaves the kernel as a start without binding
/// ahead would, a Service added after the binding began included.
#[tokio::test]
async fn addresses_bound_ahead_are_bound_once_and_adopted_by_the_first_sync() {
    let (mut ahead, ipvs, addresses) = memory_proxier();
    ahead.read_ahead();
    for id in 0..3 {
        ahead.apply(Change::UpsertService(ServiceSpec::cluster_ip(id).model()));
    }
    assert!(ahead.can_bind_ahead().await);
    assert_eq!(ahead.bind_ahead().await, 3, "three ClusterIPs on their way");
    assert!(!ahead.can_bind_ahead().await, "one binding ahead at a time");
    ahead.apply(Change::UpsertService(ServiceSpec::cluster_ip(3).model()));
    for id in 0..4 {
        ahead.apply(one_endpoint(id));
    }
    let report = ahead.sync(SyncKind::Full).await.unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(
        report.ipvs.writes,
        4 + 4 + 4,
        "4 binds, 4 virtual servers, 4 real servers"
    );
    let all = [ip(1), ip(2), ip(3), ip(4)];
    assert_eq!(
        binds_of(&addresses, &all),
        [1, 1, 1, 1],
        "{:?}",
        addresses.applied_ops()
    );
    assert_eq!(addresses.addresses(), all.into_iter().collect());

    let (mut plain, plain_ipvs, plain_addresses) = memory_proxier();
    add_cluster_ip_services(&mut plain, 4);
    plain.sync(SyncKind::Full).await.unwrap();
    assert_eq!(ipvs.table(), plain_ipvs.table());
    assert_eq!(addresses.addresses(), plain_addresses.addresses());

    let again = ahead.sync(SyncKind::Full).await.unwrap();
    assert_eq!(again.ipvs.writes, 0, "nothing left to write: {again}");
}

/// A Service deleted while its address was being bound ahead: the first sync waits for
/// the binding before it unbinds the address, which is gone at the end.
#[tokio::test]
async fn an_address_bound_ahead_that_the_first_sync_no_longer_plans_is_unbound() {
    let (mut proxier, _, addresses) = memory_proxier();
    for id in 0..3 {
        proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(id).model()));
    }
    assert_eq!(proxier.bind_ahead().await, 3);
    proxier.apply(Change::DeleteService(service_name(2)));
    let report = proxier.sync(SyncKind::Full).await.unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(addresses.addresses(), [ip(1), ip(2)].into_iter().collect());
    let ops = addresses.applied_ops();
    let bound = ops.iter().position(|op| *op == AddressOp::Add(ip(3)));
    let unbound = ops.iter().position(|op| *op == AddressOp::Remove(ip(3)));
    assert!(
        bound < unbound && bound.is_some(),
        "bound, then unbound: {ops:?}"
    );
}

/// An address the kernel refused to bind ahead is a failed bind of the first sync, for
/// the Service that plans it, retried (incrementally, from the cache) once its backoff is
/// over.
#[tokio::test(start_paused = true)]
async fn an_address_refused_ahead_is_a_failed_bind_of_the_first_sync() {
    let (mut proxier, _, addresses) = memory_proxier();
    add_cluster_ip_services(&mut proxier, 2);
    addresses.fail_address(ip(2), BackendError::Other("refused".into()));
    assert_eq!(proxier.bind_ahead().await, 2);
    let report = proxier.sync(SyncKind::Full).await.unwrap();
    assert_eq!(report.ipvs.failed, 1, "{report}");
    assert!(
        report.ipvs.errors.iter().any(|(owner, _)| owner
            .as_ref()
            .is_some_and(|port| port.service() == service_name(1))),
        "the failure is Service 1's: {report}"
    );
    assert_eq!(addresses.addresses(), [ip(1)].into_iter().collect());
    addresses.clear_failure(&ip(2));
    tokio::time::advance(Duration::from_secs(2)).await;
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(addresses.addresses(), [ip(1), ip(2)].into_iter().collect());
}

/// A restart finds its addresses bound: nothing is bound ahead, and the first sync adopts
/// the kernel with no write.
#[tokio::test]
async fn a_link_already_holding_addresses_is_not_bound_ahead() {
    let backends = Backends::in_memory();
    let (ipvs, addresses) = (backends.ipvs.clone(), backends.addresses.clone());
    let proxier_on = || {
        let backends = Backends {
            ipvs: ipvs.clone(),
            addresses: addresses.clone(),
            ..Backends::in_memory()
        };
        Proxier::new(ProxierConfig::new(NODE, Config::default()), backends).unwrap()
    };
    let mut first = proxier_on();
    assert!(first.can_bind_ahead().await, "a fresh start on a bare link");
    add_cluster_ip_services(&mut first, 3);
    first.sync(SyncKind::Full).await.unwrap();
    assert!(!first.can_bind_ahead().await, "synced");
    let ops = addresses.applied_ops().len();

    let mut restarted = proxier_on();
    assert!(
        !restarted.can_bind_ahead().await,
        "a restart's link is full"
    );
    for id in 0..3 {
        restarted.apply(Change::UpsertService(ServiceSpec::cluster_ip(id).model()));
    }
    assert_eq!(restarted.bind_ahead().await, 0);
    for id in 0..3 {
        restarted.apply(one_endpoint(id));
    }
    let report = restarted.sync(SyncKind::Full).await.unwrap();
    assert_eq!(report.ipvs.writes, 0, "{report}");
    assert_eq!(addresses.applied_ops().len(), ops, "no address written");
}

/// A start judges the nftables tables a previous run left by what its full sync's read
/// listed beside the IPVS table (so adopting them costs no listing of its own): a table
/// deleted after that read goes unseen by the first sync (and is found by the next full
/// resync), while a read made after the deletion finds it and rewrites the tables.
#[tokio::test]
async fn a_start_adopts_the_nftables_tables_as_its_read_listed_them() {
    let (mut first, ipvs, _) = memory_proxier();
    add_cluster_ip_services(&mut first, 2);
    first.sync(SyncKind::Full).await.unwrap();
    let tables = first.netfilter.backend().clone();
    let table = "ip ipvs-proxier";
    assert!(tables.tables.contains(table), "{:?}", tables.tables);
    for read_before_the_deletion in [true, false] {
        let (mut restarted, _, _) = memory_proxier_on(&ipvs, tables.clone());
        add_cluster_ip_services(&mut restarted, 2);
        let read = read_before_the_deletion.then(|| restarted.begin_full_sync());
        let read = match read {
            Some(read) => Some(read.await),
            None => None,
        };
        restarted.netfilter.backend_mut().tables.remove(table);
        let read = match read {
            Some(read) => read,
            None => restarted.begin_full_sync().await,
        };
        let report = restarted.finish_full_sync(read).await.unwrap();
        assert_eq!(
            report.netfilter_written, !read_before_the_deletion,
            "read before the deletion: {read_before_the_deletion}"
        );
    }
}

#[test]
fn a_sliced_repair_lets_changes_sync_between_slices_and_repairs_drift() {
    let rt = runtime();
    let (mut proxier, ipvs, _) = memory_proxier();
    proxier.config.reconciler.repair_slice = 1;
    let slice_of = |service: u8, endpoints: Vec<(u8, bool, bool)>| {
        Change::UpsertSlice(
            SliceSpec {
                service,
                slice: 0,
                endpoints,
            }
            .model(false),
        )
    };
    add_cluster_ip_services(&mut proxier, 4);
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    let key = |vip: u8| VirtualServerKey {
        address: ip(vip),
        port: 80,
        protocol: Protocol::Tcp,
    };
    // Drift: Service 3's virtual server deleted; a virtual server nobody plans on the
    // dummy link's address of Service 0 (the proxier's), and a foreign one.
    ipvs.remove_virtual_server(&key(4)).unwrap();
    let stray = VirtualServerKey { port: 81, ..key(1) };
    let (foreign_key, foreign_vs) = foreign();
    ipvs.insert_virtual_server(stray, foreign_vs.clone());
    ipvs.insert_virtual_server(foreign_key, foreign_vs.clone());

    let read = rt.block_on(proxier.begin_full_sync());
    // A change while the read ran, synced before the repair starts.
    proxier.apply(slice_of(1, vec![(1, true, true), (2, true, true)]));
    rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert_eq!(
        rt.block_on(proxier.start_repair(read)).unwrap(),
        None,
        "slices remain"
    );
    assert!(proxier.repairing());
    // One slice, then a change that syncs before the next slice.
    assert!(rt.block_on(proxier.repair_step()).is_none());
    proxier.apply(slice_of(2, vec![(3, true, true)]));
    let between = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert_eq!(between.kind, SyncKind::Incremental);
    assert!(between.ipvs.writes >= 2, "{between:?}");
    assert!(proxier.repairing(), "the repair goes on after the change");
    let mut slices = 1;
    let report = loop {
        slices += 1;
        if let Some(report) = rt.block_on(proxier.repair_step()) {
            break report.unwrap();
        }
        assert!(slices < 20, "the repair never ends");
    };
    assert!(slices >= 3, "one virtual server per slice: {slices} slices");
    assert!(!proxier.repairing());
    assert_eq!(report.kind, SyncKind::Full);
    assert!(report.is_complete(), "{:?}", report.ipvs.errors);
    assert_eq!(
        report.ipvs.drift,
        Some(2),
        "the deleted virtual server and the stray one"
    );
    let table = ipvs.table();
    assert!(table.contains_key(&key(4)), "the deleted one is back");
    assert!(!table.contains_key(&stray), "the stray one is gone");
    assert_eq!(
        table.get(&foreign_key),
        Some(&foreign_vs),
        "the foreign one stays"
    );
    assert_eq!(
        table[&key(2)].real_servers.len(),
        2,
        "the change synced during the read stays"
    );
    let endpoint = crate::desired::RealServerKey {
        address: IpAddr::V4(Ipv4Addr::new(10, 244, 0, 3)),
        port: 8080,
    };
    assert_eq!(
        table[&key(3)].real_servers.keys().collect::<Vec<_>>(),
        vec![&endpoint],
        "the change synced between slices stays"
    );
    // Nothing left to do: a full sync now writes nothing.
    ipvs.take_applied_ops();
    let full = rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    assert_eq!((full.ipvs.writes, full.ipvs.drift), (0, Some(0)));
}

#[test]
fn full_resyncs_check_the_nftables_tables_and_rewrite_them_only_when_missing_or_due() {
    let rt = runtime();
    let (mut proxier, _, _) = memory_proxier();
    proxier.apply(Change::UpsertService(web(1)));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    let replaces = |proxier: &MemoryProxier| {
        proxier
            .netfilter
            .backend()
            .scripts
            .iter()
            .filter(|script| script.contains("delete table"))
            .count()
    };
    assert_eq!(replaces(&proxier), 1, "the first sync writes the tables");
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    assert_eq!(replaces(&proxier), 1, "tables in place: not rewritten");
    // Someone deletes the table (`nft flush ruleset`): the next resync rewrites it.
    proxier.netfilter.backend_mut().tables.clear();
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    assert_eq!(replaces(&proxier), 2);
    assert!(
        proxier
            .netfilter
            .backend()
            .tables
            .contains("ip ipvs-proxier")
    );
    // The rewrite period passed: rewritten although present.
    proxier.config.netfilter_full_sync_period = Duration::ZERO;
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    assert_eq!(replaces(&proxier), 3);
}

fn web(vip: u8) -> Service {
    ServiceSpec {
        id: 0,
        vip,
        udp: false,
        node_port: None,
        local: false,
        external_ip: None,
    }
    .model()
}

#[test]
fn an_unchanged_change_asks_for_no_sync() {
    let (mut proxier, _, _) = memory_proxier();
    assert!(proxier.apply(Change::UpsertService(web(1))));
    runtime().block_on(proxier.sync(SyncKind::Full)).unwrap();
    assert!(!proxier.has_pending_changes());
    assert!(!proxier.apply(Change::UpsertService(web(1))));
    assert!(!proxier.has_pending_changes());
    assert!(proxier.apply(Change::UpsertService(web(2))));
}

#[test]
fn an_incremental_sync_touches_only_the_changed_service() {
    let rt = runtime();
    let backends = Backends::in_memory();
    let ipvs = backends.ipvs.clone();
    let mut proxier = Proxier::new(ProxierConfig::new(NODE, Config::default()), backends).unwrap();
    for id in 0..50u8 {
        proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(id).model()));
    }
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    ipvs.take_applied_ops();
    let spec = SliceSpec {
        service: 7,
        slice: 0,
        endpoints: vec![(1, true, true)],
    };
    proxier.apply(Change::UpsertSlice(spec.model(false)));
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert_eq!(report.changed_ports, 1);
    assert_eq!(report.ipvs.writes, 1, "one real server added");
    assert_eq!(ipvs.applied_ops().len(), 1);
    assert!(
        report.netfilter_written,
        "the endpoint's hairpin element is new"
    );
    let script = proxier.netfilter.backend().scripts.last().unwrap();
    assert!(
        script.starts_with("add element") && !script.contains("table ip"),
        "only elements change: {script}"
    );
}

#[test]
fn stale_flows_are_deleted_for_udp_ports_only() {
    let rt = runtime();
    let (mut proxier, _, _) = memory_proxier();
    // Service 0 TCP, service 1 UDP, each with one endpoint from the first sync.
    let udp = ServiceSpec {
        udp: true,
        ..ServiceSpec::cluster_ip(1)
    };
    proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(0).model()));
    proxier.apply(Change::UpsertService(udp.model()));
    proxier.apply(one_endpoint(0));
    let udp_slice = |endpoints| SliceSpec {
        service: 1,
        slice: 0,
        endpoints,
    };
    proxier.apply(Change::UpsertSlice(
        udp_slice(vec![(1, true, true)]).model(true),
    ));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    let calls = |proxier: &MemoryProxier| proxier.conntrack.as_ref().unwrap().calls.clone();
    // The UDP ClusterIP got its first endpoint: flows to it go (none for the TCP one).
    let vip = SocketAddr::new(ip(2), 80);
    assert_eq!(calls(&proxier), vec![vec![FlowFilter::to_service(vip)]]);

    // Both lose their endpoint: only the UDP one's flows to it go.
    proxier.apply(Change::UpsertSlice(
        SliceSpec {
            service: 0,
            slice: 0,
            endpoints: Vec::new(),
        }
        .model(false),
    ));
    proxier.apply(Change::UpsertSlice(udp_slice(Vec::new()).model(true)));
    rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    let endpoint = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 244, 0, 1)), 8080);
    assert_eq!(
        calls(&proxier)[1..],
        [vec![FlowFilter::to_removed_endpoint(vip, endpoint)]]
    );
}

#[test]
fn changes_applied_while_every_port_awaits_a_replan_are_planned_by_it() {
    let rt = runtime();
    let (mut proxier, ipvs, _) = memory_proxier();
    proxier.apply(Change::UpsertService(web(1)));
    let mut other = ServiceSpec::cluster_ip(1).model();
    proxier.apply(Change::UpsertService(other.clone()));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    // New node facts: the next sync re-plans every port, so the engine does not keep the
    // changes that come meanwhile as dirty ports of their own.
    proxier.apply(node_change(Some(11)));
    other.cluster_ips = vec![IpAddr::V4(Ipv4Addr::new(10, 96, 0, 77))];
    assert!(proxier.apply(Change::UpsertService(other)));
    assert!(proxier.apply(Change::DeleteService(web(1).name.clone())));
    assert!(proxier.has_pending_changes());
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(report.replanned_all);
    let addresses: BTreeSet<IpAddr> = ipvs.table().keys().map(|key| key.address).collect();
    assert_eq!(
        addresses,
        BTreeSet::from([IpAddr::V4(Ipv4Addr::new(10, 96, 0, 77))]),
        "the moved Service at its new ClusterIP, the deleted one gone"
    );
    assert!(!proxier.has_pending_changes());
}

#[test]
fn a_node_change_replans_every_port() {
    let rt = runtime();
    let (mut proxier, _, _) = memory_proxier();
    let mut spec = ServiceSpec {
        id: 0,
        vip: 1,
        udp: false,
        node_port: Some(30_001),
        local: false,
        external_ip: None,
    };
    proxier.apply(Change::UpsertService(spec.model()));
    spec.id = 1;
    spec.vip = 2;
    proxier.apply(Change::UpsertService(spec.model()));
    proxier.apply(node_change(Some(10)));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    proxier.apply(node_change(Some(11)));
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(report.replanned_all);
    assert_eq!(
        report.changed_ports, 2,
        "both NodePorts move to the new address"
    );
    let node_port_addresses: BTreeSet<IpAddr> = proxier
        .desired()
        .virtual_servers()
        .filter(|(_, key, _)| key.port == 30_001)
        .map(|(_, key, _)| key.address)
        .collect();
    assert_eq!(
        node_port_addresses,
        BTreeSet::from([IpAddr::V4(Ipv4Addr::new(192, 168, 0, 11))])
    );
}

#[test]
fn trigger_times_after_start_are_reported_once() {
    let rt = runtime();
    let (mut proxier, _, _) = memory_proxier();
    proxier.record_trigger_time(SystemTime::UNIX_EPOCH);
    proxier.record_trigger_time(SystemTime::now());
    proxier.apply(Change::UpsertService(web(1)));
    let report = rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    assert_eq!(report.programming_latencies.len(), 1);
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(report.programming_latencies.is_empty());
}

#[test]
fn a_slice_brings_its_trigger_time_and_only_a_change_is_measured() {
    let rt = runtime();
    let (mut proxier, _, _) = memory_proxier();
    proxier.apply(Change::UpsertService(web(1)));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();

    let mut slice = SliceSpec {
        service: 0,
        slice: 0,
        endpoints: vec![(2, true, true), (3, true, false)],
    }
    .model(false);
    slice.trigger_time = Some(SystemTime::now());
    assert!(proxier.apply(Change::UpsertSlice(slice.clone())));
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert_eq!(report.programming_latencies.len(), 1);

    // The same endpoints, stamped again: the trigger time is not part of the state.
    slice.trigger_time = Some(SystemTime::now());
    assert!(!proxier.apply(Change::UpsertSlice(slice.clone())));
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(report.programming_latencies.is_empty());

    // A change stamped before the proxier was built measures downtime, not programming.
    slice.endpoints.pop();
    slice.trigger_time = Some(SystemTime::UNIX_EPOCH);
    assert!(proxier.apply(Change::UpsertSlice(slice)));
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert_eq!(report.ipvs.deletes, 1, "the endpoint went");
    assert!(report.programming_latencies.is_empty());
}

#[test]
fn the_nodes_eligibility_is_a_fact_of_the_engine_that_needs_no_replan() {
    let rt = runtime();
    let (mut proxier, _, _) = memory_proxier();
    assert!(
        proxier.node_eligible(),
        "eligible until a Node object says otherwise"
    );
    proxier.apply(Change::UpsertService(web(1)));
    let node = NodeContext::new(NODE, vec![ip(200)], Vec::new());
    proxier.apply(Change::UpsertNode(node.clone()));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();

    let mut leaving = node.clone();
    leaving.eligible = false;
    assert!(
        proxier.apply(Change::UpsertNode(leaving.clone())),
        "observers must hear of it"
    );
    assert!(!proxier.node_eligible());
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(
        !report.replanned_all,
        "the plan does not depend on eligibility"
    );
    assert_eq!(report.ipvs.writes, 0);
    assert!(!proxier.apply(Change::UpsertNode(leaving)), "nothing new");

    assert!(proxier.apply(Change::UpsertNode(node)));
    assert!(proxier.node_eligible());
    assert!(proxier.apply(Change::DeleteNode));
    assert!(!proxier.node_eligible(), "a deleted node takes no traffic");
}

#[test]
fn cleanup_removes_what_the_proxier_owns_and_nothing_else() {
    let rt = runtime();
    let (mut proxier, ipvs, addresses) = memory_proxier();
    let foreign = crate::desired::VirtualServerKey {
        address: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 99)),
        port: 80,
        protocol: Protocol::Tcp,
    };
    ipvs.insert_virtual_server(foreign, crate::observed::ObservedVirtualServer::default());
    proxier.apply(Change::UpsertService(web(1)));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    assert_eq!(ipvs.table().len(), 2);
    let report = rt.block_on(proxier.cleanup());
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.virtual_servers, 1);
    assert!(report.link_deleted);
    assert_eq!(
        ipvs.table().keys().copied().collect::<Vec<_>>(),
        vec![foreign]
    );
    assert!(addresses.applied_ops().contains(&AddressOp::DeleteLink));
    let cleanup_script = proxier.netfilter.backend().scripts.last().unwrap();
    assert!(cleanup_script.contains("delete table"), "{cleanup_script}");
}

#[test]
fn node_ports_follow_the_kernels_addresses() {
    let rt = runtime();
    let backends = Backends::in_memory();
    let addresses = backends.addresses.clone();
    let node_a = IpAddr::V4(Ipv4Addr::new(192, 168, 0, 10));
    let second = IpAddr::V4(Ipv4Addr::new(172, 20, 0, 10));
    let link_local = IpAddr::V4(Ipv4Addr::new(169, 254, 3, 3));
    addresses.set_node_addresses([node_a, second]);
    let mut config = ProxierConfig::new(NODE, Config::default());
    config.node_addresses_from_kernel = true;
    let mut proxier = Proxier::new(config, backends).unwrap();
    // The Node object names only one address: the kernel's list wins.
    proxier.apply(Change::UpsertNode(NodeContext::new(
        NODE,
        vec![node_a],
        vec![node_a],
    )));
    let spec = ServiceSpec {
        id: 0,
        vip: 1,
        udp: false,
        node_port: Some(30_002),
        local: false,
        external_ip: None,
    };
    proxier.apply(Change::UpsertService(spec.model()));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    let node_ports = |proxier: &MemoryProxier| -> BTreeSet<IpAddr> {
        proxier
            .desired()
            .virtual_servers()
            .filter(|(_, key, _)| key.port == 30_002)
            .map(|(_, key, _)| key.address)
            .collect()
    };
    assert_eq!(node_ports(&proxier), BTreeSet::from([node_a, second]));

    // An address added, one removed: only an address event's refresh is needed.
    addresses.set_node_addresses([node_a, link_local]);
    assert!(rt.block_on(proxier.refresh_node_addresses()));
    assert!(!rt.block_on(proxier.refresh_node_addresses()), "unchanged");
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(report.replanned_all);
    assert_eq!(node_ports(&proxier), BTreeSet::from([node_a, link_local]));
    assert_eq!(
        report.ipvs.deletes, 1,
        "the NodePort on the removed address goes"
    );

    // A full sync reads the node's addresses beside the table and takes them at its end ...
    addresses.set_node_addresses([node_a]);
    let read = proxier.begin_full_sync();
    let read = rt.block_on(read);
    addresses.set_node_addresses([node_a, second]);
    rt.block_on(proxier.finish_full_sync(read)).unwrap();
    assert_eq!(
        node_ports(&proxier),
        BTreeSet::from([node_a]),
        "the addresses as read"
    );
    // ... unless an address event's refresh during the read saw newer ones.
    addresses.set_node_addresses([node_a]);
    let read = proxier.begin_full_sync();
    addresses.set_node_addresses([node_a, second]);
    assert!(rt.block_on(proxier.refresh_node_addresses()));
    rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    let read = rt.block_on(read);
    rt.block_on(proxier.finish_full_sync(read)).unwrap();
    assert_eq!(
        node_ports(&proxier),
        BTreeSet::from([node_a, second]),
        "the refresh is newer than the read"
    );
}

/// Counts what the driver loop does.
#[derive(Default)]
struct Counting {
    full: usize,
    incremental: usize,
}

impl driver::SyncObserver<MemoryProxier> for Counting {
    fn synced(&mut self, _: &MemoryProxier, outcome: &driver::SyncOutcome<'_>) {
        match outcome.kind {
            SyncKind::Full => self.full += 1,
            SyncKind::Incremental => self.incremental += 1,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_driver_keeps_its_full_resync_period_under_constant_changes() {
    let (mut proxier, ipvs, _) = memory_proxier();
    let (handle, commands) = ProxierHandle::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let changes = tokio::spawn(async move {
        // A change every 100 ms for two minutes, then the loop is stopped.
        for step in 0..1200u32 {
            let spec = SliceSpec {
                service: 0,
                slice: 0,
                endpoints: vec![(1 + (step % 5) as u8, true, true)],
            };
            handle.apply(vec![Change::UpsertSlice(spec.model(false))]);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = stop.send(true);
        handle
    });
    proxier.apply(Change::UpsertService(web(1)));
    let mut counting = Counting::default();
    let timing = DriverConfig::new(Duration::from_secs(30), Duration::ZERO, 2);
    driver::run(&mut proxier, timing, commands, &mut counting, stopped).await;
    let _handle = changes.await.unwrap();
    // The first sync at 0 s, then one every 30 s: 0, 30, 60, 90 and 120 s at most.
    assert!(
        (4..=5).contains(&counting.full),
        "{} full syncs in 120 s",
        counting.full
    );
    assert!(counting.incremental > 1000, "{}", counting.incremental);
    // The last endpoint is in the kernel.
    let key = VirtualServerKey {
        address: ip(1),
        port: 80,
        protocol: Protocol::Tcp,
    };
    assert_eq!(ipvs.table()[&key].real_servers.len(), 1);
}

/// A ServiceCIDR of 10.96.0.0/24 named `name`.
fn service_cidr(name: &str, cidr: &str) -> Change {
    Change::UpsertServiceCidr(ServiceCidr {
        name: name.to_owned(),
        cidrs: vec![cidr.parse().unwrap()],
    })
}

#[test]
fn a_service_cidr_routes_its_range_and_unbinds_the_cluster_ips_in_it_then_binds_them_again_before_the_route_goes()
 {
    let rt = runtime();
    let (mut proxier, _, addresses) = memory_proxier();
    proxier.apply(Change::UpsertService(web(1)));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    assert_eq!(addresses.addresses(), [ip(1)].into_iter().collect());
    addresses.take_applied_ops();

    assert!(proxier.apply(service_cidr("kubernetes", "10.96.0.0/24")));
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(report.is_complete(), "{:?}", report.ipvs.errors);
    let net: IpNet = "10.96.0.0/24".parse().unwrap();
    assert_eq!(proxier.routed_service_cidrs(), [net]);
    assert_eq!(addresses.local_routes(), [net].into_iter().collect());
    assert!(addresses.addresses().is_empty());
    // The route first, then the address under it goes; it was the link's last IPv4 address,
    // whose removal drops every IPv4 route through the link (as the kernel does), so the
    // route goes in again at once, not at the next full resync.
    assert_eq!(
        addresses.take_applied_ops(),
        vec![
            AddressOp::AddRoute(net),
            AddressOp::Remove(ip(1)),
            AddressOp::AddRoute(net)
        ]
    );
    let v4 = proxier.netfilter_plan().v4.as_ref().unwrap();
    assert_eq!(v4.routed_service_cidrs, vec![net]);

    // Being deleted is still an upsert: the range stays routed until the object is gone.
    assert!(!proxier.apply(service_cidr("kubernetes", "10.96.0.0/24")));
    assert!(proxier.apply(Change::DeleteServiceCidr("kubernetes".into())));
    let report = rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert!(report.is_complete(), "{:?}", report.ipvs.errors);
    assert!(addresses.local_routes().is_empty());
    assert_eq!(addresses.addresses(), [ip(1)].into_iter().collect());
    // The address first, then the route that covered it goes.
    assert_eq!(
        addresses.take_applied_ops(),
        vec![AddressOp::Add(ip(1)), AddressOp::RemoveRoute(net)]
    );
    assert!(
        proxier
            .netfilter_plan()
            .v4
            .as_ref()
            .unwrap()
            .routed_service_cidrs
            .is_empty()
    );

    // A route change with no Service in it still reaches the link.
    assert!(proxier.apply(service_cidr("extra", "10.100.0.0/16")));
    rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    let extra: IpNet = "10.100.0.0/16".parse().unwrap();
    assert_eq!(addresses.local_routes(), [extra].into_iter().collect());
    assert_eq!(
        addresses.take_applied_ops(),
        vec![AddressOp::AddRoute(extra)]
    );
}

#[test]
fn a_service_cidr_holding_a_node_address_is_refused_until_the_node_lets_go_of_it() {
    let rt = runtime();
    let (mut proxier, _, addresses) = memory_proxier();
    proxier.apply(Change::UpsertService(web(1)));
    proxier.apply(node_change(Some(10)));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();

    // 10.96.0.0/16 is fine; 192.168.0.0/16 holds the node's 192.168.0.10.
    proxier.apply(Change::UpsertServiceCidr(ServiceCidr {
        name: "mixed".into(),
        cidrs: vec!["192.168.0.0/16".parse().unwrap()],
    }));
    rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    let wide: IpNet = "192.168.0.0/16".parse().unwrap();
    assert!(proxier.routed_service_cidrs().is_empty());
    assert_eq!(
        proxier.refused_service_cidrs(),
        [RefusedRoute {
            cidr: wide,
            origin: RouteOrigin::ServiceCidr("mixed".into()),
            reason: RouteRefusal::HoldsNodeAddress("192.168.0.10".parse().unwrap()),
        }]
    );
    assert!(addresses.local_routes().is_empty());
    assert_eq!(addresses.addresses(), [ip(1)].into_iter().collect());

    // The node's address moves out of the range: it is routed now.
    proxier.apply(Change::UpsertNode(NodeContext::new(
        NODE,
        vec!["172.16.0.10".parse().unwrap()],
        vec!["172.16.0.10".parse().unwrap()],
    )));
    rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert_eq!(proxier.routed_service_cidrs(), [wide]);
    assert!(proxier.refused_service_cidrs().is_empty());
    assert_eq!(addresses.local_routes(), [wide].into_iter().collect());
}

#[test]
fn configured_routes_and_service_cidrs_are_both_routed_and_unsafe_ones_refused_alike() {
    let rt = runtime();
    let backends = Backends::in_memory();
    let addresses = backends.addresses.clone();
    let planner = Config {
        strict_arp: true,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        service_cidr_routes: vec!["10.96.0.0/24".parse().unwrap()],
        ..Config::default()
    };
    let mut proxier = Proxier::new(ProxierConfig::new(NODE, planner), backends).unwrap();
    proxier.apply(service_cidr("pods", "10.244.0.0/24"));
    proxier.apply(service_cidr("kubernetes", "10.96.0.0/24"));
    proxier.apply(service_cidr("more", "10.97.0.0/24"));
    rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
    let routed: Vec<IpNet> = vec![
        "10.96.0.0/24".parse().unwrap(),
        "10.97.0.0/24".parse().unwrap(),
    ];
    assert_eq!(proxier.routed_service_cidrs(), routed.as_slice());
    assert_eq!(addresses.local_routes(), routed.iter().copied().collect());
    assert_eq!(proxier.refused_service_cidrs().len(), 1);
    assert_eq!(
        proxier.refused_service_cidrs()[0].reason,
        RouteRefusal::OverlapsClusterCidr("10.244.0.0/16".parse().unwrap())
    );
    // The object going away leaves the configured range routed.
    proxier.apply(Change::DeleteServiceCidr("kubernetes".into()));
    proxier.apply(Change::DeleteServiceCidr("more".into()));
    rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    assert_eq!(
        addresses.local_routes(),
        ["10.96.0.0/24".parse().unwrap()].into_iter().collect()
    );
}

#[test]
fn without_strict_arp_no_range_is_routed() {
    let backends = Backends::in_memory();
    let mut proxier = Proxier::new(ProxierConfig::new(NODE, Config::default()), backends).unwrap();
    assert!(proxier.apply(service_cidr("kubernetes", "10.96.0.0/24")));
    assert!(proxier.routed_service_cidrs().is_empty());
    assert_eq!(
        proxier.refused_service_cidrs()[0].reason,
        RouteRefusal::StrictArpOff
    );
}

/// Records scripts as [`MemoryNetfilterBackend`] does, and applies them detached too: each
/// detached update waits for a permit of `gate` (closed at first) and fails while `fail` is
/// set.
#[derive(Debug, Clone)]
struct DetachedNetfilter {
    tables: Arc<tokio::sync::Mutex<MemoryNetfilterBackend>>,
    gate: Arc<tokio::sync::Semaphore>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl DetachedNetfilter {
    fn new() -> Self {
        DetachedNetfilter {
            tables: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            fail: Arc::default(),
        }
    }

    async fn scripts(&self) -> Vec<String> {
        self.tables.lock().await.scripts.clone()
    }
}

impl netfilter::NetfilterBackend for DetachedNetfilter {
    async fn apply(&mut self, script: &str) -> Result<(), netfilter::NetfilterError> {
        self.tables.lock().await.apply(script).await
    }

    fn apply_detached(&self, script: String) -> Option<netfilter::PendingApply> {
        let (tables, gate, fail) = (self.tables.clone(), self.gate.clone(), self.fail.clone());
        Some(Box::pin(async move {
            gate.acquire().await.unwrap().forget();
            let mut tables = tables.lock().await;
            if fail.load(std::sync::atomic::Ordering::SeqCst) {
                tables.fail_next = Some("refused".to_owned());
            }
            tables.apply(&script).await
        }))
    }

    fn list_tables(&self) -> Option<netfilter::PendingTableList> {
        let tables = self.tables.clone();
        Some(Box::pin(async move {
            let listing = tables.lock().await.list_tables();
            match listing {
                Some(listing) => listing.await,
                None => Ok(BTreeSet::new()),
            }
        }))
    }
}

type DetachedProxier =
    Proxier<MemoryIpvsBackend, MemoryAddressBackend, DetachedNetfilter, MemoryConntrack>;

/// A proxier on a [`DetachedNetfilter`] (its gate closed) and in-memory backends.
fn detached_proxier() -> (DetachedProxier, DetachedNetfilter, MemoryIpvsBackend) {
    let nft = DetachedNetfilter::new();
    let ipvs = MemoryIpvsBackend::new();
    let backends = Backends {
        ipvs: ipvs.clone(),
        addresses: MemoryAddressBackend::new(),
        netfilter: nft.clone(),
        conntrack: MemoryConntrack::default(),
    };
    let config = ProxierConfig::new(NODE, Config::default());
    (Proxier::new(config, backends).unwrap(), nft, ipvs)
}

/// Until the nftables update in flight has ended.
async fn update_ended(proxier: &DetachedProxier) {
    let ended = proxier.netfilter_update_ended();
    while !proxier.netfilter_update_finished() {
        ended.notified().await;
    }
}

#[tokio::test]
async fn an_incremental_sync_does_not_wait_for_its_nftables_update_and_later_elements_wait_for_it()
{
    let (mut proxier, nft, ipvs) = detached_proxier();
    proxier.detach_netfilter_updates(true);
    proxier.apply(Change::UpsertService(web(1)));
    // The first sync replaces the tables within the sync, detached or not.
    let first = proxier.sync(SyncKind::Full).await.unwrap();
    assert!(first.netfilter_written && !first.netfilter_pending);
    assert_eq!(nft.scripts().await.len(), 1);
    let holds = |vip: u8| ipvs.table().keys().any(|key| key.address == ip(vip));

    // A new Service: its virtual server is written while its elements are on their way.
    let second = ServiceSpec::cluster_ip(1);
    proxier.apply(Change::UpsertService(second.model()));
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(report.is_complete());
    assert!(report.netfilter_written && report.netfilter_pending);
    assert!(holds(2), "IPVS did not wait for nft");
    assert_eq!(nft.scripts().await.len(), 1, "the update waits at the gate");
    assert!(proxier.netfilter_updating());

    // Another while the first update is in flight: IPVS again at once, its elements kept.
    let third = ServiceSpec::cluster_ip(2);
    proxier.apply(Change::UpsertService(third.model()));
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(holds(3));
    assert!(!report.netfilter_written && report.netfilter_pending);

    // The first update ends; the next sync takes its answer and starts the one the third
    // Service's elements waited for.
    nft.gate.add_permits(1);
    update_ended(&proxier).await;
    let scripts = nft.scripts().await;
    assert_eq!(scripts.len(), 2);
    assert!(scripts[1].contains("10.96.0.2 . tcp . 80") && !scripts[1].contains("10.96.0.3"));
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(report.netfilter_settled.is_some());
    assert!(report.netfilter_written && report.netfilter_pending);
    nft.gate.add_permits(1);
    update_ended(&proxier).await;
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(report.netfilter_settled.is_some() && !report.netfilter_written);
    assert!(!proxier.netfilter_updating(), "nothing waited");
    let scripts = nft.scripts().await;
    assert!(scripts[2].contains("10.96.0.3 . tcp . 80") && !scripts[2].contains("10.96.0.2"));
    // The digest the tables carry, kept over detached updates, is the whole plan's.
    let whole =
        netfilter::plan_digest(proxier.netfilter_plan(), proxier.netfilter.options()).unwrap();
    assert_eq!(proxier.netfilter.digest(), Some(whole));

    // With detaching off, a sync waits for the update in flight and writes its own.
    proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(3).model()));
    proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(proxier.netfilter_updating());
    proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(4).model()));
    proxier.detach_netfilter_updates(false);
    nft.gate.add_permits(1);
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(report.netfilter_settled.is_some());
    assert!(report.netfilter_written && !report.netfilter_pending);
    assert!(
        nft.scripts()
            .await
            .last()
            .unwrap()
            .contains("10.96.0.5 . tcp . 80")
    );
    proxier.detach_netfilter_updates(true);

    // A detached update that fails: the next sync replaces the tables whole (within it).
    nft.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    proxier.apply(Change::DeleteService(third.model().name));
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(!holds(3));
    assert!(report.netfilter_pending);
    nft.gate.add_permits(1);
    update_ended(&proxier).await;
    nft.fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(report.netfilter_settled.is_none(), "it failed");
    assert!(report.is_complete() && report.netfilter_written && !report.netfilter_pending);
    let scripts = nft.scripts().await;
    assert!(
        scripts.last().unwrap().contains("table ip ipvs-proxier {"),
        "replaced whole"
    );
    assert_eq!(
        proxier.netfilter.digest(),
        Some(
            netfilter::plan_digest(proxier.netfilter_plan(), proxier.netfilter.options()).unwrap()
        )
    );
}

#[tokio::test]
async fn after_the_tables_failed_to_be_written_whole_changes_go_as_updates_again() {
    let (mut proxier, nft, _ipvs) = detached_proxier();
    let whole = |script: &String| script.contains("table ip ipvs-proxier {");
    proxier.apply(Change::UpsertService(web(1)));
    nft.tables.lock().await.fail_next = Some("refused".to_owned());
    let first = proxier.sync(SyncKind::Full).await.unwrap();
    assert!(first.netfilter_error.is_some() && nft.scripts().await.is_empty());

    // Changes while the tables are to be written whole are in the next whole write.
    proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(1).model()));
    let second = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(second.is_complete() && second.netfilter_written);
    let scripts = nft.scripts().await;
    assert!(whole(&scripts[0]) && scripts[0].contains("10.96.0.2 . tcp . 80"));

    // From then on a change is an update of its own elements, and the digest the tables
    // carry stays the whole plan's.
    proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(2).model()));
    proxier.apply(Change::DeleteService(
        ServiceSpec::cluster_ip(1).model().name,
    ));
    let third = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(third.is_complete() && third.netfilter_written);
    let scripts = nft.scripts().await;
    let update = scripts.last().unwrap();
    assert!(!whole(update), "an update, not a rewrite: {update}");
    assert!(update.contains("10.96.0.3 . tcp . 80") && update.contains("10.96.0.2 . tcp . 80"));
    assert!(
        !update.contains("10.96.0.1 "),
        "only what changed: {update}"
    );
    assert_eq!(
        proxier.netfilter.digest(),
        Some(
            netfilter::plan_digest(proxier.netfilter_plan(), proxier.netfilter.options()).unwrap()
        )
    );
}

/// Waits (at most 10 s, else panics) until `done`.
async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    assert!(waited.await.is_ok(), "not within 10 s: {what}");
}

/// Counts the syncs of a [`DetachedProxier`].
#[derive(Default)]
struct CountingDetached(usize);

impl driver::SyncObserver<DetachedProxier> for CountingDetached {
    fn synced(&mut self, _: &DetachedProxier, _: &driver::SyncOutcome<'_>) {
        self.0 += 1;
    }
}

#[tokio::test]
async fn the_driver_syncs_the_elements_that_waited_as_soon_as_the_update_in_flight_ends() {
    let (mut proxier, nft, ipvs) = detached_proxier();
    proxier.apply(Change::UpsertService(web(1)));
    let (handle, commands) = ProxierHandle::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let spec = ServiceSpec::cluster_ip;
    let (tables, gate) = (nft.clone(), nft.gate.clone());
    let holds = move |vip: u8| ipvs.table().keys().any(|key| key.address == ip(vip));
    let scripts = move |n: usize| {
        tables
            .tables
            .try_lock()
            .is_ok_and(|tables| tables.scripts.len() >= n)
    };
    let steps = tokio::spawn(async move {
        wait_for("the first sync's replace", || scripts(1)).await;
        handle.apply(vec![Change::UpsertService(spec(1).model())]);
        wait_for("the second Service in IPVS", || holds(2)).await;
        // Its update is at the gate; the next change's IPVS part does not wait for it.
        handle.apply(vec![Change::UpsertService(spec(2).model())]);
        wait_for("the third Service in IPVS", || holds(3)).await;
        gate.add_permits(1);
        wait_for("the second Service's elements", || scripts(2)).await;
        // No new change: the update's end alone brings the third Service's elements.
        gate.add_permits(1);
        wait_for("the third Service's elements", || scripts(3)).await;
        let _ = stop.send(true);
        handle
    });
    let mut counting = CountingDetached::default();
    // Full resyncs an hour apart: only the driver's wake-up can sync what waited.
    let timing = DriverConfig::new(Duration::from_secs(3600), Duration::ZERO, 2);
    driver::run(&mut proxier, timing, commands, &mut counting, stopped).await;
    let _handle = steps.await.unwrap();
    let scripts = nft.scripts().await;
    assert!(scripts[1].contains("10.96.0.2 . tcp . 80") && !scripts[1].contains("10.96.0.3"));
    assert!(scripts[2].contains("10.96.0.3 . tcp . 80"));
}

#[tokio::test]
async fn a_full_sync_repaired_in_slices_leaves_nftables_detached_unless_it_replaces_the_tables() {
    let (mut proxier, nft, ipvs) = detached_proxier();
    proxier.detach_netfilter_updates(true);
    proxier.apply(Change::UpsertService(web(1)));
    proxier.sync(SyncKind::Full).await.unwrap();
    let holds = |vip: u8| ipvs.table().keys().any(|key| key.address == ip(vip));
    // An incremental update at the gate.
    proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(1).model()));
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(report.netfilter_pending);

    // A resync while it is in flight, with a change of its own: neither its start nor its
    // slices wait for `nft`, and its elements wait in the tracker.
    proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(2).model()));
    let read = proxier.begin_full_sync().await;
    let resync = async {
        if proxier.start_repair(read).await.unwrap().is_none() {
            while proxier.repair_step().await.is_none() {}
        }
    };
    tokio::time::timeout(Duration::from_secs(5), resync)
        .await
        .expect("the full sync waited for the nftables update in flight");
    assert!(holds(3), "the resync did not write the new Service");
    assert!(proxier.netfilter_updating());
    assert_eq!(
        nft.scripts().await.len(),
        1,
        "only the first sync's replace"
    );
    nft.gate.add_permits(1);
    update_ended(&proxier).await;
    let report = proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(report.netfilter_written && report.netfilter_pending);
    nft.gate.add_permits(1);
    update_ended(&proxier).await;
    let scripts = nft.scripts().await;
    assert!(scripts[2].contains("10.96.0.3 . tcp . 80"));

    // A resync whose replacement is due waits for the update in flight and replaces the
    // tables within itself.
    proxier.apply(Change::UpsertService(ServiceSpec::cluster_ip(3).model()));
    proxier.sync(SyncKind::Incremental).await.unwrap();
    assert!(proxier.netfilter_updating());
    proxier.config.netfilter_full_sync_period = Duration::ZERO;
    nft.gate.add_permits(1);
    let read = proxier.begin_full_sync().await;
    let _ = proxier.start_repair(read).await.unwrap();
    assert!(!proxier.netfilter_updating());
    let scripts = nft.scripts().await;
    assert_eq!(scripts.len(), 5, "the update in flight, then the replace");
    assert!(scripts[4].contains("table ip ipvs-proxier {"));
}

#[test]
fn a_chunk_planned_on_two_threads_is_the_chunk_planned_on_one() {
    let state = crate::testing::state(300, 5);
    let (node, config) = (crate::testing::node(), crate::testing::config());
    let planner = Planner::new(&node, &config);
    // Every Service of the state, and one the state does not have (its plan: none).
    let mut chunk: Vec<ServicePorts> = state
        .services()
        .map(|service| (service.name.clone(), Vec::new()))
        .collect();
    chunk.insert(150, (ServiceName::new("gone", "svc"), Vec::new()));
    assert!(chunk.len() >= PARALLEL_REPLAN_MIN);
    let one_thread: Vec<(ServiceName, Option<ServicePlan>)> = chunk
        .iter()
        .map(|(name, _)| {
            let plan = state
                .service(name)
                .map(|service| planner.plan_service(&state, service));
            (name.clone(), plan)
        })
        .collect();
    let two_threads: Vec<(ServiceName, Option<ServicePlan>)> = plan_chunk(&planner, &state, chunk)
        .into_iter()
        .map(|((name, _), plan)| (name, plan))
        .collect();
    assert_eq!(two_threads.len(), 301);
    assert!(two_threads[150].1.is_none(), "the Service the state lacks");
    assert!(
        two_threads
            .iter()
            .filter(|(_, plan)| plan.is_some())
            .count()
            == 300
    );
    assert_eq!(two_threads, one_thread);
}

#[test]
fn dry_run_backends_program_as_in_memory_ones_but_keep_no_log() {
    use crate::testing;
    let rt = runtime();
    let (dry, memory) = (Backends::dry_run("kube-ipvs0"), Backends::in_memory());
    let (dry_ipvs, dry_addresses) = (dry.ipvs.clone(), dry.addresses.clone());
    let (ipvs, addresses) = (memory.ipvs.clone(), memory.addresses.clone());
    let config = || ProxierConfig::new(testing::NODE_NAME, testing::config());
    let mut proxiers = [
        Proxier::new(config(), dry).unwrap(),
        Proxier::new(config(), memory).unwrap(),
    ];
    for proxier in &mut proxiers {
        for i in 0..20 {
            proxier.apply(Change::UpsertService(testing::service(i)));
            proxier.apply(Change::UpsertSlice(testing::slice(i, 3, 0)));
        }
        rt.block_on(proxier.sync(SyncKind::Full)).unwrap();
        // Churn: endpoints replaced, a Service gone.
        for i in 0..10 {
            proxier.apply(Change::UpsertSlice(testing::slice(i, 3, 1)));
        }
        proxier.apply(Change::DeleteService(testing::service(19).name));
        rt.block_on(proxier.sync(SyncKind::Incremental)).unwrap();
    }
    assert_eq!(dry_ipvs.table(), ipvs.table());
    assert_eq!(dry_addresses.addresses(), addresses.addresses());
    assert_eq!(dry_addresses.addresses().len(), 19);
    assert!(!ipvs.applied_ops().is_empty() && !addresses.applied_ops().is_empty());
    assert!(dry_ipvs.applied_ops().is_empty(), "IPVS writes logged");
    assert!(
        dry_addresses.applied_ops().is_empty(),
        "address writes logged"
    );
}

proptest! {
    /// Re-planning everything takes every port the state's Services have and every port
    /// planned, each once, grouped by Service in order: as collecting all their names into
    /// one sorted set and cutting it by Service does (the oracle, the way it was done).
    #[test]
    fn every_port_by_service_is_the_sorted_union_grouped(
        in_state in proptest::collection::btree_map(0usize..40, (any::<bool>(), any::<bool>()), 0..25),
        planned in proptest::collection::btree_set((0usize..40, 0usize..3), 0..40),
    ) {
        let mut state = ClusterState::new();
        for (&i, &(udp, no_ports)) in &in_state {
            let mut service = crate::testing::service(i);
            if udp {
                service.ports.push(ServicePortSpec {
                    name: "dns".into(),
                    port: 53,
                    protocol: Protocol::Udp,
                    node_port: None,
                });
            }
            if no_ports {
                service.ports.clear();
            }
            state.apply(Change::UpsertService(service));
        }
        let port_names = ["dns", "http", "metrics"];
        let protocol = |port: usize| if port == 0 { Protocol::Udp } else { Protocol::Tcp };
        let mut desired = Desired::default();
        for &(i, port) in &planned {
            let name = crate::testing::service_name(i).port(port_names[port], protocol(port));
            desired.set_plan(&name, Some(ServicePortPlan::default()));
        }

        let oracle: DirtyPorts = desired
            .services
            .keys()
            .cloned()
            .chain(state.port_names())
            .collect();
        prop_assert_eq!(every_port_by_service(&state, &desired), by_service(oracle));
    }
}
