//! How a `KubeProxyConfiguration` field's value is read into a setting: the `deserialize_with`
//! functions that [`crate::cli::Cli`]'s fields name for the config file.

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use proxier_runtime::go_duration::parse_go_duration;
use serde::de;
use serde::{Deserialize, Deserializer};
use serde_yaml::Value;

/// A text field: blank means absent; otherwise parsed with `FromStr` (paths, addresses, names).
/// A number or a boolean is read as the text it was written as (`hostnameOverride: 12345`,
/// `tcpTimeout: 0`).
pub(crate) fn text<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err: Display>,
{
    let text = match Value::deserialize(d)? {
        Value::Null => None,
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        other => String::deserialize(other)
            .map(Some)
            .map_err(de::Error::custom)?,
    };
    let text = text.as_deref().map(str::trim).filter(|s| !s.is_empty());
    text.map(|s| {
        s.parse()
            .map_err(|e| de::Error::custom(format!("{s:?}: {e}")))
    })
    .transpose()
}

/// A Go duration (`30s`, `1m30s`); blank means absent. A negative one is refused as
/// kube-proxy's validation refuses it.
pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    non_negative(d, "must be greater than or equal to 0")
}

fn non_negative<'de, D: Deserializer<'de>>(
    d: D,
    negative: &str,
) -> Result<Option<Duration>, D::Error> {
    let text: Option<String> = text(d)?;
    text.map(|t| {
        if t.starts_with('-') && parse_go_duration(&t[1..]).is_ok_and(|d| !d.is_zero()) {
            return Err(de::Error::custom(format!(
                "Invalid value: {t:?}: {negative}"
            )));
        }
        parse_go_duration(&t).map_err(de::Error::custom)
    })
    .transpose()
}

/// A Go duration where 0 (or blank) means the default, as kube-proxy's defaulting treats
/// `ipvs.syncPeriod`: the file's zero is absent.
pub(crate) fn duration_zero_is_default<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    Ok(non_negative(d, "must be greater than 0")?.filter(|d| !d.is_zero()))
}

/// `clusterCIDR`: comma-separated CIDRs, one per family.
pub(crate) fn comma_cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<IpNet>>, D::Error> {
    let text: Option<String> = text(d)?;
    text.map(|t| cidr_items(t.split(','))).transpose()
}

/// `ipvs.excludeCIDRs`: a list of CIDRs.
pub(crate) fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<IpNet>>, D::Error> {
    let items = Option::<Vec<String>>::deserialize(d)?;
    items.map(|items| cidr_items(items.iter())).transpose()
}

fn cidr_items<E: de::Error>(items: impl Iterator<Item = impl AsRef<str>>) -> Result<Vec<IpNet>, E> {
    items
        .map(|s| s.as_ref().trim().to_owned())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|_| E::custom(format!("{s:?} is not a CIDR")))
        })
        .collect()
}
