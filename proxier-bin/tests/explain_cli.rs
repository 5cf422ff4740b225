//! `ipvs-proxier explain` as a user runs it, without a kernel to read: usage errors exit 2;
//! the plan's side of the explanation (ports, endpoints, virtual servers, the source's own
//! reasons) comes out as text, JSON or YAML whatever the kernel lets it read. The kernel's
//! side is checked in the VM (`tests/tests/e2e_explain.rs`).

mod support;

use std::process::{Command, Output};

use serde_json::Value;
use support::process::{BIN, CLUSTER, temp_file};

fn explain(tag: &str, args: &[&str]) -> Output {
    let path = temp_file(&format!("explain-{tag}"), CLUSTER);
    let out = Command::new(BIN)
        .arg("explain")
        .args(args)
        .arg(format!("--source-file={}", path.display()))
        .arg("--hostname-override=node-a")
        .output()
        .expect("run binary");
    let _ = std::fs::remove_file(path);
    out
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

fn kinds(doc: &Value) -> Vec<&str> {
    doc["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .map(|r| r["kind"].as_str().expect("kind"))
        .collect()
}

#[test]
fn usage_errors_exit_with_code_2() {
    for args in [
        vec!["explain"],
        vec!["explain", "web"],
        vec!["explain", "shop/web/x"],
        vec!["explain", "shop/web", "--no-such-flag"],
        vec!["explain", "shop/web", "--client=not-an-ip"],
        vec!["explain", "shop/web", "--output=xml"],
    ] {
        let out = Command::new(BIN).args(&args).output().expect("run binary");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?} must say why");
    }
}

#[test]
fn the_plan_side_comes_out_as_json_text_and_yaml() {
    let doc = json(&explain("json", &["shop/web", "--output=json"]));
    assert_eq!(doc["apiVersion"], "ipvs-proxier.explain/v1");
    assert_eq!(doc["service"], "shop/web");
    assert_eq!(doc["node"], "node-a");
    let port = &doc["ports"][0];
    assert_eq!(port["name"], "shop/web:http/TCP");
    assert_eq!(port["endpoints"]["total"], 2, "{port}");
    let vs = &port["virtualServers"][0];
    assert_eq!(vs["role"], "ClusterIP", "{vs}");
    assert_eq!(vs["planned"]["scheduler"], "rr", "{vs}");
    assert_eq!(vs["realServers"].as_array().map(Vec::len), Some(2), "{vs}");
    // No kernel here (or not one this daemon programmed): the document says so and is
    // never healthy, but it is still a document.
    assert_eq!(doc["healthy"], false);
    assert!(!kinds(&doc).is_empty());

    let text = explain("text", &["shop/web"]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.starts_with("Service shop/web on node node-a: "),
        "{text}"
    );
    assert!(
        text.contains("Port shop/web:http/TCP: 2 endpoints, 2 ready"),
        "{text}"
    );

    let yaml = explain("yaml", &["shop/web", "-o", "yaml"]);
    assert!(yaml.status.success());
    let yaml = String::from_utf8_lossy(&yaml.stdout);
    assert!(
        yaml.contains("apiVersion: ipvs-proxier.explain/v1"),
        "{yaml}"
    );
}

#[test]
fn an_unknown_service_is_reported_not_found() {
    let doc = json(&explain("missing", &["shop/nothing", "-o", "json"]));
    assert!(kinds(&doc).contains(&"serviceNotFound"), "{doc}");
    assert_eq!(doc["ports"].as_array().map(Vec::len), Some(0));
}

#[test]
fn a_client_outside_the_source_ranges_is_told_so() {
    // shop/storefront's load-balancer IP admits 198.51.100.0/24 and 192.0.2.0/24 only.
    let outside = json(&explain(
        "outside",
        &["shop/storefront", "--client=203.0.113.9", "-o", "json"],
    ));
    assert!(
        kinds(&outside).contains(&"sourceRangesExcludeClient"),
        "{outside}"
    );
    assert_eq!(outside["client"], "203.0.113.9");
    let inside = json(&explain(
        "inside",
        &["shop/storefront", "--client=198.51.100.7", "-o", "json"],
    ));
    assert!(
        !kinds(&inside).contains(&"sourceRangesExcludeClient"),
        "{inside}"
    );
    assert!(kinds(&inside).contains(&"sourceRangesRestrict"), "{inside}");
}
