//! Drop-in observability: a freshly started `ipvs-proxier` (dry run) is scraped once after its
//! first sync, and every metric that the usual kube-proxy consumers query must be there, with
//! the labels they group by. The names are written down from the consumers' published queries:
//!
//! - kubernetes-mixin, "Kubernetes / Proxy" dashboard (`dashboards/proxy.libsonnet` of
//!   kubernetes-monitoring/kubernetes-mixin);
//! - metricbeat's `kubernetes/proxy` metricset (the `mapping` in
//!   `metricbeat/module/kubernetes/proxy/proxy.go` of elastic/beats);
//! - netdata's `k8s_kubeproxy` collector (`collect.go` of the go.d module, in netdata/netdata
//!   `src/go/plugin/go.d/modules/k8s_kubeproxy/`).
//!
//! The `rest_client_*` families only exist once the API client made a request (as with
//! client-go), so they are checked in the runs against the API server double. Response sizes
//! are observed, as client-go observes them, only for responses that state their size: the
//! lists of `--api-streaming-lists=false`, not the streamed watches of the default mode.

mod support;

use std::net::SocketAddr;

use ipvs_proxier_tests::apiserver::{FakeApiServer, Kind};
use serde_json::json;
use support::process::{CLUSTER, Daemon, http_get, listening_address, temp_file, wait_line};

/// Series (sample names, i.e. with `_bucket`/`_count` for histograms) queried by the
/// kubernetes-mixin proxy dashboard, and the labels its queries filter or group by.
/// (It also queries `up`, which Prometheus makes, and `go_goroutines`, a Go runtime metric that
/// a Rust program does not have.)
const MIXIN: &[(&str, &[&str])] = &[
    // "Rules Sync Rate": sum(rate(..._count[5m]))
    ("kubeproxy_sync_proxy_rules_duration_seconds_count", &[]),
    // "Rule Sync Latency 99th Quantile": histogram_quantile(0.99, rate(..._bucket[5m]))
    (
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        &["le"],
    ),
    // "Network Programming Rate"
    ("kubeproxy_network_programming_duration_seconds_count", &[]),
    // "Network Programming Latency 99th Quantile" and the `instance` template variable
    // (label_values(kubeproxy_network_programming_duration_seconds_bucket, instance)).
    (
        "kubeproxy_network_programming_duration_seconds_bucket",
        &["le"],
    ),
    // "Kube API Request Rate": code=~"2..", "3..", ...
    ("rest_client_requests_total", &["code"]),
    // "Post/Get Request Latency 99th Quantile": by (verb, url, le)
    (
        "rest_client_request_duration_seconds_bucket",
        &["verb", "url", "le"],
    ),
    // "Memory"
    ("process_resident_memory_bytes", &[]),
    // "CPU usage": rate(...[5m])
    ("process_cpu_seconds_total", &[]),
];

/// Families metricbeat's `kubernetes/proxy` metricset maps, and the labels it keys events by.
const METRICBEAT: &[(&str, &[&str])] = &[
    ("process_cpu_seconds_total", &[]),
    ("process_resident_memory_bytes", &[]),
    ("process_virtual_memory_bytes", &[]),
    ("process_open_fds", &[]),
    ("process_start_time_seconds", &[]),
    ("process_max_fds", &[]),
    ("rest_client_requests_total", &["code", "host", "method"]),
    (
        "rest_client_request_duration_seconds_bucket",
        &["verb", "host", "le"],
    ),
    (
        "rest_client_request_size_bytes_bucket",
        &["verb", "host", "le"],
    ),
    (
        "rest_client_response_size_bytes_bucket",
        &["verb", "host", "le"],
    ),
    (
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        &["le"],
    ),
    (
        "kubeproxy_network_programming_duration_seconds_bucket",
        &["le"],
    ),
];

/// Series netdata's `k8s_kubeproxy` collector reads. (It also reads
/// `http_request_duration_microseconds`, a Go HTTP-server summary Kubernetes removed long ago;
/// current kube-proxy does not export it either.)
const NETDATA: &[(&str, &[&str])] = &[
    ("kubeproxy_sync_proxy_rules_latency_microseconds_count", &[]),
    (
        "kubeproxy_sync_proxy_rules_latency_microseconds_bucket",
        &["le"],
    ),
    ("rest_client_requests_total", &["code", "method"]),
];

/// kube-proxy's own families that a healthy, quiet node exports from the start (not queried by
/// the three consumers, but alerts and `docs/metrics.md` use them).
const KUBE_PROXY: &[(&str, &[&str])] = &[
    (
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
        &[],
    ),
    (
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
        &[],
    ),
    ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", &[]),
    (
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        &[],
    ),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", &[]),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_total", &[]),
    ("kubeproxy_sync_proxy_rules_service_changes_pending", &[]),
    ("kubeproxy_sync_proxy_rules_service_changes_total", &[]),
    (
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        &["traffic_policy"],
    ),
];

fn is_rest_client(name: &str) -> bool {
    name.starts_with("rest_client_")
}

/// The label names of each sample line of `series` in `text`; empty when there is none.
fn samples<'a>(text: &'a str, series: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .collect()
}

/// Which `rest_client_*` series a run can show.
#[derive(Clone, Copy, PartialEq)]
enum RestClient {
    /// None: the file source.
    None,
    /// All: the API source with paginated lists, whose responses state their size.
    All,
    /// All but the response sizes: the API source with streaming lists (only watches).
    NoResponseSizes,
}

const RESPONSE_SIZES: &str = "rest_client_response_size_bytes_bucket";

fn check(text: &str, consumer: &str, list: &[(&str, &[&str])], rest_client: RestClient) {
    for (series, labels) in list {
        let skipped = match rest_client {
            RestClient::None => is_rest_client(series),
            RestClient::All => false,
            RestClient::NoResponseSizes => *series == RESPONSE_SIZES,
        };
        if skipped {
            continue;
        }
        let found = samples(text, series);
        assert!(
            !found.is_empty(),
            "{consumer} queries {series}; not exported:\n{text}"
        );
        for label in *labels {
            assert!(
                found
                    .iter()
                    .any(|l| l.contains(&format!("{{{label}=\""))
                        || l.contains(&format!(",{label}=\""))),
                "{consumer} uses label {label} of {series}: {found:?}"
            );
        }
    }
}

fn start(source_args: &[String]) -> (Daemon, SocketAddr) {
    let mut args: Vec<String> = [
        "--dry-run",
        "--watch",
        "--hostname-override=node-a",
        "--healthz-bind-address=127.0.0.1:0",
        "--metrics-bind-address=127.0.0.1:0",
        "--log-format=json",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    args.extend_from_slice(source_args);
    let daemon = Daemon::start(&args);
    let addr = listening_address(&daemon.stderr_lines, "metrics server listening");
    (daemon, addr)
}

fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn file_source_exports_what_the_dashboards_query_from_the_first_scrape() {
    let path = temp_file("file", CLUSTER);
    let (daemon, metrics) = start(&[format!("--source-file={}", path.display())]);
    wait_line(&daemon.stdout_lines, "first sync", |l| {
        l.starts_with("dry-run")
    });

    let text = scrape(metrics);
    check(
        &text,
        "kubernetes-mixin proxy dashboard",
        MIXIN,
        RestClient::None,
    );
    check(
        &text,
        "metricbeat kubernetes/proxy",
        METRICBEAT,
        RestClient::None,
    );
    check(&text, "netdata k8s_kubeproxy", NETDATA, RestClient::None);
    check(&text, "kube-proxy", KUBE_PROXY, RestClient::None);
    // Nothing reported a network programming latency yet (the file has no trigger times):
    // the histogram is there all the same, with zeros, so the dashboard finds the instance.
    assert!(
        text.contains("kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"}"),
        "{text}"
    );
    // The sync happened and was counted.
    let count = samples(&text, "kubeproxy_sync_proxy_rules_duration_seconds_count");
    assert!(
        count.iter().any(|l| !l.ends_with(" 0")),
        "first sync not counted: {count:?}"
    );
    drop(daemon);
    let _ = std::fs::remove_file(path);
}

/// Runs the daemon against a double holding one Service and its slice, with `extra_args`,
/// and scrapes it after its first sync.
async fn scrape_api_source(extra_args: &[&str]) -> (String, String) {
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "default"},
               "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "type": "ClusterIP",
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}}),
    );
    api.apply(
        Kind::EndpointSlice,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
               "metadata": {"name": "web-1", "namespace": "default",
                            "labels": {"kubernetes.io/service-name": "web"}},
               "endpoints": [{"addresses": ["10.244.0.5"], "conditions": {"ready": true}}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    );
    let mut args = vec![format!("--master={}", api.url())];
    args.extend(extra_args.iter().map(|a| (*a).to_owned()));
    let text = tokio::task::block_in_place(|| {
        let (daemon, metrics) = start(&args);
        wait_line(&daemon.stdout_lines, "first sync", |l| {
            l.starts_with("dry-run")
        });
        let text = scrape(metrics);
        drop(daemon);
        text
    });
    let host = api.url().trim_start_matches("http://").to_owned();
    (text, host)
}

fn check_api_source(text: &str, host: &str, rest_client: RestClient) {
    check(text, "kubernetes-mixin proxy dashboard", MIXIN, rest_client);
    check(text, "metricbeat kubernetes/proxy", METRICBEAT, rest_client);
    check(text, "netdata k8s_kubeproxy", NETDATA, rest_client);
    check(text, "kube-proxy", KUBE_PROXY, rest_client);
    assert!(
        text.contains(&format!(
            "rest_client_requests_total{{code=\"200\",host=\"{host}\",method=\"GET\"}}"
        )),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_source_with_paginated_lists_exports_every_rest_client_metric() {
    let (text, host) = scrape_api_source(&["--api-streaming-lists=false"]).await;
    check_api_source(&text, &host, RestClient::All);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_source_with_streaming_lists_exports_the_rest_client_metrics_but_response_sizes() {
    let (text, host) = scrape_api_source(&[]).await;
    check_api_source(&text, &host, RestClient::NoResponseSizes);
    // Only watches were made, and a watch's response is a stream without a size.
    assert!(samples(&text, RESPONSE_SIZES).is_empty(), "{text}");
}
