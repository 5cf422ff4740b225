//! Tests of `proxier_runtime::source::manifests`.

use proxier_runtime::source::manifests::*;

const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  clusterIP: 10.96.0.20\n  ports:\n  - port: 80\n    protocol: TCP\n    targetPort: 8080\n";
const SLICE: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: web-abc12\n  namespace: shop\n  labels:\n    kubernetes.io/service-name: web\nendpoints:\n- addresses: [10.244.1.5]\n  conditions: {ready: true}\nports:\n- port: 8080\n  protocol: TCP\n";

#[test]
fn multi_document_file() {
    let text = format!("---\n{SVC}---\n{SLICE}\n---\n# only a comment\n");
    let m = parse_manifests(&text);
    assert!(m.problems.is_empty(), "{:?}", m.problems);
    assert_eq!(m.services.len(), 1);
    assert_eq!(m.endpoint_slices.len(), 1);
    let svc = &m.services[0];
    assert_eq!(svc.metadata.name.as_deref(), Some("web"));
    let spec = svc.spec.as_ref().expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.20"));
    let slice = &m.endpoint_slices[0];
    assert_eq!(slice.address_type, "IPv4");
    let endpoints = slice.endpoints.as_ref().expect("endpoints");
    assert_eq!(endpoints[0].addresses, vec!["10.244.1.5".to_owned()]);
}

#[test]
fn kubectl_list_output() {
    let text = "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata:\n    name: a\n    namespace: default\n  spec:\n    clusterIP: 10.96.0.1\n- apiVersion: v1\n  kind: Node\n  metadata:\n    name: node-a\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata:\n    name: d\nkind: List\nmetadata:\n  resourceVersion: \"\"\n";
    let m = parse_manifests(text);
    assert_eq!(m.services.len(), 1);
    assert_eq!(m.nodes.len(), 1);
    assert_eq!(m.problems.len(), 1);
    assert!(m.problems[0].is_unknown_kind());
    assert_eq!(
        m.problems[0].to_string(),
        "document 0 item 2: skipping apps/v1 Deployment \"d\" (not used by ipvs-proxier)"
    );
}

#[test]
fn typed_list_kind_is_a_list_too() {
    let text = "apiVersion: v1\nkind: ServiceList\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a, namespace: x}\n";
    let m = parse_manifests(text);
    assert_eq!(m.services.len(), 1);
}

#[test]
fn malformed_documents_are_isolated() {
    let broken_yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: [oops\n";
    let bad_schema = "apiVersion: v1\nkind: Service\nmetadata:\n  name: bad\n  namespace: shop\nspec:\n  ports: 80\n";
    let text = format!("{SVC}---\n{broken_yaml}---\n{bad_schema}---\n{SLICE}");
    let m = parse_manifests(&text);
    assert_eq!(m.services.len(), 1, "the good service survives");
    assert_eq!(
        m.endpoint_slices.len(),
        1,
        "the slice after the bad ones survives"
    );
    assert_eq!(m.problems.len(), 2, "{:?}", m.problems);
    assert!(matches!(
        &m.problems[0],
        ManifestProblem::Syntax {
            at: ManifestPosition {
                document: 1,
                item: None
            },
            ..
        }
    ));
    match &m.problems[1] {
        ManifestProblem::Invalid { at, kind, name, .. } => {
            assert_eq!(at.document, 2);
            assert_eq!(kind, "Service");
            assert_eq!(name, "shop/bad");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(m.problems[1].to_string().contains("document 2"));
}

#[test]
fn unsupported_api_version_is_skipped() {
    let text = SLICE.replace("discovery.k8s.io/v1", "discovery.k8s.io/v1beta1");
    let m = parse_manifests(&text);
    assert!(m.endpoint_slices.is_empty());
    assert!(m.problems[0].is_unknown_kind());
}

#[test]
fn missing_namespace_defaults() {
    let m = parse_manifests("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n");
    assert_eq!(m.services[0].metadata.namespace.as_deref(), Some("default"));
}

#[test]
fn document_markers() {
    assert_eq!(split_documents("").len(), 0);
    assert_eq!(split_documents("a: 1\n").len(), 1);
    assert_eq!(split_documents("---\na: 1\n---\nb: 2\n").len(), 2);
    assert_eq!(split_documents("a: 1\n...\n---\nb: 2\n").len(), 2);
    assert_eq!(
        split_documents("--- {a: 1}\n--- {b: 2}\n"),
        vec!["{a: 1}\n", "{b: 2}\n"]
    );
    // A block scalar's indented content that looks like a marker is not one.
    assert_eq!(split_documents("a: |\n  ---\n  x\n").len(), 1);
}
