//! Metrics of the requests the Kubernetes API client makes, with client-go's names
//! (`rest_client_requests_total`, `rest_client_request_duration_seconds`, ...): a tower layer
//! put around the kube client's service stack.
//!
//! The layer sits outermost, so it sees each request once as the client sent it (kube's retries
//! happen inside) and its path without the server's address; the host comes from the cluster
//! URL. The duration runs until the response headers arrive (for a watch, until the stream
//! opens), as client-go measures it. A request that got no response (connection refused,
//! timeout, TLS failure) is counted with code `<error>`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::metrics::{ApiRequest, record_api_request};

/// Adds the `rest_client_*` metrics to a client's service stack.
#[derive(Debug, Clone)]
pub struct ApiMetricsLayer {
    host: Arc<str>,
}

impl ApiMetricsLayer {
    /// A layer labelling requests with `host` (the API server's `host:port`, client-go's `host`
    /// label).
    pub fn new(host: impl Into<String>) -> Self {
        ApiMetricsLayer {
            host: Arc::from(host.into()),
        }
    }

    /// A layer for the API server at `url` (its authority becomes the `host` label).
    pub fn for_server(url: &http::Uri) -> Self {
        Self::new(url.authority().map(|a| a.as_str()).unwrap_or_default())
    }
}

impl<S> Layer<S> for ApiMetricsLayer {
    type Service = ApiMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiMetrics {
            inner,
            host: Arc::clone(&self.host),
        }
    }
}

/// The service [`ApiMetricsLayer`] makes: records each request, then passes it on unchanged.
#[derive(Debug, Clone)]
pub struct ApiMetrics<S> {
    inner: S,
    host: Arc<str>,
}

/// The response future of [`ApiMetrics`].
pub type ApiMetricsFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// The response's body size when it states one (`Content-Length` or an exact size hint).
fn response_size<B: Body>(response: &Response<B>) -> Option<u64> {
    response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .or_else(|| response.body().size_hint().exact())
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ApiMetrics<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    ReqBody: Body,
    ResBody: Body + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ApiMetricsFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        // The path only: the query (label selectors, resource versions, timeouts) would make
        // every watch a new series.
        let path = request.uri().path().to_owned();
        let request_size = request.body().size_hint().exact();
        let host = Arc::clone(&self.host);
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let took = started.elapsed();
            let (status, response_size) = match &result {
                Ok(response) => (Some(response.status().as_u16()), response_size(response)),
                Err(_) => (None, None),
            };
            record_api_request(&ApiRequest {
                method: &method,
                host: &host,
                path: &path,
                status,
                took,
                request_size,
                response_size,
            });
            result
        })
    }
}
