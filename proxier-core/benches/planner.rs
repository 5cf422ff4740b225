//! Planner benchmarks (filled in below).
fn main() {}
