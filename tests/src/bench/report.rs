//! The machine-readable report a VM benchmark prints on its last line: the marker
//! [`REPORT_MARKER`] and one JSON object, read from the VM's console by
//! `cargo xtask bench-report` (which writes `docs/benchmarks.md` from it). Times are in
//! seconds, memory in MiB.

use std::time::Duration;

use serde_json::{Value, json};

use super::latency::Percentiles;

/// What starts the report line on the console (xtask's `bench_report` looks for it).
pub const REPORT_MARKER: &str = "VM-BENCH-REPORT:";

/// Prints `report` as one line after [`REPORT_MARKER`].
pub fn emit(report: &Value) {
    println!("{REPORT_MARKER} {report}");
}

/// Seconds, as a JSON number.
pub fn seconds(d: Duration) -> Value {
    Value::from(d.as_secs_f64())
}

/// Percentiles of change-to-kernel samples in milliseconds (`null` without samples).
pub fn percentiles(p: Option<Percentiles>) -> Value {
    match p {
        Some(p) => json!({
            "count": p.count,
            "p50_ms": p.p50.as_secs_f64() * 1e3,
            "p99_ms": p.p99.as_secs_f64() * 1e3,
            "max_ms": p.max.as_secs_f64() * 1e3,
        }),
        None => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_in_milliseconds_and_null_without_samples() {
        let p = Percentiles::of(&[Duration::from_millis(4), Duration::from_millis(8)]);
        let value = percentiles(p);
        assert_eq!(value["count"], 2);
        assert_eq!(value["p50_ms"], 4.0);
        assert_eq!(value["max_ms"], 8.0);
        assert_eq!(percentiles(None), Value::Null);
    }
}
