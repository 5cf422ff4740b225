//! Wiring: settings -> metrics and health servers, a source, the engine and its driver;
//! signals stop it. The data plane is never cleaned up on exit.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use proxier_core::backend::{AddressBackend, IpvsBackend};
use proxier_core::conntrack::ConntrackBackend;
use proxier_core::engine::driver::{self, ProxierHandle, SyncObserver, SyncOutcome};
use proxier_core::netfilter::NetfilterBackend;
use proxier_core::takeover::KubeProxyTakeover;
use proxier_core::{Backends, EngineError, KernelProxier, Proxier, ProxierConfig, SyncKind};
use proxier_runtime::feed::{self, Feed};
use proxier_runtime::health::ProxyHealth;
use proxier_runtime::health::servers::{ServiceHealthServers, serve_proxy_health};
use proxier_runtime::http_server::{BindError, HttpServer};
use proxier_runtime::node_setup::NodeSetup;
use proxier_runtime::observer::RuntimeObserver;
use proxier_runtime::plan_printer::{PlanFormat, PlanPrinter};
use proxier_runtime::source::{self, SourceHandle};
use proxier_runtime::traffic::{TrafficLevel, TrafficMetrics};
use tokio::sync::watch;

use crate::settings::{RunMode, Settings, SourceSettings};

/// Why the daemon stopped with an error (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A server could not listen.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The API client could not be set up.
    #[error(transparent)]
    Kube(#[from] source::kube::KubeSourceError),
    /// The source file could not be read (with --once).
    #[error(transparent)]
    File(#[from] source::file::FileSourceError),
    /// Something this build cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The engine could not be built or its sync failed (`--once`).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// `--once`: some writes failed.
    #[error("sync incomplete: {0}")]
    Incomplete(String),
    /// The node cannot run the proxier (a missing IPVS scheduler).
    #[error(transparent)]
    Node(#[from] proxier_runtime::node_setup::NodeSetupError),
    /// `--cleanup` could not remove something.
    #[error("cleanup: {0}")]
    Cleanup(String),
    /// The source ended before it synced.
    #[error("the {0} source stopped before it delivered Services and EndpointSlices")]
    SourceEnded(&'static str),
}

/// Environment variable of the test hook [`proxier_core::ReconcilerConfig::pause_after_ops`].
pub const PAUSE_AFTER_OPS_ENV: &str = "IPVS_PROXIER_TEST_PAUSE_AFTER_OPS";

/// Resolves when SIGTERM or SIGINT arrives.
async fn termination_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only SIGINT stops the daemon");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub(crate) async fn start_source(settings: &Settings) -> Result<SourceHandle, DaemonError> {
    Ok(match &settings.source {
        SourceSettings::File { path } => source::file::spawn(source::file::FileSourceConfig {
            path: path.clone(),
            hostname: settings.hostname.clone(),
            poll_interval: source::file::DEFAULT_POLL_INTERVAL,
        }),
        SourceSettings::Kube { kubeconfig, master } => {
            let client = source::kube::client(kubeconfig.as_deref(), master.as_deref()).await?;
            source::kube::spawn(
                client,
                source::kube::KubeSourceConfig {
                    list_mode: match (settings.api_protobuf_lists, settings.api_streaming_lists) {
                        (true, true) => source::kube::ListMode::ProtobufStreaming,
                        (true, false) => source::kube::ListMode::Protobuf,
                        (false, true) => source::kube::ListMode::Streaming,
                        (false, false) => source::kube::ListMode::Paginated,
                    },
                    service_cidrs: settings.follow_service_cidrs,
                    ..source::kube::KubeSourceConfig::new(settings.hostname.clone())
                },
            )
        }
    })
}

pub(crate) fn source_name(settings: &Settings) -> &'static str {
    match settings.source {
        SourceSettings::File { .. } => "file",
        SourceSettings::Kube { .. } => "Kubernetes",
    }
}

/// Runs the daemon until a signal (or, with `--once`, one sync).
pub async fn run(settings: Settings) -> Result<(), DaemonError> {
    let mut config = ProxierConfig::new(settings.hostname.clone(), settings.planner.clone());
    // Test hook (inert unless set): stop inside the first IPVS batch after N writes.
    config.reconciler.pause_after_ops = std::env::var(PAUSE_AFTER_OPS_ENV)
        .ok()
        .and_then(|n| n.parse().ok());
    if settings.run_mode == RunMode::Cleanup {
        if settings.dry_run {
            return Err(DaemonError::Unsupported(
                "--cleanup cannot be combined with --dry-run".to_owned(),
            ));
        }
        let mut proxier = Proxier::new(config, Backends::kernel(&settings.dummy_interface).await?)?;
        let report = proxier.cleanup().await;
        println!(
            "cleanup: {} virtual servers deleted, link {} {}, nftables tables removed",
            report.virtual_servers,
            settings.dummy_interface,
            if report.link_deleted {
                "deleted"
            } else {
                "absent"
            }
        );
        if !report.errors.is_empty() {
            return Err(DaemonError::Cleanup(report.errors.join("; ")));
        }
        return Ok(());
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        termination_signal().await;
        tracing::info!("stopping; the data plane stays programmed (use --cleanup to remove it)");
        shutdown_tx.send_replace(true);
    });

    let once = settings.run_mode == RunMode::Once;
    // First the kernel (not in a dry run): its sockets opened and the first sync's read
    // begun, writing nothing, so that a restart's longest read runs while the metrics
    // recorder and the API client are built and the lists come. The node is written to
    // (sysctls, then the tables) only once the source has started: a bad kubeconfig is
    // refused first.
    let target = if settings.dry_run {
        Target::DryRun(Box::new(config))
    } else {
        let config = ProxierConfig {
            node_addresses_from_kernel: true,
            ..config
        };
        let mut proxier = KernelProxier::connect(config, &settings.dummy_interface).await?;
        proxier.read_ahead();
        Target::Kernel(Box::new(proxier))
    };
    // The metrics recorder before anything records: the API client counts its requests
    // (the engine records nothing itself; what its reports say is recorded from them).
    let recorder = if once {
        None
    } else {
        crate::exporter::install()
            .inspect_err(|error| tracing::warn!(%error, "metrics recorder already installed"))
            .ok()
    };
    // Then the source: its lists are under way while the servers bind.
    let source = if once && matches!(settings.source, SourceSettings::File { .. }) {
        None
    } else {
        Some(start_source(&settings).await?)
    };

    let health = ProxyHealth::new(settings.health_timeout());
    let mut observer = RuntimeObserver::new(health.clone());
    let mut servers: Vec<HttpServer> = Vec::new();
    if !once {
        if let (Some(handle), Some(addr)) = (recorder, settings.metrics_bind_address) {
            let traffic = traffic_metrics(&settings, &mut observer).await;
            let server = crate::exporter::serve_with_traffic(addr, handle, traffic).await?;
            tracing::info!(address = %server.local_addr(), "metrics server listening");
            servers.push(server);
        }
        if let Some(addr) = settings.healthz_bind_address {
            let server = serve_proxy_health(addr, health.clone()).await?;
            tracing::info!(address = %server.local_addr(), "health server listening");
            servers.push(server);
        }
    }
    let feed = observer.feed();

    let result = match target {
        Target::DryRun(config) => {
            let proxier = Proxier::new(*config, Backends::dry_run(&settings.dummy_interface))?;
            let format = PlanFormat::from(settings.output);
            if settings.take_over_kube_proxy {
                print_takeover(&KubeProxyTakeover::default(), format).await;
            }
            let mut observer = PlanPrinter::with_format(observer, std::io::stdout(), format);
            if !once {
                observer = observer.watching();
            }
            drive(&settings, proxier, observer, feed, source, shutdown_rx).await
        }
        Target::Kernel(mut proxier) => {
            proxier_runtime::node_setup::prepare(&NodeSetup {
                scheduler: settings.planner.scheduler.clone(),
                oom_score_adj: settings.oom_score_adj,
                conntrack: settings.conntrack,
            })?;
            proxier.set_kernel_settings().await;
            if settings.take_over_kube_proxy {
                proxier.take_over_kube_proxy(KubeProxyTakeover::default());
            }
            if !once {
                // Health checks of `externalTrafficPolicy: Local` Services, on every address (as
                // kube-proxy does without --nodeport-addresses).
                observer.serve_health_checks(Arc::new(ServiceHealthServers::new(
                    vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
                    health.clone(),
                )));
            }
            drive(&settings, *proxier, observer, feed, source, shutdown_rx).await
        }
    };
    drop(servers);
    result
}

/// What the daemon drives: a dry run's in-memory proxier, made from this configuration, or
/// the kernel's, opened (its first read begun) before the source starts.
enum Target {
    DryRun(Box<ProxierConfig>),
    Kernel(Box<KernelProxier>),
}

/// With `--ipvs-traffic-metrics`, a collector whose directory `observer` keeps (none in a dry
/// run: there is no kernel table to read).
async fn traffic_metrics(
    settings: &Settings,
    observer: &mut RuntimeObserver,
) -> Option<TrafficMetrics> {
    if settings.traffic_metrics == TrafficLevel::Off || settings.dry_run {
        return None;
    }
    let directory = observer.track_traffic();
    match TrafficMetrics::connect(settings.traffic_metrics, directory).await {
        Ok(traffic) => Some(traffic),
        Err(error) => {
            tracing::warn!(%error, "no traffic metrics: cannot open an IPVS netlink socket");
            None
        }
    }
}

/// `--take-over-kube-proxy --dry-run`: lists what the takeover would remove from this node
/// (read only). On standard output before the plan table; on standard error with
/// `--output json|yaml`, which keep standard output one document.
async fn print_takeover(takeover: &KubeProxyTakeover, format: PlanFormat) {
    let text = match takeover.plan().await {
        Ok(plan) => format!("kube-proxy takeover would:\n{plan}"),
        Err(error) => format!("kube-proxy takeover: cannot read the node: {error}\n"),
    };
    if format == PlanFormat::Table {
        print!("{text}");
    } else {
        eprint!("{text}");
    }
}

/// Fills `proxier` from `source` (started by the caller; `None`: `--once` with a file, read
/// here), then syncs once (`--once`) or hands it to the driver.
async fn drive<I, A, N, C, O>(
    settings: &Settings,
    mut proxier: Proxier<I, A, N, C>,
    mut observer: O,
    feed: Feed,
    source: Option<SourceHandle>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), DaemonError>
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
    O: SyncObserver<Proxier<I, A, N, C>> + OncePrinter<Proxier<I, A, N, C>>,
{
    let once = settings.run_mode == RunMode::Once;
    // The kernel is read while the source fetches its first picture.
    proxier.read_ahead();
    let mut rest = None;
    let first = if let (None, SourceSettings::File { path }) = (&source, &settings.source) {
        // `--once`: one read; an unreadable file is an error rather than something to wait
        // for.
        source::file::load(path, &settings.hostname)?
    } else {
        let SourceHandle {
            mut events,
            synced: _,
            mut services_ahead,
            task,
        } = source.ok_or(DaemonError::SourceEnded(source_name(settings)))?;
        tracing::info!(
            source = source_name(settings),
            "waiting for Services and EndpointSlices to sync"
        );
        // A restart or a takeover finds its link full and binds nothing ahead: dropping
        // the receiver now spares the source a copy of every Service.
        if services_ahead.is_some() && !proxier.can_bind_ahead().await {
            services_ahead = None;
        }
        // A source's first batch is its complete first picture. The Services may come
        // before it, their addresses then bound while the EndpointSlices come.
        let first = loop {
            tokio::select! {
                batch = events.recv() => break batch,
                services = async { services_ahead.as_mut().expect("guarded").await },
                    if services_ahead.is_some() =>
                {
                    services_ahead = None;
                    // A restart or a takeover finds its link full: its first batch applies
                    // the Services, and its first sync compares the addresses.
                    if let Ok(services) = services
                        && proxier.can_bind_ahead().await
                    {
                        let started = std::time::Instant::now();
                        let count = feed.apply_first(&mut proxier, services);
                        let addresses = proxier.bind_ahead().await;
                        tracing::info!(
                            changes = count,
                            addresses,
                            took = ?started.elapsed(),
                            "Services listed before the EndpointSlices; binding their addresses ahead"
                        );
                    }
                }
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            }
        };
        rest = Some((events, task));
        first.ok_or(DaemonError::SourceEnded(source_name(settings)))?
    };
    let started = std::time::Instant::now();
    let count = feed.apply_first(&mut proxier, first);
    tracing::info!(changes = count, took = ?started.elapsed(), "first picture applied");

    if once {
        let result = proxier.sync(SyncKind::Full).await;
        observer.print_once(&proxier, &result);
        let report = result?;
        if !report.is_complete() {
            return Err(DaemonError::Incomplete(report.to_string()));
        }
        return Ok(());
    }

    let (handle, commands) = ProxierHandle::new();
    if let Some((events, _task)) = rest {
        tokio::spawn(feed::forward(events, handle.clone(), feed));
    }
    let mut observer = SettlesAfterFullSyncs {
        inner: observer,
        settled: false,
    };
    driver::run(
        &mut proxier,
        settings.driver,
        commands,
        &mut observer,
        shutdown,
    )
    .await;
    drop(handle);
    Ok(())
}

/// An observer that ends the allocator's start ([`crate::allocator::settle`]) once the
/// first sync is done, whatever its outcome: the start's burst of allocations is over. It
/// settles again after every full sync (one each sync period): what the bursts since then
/// freed (the full sync's own read of the whole kernel table, the source's relists after an
/// API outage or a 410 Gone) goes back to the kernel then, rather than staying in the
/// threads' free pages until they happen to be reused.
struct SettlesAfterFullSyncs<O> {
    inner: O,
    settled: bool,
}

impl<P, O: SyncObserver<P>> SyncObserver<P> for SettlesAfterFullSyncs<O> {
    fn queued(&mut self) {
        self.inner.queued();
    }

    fn synced(&mut self, proxier: &P, outcome: &SyncOutcome<'_>) {
        self.inner.synced(proxier, outcome);
        if !self.settled || outcome.kind == SyncKind::Full {
            self.settled = true;
            crate::allocator::settle();
        }
    }
}

/// How `--once` shows its single sync.
pub trait OncePrinter<P> {
    /// Prints the result of the one sync.
    fn print_once(
        &mut self,
        proxier: &P,
        result: &Result<proxier_core::engine::SyncReport, EngineError>,
    );
}

impl<P> OncePrinter<P> for RuntimeObserver {
    fn print_once(
        &mut self,
        _: &P,
        result: &Result<proxier_core::engine::SyncReport, EngineError>,
    ) {
        if let Ok(report) = result {
            println!("kernel full sync: {report}");
        }
    }
}

impl<W: std::io::Write> OncePrinter<proxier_core::MemoryProxier>
    for PlanPrinter<RuntimeObserver, W>
{
    fn print_once(
        &mut self,
        proxier: &proxier_core::MemoryProxier,
        result: &Result<proxier_core::engine::SyncReport, EngineError>,
    ) {
        self.print_full_sync(proxier, result);
    }
}
