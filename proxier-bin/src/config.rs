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
