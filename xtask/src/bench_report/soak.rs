//! The soak's sections of the benchmarks page: `vm-bench soak` (churn under traffic with
//! kube-proxy's full resync every 30 s), run and written alone by
//! `cargo xtask bench-report --soak-only`, and the same soak with faults (`--faults`: a
//! kill -9 and restart, an API outage, a 410 storm) and the same soak with the ClusterIPs
//! taken by one local route (`--bind-service-cidrs`), each in a section of its own; a full
//! `bench-report` keeps them as they are.

use std::fmt::Write as _;

use anyhow::Result;
use serde_json::Value;

use super::{Facts, met, num, thousands};

/// Where the section starts on the page.
pub const BEGIN: &str = "<!-- vm-bench soak -->";
/// Where it ends.
pub const END: &str = "<!-- /vm-bench soak -->";
/// Where the section of the soak with faults starts.
pub const FAULTS_BEGIN: &str = "<!-- vm-bench soak --faults -->";
/// Where it ends.
pub const FAULTS_END: &str = "<!-- /vm-bench soak --faults -->";

/// Where the section of the soak in route mode starts.
pub const ROUTED_BEGIN: &str = "<!-- vm-bench soak --bind-service-cidrs -->";
/// Where it ends.
pub const ROUTED_END: &str = "<!-- /vm-bench soak --bind-service-cidrs -->";

/// Whether the soak ran the daemon with `--bind-service-cidrs`.
fn routed(s: &Value) -> bool {
    s["bind_service_cidrs"].as_bool() == Some(true)
}

/// The markers of the section `s` belongs in: the soak's, the soak with faults', or the
/// soak in route mode's.
pub fn markers(s: &Value) -> (&'static str, &'static str) {
    if s.get("faults").is_some() {
        (FAULTS_BEGIN, FAULTS_END)
    } else if routed(s) {
        (ROUTED_BEGIN, ROUTED_END)
    } else {
        (BEGIN, END)
    }
}

/// The section of one `vm-bench soak` report, `facts` being its own run's.
pub fn section(facts: &Facts, s: &Value) -> Result<String> {
    let mut out = String::new();
    let (begin, end) = markers(s);
    let faults = s.get("faults").and_then(Value::as_array);
    let _ = writeln!(out, "{begin}");
    let _ = writeln!(
        out,
        "{}\n",
        if faults.is_some() {
            "## Restart under load: faults during the churn (`vm-bench soak --faults`)"
        } else if routed(s) {
            "## Churn with the ClusterIPs taken by one local route (`vm-bench soak --bind-service-cidrs`)"
        } else {
            "## Churn under traffic, full resyncs included (`vm-bench soak`)"
        }
    );
    let _ = writeln!(
        out,
        "This section alone was written by `{}`, run started {}, commit {}, guest kernel {}, {} MiB; the rest of the page comes from the runs its header and sections name.\n",
        facts.command, facts.date, facts.commit, facts.guest_kernel, facts.memory_mib
    );
    let _ = writeln!(
        out,
        "{} ClusterIP Services × {} endpoints, kube source, {}, a full resync every 30 s (kube-proxy's default), {} min of churn.\n",
        thousands(num(s, "services")?),
        num(s, "endpoints")?,
        if routed(s) {
            "the ClusterIP range taken by one local route (`--bind-service-cidrs`)"
        } else {
            "each ClusterIP bound on kube-ipvs0 (kube-proxy's way)"
        },
        num(s, "minutes")?
    );
    let (p99_goal, max_goal) = (
        num(s, "goals.change_p99_ms")?,
        num(s, "goals.change_max_ms")?,
    );
    let latency = |key: &str, slow: &str| -> Result<(String, bool)> {
        let (p50, p99, max) = (
            num(s, &format!("{key}.p50_ms"))?,
            num(s, &format!("{key}.p99_ms"))?,
            num(s, &format!("{key}.max_ms"))?,
        );
        Ok((
            format!(
                "p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms ({} changes, {} of them 250 ms or more)",
                num(s, &format!("{key}.count"))?,
                num(s, &format!("slow.{slow}"))?
            ),
            p99 <= p99_goal && max <= max_goal,
        ))
    };
    let goal = format!("p99 ≤ {p99_goal:.0} ms, max ≤ {max_goal:.0} ms");
    let _ = writeln!(
        out,
        "| figure | measured | goal | status |\n|---|---|---|---|"
    );
    let failed = num(s, "connections.failed")?;
    let _ = writeln!(
        out,
        "| connections to endpoints that stay | {} answered, {failed} failed | 0 failed | {} |",
        thousands(num(s, "connections.answered")?),
        met(failed == 0.0)
    );
    let (failed_ops, error_syncs) = (num(s, "kernel_ops.failed")?, num(s, "syncs.with_errors")?);
    let _ = writeln!(
        out,
        "| failed kernel ops | {failed_ops} of {} during the churn; {error_syncs} syncs with errors | 0 | {} |",
        thousands(num(s, "kernel_ops.during_churn")?),
        met(failed_ops == 0.0 && error_syncs == 0.0)
    );
    let growth = num(s, "rss_mib.growth")?;
    // Where the growth is: the heap and stacks, or pages of the binary run for the first time.
    let split = if s["rss_mib"]["anon_start"].is_number() {
        format!(
            "; of it, heap and stacks (`RssAnon`) {:.1} → {:.1}, mapped files, the binary's code among them (`RssFile`) {:.1} → {:.1}",
            num(s, "rss_mib.anon_start")?,
            num(s, "rss_mib.anon_end")?,
            num(s, "rss_mib.file_start")?,
            num(s, "rss_mib.file_end")?
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "| RSS, converged → end (each 3 s after a full sync) | {:.1} → {:.1} MiB ({:+.1} %{split}) | ≤ +{:.0} % | {} |",
        num(s, "rss_mib.start")?,
        num(s, "rss_mib.end")?,
        growth * 100.0,
        num(s, "goals.rss_growth")? * 100.0,
        met(growth <= num(s, "goals.rss_growth")?)
    );
    let (endpoint, endpoint_met) = latency("endpoint_change", "endpoint_change")?;
    let _ = writeln!(
        out,
        "| endpoint change → kernel | {endpoint} | {goal} | {} |",
        met(endpoint_met)
    );
    let (service, service_met) = latency("service_change", "service_change")?;
    let _ = writeln!(
        out,
        "| Service add + delete → kernel | {service} | {goal} | {} |",
        met(service_met)
    );
    if s["service_change_parts"]["until_first_sync"].is_object() {
        let parts = |key: &str| p50_p99(s, &format!("service_change_parts.{key}"));
        let slow = |key: &str| num(s, &format!("service_change_parts.slowest.{key}"));
        let _ = writeln!(
            out,
            "| where a Service add + delete's time went (each set against the daemon's syncs that started during it, from its log; {} changes) | until the first of those syncs started: {}; their address writes, added up: {}; the syncs, added up: {}; {} syncs (p50). The slowest 1 % ({}), on average: {:.1} ms, of it {:.1} ms until the first sync, {:.1} ms address writes, {:.1} ms in syncs | | |",
            thousands(num(s, "service_change_parts.changes")?),
            parts("until_first_sync")?,
            parts("address_writes")?,
            parts("syncs")?,
            num(s, "service_change_parts.syncs_per_change_p50")?,
            slow("count")?,
            slow("took_ms")?,
            slow("until_first_sync_ms")?,
            slow("address_writes_ms")?,
            slow("syncs_ms")?
        );
    }
    let p = |key: &str| p50_p99(s, &format!("incremental_sync.{key}"));
    if s["incremental_sync"]["total"].is_object() && s["incremental_sync"]["nftables"].is_object() {
        let _ = writeln!(
            out,
            "| an incremental sync, as the daemon times it | {}; its nftables update, when it has one: {} | | |",
            p("total")?,
            p("nftables")?
        );
    }
    if s["incremental_sync"]["adding_or_deleting_a_service"]["total"].is_object() {
        let phase = |phase: &str| p(&format!("adding_or_deleting_a_service.{phase}"));
        let _ = writeln!(
            out,
            "| a sync adding or deleting a Service, as the daemon times it | {}; of it, address writes {}, IPVS writes {} | | |",
            phase("total")?,
            phase("address_writes")?,
            phase("ipvs_writes")?
        );
    }
    if s["kernel_address_writes"].is_object() {
        let ms = |key: &str| num(s, &format!("kernel_address_writes.{key}"));
        let _ = writeln!(
            out,
            "| the kernel alone: one address write on kube-ipvs0 holding {} addresses (`ip -batch` of {} binds, then of their unbinds, after the churn, the daemon stopped) | bind {:.1} ms, unbind {:.1} ms; on an empty link of the same namespace {:.1} ms, {:.1} ms | | |",
            thousands(ms("addresses_held")?),
            ms("writes_timed")?,
            ms("bind_ms")?,
            ms("unbind_ms")?,
            ms("empty_link_bind_ms")?,
            ms("empty_link_unbind_ms")?
        );
    }
    let _ = writeln!(
        out,
        "| syncs | {} ({} full) | | |",
        thousands(num(s, "syncs.all")?),
        num(s, "syncs.full")?
    );
    out.push_str(TEXT);
    if s["kernel_address_writes"].is_object() {
        out.push_str(ADDRESS_WRITES_TEXT);
    }
    if let Some(faults) = faults {
        fault_table(&mut out, faults, s)?;
    }
    let _ = writeln!(out, "{end}");
    Ok(out)
}

/// "p50 X ms, p99 Y ms" of the percentiles at `key` of `s`.
fn p50_p99(s: &Value, key: &str) -> Result<String> {
    Ok(format!(
        "p50 {:.1} ms, p99 {:.1} ms",
        num(s, &format!("{key}.p50_ms"))?,
        num(s, &format!("{key}.p99_ms"))?
    ))
}

/// The faults, one row each, and the fresh start's comparison.
fn fault_table(out: &mut String, faults: &[Value], s: &Value) -> Result<()> {
    out.push_str(FAULTS_TEXT);
    let _ = writeln!(
        out,
        "\n| fault | at | endpoint changes during it | of them never in the kernel (goal 0) | next change in the kernel, after the fault's end | failed connections (goal 0) |\n|---|---|---|---|---|---|"
    );
    for fault in faults {
        let lost = num(fault, "lost")?;
        let failed = num(fault, "failed_connections")?;
        let _ = writeln!(
            out,
            "| {} | {:.0} s | {} | {lost} ({}) | {:.2} s | {failed} ({}) |",
            fault["fault"].as_str().unwrap_or("?"),
            num(fault, "at_s")?,
            num(fault, "changes")?,
            met(lost == 0.0),
            num(fault, "recovery_s")?,
            met(failed == 0.0)
        );
    }
    let differences = num(s, "fresh_start.missing")? + num(s, "fresh_start.leftover")?;
    let _ = writeln!(
        out,
        "\nAt the end, the kernel against a freshly started daemon's first full sync ({:.1} s): of its {} facts (IPVS rules, kube-ipvs0 addresses, nftables rules and set elements), {} were missing and {} were leftovers — {}.",
        num(s, "fresh_start.first_sync_s")?,
        thousands(num(s, "fresh_start.facts")?),
        num(s, "fresh_start.missing")?,
        num(s, "fresh_start.leftover")?,
        if differences == 0.0 {
            "no change was lost (goal met)"
        } else {
            "goal (0) not met"
        }
    );
    Ok(())
}

const TEXT: &str = "
After the first sync, for the given minutes: one endpoint of a Service without traffic is
replaced every 100 ms through the API double, timed until the kernel holds the new
destination; every second a Service (with its slice) is added and the previous one deleted,
timed until the kernel holds both changes; a client keeps connecting through the ClusterIPs of
10 Services whose endpoints never change, and each connection must be answered by a pod. Full
resyncs run every 30 s throughout: their kernel read runs beside the changes, and their repair
is compared and written in slices between them. The console of the run lists the 20 slowest
changes of 250 ms or more with their times, beside the daemon's full syncs.
";

const ADDRESS_WRITES_TEXT: &str = "
The kernel-alone row is a yardstick for the address write each Service added or deleted
makes: after the churn the daemon is stopped, and `ip -batch` binds addresses of the
benchmarking range (198.18.0.0/15) on kube-ipvs0 one request each, then unbinds them, and
does the same on an empty dummy link in the node's namespace. Whatever the program, the
kernel's work for each write grows with the addresses the link already holds; with
`--bind-service-cidrs` (its own section) a Service added or deleted writes no address.
";

const FAULTS_TEXT: &str = "
The faults land at fixed points of the churn while the client goes on connecting: the daemon
is killed with SIGKILL and started again 2 s later (changes go on while it is down); the API
double fails every request with 503 and cuts the watches for 30 s; every watch is ended with
410 Gone and the event history forgotten, once a second for 15 s. Endpoint changes go on,
one every 100 ms, through each fault without being waited for; after it, one more change is
timed to the kernel from the fault's end, and each change made during the fault must then
reach the kernel within 60 s. The latency figures above are those of the changes made outside
the faults (the first ones after the restart included); the connection and kernel-op figures
cover the whole run, both daemon lives; the RSS at the end is the restarted daemon's. After an
outage the watches come back on kube-runtime's backoff, which is client-go's: 0.8 s doubling
to at most 30 s, each wait stretched by a random share of up to as much again, so the first
change after a 30 s outage may wait up to about a minute, as with kube-proxy.
";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SOAK: &str = include_str!("../testdata/soak-report-300x3.json");

    /// The facts of a run made by `command`.
    fn facts(command: &str) -> Facts {
        Facts {
            command: command.into(),
            date: "2026-12-02 17:00 UTC".into(),
            commit: "0123456789ab".into(),
            guest_kernel: "6.1.0-57-cloud-amd64".into(),
            memory_mib: 6144,
            qemu: "QEMU".into(),
            host: "host".into(),
            load_at_start: "0.1".into(),
            run_times: Vec::new(),
        }
    }

    #[test]
    fn the_soak_section_shows_each_figure_against_its_goal() {
        // As bench-report finds it: the last report line on the console, named `soak`.
        let console = format!(
            "boot\r\nVM-BENCH-REPORT: {}\r\nVM-RUN-EXIT: 0\r\n",
            SOAK.trim()
        );
        let soak = super::super::extract_report(&console, "soak").unwrap();
        let facts =
            facts("cargo xtask bench-report --services 300 --dests 3 --soak-only --minutes 1");
        let section = section(&facts, &soak).unwrap();
        assert!(section.starts_with(BEGIN) && section.trim_end().ends_with(END));
        assert!(
            section.contains("300 ClusterIP Services × 3 endpoints"),
            "{section}"
        );
        assert!(
            section.contains("| 1,234 answered, 0 failed | 0 failed | met |"),
            "{section}"
        );
        // 40.0 -> 41.0 MiB is +2.5 %; the split, where the report has it.
        assert!(
            section.contains("| 40.0 → 41.0 MiB (+2.5 %; of it, heap and stacks (`RssAnon`) 28.0 → 28.2, mapped files, the binary's code among them (`RssFile`) 12.0 → 12.8) | ≤ +5 % | met |"),
            "{section}"
        );
        // The endpoint changes meet both goals; the Services' max does not.
        assert!(
            section.contains("p50 12.0 ms, p99 30.5 ms, max 120.0 ms (580 changes, 0 of them 250 ms or more) | p99 ≤ 50 ms, max ≤ 250 ms | met |"),
            "{section}"
        );
        assert!(
            section.contains("max 300.0 ms (58 changes, 1 of them 250 ms or more) | p99 ≤ 50 ms, max ≤ 250 ms | not met |"),
            "{section}"
        );
        assert!(
            section.contains(
                "| failed kernel ops | 0 of 1,500 during the churn; 0 syncs with errors | 0 | met |"
            ),
            "{section}"
        );
        assert!(
            section.contains("| p50 3.0 ms, p99 20.0 ms; its nftables update, when it has one: p50 60.0 ms, p99 90.0 ms |"),
            "{section}"
        );
        // The kernel's own address writes, rounded to a tenth of a millisecond.
        assert!(
            section.contains("on kube-ipvs0 holding 301 addresses (`ip -batch` of 200 binds,"),
            "{section}"
        );
        assert!(
            section.contains("| bind 0.8 ms, unbind 1.3 ms; on an empty link of the same namespace 0.5 ms, 0.6 ms |"),
            "{section}"
        );
        assert!(
            section.contains("The kernel-alone row is a yardstick"),
            "{section}"
        );
    }

    #[test]
    fn the_soak_with_faults_has_its_own_section_with_a_row_per_fault() {
        let report: Value =
            serde_json::from_str(include_str!("../testdata/soak-faults-report-300x3.json"))
                .unwrap();
        let plain: Value = serde_json::from_str(SOAK).unwrap();
        assert_eq!(markers(&report), (FAULTS_BEGIN, FAULTS_END));
        assert_eq!(markers(&plain), (BEGIN, END));
        let facts = facts("cargo xtask bench-report --soak-only --faults");
        let section = section(&facts, &report).unwrap();
        assert!(section.starts_with(FAULTS_BEGIN) && section.trim_end().ends_with(FAULTS_END));
        assert!(section.contains("`vm-bench soak --faults`"), "{section}");
        // Each fault against its goals: the outage lost 2 changes, the storm 1 connection.
        assert!(
            section.contains("| daemon killed (SIGKILL) mid-churn, started again 2 s later | 12 s | 20 | 0 (met) | 4.56 s | 0 (met) |"),
            "{section}"
        );
        assert!(
            section.contains(
                "| API server unreachable for 30 s | 27 s | 300 | 2 (not met) | 15.20 s | 0 (met) |"
            ),
            "{section}"
        );
        assert!(
            section.contains("| 150 | 0 (met) | 0.80 s | 1 (not met) |"),
            "{section}"
        );
        assert!(
            section.contains("(3.2 s): of its 2,345 facts (IPVS rules, kube-ipvs0 addresses, nftables rules and set elements), 0 were missing and 0 were leftovers — no change was lost (goal met)."),
            "{section}"
        );
        // Its report has no split of the RSS.
        assert!(section.contains("(+2.5 %) | ≤ +5 %"), "{section}");
        // Its report has no timing of the kernel's address writes: no row for it.
        assert!(!section.contains("the kernel alone"), "{section}");
        assert!(!section.contains("The kernel-alone row"), "{section}");
    }

    #[test]
    fn the_soak_in_route_mode_has_its_own_section_with_the_service_syncs_phases() {
        let mut report: Value = serde_json::from_str(SOAK).unwrap();
        report["bind_service_cidrs"] = true.into();
        let phase = |p50: f64, p99: f64| serde_json::json!({"count": 58, "p50_ms": p50, "p99_ms": p99, "max_ms": p99 + 1.0});
        report["incremental_sync"]["adding_or_deleting_a_service"] = serde_json::json!({
            "total": phase(9.5, 21.0),
            "address_writes": phase(0.0, 0.1),
            "ipvs_writes": phase(4.3, 12.0),
        });
        assert_eq!(markers(&report), (ROUTED_BEGIN, ROUTED_END));
        let facts = facts("cargo xtask bench-report --soak-only --bind-service-cidrs");
        let section = section(&facts, &report).unwrap();
        assert!(section.starts_with(ROUTED_BEGIN) && section.trim_end().ends_with(ROUTED_END));
        assert!(
            section.contains("`vm-bench soak --bind-service-cidrs`")
                && section.contains("taken by one local route"),
            "{section}"
        );
        assert!(
            section.contains("| a sync adding or deleting a Service, as the daemon times it | p50 9.5 ms, p99 21.0 ms; of it, address writes p50 0.0 ms, p99 0.1 ms, IPVS writes p50 4.3 ms, p99 12.0 ms | | |"),
            "{section}"
        );
        // Without the flag: the soak's own section, each ClusterIP an address.
        report["bind_service_cidrs"] = false.into();
        assert_eq!(markers(&report), (BEGIN, END));
        let plain = super::section(
            &self::facts("cargo xtask bench-report --soak-only"),
            &report,
        )
        .unwrap();
        assert!(plain.contains("bound on kube-ipvs0"), "{plain}");
    }

    #[test]
    fn a_report_that_sets_the_service_changes_against_the_syncs_shows_where_their_time_went() {
        let mut report: Value = serde_json::from_str(SOAK).unwrap();
        let facts = facts("cargo xtask bench-report --soak-only");
        // The older report has no such figures: no row.
        let without = section(&facts, &report).unwrap();
        assert!(!without.contains("where a Service add"), "{without}");
        let p = |p50: f64, p99: f64| serde_json::json!({"count": 57, "p50_ms": p50, "p99_ms": p99, "max_ms": p99 + 1.0});
        report["service_change_parts"] = serde_json::json!({
            "changes": 57,
            "until_first_sync": p(5.5, 11.0),
            "address_writes": p(18.6, 37.0),
            "syncs": p(24.0, 48.0),
            "syncs_per_change_p50": 2,
            "slowest": {
                "count": 1,
                "took_ms": 57.7,
                "until_first_sync_ms": 5.5,
                "address_writes_ms": 38.2,
                "syncs_ms": 48.1,
            },
        });
        let section = section(&facts, &report).unwrap();
        assert!(
            section.contains("| where a Service add + delete's time went (each set against the daemon's syncs that started during it, from its log; 57 changes) | until the first of those syncs started: p50 5.5 ms, p99 11.0 ms; their address writes, added up: p50 18.6 ms, p99 37.0 ms; the syncs, added up: p50 24.0 ms, p99 48.0 ms; 2 syncs (p50). The slowest 1 % (1), on average: 57.7 ms, of it 5.5 ms until the first sync, 38.2 ms address writes, 48.1 ms in syncs | | |"),
            "{section}"
        );
    }
}
