//! Tests of the runtime's parts, one module per module of proxier-runtime, in one test
//! binary: sources, metrics, health and HTTP servers, the plan printer, Go durations.

mod api_client_metrics;
mod go_duration;
mod health;
mod http_server;
mod kube_source;
mod kube_source_cost;
mod metrics;
mod plan_printer;
mod source;
mod source_file;
mod source_kube;
mod source_manifests;
mod traffic;
