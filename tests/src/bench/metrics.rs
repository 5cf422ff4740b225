//! The daemon's Prometheus metrics, fetched inside its namespace.

use std::collections::BTreeMap;

use anyhow::bail;

use crate::Netns;

/// The metrics text served at `address` (`host:port`) in `ns`: an answer with status 200,
/// asked up to five times (a daemon busy with a full resync under TCG can miss socat's 10 s
/// idle timeout, and an empty answer must not read as "no operations").
pub fn scrape(ns: &Netns, address: &str) -> anyhow::Result<String> {
    let mut last = String::new();
    for _ in 0..5 {
        let out = ns.sh(&format!(
            "printf 'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' | socat -T30 -t30 - TCP:{address}"
        ));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let status = text.lines().next().unwrap_or_default();
        if out.status.success() && status.starts_with("HTTP/1.") && status.contains(" 200") {
            return Ok(text);
        }
        last = format!(
            "status line {status:?}, socat: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    bail!("fetching metrics from {address} failed five times; last: {last}")
}

/// The samples of metric `name`, by their label text (quotes removed: `op=x,result=y`).
pub fn samples(text: &str, name: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = if let Some(rest) = rest.strip_prefix('{') {
            match rest.rsplit_once("} ") {
                Some((labels, value)) => (labels.replace('"', ""), value),
                None => continue,
            }
        } else if let Some(value) = rest.strip_prefix(' ') {
            (String::new(), value)
        } else {
            continue;
        };
        if let Ok(value) = value.trim().parse::<f64>() {
            out.insert(labels, value);
        }
    }
    out
}

/// `ipvs_proxier_netlink_operations_total` by `op,result`, as counts.
pub fn netlink_ops(text: &str) -> BTreeMap<String, u64> {
    samples(text, "ipvs_proxier_netlink_operations_total")
        .into_iter()
        .map(|(k, v)| (k, v as u64))
        .collect()
}

/// Per-label `after - before`, non-zero entries only.
pub fn delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Sum of the counts whose labels contain `result=error`.
pub fn failed(ops: &BTreeMap<String, u64>) -> u64 {
    ops.iter()
        .filter(|(k, _)| k.contains("result=error"))
        .map(|(_, v)| v)
        .sum()
}

/// `total (label=n, ...)`, or `none`.
pub fn describe(ops: &BTreeMap<String, u64>) -> String {
    if ops.is_empty() {
        return "none".into();
    }
    let total: u64 = ops.values().sum();
    let parts: Vec<String> = ops.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{total} ({})", parts.join(", "))
}

/// Per-label `a + b`: counts of two daemon lives (before and after a restart, whose
/// counters start again at zero).
pub fn add(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut sum = a.clone();
    for (k, v) in b {
        *sum.entry(k.clone()).or_default() += v;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_by_label() {
        let text = "# HELP x\nipvs_proxier_netlink_operations_total{op=\"add_service\",result=\"success\"} 12\nipvs_proxier_netlink_operations_total{op=\"add_service\",result=\"error\"} 1\nother 3\n";
        let ops = netlink_ops(text);
        assert_eq!(ops.get("op=add_service,result=success"), Some(&12));
        assert_eq!(failed(&ops), 1);
        assert_eq!(samples(text, "other").get(""), Some(&3.0));
    }
}
