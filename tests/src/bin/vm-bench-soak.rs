//! Soak at scale, run inside the test VM by `cargo xtask vm-bench soak [--services N]
//! [--endpoints M] [--minutes T] [--faults] [--bind-service-cidrs]` (default 10,000 x 5 for 5
//! minutes).
//!
//! The daemon runs on the kube source (the API server double inside the VM, in the node's
//! namespace) with kube-proxy's default full resync every 30 s. The first services send
//! traffic to five pod namespaces answering on TCP 8080; the rest have endpoints that only
//! need a route. After the first full sync, for T minutes:
//! - one endpoint of a service without traffic is replaced every 100 ms, timed from the API
//!   change to the new destination in the kernel;
//! - a Service (with its slice) is added and the previous one deleted every second, each
//!   timed to the kernel;
//! - a client namespace connects to the ClusterIPs of the traffic services, whose endpoints
//!   all stay, again and again, and each connection must be answered by a pod.
//!
//! With `--bind-service-cidrs` the daemon takes the ClusterIP range with one local route
//! (`--bind-service-cidrs`, with `--ipvs-strict-arp`) instead of binding each ClusterIP on
//! kube-ipvs0: a Service added or deleted then costs no address write, whose kernel cost
//! grows with the addresses the link already holds.
//!
//! Reports failed connections (goal 0), failed kernel ops from the daemon's metrics (goal 0),
//! RSS after convergence and at the end, each 3 s after a full sync (goal: at most 5 %
//! growth), and the p50/p99 of the
//! change-to-kernel latencies. Without `--bind-service-cidrs` it then stops the daemon and
//! times the kernel's own address writes with `ip -batch`, on kube-ipvs0 as the churn left
//! it and on an empty link: what each Service added or deleted pays the kernel for its
//! ClusterIP. The last line is a `VM-BENCH-REPORT` for `cargo xtask bench-report
//! --soak-only`.
//!
//! With `--faults`, three faults land during the churn while the client goes on
//! connecting: the daemon killed with SIGKILL mid-churn and started again (changes are
//! made while it is down), the API server unreachable for 30 s (every request 503, watches
//! cut) and a storm of 410 Gone (every watch expired, once a second for 15 s), changes
//! going on through both. Each fault reports the changes made during it that never reached
//! the kernel (goal 0), the failed connections (goal 0) and how long after its end a new
//! change reached the kernel. Changes timed for the latency figures are the ones outside
//! the faults. At the end, the kernel (IPVS, kube-ipvs0's addresses, the nftables ruleset)
//! is compared with what a freshly started daemon's first full sync makes of it: any
//! difference is a change lost or a leftover.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail, ensure};
use ipvs_netlink::IpvsHandle;
use ipvs_proxier_tests::Netns;
use ipvs_proxier_tests::bench::api::ApiInNetns;
use ipvs_proxier_tests::bench::cluster::{self, ENDPOINT_ROUTE};
use ipvs_proxier_tests::bench::daemon::{BenchDaemon, METRICS, Source};
use ipvs_proxier_tests::bench::latency::{Percentiles, wait_for_destination, wait_for_service};
use ipvs_proxier_tests::bench::metrics;
use ipvs_proxier_tests::bench::phases::{
    ChangeParts, LogEvent, SYNC_WITH_ERRORS, SyncSpan, change_parts, sync_spans,
};
use ipvs_proxier_tests::bench::report;
use serde_json::{Value, json};

/// Services whose endpoints are the pods (never churned).
const TRAFFIC_SERVICES: usize = 10;
/// Pod namespaces answering on 8080.
const PODS: usize = 5;
const GOAL_RSS_GROWTH: f64 = 0.05;
/// Change to kernel during the soak, full resyncs included (the daemon's latency goals).
const GOAL_CHANGE_P99: Duration = Duration::from_millis(50);
const GOAL_CHANGE_MAX: Duration = Duration::from_millis(250);
/// Changes slower than this are listed with their time, to place them among the syncs.
const SLOW: Duration = Duration::from_millis(250);
/// How long the API server is unreachable (`--faults`).
const OUTAGE: Duration = Duration::from_secs(30);
/// How long every watch is expired once a second (`--faults`).
const GONE_STORM: Duration = Duration::from_secs(15);
/// How long the daemon stays down after its SIGKILL, changes going on (`--faults`).
const DOWN: Duration = Duration::from_secs(2);
/// How long a change made during a fault may take to reach the kernel once the first
/// change after the fault has (else it counts as lost).
const LOST_AFTER: Duration = Duration::from_secs(60);

/// A fault injected during the churn (`--faults`).
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// SIGKILL to the daemon, which is started again after [`DOWN`].
    Kill,
    /// The API server fails every request with 503 and cuts the watches for [`OUTAGE`].
    ApiOutage,
    /// Every watch ends with 410 Gone, the event history forgotten, once a second for
    /// [`GONE_STORM`].
    GoneStorm,
}

impl Fault {
    /// When in the churn it lands, as a fraction of the churn's duration.
    const SCHEDULE: [(f64, Fault); 3] = [
        (0.2, Fault::Kill),
        (0.45, Fault::ApiOutage),
        (0.7, Fault::GoneStorm),
    ];

    fn describe(self) -> String {
        match self {
            Fault::Kill => format!(
                "daemon killed (SIGKILL) mid-churn, started again {} s later",
                DOWN.as_secs()
            ),
            Fault::ApiOutage => format!("API server unreachable for {} s", OUTAGE.as_secs()),
            Fault::GoneStorm => format!(
                "every watch ended with 410 Gone, once a second for {} s",
                GONE_STORM.as_secs()
            ),
        }
    }
}

/// What one fault did.
#[derive(Debug)]
struct FaultOutcome {
    fault: Fault,
    /// When it began, from the start of the churn.
    at: Duration,
    /// Endpoint changes made while it lasted.
    changes: usize,
    /// Of those, the ones not in the kernel [`LOST_AFTER`] after the recovery.
    lost: usize,
    /// From the fault's end to the first change made after it seen in the kernel.
    recovery: Duration,
    /// Connections that failed from its start to the end of the lost-change check.
    failed_connections: u64,
}

/// The UTC time of day when `at` was, as `HH:MM:SS.mmm`.
fn wall_clock(at: Instant) -> String {
    let now = std::time::SystemTime::now();
    let then = now.checked_sub(at.elapsed()).unwrap_or(now);
    let since_epoch = then
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let ms = since_epoch.as_millis() % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

struct Args {
    services: usize,
    endpoints: usize,
    minutes: f64,
    faults: bool,
    /// The daemon takes [`cluster::SERVICE_CIDR`] with one local route.
    routed: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        services: 10_000,
        endpoints: 5,
        minutes: 5.0,
        faults: false,
        routed: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--services" => a.services = value()?.parse()?,
            "--endpoints" => a.endpoints = value()?.parse()?,
            "--minutes" => a.minutes = value()?.parse()?,
            "--faults" => a.faults = true,
            "--bind-service-cidrs" => a.routed = true,
            other => bail!(
                "unknown argument {other} (use --services N --endpoints M --minutes T [--faults] [--bind-service-cidrs])"
            ),
        }
    }
    ensure!(
        a.services > TRAFFIC_SERVICES + 10 && a.services <= 200_000,
        "--services must be between {} and 200000",
        TRAFFIC_SERVICES + 11
    );
    ensure!(
        (1..=100).contains(&a.endpoints),
        "--endpoints must be 1..=100"
    );
    ensure!(
        a.minutes > 0.0 && a.minutes <= 60.0,
        "--minutes must be in (0, 60]"
    );
    Ok(a)
}

fn pod_ip(p: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, p as u8 + 1, 2)
}

/// The endpoints of service `i` at churn generation `g` (0: as first programmed).
fn endpoints_at(i: usize, m: usize, g: usize) -> Vec<Ipv4Addr> {
    if i < TRAFFIC_SERVICES {
        return (0..PODS).map(pod_ip).collect();
    }
    let mut e = cluster::initial_endpoints(i, m);
    if g > 0 {
        e[0] = Ipv4Addr::new(10, 200, 100 + (g % 150) as u8, (i % 250 + 1) as u8);
    }
    e
}

/// Enters `ns` on the current thread.
fn enter(ns_path: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(ns_path)?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("setns into {}", ns_path.display()))?;
    Ok(())
}

/// A pod: answers every connection on 8080 with its name, from a thread in its namespace.
fn serve_pod(ns: &Netns, name: String) -> anyhow::Result<()> {
    let path = ns.path();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let listener = enter(&path)
            .and_then(|()| TcpListener::bind("0.0.0.0:8080").context("pod listens on 8080"));
        let listener = match listener {
            Ok(l) => {
                let _ = tx.send(Ok(()));
                l
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.write_all(format!("{name}\n").as_bytes());
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .context("pod server did not start")?
}

/// Client traffic counters.
#[derive(Default)]
struct Traffic {
    ok: AtomicU64,
    failed: AtomicU64,
}

/// Connects to the traffic services' ClusterIPs in turn from the client namespace until
/// `stop`, each connection answered by a pod or counted as failed.
fn client_loop(
    path: std::path::PathBuf,
    traffic: Arc<Traffic>,
    stop: Arc<AtomicBool>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
) -> anyhow::Result<()> {
    enter(&path)?;
    let started = Instant::now();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let vip = cluster::vip(n % TRAFFIC_SERVICES);
        n += 1;
        let addr = SocketAddr::new(IpAddr::V4(vip), 80);
        let result = (|| -> anyhow::Result<String> {
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
            stream.set_read_timeout(Some(Duration::from_secs(3)))?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            ensure!(answer.starts_with("pod-"), "answer {answer:?}");
            Ok(answer)
        })();
        match result {
            Ok(_) => {
                traffic.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                traffic.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut f) = failures.lock()
                    && f.len() < 20
                {
                    f.push(format!(
                        "{:.1} s: {addr}: {e}",
                        started.elapsed().as_secs_f64()
                    ));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The endpoint churn: the first endpoint of one churned service replaced per step, the
/// services in turn.
struct EndpointChurn {
    /// Each service's churn generation (see [`endpoints_at`]).
    generation: Vec<usize>,
    steps: usize,
    m: usize,
}

impl EndpointChurn {
    fn new(services: usize, m: usize) -> Self {
        EndpointChurn {
            generation: vec![0; services],
            steps: 0,
            m,
        }
    }

    /// Replaces the next service's first endpoint in the API; returns the service and its
    /// new endpoint.
    fn step(&mut self, api: &ApiInNetns) -> (usize, Ipv4Addr) {
        let i = TRAFFIC_SERVICES + self.steps % (self.generation.len() - TRAFFIC_SERVICES);
        self.steps += 1;
        self.generation[i] += 1;
        let endpoints = endpoints_at(i, self.m, self.generation[i]);
        api.set_endpoints(i, &endpoints);
        (i, endpoints[0])
    }
}

/// What a fault acts on and the recovery is checked against.
struct Target<'a> {
    node: &'a Netns,
    api: &'a ApiInNetns,
    handle: &'a IpvsHandle,
    traffic: &'a Traffic,
}

/// Steps the churn every 100 ms for `period` without waiting for the kernel, noting each
/// service's latest new endpoint in `pending`; returns the number of changes.
async fn churn_unwaited(
    period: Duration,
    api: &ApiInNetns,
    churn: &mut EndpointChurn,
    pending: &mut BTreeMap<usize, Ipv4Addr>,
) -> usize {
    let end = Instant::now() + period;
    let mut changes = 0;
    while Instant::now() < end {
        let (i, endpoint) = churn.step(api);
        pending.insert(i, endpoint);
        changes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    changes
}

/// Injects `fault` while the churn goes on, then times the first change made after it to
/// the kernel and checks that every change made during it got there. A kill adds the
/// killed daemon's netlink op counts to `ended_lives`.
async fn inject(
    fault: Fault,
    target: &Target<'_>,
    daemon: &mut BenchDaemon,
    ended_lives: &mut Option<BTreeMap<String, u64>>,
    churn: &mut EndpointChurn,
    recovery_timeout: Duration,
) -> anyhow::Result<FaultOutcome> {
    let failed_before = target.traffic.failed.load(Ordering::Relaxed);
    let mut pending = BTreeMap::new();
    let api = target.api;
    let changes = match fault {
        Fault::Kill => {
            let ops = metrics::netlink_ops(&metrics::scrape(target.node, METRICS)?);
            let so_far = ended_lives.take().unwrap_or_default();
            *ended_lives = Some(metrics::add(&so_far, &ops));
            daemon.stop();
            let changes = churn_unwaited(DOWN, api, churn, &mut pending).await;
            daemon.restart()?;
            changes
        }
        Fault::ApiOutage => {
            api.api().set_outage(true);
            let changes = churn_unwaited(OUTAGE, api, churn, &mut pending).await;
            api.api().set_outage(false);
            changes
        }
        Fault::GoneStorm => {
            let end = Instant::now() + GONE_STORM;
            let mut changes = 0;
            while Instant::now() < end {
                api.api().expire_watches();
                changes += churn_unwaited(Duration::from_secs(1), api, churn, &mut pending).await;
            }
            changes
        }
    };
    let ended = Instant::now();
    let (i, endpoint) = churn.step(api);
    // Its service may have changed during the fault too: this change is its latest.
    pending.remove(&i);
    let seen = wait_for_destination(
        target.handle,
        &cluster::service_key(i),
        IpAddr::V4(endpoint),
        recovery_timeout,
    )
    .await
    .with_context(|| format!("after the fault ({})", fault.describe()))?;
    let deadline = seen + LOST_AFTER;
    let mut lost = 0;
    for (i, endpoint) in pending {
        let left = deadline.saturating_duration_since(Instant::now());
        let key = cluster::service_key(i);
        if wait_for_destination(target.handle, &key, IpAddr::V4(endpoint), left)
            .await
            .is_err()
        {
            println!("  lost: {endpoint} of service {i} (changed during the fault)");
            lost += 1;
        }
    }
    Ok(FaultOutcome {
        fault,
        at: Duration::ZERO,
        changes,
        lost,
        recovery: seen - ended,
        failed_connections: target.traffic.failed.load(Ordering::Relaxed) - failed_before,
    })
}

/// The kernel as the daemon keeps it, one line per fact: IPVS (`ipvsadm -Sn`),
/// kube-ipvs0's addresses and the nftables ruleset with each set element on its own line
/// (so the order the kernel lists them in does not matter).
fn kernel_picture(node: &Netns) -> BTreeSet<String> {
    let mut picture: BTreeSet<String> = cluster::normalise(&node.sh_ok("ipvsadm -Sn"))
        .into_iter()
        .map(|line| format!("ipvs: {line}"))
        .collect();
    picture.extend(
        node.sh_ok("ip -o addr show dev kube-ipvs0")
            .lines()
            .filter_map(|line| line.split_whitespace().nth(3))
            .map(|address| format!("kube-ipvs0: {address}")),
    );
    picture.extend(nft_picture(&node.sh_ok("nft list ruleset")));
    picture
}

/// `nft list ruleset` as lines prefixed with their table, and each set element as
/// `TABLE set NAME: element E`.
fn nft_picture(ruleset: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let (mut table, mut set) = (String::new(), String::new());
    let mut elements: Option<String> = None;
    for line in ruleset.lines().map(str::trim) {
        let text = match elements.take() {
            Some(mut so_far) => {
                so_far.push(' ');
                so_far.push_str(line);
                so_far
            }
            None => match line.strip_prefix("elements = {") {
                Some(rest) => rest.to_owned(),
                None => {
                    if let Some(name) = line.strip_prefix("table ") {
                        table = name.trim_end_matches('{').trim().to_owned();
                    } else if let Some(name) = line.strip_prefix("set ") {
                        set = name.trim_end_matches('{').trim().to_owned();
                    }
                    out.insert(format!("{table}: {line}"));
                    continue;
                }
            },
        };
        match text.strip_suffix('}') {
            Some(all) => out.extend(
                all.split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .map(|e| format!("{table} set {set}: element {e}")),
            ),
            None => elements = Some(text),
        }
    }
    out
}

/// Kills the converged daemon, starts it afresh and compares the kernel before with what
/// its first full sync makes of it: facts only the fresh plan has (a change lost) and
/// facts only the kernel had (a leftover). Returns the two, the fresh sync's time and the
/// number of facts.
fn fresh_start_check(
    daemon: &mut BenchDaemon,
    node: &Netns,
    timeout: Duration,
) -> anyhow::Result<(Vec<String>, Vec<String>, Duration, usize)> {
    let before = kernel_picture(node);
    let syncs = daemon.syncs().len();
    daemon.restart()?;
    daemon
        .wait_sync(syncs + 1, timeout)
        .context("the fresh daemon's first sync")?;
    let took = daemon.started.elapsed();
    let after = kernel_picture(node);
    let missing = after.difference(&before).cloned().collect();
    let leftover = before.difference(&after).cloned().collect();
    Ok((missing, leftover, took, after.len()))
}

/// Addresses the kernel's own address writes are timed with: from the benchmarking range
/// (198.18.0.0/15), bound only on links of the node's namespace, never a ClusterIP.
const YARDSTICK_ADDRESSES: usize = 200;

/// What one address write costs the kernel alone on `link` of `node`: `ip -batch` binding
/// [`YARDSTICK_ADDRESSES`] addresses one by one (a request and its answer each, as the
/// daemon binds one), then unbinding them; the time of each batch over its writes, for a
/// bind and for an unbind. The process start of each batch is in its time, divided among
/// its writes.
fn address_write_cost(node: &Netns, link: &str) -> anyhow::Result<(Duration, Duration)> {
    let batch = |verb: &str| -> String {
        (0..YARDSTICK_ADDRESSES)
            .map(|i| {
                format!(
                    "address {verb} 198.18.{}.{}/32 dev {link}\n",
                    i / 250,
                    i % 250 + 1
                )
            })
            .collect()
    };
    let mut each = Vec::new();
    for verb in ["add", "del"] {
        let path = std::env::temp_dir().join(format!("vm-bench-soak-{link}-{verb}.batch"));
        std::fs::write(&path, batch(verb))?;
        let t = Instant::now();
        let out = node.sh(&format!("ip -batch {}", path.display()));
        let took = t.elapsed();
        ensure!(
            out.status.success(),
            "ip -batch of address {verb} on {link}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        each.push(took / YARDSTICK_ADDRESSES as u32);
    }
    Ok((each[0], each[1]))
}

/// Where each Service add + delete's time went: its window set against the daemon's
/// incremental syncs that started in it ([`change_parts`]); printed, and returned for the
/// report (`null` when no window could be set against a sync).
fn service_change_parts(windows: &[(SystemTime, Duration)], syncs: &[SyncSpan]) -> Value {
    let mut parts: Vec<(Duration, ChangeParts)> = windows
        .iter()
        .filter_map(|&(made, took)| change_parts(made, took, syncs).map(|parts| (took, parts)))
        .collect();
    if parts.is_empty() {
        return Value::Null;
    }
    let of = |part: fn(&ChangeParts) -> Duration| {
        Percentiles::of(&parts.iter().map(|(_, p)| part(p)).collect::<Vec<_>>())
    };
    let until = of(|p| p.until_first_sync);
    let address = of(|p| p.address_writes);
    let in_syncs = of(|p| p.sync_time);
    let mut counts: Vec<usize> = parts.iter().map(|(_, p)| p.syncs).collect();
    counts.sort_unstable();
    let syncs_p50 = counts[counts.len() / 2];
    // The slowest 1 % (at least one): what their time was made of, on average.
    parts.sort_by_key(|(took, _)| std::cmp::Reverse(*took));
    let slowest = &parts[..(parts.len() / 100).max(1)];
    let mean_ms = |part: &dyn Fn(&(Duration, ChangeParts)) -> Duration| {
        slowest.iter().map(|p| part(p).as_secs_f64()).sum::<f64>() * 1e3 / slowest.len() as f64
    };
    let slow = json!({
        "count": slowest.len(),
        "took_ms": mean_ms(&|(took, _)| *took),
        "until_first_sync_ms": mean_ms(&|(_, p)| p.until_first_sync),
        "address_writes_ms": mean_ms(&|(_, p)| p.address_writes),
        "syncs_ms": mean_ms(&|(_, p)| p.sync_time),
    });
    let show = |p: &Option<Percentiles>| p.as_ref().map_or("none".into(), ToString::to_string);
    println!(
        "Service add + delete, set against the daemon's syncs ({} of {} changes): until the first sync taking it {}; address writes of its syncs {}; its syncs {}, {syncs_p50} of them (p50); the slowest 1 %: {slow}",
        parts.len(),
        windows.len(),
        show(&until),
        show(&address),
        show(&in_syncs)
    );
    json!({
        "changes": parts.len(),
        "until_first_sync": report::percentiles(until),
        "address_writes": report::percentiles(address),
        "syncs": report::percentiles(in_syncs),
        "syncs_per_change_p50": syncs_p50,
        "slowest": slow,
    })
}

fn rss_mib(daemon: &BenchDaemon) -> anyhow::Result<f64> {
    Ok(daemon.memory_kib()?.0 as f64 / 1024.0)
}

/// Where the daemon's anonymous memory lies, and its threads: what the RSS lines show
/// beside the totals, to tell the allocator's pages from threads' stacks.
fn anon_detail(daemon: &BenchDaemon) -> anyhow::Result<String> {
    Ok(format!(
        "{}; {} threads",
        daemon.anon_by_mapping()?,
        daemon.threads()?
    ))
}

/// The daemon's `RssAnon` and `RssFile` in MiB.
fn rss_split_mib(daemon: &BenchDaemon) -> anyhow::Result<(f64, f64)> {
    let (anon, file) = daemon.rss_split_kib()?;
    Ok((anon as f64 / 1024.0, file as f64 / 1024.0))
}

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    let n = a.services;
    let m = a.endpoints;
    println!(
        "vm-bench-soak: {n} services x {m} endpoints (kube source{}), churn for {} min: one endpoint replaced every 100 ms, a Service added and deleted every second, client traffic to {TRAFFIC_SERVICES} services",
        if a.routed {
            ", ClusterIPs by one local route"
        } else {
            ", a kube-ipvs0 address per ClusterIP"
        },
        a.minutes
    );
    for module in [
        "nf_reject_ipv4",
        "nf_reject_ipv6",
        "nft_reject_ipv4",
        "nft_reject_ipv6",
    ] {
        let _ = Command::new("modprobe").arg(module).status();
    }

    // Topology: node, pods on veths (routed), a client on a veth.
    let node = Netns::new();
    let pods: Vec<Netns> = (0..PODS).map(|_| Netns::new()).collect();
    let client = Netns::new();
    let mut script = String::from("echo 1 > /proc/sys/net/ipv4/ip_forward && ");
    script.push_str(ENDPOINT_ROUTE);
    for (p, pod) in pods.iter().enumerate() {
        script.push_str(&format!(
            " && ip link add vp{p} type veth peer name eth0 netns {ns} && ip addr add 10.244.{o}.1/24 dev vp{p} && ip link set vp{p} up",
            ns = pod.name(),
            o = p + 1
        ));
    }
    script.push_str(&format!(
        " && ip link add vcli type veth peer name eth0 netns {} && ip addr add 10.10.0.1/24 dev vcli && ip link set vcli up",
        client.name()
    ));
    let out = node.sh(&script);
    ensure!(
        out.status.success(),
        "wiring the node: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (p, pod) in pods.iter().enumerate() {
        let out = pod.sh(&format!(
            "ip addr add {}/24 dev eth0 && ip link set eth0 up && ip route add default via 10.244.{}.1",
            pod_ip(p),
            p + 1
        ));
        ensure!(out.status.success(), "wiring pod {p}");
        serve_pod(pod, format!("pod-{p}"))?;
    }
    let out = client.sh(
        "ip addr add 10.10.0.2/24 dev eth0 && ip link set eth0 up && ip route add default via 10.10.0.1",
    );
    ensure!(out.status.success(), "wiring the client");

    // The API double and the daemon.
    let api = ApiInNetns::start(&node)?;
    {
        use ipvs_proxier_tests::apiserver::Kind;
        let t = Instant::now();
        api.api().apply_silently(Kind::Node, cluster::node_object());
        for i in 0..n {
            api.api()
                .apply_silently(Kind::Service, cluster::service_object(i));
            api.api().apply_silently(
                Kind::EndpointSlice,
                cluster::slice_object(i, &endpoints_at(i, m, 0)),
            );
        }
        println!("API double filled in {:.2} s", t.elapsed().as_secs_f64());
    }
    let log = std::env::temp_dir().join("vm-bench-soak.log");
    let routed_flag = format!("--bind-service-cidrs={}", cluster::SERVICE_CIDR);
    let extra: Vec<&str> = if a.routed {
        vec![&routed_flag, "--ipvs-strict-arp"]
    } else {
        Vec::new()
    };
    let mut daemon =
        BenchDaemon::start(&node, &Source::Kube(api.api().url()), &log, "30s", &extra)?;
    let timeout = Duration::from_secs(300 + n as u64 / 10);
    daemon.wait_sync(1, timeout)?;
    let programmed = daemon.started.elapsed();
    let first = daemon.phases(1);
    println!(
        "first sync after {:.2} s: {first}",
        programmed.as_secs_f64()
    );
    let expected_rules = n * (m + 1) - TRAFFIC_SERVICES * m + TRAFFIC_SERVICES * PODS;
    let rules: usize = node
        .sh_ok("ipvsadm -Sn | wc -l")
        .trim()
        .parse()
        .unwrap_or(0);
    ensure!(
        rules == expected_rules,
        "{rules} IPVS rules, want {expected_rules}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let rss_start = rss_mib(&daemon)?;
    let split_start = rss_split_mib(&daemon)?;
    let ops_start = metrics::netlink_ops(&metrics::scrape(&node, METRICS)?);
    println!(
        "converged: RSS {rss_start:.1} MiB (anon: {}), kernel ops {}",
        anon_detail(&daemon)?,
        metrics::describe(&ops_start)
    );

    // Client traffic.
    let traffic = Arc::new(Traffic::default());
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let client_thread = {
        let (path, traffic, stop, failures) = (
            client.path(),
            Arc::clone(&traffic),
            Arc::clone(&stop),
            Arc::clone(&failures),
        );
        std::thread::spawn(move || client_loop(path, traffic, stop, failures))
    };

    // Churn.
    let duration = Duration::from_secs_f64(a.minutes * 60.0);
    let schedule: Vec<(Duration, Fault)> = if a.faults {
        Fault::SCHEDULE
            .iter()
            .map(|&(at, fault)| (duration.mul_f64(at), fault))
            .collect()
    } else {
        Vec::new()
    };
    // The netlink op counts of the daemon lives a fault ended (a restart starts them at 0).
    let mut ended_lives: Option<BTreeMap<String, u64>> = None;
    let (endpoint_samples, service_samples, service_windows, rss_samples, slow, outcomes) =
        node.block_on(|| async {
        let handle = IpvsHandle::new().await?;
        let mut endpoint_samples = Vec::new();
        let mut service_samples = Vec::new();
        // Each Service add + delete: when it was made (wall clock, as the daemon's log
        // times its syncs) and how long until the kernel held both changes.
        let mut service_windows: Vec<(SystemTime, Duration)> = Vec::new();
        let mut rss_samples = Vec::new();
        let mut slow = Vec::new();
        let mut outcomes = Vec::new();
        let mut churn = EndpointChurn::new(n, m);
        let mut ticker = tokio::time::interval(Duration::from_millis(100));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        let mut tick = 0usize;
        let mut added: Option<usize> = None;
        // The churn lasts its duration, and at least until every fault has landed.
        while started.elapsed() < duration || outcomes.len() < schedule.len() {
            ticker.tick().await;
            if let Some(&(at, fault)) = schedule.get(outcomes.len())
                && started.elapsed() >= at
            {
                println!("fault at {:.0} s: {}", started.elapsed().as_secs_f64(), fault.describe());
                let at = started.elapsed();
                let target = Target { node: &node, api: &api, handle: &handle, traffic: &traffic };
                let outcome =
                    inject(fault, &target, &mut daemon, &mut ended_lives, &mut churn, timeout)
                        .await?;
                println!(
                    "  {} changes during it, {} lost; the next change reached the kernel {:.2} s after its end; {} failed connections",
                    outcome.changes,
                    outcome.lost,
                    outcome.recovery.as_secs_f64(),
                    outcome.failed_connections
                );
                outcomes.push(FaultOutcome { at, ..outcome });
                continue;
            }
            // One endpoint replaced.
            let t = Instant::now();
            let (i, endpoint) = churn.step(&api);
            let seen = wait_for_destination(
                &handle,
                &cluster::service_key(i),
                IpAddr::V4(endpoint),
                Duration::from_secs(60),
            )
            .await?;
            endpoint_samples.push(seen - t);
            if seen - t >= SLOW {
                slow.push((wall_clock(t), seen - t, "endpoint change"));
            }
            // Every second: a new Service added, the previous one deleted.
            if tick % 10 == 5 {
                let new = n + tick / 10;
                let made = SystemTime::now();
                let t = Instant::now();
                api.add_service(new, &cluster::initial_endpoints(new, m));
                if let Some(old) = added.replace(new) {
                    api.delete_service(old);
                    let gone = wait_for_service(
                        &handle,
                        &cluster::service_key(old),
                        false,
                        Duration::from_secs(60),
                    )
                    .await?;
                    service_samples.push(gone - t);
                    if gone - t >= SLOW {
                        slow.push((wall_clock(t), gone - t, "Service delete"));
                    }
                }
                let seen = wait_for_service(
                    &handle,
                    &cluster::service_key(new),
                    true,
                    Duration::from_secs(60),
                )
                .await?;
                service_samples.push(seen - t);
                service_windows.push((made, seen - t));
                if seen - t >= SLOW {
                    slow.push((wall_clock(t), seen - t, "Service delete+add"));
                }
            }
            if tick.is_multiple_of(300) {
                rss_samples.push((
                    started.elapsed(),
                    rss_mib(&daemon)?,
                    rss_split_mib(&daemon)?,
                    anon_detail(&daemon)?,
                ));
            }
            tick += 1;
        }
        anyhow::Ok((endpoint_samples, service_samples, service_windows, rss_samples, slow, outcomes))
    })?;
    stop.store(true, Ordering::Relaxed);
    match client_thread.join() {
        Ok(result) => result?,
        Err(_) => bail!("the client thread panicked"),
    }
    // The end is measured as the start was: 3 s after a full sync. (A fixed delay after the
    // churn lands inside a full resync: the churn lasts a multiple of the resync period, and
    // at 10,000 Services a resync holds the whole IPVS table read for seconds.)
    let is_full = |sync: &LogEvent| sync.str("kind") == Some("Full");
    let fulls = daemon.syncs().iter().filter(|l| is_full(l)).count();
    daemon
        .wait_sync_where(fulls + 1, is_full, Duration::from_secs(120))
        .context("no full resync after the churn")?;
    std::thread::sleep(Duration::from_secs(3));
    ensure!(
        daemon.running(),
        "the daemon exited; log:\n{}",
        daemon.log()
    );
    let rss_end = rss_mib(&daemon)?;
    let split_end = rss_split_mib(&daemon)?;
    println!(
        "end: RSS {rss_end:.1} MiB (anon: {})",
        anon_detail(&daemon)?
    );
    let ops_end = metrics::netlink_ops(&metrics::scrape(&node, METRICS)?);
    ensure!(
        !ops_end.is_empty(),
        "the metrics at the end have no ipvs_proxier_netlink_operations_total samples"
    );
    // Over a restart, the killed lives' counts (from the start of the churn) plus the
    // last life's (its adoption included).
    let (churn_ops, failed_ops) = match &ended_lives {
        None => (
            metrics::delta(&ops_start, &ops_end),
            metrics::failed(&ops_end),
        ),
        Some(ended) => (
            metrics::add(&metrics::delta(&ops_start, ended), &ops_end),
            metrics::failed(ended) + metrics::failed(&ops_end),
        ),
    };
    let syncs = daemon.syncs().len();
    let full_syncs = daemon.syncs().iter().filter(|sync| is_full(sync)).count();
    let error_syncs = daemon
        .events()
        .iter()
        .filter(|e| e.message().starts_with(SYNC_WITH_ERRORS))
        .count();
    // After the faults: the kernel against a fresh daemon's first full sync.
    let fresh = if a.faults {
        let (missing, leftover, took, facts) = fresh_start_check(&mut daemon, &node, timeout)?;
        println!(
            "fresh start: first sync after {:.2} s; of its {facts} kernel facts, {} were missing before it and {} were leftovers",
            took.as_secs_f64(),
            missing.len(),
            leftover.len()
        );
        for fact in missing.iter().take(10) {
            println!("  missing: {fact}");
        }
        for fact in leftover.iter().take(10) {
            println!("  leftover: {fact}");
        }
        Some(json!({
            "facts": facts,
            "missing": missing.len(),
            "leftover": leftover.len(),
            "first_sync_s": took.as_secs_f64(),
        }))
    } else {
        None
    };

    // Where an incremental sync's time goes: all of it, and its nftables update (`nft` run
    // as a process when set elements change). An update applied detached (the sync did not
    // wait for it) is timed by the sync that took its answer (`nftables_update_s`); one
    // applied within the sync (a replace) by that sync's `nftables_s`.
    let incremental: Vec<LogEvent> = daemon
        .syncs()
        .into_iter()
        .filter(|sync| sync.str("kind") == Some("Incremental"))
        .collect();
    let totals: Vec<Duration> = incremental
        .iter()
        .filter_map(|sync| sync.duration("total_s"))
        .collect();
    let updates: Vec<Duration> = incremental
        .iter()
        .flat_map(|sync| {
            let inline = (sync.bool("nftables_written") == Some(true)
                && sync.bool("nftables_pending") != Some(true))
            .then(|| sync.duration("nftables_s"))
            .flatten();
            [inline, sync.duration("nftables_update_s")]
        })
        .flatten()
        .collect();
    let (sync_total, sync_nft) = (Percentiles::of(&totals), Percentiles::of(&updates));
    println!(
        "incremental syncs: total {}; nftables update (those that ran one) {}",
        sync_total.as_ref().map_or("none".into(), |p| p.to_string()),
        sync_nft.as_ref().map_or("none".into(), |p| p.to_string())
    );
    // The phases of the syncs that added or deleted a whole Service (its virtual server, its
    // endpoints and its address: more kernel objects than it has endpoints, where an
    // endpoint change writes three) beside those of the others.
    let whole_service = |sync: &LogEvent| {
        sync.u64("writes").unwrap_or_default() + sync.u64("deletes").unwrap_or_default() > m as u64
    };
    // Those of the syncs adding or deleting a Service go to the report: where its time goes.
    let mut service_sync_phases = serde_json::Map::new();
    for (which, service) in [("adding or deleting a Service", true), ("other", false)] {
        let syncs: Vec<&LogEvent> = incremental
            .iter()
            .filter(|sync| whole_service(sync) == service)
            .collect();
        let phases: Vec<String> = [
            "total_s",
            "plan_s",
            "kernel_read_s",
            "diff_s",
            "address_writes_s",
            "ipvs_writes_s",
            "conntrack_s",
        ]
        .iter()
        .filter_map(|phase| {
            let samples: Vec<Duration> = syncs.iter().filter_map(|s| s.duration(phase)).collect();
            let p = Percentiles::of(&samples);
            if service {
                service_sync_phases.insert(
                    phase.trim_end_matches("_s").to_owned(),
                    report::percentiles(p),
                );
            }
            p.map(|p| format!("{phase} {p}"))
        })
        .collect();
        println!(
            "incremental syncs ({which}): {} syncs; {}",
            syncs.len(),
            phases.join("; ")
        );
    }
    let service_parts = service_change_parts(&service_windows, &sync_spans(&incremental));
    let ok = traffic.ok.load(Ordering::Relaxed);
    let failed = traffic.failed.load(Ordering::Relaxed);
    let endpoint = Percentiles::of(&endpoint_samples);
    let service = Percentiles::of(&service_samples);
    let growth = (rss_end - rss_start) / rss_start;
    println!(
        "\nRSS during churn: {}",
        rss_samples
            .iter()
            .map(|(t, r, (anon, file), detail)| format!(
                "{:.0} s {r:.1} MiB (anon {anon:.1}: {detail}; file {file:.1})",
                t.as_secs_f64()
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "syncs: {syncs} ({full_syncs} full), {error_syncs} with errors; kernel ops during churn: {}",
        metrics::describe(&churn_ops)
    );
    for f in failures.lock().map(|f| f.clone()).unwrap_or_default() {
        println!("failed connection: {f}");
    }
    // Where the slowest changes fell: beside the full resyncs and the source's relists
    // (UTC times of day, as the daemon's log writes them; in time order).
    let mut slowest: Vec<_> = slow.iter().collect();
    slowest.sort_by_key(|(_, took, _)| std::cmp::Reverse(*took));
    slowest.truncate(20);
    slowest.sort_by(|a, b| a.0.cmp(&b.0));
    for (at, took, what) in slowest {
        println!(
            "slow: {what} at {at} took {:.1} ms",
            took.as_secs_f64() * 1e3
        );
    }
    for event in daemon.events() {
        let full = event.message() == "sync done" && event.str("kind") == Some("Full");
        let notable = event.level() != "INFO" && event.level() != "DEBUG";
        let time = event.str("timestamp").unwrap_or_default();
        if full {
            println!(
                "log: {time} full sync: {}",
                event.str("phases").unwrap_or_default()
            );
        } else if notable
            || event.message().contains("synced")
            || event.message().starts_with("full sync")
        {
            println!("log: {time} {} {event}", event.level());
        }
    }
    // The kernel's own cost of the address write a Service added or deleted makes: on
    // kube-ipvs0 as the churn left it (a ClusterIP bound per Service) and on an empty link
    // of the same namespace, the daemon stopped so nothing else writes meanwhile.
    let address_writes = if a.routed {
        None
    } else {
        daemon.stop();
        let held: usize = node
            .sh_ok("ip -o addr show dev kube-ipvs0 | wc -l")
            .trim()
            .parse()
            .context("counting kube-ipvs0's addresses")?;
        let (bind, unbind) = address_write_cost(&node, "kube-ipvs0")?;
        node.sh_ok("ip link add yard0 type dummy && ip link set yard0 up");
        let (bind_empty, unbind_empty) = address_write_cost(&node, "yard0")?;
        println!(
            "the kernel's address writes (ip -batch, {YARDSTICK_ADDRESSES} each): on kube-ipvs0 holding {held} addresses a bind {:.2} ms, an unbind {:.2} ms; on an empty link {:.2} ms, {:.2} ms",
            bind.as_secs_f64() * 1e3,
            unbind.as_secs_f64() * 1e3,
            bind_empty.as_secs_f64() * 1e3,
            unbind_empty.as_secs_f64() * 1e3
        );
        Some(json!({
            "addresses_held": held,
            "writes_timed": YARDSTICK_ADDRESSES,
            "bind_ms": bind.as_secs_f64() * 1e3,
            "unbind_ms": unbind.as_secs_f64() * 1e3,
            "empty_link_bind_ms": bind_empty.as_secs_f64() * 1e3,
            "empty_link_unbind_ms": unbind_empty.as_secs_f64() * 1e3,
        }))
    };
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "\n| soak ({n} svc x {m} ep, {} min, kube source{}) | measured | goal | status |",
        a.minutes,
        if a.routed {
            ", --bind-service-cidrs"
        } else {
            ""
        }
    );
    println!("|---|---|---|---|");
    println!(
        "| connections to endpoints that stay | {ok} answered, {failed} failed | 0 failed | {} |",
        met(failed == 0 && ok > 0)
    );
    println!(
        "| failed kernel ops | {failed_ops} (of {} during churn) | 0 | {} |",
        churn_ops.values().sum::<u64>(),
        met(failed_ops == 0 && error_syncs == 0)
    );
    println!(
        "| RSS after convergence -> end | {rss_start:.1} -> {rss_end:.1} MiB ({:+.1} %; anon {:.1} -> {:.1}, file {:.1} -> {:.1}) | <= +5 % | {} |",
        growth * 100.0,
        split_start.0,
        split_end.0,
        split_start.1,
        split_end.1,
        met(growth <= GOAL_RSS_GROWTH)
    );
    // Decision 8: no change waits for a full resync, whose kernel read runs beside changes.
    let no_wait = |p: &Option<Percentiles>| {
        p.as_ref()
            .is_some_and(|p| p.p99 <= GOAL_CHANGE_P99 && p.max <= GOAL_CHANGE_MAX)
    };
    println!(
        "| endpoint change -> kernel, full resyncs included | {} | p99 <= 50 ms, max <= 250 ms | {} |",
        endpoint.as_ref().map_or("none".into(), |p| p.to_string()),
        met(no_wait(&endpoint))
    );
    println!(
        "| Service add/delete -> kernel, full resyncs included | {} | p99 <= 50 ms, max <= 250 ms | {} |",
        service.as_ref().map_or("none".into(), |p| p.to_string()),
        met(no_wait(&service))
    );
    if a.faults {
        let lost: usize = outcomes.iter().map(|o| o.lost).sum();
        println!(
            "| changes made during the faults that never reached the kernel | {lost} of {} | 0 | {} |",
            outcomes.iter().map(|o| o.changes).sum::<usize>(),
            met(lost == 0)
        );
        if let Some(fresh) = &fresh {
            let differences = fresh["missing"].as_u64().unwrap_or(u64::MAX)
                + fresh["leftover"].as_u64().unwrap_or(u64::MAX);
            println!(
                "| kernel at the end vs a fresh daemon's full sync | {differences} differences | 0 | {} |",
                met(differences == 0)
            );
        }
    }
    let slow_count = |what: &str| slow.iter().filter(|(_, _, w)| *w == what).count();
    let mut report = json!({
        "bench": "soak",
        "services": n,
        "endpoints": m,
        "minutes": a.minutes,
        "bind_service_cidrs": a.routed,
        "connections": { "answered": ok, "failed": failed },
        "kernel_ops": { "during_churn": churn_ops.values().sum::<u64>(), "failed": failed_ops },
        "syncs": { "all": syncs, "full": full_syncs, "with_errors": error_syncs },
        "rss_mib": {
            "start": rss_start,
            "end": rss_end,
            "growth": growth,
            "anon_start": split_start.0,
            "anon_end": split_end.0,
            "file_start": split_start.1,
            "file_end": split_end.1,
        },
        "endpoint_change": report::percentiles(endpoint),
        "service_change": report::percentiles(service),
        "service_change_parts": service_parts,
        "incremental_sync": {
            "total": report::percentiles(sync_total),
            "nftables": report::percentiles(sync_nft),
            "adding_or_deleting_a_service": service_sync_phases,
        },
        "slow": {
            "endpoint_change": slow_count("endpoint change"),
            "service_change": slow_count("Service delete+add"),
        },
        "goals": {
            "change_p99_ms": GOAL_CHANGE_P99.as_secs_f64() * 1e3,
            "change_max_ms": GOAL_CHANGE_MAX.as_secs_f64() * 1e3,
            "rss_growth": GOAL_RSS_GROWTH,
        },
    });
    if let Some(address_writes) = address_writes {
        report["kernel_address_writes"] = address_writes;
    }
    if a.faults {
        report["faults"] = json!(
            outcomes
                .iter()
                .map(|o| json!({
                    "fault": o.fault.describe(),
                    "at_s": o.at.as_secs_f64(),
                    "changes": o.changes,
                    "lost": o.lost,
                    "recovery_s": o.recovery.as_secs_f64(),
                    "failed_connections": o.failed_connections,
                }))
                .collect::<Vec<_>>()
        );
        report["fresh_start"] = fresh.unwrap_or_default();
    }
    report::emit(&report);
    println!("vm-bench-soak: done");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::nft_picture;

    const RULESET: &str = "table ip kube-proxy-ipvs {
	set cluster-ips {
		type ipv4_addr . inet_proto . inet_service
		elements = { 10.96.0.1 . tcp . 80, 10.96.0.2 . tcp . 80,
			     10.96.0.3 . udp . 53 }
	}
	set empty {
		type ipv4_addr
	}
	chain prerouting {
		ip daddr . meta l4proto . th dport @cluster-ips accept
	}
}
";

    #[test]
    fn set_elements_are_facts_of_their_own_whatever_their_order() {
        let picture = nft_picture(RULESET);
        assert!(
            picture.contains("ip kube-proxy-ipvs set cluster-ips: element 10.96.0.3 . udp . 53")
        );
        assert!(picture.contains(
            "ip kube-proxy-ipvs: ip daddr . meta l4proto . th dport @cluster-ips accept"
        ));
        assert_eq!(picture.iter().filter(|f| f.contains("element")).count(), 3);
        let reordered = RULESET.replace(
            "{ 10.96.0.1 . tcp . 80, 10.96.0.2 . tcp . 80,\n\t\t\t     10.96.0.3 . udp . 53 }",
            "{ 10.96.0.3 . udp . 53,\n\t\t\t     10.96.0.2 . tcp . 80, 10.96.0.1 . tcp . 80 }",
        );
        assert_ne!(reordered, RULESET);
        assert_eq!(nft_picture(&reordered), picture);
        let one_less = RULESET.replace("10.96.0.2 . tcp . 80,", "");
        let fewer = nft_picture(&one_less);
        let missing: Vec<_> = picture.difference(&fewer).collect();
        assert_eq!(
            missing,
            ["ip kube-proxy-ipvs set cluster-ips: element 10.96.0.2 . tcp . 80"]
        );
    }
}
