//! The metric catalogue: kube-proxy's names where users look for them, plus ipvs-proxier's
//! own, with their help texts and histogram buckets ([`METRICS`]), and small typed recorders
//! that write through the `metrics` facade. Installing an exporter (and serving `/metrics`) is
//! the application's choice: nothing here does it. For an application that picks
//! `metrics-exporter-prometheus`, the `prometheus` feature adds `prometheus_builder`: that
//! exporter's builder with the catalogue's histogram buckets.

use std::time::{Duration, SystemTime};

use Kind::{Counter, Gauge, Histogram};
use metrics::{KeyName, SharedString, Unit, counter, gauge, histogram};

const SYNC_PROXY_RULES_DURATION: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
const SYNC_FULL_PROXY_RULES_DURATION: &str = "kubeproxy_sync_full_proxy_rules_duration_seconds";
const SYNC_PARTIAL_PROXY_RULES_DURATION: &str =
    "kubeproxy_sync_partial_proxy_rules_duration_seconds";
const SYNC_PROXY_RULES_LAST_TIMESTAMP: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
const SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP: &str =
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";
const SYNC_PROXY_RULES_LATENCY_MICROSECONDS: &str =
    "kubeproxy_sync_proxy_rules_latency_microseconds";
const NETWORK_PROGRAMMING_DURATION: &str = "kubeproxy_network_programming_duration_seconds";
const ENDPOINT_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_pending";
const ENDPOINT_CHANGES_TOTAL: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_total";
const SERVICE_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_service_changes_pending";
const SERVICE_CHANGES_TOTAL: &str = "kubeproxy_sync_proxy_rules_service_changes_total";
const NO_LOCAL_ENDPOINTS_TOTAL: &str = "kubeproxy_sync_proxy_rules_no_local_endpoints_total";
const HEALTHZ_TOTAL: &str = "kubeproxy_proxy_healthz_total";
const LIVEZ_TOTAL: &str = "kubeproxy_proxy_livez_total";
const VIRTUAL_SERVERS: &str = "ipvs_proxier_virtual_servers";
const REAL_SERVERS: &str = "ipvs_proxier_real_servers";
const BOUND_ADDRESSES: &str = "ipvs_proxier_bound_addresses";
const SERVICE_CIDR_ROUTES: &str = "ipvs_proxier_service_cidr_routes";
const SERVICE_CIDRS_REFUSED: &str = "ipvs_proxier_service_cidrs_refused";
const NETLINK_OPERATIONS_TOTAL: &str = "ipvs_proxier_netlink_operations_total";
const GRACEFUL_DRAIN_QUEUE_LENGTH: &str = "ipvs_proxier_graceful_drain_queue_length";
const FULL_RESYNC_DRIFT_REPAIRED: &str = "ipvs_proxier_full_resync_drift_repaired";
const WATCH_ERRORS_TOTAL: &str = "ipvs_proxier_watch_errors_total";
const SOURCE_FILE_REJECTED_TOTAL: &str = "ipvs_proxier_source_file_rejected_total";
const IPVS_TABLE_READS_TOTAL: &str = "ipvs_proxier_ipvs_table_reads_total";
const IPVS_DUMP_RETRIES_TOTAL: &str = "ipvs_proxier_ipvs_dump_retries_total";
const REST_CLIENT_REQUESTS_TOTAL: &str = "rest_client_requests_total";
const REST_CLIENT_REQUEST_DURATION: &str = "rest_client_request_duration_seconds";
const REST_CLIENT_REQUEST_SIZE: &str = "rest_client_request_size_bytes";
const REST_CLIENT_RESPONSE_SIZE: &str = "rest_client_response_size_bytes";

/// What kind of series a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

/// One metric the daemon exports.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its Prometheus name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Its unit, when it has one.
    pub unit: Option<Unit>,
    /// Its `# HELP` text.
    pub help: &'static str,
    /// Whether it has no labels and is therefore exported (at zero) from the first scrape, as
    /// kube-proxy's are; labeled series appear with their first observation.
    pub unlabeled: bool,
    /// A histogram's bucket boundaries, as kube-proxy's (or client-go's) are; `None` for
    /// counters and gauges.
    pub buckets: Option<fn() -> Vec<f64>>,
}

impl Metric {
    /// The same metric with histogram buckets.
    const fn with_buckets(self, buckets: fn() -> Vec<f64>) -> Metric {
        Metric {
            buckets: Some(buckets),
            ..self
        }
    }
}

const fn metric(name: &'static str, kind: Kind, unit: Option<Unit>, help: &'static str) -> Metric {
    Metric {
        name,
        kind,
        unit,
        help,
        unlabeled: true,
        buckets: None,
    }
}

const fn labeled(name: &'static str, kind: Kind, unit: Option<Unit>, help: &'static str) -> Metric {
    Metric {
        name,
        kind,
        unit,
        help,
        unlabeled: false,
        buckets: None,
    }
}

const SECONDS: Option<Unit> = Some(Unit::Seconds);
const BYTES: Option<Unit> = Some(Unit::Bytes);

/// Every metric the daemon exports besides the process metrics (`process_*`): kube-proxy's
/// names, the API client's (client-go's `rest_client_*`) and ipvs-proxier's own
/// (`ipvs_proxier_*`). One row per metric.
#[rustfmt::skip]
pub const METRICS: &[Metric] = &[
    metric(SYNC_PROXY_RULES_DURATION, Histogram, SECONDS, "SyncProxyRules latency in seconds").with_buckets(sync_duration_buckets),
    metric(SYNC_FULL_PROXY_RULES_DURATION, Histogram, SECONDS, "SyncProxyRules latency in seconds for full resyncs").with_buckets(sync_duration_buckets),
    metric(SYNC_PARTIAL_PROXY_RULES_DURATION, Histogram, SECONDS, "SyncProxyRules latency in seconds for partial resyncs").with_buckets(sync_duration_buckets),
    metric(SYNC_PROXY_RULES_LAST_TIMESTAMP, Gauge, SECONDS, "The last time proxy rules were successfully synced"),
    // Much later than the last sync for long means syncing is stuck.
    metric(SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP, Gauge, SECONDS, "The last time a sync of proxy rules was queued"),
    // kube-proxy's histogram before 1.14, still read by netdata's `k8s_kubeproxy` collector.
    metric(SYNC_PROXY_RULES_LATENCY_MICROSECONDS, Histogram, Some(Unit::Microseconds), "(Deprecated) SyncProxyRules latency in microseconds").with_buckets(sync_duration_microsecond_buckets),
    // From an EndpointSlice's `endpoints.kubernetes.io/last-change-trigger-time` to here.
    metric(NETWORK_PROGRAMMING_DURATION, Histogram, SECONDS, "In Cluster Network Programming Latency in seconds").with_buckets(network_programming_buckets),
    metric(ENDPOINT_CHANGES_PENDING, Gauge, None, "Pending proxy rules Endpoint changes"),
    metric(ENDPOINT_CHANGES_TOTAL, Counter, None, "Cumulative proxy rules Endpoint changes"),
    metric(SERVICE_CHANGES_PENDING, Gauge, None, "Pending proxy rules Service changes"),
    metric(SERVICE_CHANGES_TOTAL, Counter, None, "Cumulative proxy rules Service changes"),
    // Labeled by traffic policy, but both series exist from the start (see `register`).
    labeled(NO_LOCAL_ENDPOINTS_TOTAL, Gauge, None, "Number of services with a Local traffic policy and no endpoints"),
    labeled(HEALTHZ_TOTAL, Counter, None, "Cumulative proxy healthz HTTP status"),
    labeled(LIVEZ_TOTAL, Counter, None, "Cumulative proxy livez HTTP status"),
    metric(VIRTUAL_SERVERS, Gauge, None, "IPVS virtual servers programmed by this proxier"),
    metric(REAL_SERVERS, Gauge, None, "IPVS real servers programmed by this proxier"),
    metric(BOUND_ADDRESSES, Gauge, None, "Addresses bound on the proxier's dummy link"),
    metric(SERVICE_CIDR_ROUTES, Gauge, None, "Service CIDRs taken whole with a local route through the proxier's dummy link"),
    // Which ones and why: the warning logged when each was refused.
    metric(SERVICE_CIDRS_REFUSED, Gauge, None, "Service CIDRs (configured or from ServiceCIDR objects) not routed because routing them would be unsafe"),
    labeled(NETLINK_OPERATIONS_TOTAL, Counter, None, "Netlink operations by operation and result"),
    metric(GRACEFUL_DRAIN_QUEUE_LENGTH, Gauge, None, "Real servers at weight 0 waiting for their connections to drain"),
    metric(FULL_RESYNC_DRIFT_REPAIRED, Gauge, None, "Differences from the desired state repaired by the last full resync"),
    labeled(WATCH_ERRORS_TOTAL, Counter, None, "API watch failures by kind"),
    metric(SOURCE_FILE_REJECTED_TOTAL, Counter, None, "Reads of the source file refused whole (the last good state stayed in force)"),
    // Labeled `verified`; both series exist from the start (see `register`).
    labeled(IPVS_TABLE_READS_TOTAL, Counter, None, "Whole-table IPVS reads, by whether their repeated service dumps agreed (best_effort: a single dump, at the first sync)"),
    metric(IPVS_DUMP_RETRIES_TOTAL, Counter, None, "IPVS service dumps repeated because IPVS changed in another network namespace meanwhile"),
    labeled(REST_CLIENT_REQUESTS_TOTAL, Counter, None, "Number of HTTP requests, partitioned by status code, method, and host."),
    labeled(REST_CLIENT_REQUEST_DURATION, Histogram, SECONDS, "Request latency in seconds. Broken down by verb, host and URL path.").with_buckets(rest_client_duration_buckets),
    labeled(REST_CLIENT_REQUEST_SIZE, Histogram, BYTES, "Request size in bytes. Broken down by verb and host.").with_buckets(rest_client_size_buckets),
    labeled(REST_CLIENT_RESPONSE_SIZE, Histogram, BYTES, "Response size in bytes. Broken down by verb and host.").with_buckets(rest_client_size_buckets),
];

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

/// Every histogram of [`METRICS`] with its bucket boundaries, for an exporter to configure.
pub fn histogram_buckets() -> impl Iterator<Item = (&'static str, Vec<f64>)> {
    METRICS
        .iter()
        .filter_map(|m| Some((m.name, (m.buckets?)())))
}

/// A `metrics-exporter-prometheus` builder with the bucket boundaries of every histogram of
/// [`METRICS`] (without them the exporter writes histograms as summaries); build or install
/// the recorder from it.
#[cfg(feature = "prometheus")]
pub fn prometheus_builder() -> metrics_exporter_prometheus::PrometheusBuilder {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let with_buckets =
        histogram_buckets().try_fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), &buckets)
        });
    match with_buckets {
        Ok(builder) => builder,
        Err(error) => {
            // Only reachable with an empty bucket list, which the catalogue has none of.
            tracing::warn!(%error, "histogram buckets refused; using summaries");
            PrometheusBuilder::new()
        }
    }
}

/// Describes every metric of [`METRICS`] and exports each unlabeled one at zero (histograms
/// with zero counts), so that each is there from the first scrape, as kube-proxy's are.
pub fn register() {
    metrics::with_recorder(|recorder| {
        for m in METRICS {
            let (name, help) = (
                KeyName::from_const_str(m.name),
                SharedString::const_str(m.help),
            );
            match m.kind {
                Counter => recorder.describe_counter(name, m.unit, help),
                Gauge => recorder.describe_gauge(name, m.unit, help),
                Histogram => recorder.describe_histogram(name, m.unit, help),
            }
        }
    });
    for m in METRICS.iter().filter(|m| m.unlabeled) {
        match m.kind {
            Counter => counter!(m.name).absolute(0),
            Gauge => gauge!(m.name).set(0.0),
            // Registering a histogram exports its buckets, sum and count at zero.
            Histogram => {
                let _ = histogram!(m.name);
            }
        }
    }
    for policy in [TrafficPolicy::Internal, TrafficPolicy::External] {
        set_no_local_endpoints(policy, 0);
    }
    set_table_reads(proxier_core::backend::TableReads::default());
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

/// Sets how many Service CIDRs are routed through the dummy link and how many are refused.
pub fn set_service_cidr_routes(routed: usize, refused: usize) {
    gauge!(SERVICE_CIDR_ROUTES).set(routed as f64);
    gauge!(SERVICE_CIDRS_REFUSED).set(refused as f64);
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
    let verified = reads.verifying_reads().saturating_sub(reads.unverified);
    counter!(IPVS_TABLE_READS_TOTAL, "verified" => "true").absolute(verified);
    counter!(IPVS_TABLE_READS_TOTAL, "verified" => "false").absolute(reads.unverified);
    counter!(IPVS_TABLE_READS_TOTAL, "verified" => "best_effort").absolute(reads.best_effort);
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
