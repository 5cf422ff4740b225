//! CPU time, for a benchmark to say where a phase's CPU went: a process's user and system
//! time (`/proc/PID/stat`, every thread it had, ended ones included) and the machine's busy
//! and idle time (`/proc/stat`).

use std::ops::Sub;

use anyhow::Context;

/// Clock ticks per second of `/proc` times (`USER_HZ`, 100 on every Linux architecture).
const TICKS_PER_SECOND: f64 = 100.0;

/// A process's CPU time so far, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessCpu {
    /// In user space.
    pub user: f64,
    /// In the kernel on its behalf (system calls, such as netlink dumps).
    pub system: f64,
}

impl ProcessCpu {
    /// The CPU time of process `pid` (a number, or `self`).
    pub fn of(pid: &str) -> anyhow::Result<ProcessCpu> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("/proc/{pid}/stat"))?;
        ProcessCpu::parse(&stat).with_context(|| format!("malformed /proc/{pid}/stat"))
    }

    /// Parses a `/proc/PID/stat` line: utime and stime are its fields 14 and 15, after the
    /// command name (in parentheses, which may hold spaces and parentheses).
    fn parse(stat: &str) -> Option<ProcessCpu> {
        let (_, rest) = stat.rsplit_once(')')?;
        let mut fields = rest.split_whitespace().skip(11);
        let mut ticks = || fields.next()?.parse::<u64>().ok();
        let (user, system) = (ticks()?, ticks()?);
        Some(ProcessCpu {
            user: user as f64 / TICKS_PER_SECOND,
            system: system as f64 / TICKS_PER_SECOND,
        })
    }

    /// User and system time together.
    pub fn total(self) -> f64 {
        self.user + self.system
    }
}

impl Sub for ProcessCpu {
    type Output = ProcessCpu;

    fn sub(self, earlier: ProcessCpu) -> ProcessCpu {
        ProcessCpu {
            user: self.user - earlier.user,
            system: self.system - earlier.system,
        }
    }
}

/// The machine's CPU time so far, all CPUs together, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MachineCpu {
    /// Spent running anything (user, nice, system, interrupts, steal).
    pub busy: f64,
    /// Idle or waiting for I/O.
    pub idle: f64,
}

impl MachineCpu {
    /// Now, from `/proc/stat`.
    pub fn now() -> anyhow::Result<MachineCpu> {
        let stat = std::fs::read_to_string("/proc/stat").context("/proc/stat")?;
        MachineCpu::parse(&stat).context("no cpu line in /proc/stat")
    }

    /// Parses the first (`cpu `) line of `/proc/stat`: user nice system idle iowait irq
    /// softirq steal (guest time is counted in user already).
    fn parse(stat: &str) -> Option<MachineCpu> {
        let line = stat.lines().find(|line| line.starts_with("cpu "))?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|field| field.parse().ok())
            .collect::<Option<_>>()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks[..] else {
            return None;
        };
        Some(MachineCpu {
            busy: (user + nice + system + irq + softirq + steal) as f64 / TICKS_PER_SECOND,
            idle: (idle + iowait) as f64 / TICKS_PER_SECOND,
        })
    }

    /// The busy share of the time since `earlier` (0 to 1).
    pub fn busy_share_since(self, earlier: MachineCpu) -> f64 {
        let busy = self.busy - earlier.busy;
        let all = busy + self.idle - earlier.idle;
        if all > 0.0 { busy / all } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_line_gives_its_user_and_system_ticks_as_seconds() {
        // A command name with a space and a parenthesis, as a thread may have.
        let line = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 1771 0 0 0 581 140 0 0 20 0 4 0 1234 0 0";
        let cpu = ProcessCpu::parse(line).expect("parsed");
        assert_eq!(cpu.user, 5.81);
        assert_eq!(cpu.system, 1.40);
        assert!((cpu.total() - 7.21).abs() < 1e-9);
        assert_eq!(ProcessCpu::parse("4242 (x) S 1 2"), None);
    }

    #[test]
    fn the_machine_line_splits_busy_from_idle_and_gives_a_share() {
        let before = MachineCpu::parse("cpu  3117 3 6478 8308 3 0 66 0 0 0\ncpu0 1 2 3 4\n")
            .expect("parsed");
        let after = MachineCpu::parse("cpu  3355 90 6792 8366 3 0 76 0 0 0\n").expect("parsed");
        assert!((before.busy - 96.64).abs() < 1e-9);
        assert!((before.idle - 83.11).abs() < 1e-9);
        // 238 + 87 + 314 + 10 busy ticks against 58 idle.
        let share = after.busy_share_since(before);
        assert!((share - 649.0 / 707.0).abs() < 1e-9, "{share}");
        assert_eq!(MachineCpu::parse("intr 1 2 3\n"), None);
    }
}
