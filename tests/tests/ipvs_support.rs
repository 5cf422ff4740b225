//! Helpers shared by the ipvs-netlink kernel suites (`mod ipvs_support;`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::future::Future;

use ipvs_netlink::IpvsHandle;
use ipvs_proxier_tests::Netns;

/// A multi-threaded runtime for tests that drive handles from the root namespace.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs `f` with a handle built inside `ns` from the (root-namespace) test thread.
pub fn with_handle<F, Fut, T>(ns: &Netns, f: F) -> T
where
    F: FnOnce(IpvsHandle) -> Fut,
    Fut: Future<Output = T>,
{
    let rt = runtime();
    let path = ns.path();
    rt.block_on(async move {
        let h = IpvsHandle::new_in_netns(path)
            .await
            .expect("handle in netns");
        f(h).await
    })
}

/// A namespace with a dummy link carrying 10.1.0.254/16 and fd00:1::fe/64, so that
/// masquerading destinations in those ranges are routable.
pub fn netns_with_routes() -> Netns {
    let ns = Netns::new();
    ns.sh_ok(
        "ip link add d0 type dummy && ip link set d0 up && \
         ip addr add 10.1.0.254/16 dev d0 && ip -6 addr add fd00:1::fe/64 dev d0 nodad",
    );
    ns
}

/// `ipvsadm -Sn` in `ns`, as a set of whitespace-normalised lines.
pub fn saved_rules(ns: &Netns) -> BTreeSet<String> {
    ns.sh_ok("ipvsadm -Sn")
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// The set of the given lines.
pub fn lines(ls: &[&str]) -> BTreeSet<String> {
    ls.iter().map(|s| s.to_string()).collect()
}

/// How long one kernel request may take before [`Watched::step`] fails the test.
pub const STEP_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Kernel requests under a watchdog: a request that has no reply after [`STEP_LIMIT`] fails
/// the test with what is needed to tell where it is stuck (one CI run stalled without
/// telling where): the handle's connection counters (queued / in `sendmsg` / sent / ended,
/// unmatched replies), whether this process was kept from running (the longest gap between
/// one-second wake-ups), the kernel stacks of this process's threads and of every thread in
/// uninterruptible sleep, and the end of the kernel log.
pub trait Watched {
    /// Awaits `request` (a request on this handle), failing the test as described above.
    fn step<T>(&self, what: &str, request: impl Future<Output = T>) -> impl Future<Output = T>;
}

impl Watched for IpvsHandle {
    async fn step<T>(&self, what: &str, request: impl Future<Output = T>) -> T {
        let started = std::time::Instant::now();
        let mut request = std::pin::pin!(request);
        let mut last = started;
        let mut longest_gap = std::time::Duration::ZERO;
        while started.elapsed() < STEP_LIMIT {
            let slice = tokio::time::timeout(std::time::Duration::from_secs(1), request.as_mut());
            if let Ok(value) = slice.await {
                return value;
            }
            let now = std::time::Instant::now();
            longest_gap = longest_gap.max(now - last);
            last = now;
        }
        panic!(
            "{what}: no reply in {:?} (longest gap between one-second wake-ups: {longest_gap:?}); \
             handle: {self:?}\n{}",
            started.elapsed(),
            stuck_report()
        );
    }
}

/// Kernel stacks of this process's threads and of every thread in uninterruptible sleep
/// (any process: generic-netlink requests run in the sender's `sendmsg`, so a request the
/// kernel holds up is a thread of ours in the kernel), of IPVS sync-daemon kernel threads,
/// and the last lines of the kernel log.
pub fn stuck_report() -> String {
    let own = std::process::id().to_string();
    let mut out = String::from("threads (pid/tid comm state wchan):\n");
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return out + "(no /proc)\n";
    };
    for process in processes.flatten() {
        let pid = process.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(process.path().join("task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let dir = task.path();
            let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
                continue;
            };
            // "tid (comm) S ...": comm may contain spaces and parentheses.
            let comm = stat
                .split_once('(')
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map_or("?", |(comm, _)| comm);
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("?");
            let interesting =
                pid == own || state == "D" || comm.starts_with("ipvs") || comm.contains("modprobe");
            if !interesting {
                continue;
            }
            let wchan = std::fs::read_to_string(dir.join("wchan")).unwrap_or_default();
            let stack = std::fs::read_to_string(dir.join("stack")).unwrap_or_default();
            out.push_str(&format!(
                "--- {pid}/{} {comm} {state} {wchan}\n{stack}",
                task.file_name().to_string_lossy()
            ));
        }
    }
    let log = std::process::Command::new("dmesg")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    out.push_str("kernel log (last 40 lines):\n");
    for line in tail.into_iter().rev() {
        out.push_str(line);
        out.push('\n');
    }
    out
}
