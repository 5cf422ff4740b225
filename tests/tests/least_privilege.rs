//! The `ipvs-proxier` daemon needs no privileged container: confined to CAP_NET_ADMIN it
//! programs IPVS virtual servers, the `kube-ipvs0` link and its nftables table, sets its
//! sysctls, follows an edit, adopts the kernel on restart without a write, and cleans up.
//!
//! The daemon is confined the way a container runtime confines a container whose
//! `securityContext.capabilities` is `drop: [ALL], add: [NET_ADMIN]` with
//! `allowPrivilegeEscalation: false`: it stays uid 0, every other capability is dropped from
//! its bounding set, its effective and permitted sets are exactly NET_ADMIN, its inheritable
//! and ambient sets are empty, and `no_new_privs` is set. The VM's `setpriv` is busybox's,
//! which cannot change the bounding set, so the test does those few syscalls itself between
//! fork and exec (`prctl(PR_CAPBSET_DROP)`, `capset`, `prctl(PR_SET_NO_NEW_PRIVS)`), after
//! entering the test's network namespace with `setns` (which needs CAP_SYS_ADMIN, so it
//! comes first). The daemon's `/proc/<pid>/status` then proves what it ran with.
//!
//! A control run with no capability at all must fail and program nothing, so the test also
//! shows the confinement is real.
//!
//! Why CAP_NET_ADMIN and nothing else (see docs/least-privilege.md):
//! - IPVS generic netlink (`IPVS_CMD_*` set commands), rtnetlink link and address changes,
//!   nftables transactions and conntrack netlink deletes all check CAP_NET_ADMIN in the
//!   socket's network namespace;
//! - the `net.*` sysctls of the daemon's namespace are writable by uid 0 with
//!   CAP_NET_ADMIN (the files are owned by root, and net sysctls grant their owner bits to
//!   CAP_NET_ADMIN holders): no CAP_SYS_ADMIN or CAP_DAC_OVERRIDE;
//! - the health (10256) and metrics (10249) ports are above 1024: no CAP_NET_BIND_SERVICE;
//! - modules are loaded beforehand (here by the VM's `/init`; on a node by
//!   `/etc/modules-load.d`): no CAP_SYS_MODULE.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// Confining a child between fork and exec (`pre_exec`, `setns`, `prctl`, `capset`) and
// signalling it are system calls std does not wrap.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ipvs_proxier_tests::{Netns, PROXIER_BIN_ENV, require_kernel};

/// `CAP_NET_ADMIN` (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;

/// The capabilities the daemon runs with: CAP_NET_ADMIN only.
const NEEDED: u64 = 1 << CAP_NET_ADMIN;

const SOURCE: &str = include_str!("../fixtures/web-and-dns.yaml");

fn source(dns_endpoint: &str) -> String {
    SOURCE.replace("DNS_ENDPOINT", dns_endpoint)
}

fn expected_ipvs(dns_endpoint: &str) -> BTreeSet<String> {
    [
        "-A -t 10.96.0.10:80 -s rr".to_owned(),
        "-a -t 10.96.0.10:80 -r 10.244.0.2:8080 -m -w 1".to_owned(),
        "-a -t 10.96.0.10:80 -r 10.244.0.3:8080 -m -w 1".to_owned(),
        "-A -u 10.96.0.20:53 -s rr".to_owned(),
        format!("-a -u 10.96.0.20:53 -r {dns_endpoint}:5353 -m -w 1"),
    ]
    .into_iter()
    .collect()
}

fn note(line: &str) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("least_privilege: {line}\n").as_bytes());
}

/// The highest capability number this kernel knows.
fn cap_last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .expect("/proc/sys/kernel/cap_last_cap")
        .trim()
        .parse()
        .expect("cap_last_cap is a number")
}

/// A node: a network namespace, a route to the pods, the source file in a directory of its own.
struct Node {
    ns: Netns,
    dir: PathBuf,
}

impl Node {
    fn new() -> Node {
        ipvs_proxier_tests::load_modules(&[
            "nf_reject_ipv4",
            "nf_reject_ipv6",
            "nft_reject_ipv4",
            "nft_reject_ipv6",
        ]);
        let ns = Netns::new();
        // Masquerading real servers need a route to them; made by the test, as root.
        ns.sh_ok(
            "ip link add pods type dummy && ip link set pods up && ip addr add 10.244.0.1/24 dev pods",
        );
        let dir = std::env::temp_dir().join(format!("least-privilege-{}", ns.name()));
        std::fs::create_dir_all(&dir).unwrap();
        Node { ns, dir }
    }

    fn source(&self) -> PathBuf {
        self.dir.join("cluster.yaml")
    }

    fn write_source(&self, yaml: &str) {
        let tmp = self.dir.join("cluster.yaml.tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.source()).unwrap();
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The daemon with `args` (and the source file, unless cleaning up), in this namespace, confined to the capabilities in `keep`.
    fn confined(&self, keep: u64, args: &[&str]) -> Command {
        let netns = File::open(self.ns.path()).expect("open the namespace file");
        let last = cap_last_cap();
        let mut command = Command::new(ipvs_proxier_tests::proxier_bin());
        if !args.contains(&"--cleanup") {
            command
                .arg("--source-file")
                .arg(self.source())
                .args(["--hostname-override", "node-a"]);
        }
        command.args(args).stdin(Stdio::null());
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls on memory it owns; it allocates nothing.
        unsafe {
            command.pre_exec(move || confine(netns.as_raw_fd(), keep, last));
        }
        command
    }

    /// Runs the confined daemon to completion.
    fn run_confined(&self, keep: u64, args: &[&str]) -> Output {
        self.confined(keep, args).output().expect("run the daemon")
    }

    /// Starts the confined daemon in the background, its output going to `log`.
    fn spawn_confined(&self, keep: u64, args: &[&str], log: &str) -> Child {
        let out = File::create(self.log_path(log)).unwrap();
        let err = out.try_clone().unwrap();
        self.confined(keep, args)
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start the daemon")
    }

    fn read_log(&self, log: &str) -> String {
        std::fs::read_to_string(self.log_path(log)).unwrap_or_default()
    }

    fn ipvsadm_save(&self) -> String {
        self.ns.sh_ok("ipvsadm -Sn")
    }

    fn ipvs_lines(&self) -> BTreeSet<String> {
        self.ipvsadm_save().lines().map(str::to_owned).collect()
    }

    /// Addresses on kube-ipvs0 (empty when the link is absent).
    fn vips(&self) -> BTreeSet<String> {
        let out = self.ns.sh("ip -o -4 addr show dev kube-ipvs0");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                words.find(|w| *w == "inet")?;
                words.next().map(str::to_owned)
            })
            .collect()
    }

    fn link_exists(&self) -> bool {
        self.ns.sh("ip link show kube-ipvs0").status.success()
    }

    fn nft_tables(&self) -> String {
        self.ns.sh_ok("nft list tables")
    }

    fn sysctl(&self, key: &str) -> String {
        self.ns
            .sh_ok(&format!("cat /proc/sys/{key}"))
            .trim()
            .to_owned()
    }

    fn wait_for(&self, what: &str, log: &str, mut check: impl FnMut(&Node) -> bool) {
        ipvs_proxier_tests::wait_until(
            Duration::from_secs(60),
            what,
            || check(self),
            || {
                format!(
                    "ipvsadm -Sn:\n{}\nvips: {:?}\nnft: {}\ndaemon log:\n{}",
                    self.ipvsadm_save(),
                    self.vips(),
                    self.nft_tables(),
                    self.read_log(log)
                )
            },
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Between fork and exec: enter the namespace, then drop every capability not in `keep` from
/// the bounding set, make `keep` the effective and permitted sets (inheritable and ambient
/// empty), and set `no_new_privs`. The process stays uid 0, so at exec its permitted and
/// effective sets become its bounding set: `keep`.
fn confine(netns_fd: libc::c_int, keep: u64, last_cap: u32) -> std::io::Result<()> {
    let check = |rc: libc::c_long| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: plain system calls that change only this (forked) process; no pointers.
    unsafe {
        check(libc::setns(netns_fd, libc::CLONE_NEWNET).into())?;
        for cap in 0..=last_cap {
            if keep & (1u64 << cap) == 0 {
                check(
                    libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0).into(),
                )?;
            }
        }
        check(
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            )
            .into(),
        )?;
        ipvs_proxier_tests::set_thread_capabilities(keep)?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())?;
    }
    Ok(())
}

/// The capability sets and `NoNewPrivs` of a running process, from `/proc/<pid>/status`.
#[derive(Debug, PartialEq, Eq)]
struct ProcCaps {
    inheritable: u64,
    permitted: u64,
    effective: u64,
    bounding: u64,
    ambient: u64,
    no_new_privs: bool,
    uid: String,
}

fn proc_caps(pid: u32) -> ProcCaps {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("{name} missing from /proc/{pid}/status:\n{status}"))
            .trim()
            .to_owned()
    };
    let hex = |name: &str| u64::from_str_radix(&field(name), 16).expect("hex capability set");
    ProcCaps {
        inheritable: hex("CapInh"),
        permitted: hex("CapPrm"),
        effective: hex("CapEff"),
        bounding: hex("CapBnd"),
        ambient: hex("CapAmb"),
        no_new_privs: field("NoNewPrivs") == "1",
        uid: field("Uid"),
    }
}

fn stop(mut child: Child) {
    // SIGTERM: the daemon stops and leaves the data plane programmed.
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: signalling our own child, which has not been reaped yet.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    for _ in 0..100 {
        if child.try_wait().expect("wait").is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the daemon did not stop within 10 s of SIGTERM");
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn net_admin_alone_programs_adopts_and_cleans_up() {
    require_kernel!();
    if std::env::var_os(PROXIER_BIN_ENV).is_none() {
        let _ = std::io::stderr().lock().write_all(
            format!(
                "SKIP net_admin_alone_programs_adopts_and_cleans_up: {PROXIER_BIN_ENV} is not set\n"
            )
            .as_bytes(),
        );
        return;
    }
    let node = Node::new();
    node.write_source(&source("10.244.0.2"));

    // Control: with no capability at all the daemon cannot program anything.
    let denied = node.run_confined(0, &["--once"]);
    assert!(
        !denied.status.success(),
        "without CAP_NET_ADMIN the daemon must fail:\n{}",
        text(&denied)
    );
    assert_eq!(
        node.ipvsadm_save().trim(),
        "",
        "nothing programmed without capabilities"
    );
    assert!(!node.link_exists(), "no kube-ipvs0 without capabilities");
    note("control run without capabilities failed as it must");

    // Fresh namespace defaults: the daemon has to write these itself.
    assert_eq!(node.sysctl("net/ipv4/ip_forward"), "0");

    // The long-running daemon with CAP_NET_ADMIN only.
    let log = "daemon.log";
    let daemon = node.spawn_confined(NEEDED, &["--ipvs-min-sync-period=0s", "-v", "2"], log);
    let pid = daemon.id();
    node.wait_for("confined daemon programs both Services", log, |n| {
        n.ipvs_lines() == expected_ipvs("10.244.0.2")
            && n.vips() == ["10.96.0.10/32", "10.96.0.20/32"].map(str::to_owned).into()
            && n.nft_tables().contains("table ip ipvs-proxier")
    });
    let caps = proc_caps(pid);
    note(&format!("daemon {pid} ran with {caps:?}"));
    assert_eq!(
        caps,
        ProcCaps {
            inheritable: 0,
            permitted: NEEDED,
            effective: NEEDED,
            bounding: NEEDED,
            ambient: 0,
            no_new_privs: true,
            uid: caps.uid.clone(),
        },
        "the daemon must hold CAP_NET_ADMIN and nothing else"
    );
    assert!(
        caps.uid.split_whitespace().all(|u| u == "0"),
        "uid 0 as in the container: {}",
        caps.uid
    );
    // The sysctls IPVS mode needs were written by the confined daemon.
    assert_eq!(node.sysctl("net/ipv4/ip_forward"), "1");
    assert_eq!(node.sysctl("net/ipv4/vs/conntrack"), "1");
    assert_eq!(node.sysctl("net/ipv4/vs/expire_nodest_conn"), "1");
    // The health server (0.0.0.0:10256) answers inside the namespace.
    node.ns.wait_listening(10256);
    let healthz = node.ns.sh_ok(
        "printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' | socat -T5 - TCP:127.0.0.1:10256",
    );
    assert!(
        healthz.starts_with("HTTP/1.0 200") || healthz.starts_with("HTTP/1.1 200"),
        "healthz: {healthz}"
    );

    // An edit: the UDP Service's endpoint moves (a real server replaced, stale UDP conntrack
    // entries flushed through conntrack netlink).
    node.write_source(&source("10.244.0.3"));
    node.wait_for("confined daemon follows an edit", log, |n| {
        n.ipvs_lines() == expected_ipvs("10.244.0.3")
    });
    stop(daemon);
    let daemon_log = node.read_log(log);
    // What kube-proxy also tries at start and needs more than CAP_NET_ADMIN for: lowering
    // oom_score_adj (CAP_SYS_RESOURCE) and nf_conntrack_max and the conntrack hash size
    // (the initial network namespace only). The daemon logs those refusals and goes on.
    let beyond_net_admin = [
        "oom_score_adj",
        "nf_conntrack_max",
        "nf_conntrack/parameters",
    ];
    let refused: Vec<&str> = daemon_log
        .lines()
        .filter(|line| !beyond_net_admin.iter().any(|key| line.contains(key)))
        .filter(|line| {
            ["Operation not permitted", "EPERM", "Permission denied"]
                .iter()
                .any(|refusal| line.contains(refusal))
        })
        .collect();
    assert!(
        refused.is_empty(),
        "the confined daemon was refused something:\n{}\n\ndaemon log:\n{daemon_log}",
        refused.join("\n")
    );
    assert!(
        !daemon_log.contains("some sysctls could not be set"),
        "sysctls failed:\n{daemon_log}"
    );

    // A restart adopts what is programmed: zero writes.
    let once = node.run_confined(NEEDED, &["--once"]);
    let stdout = String::from_utf8_lossy(&once.stdout);
    assert!(once.status.success(), "--once failed:\n{}", text(&once));
    assert!(
        stdout.contains("kernel full sync: 0 writes (0 deletes, 0 failed)"),
        "a restart on a programmed kernel writes nothing:\n{}",
        text(&once)
    );
    assert_eq!(node.ipvs_lines(), expected_ipvs("10.244.0.3"));
    note("restart with CAP_NET_ADMIN only: 0 writes");

    // Cleanup removes everything the daemon made.
    let cleanup = node.run_confined(NEEDED, &["--cleanup"]);
    assert!(
        cleanup.status.success(),
        "--cleanup failed:\n{}",
        text(&cleanup)
    );
    assert_eq!(node.ipvsadm_save().trim(), "", "virtual servers removed");
    assert!(!node.link_exists(), "kube-ipvs0 removed");
    let tables = node.nft_tables();
    assert!(
        !tables.contains("ipvs-proxier"),
        "nftables table removed: {tables}"
    );
    note("cleanup with CAP_NET_ADMIN only removed virtual servers, link and table");
}
