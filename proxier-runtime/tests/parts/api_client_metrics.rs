//! The API client's `rest_client_*` metrics, through the client `source::kube::client` builds:
//! against the API server double on 127.0.0.1 (answered requests by status code) and against
//! a loopback port nobody listens on (no answer: code `<error>`, as client-go reports it).

use std::sync::OnceLock;

use crate::metrics::build_recorder;
use ipvs_proxier_tests::apiserver::{FakeApiServer, Kind};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, ListParams};
use metrics_exporter_prometheus::PrometheusHandle;
use proxier_runtime::source::kube::client;
use serde_json::json;

/// The process-wide recorder: the client's futures run on several tasks, so a thread-local
/// recorder would miss some of them. Each test labels its series with its own host.
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("first recorder of this test binary");
        handle
    })
}

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

#[tokio::test]
async fn answered_requests_are_counted_by_code_method_and_host() {
    let handle = recorder();
    let api = FakeApiServer::start().await;
    api.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "default"},
               "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "type": "ClusterIP",
                        "ports": [{"port": 80, "protocol": "TCP"}]}}),
    );
    let url = api.url();
    let host = url.trim_start_matches("http://").to_owned();
    let client = client(None, Some(&url)).await.expect("client");

    let services: Api<Service> = Api::all(client.clone());
    let listed = services
        .list(&ListParams::default().labels("!service.kubernetes.io/headless"))
        .await
        .expect("list services");
    assert_eq!(listed.items.len(), 1);
    services
        .list(&ListParams::default())
        .await
        .expect("list services again");
    // The double serves no ConfigMaps: a 404.
    let config_maps: Api<ConfigMap> = Api::all(client);
    assert!(config_maps.list(&ListParams::default()).await.is_err());

    let text = handle.render();
    let ok = format!("rest_client_requests_total{{code=\"200\",host=\"{host}\",method=\"GET\"}}");
    assert_eq!(sample(&text, &ok), Some(2.0), "{ok} in:\n{text}");
    let not_found =
        format!("rest_client_requests_total{{code=\"404\",host=\"{host}\",method=\"GET\"}}");
    assert_eq!(
        sample(&text, &not_found),
        Some(1.0),
        "{not_found} in:\n{text}"
    );
    // Latency by verb and path: the query string (label selector) is not part of the label.
    let count = format!(
        "rest_client_request_duration_seconds_count{{verb=\"GET\",host=\"{host}\",url=\"/api/v1/services\"}}"
    );
    assert_eq!(sample(&text, &count), Some(2.0), "{count} in:\n{text}");
    assert!(
        text.contains(&format!(
            "rest_client_request_duration_seconds_bucket{{verb=\"GET\",host=\"{host}\",url=\"/api/v1/services\",le=\"60\"}} 2"
        )),
        "client-go's last bucket (60 s) in:\n{text}"
    );
    assert!(!text.contains("labelSelector"), "{text}");
}

#[tokio::test]
async fn unanswered_requests_are_counted_as_error() {
    let handle = recorder();
    // Port 1 on loopback: nothing listens there, the connection is refused at once.
    let url = "http://127.0.0.1:1";
    let client = client(None, Some(url)).await.expect("client");
    let services: Api<Service> = Api::all(client);
    assert!(services.list(&ListParams::default()).await.is_err());

    let text = handle.render();
    let error = "rest_client_requests_total{code=\"<error>\",host=\"127.0.0.1:1\",method=\"GET\"}";
    assert!(
        sample(&text, error).is_some_and(|n| n >= 1.0),
        "{error} in:\n{text}"
    );
    let count = "rest_client_request_duration_seconds_count{verb=\"GET\",host=\"127.0.0.1:1\",url=\"/api/v1/services\"}";
    assert!(
        sample(&text, count).is_some_and(|n| n >= 1.0),
        "{count} in:\n{text}"
    );
}
