//! The proxier-core reconciler against the real kernel: IPVS through ipvs-netlink,
//! the dummy link through rtnetlink. Oracles: `ipvsadm -Sn` and `ip -o addr show`.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{Debug, Display};
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use ipvs_proxier_tests::{Netns, require_kernel};
use proxier_core::backend::{
    AddressBackend, BackendError, IpvsBackend, KernelAddressBackend, KernelIpvsBackend,
};
use proxier_core::desired::{Protocol, Scheduler};
use proxier_core::observed::Forwarding;
use proxier_core::{
    Desired, RealServer, RealServerKey, Reconciler, ReconcilerConfig, ServicePortName,
    ServicePortPlan, VirtualServer, VirtualServerKey, VirtualServerRole,
};

type KernelReconciler = Reconciler<KernelIpvsBackend, KernelAddressBackend>;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn name(service: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName {
        namespace: "default".into(),
        name: service.into(),
        port: "p".into(),
        protocol,
    }
}

fn key(address: &str, port: u16, protocol: Protocol) -> VirtualServerKey {
    VirtualServerKey {
        address: ip(address),
        port,
        protocol,
    }
}

fn server(role: VirtualServerRole, endpoints: &[(&str, u16)]) -> VirtualServer {
    VirtualServer {
        role,
        scheduler: Scheduler::RoundRobin,
        persistence_timeout: None,
        hash_source_port: false,
        real_servers: endpoints
            .iter()
            .map(|(a, p)| {
                (
                    RealServerKey {
                        address: ip(a),
                        port: *p,
                    },
                    RealServer { weight: 1 },
                )
            })
            .collect(),
    }
}

fn plan(servers: Vec<(VirtualServerKey, VirtualServer)>) -> ServicePortPlan {
    ServicePortPlan {
        virtual_servers: servers.into_iter().collect(),
        ..Default::default()
    }
}

/// web (ClusterIP + NodePort, 2 endpoints), dns (UDP), sticky (ClientIP affinity, mh
/// with source-port hashing), v6 (IPv6 ClusterIP), sctp.
fn cluster() -> Desired {
    let mut sticky = server(VirtualServerRole::ClusterIp, &[("10.244.1.2", 8443)]);
    sticky.persistence_timeout = Some(10800);
    sticky.scheduler = Scheduler::MaglevHashing;
    sticky.hash_source_port = true;
    Desired {
        services: BTreeMap::from([
            (
                name("web", Protocol::Tcp),
                plan(vec![
                    (
                        key("10.96.0.10", 80, Protocol::Tcp),
                        server(
                            VirtualServerRole::ClusterIp,
                            &[("10.244.1.2", 8080), ("10.244.1.3", 8080)],
                        ),
                    ),
                    (
                        key("192.168.99.2", 30080, Protocol::Tcp),
                        server(
                            VirtualServerRole::NodePort,
                            &[("10.244.1.2", 8080), ("10.244.1.3", 8080)],
                        ),
                    ),
                ]),
            ),
            (
                name("dns", Protocol::Udp),
                plan(vec![(
                    key("10.96.0.53", 53, Protocol::Udp),
                    server(VirtualServerRole::ClusterIp, &[("10.244.1.4", 53)]),
                )]),
            ),
            (
                name("sticky", Protocol::Tcp),
                plan(vec![(key("10.96.0.11", 443, Protocol::Tcp), sticky)]),
            ),
            (
                name("v6", Protocol::Tcp),
                plan(vec![(
                    key("fd00:96::10", 80, Protocol::Tcp),
                    server(VirtualServerRole::ClusterIp, &[("fd00:244::2", 8080)]),
                )]),
            ),
            (
                name("sctp", Protocol::Sctp),
                plan(vec![(
                    key("10.96.0.12", 9000, Protocol::Sctp),
                    server(VirtualServerRole::ClusterIp, &[("10.244.1.5", 9000)]),
                )]),
            ),
        ]),
    }
}

/// `ipvsadm -Sn` of [`cluster`], written out by hand (one rule per line, sorted).
fn cluster_rules() -> BTreeSet<String> {
    [
        "-A -t 10.96.0.10:80 -s rr",
        "-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1",
        "-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 1",
        "-A -t 192.168.99.2:30080 -s rr",
        "-a -t 192.168.99.2:30080 -r 10.244.1.2:8080 -m -w 1",
        "-a -t 192.168.99.2:30080 -r 10.244.1.3:8080 -m -w 1",
        "-A -u 10.96.0.53:53 -s rr",
        "-a -u 10.96.0.53:53 -r 10.244.1.4:53 -m -w 1",
        "-A -t 10.96.0.11:443 -s mh -p 10800 -b mh-port",
        "-a -t 10.96.0.11:443 -r 10.244.1.2:8443 -m -w 1",
        "-A -t [fd00:96::10]:80 -s rr",
        "-a -t [fd00:96::10]:80 -r [fd00:244::2]:8080 -m -w 1",
        "-A --sctp-service 10.96.0.12:9000 -s rr",
        "-a --sctp-service 10.96.0.12:9000 -r 10.244.1.5:9000 -m -w 1",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// The addresses `ip` shows on kube-ipvs0 for [`cluster`].
fn cluster_addresses() -> BTreeSet<String> {
    [
        "10.96.0.10/32",
        "10.96.0.53/32",
        "10.96.0.11/32",
        "10.96.0.12/32",
        "fd00:96::10/128",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// The rules `ipvsadm -Sn` prints, normalised (whitespace collapsed), as a set.
fn ipvs_rules(netns: &Netns) -> BTreeSet<String> {
    netns
        .sh_ok("ipvsadm -Sn")
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| !line.is_empty())
        .collect()
}

/// Addresses on kube-ipvs0 as `ip -o addr show` prints them (empty when the link is missing).
fn link_addresses(netns: &Netns) -> BTreeSet<String> {
    let out = netns.sh("ip -o addr show dev kube-ipvs0");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet" || *w == "inet6")?;
            words.next().map(str::to_owned)
        })
        .filter(|address| !address.starts_with("fe80:"))
        .collect()
}

/// A namespace with routes to the endpoint subnets (masquerade destinations need one).
fn node() -> Netns {
    let netns = Netns::new();
    netns.sh_ok(
        "ip link add pods0 type dummy && ip link set pods0 up \
         && ip addr add 10.244.1.1/24 dev pods0 \
         && ip addr add fd00:244::1/64 dev pods0 nodad",
    );
    netns
}

async fn kernel_reconciler(netns: &Netns, config: ReconcilerConfig) -> KernelReconciler {
    let ipvs = KernelIpvsBackend::connect_in_netns(netns.path())
        .await
        .unwrap();
    let addresses = KernelAddressBackend::connect("kube-ipvs0").unwrap();
    Reconciler::new(ipvs, addresses, config)
}

#[test]
fn reconciler_from_empty_programs_ipvs_and_binds_vips() {
    require_kernel!();
    let netns = node();
    let report = netns.block_on(|| async {
        let mut rec = kernel_reconciler(&netns, ReconcilerConfig::default()).await;
        let report = rec.full_sync(&cluster()).await.unwrap();
        assert!(
            rec.stats().last_errors.is_empty(),
            "{:?}",
            rec.stats().last_errors
        );
        report
    });
    assert_eq!(report.failed, 0, "{report:?}");
    assert_eq!(report.deletes, 0);
    assert_eq!(ipvs_rules(&netns), cluster_rules());
    assert_eq!(link_addresses(&netns), cluster_addresses());
    // The NodePort's node address is not bound on the dummy link.
    assert!(!netns.sh_ok("ip -o addr show").contains("192.168.99.2"));
}

#[test]
fn the_backend_reads_one_virtual_server_with_its_real_servers_and_none_once_it_is_gone() {
    require_kernel!();
    let netns = node();
    // Made with ipvsadm, the oracle: a persistent round-robin service, a masquerading real
    // server with weight 3, a draining one (weight 0), one routed directly (ipvsadm gives a
    // direct-routing real server the virtual port, whatever port it is told).
    netns.sh_ok(
        "ipvsadm -A -t 10.96.7.7:80 -s rr -p 600 \
         && ipvsadm -a -t 10.96.7.7:80 -r 10.244.7.1:8080 -m -w 3 \
         && ipvsadm -a -t 10.96.7.7:80 -r 10.244.7.2:8080 -m -w 0 \
         && ipvsadm -a -t 10.96.7.7:80 -r 10.244.7.3:8080 -g -w 1",
    );
    let key = VirtualServerKey {
        address: ip("10.96.7.7"),
        port: 80,
        protocol: Protocol::Tcp,
    };
    netns.block_on(|| async {
        let mut ipvs = KernelIpvsBackend::connect_in_netns(netns.path())
            .await
            .unwrap();
        let vs = ipvs
            .get_virtual_server(&key)
            .await
            .unwrap()
            .expect("the service ipvsadm added");
        assert_eq!(vs.settings.scheduler, Scheduler::RoundRobin);
        assert_eq!(vs.settings.persistence_timeout, Some(600));
        let real = |address: &str| {
            let port = if address == "10.244.7.3" { 80 } else { 8080 };
            vs.real_servers
                .get(&RealServerKey {
                    address: ip(address),
                    port,
                })
                .copied()
                .unwrap_or_else(|| panic!("{address} missing: {vs:?}"))
        };
        assert_eq!(vs.real_servers.len(), 3, "{vs:?}");
        assert_eq!(
            (real("10.244.7.1").weight, real("10.244.7.1").forward),
            (3, Forwarding::Masquerade)
        );
        assert_eq!(
            (real("10.244.7.2").weight, real("10.244.7.2").forward),
            (0, Forwarding::Masquerade)
        );
        assert_eq!(
            (real("10.244.7.3").weight, real("10.244.7.3").forward),
            (1, Forwarding::Other)
        );

        // Gone behind the backend's back, and one that never was: no virtual server.
        netns.sh_ok("ipvsadm -D -t 10.96.7.7:80");
        assert_eq!(ipvs.get_virtual_server(&key).await.unwrap(), None);
        let never = VirtualServerKey { port: 81, ..key };
        assert_eq!(ipvs.get_virtual_server(&never).await.unwrap(), None);
    });
}

#[test]
fn reconciler_full_sync_repairs_drift() {
    require_kernel!();
    let netns = node();
    netns.block_on(|| async {
        let mut rec = kernel_reconciler(&netns, ReconcilerConfig::default()).await;
        rec.full_sync(&cluster()).await.unwrap();

        // Drift behind the proxier's back.
        netns.sh_ok(
            "ipvsadm -D -u 10.96.0.53:53 \
             && ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.99:8080 -m -w 3 \
             && ipvsadm -e -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 9 \
             && ip addr del 10.96.0.11/32 dev kube-ipvs0",
        );
        assert_ne!(ipvs_rules(&netns), cluster_rules());

        let report = rec.full_sync(&cluster()).await.unwrap();
        assert_eq!(report.failed, 0, "{report:?}");
        // Deleted virtual server, rogue real server, changed weight, unbound VIP.
        assert_eq!(report.drift, Some(4), "{report:?}");
        assert_eq!(ipvs_rules(&netns), cluster_rules());
        assert_eq!(link_addresses(&netns), cluster_addresses());

        let again = rec.full_sync(&cluster()).await.unwrap();
        assert_eq!((again.writes, again.drift), (0, Some(0)), "{again:?}");
    });
}

#[test]
fn reconciler_restart_adopts_kernel_state_with_zero_writes() {
    require_kernel!();
    let netns = node();
    netns.block_on(|| async {
        let mut first = kernel_reconciler(&netns, ReconcilerConfig::default()).await;
        first.full_sync(&cluster()).await.unwrap();
    });
    let before = ipvs_rules(&netns);
    assert_eq!(before, cluster_rules());
    // A new process: new sockets, new reconciler, same kernel.
    let report = netns.block_on(|| async {
        let mut restarted = kernel_reconciler(&netns, ReconcilerConfig::default()).await;
        let report = restarted.full_sync(&cluster()).await.unwrap();
        let stats = restarted.stats().clone();
        (report, stats)
    });
    let (report, stats) = report;
    assert_eq!(report.writes, 0, "{report:?}");
    assert_eq!(report.deletes, 0);
    assert!(
        stats.ops.values().all(|c| c.succeeded + c.failed == 0),
        "{stats:?}"
    );
    assert_eq!(ipvs_rules(&netns), before);
    assert_eq!(link_addresses(&netns), cluster_addresses());
}

#[test]
fn reconciler_leaves_foreign_virtual_servers_alone_and_removes_its_stale_ones() {
    require_kernel!();
    let netns = node();
    // keepalived-style service on another address; a stale service of a previous
    // proxier on an address bound on kube-ipvs0; an excluded one on kube-ipvs0.
    netns.sh_ok(
        "ipvsadm -A -t 192.168.77.7:80 -s wlc \
         && ipvsadm -a -t 192.168.77.7:80 -r 10.244.1.2:80 -m -w 5 \
         && ip link add kube-ipvs0 type dummy \
         && ip addr add 10.96.0.99/32 dev kube-ipvs0 \
         && ip addr add 10.250.0.1/32 dev kube-ipvs0 \
         && ipvsadm -A -t 10.96.0.99:80 -s rr \
         && ipvsadm -a -t 10.96.0.99:80 -r 10.244.1.7:80 -m \
         && ipvsadm -A -t 10.250.0.1:80 -s rr",
    );
    let config = ReconcilerConfig {
        exclude_cidrs: vec!["10.250.0.0/16".parse().unwrap()],
        ..ReconcilerConfig::default()
    };
    // A Service whose ClusterIP lies in the excluded range is still programmed.
    let mut with_excluded = cluster();
    with_excluded.services.insert(
        name("in-excluded-range", Protocol::Tcp),
        plan(vec![(
            key("10.250.0.5", 80, Protocol::Tcp),
            server(VirtualServerRole::ClusterIp, &[("10.244.1.9", 80)]),
        )]),
    );
    let (report, with_excluded_rules, bound, cleanup) = netns.block_on(|| async {
        let mut rec = kernel_reconciler(&netns, config).await;
        let report = rec.full_sync(&with_excluded).await.unwrap();
        let rules = ipvs_rules(&netns);
        let bound = link_addresses(&netns);
        // The same rule decides what a cleanup removes: what it planned, in the excluded
        // range too, and nothing foreign.
        let cleanup = rec.remove_owned().await;
        (report, rules, bound, cleanup)
    });
    assert_eq!(report.failed, 0, "{report:?}");
    let mut expected = cluster_rules();
    for rule in [
        "-A -t 192.168.77.7:80 -s wlc",
        "-a -t 192.168.77.7:80 -r 10.244.1.2:80 -m -w 5",
        "-A -t 10.250.0.1:80 -s rr",
    ] {
        expected.insert(rule.to_owned());
    }
    let mut expected_with_excluded = expected.clone();
    expected_with_excluded.insert("-A -t 10.250.0.5:80 -s rr".to_owned());
    expected_with_excluded.insert("-a -t 10.250.0.5:80 -r 10.244.1.9:80 -m -w 1".to_owned());
    assert_eq!(with_excluded_rules, expected_with_excluded);
    let mut addresses = cluster_addresses();
    addresses.insert("10.250.0.1/32".to_owned());
    addresses.insert("10.250.0.5/32".to_owned());
    assert_eq!(bound, addresses);
    assert!(cleanup.errors.is_empty(), "{:?}", cleanup.errors);
    assert!(cleanup.link_deleted);
    let left: BTreeSet<String> = [
        "-A -t 192.168.77.7:80 -s wlc",
        "-a -t 192.168.77.7:80 -r 10.244.1.2:80 -m -w 5",
        "-A -t 10.250.0.1:80 -s rr",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(ipvs_rules(&netns), left, "only foreign services are left");
}

/// Node netns with a pod netns (server) and a client netns, each on its own routed veth.
struct DrainTopology {
    node: Netns,
    pod: Netns,
    client: Netns,
    server_pid: String,
}

impl DrainTopology {
    fn new() -> DrainTopology {
        let node = Netns::new();
        let pod = Netns::new();
        let client = Netns::new();
        node.sh_ok(&format!(
            "echo 1 > /proc/sys/net/ipv4/ip_forward \
             && ip link add vpod type veth peer name eth0 netns {pod} \
             && ip link add vcli type veth peer name eth0 netns {client} \
             && ip addr add 10.244.1.1/24 dev vpod && ip link set vpod up \
             && ip addr add 10.10.0.1/24 dev vcli && ip link set vcli up",
            pod = pod.name(),
            client = client.name(),
        ));
        pod.sh_ok(
            "ip addr add 10.244.1.2/24 dev eth0 && ip link set eth0 up \
             && ip route add default via 10.244.1.1",
        );
        client.sh_ok(
            "ip addr add 10.10.0.2/24 dev eth0 && ip link set eth0 up \
             && ip route add default via 10.10.0.1",
        );
        let server_pid = pod
            .sh_ok(
                "socat TCP-LISTEN:8080,fork,reuseaddr SYSTEM:'echo pod-a; cat' \
                 </dev/null >/dev/null 2>&1 & echo $!",
            )
            .trim()
            .to_owned();
        // The client connects right after the first sync: the server must be up by then.
        pod.wait_listening(8080);
        DrainTopology {
            node,
            pod,
            client,
            server_pid,
        }
    }
}

impl Drop for DrainTopology {
    fn drop(&mut self) {
        let _ = self.pod.sh(&format!("kill {}", self.server_pid));
    }
}

#[test]
fn reconciler_drains_a_removed_endpoint_while_a_tcp_connection_lives() {
    require_kernel!();
    let topo = DrainTopology::new();
    let web = name("web", Protocol::Tcp);
    let vip = key("10.96.0.10", 80, Protocol::Tcp);
    let without_endpoint = Desired {
        services: BTreeMap::from([(
            web.clone(),
            plan(vec![(
                vip,
                server(VirtualServerRole::ClusterIp, &[("10.244.1.3", 8080)]),
            )]),
        )]),
    };
    let node = &topo.node;
    let client = &topo.client;
    let drained_rule = "-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 0";
    node.block_on(|| async {
        let mut rec = kernel_reconciler(node, ReconcilerConfig::default()).await;
        // Only the live endpoint, so the client's connection lands on it.
        let only_a = Desired {
            services: BTreeMap::from([(
                web.clone(),
                plan(vec![(
                    vip,
                    server(VirtualServerRole::ClusterIp, &[("10.244.1.2", 8080)]),
                )]),
            )]),
        };
        rec.full_sync(&only_a).await.unwrap();

        // A client holds a connection through the ClusterIP (reset on close: no TIME_WAIT).
        let client_pid = client
            .sh_ok(
                "socat -d -d TCP:10.96.0.10:80,linger=0 SYSTEM:'cat >/tmp/drain-client.out' \
                 </dev/null >/dev/null 2>/tmp/drain-client.log & echo $!",
            )
            .trim()
            .to_owned();
        // Under software emulation on a loaded machine a connect and each `ipvsadm` call can
        // take a while: allow 30 s.
        let mut established = false;
        for _ in 0..300 {
            let listing = node.sh_ok("ipvsadm -Ln -t 10.96.0.10:80");
            if listing
                .lines()
                .any(|l| l.contains("10.244.1.2:8080") && l.split_whitespace().nth(4) == Some("1"))
            {
                established = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            established,
            "no active connection on 10.244.1.2: {}\n--- client ---\n{}\n--- pod ---\n{}",
            node.sh_ok("ipvsadm -Ln; ipvsadm -Lnc; ip addr; ip route"),
            client.sh_ok("cat /tmp/drain-client.log; ip addr; ip route; ps -ef || ps"),
            topo.pod.sh_ok("ip addr; ip route; cat /proc/net/tcp"),
        );

        // The endpoint is replaced by another: weight 0, kept while the connection lives.
        let report = rec
            .sync_services(&without_endpoint, &BTreeSet::from([web.clone()]))
            .await
            .unwrap();
        assert_eq!(report.deletes, 0, "{report:?}");
        assert!(
            ipvs_rules(node).contains(drained_rule),
            "{:?}",
            ipvs_rules(node)
        );
        assert_eq!(rec.stats().drain_queue_len, 1);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            rec.tick(&without_endpoint).await.unwrap();
            assert!(
                ipvs_rules(node).contains(drained_rule),
                "{:?}",
                ipvs_rules(node)
            );
        }
        // A full sync keeps it too.
        rec.full_sync(&without_endpoint).await.unwrap();
        assert!(ipvs_rules(node).contains(drained_rule));

        // The connection closes: the real server goes on a following tick. SIGKILL, so the
        // socket is closed by the kernel with the zero linger (a reset: IPVS keeps the entry
        // 10 s in CLOSE); on SIGTERM socat shuts the socket down first, a FIN, and the entry
        // would sit in TIME_WAIT for two minutes.
        client.sh_ok(&format!("kill -KILL {client_pid}"));
        let mut gone = false;
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            rec.tick(&without_endpoint).await.unwrap();
            if !ipvs_rules(node)
                .iter()
                .any(|r| r.contains("10.244.1.2:8080"))
            {
                gone = true;
                break;
            }
        }
        assert!(
            gone,
            "still there: {}",
            node.sh_ok("ipvsadm -Ln; ipvsadm -Lnc")
        );
        assert_eq!(rec.stats().drain_queue_len, 0);
        assert!(ipvs_rules(node).contains("-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 1"));
    });
    let greeting = topo.client.sh_ok("cat /tmp/drain-client.out || true");
    assert!(greeting.contains("pod-a"), "client got {greeting:?}");
}

#[test]
fn reconciler_incremental_sync_changes_only_the_dirty_services() {
    require_kernel!();
    let netns = node();
    let web = name("web", Protocol::Tcp);
    let dns = name("dns", Protocol::Udp);
    let mut changed = cluster();
    // web loses an endpoint (no connections: deleted at once); dns is removed entirely.
    for vs in changed
        .services
        .get_mut(&web)
        .unwrap()
        .virtual_servers
        .values_mut()
    {
        vs.real_servers.remove(&RealServerKey {
            address: ip("10.244.1.3"),
            port: 8080,
        });
    }
    changed.services.remove(&dns);
    let report = netns.block_on(|| async {
        let mut rec = kernel_reconciler(&netns, ReconcilerConfig::default()).await;
        rec.full_sync(&cluster()).await.unwrap();
        rec.sync_services(&changed, &BTreeSet::from([web.clone(), dns.clone()]))
            .await
            .unwrap()
    });
    assert_eq!(report.failed, 0, "{report:?}");
    // 2 real servers (each set to weight 0 first, then deleted), 1 virtual server, 1 address.
    assert_eq!((report.writes, report.deletes), (6, 4), "{report:?}");
    let expected: BTreeSet<String> = cluster_rules()
        .into_iter()
        .filter(|rule| !rule.contains("10.244.1.3:8080") && !rule.contains("10.96.0.53:53"))
        .collect();
    assert_eq!(ipvs_rules(&netns), expected);
    let mut addresses = cluster_addresses();
    addresses.remove("10.96.0.53/32");
    assert_eq!(link_addresses(&netns), addresses);
}

/// `ip -d route show table local` lines (both families) through kube-ipvs0, whitespace
/// collapsed (`-d` prints `proto boot`, which plain `ip route` leaves out).
fn link_local_table(netns: &Netns) -> Vec<String> {
    netns
        .sh_ok("ip -d route show table local; ip -d -6 route show table local")
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| line.contains(" dev kube-ipvs0 "))
        .collect()
}

fn parsed<T: FromStr>(s: &str) -> T
where
    T::Err: Debug,
{
    s.parse().unwrap()
}

fn strings<T: Display>(items: &BTreeSet<T>) -> BTreeSet<String> {
    items.iter().map(ToString::to_string).collect()
}

#[test]
fn address_backend_routes_service_cidrs_as_local() {
    require_kernel!();
    let netns = Netns::new();
    netns.block_on(|| async {
        let mut backend = KernelAddressBackend::connect("kube-ipvs0").unwrap();
        // No link: nothing listed, nothing to add a route through.
        assert_eq!(backend.list_local_routes().await, Ok(BTreeSet::new()));
        assert_eq!(
            backend.add_local_route(parsed("10.96.0.0/12")).await,
            Err(BackendError::NotFound)
        );
        backend.ensure_link().await.unwrap();
        // The link's IPv6 link-local address has a kernel route: not listed.
        assert_eq!(backend.list_local_routes().await, Ok(BTreeSet::new()));

        backend
            .add_local_route(parsed("10.96.0.0/12"))
            .await
            .unwrap();
        backend
            .add_local_route(parsed("fd00:96::/108"))
            .await
            .unwrap();
        let table = link_local_table(&netns);
        let v4 = "local 10.96.0.0/12 dev kube-ipvs0 proto static scope host";
        assert!(table.iter().any(|l| l.starts_with(v4)), "{table:#?}");
        // IPv6 routes have no scope of their own: the kernel reports `global`.
        let v6 = "local fd00:96::/108 dev kube-ipvs0 proto static";
        assert!(table.iter().any(|l| l.starts_with(v6)), "{table:#?}");
        let both = BTreeSet::from(["10.96.0.0/12".to_owned(), "fd00:96::/108".to_owned()]);
        assert_eq!(strings(&backend.list_local_routes().await.unwrap()), both);

        // The node takes the whole range as its own.
        netns.sh_ok("ping -c1 -W1 10.96.7.7 && ping -6 -c1 -W1 fd00:96::7");
        let got = netns.sh_ok("ip route get 10.96.7.7");
        assert!(got.starts_with("local 10.96.7.7 "), "{got}");

        // A bound address gets a `proto kernel` local route of its own: not listed.
        backend.add_address(ip("10.96.0.10")).await.unwrap();
        backend.add_address(ip("fd00:96::10")).await.unwrap();
        let table = link_local_table(&netns);
        let kernel = "local 10.96.0.10 dev kube-ipvs0 proto kernel scope host";
        assert!(table.iter().any(|l| l.starts_with(kernel)), "{table:#?}");
        assert_eq!(strings(&backend.list_local_routes().await.unwrap()), both);

        assert_eq!(
            backend.add_local_route(parsed("10.96.0.0/12")).await,
            Err(BackendError::Exists)
        );
        assert_eq!(
            backend.add_local_route(parsed("fd00:96::/108")).await,
            Err(BackendError::Exists)
        );
        backend
            .remove_local_route(parsed("10.96.0.0/12"))
            .await
            .unwrap();
        let table = link_local_table(&netns);
        assert!(
            !table.iter().any(|l| l.contains("10.96.0.0/12")),
            "{table:#?}"
        );
        assert!(table.iter().any(|l| l.starts_with(kernel)), "{table:#?}");
        assert_eq!(
            strings(&backend.list_local_routes().await.unwrap()),
            BTreeSet::from(["fd00:96::/108".to_owned()])
        );
        assert_eq!(
            backend.remove_local_route(parsed("10.96.0.0/12")).await,
            Err(BackendError::NotFound)
        );

        // Every non-kernel local route through the link is the proxier's, whatever its
        // protocol (`ip route add` makes `proto boot`), and can be removed.
        netns.sh_ok("ip route add local 10.97.0.0/16 dev kube-ipvs0 table local");
        let table = link_local_table(&netns);
        let boot = "local 10.97.0.0/16 dev kube-ipvs0 proto boot scope host";
        assert!(table.iter().any(|l| l.starts_with(boot)), "{table:#?}");
        assert_eq!(
            strings(&backend.list_local_routes().await.unwrap()),
            BTreeSet::from(["10.97.0.0/16".to_owned(), "fd00:96::/108".to_owned()])
        );
        backend
            .remove_local_route(parsed("10.97.0.0/16"))
            .await
            .unwrap();
        backend
            .remove_local_route(parsed("fd00:96::/108"))
            .await
            .unwrap();
        assert_eq!(
            backend.remove_local_route(parsed("fd00:96::/108")).await,
            Err(BackendError::NotFound)
        );
        assert_eq!(backend.list_local_routes().await, Ok(BTreeSet::new()));

        // Deleting the link takes its routes with it.
        backend
            .add_local_route(parsed("10.96.0.0/12"))
            .await
            .unwrap();
        backend
            .add_local_route(parsed("fd00:96::/108"))
            .await
            .unwrap();
        assert_eq!(backend.delete_link().await, Ok(true));
        let table = link_local_table(&netns);
        assert!(table.is_empty(), "{table:#?}");
        assert_eq!(backend.list_local_routes().await, Ok(BTreeSet::new()));
        assert_eq!(
            backend.remove_local_route(parsed("10.96.0.0/12")).await,
            Err(BackendError::NotFound)
        );
    });
}

#[test]
fn address_backend_tells_whether_the_link_holds_an_address_from_the_first_it_finds() {
    // A restart is told by a link that holds addresses (its ClusterIPs); the link-local
    // address the kernel gives a link that is up is not one. The answer stops the dump at
    // the first address, so the link here holds more than one dump message carries: the
    // backend's own socket must be left whole by it.
    require_kernel!();
    let netns = node();
    netns.block_on(|| async {
        let mut backend = KernelAddressBackend::connect("kube-ipvs0").unwrap();
        assert_eq!(backend.holds_addresses().await, Ok(false), "no link");
        backend.ensure_link().await.unwrap();
    });
    // Link-local addresses of both families, as the kernel gives a link that goes up.
    netns.sh_ok(
        "ip addr add fe80::1234/64 dev kube-ipvs0 nodad \
         && ip addr add 169.254.7.7/16 dev kube-ipvs0",
    );
    let shown = netns.sh_ok("ip -o addr show dev kube-ipvs0");
    assert!(
        shown.contains("fe80::1234") && shown.contains("169.254.7.7"),
        "{shown}"
    );
    netns.block_on(|| async {
        let mut backend = KernelAddressBackend::connect("kube-ipvs0").unwrap();
        assert_eq!(
            backend.holds_addresses().await,
            Ok(false),
            "link-local alone"
        );
    });
    let batch: String = (0..2000)
        .map(|i| {
            format!(
                "addr add 10.96.{}.{}/32 dev kube-ipvs0\n",
                i / 250,
                i % 250 + 1
            )
        })
        .collect();
    netns.sh_ok(&format!("printf '{batch}' | ip -batch -"));
    netns.block_on(|| async {
        let mut backend = KernelAddressBackend::connect("kube-ipvs0").unwrap();
        for _ in 0..3 {
            assert_eq!(backend.holds_addresses().await, Ok(true));
        }
        assert_eq!(backend.list_addresses().await.map(|a| a.len()), Ok(2000));
        backend.remove_address(ip("10.96.0.1")).await.unwrap();
        assert_eq!(backend.holds_addresses().await, Ok(true));
    });
    let left = link_addresses(&netns);
    assert!(!left.contains("10.96.0.1/32"));
    let vips = left.iter().filter(|a| a.starts_with("10.96.")).count();
    assert_eq!(vips, 1999, "{left:?}");
}

#[test]
fn address_backend_reads_the_nodes_own_addresses() {
    // The node's addresses serve NodePorts. On a point-to-point address the kernel reports
    // the peer as IFA_ADDRESS and the node's own as IFA_LOCAL: the node's is the one wanted
    // (as Go's net.Interface.Addrs, which kube-proxy reads). The dummy link's VIPs, loopback
    // and IPv6 link-local addresses are not NodePort addresses; IPv4 link-local ones are.
    require_kernel!();
    let netns = node();
    netns.sh_ok(
        "ip link add tun0 type dummy && ip link set tun0 up \
         && ip addr add 10.9.0.1 peer 10.9.0.2/32 dev tun0 \
         && ip addr add 169.254.3.3/16 dev tun0 \
         && ip link set lo up",
    );
    // The oracle shows the pair as the test wrote it.
    let shown = netns.sh_ok("ip -o -4 addr show dev tun0");
    assert!(shown.contains("inet 10.9.0.1 peer 10.9.0.2/32"), "{shown}");
    netns.block_on(|| async {
        let mut backend = KernelAddressBackend::connect("kube-ipvs0").unwrap();
        backend.ensure_link().await.unwrap();
        backend.add_address(ip("10.96.0.10")).await.unwrap();
        let node = backend.node_addresses().await.unwrap();
        let expected: BTreeSet<IpAddr> = ["10.244.1.1", "fd00:244::1", "10.9.0.1", "169.254.3.3"]
            .into_iter()
            .map(ip)
            .collect();
        assert_eq!(node, expected);
        // The dummy link lists its own address, not a peer's.
        assert_eq!(
            backend.list_addresses().await.unwrap(),
            BTreeSet::from([ip("10.96.0.10")])
        );
        // A full sync's read of the link (its dumps filtered by link in the kernel) finds
        // the same two pictures.
        let read = backend
            .read_link()
            .expect("a kernel link read")
            .await
            .unwrap();
        assert_eq!(read.addresses, BTreeSet::from([ip("10.96.0.10")]));
        assert_eq!(read.node_addresses, expected);
    });
}
