//! A tiny HTTP/1 server (hyper) for the metrics, health and service health-check endpoints.
//! Handlers are plain functions of method and path; the server stops when dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// A response body.
pub type Body = Full<Bytes>;

/// Answers one request from its method and path.
pub type Handler = Arc<dyn Fn(&Method, &str) -> Response<Body> + Send + Sync>;

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

async fn accept_loop(what: String, listener: TcpListener, handler: Handler) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                tracing::warn!(server = %what, %error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let handler = Arc::clone(&handler);
        let what = what.clone();
        connections.spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let response = handler(req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(server = %what, %peer, %error, "connection ended with an error");
            }
        });
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

#[cfg(test)]
pub(crate) mod test_client {
    //! A minimal HTTP client for tests (loopback only).

    use std::net::SocketAddr;

    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper_util::rt::TokioIo;

    /// GETs `path` from `addr`; returns status, headers and body text.
    pub async fn get(addr: SocketAddr, path: &str) -> (u16, http::HeaderMap, String) {
        assert!(addr.ip().is_loopback(), "tests talk to loopback only");
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header(http::header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .expect("request");
        let resp = sender.send_request(req).await.expect("response");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_handler_and_stops_on_shutdown() {
        let handler: Handler = Arc::new(|method, path| {
            if method == Method::GET && path == "/hello" {
                response(StatusCode::OK, "text/plain", "hi")
            } else {
                not_found()
            }
        });
        let server = HttpServer::bind("test", "127.0.0.1:0".parse().expect("addr"), handler)
            .await
            .expect("bind");
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        let (status, headers, body) = test_client::get(addr, "/hello").await;
        assert_eq!((status, body.as_str()), (200, "hi"));
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let (status, _, _) = test_client::get(addr, "/nope").await;
        assert_eq!(status, 404);
        server.shutdown();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "port closed after shutdown"
        );
    }
}
