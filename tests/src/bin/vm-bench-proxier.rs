//! Scale benchmark of the whole daemon, run inside the test VM by
//! `cargo xtask vm-bench proxier [--services N] [--endpoints M]` (default 10,000 x 5).
//!
//! In a fresh network namespace:
//! 1. reference: `ipvsadm -R` of the same virtual/real servers, and `ip -batch` binding the
//!    same VIPs on a dummy link (what the daemon also does), then everything flushed;
//! 2. the daemon, long-running on a `--source-file` of N ClusterIP Services x M endpoints:
//!    time from start to the first sync that leaves the full table in the kernel (checked
//!    against the reference with `ipvsadm -Sn`);
//! 3. its RSS after convergence;
//! 4. one endpoint change at that scale: time from the file rename to the sync, and the
//!    netlink operations it took (from `ipvs_proxier_netlink_operations_total`);
//! 5. restart adoption: the daemon killed and started again on the programmed kernel: time to
//!    its first sync and its operations (expected: no writes); also `--once` on the same.
//!
//! Times under TCG are only meaningful as ratios against ipvsadm in the same run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use ipvs_proxier_tests::{Netns, proxier_bin};

const NODE: &str = "node-a";
const METRICS: &str = "127.0.0.1:10249";

fn vip_of(i: usize) -> String {
    // Up to 250 * 250 * 4 services: 10.100-103.x.y
    format!("10.{}.{}.{}", 100 + i / 62500, (i / 250) % 250, i % 250 + 1)
}

fn endpoint(i: usize, j: usize) -> String {
    format!("10.200.{j}.{}", i % 250 + 1)
}

/// The endpoint that replaces service 0's first endpoint in the change step.
const CHANGED_ENDPOINT: &str = "10.200.251.1";

/// The daemon's source file: the Node, then N Services each with one slice of M endpoints.
fn source_file(services: usize, endpoints: usize, changed: bool) -> String {
    let mut y = String::with_capacity(services * (600 + endpoints * 90));
    let _ = write!(
        y,
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\nstatus: {{addresses: [{{type: InternalIP, address: \"192.168.50.1\"}}]}}\n"
    );
    for i in 0..services {
        let v = vip_of(i);
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: bench}}\nspec: {{type: ClusterIP, clusterIP: \"{v}\", clusterIPs: [\"{v}\"], ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n"
        );
        for j in 0..endpoints {
            let a = if changed && i == 0 && j == 0 {
                CHANGED_ENDPOINT.to_owned()
            } else {
                endpoint(i, j)
            };
            let _ = writeln!(
                y,
                "- {{addresses: [\"{a}\"], conditions: {{ready: true, serving: true, terminating: false}}, nodeName: {NODE}}}"
            );
        }
    }
    y
}

/// `ipvsadm -R` input for the same table.
fn restore_file(services: usize, endpoints: usize) -> String {
    let mut s = String::with_capacity(services * (endpoints + 1) * 48);
    for i in 0..services {
        let v = vip_of(i);
        let _ = writeln!(s, "-A -t {v}:80 -s rr");
        for j in 0..endpoints {
            let _ = writeln!(s, "-a -t {v}:80 -r {}:8080 -m -w 1", endpoint(i, j));
        }
    }
    s
}

/// `ip -batch` input binding every VIP on `dev`.
fn addr_batch(services: usize, dev: &str) -> String {
    let mut s = String::with_capacity(services * 40);
    for i in 0..services {
        let _ = writeln!(s, "addr add {}/32 dev {dev}", vip_of(i));
    }
    s
}

/// Normalised `-A`/`-a` lines of `ipvsadm -Sn`.
fn normalise(save: &str) -> BTreeSet<String> {
    save.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
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

/// The daemon running in the namespace, its log in a file.
struct Daemon {
    child: Child,
    log: PathBuf,
    started: Instant,
}

impl Daemon {
    fn start(ns: &Netns, source: &Path, log: &Path, extra: &[&str]) -> anyhow::Result<Daemon> {
        let file = std::fs::File::create(log).context("daemon log")?;
        let err = file.try_clone()?;
        let started = Instant::now();
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .arg(proxier_bin())
            .arg("--source-file")
            .arg(source)
            .args([
                "--hostname-override",
                NODE,
                "--cluster-cidr=10.244.0.0/16",
                "--ipvs-min-sync-period=0s",
                "--ipvs-sync-period=1h",
                &format!("--metrics-bind-address={METRICS}"),
                "--healthz-bind-address=127.0.0.1:10256",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .context("starting ipvs-proxier")?;
        Ok(Daemon {
            child,
            log: log.to_owned(),
            started,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The `sync done` log lines so far.
    fn syncs(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains("sync done"))
            .map(str::to_owned)
            .collect()
    }

    /// Waits for sync number `n` (1-based); returns its line and when it was seen.
    fn wait_sync(&mut self, n: usize, timeout: Duration) -> anyhow::Result<(String, Instant)> {
        let deadline = Instant::now() + timeout;
        loop {
            let syncs = self.syncs();
            if syncs.len() >= n {
                return Ok((syncs[n - 1].clone(), Instant::now()));
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the daemon exited ({status}); log:\n{}", self.log());
            }
            if Instant::now() > deadline {
                bail!("no sync #{n} within {timeout:?}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn rss_kib(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .context("no VmRSS")
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `ipvs_proxier_netlink_operations_total` by `op,result`.
fn netlink_ops(ns: &Netns) -> anyhow::Result<BTreeMap<String, u64>> {
    let text = sh(
        ns,
        &format!(
            "printf 'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' | socat -T10 -t10 - TCP:{METRICS}"
        ),
    )?;
    let mut ops = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("ipvs_proxier_netlink_operations_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let labels: String = labels.chars().filter(|c| *c != '"').collect();
        let value: f64 = value.trim().parse().unwrap_or(0.0);
        ops.insert(labels, value as u64);
    }
    Ok(ops)
}

/// Per-label difference `after - before`, non-zero entries only.
fn ops_delta(
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

fn fmt_ops(ops: &BTreeMap<String, u64>) -> String {
    if ops.is_empty() {
        return "none".into();
    }
    let total: u64 = ops.values().sum();
    let parts: Vec<String> = ops.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{total} ({})", parts.join(", "))
}

/// The `N writes` figure of a `sync done` line.
fn writes_of(line: &str) -> Option<u64> {
    let at = line.find(" writes (")?;
    line[..at]
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut services = 10_000usize;
    let mut endpoints = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--services" => services = args.next().context("--services N")?.parse()?,
            "--endpoints" => endpoints = args.next().context("--endpoints M")?.parse()?,
            other => bail!("unknown argument {other} (use --services N --endpoints M)"),
        }
    }
    ensure!(
        (1..=250).contains(&endpoints) && (1..=250_000).contains(&services),
        "table out of range"
    );
    println!("vm-bench-proxier: {services} ClusterIP TCP services x {endpoints} endpoints");
    let expected_rules = services * (endpoints + 1);
    let timeout = Duration::from_secs(120 + (services as u64) / 10);

    // nft's `reject` needs these; the VM's busybox modprobe cannot autoload them by alias.
    for module in [
        "nf_reject_ipv4",
        "nf_reject_ipv6",
        "nft_reject_ipv4",
        "nft_reject_ipv6",
    ] {
        let _ = Command::new("modprobe").arg(module).status();
    }
    // The reference and the daemon each get a fresh namespace: after a flush the kernel
    // keeps deleted destinations in a trash list for two minutes and looks every new one up
    // there linearly, which would charge the daemon a quadratic walk the reference never had.
    let refns = Netns::new();
    let ns = Netns::new();
    for netns in [&refns, &ns] {
        // Masquerade destinations need a route to the endpoints: a dummy link on their subnet.
        sh(
            netns,
            "ip link add bench0 type dummy && ip link set bench0 up && \
             ip addr add 10.200.255.254/16 dev bench0",
        )?;
    }
    let dir = std::env::temp_dir();
    let source = dir.join("vm-bench-proxier.yaml");
    let rules = dir.join("vm-bench-proxier.rules");
    let batch = dir.join("vm-bench-proxier.addrs");
    let t = Instant::now();
    std::fs::write(&source, source_file(services, endpoints, false))?;
    let gen_time = t.elapsed();
    let source_size = std::fs::metadata(&source)?.len();
    std::fs::write(&rules, restore_file(services, endpoints))?;
    std::fs::write(&batch, addr_batch(services, "refvip0"))?;
    println!(
        "source file: {:.1} MiB, generated in {:.2} s",
        source_size as f64 / (1024.0 * 1024.0),
        secs(gen_time)
    );

    // 1. Reference: ipvsadm -R, plus binding the VIPs with ip -batch.
    let t = Instant::now();
    sh(&refns, &format!("ipvsadm -R < {}", rules.display()))?;
    let ipvsadm_restore = t.elapsed();
    let reference = normalise(&sh(&refns, "ipvsadm -Sn")?);
    ensure!(
        reference.len() == expected_rules,
        "ipvsadm -Sn listed {} rules, expected {expected_rules}",
        reference.len()
    );
    sh(
        &refns,
        "ip link add refvip0 type dummy && ip link set refvip0 up",
    )?;
    let t = Instant::now();
    sh(&refns, &format!("ip -batch {}", batch.display()))?;
    let ip_batch = t.elapsed();
    // Emptied but kept: deleting a namespace holding this much is kernel work that would
    // run during the daemon's measurements; a flushed table costs nothing.
    sh(&refns, "ipvsadm -C && ip link del refvip0")?;
    let reference_total = ipvsadm_restore + ip_batch;
    println!(
        "reference: ipvsadm -R {:.2} s + ip -batch {} VIPs {:.2} s",
        secs(ipvsadm_restore),
        services,
        secs(ip_batch)
    );

    // 2. The daemon from an empty kernel to the full table.
    let log1 = dir.join("vm-bench-proxier-1.log");
    let mut daemon = Daemon::start(&ns, &source, &log1, &[])?;
    let mut n = 0;
    let (first_line, programmed_at) = loop {
        n += 1;
        let (line, at) = daemon.wait_sync(n, timeout)?;
        let table = normalise(&sh(&ns, "ipvsadm -Sn")?);
        if table == reference {
            break (line, at);
        }
        println!(
            "sync #{n} left {} rules (want {expected_rules}); waiting for the next: {line}",
            table.len()
        );
        if n >= 5 {
            let missing: Vec<_> = reference.difference(&table).take(3).collect();
            let extra: Vec<_> = table.difference(&reference).take(3).collect();
            bail!("table never matched the reference; missing {missing:?}, extra {extra:?}");
        }
    };
    let program_time = programmed_at - daemon.started;
    let vips = sh(&ns, "ip -o -4 addr show dev kube-ipvs0 | wc -l")?;
    let vips: usize = vips.trim().parse().unwrap_or(0);
    ensure!(
        vips == services,
        "{vips} VIPs bound on kube-ipvs0, want {services}"
    );
    println!(
        "daemon programmed {expected_rules} rules + {vips} VIPs in {:.2} s: {first_line}",
        secs(program_time)
    );
    let program_ops = netlink_ops(&ns)?;

    // 3. RSS after convergence.
    std::thread::sleep(Duration::from_secs(2));
    let rss = daemon.rss_kib()?;

    // 4. One endpoint change.
    let before = netlink_ops(&ns)?;
    let syncs_before = daemon.syncs().len();
    let changed_text = source_file(services, endpoints, true);
    let t = Instant::now();
    write_atomically(&source, &changed_text)?;
    let (change_line, change_at) = daemon.wait_sync(syncs_before + 1, timeout)?;
    let change_time = change_at - t;
    let change_ops = ops_delta(&before, &netlink_ops(&ns)?);
    let table = normalise(&sh(&ns, "ipvsadm -Sn")?);
    let new_rule = format!("-a -t {}:80 -r {CHANGED_ENDPOINT}:8080 -m -w 1", vip_of(0));
    ensure!(
        table.contains(&new_rule),
        "the changed endpoint is not programmed: {change_line}"
    );
    let old_rule = format!("-a -t {}:80 -r {}:8080 -m -w 1", vip_of(0), endpoint(0, 0));
    let old_left = table.contains(&old_rule);
    println!(
        "one endpoint change: {:.3} s (incl. file poll <= 1 s and re-reading the file), ops {}; old endpoint {}: {change_line}",
        secs(change_time),
        fmt_ops(&change_ops),
        if old_left {
            "still listed (draining, weight 0 expected)"
        } else {
            "removed"
        }
    );

    // 5. Restart adoption.
    daemon.stop();
    drop(daemon);
    let log2 = dir.join("vm-bench-proxier-2.log");
    let mut daemon = Daemon::start(&ns, &source, &log2, &[])?;
    let (adopt_line, adopted_at) = daemon.wait_sync(1, timeout)?;
    let adopt_time = adopted_at - daemon.started;
    let adopt_ops = netlink_ops(&ns)?;
    let adopt_writes = writes_of(&adopt_line);
    let rss_adopted = daemon.rss_kib()?;
    daemon.stop();
    drop(daemon);

    let log3 = dir.join("vm-bench-proxier-3.log");
    let t = Instant::now();
    let once = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(proxier_bin())
        .arg("--source-file")
        .arg(&source)
        .args([
            "--hostname-override",
            NODE,
            "--cluster-cidr=10.244.0.0/16",
            "--metrics-bind-address=",
            "--healthz-bind-address=",
            "--once",
        ])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log3)?)
        .stderr(std::fs::File::create(dir.join("vm-bench-proxier-3.err"))?)
        .status()?;
    let once_time = t.elapsed();
    let once_log = std::fs::read_to_string(&log3).unwrap_or_default()
        + &std::fs::read_to_string(dir.join("vm-bench-proxier-3.err")).unwrap_or_default();
    let once_writes = once_log
        .lines()
        .filter(|l| l.contains("sync done") || l.contains(" writes ("))
        .find_map(writes_of);

    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| step ({services} svc x {endpoints} ep) | ours | ipvsadm reference | ours/ref |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    let _ = writeln!(
        out,
        "| start -> fully programmed | {:.2} s | {:.2} s (ipvsadm -R) | {:.2} |",
        secs(program_time),
        secs(ipvsadm_restore),
        secs(program_time) / secs(ipvsadm_restore)
    );
    let _ = writeln!(
        out,
        "| same, reference incl. binding VIPs | {:.2} s | {:.2} s (-R + ip -batch) | {:.2} |",
        secs(program_time),
        secs(reference_total),
        secs(program_time) / secs(reference_total)
    );
    let _ = writeln!(
        out,
        "| kernel ops, first sync | {} | {} rules + {services} addrs | |",
        fmt_ops(&program_ops),
        expected_rules
    );
    let _ = writeln!(
        out,
        "| RSS after convergence | {:.1} MiB | | |",
        rss as f64 / 1024.0
    );
    let _ = writeln!(
        out,
        "| one endpoint change | {:.3} s, ops {} | | |",
        secs(change_time),
        fmt_ops(&change_ops)
    );
    let _ = writeln!(
        out,
        "| restart adoption (long-running) | {:.2} s, ops {}, writes {} | | {:.2} |",
        secs(adopt_time),
        fmt_ops(&adopt_ops),
        adopt_writes.map_or("?".into(), |w| w.to_string()),
        secs(adopt_time) / secs(ipvsadm_restore)
    );
    let _ = writeln!(
        out,
        "| RSS after adoption | {:.1} MiB | | |",
        rss_adopted as f64 / 1024.0
    );
    let _ = writeln!(
        out,
        "| restart adoption (--once) | {:.2} s, writes {}, exit {} | | {:.2} |",
        secs(once_time),
        once_writes.map_or("?".into(), |w| w.to_string()),
        once,
        secs(once_time) / secs(ipvsadm_restore)
    );
    print!("{out}");

    let mut problems = Vec::new();
    if adopt_ops
        .iter()
        .any(|(k, v)| *v > 0 && !k.contains("result=error") && k.contains("op="))
    {
        problems.push(format!(
            "restart adoption wrote to the kernel: {}",
            fmt_ops(&adopt_ops)
        ));
    }
    if adopt_writes != Some(0) {
        problems.push(format!("restart sync line: {adopt_line}"));
    }
    if !once.success() {
        problems.push(format!("--once failed: {once_log}"));
    }
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    for f in [&source, &rules, &batch] {
        let _ = std::fs::remove_file(f);
    }
    ensure!(problems.is_empty(), "{} problems", problems.len());
    println!("vm-bench-proxier: OK");
    Ok(())
}
