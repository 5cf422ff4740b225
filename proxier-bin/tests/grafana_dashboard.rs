//! `deploy/grafana/ipvs-proxier.json`, the Grafana dashboard: well-formed, and every metric
//! its queries name is one the daemon really exports. A dry-run daemon (`--watch`, metrics
//! and health on loopback port 0) is scraped after its first sync and after one `/healthz`
//! and `/livez` request each (their counters are labeled by answer code and appear with the
//! first answer).

mod support;

use std::collections::BTreeSet;

use support::process::{CLUSTER, Daemon, http_get, listening_address, temp_file, wait_line};

const DASHBOARD: &str = include_str!("../../deploy/grafana/ipvs-proxier.json");

/// Identifiers with an underscore in the queries that are not metric names.
const NOT_METRICS: &[&str] = &[
    "histogram_quantile",
    "clamp_min",
    "label_values",
    "traffic_policy",
    "__rate_interval",
    "group_left",
];

fn dashboard() -> serde_json::Value {
    serde_json::from_str(DASHBOARD).expect("the dashboard is JSON")
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        out.push(panel);
        if let Some(nested) = panel["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// Every PromQL expression: panel targets and template variable queries.
fn expressions(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = panels(dashboard)
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .map(|t| t["expr"].as_str().expect("target expr").to_owned())
        .collect();
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if let Some(query) = var["query"]["query"].as_str() {
            out.push(query.to_owned());
        }
    }
    out
}

/// The metric names an expression uses: identifiers with an underscore, except PromQL
/// functions, label names and Grafana variables.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_quotes = false;
    let mut token = String::new();
    let mut after_dollar = false;
    let mut flush = |token: &mut String, after_dollar: bool| {
        if !after_dollar && token.contains('_') && !NOT_METRICS.contains(&token.as_str()) {
            names.insert(std::mem::take(token));
        }
        token.clear();
    };
    for c in expr.chars() {
        if c == '"' {
            in_quotes = !in_quotes;
            continue;
        }
        if in_quotes {
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            if token.is_empty() && c.is_ascii_digit() {
                continue;
            }
            token.push(c);
        } else {
            flush(&mut token, after_dollar);
            after_dollar = c == '$';
        }
    }
    flush(&mut token, after_dollar);
    names
}

#[test]
fn the_dashboard_is_well_formed() {
    let d = dashboard();
    assert_eq!(d["uid"], "ipvs-proxier");
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    let mut ids = BTreeSet::new();
    let mut queried = 0;
    for panel in panels(&d) {
        let id = panel["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "duplicate panel id {id}");
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            panel["description"].as_str().is_some_and(|t| !t.is_empty()),
            "{panel}"
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{panel}");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            assert!(
                !metric_names(expr).is_empty(),
                "no metric in {expr:?} of {}",
                panel["title"]
            );
            assert!(
                expr.contains("instance=~\"$instance\""),
                "{expr:?} ignores the instance selector"
            );
            queried += 1;
        }
    }
    assert!(queried >= 20, "{queried} queries");
    // What the dashboard is for: sync and programming latency, rule counts, failures, drift.
    let all: BTreeSet<String> = expressions(&d)
        .iter()
        .flat_map(|e| metric_names(e))
        .collect();
    for needed in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_network_programming_duration_seconds_bucket",
        "ipvs_proxier_virtual_servers",
        "ipvs_proxier_real_servers",
        "ipvs_proxier_netlink_operations_total",
        "ipvs_proxier_full_resync_drift_repaired",
    ] {
        assert!(all.contains(needed), "{needed} missing from {all:?}");
    }
}

#[test]
fn metric_names_are_found_in_queries() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (instance, le) (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{instance=~\"$instance\"}[$__rate_interval])))"
        ),
        BTreeSet::from(["kubeproxy_sync_proxy_rules_duration_seconds_bucket".to_owned()])
    );
    assert_eq!(
        metric_names("sum by (traffic_policy) (a_b{x=\"some_value\"}) - c_d"),
        BTreeSet::from(["a_b".to_owned(), "c_d".to_owned()])
    );
}

#[test]
fn every_metric_the_dashboard_queries_is_exported() {
    let path = temp_file("grafana", CLUSTER);
    let daemon = Daemon::start(&[
        "--dry-run".into(),
        "--watch".into(),
        "--hostname-override=node-a".into(),
        "--metrics-bind-address=127.0.0.1:0".into(),
        "--healthz-bind-address=127.0.0.1:0".into(),
        "--log-format=json".into(),
        format!("--source-file={}", path.display()),
    ]);
    let metrics = listening_address(&daemon.stderr_lines, "metrics server listening");
    let health = listening_address(&daemon.stderr_lines, "health server listening");
    wait_line(&daemon.stdout_lines, "first plan", |l| {
        l.starts_with("dry-run")
    });
    http_get(health, "/healthz");
    http_get(health, "/livez");
    let (_, text) = http_get(metrics, "/metrics");
    drop(daemon);
    let _ = std::fs::remove_file(path);

    // The per-Service traffic needs a kernel table (never in a dry run): its names are the
    // traffic module's, checked against what it renders in proxier-runtime's tests and in
    // the VM (e2e_traffic_metrics).
    let traffic = proxier_runtime::traffic::metric_names();
    let exported: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .chain(traffic.iter().map(String::as_str))
        .collect();
    let queried: BTreeSet<String> = expressions(&dashboard())
        .iter()
        .flat_map(|e| metric_names(e))
        .collect();
    let missing: Vec<&String> = queried
        .iter()
        .filter(|name| !exported.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the daemon does not export: {missing:?}\nexported: {exported:?}"
    );
}
