//! A real Kubernetes API server for tests: `mini-apiserver` (k8s.io/apiserver on a real etcd)
//! from the `realapi` directory beside the clone (`../shared/realapi` from the workspace root,
//! or `$IPVS_PROXIER_REALAPI`), started through its own `start.sh` on loopback ports.
//!
//! The shipped binaries are unpacked once into `target/realapi/<stamp>/` (the stamp names
//! the compressed files' sizes and times, so new binaries unpack anew): into a directory of a
//! name no one else uses, renamed into place, so test binaries starting at once never see a
//! half-written file. [`RealApiServer::start`] gives each test a server of its own, with
//! its state (etcd data, certificate, token, logs) in a temporary directory; dropping it stops
//! the server and removes the directory.
//!
//! Where the `realapi` directory is missing, [`RealApiServer::start`] prints
//! `SKIP <test>: <reason>` and returns `None`, so the test passes on a developer machine; with
//! the `CI` environment variable set it panics instead: CI always has the directory.
//!
//! Objects are written with `curl` (which `start.sh` needs too), as JSON.
//!
//! In the VM, `cargo xtask vm-test` puts the directory on the guest's disk with the binaries
//! already unpacked beside `start.sh` (`mini-apiserver`, `root/usr/bin/etcd`) and names it in
//! `$IPVS_PROXIER_REALAPI`; [`RealApiServer::start_in_netns`] runs the server in a test's
//! network namespace, where the daemon under test reaches it on that namespace's loopback.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Environment variable naming the `realapi` directory (default: `../shared/realapi` from the
/// workspace root).
pub const REALAPI_ENV: &str = "IPVS_PROXIER_REALAPI";

/// A running `mini-apiserver` and its etcd, stopped (and its state removed) on drop.
#[derive(Debug)]
pub struct RealApiServer {
    scripts: PathBuf,
    binaries: PathBuf,
    state: PathBuf,
    args: Vec<String>,
    url: String,
    token: String,
    running: bool,
    /// The network namespace the server (and every request of the kit) runs in.
    netns: Option<String>,
}

/// One resource request as the server logged it when it began (`--log-requests`, which
/// [`RealApiServer::start`] always passes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    /// When it began: the time of day in the log's clock (microseconds).
    pub at: Duration,
    /// `list`, `watch`, `get`, `create`, ...
    pub verb: String,
    /// Path and query.
    pub uri: String,
    /// The `Accept` header.
    pub accept: String,
    /// The `User-Agent` header.
    pub user_agent: String,
}

impl LoggedRequest {
    /// Whether the request is a streaming list (a watch with `sendInitialEvents=true`).
    pub fn is_streaming_list(&self) -> bool {
        self.verb == "watch" && self.query("sendInitialEvents") == Some("true")
    }

    /// The value of query parameter `name` (as sent, not decoded), if present.
    pub fn query(&self, name: &str) -> Option<&str> {
        let (_, query) = self.uri.split_once('?')?;
        query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key == name).then_some(value)
        })
    }

    /// The request's path, without the query.
    pub fn path(&self) -> &str {
        self.uri.split_once('?').map_or(&self.uri, |(path, _)| path)
    }
}

impl RealApiServer {
    /// Starts a server with `args` added to its flags (e.g. `--watch-cache=false`,
    /// `--feature-gates=WatchList=false`), or returns `None` after printing `SKIP` when there
    /// is no `realapi` directory.
    ///
    /// # Panics
    /// When the directory is missing in CI, or the server does not start.
    pub fn start(args: &[&str]) -> Option<RealApiServer> {
        RealApiServer::start_inside(None, args)
    }

    /// [`RealApiServer::start`] inside the named network namespace (`ip netns exec`): the
    /// server listens on that namespace's loopback, and the kit's own requests go there too.
    ///
    /// # Panics
    /// As [`RealApiServer::start`].
    pub fn start_in_netns(netns: &str, args: &[&str]) -> Option<RealApiServer> {
        RealApiServer::start_inside(Some(netns.to_owned()), args)
    }

    fn start_inside(netns: Option<String>, args: &[&str]) -> Option<RealApiServer> {
        let scripts = match realapi_dir() {
            Ok(dir) => dir,
            Err(reason) if std::env::var_os("CI").is_some() => {
                panic!("CI must run the real API server's tests: {reason}")
            }
            Err(reason) => {
                let thread = std::thread::current();
                let test = thread.name().unwrap_or("real API server test");
                // Straight to the process's stderr: libtest captures the eprintln! family,
                // and a skip must stay visible.
                let line = format!("SKIP {test}: {reason}\n");
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
                return None;
            }
        };
        let binaries = unpacked(&scripts);
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let state = std::env::temp_dir().join(format!(
            "ipvs-proxier-realapi-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&state);
        let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        args.push("--log-requests".to_owned());
        let mut server = RealApiServer {
            scripts,
            binaries,
            state,
            args,
            url: String::new(),
            token: String::new(),
            running: false,
            netns,
        };
        server.start_again();
        Some(server)
    }

    /// Starts the stopped server again on the same state: same port, certificate, token and
    /// etcd data (resourceVersions continue), a new watch cache: an API server restart as
    /// clients see one.
    ///
    /// # Panics
    /// When it does not start.
    pub fn start_again(&mut self) {
        assert!(!self.running, "the server is running");
        let out = self
            .command(&self.scripts.join("start.sh"))
            .arg(&self.state)
            .args(&self.args)
            .env("ROOT", self.binaries.join("root"))
            .env("BIN", self.binaries.join("mini-apiserver"))
            .output()
            .expect("running start.sh");
        assert!(
            out.status.success(),
            "start.sh failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.running = true;
        self.url = self.read_state("url");
        self.token = self.read_state("token");
    }

    /// Stops the server (a graceful shutdown: watches end, then etcd stops).
    pub fn stop(&mut self) {
        if self.running {
            let _ = self
                .command(&self.scripts.join("stop.sh"))
                .arg(&self.state)
                .output();
            self.running = false;
        }
    }

    /// Stops and starts the server ([`RealApiServer::start_again`]).
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bearer token the server accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A kubeconfig with the server, its CA and the token.
    pub fn kubeconfig(&self) -> PathBuf {
        self.state.join("kubeconfig")
    }

    /// A copy of the kubeconfig with `token` in place of the one the server accepts.
    ///
    /// # Panics
    /// When the kubeconfig cannot be read or written.
    pub fn kubeconfig_with_token(&self, token: &str) -> PathBuf {
        let text = std::fs::read_to_string(self.kubeconfig()).expect("reading the kubeconfig");
        assert!(text.contains(&self.token), "the kubeconfig holds the token");
        let path = self.state.join(format!("kubeconfig-{token}"));
        std::fs::write(&path, text.replace(&self.token, token)).expect("writing a kubeconfig");
        path
    }

    /// Ends every watch in flight (`POST /debug/mini/close-watches`): clients see a clean end
    /// and re-watch from their last resourceVersion. How many it ended.
    pub fn close_watches(&self) -> u64 {
        let (code, body) = self.request("POST", "/debug/mini/close-watches", None, None);
        assert_eq!(code, 200, "close-watches: {body}");
        number_field(&body, "closed")
    }

    /// Compacts etcd to its current revision (`POST /debug/mini/compact`); the revision.
    pub fn compact(&self) -> u64 {
        let (code, body) = self.request("POST", "/debug/mini/compact", None, None);
        assert_eq!(code, 200, "compact: {body}");
        number_field(&body, "compactedTo")
    }

    /// Creates the object `body` (JSON) in the collection at `path`
    /// (e.g. `/api/v1/namespaces/default/services`); panics unless the server created it.
    pub fn create(&self, path: &str, body: &serde_json::Value) {
        let (code, answer) = self.request(
            "POST",
            path,
            Some("application/json"),
            Some(&body.to_string()),
        );
        assert_eq!(code, 201, "creating in {path}: {answer}");
    }

    /// Applies a JSON merge patch to the object at `path`; panics unless it succeeded.
    pub fn merge_patch(&self, path: &str, patch: &serde_json::Value) {
        let (code, answer) = self.request(
            "PATCH",
            path,
            Some("application/merge-patch+json"),
            Some(&patch.to_string()),
        );
        assert_eq!(code, 200, "patching {path}: {answer}");
    }

    /// Deletes the object at `path`; panics unless it succeeded.
    pub fn delete(&self, path: &str) {
        let (code, answer) = self.request("DELETE", path, None, None);
        assert_eq!(code, 200, "deleting {path}: {answer}");
    }

    /// GETs `path` with the token; status code and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        self.request("GET", path, None, None)
    }

    /// Every resource request the server logged, in order, across restarts.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.log().lines().filter_map(parse_request).collect()
    }

    /// The server's log (`apiserver.log`), across restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.join("apiserver.log")).unwrap_or_default()
    }

    /// A command running `program`, inside the server's network namespace if it has one.
    fn command(&self, program: &Path) -> Command {
        match &self.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    fn read_state(&self, name: &str) -> String {
        std::fs::read_to_string(self.state.join(name))
            .unwrap_or_else(|e| panic!("reading {name} of {}: {e}", self.state.display()))
            .trim()
            .to_owned()
    }

    /// One request with `curl` (the server's certificate is self-signed, on loopback).
    fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&str>,
    ) -> (u16, String) {
        let mut curl = self.command(Path::new("curl"));
        curl.args(["-sS", "-k", "--max-time", "20", "-X", method])
            .args(["-H", &format!("Authorization: Bearer {}", self.token)])
            .args(["-w", "\n%{http_code}"]);
        if let Some(content_type) = content_type {
            curl.args(["-H", &format!("Content-Type: {content_type}")]);
        }
        if let Some(body) = body {
            curl.args(["--data-binary", body]);
        }
        let out = curl
            .arg(format!("{}{path}", self.url))
            .output()
            .expect("running curl");
        let text = String::from_utf8_lossy(&out.stdout);
        let (answer, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code.trim().parse().unwrap_or_else(|_| {
            panic!("{method} {path}: no status from curl: {}", stderr_of(&out))
        });
        (code, answer.to_owned())
    }
}

impl Drop for RealApiServer {
    /// Kills the server and its etcd (a graceful stop waits seconds for the watches a test
    /// left open, and nothing of the state is kept), then removes the state.
    fn drop(&mut self) {
        if self.running {
            for (pid, exe) in [("pid", "exe"), ("etcd.pid", "etcd.exe")] {
                kill(&self.state.join(pid), &self.state.join(exe));
            }
            self.running = false;
        }
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

/// Kills the process whose pid the file `pid` holds if it still runs the executable the file
/// `exe` names (so that a reused pid is left alone), and waits for it to be gone.
fn kill(pid: &Path, exe: &Path) {
    let read = |path: &Path| std::fs::read_to_string(path).map(|s| s.trim().to_owned());
    let (Ok(pid), Ok(exe)) = (read(pid), read(exe)) else {
        return;
    };
    let proc_exe = PathBuf::from(format!("/proc/{pid}/exe"));
    if pid.is_empty() || std::fs::read_link(&proc_exe).ok() != Some(PathBuf::from(&exe)) {
        return;
    }
    let _ = Command::new("kill").args(["-KILL", &pid]).output();
    for _ in 0..100 {
        if std::fs::read_link(&proc_exe).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `realapi` directory, or why there is none.
fn realapi_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os(REALAPI_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("../shared/realapi"),
    };
    let shipped = dir.join("bin/mini-apiserver.xz").is_file();
    if dir.join("start.sh").is_file() && (shipped || is_unpacked(&dir)) {
        Ok(dir)
    } else {
        Err(format!(
            "no real API server at {} (start.sh, and bin/*.xz or the unpacked binaries; \
             set {REALAPI_ENV})",
            dir.display()
        ))
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_owned)
}

/// Whether `dir` holds the binaries unpacked, in the layout `start.sh` reads.
fn is_unpacked(dir: &Path) -> bool {
    dir.join("mini-apiserver").is_file() && dir.join("root/usr/bin/etcd").is_file()
}

/// The directory the binaries are unpacked in (unpacking them the first time), or the
/// `realapi` directory itself when it holds them unpacked (the VM's copy).
fn unpacked(scripts: &Path) -> PathBuf {
    if is_unpacked(scripts) {
        return scripts.to_owned();
    }
    // Threads of one test binary unpack once; binaries racing are kept apart by the rename.
    static UNPACKING: Mutex<()> = Mutex::new(());
    let _one = UNPACKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
        .join("realapi");
    let dir = target.join(stamp(scripts));
    let complete = is_unpacked;
    if complete(&dir) {
        return dir;
    }
    std::fs::create_dir_all(&target).expect("creating target/realapi");
    let scratch = target.join(format!(".unpacking-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let out = Command::new(scripts.join("unpack-prebuilt.sh"))
        .arg(&scratch)
        .output()
        .expect("running unpack-prebuilt.sh");
    assert!(
        out.status.success() && complete(&scratch),
        "unpack-prebuilt.sh failed: {}",
        stderr_of(&out)
    );
    // Another binary may have renamed its copy into place first: then that one is used.
    if std::fs::rename(&scratch, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&scratch);
        assert!(complete(&dir), "no unpacked binaries at {}", dir.display());
    }
    dir
}

/// A name for the shipped binaries: their compressed sizes and modification times.
fn stamp(scripts: &Path) -> String {
    ["mini-apiserver.xz", "etcd.xz"]
        .iter()
        .map(|name| {
            let meta = std::fs::metadata(scripts.join("bin").join(name));
            let (size, time) = meta.map_or((0, 0), |meta| {
                let time = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |t| t.as_secs());
                (meta.len(), time)
            });
            format!("{size}-{time}")
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// A number field of a small JSON answer (0 when absent).
fn number_field(body: &str, field: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get(field).and_then(serde_json::Value::as_u64))
        .unwrap_or(0)
}

/// A `"request"` line of klog's structured log:
/// `I1207 18:55:15.765637   27408 main.go:416] "request" verb="watch" uri="..." ...`.
fn parse_request(line: &str) -> Option<LoggedRequest> {
    let (head, fields) = line.split_once("] \"request\" ")?;
    let time = head.split_whitespace().nth(1)?;
    let mut parts = time.split([':', '.']);
    let mut next = || parts.next()?.parse::<u64>().ok();
    let (h, m, s, us) = (next()?, next()?, next()?, next()?);
    let field = |name: &str| {
        let start = fields.find(&format!("{name}=\""))? + name.len() + 2;
        let rest = &fields[start..];
        Some(rest[..rest.find('"')?].to_owned())
    };
    Some(LoggedRequest {
        at: Duration::from_micros(((h * 60 + m) * 60 + s) * 1_000_000 + us),
        verb: field("verb")?,
        uri: field("uri")?,
        accept: field("accept").unwrap_or_default(),
        user_agent: field("userAgent").unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_request_is_read_with_its_time_and_query() {
        let line = r#"I1207 18:55:15.765637   27408 main.go:416] "request" verb="watch" uri="/api/v1/services?watch=true&sendInitialEvents=true&resourceVersion=" accept="application/json" contentType="" userAgent="curl/7.88.1""#;
        let request = parse_request(line).expect("a request line");
        assert_eq!(
            request.at,
            Duration::from_micros((18 * 3600 + 55 * 60 + 15) * 1_000_000 + 765_637)
        );
        assert_eq!(request.verb, "watch");
        assert_eq!(request.path(), "/api/v1/services");
        assert!(request.is_streaming_list());
        assert_eq!(request.query("resourceVersion"), Some(""));
        assert_eq!(request.query("limit"), None);
        assert_eq!(request.user_agent, "curl/7.88.1");
        assert_eq!(parse_request("I1207 18:55:15.1 1 x.go:1] \"other\""), None);
    }
}
