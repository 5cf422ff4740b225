//! `cni-proxier`: a CNI (or any program that knows its Services without a Kubernetes API
//! server) embedding proxier-core's engine. It reads Services from a JSON file of its own
//! ([`cni_input`]) and the engine converges the kernel on them: IPVS, the VIPs on the dummy
//! link, sysctls, nftables, stale UDP conntrack entries, health-check decisions.
//!
//! What a CNI author takes from it:
//! 1. **Build a [`Proxier`]** from a [`ProxierConfig`] (node name, planner [`Config`], the drain
//!    timeout in `reconciler`) and backends: [`KernelProxier::open`] for the kernel of the
//!    current network namespace, or [`Backends::in_memory`] to run without root (`--dry-run`).
//! 2. **Feed it [`Change`](proxier_core::Change)s** (Service, EndpointSlice, Node upserts and deletes in the model's
//!    types): [`Proxier::apply`] before the first sync, a [`ProxierHandle`] afterwards. An
//!    unchanged object changes nothing, so re-sending all you know is cheap; only deletes need
//!    what was sent last time ([`cni_input::changes`]).
//! 3. **Let the [`driver`] sync**: a full sync first (it reads the kernel, adopts what already
//!    matches, removes only what it owns), then incremental syncs of the changed Service ports,
//!    syncs when drains or retries are due, and a full resync (drift repair) every period.
//! 4. **Print through a [`SyncObserver`]**: it sees each
//!    [`SyncReport`](proxier_core::engine::SyncReport) and the proxier as it left it.
//!
//! # Usage
//! ```text
//! cni-proxier [--node NAME] [--link NAME] [--drain-timeout SECONDS] [--watch [--resync SECONDS]]
//!             [--dry-run] FILE
//! ```
//! `--node`: this node's name (default: the hostname); endpoints on it are local. `--link`: the
//! dummy link of the VIPs (default `kube-ipvs0`). `--drain-timeout`: how long a removed
//! endpoint keeps its TCP connections at weight 0 (default: until they end). `--watch`: keep running,
//! re-read FILE when it changes (checked every second; a FILE that does not parse changes
//! nothing). `--resync`: the period of the full resync with `--watch` (default 30 s).
//! `--dry-run`: in-memory backends, prints the planned table; needs no root: `cargo run -p
//! ipvs-proxier-examples --bin cni-proxier -- --dry-run --node node-a examples/cni-services.json`
//!
//! Without `--dry-run` it needs CAP_NET_ADMIN, IPVS, the dummy link type and `nft`.
//! `RUST_LOG=debug` shows proxier-core's logs. The input format: [`cni_input`].

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Context;
use ipvs_proxier_examples::cni_input::{self, Args, InputFile, ServicesFile, USAGE};
use proxier_core::backend::{AddressBackend, IpvsBackend};
use proxier_core::conntrack::ConntrackBackend;
use proxier_core::engine::driver::{self, DriverConfig, ProxierHandle, SyncObserver, SyncOutcome};
use proxier_core::model::{Config, ServicePortName};
use proxier_core::netfilter::NetfilterBackend;
use proxier_core::{Backends, KernelProxier, Proxier, ProxierConfig, SyncKind};
use tokio::sync::watch;

/// Service ports sent to the driver and not yet reported by a sync.
type Pending = Rc<RefCell<BTreeSet<ServicePortName>>>;

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

/// Reads the input, builds the proxier (on the kernel, or in memory for `--dry-run`), runs it.
fn start(args: &Args) -> anyhow::Result<()> {
    let input = InputFile::open(&args.file)?;
    // A CNI that also serves NodePorts sends a Change::UpsertNode with the node's addresses.
    let mut config = ProxierConfig::new(args.node_name()?, Config::default());
    if let Some(timeout) = args.drain_timeout {
        config.reconciler.drain_timeout = timeout;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        if args.dry_run {
            run(args, Proxier::new(config, Backends::in_memory())?, input).await
        } else {
            // In the current network namespace (`ip netns exec` to pick another).
            run(args, KernelProxier::open(config, &args.link).await?, input).await
        }
    })
}

/// Feeds the file to `proxier` and drives it: one full sync, or with `--watch` until killed.
async fn run<I, A, N, C>(
    args: &Args,
    mut proxier: Proxier<I, A, N, C>,
    mut input: InputFile,
) -> anyhow::Result<()>
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    for change in cni_input::changes(&ServicesFile::default(), input.services())? {
        proxier.apply(change);
    }
    let (handle, commands) = ProxierHandle::new();
    let (stop, shutdown) = watch::channel(false);
    let mut printer = Printer {
        stop: (!args.watch).then(|| stop.clone()),
        plan_link: args.dry_run.then(|| args.link.clone()),
        pending: Pending::default(),
        first: true,
        problem: None,
    };
    let pending = printer.pending.clone();
    let timing = DriverConfig::new(args.resync, Duration::from_secs(1), 2);
    let driver = driver::run(&mut proxier, timing, commands, &mut printer, shutdown);
    if !args.watch {
        driver.await;
        return printer.problem.map_or(Ok(()), |p| Err(anyhow::anyhow!(p)));
    }
    // --watch: re-read the file every second; send its Services when it changed.
    let follow = async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match input.reread() {
                Ok(None) => {}
                Ok(Some(edit)) if edit.ports.is_empty() => {
                    println!("file changed, no service changed");
                }
                Ok(Some(edit)) => {
                    pending.borrow_mut().extend(edit.ports);
                    handle.apply(edit.changes);
                }
                Err(error) => eprintln!("{error:#}; keeping the current services"),
            }
        }
    };
    tokio::select! {
        () = driver => Ok(()),
        () = follow => Ok(()),
    }
}

/// Prints each sync; without `--watch`, stops the driver after the first one.
struct Printer {
    stop: Option<watch::Sender<bool>>,
    plan_link: Option<String>,
    pending: Pending,
    first: bool,
    /// Why the last sync did not complete.
    problem: Option<String>,
}

impl<I, A, N, C> SyncObserver<Proxier<I, A, N, C>> for Printer
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    fn synced(&mut self, proxier: &Proxier<I, A, N, C>, outcome: &SyncOutcome<'_>) {
        if let Some(stop) = &self.stop {
            stop.send_replace(true);
        }
        // Failures are logged by the engine (tracing, RUST_LOG); the report line counts them.
        self.problem = match outcome.result {
            Ok(report) => (!report.is_complete()).then(|| format!("incomplete sync: {report}")),
            Err(error) => Some(format!("sync failed: {error}")),
        };
        let Ok(report) = outcome.result else { return };
        let first = std::mem::take(&mut self.first);
        let ports: Vec<String> = self
            .pending
            .take()
            .iter()
            .map(ToString::to_string)
            .collect();
        let size = proxier.desired().services.len();
        let what = match outcome.kind {
            _ if first => format!("full sync of {size} service ports"),
            SyncKind::Full => "full resync".to_owned(),
            SyncKind::Incremental if ports.is_empty() => "drains and retries".to_owned(),
            SyncKind::Incremental => format!("sync of {}", ports.join(", ")),
        };
        if first || !ports.is_empty() || report.ipvs.writes > 0 {
            println!("{what}: {report}");
        }
        if let (Some(link), true) = (&self.plan_link, first || !ports.is_empty()) {
            cni_input::print_plan(proxier.desired(), link);
        }
    }
}
