//! Per-Service traffic metrics at scale, run inside the test VM by `cargo xtask vm-bench
//! traffic [--services N] [--endpoints M] [--seconds S] [--scrapes K]` (default 10,000 x 5,
//! 60 s per phase, 5 scrapes).
//!
//! The daemon runs on the kube source (the API server double in the node's namespace) with
//! `--ipvs-traffic-metrics=endpoint`. Once it has programmed the cluster:
//! 1. K scrapes of `/metrics` on an otherwise idle daemon: how long each takes, how large the
//!    page is (and the part the `service` level would serve), and the daemon's CPU time per
//!    scrape;
//! 2. endpoint changes every 100 ms for S seconds, each timed from the API change to the new
//!    destination in the kernel, without scraping;
//! 3. the same for S seconds while `/metrics` is scraped every 15 s.
//!
//! The report compares the change-to-kernel latency of 3 with 2 (goal: p50 and p99 within
//! 10 %) and prints a `VM-BENCH-REPORT` line for `cargo xtask bench-report`.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use ipvs_netlink::IpvsHandle;
use ipvs_proxier_tests::Netns;
use ipvs_proxier_tests::bench::api::ApiInNetns;
use ipvs_proxier_tests::bench::cluster::{self, ENDPOINT_ROUTE};
use ipvs_proxier_tests::bench::daemon::{BenchDaemon, METRICS, Source};
use ipvs_proxier_tests::bench::latency::{Percentiles, wait_for_destination};
use ipvs_proxier_tests::bench::metrics;
use ipvs_proxier_tests::bench::report;
use serde_json::json;

/// How often a scraper asks during phase 3 (Prometheus' usual interval).
const SCRAPE_INTERVAL: Duration = Duration::from_secs(15);
/// Change-to-kernel latency with scraping on, against without.
const GOAL_LATENCY_RATIO: f64 = 1.10;

struct Args {
    services: usize,
    endpoints: usize,
    seconds: u64,
    scrapes: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        services: 10_000,
        endpoints: 5,
        seconds: 60,
        scrapes: 5,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--services" => a.services = value()?.parse()?,
            "--endpoints" => a.endpoints = value()?.parse()?,
            "--seconds" => a.seconds = value()?.parse()?,
            "--scrapes" => a.scrapes = value()?.parse()?,
            other => bail!(
                "unknown argument {other} (use --services N --endpoints M --seconds S --scrapes K)"
            ),
        }
    }
    ensure!(
        (2..=200_000).contains(&a.services),
        "--services must be 2..=200000"
    );
    ensure!(
        (1..=100).contains(&a.endpoints),
        "--endpoints must be 1..=100"
    );
    ensure!(
        (15..=3600).contains(&a.seconds),
        "--seconds must be 15..=3600"
    );
    ensure!((1..=100).contains(&a.scrapes), "--scrapes must be 1..=100");
    Ok(a)
}

/// One timed scrape: how long it took, the page, the daemon's CPU time during it.
struct Scrape {
    took: Duration,
    page: String,
    cpu: f64,
}

fn scrape(node: &Netns, daemon: &BenchDaemon) -> anyhow::Result<Scrape> {
    let cpu = daemon.cpu_seconds()?;
    let t = Instant::now();
    let page = metrics::scrape(node, METRICS)?;
    let took = t.elapsed();
    Ok(Scrape {
        took,
        page,
        cpu: daemon.cpu_seconds()? - cpu,
    })
}

/// Replaces one endpoint of a service every 100 ms for `duration`, each timed from the API
/// change to the kernel; `round` keeps the replacement addresses of two phases apart.
fn churn(
    node: &Netns,
    api: &ApiInNetns,
    a: &Args,
    duration: Duration,
    round: usize,
) -> anyhow::Result<Vec<Duration>> {
    node.block_on(|| async {
        let handle = IpvsHandle::new().await?;
        let mut samples = Vec::new();
        let mut ticker = tokio::time::interval(Duration::from_millis(100));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = Instant::now();
        let mut tick = 0usize;
        while started.elapsed() < duration {
            ticker.tick().await;
            let i = tick % a.services;
            let mut endpoints = cluster::initial_endpoints(i, a.endpoints);
            // 10.200.100-199.x: never an initial endpoint (third octet below 100), and never
            // the address the service had before (each pass over the services and each
            // phase moves the third octet).
            let pass = (tick / a.services) % 50;
            endpoints[0] = std::net::Ipv4Addr::new(
                10,
                200,
                (100 + (round % 2) * 50 + pass) as u8,
                (i % 250 + 1) as u8,
            );
            let t = Instant::now();
            api.set_endpoints(i, &endpoints);
            let seen = wait_for_destination(
                &handle,
                &cluster::service_key(i),
                IpAddr::V4(endpoints[0]),
                Duration::from_secs(60),
            )
            .await?;
            samples.push(seen - t);
            tick += 1;
        }
        anyhow::Ok(samples)
    })
}

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    let (n, m) = (a.services, a.endpoints);
    println!(
        "vm-bench-traffic: {n} services x {m} endpoints (kube source), --ipvs-traffic-metrics=endpoint: {} idle scrapes, then endpoint changes for {} s without and {} s with a scrape every {} s",
        a.scrapes,
        a.seconds,
        a.seconds,
        SCRAPE_INTERVAL.as_secs()
    );
    let node = Netns::new();
    let out = node.sh(&format!(
        "echo 1 > /proc/sys/net/ipv4/ip_forward && {ENDPOINT_ROUTE}"
    ));
    ensure!(
        out.status.success(),
        "wiring the node: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let api = ApiInNetns::start(&node)?;
    api.fill(n, m);
    let log = std::env::temp_dir().join("vm-bench-traffic.log");
    let mut daemon = BenchDaemon::start(
        &node,
        &Source::Kube(api.api().url()),
        &log,
        "1h",
        &["--ipvs-traffic-metrics=endpoint"],
    )?;
    daemon.wait_sync(1, Duration::from_secs(300 + n as u64 / 10))?;
    println!(
        "first sync after {:.2} s",
        daemon.started.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(3));

    // 1. Idle scrapes.
    let mut scrapes = Vec::new();
    for _ in 0..a.scrapes {
        scrapes.push(scrape(&node, &daemon)?);
    }
    let last = &scrapes[scrapes.len() - 1].page;
    let series = |prefix: &str| last.lines().filter(|l| l.starts_with(prefix)).count();
    let service_bytes: usize = last
        .lines()
        .filter(|l| l.contains("ipvs_proxier_service_"))
        .map(|l| l.len() + 1)
        .sum();
    let endpoint_bytes: usize = last
        .lines()
        .filter(|l| l.contains("ipvs_proxier_endpoint_"))
        .map(|l| l.len() + 1)
        .sum();
    let (service_series, endpoint_series) = (
        series("ipvs_proxier_service_"),
        series("ipvs_proxier_endpoint_"),
    );
    ensure!(
        service_series >= 7 * n,
        "{service_series} service series for {n} Services: the traffic metrics are missing"
    );
    let took: Vec<Duration> = scrapes.iter().map(|s| s.took).collect();
    let took = Percentiles::of(&took).context("no scrape")?;
    let cpu = scrapes.iter().map(|s| s.cpu).sum::<f64>() / scrapes.len() as f64;
    println!(
        "scrape: {took}; page {} bytes ({service_bytes} service level, {endpoint_bytes} endpoint level), {service_series} + {endpoint_series} series; daemon CPU {cpu:.3} s per scrape",
        last.len()
    );

    // 2. Changes without scraping; 3. with a scrape every 15 s.
    let duration = Duration::from_secs(a.seconds);
    let without = churn(&node, &api, &a, duration, 1)?;
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let stop = Arc::clone(&stop);
        let name = node.name().to_owned();
        std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
            let mut took = Vec::new();
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    let t = Instant::now();
                    let out = std::process::Command::new("ip")
                        .args(["netns", "exec", &name, "sh", "-c"])
                        .arg(format!(
                            "printf 'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' | socat -T60 -t60 - TCP:{METRICS} | wc -c"
                        ))
                        .output()?;
                    ensure!(out.status.success(), "scrape during the churn failed");
                    took.push(t.elapsed());
                    next += SCRAPE_INTERVAL;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(took)
        })
    };
    let with = churn(&node, &api, &a, duration, 2);
    stop.store(true, Ordering::Relaxed);
    let scrapes_during = match scraper.join() {
        Ok(result) => result?,
        Err(_) => bail!("the scraper thread panicked"),
    };
    let with = with?;
    ensure!(
        daemon.running(),
        "the daemon exited; log:\n{}",
        daemon.log()
    );
    let (p_without, p_with) = (
        Percentiles::of(&without).context("no change without scraping")?,
        Percentiles::of(&with).context("no change with scraping")?,
    );
    let ratio = |f: fn(&Percentiles) -> Duration| {
        f(&p_with).as_secs_f64() / f(&p_without).as_secs_f64().max(1e-9)
    };
    let (p50_ratio, p99_ratio) = (ratio(|p| p.p50), ratio(|p| p.p99));
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("\n| traffic metrics ({n} svc x {m} ep, kube source) | measured | goal | status |");
    println!("|---|---|---|---|");
    println!("| scrape (idle daemon) | {took} | | |");
    println!(
        "| scrapes during the churn | {} | | |",
        Percentiles::of(&scrapes_during).map_or("none".into(), |p| p.to_string())
    );
    println!("| change -> kernel, no scraping | {p_without} | | |");
    println!(
        "| change -> kernel, a scrape every 15 s | {p_with} (p50 {p50_ratio:.2}x, p99 {p99_ratio:.2}x) | within 10 % | {} |",
        met(p50_ratio <= GOAL_LATENCY_RATIO && p99_ratio <= GOAL_LATENCY_RATIO)
    );
    report::emit(&json!({
        "bench": "traffic",
        "services": n,
        "endpoints": m,
        "seconds": a.seconds,
        "scrape": {
            "count": scrapes.len(),
            "p50_s": took.p50.as_secs_f64(),
            "max_s": took.max.as_secs_f64(),
            "page_bytes": last.len(),
            "service_bytes": service_bytes,
            "endpoint_bytes": endpoint_bytes,
            "service_series": service_series,
            "endpoint_series": endpoint_series,
            "cpu_s": cpu,
        },
        "scrapes_during_churn": report::percentiles(Percentiles::of(&scrapes_during)),
        "without": report::percentiles(Some(p_without)),
        "with": report::percentiles(Some(p_with)),
        "p50_ratio": p50_ratio,
        "p99_ratio": p99_ratio,
    }));
    println!("vm-bench-traffic: done");
    Ok(())
}
