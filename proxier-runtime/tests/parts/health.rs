//! Tests of `proxier_runtime::health`.

use http::StatusCode;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::{NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proxier_core::k8s::{TO_BE_DELETED_TAINT, node_eligible};
use proxier_core::model::ServiceName;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proxier_runtime::health::servers::*;
use proxier_runtime::health::*;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn go_time_format() {
    assert_eq!(format_go_time(None), "0001-01-01 00:00:00 +0000 UTC");
    assert_eq!(
        format_go_time(Some(UNIX_EPOCH)),
        "1970-01-01 00:00:00 +0000 UTC"
    );
    // 2024-02-29 12:34:56.5 UTC = 1709210096.5
    assert_eq!(
        format_go_time(Some(UNIX_EPOCH + Duration::new(1_709_210_096, 500_000_000))),
        "2024-02-29 12:34:56.5 +0000 UTC"
    );
    assert_eq!(
        format_go_time(Some(at(951_782_400))),
        "2000-02-29 00:00:00 +0000 UTC"
    );
}

#[test]
fn healthy_while_starting_and_while_changes_are_recent() {
    let h = ProxyHealth::new(Duration::from_secs(60));
    let a = h.healthz(at(1000));
    assert_eq!(a.status, StatusCode::OK);
    h.queued_update(at(1000));
    assert_eq!(
        h.healthz(at(5000)).status,
        StatusCode::OK,
        "no sync yet: starting up"
    );
    h.updated(at(1001));
    h.queued_update(at(1010));
    h.queued_update(at(1050)); // later changes do not move the oldest one
    assert_eq!(h.healthz(at(1069)).status, StatusCode::OK);
    let late = h.healthz(at(1070));
    assert_eq!(late.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        late.body,
        r#"{"lastUpdated": "1970-01-01 00:16:41 +0000 UTC","currentTime": "1970-01-01 00:17:50 +0000 UTC", "nodeEligible": true}"#
    );
    assert_eq!(h.livez(at(1070)).status, StatusCode::SERVICE_UNAVAILABLE);
    h.updated(at(1071));
    let ok = h.healthz(at(1080));
    assert_eq!(ok.status, StatusCode::OK);
    // Healthy answers report lastUpdated = currentTime, as kube-proxy.
    let v: serde_json::Value = serde_json::from_str(&ok.body).expect("json");
    assert_eq!(v["lastUpdated"], v["currentTime"]);
    assert_eq!(v["nodeEligible"], true);
    let live: serde_json::Value = serde_json::from_str(&h.livez(at(1080)).body).expect("json");
    assert!(live.get("nodeEligible").is_none());
}

#[test]
fn node_being_deleted_or_tainted_fails_healthz_not_livez() {
    let h = ProxyHealth::new(Duration::from_secs(60));
    let node = Node {
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: TO_BE_DELETED_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }]),
            ..NodeSpec::default()
        }),
        ..Node::default()
    };
    h.set_node_eligible(node_eligible(&node));
    let a = h.healthz(at(10));
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(a.body.contains(r#""nodeEligible": false"#), "{}", a.body);
    assert_eq!(h.livez(at(10)).status, StatusCode::OK);

    let mut deleting = Node::default();
    deleting.metadata.deletion_timestamp = Some(
        serde_json::from_value::<Time>(serde_json::json!("2024-01-01T00:00:00Z")).expect("time"),
    );
    h.set_node_eligible(node_eligible(&Node::default()));
    assert_eq!(h.healthz(at(10)).status, StatusCode::OK);
    h.set_node_eligible(node_eligible(&deleting));
    assert_eq!(h.healthz(at(10)).status, StatusCode::SERVICE_UNAVAILABLE);
    h.set_node_eligible(node_eligible(&Node::default()));
    h.set_node_eligible(false);
    assert_eq!(h.healthz(at(10)).status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h.livez(at(10)).status, StatusCode::OK);
}

#[test]
fn service_health_body_and_status() {
    let key = ServiceName::new("shop", "web");
    let a = service_health_answer(&key, 2, true);
    assert_eq!(a.status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&a.body).expect("json");
    assert_eq!(v["service"]["namespace"], "shop");
    assert_eq!(v["service"]["name"], "web");
    assert_eq!(v["localEndpoints"], 2);
    assert_eq!(v["serviceProxyHealthy"], true);
    assert_eq!(
        service_health_answer(&key, 0, true).status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        service_health_answer(&key, 3, false).status,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn proxy_health_server_answers_on_loopback() {
    let h = ProxyHealth::new(Duration::from_secs(60));
    let server = serve_proxy_health("127.0.0.1:0".parse().expect("addr"), h.clone())
        .await
        .expect("bind");
    let (status, headers, body) =
        ipvs_proxier_tests::http_client::get(server.local_addr(), "/healthz").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    assert!(body.contains("\"nodeEligible\": true"), "{body}");
    // A change queued long ago and never synced: both endpoints fail.
    h.updated(SystemTime::now() - Duration::from_secs(600));
    h.queued_update(SystemTime::now() - Duration::from_secs(300));
    assert_eq!(
        ipvs_proxier_tests::http_client::get(server.local_addr(), "/healthz")
            .await
            .0,
        503
    );
    assert_eq!(
        ipvs_proxier_tests::http_client::get(server.local_addr(), "/livez")
            .await
            .0,
        503
    );
    assert_eq!(
        ipvs_proxier_tests::http_client::get(server.local_addr(), "/other")
            .await
            .0,
        404
    );
}

#[tokio::test]
async fn service_health_servers_follow_services_and_endpoints() {
    let h = ProxyHealth::new(Duration::from_secs(60));
    let servers = ServiceHealthServers::new(vec!["127.0.0.1".parse().expect("ip")], h);
    let web = ServiceName::new("shop", "web");
    let errors = servers
        .sync_services(&HashMap::from([(web.clone(), 0)]))
        .await;
    assert!(errors.is_empty());
    let addrs = servers.local_addrs(&web).await;
    assert_eq!(addrs.len(), 1);
    let (status, headers, body) = ipvs_proxier_tests::http_client::get(addrs[0], "/").await;
    assert_eq!(status, 503, "no local endpoints yet");
    assert!(body.contains("\"localEndpoints\": 0"), "{body}");
    assert_eq!(headers["x-load-balancing-endpoint-weight"], "0");

    servers
        .sync_endpoints(&HashMap::from([(web.clone(), 2)]))
        .await;
    let (status, headers, body) = ipvs_proxier_tests::http_client::get(addrs[0], "/").await;
    assert_eq!(status, 200);
    assert!(body.contains("\"localEndpoints\": 2"), "{body}");
    assert_eq!(headers["x-load-balancing-endpoint-weight"], "2");
    assert_eq!(headers["content-type"], "application/json");

    // Endpoints gone from the map: 0 again.
    servers.sync_endpoints(&HashMap::new()).await;
    assert_eq!(
        ipvs_proxier_tests::http_client::get(addrs[0], "/").await.0,
        503
    );

    // Service no longer wanted: its port closes.
    servers.sync_services(&HashMap::new()).await;
    assert!(servers.local_addrs(&web).await.is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addrs[0]).await.is_err());
}

#[tokio::test]
async fn a_port_in_use_is_reported_and_others_still_open() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_port = taken.local_addr().expect("addr").port();
    let servers = ServiceHealthServers::new(
        vec!["127.0.0.1".parse().expect("ip")],
        ProxyHealth::new(Duration::from_secs(60)),
    );
    let a = ServiceName::new("x", "a");
    let b = ServiceName::new("x", "b");
    let errors = servers
        .sync_services(&HashMap::from([(a.clone(), taken_port), (b.clone(), 0)]))
        .await;
    assert_eq!(errors.len(), 1);
    assert!(servers.local_addrs(&a).await.is_empty());
    assert_eq!(servers.local_addrs(&b).await.len(), 1);
}
