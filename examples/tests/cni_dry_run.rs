//! `cni-proxier`'s embedding on in-memory backends (what `--dry-run` runs): the sample input
//! becomes the table its Services describe, and edits applied the way `--watch` applies them
//! touch only the Services that changed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipvs_proxier_examples::cni_input::{
    EndpointEntry, Policy, ProtocolName, ServicesFile, changed_ports, changes, parse_services,
};
use proxier_core::backend::memory::{MemoryAddressBackend, MemoryIpvsBackend};
use proxier_core::engine::SyncReport;
use proxier_core::model::Config;
use proxier_core::observed::ObservedVirtualServer;
use proxier_core::{Backends, MemoryProxier, Proxier, ProxierConfig, SyncKind, VirtualServerKey};

/// Virtual servers with their real servers (address, port) and persistence timeout.
type Table = BTreeMap<VirtualServerKey, (BTreeSet<(IpAddr, u16)>, Option<u32>)>;

const SAMPLE: &str = include_str!("../cni-services.json");
const NODE: &str = "node-a";

/// The sample, fed to a proxier on in-memory backends and synced.
struct DryRun {
    input: ServicesFile,
    proxier: MemoryProxier,
    ipvs: MemoryIpvsBackend,
    addresses: MemoryAddressBackend,
    runtime: tokio::runtime::Runtime,
}

impl DryRun {
    fn sample() -> DryRun {
        let input = parse_services(SAMPLE, "cni-services.json").expect("sample parses");
        let backends = Backends::in_memory();
        let (ipvs, addresses) = (backends.ipvs.clone(), backends.addresses.clone());
        let config = ProxierConfig::new(NODE, Config::default());
        let mut proxier = Proxier::new(config, backends).expect("proxier");
        for change in changes(&ServicesFile::default(), &input).expect("changes") {
            proxier.apply(change);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let report = runtime
            .block_on(proxier.sync(SyncKind::Full))
            .expect("full sync");
        assert!(report.is_complete(), "{report:?}");
        DryRun {
            input,
            proxier,
            ipvs,
            addresses,
            runtime,
        }
    }

    /// Applies an edited input the way `--watch` does; returns the report.
    fn edit(&mut self, next: ServicesFile) -> SyncReport {
        for change in changes(&self.input, &next).expect("changes") {
            self.proxier.apply(change);
        }
        self.input = next;
        self.runtime
            .block_on(self.proxier.sync(SyncKind::Incremental))
            .expect("incremental sync")
    }
}

/// The table the input asks for, worked out from the input alone: a virtual server per VIP
/// and port; real servers are the endpoints of the VIP's family on the target port, narrowed
/// to this node's endpoints for `local` when it has any.
fn expected_table(input: &ServicesFile) -> Table {
    let mut table = BTreeMap::new();
    for service in &input.services {
        for vip in &service.vips {
            let of_family = |e: &&EndpointEntry| e.address.is_ipv4() == vip.is_ipv4();
            let all: Vec<&EndpointEntry> = service.endpoints.iter().filter(of_family).collect();
            let local: Vec<&EndpointEntry> = all
                .iter()
                .copied()
                .filter(|e| e.node.as_deref() == Some(NODE))
                .collect();
            let chosen = if service.traffic_policy == Policy::Local && !local.is_empty() {
                local
            } else {
                all
            };
            for port in &service.ports {
                let key = VirtualServerKey {
                    address: *vip,
                    port: port.port,
                    protocol: port.protocol.into(),
                };
                let target = port.target_port.unwrap_or(port.port);
                let real = chosen.iter().map(|e| (e.address, target)).collect();
                table.insert(key, (real, service.session_affinity_seconds));
            }
        }
    }
    table
}

fn actual_table(table: &BTreeMap<VirtualServerKey, ObservedVirtualServer>) -> Table {
    table
        .iter()
        .map(|(key, vs)| {
            let real = vs
                .real_servers
                .keys()
                .map(|rs| (rs.address, rs.port))
                .collect();
            (*key, (real, vs.settings.persistence_timeout))
        })
        .collect()
}

#[test]
fn sample_becomes_the_table_its_services_describe() {
    let run = DryRun::sample();
    let expected = expected_table(&run.input);
    // The sample exercises what the format offers.
    let services = &run.input.services;
    assert!(
        services.iter().any(|s| s.vips.len() == 2),
        "a dual-stack service"
    );
    assert!(
        services
            .iter()
            .any(|s| s.session_affinity_seconds.is_some())
    );
    assert!(services.iter().any(|s| s.traffic_policy == Policy::Local));
    assert!(
        services
            .iter()
            .flat_map(|s| &s.ports)
            .any(|p| p.protocol == ProtocolName::Udp)
    );
    let vs_count: usize = services.iter().map(|s| s.vips.len() * s.ports.len()).sum();
    assert_eq!(expected.len(), vs_count);

    assert_eq!(actual_table(&run.ipvs.table()), expected);
    for vs in run.ipvs.table().values() {
        assert!(vs.real_servers.values().all(|rs| rs.weight == 1));
    }
    let vips: BTreeSet<IpAddr> = services.iter().flat_map(|s| s.vips.clone()).collect();
    assert_eq!(run.addresses.addresses(), vips);
    assert!(run.addresses.link_exists());
    assert_eq!(run.proxier.desired().bound_addresses(), vips);
}

#[test]
fn local_policy_keeps_only_this_nodes_endpoints() {
    let run = DryRun::sample();
    let local = run
        .input
        .services
        .iter()
        .find(|s| s.traffic_policy == Policy::Local)
        .expect("a local service in the sample");
    let remote: Vec<IpAddr> = local
        .endpoints
        .iter()
        .filter(|e| e.node.as_deref() != Some(NODE))
        .map(|e| e.address)
        .collect();
    assert!(
        !remote.is_empty(),
        "the sample's local service has a remote endpoint"
    );
    let table = run.ipvs.table();
    for vip in &local.vips {
        for (key, vs) in table.iter().filter(|(k, _)| k.address == *vip) {
            for address in &remote {
                assert!(
                    !vs.real_servers.keys().any(|rs| rs.address == *address),
                    "{key} routes to the remote endpoint {address}"
                );
            }
        }
    }
}

#[test]
fn removing_an_endpoint_touches_only_that_service() {
    let mut run = DryRun::sample();
    let before = run.ipvs.table();
    run.ipvs.take_applied_ops();
    let mut next = run.input.clone();
    let service = next
        .services
        .iter_mut()
        .find(|s| s.traffic_policy == Policy::Cluster && s.endpoints.len() > 1)
        .expect("a cluster service with two endpoints");
    let removed = service.endpoints.pop().expect("an endpoint");
    let name = service.service_name().expect("name");
    let ports: BTreeSet<_> = service
        .ports
        .iter()
        .map(|p| name.port(&p.name, p.protocol.into()))
        .collect();
    let vips = service.vips.clone();

    assert_eq!(changed_ports(&run.input, &next), ports);
    let report = run.edit(next);
    assert_eq!(report.kind, SyncKind::Incremental);
    assert_eq!(report.changed_ports, ports.len(), "{report:?}");
    assert!(report.is_complete(), "{report:?}");
    // No connections in memory: the real server goes at once.
    assert_eq!(report.ipvs.deletes, report.ipvs.writes, "{report:?}");
    assert!(report.ipvs.deletes >= 1);
    let after = run.ipvs.table();
    assert_eq!(actual_table(&after), expected_table(&run.input));
    for (key, vs) in &before {
        if vips.contains(&key.address) {
            continue;
        }
        assert!(after.get(key) == Some(vs), "{key} changed");
    }
    assert!(
        after
            .values()
            .flat_map(|vs| vs.real_servers.keys())
            .all(|rs| rs.address != removed.address)
    );

    // Saving the same content again changes nothing.
    assert!(changed_ports(&run.input, &run.input).is_empty());
    let report = run.edit(run.input.clone());
    assert_eq!(report.changed_ports, 0);
    assert_eq!(report.ipvs.writes, 0);
}

#[test]
fn removing_a_service_removes_its_virtual_servers_and_vips() {
    let mut run = DryRun::sample();
    let mut next = run.input.clone();
    let gone = next.services.remove(0);
    assert_eq!(changed_ports(&run.input, &next).len(), gone.ports.len());
    let report = run.edit(next);
    assert!(report.is_complete(), "{report:?}");
    let table = run.ipvs.table();
    assert_eq!(actual_table(&table), expected_table(&run.input));
    for vip in &gone.vips {
        assert!(!table.keys().any(|k| k.address == *vip));
        assert!(!run.addresses.addresses().contains(vip));
    }
}
