//! The `KubeProxyConfiguration` file (`kubeproxy.config.k8s.io/v1alpha1`), as kube-proxy reads
//! it with `--config`. Only the fields that matter in IPVS mode are typed; every other field is
//! kept aside and reported so the caller can warn about it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::go_duration::parse_go_duration;

/// The apiVersion this file format must carry.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The kind this file format must carry.
pub const KIND: &str = "KubeProxyConfiguration";

/// Why a config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not valid YAML of the expected shape.
    #[error("parsing config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the YAML parser said.
        source: serde_yaml::Error,
    },
    /// apiVersion is missing or not kubeproxy.config.k8s.io/v1alpha1.
    #[error("config file {path}: apiVersion is {found:?}, expected {API_VERSION:?}")]
    ApiVersion {
        /// The file.
        path: PathBuf,
        /// The apiVersion it carries.
        found: String,
    },
    /// kind is missing or not KubeProxyConfiguration.
    #[error("config file {path}: kind is {found:?}, expected {KIND:?}")]
    Kind {
        /// The file.
        path: PathBuf,
        /// The kind it carries.
        found: String,
    },
    /// A duration field does not hold a Go duration.
    #[error("config file {path}: field {field}: {source}")]
    Duration {
        /// The file.
        path: PathBuf,
        /// The field, as a dotted path (e.g. `ipvs.syncPeriod`).
        field: &'static str,
        /// What is wrong with the value.
        source: crate::go_duration::DurationParseError,
    },
}

/// `clientConnection` of the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientConnection {
    /// Path to a kubeconfig file.
    #[serde(default)]
    pub kubeconfig: Option<String>,
    /// Fields we do not use.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_yaml::Value>,
}

/// `ipvs` of the config file, with durations still as text.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawIpvs {
    #[serde(default)]
    scheduler: Option<String>,
    #[serde(default)]
    sync_period: Option<String>,
    #[serde(default)]
    min_sync_period: Option<String>,
    #[serde(default, rename = "excludeCIDRs")]
    exclude_cidrs: Option<Vec<String>>,
    #[serde(default, rename = "strictARP")]
    strict_arp: Option<bool>,
    #[serde(default)]
    tcp_timeout: Option<String>,
    #[serde(default)]
    tcp_fin_timeout: Option<String>,
    #[serde(default)]
    udp_timeout: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    bind_address: Option<String>,
    #[serde(default)]
    healthz_bind_address: Option<String>,
    #[serde(default)]
    metrics_bind_address: Option<String>,
    #[serde(default, rename = "clusterCIDR")]
    cluster_cidr: Option<String>,
    #[serde(default)]
    hostname_override: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    node_port_addresses: Option<Vec<String>>,
    #[serde(default)]
    client_connection: Option<ClientConnection>,
    #[serde(default)]
    ipvs: Option<RawIpvs>,
    #[serde(default)]
    masquerade_all: Option<bool>,
    #[serde(default)]
    sync_period: Option<String>,
    #[serde(default)]
    min_sync_period: Option<String>,
    #[serde(default)]
    detect_local_mode: Option<String>,
    #[serde(default)]
    detect_local: Option<RawDetectLocal>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

/// The `detectLocal` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDetectLocal {
    #[serde(default)]
    bridge_interface: Option<String>,
    #[serde(default)]
    interface_name_prefix: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

/// The `ipvs` section, typed. Absent fields are `None` (and take the flag or the default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IpvsFileConfig {
    /// `ipvs.scheduler` (empty means the default).
    pub scheduler: Option<String>,
    /// `ipvs.syncPeriod` (or the top-level `syncPeriod` of newer files).
    pub sync_period: Option<Duration>,
    /// `ipvs.minSyncPeriod` (or the top-level `minSyncPeriod` of newer files).
    pub min_sync_period: Option<Duration>,
    /// `ipvs.excludeCIDRs`.
    pub exclude_cidrs: Option<Vec<String>>,
    /// `ipvs.strictARP`.
    pub strict_arp: Option<bool>,
    /// `ipvs.tcpTimeout`.
    pub tcp_timeout: Option<Duration>,
    /// `ipvs.tcpFinTimeout`.
    pub tcp_fin_timeout: Option<Duration>,
    /// `ipvs.udpTimeout`.
    pub udp_timeout: Option<Duration>,
}

/// A parsed `KubeProxyConfiguration`: the fields ipvs-proxier uses, as written in the file.
/// Addresses and CIDRs stay text here; [`crate::settings`] types and validates them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeProxyConfiguration {
    /// `bindAddress`.
    pub bind_address: Option<String>,
    /// `healthzBindAddress`.
    pub healthz_bind_address: Option<String>,
    /// `metricsBindAddress`.
    pub metrics_bind_address: Option<String>,
    /// `clusterCIDR` (comma-separated for dual-stack).
    pub cluster_cidr: Option<String>,
    /// `hostnameOverride`.
    pub hostname_override: Option<String>,
    /// `mode`.
    pub mode: Option<String>,
    /// `nodePortAddresses`.
    pub node_port_addresses: Option<Vec<String>>,
    /// `clientConnection.kubeconfig`.
    pub kubeconfig: Option<String>,
    /// `masqueradeAll`.
    pub masquerade_all: Option<bool>,
    /// `ipvs`.
    pub ipvs: IpvsFileConfig,
    /// `detectLocalMode` (`ClusterCIDR`, `NodeCIDR`, `BridgeInterface`,
    /// `InterfaceNamePrefix`).
    pub detect_local_mode: Option<String>,
    /// `detectLocal.bridgeInterface`.
    pub detect_local_bridge_interface: Option<String>,
    /// `detectLocal.interfaceNamePrefix`.
    pub detect_local_interface_name_prefix: Option<String>,
    /// Dotted paths of fields present in the file that ipvs-proxier does not use.
    pub ignored_fields: Vec<String>,
}

/// Reads and parses a config file.
pub fn load_config_file(path: &Path) -> Result<KubeProxyConfiguration, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_config(&text, path)
}

/// Parses the text of a config file; `path` is only used in error messages.
pub fn parse_config(text: &str, path: &Path) -> Result<KubeProxyConfiguration, ConfigError> {
    let raw: RawConfig = serde_yaml::from_str(text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let api_version = raw.api_version.clone().unwrap_or_default();
    if api_version != API_VERSION {
        return Err(ConfigError::ApiVersion {
            path: path.to_owned(),
            found: api_version,
        });
    }
    let kind = raw.kind.clone().unwrap_or_default();
    if kind != KIND {
        return Err(ConfigError::Kind {
            path: path.to_owned(),
            found: kind,
        });
    }

    let duration =
        |field: &'static str, value: &Option<String>| -> Result<Option<Duration>, ConfigError> {
            match value.as_deref().map(str::trim) {
                None | Some("") => Ok(None),
                Some(text) => {
                    parse_go_duration(text)
                        .map(Some)
                        .map_err(|source| ConfigError::Duration {
                            path: path.to_owned(),
                            field,
                            source,
                        })
                }
            }
        };

    let mut ignored_fields: Vec<String> = raw.other.keys().cloned().collect();
    let ipvs_raw = raw.ipvs.clone().unwrap_or_default();
    ignored_fields.extend(ipvs_raw.other.keys().map(|k| format!("ipvs.{k}")));
    let client = raw.client_connection.clone().unwrap_or_default();
    ignored_fields.extend(client.other.keys().map(|k| format!("clientConnection.{k}")));
    let detect_local = raw.detect_local.clone().unwrap_or_default();
    ignored_fields.extend(
        detect_local
            .other
            .keys()
            .map(|k| format!("detectLocal.{k}")),
    );

    let top_sync = duration("syncPeriod", &raw.sync_period)?;
    let top_min_sync = duration("minSyncPeriod", &raw.min_sync_period)?;
    let ipvs = IpvsFileConfig {
        scheduler: ipvs_raw.scheduler.filter(|s| !s.is_empty()),
        sync_period: duration("ipvs.syncPeriod", &ipvs_raw.sync_period)?.or(top_sync),
        min_sync_period: duration("ipvs.minSyncPeriod", &ipvs_raw.min_sync_period)?
            .or(top_min_sync),
        exclude_cidrs: ipvs_raw.exclude_cidrs,
        strict_arp: ipvs_raw.strict_arp,
        tcp_timeout: duration("ipvs.tcpTimeout", &ipvs_raw.tcp_timeout)?,
        tcp_fin_timeout: duration("ipvs.tcpFinTimeout", &ipvs_raw.tcp_fin_timeout)?,
        udp_timeout: duration("ipvs.udpTimeout", &ipvs_raw.udp_timeout)?,
    };

    let non_empty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    Ok(KubeProxyConfiguration {
        bind_address: non_empty(raw.bind_address),
        healthz_bind_address: raw.healthz_bind_address,
        metrics_bind_address: raw.metrics_bind_address,
        cluster_cidr: non_empty(raw.cluster_cidr),
        hostname_override: non_empty(raw.hostname_override),
        mode: non_empty(raw.mode),
        node_port_addresses: raw.node_port_addresses,
        kubeconfig: non_empty(client.kubeconfig),
        masquerade_all: raw.masquerade_all,
        ipvs,
        detect_local_mode: non_empty(raw.detect_local_mode),
        detect_local_bridge_interface: non_empty(detect_local.bridge_interface),
        detect_local_interface_name_prefix: non_empty(detect_local.interface_name_prefix),
        ignored_fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<KubeProxyConfiguration, ConfigError> {
        parse_config(text, Path::new("test.yaml"))
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
        assert_eq!(cfg.bind_address.as_deref(), Some("0.0.0.0"));
        assert_eq!(
            cfg.kubeconfig.as_deref(),
            Some("/var/lib/kube-proxy/kubeconfig.conf")
        );
        assert_eq!(cfg.cluster_cidr.as_deref(), Some("10.244.0.0/16"));
        assert_eq!(cfg.healthz_bind_address.as_deref(), Some("0.0.0.0:10256"));
        assert_eq!(cfg.metrics_bind_address.as_deref(), Some("127.0.0.1:10249"));
        assert_eq!(cfg.hostname_override, None, "empty string means unset");
        assert_eq!(cfg.mode.as_deref(), Some("ipvs"));
        assert_eq!(cfg.masquerade_all, Some(true));
        assert_eq!(
            cfg.node_port_addresses,
            Some(vec!["192.0.2.0/24".to_owned()])
        );
        assert_eq!(cfg.ipvs.scheduler.as_deref(), Some("wrr"));
        assert_eq!(cfg.ipvs.sync_period, Some(Duration::from_secs(45)));
        assert_eq!(cfg.ipvs.min_sync_period, Some(Duration::from_secs(2)));
        assert_eq!(
            cfg.ipvs.exclude_cidrs,
            Some(vec!["198.51.100.0/24".to_owned()])
        );
        assert_eq!(cfg.ipvs.strict_arp, Some(true));
        assert_eq!(cfg.ipvs.tcp_timeout, Some(Duration::from_secs(900)));
        assert_eq!(cfg.ipvs.tcp_fin_timeout, Some(Duration::ZERO));
        assert_eq!(cfg.ipvs.udp_timeout, Some(Duration::from_millis(300)));
    }

    #[test]
    fn unknown_fields_are_listed_not_fatal() {
        let cfg = parse(KUBEADM_LIKE).expect("valid file");
        for field in [
            "configSyncPeriod",
            "conntrack",
            "iptables",
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
                .any(|f| f == "ipvs" || f == "mode")
        );
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
        assert_eq!(cfg.detect_local_mode.as_deref(), Some("BridgeInterface"));
        assert_eq!(cfg.detect_local_bridge_interface.as_deref(), Some("cbr0"));
        assert_eq!(cfg.detect_local_interface_name_prefix, None);
        assert_eq!(
            cfg.ignored_fields,
            vec!["detectLocal.futureField".to_owned()]
        );
        let empty = parse(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: \"\"\n",
        )
        .expect("valid");
        assert_eq!(empty.detect_local_mode, None, "empty string means unset");
    }

    #[test]
    fn top_level_sync_periods_are_a_fallback() {
        let cfg = parse(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nsyncPeriod: 1m\nminSyncPeriod: 1s\nipvs:\n  minSyncPeriod: 5s\n",
        )
        .expect("valid");
        assert_eq!(cfg.ipvs.sync_period, Some(Duration::from_secs(60)));
        assert_eq!(cfg.ipvs.min_sync_period, Some(Duration::from_secs(5)));
    }

    #[test]
    fn wrong_api_version_or_kind_is_an_error() {
        let err =
            parse("apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n")
                .expect_err("wrong version");
        assert!(matches!(err, ConfigError::ApiVersion { .. }), "{err}");
        let err =
            parse("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n")
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
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmasqueradeAll: sometimes\n",
        )
        .expect_err("bad bool");
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
    }
}
