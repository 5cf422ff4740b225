//! Reconciler behaviour over the in-memory backends.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use super::*;
use crate::backend::memory::AddressOp;
use crate::backend::{MemoryAddressBackend, MemoryIpvsBackend};
use crate::desired::{Protocol, RealServer, RealServerKey, Scheduler};
use crate::observed::{Forwarding, VirtualServerSettings};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn spn(name: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "default".into(),
        name: name.into(),
        port: "p".into(),
        protocol,
    }
}

fn vkey(address: &str, port: u16, protocol: Protocol) -> VirtualServerKey {
    VirtualServerKey {
        address: ip(address),
        port,
        protocol,
    }
}

fn rkey(address: &str, port: u16) -> RealServerKey {
    RealServerKey {
        address: ip(address),
        port,
    }
}

fn vs(role: VirtualServerRole, real_servers: &[(&str, u16)]) -> VirtualServer {
    VirtualServer {
        role,
        scheduler: Scheduler::RoundRobin,
        persistence_timeout: None,
        hash_source_port: false,
        real_servers: real_servers
            .iter()
            .map(|(a, p)| (rkey(a, *p), RealServer { weight: 1 }))
            .collect(),
    }
}

fn plan(virtual_servers: Vec<(VirtualServerKey, VirtualServer)>) -> ServicePortPlan {
    ServicePortPlan {
        virtual_servers: virtual_servers.into_iter().collect(),
        ..Default::default()
    }
}

fn desired(services: Vec<(ServicePortName, ServicePortPlan)>) -> Desired {
    Desired {
        services: services.into_iter().collect(),
    }
}

/// The kernel table a plan should produce, written out by hand for the tests.
fn observed_rr(real_servers: &[(&str, u16, u32)]) -> ObservedVirtualServer {
    ObservedVirtualServer {
        settings: VirtualServerSettings {
            scheduler: Scheduler::RoundRobin,
            persistence_timeout: None,
            hash_source_port: false,
        },
        real_servers: real_servers
            .iter()
            .map(|(a, p, w)| (rkey(a, *p), ObservedRealServer::new(*w)))
            .collect(),
    }
}

type Memory = Reconciler<MemoryIpvsBackend, MemoryAddressBackend>;

fn reconciler(ipvs: &MemoryIpvsBackend, addresses: &MemoryAddressBackend) -> Memory {
    Reconciler::new(ipvs.clone(), addresses.clone(), ReconcilerConfig::default())
}

/// web: ClusterIP 10.96.0.10:80 + NodePort 192.168.1.5:30080, two endpoints.
/// dns: ClusterIP 10.96.0.53:53/UDP, one endpoint.
fn two_services() -> Desired {
    desired(vec![
        (
            spn("web", Protocol::Tcp),
            plan(vec![
                (
                    vkey("10.96.0.10", 80, Protocol::Tcp),
                    vs(
                        VirtualServerRole::ClusterIp,
                        &[("10.1.0.2", 8080), ("10.1.0.3", 8080)],
                    ),
                ),
                (
                    vkey("192.168.1.5", 30080, Protocol::Tcp),
                    vs(
                        VirtualServerRole::NodePort,
                        &[("10.1.0.2", 8080), ("10.1.0.3", 8080)],
                    ),
                ),
            ]),
        ),
        (
            spn("dns", Protocol::Udp),
            plan(vec![(
                vkey("10.96.0.53", 53, Protocol::Udp),
                vs(VirtualServerRole::ClusterIp, &[("10.1.0.9", 53)]),
            )]),
        ),
    ])
}

fn two_services_table() -> BTreeMap<VirtualServerKey, ObservedVirtualServer> {
    BTreeMap::from([
        (
            vkey("10.96.0.10", 80, Protocol::Tcp),
            observed_rr(&[("10.1.0.2", 8080, 1), ("10.1.0.3", 8080, 1)]),
        ),
        (
            vkey("192.168.1.5", 30080, Protocol::Tcp),
            observed_rr(&[("10.1.0.2", 8080, 1), ("10.1.0.3", 8080, 1)]),
        ),
        (
            vkey("10.96.0.53", 53, Protocol::Udp),
            observed_rr(&[("10.1.0.9", 53, 1)]),
        ),
    ])
}

#[tokio::test]
async fn from_empty_creates_link_binds_cluster_ips_and_programs_ipvs() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let mut rec = reconciler(&ipvs, &addresses);
    let report = rec.full_sync(&two_services()).await.unwrap();

    assert_eq!(ipvs.table(), two_services_table());
    assert!(addresses.link_exists());
    // The NodePort address belongs to the node: never bound on the dummy link.
    assert_eq!(
        addresses.addresses(),
        BTreeSet::from([ip("10.96.0.10"), ip("10.96.0.53")])
    );
    assert_eq!(report.deletes, 0);
    assert_eq!(report.failed, 0);
    // 3 virtual servers, 5 real servers, 2 addresses.
    assert_eq!(report.writes, 10);
    let stats = rec.stats();
    assert_eq!(stats.ops[&OpKind::AddVirtualServer].succeeded, 3);
    assert_eq!(stats.ops[&OpKind::AddRealServer].succeeded, 5);
    assert_eq!(stats.ops[&OpKind::BindAddress].succeeded, 2);
    assert!(stats.last_errors.is_empty());
    assert_eq!(stats.last_full_sync_drift, None);

    // Every real server is added after its virtual server.
    let ops = ipvs.applied_ops();
    for (i, op) in ops.iter().enumerate() {
        if let IpvsOp::AddRealServer(key, ..) = op {
            assert!(
                ops[..i].iter().any(|earlier| *earlier
                    == IpvsOp::AddVirtualServer(*key, VirtualServerSettings::default())),
                "{op} comes before its virtual server in {ops:?}"
            );
        }
    }
}

/// The signal of [`Reconciler::signal_ipvs_written`] fires once, when the first batch of
/// IPVS writes after it is answered, and not again for a later sync.
#[tokio::test]
async fn the_ipvs_written_signal_fires_once_with_the_next_ipvs_writes() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let mut rec = reconciler(&ipvs, &addresses);
    let signal = Arc::new(Notify::new());
    rec.signal_ipvs_written(Some(signal.clone()));
    let fired = |signal: &Arc<Notify>| {
        // A permit is stored when nobody waited: `notified` then completes at once.
        let notified = signal.notified();
        futures::FutureExt::now_or_never(notified).is_some()
    };
    assert!(!fired(&signal), "nothing written yet");
    let want = two_services();
    rec.full_sync(&want).await.unwrap();
    assert!(!ipvs.applied_ops().is_empty());
    assert!(fired(&signal), "the first sync's IPVS writes were answered");
    ipvs.remove_virtual_server(&vkey("10.96.0.10", 80, Protocol::Tcp));
    rec.full_sync(&want).await.unwrap();
    assert!(!fired(&signal), "the signal was for one batch only");
}

#[tokio::test]
async fn restart_with_unchanged_inputs_adopts_everything_with_zero_writes() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    reconciler(&ipvs, &addresses)
        .full_sync(&two_services())
        .await
        .unwrap();
    ipvs.take_applied_ops();
    addresses.take_applied_ops();

    // A new process over the same kernel.
    let mut restarted = reconciler(&ipvs, &addresses);
    let report = restarted.full_sync(&two_services()).await.unwrap();
    assert_eq!(report.writes, 0, "{report:?}");
    assert_eq!(report.deletes, 0);
    assert!(ipvs.applied_ops().is_empty(), "{:?}", ipvs.applied_ops());
    assert!(addresses.applied_ops().is_empty());
    assert_eq!(ipvs.table(), two_services_table());
}

#[tokio::test]
async fn adopts_a_kernel_programmed_by_someone_else_and_fixes_only_differences() {
    // The kernel as a previous kube-proxy left it: one weight differs, one real server is extra.
    let mut table = two_services_table();
    table
        .get_mut(&vkey("10.96.0.10", 80, Protocol::Tcp))
        .unwrap()
        .real_servers
        .get_mut(&rkey("10.1.0.3", 8080))
        .unwrap()
        .weight = 0;
    table
        .get_mut(&vkey("10.96.0.53", 53, Protocol::Udp))
        .unwrap()
        .real_servers
        .insert(rkey("10.1.0.99", 53), ObservedRealServer::new(1));
    let ipvs = MemoryIpvsBackend::with_table(table);
    let addresses = MemoryAddressBackend::with_addresses([ip("10.96.0.10"), ip("10.96.0.53")]);
    let mut rec = reconciler(&ipvs, &addresses);
    let report = rec.full_sync(&two_services()).await.unwrap();
    assert_eq!(
        ipvs.applied_ops(),
        vec![
            IpvsOp::UpdateRealServer(
                vkey("10.96.0.10", 80, Protocol::Tcp),
                rkey("10.1.0.3", 8080),
                1
            ),
            IpvsOp::DeleteRealServer(vkey("10.96.0.53", 53, Protocol::Udp), rkey("10.1.0.99", 53)),
        ]
    );
    assert_eq!(report.writes, 2);
    assert_eq!(ipvs.table(), two_services_table());
    assert!(addresses.applied_ops().is_empty());
}

#[tokio::test]
async fn full_sync_repairs_drift_and_counts_it() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let mut rec = reconciler(&ipvs, &addresses);
    let want = two_services();
    rec.full_sync(&want).await.unwrap();

    // Behind the proxier's back: a deleted virtual server, a rogue real server,
    // an unbound VIP and a changed weight.
    ipvs.remove_virtual_server(&vkey("10.96.0.53", 53, Protocol::Udp));
    let mut web = ipvs.table()[&vkey("10.96.0.10", 80, Protocol::Tcp)].clone();
    web.real_servers
        .insert(rkey("10.1.0.66", 8080), ObservedRealServer::new(5));
    web.real_servers
        .get_mut(&rkey("10.1.0.2", 8080))
        .unwrap()
        .weight = 7;
    ipvs.insert_virtual_server(vkey("10.96.0.10", 80, Protocol::Tcp), web);
    assert!(addresses.remove_behind_back(&ip("10.96.0.10")));
    ipvs.take_applied_ops();

    let report = rec.full_sync(&want).await.unwrap();
    assert_eq!(ipvs.table(), two_services_table());
    assert_eq!(
        addresses.addresses(),
        BTreeSet::from([ip("10.96.0.10"), ip("10.96.0.53")])
    );
    // 1 virtual server missing, 1 rogue real server, 1 weight, 1 address.
    assert_eq!(report.drift, Some(4));
    assert_eq!(rec.stats().last_full_sync_drift, Some(4));
    // The rogue real server had no connections: deleted at once, not drained.
    assert!(rec.drain_queue().is_empty());

    // A second full sync finds nothing to do.
    let report = rec.full_sync(&want).await.unwrap();
    assert_eq!((report.writes, report.drift), (0, Some(0)));
}

#[tokio::test]
async fn foreign_and_excluded_virtual_servers_are_left_alone_stale_owned_ones_go() {
    let foreign = vkey("192.168.50.10", 80, Protocol::Tcp); // keepalived on another address
    let excluded = vkey("10.200.0.1", 80, Protocol::Tcp); // on our link, but excluded
    let stale = vkey("10.96.0.77", 80, Protocol::Tcp); // on our link, no longer planned
    let stale_node_port = vkey("192.168.1.5", 31000, Protocol::Tcp);
    let node_non_port = vkey("192.168.1.5", 443, Protocol::Tcp); // on a node IP, outside the range
    let mut table = two_services_table();
    for key in [foreign, excluded, stale, stale_node_port, node_non_port] {
        table.insert(key, observed_rr(&[("10.1.0.50", 80, 1)]));
    }
    let ipvs = MemoryIpvsBackend::with_table(table);
    let addresses = MemoryAddressBackend::with_addresses([
        ip("10.96.0.10"),
        ip("10.96.0.53"),
        ip("10.96.0.77"),
        ip("10.200.0.1"),
    ]);
    let config = ReconcilerConfig {
        exclude_cidrs: vec!["10.200.0.0/16".parse().unwrap()],
        ..ReconcilerConfig::default()
    };
    let mut rec = Reconciler::new(ipvs.clone(), addresses.clone(), config);
    let report = rec.full_sync(&two_services()).await.unwrap();

    let table = ipvs.table();
    assert!(table.contains_key(&foreign));
    assert!(table.contains_key(&excluded));
    assert!(table.contains_key(&node_non_port));
    assert!(!table.contains_key(&stale));
    assert!(!table.contains_key(&stale_node_port));
    assert_eq!(
        addresses.addresses(),
        BTreeSet::from([ip("10.96.0.10"), ip("10.96.0.53"), ip("10.200.0.1")])
    );
    assert_eq!(
        report.deletes, 3,
        "2 virtual servers and 1 address: {report:?}"
    );
    for op in ipvs.applied_ops() {
        let key = op.virtual_server();
        assert!(
            *key != foreign && *key != excluded && *key != node_non_port,
            "touched {op}"
        );
    }
}

#[tokio::test]
async fn conflicts_are_reported_not_applied_and_excluded_plans_are_programmed() {
    let shared = vkey("10.96.0.10", 80, Protocol::Tcp);
    let want = desired(vec![
        (
            spn("a-first", Protocol::Tcp),
            plan(vec![(
                shared,
                vs(VirtualServerRole::ClusterIp, &[("10.1.0.2", 80)]),
            )]),
        ),
        (
            spn("b-second", Protocol::Tcp),
            plan(vec![
                (
                    shared,
                    vs(VirtualServerRole::ClusterIp, &[("10.1.0.3", 80)]),
                ),
                (
                    vkey("10.96.0.11", 80, Protocol::Tcp),
                    vs(VirtualServerRole::ClusterIp, &[("10.1.0.3", 80)]),
                ),
            ]),
        ),
        (
            spn("c-excluded", Protocol::Tcp),
            plan(vec![(
                vkey("10.200.0.1", 80, Protocol::Tcp),
                vs(VirtualServerRole::ClusterIp, &[("10.1.0.4", 80)]),
            )]),
        ),
    ]);
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let config = ReconcilerConfig {
        exclude_cidrs: vec!["10.200.0.0/16".parse().unwrap()],
        ..ReconcilerConfig::default()
    };
    let mut rec = Reconciler::new(ipvs.clone(), addresses.clone(), config);
    rec.full_sync(&want).await.unwrap();
    let table = ipvs.table();
    assert_eq!(table[&shared], observed_rr(&[("10.1.0.2", 80, 1)]));
    assert!(table.contains_key(&vkey("10.96.0.11", 80, Protocol::Tcp)));
    // A Service in an excluded range is still programmed (kube-proxy's meaning of
    // --ipvs-exclude-cidrs: only foreign IPVS services there are protected).
    assert!(table.contains_key(&vkey("10.200.0.1", 80, Protocol::Tcp)));
    assert!(addresses.addresses().contains(&ip("10.200.0.1")));
    let errors = &rec.stats().last_errors;
    assert!(matches!(
        &errors[&spn("b-second", Protocol::Tcp)],
        ServiceSyncError::Rejected(Rejection::Conflict { winner, .. }) if *winner == spn("a-first", Protocol::Tcp)
    ));
    assert!(!errors.contains_key(&spn("c-excluded", Protocol::Tcp)));
    assert!(!errors.contains_key(&spn("a-first", Protocol::Tcp)));

    // The winner goes away: the other claimant takes the virtual server over, incrementally.
    let mut next = want.clone();
    next.services.remove(&spn("a-first", Protocol::Tcp));
    let dirty = BTreeSet::from([spn("a-first", Protocol::Tcp)]);
    rec.sync_services(&next, &dirty).await.unwrap();
    assert_eq!(ipvs.table()[&shared], observed_rr(&[("10.1.0.3", 80, 1)]));
    assert!(
        !rec.stats()
            .last_errors
            .contains_key(&spn("b-second", Protocol::Tcp))
    );
}

#[tokio::test]
async fn incremental_sync_touches_only_the_dirty_service_and_reads_nothing_unneeded() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let mut rec = reconciler(&ipvs, &addresses);
    let mut want = two_services();
    rec.full_sync(&want).await.unwrap();
    ipvs.take_applied_ops();

    // One endpoint added to dns.
    let dns = spn("dns", Protocol::Udp);
    let dns_key = vkey("10.96.0.53", 53, Protocol::Udp);
    want.services
        .get_mut(&dns)
        .unwrap()
        .virtual_servers
        .get_mut(&dns_key)
        .unwrap()
        .real_servers
        .insert(rkey("10.1.0.10", 53), RealServer { weight: 1 });
    let report = rec
        .sync_services(&want, &BTreeSet::from([dns.clone()]))
        .await
        .unwrap();
    assert_eq!(
        ipvs.take_applied_ops(),
        vec![IpvsOp::AddRealServer(dns_key, rkey("10.1.0.10", 53), 1)]
    );
    assert_eq!(report.writes, 1);
    // Adding needs no read: the cache answers. (The first sync's best-effort read lacked
    // the three planned virtual servers, and looked each up before creating it.)
    assert_eq!(ipvs.read_calls(), (1, 3));

    // Removing the service: its virtual server goes and its VIP is unbound.
    want.services.remove(&dns);
    rec.sync_services(&want, &BTreeSet::from([dns]))
        .await
        .unwrap();
    assert_eq!(
        ipvs.take_applied_ops(),
        vec![IpvsOp::DeleteVirtualServer(dns_key)]
    );
    assert_eq!(addresses.addresses(), BTreeSet::from([ip("10.96.0.10")]));
    assert_eq!(
        ipvs.read_calls().0,
        1,
        "no full listing in incremental syncs"
    );
}

#[tokio::test]
async fn a_vip_shared_by_two_ports_stays_bound_until_both_are_gone() {
    let p80 = spn("multi-80", Protocol::Tcp);
    let p443 = spn("multi-443", Protocol::Tcp);
    let mut want = desired(vec![
        (
            p80.clone(),
            plan(vec![(
                vkey("10.96.0.20", 80, Protocol::Tcp),
                vs(VirtualServerRole::ClusterIp, &[("10.1.0.2", 80)]),
            )]),
        ),
        (
            p443.clone(),
            plan(vec![(
                vkey("10.96.0.20", 443, Protocol::Tcp),
                vs(VirtualServerRole::ClusterIp, &[("10.1.0.2", 443)]),
            )]),
        ),
    ]);
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let mut rec = reconciler(&ipvs, &addresses);
    rec.full_sync(&want).await.unwrap();
    want.services.remove(&p80);
    rec.sync_services(&want, &BTreeSet::from([p80]))
        .await
        .unwrap();
    assert_eq!(addresses.addresses(), BTreeSet::from([ip("10.96.0.20")]));
    want.services.remove(&p443);
    rec.sync_services(&want, &BTreeSet::from([p443]))
        .await
        .unwrap();
    assert!(addresses.addresses().is_empty());
    assert!(ipvs.table().is_empty());
}

#[tokio::test]
async fn node_owned_external_ips_are_not_bound() {
    let mut external = plan(vec![(
        vkey("192.168.1.5", 8443, Protocol::Tcp),
        vs(VirtualServerRole::ExternalIp, &[("10.1.0.2", 443)]),
    )]);
    external.node_owned_addresses.insert(ip("192.168.1.5"));
    let want = desired(vec![(spn("ext", Protocol::Tcp), external)]);
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    reconciler(&ipvs, &addresses)
        .full_sync(&want)
        .await
        .unwrap();
    assert!(addresses.addresses().is_empty());
    assert_eq!(ipvs.table().len(), 1);
}

/// web with endpoints a and b, b holding a live connection.
async fn web_with_busy_endpoint(
    config: ReconcilerConfig,
) -> (
    Memory,
    MemoryIpvsBackend,
    Desired,
    ServicePortName,
    VirtualServerKey,
) {
    let web = spn("web", Protocol::Tcp);
    let key = vkey("10.96.0.10", 80, Protocol::Tcp);
    let want = desired(vec![(
        web.clone(),
        plan(vec![(
            key,
            vs(
                VirtualServerRole::ClusterIp,
                &[("10.1.0.2", 80), ("10.1.0.3", 80)],
            ),
        )]),
    )]);
    let ipvs = MemoryIpvsBackend::new();
    let mut rec = Reconciler::new(ipvs.clone(), MemoryAddressBackend::new(), config);
    rec.full_sync(&want).await.unwrap();
    assert!(ipvs.set_connections(&key, &rkey("10.1.0.3", 80), 1, 0));
    ipvs.take_applied_ops();
    (rec, ipvs, want, web, key)
}

fn without_endpoint(
    want: &Desired,
    service: &ServicePortName,
    key: &VirtualServerKey,
    rs: RealServerKey,
) -> Desired {
    let mut next = want.clone();
    next.services
        .get_mut(service)
        .unwrap()
        .virtual_servers
        .get_mut(key)
        .unwrap()
        .real_servers
        .remove(&rs);
    next
}

#[tokio::test(start_paused = true)]
async fn drain_deadline_is_a_fixed_instant_that_comes_due() {
    let config = ReconcilerConfig::default();
    let interval = config.drain_check_interval;
    let (mut rec, _ipvs, want, web, key) = web_with_busy_endpoint(config).await;
    let next = without_endpoint(&want, &web, &key, rkey("10.1.0.3", 80));
    rec.sync_services(&next, &BTreeSet::from([web.clone()]))
        .await
        .unwrap();
    let deadline = rec.next_deadline().expect("a drain is queued");
    tokio::time::advance(interval / 2).await;
    // Asking again, or another sync, does not push it away.
    assert_eq!(rec.next_deadline(), Some(deadline));
    rec.sync_services(&next, &BTreeSet::from([web.clone()]))
        .await
        .unwrap();
    assert_eq!(rec.next_deadline(), Some(deadline));
    tokio::time::advance(interval).await;
    assert!(deadline <= tokio::time::Instant::now(), "the check is due");
    // A tick looks at the drains: the next check is one interval later.
    rec.tick(&next).await.unwrap();
    assert_eq!(
        rec.next_deadline(),
        Some(tokio::time::Instant::now() + interval)
    );
}

/// A TCP real server that goes is set to weight 0 before its connections are counted, so
/// that no connection is scheduled to it between the count and its delete; with none, it is
/// then deleted in the same sync. Without a drain (timeout zero) it is deleted at once.
#[tokio::test(start_paused = true)]
async fn a_leaving_tcp_endpoint_takes_weight_zero_before_its_count_is_read() {
    let a = rkey("10.1.0.2", 80);
    for (config, expected) in [
        (ReconcilerConfig::default(), 2),
        (
            ReconcilerConfig {
                drain_timeout: Duration::ZERO,
                ..ReconcilerConfig::default()
            },
            1,
        ),
    ] {
        let (mut rec, ipvs, want, web, key) = web_with_busy_endpoint(config).await;
        let next = without_endpoint(&want, &web, &key, a);
        let report = rec
            .sync_services(&next, &BTreeSet::from([web.clone()]))
            .await
            .unwrap();
        let ops = ipvs.take_applied_ops();
        let mut wanted = vec![
            IpvsOp::UpdateRealServer(key, a, 0),
            IpvsOp::DeleteRealServer(key, a),
        ];
        wanted.drain(..2 - expected);
        assert_eq!(ops, wanted);
        assert_eq!(report.writes, expected);
        assert!(!ipvs.table()[&key].real_servers.contains_key(&a));
        assert!(rec.drain_queue().is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn removed_tcp_endpoint_drains_at_weight_zero_until_its_connections_end() {
    let (mut rec, ipvs, want, web, key) = web_with_busy_endpoint(ReconcilerConfig::default()).await;
    let b = rkey("10.1.0.3", 80);
    let next = without_endpoint(&want, &web, &key, b);
    let dirty = BTreeSet::from([web.clone()]);
    rec.sync_services(&next, &dirty).await.unwrap();
    assert_eq!(
        ipvs.take_applied_ops(),
        vec![IpvsOp::UpdateRealServer(key, b, 0)]
    );
    assert_eq!(rec.stats().drain_queue_len, 1);
    assert_eq!(ipvs.table()[&key].real_servers[&b].weight, 0);
    assert!(rec.next_deadline().is_some());

    // Still connected: ticks keep it.
    tokio::time::advance(Duration::from_secs(60)).await;
    rec.tick(&next).await.unwrap();
    rec.sync_services(&next, &dirty).await.unwrap();
    assert!(ipvs.take_applied_ops().is_empty());
    assert!(ipvs.table()[&key].real_servers.contains_key(&b));

    // Connection closed: the next tick deletes it.
    ipvs.set_connections(&key, &b, 0, 0);
    rec.tick(&next).await.unwrap();
    assert_eq!(
        ipvs.take_applied_ops(),
        vec![IpvsOp::DeleteRealServer(key, b)]
    );
    assert_eq!(rec.stats().drain_queue_len, 0);
    assert_eq!(ipvs.table()[&key], observed_rr(&[("10.1.0.2", 80, 1)]));
}

#[tokio::test(start_paused = true)]
async fn a_draining_endpoint_is_deleted_after_the_bound_even_with_connections() {
    let config = ReconcilerConfig {
        drain_timeout: Duration::from_secs(120),
        ..ReconcilerConfig::default()
    };
    let (mut rec, ipvs, want, web, key) = web_with_busy_endpoint(config).await;
    let b = rkey("10.1.0.3", 80);
    let next = without_endpoint(&want, &web, &key, b);
    rec.sync_services(&next, &BTreeSet::from([web]))
        .await
        .unwrap();
    ipvs.take_applied_ops();
    tokio::time::advance(Duration::from_secs(119)).await;
    rec.tick(&next).await.unwrap();
    assert!(ipvs.take_applied_ops().is_empty());
    tokio::time::advance(Duration::from_secs(1)).await;
    // A full sync applies the bound as well.
    rec.full_sync(&next).await.unwrap();
    assert_eq!(
        ipvs.take_applied_ops(),
        vec![IpvsOp::DeleteRealServer(key, b)]
    );
    assert!(rec.drain_queue().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_that_comes_back_is_restored_not_deleted() {
    let (mut rec, ipvs, want, web, key) = web_with_busy_endpoint(ReconcilerConfig::default()).await;
    let b = rkey("10.1.0.3", 80);
    let dirty = BTreeSet::from([web.clone()]);
    rec.sync_services(&without_endpoint(&want, &web, &key, b), &dirty)
        .await
        .unwrap();
    assert_eq!(rec.stats().drain_queue_len, 1);
    ipvs.take_applied_ops();
    rec.sync_services(&want, &dirty).await.unwrap();
    assert_eq!(
        ipvs.take_applied_ops(),
        vec![IpvsOp::UpdateRealServer(key, b, 1)]
    );
    assert_eq!(rec.stats().drain_queue_len, 0);
    ipvs.set_connections(&key, &b, 0, 0);
    rec.tick(&want).await.unwrap();
    assert!(ipvs.take_applied_ops().is_empty());
    assert_eq!(ipvs.table()[&key].real_servers[&b].weight, 1);
}

#[tokio::test]
async fn udp_and_sctp_endpoints_are_deleted_at_once_despite_connections() {
    for protocol in [Protocol::Udp, Protocol::Sctp] {
        let name = spn("svc", protocol);
        let key = vkey("10.96.0.30", 5000, protocol);
        let want = desired(vec![(
            name.clone(),
            plan(vec![(
                key,
                vs(
                    VirtualServerRole::ClusterIp,
                    &[("10.1.0.2", 5000), ("10.1.0.3", 5000)],
                ),
            )]),
        )]);
        let ipvs = MemoryIpvsBackend::new();
        let mut rec = Reconciler::new(
            ipvs.clone(),
            MemoryAddressBackend::new(),
            ReconcilerConfig::default(),
        );
        rec.full_sync(&want).await.unwrap();
        let b = rkey("10.1.0.3", 5000);
        ipvs.set_connections(&key, &b, 3, 7);
        ipvs.take_applied_ops();
        rec.sync_services(
            &without_endpoint(&want, &name, &key, b),
            &BTreeSet::from([name]),
        )
        .await
        .unwrap();
        assert_eq!(
            ipvs.take_applied_ops(),
            vec![IpvsOp::DeleteRealServer(key, b)],
            "{protocol}"
        );
        assert!(rec.drain_queue().is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_service_is_isolated_retried_with_backoff_and_counted() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let mut rec = reconciler(&ipvs, &addresses);
    let want = two_services();
    let web_key = vkey("10.96.0.10", 80, Protocol::Tcp);
    ipvs.fail_virtual_server(web_key, BackendError::SchedulerNotFound("rr".into()));
    let report = rec.full_sync(&want).await.unwrap();

    // dns and web's NodePort went in; web's ClusterIP did not.
    let table = ipvs.table();
    assert!(table.contains_key(&vkey("10.96.0.53", 53, Protocol::Udp)));
    assert!(table.contains_key(&vkey("192.168.1.5", 30080, Protocol::Tcp)));
    assert!(!table.contains_key(&web_key));
    assert_eq!(
        report.failed, 3,
        "the virtual server and its two real servers"
    );
    let web = spn("web", Protocol::Tcp);
    let stats = rec.stats();
    assert_eq!(stats.retries_pending, 1);
    assert!(matches!(
        &stats.last_errors[&web],
        ServiceSyncError::Op { op: IpvsOp::AddVirtualServer(key, _), source: BackendError::SchedulerNotFound(_) } if *key == web_key
    ));
    assert_eq!(
        stats.ops[&OpKind::AddVirtualServer],
        OpCounts {
            succeeded: 2,
            failed: 1
        }
    );
    assert_eq!(stats.ops[&OpKind::AddRealServer].failed, 2);

    let attempts_on_web = |ops: &[IpvsOp]| {
        ops.iter()
            .filter(|op| *op.virtual_server() == web_key)
            .count()
    };
    ipvs.take_applied_ops();
    // Not yet due (initial backoff 1 s): neither a tick nor a full sync retries it.
    rec.tick(&want).await.unwrap();
    rec.full_sync(&want).await.unwrap();
    assert_eq!(attempts_on_web(&ipvs.take_applied_ops()), 0);
    // Due after 1 s: retried, fails again, next retry after 2 s more.
    tokio::time::advance(Duration::from_secs(1)).await;
    rec.tick(&want).await.unwrap();
    assert!(attempts_on_web(&ipvs.take_applied_ops()) > 0);
    tokio::time::advance(Duration::from_millis(1500)).await;
    rec.tick(&want).await.unwrap();
    assert_eq!(
        attempts_on_web(&ipvs.take_applied_ops()),
        0,
        "backoff doubled to 2 s"
    );
    // The kernel gets the scheduler; the next due retry converges and clears the error.
    ipvs.clear_failure(&web_key);
    tokio::time::advance(Duration::from_millis(500)).await;
    rec.tick(&want).await.unwrap();
    assert_eq!(ipvs.table(), two_services_table());
    assert!(rec.stats().last_errors.is_empty());
    assert_eq!(rec.stats().retries_pending, 0);
    assert!(rec.next_deadline().is_none());
}

#[tokio::test]
async fn a_failed_address_bind_is_the_service_error_and_others_proceed() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    addresses.fail_address(ip("10.96.0.53"), BackendError::Permission);
    let mut rec = reconciler(&ipvs, &addresses);
    rec.full_sync(&two_services()).await.unwrap();
    assert_eq!(addresses.addresses(), BTreeSet::from([ip("10.96.0.10")]));
    let errors = &rec.stats().last_errors;
    assert_eq!(errors.len(), 1);
    assert!(matches!(
        &errors[&spn("dns", Protocol::Udp)],
        ServiceSyncError::Bind {
            source: BackendError::Permission,
            ..
        }
    ));
    assert_eq!(
        rec.stats().ops[&OpKind::BindAddress],
        OpCounts {
            succeeded: 1,
            failed: 1
        }
    );
}

#[tokio::test]
async fn settings_and_forwarding_changes_are_updates_not_recreations() {
    let key = vkey("10.96.0.10", 80, Protocol::Tcp);
    let mut table = two_services_table();
    let web = table.get_mut(&key).unwrap();
    web.real_servers
        .get_mut(&rkey("10.1.0.2", 8080))
        .unwrap()
        .forward = Forwarding::Other;
    let ipvs = MemoryIpvsBackend::with_table(table);
    let addresses = MemoryAddressBackend::with_addresses([ip("10.96.0.10"), ip("10.96.0.53")]);
    let mut want = two_services();
    let planned = want
        .services
        .get_mut(&spn("web", Protocol::Tcp))
        .unwrap()
        .virtual_servers
        .get_mut(&key)
        .unwrap();
    planned.persistence_timeout = Some(10800);
    planned.scheduler = Scheduler::MaglevHashing;
    planned.hash_source_port = true;
    let mut rec = reconciler(&ipvs, &addresses);
    rec.full_sync(&want).await.unwrap();
    let settings = VirtualServerSettings {
        scheduler: Scheduler::MaglevHashing,
        persistence_timeout: Some(10800),
        hash_source_port: true,
    };
    assert_eq!(
        ipvs.applied_ops(),
        vec![
            IpvsOp::UpdateVirtualServer(key, settings.clone()),
            IpvsOp::UpdateRealServer(key, rkey("10.1.0.2", 8080), 1),
        ]
    );
    assert_eq!(ipvs.table()[&key].settings, settings);
    assert_eq!(
        ipvs.table()[&key].real_servers[&rkey("10.1.0.2", 8080)].forward,
        Forwarding::Masquerade
    );
}

/// What [`BeforeEachBatch`] runs before each batch of IPVS writes.
type BatchHook = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// The in-memory IPVS backend, with a hook run (and awaited) before each batch of writes
/// starts: what a test sees of the other writes of the sync at that moment.
#[derive(Clone)]
struct BeforeEachBatch {
    ipvs: MemoryIpvsBackend,
    hook: BatchHook,
}

impl std::fmt::Debug for BeforeEachBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BeforeEachBatch")
            .field("ipvs", &self.ipvs)
            .finish_non_exhaustive()
    }
}

impl IpvsBackend for BeforeEachBatch {
    fn read_table(&self) -> crate::backend::PendingTableRead {
        self.ipvs.read_table()
    }
    async fn get_virtual_server(
        &mut self,
        key: &VirtualServerKey,
    ) -> Result<Option<ObservedVirtualServer>, BackendError> {
        self.ipvs.get_virtual_server(key).await
    }
    async fn apply(&mut self, ops: &[IpvsOp]) -> Vec<Result<(), BackendError>> {
        (self.hook)().await;
        self.ipvs.apply(ops).await
    }
}

/// A sync that deletes one Service and keeps another: its unbind goes out beside its IPVS
/// writes, not after them (at 10,000 addresses on the link each address write costs the
/// kernel milliseconds). The IPVS writes here end only once the unbind is seen, or after a
/// second: a sync that unbinds after its IPVS writes only gets there after that second.
#[tokio::test]
async fn unbinds_go_out_beside_the_ipvs_writes_not_after_them() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    reconciler(&ipvs, &addresses)
        .full_sync(&two_services())
        .await
        .unwrap();
    let dns = ip("10.96.0.53");
    assert!(addresses.addresses().contains(&dns));
    // Each batch of IPVS writes waits (up to a second) until the unbind is seen.
    let saw_unbind = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook: BatchHook = {
        let (addresses, saw_unbind) = (addresses.clone(), saw_unbind.clone());
        Arc::new(move || {
            let (addresses, saw_unbind) = (addresses.clone(), saw_unbind.clone());
            Box::pin(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
                while addresses.addresses().contains(&dns) && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                if !addresses.addresses().contains(&dns) {
                    saw_unbind.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            })
        })
    };
    let waits = BeforeEachBatch {
        ipvs: ipvs.clone(),
        hook,
    };
    let mut rec = Reconciler::new(waits, addresses.clone(), ReconcilerConfig::default());
    rec.full_sync(&two_services()).await.unwrap();
    let mut smaller = two_services();
    smaller.services.remove(&spn("dns", Protocol::Udp));
    let report = rec.full_sync(&smaller).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(!addresses.addresses().contains(&dns));
    assert!(
        !ipvs
            .table()
            .contains_key(&vkey("10.96.0.53", 53, Protocol::Udp))
    );
    assert!(
        saw_unbind.load(std::sync::atomic::Ordering::SeqCst),
        "the IPVS writes ended before the unbind went out"
    );
}

/// kube-proxy's order within a sync: a virtual server is added before its ClusterIP is
/// bound, and deleted before it is unbound. The IPVS writes are handed on first, so they do
/// not wait while the kernel binds or unbinds (inside the address writes' send).
#[tokio::test]
async fn ipvs_writes_start_before_the_address_writes() {
    let dns = ip("10.96.0.53");
    let dns_key = vkey("10.96.0.53", 53, Protocol::Udp);
    let mut smaller = two_services();
    smaller.services.remove(&spn("dns", Protocol::Udp));
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    // Whether the ClusterIP was bound when each batch of writes started.
    let bound_at_apply: Arc<std::sync::Mutex<Vec<bool>>> = Arc::default();
    let hook: BatchHook = {
        let (addresses, bound_at_apply) = (addresses.clone(), bound_at_apply.clone());
        Arc::new(move || {
            let bound = addresses.addresses().contains(&dns);
            bound_at_apply.lock().unwrap().push(bound);
            Box::pin(std::future::ready(()))
        })
    };
    let sees = BeforeEachBatch {
        ipvs: ipvs.clone(),
        hook,
    };
    let mut rec = Reconciler::new(sees, addresses.clone(), ReconcilerConfig::default());
    rec.full_sync(&smaller).await.unwrap();
    bound_at_apply.lock().unwrap().clear();

    let added = rec.full_sync(&two_services()).await.unwrap();
    assert!(added.errors.is_empty(), "{:?}", added.errors);
    assert!(ipvs.table().contains_key(&dns_key));
    assert!(addresses.addresses().contains(&dns));
    assert_eq!(
        *bound_at_apply.lock().unwrap(),
        vec![false],
        "the virtual server's writes started after its address was bound"
    );

    bound_at_apply.lock().unwrap().clear();
    let removed = rec.full_sync(&smaller).await.unwrap();
    assert!(removed.errors.is_empty(), "{:?}", removed.errors);
    assert!(!ipvs.table().contains_key(&dns_key));
    assert!(!addresses.addresses().contains(&dns));
    assert_eq!(
        *bound_at_apply.lock().unwrap(),
        vec![true],
        "the virtual server's delete started after its address was unbound"
    );
}

#[tokio::test]
async fn a_listing_failure_fails_the_whole_sync() {
    #[derive(Debug)]
    struct Broken;
    impl IpvsBackend for Broken {
        fn read_table(&self) -> crate::backend::PendingTableRead {
            Box::pin(std::future::ready(Err(BackendError::Unavailable(
                "no ip_vs".into(),
            ))))
        }
        async fn get_virtual_server(
            &mut self,
            _: &VirtualServerKey,
        ) -> Result<Option<ObservedVirtualServer>, BackendError> {
            Err(BackendError::Unavailable("no ip_vs".into()))
        }
        async fn apply(&mut self, ops: &[IpvsOp]) -> Vec<Result<(), BackendError>> {
            vec![Err(BackendError::Unavailable("no ip_vs".into())); ops.len()]
        }
    }
    let mut rec = Reconciler::new(
        Broken,
        MemoryAddressBackend::new(),
        ReconcilerConfig::default(),
    );
    let error = rec.full_sync(&two_services()).await.unwrap_err();
    assert!(matches!(error, ReconcileError::ListVirtualServers { .. }));
    assert!(error.to_string().contains("no ip_vs"), "{error}");
    let _ = AddressOp::CreateLink;
}

/// Takes one real server from web's ClusterIP virtual server (of [`two_services`], programmed)
/// and hides that virtual server from the next listing, as a disturbed dump would; forgets
/// the ops so far. Returns its key.
async fn skip_web_short_of_a_real_server(ipvs: &MemoryIpvsBackend) -> VirtualServerKey {
    let web = vkey("10.96.0.10", 80, Protocol::Tcp);
    ipvs.clone()
        .apply(&[IpvsOp::DeleteRealServer(web, rkey("10.1.0.3", 8080))])
        .await;
    ipvs.hide_from_next_list(web);
    ipvs.take_applied_ops();
    web
}

#[tokio::test]
async fn a_virtual_server_the_resync_dump_skipped_is_re_read_not_failed() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let plan = two_services();
    let mut reconciler = reconciler(&ipvs, &addresses);
    reconciler.full_sync(&plan).await.unwrap();

    // A resync (verified read, trusted whole) whose dump misses one virtual server that
    // holds one real server too few.
    let web = skip_web_short_of_a_real_server(&ipvs).await;
    let report = reconciler.full_sync(&plan).await.unwrap();
    assert_eq!(report.failed, 0, "{:?}", report.errors);
    assert!(report.errors.is_empty());
    assert_eq!(reconciler.stats().contradictions, 1);
    assert_eq!(ipvs.table(), two_services_table());
    // The adds the missing picture asked for, and nothing after the re-read.
    let ops = ipvs.take_applied_ops();
    assert_eq!(ops.len(), 3, "{ops:?}");
    assert!(ops.iter().all(|op| *op.virtual_server() == web), "{ops:?}");
    assert_eq!(reconciler.full_sync(&plan).await.unwrap().writes, 0);
}

#[tokio::test]
async fn a_planned_virtual_server_the_adoption_read_skipped_is_looked_up_before_any_write() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let plan = two_services();
    reconciler(&ipvs, &addresses)
        .full_sync(&plan)
        .await
        .unwrap();

    // A restart whose best-effort read misses one virtual server that holds one real
    // server too few: it is looked up alone, and only the real server is written.
    let web = skip_web_short_of_a_real_server(&ipvs).await;
    let calls = ipvs.read_calls();
    let mut restarted = reconciler(&ipvs, &addresses);
    let report = restarted.full_sync(&plan).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(restarted.stats().contradictions, 0);
    assert_eq!(
        ipvs.take_applied_ops(),
        vec![IpvsOp::AddRealServer(web, rkey("10.1.0.3", 8080), 1)]
    );
    assert_eq!(ipvs.table(), two_services_table());
    // One listing (the best-effort read) and one lookup (the skipped virtual server).
    assert_eq!(ipvs.read_calls(), (calls.0 + 1, calls.1 + 1));
    assert_eq!(restarted.full_sync(&plan).await.unwrap().writes, 0);
}

#[tokio::test]
async fn an_adoption_read_lacking_most_of_the_plan_is_read_again_verified() {
    // Three hundred ClusterIP virtual servers, one real server each, programmed.
    let services: Vec<(ServicePortName, ServicePortPlan)> = (0..300u16)
        .map(|i| {
            let address = format!("10.96.{}.{}", i / 200, i % 200 + 1);
            (
                spn(&format!("s{i}"), Protocol::Tcp),
                plan(vec![(
                    vkey(&address, 80, Protocol::Tcp),
                    vs(VirtualServerRole::ClusterIp, &[("10.1.0.2", 8080)]),
                )]),
            )
        })
        .collect();
    let many = desired(services);
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    reconciler(&ipvs, &addresses)
        .full_sync(&many)
        .await
        .unwrap();
    ipvs.take_applied_ops();

    // A restart whose best-effort read lacks them all (more than are looked up one by
    // one): the table is read again, whole, and nothing is written.
    for key in ipvs.table().keys() {
        ipvs.hide_from_next_list(*key);
    }
    let calls = ipvs.read_calls();
    let mut restarted = reconciler(&ipvs, &addresses);
    let report = restarted.full_sync(&many).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.writes, 0);
    assert!(ipvs.take_applied_ops().is_empty());
    assert_eq!(ipvs.read_calls(), (calls.0 + 2, calls.1));
}

#[tokio::test]
async fn a_stale_virtual_server_the_dump_skipped_goes_at_the_next_full_sync() {
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    let mut reconciler = reconciler(&ipvs, &addresses);
    reconciler.full_sync(&two_services()).await.unwrap();
    let mut smaller = two_services();
    smaller.services.remove(&spn("dns", Protocol::Udp));
    let dns = vkey("10.96.0.53", 53, Protocol::Udp);
    ipvs.hide_from_next_list(dns);
    let report = reconciler.full_sync(&smaller).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let report = reconciler.full_sync(&smaller).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(!ipvs.table().contains_key(&dns));
}

/// `two_services` with its ClusterIPs covered by a routed Service CIDR.
fn two_services_routed() -> Desired {
    let mut desired = two_services();
    for plan in desired.services.values_mut() {
        plan.cluster_ips_routed = true;
    }
    desired
}

#[tokio::test]
async fn routed_service_cidrs_replace_cluster_ip_binds_and_own_what_lies_in_them() {
    let net = |s: &str| s.parse::<IpNet>().unwrap();
    let stale = vkey("10.96.0.77", 80, Protocol::Tcp); // in the routed CIDR, no longer planned
    let foreign = vkey("10.112.0.5", 80, Protocol::Tcp); // just outside it, on no address of ours
    let mut table = BTreeMap::new();
    for key in [stale, foreign] {
        table.insert(key, observed_rr(&[("10.1.0.50", 80, 1)]));
    }
    let ipvs = MemoryIpvsBackend::with_table(table);
    // Left from an earlier run: a ClusterIP bound one by one, and a route nobody configures.
    let addresses = MemoryAddressBackend::with_addresses([ip("10.96.0.10")]);
    addresses.add_route_behind_back(net("10.100.0.0/16"));
    let config = ReconcilerConfig {
        service_cidr_routes: vec![net("10.96.0.0/12")],
        ..ReconcilerConfig::default()
    };
    let mut rec = Reconciler::new(ipvs.clone(), addresses.clone(), config.clone());
    let report = rec.full_sync(&two_services_routed()).await.unwrap();
    assert!(report.errors.is_empty(), "{report:?}");

    assert_eq!(
        addresses.local_routes(),
        BTreeSet::from([net("10.96.0.0/12")])
    );
    // No ClusterIP is bound one by one any more.
    assert_eq!(addresses.addresses(), BTreeSet::new());
    let table = ipvs.table();
    assert!(table.contains_key(&vkey("10.96.0.10", 80, Protocol::Tcp)));
    assert!(table.contains_key(&vkey("10.96.0.53", 53, Protocol::Udp)));
    assert!(
        !table.contains_key(&stale),
        "a virtual server in the routed CIDR is ours"
    );
    assert!(table.contains_key(&foreign));

    // A restart with the same inputs adopts everything with zero writes.
    let mut again = Reconciler::new(ipvs.clone(), addresses.clone(), config);
    addresses.take_applied_ops();
    let report = again.full_sync(&two_services_routed()).await.unwrap();
    assert_eq!(report.writes, 0, "{report:?}");

    // Turned off: the route goes and the ClusterIPs are bound again.
    let mut off = reconciler(&ipvs, &addresses);
    let report = off.full_sync(&two_services()).await.unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(addresses.local_routes(), BTreeSet::new());
    assert_eq!(
        addresses.addresses(),
        BTreeSet::from([ip("10.96.0.10"), ip("10.96.0.53")])
    );
}

#[tokio::test]
async fn a_service_cidr_holding_a_node_address_is_never_routed() {
    let net = |s: &str| s.parse::<IpNet>().unwrap();
    let ipvs = MemoryIpvsBackend::new();
    let addresses = MemoryAddressBackend::new();
    addresses.set_node_addresses([ip("192.168.1.5")]);
    // Left from a run with the same mistake, before the check.
    addresses.add_route_behind_back(net("192.168.0.0/16"));
    let config = ReconcilerConfig {
        service_cidr_routes: vec![net("10.96.0.0/12"), net("192.168.0.0/16")],
        ..ReconcilerConfig::default()
    };
    let mut rec = Reconciler::new(ipvs.clone(), addresses.clone(), config);
    let report = rec.full_sync(&two_services_routed()).await.unwrap();
    assert_eq!(
        addresses.local_routes(),
        BTreeSet::from([net("10.96.0.0/12")])
    );
    let errors: Vec<String> = report.errors.iter().map(|(_, e)| e.to_string()).collect();
    assert_eq!(
        errors,
        ["not routing 192.168.0.0/16 through kube-ipvs0: it holds the node's address 192.168.1.5"]
    );
    // The rest is programmed as usual.
    assert!(
        ipvs.table()
            .contains_key(&vkey("10.96.0.10", 80, Protocol::Tcp))
    );
}

#[tokio::test]
async fn cleanup_owns_by_routes_as_syncs_do_never_over_a_node_address() {
    // `--cleanup` with the same misconfiguration: 192.168.0.0/16 holds the node's address,
    // so it is not a network of the proxier's, and an unplanned virtual server in it (not on
    // a node address, nor a NodePort) is someone else's; one in the good CIDR is ours.
    let net = |s: &str| s.parse::<IpNet>().unwrap();
    let theirs = vkey("192.168.7.7", 80, Protocol::Tcp);
    let ours = vkey("10.96.0.77", 80, Protocol::Tcp);
    let mut table = BTreeMap::new();
    for key in [theirs, ours] {
        table.insert(key, observed_rr(&[("10.1.0.50", 80, 1)]));
    }
    let ipvs = MemoryIpvsBackend::with_table(table);
    let addresses = MemoryAddressBackend::new();
    addresses.set_node_addresses([ip("192.168.1.5")]);
    let config = ReconcilerConfig {
        service_cidr_routes: vec![net("10.96.0.0/12"), net("192.168.0.0/16")],
        ..ReconcilerConfig::default()
    };
    let mut rec = Reconciler::new(ipvs.clone(), addresses.clone(), config);
    let report = rec.remove_owned().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.virtual_servers, 1);
    assert!(ipvs.table().contains_key(&theirs), "not the proxier's");
    assert!(
        !ipvs.table().contains_key(&ours),
        "in a routed Service CIDR: the proxier's"
    );
}
