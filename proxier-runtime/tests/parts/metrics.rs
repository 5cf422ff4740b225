//! Tests of `proxier_runtime::metrics`, rendered by a local Prometheus recorder.

use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use std::time::{Duration, SystemTime};

use proxier_runtime::metrics::*;

/// A recorder with the catalogue's buckets, as an exporter would configure it.
pub fn build_recorder() -> PrometheusRecorder {
    histogram_buckets()
        .try_fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), &buckets)
        })
        .expect("the catalogue has no empty bucket list")
        .build_recorder()
}

fn render_with(f: impl FnOnce()) -> (String, PrometheusHandle) {
    let recorder = build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, f);
    (handle.render(), handle)
}

#[test]
fn registered_metrics_appear_with_kube_proxy_names() {
    let (text, _) = render_with(register);
    for name in [
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        "ipvs_proxier_virtual_servers",
        "ipvs_proxier_real_servers",
        "ipvs_proxier_bound_addresses",
        "ipvs_proxier_service_cidr_routes",
        "ipvs_proxier_service_cidrs_refused",
        "ipvs_proxier_graceful_drain_queue_length",
        "ipvs_proxier_full_resync_drift_repaired",
    ] {
        assert!(
            text.contains(&format!("\n{name}"))
                || text.starts_with(name)
                || text.contains(&format!("{name}{{")),
            "{name} missing in:\n{text}"
        );
    }
    assert!(
        text.contains(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"} 0"
        ),
        "{text}"
    );
}

#[test]
fn histograms_are_exported_before_any_observation() {
    let (text, _) = render_with(register);
    for expected in [
        "# TYPE kubeproxy_network_programming_duration_seconds histogram",
        "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 0",
        "kubeproxy_network_programming_duration_seconds_bucket{le=\"+Inf\"} 0",
        "kubeproxy_network_programming_duration_seconds_sum 0",
        "kubeproxy_network_programming_duration_seconds_count 0",
        "kubeproxy_sync_proxy_rules_duration_seconds_count 0",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count 0",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count 0",
        "kubeproxy_sync_proxy_rules_latency_microseconds_bucket{le=\"1000\"} 0",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds 0",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds 0",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[cfg(feature = "prometheus")]
#[test]
fn the_prometheus_builder_has_the_catalogue_s_buckets() {
    let recorder = prometheus_builder().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, register);
    let text = handle.render();
    assert!(
        text.contains("kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 0"),
        "{text}"
    );
    let by_hand = render_with(register).0;
    let lines = |text: &str| {
        text.lines()
            .map(str::to_owned)
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(
        lines(&text),
        lines(&by_hand),
        "as an exporter configured by hand"
    );
}

#[test]
fn network_programming_buckets_are_kube_proxy_s() {
    let b = network_programming_buckets();
    assert_eq!(b.len(), 3 + 59 + 12 + 7);
    assert_eq!(&b[..4], &[0.0, 0.25, 0.5, 1.0]);
    assert!(b.contains(&59.0) && b.contains(&115.0) && b.contains(&150.0));
    assert_eq!(b.last(), Some(&300.0));
    assert!(b.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn queued_timestamp_and_api_requests_are_recorded() {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_100);
    let (text, _) = render_with(|| {
        record_sync_queued(t);
        record_api_request(&ApiRequest {
            method: "GET",
            host: "10.0.0.1:6443",
            path: "/api/v1/services",
            status: Some(200),
            took: Duration::from_millis(30),
            request_size: Some(0),
            response_size: Some(2000),
        });
        record_api_request(&ApiRequest {
            method: "GET",
            host: "10.0.0.1:6443",
            path: "/api/v1/services",
            status: None,
            took: Duration::from_millis(1),
            request_size: None,
            response_size: None,
        });
    });
    for expected in [
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds 1700000100",
        "rest_client_requests_total{code=\"200\",host=\"10.0.0.1:6443\",method=\"GET\"} 1",
        "rest_client_requests_total{code=\"<error>\",host=\"10.0.0.1:6443\",method=\"GET\"} 1",
        "rest_client_request_duration_seconds_bucket{verb=\"GET\",host=\"10.0.0.1:6443\",url=\"/api/v1/services\",le=\"0.005\"} 1",
        "rest_client_request_duration_seconds_bucket{verb=\"GET\",host=\"10.0.0.1:6443\",url=\"/api/v1/services\",le=\"0.1\"} 2",
        "rest_client_request_size_bytes_bucket{verb=\"GET\",host=\"10.0.0.1:6443\",le=\"64\"} 1",
        "rest_client_response_size_bytes_bucket{verb=\"GET\",host=\"10.0.0.1:6443\",le=\"4096\"} 1",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn sync_histogram_uses_kube_proxy_buckets() {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let (text, _) = render_with(|| {
        record_sync(SyncScope::Full, Duration::from_millis(3), true, t);
        record_sync(SyncScope::Partial, Duration::from_millis(20), false, t);
    });
    assert!(
        text.contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.032\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds_count 2"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_full_proxy_rules_duration_seconds_count 1"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds 1700000000"),
        "{text}"
    );
}

#[test]
fn typed_recorders_write_the_right_series() {
    let (text, _) = render_with(|| {
        record_service_change(3);
        record_service_change(4);
        record_endpoint_change(1);
        set_pending_changes(0, 0);
        record_netlink_operations("add_service", OpResult::Success, 5);
        record_netlink_operations("add_service", OpResult::Error, 1);
        set_data_plane_size(proxier_core::engine::PlanSize {
            virtual_servers: 7,
            real_servers: 21,
            bound_addresses: 4,
            draining: 2,
        });
        set_full_resync_drift_repaired(3);
        set_no_local_endpoints(TrafficPolicy::Internal, 2);
        record_network_programming(Duration::from_millis(700));
        set_table_reads(proxier_core::backend::TableReads {
            reads: 5,
            unverified: 1,
            dumps: 20,
            retries: 7,
            best_effort: 1,
        });
    });
    for expected in [
        "ipvs_proxier_ipvs_table_reads_total{verified=\"true\"} 3",
        "ipvs_proxier_ipvs_table_reads_total{verified=\"false\"} 1",
        "ipvs_proxier_ipvs_table_reads_total{verified=\"best_effort\"} 1",
        "ipvs_proxier_ipvs_dump_retries_total 7",
        "kubeproxy_sync_proxy_rules_service_changes_total 2",
        "kubeproxy_sync_proxy_rules_service_changes_pending 0",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
        "ipvs_proxier_netlink_operations_total{op=\"add_service\",result=\"success\"} 5",
        "ipvs_proxier_netlink_operations_total{op=\"add_service\",result=\"error\"} 1",
        "ipvs_proxier_virtual_servers 7",
        "ipvs_proxier_real_servers 21",
        "ipvs_proxier_bound_addresses 4",
        "ipvs_proxier_graceful_drain_queue_length 2",
        "ipvs_proxier_full_resync_drift_repaired 3",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"} 2",
        "kubeproxy_network_programming_duration_seconds_bucket{le=\"1\"} 1",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}
