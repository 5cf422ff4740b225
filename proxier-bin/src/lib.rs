//! The `ipvs-proxier` daemon's parts: flags and config file, sources of cluster objects and
//! their conversion into the engine's changes, metrics and health servers, logging. No proxy
//! logic lives here: planning, reconciling and the sync loop belong to `proxier-core`.

pub mod api_metrics;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod dry_run;
pub mod file_value;
pub mod go_duration;
pub mod health;
pub mod http_server;
pub mod logging;
pub mod metrics;
pub mod node_setup;
pub mod settings;
pub mod source;
pub mod sync_observer;
