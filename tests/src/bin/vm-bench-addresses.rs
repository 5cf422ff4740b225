//! The kernel's cost of one ClusterIP bound as an address, run inside the test VM by
//! `cargo xtask vm-bench addresses [--sizes 100,1000,10000] [--pairs 100]`.
//!
//! For each size N, a dummy link in a fresh network namespace is given N /32 addresses (the
//! library's pipelined binding, as the daemon binds ClusterIPs on kube-ipvs0); then one more
//! address is added and deleted `pairs` times through the same backend, each pair timed, once
//! on the backend's own socket and once as a sync writes it (a list of one address each way,
//! each list on a socket of its own: `add_addresses`, `remove_addresses`), alternating. A
//! Service added or deleted in address mode costs one such write (its ClusterIP), and the
//! kernel's work for it grows with the addresses the link already holds; with
//! `--bind-service-cidrs` a Service costs none. Prints the p50 and p99 of a pair at each size
//! and their ratio to the smallest size's; the last line is a `VM-BENCH-REPORT`.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use ipvs_proxier_tests::Netns;
use ipvs_proxier_tests::bench::cluster;
use ipvs_proxier_tests::bench::latency::Percentiles;
use ipvs_proxier_tests::bench::report;
use proxier_core::backend::{AddressBackend, KernelAddressBackend};
use serde_json::json;

struct Args {
    sizes: Vec<usize>,
    pairs: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        sizes: vec![100, 1_000, 10_000],
        pairs: 100,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--sizes" => {
                a.sizes = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .context("--sizes: a comma-separated list of numbers")?;
            }
            "--pairs" => a.pairs = value()?.parse()?,
            other => bail!("unknown argument {other} (use --sizes N,N,... --pairs K)"),
        }
    }
    ensure!(
        !a.sizes.is_empty() && a.sizes.iter().all(|&n| (1..=200_000).contains(&n)),
        "--sizes must be between 1 and 200000"
    );
    ensure!((1..=10_000).contains(&a.pairs), "--pairs must be 1..=10000");
    Ok(a)
}

/// The address added and deleted: outside every ClusterIP ([`cluster::vip`] is 10.100-103.x.y).
const PROBE: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 99, 0, 1));

/// Binds `n` ClusterIPs on a fresh link, then times `pairs` add + delete pairs of [`PROBE`],
/// and as many written as a sync writes them.
fn measure(n: usize, pairs: usize) -> anyhow::Result<(Duration, Vec<Duration>, Vec<Duration>)> {
    let ns = Netns::new();
    ns.block_on(|| async move {
        let mut link = KernelAddressBackend::connect("addr0")?;
        link.ensure_link().await?;
        let vips = cluster::vips(n);
        let t = Instant::now();
        let bound = link.add_addresses(&vips).await;
        let binding = t.elapsed();
        if let Some(Err(e)) = bound.iter().find(|r| r.is_err()) {
            bail!("binding {n} addresses failed: {e}");
        }
        // Alternating: one pair on the backend's own socket, one as a sync writes (a list of
        // one address each way, on a socket the list opens for itself).
        let mut samples = Vec::with_capacity(pairs);
        let mut listed = Vec::with_capacity(pairs);
        for _ in 0..pairs {
            let t = Instant::now();
            link.add_address(PROBE).await?;
            link.remove_address(PROBE).await?;
            samples.push(t.elapsed());
            let t = Instant::now();
            let added = link.add_addresses(&[PROBE]).await;
            let removed = link.remove_addresses(&[PROBE]).await;
            listed.push(t.elapsed());
            if let Some(Err(e)) = added.iter().chain(&removed).find(|r| r.is_err()) {
                bail!("the probe written as a list failed: {e}");
            }
        }
        link.delete_link().await?;
        Ok((binding, samples, listed))
    })
}

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    // SCTP, when loaded, is told of every address change and walks its own list of them.
    let sctp = modules.lines().any(|l| l.starts_with("sctp "));
    println!(
        "vm-bench-addresses: one address added and deleted {} times on a dummy link holding N others, N in {:?} (sctp module loaded: {sctp})",
        a.pairs, a.sizes
    );
    let mut rows = Vec::new();
    let mut base: Option<Duration> = None;
    for &n in &a.sizes {
        let (binding, samples, listed) = measure(n, a.pairs)?;
        let (Some(p), Some(as_sync)) = (Percentiles::of(&samples), Percentiles::of(&listed)) else {
            bail!("no samples at {n}");
        };
        let base = *base.get_or_insert(p.p50);
        let ratio = p.p50.as_secs_f64() / base.as_secs_f64();
        println!(
            "N = {n}: binding the {n} took {:.2} s; one add + delete: {p}; p50 {ratio:.2} x the first size's; written as a sync writes them (lists of one): {as_sync}",
            binding.as_secs_f64()
        );
        rows.push(json!({
            "addresses": n,
            "binding_s": binding.as_secs_f64(),
            "pair": report::percentiles(Some(p)),
            "pair_as_sync": report::percentiles(Some(as_sync)),
            "p50_ratio": ratio,
        }));
    }
    report::emit(&json!({
        "bench": "addresses",
        "pairs": a.pairs,
        "sctp_loaded": sctp,
        "sizes": rows,
    }));
    println!("vm-bench-addresses: done");
    Ok(())
}
