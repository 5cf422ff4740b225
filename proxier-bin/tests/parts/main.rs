//! Unit-level tests of the daemon's parts (one module per source module of proxier-bin),
//! in one test binary: flags and config, sources, metrics, health and HTTP servers.

mod cli;
mod config;
mod go_duration;
mod health;
mod http_client;
mod http_server;
mod kube_proxy_validation;
mod kubeadm_files;
mod logging;
mod metrics;
mod settings;
mod source;
mod source_file;
mod source_kube;
mod source_manifests;
