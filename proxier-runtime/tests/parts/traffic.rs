//! Tests of `proxier_runtime::traffic`: which virtual servers are exported, with which labels
//! and values, and how the directory follows the plan.

use std::net::IpAddr;

use ipvs_netlink::{
    Destination, DestinationEntry, Scheduler, Service, ServiceEntry, ServiceKey, Stats,
};
use proxier_core::desired::{
    Desired, Protocol, RealServer, RealServerKey, ServicePortName, ServicePortPlan, SortedMap,
    VirtualServer, VirtualServerKey, VirtualServerRole,
};
use proxier_core::model::ServiceName;
use proxier_runtime::traffic::{TrafficDirectory, TrafficLevel, render};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn web_port() -> ServicePortName {
    ServiceName::new("shop", "web").port("http", Protocol::Tcp)
}

fn vs_key(address: &str, port: u16) -> VirtualServerKey {
    VirtualServerKey {
        address: ip(address),
        port,
        protocol: Protocol::Tcp,
    }
}

fn virtual_server(role: VirtualServerRole) -> VirtualServer {
    VirtualServer {
        role,
        scheduler: Scheduler::RoundRobin,
        persistence_timeout: None,
        hash_source_port: false,
        real_servers: SortedMap::from_iter([(
            RealServerKey {
                address: ip("10.244.1.5"),
                port: 8080,
            },
            RealServer { weight: 1 },
        )]),
    }
}

/// shop/web:http on ClusterIP 10.96.0.10:80 and NodePort 192.168.0.10:30080.
fn desired() -> Desired {
    let mut plan = ServicePortPlan::default();
    plan.virtual_servers.insert(
        vs_key("10.96.0.10", 80),
        virtual_server(VirtualServerRole::ClusterIp),
    );
    plan.virtual_servers.insert(
        vs_key("192.168.0.10", 30080),
        virtual_server(VirtualServerRole::NodePort),
    );
    let mut desired = Desired::default();
    desired.set_plan(&web_port(), Some(plan));
    desired
}

fn stats(conns: u64, bytes_in: u64) -> Stats {
    Stats {
        conns,
        in_packets: conns * 3,
        out_packets: conns * 2,
        in_bytes: bytes_in,
        out_bytes: bytes_in * 10,
        ..Stats::default()
    }
}

fn entry(
    address: &str,
    port: u16,
    conns: u64,
    bytes_in: u64,
) -> (ServiceEntry, Vec<DestinationEntry>) {
    let service = ServiceEntry {
        service: Service::new(ServiceKey::tcp(ip(address), port), Scheduler::RoundRobin),
        stats: stats(conns, bytes_in),
    };
    let destination = DestinationEntry {
        destination: Destination::new(ip("10.244.1.5"), 8080),
        active_conns: 2,
        inactive_conns: 1,
        persistent_conns: 0,
        stats: stats(conns, bytes_in),
    };
    (service, vec![destination])
}

fn table() -> ipvs_netlink::Table {
    vec![
        entry("10.96.0.10", 80, 7, 700),
        entry("192.168.0.10", 30080, 4, 400),
        // Not the proxier's: never exported.
        entry("203.0.113.1", 80, 99, 9900),
    ]
}

fn samples(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn each_planned_virtual_server_is_labelled_with_its_service_port_and_role() {
    let mut directory = TrafficDirectory::new();
    directory.rebuild(&desired());
    assert_eq!(directory.len(), 2);
    let text = render(&table(), &directory, TrafficLevel::Service);
    let cluster_ip = r#"namespace="shop",service="web",port="http",protocol="TCP",role="ClusterIP",family="IPv4",address="10.96.0.10""#;
    let node_port = r#"namespace="shop",service="web",port="http",protocol="TCP",role="NodePort",family="IPv4",address="192.168.0.10""#;
    for expected in [
        format!("ipvs_proxier_service_connections_total{{{cluster_ip}}} 7"),
        format!("ipvs_proxier_service_packets_in_total{{{cluster_ip}}} 21"),
        format!("ipvs_proxier_service_packets_out_total{{{cluster_ip}}} 14"),
        format!("ipvs_proxier_service_bytes_in_total{{{cluster_ip}}} 700"),
        format!("ipvs_proxier_service_bytes_out_total{{{cluster_ip}}} 7000"),
        format!("ipvs_proxier_service_active_connections{{{cluster_ip}}} 2"),
        format!("ipvs_proxier_service_inactive_connections{{{cluster_ip}}} 1"),
        format!("ipvs_proxier_service_connections_total{{{node_port}}} 4"),
    ] {
        assert!(
            samples(&text).contains(&expected.as_str()),
            "{expected}\n{text}"
        );
    }
    assert!(
        !text.contains("203.0.113.1"),
        "a foreign virtual server: {text}"
    );
    assert!(
        !text.contains("ipvs_proxier_endpoint_"),
        "service level only: {text}"
    );
    // Seven metrics, two virtual servers each, one HELP and one TYPE per metric.
    assert_eq!(samples(&text).len(), 14, "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE")).count(), 7);
    assert!(text.contains("# TYPE ipvs_proxier_service_connections_total counter"));
    assert!(text.contains("# TYPE ipvs_proxier_service_active_connections gauge"));
}

#[test]
fn the_endpoint_level_adds_one_series_per_real_server() {
    let mut directory = TrafficDirectory::new();
    directory.rebuild(&desired());
    let text = render(&table(), &directory, TrafficLevel::Endpoint);
    let expected = r#"ipvs_proxier_endpoint_bytes_in_total{namespace="shop",service="web",port="http",protocol="TCP",role="NodePort",family="IPv4",address="192.168.0.10",endpoint="10.244.1.5:8080"} 400"#;
    assert!(samples(&text).contains(&expected), "{text}");
    assert_eq!(samples(&text).len(), 28, "{text}");
    let written: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let named = proxier_runtime::traffic::metric_names();
    assert_eq!(written, named.iter().map(String::as_str).collect());
}

#[test]
fn nothing_is_read_when_off() {
    let mut directory = TrafficDirectory::new();
    directory.rebuild(&desired());
    assert_eq!(render(&table(), &directory, TrafficLevel::Off), "");
}

#[test]
fn a_port_that_goes_takes_its_series_with_it() {
    let mut directory = TrafficDirectory::new();
    directory.rebuild(&desired());
    let mut smaller = desired().services.remove(&web_port()).expect("plan");
    smaller
        .virtual_servers
        .remove(&vs_key("192.168.0.10", 30080));
    assert!(directory.update_port(&web_port(), Some(&smaller)));
    assert!(
        !directory.update_port(&web_port(), Some(&smaller)),
        "no change twice"
    );
    let text = render(&table(), &directory, TrafficLevel::Service);
    assert!(!text.contains("NodePort"), "{text}");
    assert_eq!(samples(&text).len(), 7, "{text}");

    assert!(directory.update_port(&web_port(), None));
    assert!(directory.is_empty());
    assert_eq!(
        samples(&render(&table(), &directory, TrafficLevel::Service)),
        Vec::<&str>::new()
    );
}

#[test]
fn levels_read_as_the_flag_writes_them() {
    for (text, level) in [
        ("off", TrafficLevel::Off),
        ("service", TrafficLevel::Service),
        ("endpoint", TrafficLevel::Endpoint),
    ] {
        assert_eq!(text.parse::<TrafficLevel>(), Ok(level));
        assert_eq!(level.to_string(), text);
    }
    assert!("services".parse::<TrafficLevel>().is_err());
}
