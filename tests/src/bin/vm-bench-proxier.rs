//! Scale benchmark of the whole daemon, run inside the test VM by
//! `cargo xtask vm-bench proxier [--services N] [--endpoints M]
//! [--source kube|kube-json|file|both|all] [--json] [--changes K] [--small S]
//! [--bind-service-cidrs] [--dump-breakdown]` (default 10,000 x 5, the file and kube sources,
//! 100 changes, 100 services; `kube` is the daemon's default, streaming lists of Services and
//! EndpointSlices in protobuf, `kube-json` the same in JSON (`--kube-api-content-type=
//! application/json`), `all` runs it after the other two, `--json` makes every kube run
//! one; `--bind-service-cidrs` runs the daemon with the
//! ClusterIP range taken whole by one local route instead of an address per ClusterIP;
//! `--dump-breakdown` also times a service dump alone, the best-effort read and `ipvsadm -Sn`
//! of the programmed kernel).
//!
//! 1. Floors and reference, each in a fresh network namespace: `ipvsadm -R` of the table plus
//!    `ip -batch` binding the N ClusterIPs (the reference); the library's own `batch` of the
//!    same table plus the engine's pipelined address binding of the N ClusterIPs (the floor).
//! 2. For each source, in a fresh namespace: the daemon from an empty kernel to the full
//!    table (checked against `ipvsadm -Sn` of the reference), with the per-phase breakdown
//!    of its first sync; its RSS after convergence; restart adoption (the daemon killed and
//!    started again on the programmed kernel: time to its first sync, its phases, its kernel
//!    writes, expected none, and its CPU time, with the machine's) against the library's
//!    `table()` plus an address dump of the same kernel (and the read's CPU time), each run
//!    three times and the median run reported (every run's time beside it); then
//!    endpoint changes: for the file source one rewrite of the file, for the kube source
//!    (the API server double serving the same N Services and EndpointSlices inside the VM)
//!    K single-endpoint changes, each timed from the API change to the new destination
//!    showing in the kernel.
//! 3. The same K kube-source changes on a cluster of S services, for the scaling ratio.
//!
//! Times under TCG are only meaningful as ratios against ipvsadm and the library in the same
//! run. The last line is the machine-readable report (`VM-BENCH-REPORT: {json}`) that
//! `cargo xtask bench-report` turns into `docs/benchmarks.md`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use futures::StreamExt as _;
use ipvs_netlink::IpvsHandle;
use ipvs_proxier_tests::Netns;
use ipvs_proxier_tests::bench::api::ApiInNetns;
use ipvs_proxier_tests::bench::cluster::{self, ENDPOINT_ROUTE};
use ipvs_proxier_tests::bench::cpu::{MachineCpu, ProcessCpu};
use ipvs_proxier_tests::bench::daemon::{BenchDaemon, METRICS, Source};
use ipvs_proxier_tests::bench::latency::{Percentiles, wait_for_destination};
use ipvs_proxier_tests::bench::metrics;
use ipvs_proxier_tests::bench::phases::{LogEvent, Phases, SYNC_DONE};
use ipvs_proxier_tests::bench::report;
use proxier_core::backend::{AddressBackend, KernelAddressBackend};
use serde_json::{Value, json};

/// Messages of the daemon's start-up events, echoed from its log after the first start.
const STARTUP_EVENTS: [&str; 7] = [
    "sysctls and IPVS timeouts set",
    "source file loaded",
    "first list received",
    "Services listed before the EndpointSlices; binding their addresses ahead",
    "Services and EndpointSlices synced",
    "first picture applied",
    SYNC_DONE,
];

/// The daemon's message when a restart finds its nftables tables holding its plan.
const NFTABLES_ADOPTED: &str = "nftables tables already hold the plan: adopted without a rewrite";

/// The daemon's goals at scale.
const GOAL_START_VS_FLOOR: f64 = 1.3;
const GOAL_START_VS_REFERENCE: f64 = 0.35;
const GOAL_RSS_MIB: f64 = 64.0;
const GOAL_ADOPTION_VS_DUMPS: f64 = 2.0;
const GOAL_P99_MS: f64 = 50.0;
const GOAL_SCALING: f64 = 2.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceKind {
    File,
    /// The kube source as the daemon defaults it: streaming lists in protobuf.
    Kube,
    /// The kube source reading JSON (`--kube-api-content-type=application/json`).
    KubeJson,
}

impl SourceKind {
    fn name(self) -> &'static str {
        match self {
            SourceKind::File => "file",
            SourceKind::Kube => "kube",
            SourceKind::KubeJson => "kube-json",
        }
    }

    /// Whether the daemon reads the API server double.
    fn kube(self) -> bool {
        self != SourceKind::File
    }
}

struct Args {
    services: usize,
    endpoints: usize,
    sources: Vec<SourceKind>,
    changes: usize,
    small: usize,
    /// Also time the pipelined binding from a multi-thread runtime (`--runtime-probe`).
    runtime_probe: bool,
    /// Stop after the floors (`--floors-only`).
    floors_only: bool,
    /// Run the daemon with `--bind-service-cidrs` over the ClusterIP range
    /// ([`ROUTED_CIDR`]): one local route instead of an address per ClusterIP.
    routed: bool,
    /// Also time the parts of a table read and `ipvsadm -Sn` of the programmed kernel
    /// (`--dump-breakdown`): whose a read's growth with the table's size is.
    dump_breakdown: bool,
    /// Turn the kernel's IPVS rate estimation off in the daemon's namespace
    /// (`--no-rate-estimation`: `net.ipv4.vs.run_estimation=0`), to tell its periodic walk
    /// of every estimator from the daemon's own work in the changes' tail.
    no_rate_estimation: bool,
}

/// The CIDR holding every ClusterIP of the bench ([`cluster::vip`]: 10.100-103.x.y).
const ROUTED_CIDR: &str = cluster::SERVICE_CIDR;

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        services: 10_000,
        endpoints: 5,
        sources: vec![SourceKind::File, SourceKind::Kube],
        changes: 100,
        small: 100,
        runtime_probe: false,
        floors_only: false,
        routed: false,
        dump_breakdown: false,
        no_rate_estimation: false,
    };
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--services" => a.services = value()?.parse()?,
            "--endpoints" => a.endpoints = value()?.parse()?,
            "--changes" => a.changes = value()?.parse()?,
            "--small" => a.small = value()?.parse()?,
            "--runtime-probe" => a.runtime_probe = true,
            "--floors-only" => a.floors_only = true,
            "--bind-service-cidrs" => a.routed = true,
            "--dump-breakdown" => a.dump_breakdown = true,
            "--no-rate-estimation" => a.no_rate_estimation = true,
            "--json" => json = true,
            "--source" => {
                a.sources = match value()?.as_str() {
                    "file" => vec![SourceKind::File],
                    "kube" => vec![SourceKind::Kube],
                    "kube-json" => vec![SourceKind::KubeJson],
                    "both" => vec![SourceKind::File, SourceKind::Kube],
                    "all" => vec![SourceKind::File, SourceKind::Kube, SourceKind::KubeJson],
                    other => bail!("--source {other}: use kube, kube-json, file, both or all"),
                }
            }
            other => bail!(
                "unknown argument {other} (use --services N --endpoints M --source kube|kube-json|file|both|all --changes K --small S --bind-service-cidrs --json)"
            ),
        }
    }
    if json {
        for kind in &mut a.sources {
            if *kind == SourceKind::Kube {
                *kind = SourceKind::KubeJson;
            }
        }
        a.sources.dedup();
    }
    ensure!(
        (1..=250).contains(&a.endpoints) && (1..=250_000).contains(&a.services),
        "table out of range"
    );
    ensure!(
        a.changes <= 750 && a.changes <= a.services.min(a.small),
        "--changes must be at most 750 and at most the number of services"
    );
    Ok(a)
}

fn sh(ns: &Netns, script: &str) -> anyhow::Result<String> {
    let out = ns.sh(script);
    if !out.status.success() {
        bail!(
            "`{script}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `command` in `ns`, timed by the shell inside the namespace.
fn timed(ns: &Netns, command: &str) -> anyhow::Result<Duration> {
    let out = sh(
        ns,
        &format!("t0=$EPOCHREALTIME; {command} >/dev/null; t1=$EPOCHREALTIME; echo \"$t0 $t1\""),
    )?;
    let mut fields = out.split_whitespace().map(str::parse::<f64>);
    let (Some(Ok(t0)), Some(Ok(t1))) = (fields.next(), fields.next()) else {
        bail!("no times from {command}: {out:?}");
    };
    Ok(Duration::from_secs_f64((t1 - t0).max(0.0)))
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn fresh_ns() -> anyhow::Result<Netns> {
    let ns = Netns::new();
    sh(&ns, ENDPOINT_ROUTE)?;
    Ok(ns)
}

/// Reference and floors.
struct Floors {
    ipvsadm_restore: Duration,
    ip_batch: Duration,
    library_batch: Duration,
    vip_floor: Duration,
    table: BTreeSet<String>,
}

impl Floors {
    fn reference(&self) -> Duration {
        self.ipvsadm_restore + self.ip_batch
    }
    fn floor(&self) -> Duration {
        self.library_batch + self.vip_floor
    }
}

fn measure_floors(a: &Args, dir: &Path) -> anyhow::Result<Floors> {
    let expected_rules = a.services * (a.endpoints + 1);
    // ipvsadm and ip -batch in one fresh namespace.
    let refns = fresh_ns()?;
    let rules = dir.join("vm-bench-proxier.rules");
    let batch = dir.join("vm-bench-proxier.addrs");
    std::fs::write(&rules, cluster::restore_file(a.services, a.endpoints))?;
    std::fs::write(&batch, cluster::addr_batch(a.services, "refvip0"))?;
    let ipvsadm_restore = timed(&refns, &format!("ipvsadm -R < {}", rules.display()))?;
    let table = cluster::normalise(&sh(&refns, "ipvsadm -Sn")?);
    ensure!(
        table.len() == expected_rules,
        "ipvsadm -Sn listed {} rules, expected {expected_rules}",
        table.len()
    );
    sh(
        &refns,
        "ip link add refvip0 type dummy && ip link set refvip0 up",
    )?;
    // With --bind-service-cidrs the daemon takes the range with one local route, and so do
    // the reference and the floor: binding N addresses would be work the daemon does not do
    // (and, at 50,000, quadratic kernel work of many minutes).
    let ip_batch = if a.routed {
        timed(
            &refns,
            &format!("ip route add local {ROUTED_CIDR} dev refvip0 table local"),
        )?
    } else {
        timed(&refns, &format!("ip -batch {}", batch.display()))?
    };
    // Emptied but kept: deleting a namespace holding this much is kernel work that would run
    // during the next measurements; a flushed table costs nothing.
    sh(&refns, "ipvsadm -C && ip link del refvip0")?;
    let _ = std::fs::remove_file(&rules);
    let _ = std::fs::remove_file(&batch);

    // The library's batch and the engine's pipelined binding in another fresh namespace
    // (a flushed one would charge the kernel's destination-trash walk).
    let libns = fresh_ns()?;
    let ops = cluster::library_ops(a.services, a.endpoints);
    let vips = cluster::vips(a.services);
    let routed = a.routed;
    let (library_batch, vip_floor) = libns.block_on(|| async move {
        let handle = IpvsHandle::new().await?;
        let t = Instant::now();
        let results = handle.batch(ops).await;
        let library_batch = t.elapsed();
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            bail!("library batch failed: {e}");
        }
        let mut link = KernelAddressBackend::connect("libvip0")?;
        link.ensure_link().await?;
        let t = Instant::now();
        if routed {
            link.add_local_route(ROUTED_CIDR.parse()?).await?;
        } else {
            let bound = link.add_addresses(&vips).await;
            if let Some(Err(e)) = bound.iter().find(|r| r.is_err()) {
                bail!("binding addresses failed: {e}");
            }
        }
        let vip_floor = t.elapsed();
        handle.flush().await?;
        link.delete_link().await?;
        Ok((library_batch, vip_floor))
    })?;
    if a.runtime_probe {
        let probe = fresh_ns()?;
        let vips = cluster::vips(a.services);
        let multi = multi_thread_binding(&probe, vips)?;
        println!(
            "probe: the same pipelined binding from a multi-thread runtime's block_on (the daemon's layout): {:.2} s, against {:.2} s on a current-thread runtime",
            secs(multi),
            secs(vip_floor)
        );
    }
    let binding = if a.routed {
        format!("one local route for {ROUTED_CIDR}")
    } else {
        format!("{} VIPs", a.services)
    };
    println!(
        "reference: ipvsadm -R {:.2} s + ip {binding} {:.2} s = {:.2} s; floor: library batch {:.2} s + {binding} {:.2} s = {:.2} s",
        secs(ipvsadm_restore),
        secs(ip_batch),
        secs(ipvsadm_restore + ip_batch),
        secs(library_batch),
        secs(vip_floor),
        secs(library_batch + vip_floor)
    );
    Ok(Floors {
        ipvsadm_restore,
        ip_batch,
        library_batch,
        vip_floor,
        table,
    })
}

/// Binds `vips` in `ns` as the daemon does: from the `block_on` future of a multi-thread
/// runtime, the rtnetlink connection spawned onto its workers.
fn multi_thread_binding(ns: &Netns, vips: Vec<IpAddr>) -> anyhow::Result<Duration> {
    let path = ns.path();
    std::thread::scope(|scope| {
        scope
            .spawn(move || -> anyhow::Result<Duration> {
                let file = std::fs::File::open(&path)?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)?;
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let mut link = KernelAddressBackend::connect("probe0")?;
                    link.ensure_link().await?;
                    let t = Instant::now();
                    let bound = link.add_addresses(&vips).await;
                    let took = t.elapsed();
                    if let Some(Err(e)) = bound.iter().find(|r| r.is_err()) {
                        bail!("binding addresses failed: {e}");
                    }
                    link.delete_link().await?;
                    Ok(took)
                })
            })
            .join()
            .map_err(|_| anyhow::anyhow!("probe thread panicked"))?
    })
}

/// What one source's run measured.
struct SourceRun {
    kind: SourceKind,
    program: Duration,
    first: Phases,
    first_ops: String,
    rss_mib: f64,
    hwm_mib: f64,
    adoption: Duration,
    adoption_phases: Phases,
    adoption_writes: u64,
    adoption_ops: String,
    /// Every adoption's time, in the order run (the fields above are the median run's).
    adoption_runs: Vec<Duration>,
    dump_table: Duration,
    /// The CPU time of that read.
    dump_table_cpu: ProcessCpu,
    dump_addresses: Duration,
    /// Every dump pair's time (`table()` + address dump), in the order run (the fields
    /// above are the median pair's).
    dump_runs: Vec<Duration>,
    adoption_cpu: AdoptionCpu,
    /// With `--dump-breakdown`.
    dump_parts: Option<DumpParts>,
    rss_adopted_mib: f64,
    /// File source: the one change; kube: the K changes.
    changes: Vec<Duration>,
    change_ops: String,
    change_failed: u64,
    rss_after_changes_mib: f64,
    /// The slowest changes (kube source: with when each was made).
    slowest_changes: Vec<SlowChange>,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Waits until a sync leaves the reference table in the kernel; returns when.
fn wait_programmed(
    daemon: &mut BenchDaemon,
    ns: &Netns,
    table: &BTreeSet<String>,
    timeout: Duration,
) -> anyhow::Result<(usize, Instant)> {
    let mut n = 0;
    loop {
        n += 1;
        let (sync, at) = daemon.wait_sync(n, timeout)?;
        let now = cluster::normalise(&sh(ns, "ipvsadm -Sn")?);
        if &now == table {
            return Ok((n, at));
        }
        println!(
            "sync #{n} left {} rules (want {}); waiting for the next: {sync}",
            now.len(),
            table.len()
        );
        if n >= 5 {
            let missing: Vec<_> = table.difference(&now).take(3).collect();
            let extra: Vec<_> = now.difference(table).take(3).collect();
            bail!("table never matched the reference; missing {missing:?}, extra {extra:?}");
        }
    }
}

/// One of the slowest changes of a run.
#[derive(Debug, Clone, Copy)]
struct SlowChange {
    /// Its place among the changes (0-based).
    index: usize,
    /// When it was made, seconds since the first change.
    at_s: f64,
    /// How long it took, event to kernel.
    ms: f64,
}

/// The three slowest of `changes`, slowest first (`made_at`: when each was made; empty
/// when unknown).
fn slowest_changes(changes: &[Duration], made_at: &[Duration]) -> Vec<SlowChange> {
    let mut all: Vec<SlowChange> = changes
        .iter()
        .enumerate()
        .map(|(index, took)| SlowChange {
            index,
            at_s: made_at.get(index).map_or(f64::NAN, Duration::as_secs_f64),
            ms: took.as_secs_f64() * 1e3,
        })
        .collect();
    all.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    all.truncate(3);
    all
}

/// The parts of reading a programmed table, each timed alone on the same kernel.
#[derive(Debug, Clone, Copy)]
struct DumpParts {
    /// One dump of the services alone (no destinations): the dump the kernel resumes by
    /// walking its service table from the start for every message.
    services: Duration,
    /// The library's best-effort read: one service dump, then every service's destinations.
    best_effort: Duration,
    /// `ipvsadm -Sn`: the reference tool's read of the same table (one service dump and
    /// a destination dump per service, printed).
    ipvsadm: Duration,
}

/// Times [`DumpParts`] in `ns` (programmed).
fn dump_parts(ns: &Netns) -> anyhow::Result<DumpParts> {
    let (services, best_effort) = ns.block_on(|| async {
        let handle = IpvsHandle::new().await?;
        let t = Instant::now();
        let listed: Vec<_> = handle.services().collect().await;
        let services = t.elapsed();
        ensure!(
            !listed.is_empty() && listed.iter().all(Result::is_ok),
            "the service dump failed or was empty"
        );
        let t = Instant::now();
        let table = handle.table_best_effort().await?;
        let best_effort = t.elapsed();
        ensure!(table.len() == listed.len(), "the reads disagree");
        anyhow::Ok((services, best_effort))
    })?;
    let ipvsadm = timed(ns, "ipvsadm -Sn")?;
    Ok(DumpParts {
        services,
        best_effort,
        ipvsadm,
    })
}

/// Times the library's `table()` and a dump of `kube-ipvs0`'s addresses and local routes
/// in `ns`.
fn dump_floor(ns: &Netns) -> anyhow::Result<DumpFloor> {
    ns.block_on(|| async {
        let handle = IpvsHandle::new().await?;
        // This process's CPU time: the read's threads (the API double in it is idle).
        let cpu = ProcessCpu::of("self")?;
        let t = Instant::now();
        let table = handle.table().await?;
        let table_time = t.elapsed();
        let table_cpu = ProcessCpu::of("self")? - cpu;
        let mut link = KernelAddressBackend::connect("kube-ipvs0")?;
        let t = Instant::now();
        let addresses = link.list_addresses().await?;
        // With --bind-service-cidrs the link holds a route instead (read on adoption too).
        let routes = link.list_local_routes().await?;
        let address_time = t.elapsed();
        let link_empty = addresses.is_empty() && routes.is_empty();
        ensure!(!table.is_empty() && !link_empty, "nothing programmed");
        Ok(DumpFloor {
            table: table_time,
            table_cpu,
            addresses: address_time,
            bound: addresses.len(),
        })
    })
}

/// What reading the programmed kernel costs the library alone.
struct DumpFloor {
    /// A verified `table()`.
    table: Duration,
    /// Its CPU time (its threads, user and system).
    table_cpu: ProcessCpu,
    /// A dump of the link's addresses and routes.
    addresses: Duration,
    /// Addresses on the link.
    bound: usize,
}

/// Where the CPU went while the daemon adopted the kernel (from its start to its first
/// sync seen).
struct AdoptionCpu {
    /// The daemon's, all its threads.
    daemon: ProcessCpu,
    /// This process's: the API double serving the lists, and the wait for the sync.
    harness: f64,
    /// The share of the machine's CPUs busy (0 to 1), all processes.
    busy: f64,
    /// The machine's CPUs.
    cpus: usize,
}

impl DumpFloor {
    /// The pair the adoption is measured against: `table()` and the address dump.
    fn total(&self) -> Duration {
        self.table + self.addresses
    }
}

/// One restart adoption.
struct Adoption {
    /// From the daemon's start to its first sync.
    took: Duration,
    cpu: AdoptionCpu,
    phases: Phases,
    /// Kernel writes (expected none).
    writes: u64,
    /// The kernel ops, described.
    ops: String,
}

/// How many times each restart adoption and its dumps are measured: the report keeps the
/// median run.
const ADOPTION_ROUNDS: usize = 3;

/// The median of `runs` by `key` (the upper one of an even count).
fn median_by_key<T>(mut runs: Vec<T>, key: impl Fn(&T) -> Duration) -> T {
    runs.sort_by_key(|run| key(run));
    runs.swap_remove(runs.len() / 2)
}

/// Durations as `1.23, 1.25, 1.31 s`.
fn list_secs(runs: &[Duration]) -> String {
    let parts: Vec<String> = runs.iter().map(|d| format!("{:.2}", secs(*d))).collect();
    format!("{} s", parts.join(", "))
}

/// ADOPTION_ROUNDS restart adoptions of the programmed kernel, each a fresh daemon (the one
/// before stopped) whose first sync must write nothing; `log(n)` names the n-th daemon's log
/// (from 2). Returns them in the order run and the last daemon, still running.
fn restart_adoptions(
    ns: &Netns,
    source: &Source,
    log: &dyn Fn(u32) -> PathBuf,
    extra: &[&str],
    timeout: Duration,
) -> anyhow::Result<(Vec<Adoption>, BenchDaemon)> {
    let mut adoptions = Vec::new();
    let mut last: Option<BenchDaemon> = None;
    for round in 0..ADOPTION_ROUNDS {
        if let Some(mut previous) = last.take() {
            previous.stop();
        }
        let (machine, harness) = (MachineCpu::now()?, ProcessCpu::of("self")?);
        let log_n = 2 + u32::try_from(round)?;
        let mut daemon = BenchDaemon::start(ns, source, &log(log_n), "1h", extra)?;
        let (adopt_sync, adopted_at) = daemon.wait_sync(1, timeout)?;
        let took = adopted_at - daemon.started;
        let cpu = AdoptionCpu {
            daemon: daemon.cpu()?,
            harness: (ProcessCpu::of("self")? - harness).total(),
            busy: MachineCpu::now()?.busy_share_since(machine),
            cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        };
        let phases = daemon.phases(1);
        let scraped = metrics::scrape(ns, METRICS)?;
        let ops = metrics::netlink_ops(&scraped);
        let writes: u64 = ops.values().sum();
        let described = metrics::describe(&ops);
        // Which whole-table reads the adoption made (best-effort, verified).
        let table_reads = metrics::samples(&scraped, "ipvs_proxier_ipvs_table_reads_total");
        println!(
            "adoption {}/{ADOPTION_ROUNDS}: adopted in {:.2} s, kernel ops {described}, IPVS table reads {table_reads:?}: {phases}",
            round + 1,
            secs(took)
        );
        println!(
            "  adoption CPU: the daemon {:.2} s user + {:.2} s system ({} page faults), the API double and this harness {:.2} s; the machine's {} CPUs {:.0} % busy",
            cpu.daemon.user,
            cpu.daemon.system,
            daemon.minor_faults()?,
            cpu.harness,
            cpu.cpus,
            cpu.busy * 100.0
        );
        if round == 0 {
            for line in daemon.log().lines().filter(|line| {
                LogEvent::parse(line).is_some_and(|e| {
                    STARTUP_EVENTS.contains(&e.message()) || e.message() == NFTABLES_ADOPTED
                })
            }) {
                println!("  daemon log: {line}");
            }
        }
        ensure!(
            adopt_sync.u64("writes") == Some(0) && writes == 0,
            "restart adoption {} wrote to the kernel ({described}): {adopt_sync}",
            round + 1
        );
        adoptions.push(Adoption {
            took,
            cpu,
            phases,
            writes,
            ops: described,
        });
        last = Some(daemon);
    }
    let Some(daemon) = last else {
        bail!("no adoption run");
    };
    Ok((adoptions, daemon))
}

/// K single-endpoint changes through the API double, each timed to the kernel: when it was
/// made (since the first) and how long it took.
fn kube_changes(
    ns: &Netns,
    api: &ApiInNetns,
    services: usize,
    m: usize,
    count: usize,
) -> anyhow::Result<Vec<(Duration, Duration)>> {
    ns.block_on(|| async {
        let handle = IpvsHandle::new().await?;
        let mut samples = Vec::with_capacity(count);
        let first = Instant::now();
        for k in 0..count {
            let i = (k * 7919) % services;
            let mut endpoints = cluster::initial_endpoints(i, m);
            let new = cluster::replacement(k);
            endpoints[0] = new;
            let key = cluster::service_key(i);
            let t = Instant::now();
            api.set_endpoints(i, &endpoints);
            let seen =
                wait_for_destination(&handle, &key, IpAddr::V4(new), Duration::from_secs(60))
                    .await?;
            samples.push((t - first, seen - t));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(samples)
    })
}

fn run_source(
    kind: SourceKind,
    a: &Args,
    floors: &Floors,
    dir: &Path,
    timeout: Duration,
) -> anyhow::Result<SourceRun> {
    println!("--- {} source ---", kind.name());
    let ns = fresh_ns()?;
    if a.no_rate_estimation {
        sh(&ns, "sysctl -qw net.ipv4.vs.run_estimation=0")?;
        println!("IPVS rate estimation off in the daemon's namespace");
    }
    let source_path = dir.join("vm-bench-proxier.yaml");
    let m = a.endpoints;
    let mut api = None;
    let source = match kind {
        SourceKind::File => {
            let t = Instant::now();
            std::fs::write(
                &source_path,
                cluster::source_file(a.services, |i| cluster::initial_endpoints(i, m)),
            )?;
            println!(
                "source file: {:.1} MiB, generated in {:.2} s",
                std::fs::metadata(&source_path)?.len() as f64 / (1024.0 * 1024.0),
                secs(t.elapsed())
            );
            Source::File(source_path.clone())
        }
        SourceKind::Kube | SourceKind::KubeJson => {
            let double = ApiInNetns::start(&ns)?;
            let t = Instant::now();
            double.fill(a.services, m);
            if kind == SourceKind::Kube {
                // Encoded once after filling, as a real server's cache holds them.
                double.api().prepare_protobuf();
            }
            println!(
                "API double: {} Services + {} EndpointSlices, filled in {:.2} s",
                a.services,
                a.services,
                secs(t.elapsed())
            );
            let url = double.api().url();
            // What serving the daemon's two big lists costs the double alone (same VM).
            let host = url.trim_start_matches("http://");
            for path in [
                "/api/v1/services",
                "/apis/discovery.k8s.io/v1/endpointslices",
            ] {
                let took = timed(
                    &ns,
                    &format!(
                        "printf 'GET {path}?labelSelector=%%21service.kubernetes.io%%2Fservice-proxy-name HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' | socat -T60 -t60 - TCP:{host}"
                    ),
                )?;
                println!(
                    "API double: one list of {path} served in {:.2} s",
                    secs(took)
                );
            }
            api = Some(double);
            Source::Kube(url)
        }
    };
    let log = |n: u32| -> PathBuf { dir.join(format!("vm-bench-proxier-{}-{n}.log", kind.name())) };

    // Start to programmed.
    let routed_flag = format!("--bind-service-cidrs={ROUTED_CIDR}");
    let mut extra: Vec<&str> = if a.routed {
        vec![&routed_flag, "--ipvs-strict-arp"]
    } else {
        Vec::new()
    };
    if kind == SourceKind::KubeJson {
        extra.push("--kube-api-content-type=application/json");
    }
    let mut daemon = BenchDaemon::start(&ns, &source, &log(1), "1h", &extra)?;
    let (n, programmed_at) = wait_programmed(&mut daemon, &ns, &floors.table, timeout)?;
    let program = programmed_at - daemon.started;
    let first = daemon.phases(n);
    let vips: usize = sh(&ns, "ip -o -4 addr show dev kube-ipvs0 | wc -l")?
        .trim()
        .parse()
        .unwrap_or(0);
    if a.routed {
        let routes = sh(&ns, "ip route show table local dev kube-ipvs0")?;
        ensure!(
            vips == 0 && routes.contains(&format!("local {ROUTED_CIDR}")),
            "--bind-service-cidrs: {vips} VIPs bound on kube-ipvs0, routes {routes}"
        );
    } else {
        ensure!(
            vips == a.services,
            "{vips} VIPs bound on kube-ipvs0, want {}",
            a.services
        );
    }
    let first_ops = metrics::describe(&metrics::netlink_ops(&metrics::scrape(&ns, METRICS)?));
    println!("programmed in {:.2} s: {first}", secs(program));
    // The start-up events and the first sync as the daemon logged them (JSON lines).
    for line in daemon
        .log()
        .lines()
        .filter(|line| LogEvent::parse(line).is_some_and(|e| STARTUP_EVENTS.contains(&e.message())))
    {
        println!("  daemon log: {line}");
    }
    std::thread::sleep(Duration::from_secs(2));
    let (rss, hwm) = daemon.memory_kib()?;
    println!(
        "RSS {:.1} MiB (peak {:.1} MiB; {})",
        mib(rss),
        mib(hwm),
        daemon.memory_detail()?
    );

    // Restart adoption, against the library's reads of the same kernel: each measured
    // ADOPTION_ROUNDS times and the median run kept (one TCG sample of either moves by as
    // much as 15 % from run to run).
    daemon.stop();
    drop(daemon);
    let mut floors = Vec::new();
    for _ in 0..ADOPTION_ROUNDS {
        let floor = dump_floor(&ns)?;
        println!(
            "library table() {:.2} s ({:.2} s user + {:.2} s system CPU) + address dump ({} addresses) {:.3} s",
            secs(floor.table),
            floor.table_cpu.user,
            floor.table_cpu.system,
            floor.bound,
            secs(floor.addresses)
        );
        floors.push(floor);
    }
    let dump_runs: Vec<Duration> = floors.iter().map(DumpFloor::total).collect();
    let floor = median_by_key(floors, DumpFloor::total);
    let dump_parts = if a.dump_breakdown {
        let parts = dump_parts(&ns)?;
        println!(
            "table read parts: service dump alone {:.2} s, best-effort table {:.2} s, ipvsadm -Sn {:.2} s",
            secs(parts.services),
            secs(parts.best_effort),
            secs(parts.ipvsadm)
        );
        Some(parts)
    } else {
        None
    };
    let (adoptions, mut daemon) = restart_adoptions(&ns, &source, &log, &extra, timeout)?;
    std::thread::sleep(Duration::from_secs(2));
    let (rss_adopted, _) = daemon.memory_kib()?;
    let adoption_runs: Vec<Duration> = adoptions.iter().map(|run| run.took).collect();
    let adoption = median_by_key(adoptions, |run| run.took);
    println!(
        "adoption, median of {ADOPTION_ROUNDS}: {:.2} s (runs {}) against the dumps' median {:.2} s (runs {})",
        secs(adoption.took),
        list_secs(&adoption_runs),
        secs(floor.total()),
        list_secs(&dump_runs)
    );

    // Endpoint changes.
    let before = metrics::netlink_ops(&metrics::scrape(&ns, METRICS)?);
    // When each change was made, since the first (kube source).
    let mut made_at = Vec::new();
    let changes = match kind {
        SourceKind::File => {
            let text = cluster::source_file(a.services, |i| {
                let mut e = cluster::initial_endpoints(i, m);
                if i == 0 {
                    e[0] = cluster::replacement(0);
                }
                e
            });
            let tmp = source_path.with_extension("tmp");
            std::fs::write(&tmp, text)?;
            let key = cluster::service_key(0);
            let new = IpAddr::V4(cluster::replacement(0));
            let seen = ns.block_on(|| async {
                let handle = IpvsHandle::new().await?;
                let t = Instant::now();
                std::fs::rename(&tmp, &source_path)?;
                let seen = wait_for_destination(&handle, &key, new, timeout).await?;
                anyhow::Ok(seen - t)
            })?;
            vec![seen]
        }
        SourceKind::Kube | SourceKind::KubeJson => {
            let Some(api) = &api else {
                bail!("kube source without its double");
            };
            let timed = kube_changes(&ns, api, a.services, m, a.changes)?;
            made_at = timed.iter().map(|(at, _)| *at).collect();
            timed.into_iter().map(|(_, took)| took).collect()
        }
    };
    std::thread::sleep(Duration::from_millis(500));
    let after = metrics::netlink_ops(&metrics::scrape(&ns, METRICS)?);
    let delta = metrics::delta(&before, &after);
    let (rss_after, _) = daemon.memory_kib()?;
    println!(
        "{} change(s): {}; kernel ops {}",
        changes.len(),
        Percentiles::of(&changes).map_or("none".into(), |p| p.to_string()),
        metrics::describe(&delta)
    );
    // Which changes the tail is made of (in order of the changes, 0-based), and the syncs
    // that took longest while they ran.
    let slowest = slowest_changes(&changes, &made_at);
    let described: Vec<String> = slowest
        .iter()
        .map(|c| format!("#{} made at {:.2} s: {:.1} ms", c.index, c.at_s, c.ms))
        .collect();
    println!("  slowest changes: {}", described.join(", "));
    for sync in daemon.syncs().iter().rev().take(2).rev() {
        println!("  last syncs: {sync}");
    }
    daemon.stop();
    let _ = std::fs::remove_file(&source_path);
    Ok(SourceRun {
        kind,
        program,
        first,
        first_ops,
        rss_mib: mib(rss),
        hwm_mib: mib(hwm),
        adoption: adoption.took,
        adoption_phases: adoption.phases,
        adoption_writes: adoption.writes,
        adoption_ops: adoption.ops,
        adoption_runs,
        dump_table: floor.table,
        dump_table_cpu: floor.table_cpu,
        dump_addresses: floor.addresses,
        dump_runs,
        adoption_cpu: adoption.cpu,
        dump_parts,
        rss_adopted_mib: mib(rss_adopted),
        change_failed: metrics::failed(&delta),
        change_ops: metrics::describe(&delta),
        changes,
        rss_after_changes_mib: mib(rss_after),
        slowest_changes: slowest,
    })
}

/// The K kube-source changes on a small cluster.
fn small_latency(a: &Args, dir: &Path) -> anyhow::Result<Vec<Duration>> {
    println!("--- kube source, {} services ---", a.small);
    let ns = fresh_ns()?;
    let api = ApiInNetns::start(&ns)?;
    api.fill(a.small, a.endpoints);
    let source = Source::Kube(api.api().url());
    let mut daemon = BenchDaemon::start(
        &ns,
        &source,
        &dir.join("vm-bench-proxier-small.log"),
        "1h",
        &[],
    )?;
    daemon.wait_sync(1, Duration::from_secs(300))?;
    let samples: Vec<Duration> = kube_changes(&ns, &api, a.small, a.endpoints, a.changes)?
        .into_iter()
        .map(|(_, took)| took)
        .collect();
    daemon.stop();
    Ok(samples)
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    println!(
        "vm-bench-proxier: {} ClusterIP TCP services x {} endpoints, sources {:?}, {} changes, small cluster {}",
        a.services,
        a.endpoints,
        a.sources.iter().map(|s| s.name()).collect::<Vec<_>>(),
        a.changes,
        a.small
    );
    let timeout = Duration::from_secs(120 + (a.services as u64) / 10);
    // nft's `reject` needs these; the VM's busybox modprobe cannot autoload them by alias.
    for module in [
        "nf_reject_ipv4",
        "nf_reject_ipv6",
        "nft_reject_ipv4",
        "nft_reject_ipv6",
    ] {
        let _ = Command::new("modprobe").arg(module).status();
    }
    let dir = std::env::temp_dir();
    let floors = measure_floors(&a, &dir)?;
    if a.floors_only {
        return Ok(());
    }
    let mut runs = Vec::new();
    for kind in &a.sources {
        runs.push(run_source(*kind, &a, &floors, &dir, timeout)?);
    }
    let small = if a.sources.iter().any(|kind| kind.kube()) {
        Some(small_latency(&a, &dir)?)
    } else {
        None
    };
    print_report(&a, &floors, &runs, small.as_deref())?;
    report::emit(&json_report(&a, &floors, &runs, small.as_deref()));
    Ok(())
}

/// The run's figures for `cargo xtask bench-report` (seconds, MiB, milliseconds).
fn json_report(
    a: &Args,
    floors: &Floors,
    runs: &[SourceRun],
    small: Option<&[Duration]>,
) -> serde_json::Value {
    let sources: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            json!({
                "source": r.kind.name(),
                "program_s": secs(r.program),
                "first_sync": r.first.to_json(),
                "rss_mib": r.rss_mib,
                "peak_rss_mib": r.hwm_mib,
                "adoption_s": secs(r.adoption),
                "adoption_writes": r.adoption_writes,
                "adoption_phases": r.adoption_phases.to_json(),
                "dump_table_s": secs(r.dump_table),
                "dump_table_cpu": {
                    "user_s": r.dump_table_cpu.user,
                    "system_s": r.dump_table_cpu.system,
                },
                "dump_addresses_s": secs(r.dump_addresses),
                "adoption_runs_s": r.adoption_runs.iter().map(|d| secs(*d)).collect::<Vec<f64>>(),
                "dump_runs_s": r.dump_runs.iter().map(|d| secs(*d)).collect::<Vec<f64>>(),
                "adoption_cpu": {
                    "daemon_user_s": r.adoption_cpu.daemon.user,
                    "daemon_system_s": r.adoption_cpu.daemon.system,
                    "harness_s": r.adoption_cpu.harness,
                    "machine_busy": r.adoption_cpu.busy,
                    "cpus": r.adoption_cpu.cpus,
                },
                "dump_parts": r.dump_parts.map(|p| json!({
                    "services_s": secs(p.services),
                    "best_effort_s": secs(p.best_effort),
                    "ipvsadm_s": secs(p.ipvsadm),
                })),
                "rss_adopted_mib": r.rss_adopted_mib,
                "rss_after_changes_mib": r.rss_after_changes_mib,
                "changes": report::percentiles(Percentiles::of(&r.changes)),
                "change_failed_ops": r.change_failed,
                "slowest_changes": r.slowest_changes.iter().map(|c| json!({
                    "index": c.index,
                    "at_s": if c.at_s.is_finite() { json!(c.at_s) } else { Value::Null },
                    "ms": c.ms,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "bench": "proxier",
        "services": a.services,
        "endpoints": a.endpoints,
        "changes": a.changes,
        "small": a.small,
        "bind_service_cidrs": a.routed,
        "no_rate_estimation": a.no_rate_estimation,
        "floors": {
            "ipvsadm_restore_s": secs(floors.ipvsadm_restore),
            "ip_batch_s": secs(floors.ip_batch),
            "library_batch_s": secs(floors.library_batch),
            "vip_binding_s": secs(floors.vip_floor),
        },
        "sources": sources,
        "small_changes": report::percentiles(small.and_then(Percentiles::of)),
    })
}

fn print_report(
    a: &Args,
    floors: &Floors,
    runs: &[SourceRun],
    small: Option<&[Duration]>,
) -> anyhow::Result<()> {
    let mut out = String::new();
    let _ = writeln!(out, "\nFirst sync and adoption, per phase:");
    for r in runs {
        let _ = writeln!(out, "- {} first sync: {}", r.kind.name(), r.first);
        let _ = writeln!(out, "  {} kernel ops: {}", r.kind.name(), r.first_ops);
        let _ = writeln!(out, "- {} adoption: {}", r.kind.name(), r.adoption_phases);
        let _ = writeln!(
            out,
            "  {} adoption reference: table() {:.2} s + address dump {:.3} s; kernel ops {}",
            r.kind.name(),
            secs(r.dump_table),
            secs(r.dump_addresses),
            r.adoption_ops
        );
        let _ = writeln!(
            out,
            "  {} adoption CPU: daemon {:.2} s ({:.2} user + {:.2} system), double and harness {:.2} s, {:.0} % of {} CPUs busy; table() alone {:.2} s ({:.2} user + {:.2} system)",
            r.kind.name(),
            r.adoption_cpu.daemon.total(),
            r.adoption_cpu.daemon.user,
            r.adoption_cpu.daemon.system,
            r.adoption_cpu.harness,
            r.adoption_cpu.busy * 100.0,
            r.adoption_cpu.cpus,
            r.dump_table_cpu.total(),
            r.dump_table_cpu.user,
            r.dump_table_cpu.system
        );
        let _ = writeln!(
            out,
            "  {} RSS: {:.1} MiB after convergence (peak {:.1}), {:.1} after adoption, {:.1} after the changes; change ops {}",
            r.kind.name(),
            r.rss_mib,
            r.hwm_mib,
            r.rss_adopted_mib,
            r.rss_after_changes_mib,
            r.change_ops
        );
    }

    let col = |f: &dyn Fn(&SourceRun) -> String| -> Vec<String> { runs.iter().map(f).collect() };
    let names: Vec<&str> = runs.iter().map(|r| r.kind.name()).collect();
    if a.routed {
        let _ = writeln!(
            out,
            "\nThe daemon ran with --bind-service-cidrs={ROUTED_CIDR} (one local route, no VIP \
             addresses); so did the floor and the reference (the VIP binding column is the route)."
        );
    }
    let _ = writeln!(
        out,
        "\n| step ({} svc x {} ep) | {} | what its parts cost | goal | status |",
        a.services,
        a.endpoints,
        names.join(" | ")
    );
    let _ = writeln!(out, "|---|{}---|---|---|", "---|".repeat(runs.len()));

    let floor = secs(floors.floor());
    let reference = secs(floors.reference());
    let start_ok = runs.iter().all(|r| {
        secs(r.program) <= GOAL_START_VS_FLOOR * floor
            && secs(r.program) <= GOAL_START_VS_REFERENCE * reference
    });
    let _ = writeln!(
        out,
        "| start -> programmed ({} rules + {} VIPs) | {} | library batch {:.2} s + VIP binding {:.2} s = {:.2} s; reference ipvsadm -R {:.2} s + ip -batch {:.2} s = {:.2} s | <= {GOAL_START_VS_FLOOR} x floor = {:.2} s and <= {GOAL_START_VS_REFERENCE} x reference = {:.2} s | {} |",
        a.services * (a.endpoints + 1),
        a.services,
        col(&|r| format!(
            "{:.2} s ({:.2} x floor, {:.2} x ref)",
            secs(r.program),
            secs(r.program) / floor,
            secs(r.program) / reference
        ))
        .join(" | "),
        secs(floors.library_batch),
        secs(floors.vip_floor),
        floor,
        secs(floors.ipvsadm_restore),
        secs(floors.ip_batch),
        reference,
        GOAL_START_VS_FLOOR * floor,
        GOAL_START_VS_REFERENCE * reference,
        met(start_ok)
    );
    let rss_ok = runs.iter().all(|r| r.rss_mib <= GOAL_RSS_MIB);
    let _ = writeln!(
        out,
        "| RSS after convergence | {} | | <= {GOAL_RSS_MIB} MiB | {} |",
        col(&|r| format!("{:.1} MiB", r.rss_mib)).join(" | "),
        met(rss_ok)
    );
    let adoption_ok = runs.iter().all(|r| {
        r.adoption_writes == 0
            && secs(r.adoption) <= GOAL_ADOPTION_VS_DUMPS * secs(r.dump_table + r.dump_addresses)
    });
    let _ = writeln!(
        out,
        "| restart adoption, 0 writes | {} | table() + address dump: {} | <= {GOAL_ADOPTION_VS_DUMPS} x (table() + address dump) | {} |",
        col(&|r| format!(
            "{:.2} s, {} writes ({:.2} x dumps)",
            secs(r.adoption),
            r.adoption_writes,
            secs(r.adoption) / secs(r.dump_table + r.dump_addresses)
        ))
        .join(" | "),
        col(&|r| format!(
            "{} {:.2} s",
            r.kind.name(),
            secs(r.dump_table + r.dump_addresses)
        ))
        .join(", "),
        met(adoption_ok)
    );
    let kube = runs.iter().find(|r| r.kind.kube());
    let big = kube.and_then(|r| Percentiles::of(&r.changes));
    let small = small.and_then(Percentiles::of);
    let latency_cell = |r: &SourceRun| match r.kind {
        SourceKind::File => format!(
            "{:.3} s (file rewrite, re-read whole)",
            r.changes.first().map_or(0.0, |d| secs(*d))
        ),
        SourceKind::Kube | SourceKind::KubeJson => match (Percentiles::of(&r.changes), small) {
            (Some(b), Some(s)) => format!(
                "at {}: p50 {:.1} ms / p99 {:.1} ms; at {}: p50 {:.1} / p99 {:.1} ms",
                a.services,
                secs(b.p50) * 1e3,
                secs(b.p99) * 1e3,
                a.small,
                secs(s.p50) * 1e3,
                secs(s.p99) * 1e3
            ),
            _ => "?".into(),
        },
    };
    let (latency_ok, ratio_text) = match (big, small) {
        (Some(b), Some(s)) => {
            let p50 = secs(b.p50) / secs(s.p50);
            let p99 = secs(b.p99) / secs(s.p99);
            (
                secs(b.p99) * 1e3 <= GOAL_P99_MS && p50 < GOAL_SCALING,
                format!(
                    "ratio {}/{}: p50 {p50:.2}, p99 {p99:.2}",
                    a.services, a.small
                ),
            )
        }
        _ => (false, "no kube-source figures".into()),
    };
    let failed: u64 = runs.iter().map(|r| r.change_failed).sum();
    let _ = writeln!(
        out,
        "| one endpoint change, event -> kernel | {} | {ratio_text}; failed kernel ops {failed} | kube: p99 <= {GOAL_P99_MS} ms, p50 at {} / at {} < {GOAL_SCALING} | {} |",
        col(&latency_cell).join(" | "),
        a.services,
        a.small,
        met(latency_ok && failed == 0)
    );
    print!("{out}");
    println!("vm-bench-proxier: done");
    Ok(())
}
