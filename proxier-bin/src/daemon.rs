//! Wiring: settings -> metrics and health servers, a source, the event pump and the sync
//! runner; signals stop it. The data plane is never cleaned up on exit.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster_view::{ClusterView, Touched};
use crate::dry_run::DryRunTarget;
use crate::health::{ProxyHealth, ServiceHealthServers, serve_proxy_health};
use crate::http_server::{BindError, HttpServer};
use crate::runner::{self, RunnerConfig, RunnerHandle, SyncScheduler};
use crate::settings::{RunMode, Settings, SourceSettings};
use crate::source::{self, SourceEvent, SourceHandle};

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
    /// Something this build cannot do yet.
    #[error("{0}")]
    Unsupported(String),
    /// The last sync failed (with --once).
    #[error("sync failed: {0}")]
    Sync(#[from] runner::SyncError),
    /// The kernel data plane failed (open, `--once` sync, `--cleanup`).
    #[error(transparent)]
    DataPlane(#[from] crate::dataplane::DataPlaneError),
    /// The source ended before it synced.
    #[error("the {0} source stopped before it delivered Services and EndpointSlices")]
    SourceEnded(&'static str),
}

/// Changes counted since the last sync (for the `*_changes_pending` gauges).
#[derive(Debug, Default)]
struct PendingChanges {
    services: AtomicUsize,
    endpoints: AtomicUsize,
}

/// Resolves when SIGTERM or SIGINT arrives.
async fn termination_signal() {
    #[cfg(unix)]
    {
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
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn start_source(settings: &Settings) -> Result<SourceHandle, DaemonError> {
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
                    hostname: settings.hostname.clone(),
                },
            )
        }
    })
}

fn source_name(settings: &Settings) -> &'static str {
    match settings.source {
        SourceSettings::File { .. } => "file",
        SourceSettings::Kube { .. } => "Kubernetes",
    }
}

/// Applies source events to the view, the health state and the runner, until the source ends.
/// `view_synced` turns true once a snapshot (a source's complete first picture) is in the
/// view, so that no sync runs on a view the source has not filled yet.
async fn pump_events(
    mut events: tokio::sync::mpsc::Receiver<SourceEvent>,
    view: Arc<Mutex<ClusterView>>,
    health: ProxyHealth,
    runner: RunnerHandle,
    pending: Arc<PendingChanges>,
    view_synced: watch::Sender<bool>,
) {
    while let Some(event) = events.recv().await {
        tracing::debug!(event = %event.describe(), "source event");
        match &event {
            SourceEvent::NodeUpdate(Some(node))
            | SourceEvent::Snapshot(source::ClusterSnapshot {
                node: Some(node), ..
            }) => health.sync_node(node),
            SourceEvent::NodeUpdate(None) => health.node_deleted(),
            _ => {}
        }
        let touched = view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .apply(&event);
        match touched {
            Touched::Service => {
                let n = pending.services.fetch_add(1, Ordering::Relaxed) + 1;
                crate::metrics::record_service_change(n);
                runner.request_sync();
            }
            Touched::EndpointSlice => {
                let n = pending.endpoints.fetch_add(1, Ordering::Relaxed) + 1;
                crate::metrics::record_endpoint_change(n);
                runner.request_sync();
            }
            Touched::Everything => {
                view_synced.send_replace(true);
                runner.request_full();
            }
            // The data plane replans everything when the node's facts changed; the kernel
            // side stays incremental.
            Touched::Node => runner.request_sync(),
            Touched::Nothing => {}
        }
    }
}

/// A target wrapper that resets the pending-change gauges when a sync starts.
struct CountingTarget<T> {
    inner: T,
    pending: Arc<PendingChanges>,
}

impl<T: runner::SyncTarget> runner::SyncTarget for CountingTarget<T> {
    fn sync(
        &mut self,
        kind: runner::SyncKind,
    ) -> impl std::future::Future<Output = Result<(), runner::SyncError>> + Send {
        self.pending.services.store(0, Ordering::Relaxed);
        self.pending.endpoints.store(0, Ordering::Relaxed);
        crate::metrics::set_pending_changes(0, 0);
        self.inner.sync(kind)
    }
}

/// Runs the daemon until a signal (or, with `--once`, one sync).
pub async fn run(settings: Settings) -> Result<(), DaemonError> {
    if settings.run_mode == RunMode::Cleanup {
        if settings.dry_run {
            return Err(DaemonError::Unsupported(
                "--cleanup cannot be combined with --dry-run".to_owned(),
            ));
        }
        let report = crate::dataplane::cleanup(&settings).await?;
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
        return Ok(());
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        termination_signal().await;
        tracing::info!("stopping; the data plane stays programmed (use --cleanup to remove it)");
        shutdown_tx.send_replace(true);
    });

    let health = ProxyHealth::new(settings.health_timeout());
    let mut servers: Vec<HttpServer> = Vec::new();
    let once = settings.run_mode == RunMode::Once;
    if !once {
        match crate::metrics::install() {
            Ok(handle) => {
                if let Some(addr) = settings.metrics_bind_address {
                    let server = crate::metrics::serve(addr, handle).await?;
                    tracing::info!(address = %server.local_addr(), "metrics server listening");
                    servers.push(server);
                }
            }
            Err(error) => tracing::warn!(%error, "metrics recorder already installed"),
        }
        if let Some(addr) = settings.healthz_bind_address {
            let server = serve_proxy_health(addr, health.clone()).await?;
            tracing::info!(address = %server.local_addr(), "health server listening");
            servers.push(server);
        }
    }

    let view = Arc::new(Mutex::new(ClusterView::default()));
    let pending = Arc::new(PendingChanges::default());
    let (runner_handle, triggers) = RunnerHandle::new();

    if once && let SourceSettings::File { path } = &settings.source {
        // One read; an unreadable file is an error rather than something to wait for.
        let snapshot = source::file::load_snapshot(path, &settings.hostname)?;
        view.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .apply(&SourceEvent::Snapshot(snapshot));
    } else {
        let SourceHandle {
            events,
            synced: _,
            task: _task,
        } = start_source(&settings).await?;
        let (view_synced_tx, mut synced) = watch::channel(false);
        tokio::spawn(pump_events(
            events,
            Arc::clone(&view),
            health.clone(),
            runner_handle.clone(),
            Arc::clone(&pending),
            view_synced_tx,
        ));
        tracing::info!(
            source = source_name(&settings),
            "waiting for Services and EndpointSlices to sync"
        );
        let mut shutdown = shutdown_rx.clone();
        tokio::select! {
            result = synced.wait_for(|s| *s) => {
                if result.is_err() {
                    return Err(DaemonError::SourceEnded(source_name(&settings)));
                }
            }
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
        }
    }

    if !settings.dry_run {
        let mut dataplane = crate::dataplane::DataPlane::open(&settings, Arc::clone(&view)).await?;
        if once {
            let outcome = dataplane.sync(runner::SyncKind::Full).await?;
            println!("kernel full sync: {outcome}");
            return Ok(());
        }
        dataplane.wake_runner_with(runner_handle.clone());
        // Health checks of `externalTrafficPolicy: Local` Services, on every address (as
        // kube-proxy does without --nodeport-addresses).
        dataplane.serve_health_checks_with(Arc::new(ServiceHealthServers::new(
            vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)],
            health.clone(),
        )));
        let mut target = CountingTarget {
            inner: dataplane,
            pending,
        };
        let scheduler =
            SyncScheduler::new(RunnerConfig::from_settings(&settings.ipvs), Instant::now());
        let result = runner::run(
            scheduler,
            triggers,
            &mut target,
            Some(health),
            shutdown_rx,
            false,
        )
        .await;
        drop(runner_handle);
        drop(servers);
        return result.map_err(DaemonError::from);
    }

    let mut target = CountingTarget {
        inner: DryRunTarget::new(
            Arc::clone(&view),
            settings.planner_config(),
            &settings.hostname,
            &settings.dummy_interface,
            std::io::stdout(),
        ),
        pending,
    };
    let scheduler = SyncScheduler::new(RunnerConfig::from_settings(&settings.ipvs), Instant::now());
    let result = runner::run(
        scheduler,
        triggers,
        &mut target,
        Some(health),
        shutdown_rx,
        once,
    )
    .await;
    drop(runner_handle);
    drop(servers);
    result.map_err(DaemonError::from)
}
