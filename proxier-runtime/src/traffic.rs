//! Per-Service IPVS traffic metrics, beyond kube-proxy: the kernel's counters of each virtual
//! server (and, at [`TrafficLevel::Endpoint`], of each real server), labelled with the
//! Service port and role they serve rather than with addresses only.
//!
//! - [`TrafficDirectory`]: which Service port and role each planned virtual server serves.
//!   [`crate::observer::RuntimeObserver::track_traffic`] keeps it current after each sync,
//!   touching only the ports whose plan changed.
//! - [`TrafficMetrics::collect`]: one verified IPVS table read on its own netlink socket, at
//!   scrape time (it never waits for, nor holds, the engine), rendered in Prometheus' text
//!   format by [`render`].
//!
//! Counters are the kernel's own: a virtual server deleted and created again starts from zero,
//! which Prometheus takes as a counter reset (`rate()` stays right). A Service that goes away
//! leaves the directory, so its series are gone from the next scrape. Virtual servers the
//! proxier does not plan (foreign ones) are not exported.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use ipvs_netlink::{DestinationEntry, IpvsHandle, ServiceEntry, ServiceKey, Stats, Table};
use proxier_core::desired::{
    Desired, ServicePortName, ServicePortPlan, VirtualServerKey, VirtualServerRole,
};

/// How much traffic is exported (`--ipvs-traffic-metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrafficLevel {
    /// Nothing (the default: a table read per scrape costs seconds at 10,000 Services).
    #[default]
    Off,
    /// One series per virtual server (Service port, role, address).
    Service,
    /// Per virtual server and per real server.
    Endpoint,
}

impl FromStr for TrafficLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(TrafficLevel::Off),
            "service" => Ok(TrafficLevel::Service),
            "endpoint" => Ok(TrafficLevel::Endpoint),
            other => Err(format!(
                "unknown traffic metrics level {other:?} (off, service or endpoint)"
            )),
        }
    }
}

impl fmt::Display for TrafficLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrafficLevel::Off => "off",
            TrafficLevel::Service => "service",
            TrafficLevel::Endpoint => "endpoint",
        })
    }
}

/// What one planned virtual server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Served {
    port: Arc<ServicePortName>,
    role: VirtualServerRole,
}

/// Which Service port and role each planned virtual server serves.
#[derive(Debug, Default)]
pub struct TrafficDirectory {
    by_key: HashMap<VirtualServerKey, Served>,
    by_port: HashMap<ServicePortName, Vec<(VirtualServerKey, VirtualServerRole)>>,
}

impl TrafficDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        TrafficDirectory::default()
    }

    /// Takes the whole plan (after the first sync, or a re-plan of every port).
    pub fn rebuild(&mut self, desired: &Desired) {
        self.by_key.clear();
        self.by_port.clear();
        for (name, plan) in &desired.services {
            self.update_port(name, Some(plan));
        }
    }

    /// Takes one port's new plan (`None`: the port is gone); returns whether its virtual
    /// servers or their roles changed.
    pub fn update_port(&mut self, name: &ServicePortName, plan: Option<&ServicePortPlan>) -> bool {
        let served: Vec<(VirtualServerKey, VirtualServerRole)> = plan
            .map(|plan| {
                plan.virtual_servers
                    .iter()
                    .map(|(key, vs)| (*key, vs.role))
                    .collect()
            })
            .unwrap_or_default();
        if self
            .by_port
            .get(name)
            .map_or(served.is_empty(), |old| *old == served)
        {
            return false;
        }
        if let Some(old) = self.by_port.remove(name) {
            for (key, _) in old {
                // Another port may have claimed the key since (a conflict): keep its entry.
                if self.by_key.get(&key).is_some_and(|s| *s.port == *name) {
                    self.by_key.remove(&key);
                }
            }
        }
        if !served.is_empty() {
            let port = Arc::new(name.clone());
            for (key, role) in &served {
                self.by_key.insert(
                    *key,
                    Served {
                        port: Arc::clone(&port),
                        role: *role,
                    },
                );
            }
            self.by_port.insert(name.clone(), served);
        }
        true
    }

    /// Number of virtual servers it knows.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether it knows no virtual server.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// A directory shared between the observer that keeps it and the collector that reads it.
pub type SharedDirectory = Arc<Mutex<TrafficDirectory>>;

fn lock(directory: &SharedDirectory) -> MutexGuard<'_, TrafficDirectory> {
    // Plain data: a panic while it was held leaves nothing half-updated that matters here.
    directory
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One exported virtual server: its labels, and the kernel's entry.
struct Row<'t> {
    /// `namespace="…",service="…",…,address="…"`, written once for all its samples.
    labels: String,
    service: &'t ServiceEntry,
    destinations: &'t [DestinationEntry],
}

fn key_of(entry: &ServiceEntry) -> Option<VirtualServerKey> {
    match entry.service.key {
        ServiceKey::Tuple {
            addr,
            port,
            protocol,
        } => Some(VirtualServerKey {
            address: addr,
            port,
            protocol,
        }),
        ServiceKey::Fwmark { .. } => None,
    }
}

/// A metric's name (after `ipvs_proxier_service_` or `ipvs_proxier_endpoint_`), its help
/// text, and how a sample is read from `T`.
type Metric<T, V> = (&'static str, &'static str, fn(&T) -> V);

/// The kernel's counters.
const COUNTERS: [Metric<Stats, u64>; 5] = [
    ("connections_total", "Connections IPVS scheduled", |s| {
        s.conns
    }),
    ("packets_in_total", "Packets received", |s| s.in_packets),
    ("packets_out_total", "Packets sent", |s| s.out_packets),
    ("bytes_in_total", "Bytes received", |s| s.in_bytes),
    ("bytes_out_total", "Bytes sent", |s| s.out_bytes),
];

/// The name of every metric [`render`] writes at [`TrafficLevel::Endpoint`] (the service
/// level writes the first half).
pub fn metric_names() -> Vec<String> {
    let names = || {
        COUNTERS
            .iter()
            .map(|(name, ..)| *name)
            .chain(CONNECTION_GAUGES.iter().map(|(name, ..)| *name))
    };
    ["service", "endpoint"]
        .iter()
        .flat_map(|level| names().map(move |name| format!("ipvs_proxier_{level}_{name}")))
        .collect()
}

/// Renders the traffic of the virtual servers of `table` that `directory` knows, in
/// Prometheus' text exposition format (nothing at [`TrafficLevel::Off`]).
pub fn render(table: &Table, directory: &TrafficDirectory, level: TrafficLevel) -> String {
    render_resolved(table, &resolve(table, directory), level)
}

/// What each entry of `table` serves (`None`: not the proxier's): the only part of a scrape
/// that needs the directory, so that its lock is held for lookups only, never while
/// formatting (the observer takes it after every sync).
fn resolve(table: &Table, directory: &TrafficDirectory) -> Vec<Option<Served>> {
    table
        .iter()
        .map(|(service, _)| directory.by_key.get(&key_of(service)?).cloned())
        .collect()
}

fn render_resolved(table: &Table, served: &[Option<Served>], level: TrafficLevel) -> String {
    if level == TrafficLevel::Off {
        return String::new();
    }
    let rows: Vec<Row<'_>> = table
        .iter()
        .zip(served)
        .filter_map(|((service, destinations), served)| {
            let served = served.as_ref()?;
            let ServiceKey::Tuple { addr, .. } = service.service.key else {
                return None;
            };
            Some(Row {
                labels: labels(served, addr),
                service,
                destinations,
            })
        })
        .collect();
    let endpoint = level == TrafficLevel::Endpoint;
    // About 190 bytes a sample: sized once instead of grown by doubling.
    let samples: usize = rows
        .iter()
        .map(|row| 1 + if endpoint { row.destinations.len() } else { 0 })
        .sum();
    let mut out = String::with_capacity(samples * 7 * 200);
    for (name, help, read) in COUNTERS {
        header(&mut out, "service", name, "counter", help, "virtual server");
        for row in &rows {
            sample(
                &mut out,
                "service",
                name,
                &row.labels,
                None,
                read(&row.service.stats),
            );
        }
    }
    for (name, help, read) in CONNECTION_GAUGES {
        header(&mut out, "service", name, "gauge", help, "virtual server");
        for row in &rows {
            let sum = row.destinations.iter().map(read).map(u64::from).sum();
            sample(&mut out, "service", name, &row.labels, None, sum);
        }
    }
    if endpoint {
        let endpoints: Vec<Vec<String>> = rows
            .iter()
            .map(|row| row.destinations.iter().map(endpoint_label).collect())
            .collect();
        let each = |out: &mut String, name: &str, value: &dyn Fn(&DestinationEntry) -> u64| {
            for (row, labels) in rows.iter().zip(&endpoints) {
                for (d, label) in row.destinations.iter().zip(labels) {
                    sample(out, "endpoint", name, &row.labels, Some(label), value(d));
                }
            }
        };
        for (name, help, read) in COUNTERS {
            header(&mut out, "endpoint", name, "counter", help, "real server");
            each(&mut out, name, &|d| read(&d.stats));
        }
        for (name, help, read) in CONNECTION_GAUGES {
            header(&mut out, "endpoint", name, "gauge", help, "real server");
            each(&mut out, name, &|d| u64::from(read(d)));
        }
    }
    out
}

/// Connection counts of a real server (summed over them for a virtual server).
const CONNECTION_GAUGES: [Metric<DestinationEntry, u32>; 2] = [
    ("active_connections", "Established connections", |d| {
        d.active_conns
    }),
    (
        "inactive_connections",
        "Connections not established (or closing)",
        |d| d.inactive_conns,
    ),
];

fn header(out: &mut String, level: &str, name: &str, kind: &str, help: &str, of: &str) {
    let _ = writeln!(
        out,
        "# HELP ipvs_proxier_{level}_{name} {help}, per {of} of a Service port (IPVS counters)."
    );
    let _ = writeln!(out, "# TYPE ipvs_proxier_{level}_{name} {kind}");
}

/// The labels of a virtual server's samples.
fn labels(served: &Served, address: IpAddr) -> String {
    let port = &served.port;
    format!(
        "namespace=\"{}\",service=\"{}\",port=\"{}\",protocol=\"{}\",role=\"{}\",family=\"{}\",address=\"{address}\"",
        escape(&port.namespace),
        escape(&port.name),
        escape(&port.port),
        port.protocol,
        role(served.role),
        family(address),
    )
}

/// The label a real server adds to its virtual server's.
fn endpoint_label(d: &DestinationEntry) -> String {
    match d.destination.addr {
        IpAddr::V4(a) => format!(",endpoint=\"{a}:{}\"", d.destination.port),
        IpAddr::V6(a) => format!(",endpoint=\"[{a}]:{}\"", d.destination.port),
    }
}

fn sample(
    out: &mut String,
    level: &str,
    name: &str,
    labels: &str,
    endpoint: Option<&str>,
    value: u64,
) {
    out.push_str("ipvs_proxier_");
    out.push_str(level);
    out.push('_');
    out.push_str(name);
    out.push('{');
    out.push_str(labels);
    if let Some(endpoint) = endpoint {
        out.push_str(endpoint);
    }
    out.push_str("} ");
    let _ = write!(out, "{value}");
    out.push('\n');
}

fn family(address: IpAddr) -> &'static str {
    if address.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// The Service field the role comes from, as Kubernetes spells it.
fn role(role: VirtualServerRole) -> &'static str {
    match role {
        VirtualServerRole::ClusterIp => "ClusterIP",
        VirtualServerRole::NodePort => "NodePort",
        VirtualServerRole::ExternalIp => "ExternalIP",
        VirtualServerRole::LoadBalancer => "LoadBalancer",
    }
}

/// A label value as the text format wants it (backslash, quote and newline escaped).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Reads the node's IPVS table at scrape time and renders its per-Service traffic.
///
/// The reads and the formatting run on a thread of their own at the lowest CPU priority
/// (nice 19), with its own netlink socket: a scrape at 10,000 Services × 5 endpoints takes
/// seconds of CPU, and at that priority it takes only what the syncs leave, so a change that
/// lands during a scrape is not kept waiting for the CPU. Cloning shares that thread; it ends
/// when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct TrafficMetrics {
    level: TrafficLevel,
    requests: tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<String>>,
}

/// The collector thread's name.
const COLLECTOR_THREAD: &str = "traffic-metrics";

/// Why [`TrafficMetrics::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum TrafficMetricsError {
    /// The collector thread or its runtime could not be started.
    #[error("cannot start the traffic metrics thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The IPVS netlink socket could not be opened.
    #[error(transparent)]
    Ipvs(#[from] ipvs_netlink::Error),
}

impl TrafficMetrics {
    /// A collector on its own thread and IPVS netlink socket, reading names from
    /// `directory`.
    pub async fn connect(
        level: TrafficLevel,
        directory: SharedDirectory,
    ) -> Result<TrafficMetrics, TrafficMetricsError> {
        let (requests, mut queue) =
            tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<String>>(4);
        let (ready, connected) = tokio::sync::oneshot::channel();
        let collector = async move {
            // One socket: the scrape's read stays on this low-priority thread instead of
            // spreading its dumps over the other CPUs.
            let handle = match IpvsHandle::new().await {
                Ok(handle) => handle.with_read_sockets(1),
                Err(error) => {
                    let _ = ready.send(Err(error.into()));
                    return;
                }
            };
            let _ = ready.send(Ok(()));
            while let Some(reply) = queue.recv().await {
                let page = read_and_render(&handle, &directory, level).await;
                let _ = reply.send(page);
            }
        };
        let ended = proxier_core::priority::spawn_in_background(
            COLLECTOR_THREAD,
            proxier_core::priority::LOWEST_NICE,
            collector,
        )
        .map_err(TrafficMetricsError::Thread)?;
        // The collector ends when every handle is dropped (its queue closes); dropping the
        // receiver before that would cancel it, so a task holds it until then.
        tokio::spawn(async move {
            let _ = ended.await;
        });
        match connected.await {
            Ok(Ok(())) => Ok(TrafficMetrics { level, requests }),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(TrafficMetricsError::Thread(std::io::Error::other(
                "it stopped before it connected",
            ))),
        }
    }

    /// The exported level.
    pub fn level(&self) -> TrafficLevel {
        self.level
    }

    /// One verified table read, rendered ([`render`]); a failed read is logged and renders
    /// nothing (the scrape still gets every other metric).
    pub async fn collect(&self) -> String {
        if self.level == TrafficLevel::Off {
            return String::new();
        }
        let (reply, page) = tokio::sync::oneshot::channel();
        if self.requests.send(reply).await.is_err() {
            tracing::error!("the traffic metrics thread is gone");
            return String::new();
        }
        page.await.unwrap_or_default()
    }
}

/// One verified read of the table, rendered at `level`.
async fn read_and_render(
    handle: &IpvsHandle,
    directory: &SharedDirectory,
    level: TrafficLevel,
) -> String {
    let table = match handle.table_verified().await {
        Ok(read) => read.table,
        Err(error) => {
            tracing::warn!(%error, "cannot read the IPVS table for traffic metrics");
            return String::new();
        }
    };
    let served = resolve(&table, &lock(directory));
    render_resolved(&table, &served, level)
}
