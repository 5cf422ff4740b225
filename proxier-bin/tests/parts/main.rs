//! Unit-level tests of the daemon's parts (one module per source module of proxier-bin),
//! in one test binary: flags, config file, settings and logging.

mod cli;
mod config;
mod exporter;
mod kube_proxy_validation;
mod kubeadm_files;
mod logging;
mod settings;
