//! Synthetic clusters for tests and benchmarks.
