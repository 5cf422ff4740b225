//! The `KubeProxyConfiguration` file (`kubeproxy.config.k8s.io/v1alpha1`), as kube-proxy reads
//! it with `--config`. Its sections are flattened into dotted paths (`ipvs.syncPeriod`), the
//! names under which [`Cli`] declares the fields that set its flags; every other field is kept
//! aside and reported so the caller can warn about it.

use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_yaml::{Mapping, Value};

use crate::cli::Cli;

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
    /// The file is not valid YAML of the expected shape, or a field's value is malformed (the
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

/// A parsed `KubeProxyConfiguration`.
#[derive(Debug, Clone, Default)]
pub struct KubeProxyConfiguration {
    /// The settings the file gives; a field it leaves out, sets to `null` or to a blank string
    /// is `None` (and takes the flag or the default).
    pub values: Cli,
    /// Dotted paths of fields present in the file that ipvs-proxier does not use.
    pub ignored_fields: Vec<String>,
}

/// The sections whose fields are settings (`ipvs:` with nothing under it is an empty one).
const SECTIONS: [&str; 5] = [
    "clientConnection",
    "conntrack",
    "detectLocal",
    "iptables",
    "ipvs",
];

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
    let parse_error = |source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    };
    let file: Option<Mapping> = serde_yaml::from_str(text).map_err(parse_error)?;
    let mut fields = flatten(file.unwrap_or_default()).map_err(parse_error)?;
    let mut take = |key: &str| {
        fields
            .remove(key)
            .and_then(|(_, v)| v.as_str().map(str::to_owned))
    };
    let api_version = take("apiVersion").unwrap_or_default();
    if api_version != API_VERSION {
        return Err(ConfigError::ApiVersion {
            path: path.to_owned(),
            found: api_version,
        });
    }
    let kind = take("kind").unwrap_or_default();
    if kind != KIND {
        return Err(ConfigError::Kind {
            path: path.to_owned(),
            found: kind,
        });
    }
    // Newer files carry the sync periods at the top level; `ipvs.*` wins where it is set.
    for key in ["syncPeriod", "minSyncPeriod"] {
        if let Some((_, value)) = fields.remove(key) {
            let ipvs = format!("ipvs.{key}");
            if fields.get(&ipvs).is_none_or(|(_, v)| blank(v)) {
                fields.insert(ipvs, (key.to_owned(), value));
            }
        }
    }
    let known = cli_fields();
    let (used, ignored): (Vec<_>, Vec<_>) = fields
        .into_iter()
        .partition(|(key, _)| known.contains(&key.as_str()));
    let mut values = Cli::deserialize(de::value::MapAccessDeserializer::new(Fields {
        entries: used.into_iter(),
        value: None,
    }))
    .map_err(parse_error)?;
    // kube-proxy's defaulting leaves `ipvs.minSyncPeriod` alone: a file without one (or with
    // 0s, as kubeadm writes it) means no minimum, where a run without a file gets 1s.
    values
        .ipvs_min_sync_period
        .get_or_insert(std::time::Duration::ZERO);
    Ok(KubeProxyConfiguration {
        values,
        ignored_fields: ignored.into_iter().map(|(key, _)| key).collect(),
    })
}

/// Why a field kube-proxy users may expect to work is ignored, for the warning that lists
/// it; `None` for the rest.
pub fn ignored_field_hint(field: &str) -> Option<&'static str> {
    match field {
        "masqueradeAll" => Some(
            "kubeproxy.config.k8s.io/v1alpha1 has no top-level masqueradeAll; \
             use iptables.masqueradeAll",
        ),
        "udpIdleTimeout" | "resourceContainer" | "portRange" | "conntrack.max" => {
            Some("removed from kube-proxy; it has no effect there either")
        }
        _ => None,
    }
}

/// The field path kube-proxy's validation names for a file field (`ipvs.syncPeriod` →
/// `KubeProxyConfiguration.KubeProxyIPVSConfiguration.SyncPeriod`), for the fields
/// ipvs-proxier reads.
pub fn kube_proxy_path(field: &str) -> Option<&'static str> {
    Some(match field {
        "ipvs.syncPeriod" => "KubeProxyConfiguration.KubeProxyIPVSConfiguration.SyncPeriod",
        "ipvs.minSyncPeriod" => "KubeProxyConfiguration.KubeProxyIPVSConfiguration.MinSyncPeriod",
        "ipvs.tcpTimeout" => "KubeProxyConfiguration.KubeProxyIPVSConfiguration.TCPTimeout",
        "ipvs.tcpFinTimeout" => "KubeProxyConfiguration.KubeProxyIPVSConfiguration.TCPFinTimeout",
        "ipvs.udpTimeout" => "KubeProxyConfiguration.KubeProxyIPVSConfiguration.UDPTimeout",
        "ipvs.scheduler" => "KubeProxyConfiguration.KubeProxyIPVSConfiguration.Scheduler.Scheduler",
        "ipvs.excludeCIDRs" => "KubeProxyConfiguration.KubeProxyIPVSConfiguration.ExcludeCIDRs",
        "conntrack.maxPerCore" => {
            "KubeProxyConfiguration.KubeProxyConntrackConfiguration.MaxPerCore"
        }
        "conntrack.min" => "KubeProxyConfiguration.KubeProxyConntrackConfiguration.Min",
        "conntrack.tcpEstablishedTimeout" => {
            "KubeProxyConfiguration.KubeProxyConntrackConfiguration.TCPEstablishedTimeout"
        }
        "conntrack.tcpCloseWaitTimeout" => {
            "KubeProxyConfiguration.KubeProxyConntrackConfiguration.TCPCloseWaitTimeout"
        }
        "conntrack.udpTimeout" => {
            "KubeProxyConfiguration.KubeProxyConntrackConfiguration.UDPTimeout"
        }
        "conntrack.udpStreamTimeout" => {
            "KubeProxyConfiguration.KubeProxyConntrackConfiguration.UDPStreamTimeout"
        }
        "oomScoreAdj" => "KubeProxyConfiguration.OOMScoreAdj",
        "mode" => "KubeProxyConfiguration.Mode.ProxyMode",
        "bindAddress" => "KubeProxyConfiguration.BindAddress",
        "healthzBindAddress" => "KubeProxyConfiguration.HealthzBindAddress",
        "metricsBindAddress" => "KubeProxyConfiguration.MetricsBindAddress",
        "clusterCIDR" => "KubeProxyConfiguration.ClusterCIDR",
        "nodePortAddresses" => "KubeProxyConfiguration.NodePortAddresses",
        "detectLocalMode" => "KubeProxyConfiguration.DetectLocalMode",
        _ => return None,
    })
}

fn blank(value: &Value) -> bool {
    value.is_null() || value.as_str().is_some_and(|s| s.trim().is_empty())
}

/// The file's fields by dotted path (sections flattened), each with the name it was written
/// under (which differs for the top-level sync periods) and its value.
fn flatten(
    file: Mapping,
) -> Result<std::collections::BTreeMap<String, (String, Value)>, serde_yaml::Error> {
    let name = |key: Value| -> Result<String, serde_yaml::Error> {
        match key {
            Value::String(key) => Ok(key),
            other => Err(de::Error::custom(format!(
                "field name {other:?} is not a string"
            ))),
        }
    };
    let mut fields = std::collections::BTreeMap::new();
    for (key, value) in file {
        let key = name(key)?;
        match value {
            Value::Null if SECTIONS.contains(&key.as_str()) => {}
            Value::Mapping(section) if SECTIONS.contains(&key.as_str()) => {
                for (field, value) in section {
                    let path = format!("{key}.{}", name(field)?);
                    fields.insert(path.clone(), (path, value));
                }
            }
            _ if SECTIONS.contains(&key.as_str()) => {
                return Err(de::Error::custom(format!(
                    "field {key}: expected a mapping"
                )));
            }
            value => {
                fields.insert(key.clone(), (key, value));
            }
        }
    }
    Ok(fields)
}

/// The file fields [`Cli`] reads: the names its `Deserialize` derive declares.
fn cli_fields() -> &'static [&'static str] {
    struct Names<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Names<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only the field names are read"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            self.deserialize_any(visitor)
        }
        serde::forward_to_deserialize_any! { bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32
        f64 char str string bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = Cli::deserialize(Names(&mut fields));
    fields
}

/// Hands the file's fields to [`Cli`]'s `Deserialize`, naming the field in a value's error.
struct Fields<I> {
    entries: I,
    value: Option<(String, Value)>,
}

impl<'de, I: Iterator<Item = (String, (String, Value))>> MapAccess<'de> for Fields<I> {
    type Error = serde_yaml::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((path, written)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(written);
        seed.deserialize(path.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let (name, value) = self.value.take().unwrap_or_default();
        seed.deserialize(value)
            .map_err(|e| match kube_proxy_path(&name) {
                Some(path) => de::Error::custom(format!("field {name} ({path}): {e}")),
                None => de::Error::custom(format!("field {name}: {e}")),
            })
    }
}
