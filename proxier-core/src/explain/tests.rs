use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use super::*;
use crate::desired::Protocol;
use crate::kernel_modules::ModuleStatus;
use crate::model::{
    Endpoint, EndpointPort, EndpointSlice, LoadBalancerIngress, Service, ServicePortSpec, SliceKey,
};
use crate::netfilter::render::{nft_family, set_elements};
use crate::observed::{ObservedRealServer, ObservedVirtualServer, VirtualServerSettings};
use crate::planner::plan;
use crate::state::Change;

const NODE: &str = "node-a";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn name() -> ServiceName {
    ServiceName::new("default", "web")
}

fn web(node_port: Option<u16>) -> Service {
    Service::new(
        name(),
        vec![ip("10.96.0.10")],
        vec![ServicePortSpec {
            name: "http".into(),
            port: 80,
            protocol: Protocol::Tcp,
            node_port,
        }],
    )
}

fn endpoint(address: &str, node: &str) -> Endpoint {
    Endpoint {
        node_name: Some(Arc::from(node)),
        ..Endpoint::ready(ip(address))
    }
}

fn slice(endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        key: SliceKey::new("default", "web-1"),
        service: name(),
        ports: vec![EndpointPort {
            name: "http".into(),
            port: 8080,
            protocol: Protocol::Tcp,
        }],
        endpoints,
        warnings: Vec::new(),
        trigger_time: None,
    }
}

/// The engine's picture and a kernel programmed exactly as planned, which a test then
/// changes.
struct World {
    state: ClusterState,
    node: NodeContext,
    config: Config,
    desired: Desired,
    kernel: KernelFacts,
}

impl World {
    fn new(service: Service, endpoints: Vec<Endpoint>) -> World {
        let mut state = ClusterState::new();
        state.apply(Change::UpsertService(service));
        state.apply(Change::UpsertSlice(slice(endpoints)));
        let node = NodeContext::new(NODE, vec![ip("192.168.1.1")], vec![ip("192.168.1.1")]);
        let config = Config::default();
        let desired = plan(&state, &node, &config);
        let mut virtual_servers = BTreeMap::new();
        for (_, key, vs) in desired.virtual_servers() {
            let mut observed = ObservedVirtualServer {
                settings: VirtualServerSettings::of(vs),
                real_servers: Default::default(),
            };
            for (rs, planned) in vs.real_servers.iter() {
                observed
                    .real_servers
                    .insert(*rs, ObservedRealServer::new(planned.weight));
            }
            virtual_servers.insert(*key, observed);
        }
        let mut sets: BTreeMap<(String, String), NetfilterSetRead> = BTreeMap::new();
        let netfilter = crate::netfilter::plan(&state, &node, &config);
        for (family, set, element) in set_elements(&netfilter) {
            let entry = sets
                .entry((nft_family(family).to_owned(), set.to_owned()))
                .or_insert_with(|| Ok(BTreeSet::new()));
            if let Ok(elements) = entry {
                elements.insert(element);
            }
        }
        let kernel = KernelFacts {
            link: "kube-ipvs0".into(),
            virtual_servers: Ok(virtual_servers),
            link_addresses: Ok(desired.bound_addresses()),
            local_routes: Ok(BTreeSet::new()),
            missing_tables: Ok(BTreeSet::new()),
            netfilter_refused: None,
            netfilter_sets: sets,
            scheduler_modules: BTreeMap::from([("rr".to_owned(), ModuleStatus::Loaded)]),
            health_checks: BTreeMap::new(),
        };
        World {
            state,
            node,
            config,
            desired,
            kernel,
        }
    }

    fn explain(&self, client: Option<IpAddr>) -> Explanation {
        let picture = EnginePicture {
            state: &self.state,
            node: &self.node,
            config: &self.config,
            desired: &self.desired,
        };
        explain(picture, &name(), &self.kernel, client)
    }

    fn table(&mut self) -> &mut BTreeMap<VirtualServerKey, ObservedVirtualServer> {
        self.kernel.virtual_servers.as_mut().expect("a table")
    }
}

fn kinds(explanation: &Explanation) -> Vec<(ReasonKind, Severity)> {
    explanation
        .reasons
        .iter()
        .map(|r| (r.kind, r.severity))
        .collect()
}

fn cluster_ip_key() -> VirtualServerKey {
    VirtualServerKey {
        address: ip("10.96.0.10"),
        port: 80,
        protocol: Protocol::Tcp,
    }
}

#[test]
fn a_service_programmed_as_planned_is_healthy() {
    let world = World::new(
        web(Some(30080)),
        vec![
            endpoint("10.244.0.5", NODE),
            endpoint("10.244.1.5", "node-b"),
        ],
    );
    let explanation = world.explain(None);
    assert!(explanation.healthy, "{:#?}", explanation.reasons);
    assert!(explanation.reasons.is_empty());
    let port = &explanation.ports[0];
    assert_eq!(port.endpoints.total, 2);
    assert_eq!(port.endpoints.local_usable, 1);
    let roles: BTreeSet<&str> = port
        .virtual_servers
        .iter()
        .map(|v| v.role.as_str())
        .collect();
    assert_eq!(roles, BTreeSet::from(["ClusterIP", "NodePort"]));
    let cluster_ip = port
        .virtual_servers
        .iter()
        .find(|v| v.role == "ClusterIP")
        .expect("a ClusterIP virtual server");
    assert_eq!(cluster_ip.address_state, AddressState::Bound);
    assert_eq!(cluster_ip.real_servers.len(), 2);
    assert!(
        explanation
            .netfilter
            .iter()
            .all(|m| m.present == Some(true))
    );
    assert!(
        explanation
            .netfilter
            .iter()
            .any(|m| m.set == "cluster-ips" && m.element == "10.96.0.10 . tcp . 80")
    );
}

#[test]
fn endpoint_problems_are_named_per_port() {
    let world = World::new(web(None), Vec::new());
    assert_eq!(
        kinds(&world.explain(None)),
        [(ReasonKind::NoEndpoints, Severity::Blocking)]
    );

    let not_ready = Endpoint {
        ready: false,
        serving: false,
        ..endpoint("10.244.0.5", NODE)
    };
    let world = World::new(web(None), vec![not_ready]);
    assert_eq!(
        kinds(&world.explain(None)),
        [(ReasonKind::NoReadyEndpoints, Severity::Blocking)]
    );

    let terminating = Endpoint {
        ready: false,
        serving: true,
        terminating: true,
        ..endpoint("10.244.0.5", NODE)
    };
    let world = World::new(web(None), vec![terminating]);
    let explanation = world.explain(None);
    assert_eq!(
        kinds(&explanation),
        [(ReasonKind::OnlyTerminatingEndpoints, Severity::Warning)]
    );
    assert!(!explanation.healthy);
}

#[test]
fn local_traffic_policies_without_local_endpoints() {
    let mut service = web(Some(30080));
    service.external_traffic_policy = TrafficPolicy::Local;
    service.health_check_node_port = Some(32000);
    let mut world = World::new(service, vec![endpoint("10.244.1.5", "node-b")]);
    world
        .kernel
        .health_checks
        .insert(32000, Ok(HealthAnswer { status: 503 }));
    let explanation = world.explain(None);
    assert_eq!(
        kinds(&explanation),
        [(
            ReasonKind::ExternalPolicyLocalNoLocalEndpoints,
            Severity::Blocking
        )]
    );
    let check = explanation.health_check.expect("a health check");
    assert_eq!(
        (check.expected_status, check.answered_status),
        (503, Some(503))
    );

    // A health check that answers otherwise than planned is named too.
    world
        .kernel
        .health_checks
        .insert(32000, Ok(HealthAnswer { status: 200 }));
    assert!(
        kinds(&world.explain(None)).contains(&(ReasonKind::HealthCheckMismatch, Severity::Warning))
    );

    // internalTrafficPolicy: Local and not reachable from outside: nothing to fall back to.
    let mut service = web(None);
    service.internal_traffic_policy = TrafficPolicy::Local;
    let world = World::new(service, vec![endpoint("10.244.1.5", "node-b")]);
    assert_eq!(
        kinds(&world.explain(None)),
        [(
            ReasonKind::InternalPolicyLocalNoLocalEndpoints,
            Severity::Blocking
        )]
    );
    // With a NodePort the ClusterIP falls back to the cluster's endpoints: a warning.
    let mut service = web(Some(30080));
    service.internal_traffic_policy = TrafficPolicy::Local;
    let world = World::new(service, vec![endpoint("10.244.1.5", "node-b")]);
    assert_eq!(
        kinds(&world.explain(None)),
        [(
            ReasonKind::InternalPolicyLocalNoLocalEndpoints,
            Severity::Warning
        )]
    );
}

#[test]
fn source_ranges_exclude_a_client_outside_them() {
    let mut service = web(Some(30080));
    service.load_balancer_ingress = vec![LoadBalancerIngress {
        ip: ip("203.0.113.10"),
        ip_mode: Default::default(),
    }];
    service.load_balancer_source_ranges = vec!["198.51.100.0/24".parse().expect("net")];
    let world = World::new(service, vec![endpoint("10.244.0.5", NODE)]);
    let outside = world.explain(Some(ip("192.0.2.7")));
    assert_eq!(
        kinds(&outside),
        [(ReasonKind::SourceRangesExcludeClient, Severity::Blocking)]
    );
    assert!(outside.reasons[0].message.contains("198.51.100.0/24"));
    let inside = world.explain(Some(ip("198.51.100.7")));
    assert_eq!(
        kinds(&inside),
        [(ReasonKind::SourceRangesRestrict, Severity::Info)]
    );
    assert!(inside.healthy);
}

#[test]
fn kernel_drift_a_missing_scheduler_and_foreign_virtual_servers() {
    let mut world = World::new(web(None), vec![endpoint("10.244.0.5", NODE)]);
    // A real server gone behind the proxier's back, another added, the VIP unbound.
    let vs = world.table().get_mut(&cluster_ip_key()).expect("planned");
    vs.real_servers.clear();
    vs.real_servers.insert(
        crate::desired::RealServerKey {
            address: ip("10.244.9.9"),
            port: 8080,
        },
        ObservedRealServer::new(1),
    );
    world.kernel.link_addresses = Ok(BTreeSet::new());
    let explanation = world.explain(None);
    let drift: Vec<&Reason> = explanation
        .reasons
        .iter()
        .filter(|r| r.kind == ReasonKind::Drift)
        .collect();
    assert_eq!(drift.len(), 3, "{drift:#?}");
    assert!(drift.iter().any(|r| r.message.contains("10.244.0.5:8080")));
    assert!(drift.iter().any(|r| r.message.contains("10.244.9.9:8080")));
    assert!(drift.iter().any(|r| r.severity == Severity::Blocking));
    let rs = &explanation.ports[0].virtual_servers[0].real_servers;
    assert_eq!(rs.len(), 2);

    // The virtual server missing, and its scheduler not available.
    let mut world = World::new(web(None), vec![endpoint("10.244.0.5", NODE)]);
    world.table().clear();
    world
        .kernel
        .scheduler_modules
        .insert("rr".into(), ModuleStatus::Missing);
    let explanation = world.explain(None);
    assert!(
        kinds(&explanation).contains(&(ReasonKind::SchedulerModuleMissing, Severity::Blocking))
    );
    assert!(kinds(&explanation).contains(&(ReasonKind::Drift, Severity::Blocking)));

    // A virtual server on the ClusterIP that nobody plans.
    let mut world = World::new(web(None), vec![endpoint("10.244.0.5", NODE)]);
    let foreign = VirtualServerKey {
        port: 8443,
        ..cluster_ip_key()
    };
    world.table().insert(
        foreign,
        ObservedVirtualServer {
            settings: VirtualServerSettings::default(),
            real_servers: Default::default(),
        },
    );
    let explanation = world.explain(None);
    assert_eq!(
        kinds(&explanation),
        [(ReasonKind::ForeignVirtualServer, Severity::Warning)]
    );
    assert_eq!(explanation.foreign_virtual_servers, [foreign.to_string()]);
}

#[test]
fn unreadable_kernel_parts_are_said_once_and_an_unknown_service_is_not_found() {
    let mut world = World::new(web(None), vec![endpoint("10.244.0.5", NODE)]);
    world.kernel.virtual_servers = Err("permission denied".into());
    let explanation = world.explain(None);
    assert_eq!(
        kinds(&explanation),
        [(ReasonKind::KernelUnreadable, Severity::Warning)]
    );
    assert!(explanation.reasons[0].message.contains("permission denied"));

    // A missing table is drift, said once, and its sets are not checked.
    let mut world = World::new(web(None), vec![endpoint("10.244.0.5", NODE)]);
    world.kernel.netfilter_sets.clear();
    world.kernel.missing_tables = Ok(BTreeSet::from(["ip ipvs-proxier".to_owned()]));
    let explanation = world.explain(None);
    assert_eq!(
        kinds(&explanation),
        [(ReasonKind::Drift, Severity::Blocking)]
    );
    assert!(explanation.reasons[0].message.contains("ip ipvs-proxier"));
    assert!(explanation.netfilter.iter().all(|m| m.present.is_none()));

    let picture = EnginePicture {
        state: &world.state,
        node: &world.node,
        config: &world.config,
        desired: &world.desired,
    };
    let missing = explain(
        picture,
        &ServiceName::new("default", "nope"),
        &world.kernel,
        None,
    );
    assert!(kinds(&missing).contains(&(ReasonKind::ServiceNotFound, Severity::Blocking)));
    assert!(missing.ports.is_empty());
}

#[test]
fn the_document_round_trips_through_json() {
    let world = World::new(web(Some(30080)), vec![endpoint("10.244.0.5", NODE)]);
    let explanation = world.explain(Some(ip("192.0.2.7")));
    let json = serde_json::to_string(&explanation).expect("serialise");
    assert!(
        json.contains("\"apiVersion\":\"ipvs-proxier.explain/v1\""),
        "{json}"
    );
    let back: Explanation = serde_json::from_str(&json).expect("deserialise");
    assert_eq!(back, explanation);
}

#[test]
fn set_listings_parse_into_elements() {
    let listing = "table ip ipvs-proxier {\n\tset cluster-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\telements = { 10.96.0.10 . tcp . 80,\n\t\t\t     10.96.0.11 . udp . 53 }\n\t}\n}\n";
    assert_eq!(
        crate::netfilter::render::parse_set_elements(listing),
        BTreeSet::from([
            "10.96.0.10 . tcp . 80".to_owned(),
            "10.96.0.11 . udp . 53".to_owned()
        ])
    );
    let empty = "table ip ipvs-proxier {\n\tset cluster-ips {\n\t\ttype ipv4_addr\n\t}\n}\n";
    assert!(crate::netfilter::render::parse_set_elements(empty).is_empty());
}

#[test]
fn protocols_listed_as_numbers_parse_as_the_names_the_plan_writes() {
    let named = "table ip ipvs-proxier {\n\tset hairpin {\n\t\ttype ipv4_addr . inet_proto . inet_service . ipv4_addr\n\t\telements = { 10.244.0.5 . tcp . 8080 . 10.244.0.5,\n\t\t\t     10.244.0.5 . udp . 53 . 10.244.0.5,\n\t\t\t     10.244.0.5 . sctp . 3868 . 10.244.0.5 }\n\t}\n}\n";
    let numbered = "table ip ipvs-proxier {\n\tset hairpin {\n\t\ttype ipv4_addr . inet_proto . inet_service . ipv4_addr\n\t\telements = { 10.244.0.5 . 6 . 8080 . 10.244.0.5,\n\t\t\t     10.244.0.5 . 17 . 53 . 10.244.0.5,\n\t\t\t     10.244.0.5 . 132 . 3868 . 10.244.0.5 }\n\t}\n}\n";
    let expected = BTreeSet::from([
        "10.244.0.5 . tcp . 8080 . 10.244.0.5".to_owned(),
        "10.244.0.5 . udp . 53 . 10.244.0.5".to_owned(),
        "10.244.0.5 . sctp . 3868 . 10.244.0.5".to_owned(),
    ]);
    assert_eq!(
        crate::netfilter::render::parse_set_elements(named),
        expected
    );
    assert_eq!(
        crate::netfilter::render::parse_set_elements(numbered),
        expected
    );
}

#[test]
fn only_fields_typed_inet_proto_are_read_as_protocols() {
    // Port 6 and port 17 stay numbers; an IP protocol no Service uses stays as listed.
    let listing = "table ip6 ipvs-proxier {\n\tset node-ports {\n\t\ttype inet_proto . inet_service\n\t\telements = { 6 . 6, udp . 17, 50 . 80 }\n\t}\n}\n";
    assert_eq!(
        crate::netfilter::render::parse_set_elements(listing),
        BTreeSet::from([
            "tcp . 6".to_owned(),
            "udp . 17".to_owned(),
            "50 . 80".to_owned()
        ])
    );
    // Without a type line, or with fields that do not match it, elements stay as listed.
    let untyped = "table ip ipvs-proxier {\n\tset cluster-ips {\n\t\telements = { 10.96.0.10 .  6 . 80 }\n\t}\n}\n";
    assert_eq!(
        crate::netfilter::render::parse_set_elements(untyped),
        BTreeSet::from(["10.96.0.10 . 6 . 80".to_owned()])
    );
    let mismatched = "table ip ipvs-proxier {\n\tset node-ports {\n\t\ttype inet_proto . inet_service\n\t\telements = { 10.96.0.10 . 6 . 80 }\n\t}\n}\n";
    assert_eq!(
        crate::netfilter::render::parse_set_elements(mismatched),
        BTreeSet::from(["10.96.0.10 . 6 . 80".to_owned()])
    );
}

/// A set as `nft list set` prints it on a host without `/etc/protocols`: each protocol as
/// its number, under the key type its elements' fields have.
fn listing_with_numbered_protocols(family: &str, set: &str, elements: &BTreeSet<String>) -> String {
    let number = |field: &str| match field {
        "tcp" => Some("6"),
        "udp" => Some("17"),
        "sctp" => Some("132"),
        _ => None,
    };
    let first = elements.first().map(String::as_str).unwrap_or_default();
    let key_type: Vec<&str> = first
        .split(" . ")
        .map(|field| match (number(field), field.parse::<IpAddr>()) {
            (Some(_), _) => "inet_proto",
            (None, Ok(IpAddr::V4(_))) => "ipv4_addr",
            (None, Ok(IpAddr::V6(_))) => "ipv6_addr",
            (None, Err(_)) => "inet_service",
        })
        .collect();
    let listed: Vec<String> = elements
        .iter()
        .map(|element| {
            element
                .split(" . ")
                .map(|field| number(field).unwrap_or(field))
                .collect::<Vec<_>>()
                .join(" . ")
        })
        .collect();
    format!(
        "table {family} ipvs-proxier {{\n\tset {set} {{\n\t\ttype {}\n\t\telements = {{ {} }}\n\t}}\n}}\n",
        key_type.join(" . "),
        listed.join(",\n\t\t\t     ")
    )
}

#[test]
fn a_kernel_that_lists_protocols_as_numbers_holds_the_planned_elements() {
    let mut world = World::new(
        web(Some(30080)),
        vec![
            endpoint("10.244.0.5", NODE),
            endpoint("10.244.1.5", "node-b"),
        ],
    );
    let mut numbered = 0;
    for ((family, set), read) in &mut world.kernel.netfilter_sets {
        let elements = read.as_ref().expect("every set read");
        let listing = listing_with_numbered_protocols(family, set, elements);
        numbered += usize::from(listing.contains(" 6 . "));
        *read = Ok(crate::netfilter::render::parse_set_elements(&listing));
    }
    assert!(numbered >= 2, "cluster-ips and hairpin list a protocol");
    let explanation = world.explain(None);
    assert!(explanation.healthy, "{:#?}", explanation.reasons);
    assert!(
        explanation
            .netfilter
            .iter()
            .all(|m| m.present == Some(true))
    );
}

#[test]
fn a_kernel_that_refuses_the_tables_blocks_with_the_start_checks_words() {
    let mut world = World::new(web(None), vec![endpoint("10.244.0.5", NODE)]);
    world.kernel.netfilter_refused =
        Some("kernel 6.12 refuses the proxier's nftables tables".into());
    let explanation = world.explain(None);
    assert_eq!(
        kinds(&explanation),
        [(ReasonKind::NetfilterRefused, Severity::Blocking)]
    );
    assert!(
        explanation.reasons[0]
            .message
            .contains("kernel 6.12 refuses")
    );
    assert!(!explanation.healthy);
}
