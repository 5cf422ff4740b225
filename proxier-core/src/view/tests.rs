use crate::engine::driver::SyncOutcome;
use crate::engine::{EngineError, SyncReport};
use crate::testing;
use crate::{Backends, Change, MemoryProxier, Proxier, ProxierConfig, SyncKind};

use super::render::{describe_change, render_report};
use super::*;

fn outcome(result: &Result<SyncReport, EngineError>, kind: SyncKind) -> SyncOutcome<'_> {
    SyncOutcome {
        kind,
        took: std::time::Duration::ZERO,
        result,
        succeeded: result.is_ok(),
        changes_pending: false,
    }
}

/// A proxier on in-memory backends holding `services` Services × `endpoints` endpoints.
fn proxier(services: usize, endpoints: usize) -> MemoryProxier {
    let config = ProxierConfig::new(testing::NODE_NAME, testing::config());
    let mut proxier = Proxier::new(config, Backends::in_memory()).expect("proxier");
    proxier.apply(Change::UpsertNode(testing::node()));
    let cluster = testing::state(services, endpoints);
    for service in cluster.services() {
        proxier.apply(Change::UpsertService(service.clone()));
        for slice in cluster.slices_of(&service.name) {
            proxier.apply(Change::UpsertSlice(slice.clone()));
        }
    }
    proxier
}

#[tokio::test]
async fn a_plan_document_counts_what_it_lists_and_round_trips() {
    let mut proxier = proxier(20, 3);
    let result = proxier.sync(SyncKind::Full).await;
    let doc = plan_document(&proxier, &outcome(&result, SyncKind::Full));
    assert_eq!(
        (doc.api_version.as_str(), doc.kind.as_str()),
        (DOCUMENT_API_VERSION, "Plan")
    );
    assert_eq!(doc.summary.services, 20);
    assert_eq!(doc.summary.virtual_servers, doc.virtual_servers.len());
    assert_eq!(doc.summary.bound_addresses, doc.bound_addresses.len());
    let reals: usize = doc
        .virtual_servers
        .iter()
        .map(|v| v.real_servers.len())
        .sum();
    assert_eq!(doc.summary.real_servers, reals);
    let writes = doc.writes.as_ref().expect("applied in memory");
    assert_eq!(
        writes.total,
        reals + doc.virtual_servers.len() + doc.bound_addresses.len()
    );
    assert_eq!(writes.deletes, 0);

    let json = serde_json::to_string(&doc).expect("json");
    let back: PlanDocument = serde_json::from_str(&json).expect("parse");
    assert_eq!(back, doc);
    // Unknown fields are refused: a consumer's schema and ours cannot drift silently.
    let mut extra: serde_json::Value = serde_json::from_str(&json).expect("value");
    extra["surprise"] = serde_json::json!(1);
    assert!(serde_json::from_value::<PlanDocument>(extra).is_err());
}

#[tokio::test]
async fn a_change_document_lists_only_what_the_sync_changed() {
    let mut proxier = proxier(5, 2);
    let _ = proxier.sync(SyncKind::Full).await;
    let before = proxier.desired().clone();
    let gone = testing::state(5, 2)
        .services()
        .next()
        .expect("a service")
        .name
        .clone();
    proxier.apply(Change::DeleteService(gone.clone()));
    let result = proxier.sync(SyncKind::Incremental).await;
    let doc = change_document(&before, &proxier, &outcome(&result, SyncKind::Incremental));
    assert!(!doc.is_empty());
    assert!(doc.virtual_servers.added.is_empty() && doc.virtual_servers.changed.is_empty());
    assert!(!doc.virtual_servers.removed.is_empty());
    let prefix = format!("{}/{}", gone.namespace, gone.name);
    assert!(
        doc.virtual_servers
            .removed
            .iter()
            .all(|v| v.service_port.starts_with(&prefix)),
        "{:?}",
        doc.virtual_servers.removed
    );
    assert_eq!(doc.summary.services, 4);
    assert!(doc.writes.as_ref().is_some_and(|w| w.deletes > 0));

    // A sync that changes nothing gives an empty document.
    let before = proxier.desired().clone();
    let result = proxier.sync(SyncKind::Full).await;
    assert!(change_document(&before, &proxier, &outcome(&result, SyncKind::Full)).is_empty());
}

#[test]
fn changed_virtual_servers_name_their_real_server_changes() {
    let rs = |a: &str, w: u32| RealServerDoc {
        address: a.parse().expect("ip"),
        port: 8080,
        weight: w,
    };
    let before = VirtualServerDoc {
        service_port: "shop/web:http/TCP".into(),
        role: "ClusterIP".into(),
        protocol: "TCP".into(),
        address: "10.96.12.50".parse().expect("ip"),
        port: 80,
        scheduler: "rr".into(),
        persistence_timeout_seconds: None,
        hash_source_port: false,
        real_servers: vec![rs("10.244.1.5", 1), rs("10.244.1.6", 1)],
    };
    let after = VirtualServerDoc {
        scheduler: "wrr".into(),
        real_servers: vec![rs("10.244.1.6", 3), rs("10.244.1.7", 1)],
        ..before.clone()
    };
    assert_eq!(
        describe_change(&before, &after),
        "scheduler rr -> wrr; real servers +10.244.1.7:8080; real servers -10.244.1.5:8080; weights 10.244.1.6:8080 w1 -> w3"
    );
}

#[tokio::test]
async fn a_large_plan_keeps_the_addresses_line_short() {
    let mut proxier = proxier(10_000, 2);
    let result = proxier.sync(SyncKind::Full).await;
    let text = render_report(&proxier, &outcome(&result, SyncKind::Full));
    let line = text
        .lines()
        .find(|l| l.starts_with("addresses on "))
        .expect("addresses line");
    assert!(line.len() < 300, "{line}");
    assert!(line.contains(": 10000 ("), "{line}");
    assert!(
        line.contains("… 9992 more; --output json lists them all"),
        "{line}"
    );
    assert_eq!(
        text.lines().filter(|l| l.contains("ClusterIP")).count(),
        10_000
    );
}
