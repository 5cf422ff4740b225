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

use http::HeaderValue;
use http::header::USER_AGENT;
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

/// A client for `config`'s API server, its requests sent with [`user_agent`] unless the
/// configuration names another. A proxy in the configuration goes through kube's own stack
/// (which says whether this build can use it), with its default read buffer.
pub(crate) fn build(mut config: kube::Config) -> Result<kube::Client, KubeSourceError> {
    let error = |e: kube::Error| KubeSourceError::Client(e.to_string());
    if !config.headers.iter().any(|(name, _)| name == USER_AGENT) {
        let agent = HeaderValue::from_str(&user_agent())
            .map_err(|e| KubeSourceError::Client(format!("the User-Agent header: {e}")))?;
        config.headers.push((USER_AGENT, agent));
    }
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

/// The `User-Agent` of the API client, in kube-proxy's form (`kube-proxy/v1.35.0
/// (linux/amd64) kubernetes/<commit>`): `ipvs-proxier/v<version> (<os>/<arch>)`, the
/// operating system and architecture named as Go names them (`GOOS/GOARCH`), so the API
/// server's audit log and metrics tell this client apart the way they tell kube-proxy.
pub fn user_agent() -> String {
    format!(
        "ipvs-proxier/v{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        go_arch(std::env::consts::ARCH)
    )
}

/// Go's name (`GOARCH`) of a Rust target architecture; Rust's own where they agree.
fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_agent_names_the_version_and_the_platform_as_go_does() {
        let agent = user_agent();
        assert!(agent.starts_with(&format!("ipvs-proxier/v{} (", env!("CARGO_PKG_VERSION"))));
        assert!(HeaderValue::from_str(&agent).is_ok(), "{agent:?}");
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_arch("s390x"), "s390x");
        if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
            assert!(agent.ends_with(" (linux/amd64)"), "{agent:?}");
        }
    }
}
