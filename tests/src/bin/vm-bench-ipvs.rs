//! IPVS programming and listing benchmark, run inside the test VM by
//! `cargo xtask vm-bench ipvs --services N --dests M`.
//!
//! Programs N TCP services x M masquerading destinations twice, with `ipvsadm -R` and with
//! ipvs-netlink's batch call (each in a fresh network namespace), and lists the table with `ipvsadm -Sn`
//! and with ipvs-netlink's verified table read, in alternating pairs (the median ratio is
//! reported: one pair can land in a moment when the shared host is busy for one side only).
//! Both listings are checked to hold the same table. Then rewrites every rule in place both ways (`ipvsadm -R` with `-E`/`-e` lines,
//! and update ops in one batch), which isolates the client-side cost from the kernel's cost
//! of creating services and destinations. Prints times and ours/ipvsadm ratios, and last the
//! machine-readable report (`VM-BENCH-REPORT: {json}`) that `cargo xtask bench-report` turns
//! into `docs/benchmarks.md`.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use ipvs_netlink::{Destination, IpvsHandle, Op, Scheduler, Service, ServiceKey};
use ipvs_proxier_tests::Netns;
use ipvs_proxier_tests::bench::report;
use serde_json::json;

/// Runs `command` in `ns` and returns how long it took, timed by the shell inside the
/// namespace (`$EPOCHREALTIME` around it), so that starting `ip netns exec` and bash is not
/// counted against ipvsadm. Its stdout goes to `/tmp/ipvs-bench.out`.
fn timed(ns: &Netns, command: &str) -> anyhow::Result<Duration> {
    let out = ns.sh_ok(&format!(
        "t0=$EPOCHREALTIME; {command} > /tmp/ipvs-bench.out; t1=$EPOCHREALTIME; echo \"$t0 $t1\""
    ));
    let mut fields = out.split_whitespace().map(str::parse::<f64>);
    let (Some(Ok(t0)), Some(Ok(t1))) = (fields.next(), fields.next()) else {
        bail!("no times from {command}: {out:?}");
    };
    Ok(Duration::from_secs_f64((t1 - t0).max(0.0)))
}

fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        100 + (i / 62500) as u8,
        ((i / 250) % 250) as u8,
        (i % 250 + 1) as u8,
    )
}

fn real_server(i: usize, j: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, j as u8, (i % 250 + 1) as u8)
}

/// A fresh namespace with a route to the real servers (masquerading needs one).
fn bench_netns() -> anyhow::Result<Netns> {
    let ns = Netns::new();
    ns.sh_ok(
        "ip link add bench0 type dummy && ip link set bench0 up \
         && ip addr add 10.200.255.254/16 dev bench0",
    );
    Ok(ns)
}

/// `ipvsadm -Sn` lines for the table we program.
fn restore_file(services: usize, dests: usize) -> String {
    let mut s = String::with_capacity(services * (dests + 1) * 48);
    for i in 0..services {
        let v = vip(i);
        s.push_str(&format!("-A -t {v}:80 -s rr\n"));
        for j in 0..dests {
            s.push_str(&format!(
                "-a -t {v}:80 -r {}:8080 -m -w 1\n",
                real_server(i, j)
            ));
        }
    }
    s
}

fn ops(services: usize, dests: usize) -> Vec<Op> {
    let mut ops = Vec::with_capacity(services * (dests + 1));
    for i in 0..services {
        let key = ServiceKey::tcp(IpAddr::V4(vip(i)), 80);
        ops.push(Op::AddService(Service::new(key, Scheduler::RoundRobin)));
        for j in 0..dests {
            ops.push(Op::AddDestination(
                key,
                Destination::new(IpAddr::V4(real_server(i, j)), 8080),
            ));
        }
    }
    ops
}

/// The same table as `ipvsadm -R` edit lines (`-E` / `-e`): every rule rewritten in place.
fn edit_file(services: usize, dests: usize) -> String {
    restore_file(services, dests)
        .lines()
        .map(|l| match l.split_at(3) {
            ("-A ", rest) => format!("-E {rest}\n"),
            ("-a ", rest) => format!("-e {rest}\n"),
            _ => format!("{l}\n"),
        })
        .collect()
}

/// The ops of [`ops`] as in-place updates.
fn update_ops(services: usize, dests: usize) -> Vec<Op> {
    ops(services, dests)
        .into_iter()
        .map(|op| match op {
            Op::AddService(s) => Op::UpdateService(s),
            Op::AddDestination(k, d) => Op::UpdateDestination(k, d),
            other => other,
        })
        .collect()
}

/// `ipvsadm -Sn` lines for a table read through ipvs-netlink.
fn save_lines(table: &ipvs_netlink::Table) -> anyhow::Result<BTreeSet<String>> {
    let mut lines = BTreeSet::new();
    for (svc, ds) in table {
        let ServiceKey::Tuple { addr, port, .. } = svc.service.key else {
            bail!("unexpected fwmark service");
        };
        lines.insert(format!("-A -t {addr}:{port} -s {}", svc.service.scheduler));
        for d in ds {
            lines.insert(format!(
                "-a -t {addr}:{port} -r {}:{} -m -w {}",
                d.destination.addr, d.destination.port, d.destination.weight
            ));
        }
    }
    Ok(lines)
}

/// Normalised set of `-A`/`-a` lines from `ipvsadm -Sn`.
fn normalise(save: &str) -> BTreeSet<String> {
    save.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// Alternating (`ipvsadm -Sn`, `table()`) pairs timed; the median ratio is reported.
const DUMP_PAIRS: usize = 3;

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The pairs (ipvsadm's time, ours) as JSON, with the pair of the median ratio.
fn median_pair(mut pairs: Vec<(Duration, Duration)>) -> (serde_json::Value, Duration, Duration) {
    let listed: Vec<serde_json::Value> = pairs
        .iter()
        .map(|(theirs, ours)| json!({"ipvsadm_s": secs(*theirs), "ours_s": secs(*ours)}))
        .collect();
    pairs.sort_by(|a, b| (secs(a.1) / secs(a.0)).total_cmp(&(secs(b.1) / secs(b.0))));
    let (theirs, ours) = pairs[pairs.len() / 2];
    (
        json!({"ipvsadm_s": secs(theirs), "ours_s": secs(ours), "pairs": listed}),
        theirs,
        ours,
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut services = 10_000usize;
    let mut dests = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--services" => services = args.next().context("--services N")?.parse()?,
            "--dests" => dests = args.next().context("--dests N")?.parse()?,
            other => bail!("unknown argument {other}"),
        }
    }
    ensure!(dests <= 250 && services <= 250_000, "table too large");
    println!("vm-bench-ipvs: {services} TCP services x {dests} masq destinations");
    // Each side programs its own fresh network namespace. Not one namespace flushed in
    // between: the kernel keeps deleted destinations in a trash list for two minutes and
    // every new destination is first looked up there, linearly, so whoever programs right
    // after a flush of 50,000 destinations pays a quadratic walk.
    let theirs = bench_netns()?;
    let ours = bench_netns()?;
    let expected = services * (dests + 1);

    // 1. ipvsadm -R
    let file = "/tmp/ipvs-bench.rules";
    std::fs::write(file, restore_file(services, dests))?;
    let ipvsadm_program = timed(&theirs, &format!("ipvsadm -R < {file}"))?;

    // 2./3. `ipvsadm -Sn` and our verified dump of the same table, in alternating pairs: the
    // host of the VM is shared, so a single pair can land in a busy moment for one side only.
    // The ratio reported is the median of the pairs' ratios.
    let handle = IpvsHandle::new_in_netns(theirs.path()).await?;
    let mut ipvsadm_lines = BTreeSet::new();
    let mut dumps = Vec::with_capacity(DUMP_PAIRS);
    let mut best_effort_dumps = Vec::with_capacity(DUMP_PAIRS);
    for pair in 0..DUMP_PAIRS {
        let ipvsadm_dump = timed(&theirs, "ipvsadm -Sn")?;
        let save = std::fs::read_to_string("/tmp/ipvs-bench.out")?;
        ipvsadm_lines = normalise(&save);
        ensure!(
            ipvsadm_lines.len() == expected,
            "ipvsadm -Sn listed {} rules, expected {expected}",
            ipvsadm_lines.len()
        );
        let t = Instant::now();
        let table = handle.table().await?;
        let ours_dump = t.elapsed();
        let ours_lines = save_lines(&table)?;
        ensure!(
            ours_lines == ipvsadm_lines,
            "our dump differs from ipvsadm -Sn: {} vs {} lines",
            ours_lines.len(),
            ipvsadm_lines.len()
        );
        // The best-effort read (one service dump) of the same table, right after.
        let t = Instant::now();
        let best_effort = handle.table_best_effort().await?;
        let ours_best_effort = t.elapsed();
        ensure!(
            save_lines(&best_effort)? == ipvsadm_lines,
            "our best-effort dump differs from ipvsadm -Sn"
        );
        println!(
            "dump pair {}: ipvsadm -Sn {:.3} s, ipvs-netlink table {:.3} s, ratio {:.3}; best-effort {:.3} s, ratio {:.3}",
            pair + 1,
            secs(ipvsadm_dump),
            secs(ours_dump),
            secs(ours_dump) / secs(ipvsadm_dump),
            secs(ours_best_effort),
            secs(ours_best_effort) / secs(ipvsadm_dump)
        );
        dumps.push((ipvsadm_dump, ours_dump));
        best_effort_dumps.push((ipvsadm_dump, ours_best_effort));
    }
    let (dump, ipvsadm_dump, ours_dump) = median_pair(dumps);
    let (dump_best_effort, ipvsadm_best_effort, ours_best_effort) = median_pair(best_effort_dumps);

    // 4. ipvsadm rewrites every rule in place (see 6.), then its table is flushed so that
    // its estimators do not run while ours are measured.
    let edits = "/tmp/ipvs-bench.edits";
    std::fs::write(edits, edit_file(services, dests))?;
    let ipvsadm_update = timed(&theirs, &format!("ipvsadm -R < {edits}"))?;
    theirs.sh_ok("ipvsadm -C");

    // 5. our batch, in the other namespace
    let handle = IpvsHandle::new_in_netns(ours.path()).await?;
    let t = Instant::now();
    let results = handle.batch(ops(services, dests)).await;
    let ours_program = t.elapsed();
    let failed = results.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        bail!("{failed} batch ops failed, first: {e}");
    }
    ensure!(
        normalise(&ours.sh_ok("ipvsadm -Sn")) == ipvsadm_lines,
        "batch-programmed table differs from ipvsadm -R's"
    );

    // 6. the same rules rewritten in place: the kernel allocates nothing, so this shows the
    // cost of the client side (sockets, round trips) rather than of creating objects.
    let t = Instant::now();
    let results = handle.batch(update_ops(services, dests)).await;
    let ours_update = t.elapsed();
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        bail!("batch updates failed: {e}");
    }
    ensure!(
        normalise(&ours.sh_ok("ipvsadm -Sn")) == ipvsadm_lines,
        "the table changed under in-place updates"
    );

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "program: ipvsadm -R {:.3} s, ipvs-netlink batch {:.3} s, ratio {:.3} (target <= 0.25)",
        secs(ipvsadm_program),
        secs(ours_program),
        secs(ours_program) / secs(ipvsadm_program)
    )?;
    writeln!(
        out,
        "dump:    ipvsadm -Sn {:.3} s, ipvs-netlink table {:.3} s, ratio {:.3} (median of {DUMP_PAIRS} pairs; target <= 0.5)",
        secs(ipvsadm_dump),
        secs(ours_dump),
        secs(ours_dump) / secs(ipvsadm_dump)
    )?;
    writeln!(
        out,
        "dump:    ipvsadm -Sn {:.3} s, ipvs-netlink best-effort table {:.3} s, ratio {:.3} (median of the same {DUMP_PAIRS} pairs)",
        secs(ipvsadm_best_effort),
        secs(ours_best_effort),
        secs(ours_best_effort) / secs(ipvsadm_best_effort)
    )?;
    writeln!(
        out,
        "update:  ipvsadm -R (-E/-e) {:.3} s, ipvs-netlink batch {:.3} s, ratio {:.3}",
        secs(ipvsadm_update),
        secs(ours_update),
        secs(ours_update) / secs(ipvsadm_update)
    )?;
    writeln!(out, "vm-bench-ipvs: OK ({expected} rules each way)")?;
    drop(out);
    report::emit(&json!({
        "bench": "ipvs",
        "services": services,
        "dests": dests,
        "rules": expected,
        "program": {"ipvsadm_s": secs(ipvsadm_program), "ours_s": secs(ours_program)},
        "dump": dump,
        "dump_best_effort": dump_best_effort,
        "update": {"ipvsadm_s": secs(ipvsadm_update), "ours_s": secs(ours_update)},
    }));
    Ok(())
}
