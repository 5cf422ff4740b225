//! The `ipvs-proxier` daemon programming the real kernel (in the VM), fed a `--source-file`,
//! each test in its own network namespace: `--once` from empty, an unchanged rerun that writes
//! nothing, a running daemon following file edits, kill -9 mid-sync then a restart, real TCP
//! traffic to a ClusterIP, and `--cleanup`.
//!
//! The oracles are the kernel's own tools: `ipvsadm -Sn`, `ip -o addr`, `nft list tables`.
//! Expected `ipvsadm -Sn` lines are written from the Services in the test (kube-proxy's
//! semantics: round robin, masquerade, weight 1), not from the daemon's output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use ipvs_proxier_tests::{Netns, PROXIER_BIN_ENV, ShellProcess, require_kernel};

/// One ClusterIP Service with one port and the ready endpoints of its one slice.
struct Svc {
    name: String,
    cluster_ip: String,
    protocol: &'static str,
    port: u16,
    target: u16,
    endpoints: Vec<String>,
}

impl Svc {
    fn tcp(name: &str, cluster_ip: &str, port: u16, target: u16) -> Svc {
        Svc {
            name: name.to_owned(),
            cluster_ip: cluster_ip.to_owned(),
            protocol: "TCP",
            port,
            target,
            endpoints: Vec::new(),
        }
    }

    fn with(mut self, endpoints: &[&str]) -> Svc {
        self.endpoints = endpoints.iter().map(|e| (*e).to_owned()).collect();
        self
    }

    /// The `ipvsadm -Sn` lines kube-proxy's IPVS mode would make for it.
    fn ipvsadm_lines(&self) -> Vec<String> {
        let flag = if self.protocol == "UDP" { "-u" } else { "-t" };
        let vs = format!("{}:{}", self.cluster_ip, self.port);
        let mut lines = vec![format!("-A {flag} {vs} -s rr")];
        for ep in &self.endpoints {
            lines.push(format!("-a {flag} {vs} -r {ep}:{} -m -w 1", self.target));
        }
        lines
    }
}

/// The Services as `kubectl get -o yaml` would print them (the fields the daemon reads).
fn manifests(services: &[Svc]) -> String {
    let mut out = String::new();
    for s in services {
        let _ = write!(
            out,
            "---
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
spec:
  type: ClusterIP
  clusterIP: {ip}
  clusterIPs:
  - {ip}
  ports:
  - name: p
    port: {port}
    protocol: {proto}
    targetPort: {target}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: default
  labels:
    kubernetes.io/service-name: {name}
addressType: IPv4
",
            name = s.name,
            ip = s.cluster_ip,
            port = s.port,
            proto = s.protocol,
            target = s.target,
        );
        out.push_str(if s.endpoints.is_empty() {
            "endpoints: []\n"
        } else {
            "endpoints:\n"
        });
        for ep in &s.endpoints {
            let _ = write!(
                out,
                "- addresses:
  - {ep}
  conditions:
    ready: true
"
            );
        }
        let _ = write!(
            out,
            "ports:
- name: p
  port: {}
  protocol: {}
",
            s.target, s.protocol
        );
    }
    out
}

/// The starting cluster of most tests, written by hand (shared with least_privilege).
const BASE_TEMPLATE: &str = include_str!("../fixtures/web-and-dns.yaml");

/// [`BASE_TEMPLATE`] with dns served by 10.244.0.2.
fn base() -> String {
    BASE_TEMPLATE.replace("DNS_ENDPOINT", "10.244.0.2")
}

/// `ipvsadm -Sn` lines expected for [`base`].
const BASE_IPVS: &[&str] = &[
    "-A -t 10.96.0.10:80 -s rr",
    "-a -t 10.96.0.10:80 -r 10.244.0.2:8080 -m -w 1",
    "-a -t 10.96.0.10:80 -r 10.244.0.3:8080 -m -w 1",
    "-A -u 10.96.0.20:53 -s rr",
    "-a -u 10.96.0.20:53 -r 10.244.0.2:5353 -m -w 1",
];

/// Prints a line the VM log keeps (libtest captures `eprintln!`).
fn note(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("daemon_kernel: {line}\n").as_bytes());
}

/// Whether the daemon binary is known; prints a SKIP line otherwise.
fn daemon_available(test: &str) -> bool {
    if std::env::var_os(PROXIER_BIN_ENV).is_some() {
        return true;
    }
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("SKIP {test}: {PROXIER_BIN_ENV} is not set\n").as_bytes());
    false
}

/// Loads the modules nft's `reject` needs (nf_tables asks for them by alias, which the VM's
/// busybox modprobe does not resolve).
fn load_nft_modules() {
    ipvs_proxier_tests::load_modules(&[
        "nf_reject_ipv4",
        "nf_reject_ipv6",
        "nft_reject_ipv4",
        "nft_reject_ipv6",
    ]);
}

/// A node: a network namespace with the daemon's source file in a directory of its own.
struct Node {
    ns: Netns,
    dir: PathBuf,
}

impl Node {
    fn new() -> Node {
        load_nft_modules();
        let ns = Netns::new();
        let dir = std::env::temp_dir().join(format!("daemon-kernel-{}", ns.name()));
        std::fs::create_dir_all(&dir).unwrap();
        Node { ns, dir }
    }

    /// A route to the pod range, which masquerading real servers need.
    fn with_pod_route(self) -> Node {
        self.ns.sh_ok(
            "ip link add pods type dummy && ip link set pods up && ip addr add 10.244.0.1/24 dev pods",
        );
        self
    }

    fn source(&self) -> PathBuf {
        self.dir.join("cluster.yaml")
    }

    /// Replaces the source file in one rename, as an editor or a ConfigMap update does.
    fn write_source(&self, yaml: &str) {
        let tmp = self.dir.join("cluster.yaml.tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.source()).unwrap();
    }

    fn daemon_command(&self, extra: &str) -> String {
        format!(
            "\"${PROXIER_BIN_ENV}\" --source-file {} --hostname-override node-a {extra}",
            self.source().display()
        )
    }

    /// `--once`; returns the output and how long it took.
    fn once(&self) -> (Output, Duration) {
        let started = Instant::now();
        let out = self.ns.sh(&self.daemon_command("--once"));
        (out, started.elapsed())
    }

    fn once_ok(&self) -> (String, Duration) {
        let (out, took) = self.once();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "--once failed ({:?}): {stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        (stdout, took)
    }

    /// Starts the daemon in the background. Logs go to a file.
    fn spawn_daemon(&self) -> ShellProcess {
        let log = self.dir.join("daemon.log");
        let pid = self.ns.sh_ok(&format!(
            "{} -v 2 >{} 2>&1 </dev/null & echo $!",
            self.daemon_command("--ipvs-min-sync-period=0s"),
            log.display()
        ));
        ShellProcess::new(pid.trim().parse().expect("pid"))
    }

    fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// `ipvsadm -Sn`, read until two listings in a row agree. Its service dump resumes by a
    /// position counted over every network namespace's services, so while other tests of
    /// this binary change IPVS in theirs a single listing can repeat or skip services of
    /// this one (seen in the VM: a service listed twice).
    fn ipvsadm_save(&self) -> String {
        let mut last = self.ns.sh_ok("ipvsadm -Sn");
        for _ in 0..20 {
            let next = self.ns.sh_ok("ipvsadm -Sn");
            if next == last {
                return next;
            }
            last = next;
        }
        panic!("ipvsadm -Sn never listed the same table twice in a row: {last}");
    }

    fn ipvs_lines(&self) -> BTreeSet<String> {
        self.ipvsadm_save().lines().map(str::to_owned).collect()
    }

    /// Addresses on kube-ipvs0 (empty when the link is absent).
    fn vips(&self) -> BTreeSet<String> {
        let out = self.ns.sh("ip -o -4 addr show dev kube-ipvs0");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                words.find(|w| *w == "inet")?;
                words.next().map(str::to_owned)
            })
            .collect()
    }

    fn nft_tables(&self) -> String {
        self.ns.sh_ok("nft list tables")
    }

    /// Polls `check` every 200 ms until it holds or `limit` passes; returns the time taken.
    fn wait_for(
        &self,
        limit: Duration,
        what: &str,
        mut check: impl FnMut(&Node) -> bool,
    ) -> Duration {
        ipvs_proxier_tests::wait_until(
            limit,
            what,
            || check(self),
            || {
                format!(
                    "ipvsadm -Sn:\n{}\nvips: {:?}\ndaemon log:\n{}",
                    self.ipvsadm_save(),
                    self.vips(),
                    self.daemon_log()
                )
            },
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `signal` to process `pid`.
fn kill(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

fn lines(expected: &[&str]) -> BTreeSet<String> {
    expected.iter().map(|l| (*l).to_owned()).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|l| (*l).to_owned()).collect()
}

fn assert_our_table(node: &Node) {
    let tables = node.nft_tables();
    assert!(
        tables.contains("table ip ipvs-proxier"),
        "no nftables table of ours: {tables}"
    );
}

#[test]
fn once_from_empty_programs_services_addresses_and_table() {
    require_kernel!();
    if !daemon_available("once_from_empty_programs_services_addresses_and_table") {
        return;
    }
    let node = Node::new().with_pod_route();
    node.write_source(&base());
    assert_eq!(
        node.ipvsadm_save().trim(),
        "",
        "fresh namespace has no IPVS services"
    );

    let (stdout, took) = node.once_ok();
    note(&format!(
        "--once from empty took {took:?}: {}",
        stdout.trim()
    ));
    assert_eq!(node.ipvs_lines(), lines(BASE_IPVS));
    assert_eq!(node.vips(), set(&["10.96.0.10/32", "10.96.0.20/32"]));
    let link = node.ns.sh_ok("ip -o link show kube-ipvs0");
    assert!(
        link.contains("dummy") || link.contains("UP") || link.contains("UNKNOWN"),
        "{link}"
    );
    assert_our_table(&node);
    // 2 virtual servers + 3 real servers + 2 addresses.
    assert!(
        stdout.contains("kernel full sync: 7 writes (0 deletes, 0 failed)"),
        "{stdout}"
    );
}

#[test]
fn once_again_with_unchanged_input_changes_nothing() {
    require_kernel!();
    if !daemon_available("once_again_with_unchanged_input_changes_nothing") {
        return;
    }
    let node = Node::new().with_pod_route();
    node.write_source(&base());
    node.once_ok();
    let before = node.ipvsadm_save();
    let vips_before = node.vips();

    let (stdout, took) = node.once_ok();
    note(&format!(
        "unchanged --once rerun took {took:?}: {}",
        stdout.trim()
    ));
    assert_eq!(
        node.ipvsadm_save(),
        before,
        "ipvsadm -Sn changed byte for byte"
    );
    assert_eq!(node.vips(), vips_before);
    assert!(
        stdout.contains("kernel full sync: 0 writes (0 deletes, 0 failed)"),
        "an unchanged restart must write nothing: {stdout}"
    );
    assert_our_table(&node);
}

#[test]
fn running_daemon_follows_file_edits() {
    require_kernel!();
    if !daemon_available("running_daemon_follows_file_edits") {
        return;
    }
    let node = Node::new().with_pod_route();
    node.write_source(&base());
    let started = Instant::now();
    let daemon = node.spawn_daemon();
    let first = node.wait_for(Duration::from_secs(90), "initial programming", |n| {
        n.ipvs_lines() == lines(BASE_IPVS)
    });
    note(&format!("daemon start to programmed: {first:?}"));

    // Remove web's second endpoint, add a Service.
    let edited = base().replace(
        "- addresses:\n  - 10.244.0.3\n  conditions:\n    ready: true\n",
        "",
    ) + &manifests(&[Svc::tcp("api", "10.96.0.30", 443, 8443).with(&["10.244.0.4"])]);
    assert_ne!(edited, base());
    node.write_source(&edited);
    let mut expected = lines(BASE_IPVS);
    expected.remove("-a -t 10.96.0.10:80 -r 10.244.0.3:8080 -m -w 1");
    expected.insert("-A -t 10.96.0.30:443 -s rr".to_owned());
    expected.insert("-a -t 10.96.0.30:443 -r 10.244.0.4:8443 -m -w 1".to_owned());
    let converged = node.wait_for(Duration::from_secs(60), "edit applied", |n| {
        n.ipvs_lines() == expected
            && n.vips() == set(&["10.96.0.10/32", "10.96.0.20/32", "10.96.0.30/32"])
    });
    note(&format!("file edit to converged: {converged:?}"));

    // Remove a Service: its virtual server and address go.
    node.write_source(&manifests(&[
        Svc::tcp("web", "10.96.0.10", 80, 8080).with(&["10.244.0.2"])
    ]));
    let removed = node.wait_for(Duration::from_secs(60), "services removed", |n| {
        n.ipvs_lines()
            == lines(&[
                "-A -t 10.96.0.10:80 -s rr",
                "-a -t 10.96.0.10:80 -r 10.244.0.2:8080 -m -w 1",
            ])
            && n.vips() == set(&["10.96.0.10/32"])
    });
    note(&format!("service removal to converged: {removed:?}"));

    // SIGTERM stops it and leaves the data plane programmed.
    kill(daemon.pid(), "-TERM");
    node.wait_for(Duration::from_secs(10), "daemon exit", |_| {
        !daemon.running()
    });
    assert_eq!(
        node.vips(),
        set(&["10.96.0.10/32"]),
        "SIGTERM must leave addresses"
    );
    assert!(node.ipvsadm_save().contains("-A -t 10.96.0.10:80 -s rr"));
    assert_our_table(&node);
    note(&format!(
        "running daemon test total: {:?}",
        started.elapsed()
    ));
}

#[test]
fn kill_9_during_sync_then_restart_converges() {
    require_kernel!();
    if !daemon_available("kill_9_during_sync_then_restart_converges") {
        return;
    }
    let node = Node::new().with_pod_route();
    // Enough services that the first sync takes a while.
    const N: usize = 120;
    let svc = |i: usize, endpoints: &[&str]| {
        Svc::tcp(&format!("svc-{i}"), &format!("10.96.1.{i}"), 80, 8080).with(endpoints)
    };
    let services: Vec<Svc> = (0..N)
        .map(|i| svc(i, &["10.244.0.2", "10.244.0.3"]))
        .collect();
    node.write_source(&manifests(&services));

    let daemon = node.spawn_daemon();
    let started = Instant::now();
    // Kill it as soon as its first sync starts writing (the link is made first).
    loop {
        if node.daemon_log().contains("created dummy link") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the daemon programmed nothing in 120 s:\n{}",
            node.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(daemon.pid(), "-KILL");
    let at_kill = node.ns.sh_ok("ipvsadm -Ln | grep -c '^TCP' || true");
    let vips_at_kill = node.vips().len();
    note(&format!(
        "killed -9 after {:?} with {} of {N} virtual servers and {vips_at_kill} addresses programmed",
        started.elapsed(),
        at_kill.trim()
    ));

    // While it was down: the first 40 Services went away, the rest lost an endpoint and got
    // another.
    let remaining: Vec<Svc> = (40..N)
        .map(|i| svc(i, &["10.244.0.3", "10.244.0.4"]))
        .collect();
    node.write_source(&manifests(&remaining));
    let (stdout, took) = node.once_ok();
    note(&format!("restart --once took {took:?}: {}", stdout.trim()));

    let expected: BTreeSet<String> = remaining.iter().flat_map(Svc::ipvsadm_lines).collect();
    assert_eq!(node.ipvs_lines(), expected, "stale or missing IPVS entries");
    let expected_vips: BTreeSet<String> = remaining
        .iter()
        .map(|s| format!("{}/32", s.cluster_ip))
        .collect();
    assert_eq!(node.vips(), expected_vips, "stale or missing addresses");
    assert_our_table(&node);

    // And a second restart writes nothing.
    let (stdout, _) = node.once_ok();
    assert!(
        stdout.contains("kernel full sync: 0 writes (0 deletes, 0 failed)"),
        "{stdout}"
    );
}

#[test]
fn client_reaches_the_backend_through_the_cluster_ip() {
    require_kernel!();
    if !daemon_available("client_reaches_the_backend_through_the_cluster_ip") {
        return;
    }
    let node = Node::new();
    let backend = Netns::new();
    let client = Netns::new();
    // Backend pod on a veth into the node; a client host on another.
    node.ns.sh_ok(&format!(
        "ip link add pod0 type veth peer name eth0 netns {be}
         ip addr add 10.244.0.1/24 dev pod0 && ip link set pod0 up
         ip link add cl0 type veth peer name eth0 netns {cl}
         ip addr add 10.100.0.1/24 dev cl0 && ip link set cl0 up",
        be = backend.name(),
        cl = client.name()
    ));
    backend.sh_ok(
        "ip addr add 10.244.0.2/24 dev eth0 && ip link set eth0 up && ip route add default via 10.244.0.1",
    );
    client.sh_ok(
        "ip addr add 10.100.0.2/24 dev eth0 && ip link set eth0 up && ip route add default via 10.100.0.1",
    );
    let server = ShellProcess::new(
        backend
            .sh_ok(
                "socat TCP-LISTEN:8080,fork,reuseaddr SYSTEM:'echo backend-a' >/dev/null 2>&1 </dev/null & echo $!",
            )
            .trim()
            .parse()
            .expect("socat pid"),
    );
    node.write_source(&manifests(&[
        Svc::tcp("web", "10.96.0.10", 80, 8080).with(&["10.244.0.2"])
    ]));
    let (stdout, took) = node.once_ok();
    note(&format!(
        "--once for the traffic test took {took:?}: {}",
        stdout.trim()
    ));

    // The backend answers directly first (its server is up), so a failure below is IPVS's.
    let direct = node.wait_for(Duration::from_secs(60), "backend listening", |n| {
        let out =
            n.ns.sh("socat -T5 - TCP:10.244.0.2:8080,connect-timeout=5 </dev/null");
        String::from_utf8_lossy(&out.stdout).trim() == "backend-a"
    });
    note(&format!("backend answered directly after {direct:?}"));

    let started = Instant::now();
    let answer = loop {
        let out = client.sh("socat -T5 - TCP:10.96.0.10:80,connect-timeout=5 </dev/null");
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if text == "backend-a" || started.elapsed() > Duration::from_secs(60) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    drop(server);
    assert_eq!(
        answer,
        "backend-a",
        "client -> ClusterIP -> backend failed\nipvsadm:\n{}",
        node.ipvsadm_save()
    );
    note(&format!(
        "client got the backend's answer after {:?}",
        started.elapsed()
    ));
    let conns = node.ns.sh_ok("ipvsadm -Ln --stats -t 10.96.0.10:80");
    assert!(conns.contains("10.244.0.2:8080"), "{conns}");
}

#[test]
fn cleanup_removes_virtual_servers_link_and_table() {
    require_kernel!();
    if !daemon_available("cleanup_removes_virtual_servers_link_and_table") {
        return;
    }
    let node = Node::new().with_pod_route();
    node.write_source(&base());
    node.once_ok();
    assert_our_table(&node);
    // A virtual server someone else made, on an address that is not on our link.
    node.ns.sh_ok(
        "ipvsadm -A -t 10.200.0.1:80 -s wrr && ipvsadm -a -t 10.200.0.1:80 -r 10.244.0.9:80 -m",
    );
    // What kube-proxy's IPVS mode leaves behind for a NodePort: a virtual server on a node
    // address in the NodePort range (removed); and one outside that range (left alone).
    node.ns.sh_ok(
        "ipvsadm -A -t 10.244.0.1:30080 -s rr && ipvsadm -a -t 10.244.0.1:30080 -r 10.244.0.9:80 -m \
         && ipvsadm -A -u 10.244.0.1:31000 -s rr \
         && ipvsadm -A -t 10.244.0.1:8443 -s rr",
    );

    let started = Instant::now();
    let cleanup = format!("\"${PROXIER_BIN_ENV}\" --cleanup");
    let out = node.ns.sh(&cleanup);
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "--cleanup failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    note(&format!(
        "--cleanup took {took:?}: {}",
        String::from_utf8_lossy(&out.stdout).trim()
    ));
    assert_eq!(
        node.ipvs_lines(),
        lines(&[
            "-A -t 10.200.0.1:80 -s wrr",
            "-a -t 10.200.0.1:80 -r 10.244.0.9:80 -m -w 1",
            "-A -t 10.244.0.1:8443 -s rr",
        ]),
        "only the foreign virtual servers may stay"
    );
    let link = node.ns.sh("ip link show kube-ipvs0");
    assert!(!link.status.success(), "kube-ipvs0 still exists");
    let tables = node.nft_tables();
    assert!(
        !tables.contains("ipvs-proxier"),
        "our table is still there: {tables}"
    );
    // Idempotent: a second cleanup finds nothing and succeeds.
    let again = node.ns.sh(&cleanup);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[test]
fn torn_source_files_keep_every_virtual_server() {
    require_kernel!();
    if !daemon_available("torn_source_files_keep_every_virtual_server") {
        return;
    }
    let node = Node::new().with_pod_route();
    let services: Vec<Svc> = (0..50)
        .map(|i| {
            Svc::tcp(&format!("s{i}"), &format!("10.96.1.{}", i + 1), 80, 8080)
                .with(&[&format!("10.244.0.{}", i + 2)])
        })
        .collect();
    let whole = manifests(&services);
    let expected: BTreeSet<String> = services.iter().flat_map(Svc::ipvsadm_lines).collect();
    node.write_source(&whole);
    let daemon = node.spawn_daemon();
    node.wait_for(Duration::from_secs(120), "50 services programmed", |n| {
        n.ipvs_lines() == expected
    });

    // `kubectl get -o yaml > file`: truncated in place, empty for 3 s.
    std::fs::write(node.source(), "").unwrap();
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            node.ipvs_lines(),
            expected,
            "an empty file removed services"
        );
    }
    // Cut in the middle of a document (an interrupted write), for 3 s.
    let cut = whole.len() / 8;
    let torn = &whole[..whole[..cut].rfind("  name: ").unwrap() + 9];
    std::fs::write(node.source(), torn).unwrap();
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(node.ipvs_lines(), expected, "a torn file removed services");
    }
    assert!(
        node.daemon_log().contains("ends mid-line"),
        "the refusal is logged:\n{}",
        node.daemon_log()
    );

    // An intended change still converges: the last Service goes.
    let fewer = manifests(&services[..49]);
    node.write_source(&fewer);
    let mut smaller = expected.clone();
    for line in services[49].ipvsadm_lines() {
        smaller.remove(&line);
    }
    node.wait_for(Duration::from_secs(60), "intended change", |n| {
        n.ipvs_lines() == smaller
    });
    kill(daemon.pid(), "-TERM");
}
