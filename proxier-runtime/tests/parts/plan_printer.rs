//! Tests of `proxier_runtime::plan_printer`, the dry run on the example cluster
//! (`examples/cluster.yaml`): the file source's objects through the engine on in-memory
//! backends, printed by the plan printer as the daemon's `--dry-run` prints them.

use proxier_core::engine::driver::{self, DriverConfig, ProxierHandle, SyncObserver, SyncOutcome};
use proxier_core::model::Config;
use proxier_core::view::render::render_plan;
use proxier_core::view::{DOCUMENT_API_VERSION, PlanDocument, plan_document};
use proxier_core::{Backends, Change, MemoryProxier, Proxier, ProxierConfig, SyncKind};
use proxier_runtime::health::ProxyHealth;
use proxier_runtime::observer::RuntimeObserver;
use proxier_runtime::plan_printer::{PlanFormat, PlanPrinter};
use proxier_runtime::source::file::FileReader;
use tokio::sync::watch;

fn example_changes() -> Vec<Change> {
    let text = include_str!("../../../examples/cluster.yaml");
    let batch = FileReader::new("cluster.yaml", "node-a").read(text);
    batch.expect("the example is well-formed").changes
}

fn proxier() -> MemoryProxier {
    let config = ProxierConfig::new("node-a", Config::default());
    let mut proxier = Proxier::new(config, Backends::in_memory()).expect("proxier");
    for change in example_changes() {
        proxier.apply(change);
    }
    proxier
}

fn row<'a>(table: &'a str, service_port: &str, vip: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(service_port) && l.contains(vip))
        .unwrap_or_else(|| panic!("no row for {service_port} {vip} in:\n{table}"))
}

#[tokio::test]
async fn example_cluster_plan_table() {
    let mut proxier = proxier();
    proxier.sync(SyncKind::Full).await.expect("sync");
    assert_eq!(
        proxier.node().primary_ips.len(),
        2,
        "IPv4 and IPv6 InternalIPs"
    );
    let table = render_plan(proxier.desired(), "kube-ipvs0");

    // ClusterIP with the API server behind it.
    assert!(row(&table, "default/kubernetes", "TCP 10.96.0.1:443").contains("192.0.2.100:6443"));
    // DNS over UDP and TCP.
    assert!(row(&table, "kube-system/kube-dns:dns/UDP", "10.96.0.10:53").contains("10.244.2.3:53"));
    assert!(
        row(&table, "kube-system/kube-dns:dns-tcp/TCP", "10.96.0.10:53").contains("10.244.1.2:53")
    );
    // ClientIP affinity becomes persistence.
    assert!(row(&table, "shop/cart", "10.96.12.51:7070").contains("600s"));
    // NodePort on the node's address; LoadBalancer ingress.
    assert!(row(&table, "shop/web", "192.0.2.10:30080").contains("NodePort"));
    assert!(row(&table, "shop/storefront", "203.0.113.10:443").contains("LoadBalancer"));
    // eTP=Local: the load balancer VIP only has the local endpoint.
    let lb_local = row(&table, "shop/checkout", "203.0.113.11:443");
    assert!(
        lb_local.contains("10.244.1.41:8443") && !lb_local.contains("10.244.2.42"),
        "{lb_local}"
    );
    // Dual-stack: one virtual server per family.
    assert!(
        row(&table, "monitoring/prometheus", "[fd00:10:96::28]:9090")
            .contains("[fd00:10:244:1::7]:9090")
    );
    assert!(row(&table, "monitoring/prometheus", "10.96.40.5:9090").contains("10.244.1.7:9090"));
    // Skipped: headless, ExternalName, other proxy.
    for skipped in [
        "shop/orders-db",
        "shop/payments-gateway",
        "shop/legacy-billing",
    ] {
        assert!(
            !table.contains(skipped),
            "{skipped} must not be planned:\n{table}"
        );
    }
    let vips = table.lines().last().expect("addresses line");
    assert!(vips.starts_with("addresses on kube-ipvs0: "), "{vips}");
    assert!(
        vips.contains("10.96.0.1,") && vips.contains("203.0.113.11") && vips.contains("192.0.2.50"),
        "{vips}"
    );
    assert!(
        !vips.contains("192.0.2.10,") && !vips.ends_with("192.0.2.10"),
        "node IPs are not bound: {vips}"
    );
}

#[tokio::test]
async fn the_driver_prints_each_sync_and_a_removed_service_deletes() {
    let mut proxier = proxier();
    let (handle, commands) = ProxierHandle::new();
    let (stop, shutdown) = watch::channel(false);
    let daemon = RuntimeObserver::new(ProxyHealth::new(std::time::Duration::from_secs(60)));
    let mut observer = PlanPrinter::new(daemon, Vec::new());
    let config = DriverConfig::new(
        std::time::Duration::from_secs(3600),
        std::time::Duration::ZERO,
        2,
    );
    let feeder = async {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        handle.apply(vec![Change::DeleteService(
            proxier_core::model::ServiceName::new("shop", "cart"),
        )]);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        stop.send_replace(true);
    };
    tokio::join!(
        driver::run(&mut proxier, config, commands, &mut observer, shutdown),
        feeder
    );
    let printed = String::from_utf8(observer.into_writer()).expect("utf8");
    let plans: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("plan: ") || l.starts_with("changes: "))
        .collect();
    assert_eq!(plans.len(), 2, "{printed}");
    assert!(
        plans[0].starts_with("plan: "),
        "the whole plan first: {printed}"
    );
    assert!(!plans[0].contains("would make 0 writes"), "{}", plans[0]);
    assert!(
        plans[1].starts_with("changes: "),
        "then only changes: {printed}"
    );
    assert!(
        !plans[1].ends_with("(0 deletes)"),
        "removing a Service deletes: {}",
        plans[1]
    );
    let second = printed.split("changes: ").nth(1).expect("second report");
    assert!(second.contains("- shop/cart"), "{second}");
    assert!(!second.contains("shop/web"), "{second}");
    let first = printed.lines().next().expect("summary");
    // The example's 11 Services less the headless and the ExternalName one; the slice
    // of the headless Service is filtered by the file source.
    assert_eq!(
        first,
        "dry-run full sync: 9 services (11 ports), 10 endpoint slices (18 endpoints), node node-a"
    );
}

fn outcome(
    result: &Result<proxier_core::engine::SyncReport, proxier_core::EngineError>,
    kind: SyncKind,
) -> SyncOutcome<'_> {
    SyncOutcome {
        kind,
        took: std::time::Duration::ZERO,
        result,
        succeeded: result.is_ok(),
        changes_pending: false,
    }
}

fn observer(format: PlanFormat) -> PlanPrinter<RuntimeObserver, Vec<u8>> {
    let daemon = RuntimeObserver::new(ProxyHealth::new(std::time::Duration::from_secs(60)));
    PlanPrinter::with_format(daemon, Vec::new(), format).watching()
}

#[tokio::test]
async fn plan_documents_round_trip_through_json_and_yaml() {
    let mut proxier = proxier();
    let result = proxier.sync(SyncKind::Full).await;
    let doc = plan_document(&proxier, &outcome(&result, SyncKind::Full));
    assert_eq!(doc.api_version, DOCUMENT_API_VERSION);
    assert!(doc.virtual_servers.iter().any(|v| v.role == "NodePort"));
    assert!(doc.writes.as_ref().is_some_and(|w| w.total > 0));

    let json = serde_json::to_string_pretty(&doc).expect("json");
    let back: PlanDocument = serde_json::from_str(&json).expect("parse json");
    assert_eq!(back, doc);
    let yaml = serde_yaml::to_string(&doc).expect("yaml");
    let back: PlanDocument = serde_yaml::from_str(&yaml).expect("parse yaml");
    assert_eq!(back, doc);

    // The names the schema documents (docs/dry-run.md).
    let v: serde_json::Value = serde_json::from_str(&json).expect("value");
    for field in [
        "apiVersion",
        "kind",
        "sync",
        "node",
        "dummyInterface",
        "summary",
        "writes",
        "error",
        "virtualServers",
        "boundAddresses",
    ] {
        assert!(v.get(field).is_some(), "{field} missing: {json}");
    }
    let vs = &v["virtualServers"][0];
    for field in [
        "servicePort",
        "role",
        "protocol",
        "address",
        "port",
        "scheduler",
        "persistenceTimeoutSeconds",
        "hashSourcePort",
        "realServers",
    ] {
        assert!(vs.get(field).is_some(), "{field} missing: {vs}");
    }
    assert!(v["node"].get("primaryIPs").is_some());
    assert!(
        v["virtualServers"][0]["realServers"][0]
            .get("weight")
            .is_some()
    );
    // Unknown fields are refused: a consumer's schema and ours cannot drift silently.
    let mut extra = v.clone();
    extra["surprise"] = serde_json::json!(1);
    assert!(serde_json::from_value::<PlanDocument>(extra).is_err());
}

#[tokio::test]
async fn watch_prints_the_plan_then_only_what_changed() {
    let mut proxier = proxier();
    let mut obs = observer(PlanFormat::Table);
    let result = proxier.sync(SyncKind::Full).await;
    obs.synced(&proxier, &outcome(&result, SyncKind::Full));

    // Nothing changed: one summary line and "no change".
    let result = proxier.sync(SyncKind::Full).await;
    obs.synced(&proxier, &outcome(&result, SyncKind::Full));

    // cart goes away; web gets one endpoint more.
    proxier.apply(Change::DeleteService(
        proxier_core::model::ServiceName::new("shop", "cart"),
    ));
    let result = proxier.sync(SyncKind::Incremental).await;
    obs.synced(&proxier, &outcome(&result, SyncKind::Incremental));

    let printed = String::from_utf8(obs.into_writer()).expect("utf8");
    let reports: Vec<&str> = printed
        .split("dry-run ")
        .filter(|r| !r.is_empty())
        .collect();
    assert_eq!(reports.len(), 3, "{printed}");
    assert!(reports[0].contains("SERVICE PORT"), "{}", reports[0]);
    assert!(
        reports[1].contains("no change; a real sync would make 0 writes"),
        "{}",
        reports[1]
    );
    assert!(!reports[1].contains("SERVICE PORT"), "{}", reports[1]);
    let change = reports[2];
    assert!(!change.contains("SERVICE PORT"), "no whole table: {change}");
    assert!(
        change.contains("changes: 0 virtual servers added, 1 removed, 0 changed; 0 addresses bound, 1 unbound on kube-ipvs0; a real sync would make"),
        "{change}"
    );
    let removed: Vec<&str> = change.lines().filter(|l| l.starts_with("- ")).collect();
    assert_eq!(removed.len(), 2, "{change}");
    assert!(
        removed[0].starts_with("- shop/cart") && removed[0].contains("10.96.12.51:7070"),
        "{change}"
    );
    assert_eq!(removed[1], "- addresses on kube-ipvs0: 10.96.12.51");
    assert!(!change.contains("shop/web"), "{change}");
}

#[tokio::test]
async fn bound_service_cidrs_show_as_local_routes_instead_of_cluster_ip_addresses() {
    let planner = Config {
        service_cidr_routes: vec!["10.96.0.0/16".parse().expect("cidr")],
        strict_arp: true,
        ..Config::default()
    };
    let mut routed = Proxier::new(ProxierConfig::new("node-a", planner), Backends::in_memory())
        .expect("proxier");
    for change in example_changes() {
        routed.apply(change);
    }
    let result = routed.sync(SyncKind::Full).await;
    let doc = plan_document(&routed, &outcome(&result, SyncKind::Full));
    let routed: Vec<String> = doc.local_routes.iter().map(ToString::to_string).collect();
    assert_eq!(routed, ["10.96.0.0/16"]);
    let bound: Vec<String> = doc
        .bound_addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    // The IPv4 ClusterIPs lie in the route; the load-balancer IP and the ClusterIPs of the
    // dual-stack Service (its IPv6 family has no routed CIDR) are still bound.
    assert!(!bound.contains(&"10.96.0.1".to_owned()), "{bound:?}");
    assert!(bound.contains(&"203.0.113.11".to_owned()), "{bound:?}");
    assert!(bound.contains(&"fd00:10:96::28".to_owned()), "{bound:?}");
    assert!(bound.contains(&"10.96.40.5".to_owned()), "{bound:?}");
    let json = serde_json::to_string(&doc).expect("json");
    assert!(
        json.contains("\"localRoutes\":[\"10.96.0.0/16\"]"),
        "{json}"
    );
    let table = proxier_core::view::render::render_plan_table(&doc);
    assert!(
        table.ends_with("local routes through kube-ipvs0: 10.96.0.0/16\n"),
        "{table}"
    );
    // Without the option the document has no such field.
    let mut plain = proxier();
    let result = plain.sync(SyncKind::Full).await;
    let json = serde_json::to_string(&plan_document(&plain, &outcome(&result, SyncKind::Full)))
        .expect("json");
    assert!(!json.contains("localRoutes"), "{json}");
}
