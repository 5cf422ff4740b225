//! Tests of `proxier_bin::config`.

use ipnet::IpNet;
use ipvs_netlink::Scheduler;
use proxier_bin::config::*;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

fn parse(text: &str) -> Result<KubeProxyConfiguration, ConfigError> {
    parse_config(text, Path::new("test.yaml"))
}

fn cidr(text: &str) -> IpNet {
    text.parse().expect("CIDR")
}

const KUBEADM_LIKE: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 5
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  masqueradeAll: false
  syncPeriod: 30s
ipvs:
  excludeCIDRs:
  - 198.51.100.0/24
  minSyncPeriod: 2s
  scheduler: "wrr"
  strictARP: true
  syncPeriod: 45s
  tcpFinTimeout: 0s
  tcpTimeout: 15m
  udpTimeout: 300ms
masqueradeAll: true
metricsBindAddress: 127.0.0.1:10249
mode: ipvs
nodePortAddresses:
- 192.0.2.0/24
"#;

#[test]
fn reads_the_ipvs_relevant_fields() {
    let cfg = parse(KUBEADM_LIKE).expect("valid file");
    assert_eq!(cfg.values.bind_address, Some(Ipv4Addr::UNSPECIFIED.into()));
    assert_eq!(
        cfg.values.kubeconfig.as_deref(),
        Some(Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(cfg.values.cluster_cidr, Some(vec![cidr("10.244.0.0/16")]));
    assert_eq!(
        cfg.values.healthz_bind_address.as_deref(),
        Some("0.0.0.0:10256")
    );
    assert_eq!(
        cfg.values.metrics_bind_address.as_deref(),
        Some("127.0.0.1:10249")
    );
    assert_eq!(
        cfg.values.hostname_override, None,
        "empty string means unset"
    );
    assert_eq!(cfg.values.proxy_mode.as_deref(), Some("ipvs"));
    assert_eq!(
        cfg.values.masquerade_all,
        Some(false),
        "iptables.masqueradeAll, not the top-level field the schema does not have"
    );
    assert_eq!(
        cfg.values.nodeport_addresses,
        Some(vec!["192.0.2.0/24".to_owned()])
    );
    assert_eq!(
        cfg.values.ipvs_scheduler,
        Some(Scheduler::WeightedRoundRobin)
    );
    assert_eq!(cfg.values.ipvs_sync_period, Some(Duration::from_secs(45)));
    assert_eq!(
        cfg.values.ipvs_min_sync_period,
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        cfg.values.ipvs_exclude_cidrs,
        Some(vec![cidr("198.51.100.0/24")])
    );
    assert_eq!(cfg.values.ipvs_strict_arp, Some(true));
    assert_eq!(cfg.values.ipvs_tcp_timeout, Some(Duration::from_secs(900)));
    assert_eq!(cfg.values.ipvs_tcpfin_timeout, Some(Duration::ZERO));
    assert_eq!(
        cfg.values.ipvs_udp_timeout,
        Some(Duration::from_millis(300))
    );
}

#[test]
fn unknown_fields_are_listed_not_fatal() {
    let cfg = parse(KUBEADM_LIKE).expect("valid file");
    for field in [
        "configSyncPeriod",
        "masqueradeAll",
        "iptables.syncPeriod",
        "clientConnection.qps",
    ] {
        assert!(
            cfg.ignored_fields.iter().any(|f| f == field),
            "{field} missing from {:?}",
            cfg.ignored_fields
        );
    }
    assert!(
        !cfg.ignored_fields
            .iter()
            .any(|f| f == "ipvs" || f == "mode" || f.starts_with("conntrack"))
    );
    let hint = proxier_bin::config::ignored_field_hint("masqueradeAll").unwrap_or_default();
    assert!(hint.contains("iptables.masqueradeAll"), "{hint:?}");
    let with_typo = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nipvs:\n  shceduler: rr\n",
    )
    .expect("typo tolerated");
    assert_eq!(with_typo.ignored_fields, vec!["ipvs.shceduler".to_owned()]);
}

#[test]
fn reads_detect_local_fields() {
    let cfg = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.244.0.0/16\ndetectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n  interfaceNamePrefix: \"\"\n  futureField: 1\n",
    )
    .expect("valid");
    assert_eq!(
        cfg.values.detect_local_mode.as_deref(),
        Some("BridgeInterface")
    );
    assert_eq!(cfg.values.pod_bridge_interface.as_deref(), Some("cbr0"));
    assert_eq!(cfg.values.pod_interface_name_prefix, None);
    assert_eq!(
        cfg.ignored_fields,
        vec!["detectLocal.futureField".to_owned()]
    );
    let empty = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: \"\"\n",
    )
    .expect("valid");
    assert_eq!(
        empty.values.detect_local_mode, None,
        "empty string means unset"
    );
}

#[test]
fn top_level_sync_periods_are_a_fallback() {
    let cfg = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nsyncPeriod: 1m\nminSyncPeriod: 1s\nipvs:\n  minSyncPeriod: 5s\n",
    )
    .expect("valid");
    assert_eq!(cfg.values.ipvs_sync_period, Some(Duration::from_secs(60)));
    assert_eq!(
        cfg.values.ipvs_min_sync_period,
        Some(Duration::from_secs(5))
    );
}

#[test]
fn wrong_api_version_or_kind_is_an_error() {
    let err = parse("apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n")
        .expect_err("wrong version");
    assert!(matches!(err, ConfigError::ApiVersion { .. }), "{err}");
    let err = parse("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n")
        .expect_err("wrong kind");
    assert!(matches!(err, ConfigError::Kind { .. }), "{err}");
    let err = parse("kind: KubeProxyConfiguration\n").expect_err("missing version");
    assert!(matches!(err, ConfigError::ApiVersion { .. }), "{err}");
}

#[test]
fn bad_duration_names_the_field() {
    let err = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nipvs:\n  syncPeriod: thirty\n",
    )
    .expect_err("bad duration");
    assert!(err.to_string().contains("ipvs.syncPeriod"), "{err}");
}

#[test]
fn malformed_yaml_is_a_parse_error() {
    let err = parse("apiVersion: [unclosed\n").expect_err("bad yaml");
    assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
    let err = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeAll: sometimes\n",
    )
    .expect_err("bad bool");
    assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
}

#[test]
fn empty_sections_are_empty_not_errors() {
    let cfg = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nipvs:\nclientConnection:\ndetectLocal:\nbindAddress: \"\"\n",
    )
    .expect("valid");
    assert_eq!(cfg.values.ipvs_scheduler, None);
    assert_eq!(cfg.values.kubeconfig, None);
    assert_eq!(cfg.values.bind_address, None, "empty string means unset");
    assert!(cfg.ignored_fields.is_empty(), "{:?}", cfg.ignored_fields);
}

#[test]
fn numbers_and_booleans_in_text_fields_are_their_text() {
    let cfg = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhostnameOverride: 12345\nipvs:\n  tcpTimeout: 0\n",
    )
    .expect("valid");
    assert_eq!(cfg.values.hostname_override.as_deref(), Some("12345"));
    assert_eq!(cfg.values.ipvs_tcp_timeout, Some(Duration::ZERO));
    let err = parse(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhostnameOverride: [a]\n",
    )
    .expect_err("a list is not a name");
    assert!(err.to_string().contains("hostnameOverride"), "{err}");
}
