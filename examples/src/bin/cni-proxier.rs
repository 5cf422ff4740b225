//! `cni-proxier`: a CNI (or any program that knows its Services without a Kubernetes API
//! server) driving proxier-core directly.
//!
//! It reads a small JSON description of Services of its own (not Kubernetes YAML), turns it
//! into proxier-core's model, plans the IPVS table and converges the kernel on it.
//!
//! What a CNI author takes from it:
//! 1. **Describe Services in your own terms** and convert them into proxier-core's model types
//!    ([`Service`], [`EndpointSlice`]): see [`ServiceEntry::to_model`]. One slice per Service
//!    is enough; node names on endpoints matter for `"traffic_policy": "local"`.
//! 2. **Keep one [`ClusterState`]** and feed it [`Change`]s. [`ClusterState::apply`] answers
//!    which Service ports the change dirtied, and an unchanged object dirties nothing, so
//!    re-sending everything you know is cheap: see [`changes`].
//! 3. **Plan with a [`Planner`]** (pure: state + node + config in, table out): the whole node
//!    at start, only the dirty ports afterwards ([`Planner::plan_ports`]).
//! 4. **Converge with a [`Reconciler`]**: [`Reconciler::full_sync`] at start (it reads the
//!    kernel, adopts what already matches, removes only what it owns), then
//!    [`Reconciler::sync_services`] with the dirty ports, and [`Reconciler::tick`] when
//!    [`Reconciler::next_deadline`] comes (removed endpoints that still had connections are
//!    drained at weight 0 first; failed writes are retried with backoff).
//! 5. **Test without root** by handing the reconciler the in-memory backends (`--dry-run`).
//!
//! Not shown here, and needed by a full Service proxy (see `proxier-bin/src/dataplane.rs`):
//! the sysctls (`proxier_core::sysctl`), masquerade rules (`proxier_core::netfilter`), stale
//! UDP conntrack cleanup (`proxier_core::conntrack`) and NodePorts (give [`NodeContext`] the
//! node's addresses).
//!
//! # Usage
//! ```text
//! cni-proxier [--node NAME] [--link NAME] [--drain-timeout SECONDS] [--watch [--resync SECONDS]]
//!             [--dry-run] FILE
//! ```
//! - `--node NAME`: this node's name (default: the kernel's hostname); endpoints on it are local.
//! - `--link NAME`: the dummy link the VIPs are bound on (default `kube-ipvs0`).
//! - `--drain-timeout SECONDS`: how long a removed endpoint keeps its open TCP connections
//!   (at weight 0) before it is deleted (default 15 minutes; only `--watch` waits for it).
//! - `--watch`: keep running; re-read FILE when it changes (checked every second) and apply
//!   only the Services that changed.
//! - `--resync SECONDS`: with `--watch`, how often a full sync re-reads the kernel and repairs
//!   what was changed behind the program's back (default 30).
//! - `--dry-run`: in-memory backends instead of the kernel; prints the planned table. Runs on
//!   any machine, without root: `cargo run -p ipvs-proxier-examples --bin cni-proxier --
//!   --dry-run --node node-a examples/cni-services.json`.
//!
//! Without `--dry-run` it needs CAP_NET_ADMIN and a kernel with IPVS and the dummy link type.
//! `RUST_LOG=debug` shows proxier-core's logs.
//!
//! # Input
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
//! every endpoint of its family.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail, ensure};
use proxier_core::backend::address::KernelAddressBackend;
use proxier_core::backend::ipvs::KernelIpvsBackend;
use proxier_core::backend::memory::{MemoryAddressBackend, MemoryIpvsBackend};
use proxier_core::backend::{AddressBackend, DEFAULT_DUMMY_LINK, IpvsBackend};
use proxier_core::desired::Protocol;
use proxier_core::model::{
    AddressFamily, Config, Endpoint, EndpointPort, EndpointSlice, NodeContext, Service,
    ServiceName, ServicePortSpec, SessionAffinity, SliceKey, TrafficPolicy,
};
use proxier_core::{
    Change, ClusterState, Desired, DirtyPorts, Planner, Reconciler, ReconcilerConfig, SyncReport,
};
use serde::Deserialize;

// ---------------------------------------------------------------------------------------------
// The input format: this program's own, nothing of Kubernetes.
// ---------------------------------------------------------------------------------------------

/// The whole input file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServicesFile {
    /// The Services.
    services: Vec<ServiceEntry>,
}

/// One Service.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceEntry {
    /// `namespace/name`, or `name` in namespace `default`.
    name: String,
    /// Virtual IPs (at most one per address family).
    vips: Vec<IpAddr>,
    /// Ports.
    ports: Vec<PortEntry>,
    /// ClientIP session affinity timeout; absent: no affinity.
    #[serde(default)]
    session_affinity_seconds: Option<u32>,
    /// Which endpoints serve traffic on this node.
    #[serde(default)]
    traffic_policy: Policy,
    /// Backends.
    #[serde(default)]
    endpoints: Vec<EndpointEntry>,
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortEntry {
    /// Port name (may be empty for a single-port Service).
    #[serde(default)]
    name: String,
    /// The port on the VIPs.
    port: u16,
    /// Transport protocol.
    #[serde(default)]
    protocol: ProtocolName,
    /// The port on the endpoints; absent: the same as `port`.
    #[serde(default)]
    target_port: Option<u16>,
}

/// One backend.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointEntry {
    /// Its address.
    address: IpAddr,
    /// The node it runs on.
    #[serde(default)]
    node: Option<String>,
}

/// `tcp`, `udp` or `sctp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ProtocolName {
    #[default]
    Tcp,
    Udp,
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
enum Policy {
    #[default]
    Cluster,
    Local,
}

/// Kubernetes' upper bound for ClientIP affinity (one day).
const MAX_AFFINITY_SECONDS: u32 = 86_400;

/// Parses and checks the input text (`origin` names it in errors).
fn parse_services(text: &str, origin: &str) -> anyhow::Result<ServicesFile> {
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
fn read_services(path: &Path) -> anyhow::Result<ServicesFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading services file {}", path.display()))?;
    parse_services(&text, &path.display().to_string())
}

impl ServiceEntry {
    fn service_name(&self) -> anyhow::Result<ServiceName> {
        let (namespace, name) = self.name.split_once('/').unwrap_or(("default", &self.name));
        ensure!(
            !namespace.is_empty() && !name.is_empty() && !name.contains('/'),
            "service name {:?} is not \"namespace/name\" or \"name\"",
            self.name
        );
        Ok(ServiceName::new(namespace, name))
    }

    /// The Service and its one EndpointSlice in proxier-core's model.
    fn to_model(&self) -> anyhow::Result<(Service, EndpointSlice)> {
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
fn slice_key(service: &ServiceName) -> SliceKey {
    SliceKey::new(&service.namespace, format!("{}-cni", service.name))
}

/// The changes that take a [`ClusterState`] holding `old` to `new`: every Service of `new` is
/// upserted (the state ignores the ones that did not change), the ones gone are deleted.
fn changes(old: &ServicesFile, new: &ServicesFile) -> anyhow::Result<Vec<Change>> {
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

/// Applies `changes` and returns every Service port they dirtied.
fn apply_all(state: &mut ClusterState, changes: Vec<Change>) -> DirtyPorts {
    let mut dirty = DirtyPorts::new();
    for change in changes {
        dirty.extend(state.apply(change));
    }
    dirty
}

/// Replaces the plans of the `dirty` ports in `desired` (a port planned as `None` is removed).
fn replan(desired: &mut Desired, planner: &Planner<'_>, state: &ClusterState, dirty: &DirtyPorts) {
    for (port, plan) in planner.plan_ports(state, dirty) {
        match plan {
            Some(plan) => {
                desired.services.insert(port, plan);
            }
            None => {
                desired.services.remove(&port);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Command line and the sync loop.
// ---------------------------------------------------------------------------------------------

const USAGE: &str = "usage: cni-proxier [--node NAME] [--link NAME] [--drain-timeout SECONDS] \
                     [--watch [--resync SECONDS]] [--dry-run] FILE";

/// Default period of the full resync in `--watch` mode.
const DEFAULT_RESYNC: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Args {
    file: PathBuf,
    node: Option<String>,
    link: String,
    drain_timeout: Option<Duration>,
    watch: bool,
    resync: Duration,
    dry_run: bool,
}

impl Args {
    fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Args> {
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

/// The kernel's hostname, the default node name.
fn hostname() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading /proc/sys/kernel/hostname (pass --node NAME)")?;
    Ok(name.trim().to_owned())
}

/// When the file last changed (modification time and size), to notice edits.
fn file_version(path: &Path) -> anyhow::Result<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let modified = meta
        .modified()
        .with_context(|| format!("modification time of {}", path.display()))?;
    Ok((modified, meta.len()))
}

fn print_report(what: &str, report: &SyncReport) {
    println!(
        "{what}: {} writes ({} deletes, {} failed){}",
        report.writes,
        report.deletes,
        report.failed,
        report
            .drift
            .map(|d| format!(", {d} kernel objects had drifted"))
            .unwrap_or_default()
    );
    for (port, error) in &report.errors {
        match port {
            Some(port) => println!("  {port}: {error}"),
            None => println!("  cleanup: {error}"),
        }
    }
}

/// `10.96.0.10:80` or `[fd00::10]:80`.
fn address_port(address: IpAddr, port: u16) -> String {
    match address {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// Prints the plan as `ipvsadm -Sn` would print the resulting table, and the VIPs to bind.
fn print_plan(desired: &Desired, link: &str) {
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

/// Reads the file, converges once, and with `--watch` follows the file's changes.
async fn run<I: IpvsBackend, A: AddressBackend>(
    args: &Args,
    node_name: String,
    mut reconciler: Reconciler<I, A>,
) -> anyhow::Result<()> {
    // A CNI that also serves NodePorts gives the node's addresses here.
    let node = NodeContext::new(node_name, Vec::new(), Vec::new());
    let config = Config::default();
    let planner = Planner::new(&node, &config);

    // Start: everything in the file, the whole node planned, a full sync.
    let mut version = file_version(&args.file)?;
    let mut current = read_services(&args.file)?;
    let mut state = ClusterState::new();
    apply_all(&mut state, changes(&ServicesFile::default(), &current)?);
    let mut desired = planner.plan(&state);
    let report = reconciler
        .full_sync(&desired)
        .await
        .context("first sync (reading or preparing the kernel)")?;
    print_report(
        &format!("full sync of {} service ports", desired.services.len()),
        &report,
    );
    if args.dry_run {
        print_plan(&desired, &args.link);
    }
    if !args.watch {
        ensure!(
            report.failed == 0 && report.errors.is_empty(),
            "{} kernel writes failed",
            report.failed
        );
        return Ok(());
    }

    // Watch: apply only what changed; tick when the reconciler asks (drains, retries); a
    // periodic full sync as a safety net (someone deleted a virtual server, a write was lost).
    let mut tick_at = reconciler.next_deadline();
    let mut last_full_sync = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if last_full_sync.elapsed() >= args.resync {
            match reconciler.full_sync(&desired).await {
                Ok(report) if report.writes > 0 => print_report("full resync", &report),
                Ok(_) => {}
                Err(error) => eprintln!("full resync failed: {error}; trying again later"),
            }
            last_full_sync = tokio::time::Instant::now();
            tick_at = reconciler.next_deadline();
        }
        if tick_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
            let report = reconciler.tick(&desired).await.context("tick")?;
            if report.writes > 0 {
                print_report("drains and retries", &report);
            }
            tick_at = reconciler.next_deadline();
        }

        let now = match file_version(&args.file) {
            Ok(now) => now,
            Err(error) => {
                eprintln!("{error:#}; keeping the current services");
                continue;
            }
        };
        if now == version {
            continue;
        }
        version = now;
        let next = match read_services(&args.file) {
            Ok(next) => next,
            Err(error) => {
                eprintln!("{error:#}; keeping the current services");
                continue;
            }
        };
        let dirty = apply_all(&mut state, changes(&current, &next)?);
        current = next;
        if dirty.is_empty() {
            println!("file changed, no service changed");
            continue;
        }
        replan(&mut desired, &planner, &state, &dirty);
        let report = reconciler
            .sync_services(&desired, &dirty)
            .await
            .context("incremental sync")?;
        let ports: Vec<String> = dirty.iter().map(ToString::to_string).collect();
        print_report(&format!("sync of {}", ports.join(", ")), &report);
        if args.dry_run {
            print_plan(&desired, &args.link);
        }
        tick_at = reconciler.next_deadline();
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return std::process::ExitCode::SUCCESS;
    }
    match Args::parse(args).and_then(|args| start(&args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cni-proxier: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Opens the backends (kernel, or in memory for `--dry-run`) and runs.
fn start(args: &Args) -> anyhow::Result<()> {
    let node_name = match &args.node {
        Some(name) => name.clone(),
        None => hostname()?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let mut config = ReconcilerConfig::default();
        if let Some(timeout) = args.drain_timeout {
            config.drain_timeout = timeout;
        }
        if args.dry_run {
            let reconciler = Reconciler::new(
                MemoryIpvsBackend::new(),
                MemoryAddressBackend::new(),
                config,
            );
            run(args, node_name, reconciler).await
        } else {
            // Both open in the current network namespace (`ip netns exec` to pick another).
            let ipvs = KernelIpvsBackend::connect()
                .await
                .context("opening IPVS (generic netlink)")?;
            let addresses = KernelAddressBackend::connect(args.link.clone())
                .with_context(|| format!("opening rtnetlink for link {}", args.link))?;
            run(args, node_name, Reconciler::new(ipvs, addresses, config)).await
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxier_core::VirtualServerKey;
    use proxier_core::observed::ObservedVirtualServer;
    use std::collections::BTreeMap;

    /// Virtual servers with their real servers (address, port) and persistence timeout.
    type Table = BTreeMap<VirtualServerKey, (BTreeSet<(IpAddr, u16)>, Option<u32>)>;

    const SAMPLE: &str = include_str!("../../cni-services.json");
    const NODE: &str = "node-a";

    /// The sample, planned and reconciled into in-memory backends.
    struct DryRun {
        input: ServicesFile,
        state: ClusterState,
        desired: Desired,
        ipvs: MemoryIpvsBackend,
        addresses: MemoryAddressBackend,
        reconciler: Reconciler<MemoryIpvsBackend, MemoryAddressBackend>,
        runtime: tokio::runtime::Runtime,
    }

    impl DryRun {
        fn sample() -> DryRun {
            let input = parse_services(SAMPLE, "cni-services.json").expect("sample parses");
            let mut state = ClusterState::new();
            apply_all(
                &mut state,
                changes(&ServicesFile::default(), &input).expect("changes"),
            );
            let node = NodeContext::new(NODE, Vec::new(), Vec::new());
            let desired = Planner::new(&node, &Config::default()).plan(&state);
            let ipvs = MemoryIpvsBackend::new();
            let addresses = MemoryAddressBackend::new();
            let mut reconciler =
                Reconciler::new(ipvs.clone(), addresses.clone(), ReconcilerConfig::default());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let report = runtime
                .block_on(reconciler.full_sync(&desired))
                .expect("full sync");
            assert_eq!(report.failed, 0, "{report:?}");
            DryRun {
                input,
                state,
                desired,
                ipvs,
                addresses,
                reconciler,
                runtime,
            }
        }

        /// Applies an edited input the way `--watch` does; returns the dirty ports and report.
        fn edit(&mut self, next: ServicesFile) -> (DirtyPorts, SyncReport) {
            let dirty = apply_all(
                &mut self.state,
                changes(&self.input, &next).expect("changes"),
            );
            self.input = next;
            let node = NodeContext::new(NODE, Vec::new(), Vec::new());
            let config = Config::default();
            replan(
                &mut self.desired,
                &Planner::new(&node, &config),
                &self.state,
                &dirty,
            );
            let report = self
                .runtime
                .block_on(self.reconciler.sync_services(&self.desired, &dirty))
                .expect("incremental sync");
            (dirty, report)
        }
    }

    /// The table the input asks for, worked out from the input alone: a virtual server per
    /// VIP and port; real servers are the endpoints of the VIP's family on the target port,
    /// narrowed to this node's endpoints for `local` when it has any.
    fn expected_table(input: &ServicesFile) -> Table {
        let mut table = BTreeMap::new();
        for service in &input.services {
            let local: Vec<&EndpointEntry> = service
                .endpoints
                .iter()
                .filter(|e| e.node.as_deref() == Some(NODE))
                .collect();
            for vip in &service.vips {
                let all_of_family: Vec<&EndpointEntry> = service
                    .endpoints
                    .iter()
                    .filter(|e| e.address.is_ipv4() == vip.is_ipv4())
                    .collect();
                let local_of_family: Vec<&EndpointEntry> = local
                    .iter()
                    .copied()
                    .filter(|e| e.address.is_ipv4() == vip.is_ipv4())
                    .collect();
                let chosen =
                    if service.traffic_policy == Policy::Local && !local_of_family.is_empty() {
                        local_of_family
                    } else {
                        all_of_family
                    };
                for port in &service.ports {
                    let key = VirtualServerKey {
                        address: *vip,
                        port: port.port,
                        protocol: port.protocol.into(),
                    };
                    let target = port.target_port.unwrap_or(port.port);
                    let real: BTreeSet<(IpAddr, u16)> =
                        chosen.iter().map(|e| (e.address, target)).collect();
                    table.insert(key, (real, service.session_affinity_seconds));
                }
            }
        }
        table
    }

    fn actual_table(table: &BTreeMap<VirtualServerKey, ObservedVirtualServer>) -> Table {
        table
            .iter()
            .map(|(key, vs)| {
                let real = vs
                    .real_servers
                    .keys()
                    .map(|rs| (rs.address, rs.port))
                    .collect();
                (*key, (real, vs.settings.persistence_timeout))
            })
            .collect()
    }

    #[test]
    fn sample_becomes_the_table_its_services_describe() {
        let run = DryRun::sample();
        let expected = expected_table(&run.input);
        // The sample exercises what the format offers.
        let services = &run.input.services;
        assert!(
            services.iter().any(|s| s.vips.len() == 2),
            "a dual-stack service"
        );
        assert!(
            services
                .iter()
                .any(|s| s.session_affinity_seconds.is_some())
        );
        assert!(services.iter().any(|s| s.traffic_policy == Policy::Local));
        assert!(
            services
                .iter()
                .flat_map(|s| &s.ports)
                .any(|p| p.protocol == ProtocolName::Udp)
        );
        let vs_count: usize = services.iter().map(|s| s.vips.len() * s.ports.len()).sum();
        assert_eq!(expected.len(), vs_count);

        assert_eq!(actual_table(&run.ipvs.table()), expected);
        for vs in run.ipvs.table().values() {
            assert!(vs.real_servers.values().all(|rs| rs.weight == 1));
        }
        let vips: BTreeSet<IpAddr> = services.iter().flat_map(|s| s.vips.clone()).collect();
        assert_eq!(run.addresses.addresses(), vips);
        assert!(run.addresses.link_exists());
    }

    #[test]
    fn local_policy_keeps_only_this_nodes_endpoints() {
        let run = DryRun::sample();
        let local = run
            .input
            .services
            .iter()
            .find(|s| s.traffic_policy == Policy::Local)
            .expect("a local service in the sample");
        let remote: Vec<IpAddr> = local
            .endpoints
            .iter()
            .filter(|e| e.node.as_deref() != Some(NODE))
            .map(|e| e.address)
            .collect();
        assert!(
            !remote.is_empty(),
            "the sample's local service has a remote endpoint"
        );
        let table = run.ipvs.table();
        for vip in &local.vips {
            for (key, vs) in table.iter().filter(|(k, _)| k.address == *vip) {
                for address in &remote {
                    assert!(
                        !vs.real_servers.keys().any(|rs| rs.address == *address),
                        "{key} routes to the remote endpoint {address}"
                    );
                }
            }
        }
    }

    #[test]
    fn removing_an_endpoint_touches_only_that_service() {
        let mut run = DryRun::sample();
        let before = run.ipvs.table();
        run.ipvs.take_applied_ops();
        let mut next = run.input.clone();
        let service = next
            .services
            .iter_mut()
            .find(|s| s.traffic_policy == Policy::Cluster && s.endpoints.len() > 1)
            .expect("a cluster service with two endpoints");
        let removed = service.endpoints.pop().expect("an endpoint");
        let name = service.service_name().expect("name");
        let ports: DirtyPorts = service
            .ports
            .iter()
            .map(|p| name.port(&p.name, p.protocol.into()))
            .collect();
        let vips = service.vips.clone();

        let (dirty, report) = run.edit(next);
        assert_eq!(dirty, ports);
        assert_eq!(report.failed, 0, "{report:?}");
        // No connections in memory: the real server goes at once.
        assert_eq!(report.deletes, report.writes, "{report:?}");
        assert!(report.deletes >= 1);
        let after = run.ipvs.table();
        assert_eq!(actual_table(&after), expected_table(&run.input));
        for (key, vs) in &before {
            if vips.contains(&key.address) {
                continue;
            }
            assert!(after.get(key) == Some(vs), "{key} changed");
        }
        assert!(
            after
                .values()
                .flat_map(|vs| vs.real_servers.keys())
                .all(|rs| rs.address != removed.address)
        );

        // Saving the same content again changes nothing.
        let (dirty, report) = run.edit(run.input.clone());
        assert!(dirty.is_empty());
        assert_eq!(report.writes, 0);
    }

    #[test]
    fn removing_a_service_removes_its_virtual_servers_and_vips() {
        let mut run = DryRun::sample();
        let mut next = run.input.clone();
        let gone = next.services.remove(0);
        let (_, report) = run.edit(next);
        assert_eq!(report.failed, 0, "{report:?}");
        let table = run.ipvs.table();
        assert_eq!(actual_table(&table), expected_table(&run.input));
        for vip in &gone.vips {
            assert!(!table.keys().any(|k| k.address == *vip));
            assert!(!run.addresses.addresses().contains(vip));
        }
    }

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
