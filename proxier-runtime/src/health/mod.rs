//! Health, as kube-proxy reports it:
//! - the proxier's `/healthz` and `/livez` ([`ProxyHealth`]; served by
//!   `servers::serve_proxy_health` with the `http` feature): unhealthy (503) once a queued change has waited longer than the
//!   health timeout (2 × sync period) without a successful sync; `/healthz` is also 503 while
//!   the node is being deleted or carries the cluster autoscaler's `ToBeDeletedByClusterAutoscaler`
//!   taint;
//! - one health-check node port per `externalTrafficPolicy: Local` Service
//!   ([`service_health_answer`]; served by `servers::ServiceHealthServers`): 200 while the node has a local endpoint and the proxier is
//!   healthy, 503 otherwise, so load balancers skip nodes without endpoints.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

#[cfg(feature = "http")]
pub mod servers;

use http::StatusCode;

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
    /// Health with the given timeout (kube-proxy uses twice the sync period).
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

/// The body and status of a Service health check.
pub fn service_health_answer(
    service: &ServiceName,
    local_endpoints: usize,
    proxy_healthy: bool,
) -> HealthAnswer {
    let body = serde_json::json!({
        "service": { "namespace": &*service.namespace, "name": &*service.name },
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
