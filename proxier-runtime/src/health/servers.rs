//! The health servers (feature `http`): the proxier's `/healthz` and `/livez`, and one
//! health-check node port per `externalTrafficPolicy: Local` Service.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use proxier_core::model::ServiceName;

use super::{ENDPOINT_WEIGHT_HEADER, ProxyHealth, service_health_answer};
use crate::http_server::{BindError, Handler, HttpServer, not_found, response};

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
