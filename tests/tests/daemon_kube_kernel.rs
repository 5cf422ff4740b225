//! The `ipvs-proxier` daemon fed by the Kubernetes API server double (in the VM): the double
//! serves HTTP inside the node's network namespace, the daemon runs there with `--master`,
//! programs the real kernel, and real TCP traffic from a client namespace reaches pod
//! namespaces through a ClusterIP. Then, through the double: a second endpoint, a watch expiry
//! (410 Gone) after a change only a relist shows, an API outage that must leave the kernel
//! alone through a periodic full resync, a change after the outage, a deleted Service, and
//! drift made with `ipvsadm` behind the daemon's back that its next full resync repairs.
//!
//! The same daemon with `--kubeconfig` against a real API server (`mini-apiserver`:
//! k8s.io/apiserver on etcd, [`RealApiServer`]) in the node netns: a Service created over the
//! API carries traffic, an endpoint change and a Service delete reach the kernel.
//!
//! The oracles are `ipvsadm -Sn` and the pods' own answers. Expected `ipvsadm -Sn` lines are
//! written from the objects in the test (kube-proxy's semantics: round robin, masquerade,
//! weight 1), not from the daemon's output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipvs_proxier_tests::apiserver::{FakeApiServer, Kind};
use ipvs_proxier_tests::bench::api::ApiInNetns;
use ipvs_proxier_tests::realapi::RealApiServer;
use ipvs_proxier_tests::{Background, Netns, proxier_bin, require_kernel};
use serde_json::{Value, json};

/// How long the daemon gets to converge after a change (software emulation is slow).
const CONVERGE: Duration = Duration::from_secs(60);

/// Prints a line the VM log keeps.
fn note(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("daemon_kube_kernel: {line}\n").as_bytes());
}

fn service(name: &str, ip: &str, port: u16, target: u16) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                    "ports": [{"name": "http", "port": port, "protocol": "TCP",
                               "targetPort": target}]}})
}

fn slice(name: &str, svc: &str, target: u16, endpoints: &[&str]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-a"}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
           "metadata": {"name": name, "namespace": "default",
                        "labels": {"kubernetes.io/service-name": svc}},
           "endpoints": endpoints,
           "ports": [{"name": "http", "port": target, "protocol": "TCP"}]})
}

fn node_object(name: &str, internal_ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
           "status": {"addresses": [{"type": "InternalIP", "address": internal_ip},
                                    {"type": "Hostname", "address": name}]}})
}

/// The `ipvsadm -Sn` lines kube-proxy's IPVS mode makes for a TCP ClusterIP service port.
fn ipvs_lines(vip: &str, port: u16, target: u16, endpoints: &[&str]) -> Vec<String> {
    let mut lines = vec![format!("-A -t {vip}:{port} -s rr")];
    for ep in endpoints {
        lines.push(format!("-a -t {vip}:{port} -r {ep}:{target} -m -w 1"));
    }
    lines
}

/// The daemon started in the background in the node netns (by bash, so not our child); its log
/// goes to a file. SIGKILLed on drop if still running.
struct Daemon {
    pid: u32,
    log: PathBuf,
}

impl Daemon {
    fn start(node: &Netns, master: &str) -> Daemon {
        Daemon::start_with(node, master, "")
    }

    /// [`Daemon::start`] with more flags.
    fn start_with(node: &Netns, master: &str, flags: &str) -> Daemon {
        Daemon::start_flags(node, &format!("--master {master} {flags}"))
    }

    /// The daemon with these flags besides the node name, ports and sync period.
    fn start_flags(node: &Netns, flags: &str) -> Daemon {
        let log = std::env::temp_dir().join(format!("daemon-kube-{}.log", node.name()));
        let pid = node.sh_ok(&format!(
            "{bin} --hostname-override node-a \
             --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 \
             --ipvs-sync-period 5s -v 2 {flags} >{log} 2>&1 </dev/null & echo $!",
            bin = proxier_bin().display(),
            log = log.display()
        ));
        Daemon {
            pid: pid.trim().parse().expect("daemon pid"),
            log,
        }
    }

    fn running(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .is_ok_and(|stat| !stat.contains(") Z "))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Log lines saying a full resync is done (the runner and the data plane each log one).
    fn full_syncs(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("sync done") && l.contains("Full"))
            .count()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.running() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
        }
        if std::thread::panicking() {
            note(&format!("daemon log:\n{}", self.log()));
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A node namespace with two pods and a client host on veths, as a CNI would wire them.
struct Topology {
    /// First field, so the servers are killed before their namespaces go.
    _servers: Background,
    node: Netns,
    /// Held so the pod namespaces live as long as the test.
    _pods: [Netns; 2],
    client: Netns,
}

const POD_A: &str = "10.244.1.2";
const POD_B: &str = "10.244.2.2";
const NODE_IP: &str = "10.10.0.1";

impl Topology {
    fn new() -> Topology {
        // nft's `reject` modules are asked for by alias, which the VM's modprobe does not resolve.
        ipvs_proxier_tests::load_modules(&[
            "nf_reject_ipv4",
            "nf_reject_ipv6",
            "nft_reject_ipv4",
            "nft_reject_ipv6",
        ]);
        let node = Netns::new();
        let pod_a = Netns::new();
        let pod_b = Netns::new();
        let client = Netns::new();
        node.sh_ok(&format!(
            "echo 1 > /proc/sys/net/ipv4/ip_forward \
             && ip link add vpa type veth peer name eth0 netns {a} \
             && ip link add vpb type veth peer name eth0 netns {b} \
             && ip link add vcli type veth peer name eth0 netns {c} \
             && ip addr add 10.244.1.1/24 dev vpa && ip link set vpa up \
             && ip addr add 10.244.2.1/24 dev vpb && ip link set vpb up \
             && ip addr add {NODE_IP}/24 dev vcli && ip link set vcli up",
            a = pod_a.name(),
            b = pod_b.name(),
            c = client.name(),
        ));
        pod_a.sh_ok(&format!(
            "ip addr add {POD_A}/24 dev eth0 && ip link set eth0 up \
             && ip route add default via 10.244.1.1"
        ));
        pod_b.sh_ok(&format!(
            "ip addr add {POD_B}/24 dev eth0 && ip link set eth0 up \
             && ip route add default via 10.244.2.1"
        ));
        client.sh_ok(
            "ip addr add 10.10.0.2/24 dev eth0 && ip link set eth0 up \
             && ip route add default via 10.10.0.1",
        );
        let mut servers = Background::default();
        servers.spawn(
            &pod_a,
            "socat TCP-LISTEN:8080,fork,reuseaddr SYSTEM:'echo pod-a'",
        );
        servers.spawn(
            &pod_b,
            "socat TCP-LISTEN:8080,fork,reuseaddr SYSTEM:'echo pod-b'",
        );
        pod_a.wait_listening(8080);
        pod_b.wait_listening(8080);
        Topology {
            _servers: servers,
            node,
            _pods: [pod_a, pod_b],
            client,
        }
    }

    fn ipvsadm_save(&self) -> String {
        self.node.sh_ok("ipvsadm -Sn")
    }

    fn ipvs_set(&self) -> BTreeSet<String> {
        self.ipvsadm_save().lines().map(str::to_owned).collect()
    }

    /// One TCP request from the client; the answer, trimmed (empty on failure).
    fn request(&self, vip: &str, port: u16) -> String {
        let out = self.client.sh(&format!(
            "socat -T5 - TCP:{vip}:{port},connect-timeout=5 </dev/null"
        ));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Polls until `check` holds; panics after `limit` with the kernel's table and the log.
    fn wait_for(
        &self,
        daemon: &Daemon,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Topology) -> bool,
    ) -> Duration {
        let started = Instant::now();
        loop {
            if check(self) {
                let took = started.elapsed();
                note(&format!("{what}: after {took:?}"));
                return took;
            }
            assert!(
                daemon.running(),
                "{what}: the daemon exited\nlog:\n{}",
                daemon.log()
            );
            if started.elapsed() > limit {
                panic!(
                    "{what}: not reached within {limit:?}\nipvsadm -Sn:\n{}",
                    self.ipvsadm_save(),
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until the table holds all of `expected` (other lines allowed).
    fn wait_lines(&self, daemon: &Daemon, what: &str, expected: &[String]) {
        self.wait_for(daemon, what, CONVERGE, |t| {
            let have = t.ipvs_set();
            expected.iter().all(|l| have.contains(l))
        });
    }

    /// Waits until requests to `vip:port` have been answered by each of `answers`.
    fn wait_answers(&self, daemon: &Daemon, vip: &str, port: u16, answers: &[&str]) {
        let mut seen = BTreeSet::new();
        self.wait_for(
            daemon,
            &format!("{vip}:{port} answered by {answers:?}"),
            CONVERGE,
            |t| {
                let answer = t.request(vip, port);
                if !answer.is_empty() {
                    assert!(
                        answers.contains(&answer.as_str()),
                        "{vip}:{port} answered {answer:?}, expected one of {answers:?}"
                    );
                    seen.insert(answer);
                }
                answers.iter().all(|a| seen.contains(*a))
            },
        );
    }
}

/// Web's slice gets pod-b through a watch event: both real servers, both pods answer.
/// Returns web's lines.
fn add_pod_b_to_web(topo: &Topology, daemon: &Daemon, api: &FakeApiServer) -> Vec<String> {
    api.apply(
        Kind::EndpointSlice,
        slice("web-1", "web", 8080, &[POD_A, POD_B]),
    );
    let web_ab = ipvs_lines("10.96.0.50", 80, 8080, &[POD_A, POD_B]);
    topo.wait_lines(daemon, "web with pod-a and pod-b programmed", &web_ab);
    topo.wait_answers(daemon, "10.96.0.50", 80, &["pod-a", "pod-b"]);
    web_ab
}

/// Service api and its slice added without telling the watches, which then expire (410
/// Gone): only the relist the daemon must do can show it; programmed, pod-b answers.
/// Returns api's lines.
fn relist_shows_api(topo: &Topology, daemon: &Daemon, api: &FakeApiServer) -> Vec<String> {
    api.apply_silently(Kind::Service, service("api", "10.96.0.51", 80, 8080));
    api.apply_silently(Kind::EndpointSlice, slice("api-1", "api", 8080, &[POD_B]));
    api.expire_watches();
    let api_b = ipvs_lines("10.96.0.51", 80, 8080, &[POD_B]);
    topo.wait_lines(daemon, "api (seen only by the relist) programmed", &api_b);
    topo.wait_answers(daemon, "10.96.0.51", 80, &["pod-b"]);
    api_b
}

#[test]
fn daemon_driven_by_the_api_double_programs_the_kernel_and_traffic_flows() {
    require_kernel!();
    let started = Instant::now();
    let topo = Topology::new();
    let api_in_node =
        ApiInNetns::start(&topo.node).expect("the API double started in the node netns");
    let api = api_in_node.api();
    note(&format!("API double at {} in the node netns", api.url()));

    api.apply(Kind::Node, node_object("node-a", NODE_IP));
    api.apply(Kind::Service, service("web", "10.96.0.50", 80, 8080));
    api.apply(Kind::EndpointSlice, slice("web-1", "web", 8080, &[POD_A]));

    let daemon = Daemon::start(&topo.node, &api.url());

    // 1. One endpoint: the virtual server and its real server, and the pod answers.
    let web_a = ipvs_lines("10.96.0.50", 80, 8080, &[POD_A]);
    topo.wait_lines(&daemon, "web with pod-a programmed", &web_a);
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("/api/v1/services?")),
        "the daemon listed Services from the double: {:?}",
        api.requests()
    );
    topo.wait_answers(&daemon, "10.96.0.50", 80, &["pod-a"]);

    // 2. A second endpoint through a watch event: both real servers, both pods answer.
    let web_ab = add_pod_b_to_web(&topo, &daemon, api);

    // 3. A change the watches never report (compacted away), then the watches expire (410
    // Gone): only the relist the daemon must do can show it.
    let before_expiry = api.requests().len();
    let api_b = relist_shows_api(&topo, &daemon, api);
    let after_expiry = api.requests();
    assert!(
        after_expiry[before_expiry..]
            .iter()
            .any(|r| r.contains("sendInitialEvents=true") && r.starts_with("/api/v1/services?")),
        "after 410 Gone the daemon relists Services (a streaming list, the default): {:?}",
        &after_expiry[before_expiry..]
    );
    // In protobuf, the default content type (kube-proxy's): the first streaming list, its
    // watch's changes and the relist, each one protobuf watch.
    assert!(
        api.protobuf_watches(Kind::Service) >= 2 && api.protobuf_pages(Kind::Service) == 0,
        "Services streamed in protobuf: {:?}",
        api.requests()
    );
    // The relist forgot nothing: web is still fully programmed.
    let table = topo.ipvs_set();
    for line in &web_ab {
        assert!(table.contains(line), "{line} lost after relist: {table:?}");
    }

    // 4. An outage: the daemon keeps retrying, and the kernel table stays as it is.
    let before_outage = topo.ipvsadm_save();
    let requests_before = api.requests().len();
    api.set_outage(true);
    topo.wait_for(
        &daemon,
        "the daemon retried against the failing API",
        CONVERGE,
        |_| api.requests().len() >= requests_before + 3,
    );
    // At least five seconds, and at least one periodic full resync (which re-reads the kernel)
    // while the API is down.
    let full_syncs_before = daemon.full_syncs();
    let outage_started = Instant::now();
    while outage_started.elapsed() < Duration::from_secs(5)
        || daemon.full_syncs() <= full_syncs_before
    {
        let now = topo.ipvsadm_save();
        assert_eq!(
            now,
            before_outage,
            "the kernel table changed during the API outage\nlog:\n{}",
            daemon.log()
        );
        assert!(daemon.running(), "daemon exited during the outage");
        assert!(
            outage_started.elapsed() < CONVERGE,
            "no full resync logged during the outage within {CONVERGE:?}\nlog:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Traffic still flows during the outage.
    topo.wait_answers(&daemon, "10.96.0.50", 80, &["pod-a", "pod-b"]);
    assert_eq!(
        topo.ipvsadm_save(),
        before_outage,
        "table changed at the end of the outage"
    );
    note(&format!(
        "outage: {} requests failed, {} 'sync done' log lines of full resyncs, table unchanged",
        api.requests().len() - requests_before,
        daemon.full_syncs() - full_syncs_before
    ));

    // 5. The API is back: a change converges.
    api.set_outage(false);
    api.apply(Kind::Service, service("extra", "10.96.0.52", 80, 8080));
    api.apply(
        Kind::EndpointSlice,
        slice("extra-1", "extra", 8080, &[POD_A]),
    );
    let extra_a = ipvs_lines("10.96.0.52", 80, 8080, &[POD_A]);
    topo.wait_lines(&daemon, "extra (after the outage) programmed", &extra_a);
    topo.wait_answers(&daemon, "10.96.0.52", 80, &["pod-a"]);

    // 6. The Service is deleted: its virtual server goes, the others stay.
    api.delete(Kind::Service, "default", "web");
    topo.wait_for(&daemon, "web's virtual server removed", CONVERGE, |t| {
        !t.ipvsadm_save().contains("10.96.0.50:80")
    });
    let table = topo.ipvs_set();
    for line in api_b.iter().chain(&extra_a) {
        assert!(
            table.contains(line),
            "{line} lost when web was deleted: {table:?}"
        );
    }

    // 7. Drift behind the daemon's back, which only a periodic full resync (repaired in
    // slices after the first) sees: a virtual server deleted, a real server's weight
    // changed, a stray virtual server on an address of kube-ipvs0 (the daemon's), and a
    // foreign one elsewhere (not the daemon's).
    topo.node.sh_ok(
        "ipvsadm -D -t 10.96.0.51:80 \
         && ipvsadm -e -t 10.96.0.52:80 -r 10.244.1.2:8080 -m -w 5 \
         && ipvsadm -A -t 10.96.0.52:81 -s rr \
         && ipvsadm -A -t 192.0.2.10:80 -s rr",
    );
    let full_syncs_before = daemon.full_syncs();
    topo.wait_for(
        &daemon,
        "the drift repaired by a full resync",
        CONVERGE,
        |t| {
            let table = t.ipvs_set();
            api_b
                .iter()
                .chain(&extra_a)
                .all(|line| table.contains(line))
                && !t.ipvsadm_save().contains("10.96.0.52:81")
        },
    );
    assert!(
        daemon.full_syncs() > full_syncs_before,
        "repaired without a full resync?\nlog:\n{}",
        daemon.log()
    );
    assert!(
        topo.ipvsadm_save().contains("-A -t 192.0.2.10:80 -s rr"),
        "the foreign virtual server stays:\n{}",
        topo.ipvsadm_save()
    );
    topo.wait_answers(&daemon, "10.96.0.51", 80, &["pod-b"]);

    assert!(daemon.running(), "daemon still running at the end");
    note(&format!("whole scenario took {:?}", started.elapsed()));
}

/// Paginated protobuf lists (`--api-streaming-lists=false`; a server that refuses streaming
/// lists gets the same), watched in JSON.
#[test]
fn daemon_on_protobuf_lists_programs_the_kernel_and_relists_in_protobuf() {
    require_kernel!();
    let topo = Topology::new();
    let api_in_node =
        ApiInNetns::start(&topo.node).expect("the API double started in the node netns");
    let api = api_in_node.api();
    api.apply(Kind::Node, node_object("node-a", NODE_IP));
    api.apply(Kind::Service, service("web", "10.96.0.50", 80, 8080));
    api.apply(Kind::EndpointSlice, slice("web-1", "web", 8080, &[POD_A]));

    let daemon = Daemon::start_with(
        &topo.node,
        &api.url(),
        "--kube-api-content-type=application/vnd.kubernetes.protobuf --api-streaming-lists=false",
    );

    // Listed in protobuf: programmed, and the pod answers.
    let web_a = ipvs_lines("10.96.0.50", 80, 8080, &[POD_A]);
    topo.wait_lines(&daemon, "web with pod-a programmed", &web_a);
    topo.wait_answers(&daemon, "10.96.0.50", 80, &["pod-a"]);
    assert_eq!(api.protobuf_pages(Kind::Service), 1, "{:?}", api.requests());
    assert_eq!(api.protobuf_pages(Kind::EndpointSlice), 1);

    // A change through the (JSON) watch.
    let web_ab = add_pod_b_to_web(&topo, &daemon, api);

    // What only a relist shows, then 410 Gone: the relist is a protobuf list again.
    relist_shows_api(&topo, &daemon, api);
    assert_eq!(api.protobuf_pages(Kind::Service), 2, "{:?}", api.requests());
    let table = topo.ipvs_set();
    for line in &web_ab {
        assert!(table.contains(line), "{line} lost after relist: {table:?}");
    }
    assert!(daemon.running(), "daemon still running at the end");
}

#[test]
fn a_kubeconfig_that_cannot_be_read_is_refused_with_the_node_untouched() {
    // The daemon opens the kernel and begins reading it before it builds its API client
    // (a restart's longest read then runs meanwhile); it writes nothing before the source
    // has started. A kubeconfig that cannot be read stops it with the node as it was: the
    // IPVS sysctls it would set (per network namespace), no link, no table, no rule.
    require_kernel!();
    let node = Netns::new();
    let sysctls = "sysctl -n net.ipv4.vs.conntrack net.ipv4.vs.expire_nodest_conn";
    let before = node.sh_ok(sysctls);
    let out = node.sh(&format!(
        "{bin} --kubeconfig /nonexistent/kubeconfig --hostname-override node-a \
         --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256",
        bin = proxier_bin().display()
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the daemon went on: {stderr}");
    assert!(stderr.contains("/nonexistent/kubeconfig"), "{stderr}");
    assert_eq!(node.sh_ok(sysctls), before, "sysctls set: {stderr}");
    assert!(
        !node.sh("ip link show kube-ipvs0").status.success(),
        "the dummy link was made"
    );
    assert_eq!(node.sh_ok("ipvsadm -Sn").trim(), "");
    assert!(!node.sh_ok("nft list tables").contains("ipvs-proxier"));
}

/// The API paths of the objects the real-server test writes.
const NODES: &str = "/api/v1/nodes";
const SERVICES: &str = "/api/v1/namespaces/default/services";
const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";

#[test]
fn daemon_against_a_real_api_server_programs_the_kernel_and_traffic_flows() {
    // The daemon as a node runs it: `--kubeconfig` (TLS, a bearer token) against
    // k8s.io/apiserver on etcd, with its defaults (protobuf, streaming lists).
    require_kernel!();
    let topo = Topology::new();
    let Some(api) = RealApiServer::start_in_netns(topo.node.name(), &[]) else {
        return;
    };
    note(&format!(
        "real API server at {} in the node netns",
        api.url()
    ));
    api.create(NODES, &node_object("node-a", NODE_IP));
    api.create(SERVICES, &service("web", "10.96.0.50", 80, 8080));
    api.create(SLICES, &slice("web-1", "web", 8080, &[POD_A]));

    let daemon = Daemon::start_flags(
        &topo.node,
        &format!("--kubeconfig {}", api.kubeconfig().display()),
    );

    // 1. The Service created over the API: programmed, and the pod answers.
    let web_a = ipvs_lines("10.96.0.50", 80, 8080, &[POD_A]);
    topo.wait_lines(&daemon, "web with pod-a programmed", &web_a);
    topo.wait_answers(&daemon, "10.96.0.50", 80, &["pod-a"]);

    // 2. An endpoint added (a merge patch of the slice): both pods answer.
    let slice_path = format!("{SLICES}/web-1");
    let ready =
        |ip: &str| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-a"});
    api.merge_patch(
        &slice_path,
        &json!({"endpoints": [ready(POD_A), ready(POD_B)]}),
    );
    let web_ab = ipvs_lines("10.96.0.50", 80, 8080, &[POD_A, POD_B]);
    topo.wait_lines(&daemon, "web with pod-a and pod-b programmed", &web_ab);
    topo.wait_answers(&daemon, "10.96.0.50", 80, &["pod-a", "pod-b"]);

    // 3. An endpoint removed: its real server goes.
    api.merge_patch(&slice_path, &json!({"endpoints": [ready(POD_B)]}));
    let web_b = ipvs_lines("10.96.0.50", 80, 8080, &[POD_B]);
    topo.wait_for(&daemon, "pod-a's real server removed", CONVERGE, |t| {
        let table = t.ipvs_set();
        web_b.iter().all(|line| table.contains(line)) && !table.contains(&web_a[1])
    });

    // 4. The Service deleted: its virtual server goes.
    api.delete(&format!("{SERVICES}/web"));
    topo.wait_for(&daemon, "web's virtual server removed", CONVERGE, |t| {
        !t.ipvsadm_save().contains("10.96.0.50:80")
    });

    // The server saw the daemon, by its User-Agent, list and watch Services.
    let requests = api.requests();
    let daemon_requests: Vec<_> = requests
        .iter()
        .filter(|r| r.user_agent.starts_with("ipvs-proxier/") && r.path() == "/api/v1/services")
        .collect();
    assert!(
        daemon_requests.iter().any(|r| r.verb == "watch"),
        "the daemon's requests for Services: {requests:?}"
    );
    assert!(daemon.running(), "daemon still running at the end");
}
