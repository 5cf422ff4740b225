//! Processes a test starts in the background (servers, clients), killed when it ends.

use std::process::Command;

use crate::Netns;

/// Background processes started by a test, killed by pid on drop.
#[derive(Debug, Default)]
pub struct Background(Vec<u32>);

impl Background {
    /// Starts `command` in `netns` in the background (stdio detached) and returns its pid.
    ///
    /// # Panics
    /// When the shell does not print a pid.
    pub fn spawn(&mut self, netns: &Netns, command: &str) -> u32 {
        let out = netns.sh_ok(&format!("{command} </dev/null >/dev/null 2>&1 & echo $!"));
        let pid = out
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no pid from {out:?} for {command}"));
        self.0.push(pid);
        pid
    }

    /// Kills one process started here and forgets it.
    pub fn kill(&mut self, pid: u32) {
        kill(pid);
        self.0.retain(|p| *p != pid);
    }

    /// The pid of the last process started.
    ///
    /// # Panics
    /// When nothing was started.
    pub fn last(&self) -> u32 {
        *self.0.last().expect("no background process started")
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for pid in &self.0 {
            kill(*pid);
        }
    }
}

fn kill(pid: u32) {
    let _ = Command::new("kill").arg(pid.to_string()).output();
}

/// Loads kernel modules by name, ignoring failures (a module may
/// be built in). The VM's busybox `modprobe` resolves no aliases (such as the `nft-expr-*`
/// ones nf_tables asks for), and `br_netfilter` is never autoloaded, so suites name them.
pub fn load_modules(modules: &[&str]) {
    for module in modules {
        let _ = Command::new("modprobe").arg(module).output();
    }
}

/// A process a shell started in the background (so not our child: no `wait`), known by pid;
/// SIGKILLed on drop while it still runs, so a failing test never leaves it behind.
#[derive(Debug)]
pub struct ShellProcess {
    pid: u32,
}

impl ShellProcess {
    /// Takes charge of the process `pid`.
    pub fn new(pid: u32) -> ShellProcess {
        ShellProcess { pid }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it still runs (exists and is not a zombie).
    pub fn running(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .is_ok_and(|stat| !stat.contains(") Z "))
    }

    /// Sends `signal` (as `kill` spells it: `-TERM`, `-KILL`, ...).
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.pid.to_string()])
            .status();
    }
}

impl Drop for ShellProcess {
    fn drop(&mut self) {
        if self.running() {
            self.signal("-KILL");
        }
    }
}

/// Polls `check` every 200 ms until it holds and returns the time it took; after `limit`,
/// panics with `what` and what `diagnostics` says about the state at that moment.
pub fn wait_until(
    limit: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
    diagnostics: impl FnOnce() -> String,
) -> std::time::Duration {
    let started = std::time::Instant::now();
    loop {
        if check() {
            return started.elapsed();
        }
        if started.elapsed() > limit {
            panic!("{what}: not reached within {limit:?}\n{}", diagnostics());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
