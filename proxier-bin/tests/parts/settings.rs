//! Tests of `proxier_bin::settings`.

use ipnet::IpNet;
use ipvs_netlink::Scheduler;
use proxier_bin::cli::{Cli, OutputFormat};
use proxier_bin::config::KubeProxyConfiguration;
use proxier_core::model::config::{DetectLocal, InterfaceName};
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use proxier_bin::config::parse_config;
use proxier_bin::settings::*;

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_args(std::iter::once("ipvs-proxier").chain(args.iter().copied()))
        .expect("flags parse")
}

fn file(text: &str) -> KubeProxyConfiguration {
    parse_config(
        &format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{text}"
        ),
        Path::new("t.yaml"),
    )
    .expect("config parses")
}

#[test]
fn defaults_match_kube_proxy() {
    let s = resolve(&cli(&[]), None, "Node-A").expect("valid");
    assert_eq!(s.hostname, "node-a");
    assert_eq!(
        s.healthz_bind_address,
        Some("0.0.0.0:10256".parse().expect("addr"))
    );
    assert_eq!(
        s.metrics_bind_address,
        Some("127.0.0.1:10249".parse().expect("addr"))
    );
    assert_eq!(s.driver.sync_period, Duration::from_secs(30));
    assert_eq!(s.driver.min_sync_period, Duration::from_secs(1));
    assert_eq!(s.planner.scheduler, Scheduler::RoundRobin);
    assert_eq!(s.dummy_interface, "kube-ipvs0");
    assert_eq!(s.planner.node_port_addresses, NodePortAddresses::All);
    assert_eq!(s.run_mode, RunMode::Daemon);
    assert_eq!(
        s.source,
        SourceSettings::Kube {
            kubeconfig: None,
            master: None
        }
    );
    assert_eq!(s.health_timeout(), Duration::from_secs(60));
}

#[test]
fn dry_run_is_once_unless_watching() {
    let s = resolve(&cli(&["--dry-run"]), None, "n").expect("valid");
    assert_eq!((s.dry_run, s.run_mode), (true, RunMode::Once));
    assert_eq!(s.output, OutputFormat::Table);
    let s = resolve(&cli(&["--dry-run", "--once"]), None, "n").expect("valid");
    assert_eq!(s.run_mode, RunMode::Once);
    let s = resolve(&cli(&["--dry-run", "--watch", "--output=json"]), None, "n").expect("valid");
    assert_eq!(
        (s.run_mode, s.output),
        (RunMode::Daemon, OutputFormat::Json)
    );
    let s = resolve(&cli(&["--dry-run", "-o", "yaml"]), None, "n").expect("valid");
    assert_eq!(s.output, OutputFormat::Yaml);
    for args in [
        &["--watch"][..],
        &["--dry-run", "--watch", "--once"],
        &["--output=json"],
    ] {
        let err = resolve(&cli(args), None, "n").expect_err(&format!("{args:?}"));
        assert_eq!(err.exit_code(), 2);
    }
}

#[test]
fn detect_local_mode_from_flags_and_file() {
    let iface = |s: &str| InterfaceName::new(s).expect("name");
    let default = resolve(&cli(&["--cluster-cidr=10.244.0.0/16"]), None, "n").expect("valid");
    assert_eq!(default.planner.detect_local, DetectLocal::ClusterCidr);

    let node = resolve(&cli(&["--detect-local-mode=NodeCIDR"]), None, "n").expect("valid");
    assert_eq!(node.planner.detect_local, DetectLocal::NodeCidr);

    let bridge = resolve(
        &cli(&[
            "--detect-local-mode=BridgeInterface",
            "--pod-bridge-interface=cbr0",
        ]),
        None,
        "n",
    )
    .expect("valid");
    assert_eq!(
        bridge.planner.detect_local,
        DetectLocal::BridgeInterface(iface("cbr0"))
    );

    let from_file = file(
        "detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  bridgeInterface: cbr0\n  interfaceNamePrefix: veth\n",
    );
    let s = resolve(&cli(&[]), Some(&from_file), "n").expect("valid");
    assert_eq!(
        s.planner.detect_local,
        DetectLocal::InterfaceNamePrefix(iface("veth"))
    );
    // Flags win over the file, for the mode and for its interface.
    let s = resolve(
        &cli(&[
            "--detect-local-mode=BridgeInterface",
            "--pod-bridge-interface=br0",
        ]),
        Some(&from_file),
        "n",
    )
    .expect("valid");
    assert_eq!(
        s.planner.detect_local,
        DetectLocal::BridgeInterface(iface("br0"))
    );
    let s = resolve(
        &cli(&["--detect-local-mode=BridgeInterface"]),
        Some(&from_file),
        "n",
    )
    .expect("valid");
    assert_eq!(
        s.planner.detect_local,
        DetectLocal::BridgeInterface(iface("cbr0"))
    );
}

#[test]
fn detect_local_mode_errors_are_usage_errors() {
    for (args, needle) in [
        (
            &["--detect-local-mode=PodCIDR"][..],
            "is not one of ClusterCIDR",
        ),
        (
            &["--detect-local-mode=BridgeInterface"],
            "needs --pod-bridge-interface",
        ),
        (
            &["--detect-local-mode=InterfaceNamePrefix"],
            "needs --pod-interface-name-prefix",
        ),
        (
            &[
                "--detect-local-mode=BridgeInterface",
                "--pod-bridge-interface=a-name-that-is-too-long",
            ],
            "not a network interface name",
        ),
        (
            &[
                "--detect-local-mode=InterfaceNamePrefix",
                "--pod-interface-name-prefix=veth*",
            ],
            "not a network interface name",
        ),
    ] {
        let err = resolve(&cli(args), None, "n").expect_err(&format!("{args:?}"));
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains(needle), "{args:?}: {err}");
    }
    let err = resolve(&cli(&[]), Some(&file("detectLocalMode: nodecidr\n")), "n")
        .expect_err("case matters, as in kube-proxy");
    assert!(err.to_string().contains("detectLocalMode"), "{err}");
}

#[test]
fn ipv6_bind_address_moves_default_servers_to_ipv6() {
    let s = resolve(&cli(&["--bind-address=::"]), None, "n").expect("valid");
    assert_eq!(
        s.healthz_bind_address,
        Some("[::]:10256".parse().expect("addr"))
    );
    assert_eq!(
        s.metrics_bind_address,
        Some("[::1]:10249".parse().expect("addr"))
    );
}

#[test]
fn file_values_apply_and_flags_override_them() {
    let f = file(
        "hostnameOverride: from-file\niptables:\n  masqueradeAll: true\nclusterCIDR: 10.244.0.0/16\nmetricsBindAddress: 127.0.0.1:9999\nclientConnection:\n  kubeconfig: /file/kubeconfig\nipvs:\n  scheduler: lc\n  syncPeriod: 1m\n  minSyncPeriod: 10s\n  strictARP: true\n  excludeCIDRs: [198.51.100.0/24]\n",
    );
    let from_file = resolve(&cli(&[]), Some(&f), "sys").expect("valid");
    assert_eq!(from_file.hostname, "from-file");
    assert!(from_file.planner.masquerade_all);
    assert_eq!(
        from_file.planner.cluster_cidrs,
        vec!["10.244.0.0/16".parse::<IpNet>().expect("cidr")]
    );
    assert_eq!(
        from_file.metrics_bind_address,
        Some("127.0.0.1:9999".parse().expect("addr"))
    );
    assert_eq!(from_file.planner.scheduler, Scheduler::LeastConnection);
    assert_eq!(from_file.driver.sync_period, Duration::from_secs(60));
    assert_eq!(from_file.driver.min_sync_period, Duration::from_secs(10));
    assert!(from_file.planner.strict_arp);
    assert_eq!(from_file.planner.exclude_cidrs.len(), 1);
    assert_eq!(
        from_file.source,
        SourceSettings::Kube {
            kubeconfig: Some(PathBuf::from("/file/kubeconfig")),
            master: None
        }
    );

    let flags = cli(&[
        "--hostname-override=from-flag",
        "--masquerade-all=false",
        "--ipvs-scheduler=sh",
        "--ipvs-sync-period=2m",
        "--ipvs-strict-arp=false",
        "--kubeconfig=/flag/kubeconfig",
        "--metrics-bind-address=127.0.0.1",
    ]);
    let overridden = resolve(&flags, Some(&f), "sys").expect("valid");
    assert_eq!(overridden.hostname, "from-flag");
    assert!(!overridden.planner.masquerade_all);
    assert_eq!(overridden.planner.scheduler, Scheduler::SourceHashing);
    assert_eq!(overridden.driver.sync_period, Duration::from_secs(120));
    // Not given as a flag: still the file's.
    assert_eq!(overridden.driver.min_sync_period, Duration::from_secs(10));
    assert!(!overridden.planner.strict_arp);
    assert_eq!(
        overridden.metrics_bind_address,
        Some("127.0.0.1:10249".parse().expect("addr"))
    );
    assert_eq!(
        overridden.source,
        SourceSettings::Kube {
            kubeconfig: Some(PathBuf::from("/flag/kubeconfig")),
            master: None
        }
    );
}

#[test]
fn empty_flag_disables_a_server() {
    let s = resolve(&cli(&["--healthz-bind-address="]), None, "n").expect("valid");
    assert_eq!(s.healthz_bind_address, None);
    assert!(s.metrics_bind_address.is_some());
}

#[test]
fn contradictions_are_refused_with_exit_code_2() {
    let cases: &[(&[&str], Option<&str>)] = &[
        (
            &["--source-file=c.yaml", "--master=https://127.0.0.1:6443"],
            None,
        ),
        (&["--source-file=c.yaml", "--kubeconfig=k"], None),
        (
            &["--ipvs-min-sync-period=1m", "--ipvs-sync-period=30s"],
            None,
        ),
        (&["--ipvs-sync-period=0s"], None),
        (&["--proxy-mode=iptables"], None),
        (&["--cleanup", "--dry-run"], None),
        (&["--cleanup", "--source-file=c.yaml"], None),
        (&["--ipvs-sync-burst=0"], None),
        (&["--cluster-cidr=10.0.0.0/8,10.244.0.0/16"], None),
        (&["--nodeport-addresses=primary,192.0.2.0/24"], None),
        (&["--dummy-interface=much-too-long-name0"], None),
        // The kernel refuses a colon in a link name (dev_valid_name).
        (&["--dummy-interface=kube:ipvs0"], None),
        (&["--hostname-override= "], None),
        (&[], Some("mode: iptables\n")),
        (&[], Some("ipvs:\n  minSyncPeriod: 2m\n")),
    ];
    for (args, file_text) in cases {
        let f = file_text.map(file);
        let err = resolve(&cli(args), f.as_ref(), "node")
            .expect_err(&format!("{args:?} {file_text:?} should be refused"));
        assert_eq!(err.exit_code(), 2);
    }
    // A malformed value in the file is refused while the file is read (main exits 2 for any
    // config error but a failed read), naming the field.
    for (text, field) in [
        ("ipvs:\n  excludeCIDRs: [not-a-cidr]\n", "ipvs.excludeCIDRs"),
        ("bindAddress: nowhere\n", "bindAddress"),
    ] {
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{text}"
        );
        let err = parse_config(&text, Path::new("t.yaml")).expect_err(field);
        assert!(
            matches!(err, proxier_bin::config::ConfigError::Parse { .. })
                && err.to_string().contains(field),
            "{err}"
        );
    }
}

#[test]
fn min_sync_period_error_names_both_values() {
    let err = resolve(
        &cli(&["--ipvs-min-sync-period=1m", "--ipvs-sync-period=30s"]),
        None,
        "n",
    )
    .expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains("1m0s") && msg.contains("30s"), "{msg}");
}

#[test]
fn ipvs_mode_and_sources() {
    let s = resolve(
        &cli(&[
            "--proxy-mode=ipvs",
            "--source-file=/tmp/c.yaml",
            "--once",
            "--dry-run",
        ]),
        None,
        "n",
    )
    .expect("valid");
    assert_eq!(
        s.source,
        SourceSettings::File {
            path: PathBuf::from("/tmp/c.yaml")
        }
    );
    assert_eq!(s.run_mode, RunMode::Once);
    assert!(s.dry_run);
    let s = resolve(&cli(&["--cleanup"]), None, "n").expect("valid");
    assert_eq!(s.run_mode, RunMode::Cleanup);
}

#[test]
fn a_dry_run_serves_nothing_unless_asked() {
    let s = resolve(&cli(&["--dry-run"]), None, "n").expect("valid");
    assert_eq!(
        (s.metrics_bind_address, s.healthz_bind_address),
        (None, None)
    );
    let s = resolve(
        &cli(&["--dry-run", "--metrics-bind-address=127.0.0.1:9999"]),
        None,
        "n",
    )
    .expect("valid");
    assert_eq!(
        s.metrics_bind_address,
        Some("127.0.0.1:9999".parse().expect("addr"))
    );
    assert_eq!(s.healthz_bind_address, None);
    let s = resolve(&cli(&[]), None, "n").expect("valid");
    assert!(s.metrics_bind_address.is_some() && s.healthz_bind_address.is_some());
}

#[test]
fn nodeport_addresses_forms() {
    let s = resolve(&cli(&["--nodeport-addresses=primary"]), None, "n").expect("valid");
    assert_eq!(s.planner.node_port_addresses, NodePortAddresses::Primary);
    let s = resolve(
        &cli(&["--nodeport-addresses=192.0.2.0/24,2001:db8::/64"]),
        None,
        "n",
    )
    .expect("valid");
    assert!(
        matches!(s.planner.node_port_addresses, NodePortAddresses::Cidrs(ref v) if v.len() == 2)
    );
}

#[test]
fn planner_config_carries_the_settings() {
    let s = resolve(
        &cli(&[
            "--ipvs-scheduler=lc",
            "--ipvs-exclude-cidrs=198.51.100.0/24",
            "--nodeport-addresses=primary",
            "--ipvs-tcp-timeout=15m",
            "--masquerade-all",
            "--cluster-cidr=10.244.0.0/16",
        ]),
        None,
        "n",
    )
    .expect("valid");
    let c = &s.planner;
    assert_eq!(c.scheduler, Scheduler::LeastConnection);
    assert_eq!(c.exclude_cidrs.len(), 1);
    assert_eq!(
        c.node_port_addresses,
        proxier_core::model::NodePortAddresses::Primary
    );
    assert_eq!(c.timeouts.tcp, Some(Duration::from_secs(900)));
    assert_eq!(c.timeouts.udp, None, "0 leaves the kernel's value");
    assert!(c.masquerade_all);
    assert_eq!(c.cluster_cidrs.len(), 1);
}

#[test]
fn bind_address_forms() {
    assert_eq!(
        parse_bind_address("x", "127.0.0.1", 10256),
        Ok("127.0.0.1:10256".parse().expect("addr"))
    );
    assert_eq!(
        parse_bind_address("x", "[::1]:80", 1),
        Ok("[::1]:80".parse().expect("addr"))
    );
    assert_eq!(
        parse_bind_address("x", "::1", 5),
        Ok("[::1]:5".parse().expect("addr"))
    );
    assert!(parse_bind_address("x", "localhost:80", 1).is_err());
}

#[test]
fn bind_service_cidrs_needs_strict_arp_and_reaches_the_engine() {
    // Without strict ARP the node would answer ARP for every address of the range.
    let error = resolve(&cli(&["--bind-service-cidrs=10.96.0.0/12"]), None, "n")
        .expect_err("refused without strict ARP");
    assert!(error.to_string().contains("--ipvs-strict-arp"), "{error}");

    let s = resolve(
        &cli(&[
            "--bind-service-cidrs=10.96.0.5/12,fd00:96::/108",
            "--ipvs-strict-arp",
        ]),
        None,
        "n",
    )
    .expect("valid");
    let nets: Vec<IpNet> = vec![
        "10.96.0.0/12".parse().expect("net"),
        "fd00:96::/108".parse().expect("net"),
    ];
    assert_eq!(s.planner.service_cidr_routes, nets);
    assert!(s.planner.strict_arp);
    // The pod network given by mistake would blackhole the pods.
    let error = resolve(
        &cli(&[
            "--bind-service-cidrs=10.0.0.0/8",
            "--ipvs-strict-arp",
            "--cluster-cidr=10.244.0.0/16",
        ]),
        None,
        "n",
    )
    .expect_err("overlaps the pods");
    assert!(error.to_string().contains("10.244.0.0/16"), "{error}");
    // Off by default.
    let s = resolve(&cli(&[]), None, "n").expect("valid");
    assert!(s.planner.service_cidr_routes.is_empty());
    assert!(!s.follow_service_cidrs);
}

#[test]
fn bind_service_cidrs_auto_follows_service_cidr_objects_with_strict_arp_and_the_api_server() {
    let s = resolve(
        &cli(&["--bind-service-cidrs=auto", "--ipvs-strict-arp"]),
        None,
        "n",
    )
    .expect("valid");
    assert!(s.follow_service_cidrs);
    assert!(s.planner.service_cidr_routes.is_empty());
    // With listed ranges beside it: both.
    let s = resolve(
        &cli(&[
            "--bind-service-cidrs=auto,10.96.0.0/12",
            "--ipvs-strict-arp",
        ]),
        None,
        "n",
    )
    .expect("valid");
    assert!(s.follow_service_cidrs);
    let nets: Vec<IpNet> = vec!["10.96.0.0/12".parse().expect("net")];
    assert_eq!(s.planner.service_cidr_routes, nets);

    let error = resolve(&cli(&["--bind-service-cidrs=auto"]), None, "n")
        .expect_err("refused without strict ARP");
    assert!(error.to_string().contains("--ipvs-strict-arp"), "{error}");
    let error = resolve(
        &cli(&[
            "--bind-service-cidrs=auto",
            "--ipvs-strict-arp",
            "--source-file=/tmp/cluster.yaml",
        ]),
        None,
        "n",
    )
    .expect_err("the file has no ServiceCIDRs to follow");
    assert!(error.to_string().contains("--source-file"), "{error}");
    let error = Cli::try_parse_args(["ipvs-proxier", "--bind-service-cidrs=automatic"])
        .expect_err("neither auto nor a CIDR");
    assert!(
        error.to_string().contains("neither `auto` nor a CIDR"),
        "{error}"
    );
}

#[test]
fn the_api_content_type_picks_protobuf_lists_from_the_flag_or_the_file() {
    let protobuf = "application/vnd.kubernetes.protobuf";
    // Unset, protobuf: kube-proxy's default.
    assert!(
        resolve(&cli(&[]), None, "n")
            .expect("valid")
            .api_protobuf_lists
    );
    let s = resolve(
        &cli(&[&format!("--kube-api-content-type={protobuf}")]),
        None,
        "n",
    )
    .expect("valid");
    assert!(s.api_protobuf_lists);
    let in_file = file(&format!("clientConnection:\n  contentType: {protobuf}\n"));
    assert!(
        resolve(&cli(&[]), Some(&in_file), "n")
            .expect("valid")
            .api_protobuf_lists
    );
    // The flag wins over the file; kubeadm's blank value is the default (protobuf).
    let s = resolve(
        &cli(&["--kube-api-content-type=application/json"]),
        Some(&in_file),
        "n",
    )
    .expect("valid");
    assert!(!s.api_protobuf_lists);
    let blank = file("clientConnection:\n  contentType: \"\"\n");
    assert!(
        resolve(&cli(&[]), Some(&blank), "n")
            .expect("valid")
            .api_protobuf_lists
    );
    let json = file("clientConnection:\n  contentType: application/json\n");
    assert!(
        !resolve(&cli(&[]), Some(&json), "n")
            .expect("valid")
            .api_protobuf_lists
    );

    let err = resolve(
        &cli(&[]),
        Some(&file("clientConnection:\n  contentType: text/yaml\n")),
        "n",
    )
    .expect_err("not a list encoding");
    let message = err.to_string();
    assert!(
        message.contains("clientConnection.contentType") && message.contains("text/yaml"),
        "{message}"
    );
}
