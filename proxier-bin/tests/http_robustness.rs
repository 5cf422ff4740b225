//! The metrics and health servers cannot be used to stop the proxier: malformed requests, a
//! client that sends half a request and stalls, and 10,000 concurrent connections to each
//! server leave the daemon running, its sync loop syncing (a source file edit still shows up
//! as a new `dry-run` line) and `/healthz` answering 200 again within seconds of the flood.
//!
//! The daemon is the file-source dry run with both servers on `127.0.0.1:0`. All traffic goes
//! to 127.0.0.1.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

use support::process::{CLUSTER, Daemon, listening_address, temp_file, wait_line};

/// Connections opened at once against each server.
const FLOOD: usize = 10_000;

/// The servers' header read timeout (`http_server::HEADER_READ_TIMEOUT`) plus slack for a
/// busy machine.
const STALL_LIMIT: Duration = Duration::from_secs(15);

fn note(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("http_robustness: {line}\n").as_bytes());
}

/// The dry-run daemon and its source file (removed when dropped).
struct Running {
    daemon: Daemon,
    source: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.source);
    }
}

impl Running {
    fn assert_running(&mut self, when: &str) {
        if let Some(status) = self.daemon.child.try_wait().expect("wait") {
            let stderr: Vec<String> = self.daemon.stderr_lines.try_iter().collect();
            panic!(
                "the daemon exited ({status}) {when}; stderr:\n{}",
                stderr.join("\n")
            );
        }
    }

    /// Rewrites the source file (temporary file, then rename) with `services` of the example's
    /// proxied Services left (9 or 8) and waits for the sync that follows.
    fn edit_and_wait_for_sync(&mut self, services: usize, when: &str) {
        let text = if services == 9 {
            CLUSTER.to_owned()
        } else {
            let smaller = CLUSTER.replacen(
                "  labels:\n    app: cart\n  name: cart\n",
                "  labels:\n    app: cart\n    service.kubernetes.io/service-proxy-name: other\n  name: cart\n",
                1,
            );
            assert_ne!(smaller, CLUSTER);
            smaller
        };
        let tmp = self.source.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write source");
        std::fs::rename(&tmp, &self.source).expect("rename source");
        let wanted = format!("{services} services");
        let started = Instant::now();
        let line = wait_line(&self.daemon.stdout_lines, when, |l| {
            l.starts_with("dry-run") && l.contains(&wanted)
        });
        note(&format!(
            "{when}: synced in {:?}: {line}",
            started.elapsed()
        ));
    }
}

fn start_daemon() -> Running {
    let source = temp_file("http-robustness", CLUSTER);
    let args = [
        "--dry-run",
        "--watch",
        "--hostname-override=node-a",
        "--healthz-bind-address=127.0.0.1:0",
        "--metrics-bind-address=127.0.0.1:0",
        "--ipvs-min-sync-period=0s",
        "--log-format=json",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([format!("--source-file={}", source.display())])
    .collect::<Vec<_>>();
    Running {
        daemon: Daemon::start(&args),
        source,
    }
}

/// One GET with `Connection: close`: the status, or why there was none.
fn try_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<u16, String> {
    assert!(addr.ip().is_loopback());
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = Vec::new();
    stream.read_to_end(&mut text).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&text);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))
}

/// Polls `GET path` until it answers 200; returns how long that took.
fn wait_ok(addr: SocketAddr, path: &str, limit: Duration, when: &str) -> Duration {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < limit {
        match try_get(addr, path, Duration::from_secs(2)) {
            Ok(200) => return started.elapsed(),
            Ok(status) => last = format!("status {status}"),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{path} on {addr} did not answer 200 within {limit:?} {when}: last {last}");
}

/// Sends `payload` on a fresh connection, half-closes, and reads whatever comes back (bounded).
/// Returns the status code if the server answered with one.
fn send_raw(addr: SocketAddr, payload: &[u8]) -> Option<u16> {
    assert!(addr.ip().is_loopback());
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(STALL_LIMIT))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .expect("write timeout");
    // The server may close before reading everything (e.g. a head over its limit): fine.
    let _ = stream.write_all(payload);
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = Vec::new();
    let started = Instant::now();
    let _ = stream.read_to_end(&mut answer);
    assert!(
        started.elapsed() < STALL_LIMIT,
        "the server held a connection with a malformed request open: {:?}",
        String::from_utf8_lossy(&payload[..payload.len().min(80)])
    );
    let text = String::from_utf8_lossy(&answer);
    text.strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
}

fn malformed_requests() -> Vec<(&'static str, Vec<u8>)> {
    let mut huge_header = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    huge_header.extend(std::iter::repeat_n(b'a', 64 * 1024));
    huge_header.extend_from_slice(b"\r\n\r\n");
    let mut many_headers = b"GET /healthz HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..500 {
        many_headers.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
    }
    many_headers.extend_from_slice(b"\r\n");
    let mut long_uri = b"GET /".to_vec();
    long_uri.extend(std::iter::repeat_n(b'x', 100 * 1024));
    long_uri.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut noise = Vec::with_capacity(4096);
    let mut x: u32 = 0x1234_5678;
    for _ in 0..4096 {
        // xorshift: deterministic noise, NUL bytes and high bytes included.
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise.push(x.to_le_bytes()[0]);
    }
    vec![
        ("binary noise", noise),
        ("empty line", b"\r\n\r\n".to_vec()),
        ("bad version", b"GET /healthz HTTP/9.9\r\n\r\n".to_vec()),
        ("no version", b"GET /healthz\r\n\r\n".to_vec()),
        ("bad method", b"G\x00T /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("header without colon", b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n".to_vec()),
        ("bad header name", b"GET /healthz HTTP/1.1\r\nHo st: x\r\n\r\n".to_vec()),
        ("NUL in header", b"GET /healthz HTTP/1.1\r\nHost: \x00\r\n\r\n".to_vec()),
        ("absolute URI", b"GET http://[::1/ HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("asterisk", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("CONNECT", b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        (
            "huge content-length",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n"
                .to_vec(),
        ),
        (
            "two content-lengths",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
                .to_vec(),
        ),
        (
            "bad chunk",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
                .to_vec(),
        ),
        (
            "short body",
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc".to_vec(),
        ),
        (
            "HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00".to_vec(),
        ),
        ("TLS hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec()),
        ("huge header", huge_header),
        ("500 headers", many_headers),
        ("100 KiB URI", long_uri),
        (
            "pipelined garbage after a good request",
            b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n\x01\x02garbage\r\n\r\n".to_vec(),
        ),
    ]
}

/// Raises this process's open-file limit (soft to hard, with `prlimit`) if it is below what a
/// flood needs, and returns how many flood connections fit.
fn flood_size() -> usize {
    let soft = || -> usize {
        std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                l.lines()
                    .find(|l| l.starts_with("Max open files"))
                    .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
            })
            .unwrap_or(1024)
    };
    let margin = 500;
    if soft() < FLOOD + margin {
        let _ = Command::new("prlimit")
            .arg("--pid")
            .arg(std::process::id().to_string())
            .arg("--nofile=unlimited:")
            .output();
        let hard = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                l.lines()
                    .find(|l| l.starts_with("Max open files"))
                    .and_then(|l| l.split_whitespace().nth(4)?.parse::<usize>().ok())
            });
        if let Some(hard) = hard {
            let _ = Command::new("prlimit")
                .arg("--pid")
                .arg(std::process::id().to_string())
                .arg(format!("--nofile={hard}:"))
                .output();
        }
    }
    let size = FLOOD.min(soft().saturating_sub(margin));
    if size < FLOOD {
        note(&format!(
            "open-file limit {} too low for {FLOOD} connections; flooding with {size}",
            soft()
        ));
    }
    size
}

/// Opens up to `n` connections to `addr` (from several threads) and keeps them open; gives up
/// on the rest after `limit`.
fn flood(addr: SocketAddr, n: usize, limit: Duration) -> Vec<TcpStream> {
    assert!(addr.ip().is_loopback());
    const THREADS: usize = 16;
    let started = Instant::now();
    let (open, failed) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|i| {
                let share = n / THREADS + usize::from(i < n % THREADS);
                scope.spawn(move || {
                    let mut open = Vec::with_capacity(share);
                    let mut failed = 0usize;
                    while open.len() < share && started.elapsed() < limit {
                        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                            Ok(stream) => open.push(stream),
                            Err(_) => failed += 1,
                        }
                    }
                    (open, failed)
                })
            })
            .collect();
        let mut all = Vec::with_capacity(n);
        let mut failed = 0;
        for worker in workers {
            let (open, f) = worker.join().expect("flood thread");
            all.extend(open);
            failed += f;
        }
        (all, failed)
    });
    note(&format!(
        "flood of {addr}: {} connections open at once after {:?} ({failed} connects failed)",
        open.len(),
        started.elapsed()
    ));
    open
}

#[test]
fn servers_survive_garbage_stalls_and_floods_while_the_daemon_syncs() {
    let n = flood_size();
    let mut daemon = start_daemon();
    let metrics = listening_address(&daemon.daemon.stderr_lines, "metrics server listening");
    let health = listening_address(&daemon.daemon.stderr_lines, "health server listening");
    wait_line(&daemon.daemon.stdout_lines, "first sync", |l| {
        l.starts_with("dry-run") && l.contains("9 services")
    });
    wait_ok(health, "/healthz", Duration::from_secs(5), "at start");

    // Malformed requests: an error answer or a closed connection, never a stuck or dead server.
    for addr in [health, metrics] {
        for (what, payload) in malformed_requests() {
            let status = send_raw(addr, &payload);
            // Requests no HTTP/1 parser can accept must not get a success answer.
            let unparseable = [
                "binary noise",
                "bad version",
                "no version",
                "bad method",
                "header without colon",
                "bad header name",
                "huge header",
                "100 KiB URI",
                "TLS hello",
            ];
            if unparseable.contains(&what) {
                assert!(
                    status.is_none_or(|s| s >= 400),
                    "{what} on {addr} answered {status:?}"
                );
            }
            daemon.assert_running(&format!("after {what}"));
        }
        wait_ok(
            addr,
            if addr == health {
                "/healthz"
            } else {
                "/metrics"
            },
            Duration::from_secs(5),
            "after malformed requests",
        );
    }
    note("malformed requests: answered with errors or closed; both servers still answer");

    // A client that sends half a request and stalls is cut off after the header timeout,
    // and meanwhile others are served.
    for addr in [health, metrics] {
        let mut stalled = TcpStream::connect(addr).expect("connect");
        stalled
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
            .expect("send half a request");
        stalled
            .set_read_timeout(Some(STALL_LIMIT))
            .expect("read timeout");
        wait_ok(
            health,
            "/healthz",
            Duration::from_secs(5),
            "while a client stalls",
        );
        let started = Instant::now();
        let mut buf = [0u8; 1024];
        let ended = loop {
            match stalled.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue, // e.g. a 408 before the close
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    break false;
                }
                Err(_) => break true, // reset
            }
        };
        assert!(
            ended,
            "{addr}: a stalled half request was still open after {STALL_LIMIT:?}"
        );
        note(&format!(
            "{addr}: stalled half request closed after {:?}",
            started.elapsed()
        ));
    }

    // A flood of each server in turn, the sync loop syncing meanwhile.
    for (round, (flooded, other)) in [(metrics, health), (health, metrics)]
        .into_iter()
        .enumerate()
    {
        let held = flood(flooded, n, Duration::from_secs(120));
        assert!(
            held.len() >= n / 2,
            "only {} of {n} connections to {flooded} could be opened",
            held.len()
        );
        daemon.assert_running("during a flood");
        // The sync loop is not held up: an edit is planned.
        let services = if round == 0 { 8 } else { 9 };
        daemon.edit_and_wait_for_sync(services, &format!("during the flood of {flooded}"));
        // The other server is unaffected.
        let other_path = if other == health {
            "/healthz"
        } else {
            "/metrics"
        };
        let took = wait_ok(
            other,
            other_path,
            Duration::from_secs(5),
            "during the other's flood",
        );
        note(&format!(
            "{other}{other_path} answered in {took:?} during the flood of {flooded}"
        ));
        // The flooded one serves again once the connections holding its slots time out
        // (they never send a request), while the flood is still held open.
        let flooded_path = if flooded == health {
            "/healthz"
        } else {
            "/metrics"
        };
        let took = wait_ok(flooded, flooded_path, STALL_LIMIT, "during its own flood");
        note(&format!(
            "{flooded}{flooded_path} answered in {took:?} during its own flood"
        ));
        drop(held);
        let took = wait_ok(
            health,
            "/healthz",
            Duration::from_secs(5),
            "after the flood",
        );
        note(&format!(
            "/healthz answered 200 {took:?} after the flood of {flooded} ended"
        ));
        daemon.assert_running("after a flood");
    }
}
