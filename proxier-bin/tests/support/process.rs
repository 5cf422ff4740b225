//! The daemon binary as a child process: its output lines, the addresses its JSON log says
//! it listens on, and plain HTTP GETs to them (loopback only).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The daemon binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ipvs-proxier");

/// The example cluster of the repository.
pub const CLUSTER: &str = include_str!("../../../examples/cluster.yaml");

/// Writes `content` to a file of its own in the temporary directory.
pub fn temp_file(tag: &str, content: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "ipvs-proxier-test-{tag}-{}-{:?}.yaml",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, content).expect("write temp file");
    path
}

/// A running daemon with its stdout and stderr lines; killed when dropped.
pub struct Daemon {
    /// The process.
    pub child: Child,
    /// Lines it printed on stdout.
    pub stdout_lines: mpsc::Receiver<String>,
    /// Lines it printed on stderr (its log).
    pub stderr_lines: mpsc::Receiver<String>,
}

impl Daemon {
    /// Starts the binary with `args`, capturing both streams.
    pub fn start(args: &[String]) -> Daemon {
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn daemon");
        let stdout_lines = lines_of(child.stdout.take().expect("stdout"));
        let stderr_lines = lines_of(child.stderr.take().expect("stderr"));
        Daemon {
            child,
            stdout_lines,
            stderr_lines,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of `stream`, read on a thread of their own.
pub fn lines_of(stream: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line for which `pred` holds, within 30 s.
pub fn wait_line(rx: &mpsc::Receiver<String>, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if pred(&line) => return line,
            Ok(_) => continue,
            Err(e) => panic!("no line for {what} within 30 s: {e}"),
        }
    }
}

/// The `address` field of the JSON log line containing `message` (a loopback address).
pub fn listening_address(rx: &mpsc::Receiver<String>, message: &str) -> SocketAddr {
    let line = wait_line(rx, message, |l| l.contains(message));
    let v: serde_json::Value = serde_json::from_str(&line).expect("JSON log line");
    let addr: SocketAddr = v["address"]
        .as_str()
        .expect("address field")
        .parse()
        .expect("socket address");
    assert!(addr.ip().is_loopback());
    addr
}

/// `GET path` on `addr`: status code and body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}
