//! End-to-end topology for the conformance suites: the real `ipvs-proxier` daemon programs a
//! node built from network namespaces, and real traffic flows between them.
//!
//! ```text
//!   client netns                  node netns (daemon runs here)          pod netns (x N)
//!   eth0 192.168.50.2/24 ---veth--- vc 192.168.50.1/24
//!        192.168.50.3/24            kube-ipvs0 (dummy, made by the daemon)
//!        fd00:50::2/64                 fd00:50::1/64
//!                                   cbr0 10.244.0.1/24 fd00:244::1/64 ---veth--- eth0 10.244.0.1x
//!                                   (bridge, hairpin on every port,              fd00:244::1x
//!                                    br_netfilter)
//! ```
//!
//! The daemon reads Services, EndpointSlices and its Node from a YAML file (as `kubectl get -o
//! yaml` writes them); tests rewrite the file to change the cluster. Only addresses of these
//! namespaces (and VIPs the daemon binds in the node) are ever used.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ipvs_proxier_tests::Netns;

pub mod manifests;

#[allow(unused_imports)]
pub use manifests::{Ep, Port, Proto, Slice, Svc};

/// The node's name as the daemon is told it (`--hostname-override`).
pub const NODE_NAME: &str = "node-a";
/// Another node's name, for endpoints that are not local.
pub const OTHER_NODE: &str = "node-b";
pub const NODE_IP: &str = "192.168.50.1";
pub const NODE_IP6: &str = "fd00:50::1";
pub const CLIENT_IP: &str = "192.168.50.2";
pub const CLIENT_IP6: &str = "fd00:50::2";
pub const OTHER_CLIENT_IP: &str = "192.168.50.3";
pub const BRIDGE_IP: &str = "10.244.0.1";
pub const BRIDGE_IP6: &str = "fd00:244::1";
pub const CLUSTER_CIDRS: &str = "10.244.0.0/16,fd00:244::/64";

/// How long a change in the source file may take to reach the kernel under TCG.
pub const CONVERGE: Duration = Duration::from_secs(60);

/// The IPv4 address of pod `i`.
pub fn pod_ip(i: usize) -> String {
    format!("10.244.0.{}", 10 + i)
}

/// The IPv6 address of pod `i`.
pub fn pod_ip6(i: usize) -> String {
    format!("fd00:244::{:x}", 0x10 + i)
}

/// The name pod `i` answers with.
pub fn pod_name(i: usize) -> String {
    format!("pod-{i}")
}

/// Loads modules the suites need that busybox modprobe cannot autoload by alias.
fn load_modules() {
    ipvs_proxier_tests::load_modules(&[
        "br_netfilter",
        "nf_reject_ipv4",
        "nf_reject_ipv6",
        "nft_reject_ipv4",
        "nft_reject_ipv6",
        "ip_vs_rr",
        "ip_vs_sh",
    ]);
}

pub use ipvs_proxier_tests::Background;

/// The running daemon, killed on drop. Its log goes to a file shown by [`Daemon::log`].
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The pid of the daemon (of `ip netns exec`, which execs the daemon).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with the log when the daemon has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the daemon exited ({status}); log:\n{}", self.log());
        }
    }

    /// Stops the daemon (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- daemon log {} ---\n{}", self.log.display(), self.log());
        }
    }
}

static NEXT_FILE: AtomicU32 = AtomicU32::new(0);

/// The node, its external client and its pods, plus the daemon's source file.
pub struct Topology {
    pub node: Netns,
    pub client: Netns,
    pub pods: Vec<Netns>,
    pub background: Background,
    source: PathBuf,
    daemon: Option<Daemon>,
}

impl Topology {
    /// Builds the node with `pods` pods on its bridge and the external client.
    pub fn new(pods: usize) -> Topology {
        load_modules();
        let node = Netns::new();
        let client = Netns::new();
        node.sh_ok(&format!(
            "set -e
             sysctl -qw net.ipv6.conf.all.forwarding=1
             ip link add cbr0 type bridge && ip link set cbr0 up
             ip addr add {BRIDGE_IP}/24 dev cbr0 && ip addr add {BRIDGE_IP6}/64 dev cbr0 nodad
             ip link add vc type veth peer name eth0 netns {client}
             ip addr add {NODE_IP}/24 dev vc && ip addr add {NODE_IP6}/64 dev vc nodad
             ip link set vc up
             sysctl -qw net.bridge.bridge-nf-call-iptables=1 || true
             sysctl -qw net.bridge.bridge-nf-call-ip6tables=1 || true",
            client = client.name()
        ));
        client.sh_ok(&format!(
            "set -e
             ip addr add {CLIENT_IP}/24 dev eth0 && ip addr add {OTHER_CLIENT_IP}/24 dev eth0
             ip addr add {CLIENT_IP6}/64 dev eth0 nodad
             ip link set eth0 up
             ip route add default via {NODE_IP} && ip -6 route add default via {NODE_IP6}"
        ));
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let source =
            std::env::temp_dir().join(format!("ipvsp-e2e-{}-{n}.yaml", std::process::id()));
        let mut topology = Topology {
            node,
            client,
            pods: Vec::new(),
            background: Background::default(),
            source,
            daemon: None,
        };
        for _ in 0..pods {
            topology.add_pod();
        }
        topology
    }

    /// Adds a pod on the bridge (hairpin on, as CNIs set it); returns its index.
    pub fn add_pod(&mut self) -> usize {
        let i = self.pods.len();
        let pod = Netns::new();
        let port = format!("vp{i}");
        self.node.sh_ok(&format!(
            "set -e
             ip link add {port} type veth peer name eth0 netns {pod}
             ip link set {port} master cbr0 && ip link set {port} up
             ip link set {port} type bridge_slave hairpin on",
            pod = pod.name()
        ));
        pod.sh_ok(&format!(
            "set -e
             ip addr add {}/24 dev eth0 && ip addr add {}/64 dev eth0 nodad
             ip link set eth0 up
             ip route add default via {BRIDGE_IP} && ip -6 route add default via {BRIDGE_IP6}",
            pod_ip(i),
            pod_ip6(i)
        ));
        self.pods.push(pod);
        i
    }

    /// Starts, in pod `i`, TCP servers (IPv4 and IPv6) on `port` answering
    /// `pod-i <peer address>`.
    pub fn serve_tcp(&mut self, i: usize, port: u16) {
        let name = pod_name(i);
        let pod = &self.pods[i];
        self.background.spawn(
            pod,
            &format!("socat TCP6-LISTEN:{port},ipv6only=1,fork,reuseaddr SYSTEM:'echo {name} $SOCAT_PEERADDR'"),
        );
        self.serve(
            i,
            port,
            &format!(
                "socat TCP4-LISTEN:{port},fork,reuseaddr SYSTEM:'echo {name} $SOCAT_PEERADDR'"
            ),
        );
        wait_in_table(&self.pods[i], "/proc/net/tcp6", port);
    }

    /// Starts, in pod `i`, a TCP server on `port` answering `pod-i`, then after `hold`
    /// seconds `done-pod-i`: a connection that stays established for a while.
    pub fn serve_slow_tcp(&mut self, i: usize, port: u16, hold: u32) {
        let name = pod_name(i);
        self.serve(
            i,
            port,
            &format!(
                "socat TCP-LISTEN:{port},fork,reuseaddr SYSTEM:'echo {name}; sleep {hold}; echo done-{name}'"
            ),
        );
    }

    /// Starts, in pod `i`, a UDP server on `port` answering every datagram with `pod-i`.
    pub fn serve_udp(&mut self, i: usize, port: u16) {
        let name = pod_name(i);
        self.serve(
            i,
            port,
            &format!("socat UDP-RECVFROM:{port},fork SYSTEM:'echo {name}'"),
        );
    }

    /// Starts `command` in pod `i` and waits until something listens on `port` there.
    pub fn serve(&mut self, i: usize, port: u16, command: &str) {
        let pod = &self.pods[i];
        self.background.spawn(pod, command);
        wait_listening(pod, port);
    }

    /// Writes the daemon's source file: these objects plus this node. The file is replaced
    /// atomically so the daemon never reads half of it.
    pub fn write_source(&self, services: &[Svc], slices: &[Slice]) {
        self.write_source_with_node(
            &manifests::node(NODE_NAME, NODE_IP, NODE_IP6),
            services,
            slices,
        );
    }

    /// [`Topology::write_source`] with this Node manifest instead of the plain one.
    pub fn write_source_with_node(&self, node: &str, services: &[Svc], slices: &[Slice]) {
        let mut text = node.to_owned();
        for s in services {
            text.push_str("---\n");
            text.push_str(&s.to_yaml());
        }
        for s in slices {
            text.push_str("---\n");
            text.push_str(&s.to_yaml());
        }
        let tmp = self.source.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write source file");
        std::fs::rename(&tmp, &self.source).expect("rename source file");
    }

    /// [`Topology::write_source`] with one Service.
    pub fn write_one(&self, svc: &Svc, slices: &[Slice]) {
        self.write_source(std::slice::from_ref(svc), slices);
    }

    /// The source file's path.
    pub fn source(&self) -> &std::path::Path {
        &self.source
    }

    /// Starts the daemon in the node on the current source file.
    pub fn start_daemon(&mut self, extra: &[&str]) -> &mut Daemon {
        self.start_daemon_with_env(extra, &[])
    }

    /// [`Topology::start_daemon`] with extra environment variables (test hooks).
    pub fn start_daemon_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) -> &mut Daemon {
        assert!(self.source.exists(), "write_source before start_daemon");
        let log = self.source.with_extension("log");
        let file = std::fs::File::create(&log).expect("daemon log file");
        let err = file.try_clone().expect("daemon log file");
        let bin = ipvs_proxier_tests::proxier_bin();
        let child = Command::new("ip")
            .args(["netns", "exec", self.node.name()])
            .arg(bin)
            .arg("--source-file")
            .arg(&self.source)
            .args([
                "--hostname-override",
                NODE_NAME,
                "--cluster-cidr",
                CLUSTER_CIDRS,
                "--ipvs-min-sync-period=0s",
                "--ipvs-sync-period=30s",
                "--metrics-bind-address=127.0.0.1:10249",
                "--healthz-bind-address=127.0.0.1:10256",
                "--v=2",
            ])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .expect("start ipvs-proxier");
        self.daemon = Some(Daemon { child, log });
        self.daemon.as_mut().unwrap()
    }

    /// The running daemon.
    pub fn daemon(&mut self) -> &mut Daemon {
        self.daemon.as_mut().expect("daemon started")
    }

    /// The daemon's log, or nothing when it was not started.
    pub fn daemon_log(&self) -> String {
        self.daemon.as_ref().map(Daemon::log).unwrap_or_default()
    }

    /// `ipvsadm -Ln` in the node, parsed.
    pub fn ipvs(&self) -> IpvsTable {
        let out = self.node.sh("ipvsadm -Ln");
        IpvsTable::parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// Waits until `check` holds for the node's IPVS table, failing with the table and the
    /// daemon's log after [`CONVERGE`].
    pub fn wait_ipvs(&mut self, what: &str, check: impl Fn(&IpvsTable) -> bool) {
        let deadline = Instant::now() + CONVERGE;
        loop {
            let table = self.ipvs();
            if check(&table) {
                return;
            }
            if let Some(d) = self.daemon.as_mut() {
                d.assert_running();
            }
            if Instant::now() > deadline {
                panic!(
                    "IPVS never showed {what}; table:\n{}\ndaemon log:\n{}",
                    table.text,
                    self.daemon_log()
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Waits until the virtual service `key` (e.g. `TCP  10.96.0.10:80`) has exactly these
    /// real servers with a non-zero weight.
    pub fn wait_backends(&mut self, key: &str, expected: &[String]) {
        let want: BTreeSet<String> = expected.iter().cloned().collect();
        self.wait_ipvs(&format!("{key} -> {want:?}"), |t| {
            t.active_servers(key) == want
        });
        self.wait_settled();
    }

    /// Waits until the daemon has no sync running and started none for a second (from its
    /// driver's `sync starting` / `sync done` log lines), so traffic checks see the applied
    /// state rather than a sync in progress.
    pub fn wait_settled(&mut self) {
        let deadline = Instant::now() + CONVERGE;
        let mut quiet_since: Option<(Instant, usize)> = None;
        while Instant::now() < deadline {
            let log = self.daemon_log();
            let started = log.matches("driver: sync starting").count();
            let done = log.matches("driver: sync done").count();
            if started == done {
                match quiet_since {
                    Some((at, n)) if n == started => {
                        if at.elapsed() >= Duration::from_secs(1) {
                            return;
                        }
                    }
                    _ => quiet_since = Some((Instant::now(), started)),
                }
            } else {
                quiet_since = None;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A TCP request from the external client to `target` (`ip:port` or `[ip6]:port`),
    /// optionally from a given source address.
    pub fn client_tcp(&self, target: &str, source: Option<&str>) -> Option<String> {
        tcp_request(&self.client, target, source)
    }

    /// The node's IPVS table, IPVS connections and conntrack entries, for failure messages.
    pub fn diagnostics(&self) -> String {
        let out = self.node.sh(
            "echo '--- ipvsadm -Ln'; ipvsadm -Ln; echo '--- ipvsadm -Lnc'; ipvsadm -Lnc; \
             echo '--- conntrack -L'; conntrack -L 2>/dev/null | head -40",
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ipvs-proxier explain SERVICE` in the node, on the daemon's source file and with its
    /// planner flags plus `extra`. `prefix` runs first in the same shell, in a mount
    /// namespace of its own (`ip netns exec` makes one): a test may hide files there.
    pub fn explain(&self, prefix: &str, service: &str, extra: &[&str]) -> std::process::Output {
        let script = format!(
            "{prefix}\nexec {} explain {service} --source-file {} --hostname-override {NODE_NAME} \
             --cluster-cidr {CLUSTER_CIDRS} {}",
            ipvs_proxier_tests::proxier_bin().display(),
            self.source.display(),
            extra.join(" ")
        );
        self.node.sh(&script)
    }

    /// [`Topology::explain`] with `--output json`: the document, or a panic with stderr.
    pub fn explain_json(&self, prefix: &str, service: &str, extra: &[&str]) -> serde_json::Value {
        let extra = [extra, &["--output", "json"]].concat();
        let out = self.explain(prefix, service, &extra);
        assert!(
            out.status.success(),
            "explain {service} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "explain {service}: not JSON ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// The node's metrics text.
    pub fn metrics(&self) -> String {
        self.node.sh_ok(
            "printf 'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' | socat -T10 -t10 - TCP:127.0.0.1:10249",
        )
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
            if std::thread::panicking() {
                eprintln!("--- daemon log ---\n{}", d.log());
            }
        }
        let _ = std::fs::remove_file(&self.source);
        let _ = std::fs::remove_file(self.source.with_extension("log"));
    }
}

/// Formats `ip:port` with brackets for IPv6.
pub fn hostport(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The socat address for TCP to `target` (`ip:port` or `[ip6]:port`).
fn tcp_address(target: &str, source: Option<&str>) -> String {
    let v6 = target.starts_with('[');
    let proto = if v6 { "TCP6" } else { "TCP4" };
    let mut address = format!("{proto}:{target},connect-timeout=5");
    if let Some(source) = source {
        let _ = write!(address, ",bind={}", bracket(source));
    }
    address
}

fn bracket(ip: &str) -> String {
    if ip.contains(':') && !ip.starts_with('[') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    }
}

/// One TCP request from `netns`: the first answer line. The client only reads (`-u`): had it
/// sent data, the server's socat could hit its exited `echo` child's closed pipe and close
/// the connection before relaying the answer, or `None` on failure/no answer.
pub fn tcp_request(netns: &Netns, target: &str, source: Option<&str>) -> Option<String> {
    let out = netns.sh(&format!("socat -T10 -u {} -", tcp_address(target, source)));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// One UDP request from `netns` to `target`.
pub fn udp_request(netns: &Netns, target: &str) -> Option<String> {
    let proto = if target.starts_with('[') {
        "UDP6"
    } else {
        "UDP4"
    };
    let out = netns.sh(&format!("echo q | socat -T5 -t5 - {proto}:{target}"));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// The pod names in a set of answers (`pod-N ...` -> `pod-N`).
pub fn names(answers: &[Option<String>]) -> BTreeSet<String> {
    answers
        .iter()
        .flatten()
        .filter_map(|a| a.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// `n` requests made by `request`; panics if any one failed.
pub fn all_answer(
    n: usize,
    what: &str,
    mut request: impl FnMut() -> Option<String>,
) -> Vec<String> {
    (0..n)
        .map(|k| request().unwrap_or_else(|| panic!("{what}: request {k} got no answer")))
        .collect()
}

/// The set of pod names of answers.
pub fn name_set(answers: &[String]) -> BTreeSet<String> {
    answers
        .iter()
        .filter_map(|a| a.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// The set `pod-i` for these pods.
pub fn pods(list: &[usize]) -> BTreeSet<String> {
    list.iter().map(|i| pod_name(*i)).collect()
}

/// Waits until something listens on TCP/UDP/SCTP `port` in `netns`.
pub fn wait_listening(netns: &Netns, port: u16) {
    netns.wait_listening(port);
}

/// Waits until `table` (e.g. `/proc/net/tcp6`) in `netns` lists local port `port`.
pub fn wait_in_table(netns: &Netns, table: &str, port: u16) {
    netns.wait_in_table(table, port);
}

/// `ipvsadm -Ln` output, parsed into virtual services and their real servers.
#[derive(Debug, Clone, Default)]
pub struct IpvsTable {
    pub text: String,
    /// (service line key such as `TCP  10.96.0.10:80`, scheduler/flags rest, servers)
    pub services: Vec<(String, String, Vec<RealServer>)>,
}

/// One `-> addr:port Forward Weight Active Inactive` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealServer {
    pub address: String,
    pub forward: String,
    pub weight: u32,
    pub active: u32,
    pub inactive: u32,
}

impl IpvsTable {
    /// Parses `ipvsadm -Ln`.
    pub fn parse(text: &str) -> IpvsTable {
        let mut table = IpvsTable {
            text: text.to_owned(),
            services: Vec::new(),
        };
        for line in text.lines() {
            if line.starts_with("IP Virtual Server") || line.starts_with("Prot ") {
                continue;
            }
            let trimmed = line.trim_start();
            if let Some(rest) = trimmed.strip_prefix("->") {
                let f: Vec<&str> = rest.split_whitespace().collect();
                if f.first() == Some(&"RemoteAddress:Port") || f.len() < 5 {
                    continue;
                }
                if let Some(svc) = table.services.last_mut() {
                    svc.2.push(RealServer {
                        address: f[0].to_owned(),
                        forward: f[1].to_owned(),
                        weight: f[2].parse().unwrap_or(0),
                        active: f[3].parse().unwrap_or(0),
                        inactive: f[4].parse().unwrap_or(0),
                    });
                }
            } else if !trimmed.is_empty() {
                let f: Vec<&str> = trimmed.split_whitespace().collect();
                if f.len() >= 2 {
                    table.services.push((
                        format!("{}  {}", f[0], f[1]),
                        f[2..].join(" "),
                        Vec::new(),
                    ));
                }
            }
        }
        table
    }

    /// The service `key`, if present: (flags, servers).
    pub fn service(&self, key: &str) -> Option<(&str, &[RealServer])> {
        self.services
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, flags, servers)| (flags.as_str(), servers.as_slice()))
    }

    /// Addresses of the real servers of `key` with a non-zero weight.
    pub fn active_servers(&self, key: &str) -> BTreeSet<String> {
        self.service(key)
            .map(|(_, servers)| {
                servers
                    .iter()
                    .filter(|s| s.weight > 0)
                    .map(|s| s.address.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Addresses of all real servers of `key`, whatever their weight.
    pub fn all_servers(&self, key: &str) -> BTreeSet<String> {
        self.service(key)
            .map(|(_, servers)| servers.iter().map(|s| s.address.clone()).collect())
            .unwrap_or_default()
    }
}

/// `pod_ip(i):port` for these pods.
pub fn backends(list: &[usize], port: u16) -> Vec<String> {
    list.iter().map(|i| hostport(&pod_ip(*i), port)).collect()
}

/// `[pod_ip6(i)]:port` for these pods.
pub fn backends6(list: &[usize], port: u16) -> Vec<String> {
    list.iter().map(|i| hostport(&pod_ip6(*i), port)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipvsadm_listing_parses() {
        let text = "IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.10:80 rr persistent 10800
  -> 10.244.0.10:80               Masq    1      0          0
  -> 10.244.0.11:80               Masq    0      1          0
UDP  [fd00:96::10]:53 rr
  -> [fd00:244::10]:53            Masq    1      0          0
";
        let t = IpvsTable::parse(text);
        assert_eq!(t.services.len(), 2);
        let (flags, servers) = t.service("TCP  10.96.0.10:80").unwrap();
        assert_eq!(flags, "rr persistent 10800");
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[1].active, 1);
        assert_eq!(
            t.active_servers("TCP  10.96.0.10:80"),
            ["10.244.0.10:80".to_owned()].into_iter().collect()
        );
        assert_eq!(
            t.all_servers("UDP  [fd00:96::10]:53"),
            ["[fd00:244::10]:53".to_owned()].into_iter().collect()
        );
    }
}
