//! Tests of `proxier_bin::exporter`.

use ipvs_proxier_tests::http_client::get as http_get;
use metrics_exporter_prometheus::PrometheusRecorder;
use proxier_bin::exporter::{register, serve};
use proxier_runtime::metrics::{prometheus_builder, set_data_plane_size};

/// A local recorder, as [`proxier_bin::exporter::install`] builds the global one.
fn build_recorder() -> PrometheusRecorder {
    prometheus_builder().build_recorder()
}

#[tokio::test]
async fn metrics_endpoint_serves_prometheus_text() {
    let recorder = build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        set_data_plane_size(proxier_core::engine::PlanSize {
            virtual_servers: 2,
            ..Default::default()
        });
    });
    let server = serve("127.0.0.1:0".parse().expect("addr"), handle)
        .await
        .expect("bind");
    let (status, headers, body) = http_get(server.local_addr(), "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        headers["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/plain")
    );
    assert!(body.contains("ipvs_proxier_virtual_servers 2"), "{body}");
    let (status, _, _) = http_get(server.local_addr(), "/other").await;
    assert_eq!(status, 404);
}

#[test]
fn process_metrics_are_exported_from_the_start() {
    let recorder = build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, register);
    let text = handle.render();
    for expected in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count 0",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
        "process_virtual_memory_bytes ",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}
