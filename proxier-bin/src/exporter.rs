//! The Prometheus exporter: a `metrics-exporter-prometheus` recorder with the buckets of the
//! runtime's catalogue, the process metrics (`process_*`), and `/metrics` served on
//! `--metrics-bind-address`.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{Method, StatusCode};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use proxier_runtime::http_server::{BindError, Handler, HttpServer, not_found, response};
use proxier_runtime::metrics;

/// A recorder with the catalogue's histogram buckets (tests build their own local one).
pub fn build_recorder() -> PrometheusRecorder {
    let with_buckets = metrics::histogram_buckets().try_fold(
        PrometheusBuilder::new(),
        |builder, (name, buckets)| {
            builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), &buckets)
        },
    );
    match with_buckets {
        Ok(builder) => builder.build_recorder(),
        Err(error) => {
            // Only reachable with an empty bucket list, which the catalogue has none of.
            tracing::warn!(%error, "histogram buckets refused; using summaries");
            PrometheusBuilder::new().build_recorder()
        }
    }
}

/// Installs the global recorder and [`register`]s every metric.
pub fn install() -> Result<PrometheusHandle, ::metrics::SetRecorderError<PrometheusRecorder>> {
    let recorder = build_recorder();
    let handle = recorder.handle();
    ::metrics::set_global_recorder(recorder)?;
    register();
    Ok(handle)
}

/// Registers the catalogue's metrics and the process metrics with the current recorder, so
/// that each shows from the first scrape.
pub fn register() {
    metrics::register();
    process_collector().describe();
    process_collector().collect();
}

/// The process metrics (`process_*`), read from `/proc` on every scrape.
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
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
        process_collector().collect();
        response(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            handle.render(),
        )
    });
    HttpServer::bind("metrics", addr, handler).await
}
