//! The Prometheus exporter: a `metrics-exporter-prometheus` recorder with the buckets of the
//! runtime's catalogue (`proxier_runtime::metrics::prometheus_builder`), the process metrics
//! (`process_*`), the per-Service traffic with `--ipvs-traffic-metrics`, and `/metrics` served
//! on `--metrics-bind-address`.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{Method, StatusCode};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};
use proxier_runtime::http_server::{
    AsyncHandler, BindError, HttpServer, ResponseFuture, not_found, response,
};
use proxier_runtime::metrics;
use proxier_runtime::traffic::TrafficMetrics;

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
    serve_with_traffic(addr, handle, None).await
}

/// [`serve`], reading the per-Service IPVS traffic at each scrape with `traffic`.
pub async fn serve_with_traffic(
    addr: SocketAddr,
    handle: PrometheusHandle,
    traffic: Option<TrafficMetrics>,
) -> Result<HttpServer, BindError> {
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let handler: AsyncHandler = Arc::new(move |method, path| {
        if path != "/metrics" {
            return ready(not_found());
        }
        if method != Method::GET && method != Method::HEAD {
            return ready(response(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "method not allowed\n",
            ));
        }
        let (handle, traffic) = (handle.clone(), traffic.clone());
        Box::pin(async move {
            let traffic = match &traffic {
                Some(traffic) => traffic.collect().await,
                None => String::new(),
            };
            process_collector().collect();
            let mut text = handle.render();
            text.push_str(&traffic);
            response(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            )
        })
    });
    HttpServer::bind_async("metrics", addr, handler).await
}

fn ready(answer: http::Response<proxier_runtime::http_server::Body>) -> ResponseFuture {
    Box::pin(std::future::ready(answer))
}
