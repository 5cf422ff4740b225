//! The `ipvs-proxier` daemon's parts: flags and config file, sources of cluster objects,
//! the sync runner, metrics and health servers, logging. No proxy logic lives here: planning
//! and reconciling belong to `proxier-core`.

pub mod cli;
pub mod cluster_view;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod dry_run;
pub mod go_duration;
pub mod health;
pub mod http_server;
pub mod logging;
pub mod metrics;
pub mod runner;
pub mod settings;
pub mod source;
pub mod tracked_state;
