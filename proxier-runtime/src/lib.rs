//! What every program around the [`proxier_core`] engine needs, as kube-runtime is for
//! kube-rs: sources of cluster objects, kube-proxy's health servers, and the `kubeproxy_*`
//! metrics. The `ipvs-proxier` daemon is these parts wired together; a CNI or any program
//! that embeds the engine takes the ones it needs.
//!
//! - [`source`]: the Kubernetes API server (feature `kube`: kube-runtime watchers with
//!   kube-proxy's selectors and readiness rule) and a YAML file of manifests (feature `file`).
//!   Each is a value the caller spawns, yielding the engine's [`Change`](proxier_core::Change)s.
//! - [`explain`]: why one Service does or does not answer on this node: the engine's plan
//!   of a source's first picture next to what the kernel holds (`ipvs-proxier explain`).
//! - [`feed`]: hands a source's batches to the engine (counted for the metrics): the first
//!   before the first sync, the rest to the driver.
//! - [`go_duration`]: durations as Kubernetes components' flags and config files write them
//!   (Go's `time.ParseDuration`), parsed and printed.
//! - [`health`]: kube-proxy's `/healthz` and `/livez` state and, with the `http` feature, its
//!   servers and the per-Service health-check node ports of `externalTrafficPolicy: Local`.
//! - [`metrics`]: the catalogue (kube-proxy's names, help texts and buckets) and recorders
//!   through the `metrics` facade; installing an exporter stays the application's choice.
//! - [`node_setup`]: what kube-proxy does to the node before it starts: the IPVS scheduler's
//!   module checked, `oom_score_adj` and the conntrack sysctls set.
//! - [`observer`]: a [`SyncObserver`](proxier_core::engine::driver::SyncObserver) that records
//!   every sync in the metrics and the health state and opens or closes the health-check
//!   servers.
//! - [`traffic`]: per-Service IPVS traffic metrics (beyond kube-proxy), read from the
//!   kernel's counters at scrape time and labelled with the Service port and role.
//! - [`plan_printer`] (feature `printer`): a `SyncObserver` around another that prints the
//!   plan of an engine on in-memory backends after every sync, as a table, JSON or YAML (a
//!   dry run).
//!
//! ```no_run
//! use proxier_core::engine::driver::{self, DriverConfig, ProxierHandle};
//! use proxier_core::model::Config;
//! use proxier_core::{KernelProxier, ProxierConfig};
//! use proxier_runtime::health::ProxyHealth;
//! use proxier_runtime::observer::RuntimeObserver;
//! use proxier_runtime::feed;
//! use proxier_runtime::source::{self, file::FileSourceConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = ProxierConfig::new("node-a", Config::default());
//! let mut proxier = KernelProxier::open(config, "kube-ipvs0").await?;
//! let mut source = source::file::spawn(FileSourceConfig::new("cluster.yaml", "node-a"));
//! let health = ProxyHealth::new(std::time::Duration::from_secs(60));
//! let mut observer = RuntimeObserver::new(health.clone());
//!
//! // The first batch is the source's complete picture: apply it before the first sync.
//! let first = source.events.recv().await.ok_or("the source ended")?;
//! observer.feed().apply_first(&mut proxier, first);
//! let (handle, commands) = ProxierHandle::new();
//! tokio::spawn(feed::forward(source.events, handle.clone(), observer.feed()));
//! let (_stop, stopped) = tokio::sync::watch::channel(false);
//! let timing = DriverConfig::new(std::time::Duration::from_secs(30), std::time::Duration::from_secs(1), 2);
//! driver::run(&mut proxier, timing, commands, &mut observer, stopped).await;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

#[cfg(feature = "kube")]
pub mod api_metrics;
pub mod explain;
pub mod feed;
pub mod go_duration;
pub mod health;
#[cfg(feature = "http")]
pub mod http_server;
pub mod metrics;
pub mod node_setup;
pub mod observer;
#[cfg(feature = "printer")]
pub mod plan_printer;
pub mod source;
pub mod traffic;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
