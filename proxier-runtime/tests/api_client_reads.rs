//! The API client reads a long response in pieces of at most
//! [`proxier_runtime::source::api_client::READ_BUFFER_MAX`]: a streaming list of megabytes,
//! read while its events are still held, never makes the connection allocate a read buffer
//! of hundreds of KiB (hyper's default bound, about 400 KiB, which kube's own stack keeps).
//! Measured with a counting global allocator, in its own binary so that no other test
//! allocates meanwhile; the server is a plain socket that writes a body made beforehand, so
//! nothing it does allocates while the client reads.
#![allow(clippy::unwrap_used)]

#[path = "../../proxier-core/tests/support/counting_allocator.rs"]
mod counting_allocator;

use std::io::{Read, Write};
use std::net::TcpListener;

use counting_allocator::{CountingAllocator, largest_allocation, reset_largest};
use http_body_util::BodyExt;
use proxier_runtime::source::api_client::READ_BUFFER_MAX;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The response's body: 8 MiB, in chunks of 256 KiB (as an API server streams a list).
const BODY: usize = 8 << 20;
const CHUNK: usize = 256 << 10;

/// A whole chunked HTTP/1.1 response carrying [`BODY`] bytes.
fn response() -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: application/vnd.kubernetes.protobuf;stream=watch\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for n in 0..BODY / CHUNK {
        out.extend_from_slice(format!("{CHUNK:x}\r\n").as_bytes());
        out.extend(std::iter::repeat_n(b'a' + (n % 26) as u8, CHUNK));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_response_is_read_without_a_large_read_buffer() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let response = response();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        // The request's head, read into a fixed buffer (no allocation).
        let mut head = [0u8; 8192];
        let mut read = 0;
        while !head[..read].windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut head[read..]).unwrap();
            assert!(n > 0, "the client closed before its request ended");
            read += n;
        }
        stream.write_all(&response).unwrap();
    });

    let client =
        proxier_runtime::source::kube::client(None, Some(&format!("http://127.0.0.1:{port}")))
            .await
            .unwrap();
    let request = http::Request::get("/api/v1/services?watch=true")
        .body(Vec::new())
        .unwrap();
    let response = client.send(request.map(Into::into)).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // Every piece is held until the end, as events are held while they are decoded: a read
    // buffer cannot be reused while views of it live, so each read gets a new one.
    let mut held = Vec::with_capacity(BODY / 1024);
    let mut total = 0;
    reset_largest();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            total += data.len();
            held.push(data);
        }
    }
    let largest = largest_allocation();
    server.join().unwrap();
    assert_eq!(total, BODY);
    println!(
        "{} pieces read; the largest allocation while reading: {largest} bytes",
        held.len()
    );
    assert!(
        largest <= 2 * READ_BUFFER_MAX,
        "an allocation of {largest} bytes while reading (read buffer bound {READ_BUFFER_MAX})"
    );
}
