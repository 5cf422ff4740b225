//! The `ipvs-proxier` binary as a user runs it: exit codes for bad flags, the `--once` dry run,
//! and a long-running dry run that serves health and metrics on loopback, follows the source
//! file and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ipvs-proxier");
const CLUSTER: &str = include_str!("../../examples/cluster.yaml");

fn temp_file(tag: &str, content: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ipvs-proxier-cli-{tag}-{}", std::process::id()));
    std::fs::write(&path, content).expect("write temp file");
    path
}

fn exit_code(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().expect("run binary");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_exit_with_code_2() {
    let bad_config = temp_file(
        "bad-kind",
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
    );
    let bad_config_arg = format!("--config={}", bad_config.display());
    for args in [
        vec!["--no-such-flag"],
        vec!["--ipvs-sync-period=soon"],
        vec!["--source-file=x.yaml", "--master=https://127.0.0.1:6443"],
        vec!["--ipvs-min-sync-period=2m", "--ipvs-sync-period=1m"],
        vec!["--proxy-mode=iptables"],
        vec![bad_config_arg.as_str()],
    ] {
        let (code, stderr) = exit_code(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(!stderr.trim().is_empty(), "{args:?} must say why");
    }
    let _ = std::fs::remove_file(bad_config);
}

#[test]
fn once_dry_run_prints_the_source_and_exits_0() {
    let path = temp_file("once", CLUSTER);
    let out = Command::new(BIN)
        .args(["--dry-run", "--once", "--hostname-override=node-a"])
        .arg(format!("--source-file={}", path.display()))
        .output()
        .expect("run binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("9 services")
            && stdout.contains("10 endpoint slices")
            && stdout.contains("node node-a"),
        "{stdout}"
    );
    let _ = std::fs::remove_file(path);
}

struct Daemon {
    child: Child,
    stdout_lines: mpsc::Receiver<String>,
    stderr_lines: mpsc::Receiver<String>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines_of(stream: impl Read + Send + 'static) -> mpsc::Receiver<String> {
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

fn wait_line(rx: &mpsc::Receiver<String>, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if pred(&line) => return line,
            Ok(_) => continue,
            Err(e) => panic!("no line for {what} within 20 s: {e}"),
        }
    }
}

fn listening_address(rx: &mpsc::Receiver<String>, message: &str) -> SocketAddr {
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

fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
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

#[test]
fn dry_run_daemon_serves_follows_the_file_and_stops_on_sigterm() {
    let path = temp_file("daemon", CLUSTER);
    let mut child = Command::new(BIN)
        .args([
            "--dry-run",
            "--hostname-override=node-a",
            "--healthz-bind-address=127.0.0.1:0",
            "--metrics-bind-address=127.0.0.1:0",
            "--ipvs-min-sync-period=0s",
            "--log-format=json",
        ])
        .arg(format!("--source-file={}", path.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn daemon");
    let stdout_lines = lines_of(child.stdout.take().expect("stdout"));
    let stderr_lines = lines_of(child.stderr.take().expect("stderr"));
    let mut daemon = Daemon {
        child,
        stdout_lines,
        stderr_lines,
    };
    let metrics = listening_address(&daemon.stderr_lines, "metrics server listening");
    let health = listening_address(&daemon.stderr_lines, "health server listening");

    let first = wait_line(&daemon.stdout_lines, "first sync", |l| {
        l.starts_with("dry-run")
    });
    assert!(first.contains("9 services"), "{first}");

    let (status, body) = http_get(health, "/healthz");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("healthz JSON");
    assert_eq!(v["nodeEligible"], true);
    assert_eq!(http_get(health, "/livez").0, 200);

    // One Service less in the file: a new sync with 8 (the file has 11, headless and ExternalName ones are not proxied).
    let smaller = CLUSTER.replacen(
        "  labels:\n    app: cart\n  name: cart\n",
        "  labels:\n    app: cart\n    service.kubernetes.io/service-proxy-name: other\n  name: cart\n",
        1,
    );
    assert_ne!(smaller, CLUSTER);
    std::fs::write(&path, smaller).expect("rewrite source");
    let second = wait_line(&daemon.stdout_lines, "sync after change", |l| {
        l.contains("8 services")
    });
    assert!(second.starts_with("dry-run"), "{second}");

    let (status, text) = http_get(metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds"),
        "{text}"
    );

    let pid = daemon.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = daemon.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "daemon did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean stop");
    let _ = std::fs::remove_file(path);
}
