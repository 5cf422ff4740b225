//! The `ipvs-proxier` daemon's parts: flags and config file, settings, logging, the metrics
//! exporter, and the wiring. No proxy, source, health or printing logic lives here: the
//! engine is `proxier-core`; the sources, health servers, metrics and the dry run's plan
//! printer are `proxier-runtime`.

pub mod allocator;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod explain;
pub mod exporter;
pub mod file_value;
pub mod logging;
pub mod settings;
