//! Kernel settings the proxier needs, set once at start.
//!
//! [`required_settings`] (pure) decides what to set from the options and the kernel
//! version; [`apply_settings`] writes them through a [`SysctlStore`] and reports, per key,
//! what happened. [`ProcSysctl`] is the real `/proc/sys` (or any directory laid out like
//! it, for tests).
//!
//! | key | value | why | essential |
//! | --- | --- | --- | --- |
//! | `net/ipv4/ip_forward` | 1 | IPVS NAT forwards replies between pods and clients | yes |
//! | `net/ipv4/vs/conntrack` | 1 | conntrack must track IPVS connections, or the nftables masquerade (and every NAT rule) never sees them | yes |
//! | `net/ipv4/vs/expire_nodest_conn` | 1 | a connection to a removed real server is expired on its next packet instead of blackholing | no |
//! | `net/ipv4/vs/expire_quiescent_template` | 1 | persistence templates of weight-0 (draining) real servers expire, so ClientIP affinity moves on | no |
//! | `net/ipv4/vs/conn_reuse_mode` | 0 on kernels 4.1 ..< 5.9; left alone from 5.9 (kernel fix 35dfb013149f) and not available before 4.1 | avoids the 1 s stall of reused source ports on old kernels | no |
//! | `net/ipv4/conf/all/arp_ignore` | 1 (strict ARP only) | the node does not answer ARP for VIPs on the dummy link | no |
//! | `net/ipv4/conf/all/arp_announce` | 2 (strict ARP only) | same | no |
//!
//! The `vs/*` keys exist only once the `ip_vs` module is loaded: apply after the IPVS handle
//! is opened (which loads it). All keys except the `conf/all/arp_*` pair are per network
//! namespace.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Reads and writes sysctls by key (`net/ipv4/ip_forward`: slash-separated, as under `/proc/sys`).
pub trait SysctlStore {
    /// The current value, trimmed.
    fn read(&self, key: &str) -> io::Result<String>;
    /// Writes `value`.
    fn write(&self, key: &str, value: &str) -> io::Result<()>;
}

/// Sysctls under a directory laid out like `/proc/sys`.
#[derive(Debug, Clone)]
pub struct ProcSysctl {
    root: PathBuf,
}

impl Default for ProcSysctl {
    fn default() -> Self {
        ProcSysctl::new("/proc/sys")
    }
}

impl ProcSysctl {
    /// Sysctls under `root` (`/proc/sys` for the real ones).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ProcSysctl { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

impl SysctlStore for ProcSysctl {
    fn read(&self, key: &str) -> io::Result<String> {
        Ok(std::fs::read_to_string(self.path(key))?.trim().to_owned())
    }

    fn write(&self, key: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.path(key), format!("{value}\n"))
    }
}

/// Options that change which sysctls are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SysctlOptions {
    /// `--ipvs-strict-arp`: set `arp_ignore=1` and `arp_announce=2` on all interfaces.
    pub strict_arp: bool,
}

/// A kernel release, major.minor (the patch level never matters here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl KernelVersion {
    /// Parses a release string such as `6.1.0-28-cloud-amd64` or `5.15.0`.
    pub fn parse(release: &str) -> Option<Self> {
        let mut parts = release.trim().split(['.', '-', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor_text = parts.next()?;
        let digits: String = minor_text
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let minor = digits.parse().ok()?;
        Some(KernelVersion { major, minor })
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// First kernel with `net.ipv4.vs.conn_reuse_mode`.
pub const CONN_REUSE_MODE_MIN_KERNEL: KernelVersion = KernelVersion { major: 4, minor: 1 };
/// First kernel where the default `conn_reuse_mode` no longer stalls reused ports.
pub const CONN_REUSE_MODE_FIXED_KERNEL: KernelVersion = KernelVersion { major: 5, minor: 9 };

/// One sysctl to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlSetting {
    /// Key, slash-separated.
    pub key: &'static str,
    /// Value to write.
    pub value: &'static str,
    /// Whether the proxier cannot work correctly without it.
    pub essential: bool,
    /// Why it is set (for logs and docs).
    pub reason: &'static str,
}

/// A setting deliberately not applied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSetting {
    /// Key.
    pub key: &'static str,
    /// Why it is left alone.
    pub reason: String,
}

/// What to set on this kernel, and what to leave alone.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SysctlPlan {
    /// To write, in order.
    pub settings: Vec<SysctlSetting>,
    /// Left alone on purpose.
    pub skipped: Vec<SkippedSetting>,
}

const CONN_REUSE_MODE: &str = "net/ipv4/vs/conn_reuse_mode";

/// Decides which sysctls to set for these options on this kernel (`None`: unknown version,
/// `conn_reuse_mode` is then left alone).
pub fn required_settings(options: SysctlOptions, kernel: Option<KernelVersion>) -> SysctlPlan {
    let mut plan = SysctlPlan::default();
    let mut set = |key, value, essential, reason| {
        plan.settings.push(SysctlSetting {
            key,
            value,
            essential,
            reason,
        });
    };
    set(
        "net/ipv4/ip_forward",
        "1",
        true,
        "IPVS NAT forwards traffic between clients and endpoints",
    );
    set(
        "net/ipv4/vs/conntrack",
        "1",
        true,
        "conntrack must track IPVS connections for masquerade (SNAT) to apply",
    );
    set(
        "net/ipv4/vs/expire_nodest_conn",
        "1",
        false,
        "expire connections to removed real servers on their next packet",
    );
    set(
        "net/ipv4/vs/expire_quiescent_template",
        "1",
        false,
        "expire persistence templates of weight-0 real servers",
    );
    match kernel {
        Some(version) if version < CONN_REUSE_MODE_MIN_KERNEL => {
            plan.skipped.push(SkippedSetting {
                key: CONN_REUSE_MODE,
                reason: format!(
                    "kernel {version} predates {CONN_REUSE_MODE_MIN_KERNEL}, which introduced it"
                ),
            });
        }
        Some(version) if version >= CONN_REUSE_MODE_FIXED_KERNEL => {
            plan.skipped.push(SkippedSetting {
                key: CONN_REUSE_MODE,
                reason: format!(
                    "kernel {version} >= {CONN_REUSE_MODE_FIXED_KERNEL} handles port reuse correctly; left as is"
                ),
            });
        }
        Some(_) => plan.settings.push(SysctlSetting {
            key: CONN_REUSE_MODE,
            value: "0",
            essential: false,
            reason: "avoid the 1 s stall of reused source ports on kernels before 5.9",
        }),
        None => plan.skipped.push(SkippedSetting {
            key: CONN_REUSE_MODE,
            reason: "kernel version unknown; left as is".to_owned(),
        }),
    }
    if options.strict_arp {
        plan.settings.push(SysctlSetting {
            key: "net/ipv4/conf/all/arp_ignore",
            value: "1",
            essential: false,
            reason: "strict ARP: do not answer ARP for addresses on the dummy link",
        });
        plan.settings.push(SysctlSetting {
            key: "net/ipv4/conf/all/arp_announce",
            value: "2",
            essential: false,
            reason: "strict ARP: announce only the best local address",
        });
    }
    plan
}

/// A sysctl that could not be set.
#[derive(Debug, thiserror::Error)]
#[error("cannot set sysctl {key} = {value} ({reason}): {source}")]
pub struct SysctlFailure {
    /// Key.
    pub key: &'static str,
    /// Value it should have.
    pub value: &'static str,
    /// Why it is needed.
    pub reason: &'static str,
    /// Whether the proxier cannot work correctly without it.
    pub essential: bool,
    /// The error from the kernel.
    pub source: io::Error,
}

/// What [`apply_settings`] did.
#[derive(Debug, Default)]
pub struct SysctlReport {
    /// Keys written (they held another value).
    pub changed: Vec<&'static str>,
    /// Keys that already held the value.
    pub unchanged: Vec<&'static str>,
    /// Keys left alone on purpose.
    pub skipped: Vec<SkippedSetting>,
    /// Keys that could not be set.
    pub failures: Vec<SysctlFailure>,
}

impl SysctlReport {
    /// Failures of essential settings: the caller should refuse to start.
    pub fn essential_failures(&self) -> impl Iterator<Item = &SysctlFailure> {
        self.failures.iter().filter(|f| f.essential)
    }
}

/// Reads the running kernel's version from `kernel/osrelease` of the store.
pub fn kernel_version(store: &impl SysctlStore) -> Option<KernelVersion> {
    store
        .read("kernel/osrelease")
        .ok()
        .and_then(|release| KernelVersion::parse(&release))
}

/// Writes every setting of `plan` that does not already hold its value, and logs each
/// outcome (failures at warn, essential ones at error).
pub fn apply_settings(store: &impl SysctlStore, plan: &SysctlPlan) -> SysctlReport {
    let mut report = SysctlReport {
        skipped: plan.skipped.clone(),
        ..SysctlReport::default()
    };
    for skipped in &plan.skipped {
        tracing::info!(sysctl = skipped.key, "not set: {}", skipped.reason);
    }
    for setting in &plan.settings {
        if store.read(setting.key).is_ok_and(|v| v == setting.value) {
            report.unchanged.push(setting.key);
            continue;
        }
        match store.write(setting.key, setting.value) {
            Ok(()) => {
                tracing::info!(sysctl = setting.key, value = setting.value, "sysctl set");
                report.changed.push(setting.key);
            }
            Err(source) => {
                let failure = SysctlFailure {
                    key: setting.key,
                    value: setting.value,
                    reason: setting.reason,
                    essential: setting.essential,
                    source,
                };
                if failure.essential {
                    tracing::error!("{failure}");
                } else {
                    tracing::warn!("{failure}");
                }
                report.failures.push(failure);
            }
        }
    }
    report
}

/// Decides and applies in one call: reads the kernel version from the store, then sets
/// everything [`required_settings`] asks for.
pub fn ensure_sysctls(store: &impl SysctlStore, options: SysctlOptions) -> SysctlReport {
    let plan = required_settings(options, kernel_version(store));
    apply_settings(store, &plan)
}

/// Sysctls held in memory: for tests and for callers that plan without a kernel. Keys can be
/// made to fail their writes with a chosen error kind (a read-only `/sys`, a missing
/// capability).
#[derive(Debug, Default)]
pub struct MemorySysctl {
    values: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    refused: std::sync::Mutex<std::collections::BTreeMap<String, io::ErrorKind>>,
}

impl MemorySysctl {
    /// A store holding `values`.
    pub fn with(values: &[(&str, &str)]) -> Self {
        let store = MemorySysctl::default();
        for (key, value) in values {
            store.set(key, value);
        }
        store
    }

    /// Sets `key` to `value` (bypassing any refusal).
    pub fn set(&self, key: &str, value: &str) {
        self.values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.to_owned(), value.to_owned());
    }

    /// Makes every later write of `key` fail with `kind`.
    pub fn refuse_writes(&self, key: &str, kind: io::ErrorKind) {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.to_owned(), kind);
    }

    /// The value of `key`, if it has one.
    pub fn get(&self, key: &str) -> Option<String> {
        self.values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned()
    }
}

impl SysctlStore for MemorySysctl {
    fn read(&self, key: &str) -> io::Result<String> {
        self.get(key)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no sysctl {key}")))
    }

    fn write(&self, key: &str, value: &str) -> io::Result<()> {
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .copied();
        if let Some(kind) = refused {
            return Err(io::Error::new(kind, format!("writing {key} refused")));
        }
        self.set(key, value.trim());
        Ok(())
    }
}

/// kube-proxy's conntrack settings (`--conntrack-*`, the `conntrack` section of a
/// `KubeProxyConfiguration`), applied once at start as kube-proxy applies them. A zero means
/// "leave the kernel's value".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Conntrack entries per CPU; `nf_conntrack_max` becomes `max(max_per_core × CPUs,
    /// min)`. 0 leaves `nf_conntrack_max` (and the hash size) alone and ignores `min`.
    pub max_per_core: u32,
    /// The floor of `nf_conntrack_max` when `max_per_core` is set.
    pub min: u32,
    /// `nf_conntrack_tcp_timeout_established` (whole seconds); zero leaves it.
    pub tcp_established_timeout: Duration,
    /// `nf_conntrack_tcp_timeout_close_wait` (whole seconds); zero leaves it.
    pub tcp_close_wait_timeout: Duration,
    /// Set `nf_conntrack_tcp_be_liberal` to 1; false leaves it.
    pub tcp_be_liberal: bool,
    /// `nf_conntrack_udp_timeout` (whole seconds); zero leaves it.
    pub udp_timeout: Duration,
    /// `nf_conntrack_udp_timeout_stream` (whole seconds); zero leaves it.
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackSettings {
    /// kube-proxy's defaults: 32768 per core, at least 131072, established TCP 24 h,
    /// CLOSE_WAIT 1 h, the rest left to the kernel.
    fn default() -> Self {
        ConntrackSettings {
            max_per_core: 32 * 1024,
            min: 128 * 1024,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

impl ConntrackSettings {
    /// Settings that change nothing (every value "leave the kernel's").
    pub fn unchanged() -> Self {
        ConntrackSettings {
            max_per_core: 0,
            min: 0,
            tcp_established_timeout: Duration::ZERO,
            tcp_close_wait_timeout: Duration::ZERO,
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }

    /// The `nf_conntrack_max` to set on a machine with `cpus` CPUs: `max_per_core × cpus`,
    /// or `min` when that is larger; `None` when `max_per_core` is 0.
    pub fn conntrack_max(&self, cpus: usize) -> Option<u64> {
        if self.max_per_core == 0 {
            return None;
        }
        let cpus = u64::try_from(cpus).unwrap_or(u64::MAX);
        let scaled = u64::from(self.max_per_core).saturating_mul(cpus);
        Some(scaled.max(u64::from(self.min)))
    }

    /// The sysctls to write, in kube-proxy's order (`nf_conntrack_max` first), with values.
    pub fn sysctls(&self, cpus: usize) -> Vec<(&'static str, u64)> {
        let seconds = |d: Duration| (!d.is_zero()).then_some(d.as_secs());
        let mut out = Vec::new();
        if let Some(max) = self.conntrack_max(cpus) {
            out.push((CONNTRACK_MAX, max));
        }
        let timeouts = [
            (
                "net/netfilter/nf_conntrack_tcp_timeout_established",
                seconds(self.tcp_established_timeout),
            ),
            (
                "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
                seconds(self.tcp_close_wait_timeout),
            ),
            (
                "net/netfilter/nf_conntrack_tcp_be_liberal",
                self.tcp_be_liberal.then_some(1),
            ),
            (
                "net/netfilter/nf_conntrack_udp_timeout",
                seconds(self.udp_timeout),
            ),
            (
                "net/netfilter/nf_conntrack_udp_timeout_stream",
                seconds(self.udp_stream_timeout),
            ),
        ];
        out.extend(
            timeouts
                .into_iter()
                .filter_map(|(key, value)| value.map(|v| (key, v))),
        );
        out
    }
}

/// The `nf_conntrack_max` sysctl.
pub const CONNTRACK_MAX: &str = "net/netfilter/nf_conntrack_max";
/// The conntrack hash size module parameter, as a key under `/sys/module`.
pub const CONNTRACK_HASHSIZE: &str = "nf_conntrack/parameters/hashsize";

/// A conntrack setting that could not be applied.
#[derive(Debug, thiserror::Error)]
#[error("cannot set {key} = {value}: {source}")]
pub struct ConntrackFailure {
    /// The sysctl key, or [`CONNTRACK_HASHSIZE`].
    pub key: &'static str,
    /// The value it should have.
    pub value: u64,
    /// What the kernel said.
    pub source: io::Error,
}

impl ConntrackFailure {
    /// Whether the write failed because the filesystem (`/sys`, as some container runtimes
    /// mount it) is read-only: kube-proxy reports that and carries on.
    pub fn read_only(&self) -> bool {
        self.source.kind() == io::ErrorKind::ReadOnlyFilesystem
    }
}

/// What [`apply_conntrack`] did.
#[derive(Debug, Default)]
pub struct ConntrackReport {
    /// Keys written, with the value written.
    pub changed: Vec<(&'static str, u64)>,
    /// Keys that already held their value.
    pub unchanged: Vec<&'static str>,
    /// Keys that could not be set.
    pub failures: Vec<ConntrackFailure>,
}

/// Applies `settings` as kube-proxy does at start: `nf_conntrack_max` from the CPU count,
/// then the hash size (`/sys/module/nf_conntrack/parameters/hashsize`, raised to
/// `nf_conntrack_max / 4` only when smaller: the kernel takes it only in the initial network
/// namespace), then each non-zero timeout. A key already holding its value is not written;
/// a larger `nf_conntrack_max` is lowered, as kube-proxy does. Failures are collected and
/// logged at warn; a failed `nf_conntrack_max` skips the hash size, as in kube-proxy.
///
/// `sysctl` is `/proc/sys` ([`ProcSysctl::default`]); `modules` is `/sys/module`
/// (`ProcSysctl::new("/sys/module")`).
pub fn apply_conntrack(
    sysctl: &impl SysctlStore,
    modules: &impl SysctlStore,
    settings: &ConntrackSettings,
    cpus: usize,
) -> ConntrackReport {
    let mut report = ConntrackReport::default();
    let fail = |report: &mut ConntrackReport, key, value, source| {
        let failure = ConntrackFailure { key, value, source };
        tracing::warn!("{failure}");
        report.failures.push(failure);
    };
    for (key, value) in settings.sysctls(cpus) {
        let held = sysctl.read(key).ok().and_then(|v| v.parse::<u64>().ok());
        let written = if held == Some(value) {
            report.unchanged.push(key);
            true
        } else {
            match sysctl.write(key, &value.to_string()) {
                Ok(()) => {
                    tracing::info!(sysctl = key, value, "conntrack sysctl set");
                    report.changed.push((key, value));
                    true
                }
                Err(source) => {
                    fail(&mut report, key, value, source);
                    false
                }
            }
        };
        if key == CONNTRACK_MAX && written {
            let buckets = value / 4;
            match modules.read(CONNTRACK_HASHSIZE).map(|v| v.parse::<u64>()) {
                Ok(Ok(held)) if held >= buckets => report.unchanged.push(CONNTRACK_HASHSIZE),
                Ok(Ok(_)) => match modules.write(CONNTRACK_HASHSIZE, &buckets.to_string()) {
                    Ok(()) => {
                        tracing::info!(hashsize = buckets, "conntrack hash size set");
                        report.changed.push((CONNTRACK_HASHSIZE, buckets));
                    }
                    Err(source) => fail(&mut report, CONNTRACK_HASHSIZE, buckets, source),
                },
                Ok(Err(_)) => fail(
                    &mut report,
                    CONNTRACK_HASHSIZE,
                    buckets,
                    io::Error::new(io::ErrorKind::InvalidData, "hash size is not a number"),
                ),
                Err(source) => fail(&mut report, CONNTRACK_HASHSIZE, buckets, source),
            }
        }
    }
    report
}

/// The number of CPUs kube-proxy scales `nf_conntrack_max` by: the online CPUs of the
/// machine (`/sys/devices/system/cpu/online`), not the ones this process may run on; the
/// process's available parallelism if that file cannot be read.
pub fn machine_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|list| count_cpu_list(&list))
        .filter(|n| *n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
}

/// Counts the CPUs in a kernel CPU list such as `0-3,8,10-11`; `None` if it is malformed.
pub fn count_cpu_list(list: &str) -> Option<usize> {
    let mut count = 0usize;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
                count += last.checked_sub(first)? + 1;
            }
            None => {
                part.parse::<usize>().ok()?;
                count += 1;
            }
        }
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn fake_proc(release: &str, existing: &[(&str, &str)]) -> (tempdir::TempDir, ProcSysctl) {
        let dir = tempdir::TempDir::new();
        let store = ProcSysctl::new(dir.path());
        std::fs::create_dir_all(dir.path().join("kernel")).unwrap();
        std::fs::write(dir.path().join("kernel/osrelease"), format!("{release}\n")).unwrap();
        for (key, value) in existing {
            let path = dir.path().join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("{value}\n")).unwrap();
        }
        (dir, store)
    }

    mod tempdir {
        use std::path::{Path, PathBuf};
        use std::sync::atomic::{AtomicU32, Ordering};

        static NEXT: AtomicU32 = AtomicU32::new(0);

        pub struct TempDir(PathBuf);

        impl TempDir {
            pub fn new() -> Self {
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let path =
                    std::env::temp_dir().join(format!("proxier-sysctl-{}-{n}", std::process::id()));
                let _ = std::fs::remove_dir_all(&path);
                std::fs::create_dir_all(&path).unwrap();
                TempDir(path)
            }
            pub fn path(&self) -> &Path {
                &self.0
            }
        }

        impl Drop for TempDir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn keys(plan: &SysctlPlan) -> Vec<&'static str> {
        plan.settings.iter().map(|s| s.key).collect()
    }

    #[test]
    fn parses_kernel_releases() {
        assert_eq!(
            KernelVersion::parse("6.1.0-28-cloud-amd64"),
            Some(KernelVersion { major: 6, minor: 1 })
        );
        assert_eq!(
            KernelVersion::parse("5.4.0"),
            Some(KernelVersion { major: 5, minor: 4 })
        );
        assert_eq!(
            KernelVersion::parse("4.19-rc3"),
            Some(KernelVersion {
                major: 4,
                minor: 19
            })
        );
        assert_eq!(
            KernelVersion::parse("5.10+"),
            Some(KernelVersion {
                major: 5,
                minor: 10
            })
        );
        assert_eq!(KernelVersion::parse("garbage"), None);
        assert_eq!(KernelVersion::parse("6"), None);
    }

    #[test]
    fn conn_reuse_mode_depends_on_kernel() {
        let on = |major, minor| {
            required_settings(
                SysctlOptions::default(),
                Some(KernelVersion { major, minor }),
            )
        };
        assert!(!keys(&on(6, 1)).contains(&CONN_REUSE_MODE));
        assert!(!keys(&on(5, 9)).contains(&CONN_REUSE_MODE));
        let mid = on(5, 4);
        let reuse = mid
            .settings
            .iter()
            .find(|s| s.key == CONN_REUSE_MODE)
            .unwrap();
        assert_eq!(reuse.value, "0");
        assert!(!keys(&on(4, 0)).contains(&CONN_REUSE_MODE));
        assert!(on(4, 0).skipped.iter().any(|s| s.key == CONN_REUSE_MODE));
        assert!(
            required_settings(SysctlOptions::default(), None)
                .skipped
                .iter()
                .any(|s| s.key == CONN_REUSE_MODE)
        );
    }

    #[test]
    fn strict_arp_adds_arp_settings() {
        let kernel = Some(KernelVersion { major: 6, minor: 1 });
        let off = required_settings(SysctlOptions::default(), kernel);
        assert!(!keys(&off).iter().any(|k| k.contains("arp_")));
        let on = required_settings(SysctlOptions { strict_arp: true }, kernel);
        let arp: Vec<(&str, &str)> = on
            .settings
            .iter()
            .filter(|s| s.key.contains("arp_"))
            .map(|s| (s.key, s.value))
            .collect();
        assert_eq!(
            arp,
            vec![
                ("net/ipv4/conf/all/arp_ignore", "1"),
                ("net/ipv4/conf/all/arp_announce", "2")
            ]
        );
    }

    #[test]
    fn forwarding_and_vs_conntrack_are_essential() {
        let plan = required_settings(SysctlOptions::default(), None);
        let essential: Vec<&str> = plan
            .settings
            .iter()
            .filter(|s| s.essential)
            .map(|s| s.key)
            .collect();
        assert_eq!(
            essential,
            vec!["net/ipv4/ip_forward", "net/ipv4/vs/conntrack"]
        );
        for key in [
            "net/ipv4/vs/expire_nodest_conn",
            "net/ipv4/vs/expire_quiescent_template",
        ] {
            let s = plan.settings.iter().find(|s| s.key == key).unwrap();
            assert_eq!(s.value, "1");
        }
    }

    #[test]
    fn applies_to_a_proc_like_directory_and_reports() {
        let (dir, store) = fake_proc(
            "5.4.0-150-generic",
            &[
                ("net/ipv4/ip_forward", "0"),
                ("net/ipv4/vs/conntrack", "1"),
                ("net/ipv4/vs/expire_nodest_conn", "0"),
                ("net/ipv4/vs/expire_quiescent_template", "0"),
                ("net/ipv4/vs/conn_reuse_mode", "1"),
            ],
        );
        let report = ensure_sysctls(&store, SysctlOptions::default());
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.unchanged, vec!["net/ipv4/vs/conntrack"]);
        assert_eq!(
            report.changed,
            vec![
                "net/ipv4/ip_forward",
                "net/ipv4/vs/expire_nodest_conn",
                "net/ipv4/vs/expire_quiescent_template",
                "net/ipv4/vs/conn_reuse_mode"
            ]
        );
        let read = |k: &str| std::fs::read_to_string(dir.path().join(k)).unwrap();
        assert_eq!(read("net/ipv4/ip_forward"), "1\n");
        assert_eq!(read("net/ipv4/vs/conn_reuse_mode"), "0\n");
    }

    #[test]
    fn missing_keys_are_reported_with_key_and_essentiality() {
        // No `vs` directory: ip_vs not loaded.
        let (_dir, store) = fake_proc("6.1.0", &[("net/ipv4/ip_forward", "1")]);
        let report = ensure_sysctls(&store, SysctlOptions::default());
        let failed: Vec<(&str, bool)> = report
            .failures
            .iter()
            .map(|f| (f.key, f.essential))
            .collect();
        assert_eq!(
            failed,
            vec![
                ("net/ipv4/vs/conntrack", true),
                ("net/ipv4/vs/expire_nodest_conn", false),
                ("net/ipv4/vs/expire_quiescent_template", false),
            ]
        );
        assert_eq!(report.essential_failures().count(), 1);
        let message = report.failures[0].to_string();
        assert!(message.contains("net/ipv4/vs/conntrack = 1"), "{message}");
        assert!(message.contains("masquerade"), "{message}");
        assert_eq!(report.unchanged, vec!["net/ipv4/ip_forward"]);
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn conntrack_max_is_per_core_with_a_floor_and_zero_leaves_it() {
        let settings = ConntrackSettings::default();
        // kube-proxy: 32768 per core, at least 131072.
        assert_eq!(settings.conntrack_max(2), Some(131_072));
        assert_eq!(settings.conntrack_max(8), Some(262_144));
        let none = ConntrackSettings {
            max_per_core: 0,
            min: 500_000,
            ..settings
        };
        assert_eq!(none.conntrack_max(64), None, "min alone sets nothing");
        assert_eq!(ConntrackSettings::unchanged().sysctls(4), vec![]);
    }

    #[test]
    fn conntrack_sysctls_are_whole_seconds_and_skip_zeros() {
        let settings = ConntrackSettings {
            max_per_core: 10,
            min: 0,
            tcp_established_timeout: Duration::from_millis(90_500),
            tcp_close_wait_timeout: Duration::ZERO,
            tcp_be_liberal: true,
            udp_timeout: secs(30),
            udp_stream_timeout: Duration::ZERO,
        };
        assert_eq!(
            settings.sysctls(3),
            vec![
                ("net/netfilter/nf_conntrack_max", 30),
                ("net/netfilter/nf_conntrack_tcp_timeout_established", 90),
                ("net/netfilter/nf_conntrack_tcp_be_liberal", 1),
                ("net/netfilter/nf_conntrack_udp_timeout", 30),
            ]
        );
    }

    #[test]
    fn apply_conntrack_writes_what_differs_and_raises_the_hash_size() {
        let sysctl = MemorySysctl::with(&[
            (CONNTRACK_MAX, "524288"),
            (
                "net/netfilter/nf_conntrack_tcp_timeout_established",
                "432000",
            ),
            ("net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600"),
        ]);
        let modules = MemorySysctl::with(&[(CONNTRACK_HASHSIZE, "16384")]);
        let report = apply_conntrack(&sysctl, &modules, &ConntrackSettings::default(), 2);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        // A larger nf_conntrack_max is lowered, as kube-proxy does.
        assert_eq!(sysctl.get(CONNTRACK_MAX).as_deref(), Some("131072"));
        assert_eq!(modules.get(CONNTRACK_HASHSIZE).as_deref(), Some("32768"));
        assert_eq!(
            sysctl
                .get("net/netfilter/nf_conntrack_tcp_timeout_established")
                .as_deref(),
            Some("86400")
        );
        assert_eq!(
            report.unchanged,
            vec!["net/netfilter/nf_conntrack_tcp_timeout_close_wait"]
        );
        // A hash size already large enough is left alone.
        let modules = MemorySysctl::with(&[(CONNTRACK_HASHSIZE, "65536")]);
        apply_conntrack(&sysctl, &modules, &ConntrackSettings::default(), 2);
        assert_eq!(modules.get(CONNTRACK_HASHSIZE).as_deref(), Some("65536"));
    }

    #[test]
    fn conntrack_failures_are_collected_not_fatal() {
        let sysctl = MemorySysctl::with(&[(CONNTRACK_MAX, "65536")]);
        sysctl.refuse_writes(CONNTRACK_MAX, io::ErrorKind::PermissionDenied);
        let modules = MemorySysctl::with(&[(CONNTRACK_HASHSIZE, "1024")]);
        let report = apply_conntrack(&sysctl, &modules, &ConntrackSettings::default(), 1);
        let failed: Vec<&str> = report.failures.iter().map(|f| f.key).collect();
        assert_eq!(failed, vec![CONNTRACK_MAX]);
        // No hash size after a failed nf_conntrack_max; the timeouts still go on.
        assert_eq!(modules.get(CONNTRACK_HASHSIZE).as_deref(), Some("1024"));
        assert_eq!(
            sysctl
                .get("net/netfilter/nf_conntrack_tcp_timeout_close_wait")
                .as_deref(),
            Some("3600")
        );

        // A read-only /sys is told apart.
        let sysctl = MemorySysctl::default();
        let modules = MemorySysctl::with(&[(CONNTRACK_HASHSIZE, "1024")]);
        modules.refuse_writes(CONNTRACK_HASHSIZE, io::ErrorKind::ReadOnlyFilesystem);
        let report = apply_conntrack(&sysctl, &modules, &ConntrackSettings::default(), 1);
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert!(report.failures[0].read_only());
        assert_eq!(report.failures[0].key, CONNTRACK_HASHSIZE);
    }

    #[test]
    fn counts_cpu_lists() {
        assert_eq!(count_cpu_list("0-3\n"), Some(4));
        assert_eq!(count_cpu_list("0,2,4-5"), Some(4));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
    }
}
