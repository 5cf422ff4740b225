//! Prometheus metrics: kube-proxy's names where users look for them, plus ipvs-proxier's own.
//! Recorded through the `metrics` facade with small typed functions; rendered by
//! `metrics-exporter-prometheus` and served on `--metrics-bind-address` at `/metrics`.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use http::{Method, StatusCode};
use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::http_server::{BindError, Handler, HttpServer, not_found, response};

/// Duration of one sync of the proxy rules.
pub const SYNC_PROXY_RULES_DURATION: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
/// Duration of full syncs.
pub const SYNC_FULL_PROXY_RULES_DURATION: &str = "kubeproxy_sync_full_proxy_rules_duration_seconds";
/// Duration of incremental syncs.
pub const SYNC_PARTIAL_PROXY_RULES_DURATION: &str =
    "kubeproxy_sync_partial_proxy_rules_duration_seconds";
/// Wall-clock time of the last successful sync.
pub const SYNC_PROXY_RULES_LAST_TIMESTAMP: &str =
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
/// Wall-clock time a sync was last queued (a change arrived). Much later than
/// [`SYNC_PROXY_RULES_LAST_TIMESTAMP`] for long means syncing is stuck.
pub const SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP: &str =
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";
/// Sync durations in microseconds: kube-proxy's histogram before 1.14 (removed there since),
/// still read by netdata's `k8s_kubeproxy` collector.
pub const SYNC_PROXY_RULES_LATENCY_MICROSECONDS: &str =
    "kubeproxy_sync_proxy_rules_latency_microseconds";
/// Time from an endpoint change in the cluster to its programming here.
pub const NETWORK_PROGRAMMING_DURATION: &str = "kubeproxy_network_programming_duration_seconds";
/// EndpointSlice changes not yet synced.
pub const ENDPOINT_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_pending";
/// EndpointSlice changes seen.
pub const ENDPOINT_CHANGES_TOTAL: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_total";
/// Service changes not yet synced.
pub const SERVICE_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_service_changes_pending";
/// Service changes seen.
pub const SERVICE_CHANGES_TOTAL: &str = "kubeproxy_sync_proxy_rules_service_changes_total";
/// Services with a Local traffic policy and no local endpoint.
pub const NO_LOCAL_ENDPOINTS_TOTAL: &str = "kubeproxy_sync_proxy_rules_no_local_endpoints_total";
/// /healthz answers by status code.
pub const HEALTHZ_TOTAL: &str = "kubeproxy_proxy_healthz_total";
/// /livez answers by status code.
pub const LIVEZ_TOTAL: &str = "kubeproxy_proxy_livez_total";
/// IPVS virtual servers programmed.
pub const VIRTUAL_SERVERS: &str = "ipvs_proxier_virtual_servers";
/// IPVS real servers programmed.
pub const REAL_SERVERS: &str = "ipvs_proxier_real_servers";
/// Addresses bound on the dummy link.
pub const BOUND_ADDRESSES: &str = "ipvs_proxier_bound_addresses";
/// Netlink operations by operation and result.
pub const NETLINK_OPERATIONS_TOTAL: &str = "ipvs_proxier_netlink_operations_total";
/// Real servers draining (weight 0) before removal.
pub const GRACEFUL_DRAIN_QUEUE_LENGTH: &str = "ipvs_proxier_graceful_drain_queue_length";
/// Drift found and repaired by the last full resync.
pub const FULL_RESYNC_DRIFT_REPAIRED: &str = "ipvs_proxier_full_resync_drift_repaired";
/// Watch failures by kind.
pub const WATCH_ERRORS_TOTAL: &str = "ipvs_proxier_watch_errors_total";
/// Reads of the source file refused whole (malformed document, unreadable file).
pub const SOURCE_FILE_REJECTED_TOTAL: &str = "ipvs_proxier_source_file_rejected_total";
/// Whole-table IPVS reads, by whether their dumps agreed (`verified`: true / false).
pub const IPVS_TABLE_READS_TOTAL: &str = "ipvs_proxier_ipvs_table_reads_total";
/// IPVS service dumps beyond an undisturbed read's three: retries forced by churn in other
/// network namespaces.
pub const IPVS_DUMP_RETRIES_TOTAL: &str = "ipvs_proxier_ipvs_dump_retries_total";

/// API requests by status code (`<error>` when no answer came), method and host (client-go's
/// `rest_client_requests_total`).
pub const REST_CLIENT_REQUESTS_TOTAL: &str = "rest_client_requests_total";
/// API request latency (until the response headers) by verb, host and URL path.
pub const REST_CLIENT_REQUEST_DURATION: &str = "rest_client_request_duration_seconds";
/// API request body sizes by verb and host.
pub const REST_CLIENT_REQUEST_SIZE: &str = "rest_client_request_size_bytes";
/// API response body sizes (when the response states them) by verb and host.
pub const REST_CLIENT_RESPONSE_SIZE: &str = "rest_client_response_size_bytes";

/// kube-proxy's buckets for sync durations: 1 ms doubling 15 times (~16 s).
fn sync_duration_buckets() -> Vec<f64> {
    (0..15).map(|i| 0.001 * f64::powi(2.0, i)).collect()
}

/// The same boundaries in microseconds (the deprecated histogram).
fn sync_duration_microsecond_buckets() -> Vec<f64> {
    (0..15).map(|i| 1000.0 * f64::powi(2.0, i)).collect()
}

/// kube-proxy's buckets for network programming latency: 0, 0.25 s, 0.5 s, every second to
/// 59 s, every 5 s to 115 s, every 30 s to 5 min.
pub fn network_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.0, 0.25, 0.5];
    buckets.extend((1..=59).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    buckets
}

/// client-go's (component-base) buckets for `rest_client_request_duration_seconds`.
fn rest_client_duration_buckets() -> Vec<f64> {
    vec![
        0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
    ]
}

/// client-go's buckets for request and response sizes: 64 bytes times 4, 8 times (~4 MiB).
fn rest_client_size_buckets() -> Vec<f64> {
    (0..8).map(|i| 64.0 * f64::powi(4.0, i)).collect()
}

/// The recorder with this crate's histogram buckets (tests build their own local one).
pub fn build_recorder() -> PrometheusRecorder {
    let with_buckets = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("proxy_rules_duration_seconds".to_owned()),
            &sync_duration_buckets(),
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(SYNC_PROXY_RULES_LATENCY_MICROSECONDS.to_owned()),
                &sync_duration_microsecond_buckets(),
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(NETWORK_PROGRAMMING_DURATION.to_owned()),
                &network_programming_buckets(),
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(REST_CLIENT_REQUEST_DURATION.to_owned()),
                &rest_client_duration_buckets(),
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(REST_CLIENT_REQUEST_SIZE.to_owned()),
                &rest_client_size_buckets(),
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(REST_CLIENT_RESPONSE_SIZE.to_owned()),
                &rest_client_size_buckets(),
            )
        });
    match with_buckets {
        Ok(b) => b.build_recorder(),
        Err(error) => {
            // Only reachable with an empty bucket list, which the lists above are not.
            tracing::warn!(%error, "histogram buckets refused; using summaries");
            PrometheusBuilder::new().build_recorder()
        }
    }
}

/// Installs the global recorder and registers every metric (so each shows from the start).
pub fn install() -> Result<PrometheusHandle, metrics::SetRecorderError<PrometheusRecorder>> {
    let recorder = build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    register();
    Ok(handle)
}

/// The process metrics (`process_*`), read from `/proc` on every scrape.
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// Refreshes the process metrics (CPU, memory, file descriptors, start time).
pub fn collect_process_metrics() {
    process_collector().collect();
}

/// Describes every metric, sets unlabeled gauges and counters to 0 and creates the unlabeled
/// histograms, so that each is exported (with zero counts) from the first scrape, as kube-proxy's
/// are.
pub fn register() {
    describe_histogram!(
        SYNC_PROXY_RULES_DURATION,
        Unit::Seconds,
        "SyncProxyRules latency in seconds"
    );
    describe_histogram!(
        SYNC_FULL_PROXY_RULES_DURATION,
        Unit::Seconds,
        "SyncProxyRules latency in seconds for full resyncs"
    );
    describe_histogram!(
        SYNC_PARTIAL_PROXY_RULES_DURATION,
        Unit::Seconds,
        "SyncProxyRules latency in seconds for partial resyncs"
    );
    describe_gauge!(
        SYNC_PROXY_RULES_LAST_TIMESTAMP,
        Unit::Seconds,
        "The last time proxy rules were successfully synced"
    );
    describe_gauge!(
        SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP,
        Unit::Seconds,
        "The last time a sync of proxy rules was queued"
    );
    describe_histogram!(
        SYNC_PROXY_RULES_LATENCY_MICROSECONDS,
        Unit::Microseconds,
        "(Deprecated) SyncProxyRules latency in microseconds"
    );
    describe_histogram!(
        NETWORK_PROGRAMMING_DURATION,
        Unit::Seconds,
        "In Cluster Network Programming Latency in seconds"
    );
    describe_gauge!(
        ENDPOINT_CHANGES_PENDING,
        "Pending proxy rules Endpoint changes"
    );
    describe_counter!(
        ENDPOINT_CHANGES_TOTAL,
        "Cumulative proxy rules Endpoint changes"
    );
    describe_gauge!(
        SERVICE_CHANGES_PENDING,
        "Pending proxy rules Service changes"
    );
    describe_counter!(
        SERVICE_CHANGES_TOTAL,
        "Cumulative proxy rules Service changes"
    );
    describe_gauge!(
        NO_LOCAL_ENDPOINTS_TOTAL,
        "Number of services with a Local traffic policy and no endpoints"
    );
    describe_counter!(HEALTHZ_TOTAL, "Cumulative proxy healthz HTTP status");
    describe_counter!(LIVEZ_TOTAL, "Cumulative proxy livez HTTP status");
    describe_gauge!(
        VIRTUAL_SERVERS,
        "IPVS virtual servers programmed by this proxier"
    );
    describe_gauge!(REAL_SERVERS, "IPVS real servers programmed by this proxier");
    describe_gauge!(
        BOUND_ADDRESSES,
        "Addresses bound on the proxier's dummy link"
    );
    describe_counter!(
        NETLINK_OPERATIONS_TOTAL,
        "Netlink operations by operation and result"
    );
    describe_gauge!(
        GRACEFUL_DRAIN_QUEUE_LENGTH,
        "Real servers at weight 0 waiting for their connections to drain"
    );
    describe_gauge!(
        FULL_RESYNC_DRIFT_REPAIRED,
        "Differences from the desired state repaired by the last full resync"
    );
    describe_counter!(WATCH_ERRORS_TOTAL, "API watch failures by kind");
    describe_counter!(
        SOURCE_FILE_REJECTED_TOTAL,
        "Reads of the source file refused whole (the last good state stayed in force)"
    );
    counter!(SOURCE_FILE_REJECTED_TOTAL).absolute(0);
    describe_counter!(
        IPVS_TABLE_READS_TOTAL,
        "Whole-table IPVS reads, by whether their repeated service dumps agreed"
    );
    describe_counter!(
        IPVS_DUMP_RETRIES_TOTAL,
        "IPVS service dumps repeated because IPVS changed in another network namespace meanwhile"
    );
    set_table_reads(proxier_core::backend::TableReads::default());
    describe_counter!(
        REST_CLIENT_REQUESTS_TOTAL,
        "Number of HTTP requests, partitioned by status code, method, and host."
    );
    describe_histogram!(
        REST_CLIENT_REQUEST_DURATION,
        Unit::Seconds,
        "Request latency in seconds. Broken down by verb, host and URL path."
    );
    describe_histogram!(
        REST_CLIENT_REQUEST_SIZE,
        Unit::Bytes,
        "Request size in bytes. Broken down by verb and host."
    );
    describe_histogram!(
        REST_CLIENT_RESPONSE_SIZE,
        Unit::Bytes,
        "Response size in bytes. Broken down by verb and host."
    );
    process_collector().describe();
    collect_process_metrics();

    // Unlabeled histograms exist from the start: registering one makes the exporter render its
    // buckets, sum and count with zeros until the first observation.
    for name in [
        SYNC_PROXY_RULES_DURATION,
        SYNC_FULL_PROXY_RULES_DURATION,
        SYNC_PARTIAL_PROXY_RULES_DURATION,
        SYNC_PROXY_RULES_LATENCY_MICROSECONDS,
        NETWORK_PROGRAMMING_DURATION,
    ] {
        let _ = histogram!(name);
    }
    gauge!(SYNC_PROXY_RULES_LAST_TIMESTAMP).set(0.0);
    gauge!(SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP).set(0.0);

    gauge!(ENDPOINT_CHANGES_PENDING).set(0.0);
    counter!(ENDPOINT_CHANGES_TOTAL).absolute(0);
    gauge!(SERVICE_CHANGES_PENDING).set(0.0);
    counter!(SERVICE_CHANGES_TOTAL).absolute(0);
    for policy in [TrafficPolicy::Internal, TrafficPolicy::External] {
        gauge!(NO_LOCAL_ENDPOINTS_TOTAL, "traffic_policy" => policy.label()).set(0.0);
    }
    gauge!(VIRTUAL_SERVERS).set(0.0);
    gauge!(REAL_SERVERS).set(0.0);
    gauge!(BOUND_ADDRESSES).set(0.0);
    gauge!(GRACEFUL_DRAIN_QUEUE_LENGTH).set(0.0);
    gauge!(FULL_RESYNC_DRIFT_REPAIRED).set(0.0);
}

/// Whether a sync re-read everything or only applied changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncScope {
    /// Full resync (reads the kernel, repairs drift).
    Full,
    /// Only the changed services.
    Partial,
}

/// Records a finished sync: its duration and, when it succeeded, its wall-clock time.
pub fn record_sync(scope: SyncScope, took: Duration, succeeded: bool, finished_at: SystemTime) {
    let secs = took.as_secs_f64();
    histogram!(SYNC_PROXY_RULES_DURATION).record(secs);
    histogram!(SYNC_PROXY_RULES_LATENCY_MICROSECONDS).record(secs * 1e6);
    match scope {
        SyncScope::Full => histogram!(SYNC_FULL_PROXY_RULES_DURATION).record(secs),
        SyncScope::Partial => histogram!(SYNC_PARTIAL_PROXY_RULES_DURATION).record(secs),
    }
    if succeeded {
        let ts = unix_seconds(finished_at);
        gauge!(SYNC_PROXY_RULES_LAST_TIMESTAMP).set(ts);
    }
}

fn unix_seconds(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Records that a sync was queued (a change arrived) at `at`.
pub fn record_sync_queued(at: SystemTime) {
    gauge!(SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP).set(unix_seconds(at));
}

/// One request the API client made, as the `rest_client_*` metrics see it.
#[derive(Debug, Clone)]
pub struct ApiRequest<'a> {
    /// The HTTP method (client-go's `method` and `verb`), e.g. `GET`.
    pub method: &'a str,
    /// The API server's `host:port`.
    pub host: &'a str,
    /// The URL path, without the query string.
    pub path: &'a str,
    /// The response status, or `None` when no response came (connection refused, timeout, ...).
    pub status: Option<u16>,
    /// Time until the response headers (or the failure).
    pub took: Duration,
    /// Request body size, when known.
    pub request_size: Option<u64>,
    /// Response body size, when the response states it.
    pub response_size: Option<u64>,
}

/// Records one API request in the `rest_client_*` metrics. A request without an answer counts
/// with code `<error>`, as client-go does.
pub fn record_api_request(request: &ApiRequest<'_>) {
    let code = request
        .status
        .map_or_else(|| "<error>".to_owned(), |s| s.to_string());
    let method = request.method.to_owned();
    let host = request.host.to_owned();
    counter!(
        REST_CLIENT_REQUESTS_TOTAL,
        "code" => code,
        "host" => host.clone(),
        "method" => method.clone()
    )
    .increment(1);
    histogram!(
        REST_CLIENT_REQUEST_DURATION,
        "verb" => method.clone(),
        "host" => host.clone(),
        "url" => request.path.to_owned()
    )
    .record(request.took.as_secs_f64());
    if let Some(size) = request.request_size {
        histogram!(REST_CLIENT_REQUEST_SIZE, "verb" => method.clone(), "host" => host.clone())
            .record(size as f64);
    }
    if let Some(size) = request.response_size {
        histogram!(REST_CLIENT_RESPONSE_SIZE, "verb" => method, "host" => host).record(size as f64);
    }
}

/// Records the latency from a change in the cluster (e.g. an EndpointSlice's
/// `endpoints.kubernetes.io/last-change-trigger-time`) to its programming.
pub fn record_network_programming(latency: Duration) {
    histogram!(NETWORK_PROGRAMMING_DURATION).record(latency.as_secs_f64());
}

/// Records a Service change (adds to the total) and the number now pending.
pub fn record_service_change(pending: usize) {
    counter!(SERVICE_CHANGES_TOTAL).increment(1);
    gauge!(SERVICE_CHANGES_PENDING).set(pending as f64);
}

/// Records an EndpointSlice change (adds to the total) and the number now pending.
pub fn record_endpoint_change(pending: usize) {
    counter!(ENDPOINT_CHANGES_TOTAL).increment(1);
    gauge!(ENDPOINT_CHANGES_PENDING).set(pending as f64);
}

/// Sets the pending change gauges (e.g. to 0 after a sync).
pub fn set_pending_changes(services: usize, endpoints: usize) {
    gauge!(SERVICE_CHANGES_PENDING).set(services as f64);
    gauge!(ENDPOINT_CHANGES_PENDING).set(endpoints as f64);
}

/// Which traffic policy a "no local endpoints" count is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// internalTrafficPolicy: Local.
    Internal,
    /// externalTrafficPolicy: Local.
    External,
}

impl TrafficPolicy {
    fn label(self) -> &'static str {
        match self {
            TrafficPolicy::Internal => "internal",
            TrafficPolicy::External => "external",
        }
    }
}

/// Sets how many Local-policy services have no local endpoint.
pub fn set_no_local_endpoints(policy: TrafficPolicy, services: usize) {
    gauge!(NO_LOCAL_ENDPOINTS_TOTAL, "traffic_policy" => policy.label()).set(services as f64);
}

/// Sets the data plane size gauges.
pub fn set_data_plane_size(size: proxier_core::engine::PlanSize) {
    gauge!(VIRTUAL_SERVERS).set(size.virtual_servers as f64);
    gauge!(REAL_SERVERS).set(size.real_servers as f64);
    gauge!(BOUND_ADDRESSES).set(size.bound_addresses as f64);
    gauge!(GRACEFUL_DRAIN_QUEUE_LENGTH).set(size.draining as f64);
}

/// Outcome of a netlink operation, as a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpResult {
    /// It worked.
    Success,
    /// It failed.
    Error,
}

/// Counts netlink operations, e.g. `("add_service", Success, 12)`.
pub fn record_netlink_operations(op: &'static str, result: OpResult, count: u64) {
    let result = match result {
        OpResult::Success => "success",
        OpResult::Error => "error",
    };
    counter!(NETLINK_OPERATIONS_TOTAL, "op" => op, "result" => result).increment(count);
}

/// Sets how much drift the last full resync repaired.
pub fn set_full_resync_drift_repaired(differences: usize) {
    gauge!(FULL_RESYNC_DRIFT_REPAIRED).set(differences as f64);
}

/// Exports the IPVS backend's table-read counters (totals since start).
pub fn set_table_reads(reads: proxier_core::backend::TableReads) {
    let verified = reads.reads.saturating_sub(reads.unverified);
    counter!(IPVS_TABLE_READS_TOTAL, "verified" => "true").absolute(verified);
    counter!(IPVS_TABLE_READS_TOTAL, "verified" => "false").absolute(reads.unverified);
    counter!(IPVS_DUMP_RETRIES_TOTAL).absolute(reads.retries);
}

/// Counts a watch failure of one kind of object.
pub fn record_watch_error(kind: &'static str) {
    counter!(WATCH_ERRORS_TOTAL, "kind" => kind).increment(1);
}

/// Counts a read of the source file that was refused whole.
pub fn record_rejected_source_file() {
    counter!(SOURCE_FILE_REJECTED_TOTAL).increment(1);
}

/// Counts a /healthz or /livez answer.
pub fn record_health_answer(livez: bool, status: u16) {
    let name = if livez { LIVEZ_TOTAL } else { HEALTHZ_TOTAL };
    counter!(name, "code" => status.to_string()).increment(1);
}

/// Serves `/metrics` from `handle` on `addr`, refreshing the process metrics on each scrape.
/// Also runs the recorder's upkeep periodically.
pub async fn serve(addr: SocketAddr, handle: PrometheusHandle) -> Result<HttpServer, BindError> {
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let handler: Handler = Arc::new(move |method, path| {
        if path != "/metrics" {
            return not_found();
        }
        if method != Method::GET && method != Method::HEAD {
            return response(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "method not allowed\n",
            );
        }
        collect_process_metrics();
        response(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            handle.render(),
        )
    });
    HttpServer::bind("metrics", addr, handler).await
}
