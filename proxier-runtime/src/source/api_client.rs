//! The Kubernetes API client's service stack: kube's own layers (base URI, retries of 429,
//! 503 and 504, authentication, extra headers) over a hyper client whose connections keep a
//! small read buffer ([`READ_BUFFER_MAX`]), with the `rest_client_*` metrics outermost.
//!
//! kube's default stack leaves hyper's read buffer at its default bound (about 400 KiB). A
//! streaming list of 10,000 objects fills it read after read, and as each event the source
//! decodes is a view into the buffer, every read while events are still held allocates a new
//! one: a relist churns buffers of 400–800 KiB, and each watch connection keeps its last one.
//! In the VM's fault soak (10,000 Services × 5, a 410 Gone to every watch once a second for
//! 15 s) that left the allocator's large pages 1.75 MiB fuller after the storm, for 0.3 MiB
//! more memory in use; with reads of at most 32 KiB the storm left nothing measurable
//! (CHANGELOG). What kube's stack has and this one does not: its debug-level tracing spans
//! and the client's expiry for exec-plugin certificates (`Client::valid_until`, which the
//! source does not read).

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

use super::kube::KubeSourceError;
use crate::api_metrics::ApiMetricsLayer;

/// The most a connection to the API server reads at once, and so the largest read buffer it
/// keeps. An event larger than this still arrives whole (it is gathered across reads).
pub const READ_BUFFER_MAX: usize = 32 * 1024;

/// A client for `config`'s API server. A proxy in the configuration goes through kube's own
/// stack (which says whether this build can use it), with its default read buffer.
pub(crate) fn build(config: kube::Config) -> Result<kube::Client, KubeSourceError> {
    let error = |e: kube::Error| KubeSourceError::Client(e.to_string());
    let metrics = ApiMetricsLayer::for_server(&config.cluster_url);
    if config.proxy_url.is_some() {
        let builder = kube::client::ClientBuilder::try_from(config).map_err(error)?;
        return Ok(builder.with_layer(&metrics).build());
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = config
        .rustls_https_connector_with_connector(http)
        .map_err(error)?;
    // The configuration's timeouts, as kube's own stack sets them.
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http1_max_buf_size(READ_BUFFER_MAX)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(metrics)
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().map_err(error)?)
        .layer(config.extra_headers_layer().map_err(error)?)
        .map_err(tower::BoxError::from)
        .service(hyper_client);
    Ok(kube::Client::new(service, config.default_namespace))
}
