//! `--bind-service-cidrs=auto` on a real kernel: the `ipvs-proxier` daemon, fed by the API
//! server double inside the node's network namespace, follows ServiceCIDR objects at run time.
//! A ServiceCIDR added → a `local` route for its range through `kube-ipvs0` and the ClusterIP
//! in it no longer bound as an address, while TCP from a client namespace still reaches the
//! pod; an address of the range that no Service has is refused. Unsafe ranges (one holding the
//! node's address, one over `--cluster-cidr`) → no route, the reason in the log and the
//! refused gauge. The ServiceCIDR being deleted keeps its route; deleted → the route goes and
//! the ClusterIP is bound again, traffic still flowing. Full resyncs are 5 minutes apart, so
//! all of it happens through incremental syncs: when the ClusterIP was `kube-ipvs0`'s last
//! IPv4 address, its unbinding makes the kernel drop every route through the link, and the
//! route must be put back at once (before, it came back with the next full resync).
//!
//! Oracles: `ip route show table local dev kube-ipvs0`, `ip -4 addr show dev kube-ipvs0`, the
//! pod's own answer through `socat`, the daemon's log and its metrics page.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipvs_proxier_tests::apiserver::Kind;
use ipvs_proxier_tests::bench::api::ApiInNetns;
use ipvs_proxier_tests::{Background, Netns, proxier_bin, require_kernel};
use serde_json::{Value, json};

/// How long the daemon gets to converge after a change (software emulation is slow).
const CONVERGE: Duration = Duration::from_secs(60);

const POD: &str = "10.244.1.2";
const NODE_IP: &str = "10.10.0.1";
const VIP: &str = "10.96.0.50";
const SERVICE_RANGE: &str = "10.96.0.0/16";

fn note(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("daemon_service_cidrs: {line}\n").as_bytes());
}

fn service_cidr(name: &str, cidr: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
           "metadata": {"name": name, "finalizers": ["networking.k8s.io/service-cidr-finalizer"]},
           "spec": {"cidrs": [cidr]}})
}

/// The daemon in the node namespace (started by bash, so not our child), its log in a file;
/// SIGKILLed on drop if still running.
struct Daemon {
    pid: u32,
    log: PathBuf,
}

impl Daemon {
    /// Starts the daemon with its periodic full resync out of the way (5 minutes): every
    /// change here must reach the kernel through the incremental path.
    fn start(node: &Netns, master: &str) -> Daemon {
        let log = std::env::temp_dir().join(format!("daemon-cidrs-{}.log", node.name()));
        let pid = node.sh_ok(&format!(
            "{bin} --master {master} --hostname-override node-a \
             --bind-service-cidrs=auto --ipvs-strict-arp --cluster-cidr 10.244.0.0/16 \
             --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 \
             --ipvs-sync-period 5m -v 2 >{log} 2>&1 </dev/null & echo $!",
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

/// A node namespace with one pod and one client host on veths.
struct Topology {
    /// First field, so the server is killed before its namespace goes.
    _server: Background,
    node: Netns,
    _pod: Netns,
    client: Netns,
}

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
        let pod = Netns::new();
        let client = Netns::new();
        node.sh_ok(&format!(
            "echo 1 > /proc/sys/net/ipv4/ip_forward \
             && ip link add vpa type veth peer name eth0 netns {p} \
             && ip link add vcli type veth peer name eth0 netns {c} \
             && ip addr add 10.244.1.1/24 dev vpa && ip link set vpa up \
             && ip addr add {NODE_IP}/24 dev vcli && ip link set vcli up",
            p = pod.name(),
            c = client.name(),
        ));
        pod.sh_ok(&format!(
            "ip addr add {POD}/24 dev eth0 && ip link set eth0 up \
             && ip route add default via 10.244.1.1"
        ));
        client.sh_ok(
            "ip addr add 10.10.0.2/24 dev eth0 && ip link set eth0 up \
             && ip route add default via 10.10.0.1",
        );
        let mut server = Background::default();
        server.spawn(
            &pod,
            "socat TCP-LISTEN:8080,fork,reuseaddr SYSTEM:'echo pod-a'",
        );
        pod.wait_listening(8080);
        Topology {
            _server: server,
            node,
            _pod: pod,
            client,
        }
    }

    /// The `local` routes through the dummy link (empty while it does not exist).
    fn local_routes(&self) -> String {
        let out = self
            .node
            .sh("ip route show table local dev kube-ipvs0 2>/dev/null");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether `address` is bound on the dummy link.
    fn bound(&self, address: &str) -> bool {
        let out = self
            .node
            .sh("ip -4 -o addr show dev kube-ipvs0 2>/dev/null");
        String::from_utf8_lossy(&out.stdout).contains(&format!(" {address}/"))
    }

    /// One TCP request from the client: the answer, trimmed (empty on failure).
    fn request(&self, vip: &str, port: u16) -> String {
        let out = self.client.sh(&format!(
            "socat -T5 - TCP:{vip}:{port},connect-timeout=5 </dev/null"
        ));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The daemon's metrics page.
    fn metrics(&self) -> String {
        let out = self
            .node
            .sh("printf 'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' \
             | socat -T5 - TCP:127.0.0.1:10249");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls until `check` holds; panics after [`CONVERGE`] with the link's state.
    fn wait_for(&self, daemon: &Daemon, what: &str, mut check: impl FnMut(&Topology) -> bool) {
        let started = Instant::now();
        loop {
            if check(self) {
                note(&format!("{what}: after {:?}", started.elapsed()));
                return;
            }
            assert!(daemon.running(), "{what}: the daemon exited");
            if started.elapsed() > CONVERGE {
                panic!(
                    "{what}: not reached within {CONVERGE:?}\nlocal routes:\n{}\naddresses:\n{}",
                    self.local_routes(),
                    String::from_utf8_lossy(&self.node.sh("ip addr show dev kube-ipvs0").stdout),
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn wait_answer(&self, daemon: &Daemon, vip: &str) {
        self.wait_for(daemon, &format!("{vip}:80 answered by pod-a"), |t| {
            t.request(vip, 80) == "pod-a"
        });
    }
}

#[test]
fn service_cidr_objects_are_routed_through_the_dummy_link_at_run_time_and_unsafe_ones_refused() {
    require_kernel!();
    let topo = Topology::new();
    let api_in_node = ApiInNetns::start(&topo.node).expect("the API double in the node netns");
    let api = api_in_node.api();
    api.apply(
        Kind::Node,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
               "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}}),
    );
    api.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "default"},
               "spec": {"clusterIP": VIP, "clusterIPs": [VIP], "type": "ClusterIP",
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                                   "targetPort": 8080}]}}),
    );
    api.apply(
        Kind::EndpointSlice,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "addressType": "IPv4",
               "metadata": {"name": "web-1", "namespace": "default",
                            "labels": {"kubernetes.io/service-name": "web"}},
               "endpoints": [{"addresses": [POD], "conditions": {"ready": true},
                              "nodeName": "node-a"}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    );
    let daemon = Daemon::start(&topo.node, &api.url());

    // 1. No ServiceCIDR yet: the ClusterIP is bound as an address, no route.
    topo.wait_for(&daemon, "the ClusterIP bound", |t| t.bound(VIP));
    topo.wait_answer(&daemon, VIP);
    assert!(
        !topo.local_routes().contains(SERVICE_RANGE),
        "{}",
        topo.local_routes()
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("/apis/networking.k8s.io/v1/servicecidrs?")),
        "the daemon lists ServiceCIDRs: {:?}",
        api.requests()
    );

    // 2. A ServiceCIDR at run time: its route, the ClusterIP no longer bound, traffic flows;
    // an address of the range no Service has is refused at once.
    api.apply(Kind::ServiceCidr, service_cidr("kubernetes", SERVICE_RANGE));
    topo.wait_for(&daemon, "the range routed and the ClusterIP unbound", |t| {
        t.local_routes()
            .contains(&format!("local {SERVICE_RANGE} "))
            && !t.bound(VIP)
    });
    topo.wait_answer(&daemon, VIP);
    let stray = topo
        .client
        .sh("socat -T5 - TCP:10.96.0.99:80,connect-timeout=5 </dev/null");
    assert!(
        !stray.status.success(),
        "10.96.0.99 has no Service: {}",
        String::from_utf8_lossy(&stray.stdout)
    );

    // 3. Unsafe ranges: refused with the reason, no route, the gauge counts them.
    api.apply(
        Kind::ServiceCidr,
        service_cidr("on-the-node", "10.10.0.0/24"),
    );
    api.apply(
        Kind::ServiceCidr,
        service_cidr("on-the-pods", "10.244.0.0/20"),
    );
    topo.wait_for(&daemon, "both unsafe ranges refused in the log", |_| {
        let log = daemon.log();
        let refused = |name: &str, cidr: &str, reason: &str| {
            log.lines().any(|l| {
                l.contains("Service CIDR not routed")
                    && l.contains(&format!("ServiceCIDR {name}"))
                    && l.contains(cidr)
                    && l.contains(reason)
            })
        };
        refused(
            "on-the-node",
            "10.10.0.0/24",
            &format!("holds the node's address {NODE_IP}"),
        ) && refused(
            "on-the-pods",
            "10.244.0.0/20",
            "overlaps the cluster CIDR 10.244.0.0/16",
        )
    });
    topo.wait_for(&daemon, "the refused gauge at 2", |t| {
        t.metrics().contains("ipvs_proxier_service_cidrs_refused 2")
    });
    let routes = topo.local_routes();
    assert!(
        !routes.contains("10.10.0.0/24") && !routes.contains("10.244.0.0/20"),
        "{routes}"
    );
    topo.wait_answer(&daemon, VIP);

    // 4. Being deleted (its finalizer holds it while Services have addresses in it): the
    // route stays.
    let mut deleting = service_cidr("kubernetes", SERVICE_RANGE);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-01T10:00:00Z");
    api.apply(Kind::ServiceCidr, deleting);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        topo.local_routes().contains(SERVICE_RANGE) && !topo.bound(VIP),
        "a ServiceCIDR being deleted keeps its route: {}",
        topo.local_routes()
    );

    // 5. Gone: the route goes, the ClusterIP is bound again, traffic still flows.
    api.delete(Kind::ServiceCidr, "", "kubernetes");
    topo.wait_for(
        &daemon,
        "the route gone and the ClusterIP bound again",
        |t| !t.local_routes().contains(SERVICE_RANGE) && t.bound(VIP),
    );
    topo.wait_answer(&daemon, VIP);
    assert!(daemon.running(), "the daemon still runs");
}
