//! The kit of the daemon benchmarks in `src/bin` (`cargo xtask vm-bench proxier|soak`): the
//! synthetic cluster, CPU time, the daemon under benchmark with the phase timings of its JSON log, the
//! API server double in a namespace, metrics, change-to-kernel latency, and the report line
//! `cargo xtask bench-report` reads.

pub mod api;
pub mod cluster;
pub mod cpu;
pub mod daemon;
pub mod latency;
pub mod metrics;
pub mod phases;
pub mod report;
