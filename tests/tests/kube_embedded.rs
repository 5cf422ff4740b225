//! The `kube-embedded` example (examples/src/bin/kube-embedded.rs) against the real kernel:
//! the engine embedded with proxier-runtime's Kubernetes source, health servers and metrics,
//! fed by the API server double inside the node's network namespace. Real TCP from the
//! client namespace reaches pods through the NodePort of a LoadBalancer Service with
//! `externalTrafficPolicy: Local` (the type that gets a health-check node port); an endpoint change reaches the kernel; the Service's health-check node port
//! answers 200 while the node has a local endpoint and 503 when it has none.
//!
//! Then the same example with `--kubeconfig` against a real API server (`mini-apiserver`:
//! k8s.io/apiserver on etcd) in the node namespace: the Service created over the API carries
//! traffic, an endpoint change and the Service's delete reach the kernel.
//!
//! Oracles: `ipvsadm -Ln` in the node, the pods' own answers, and the health check's HTTP
//! status as the client sees it (kube-proxy's contract with load balancers).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e_support/mod.rs"]
mod e2e;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e::{CONVERGE, NODE_IP, NODE_NAME, OTHER_NODE, Topology, pod_ip, pod_name};
use ipvs_proxier_tests::apiserver::Kind;
use ipvs_proxier_tests::bench::api::ApiInNetns;
use ipvs_proxier_tests::realapi::RealApiServer;
use ipvs_proxier_tests::{PROXIER_BIN_ENV, require_kernel};
use serde_json::{Value, json};

const EXAMPLE: &str = "kube-embedded";
const CLUSTER_IP: &str = "10.96.0.70";
const NODE_PORT: u16 = 30070;
const HEALTH_PORT: u16 = 30170;

/// The example binary: `cargo xtask vm-test` puts the example programs next to the daemon.
fn example_bin() -> PathBuf {
    let daemon = std::env::var_os(PROXIER_BIN_ENV).map(PathBuf::from);
    let next_to_daemon = daemon.and_then(|d| d.parent().map(|dir| dir.join(EXAMPLE)));
    next_to_daemon
        .filter(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{EXAMPLE} is not next to ${PROXIER_BIN_ENV} (xtask builds it)"))
}

fn service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "web", "namespace": "default"},
           "spec": {"clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP], "type": "LoadBalancer",
                    "externalTrafficPolicy": "Local", "healthCheckNodePort": HEALTH_PORT,
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                               "targetPort": 8080, "nodePort": NODE_PORT}]}})
}

/// The Service's slice: each endpoint is (pod index, node it runs on).
fn slice(endpoints: &[(usize, &str)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(i, node)| {
            json!({"addresses": [pod_ip(*i)], "conditions": {"ready": true},
                                "nodeName": node})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
           "metadata": {"name": "web-1", "namespace": "default",
                        "labels": {"kubernetes.io/service-name": "web"}},
           "endpoints": endpoints,
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

fn node_object() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME},
           "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}})
}

/// The example running in the node namespace, killed on drop; its log in a file.
struct Embedded {
    child: Child,
    log: PathBuf,
}

impl Embedded {
    /// The example with `source` (`--master URL` or `--kubeconfig FILE`).
    fn start(topo: &Topology, source: [&str; 2]) -> Embedded {
        let log = std::env::temp_dir().join("kube-embedded.log");
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", topo.node.name()])
            .arg(example_bin())
            .args(["--node", NODE_NAME])
            .args(source)
            .args([
                "--healthz",
                "127.0.0.1:10256",
                "--metrics",
                "127.0.0.1:10249",
            ])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("start kube-embedded");
        Embedded { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `check` until it holds; panics with the log after [`CONVERGE`].
    fn wait(&mut self, what: &str, mut check: impl FnMut() -> bool) {
        let started = Instant::now();
        while !check() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{what}: kube-embedded exited ({status})\n{}", self.log());
            }
            assert!(
                started.elapsed() < CONVERGE,
                "{what}: not within {CONVERGE:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        eprintln!("kube_embedded: {what} after {:?}", started.elapsed());
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- kube-embedded log ---\n{}", self.log());
        }
    }
}

/// Whether a pod's answer (`pod-i <peer address>`) came from pod `i`.
fn answered_by(answer: Option<String>, i: usize) -> bool {
    answer.is_some_and(|a| a.split_whitespace().next() == Some(pod_name(i).as_str()))
}

/// The HTTP status line's code of `GET path` on `target`, sent from the client namespace.
fn http_status(topo: &Topology, target: &str, path: &str) -> Option<u16> {
    let out = topo.client.sh(&format!(
        "printf 'GET {path} HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' | socat -T5 -t5 - TCP:{target},connect-timeout=5"
    ));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next()?.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn embedded_engine_follows_the_api_and_answers_health_checks() {
    require_kernel!();
    let mut topo = Topology::new(2);
    topo.serve_tcp(0, 8080);
    topo.serve_tcp(1, 8080);
    let api_in_node = ApiInNetns::start(&topo.node).expect("API double in the node netns");
    let api = api_in_node.api();
    api.apply(Kind::Node, node_object());
    api.apply(Kind::Service, service());
    api.apply(Kind::EndpointSlice, slice(&[(0, NODE_NAME)]));
    let mut embedded = Embedded::start(&topo, ["--master", &api.url()]);

    // A local endpoint: the NodePort answers through IPVS, the health check says 200.
    let vs = format!("TCP  {NODE_IP}:{NODE_PORT}");
    embedded.wait("the NodePort's real server programmed", || {
        topo.ipvs()
            .active_servers(&vs)
            .contains(&format!("{}:8080", pod_ip(0)))
    });
    let node_port = format!("{NODE_IP}:{NODE_PORT}");
    embedded.wait("pod-0 answers on the NodePort", || {
        answered_by(topo.client_tcp(&node_port, None), 0)
    });
    let health = format!("{NODE_IP}:{HEALTH_PORT}");
    embedded.wait("the health check answers 200", || {
        http_status(&topo, &health, "/") == Some(200)
    });

    // The endpoint moves to another node: the kernel follows, the health check says 503.
    api.apply(Kind::EndpointSlice, slice(&[(1, OTHER_NODE)]));
    let cluster_vs = format!("TCP  {CLUSTER_IP}:80");
    embedded.wait("the ClusterIP's real server replaced", || {
        let servers = topo.ipvs().active_servers(&cluster_vs);
        servers.len() == 1 && servers.contains(&format!("{}:8080", pod_ip(1)))
    });
    embedded.wait("the health check answers 503", || {
        http_status(&topo, &health, "/") == Some(503)
    });

    // A local endpoint again: 200 again, and the NodePort answers from it.
    api.apply(
        Kind::EndpointSlice,
        slice(&[(0, NODE_NAME), (1, OTHER_NODE)]),
    );
    embedded.wait("the health check answers 200 again", || {
        http_status(&topo, &health, "/") == Some(200)
    });
    embedded.wait("pod-0 answers on the NodePort again", || {
        answered_by(topo.client_tcp(&node_port, None), 0)
    });

    // The runtime's metrics reach the example's exporter.
    let metrics = topo.metrics();
    assert!(
        metrics.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds"),
        "metrics:\n{metrics}"
    );
}

#[test]
fn embedded_engine_follows_a_real_api_server() {
    require_kernel!();
    let mut topo = Topology::new(2);
    topo.serve_tcp(0, 8080);
    topo.serve_tcp(1, 8080);
    let Some(api) = RealApiServer::start_in_netns(topo.node.name(), &[]) else {
        return;
    };
    let slices = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";
    api.create("/api/v1/nodes", &node_object());
    api.create("/api/v1/namespaces/default/services", &service());
    api.create(slices, &slice(&[(0, NODE_NAME)]));
    let kubeconfig = api.kubeconfig();
    let kubeconfig = kubeconfig.to_str().expect("a UTF-8 path");
    let mut embedded = Embedded::start(&topo, ["--kubeconfig", kubeconfig]);

    // Created over the API: the NodePort answers from the local pod.
    let node_port = format!("{NODE_IP}:{NODE_PORT}");
    embedded.wait("pod-0 answers on the NodePort", || {
        answered_by(topo.client_tcp(&node_port, None), 0)
    });

    // The endpoint moves to pod-1 (a merge patch of the slice): the kernel follows.
    let endpoints = slice(&[(1, OTHER_NODE)])["endpoints"].clone();
    api.merge_patch(
        &format!("{slices}/web-1"),
        &json!({ "endpoints": endpoints }),
    );
    let cluster_vs = format!("TCP  {CLUSTER_IP}:80");
    embedded.wait("the ClusterIP's real server replaced", || {
        let servers = topo.ipvs().active_servers(&cluster_vs);
        servers.len() == 1 && servers.contains(&format!("{}:8080", pod_ip(1)))
    });

    // The Service deleted: its virtual servers go.
    api.delete("/api/v1/namespaces/default/services/web");
    embedded.wait("the Service's virtual servers removed", || {
        let table = topo.ipvs();
        table.service(&cluster_vs).is_none() && !table.text.contains(&format!(":{NODE_PORT}"))
    });
}
