//! A small node inside the VM, built from network namespaces, for the netfilter suites.
//!
//! ```text
//!   client netns                node netns                         pod netns
//!   eth0 192.168.50.2/24 --veth-- vc 192.168.50.1/24
//!   (+ 192.168.50.3)            kube-ipvs0 (dummy): the VIPs
//!                               cbr0 10.244.0.1/24 (bridge) --veth-- eth0 10.244.0.1x/24
//!                               hairpin on every bridge port         default via 10.244.0.1
//! ```
//!
//! Only addresses of these namespaces are ever used. IPVS is programmed with `ipvsadm` in
//! the node; the netfilter table is planned, rendered and applied by proxier-core's own code
//! from a model of the Services; sysctls are set by proxier-core's `sysctl` module.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::IpAddr;
use std::sync::Arc;

use ipvs_proxier_tests::Netns;
use proxier_core::desired::Protocol;
use proxier_core::model::{
    Config, Endpoint, EndpointPort, EndpointSlice, NodeContext, Service, ServiceName,
    ServicePortSpec, SliceKey,
};
use proxier_core::netfilter::{self, Netfilter, NetfilterPlan, NftBackend, RenderOptions};
use proxier_core::state::{Change, ClusterState};
use proxier_core::sysctl::{ProcSysctl, SysctlOptions, ensure_sysctls};

pub const NODE_NAME: &str = "node";
pub const NODE_IP: &str = "192.168.50.1";
pub const CLIENT_IP: &str = "192.168.50.2";
pub const OTHER_CLIENT_IP: &str = "192.168.50.3";
pub const BRIDGE_IP: &str = "10.244.0.1";

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Loads the kernel modules nft needs for `reject` in the `ip` and `ip6` families (nf_tables
/// asks for them by alias, which the VM's busybox modprobe does not resolve).
pub fn load_nft_modules() {
    ipvs_proxier_tests::load_modules(&[
        "nf_reject_ipv4",
        "nf_reject_ipv6",
        "nft_reject_ipv4",
        "nft_reject_ipv6",
    ]);
}

pub use ipvs_proxier_tests::Background;

/// Tests of one binary build their topologies one at a time: under software emulation,
/// parallel topologies slow every hop down to the point of spurious timeouts.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The node, its client and its pods.
pub struct Topology {
    pub node: Netns,
    pub client: Netns,
    pub pods: Vec<Netns>,
    pub background: Background,
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// A TCP server in a pod that answers every connection with the address it came from.
pub fn peer_echo_server(port: u16) -> String {
    format!("socat TCP-LISTEN:{port},fork,reuseaddr SYSTEM:'echo $SOCAT_PEERADDR'")
}

impl Topology {
    /// Builds the node with `pods` pods (10.244.0.10, .11, ...) and the client.
    pub fn new(pods: usize) -> Topology {
        load_nft_modules();
        let serial = SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let node = Netns::new();
        let client = Netns::new();
        node.sh_ok(&format!(
            "set -e
             ip link add kube-ipvs0 type dummy && ip link set kube-ipvs0 up
             ip link add cbr0 type bridge && ip addr add {BRIDGE_IP}/24 dev cbr0 && ip link set cbr0 up
             ip link add vc type veth peer name eth0 netns {client}
             ip addr add {NODE_IP}/24 dev vc && ip link set vc up
             sysctl -qw net.bridge.bridge-nf-call-iptables=1 || true",
            client = client.name()
        ));
        client.sh_ok(&format!(
            "set -e
             ip addr add {CLIENT_IP}/24 dev eth0 && ip addr add {OTHER_CLIENT_IP}/24 dev eth0
             ip link set eth0 up && ip route add default via {NODE_IP}"
        ));
        let mut topology = Topology {
            node,
            client,
            pods: Vec::new(),
            background: Background::default(),
            _serial: serial,
        };
        for _ in 0..pods {
            topology.add_pod();
        }
        topology.set_sysctls();
        topology
    }

    /// The address of pod `i`.
    pub fn pod_ip(i: usize) -> String {
        format!("10.244.0.{}", 10 + i)
    }

    /// Adds a pod on the bridge (hairpin on, as CNIs set it).
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
             ip addr add {}/24 dev eth0 && ip link set eth0 up
             ip route add default via {BRIDGE_IP}",
            Self::pod_ip(i)
        ));
        self.pods.push(pod);
        i
    }

    /// Sets the proxier's sysctls in the node through proxier-core and checks them.
    fn set_sysctls(&self) {
        let report = self.node.block_on(|| async {
            ensure_sysctls(&ProcSysctl::default(), SysctlOptions::default())
        });
        assert!(
            report.failures.is_empty(),
            "sysctls failed in the node: {:?}",
            report.failures
        );
        let seen = self.node.sh_ok(
            "sysctl -n net.ipv4.ip_forward net.ipv4.vs.conntrack net.ipv4.vs.expire_nodest_conn",
        );
        assert_eq!(
            seen.split_whitespace().collect::<Vec<_>>(),
            ["1", "1", "1"],
            "{seen}"
        );
    }

    /// Starts the peer-echo server on `port` in pod `i`.
    pub fn serve_peer_echo(&mut self, i: usize, port: u16) {
        let pod = &self.pods[i];
        self.background.spawn(pod, &peer_echo_server(port));
        wait_listening(pod, port);
    }

    /// Binds `vip` on the dummy link.
    pub fn bind_vip(&self, vip: &str) {
        self.node
            .sh_ok(&format!("ip addr add {vip}/32 dev kube-ipvs0"));
    }

    /// `ipvsadm` in the node.
    pub fn ipvsadm(&self, args: &str) {
        self.node.sh_ok(&format!("ipvsadm {args}"));
    }

    /// A TCP virtual server `vip:port` to the given pods' `target` port (masquerade).
    pub fn tcp_service(&self, vip: &str, port: u16, pods: &[usize], target: u16) {
        self.ipvsadm(&format!("-A -t {vip}:{port} -s rr"));
        for i in pods {
            self.ipvsadm(&format!(
                "-a -t {vip}:{port} -r {}:{target} -m",
                Self::pod_ip(*i)
            ));
        }
    }

    /// Plans, renders and applies the netfilter table of `state` in the node through
    /// proxier-core, exactly as the daemon does.
    pub fn apply_netfilter(&self, state: &ClusterState, config: &Config) -> NetfilterPlan {
        let plan = netfilter::plan(state, &self.node_context(), config);
        let applied = plan.clone();
        self.node.block_on(|| async move {
            let mut nf = Netfilter::new(NftBackend::default(), RenderOptions::default()).unwrap();
            nf.sync(&applied).await.unwrap();
        });
        plan
    }

    pub fn node_context(&self) -> NodeContext {
        NodeContext::new(
            NODE_NAME,
            vec![ip(NODE_IP)],
            vec![ip(NODE_IP), ip(BRIDGE_IP)],
        )
    }

    /// A TCP request from the client (source `source`) to `target:port`: the answer, or
    /// `None` when the connection failed or timed out.
    pub fn client_request(&self, source: &str, target: &str, port: u16) -> Option<String> {
        request(
            &self.client,
            &format!("TCP:{target}:{port},bind={source},connect-timeout=3"),
        )
    }

    /// [`Topology::client_request`], retried: for requests that must get through.
    pub fn client_request_ok(&self, source: &str, target: &str, port: u16) -> Option<String> {
        request_retrying(
            &self.client,
            &format!("TCP:{target}:{port},bind={source},connect-timeout=3"),
        )
    }
}

/// One socat request from `netns` to the socat `address`; `None` on failure or no answer.
pub fn request(netns: &Netns, address: &str) -> Option<String> {
    let out = netns.sh(&format!("echo q | socat -T5 - {address}"));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// [`request`] up to three times, until it answers: for checks that expect an answer
/// (the first packets of a fresh topology also wait for ARP, slow under emulation).
pub fn request_retrying(netns: &Netns, address: &str) -> Option<String> {
    for _ in 0..3 {
        if let Some(answer) = request(netns, address) {
            return Some(answer);
        }
    }
    None
}

/// Like [`request`], with the exit status and stderr, for asserting on how it failed.
pub fn request_verbose(netns: &Netns, address: &str) -> (bool, String, String) {
    let out = netns.sh(&format!("echo q | socat -T5 - {address}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

/// Waits until something listens on TCP/UDP `port` in `netns`.
pub fn wait_listening(netns: &Netns, port: u16) {
    netns.wait_listening(port);
}

/// A Service with one port (`name` / `port` / `protocol`, NodePort optional).
pub fn service(
    name: &str,
    cluster_ip: &str,
    port: u16,
    protocol: Protocol,
    node_port: Option<u16>,
) -> Service {
    Service::new(
        ServiceName::new("default", name),
        vec![ip(cluster_ip)],
        vec![ServicePortSpec {
            name: "p".into(),
            port,
            protocol,
            node_port,
        }],
    )
}

/// The EndpointSlice of Service `name`: pods `pods` on this node, port `target`.
pub fn slice(name: &str, pods: &[usize], target: u16, protocol: Protocol) -> EndpointSlice {
    EndpointSlice {
        key: SliceKey::new("default", format!("{name}-1")),
        service: ServiceName::new("default", name),
        ports: vec![EndpointPort {
            name: "p".into(),
            port: target,
            protocol,
        }],
        endpoints: pods
            .iter()
            .map(|i| {
                let mut ep = Endpoint::ready(ip(&Topology::pod_ip(*i)));
                ep.node_name = Some(Arc::from(NODE_NAME));
                ep
            })
            .collect(),
        warnings: Vec::new(),
        trigger_time: None,
    }
}

/// A state holding these Services and slices.
pub fn state(services: Vec<Service>, slices: Vec<EndpointSlice>) -> ClusterState {
    let mut state = ClusterState::new();
    for s in services {
        state.apply(Change::UpsertService(s));
    }
    for s in slices {
        state.apply(Change::UpsertSlice(s));
    }
    state
}

/// The pod network as the cluster CIDR: traffic from elsewhere to ClusterIPs is masqueraded.
pub fn config() -> Config {
    Config {
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Config::default()
    }
}

/// The address part of socat's `SOCAT_PEERADDR` answer.
pub fn peer(answer: &Option<String>) -> Option<&str> {
    answer.as_deref().map(str::trim)
}
