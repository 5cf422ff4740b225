//! The `KubeProxyConfiguration` files kubeadm generates (current and older), loaded as a
//! migrating user loads them: they must start the daemon, keep masquerade-all, the conntrack
//! and OOM settings, and list what is ignored.

use std::path::Path;
use std::time::Duration;

use ipvs_netlink::Scheduler;
use proxier_bin::cli::Cli;
use proxier_bin::config::{KubeProxyConfiguration, load_config_file};
use proxier_bin::settings::{Settings, resolve};
use proxier_core::sysctl::ConntrackSettings;

/// The fixtures, compiled in: the kernel tests run this binary in a VM where the source
/// tree is not.
const FIXTURES: [(&str, &str); 3] = [
    (
        "kubeadm-v1.20-kube-proxy.yaml",
        include_str!("../fixtures/kubeadm-v1.20-kube-proxy.yaml"),
    ),
    (
        "kubeadm-v1.31-kube-proxy-unchanged.yaml",
        include_str!("../fixtures/kubeadm-v1.31-kube-proxy-unchanged.yaml"),
    ),
    (
        "kubeadm-v1.31-kube-proxy.yaml",
        include_str!("../fixtures/kubeadm-v1.31-kube-proxy.yaml"),
    ),
];

/// Loads fixture `name` from a file, as the daemon reads `--config`.
fn fixture(name: &str) -> KubeProxyConfiguration {
    let (_, content) = FIXTURES
        .iter()
        .find(|(fixture, _)| *fixture == name)
        .unwrap_or_else(|| panic!("no fixture {name}"));
    let path = std::env::temp_dir().join(format!(
        "ipvs-proxier-fixture-{}-{:?}-{name}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, content).expect("write the fixture");
    let loaded = load_config_file(&path);
    let _ = std::fs::remove_file(&path);
    loaded.unwrap_or_else(|e| panic!("{name} must load: {e}"))
}

fn settings(file: &KubeProxyConfiguration, flags: &[&str]) -> Settings {
    let cli = Cli::try_parse_args(std::iter::once("ipvs-proxier").chain(flags.iter().copied()))
        .expect("flags");
    resolve(&cli, Some(file), "node-a").unwrap_or_else(|e| panic!("must resolve: {e}"))
}

const HOUR: u64 = 3600;

#[test]
fn kubeadm_file_as_generated_starts_with_kube_proxy_defaults() {
    let file = fixture("kubeadm-v1.31-kube-proxy-unchanged.yaml");
    let s = settings(&file, &[]);
    // Every 0s and null is kube-proxy's default after its defaulting.
    assert_eq!(s.driver.sync_period, Duration::from_secs(30));
    assert_eq!(
        s.driver.min_sync_period,
        Duration::ZERO,
        "ipvs.minSyncPeriod is not defaulted"
    );
    assert_eq!(s.planner.scheduler, Scheduler::RoundRobin);
    assert!(!s.planner.masquerade_all);
    assert_eq!(
        s.healthz_bind_address,
        Some("0.0.0.0:10256".parse().expect("addr"))
    );
    assert_eq!(
        s.metrics_bind_address,
        Some("127.0.0.1:10249".parse().expect("addr"))
    );
    assert_eq!(
        s.conntrack,
        ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established_timeout: Duration::from_secs(24 * HOUR),
            tcp_close_wait_timeout: Duration::from_secs(HOUR),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    );
    assert_eq!(s.oom_score_adj, -999);
    assert_eq!(
        s.planner.timeouts,
        proxier_core::model::IpvsTimeouts::default(),
        "0s IPVS timeouts leave the kernel's"
    );
    // The flag that is 0 in the file is still refused on the command line.
    let cli = Cli::try_parse_args(["ipvs-proxier", "--ipvs-sync-period=0s"]).expect("flags");
    let err = resolve(&cli, Some(&file), "n").expect_err("flag 0 refused");
    assert!(err.to_string().contains("--ipvs-sync-period"), "{err}");
}

#[test]
fn kubeadm_file_keeps_masquerade_all_conntrack_and_oom() {
    let file = fixture("kubeadm-v1.31-kube-proxy.yaml");
    let s = settings(&file, &[]);
    assert!(s.planner.masquerade_all, "iptables.masqueradeAll: true");
    assert_eq!(
        s.conntrack,
        ConntrackSettings {
            max_per_core: 65536,
            min: 262144,
            tcp_established_timeout: Duration::from_secs(12 * HOUR),
            tcp_close_wait_timeout: Duration::from_secs(30 * 60),
            tcp_be_liberal: true,
            udp_timeout: Duration::from_secs(30),
            udp_stream_timeout: Duration::from_secs(120),
        }
    );
    assert_eq!(s.oom_score_adj, -500);
    // Flags still win over the file.
    let s = settings(
        &file,
        &[
            "--conntrack-max-per-core=0",
            "--oom-score-adj=10",
            "--masquerade-all=false",
        ],
    );
    assert_eq!(s.conntrack.max_per_core, 0);
    assert_eq!(s.conntrack.min, 262144);
    assert_eq!(s.oom_score_adj, 10);
    assert!(!s.planner.masquerade_all);

    for field in [
        "bindAddressHardFail",
        "clientConnection.qps",
        "configSyncPeriod",
        "iptables.syncPeriod",
        "iptables.masqueradeBit",
        "logging",
        "nftables",
        "winkernel",
        "enableProfiling",
        "portRange",
    ] {
        assert!(
            file.ignored_fields.iter().any(|f| f == field),
            "{field} not reported in {:?}",
            file.ignored_fields
        );
    }
    for used in [
        "iptables.masqueradeAll",
        "conntrack.maxPerCore",
        "conntrack.tcpBeLiberal",
        "oomScoreAdj",
        "ipvs.syncPeriod",
        "mode",
    ] {
        assert!(
            !file.ignored_fields.iter().any(|f| f == used),
            "{used} reported as ignored"
        );
    }
}

#[test]
fn older_kubeadm_file_loads_and_keeps_its_zeros() {
    let file = fixture("kubeadm-v1.20-kube-proxy.yaml");
    let s = settings(&file, &[]);
    assert!(s.planner.masquerade_all);
    assert_eq!(s.driver.sync_period, Duration::from_secs(30));
    // maxPerCore 0 leaves nf_conntrack_max alone; tcpEstablishedTimeout 0s leaves the
    // kernel's; null takes the default; oomScoreAdj 0 is 0, not -999.
    assert_eq!(s.conntrack.max_per_core, 0);
    assert_eq!(s.conntrack.conntrack_max(64), None);
    assert_eq!(s.conntrack.tcp_established_timeout, Duration::ZERO);
    assert_eq!(
        s.conntrack.tcp_close_wait_timeout,
        Duration::from_secs(HOUR)
    );
    assert_eq!(s.oom_score_adj, 0);
    for field in [
        "udpIdleTimeout",
        "portRange",
        "winkernel",
        "showHiddenMetricsForVersion",
    ] {
        assert!(
            file.ignored_fields.iter().any(|f| f == field),
            "{field} not reported in {:?}",
            file.ignored_fields
        );
    }
}

#[test]
fn a_top_level_masquerade_all_is_ignored_and_reported() {
    let file = proxier_bin::config::parse_config(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmasqueradeAll: true\n",
        Path::new("t.yaml"),
    )
    .expect("loads");
    assert_eq!(file.ignored_fields, vec!["masqueradeAll".to_owned()]);
    assert!(!settings(&file, &[]).planner.masquerade_all);
}

#[test]
fn without_a_file_the_flags_defaults_are_kube_proxys() {
    let s = resolve(
        &Cli::try_parse_args(["ipvs-proxier"]).expect("flags"),
        None,
        "n",
    )
    .expect("resolves");
    assert_eq!(s.conntrack.max_per_core, 32768);
    assert_eq!(s.conntrack.min, 131072);
    assert_eq!(s.oom_score_adj, -999);
    assert_eq!(s.driver.min_sync_period, Duration::from_secs(1));
    let s = resolve(
        &Cli::try_parse_args([
            "ipvs-proxier",
            "--conntrack-tcp-timeout-established=2h",
            "--conntrack-tcp-timeout-close-wait=0s",
            "--conntrack-udp-timeout=1m",
            "--conntrack-udp-timeout-stream=3m",
            "--conntrack-tcp-be-liberal",
            "--conntrack-min=10",
        ])
        .expect("flags"),
        None,
        "n",
    )
    .expect("resolves");
    assert_eq!(
        s.conntrack.tcp_established_timeout,
        Duration::from_secs(2 * HOUR)
    );
    assert_eq!(s.conntrack.tcp_close_wait_timeout, Duration::ZERO);
    assert_eq!(s.conntrack.udp_timeout, Duration::from_secs(60));
    assert_eq!(s.conntrack.udp_stream_timeout, Duration::from_secs(180));
    assert!(s.conntrack.tcp_be_liberal);
    assert_eq!(s.conntrack.min, 10);
}
