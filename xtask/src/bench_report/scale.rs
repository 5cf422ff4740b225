//! The scale section of the benchmarks page: `vm-bench proxier` with the kube source and
//! `--bind-service-cidrs`, once at 10,000 Services and once at the size asked for (50,000 by
//! the issue that wanted it), each in its own boot, run and written alone by
//! `cargo xtask bench-report --scale-only --services N`. Every figure is shown at both sizes
//! with its growth against the growth of the cluster, and the section names the figures that
//! grow worse than linearly, worst first.

use std::fmt::Write as _;

use anyhow::{Result, ensure};
use serde_json::Value;

use super::{Facts, PHASES, met, num, secs, thousands};
use crate::guest_kernel::KernelChoice;

/// Where the section starts on the page.
pub const BEGIN: &str = "<!-- vm-bench proxier scale -->";
/// Where it ends.
pub const END: &str = "<!-- /vm-bench proxier scale -->";

/// The markers of the section of a run on `kernel`: the host's kernel (6.1) has the plain
/// ones, each other kernel markers of its own, so the sections of the kernels stand side by
/// side on the page.
pub fn markers(kernel: KernelChoice) -> (String, String) {
    if kernel == KernelChoice::Bookworm {
        return (BEGIN.to_owned(), END.to_owned());
    }
    let name = kernel.name();
    (
        format!("<!-- vm-bench proxier scale {name} -->"),
        format!("<!-- /vm-bench proxier scale {name} -->"),
    )
}

/// The size the scale is judged from.
pub const BASE_SERVICES: usize = 10_000;

/// Goal: settled RSS at the large size at most this many times the 10,000 figure.
const GOAL_RSS_GROWTH: f64 = 5.0;
/// Goal: endpoint-change p99 at the large size at most this many times the 10,000 figure.
const GOAL_P99_GROWTH: f64 = 2.0;
/// A figure whose growth exceeds the cluster's by more than this factor is called worse
/// than linear (TCG timings move by about that much between boots).
const SUPERLINEAR_MARGIN: f64 = 1.25;

/// `vm-bench proxier`'s arguments for one size of the scale run.
pub fn proxier_args(
    services: usize,
    endpoints: usize,
    changes: usize,
    small: usize,
) -> Vec<String> {
    [
        "--services".to_owned(),
        services.to_string(),
        "--endpoints".to_owned(),
        endpoints.to_string(),
        "--changes".to_owned(),
        changes.to_string(),
        "--small".to_owned(),
        small.to_string(),
        "--source".to_owned(),
        "kube".to_owned(),
        "--bind-service-cidrs".to_owned(),
        "--dump-breakdown".to_owned(),
    ]
    .into()
}

/// One row: a figure at both sizes, and how it grows.
struct Row {
    name: String,
    base: f64,
    large: f64,
    /// Seconds (rendered with [`secs`]) or MiB.
    unit: Unit,
    /// Whether the figure should grow with the cluster at all (a change's latency should
    /// not: its growth is judged against 1).
    per_cluster: bool,
}

#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Mib,
    Millis,
}

impl Row {
    fn growth(&self) -> f64 {
        self.large / self.base
    }

    fn cell(&self, v: f64) -> String {
        match self.unit {
            Unit::Seconds => secs(v),
            Unit::Mib => format!("{v:.1} MiB"),
            Unit::Millis => format!("{v:.1} ms"),
        }
    }
}

/// The kube source's run of a `vm-bench proxier` report.
fn kube(p: &Value) -> Result<&Value> {
    let source = p["sources"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["source"] == "kube"));
    ensure!(source.is_some(), "the report has no kube-source run");
    ensure!(
        p["bind_service_cidrs"].as_bool() == Some(true),
        "the scale run must use --bind-service-cidrs"
    );
    Ok(source.unwrap_or(&Value::Null))
}

fn rows(base: &Value, large: &Value) -> Result<Vec<Row>> {
    let (b, l) = (kube(base)?, kube(large)?);
    let mut rows = Vec::new();
    let mut both = |name: &str, bv: f64, lv: f64, unit: Unit, per_cluster: bool| {
        rows.push(Row {
            name: name.to_owned(),
            base: bv,
            large: lv,
            unit,
            per_cluster,
        });
    };
    both(
        "reference: `ipvsadm -R` of the table",
        num(base, "floors.ipvsadm_restore_s")?,
        num(large, "floors.ipvsadm_restore_s")?,
        Unit::Seconds,
        true,
    );
    both(
        "floor: the library's `batch` of the table",
        num(base, "floors.library_batch_s")?,
        num(large, "floors.library_batch_s")?,
        Unit::Seconds,
        true,
    );
    both(
        "daemon: start → programmed",
        num(b, "program_s")?,
        num(l, "program_s")?,
        Unit::Seconds,
        true,
    );
    for phase in PHASES {
        let (Some(bv), Some(lv)) = (
            b["first_sync"][phase].as_f64(),
            l["first_sync"][phase].as_f64(),
        ) else {
            continue;
        };
        // Phases of a few milliseconds are noise at either size.
        if bv.max(lv) < 0.05 {
            continue;
        }
        both(
            &format!("daemon: first sync, {phase}"),
            bv,
            lv,
            Unit::Seconds,
            true,
        );
    }
    both(
        VERIFIED_TABLE,
        num(b, "dump_table_s")?,
        num(l, "dump_table_s")?,
        Unit::Seconds,
        true,
    );
    // The parts of a read, timed alone on the same kernel (`--dump-breakdown`; absent from
    // reports of runs before it).
    for (name, key) in DUMP_PARTS {
        if let (Some(bv), Some(lv)) = (b["dump_parts"][key].as_f64(), l["dump_parts"][key].as_f64())
        {
            both(name, bv, lv, Unit::Seconds, true);
        }
    }
    both(
        "daemon: restart adoption (0 writes)",
        num(b, "adoption_s")?,
        num(l, "adoption_s")?,
        Unit::Seconds,
        true,
    );
    both(
        "daemon: RSS 2 s after programmed",
        num(b, "rss_mib")?,
        num(l, "rss_mib")?,
        Unit::Mib,
        true,
    );
    both(
        "daemon: peak RSS (first sync)",
        num(b, "peak_rss_mib")?,
        num(l, "peak_rss_mib")?,
        Unit::Mib,
        true,
    );
    both(
        "daemon: one endpoint change, event → kernel, p50",
        num(b, "changes.p50_ms")?,
        num(l, "changes.p50_ms")?,
        Unit::Millis,
        false,
    );
    both(
        "daemon: one endpoint change, event → kernel, p99",
        num(b, "changes.p99_ms")?,
        num(l, "changes.p99_ms")?,
        Unit::Millis,
        false,
    );
    Ok(rows)
}

/// The row of the library's verified read of the programmed table.
const VERIFIED_TABLE: &str = "library: verified `table()` of the programmed kernel";

/// The table-read rows of `--dump-breakdown`: name, key under `dump_parts`.
const DUMP_PARTS: [(&str, &str); 3] = [
    (
        "library: one service dump alone (no destinations)",
        "services_s",
    ),
    ("library: best-effort table read", "best_effort_s"),
    (
        "reference: `ipvsadm -Sn` of the programmed kernel",
        "ipvsadm_s",
    ),
];

/// What the reads' growth says, when the run timed their parts: how much longer than linear
/// growth from the base size would give each read took (seconds: the readers differ by a
/// factor of five in size, so their ratios hide a cost they all pay), and the kernel's
/// structure behind it (`None` without the parts).
fn reading_the_table(rows: &[Row], scale: f64) -> Option<String> {
    let beyond = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .map(|r| match r.large - scale * r.base {
                more if more > 0.0 => secs(more),
                _ => "nothing".to_owned(),
            })
    };
    let verified = beyond(VERIFIED_TABLE)?;
    let services = beyond(DUMP_PARTS[0].0)?;
    let best_effort = beyond(DUMP_PARTS[1].0)?;
    let ipvsadm = beyond(DUMP_PARTS[2].0)?;
    Some(format!(
        "Reading the table: beyond what linear growth from the smaller size would give, `ipvsadm -Sn` took {ipvsadm} more, the verified `table()` {verified}, the best-effort read {best_effort}, one service dump alone {services}. \
         Every reader pays such a cost, which is the kernel's: it resumes a service dump that \
         spans many messages by walking the namespace's service table from its first service \
         for each message (`ip_vs_genl_dump_services` in `net/netfilter/ipvs/ip_vs_ctl.c`; the \
         table has a fixed 256 buckets, `IP_VS_SVC_TAB_BITS` 8, in this guest's kernel), so a \
         dump's walking grows with the table's size times the number of its messages. The \
         library asks for the largest messages the kernel makes (32 KiB); the verified read makes \
         two service dumps more than the best-effort one \
         (`ipvs_netlink::IpvsHandle::table_verified`).\n"
    ))
}

/// Whether a kernel release (`6.12.117+deb13-cloud-amd64`) estimates IPVS rates in kernel
/// threads, a slice of the estimators at a time (from 6.2), rather than in one timer walk.
fn estimates_in_kthreads(release: &str) -> bool {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    (major, minor) >= (6, 2)
}

/// The slowest endpoint changes of the large run, with when each was made (absent from
/// reports of runs before they were kept), and what spaces them on `kernel` (the guest's
/// release).
fn slowest_changes(run: &Value, services: f64, kernel: &str) -> Option<String> {
    let slowest = run["slowest_changes"].as_array()?;
    let listed: Vec<String> = slowest
        .iter()
        .filter_map(|c| {
            Some(format!(
                "#{} made {:.2} s after the first, {:.1} ms",
                c["index"].as_u64()?,
                c["at_s"].as_f64()?,
                c["ms"].as_f64()?
            ))
        })
        .collect();
    if listed.is_empty() {
        return None;
    }
    let estimation = if estimates_in_kthreads(kernel) {
        format!(
            "this guest's kernel ({kernel}) estimates rates in kernel threads, a slice of the \
             estimators at a time (from 6.2), so a change does not wait for a walk of every \
             estimator as on kernels before 6.2, whose timer walks every service's and \
             destination's estimator in one go every 2 seconds under the lock those need"
        )
    } else {
        format!(
            "the kernel of this guest ({kernel}) takes the lock those need for the whole of its \
             rate estimation, which walks every service's and destination's estimator in one go \
             every 2 seconds (`estimation_timer`); kernels from 6.2 estimate in kernel threads, \
             a slice of the estimators at a time"
        )
    };
    Some(format!(
        "The slowest endpoint changes at {}: {}. \
         A change that replaces an endpoint adds and deletes an IPVS destination, and \
         {estimation} (`net/netfilter/ipvs/ip_vs_est.c`; 300,000 estimators at 50,000 \
         Services × 5). `vm-bench proxier --no-rate-estimation` runs the same benchmark with \
         `net.ipv4.vs.run_estimation=0` in the daemon's namespace, to tell the two apart.\n",
        thousands(services),
        listed.join("; ")
    ))
}

/// The section from the two `vm-bench proxier` reports (10,000 Services, then the large
/// size) and, when run, the large size's again with the kernel's rate estimation off
/// (`quiet`), `facts` being this run's.
pub fn section(
    facts: &Facts,
    base: &Value,
    large: &Value,
    quiet: Option<&Value>,
    kernel: KernelChoice,
) -> Result<String> {
    let (begin, end) = markers(kernel);
    let base_services = num(base, "services")?;
    let services = num(large, "services")?;
    ensure!(
        services > base_services,
        "the scale run's size ({services}) must exceed {base_services}"
    );
    let scale = services / base_services;
    let rows = rows(base, large)?;
    let (boots, third) = match quiet {
        Some(_) => (
            "Three boots",
            ", and the larger again without the kernel's IPVS rate estimation (below)",
        ),
        None => ("Two boots", ""),
    };
    let mut out = String::new();
    let _ = writeln!(out, "{begin}");
    let _ = writeln!(
        out,
        "## At {} Services, kernel {} (`vm-bench proxier --services {} --source kube --bind-service-cidrs`)\n",
        thousands(services),
        kernel.name(),
        services
    );
    let _ = writeln!(
        out,
        "This section alone was written by `{}`, run started {}, commit {}, guest kernel {}, {} MiB; the rest of the page comes from the runs its header and sections name. {}: the same benchmark at {} and at {} Services × {} endpoints, kube source, the daemon taking the ClusterIP range with one local route (`--bind-service-cidrs`, as the reference and the floor do in these runs){}.\n",
        facts.command,
        facts.date,
        facts.commit,
        facts.guest_kernel,
        facts.memory_mib,
        boots,
        thousands(base_services),
        thousands(services),
        num(large, "endpoints")?,
        third
    );
    let _ = writeln!(
        out,
        "| figure | at {} | at {} | growth (the cluster: {scale:.1} ×) |\n|---|---|---|---|",
        thousands(base_services),
        thousands(services)
    );
    for row in &rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} × |",
            row.name,
            row.cell(row.base),
            row.cell(row.large),
            row.growth()
        );
    }
    let rss = rows
        .iter()
        .find(|r| r.name == "daemon: RSS 2 s after programmed")
        .map_or(f64::NAN, Row::growth);
    let p99 = rows
        .iter()
        .find(|r| r.name == "daemon: one endpoint change, event → kernel, p99")
        .map_or(f64::NAN, Row::growth);
    let _ = writeln!(
        out,
        "\n| goal at {} | figure | status |\n|---|---|---|",
        thousands(services)
    );
    let _ = writeln!(
        out,
        "| settled RSS ≤ {GOAL_RSS_GROWTH} × the {} figure | {rss:.2} × | {} |",
        thousands(base_services),
        met(rss <= GOAL_RSS_GROWTH)
    );
    let _ = writeln!(
        out,
        "| endpoint change p99 ≤ {GOAL_P99_GROWTH} × the {} figure | {p99:.2} × | {} |\n",
        thousands(base_services),
        met(p99 <= GOAL_P99_GROWTH)
    );

    // Worse than linear: a figure of the cluster's size growing by more than the cluster
    // (with a margin for TCG's noise), a change's latency growing at all beyond the margin.
    let mut worse: Vec<(&Row, f64)> = rows
        .iter()
        .map(|r| {
            let expected = if r.per_cluster { scale } else { 1.0 };
            (r, r.growth() / expected)
        })
        .filter(|(_, excess)| *excess > SUPERLINEAR_MARGIN)
        .collect();
    worse.sort_by(|a, b| b.1.total_cmp(&a.1));
    if worse.is_empty() {
        let _ = writeln!(
            out,
            "Nothing grows worse than linearly (every figure of the cluster's size within {SUPERLINEAR_MARGIN} × of the cluster's growth; a change's latency within {SUPERLINEAR_MARGIN} × of flat).\n"
        );
    } else {
        let _ = writeln!(
            out,
            "Worse than linear, worst first (growth over what linear would give; a change's latency should stay flat):\n"
        );
        for (row, excess) in worse {
            let _ = writeln!(
                out,
                "- {}: {:.2} × {}",
                row.name,
                excess,
                if row.per_cluster { "linear" } else { "flat" }
            );
        }
        out.push('\n');
    }
    if let Some(text) = reading_the_table(&rows, scale) {
        let _ = writeln!(out, "{text}");
    }
    if let Some(text) = slowest_changes(kube(large)?, services, &facts.guest_kernel) {
        let _ = writeln!(out, "{text}");
    }
    if let Some(quiet) = quiet {
        ensure!(
            quiet["no_rate_estimation"].as_bool() == Some(true)
                && num(quiet, "services")? == services,
            "the third scale run must be the large size with --no-rate-estimation"
        );
        let run = kube(quiet)?;
        let _ = writeln!(
            out,
            "The same benchmark at {} in a third boot, with `net.ipv4.vs.run_estimation=0` in the daemon's namespace: one endpoint change p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({:.2} × the {} figure with estimation on).\n",
            thousands(services),
            num(run, "changes.p50_ms")?,
            num(run, "changes.p99_ms")?,
            num(run, "changes.max_ms")?,
            num(run, "changes.p99_ms")? / num(kube(base)?, "changes.p99_ms")?,
            thousands(base_services)
        );
    }
    out.push_str(SCALE_TEXT);
    let _ = writeln!(out, "{end}");
    Ok(out)
}

const SCALE_TEXT: &str = "\
What the rows measure: as in the daemon's section above, at two sizes in two boots of the same
VM. The address mode (one address per ClusterIP on `kube-ipvs0`) is not run at this size: the
kernel's cost of binding addresses on one link grows with the addresses already there (see
`--bind-service-cidrs` in docs/migration.md), so there the IPVS table is no longer what a
start waits for.
";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(services: f64, program: f64, rss: f64, p99: f64) -> Value {
        json!({
            "bench": "proxier",
            "services": services,
            "endpoints": 5,
            "bind_service_cidrs": true,
            "floors": {"ipvsadm_restore_s": services / 1000.0, "library_batch_s": services / 5000.0},
            "sources": [{
                "source": "kube",
                "program_s": program,
                "first_sync": {"sync total": program / 2.0, "diff": 0.001},
                "dump_table_s": services / 2000.0,
                "adoption_s": services / 1000.0,
                "rss_mib": rss,
                "peak_rss_mib": rss * 2.0,
                "changes": {"p50_ms": 10.0, "p99_ms": p99},
            }],
        })
    }

    fn facts() -> Facts {
        Facts {
            command: "cargo xtask bench-report --scale-only --services 50000".into(),
            date: "2026-12-03 07:00 UTC".into(),
            commit: "abc".into(),
            guest_kernel: "6.1".into(),
            memory_mib: 12288,
            qemu: "q".into(),
            host: "h".into(),
            load_at_start: "0".into(),
            run_times: Vec::new(),
        }
    }

    #[test]
    fn the_parts_of_a_read_get_rows_and_the_paragraph_that_compares_their_growth() {
        let with_parts = |services: f64, parts: [f64; 3]| {
            let mut r = report(services, services / 1000.0, 70.0, 40.0);
            r["sources"][0]["dump_parts"] = json!({
                "services_s": parts[0], "best_effort_s": parts[1], "ipvsadm_s": parts[2],
            });
            r
        };
        let base = with_parts(10_000.0, [0.1, 1.0, 6.0]);
        let large = with_parts(50_000.0, [2.5, 7.0, 45.0]);
        let section = section(&facts(), &base, &large, None, KernelChoice::Bookworm).unwrap();
        assert!(
            section.contains(
                "| reference: `ipvsadm -Sn` of the programmed kernel | 6.00 s | 45.0 s | 7.50 × |"
            ),
            "{section}"
        );
        assert!(
            section.contains("`ipvsadm -Sn` took 15.0 s more, the verified `table()` nothing, the best-effort read 2.00 s, one service dump alone 2.00 s."),
            "{section}"
        );
        let worse = section.split("worst first").nth(1).unwrap();
        assert!(
            worse.contains("- library: one service dump alone (no destinations): 5.00 × linear")
        );

        // Reports without the parts: no rows, no paragraph.
        let plain = super::section(
            &facts(),
            &report(10_000.0, 10.0, 70.0, 40.0),
            &report(50_000.0, 50.0, 300.0, 40.0),
            None,
            KernelChoice::Bookworm,
        )
        .unwrap();
        assert!(!plain.contains("ipvsadm -Sn") && !plain.contains("Reading the table"));
    }

    #[test]
    fn what_spaces_the_slowest_changes_is_told_from_the_guests_kernel() {
        assert!(!estimates_in_kthreads("5.10.0-32-cloud-amd64"));
        assert!(!estimates_in_kthreads("6.1.0-57-cloud-amd64"));
        assert!(estimates_in_kthreads("6.2.0"));
        assert!(estimates_in_kthreads("6.12.117+deb13-cloud-amd64"));
        let run = json!({"slowest_changes": [{"index": 3, "at_s": 0.5, "ms": 20.0}]});
        let old = slowest_changes(&run, 50_000.0, "6.1.0-57-cloud-amd64").unwrap();
        assert!(
            old.contains("the kernel of this guest (6.1.0-57-cloud-amd64) takes the lock"),
            "{old}"
        );
        let new = slowest_changes(&run, 50_000.0, "6.12.117+deb13-cloud-amd64").unwrap();
        assert!(
            new.contains(
                "this guest's kernel (6.12.117+deb13-cloud-amd64) estimates rates in kernel threads"
            ),
            "{new}"
        );
        assert!(!new.contains("the kernel of this guest"), "{new}");
    }

    #[test]
    fn the_slowest_changes_and_the_run_without_rate_estimation_are_told() {
        let base = report(10_000.0, 10.0, 70.0, 40.0);
        let mut large = report(50_000.0, 50.0, 300.0, 150.0);
        large["sources"][0]["slowest_changes"] = json!([
            {"index": 83, "at_s": 2.8, "ms": 176.7},
            {"index": 26, "at_s": 0.9, "ms": 166.2},
        ]);
        let mut quiet = report(50_000.0, 50.0, 300.0, 30.0);
        quiet["no_rate_estimation"] = json!(true);
        quiet["sources"][0]["changes"]["max_ms"] = json!(31.0);
        let text = section(
            &facts(),
            &base,
            &large,
            Some(&quiet),
            KernelChoice::Bookworm,
        )
        .unwrap();
        assert!(
            text.contains("The slowest endpoint changes at 50,000: #83 made 2.80 s after the first, 176.7 ms; #26 made 0.90 s after the first, 166.2 ms."),
            "{text}"
        );
        assert!(
            text.contains("one endpoint change p50 10.0 ms, p99 30.0 ms, max 31.0 ms (0.75 × the 10,000 figure with estimation on)"),
            "{text}"
        );
        // A third run that is not the large size without estimation is refused.
        assert!(text.contains("Three boots:"), "{text}");
        assert!(
            section(
                &facts(),
                &base,
                &large,
                Some(&large),
                KernelChoice::Bookworm
            )
            .is_err()
        );
    }

    #[test]
    fn the_scale_section_names_what_grows_worse_than_linearly_worst_first() {
        // Start grows 10 x for a 5 x cluster, the p99 3 x where it should stay flat.
        let section = section(
            &facts(),
            &report(10_000.0, 10.0, 70.0, 40.0),
            &report(50_000.0, 100.0, 300.0, 120.0),
            None,
            KernelChoice::Bookworm,
        )
        .unwrap();
        assert!(section.starts_with(BEGIN) && section.trim_end().ends_with(END));
        assert!(
            section.contains("| daemon: start → programmed | 10.0 s | 100 s | 10.00 × |"),
            "{section}"
        );
        assert!(
            section.contains("| settled RSS ≤ 5 × the 10,000 figure | 4.29 × | met |"),
            "{section}"
        );
        assert!(
            section.contains("| endpoint change p99 ≤ 2 × the 10,000 figure | 3.00 × | not met |"),
            "{section}"
        );
        let worse = section.split("worst first").nth(1).unwrap();
        let p99 = worse.find("p99: 3.00 × flat").unwrap();
        let start = worse.find("start → programmed: 2.00 × linear").unwrap();
        let sync = worse.find("sync total: 2.00 × linear").unwrap();
        assert!(p99 < start && p99 < sync, "{worse}");
        // Linear figures and millisecond phases are not named.
        assert!(!worse.contains("ipvsadm"), "{worse}");
        assert!(!section.contains("diff"), "{section}");
    }

    #[test]
    fn a_scale_run_without_route_mode_or_below_the_base_is_refused() {
        let mut address_mode = report(50_000.0, 1.0, 1.0, 1.0);
        address_mode["bind_service_cidrs"] = json!(false);
        assert!(
            section(
                &facts(),
                &report(10_000.0, 1.0, 1.0, 1.0),
                &address_mode,
                None,
                KernelChoice::Bookworm
            )
            .is_err()
        );
        let small = report(5_000.0, 1.0, 1.0, 1.0);
        assert!(
            section(
                &facts(),
                &report(10_000.0, 1.0, 1.0, 1.0),
                &small,
                None,
                KernelChoice::Bookworm
            )
            .is_err()
        );
    }
}
