//! Network namespaces for kernel tests.

use std::future::Future;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Counter making namespace names unique within one test process.
static NEXT_NETNS: AtomicU32 = AtomicU32::new(0);

/// A named network namespace made with `ip netns add`, with `lo` up, deleted
/// (`ip netns del`) on drop. Each instance has a unique name
/// (`ipvsp-<pid>-<n>`), so parallel tests and test binaries do not collide.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a fresh namespace and brings its loopback up.
    ///
    /// # Panics
    /// When `ip netns add` or `ip link set lo up` fails.
    pub fn new() -> Netns {
        let n = NEXT_NETNS.fetch_add(1, Ordering::Relaxed);
        let name = format!("ipvsp-{}-{n}", std::process::id());
        run_checked(Command::new("ip").args(["netns", "add", &name]));
        let netns = Netns { name };
        run_checked(Command::new("ip").args(["-n", &netns.name, "link", "set", "lo", "up"]));
        netns
    }

    /// The namespace's name, as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file, `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// Runs `script` with `bash -c` inside the namespace
    /// (`ip netns exec <name> bash -c <script>`) and returns its output.
    ///
    /// # Panics
    /// When the command cannot be started at all.
    pub fn sh(&self, script: &str) -> Output {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, "bash", "-c", script]);
        match command.output() {
            Ok(output) => output,
            Err(err) => panic!(
                "netns {}: cannot run `ip netns exec ... bash`: {err}",
                self.name
            ),
        }
    }

    /// Like [`Netns::sh`], but panics with the script's stderr when it exits
    /// non-zero; returns its stdout.
    pub fn sh_ok(&self, script: &str) -> String {
        let output = self.sh(script);
        if !output.status.success() {
            panic!(
                "netns {}: script failed ({}):\n{script}\n--- stdout ---\n{}--- stderr ---\n{}",
                self.name,
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            );
        }
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits up to ten seconds until a socket in this namespace is bound to local `port` in
    /// one of `/proc/net/{tcp,tcp6,udp,udp6}` or `/proc/net/sctp/eps`, so a server started in
    /// the background is ready before a client connects.
    ///
    /// # Panics
    /// When nothing is bound to the port by then.
    pub fn wait_listening(&self, port: u16) {
        let hex = format!(":{port:04X} ");
        let dec = format!(" {port} ");
        for _ in 0..100 {
            let out = self.sh(
                "cat /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6 2>/dev/null; \
                 cat /proc/net/sctp/eps 2>/dev/null",
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let in_inet_table = text.contains(&hex);
            // SCTP endpoints print the port in decimal, on lines without `addr:port` pairs.
            let in_sctp_table = text.lines().any(|l| l.contains(&dec) && !l.contains(':'));
            if in_inet_table || in_sctp_table {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("nothing listens on port {port} in netns {}", self.name);
    }

    /// Waits up to ten seconds until `table` (e.g. `/proc/net/tcp6`) in this namespace lists
    /// local port `port`: for a server of one address family only.
    ///
    /// # Panics
    /// When the port is not listed by then.
    pub fn wait_in_table(&self, table: &str, port: u16) {
        let hex = format!(":{port:04X} ");
        for _ in 0..100 {
            let out = self.sh(&format!("cat {table}"));
            if String::from_utf8_lossy(&out.stdout).contains(&hex) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "nothing listens on port {port} ({table}) in netns {}",
            self.name
        );
    }

    /// Runs `f` on a fresh thread that has `setns()`'d into this namespace,
    /// inside a current-thread tokio runtime (all drivers enabled), and
    /// returns its result. Sockets opened by the future belong to this
    /// namespace; the calling thread's namespace is untouched.
    ///
    /// # Panics
    /// When entering the namespace or building the runtime fails, and
    /// re-raises any panic of `f` or its future.
    pub fn block_on<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = T>,
        T: Send,
    {
        let path = self.path();
        std::thread::scope(|scope| {
            let worker = scope.spawn(move || {
                let file = match std::fs::File::open(&path) {
                    Ok(file) => file,
                    Err(err) => panic!("cannot open netns file {}: {err}", path.display()),
                };
                if let Err(err) = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET) {
                    panic!("setns into {} failed: {err}", path.display());
                }
                drop(file);
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => panic!("cannot build tokio runtime in {}: {err}", path.display()),
                };
                runtime.block_on(f())
            });
            match worker.join() {
                Ok(value) => value,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }
}

impl Default for Netns {
    fn default() -> Self {
        Netns::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let result = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        let failure = match result {
            Ok(output) if output.status.success() => None,
            Ok(output) => Some(String::from_utf8_lossy(&output.stderr).into_owned()),
            Err(err) => Some(err.to_string()),
        };
        if let Some(failure) = failure {
            use std::io::Write;
            let line = format!(
                "warning: ip netns del {} failed: {}\n",
                self.name,
                failure.trim()
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
}

/// Runs a setup command and panics with its stderr when it fails.
fn run_checked(command: &mut Command) {
    let shown = format!("{command:?}");
    match command.output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "{shown} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(err) => panic!("cannot run {shown}: {err}"),
    }
}
