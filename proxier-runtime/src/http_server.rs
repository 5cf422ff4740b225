//! A tiny HTTP/1 server (hyper) for the metrics, health and service health-check endpoints.
//! Handlers are plain functions of method and path ([`Handler`]), or return a future when the
//! answer needs I/O ([`AsyncHandler`]); the server stops when dropped.
//!
//! The servers listen where anyone on the network may talk to them (the health port is
//! `0.0.0.0:10256`, as kube-proxy's), so no client can hold them up or take them down:
//! - at most [`MAX_CONNECTIONS`] connections are served at once per server; a connection
//!   beyond that is closed as soon as it is accepted (the health check of a flooded node fails
//!   fast instead of queueing, and memory and file descriptors stay bounded);
//! - a client has [`HEADER_READ_TIMEOUT`] to send a request's head (also between keep-alive
//!   requests), and a connection lives at most [`MAX_CONNECTION_LIFETIME`], so slow or stalled
//!   clients give their slot back;
//! - request heads are limited to [`MAX_HEAD_BYTES`]; malformed requests get hyper's error
//!   answer (400, 431, ...) or a closed connection, never a panic; a panic in a handler
//!   answers 500 for that one request.
//!
//! Each server runs on its own tasks: nothing here waits on the sync loop or blocks it.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Connections served at once by one server; more are closed as soon as they are accepted.
/// Health probes and scrapes need a handful.
pub const MAX_CONNECTIONS: usize = 256;

/// How long a client may take to send a request's head (from the connection's start, or from
/// the previous response on a kept-alive connection).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// After this long a connection is asked to close (after its current response); it is cut
/// [`SHUTDOWN_GRACE`] later if the client still does not read.
pub const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// How long a connection asked to close may take to finish its response.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The largest request head (request line and headers) read; larger ones are refused.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// A response body.
pub type Body = Full<Bytes>;

/// Answers one request from its method and path.
pub type Handler = Arc<dyn Fn(&Method, &str) -> Response<Body> + Send + Sync>;

/// The answer to one request, still to come.
pub type ResponseFuture = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// Answers one request from its method and path with a future: for answers that need I/O
/// (a kernel read at scrape time). Each answer runs as its own task.
pub type AsyncHandler = Arc<dyn Fn(&Method, &str) -> ResponseFuture + Send + Sync>;

/// A server could not listen.
#[derive(Debug, thiserror::Error)]
#[error("listening for {what} on {addr}: {source}")]
pub struct BindError {
    /// Which server.
    pub what: String,
    /// The address.
    pub addr: SocketAddr,
    /// What the OS said.
    pub source: std::io::Error,
}

/// A running server. Dropping it stops accepting and closes its connections.
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    tasks: JoinSet<()>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and serves `handler` on it.
    pub async fn bind(
        what: &str,
        addr: SocketAddr,
        handler: Handler,
    ) -> Result<HttpServer, BindError> {
        let handler: AsyncHandler = Arc::new(move |method: &Method, path: &str| {
            let answer = handler(method, path);
            Box::pin(std::future::ready(answer)) as ResponseFuture
        });
        HttpServer::bind_async(what, addr, handler).await
    }

    /// [`HttpServer::bind`] with an [`AsyncHandler`].
    pub async fn bind_async(
        what: &str,
        addr: SocketAddr,
        handler: AsyncHandler,
    ) -> Result<HttpServer, BindError> {
        let listener = TcpListener::bind(addr).await.map_err(|source| BindError {
            what: what.to_owned(),
            addr,
            source,
        })?;
        let local_addr = listener.local_addr().map_err(|source| BindError {
            what: what.to_owned(),
            addr,
            source,
        })?;
        let mut tasks = JoinSet::new();
        let what = what.to_owned();
        tasks.spawn(accept_loop(what, listener, handler));
        Ok(HttpServer { local_addr, tasks })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops the server now.
    pub fn shutdown(mut self) {
        self.tasks.abort_all();
    }
}

async fn accept_loop(what: String, listener: TcpListener, handler: AsyncHandler) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    let mut refused: u64 = 0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // Reap finished connections so the set does not grow. A connection task that
            // panicked is reaped the same way: it took only itself down.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!(server = %what, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Full: close at once. Logged for the first and then every 1000th, so a flood
            // does not flood the log too.
            if refused.is_multiple_of(1000) {
                tracing::warn!(
                    server = %what,
                    %peer,
                    limit = MAX_CONNECTIONS,
                    refused = refused + 1,
                    "too many connections; closing new ones"
                );
            }
            refused = refused.wrapping_add(1);
            drop(stream);
            continue;
        };
        let handler = Arc::clone(&handler);
        let what = what.clone();
        connections.spawn(async move {
            serve_connection(&what, peer, stream, handler).await;
            drop(slot);
        });
    }
}

/// Serves one connection within the timeouts.
async fn serve_connection(
    what: &str,
    peer: SocketAddr,
    stream: tokio::net::TcpStream,
    handler: AsyncHandler,
) {
    let server = what.to_owned();
    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let path = req.uri().path().to_owned();
        // A handler bug answers 500 for its request instead of taking the connection down:
        // a panic while making the future is caught here, one while running it by its task.
        let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            handler(req.method(), &path)
        }));
        let server = server.clone();
        async move {
            let answer = match answer {
                Ok(future) => tokio::spawn(future).await.ok(),
                Err(_) => None,
            };
            Ok::<_, Infallible>(answer.unwrap_or_else(|| {
                tracing::error!(server = %server, path = %path, "handler panicked");
                response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain; charset=utf-8",
                    "internal error\n",
                )
            }))
        }
    });
    let connection = http1::Builder::new()
        // A client may shut its side down once its request is sent (socat, HTTP/1.0 tools):
        // an answer still being made (an async handler) must still reach it.
        .half_close(true)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_header_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = match tokio::time::timeout(MAX_CONNECTION_LIFETIME, connection.as_mut()).await {
        Ok(result) => result,
        Err(_) => {
            connection.as_mut().graceful_shutdown();
            match tokio::time::timeout(SHUTDOWN_GRACE, connection.as_mut()).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::debug!(server = %what, %peer, "connection cut: client does not read");
                    return;
                }
            }
        }
    };
    if let Err(error) = result {
        tracing::debug!(server = %what, %peer, %error, "connection ended with an error");
    }
}

/// A response with a status, a content type and a body.
pub fn response(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    resp.headers_mut().insert(
        header::HeaderName::from_static("x-content-type-options"),
        header::HeaderValue::from_static("nosniff"),
    );
    resp
}

/// 404 for unknown paths.
pub fn not_found() -> Response<Body> {
    response(
        StatusCode::NOT_FOUND,
        "text/plain; charset=utf-8",
        "404 page not found\n",
    )
}
