//! `cni-proxier`: a CNI (or any program that knows its Services without an API server)
//! embedding the engine. It writes Services, EndpointSlices and optionally its Node as
//! Kubernetes manifests to a YAML file (sample: `examples/cni-services.yaml`); the engine
//! converges the kernel on them: IPVS, VIPs on the dummy link, sysctls, nftables, conntrack.
//!
//! What a CNI author takes from it (none of it is proxy, source or health logic):
//! 1. **A proxier**: [`KernelProxier::open`] on this network namespace's kernel, or
//!    [`Backends::in_memory`] to plan without root (`--dry-run`).
//! 2. **A source**: [`source::file::spawn`] follows the file (inotify, polling as a fallback);
//!    a torn or malformed file is refused whole. Its first batch, the complete picture, is
//!    applied before the first sync ([`Feed::apply_first`](proxier_runtime::feed::Feed));
//!    [`feed::forward`] hands the rest to the driver. A one-shot run uses [`source::file::load`].
//! 3. **The driver** syncs: a full sync first (adopting what matches, removing only what it
//!    owns), then the changed Service ports, drains, retries, and a full resync every period.
//! 4. **An observer**: [`RuntimeObserver`] records metrics (export them as `kube-embedded` does)
//!    and health, and serves the `externalTrafficPolicy: Local` health checks; [`Printer`] prints.
//!
//! Usage: `cni-proxier [--node NAME] [--link NAME] [--drain-timeout S] [--watch [--resync S]]
//! [--dry-run] FILE`. `--node` defaults to the hostname, `--link` (the VIPs' dummy link) to
//! `kube-ipvs0`, `--drain-timeout` (a removed endpoint's connections at weight 0) to "until they
//! end". `--watch` follows FILE (it may appear later), with a full resync every `--resync` s (30).
//! `--dry-run`: in-memory backends, prints the plan, then what each sync changed; otherwise it
//! needs CAP_NET_ADMIN, IPVS, the dummy link type and `nft`. Logs: `RUST_LOG=info`.

use std::{net::IpAddr, net::Ipv4Addr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, bail};
use proxier_core::backend::{AddressBackend, IpvsBackend};
use proxier_core::engine::driver::{self, DriverConfig, ProxierHandle, SyncObserver, SyncOutcome};
use proxier_core::view::render::{render_change_report, render_plan_report};
use proxier_core::view::{change_document, link_name, plan_document};
use proxier_core::{Backends, Desired, KernelProxier, Proxier, ProxierConfig, SyncKind, model};
use proxier_core::{conntrack::ConntrackBackend, netfilter::NetfilterBackend};
use proxier_runtime::health::{ProxyHealth, servers::ServiceHealthServers};
use proxier_runtime::{feed, observer::RuntimeObserver, source, source::file::FileSourceConfig};

#[derive(Default)]
struct Args {
    file: PathBuf,
    node: String,
    link: String,
    drain_timeout: Option<Duration>,
    watch: bool,
    resync: Duration,
    dry_run: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        link: "kube-ipvs0".into(),
        resync: Duration::from_secs(30),
        ..Args::default()
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        match word.as_str() {
            "--watch" => args.watch = true,
            "--dry-run" => args.dry_run = true,
            "--node" => args.node = words.next().context("--node needs a name")?,
            "--link" => args.link = words.next().context("--link needs a name")?,
            "--drain-timeout" => args.drain_timeout = Some(seconds(words.next())?),
            "--resync" => args.resync = seconds(words.next())?.max(Duration::from_secs(1)),
            flag if flag.starts_with('-') => bail!("unknown flag {flag} (see the program's doc)"),
            _ if !args.file.as_os_str().is_empty() => bail!("more than one FILE"),
            file => args.file = file.into(),
        }
    }
    anyhow::ensure!(!args.file.as_os_str().is_empty(), "no FILE given");
    if args.node.is_empty() {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname");
        args.node = hostname.context("no --node, no hostname")?.trim().into();
    }
    Ok(args)
}

fn seconds(value: Option<String>) -> anyhow::Result<Duration> {
    let value = value.context("a flag needs seconds")?;
    Ok(Duration::from_secs(value.parse().context("seconds")?))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = parse_args()?;
    let mut config = ProxierConfig::new(&args.node, model::Config::default());
    if let Some(timeout) = args.drain_timeout {
        config.reconciler.drain_timeout = timeout;
    }
    if args.dry_run {
        run(&args, Proxier::new(config, Backends::in_memory())?).await
    } else {
        // In the current network namespace (`ip netns exec` to pick another).
        run(&args, KernelProxier::open(config, &args.link).await?).await
    }
}

/// Feeds the file to `proxier` and drives it: one sync, or with `--watch` until killed.
async fn run<I, A, N, C>(args: &Args, mut proxier: Proxier<I, A, N, C>) -> anyhow::Result<()>
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    let health = ProxyHealth::new(2 * args.resync);
    let mut runtime = RuntimeObserver::new(health.clone());
    let (handle, commands) = ProxierHandle::new();
    let first = if args.watch {
        // The first batch comes once the file exists and reads well (the source logs why not).
        let mut source = source::file::spawn(FileSourceConfig::new(&args.file, &args.node));
        let Some(first) = source.events.recv().await else {
            bail!("the file source ended");
        };
        let feed = runtime.feed();
        tokio::spawn(feed::forward(source.events, handle.clone(), feed));
        first
    } else {
        // Read once: a missing, torn or malformed file fails the run, the kernel untouched.
        source::file::load(&args.file, &args.node)?
    };
    runtime.feed().apply_first(&mut proxier, first);
    if args.watch && !args.dry_run {
        let everywhere = vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)];
        runtime.serve_health_checks(Arc::new(ServiceHealthServers::new(everywhere, health)));
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut printer = Printer {
        runtime,
        stop: (!args.watch).then(|| stop.clone()),
        dry_run: args.dry_run,
        before: None,
        problem: None,
    };
    let timing = DriverConfig::new(args.resync, Duration::from_secs(1), 2);
    driver::run(&mut proxier, timing, commands, &mut printer, stopped).await;
    printer.problem.map_or(Ok(()), |problem| bail!(problem))
}

/// Prints what each sync did, after [`RuntimeObserver`] recorded it; stops a one-shot run.
struct Printer {
    runtime: RuntimeObserver,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    dry_run: bool,
    before: Option<Desired>, // the plan after the last sync
    problem: Option<String>, // why the last sync did not complete
}

impl<I, A, N, C> SyncObserver<Proxier<I, A, N, C>> for Printer
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    fn queued(&mut self) {
        SyncObserver::<Proxier<I, A, N, C>>::queued(&mut self.runtime);
    }

    fn synced(&mut self, proxier: &Proxier<I, A, N, C>, outcome: &SyncOutcome<'_>) {
        self.runtime.synced(proxier, outcome);
        if let Some(stop) = &self.stop {
            stop.send_replace(true);
        }
        self.problem = match outcome.result {
            Ok(report) => (!report.is_complete()).then(|| format!("incomplete sync: {report}")),
            Err(error) => Some(format!("sync failed: {error}")),
        };
        let Ok(report) = outcome.result else { return };
        let Some(before) = self.before.replace(proxier.desired().clone()) else {
            let size = proxier.desired().services.len();
            println!("full sync of {size} service ports: {report}");
            if self.dry_run {
                print!("{}", render_plan_report(&plan_document(proxier, outcome)));
            }
            return;
        };
        // The Service ports this sync changed: the plans before and after it, compared.
        let changes = change_document(&before, proxier, outcome);
        let vs = &changes.virtual_servers;
        let changed = vs.changed.iter().map(|change| &change.after);
        let all = vs.added.iter().chain(&vs.removed).chain(changed);
        let mut ports: Vec<&str> = all.map(|v| v.service_port.as_str()).collect();
        ports.sort_unstable();
        ports.dedup();
        let what = match (outcome.kind, ports.is_empty()) {
            (SyncKind::Full, _) => "full resync".to_owned(),
            (_, true) => "drains and retries".to_owned(),
            (_, false) => format!("sync of {}", ports.join(", ")),
        };
        if !ports.is_empty() || report.ipvs.writes > 0 {
            println!("{what}: {report}");
        }
        if self.dry_run && !changes.is_empty() {
            print!("{}", render_change_report(&changes, &link_name(proxier)));
        }
    }
}
