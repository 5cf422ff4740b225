//! The daemon under benchmark: started in a network namespace with a file or API source, its
//! JSON log (`--log-format json`) in a file; waits for its syncs, reads its memory and the
//! phase timings it logs (by event message and fields, not by target).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{Netns, proxier_bin};

use super::cluster::NODE;
use super::cpu::ProcessCpu;
use super::phases::{self, LogEvent, Phases};

/// Where the daemon's metrics listen, in its namespace.
pub const METRICS: &str = "127.0.0.1:10249";

/// Where the daemon reads Services and EndpointSlices.
#[derive(Debug, Clone)]
pub enum Source {
    /// `--source-file PATH`.
    File(PathBuf),
    /// `--master URL` (the API server double).
    Kube(String),
}

/// The daemon running in a namespace (a child of this process), its log in a file.
#[derive(Debug)]
pub struct BenchDaemon {
    child: Child,
    /// The namespace it runs in (its file under `/run/netns`).
    netns: PathBuf,
    /// Its flags.
    args: Vec<OsString>,
    log: PathBuf,
    /// When it was started.
    pub started: Instant,
}

impl BenchDaemon {
    /// Starts `ipvs-proxier` in `ns` on `source`, logging JSON lines, syncing as soon as something changes
    /// (`--ipvs-min-sync-period=0s`) and fully every `sync_period` (`--ipvs-sync-period`,
    /// e.g. `1h`); `extra` flags follow.
    pub fn start(
        ns: &Netns,
        source: &Source,
        log: &Path,
        sync_period: &str,
        extra: &[&str],
    ) -> anyhow::Result<BenchDaemon> {
        let mut argv: Vec<OsString> = Vec::new();
        match source {
            Source::File(path) => argv.extend(["--source-file".into(), path.into()]),
            Source::Kube(url) => argv.extend(["--master".into(), url.into()]),
        }
        argv.extend(
            [
                "--hostname-override",
                NODE,
                "--cluster-cidr=10.244.0.0/16",
                "--ipvs-min-sync-period=0s",
                &format!("--ipvs-sync-period={sync_period}"),
                &format!("--metrics-bind-address={METRICS}"),
                "--healthz-bind-address=127.0.0.1:10256",
                "--log-format=json",
            ]
            .into_iter()
            .chain(extra.iter().copied())
            .map(OsString::from),
        );
        let file = std::fs::File::create(log).context("daemon log")?;
        let started = Instant::now();
        let child = spawn(&ns.path(), &argv, file)?;
        Ok(BenchDaemon {
            child,
            netns: ns.path(),
            args: argv,
            log: log.to_owned(),
            started,
        })
    }

    /// Kills it with SIGKILL, as a crash or an OOM kill would, and starts it again with the
    /// same arguments, its log appended to the same file (so sync counts go on).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .context("daemon log")?;
        // A line the killed daemon left half-written ends here, not in the new one's first.
        if !self.log().is_empty() && !self.log().ends_with('\n') {
            std::io::Write::write_all(&mut file, b"\n")?;
        }
        self.started = Instant::now();
        self.child = spawn(&self.netns, &self.args, file)?;
        Ok(())
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The events of its log so far.
    pub fn events(&self) -> Vec<LogEvent> {
        phases::events(&self.log()).collect()
    }

    /// The `sync done` events so far.
    pub fn syncs(&self) -> Vec<LogEvent> {
        phases::syncs(&self.log())
    }

    /// Waits for sync number `n` (1-based); returns its event and when it was seen.
    pub fn wait_sync(
        &mut self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<(LogEvent, Instant)> {
        self.wait_sync_where(n, |_| true, timeout)
    }

    /// Waits for the `n`-th (1-based) sync whose event passes `filter` (e.g. full syncs
    /// only); returns its event and when it was seen.
    pub fn wait_sync_where(
        &mut self,
        n: usize,
        filter: impl Fn(&LogEvent) -> bool,
        timeout: Duration,
    ) -> anyhow::Result<(LogEvent, Instant)> {
        let deadline = Instant::now() + timeout;
        // The log is read again only when it grew: the daemon's CPUs are the ones this
        // loop would take.
        let mut read_length = None;
        loop {
            let length = std::fs::metadata(&self.log).map(|m| m.len()).ok();
            if length.is_none() || length != read_length {
                read_length = length;
                let mut syncs = self.syncs();
                syncs.retain(|l| filter(l));
                if syncs.len() >= n {
                    return Ok((syncs.swap_remove(n - 1), Instant::now()));
                }
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the daemon exited ({status}); log:\n{}", self.log());
            }
            if Instant::now() > deadline {
                bail!("no sync #{n} within {timeout:?}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The phases of sync `n` (1-based) with the start-up lines before it.
    pub fn phases(&self, n: usize) -> Phases {
        Phases::from_log(&self.log(), n)
    }

    /// `VmRSS` and `VmHWM` (peak) in KiB.
    pub fn memory_kib(&self) -> anyhow::Result<(u64, u64)> {
        self.status_kib("VmRSS", "VmHWM")
    }

    /// The resident set split in `RssAnon` (the heap, stacks) and `RssFile` (the mapped
    /// binary and libraries: a code page counts once it has run), in KiB.
    pub fn rss_split_kib(&self) -> anyhow::Result<(u64, u64)> {
        self.status_kib("RssAnon", "RssFile")
    }

    /// Two `/proc/PID/status` fields given in kB, in KiB.
    fn status_kib(&self, first: &str, second: &str) -> anyhow::Result<(u64, u64)> {
        let status = self.proc_file("status")?;
        let kib = |name: &str| {
            proc_field(&status, name)
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .with_context(|| format!("no {name} in /proc/PID/status"))
        };
        Ok((kib(first)?, kib(second)?))
    }

    /// The lines of `/proc/PID/status` that split the resident set: `RssAnon` (the heap,
    /// stacks), `RssFile` (the mapped binary and libraries) and the thread count, and from
    /// `smaps_rollup` `AnonHugePages` (a transparent huge page counts whole once touched).
    pub fn memory_detail(&self) -> anyhow::Result<String> {
        let status = self.proc_file("status")?;
        let mut parts = Vec::new();
        for name in ["RssAnon", "RssFile", "Threads"] {
            let value = proc_field(&status, name)
                .with_context(|| format!("no {name} in /proc/PID/status"))?;
            parts.push(format!("{name}: {value}"));
        }
        if let Ok(rollup) = self.proc_file("smaps_rollup")
            && let Some(value) = proc_field(&rollup, "AnonHugePages")
        {
            parts.push(format!("AnonHugePages: {value}"));
        }
        Ok(parts.join(", "))
    }

    /// How many threads it has (`Threads` of `/proc/PID/status`).
    pub fn threads(&self) -> anyhow::Result<u64> {
        proc_field(&self.proc_file("status")?, "Threads")
            .and_then(|v| v.trim().parse().ok())
            .context("no Threads in /proc/PID/status")
    }

    /// Where its anonymous resident memory lies, from `/proc/PID/smaps` ([`AnonByMapping`]).
    pub fn anon_by_mapping(&self) -> anyhow::Result<AnonByMapping> {
        Ok(AnonByMapping::from_smaps(&self.proc_file("smaps")?))
    }

    /// CPU time used so far (user and system, from `/proc/PID/stat`), in seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        Ok(self.cpu()?.total())
    }

    /// CPU time used so far, user and system apart.
    pub fn cpu(&self) -> anyhow::Result<ProcessCpu> {
        ProcessCpu::of(&self.child.id().to_string())
    }

    /// The page faults it took so far that needed no disk (`minflt` of `/proc/PID/stat`): in
    /// the VM each costs kernel time, and a start faults in every page it allocates.
    pub fn minor_faults(&self) -> anyhow::Result<u64> {
        let stat = self.proc_file("stat")?;
        let (_, rest) = stat
            .rsplit_once(')')
            .ok_or_else(|| anyhow::anyhow!("malformed /proc/PID/stat"))?;
        // After the command: state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt.
        let field = rest.split_whitespace().nth(7);
        field
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("malformed /proc/PID/stat: {stat}"))
    }

    fn proc_file(&self, name: &str) -> std::io::Result<String> {
        std::fs::read_to_string(format!("/proc/{}/{name}", self.child.id()))
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills it and waits for it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ipvs-proxier args...` in the namespace of the file `netns`, stdout and stderr to
/// `log`. It is started from a thread that has entered the namespace (a child begins in the
/// namespaces of the thread that forked it), as a container runtime starts it in its pod's,
/// not through `ip netns exec`: that would add a process of its own, and the mount
/// namespace it makes, to every start the benchmarks time.
fn spawn(netns: &Path, args: &[OsString], log: std::fs::File) -> anyhow::Result<Child> {
    let err = log.try_clone()?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = std::fs::File::open(netns)
                    .with_context(|| format!("opening {}", netns.display()))?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .with_context(|| format!("entering {}", netns.display()))?;
                Command::new(proxier_bin())
                    .args(args)
                    .stdin(Stdio::null())
                    .stdout(log)
                    .stderr(err)
                    .spawn()
                    .context("starting ipvs-proxier")
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The value of a `Name:   value unit` line of a /proc file, with its spaces collapsed.
/// A process's anonymous resident memory (`Anonymous:` of its mappings in
/// `/proc/PID/smaps`) by kind of region, a region being adjacent unnamed mappings taken
/// together (the allocator commits its reservations piece by piece, and a thread's stack
/// lies next to its guard page, so either spans several mappings of different protections).
/// Told apart by size: the allocator's arenas (a reservation of 64 MiB or more), thread
/// stacks (regions of 1 to 16 MiB, and the main thread's `[stack]`), glibc's `[heap]`, and
/// the rest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnonByMapping {
    /// In regions of 64 MiB or more (KiB).
    pub arenas_kib: u64,
    /// In stack-sized regions and `[stack]` (KiB).
    pub stacks_kib: u64,
    /// How many stack-sized regions hold some.
    pub stacks: usize,
    /// In `[heap]` (KiB).
    pub brk_kib: u64,
    /// Elsewhere (KiB).
    pub other_kib: u64,
}

/// Adjacent mappings with one name (none, for most anonymous ones): their span and the
/// anonymous memory in them.
#[derive(Debug)]
struct Region {
    start: u64,
    end: u64,
    name: String,
    anon_kib: u64,
}

impl AnonByMapping {
    /// Sums the `Anonymous:` lines of `smaps` by the region each belongs to.
    pub fn from_smaps(smaps: &str) -> AnonByMapping {
        let mut regions: Vec<Region> = Vec::new();
        for line in smaps.lines() {
            let mut fields = line.split_whitespace();
            let Some(first) = fields.next() else {
                continue;
            };
            if let Some((start, end)) = first.split_once('-')
                && let (Ok(start), Ok(end)) =
                    (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                let name = fields.nth(4).unwrap_or("").to_string();
                match regions.last_mut() {
                    Some(last) if last.end == start && last.name == name => last.end = end,
                    _ => regions.push(Region {
                        start,
                        end,
                        name,
                        anon_kib: 0,
                    }),
                }
                continue;
            }
            if first == "Anonymous:"
                && let (Some(region), Some(kib)) = (
                    regions.last_mut(),
                    fields.next().and_then(|v| v.parse::<u64>().ok()),
                )
            {
                region.anon_kib += kib;
            }
        }
        let mut by = AnonByMapping::default();
        for region in regions.iter().filter(|r| r.anon_kib > 0) {
            let size_kib = (region.end - region.start) / 1024;
            let kib = region.anon_kib;
            match region.name.as_str() {
                "[heap]" => by.brk_kib += kib,
                "[stack]" => {
                    by.stacks_kib += kib;
                    by.stacks += 1;
                }
                "" if size_kib >= 64 * 1024 => by.arenas_kib += kib,
                "" if (1024..=16 * 1024).contains(&size_kib) => {
                    by.stacks_kib += kib;
                    by.stacks += 1;
                }
                _ => by.other_kib += kib,
            }
        }
        by
    }
}

impl std::fmt::Display for AnonByMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |kib: u64| kib as f64 / 1024.0;
        write!(
            f,
            "arenas {:.1}, stacks {:.1} ({}), [heap] {:.1}, other {:.1}",
            mib(self.arenas_kib),
            mib(self.stacks_kib),
            self.stacks,
            mib(self.brk_kib),
            mib(self.other_kib)
        )
    }
}

fn proc_field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?;
        Some(value.split_whitespace().collect::<Vec<_>>().join(" "))
    })
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::AnonByMapping;

    #[test]
    fn anonymous_memory_is_summed_by_the_kind_of_its_region() {
        // A 1 GiB arena committed in two pieces around a reserved one, a 2 MiB thread
        // stack after its guard page, the main stack, glibc's heap, a small unnamed
        // mapping, a file mapping with private copies, and a stack-sized region that holds
        // nothing.
        let smaps = "\
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
Size:               4096 kB
Anonymous:         30000 kB
7f0000400000-7f0020000000 ---p 00000000 00:00 0
Size:             520192 kB
Anonymous:             0 kB
7f0020000000-7f0040000000 rw-p 00000000 00:00 0
Size:             524288 kB
Anonymous:         10000 kB
7f0050000000-7f0050001000 ---p 00000000 00:00 0
Size:                  4 kB
Anonymous:             0 kB
7f0050001000-7f0050201000 rw-p 00000000 00:00 0
Size:               2048 kB
Anonymous:            24 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Size:                132 kB
Anonymous:            36 kB
55d000000000-55d000100000 rw-p 00000000 00:00 0                          [heap]
Size:               1024 kB
Anonymous:           300 kB
7f0060000000-7f0060010000 rw-p 00000000 00:00 0
Size:                 64 kB
Anonymous:            12 kB
55c000000000-55c000200000 r--p 00000000 fe:01 1234                       /usr/bin/ipvs-proxier
Size:               2048 kB
Anonymous:             8 kB
7f0070000000-7f0070200000 rw-p 00000000 00:00 0
Size:               2048 kB
Anonymous:             0 kB
";
        assert_eq!(
            AnonByMapping::from_smaps(smaps),
            AnonByMapping {
                arenas_kib: 40_000,
                stacks_kib: 24 + 36,
                stacks: 2,
                brk_kib: 300,
                other_kib: 12 + 8,
            }
        );
    }
}
