//! Tests of `proxier_runtime::http_server`.

use http::{Method, StatusCode};
use proxier_runtime::http_server::*;
use std::sync::Arc;
use std::time::Duration;

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
    let (status, headers, body) = ipvs_proxier_tests::http_client::get(addr, "/hello").await;
    assert_eq!((status, body.as_str()), (200, "hi"));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let (status, _, _) = ipvs_proxier_tests::http_client::get(addr, "/nope").await;
    assert_eq!(status, 404);
    server.shutdown();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "port closed after shutdown"
    );
}

fn hello() -> Handler {
    Arc::new(|_method, _path| response(StatusCode::OK, "text/plain", "hi"))
}

/// Reads until the server closes; true if it did within `limit`.
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 512];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let server = HttpServer::bind("test", "127.0.0.1:0".parse().expect("addr"), hello())
        .await
        .expect("bind");
    let addr = server.local_addr();
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        held.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    // Let the server accept them all.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = tokio::net::TcpStream::connect(addr).await.expect("connect");
    assert!(
        closed_within(&mut extra, Duration::from_secs(2)).await,
        "a connection beyond the cap is closed at once"
    );
    // A slot freed is a connection served.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _, body) = ipvs_proxier_tests::http_client::get(addr, "/x").await;
    assert_eq!((status, body.as_str()), (200, "hi"));
    server.shutdown();
}

#[tokio::test]
async fn a_stalled_half_request_is_cut_after_the_header_timeout() {
    use tokio::io::AsyncWriteExt;
    let server = HttpServer::bind("test", "127.0.0.1:0".parse().expect("addr"), hello())
        .await
        .expect("bind");
    let addr = server.local_addr();
    let mut stalled = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stalled
        .write_all(b"GET /x HTTP/1.1\r\nHost: a\r\nX-Half: ")
        .await
        .expect("write");
    let started = std::time::Instant::now();
    assert!(closed_within(&mut stalled, HEADER_READ_TIMEOUT * 3).await);
    assert!(started.elapsed() >= HEADER_READ_TIMEOUT / 2);
    // An idle connection (nothing sent at all) is cut the same way.
    let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
    assert!(closed_within(&mut idle, HEADER_READ_TIMEOUT * 3).await);
    server.shutdown();
}

#[tokio::test]
async fn a_panicking_handler_answers_500_and_the_server_goes_on() {
    let handler: Handler = Arc::new(|_method, path| {
        assert!(path != "/panic", "handler bug");
        response(StatusCode::OK, "text/plain", "ok")
    });
    let server = HttpServer::bind("test", "127.0.0.1:0".parse().expect("addr"), handler)
        .await
        .expect("bind");
    let addr = server.local_addr();
    let (status, _, _) = ipvs_proxier_tests::http_client::get(addr, "/panic").await;
    assert_eq!(status, 500);
    let (status, _, body) = ipvs_proxier_tests::http_client::get(addr, "/fine").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    server.shutdown();
}

#[tokio::test]
async fn an_async_answer_reaches_a_client_that_shut_its_side_after_the_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let handler: AsyncHandler = Arc::new(|_method, path| {
        let path = path.to_owned();
        Box::pin(async move {
            if path == "/panic" {
                panic!("a handler bug");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            response(StatusCode::OK, "text/plain", "late")
        })
    });
    let server = HttpServer::bind_async("test", "127.0.0.1:0".parse().expect("addr"), handler)
        .await
        .expect("bind");
    let addr = server.local_addr();
    // As `printf 'GET ...' | socat - TCP:...` does: the request, then the write side shut.
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /late HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    stream.shutdown().await.expect("shut the write side");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
        .await
        .expect("an answer within 5 s")
        .expect("read");
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(answer.ends_with("late"), "{answer}");

    let (status, _, _) = ipvs_proxier_tests::http_client::get(addr, "/panic").await;
    assert_eq!(
        status, 500,
        "a panicking answer is a 500, not a dead server"
    );
    let (status, _, body) = ipvs_proxier_tests::http_client::get(addr, "/again").await;
    assert_eq!((status, body.as_str()), (200, "late"));
    server.shutdown();
}
