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
