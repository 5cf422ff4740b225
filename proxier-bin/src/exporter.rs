//! The Prometheus exporter: a `metrics-exporter-prometheus` recorder with the buckets of the
//! runtime's catalogue (`proxier_runtime::metrics::prometheus_builder`), the process metrics
//! (`process_*`), and `/metrics` served on `--metrics-bind-address`.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{Method, StatusCode};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};
use proxier_runtime::http_server::{BindError, Handler, HttpServer, not_found, response};
use proxier_runtime::metrics;

/// Installs the global recorder, with the catalogue's histogram buckets, and [`register`]s
/// every metric.
pub fn install() -> Result<PrometheusHandle, ::metrics::SetRecorderError<PrometheusRecorder>> {
    let recorder = metrics::prometheus_builder().build_recorder();
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
