//! The `cni-proxier` example (examples/src/bin/cni-proxier.rs) against the real kernel (in
//! the VM): the example binary runs inside a fresh network namespace with `ip netns exec`,
//! fed a YAML file of Services and EndpointSlices the test writes to /tmp (read by
//! proxier-runtime's file source).
//!
//! - `--watch`: the table and the VIP on `kube-ipvs0` appear, real TCP traffic from a client
//!   namespace reaches both pod namespaces through the VIP, then file edits are followed
//!   incrementally (an endpoint removed, drained and deleted; a Service replaced by another),
//!   drift is repaired by the periodic full resync, a torn or malformed file changes nothing,
//!   and a good file after them is followed again.
//! - one-shot runs: a first run programs the kernel, an unchanged rerun writes nothing, an
//!   edited rerun converges, a malformed file fails the run and changes nothing, and a
//!   virtual server someone else made is never touched.
//!
//! The oracles are the kernel's tools (`ipvsadm -Sn`, `ip -o addr`, socat answers). Expected
//! `ipvsadm -Sn` lines are written from the Services in the test (round robin, masquerade,
//! weight 1, persistence for affinity, only this node's endpoints for `local`), not from the
//! example's output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use ipvs_proxier_tests::{Netns, PROXIER_BIN_ENV, ShellProcess, require_kernel};

/// The example program's name (a binary of package ipvs-proxier-examples).
const EXAMPLE: &str = "cni-proxier";

/// The node the example runs as.
const NODE: &str = "node-a";

/// Where the example binary is: `cargo xtask vm-test` builds the example programs next to the
/// daemon (`IPVS_PROXIER_BIN`), in a directory on the guest's PATH.
fn example_bin() -> PathBuf {
    let next_to_daemon = std::env::var_os(PROXIER_BIN_ENV)
        .map(PathBuf::from)
        .and_then(|daemon| daemon.parent().map(|dir| dir.join(EXAMPLE)));
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join(EXAMPLE));
    next_to_daemon
        .into_iter()
        .chain(on_path)
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!("{EXAMPLE} is neither next to ${PROXIER_BIN_ENV} nor on PATH (xtask builds it)")
        })
}

/// Prints a line the VM log keeps (libtest captures `eprintln!`).
fn note(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("cni_example: {line}\n").as_bytes());
}

/// One Service of the example's input format, with one port.
#[derive(Clone)]
struct Svc {
    name: &'static str,
    vip: &'static str,
    protocol: &'static str,
    port: u16,
    target: u16,
    affinity: Option<u32>,
    local: bool,
    /// (address, node)
    endpoints: Vec<(&'static str, &'static str)>,
}

impl Svc {
    fn tcp(name: &'static str, vip: &'static str, port: u16, target: u16) -> Svc {
        Svc {
            name,
            vip,
            protocol: "tcp",
            port,
            target,
            affinity: None,
            local: false,
            endpoints: Vec::new(),
        }
    }

    fn udp(self) -> Svc {
        Svc {
            protocol: "udp",
            ..self
        }
    }

    fn endpoint(mut self, address: &'static str, node: &'static str) -> Svc {
        self.endpoints.push((address, node));
        self
    }

    /// The Service and its EndpointSlice as Kubernetes manifests (YAML documents).
    fn yaml(&self) -> String {
        let (namespace, name) = self.name.split_once('/').expect("namespace/name");
        let protocol = self.protocol.to_uppercase();
        let mut y = format!(
            "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {namespace}\n\
             spec:\n  type: ClusterIP\n  clusterIP: {vip}\n  clusterIPs:\n  - {vip}\n\
             \x20 ports:\n  - name: p\n    port: {port}\n    protocol: {protocol}\n    targetPort: {target}\n",
            vip = self.vip,
            port = self.port,
            target = self.target,
        );
        if let Some(seconds) = self.affinity {
            y.push_str(&format!(
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: {seconds}\n"
            ));
        }
        if self.local {
            y.push_str("  internalTrafficPolicy: Local\n");
        }
        y.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-cni\n\
             \x20 namespace: {namespace}\n  labels:\n    kubernetes.io/service-name: {name}\n\
             addressType: IPv4\nports:\n- name: p\n  port: {target}\n  protocol: {protocol}\nendpoints:\n",
            target = self.target,
        ));
        for (address, node) in &self.endpoints {
            y.push_str(&format!(
                "- addresses:\n  - {address}\n  conditions:\n    ready: true\n  nodeName: {node}\n"
            ));
        }
        y
    }

    /// The `ipvsadm -Sn` lines this Service should become on node [`NODE`].
    fn ipvsadm_lines(&self) -> Vec<String> {
        let flag = match self.protocol {
            "tcp" => "-t",
            "udp" => "-u",
            other => panic!("no ipvsadm flag for {other}"),
        };
        let vs = format!("{}:{}", self.vip, self.port);
        let persistence = self
            .affinity
            .map(|s| format!(" -p {s}"))
            .unwrap_or_default();
        let mut lines = vec![format!("-A {flag} {vs} -s rr{persistence}")];
        let on_node: Vec<&str> = self
            .endpoints
            .iter()
            .filter(|(_, node)| *node == NODE)
            .map(|(address, _)| *address)
            .collect();
        let chosen: Vec<&str> = if self.local && !on_node.is_empty() {
            on_node
        } else {
            self.endpoints.iter().map(|(address, _)| *address).collect()
        };
        for address in chosen {
            lines.push(format!(
                "-a {flag} {vs} -r {address}:{} -m -w 1",
                self.target
            ));
        }
        lines
    }
}

fn manifests(services: &[Svc]) -> String {
    services.iter().map(Svc::yaml).collect()
}

fn expected_lines(services: &[Svc]) -> BTreeSet<String> {
    services.iter().flat_map(Svc::ipvsadm_lines).collect()
}

fn expected_vips(services: &[Svc]) -> BTreeSet<String> {
    services.iter().map(|s| format!("{}/32", s.vip)).collect()
}

/// The namespace the example runs in, with its input file in a directory of its own.
struct Node {
    ns: Netns,
    dir: PathBuf,
}

impl Node {
    fn new() -> Node {
        let ns = Netns::new();
        ns.sh_ok("echo 1 > /proc/sys/net/ipv4/ip_forward");
        let dir = std::env::temp_dir().join(format!("cni-example-{}", ns.name()));
        std::fs::create_dir_all(&dir).unwrap();
        Node { ns, dir }
    }

    fn input(&self) -> PathBuf {
        self.dir.join("services.yaml")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("cni-proxier.log")
    }

    /// Replaces the input in one rename, as a CNI writing its state file would.
    fn write_input(&self, services: &[Svc]) {
        let tmp = self.dir.join("services.yaml.tmp");
        std::fs::write(&tmp, manifests(services)).unwrap();
        std::fs::rename(&tmp, self.input()).unwrap();
    }

    fn command(&self, extra: &str) -> String {
        format!(
            "{} --node {NODE} {extra} {}",
            example_bin().display(),
            self.input().display()
        )
    }

    /// One run without `--watch`; panics with its output when it fails. Returns stdout.
    fn run_once(&self) -> String {
        let started = Instant::now();
        let out: Output = self.ns.sh(&self.command(""));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{EXAMPLE} failed ({:?}): {stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        note(&format!(
            "one-shot run took {:?}: {}",
            started.elapsed(),
            stdout.trim()
        ));
        stdout
    }

    /// Starts `--watch` in the background, output to the log file.
    fn spawn_watch(&self, flags: &str) -> ShellProcess {
        let pid = self.ns.sh_ok(&format!(
            "{} >{} 2>&1 </dev/null & echo $!",
            self.command(&format!("--watch {flags}")),
            self.log().display()
        ));
        ShellProcess::new(pid.trim().parse().expect("pid"))
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    fn ipvs_lines(&self) -> BTreeSet<String> {
        self.ns
            .sh_ok("ipvsadm -Sn")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// IPv4 addresses on kube-ipvs0 (empty when the link is absent).
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
                    "ipvsadm -Sn:\n{:?}\nvips: {:?}\n{EXAMPLE} log:\n{}",
                    self.ipvs_lines(),
                    self.vips(),
                    self.log_text()
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

/// A node with two pod namespaces behind veths (a socat server answering its name on 8080)
/// and a client namespace behind a third veth.
struct Pods {
    /// First field: the servers are killed before their namespaces go.
    _servers: ipvs_proxier_tests::Background,
    node: Node,
    client: Netns,
    _pod_a: Netns,
    _pod_b: Netns,
}

const POD_A: &str = "10.244.1.2";
const POD_B: &str = "10.244.2.2";
const POD_PORT: u16 = 8080;

impl Pods {
    fn new() -> Pods {
        let node = Node::new();
        let pod_a = Netns::new();
        let pod_b = Netns::new();
        let client = Netns::new();
        node.ns.sh_ok(&format!(
            "ip link add vpa type veth peer name eth0 netns {a}
             ip addr add 10.244.1.1/24 dev vpa && ip link set vpa up
             ip link add vpb type veth peer name eth0 netns {b}
             ip addr add 10.244.2.1/24 dev vpb && ip link set vpb up
             ip link add vcl type veth peer name eth0 netns {c}
             ip addr add 10.10.0.1/24 dev vcl && ip link set vcl up",
            a = pod_a.name(),
            b = pod_b.name(),
            c = client.name(),
        ));
        pod_a.sh_ok(&format!(
            "ip addr add {POD_A}/24 dev eth0 && ip link set eth0 up && ip route add default via 10.244.1.1"
        ));
        pod_b.sh_ok(&format!(
            "ip addr add {POD_B}/24 dev eth0 && ip link set eth0 up && ip route add default via 10.244.2.1"
        ));
        client.sh_ok(
            "ip addr add 10.10.0.2/24 dev eth0 && ip link set eth0 up && ip route add default via 10.10.0.1",
        );
        let mut servers = ipvs_proxier_tests::Background::default();
        for (pod, answer) in [(&pod_a, "pod-a"), (&pod_b, "pod-b")] {
            servers.spawn(
                pod,
                &format!("socat TCP-LISTEN:{POD_PORT},fork,reuseaddr SYSTEM:'echo {answer}'"),
            );
            pod.wait_listening(POD_PORT);
        }
        // Each pod answers the node directly first, so a failure later is IPVS's.
        for (address, answer) in [(POD_A, "pod-a"), (POD_B, "pod-b")] {
            node.wait_for(Duration::from_secs(60), "pod answering directly", |n| {
                n.ns.sh(&format!(
                    "socat -T5 -u TCP:{address}:{POD_PORT},connect-timeout=5 STDOUT"
                ))
                .stdout
                .starts_with(answer.as_bytes())
            });
        }
        Pods {
            _servers: servers,
            node,
            client,
            _pod_a: pod_a,
            _pod_b: pod_b,
        }
    }

    /// One connection from the client to `vip:port`; the answer (empty on failure). The
    /// client resets on close (linger 0), so IPVS forgets the connection within seconds.
    fn ask(&self, vip: &str, port: u16) -> String {
        let out = self.client.sh(&format!(
            "socat -T5 -u TCP:{vip}:{port},connect-timeout=5,linger=0 STDOUT"
        ));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Answers of `count` connections (retrying failed ones for up to 60 s in all).
    fn answers(&self, vip: &str, port: u16, count: usize) -> Vec<String> {
        let started = Instant::now();
        let mut answers = Vec::new();
        while answers.len() < count {
            let answer = self.ask(vip, port);
            if !answer.is_empty() {
                answers.push(answer);
            } else if started.elapsed() > Duration::from_secs(60) {
                panic!(
                    "client -> {vip}:{port}: no answer within 60 s (got {answers:?})\nipvsadm:\n{}\n{}",
                    self.node.ns.sh_ok("ipvsadm -Ln; ipvsadm -Lnc"),
                    self.node.log_text()
                );
            } else {
                std::thread::sleep(Duration::from_millis(300));
            }
        }
        answers
    }
}

fn web(endpoints: &[(&'static str, &'static str)]) -> Svc {
    endpoints.iter().fold(
        Svc::tcp("default/web", "10.96.0.10", 80, POD_PORT),
        |s, (a, n)| s.endpoint(a, n),
    )
}

#[test]
fn watch_programs_the_kernel_carries_traffic_and_follows_edits() {
    require_kernel!();
    let pods = Pods::new();
    let node = &pods.node;
    let both = [web(&[(POD_A, NODE), (POD_B, "node-b")])];
    node.write_input(&both);
    let watcher = node.spawn_watch("--drain-timeout 5 --resync 5");

    // The first (full) sync: the table and the VIP on the dummy link.
    let took = node.wait_for(Duration::from_secs(60), "table of the first sync", |n| {
        n.ipvs_lines() == expected_lines(&both)
    });
    note(&format!("first sync visible after {took:?}"));
    assert_eq!(node.vips(), expected_vips(&both));
    let link = node.ns.sh_ok("ip -d link show kube-ipvs0");
    assert!(
        link.contains("dummy"),
        "kube-ipvs0 is not a dummy link: {link}"
    );

    // Round robin over both pods.
    let answers: BTreeSet<String> = pods.answers("10.96.0.10", 80, 4).into_iter().collect();
    assert_eq!(
        answers,
        BTreeSet::from(["pod-a".to_owned(), "pod-b".to_owned()]),
        "client -> VIP should reach both pods"
    );

    // Edit: pod-b goes away. Only default/web is re-planned and re-applied.
    let only_a = [web(&[(POD_A, NODE)])];
    node.write_input(&only_a);
    let pod_b_line = format!("-a -t 10.96.0.10:80 -r {POD_B}:{POD_PORT} -m -w 1");
    let took = node.wait_for(Duration::from_secs(30), "pod-b out of rotation", |n| {
        let lines = n.ipvs_lines();
        !lines.contains(&pod_b_line) && expected_lines(&only_a).is_subset(&lines)
    });
    note(&format!("edit applied after {took:?}"));
    // pod-b still holds the client's closed connections (TIME_WAIT in IPVS for two minutes):
    // it is drained at weight 0, not cut, until --drain-timeout (5 s) passes and a tick of the
    // watcher deletes it; on a slow VM that may already have happened by now.
    let drained = format!("-a -t 10.96.0.10:80 -r {POD_B}:{POD_PORT} -m -w 0");
    let lines = node.ipvs_lines();
    let log = node.log_text();
    assert!(
        lines.contains(&drained) || lines == expected_lines(&only_a),
        "{lines:?}"
    );
    note(&format!(
        "pod-b after the edit: {}",
        if lines.contains(&drained) {
            "draining at weight 0"
        } else {
            "already deleted"
        }
    ));
    assert!(
        log.contains("sync of default/web:p/TCP"),
        "no incremental sync of default/web in the log:\n{log}"
    );
    let answers = pods.answers("10.96.0.10", 80, 4);
    assert!(
        answers.iter().all(|a| a == "pod-a"),
        "after removing pod-b: {answers:?}"
    );
    // The watcher's ticks delete it once the drain timeout passes.
    let took = node.wait_for(Duration::from_secs(60), "drained pod-b deleted", |n| {
        n.ipvs_lines() == expected_lines(&only_a)
    });
    note(&format!("pod-b gone from the table {took:?} later"));

    // Edit: default/web replaced by default/api on another VIP and port.
    let api = [Svc::tcp("default/api", "10.96.0.20", 81, POD_PORT).endpoint(POD_B, "node-b")];
    node.write_input(&api);
    let took = node.wait_for(Duration::from_secs(30), "web replaced by api", |n| {
        n.ipvs_lines() == expected_lines(&api) && n.vips() == expected_vips(&api)
    });
    note(&format!("service swap applied after {took:?}"));
    let answers = pods.answers("10.96.0.20", 81, 2);
    assert!(answers.iter().all(|a| a == "pod-b"), "{answers:?}");

    // Drift: the virtual server and its VIP removed behind the watcher's back come back with
    // the next full resync (every 5 s here).
    node.ns
        .sh_ok("ipvsadm -D -t 10.96.0.20:81 && ip addr del 10.96.0.20/32 dev kube-ipvs0");
    let took = node.wait_for(Duration::from_secs(60), "drift repaired", |n| {
        n.ipvs_lines() == expected_lines(&api) && n.vips() == expected_vips(&api)
    });
    note(&format!("drift repaired after {took:?}"));
    assert!(
        node.log_text().contains("full resync"),
        "{}",
        node.log_text()
    );

    // A torn file (a writer cut off mid-line, without the api Service) and a malformed one
    // (a Service whose port is no number, the rest well-formed) are refused whole: the
    // kernel keeps the last good state, nothing the broken file no longer lists is removed.
    let good = manifests(&api);
    let torn = &good[..good.find("addressType").unwrap() + "address".len()];
    std::fs::write(node.input(), torn).unwrap();
    node.wait_for(Duration::from_secs(30), "torn file reported", |n| {
        n.log_text().contains("ends mid-line")
    });
    assert_eq!(node.ipvs_lines(), expected_lines(&api));
    let malformed =
        format!("{good}{}", web(&[(POD_A, NODE)]).yaml()).replace("port: 80\n", "port: eighty\n");
    std::fs::write(node.input(), malformed).unwrap();
    node.wait_for(Duration::from_secs(30), "malformed file reported", |n| {
        n.log_text().contains("refused whole")
    });
    assert_eq!(node.ipvs_lines(), expected_lines(&api));
    assert_eq!(node.vips(), expected_vips(&api));
    assert!(
        watcher.running(),
        "{EXAMPLE} --watch exited:\n{}",
        node.log_text()
    );
    // A good file after the broken ones is followed again.
    let both_services = [api[0].clone(), web(&[(POD_A, NODE)])];
    node.write_input(&both_services);
    node.wait_for(
        Duration::from_secs(30),
        "good file after broken ones",
        |n| n.ipvs_lines() == expected_lines(&both_services),
    );
    assert_eq!(pods.answers("10.96.0.10", 80, 1), ["pod-a"]);
}

#[test]
fn one_shot_runs_converge_rerun_writes_nothing_and_foreign_services_stay() {
    require_kernel!();
    let node = Node::new();
    // Masquerading real servers need a route to their addresses.
    node.ns.sh_ok(
        "ip link add pods type dummy && ip link set pods up && ip addr add 10.244.0.1/16 dev pods",
    );
    // Someone else's virtual server, on an address that is not on kube-ipvs0.
    let foreign = [
        "-A -t 10.200.0.1:80 -s wrr".to_owned(),
        "-a -t 10.200.0.1:80 -r 10.244.9.9:80 -m -w 1".to_owned(),
    ];
    node.ns.sh_ok(
        "ipvsadm -A -t 10.200.0.1:80 -s wrr && ipvsadm -a -t 10.200.0.1:80 -r 10.244.9.9:80 -m",
    );
    let with_foreign = |services: &[Svc]| -> BTreeSet<String> {
        let mut lines = expected_lines(services);
        lines.extend(foreign.iter().cloned());
        lines
    };

    let web_svc = web(&[("10.244.1.2", NODE), ("10.244.2.3", "node-b")]);
    let dns = Svc::tcp("kube-system/dns", "10.96.0.53", 53, 5353)
        .udp()
        .endpoint("10.244.1.5", NODE)
        .endpoint("10.244.2.6", "node-b");
    let cart = Svc {
        affinity: Some(600),
        local: true,
        ..Svc::tcp("shop/cart", "10.96.0.30", 443, 8443)
            .endpoint("10.244.1.7", NODE)
            .endpoint("10.244.2.8", "node-b")
    };
    let first = [web_svc.clone(), dns, cart.clone()];
    node.write_input(&first);
    let stdout = node.run_once();
    assert!(stdout.contains("full sync"), "{stdout}");
    assert_eq!(node.ipvs_lines(), with_foreign(&first));
    assert_eq!(node.vips(), expected_vips(&first));

    // The same input again: adopted as it is, nothing written.
    let stdout = node.run_once();
    assert!(
        stdout.contains(": 0 writes"),
        "an unchanged rerun wrote: {stdout}"
    );
    assert_eq!(node.ipvs_lines(), with_foreign(&first));

    // One endpoint fewer and dns gone.
    let mut smaller_web = web_svc;
    smaller_web.endpoints.pop();
    let second = [smaller_web, cart];
    node.write_input(&second);
    node.run_once();
    assert_eq!(node.ipvs_lines(), with_foreign(&second));
    assert_eq!(node.vips(), expected_vips(&second));

    // A file with a malformed object fails the run with a message naming the file and leaves
    // the kernel alone (the well-formed rest is not applied either).
    let malformed = manifests(&first).replace("timeoutSeconds: 600", "timeoutSeconds: [600]");
    std::fs::write(node.input(), malformed).unwrap();
    let out = node.ns.sh(&node.command(""));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&*node.input().to_string_lossy()),
        "{stderr}"
    );
    assert_eq!(node.ipvs_lines(), with_foreign(&second));
}
