//! Taking a node over from kube-proxy's IPVS mode, as it happens on a real node: kube-proxy
//! has just been stopped and left its IPVS table, `kube-ipvs0` and its iptables chains and
//! ipsets (built from its source by `takeover_support/kube_proxy_ipvs.sh`, with Debian's
//! `iptables` and `ipset`, in the legacy or the nft flavour), next to the kubelet's chains, a
//! foreign chain and set, and a keepalived-style virtual server. Clients keep opening
//! connections to a ClusterIP and a NodePort, and one TCP connection stays open, while
//! `ipvs-proxier --take-over-kube-proxy` starts.
//!
//! Asserted: no connection attempt fails, the long connection completes, the first sync
//! makes zero IPVS and address writes and leaves `ipvsadm -Sn` as kube-proxy left it, none
//! of kube-proxy's chains or sets remain, and the kubelet's chains, the foreign chain and set
//! and the keepalived virtual server are untouched.

#![allow(clippy::unwrap_used)]

mod e2e_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use e2e_support::manifests::{Ep, Port, Slice, Svc};
use e2e_support::{BRIDGE_IP, NODE_IP, NODE_NAME, Topology, pod_ip, pod_name};
use ipvs_proxier_tests::require_kernel;

const FOOTPRINT: &str = include_str!("takeover_support/kube_proxy_ipvs.sh");

const WEB_VIP: &str = "10.96.0.10";
const NODEPORT_VIP: &str = "10.96.0.20";
const NODE_PORT: u16 = 30080;
const SLOW_VIP: &str = "10.96.0.30";
/// How long the long-lived connection stays open: across the daemon's start and takeover.
const HOLD_SECS: u32 = 25;
/// The keepalived-style virtual server: on an address that is not on `kube-ipvs0`.
const KEEPALIVED_VS: &str = "192.168.60.1:8443";

fn services() -> (Vec<Svc>, Vec<Slice>) {
    let web = Svc::cluster_ip("web", &[WEB_VIP], vec![Port::tcp("http", 80, 8080)]);
    let np = Svc {
        kind: "NodePort",
        ..Svc::cluster_ip(
            "web-np",
            &[NODEPORT_VIP],
            vec![Port::tcp("http", 80, 8080).node_port(NODE_PORT)],
        )
    };
    let slow = Svc::cluster_ip("slow", &[SLOW_VIP], vec![Port::tcp("hold", 80, 9090)]);
    let both = || {
        vec![
            Ep::ready(&pod_ip(0), NODE_NAME),
            Ep::ready(&pod_ip(1), NODE_NAME),
        ]
    };
    let slices = vec![
        Slice::of(&web, false, both()),
        Slice::of(&np, false, both()),
        Slice::of(&slow, false, vec![Ep::ready(&pod_ip(0), NODE_NAME)]),
    ];
    (vec![web, np, slow], slices)
}

/// kube-proxy's IPVS state for [`services`], as its syncProxyRules leaves it: the dummy link
/// (down) with the ClusterIPs as /32, one virtual server per ClusterIP:port and per node
/// address:NodePort (every non-loopback IPv4 address outside `kube-ipvs0`), `rr`,
/// masquerading real servers of weight 1; and its sysctls.
fn kube_proxy_ipvs() -> String {
    // One `ipvsadm -R` and one `ip -batch` instead of a call per object: the same kernel state.
    let mut rules = String::new();
    let mut vs = |vip: &str, port: u16, target: u16, pods: &[usize]| {
        rules.push_str(&format!("-A -t {vip}:{port} -s rr\n"));
        for pod in pods {
            rules.push_str(&format!(
                "-a -t {vip}:{port} -r {}:{target} -m -w 1\n",
                pod_ip(*pod)
            ));
        }
    };
    vs(WEB_VIP, 80, 8080, &[0, 1]);
    vs(NODEPORT_VIP, 80, 8080, &[0, 1]);
    vs(SLOW_VIP, 80, 9090, &[0]);
    vs(NODE_IP, NODE_PORT, 8080, &[0, 1]);
    vs(BRIDGE_IP, NODE_PORT, 8080, &[0, 1]);
    let addresses: String = [WEB_VIP, NODEPORT_VIP, SLOW_VIP]
        .iter()
        .map(|vip| format!("addr add {vip}/32 dev kube-ipvs0\n"))
        .collect();
    format!(
        "set -e
sysctl -qw net.ipv4.vs.conntrack=1 net.ipv4.ip_forward=1
sysctl -qw net.ipv4.vs.expire_nodest_conn=1 net.ipv4.vs.expire_quiescent_template=1
ipvsadm -R <<'END'
{rules}END
ip -batch - <<'END'
link add kube-ipvs0 type dummy
{addresses}END
"
    )
}

/// kube-proxy's iptables chains and ipsets for [`services`], the kubelet's chains beside
/// them, plus a foreign chain and set and a keepalived-style virtual server.
fn node_footprint(ipt: &str, script: &std::path::Path) -> String {
    let vips = [WEB_VIP, NODEPORT_VIP, SLOW_VIP];
    let cluster_ips: Vec<String> = vips.iter().map(|v| format!("{v},tcp:80")).collect();
    let loop_back: Vec<String> = [(0, 8080), (1, 8080), (0, 9090)]
        .iter()
        .map(|(pod, port)| format!("{ip},tcp:{port},{ip}", ip = pod_ip(*pod)))
        .collect();
    std::fs::write(script, FOOTPRINT).unwrap();
    format!(
        "set -e
         export IPT={ipt} CLUSTER_CIDR=10.244.0.0/16
         export CLUSTER_IPS='{}' LOOP_BACK='{}' NODE_PORTS_TCP={NODE_PORT} IPVS_IPS='{}'
         bash {}
         ipset create foreign-allow hash:net
         ipset add foreign-allow 192.168.50.0/24
         {ipt} -N FOREIGN-INPUT
         {ipt} -A FOREIGN-INPUT -m set --match-set foreign-allow src -j ACCEPT
         {ipt} -A INPUT -j FOREIGN-INPUT
         ipvsadm -A -t {KEEPALIVED_VS} -s wrr
         ipvsadm -a -t {KEEPALIVED_VS} -r {}:8443 -m -w 3",
        cluster_ips.join("\n"),
        loop_back.join("\n"),
        vips.join("\n"),
        script.display(),
        pod_ip(1),
    )
}

/// `iptables-save` of `ipt`, chain declarations and rules only, per table (`table line`).
fn saved(t: &Topology, ipt: &str) -> BTreeSet<String> {
    let mut table = String::new();
    let mut lines = BTreeSet::new();
    for line in t.node.sh_ok(&format!("{ipt}-save")).lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_owned();
        } else if line.starts_with(':') {
            // `:NAME POLICY [counters]`: the name and policy.
            let decl: Vec<&str> = line.split_whitespace().take(2).collect();
            lines.insert(format!("{table} {}", decl.join(" ")));
        } else if line.starts_with("-A ") {
            lines.insert(format!("{table} {line}"));
        }
    }
    lines
}

/// What stays of `iptables-save` once kube-proxy's part is gone: the built-in chains, the
/// kubelet's chains and rules, the foreign chain and its rule (written from the footprint,
/// not from the proxier).
fn expected_after(builtin: &[(&str, &[&str])]) -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    for (table, chains) in builtin {
        for chain in *chains {
            lines.insert(format!("{table} :{chain} ACCEPT"));
        }
        lines.insert(format!("{table} :KUBE-KUBELET-CANARY -"));
    }
    for line in [
        "filter :KUBE-FIREWALL -",
        "filter :FOREIGN-INPUT -",
        "filter -A INPUT -j KUBE-FIREWALL",
        "filter -A OUTPUT -j KUBE-FIREWALL",
        "filter -A INPUT -j FOREIGN-INPUT",
        "filter -A FOREIGN-INPUT -m set --match-set foreign-allow src -j ACCEPT",
        "filter -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
    ] {
        lines.insert(line.to_owned());
    }
    lines
}

/// Counts `ok` and `fail` lines of a client loop's log.
fn outcomes(path: &std::path::Path) -> (usize, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    (
        text.lines().filter(|l| *l == "ok").count(),
        text.lines().filter(|l| *l == "fail").count(),
    )
}

fn wait_for(what: &str, deadline: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Modules iptables and ipset need (the VM's busybox modprobe resolves no aliases).
const MODULES: &[&str] = &[
    "ip_set",
    "ip_set_hash_ip",
    "ip_set_hash_ipport",
    "ip_set_hash_ipportip",
    "ip_set_hash_ipportnet",
    "ip_set_hash_net",
    "ip_set_bitmap_port",
    "xt_set",
    "ip_tables",
    "iptable_nat",
    "iptable_filter",
    "iptable_mangle",
    "xt_comment",
    "xt_mark",
    "xt_conntrack",
    "xt_addrtype",
    "xt_MASQUERADE",
    "xt_tcpudp",
    "ipt_REJECT",
    "nft_compat",
    "nft_chain_nat",
];

fn take_over(ipt: &str) {
    let started = Instant::now();
    let mark = |what: &str| println!("{ipt}: {what} at {:.1}s", started.elapsed().as_secs_f64());
    ipvs_proxier_tests::load_modules(MODULES);
    let mut t = Topology::new(2);
    t.serve_tcp(0, 8080);
    t.serve_tcp(1, 8080);
    t.serve_slow_tcp(0, 9090, HOLD_SECS);
    let (services, slices) = services();
    t.write_source(&services, &slices);

    // The node as kube-proxy (IPVS mode, `ipt` flavour) left it.
    t.node.sh_ok(&kube_proxy_ipvs());
    t.node.sh_ok(&node_footprint(
        ipt,
        &t.source().with_extension("footprint.sh"),
    ));
    let builtin: &[(&str, &[&str])] = &[
        (
            "mangle",
            &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        ),
        ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
        ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
    ];
    let before_rules = saved(&t, ipt);
    assert!(
        before_rules.contains("nat :KUBE-SERVICES -") && before_rules.len() > 40,
        "{before_rules:#?}"
    );
    let ipvs_before = t.node.sh_ok("ipvsadm -Sn");
    // kube-proxy's data plane works on its own: both Services answer.
    let web = format!("{WEB_VIP}:80");
    let node_port = format!("{NODE_IP}:{NODE_PORT}");
    for target in [&web, &node_port] {
        let answer = t.client_tcp(target, None);
        assert!(
            answer.as_deref().is_some_and(|a| a.starts_with("pod-")),
            "{target} under kube-proxy's rules: {answer:?}\n{}",
            t.diagnostics()
        );
    }

    // The dry run lists kube-proxy's part and nothing else.
    let dry = t.node.sh_ok(&format!(
        "{} --source-file {} --hostname-override {NODE_NAME} --dry-run --take-over-kube-proxy",
        ipvs_proxier_tests::proxier_bin().display(),
        t.source().display()
    ));
    assert!(
        dry.contains(&format!("remove chain  {ipt} -t nat KUBE-SERVICES\n"))
            && dry.contains(&format!("remove chain  {ipt} -t filter KUBE-IPVS-FILTER\n"))
            && dry.contains("remove ipset  KUBE-CLUSTER-IP\n"),
        "{dry}"
    );
    assert!(
        !dry.contains("FOREIGN") && !dry.contains("foreign") && !dry.contains("KUBELET"),
        "{dry}"
    );
    assert_eq!(saved(&t, ipt), before_rules, "the dry run changed nothing");

    mark("kube-proxy's footprint built and checked");
    // One long connection through a ClusterIP, open before the takeover.
    let held = t.source().with_extension("held");
    let _ = std::fs::remove_file(&held);
    t.background.spawn(
        &t.client,
        &format!(
            "bash -c 'socat -T{} -u TCP4:{SLOW_VIP}:80,connect-timeout=5 - > {}'",
            HOLD_SECS + 30,
            held.display()
        ),
    );
    wait_for(
        "the held connection's first line",
        Duration::from_secs(20),
        || std::fs::read_to_string(&held).unwrap_or_default().trim() == pod_name(0),
    );

    // New connections in a loop, to the ClusterIP and to the NodePort.
    let stop = t.source().with_extension("stop");
    let _ = std::fs::remove_file(&stop);
    let logs: Vec<std::path::PathBuf> = ["clusterip", "nodeport"]
        .iter()
        .map(|name| t.source().with_extension(name))
        .collect();
    for (target, log) in [&web, &node_port].into_iter().zip(&logs) {
        let _ = std::fs::remove_file(log);
        t.background.spawn(
            &t.client,
            &format!(
                "bash -c 'while [ ! -e {stop} ]; do \
                   if socat -T5 -u TCP4:{target},connect-timeout=3 - 2>/dev/null | grep -q ^pod-; \
                   then echo ok; else echo fail; fi; done >> {log}; echo end >> {log}'",
                stop = stop.display(),
                log = log.display()
            ),
        );
    }
    wait_for("client loops under way", Duration::from_secs(30), || {
        logs.iter().all(|log| outcomes(log).0 >= 3)
    });

    mark("client loops running");
    t.start_daemon(&["--take-over-kube-proxy"]);
    wait_for("the takeover", Duration::from_secs(60), || {
        t.daemon().assert_running();
        t.daemon_log().contains("took over from kube-proxy")
    });
    mark("takeover done");
    let at_takeover: Vec<(usize, usize)> = logs.iter().map(|l| outcomes(l)).collect();
    // Traffic goes on through ipvs-proxier's rules alone.
    wait_for(
        "connections after the takeover",
        Duration::from_secs(30),
        || {
            logs.iter()
                .zip(&at_takeover)
                .all(|(log, before)| outcomes(log).0 >= before.0 + 3)
        },
    );
    std::fs::write(&stop, "").unwrap();
    wait_for("the client loops to stop", Duration::from_secs(15), || {
        logs.iter().all(|log| {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .ends_with("end\n")
        })
    });
    mark("client loops stopped");
    let log = t.daemon_log();

    let totals: Vec<(usize, usize)> = logs.iter().map(|l| outcomes(l)).collect();
    println!(
        "{ipt}: ClusterIP connections ok/failed {:?} ({:?} before the takeover), NodePort {:?} ({:?})",
        totals[0], at_takeover[0], totals[1], at_takeover[1]
    );
    for (name, (ok, failed)) in ["ClusterIP", "NodePort"].iter().zip(&totals) {
        assert_eq!(
            *failed,
            0,
            "{name}: {failed} of {} connection attempts failed\n{}\n{log}",
            ok + failed,
            t.diagnostics()
        );
    }

    // The first sync adopted kube-proxy's IPVS state without a single write.
    let first_sync = log
        .lines()
        .find(|l| l.contains("sync done"))
        .unwrap_or_else(|| panic!("no sync in the log:\n{log}"));
    println!("{ipt}: first sync: {first_sync}");
    assert!(
        first_sync.contains("report=0 writes (0 deletes, 0 failed)"),
        "{first_sync}"
    );
    assert_eq!(
        t.node.sh_ok("ipvsadm -Sn"),
        ipvs_before,
        "IPVS (kube-proxy's services and the keepalived one) unchanged"
    );

    // kube-proxy's chains, jumps and sets are gone; everything else is as it was.
    assert_eq!(saved(&t, ipt), expected_after(builtin));
    let sets: BTreeSet<String> = t
        .node
        .sh_ok("ipset list -n")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(sets, BTreeSet::from(["foreign-allow".to_owned()]));
    assert!(
        t.node
            .sh_ok("ipset list foreign-allow")
            .contains("192.168.50.0/24")
    );
    t.node.sh_ok("nft list table ip ipvs-proxier >/dev/null");

    // The long connection made before the takeover completes.
    wait_for(
        "the held connection to complete",
        Duration::from_secs(u64::from(HOLD_SECS) + 20),
        || {
            std::fs::read_to_string(&held)
                .unwrap_or_default()
                .contains(&format!("done-{}", pod_name(0)))
        },
    );
    mark("the connection held across the takeover completed");
}

#[test]
fn takes_over_from_kube_proxy_with_iptables_legacy() {
    require_kernel!();
    take_over("iptables-legacy");
}

#[test]
fn takes_over_from_kube_proxy_with_iptables_nft() {
    require_kernel!();
    take_over("iptables-nft");
}
