//! `cargo xtask bench-report`: runs the VM benchmarks (`vm-bench ipvs`, `vm-bench proxier`,
//! then `vm-bench traffic`, one boot each; with `--traffic-only` the last alone, rewriting
//! only its section; with `--soak-only` the soak alone, into its own section; with
//! `--scale-only` the daemon's bench at 10,000 and at `--services` Services, into its own
//! section), reads the machine-readable report each prints on its last line
//! (`VM-BENCH-REPORT: {json}`, see `tests/src/bench/report.rs`) from the VM's console, and
//! writes `docs/benchmarks.md`: the command, date, sizes, kernel and host, the figures with
//! their same-run ratios, and a fixed text on what each row measures. No number on that page
//! is typed by hand.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::guest_kernel::KernelChoice;
use crate::vm::{self, VmConfig};
use crate::workspace::Workspace;

mod scale;
mod soak;

/// What starts a benchmark's report line on the console (`tests/src/bench/report.rs`).
pub const REPORT_MARKER: &str = "VM-BENCH-REPORT:";

/// Sizes and output of one `bench-report` run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Virtual services (ClusterIP Services for the daemon).
    pub services: usize,
    /// Destinations per service (endpoints per Service for the daemon).
    pub dests: usize,
    /// Endpoint changes timed through the API double.
    pub changes: usize,
    /// Services of the small cluster the changes are also timed on.
    pub small: usize,
    /// Where the page goes (relative paths: from the workspace root).
    pub output: PathBuf,
    /// Run `vm-bench traffic` alone and rewrite only its section of the page.
    pub traffic_only: bool,
    /// Run `vm-bench soak` alone and rewrite only its section of the page.
    pub soak_only: bool,
    /// How long the soak churns, in minutes.
    pub minutes: f64,
    /// Inject faults into the soak (`vm-bench soak --faults`); its section is its own.
    pub faults: bool,
    /// Run the soak with `--bind-service-cidrs` (ClusterIPs by one local route); its section
    /// is its own.
    pub bind_service_cidrs: bool,
    /// Run `vm-bench proxier` (kube source, `--bind-service-cidrs`) at 10,000 and at
    /// `services` Services and rewrite only the scale section of the page.
    pub scale_only: bool,
}

/// Facts about the run that go into the page's header.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// The command line that made the page.
    pub command: String,
    /// When the run started (UTC).
    pub date: String,
    /// The commit measured (`-dirty` when the tree had changes).
    pub commit: String,
    /// The guest kernel's release.
    pub guest_kernel: String,
    /// Guest memory.
    pub memory_mib: u32,
    /// qemu's version line.
    pub qemu: String,
    /// The host: kernel, CPU model, CPUs.
    pub host: String,
    /// Load average when the run started.
    pub load_at_start: String,
    /// How long each benchmark ran in the guest (`VM-RUN: took`), and its whole VM run
    /// (build, boot, run).
    pub run_times: Vec<(String, Option<Duration>, Duration)>,
}

/// `cargo xtask bench-report`.
pub fn run(options: &Options, config: &VmConfig) -> Result<ExitCode> {
    let workspace = Workspace::locate()?;
    let output = if options.output.is_absolute() {
        options.output.clone()
    } else {
        workspace.root.join(&options.output)
    };
    let mut facts = Facts {
        command: command_line(options, config),
        date: output_of("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "?".into()),
        commit: commit(&workspace.root),
        guest_kernel: crate::guest_kernel::resolve(config.kernel, &workspace.vm_dir())?.version,
        memory_mib: config.memory_mib,
        qemu: output_of("qemu-system-x86_64", &["--version"])
            .and_then(|v| v.lines().next().map(str::to_owned))
            .unwrap_or_else(|| "?".into()),
        host: host(),
        load_at_start: std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "?".into()),
        run_times: Vec::new(),
    };
    let (s, d) = (options.services.to_string(), options.dests.to_string());
    let ipvs_args = ["--services", &s, "--dests", &d].map(str::to_owned);
    let (changes, small) = (options.changes.to_string(), options.small.to_string());
    let proxier_args = [
        "--services",
        &s,
        "--endpoints",
        &d,
        "--changes",
        &changes,
        "--small",
        &small,
        "--source",
        "all",
    ]
    .map(str::to_owned);
    let traffic_args = ["--services", &s, "--endpoints", &d].map(str::to_owned);
    let minutes = options.minutes.to_string();
    let mut soak_args: Vec<String> = ["--services", &s, "--endpoints", &d, "--minutes", &minutes]
        .map(str::to_owned)
        .into();
    if options.faults {
        soak_args.push("--faults".to_owned());
    }
    if options.bind_service_cidrs {
        soak_args.push("--bind-service-cidrs".to_owned());
    }
    let mut scale_args = [
        scale::proxier_args(
            scale::BASE_SERVICES,
            options.dests,
            options.changes,
            options.small,
        ),
        scale::proxier_args(
            options.services,
            options.dests,
            options.changes,
            options.small,
        ),
        scale::proxier_args(
            options.services,
            options.dests,
            options.changes,
            options.small,
        ),
    ];
    // The large size again with the kernel's IPVS rate estimation off: whose the changes'
    // tail is.
    scale_args[2].push("--no-rate-estimation".to_owned());
    let runs: Vec<(&str, &[String])> = if options.traffic_only {
        vec![("traffic", &traffic_args[..])]
    } else if options.scale_only {
        ensure!(
            options.services > scale::BASE_SERVICES,
            "--scale-only compares with {} Services: ask for more with --services",
            scale::BASE_SERVICES
        );
        vec![
            ("proxier", &scale_args[0][..]),
            ("proxier", &scale_args[1][..]),
            ("proxier", &scale_args[2][..]),
        ]
    } else if options.soak_only {
        vec![("soak", &soak_args[..])]
    } else {
        vec![
            ("ipvs", &ipvs_args[..]),
            ("proxier", &proxier_args[..]),
            ("traffic", &traffic_args[..]),
        ]
    };
    let mut reports = Vec::new();
    for (name, args) in runs {
        println!("xtask: bench-report: vm-bench {name} {}", args.join(" "));
        let started = Instant::now();
        let code = vm::vm_bench(name, args, config)?;
        let console_path = workspace.vm_dir().join("last-console.log");
        let console = std::fs::read_to_string(&console_path)
            .with_context(|| format!("reading {}", console_path.display()))?;
        facts
            .run_times
            .push((name.to_owned(), guest_run_time(&console), started.elapsed()));
        if code != ExitCode::SUCCESS {
            bail!(
                "vm-bench {name} failed (console in {}); {} not written",
                console_path.display(),
                output.display()
            );
        }
        reports.push(extract_report(&console, name)?);
    }
    let old_page = std::fs::read_to_string(&output);
    let page = if options.traffic_only || options.soak_only || options.scale_only {
        let page = old_page
            .with_context(|| format!("reading {} to rewrite one section", output.display()))?;
        if options.scale_only {
            let (begin, end) = scale::markers(config.kernel);
            splice(
                &page,
                &begin,
                &end,
                &scale::section(
                    &facts,
                    &reports[0],
                    &reports[1],
                    reports.get(2),
                    config.kernel,
                )?,
            )
        } else if options.traffic_only {
            splice(
                &page,
                TRAFFIC_BEGIN,
                TRAFFIC_END,
                &traffic_section(Some(&facts), &reports[0])?,
            )
        } else {
            let (begin, end) = soak::markers(&reports[0]);
            splice(&page, begin, end, &soak::section(&facts, &reports[0])?)
        }
    } else {
        let page = render(&facts, &reports[0], &reports[1], &reports[2])?;
        // The soak's and the scale's sections, each from its own run, stay.
        let old_page = old_page.unwrap_or_default();
        let mut kept: Vec<(String, String)> = [
            (soak::BEGIN, soak::END),
            (soak::FAULTS_BEGIN, soak::FAULTS_END),
            (soak::ROUTED_BEGIN, soak::ROUTED_END),
        ]
        .into_iter()
        .map(|(begin, end)| (begin.to_owned(), end.to_owned()))
        .collect();
        kept.extend(
            [
                KernelChoice::Bookworm,
                KernelChoice::Trixie,
                KernelChoice::Bullseye,
            ]
            .into_iter()
            .map(scale::markers),
        );
        kept.into_iter().fold(page, |page, (begin, end)| {
            match section_of(&old_page, &begin, &end) {
                Some(kept) => splice(&page, &begin, &end, kept),
                None => page,
            }
        })
    };
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&output, page).with_context(|| format!("writing {}", output.display()))?;
    println!("xtask: bench-report: wrote {}", output.display());
    Ok(ExitCode::SUCCESS)
}

/// The command as a user would type it again (defaults left out).
fn command_line(options: &Options, config: &VmConfig) -> String {
    let mut command = format!(
        "cargo xtask bench-report --services {} --dests {}",
        options.services, options.dests
    );
    if options.changes != 100 {
        let _ = write!(command, " --changes {}", options.changes);
    }
    if options.small != 100 {
        let _ = write!(command, " --small {}", options.small);
    }
    if config.memory_mib != DEFAULT_MEMORY_MIB {
        let _ = write!(command, " --memory-mib {}", config.memory_mib);
    }
    if options.traffic_only {
        command.push_str(" --traffic-only");
    }
    if options.soak_only {
        let _ = write!(command, " --soak-only --minutes {}", options.minutes);
    }
    if options.faults {
        command.push_str(" --faults");
    }
    if options.bind_service_cidrs {
        command.push_str(" --bind-service-cidrs");
    }
    if options.scale_only {
        command.push_str(" --scale-only");
    }
    if config.kernel != crate::guest_kernel::KernelChoice::Bookworm {
        let _ = write!(command, " --kernel {}", config.kernel.name());
    }
    command
}

/// The guest memory `bench-report` asks for by default: the daemon bench at 10,000 x 5
/// needs more than the VM's usual 2 GiB (the reference table, the API double and the
/// daemon share the guest).
pub const DEFAULT_MEMORY_MIB: u32 = 6144;

fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn commit(root: &Path) -> String {
    let root = root.to_string_lossy();
    let Some(hash) = output_of("git", &["-C", &root, "rev-parse", "--short=12", "HEAD"]) else {
        return "?".into();
    };
    let dirty = output_of("git", &["-C", &root, "status", "--porcelain"])
        .is_some_and(|s| s.lines().any(|l| !l.starts_with("??")));
    if dirty { format!("{hash}-dirty") } else { hash }
}

fn host() -> String {
    let kernel = output_of("uname", &["-sr"]).unwrap_or_else(|| "?".into());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == "model name").then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{kernel}, {model}, {cpus} CPUs")
}

/// How long the benchmark ran in the guest: the runner's `VM-RUN: took 42.675s` line.
fn guest_run_time(console: &str) -> Option<Duration> {
    console.lines().find_map(|l| {
        let took = l.split_once("VM-RUN: took ")?.1.trim().strip_suffix('s')?;
        Duration::try_from_secs_f64(took.parse().ok()?).ok()
    })
}

/// The report line of benchmark `name` in a console log.
pub fn extract_report(console: &str, name: &str) -> Result<Value> {
    let line = console
        .lines()
        .rev()
        .find_map(|l| Some(l.split_once(REPORT_MARKER)?.1.trim()))
        .with_context(|| format!("vm-bench {name} printed no {REPORT_MARKER} line"))?;
    let report: Value =
        serde_json::from_str(line).with_context(|| format!("vm-bench {name}'s report"))?;
    ensure!(
        report["bench"] == name,
        "the report found is not vm-bench {name}'s: {line}"
    );
    Ok(report)
}

/// A number of the report at `path` (`a.b.c`).
fn num(report: &Value, path: &str) -> Result<f64> {
    let mut value = report;
    for key in path.split('.') {
        value = &value[key];
    }
    value
        .as_f64()
        .with_context(|| format!("the report has no number at {path}"))
}

/// The numbers of the array at `key`, when the report has one.
fn runs_of(report: &Value, key: &str) -> Option<Vec<f64>> {
    report[key].as_array()?.iter().map(Value::as_f64).collect()
}

/// Seconds as `1.23, 1.25, 1.31 s`.
fn list_secs(runs: &[f64]) -> String {
    let parts: Vec<String> = runs.iter().map(|s| format!("{s:.2}")).collect();
    format!("{} s", parts.join(", "))
}

/// `12,345`.
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds with about three significant digits (milliseconds under 0.1 s).
fn secs(s: f64) -> String {
    if s < 0.1 {
        format!("{:.1} ms", s * 1e3)
    } else if s >= 100.0 {
        format!("{s:.0} s")
    } else if s >= 10.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.2} s")
    }
}

fn ratio(r: f64) -> String {
    format!("{r:.3}")
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "not met" }
}

/// A goal's status over the sources (name, met): "met" or "not met" when all agree, else
/// each source's.
fn met_by(verdicts: &[(&str, bool)]) -> String {
    if verdicts.iter().all(|(_, ok)| *ok) || verdicts.iter().all(|(_, ok)| !*ok) {
        return met(verdicts.first().is_none_or(|(_, ok)| *ok)).to_owned();
    }
    let each: Vec<String> = verdicts
        .iter()
        .map(|(name, ok)| format!("{name} {}", met(*ok)))
        .collect();
    each.join(", ")
}

/// A column's title for a source of `vm-bench-proxier`'s report.
fn source_title(source: &str) -> String {
    match source {
        "kube-json" => "kube source (JSON)".to_owned(),
        // Reports from before protobuf streaming lists were the default.
        "kube-protobuf" => "kube source (protobuf lists)".to_owned(),
        other => format!("{other} source"),
    }
}

/// The daemon's goals (as `vm-bench-proxier` checks them).
const GOAL_START_VS_FLOOR: f64 = 1.3;
const GOAL_START_VS_REFERENCE: f64 = 0.35;
const GOAL_RSS_MIB: f64 = 64.0;
const GOAL_ADOPTION_VS_DUMPS: f64 = 2.0;
const GOAL_P99_MS: f64 = 50.0;
const GOAL_SCALING: f64 = 2.0;

/// The phase rows of a sync breakdown, as `vm-bench-proxier` names them.
const PHASES: [&str; 11] = [
    "sysctls",
    "source read+parse",
    "first picture applied",
    "planning",
    "kernel read (dumps)",
    "diff",
    "address ops",
    "IPVS ops",
    "nftables",
    "conntrack",
    "sync total",
];

/// The page.
pub fn render(facts: &Facts, ipvs: &Value, proxier: &Value, traffic: &Value) -> Result<String> {
    let mut out = String::new();
    header(&mut out, facts, ipvs, proxier)?;
    out.push_str(HOW_TO_READ);
    ipvs_section(&mut out, ipvs)?;
    proxier_section(&mut out, proxier)?;
    out.push_str(&traffic_section(None, traffic)?);
    Ok(out)
}

/// Where the traffic section starts and ends on the page (so that `--traffic-only` can
/// rewrite it alone).
const TRAFFIC_BEGIN: &str = "<!-- vm-bench traffic -->";
const TRAFFIC_END: &str = "<!-- /vm-bench traffic -->";

/// Goal of the traffic metrics: the change-to-kernel latency with a scrape every 15 s within
/// 10 % of the latency without.
const GOAL_TRAFFIC_LATENCY_RATIO: f64 = 1.10;

/// The section of `vm-bench traffic`; `facts` when it comes from its own run
/// (`--traffic-only`), not the page header's.
fn traffic_section(facts: Option<&Facts>, t: &Value) -> Result<String> {
    let mut out = String::new();
    let _ = writeln!(out, "{TRAFFIC_BEGIN}");
    let _ = writeln!(out, "## Per-Service traffic metrics (`vm-bench traffic`)\n");
    if let Some(facts) = facts {
        let _ = writeln!(
            out,
            "This section alone was written by `{}`, run started {}, commit {}, guest kernel {}; the rest of the page comes from the run its header names.\n",
            facts.command, facts.date, facts.commit, facts.guest_kernel
        );
    }
    let ms = |path: &str| -> Result<String> { Ok(format!("{:.1} ms", num(t, path)?)) };
    let latency = |key: &str| -> Result<String> {
        Ok(format!(
            "p50 {}, p99 {}, max {} ({} changes)",
            ms(&format!("{key}.p50_ms"))?,
            ms(&format!("{key}.p99_ms"))?,
            ms(&format!("{key}.max_ms"))?,
            num(t, &format!("{key}.count"))?
        ))
    };
    let (p50_ratio, p99_ratio) = (num(t, "p50_ratio")?, num(t, "p99_ratio")?);
    let _ = writeln!(
        out,
        "{} ClusterIP Services × {} endpoints, kube source, `--ipvs-traffic-metrics=endpoint`.\n",
        thousands(num(t, "services")?),
        num(t, "endpoints")?
    );
    let _ = writeln!(
        out,
        "| figure | measured | goal | status |\n|---|---|---|---|"
    );
    let _ = writeln!(
        out,
        "| scrape of `/metrics`, idle daemon ({} scrapes) | p50 {}, max {} | | |",
        num(t, "scrape.count")?,
        secs(num(t, "scrape.p50_s")?),
        secs(num(t, "scrape.max_s")?)
    );
    let _ = writeln!(
        out,
        "| page | {} bytes: traffic at `service` level {} bytes ({} series), `endpoint` level adds {} bytes ({} series) | | |",
        thousands(num(t, "scrape.page_bytes")?),
        thousands(num(t, "scrape.service_bytes")?),
        thousands(num(t, "scrape.service_series")?),
        thousands(num(t, "scrape.endpoint_bytes")?),
        thousands(num(t, "scrape.endpoint_series")?)
    );
    let _ = writeln!(
        out,
        "| daemon CPU per scrape | {} | | |",
        secs(num(t, "scrape.cpu_s")?)
    );
    if t["scrapes_during_churn"].is_object() {
        let _ = writeln!(
            out,
            "| scrapes during the changes (every 15 s) | p50 {}, max {} | | |",
            secs(num(t, "scrapes_during_churn.p50_ms")? / 1e3),
            secs(num(t, "scrapes_during_churn.max_ms")? / 1e3)
        );
    }
    let _ = writeln!(
        out,
        "| endpoint change → kernel, no scraping | {} | | |",
        latency("without")?
    );
    let _ = writeln!(
        out,
        "| endpoint change → kernel, a scrape every 15 s | {} (p50 {p50_ratio:.2} ×, p99 {p99_ratio:.2} ×) | p50 and p99 within 10 % | {} |",
        latency("with")?,
        met(p50_ratio <= GOAL_TRAFFIC_LATENCY_RATIO && p99_ratio <= GOAL_TRAFFIC_LATENCY_RATIO)
    );
    out.push_str(TRAFFIC_TEXT);
    let _ = writeln!(out, "{TRAFFIC_END}");
    Ok(out)
}

const TRAFFIC_TEXT: &str = "
The idle scrapes read the whole IPVS table (a verified read, on the scrape's own netlink
socket) and render every virtual and real server's counters; the daemon's CPU is its user and
system time across each scrape. The changes are one endpoint replaced every 100 ms through the
API double, timed until the kernel holds it, first for the given time without scraping, then
for as long with a scraper asking every 15 s.
";

/// `page` with its section between the markers `begin` and `end` replaced by `section`
/// (which carries the markers; appended when the page has none).
fn splice(page: &str, begin: &str, end: &str, section: &str) -> String {
    match (page.find(begin), page.find(end)) {
        (Some(from), Some(to)) if from < to => {
            let to = to + end.len();
            let rest = page[to..].strip_prefix('\n').unwrap_or(&page[to..]);
            format!("{}{section}{rest}", &page[..from])
        }
        _ => format!("{}\n\n{section}", page.trim_end()),
    }
}

/// The section of `page` between the markers `begin` and `end`, markers included.
fn section_of<'p>(page: &'p str, begin: &str, end: &str) -> Option<&'p str> {
    let from = page.find(begin)?;
    let to = page[from..].find(end)? + from + end.len();
    Some(&page[from..to])
}

fn header(out: &mut String, facts: &Facts, ipvs: &Value, proxier: &Value) -> Result<()> {
    let services = num(ipvs, "services")?;
    let dests = num(ipvs, "dests")?;
    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "Written by `{}`, run started {}; do not edit by hand, run the command again.\n",
        facts.command, facts.date
    );
    let _ = writeln!(out, "| run | |\n|---|---|");
    let _ = writeln!(
        out,
        "| sizes | `vm-bench ipvs`: {} TCP services × {} masquerading destinations ({} rules); `vm-bench proxier`: {} ClusterIP Services × {} endpoints, {} endpoint changes, small cluster {} Services |",
        thousands(services),
        dests,
        thousands(num(ipvs, "rules")?),
        thousands(num(proxier, "services")?),
        num(proxier, "endpoints")?,
        num(proxier, "changes")?,
        num(proxier, "small")?,
    );
    let _ = writeln!(out, "| commit | `{}` |", facts.commit);
    let _ = writeln!(
        out,
        "| guest | Debian cloud kernel {}, qemu TCG (software emulation), 2 vCPUs, {} MiB, no network card |",
        facts.guest_kernel, facts.memory_mib
    );
    let _ = writeln!(out, "| emulator | {} |", facts.qemu);
    let _ = writeln!(
        out,
        "| host | {}; load average at start {} |",
        facts.host, facts.load_at_start
    );
    let times: Vec<String> = facts
        .run_times
        .iter()
        .map(|(name, guest, whole)| {
            let guest = guest.map_or("?".to_owned(), |d| {
                format!("{:.1} min", d.as_secs_f64() / 60.0)
            });
            format!(
                "`vm-bench {name}` {guest} ({:.1} min with build and boot)",
                whole.as_secs_f64() / 60.0
            )
        })
        .collect();
    let _ = writeln!(out, "| run time in the VM | {} |\n", times.join(", "));
    Ok(())
}

const HOW_TO_READ: &str = "\
## How to read these figures

The benchmarks run inside a qemu VM with software emulation (TCG) on a shared 2-core host,
because the development machines' kernel has no IPVS. Emulation makes every absolute time
several times longer than on hardware, and by a factor that changes with the host's load
from one run to the next. **Only ratios between figures of the same run compare**: ours
against `ipvsadm` (and `ip`) run a moment before in the same VM, and the daemon against
the library's own floor. Never quote an absolute time from this page as a product figure,
and never compare seconds across two runs of this page.

Each side programs its own fresh network namespace. The kernel keeps deleted IPVS
destinations in a per-namespace trash list for about two minutes and looks every new
destination up there linearly, so whoever programs right after a flush of a large table pays
a walk the other side did not.

The run's full console (every figure printed as it was measured, the daemon's phases, the
kernel op counts) is `target/vm/last-console.log` after each benchmark; this page is built
only from the JSON report each benchmark prints last.

";

fn ipvs_section(out: &mut String, ipvs: &Value) -> Result<()> {
    let _ = writeln!(out, "## ipvs-netlink against ipvsadm (`vm-bench ipvs`)\n");
    let _ = writeln!(out, "| operation | ipvsadm | ipvs-netlink | ratio |");
    let _ = writeln!(out, "|---|---|---|---|");
    let row = |out: &mut String, label: &str, key: &str, extra: &str| -> Result<()> {
        let theirs = num(ipvs, &format!("{key}.ipvsadm_s"))?;
        let ours = num(ipvs, &format!("{key}.ours_s"))?;
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {}{extra} |",
            secs(theirs),
            secs(ours),
            ratio(ours / theirs)
        );
        Ok(())
    };
    row(out, "program (`ipvsadm -R` / one `batch`)", "program", "")?;
    // The pairs' ratios, as " (median of N pairs, lo–hi)".
    let range = |key: &str| -> String {
        let pairs: Vec<f64> = ipvs[key]["pairs"]
            .as_array()
            .map(|pairs| {
                pairs
                    .iter()
                    .filter_map(|p| Some(p["ours_s"].as_f64()? / p["ipvsadm_s"].as_f64()?))
                    .collect()
            })
            .unwrap_or_default();
        match (
            pairs.iter().copied().reduce(f64::min),
            pairs.iter().copied().reduce(f64::max),
        ) {
            (Some(lo), Some(hi)) => format!(" (median of {} pairs, {lo:.3}–{hi:.3})", pairs.len()),
            _ => String::new(),
        }
    };
    row(
        out,
        "dump (`ipvsadm -Sn` / verified `table()`)",
        "dump",
        &range("dump"),
    )?;
    if ipvs.get("dump_best_effort").is_some() {
        row(
            out,
            "dump (`ipvsadm -Sn` / best-effort `table_best_effort()`)",
            "dump_best_effort",
            &range("dump_best_effort"),
        )?;
    }
    row(
        out,
        "rewrite in place (`-E`/`-e` lines / update ops in one `batch`)",
        "update",
        "",
    )?;
    out.push_str(IPVS_TEXT);
    Ok(())
}

const IPVS_TEXT: &str = "
- **program**: `ipvsadm -R` reading the whole table from a file, against one pipelined
  `IpvsHandle::batch` of the same add-service and add-destination ops (one result per op).
  Both tables are then checked equal (`ipvsadm -Sn`).
- **dump**: timed in alternating pairs on the same table, and the pair with the median ratio
  is shown, because one pair can land in a moment when the shared host is busy for one side
  only. A verified `table()` dumps the service list until two dumps in a row bring nothing
  new (the kernel positions a multi-part dump by an index that counts every namespace's
  services, so one dump can skip entries while another namespace changes IPVS), then every
  service's destinations on two sockets. IPVS has no all-destinations dump, so both sides make
  one destination dump per service, and the IPVS generic-netlink family (no `parallel_ops` on
  this kernel) serves them one at a time under its global lock: the dump ratio is the
  kernel's per-request cost over ipvsadm's, halved by the second socket. On a busy host
  ipvsadm suffers more than the library does, so the ratio is lower there. The best-effort
  read (one service dump, what the daemon's first sync reads) is timed right after the
  verified one in each pair, against the same `ipvsadm -Sn`.
- **rewrite in place**: every rule edited with the values it already has. The kernel
  allocates nothing, so this isolates the client side (sockets, round trips, encoding) from
  the kernel's cost of creating objects.

";

fn proxier_section(out: &mut String, p: &Value) -> Result<()> {
    let services = num(p, "services")?;
    let endpoints = num(p, "endpoints")?;
    let restore = num(p, "floors.ipvsadm_restore_s")?;
    let ip_batch = num(p, "floors.ip_batch_s")?;
    let library = num(p, "floors.library_batch_s")?;
    let binding = num(p, "floors.vip_binding_s")?;
    let reference = restore + ip_batch;
    let floor = library + binding;
    let _ = writeln!(
        out,
        "## The daemon against the reference and the floor (`vm-bench proxier`)\n"
    );
    if p["bind_service_cidrs"].as_bool() == Some(true) {
        let _ = writeln!(
            out,
            "The daemon ran with `--bind-service-cidrs` (one local route, no address per ClusterIP).\n"
        );
    }
    let _ = writeln!(out, "| baseline, same run | parts | total |\n|---|---|---|");
    let _ = writeln!(
        out,
        "| reference: `ipvsadm -R` + `ip -batch` of {} addresses | {} + {} | {} |",
        thousands(services),
        secs(restore),
        secs(ip_batch),
        secs(reference)
    );
    let _ = writeln!(
        out,
        "| floor: library `batch` + the engine's pipelined binding of the ClusterIPs | {} + {} | {} |\n",
        secs(library),
        secs(binding),
        secs(floor)
    );

    let sources = p["sources"]
        .as_array()
        .context("the report has no sources")?;
    let names: Vec<String> = sources
        .iter()
        .map(|s| source_title(s["source"].as_str().unwrap_or("?")))
        .collect();
    let _ = writeln!(
        out,
        "| step ({} svc × {} ep) | {} | goal | status |",
        thousands(services),
        endpoints,
        names.join(" | ")
    );
    let _ = writeln!(out, "|---|{}---|---|", "---|".repeat(sources.len()));

    let mut cells = Vec::new();
    let (mut vs_floor, mut vs_reference) = (Vec::new(), Vec::new());
    for (s, name) in sources.iter().zip(&names) {
        let program = num(s, "program_s")?;
        vs_floor.push((name.as_str(), program <= GOAL_START_VS_FLOOR * floor));
        vs_reference.push((
            name.as_str(),
            program <= GOAL_START_VS_REFERENCE * reference,
        ));
        cells.push(format!(
            "{} ({:.2} × floor, {:.2} × reference)",
            secs(program),
            program / floor,
            program / reference
        ));
    }
    let _ = writeln!(
        out,
        "| start → programmed ({} rules + {} ClusterIPs) | {} | ≤ {GOAL_START_VS_FLOOR} × floor; ≤ {GOAL_START_VS_REFERENCE} × reference | floor: {}; reference: {} |",
        thousands(services * (endpoints + 1.0)),
        thousands(services),
        cells.join(" | "),
        met_by(&vs_floor),
        met_by(&vs_reference)
    );

    let mut cells = Vec::new();
    let mut verdicts = Vec::new();
    for (s, name) in sources.iter().zip(&names) {
        let adoption = num(s, "adoption_s")?;
        let dumps = num(s, "dump_table_s")? + num(s, "dump_addresses_s")?;
        let writes = num(s, "adoption_writes")?;
        let ok = writes == 0.0 && adoption <= GOAL_ADOPTION_VS_DUMPS * dumps;
        verdicts.push((name.as_str(), ok));
        // Reports since the adoption and its dumps were each run three times give every
        // run; the figures are the median run's.
        let runs = match (runs_of(s, "adoption_runs_s"), runs_of(s, "dump_runs_s")) {
            (Some(adoptions), Some(dumps)) if adoptions.len() > 1 => format!(
                "; medians of {} runs, adoption {}, dumps {}",
                adoptions.len(),
                list_secs(&adoptions),
                list_secs(&dumps)
            ),
            _ => String::new(),
        };
        cells.push(format!(
            "{}, {writes:.0} writes ({:.2} × dumps: `table()` {} + address dump {}{runs})",
            secs(adoption),
            adoption / dumps,
            secs(num(s, "dump_table_s")?),
            secs(num(s, "dump_addresses_s")?)
        ));
    }
    let _ = writeln!(
        out,
        "| restart adoption | {} | 0 writes, ≤ {GOAL_ADOPTION_VS_DUMPS} × dumps | {} |",
        cells.join(" | "),
        met_by(&verdicts)
    );
    // Where the adoption's CPU went (reports from before it was measured have none).
    if sources.iter().all(|s| s["adoption_cpu"].is_object()) {
        let (mut cells, mut floors) = (Vec::new(), Vec::new());
        for s in sources {
            let cpu = &s["adoption_cpu"];
            let read = &s["dump_table_cpu"];
            let (user, system) = (num(cpu, "daemon_user_s")?, num(cpu, "daemon_system_s")?);
            let (harness, cpus) = (num(cpu, "harness_s")?, num(cpu, "cpus")?);
            let (read_user, read_system) = (num(read, "user_s")?, num(read, "system_s")?);
            cells.push(format!(
                "daemon {} ({} user + {} system), API double {}; {:.0} % of {cpus:.0} CPUs busy; `table()` alone {} ({} system)",
                secs(user + system),
                secs(user),
                secs(system),
                secs(harness),
                num(cpu, "machine_busy")? * 100.0,
                secs(read_user + read_system),
                secs(read_system)
            ));
            // How fast the adoption could be with that CPU time spread over every CPU:
            // below the goal only when the CPU time itself is.
            let floor = (user + system + harness) / cpus;
            let dumps = num(s, "dump_table_s")? + num(s, "dump_addresses_s")?;
            floors.push(format!(
                "{} = {:.2} × dumps (the adoption {:.2} × it)",
                secs(floor),
                floor / dumps,
                num(s, "adoption_s")? / floor
            ));
        }
        let _ = writeln!(
            out,
            "| restart adoption: CPU time | {} | | |",
            cells.join(" | ")
        );
        let _ = writeln!(
            out,
            "| restart adoption: CPU-bound floor, (daemon + API double) / CPUs | {} | | |",
            floors.join(" | ")
        );
    }

    let mut cells = Vec::new();
    let mut verdicts = Vec::new();
    for (s, name) in sources.iter().zip(&names) {
        let rss = num(s, "rss_mib")?;
        verdicts.push((name.as_str(), rss <= GOAL_RSS_MIB));
        cells.push(format!(
            "{rss:.1} / {:.1} / {:.1} MiB (peak {:.1})",
            num(s, "rss_adopted_mib")?,
            num(s, "rss_after_changes_mib")?,
            num(s, "peak_rss_mib")?
        ));
    }
    let _ = writeln!(
        out,
        "| RSS 2 s after programmed / after adoption / after the changes | {} | ≤ {GOAL_RSS_MIB} MiB after programmed | {} |",
        cells.join(" | "),
        met_by(&verdicts)
    );

    let small = &p["small_changes"];
    let mut cells = Vec::new();
    // Judged on every kube source's changes.
    let mut judged: Option<bool> = None;
    for s in sources {
        let changes = &s["changes"];
        let failed = num(s, "change_failed_ops")?;
        match s["source"].as_str() {
            Some("kube" | "kube-json" | "kube-protobuf") => {
                let p50 = num(changes, "p50_ms")?;
                let p99 = num(changes, "p99_ms")?;
                let mut cell = format!(
                    "p50 {p50:.1} ms, p99 {p99:.1} ms ({:.0} changes)",
                    num(changes, "count")?
                );
                if !small.is_null() {
                    let small_p50 = num(small, "p50_ms")?;
                    let _ = write!(
                        cell,
                        "; at {:.0} Services p50 {small_p50:.1}, p99 {:.1} ms (p50 ratio {:.2})",
                        num(p, "small")?,
                        num(small, "p99_ms")?,
                        p50 / small_p50
                    );
                    let ok = p99 <= GOAL_P99_MS && p50 / small_p50 < GOAL_SCALING && failed == 0.0;
                    judged = Some(judged.unwrap_or(true) && ok);
                }
                cells.push(cell);
            }
            _ => cells.push(format!(
                "{} (the file rewritten and read whole)",
                secs(num(changes, "max_ms")? / 1e3)
            )),
        }
    }
    let _ = writeln!(
        out,
        "| one endpoint change, event → kernel | {} | kube: p99 ≤ {GOAL_P99_MS} ms, p50 at {} / at {} < {GOAL_SCALING} | {} |\n",
        cells.join(" | "),
        thousands(services),
        num(p, "small")?,
        judged.map_or("", met),
    );

    // Phases.
    let mut columns = Vec::new();
    for s in sources {
        let name = s["source"].as_str().unwrap_or("?");
        columns.push((format!("{name}: first sync"), &s["first_sync"]));
        columns.push((format!("{name}: adoption"), &s["adoption_phases"]));
    }
    let _ = writeln!(
        out,
        "Where the time goes (the daemon's own phase timings, from its JSON log; `?`: not logged):\n"
    );
    let heads: Vec<&str> = columns.iter().map(|(h, _)| h.as_str()).collect();
    let _ = writeln!(out, "| phase | {} |", heads.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(columns.len()));
    for phase in PHASES {
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, phases)| phases[phase].as_f64().map_or("?".to_owned(), secs))
            .collect();
        let _ = writeln!(out, "| {phase} | {} |", cells.join(" | "));
    }
    out.push_str(PROXIER_TEXT);
    Ok(())
}

const PROXIER_TEXT: &str = "
What the rows measure:

- **reference**: what a shell script would do with the standard tools: `ipvsadm -R` of the
  whole table, then `ip -batch` binding every ClusterIP on a dummy link. **floor**: the
  library's own `batch` of the same rules plus the engine's pipelined binding of the
  ClusterIPs, with nothing else (no source, no planning, no nftables): the least any program
  built on these libraries can take.
- **start → programmed**: the daemon started on an empty kernel in a fresh namespace, timed
  until a sync leaves exactly the reference's table in the kernel (checked against `ipvsadm
  -Sn`) and every ClusterIP bound. The file source reads a YAML file of every Service and
  EndpointSlice; the kube source lists them from a Kubernetes API server double that serves
  the same objects inside the VM, as streaming lists: of Services and EndpointSlices in
  protobuf (the default, as kube-proxy's) or, in the last column, in JSON
  (`--kube-api-content-type=application/json`).
- **restart adoption**: the daemon killed and started again on the table it programmed; timed
  to its first sync, which must write nothing (read from the daemon's metrics and its sync
  event). Compared with what reading that kernel costs the library alone: a verified
  `table()` plus a dump of the link's addresses. (The daemon's first sync reads the table
  best-effort: one service dump instead of a verified read's three, and the destinations
  from the kernel's text listing of the namespace, `/proc/net/ip_vs`, instead of a
  destination dump per service; it looks up alone each planned virtual server that read
  lacks. The verified netlink read, the stricter one and what any netlink client pays for
  the table, stays the yardstick.) Each is run three times (the daemon stopped
  and started again between adoptions) and the median run shown, every run's time beside
  it. **CPU time**, of the median runs: the daemon's user and system time from its start to
  that sync, that of the benchmark's own process meanwhile (the API double serving the
  lists, and the wait), the share of the VM's CPUs busy over that time (all processes), and
  the CPU time of the library's `table()` alone (system: the kernel's work of the dumps, one
  per service for its destinations). **CPU-bound floor**: that CPU time (the daemon's and
  the API double's) divided among the VM's CPUs, the adoption's time if nothing ever
  waited: the adoption reaches the goal only once its CPU time does.
- **RSS**: `VmRSS` of the daemon 2 s after each step (peak: `VmHWM`). The daemon uses mimalloc
  and turns transparent huge pages off for itself.
- **one endpoint change**: kube source: one endpoint of one Service replaced through the API
  double, timed until the new destination shows in the kernel (polled every millisecond),
  20 ms between changes; the same changes on the small cluster give the scaling ratio (work
  per change must not grow with the cluster). File source: one endpoint changed by rewriting
  the whole file, which the daemon re-reads whole.
- **phases**: the source's first picture, applying it to the engine, then the sync's steps
  (planning, kernel read, diff, address and IPVS writes, nftables, conntrack) as the daemon
  logs them. Address and IPVS writes run in parallel with nftables, so the steps add up to
  more than the sync's total. A kube start that has the Services' list before the
  EndpointSlices' begins binding their addresses then, before the sync: its address ops are
  the part of the binding left when the sync's writes begin.
- **goals and status**: the daemon's goals, judged on this run's same-run ratios.

The soak benchmark (churn under traffic, RSS growth, change latency with full resyncs) has
its own section below, written by its own run (`cargo xtask bench-report --soak-only`), and
so has the soak with faults (kill -9 and restart, API outage, 410 storm:
`cargo xtask bench-report --soak-only --faults`), the soak with the ClusterIPs taken by one
local route (`cargo xtask bench-report --soak-only --bind-service-cidrs`), and the daemon at
50,000 Services beside 10,000 (`cargo xtask bench-report --scale-only --services 50000`).

";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_report_is_the_last_marker_line_of_the_console() {
        let console = "boot\r\nVM-BENCH-REPORT: {\"bench\":\"ipvs\",\"services\":1}\r\n\
                       VM-BENCH-REPORT: {\"bench\":\"ipvs\",\"services\":2}\r\nVM-RUN-EXIT: 0\r\n";
        let report = extract_report(console, "ipvs").unwrap();
        assert_eq!(report["services"], 2);
        assert!(extract_report(console, "proxier").is_err());
        assert!(extract_report("no report here", "ipvs").is_err());
    }

    /// The reports of a real run: `cargo xtask bench-report --services 300 --dests 3
    /// --changes 20 --small 50`.
    const IPVS: &str = include_str!("../testdata/ipvs-report-300x3.json");
    const PROXIER: &str = include_str!("../testdata/proxier-report-300x3.json");
    /// `cargo xtask vm-bench traffic --services 200 --seconds 15 --scrapes 2`.
    const TRAFFIC: &str = include_str!("../testdata/traffic-report-200x5.json");

    fn facts() -> Facts {
        Facts {
            command: "cargo xtask bench-report --services 300 --dests 3".into(),
            date: "2026-12-02 01:51 UTC".into(),
            commit: "5440a3000ccc".into(),
            guest_kernel: "6.1.0-57-cloud-amd64".into(),
            memory_mib: 6144,
            qemu: "QEMU emulator version 7.2.22".into(),
            host: "Linux 6.18, AMD EPYC, 2 CPUs".into(),
            load_at_start: "5.89 8.00 8.69".into(),
            run_times: vec![(
                "ipvs".into(),
                Some(Duration::from_secs(43)),
                Duration::from_secs(600),
            )],
        }
    }

    /// The page rendered from the test reports, with `proxier` as the daemon's.
    fn page_with(proxier: &str) -> String {
        let ipvs: Value = serde_json::from_str(IPVS).unwrap();
        let proxier: Value = serde_json::from_str(proxier).unwrap();
        let traffic: Value = serde_json::from_str(TRAFFIC).unwrap();
        render(&facts(), &ipvs, &proxier, &traffic).unwrap()
    }

    #[test]
    fn the_page_shows_every_figure_with_its_same_run_ratio() {
        let page = page_with(PROXIER);
        assert!(page.starts_with("# Benchmarks\n"));
        assert!(page.contains("`cargo xtask bench-report --services 300 --dests 3`"));
        assert!(page.contains("300 TCP services × 3 masquerading destinations (1,200 rules)"));
        // ipvs: 0.05478469 / 0.536754131, and each dump's median pair with the range of
        // its pairs' ratios (verified: 0.0449 / 0.2073, pairs 0.215 to 0.310; best-effort:
        // 0.0417 / 0.2073, pairs 0.196 to 0.206).
        assert!(
            page.contains("| program (`ipvsadm -R` / one `batch`) | 0.54 s | 54.8 ms | 0.102 |"),
            "{page}"
        );
        assert!(
            page.contains("| 0.21 s | 44.9 ms | 0.217 (median of 3 pairs, 0.215–0.310) |"),
            "{page}"
        );
        assert!(
            page.contains(
                "| dump (`ipvsadm -Sn` / best-effort `table_best_effort()`) | 0.21 s | 41.7 ms | 0.201 (median of 3 pairs, 0.196–0.206) |"
            ),
            "{page}"
        );
        // proxier: reference 0.793 + 0.149, floor 0.108 + 0.112; file start 1.93 s.
        assert!(page.contains("| 0.79 s + 0.15 s | 0.94 s |"), "{page}");
        assert!(page.contains("(8.78 × floor, 2.05 × reference)"), "{page}");
        assert!(
            page.contains("| floor: not met; reference: not met |"),
            "{page}"
        );
        assert!(
            page.contains("at 50 Services p50 27.0, p99 108.6 ms"),
            "{page}"
        );
        assert!(page.contains("| nftables | 0.79 s |"), "{page}");
        assert!(page.contains("`vm-bench ipvs` 0.7 min (10.0 min with build and boot)"));
        assert!(page.contains("Only ratios between figures of the same run compare"));
    }

    /// `cargo xtask vm-bench proxier --source all --changes 20 --small 20` (10,000 x 5):
    /// the three sources, with the adoption's CPU time.
    const PROXIER_ALL: &str = include_str!("../testdata/proxier-report-10000x5-all.json");

    #[test]
    fn the_protobuf_column_and_the_adoption_cpu_row_come_from_the_report() {
        let page = page_with(PROXIER_ALL);
        assert!(
            page.contains(
                "| file source | kube source | kube source (protobuf lists) | goal | status |"
            ),
            "{page}"
        );
        // protobuf: adopted in 3.543 s against table() 1.120 s + address dump 0.141 s.
        assert!(page.contains("3.54 s, 0 writes (2.81 × dumps"), "{page}");
        // Its CPU: 2.88 s user + 2.93 s system, the double 0.42 s, 91.5 % busy; the read
        // alone 0.48 s user + 1.71 s system.
        assert!(
            page.contains(
                "daemon 5.81 s (2.88 s user + 2.93 s system), API double 0.42 s; 91 % of 2 CPUs busy; `table()` alone 2.19 s (1.71 s system) |"
            ),
            "{page}"
        );
        assert!(page.contains("| kube-protobuf: adoption |"), "{page}");
        // The older report has no CPU time: no row.
        let page = page_with(PROXIER);
        assert!(!page.contains("restart adoption: CPU time"), "{page}");
    }

    /// `cargo xtask vm-bench proxier --source all` (10,000 x 5, as `bench-report` runs it),
    /// each adoption and dump pair run three times.
    const PROXIER_MEDIANS: &str = include_str!("../testdata/proxier-report-10000x5-medians.json");

    #[test]
    fn the_adoption_is_the_median_run_with_every_run_beside_it() {
        let page = page_with(PROXIER_MEDIANS);
        // kube: adoptions 3.588, 3.414, 3.532 s; dump pairs 1.398, 1.170 (table() 1.025 +
        // addresses 0.145), 1.133 s: the medians 3.532 / 1.170 = 3.02.
        assert!(
            page.contains(
                "3.53 s, 0 writes (3.02 × dumps: `table()` 1.02 s + address dump 0.14 s; \
                 medians of 3 runs, adoption 3.59, 3.41, 3.53 s, dumps 1.40, 1.17, 1.13 s)"
            ),
            "{page}"
        );
        // kube: the daemon 3.45 + 2.55 s and the double 0.32 s of CPU on 2 CPUs: 3.16 s, 2.70
        // × the dumps, and the adoption 1.12 × that.
        assert!(
            page.contains("3.16 s = 2.70 × dumps (the adoption 1.12 × it)"),
            "{page}"
        );
        // The older report has one run of each: no runs listed.
        let page = page_with(PROXIER_ALL);
        assert!(!page.contains("medians of"), "{page}");
    }

    #[test]
    fn a_goal_met_by_some_sources_names_each() {
        assert_eq!(
            met_by(&[("file source", true), ("kube source", true)]),
            "met"
        );
        assert_eq!(
            met_by(&[("file source", false), ("kube source", false)]),
            "not met"
        );
        assert_eq!(
            met_by(&[("file source", false), ("kube source", true)]),
            "file source not met, kube source met"
        );
    }

    #[test]
    fn the_traffic_section_has_its_figures_and_can_be_rewritten_alone() {
        let traffic: Value = serde_json::from_str(TRAFFIC).unwrap();
        let section = traffic_section(None, &traffic).unwrap();
        assert!(
            section.contains("200 ClusterIP Services × 5 endpoints"),
            "{section}"
        );
        // 0.76683888 s, 1531559 bytes, 0.545 s of CPU; 24.32 -> 24.37 ms at p50.
        assert!(section.contains("| p50 0.77 s, max 0.95 s |"), "{section}");
        assert!(
            section.contains(
                "| 1,531,559 bytes: traffic at `service` level 217,699 bytes (1,400 series)"
            ),
            "{section}"
        );
        assert!(
            section.contains("| daemon CPU per scrape | 0.55 s |"),
            "{section}"
        );
        assert!(section.contains("p50 24.4 ms, p99 44.0 ms, max 66.2 ms (151 changes) (p50 1.00 ×, p99 1.05 ×) | p50 and p99 within 10 % | met |"), "{section}");

        let page = format!("# Benchmarks\n\nbefore\n{section}\nafter\n");
        let mut again = facts();
        again.command = "cargo xtask bench-report --traffic-only".into();
        let newer = traffic_section(Some(&again), &traffic).unwrap();
        let spliced = splice(&page, TRAFFIC_BEGIN, TRAFFIC_END, &newer);
        assert!(spliced.starts_with("# Benchmarks\n\nbefore\n"), "{spliced}");
        assert!(spliced.ends_with("\nafter\n"), "{spliced}");
        assert!(spliced.contains(
            "This section alone was written by `cargo xtask bench-report --traffic-only`"
        ));
        assert_eq!(spliced.matches(TRAFFIC_BEGIN).count(), 1);
        // A page from before the section: it is appended.
        let appended = splice("# Benchmarks\n\nold\n", TRAFFIC_BEGIN, TRAFFIC_END, &newer);
        assert!(
            appended.starts_with("# Benchmarks\n\nold\n\n<!-- vm-bench traffic -->"),
            "{appended}"
        );
    }

    #[test]
    fn the_guest_run_time_comes_from_the_runner_line() {
        let console = "x\r\nVM-RUN: took 42.675s\r\nVM-RUN-EXIT: 0\r\n";
        assert_eq!(guest_run_time(console), Some(Duration::from_millis(42675)));
        assert_eq!(guest_run_time("nothing"), None);
    }

    #[test]
    fn numbers_are_grouped_and_seconds_keep_three_digits() {
        assert_eq!(thousands(60000.0), "60,000");
        assert_eq!(thousands(300.0), "300");
        assert_eq!(secs(0.0123), "12.3 ms");
        assert_eq!(secs(1.234), "1.23 s");
        assert_eq!(secs(27.44), "27.4 s");
        assert_eq!(secs(123.4), "123 s");
    }
}
