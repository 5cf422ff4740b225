//! Per-Service traffic metrics (`--ipvs-traffic-metrics`): real TCP connections through a
//! ClusterIP and a NodePort show up in the daemon's `/metrics`, labelled with the Service,
//! per virtual server and per endpoint; a deleted Service's series go; a re-created virtual
//! server starts its counters again (a reset, as Prometheus expects of a counter).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e_support/mod.rs"]
mod e2e_support;

use std::time::{Duration, Instant};

use e2e_support::*;
use ipvs_proxier_tests::require_kernel;

const CLUSTER_IP: &str = "10.96.0.40";
const NODE_PORT: u16 = 30_090;

/// The value of the sample whose name is `name` and whose labels include every one of
/// `labels` (`key="value"` pieces), summed when several match (0 when none does).
fn value(text: &str, name: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{')?;
            (metric == name && labels.iter().all(|l| rest.contains(l)))
                .then(|| value.parse::<u64>().expect("an integer sample"))
        })
        .sum()
}

/// Scrapes until `done` holds (the kernel folds its per-CPU counters into the ones it
/// reports every two seconds), or panics after 20 s with the last page.
fn scrape_until(t: &Topology, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = t.metrics();
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}: not seen in\n{text}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn web() -> (Svc, Vec<Slice>) {
    let mut svc = Svc::cluster_ip(
        "web",
        &[CLUSTER_IP],
        vec![Port::tcp("http", 80, 8080).node_port(NODE_PORT)],
    );
    svc.kind = "NodePort";
    let eps = (0..2).map(|i| Ep::ready(&pod_ip(i), NODE_NAME)).collect();
    let slices = vec![Slice::of(&svc, false, eps)];
    (svc, slices)
}

#[test]
fn connections_and_bytes_appear_per_service_and_endpoint_and_go_with_the_service() {
    require_kernel!();
    let mut t = Topology::new(2);
    let from = t.add_pod();
    for i in 0..2 {
        t.serve_tcp(i, 8080);
    }
    let (svc, slices) = web();
    t.write_one(&svc, &slices);
    t.start_daemon(&["--ipvs-traffic-metrics=endpoint"]);
    t.wait_backends(&format!("TCP  {CLUSTER_IP}:80"), &backends(&[0, 1], 8080));
    t.wait_backends(
        &format!("TCP  {NODE_IP}:{NODE_PORT}"),
        &backends(&[0, 1], 8080),
    );

    let service = [
        r#"namespace="default""#,
        r#"service="web""#,
        r#"port="http""#,
    ];
    let cluster_ip = [service.as_slice(), &[r#"role="ClusterIP""#]].concat();
    let node_port = [service.as_slice(), &[r#"role="NodePort""#]].concat();
    let conns = "ipvs_proxier_service_connections_total";
    let before = t.metrics();
    assert!(
        before.contains("# TYPE ipvs_proxier_service_connections_total counter"),
        "{before}"
    );
    let (cluster_before, node_before) = (
        value(&before, conns, &cluster_ip),
        value(&before, conns, &node_port),
    );

    // Six connections from a pod to the ClusterIP, four from outside to the NodePort.
    let pod = &t.pods[from];
    let mut answered = 0;
    for _ in 0..6 {
        let answer = tcp_request(pod, &format!("{CLUSTER_IP}:80"), None).expect("an answer");
        answered += answer.len() as u64;
    }
    for _ in 0..4 {
        let answer = t
            .client_tcp(&format!("{NODE_IP}:{NODE_PORT}"), None)
            .expect("an answer");
        answered += answer.len() as u64;
    }

    let after = scrape_until(&t, "10 connections", |text| {
        value(text, conns, &cluster_ip) == cluster_before + 6
            && value(text, conns, &node_port) == node_before + 4
    });
    // The answers went out through IPVS: at least their bytes (plus headers) were sent.
    let bytes_out = value(&after, "ipvs_proxier_service_bytes_out_total", &service);
    assert!(bytes_out >= answered, "{bytes_out} < {answered}\n{after}");
    assert!(value(&after, "ipvs_proxier_service_packets_in_total", &service) >= 10 * 3);
    // Per endpoint: the two real servers share the ClusterIP's connections.
    let per_endpoint = value(
        &after,
        "ipvs_proxier_endpoint_connections_total",
        &cluster_ip,
    );
    assert_eq!(per_endpoint, cluster_before + 6, "{after}");
    for i in 0..2 {
        let endpoint = format!(r#"endpoint="{}""#, hostport(&pod_ip(i), 8080));
        let labels = [cluster_ip.as_slice(), &[endpoint.as_str()]].concat();
        assert!(
            after.contains(&endpoint)
                && value(&after, "ipvs_proxier_endpoint_connections_total", &labels) > 0,
            "round robin sends to {endpoint}\n{after}"
        );
    }
    let family = r#"family="IPv4""#;
    let address = format!(r#"address="{CLUSTER_IP}""#);
    assert!(
        after
            .lines()
            .any(|l| l.starts_with(conns) && l.contains(family) && l.contains(&address)),
        "{after}"
    );

    // The Service goes: its series go from the next scrape.
    t.write_source(&[], &[]);
    t.wait_ipvs("web removed", |table| table.services.is_empty());
    scrape_until(&t, "web's series gone", |text| {
        !text.contains(r#"service="web""#)
    });

    // It comes back: new virtual servers, counters from zero (a reset, not a negative rate).
    t.write_one(&svc, &slices);
    t.wait_backends(&format!("TCP  {CLUSTER_IP}:80"), &backends(&[0, 1], 8080));
    tcp_request(&t.pods[from], &format!("{CLUSTER_IP}:80"), None).expect("an answer");
    let again = scrape_until(&t, "one connection after re-creation", |text| {
        value(text, conns, &cluster_ip) == 1
    });
    assert!(value(&again, conns, &cluster_ip) < cluster_before + 6);
}
