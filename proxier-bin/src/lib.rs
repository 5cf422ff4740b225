//! The `ipvs-proxier` daemon's parts: flags and config file, settings, logging, the metrics
//! exporter, the dry run's printer, and the wiring. No proxy, source or health logic lives
//! here: the engine is `proxier-core`, the sources, health servers and metrics are
//! `proxier-runtime`.

pub mod cli;
pub mod config;
pub mod daemon;
pub mod dry_run;
pub mod exporter;
pub mod file_value;
pub mod go_duration;
pub mod logging;
pub mod settings;
