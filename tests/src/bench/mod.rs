//! The kit of the daemon benchmarks in `src/bin` (`cargo xtask vm-bench proxier|soak`): the
//! synthetic cluster, the daemon under benchmark with its logged phase timings, the API
//! server double in a namespace, metrics, and change-to-kernel latency.

pub mod api;
pub mod cluster;
pub mod daemon;
pub mod latency;
pub mod metrics;
pub mod phases;
