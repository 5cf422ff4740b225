//! `kube-embedded`: the daemon's whole job for a program that embeds the engine — the
//! runtime's Kubernetes source, kube-proxy's health servers and the `kubeproxy_*` metrics
//! around a [`KernelProxier`] driven by the engine's driver loop. No proxy, source or health
//! logic of its own: everything below is wiring.
//!
//! ```text
//! kube-embedded --node NAME [--master URL | --kubeconfig FILE] [--link NAME]
//!               [--healthz ADDR:PORT] [--metrics ADDR:PORT]
//! ```
//! Without `--master` and `--kubeconfig` it uses the in-cluster configuration, then
//! `~/.kube/config`. Health (`/healthz`, `/livez`) defaults to `0.0.0.0:10256`, metrics to
//! `127.0.0.1:10249`; Services with `externalTrafficPolicy: Local` get their health-check node
//! port on every address. Needs CAP_NET_ADMIN, IPVS, the dummy link type and `nft`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use http::StatusCode;
use proxier_core::engine::driver::{self, DriverConfig, ProxierHandle};
use proxier_core::model::Config;
use proxier_core::{KernelProxier, ProxierConfig};
use proxier_runtime::feed;
use proxier_runtime::health::ProxyHealth;
use proxier_runtime::health::servers::{ServiceHealthServers, serve_proxy_health};
use proxier_runtime::http_server::{Handler, HttpServer, not_found, response};
use proxier_runtime::observer::RuntimeObserver;
use proxier_runtime::source::kube;
use tokio::signal::unix::{SignalKind, signal};

/// kube-proxy's timing: a full resync every 30 s, at most 2 syncs back to back, then 1 a second.
const SYNC_PERIOD: Duration = Duration::from_secs(30);

struct Args {
    node: String,
    master: Option<String>,
    kubeconfig: Option<std::path::PathBuf>,
    link: String,
    healthz: SocketAddr,
    metrics: SocketAddr,
}

impl Args {
    fn parse() -> anyhow::Result<Args> {
        let mut args = Args {
            node: String::new(),
            master: None,
            kubeconfig: None,
            link: "kube-ipvs0".to_owned(),
            healthz: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 10256)),
            metrics: SocketAddr::from((Ipv4Addr::LOCALHOST, 10249)),
        };
        let mut words = std::env::args().skip(1);
        while let Some(flag) = words.next() {
            let value = words
                .next()
                .with_context(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--node" => args.node = value,
                "--master" => args.master = Some(value),
                "--kubeconfig" => args.kubeconfig = Some(value.into()),
                "--link" => args.link = value,
                "--healthz" => args.healthz = value.parse().context("--healthz")?,
                "--metrics" => args.metrics = value.parse().context("--metrics")?,
                _ => bail!("unknown flag {flag} (see the program's doc)"),
            }
        }
        if args.node.is_empty() {
            bail!("--node NAME is required");
        }
        Ok(args)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse()?;

    // Metrics: the runtime records through the `metrics` facade; the exporter is ours to pick
    // (the runtime's `prometheus` feature gives its builder the catalogue's buckets).
    let prometheus = proxier_runtime::metrics::prometheus_builder()
        .install_recorder()
        .context("installing the Prometheus recorder")?;
    proxier_runtime::metrics::register();
    let scrape: Handler = Arc::new(move |_method, path| match path {
        "/metrics" => response(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            prometheus.render(),
        ),
        _ => not_found(),
    });
    let _metrics = HttpServer::bind("metrics", args.metrics, scrape).await?;

    // The engine on this network namespace's kernel, following the node's own addresses.
    let mut config = ProxierConfig::new(&args.node, Config::default());
    config.node_addresses_from_kernel = true;
    let mut proxier = KernelProxier::open(config, &args.link).await?;
    // The first sync's kernel read runs while the source lists.
    proxier.read_ahead();

    // Health: /healthz and /livez, and the health-check node ports of Local Services.
    let health = ProxyHealth::new(2 * SYNC_PERIOD);
    let _healthz = serve_proxy_health(args.healthz, health.clone()).await?;
    let mut observer = RuntimeObserver::new(health.clone());
    let everywhere = vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)];
    observer.serve_health_checks(Arc::new(ServiceHealthServers::new(everywhere, health)));

    // The source: kube-proxy's watches; its first batch is the complete picture.
    let client = kube::client(args.kubeconfig.as_deref(), args.master.as_deref()).await?;
    let hostname = args.node.clone();
    let mut source = kube::spawn(client, kube::KubeSourceConfig::new(hostname));
    // Services listed before the EndpointSlices: their addresses are bound meanwhile (a
    // fresh start's longest write); nothing comes when both list at once, and a restart
    // (its link already full) leaves them to the first batch.
    if let Some(ahead) = source.services_ahead.take()
        && let Ok(services) = ahead.await
        && proxier.can_bind_ahead().await
    {
        observer.feed().apply_first(&mut proxier, services);
        let addresses = proxier.bind_ahead().await;
        tracing::info!(addresses, "Services listed; binding their addresses ahead");
    }
    let first = source
        .events
        .recv()
        .await
        .context("the source ended before it synced")?;
    let changes = observer.feed().apply_first(&mut proxier, first);
    tracing::info!(changes, "Services and EndpointSlices listed");

    // From here on the driver syncs; later changes reach it through a handle.
    let (handle, commands) = ProxierHandle::new();
    tokio::spawn(feed::forward(
        source.events,
        handle.clone(),
        observer.feed(),
    ));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        stop.send_replace(true);
    });
    let timing = DriverConfig::new(SYNC_PERIOD, Duration::from_secs(1), 2);
    driver::run(&mut proxier, timing, commands, &mut observer, stopped).await;
    Ok(())
}
