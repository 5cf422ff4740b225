//! Health endpoints, as kube-proxy serves them:
//! - the proxier's `/healthz` and `/livez` on `--healthz-bind-address` ([`ProxyHealth`],
//!   [`serve_proxy_health`]): unhealthy (503) once a queued change has waited longer than the
//!   health timeout (2 × sync period) without a successful sync; `/healthz` is also 503 while
//!   the node is being deleted or carries the cluster autoscaler's `ToBeDeletedByClusterAutoscaler`
//!   taint;
//! - one health-check node port per `externalTrafficPolicy: Local` Service
//!   ([`ServiceHealthServers`]): 200 while the node has a local endpoint and the proxier is
//!   healthy, 503 otherwise, so load balancers skip nodes without endpoints.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use http::StatusCode;

use crate::http_server::{BindError, Handler, HttpServer, not_found, response};
use proxier_core::model::ServiceName;

/// The header of a Service health answer that carries the node's local endpoint count.
pub const ENDPOINT_WEIGHT_HEADER: &str = "x-load-balancing-endpoint-weight";

/// Formats a time the way Go's `time.Time.String()` prints a UTC time
/// (`2006-01-02 15:04:05.999999999 +0000 UTC`); `None` is Go's zero time.
pub fn format_go_time(t: Option<SystemTime>) -> String {
    t.and_then(|t| jiff::Timestamp::try_from(t).ok())
        .map_or_else(
            || "0001-01-01 00:00:00 +0000 UTC".to_owned(),
            // `%.f`: the fraction without trailing zeros, nothing when it is zero (as Go).
            |t| t.strftime("%Y-%m-%d %H:%M:%S%.f +0000 UTC").to_string(),
        )
}

#[derive(Debug)]
struct HealthState {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<SystemTime>,
    node_eligible: bool,
}

/// The proxier's health, shared between the sync runner (which reports queued changes and
/// finished syncs) and the health servers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProxyHealth {
    timeout: Duration,
    state: Arc<Mutex<HealthState>>,
}

/// What a health endpoint answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthAnswer {
    /// 200 or 503.
    pub status: StatusCode,
    /// The JSON body.
    pub body: String,
}

impl ProxyHealth {
    /// Health with the given timeout (use [`crate::settings::Settings::health_timeout`]).
    /// The node counts as eligible until a Node object says otherwise.
    pub fn new(timeout: Duration) -> ProxyHealth {
        ProxyHealth {
            timeout,
            state: Arc::new(Mutex::new(HealthState {
                last_updated: None,
                oldest_pending: None,
                node_eligible: true,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HealthState> {
        // A panic while holding this lock cannot leave the plain data inconsistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A change arrived that needs a sync. Only the oldest unsynced change counts.
    pub fn queued_update(&self, now: SystemTime) {
        let mut st = self.lock();
        st.oldest_pending.get_or_insert(now);
    }

    /// A sync succeeded: everything queued before it is programmed.
    pub fn updated(&self, now: SystemTime) {
        let mut st = self.lock();
        st.oldest_pending = None;
        st.last_updated = Some(now);
    }

    /// Records whether this node may take traffic (see [`proxier_core::k8s::node_eligible`];
    /// `false` also while its Node object is deleted).
    pub fn set_node_eligible(&self, eligible: bool) {
        self.lock().node_eligible = eligible;
    }

    /// Whether the node is eligible for traffic.
    pub fn node_eligible(&self) -> bool {
        self.lock().node_eligible
    }

    /// Whether the proxier is healthy at `now`, and the time of its last successful sync.
    /// Healthy while starting (no sync yet), while nothing is queued, or while the oldest
    /// queued change is younger than the timeout.
    pub fn is_healthy(&self, now: SystemTime) -> (bool, Option<SystemTime>) {
        let st = self.lock();
        let Some(last_updated) = st.last_updated else {
            return (true, None);
        };
        let healthy = match st.oldest_pending {
            None => true,
            Some(queued) => now.duration_since(queued).unwrap_or(Duration::ZERO) < self.timeout,
        };
        (healthy, Some(last_updated))
    }

    fn answer(&self, now: SystemTime, with_node: bool) -> HealthAnswer {
        let (mut healthy, mut last_updated) = self.is_healthy(now);
        let eligible = self.node_eligible();
        if with_node {
            healthy = healthy && eligible;
        }
        // As kube-proxy: a healthy answer reports lastUpdated as now.
        if healthy {
            last_updated = Some(now);
        }
        let last = json_string(&format_go_time(last_updated));
        let current = json_string(&format_go_time(Some(now)));
        let body = if with_node {
            format!(
                r#"{{"lastUpdated": {last},"currentTime": {current}, "nodeEligible": {eligible}}}"#
            )
        } else {
            format!(r#"{{"lastUpdated": {last},"currentTime": {current}}}"#)
        };
        HealthAnswer {
            status: if healthy {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            body,
        }
    }

    /// The `/healthz` answer at `now` (proxier health and node eligibility).
    pub fn healthz(&self, now: SystemTime) -> HealthAnswer {
        self.answer(now, true)
    }

    /// The `/livez` answer at `now` (proxier health only).
    pub fn livez(&self, now: SystemTime) -> HealthAnswer {
        self.answer(now, false)
    }
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// Serves `/healthz` and `/livez` on `addr`.
pub async fn serve_proxy_health(
    addr: SocketAddr,
    health: ProxyHealth,
) -> Result<HttpServer, BindError> {
    let handler: Handler = Arc::new(move |_method, path| {
        let now = SystemTime::now();
        let (answer, livez) = match path {
            "/healthz" => (health.healthz(now), false),
            "/livez" => (health.livez(now), true),
            _ => return not_found(),
        };
        crate::metrics::record_health_answer(livez, answer.status.as_u16());
        response(answer.status, "application/json", answer.body)
    });
    HttpServer::bind("healthz", addr, handler).await
}

/// The body and status of a Service health check.
pub fn service_health_answer(
    service: &ServiceName,
    local_endpoints: usize,
    proxy_healthy: bool,
) -> HealthAnswer {
    let body = serde_json::json!({
        "service": { "namespace": service.namespace, "name": service.name },
        "localEndpoints": local_endpoints,
        "serviceProxyHealthy": proxy_healthy,
    });
    HealthAnswer {
        status: if local_endpoints > 0 && proxy_healthy {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        body: serde_json::to_string_pretty(&body).unwrap_or_default(),
    }
}

#[derive(Debug)]
struct ServiceHealthInstance {
    port: u16,
    local_endpoints: Arc<AtomicUsize>,
    servers: Vec<HttpServer>,
}

/// The per-Service health-check servers (`spec.healthCheckNodePort` of
/// `externalTrafficPolicy: Local` Services).
#[derive(Debug)]
pub struct ServiceHealthServers {
    listen_ips: Vec<IpAddr>,
    proxy_health: ProxyHealth,
    services: tokio::sync::Mutex<HashMap<ServiceName, ServiceHealthInstance>>,
}

impl ServiceHealthServers {
    /// Servers that will listen on each of `listen_ips` (e.g. `0.0.0.0`, or the node's
    /// NodePort addresses) and report `proxy_health` as `serviceProxyHealthy`.
    pub fn new(listen_ips: Vec<IpAddr>, proxy_health: ProxyHealth) -> ServiceHealthServers {
        ServiceHealthServers {
            listen_ips,
            proxy_health,
            services: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Makes `wanted` (Service -> health-check port) the set of open servers: servers of
    /// Services no longer wanted, or whose port changed, are closed; new ones are opened.
    /// A port that cannot be bound is logged and reported; the others still open.
    pub async fn sync_services(&self, wanted: &HashMap<ServiceName, u16>) -> Vec<BindError> {
        let mut services = self.services.lock().await;
        services.retain(|key, inst| {
            let keep = wanted.get(key) == Some(&inst.port);
            if !keep {
                tracing::info!(service = %key, port = inst.port, "closing health check server");
            }
            keep
        });
        let mut errors = Vec::new();
        for (key, &port) in wanted {
            if services.contains_key(key) {
                continue;
            }
            let local_endpoints = Arc::new(AtomicUsize::new(0));
            let mut servers = Vec::new();
            let mut failed = false;
            for ip in &self.listen_ips {
                let handler = self.handler(key.clone(), Arc::clone(&local_endpoints));
                match HttpServer::bind(
                    &format!("health check of {key}"),
                    SocketAddr::new(*ip, port),
                    handler,
                )
                .await
                {
                    Ok(server) => servers.push(server),
                    Err(error) => {
                        tracing::error!(service = %key, port, %error, "cannot open health check port");
                        errors.push(error);
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                // Close what opened so a later sync retries the whole set.
                continue;
            }
            tracing::info!(service = %key, port, "opened health check server");
            services.insert(
                key.clone(),
                ServiceHealthInstance {
                    port,
                    local_endpoints,
                    servers,
                },
            );
        }
        errors
    }

    /// Sets the number of local endpoints per Service; Services not listed have none.
    pub async fn sync_endpoints(&self, counts: &HashMap<ServiceName, usize>) {
        let services = self.services.lock().await;
        for (key, inst) in services.iter() {
            let n = counts.get(key).copied().unwrap_or(0);
            inst.local_endpoints.store(n, Ordering::Relaxed);
        }
    }

    /// Addresses a Service's health check listens on (useful with port 0 in tests).
    pub async fn local_addrs(&self, service: &ServiceName) -> Vec<SocketAddr> {
        let services = self.services.lock().await;
        services
            .get(service)
            .map(|inst| inst.servers.iter().map(HttpServer::local_addr).collect())
            .unwrap_or_default()
    }

    fn handler(&self, key: ServiceName, local_endpoints: Arc<AtomicUsize>) -> Handler {
        let proxy_health = self.proxy_health.clone();
        Arc::new(move |_method, _path| {
            let (healthy, _) = proxy_health.is_healthy(SystemTime::now());
            let count = local_endpoints.load(Ordering::Relaxed);
            let answer = service_health_answer(&key, count, healthy);
            let mut reply = response(answer.status, "application/json", answer.body);
            // As kube-proxy: load balancers that weigh nodes (GCP's weighted Maglev) read
            // the local endpoint count here, on healthy and unhealthy answers alike.
            reply
                .headers_mut()
                .insert(ENDPOINT_WEIGHT_HEADER, http::HeaderValue::from(count));
            reply
        })
    }
}
