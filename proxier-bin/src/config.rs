//! The `KubeProxyConfiguration` file (`kubeproxy.config.k8s.io/v1alpha1`), as kube-proxy reads
//! it with `--config`. Only the fields that matter in IPVS mode are typed; every other field is
//! kept aside and reported so the caller can warn about it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

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
    /// The file is not valid YAML of the expected shape (a malformed duration included; the
    /// message names the field, e.g. `ipvs.syncPeriod`).
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
}

/// Fields the file leaves out, sets to `null` or to an empty (or blank) string are absent.
fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.filter(|s| !s.trim().is_empty()))
}

/// A Go duration (`30s`, `1m30s`); empty means absent. The YAML parser loses track of the
/// field inside sections with unknown fields kept aside, so the error names it.
fn go_duration<'de, D: Deserializer<'de>>(d: D, field: &str) -> Result<Option<Duration>, D::Error> {
    non_empty(d)?
        .map(|text| parse_go_duration(text.trim()))
        .transpose()
        .map_err(|e| serde::de::Error::custom(format!("field {field}: {e}")))
}

macro_rules! duration_fields {
    ($($function:ident: $field:literal),* $(,)?) => {$(
        fn $function<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            go_duration(d, $field)
        }
    )*};
}

duration_fields! {
    sync_period: "syncPeriod",
    min_sync_period: "minSyncPeriod",
    ipvs_sync_period: "ipvs.syncPeriod",
    ipvs_min_sync_period: "ipvs.minSyncPeriod",
    ipvs_tcp_timeout: "ipvs.tcpTimeout",
    ipvs_tcp_fin_timeout: "ipvs.tcpFinTimeout",
    ipvs_udp_timeout: "ipvs.udpTimeout",
}

/// A section written as `null` (`ipvs:` with nothing under it) is an empty one.
fn section<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `clientConnection` of the config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClientConnection {
    /// Path to a kubeconfig file.
    #[serde(deserialize_with = "non_empty")]
    pub kubeconfig: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

/// The `detectLocal` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DetectLocal {
    /// `detectLocal.bridgeInterface`.
    #[serde(deserialize_with = "non_empty")]
    pub bridge_interface: Option<String>,
    /// `detectLocal.interfaceNamePrefix`.
    #[serde(deserialize_with = "non_empty")]
    pub interface_name_prefix: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

/// The `ipvs` section. Absent fields are `None` (and take the flag or the default).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpvsFileConfig {
    /// `ipvs.scheduler`.
    #[serde(deserialize_with = "non_empty")]
    pub scheduler: Option<String>,
    /// `ipvs.syncPeriod` (or the top-level `syncPeriod` of newer files).
    #[serde(deserialize_with = "ipvs_sync_period")]
    pub sync_period: Option<Duration>,
    /// `ipvs.minSyncPeriod` (or the top-level `minSyncPeriod` of newer files).
    #[serde(deserialize_with = "ipvs_min_sync_period")]
    pub min_sync_period: Option<Duration>,
    /// `ipvs.excludeCIDRs`.
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    /// `ipvs.strictARP`.
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    /// `ipvs.tcpTimeout`.
    #[serde(deserialize_with = "ipvs_tcp_timeout")]
    pub tcp_timeout: Option<Duration>,
    /// `ipvs.tcpFinTimeout`.
    #[serde(deserialize_with = "ipvs_tcp_fin_timeout")]
    pub tcp_fin_timeout: Option<Duration>,
    /// `ipvs.udpTimeout`.
    #[serde(deserialize_with = "ipvs_udp_timeout")]
    pub udp_timeout: Option<Duration>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
}

/// A parsed `KubeProxyConfiguration`: the fields ipvs-proxier uses, as written in the file.
/// Addresses and CIDRs stay text here; [`crate::settings`] types and validates them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    /// `bindAddress`.
    #[serde(deserialize_with = "non_empty")]
    pub bind_address: Option<String>,
    /// `healthzBindAddress` (an empty string means the default).
    pub healthz_bind_address: Option<String>,
    /// `metricsBindAddress` (an empty string means the default).
    pub metrics_bind_address: Option<String>,
    /// `clusterCIDR` (comma-separated for dual-stack).
    #[serde(rename = "clusterCIDR", deserialize_with = "non_empty")]
    pub cluster_cidr: Option<String>,
    /// `hostnameOverride`.
    #[serde(deserialize_with = "non_empty")]
    pub hostname_override: Option<String>,
    /// `mode`.
    #[serde(deserialize_with = "non_empty")]
    pub mode: Option<String>,
    /// `nodePortAddresses`.
    pub node_port_addresses: Option<Vec<String>>,
    /// `clientConnection`.
    #[serde(deserialize_with = "section")]
    pub client_connection: ClientConnection,
    /// `masqueradeAll`.
    pub masquerade_all: Option<bool>,
    /// `ipvs`.
    #[serde(deserialize_with = "section")]
    pub ipvs: IpvsFileConfig,
    #[serde(deserialize_with = "sync_period")]
    sync_period: Option<Duration>,
    #[serde(deserialize_with = "min_sync_period")]
    min_sync_period: Option<Duration>,
    /// `detectLocalMode` (`ClusterCIDR`, `NodeCIDR`, `BridgeInterface`,
    /// `InterfaceNamePrefix`).
    #[serde(deserialize_with = "non_empty")]
    pub detect_local_mode: Option<String>,
    /// `detectLocal`.
    #[serde(deserialize_with = "section")]
    pub detect_local: DetectLocal,
    /// Dotted paths of fields present in the file that ipvs-proxier does not use.
    #[serde(skip)]
    pub ignored_fields: Vec<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml::Value>,
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
    let mut config: KubeProxyConfiguration =
        serde_yaml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
    let api_version = config.api_version.clone().unwrap_or_default();
    if api_version != API_VERSION {
        return Err(ConfigError::ApiVersion {
            path: path.to_owned(),
            found: api_version,
        });
    }
    let kind = config.kind.clone().unwrap_or_default();
    if kind != KIND {
        return Err(ConfigError::Kind {
            path: path.to_owned(),
            found: kind,
        });
    }
    config.ipvs.sync_period = config.ipvs.sync_period.or(config.sync_period);
    config.ipvs.min_sync_period = config.ipvs.min_sync_period.or(config.min_sync_period);
    let sections = [
        ("", &config.other),
        ("ipvs.", &config.ipvs.other),
        ("clientConnection.", &config.client_connection.other),
        ("detectLocal.", &config.detect_local.other),
    ];
    config.ignored_fields = sections
        .iter()
        .flat_map(|(section, other)| other.keys().map(move |key| format!("{section}{key}")))
        .collect();
    Ok(config)
}
