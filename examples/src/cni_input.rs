//! What `cni-proxier` (src/bin/cni-proxier.rs) has of its own, apart from embedding
//! proxier-core: its command line, its input (a small JSON description of Services, not
//! Kubernetes YAML) parsed, validated and turned into proxier-core's model and [`Change`]s,
//! and the `ipvsadm -Sn`-style printing of a plan for `--dry-run`. A CNI has its own equivalent.
//!
//! ```json
//! { "services": [ {
//!     "name": "default/web",                 // "namespace/name" ("name" alone: default/)
//!     "vips": ["10.96.0.10"],                 // at most one per address family
//!     "ports": [ { "name": "http", "port": 80, "protocol": "tcp", "target_port": 8080 } ],
//!     "session_affinity_seconds": 600,        // optional: ClientIP affinity
//!     "traffic_policy": "local",              // optional: "cluster" (default) or "local"
//!     "endpoints": [ { "address": "10.244.1.2", "node": "node-a" } ]
//! } ] }
//! ```
//! `protocol` is `tcp`, `udp` or `sctp` (default `tcp`); `target_port` defaults to `port`;
//! `name` of a port may be omitted when a Service has one port. Each port of a Service goes to
//! every endpoint of its family. The whole file is rejected when any part of it is invalid.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail, ensure};
use proxier_core::backend::DEFAULT_DUMMY_LINK;
use proxier_core::model::{
    AddressFamily, Endpoint, EndpointPort, EndpointSlice, Protocol, Service, ServiceName,
    ServicePortName, ServicePortSpec, SessionAffinity, SliceKey, TrafficPolicy,
};
use proxier_core::{Change, Desired};
use serde::Deserialize;

/// The whole input file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicesFile {
    /// The Services.
    pub services: Vec<ServiceEntry>,
}

/// One Service.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceEntry {
    /// `namespace/name`, or `name` in namespace `default`.
    pub name: String,
    /// Virtual IPs (at most one per address family).
    pub vips: Vec<IpAddr>,
    /// Ports.
    pub ports: Vec<PortEntry>,
    /// ClientIP session affinity timeout; absent: no affinity.
    #[serde(default)]
    pub session_affinity_seconds: Option<u32>,
    /// Which endpoints serve traffic on this node.
    #[serde(default)]
    pub traffic_policy: Policy,
    /// Backends.
    #[serde(default)]
    pub endpoints: Vec<EndpointEntry>,
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortEntry {
    /// Port name (may be empty for a single-port Service).
    #[serde(default)]
    pub name: String,
    /// The port on the VIPs.
    pub port: u16,
    /// Transport protocol.
    #[serde(default)]
    pub protocol: ProtocolName,
    /// The port on the endpoints; absent: the same as `port`.
    #[serde(default)]
    pub target_port: Option<u16>,
}

/// One backend.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointEntry {
    /// Its address.
    pub address: IpAddr,
    /// The node it runs on.
    #[serde(default)]
    pub node: Option<String>,
}

/// `tcp`, `udp` or `sctp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProtocolName {
    /// TCP (the default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl From<ProtocolName> for Protocol {
    fn from(name: ProtocolName) -> Protocol {
        match name {
            ProtocolName::Tcp => Protocol::Tcp,
            ProtocolName::Udp => Protocol::Udp,
            ProtocolName::Sctp => Protocol::Sctp,
        }
    }
}

/// `cluster` (every endpoint) or `local` (this node's endpoints, all of them if it has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Every endpoint (the default).
    #[default]
    Cluster,
    /// This node's endpoints.
    Local,
}

/// Kubernetes' upper bound for ClientIP affinity (one day).
pub const MAX_AFFINITY_SECONDS: u32 = 86_400;

/// Parses and checks the input text (`origin` names it in errors).
pub fn parse_services(text: &str, origin: &str) -> anyhow::Result<ServicesFile> {
    let file: ServicesFile = serde_json::from_str(text)
        .with_context(|| format!("{origin}: not a valid services file"))?;
    let mut names = BTreeSet::new();
    for entry in &file.services {
        let name = entry.service_name()?;
        ensure!(
            names.insert(name.clone()),
            "{origin}: service {name} is listed twice"
        );
        entry
            .to_model()
            .with_context(|| format!("{origin}: service {name}"))?;
    }
    Ok(file)
}

/// Reads and parses the input file.
pub fn read_services(path: &Path) -> anyhow::Result<ServicesFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading services file {}", path.display()))?;
    parse_services(&text, &path.display().to_string())
}

impl ServiceEntry {
    /// The Service's name (`name` alone is in namespace `default`).
    pub fn service_name(&self) -> anyhow::Result<ServiceName> {
        let (namespace, name) = self.name.split_once('/').unwrap_or(("default", &self.name));
        ensure!(
            !namespace.is_empty() && !name.is_empty() && !name.contains('/'),
            "service name {:?} is not \"namespace/name\" or \"name\"",
            self.name
        );
        Ok(ServiceName::new(namespace, name))
    }

    /// The Service and its one EndpointSlice in proxier-core's model.
    pub fn to_model(&self) -> anyhow::Result<(Service, EndpointSlice)> {
        let name = self.service_name()?;
        ensure!(!self.vips.is_empty(), "no VIP");
        for family in AddressFamily::ALL {
            let count = self
                .vips
                .iter()
                .filter(|ip| AddressFamily::of(**ip) == family)
                .count();
            ensure!(count <= 1, "more than one {family} VIP");
        }
        ensure!(!self.ports.is_empty(), "no port");
        if self.ports.len() > 1 && self.ports.iter().any(|p| p.name.is_empty()) {
            bail!("a service with several ports must name each of them");
        }
        let mut seen = BTreeSet::new();
        for port in &self.ports {
            ensure!(port.port != 0, "port 0");
            ensure!(port.target_port != Some(0), "target port 0");
            ensure!(
                seen.insert((port.name.as_str(), Protocol::from(port.protocol))),
                "two ports named {:?} with protocol {}",
                port.name,
                Protocol::from(port.protocol)
            );
        }

        let mut service = Service::new(
            name.clone(),
            self.vips.clone(),
            self.ports
                .iter()
                .map(|p| ServicePortSpec {
                    name: p.name.clone(),
                    port: p.port,
                    protocol: p.protocol.into(),
                    node_port: None,
                })
                .collect(),
        );
        if let Some(seconds) = self.session_affinity_seconds {
            ensure!(
                (1..=MAX_AFFINITY_SECONDS).contains(&seconds),
                "session_affinity_seconds must be 1..={MAX_AFFINITY_SECONDS}, not {seconds}"
            );
            service.session_affinity = SessionAffinity::ClientIp {
                timeout_seconds: seconds,
            };
        }
        // A ClusterIP-only Service: the internal policy is the one that applies.
        service.internal_traffic_policy = match self.traffic_policy {
            Policy::Cluster => TrafficPolicy::Cluster,
            Policy::Local => TrafficPolicy::Local,
        };

        let slice = EndpointSlice {
            key: slice_key(&name),
            service: name,
            ports: self
                .ports
                .iter()
                .map(|p| EndpointPort {
                    name: p.name.clone(),
                    port: p.target_port.unwrap_or(p.port),
                    protocol: p.protocol.into(),
                })
                .collect(),
            endpoints: self
                .endpoints
                .iter()
                .map(|e| Endpoint {
                    node_name: e.node.as_deref().map(Arc::from),
                    ..Endpoint::ready(e.address)
                })
                .collect(),
            warnings: Vec::new(),
        };
        Ok((service, slice))
    }
}

/// The one EndpointSlice each Service of the file gets.
pub fn slice_key(service: &ServiceName) -> SliceKey {
    SliceKey::new(&service.namespace, format!("{}-cni", service.name))
}

/// The changes that take a proxier fed `old` to `new`: every Service of `new` is upserted (an
/// unchanged one changes nothing, so re-sending everything is cheap), the ones gone are deleted.
pub fn changes(old: &ServicesFile, new: &ServicesFile) -> anyhow::Result<Vec<Change>> {
    let mut out = Vec::new();
    let mut kept = BTreeSet::new();
    for entry in &new.services {
        let (service, slice) = entry
            .to_model()
            .with_context(|| format!("service {}", entry.name))?;
        kept.insert(service.name.clone());
        out.push(Change::UpsertService(service));
        out.push(Change::UpsertSlice(slice));
    }
    for entry in &old.services {
        let name = entry.service_name()?;
        if !kept.contains(&name) {
            out.push(Change::DeleteSlice(slice_key(&name)));
            out.push(Change::DeleteService(name));
        }
    }
    Ok(out)
}

/// The Service ports of the Services that differ between `old` and `new` (added, edited or
/// gone): what a sync after [`changes`] re-plans.
pub fn changed_ports(old: &ServicesFile, new: &ServicesFile) -> BTreeSet<ServicePortName> {
    let ports = |entry: &ServiceEntry| -> Vec<ServicePortName> {
        let Ok(name) = entry.service_name() else {
            return Vec::new();
        };
        entry
            .ports
            .iter()
            .map(|p| name.port(&p.name, p.protocol.into()))
            .collect()
    };
    let differs = |a: &ServicesFile, b: &ServicesFile| -> Vec<ServicePortName> {
        let b: BTreeMap<&str, &ServiceEntry> =
            b.services.iter().map(|e| (e.name.as_str(), e)).collect();
        a.services
            .iter()
            .filter(|entry| b.get(entry.name.as_str()) != Some(entry))
            .flat_map(ports)
            .collect()
    };
    differs(old, new)
        .into_iter()
        .chain(differs(new, old))
        .collect()
}

/// The services file as last read, to notice and apply its edits.
#[derive(Debug)]
pub struct InputFile {
    path: PathBuf,
    /// Modification time and size when last read.
    version: (SystemTime, u64),
    current: ServicesFile,
}

/// What an edit of the services file changed.
#[derive(Debug)]
pub struct Edit {
    /// The changes to apply (every Service of the new file, deletes for the ones gone).
    pub changes: Vec<Change>,
    /// The Service ports of the Services that were added, edited or removed.
    pub ports: BTreeSet<ServicePortName>,
}

impl InputFile {
    /// Reads and checks the file at `path`.
    pub fn open(path: &Path) -> anyhow::Result<InputFile> {
        let version = file_version(path)?;
        let current = read_services(path)?;
        let path = path.to_owned();
        Ok(InputFile {
            path,
            version,
            current,
        })
    }

    /// The Services as last read.
    pub fn services(&self) -> &ServicesFile {
        &self.current
    }

    /// Re-reads the file if it changed (modification time or size) since it was last read:
    /// `None` if it did not, an error (and the last good Services kept) if it cannot be read
    /// or is invalid in any part.
    pub fn reread(&mut self) -> anyhow::Result<Option<Edit>> {
        let version = file_version(&self.path)?;
        if version == self.version {
            return Ok(None);
        }
        self.version = version;
        let next = read_services(&self.path)?;
        let edit = Edit {
            changes: changes(&self.current, &next)?,
            ports: changed_ports(&self.current, &next),
        };
        self.current = next;
        Ok(Some(edit))
    }
}

/// When the file at `path` last changed (modification time and size).
fn file_version(path: &Path) -> anyhow::Result<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let modified = meta
        .modified()
        .with_context(|| format!("modification time of {}", path.display()))?;
    Ok((modified, meta.len()))
}

/// The command line.
pub const USAGE: &str = "usage: cni-proxier [--node NAME] [--link NAME] [--drain-timeout SECONDS] \
                     [--watch [--resync SECONDS]] [--dry-run] FILE";

/// Default period of the full resync in `--watch` mode.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(30);

/// The parsed command line (see the binary's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The services file.
    pub file: PathBuf,
    /// `--node`: this node's name (default: the hostname).
    pub node: Option<String>,
    /// `--link`: the dummy link the VIPs are bound on.
    pub link: String,
    /// `--drain-timeout`.
    pub drain_timeout: Option<Duration>,
    /// `--watch`.
    pub watch: bool,
    /// `--resync` (at least 1 s).
    pub resync: Duration,
    /// `--dry-run`.
    pub dry_run: bool,
}

impl Args {
    /// This node's name: `--node`, or the kernel's hostname.
    pub fn node_name(&self) -> anyhow::Result<String> {
        match &self.node {
            Some(name) => Ok(name.clone()),
            None => Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")
                .context("reading /proc/sys/kernel/hostname (pass --node NAME)")?
                .trim()
                .to_owned()),
        }
    }

    /// Parses the arguments (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Args> {
        let mut args = args.into_iter();
        let mut file = None;
        let mut node = None;
        let mut link = DEFAULT_DUMMY_LINK.to_owned();
        let mut drain_timeout = None;
        let mut resync = DEFAULT_RESYNC;
        let (mut watch, mut dry_run) = (false, false);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--watch" => watch = true,
                "--dry-run" => dry_run = true,
                "--node" => node = Some(args.next().context("--node needs a name")?),
                "--link" => link = args.next().context("--link needs a name")?,
                "--drain-timeout" => drain_timeout = Some(seconds(&arg, args.next())?),
                "--resync" => resync = seconds(&arg, args.next())?.max(Duration::from_secs(1)),
                flag if flag.starts_with('-') => bail!("unknown flag {flag}\n{USAGE}"),
                _ if file.is_some() => bail!("more than one FILE\n{USAGE}"),
                _ => file = Some(PathBuf::from(arg)),
            }
        }
        Ok(Args {
            file: file.with_context(|| format!("no FILE given\n{USAGE}"))?,
            node,
            link,
            drain_timeout,
            watch,
            resync,
            dry_run,
        })
    }
}

/// The value of a flag taking seconds.
fn seconds(flag: &str, value: Option<String>) -> anyhow::Result<Duration> {
    let value = value.with_context(|| format!("{flag} needs seconds"))?;
    let seconds: u64 = value
        .parse()
        .with_context(|| format!("{flag} {value:?}: not a number of seconds"))?;
    Ok(Duration::from_secs(seconds))
}

/// `10.96.0.10:80` or `[fd00::10]:80`.
fn address_port(address: IpAddr, port: u16) -> String {
    match address {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// Prints the plan as `ipvsadm -Sn` would print the resulting table, and the VIPs to bind.
pub fn print_plan(desired: &Desired, link: &str) {
    let flag = |protocol: Protocol| match protocol {
        Protocol::Tcp => "-t",
        Protocol::Udp => "-u",
        Protocol::Sctp => "--sctp-service",
    };
    for (port, plan) in &desired.services {
        println!("# {port}");
        for (key, vs) in &plan.virtual_servers {
            let vip = address_port(key.address, key.port);
            let persistence = vs
                .persistence_timeout
                .map(|t| format!(" -p {t}"))
                .unwrap_or_default();
            println!(
                "-A {} {vip} -s {}{persistence}",
                flag(key.protocol),
                vs.scheduler
            );
            for (rs, real) in &vs.real_servers {
                println!(
                    "-a {} {vip} -r {rs} -m -w {}",
                    flag(key.protocol),
                    real.weight
                );
            }
        }
    }
    let vips: Vec<String> = desired
        .bound_addresses()
        .iter()
        .map(ToString::to_string)
        .collect();
    println!("# addresses on {link}: {}", vips.join(" "));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_inputs_are_refused_with_the_service_named() {
        let cases = [
            (
                r#"{"services": [{"name": "a", "vips": ["10.0.0.1", "10.0.0.2"], "ports": [{"port": 80}]}]}"#,
                "more than one IPv4 VIP",
            ),
            (
                r#"{"services": [{"name": "a", "vips": ["10.0.0.1"], "ports": [{"port": 80, "protocol": "icmp"}]}]}"#,
                "not a valid services file",
            ),
            (
                r#"{"services": [{"name": "a", "vips": ["10.0.0.1"], "ports": []}]}"#,
                "no port",
            ),
            (
                r#"{"services": [{"name": "a", "vips": ["10.0.0.1"], "ports": [{"port": 80}], "session_affinity_seconds": 0}]}"#,
                "session_affinity_seconds",
            ),
            (
                r#"{"services": [{"name": "x/a", "vips": ["10.0.0.1"], "ports": [{"port": 80}]}, {"name": "x/a", "vips": ["10.0.0.2"], "ports": [{"port": 80}]}]}"#,
                "listed twice",
            ),
            (
                r#"{"services": [{"name": "a", "vips": ["10.0.0.1"], "ports": [{"port": 80}, {"port": 81}]}]}"#,
                "must name each",
            ),
            (
                r#"{"services": [{"name": "a", "vips": ["10.0.0.300"], "ports": [{"port": 80}]}]}"#,
                "not a valid services file",
            ),
        ];
        for (text, wanted) in cases {
            let error = parse_services(text, "input").expect_err(text);
            let message = format!("{error:#}");
            assert!(message.contains(wanted), "{text}: {message}");
            if !wanted.contains("valid") && !wanted.contains("twice") {
                assert!(message.contains("default/a"), "{text}: {message}");
            }
        }
    }

    #[test]
    fn arguments() {
        let args = |list: &[&str]| Args::parse(list.iter().map(|s| (*s).to_owned()));
        assert_eq!(
            args(&["--dry-run", "--node", "n1", "f.json"]).expect("valid"),
            Args {
                file: PathBuf::from("f.json"),
                node: Some("n1".into()),
                link: DEFAULT_DUMMY_LINK.into(),
                drain_timeout: None,
                watch: false,
                resync: DEFAULT_RESYNC,
                dry_run: true,
            }
        );
        let parsed =
            args(&["--drain-timeout", "5", "--watch", "--resync", "7", "f"]).expect("valid");
        assert_eq!(parsed.drain_timeout, Some(Duration::from_secs(5)));
        assert_eq!(parsed.resync, Duration::from_secs(7));
        assert!(parsed.watch);
        assert!(args(&["--drain-timeout", "soon", "f"]).is_err());
        assert!(args(&[]).is_err());
        assert!(args(&["--node"]).is_err());
        assert!(args(&["--bogus", "f"]).is_err());
        assert!(args(&["a", "b"]).is_err());
    }
}
