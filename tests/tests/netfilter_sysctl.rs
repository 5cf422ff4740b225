//! proxier-core's sysctl module against a real kernel: every setting lands in the network
//! namespace it runs in (checked with `sysctl`, the oracle), strict ARP included, and a
//! second run changes nothing. And the daemon with the `KubeProxyConfiguration` kubeadm
//! writes: its conntrack and OOM settings reach the kernel, and a scheduler the kernel lacks
//! stops it at start (while a dry run, which needs no IPVS, still plans).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ipvs_proxier_tests::{Netns, PROXIER_BIN_ENV, ShellProcess, require_kernel, wait_until};
use proxier_core::sysctl::{
    KernelVersion, ProcSysctl, SysctlOptions, ensure_sysctls, kernel_version,
};

const KEYS: &str = "net.ipv4.ip_forward net.ipv4.vs.conntrack net.ipv4.vs.expire_nodest_conn \
                    net.ipv4.vs.expire_quiescent_template net.ipv4.conf.all.arp_ignore \
                    net.ipv4.conf.all.arp_announce";

#[test]
fn sysctls_are_set_in_the_namespace_and_reported() {
    require_kernel!();
    let netns = Netns::new();
    // Start from the opposite of what the proxier wants.
    netns.sh_ok(
        "sysctl -w net.ipv4.ip_forward=0 net.ipv4.vs.conntrack=0 net.ipv4.vs.expire_nodest_conn=0 \
         net.ipv4.vs.expire_quiescent_template=0 net.ipv4.conf.all.arp_ignore=0 \
         net.ipv4.conf.all.arp_announce=0 >/dev/null",
    );
    let (first, second, version) = netns.block_on(|| async {
        let store = ProcSysctl::default();
        let options = SysctlOptions { strict_arp: true };
        let first = ensure_sysctls(&store, options);
        let second = ensure_sysctls(&store, options);
        (first, second, kernel_version(&store))
    });
    assert!(first.failures.is_empty(), "{:?}", first.failures);
    assert_eq!(first.changed.len(), 6, "changed: {:?}", first.changed);
    assert!(second.changed.is_empty() && second.failures.is_empty());
    assert_eq!(second.unchanged.len(), 6);

    let values = netns.sh_ok(&format!("sysctl -n {KEYS}"));
    assert_eq!(
        values.split_whitespace().collect::<Vec<_>>(),
        ["1", "1", "1", "1", "1", "2"],
        "{values}"
    );
    // The VM's 6.1 kernel fixed conn_reuse_mode: it is left alone and reported as such.
    let version = version.unwrap();
    assert!(version >= KernelVersion { major: 5, minor: 9 }, "{version}");
    assert!(
        first
            .skipped
            .iter()
            .any(|s| s.key == "net/ipv4/vs/conn_reuse_mode"),
        "{:?}",
        first.skipped
    );

    // Another namespace was not touched.
    let other = Netns::new();
    let untouched = other.sh_ok("sysctl -n net.ipv4.vs.conntrack");
    assert_eq!(untouched.trim(), "0");
}

/// kubeadm's generated file with conntrack, masquerade-all and OOM values set.
const KUBEADM_CONFIG: &str =
    include_str!("../../proxier-bin/tests/fixtures/kubeadm-v1.31-kube-proxy.yaml");

/// One Service without endpoints: enough for the daemon to program something.
const SOURCE: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\n\
spec:\n  clusterIP: 10.96.0.10\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n";

/// Whether the daemon binary is known; prints a SKIP line otherwise.
fn daemon_available(test: &str) -> bool {
    if std::env::var_os(PROXIER_BIN_ENV).is_some() {
        return true;
    }
    eprintln!("SKIP {test}: {PROXIER_BIN_ENV} is not set");
    false
}

/// Writes the config (kubeadm's file with `edit` applied) and the source into a directory of
/// the namespace's own; returns the daemon's command line up to its extra flags.
fn daemon_command(netns: &Netns, config: &str) -> String {
    let dir = std::env::temp_dir().join(format!("netfilter-sysctl-{}", netns.name()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.conf"), config).unwrap();
    std::fs::write(dir.join("cluster.yaml"), SOURCE).unwrap();
    format!(
        "\"${PROXIER_BIN_ENV}\" --config {} --source-file {} --hostname-override node-a \
         --healthz-bind-address= --metrics-bind-address=",
        dir.join("config.conf").display(),
        dir.join("cluster.yaml").display()
    )
}

#[test]
fn daemon_applies_kubeadm_conntrack_and_oom_settings() {
    require_kernel!();
    if !daemon_available("daemon_applies_kubeadm_conntrack_and_oom_settings") {
        return;
    }
    ipvs_proxier_tests::load_modules(&["nf_conntrack"]);
    let netns = Netns::new();
    // Start from values the file does not ask for.
    netns.sh_ok(
        "sysctl -w net.netfilter.nf_conntrack_tcp_timeout_established=432000 \
         net.netfilter.nf_conntrack_tcp_timeout_close_wait=60 \
         net.netfilter.nf_conntrack_tcp_be_liberal=0 net.netfilter.nf_conntrack_udp_timeout=31 \
         net.netfilter.nf_conntrack_udp_timeout_stream=121 >/dev/null",
    );
    let log = std::env::temp_dir().join(format!("netfilter-sysctl-{}.log", netns.name()));
    let pid = netns.sh_ok(&format!(
        "{} >{} 2>&1 </dev/null & echo $!",
        daemon_command(&netns, KUBEADM_CONFIG),
        log.display()
    ));
    let daemon = ShellProcess::new(pid.trim().parse().expect("pid"));
    let keys = "net.netfilter.nf_conntrack_tcp_timeout_established \
                net.netfilter.nf_conntrack_tcp_timeout_close_wait \
                net.netfilter.nf_conntrack_tcp_be_liberal net.netfilter.nf_conntrack_udp_timeout \
                net.netfilter.nf_conntrack_udp_timeout_stream";
    // 12h0m0s, 30m0s, true, 30s, 2m0s in the file.
    let want = ["43200", "1800", "1", "30", "120"];
    wait_until(
        Duration::from_secs(60),
        "the daemon sets the file's conntrack timeouts",
        || {
            netns
                .sh_ok(&format!("sysctl -n {keys}"))
                .split_whitespace()
                .eq(want)
        },
        || {
            format!(
                "sysctls: {}\nlog:\n{}",
                netns.sh_ok(&format!("sysctl -n {keys}")),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        },
    );
    let oom = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", daemon.pid())).unwrap();
    assert_eq!(oom.trim(), "-500", "oomScoreAdj: -500 in the file");
    assert!(
        daemon.running(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    daemon.signal("-TERM");
    wait_until(
        Duration::from_secs(20),
        "the daemon stops",
        || !daemon.running(),
        String::new,
    );

    // nf_conntrack_max belongs to the initial namespace: from this one it is read-only, and
    // the daemon says so and carries on (kube-proxy would stop). 65536 per CPU, at least
    // 262144, in the file.
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let cpus = proxier_core::sysctl::machine_cpus() as u64;
    let max = (65536 * cpus).max(262_144);
    let global = netns.sh_ok("sysctl -n net.netfilter.nf_conntrack_max");
    if global.trim() != max.to_string() {
        assert!(
            log.contains("nf_conntrack_max") && log.contains(&max.to_string()),
            "a refused nf_conntrack_max={max} is reported:\n{log}"
        );
    }
    // kubeadm's ignored fields are listed.
    assert!(
        log.contains("nftables") && log.contains("winkernel"),
        "{log}"
    );
}

#[test]
fn a_scheduler_the_kernel_lacks_stops_the_daemon_but_not_a_dry_run() {
    require_kernel!();
    if !daemon_available("a_scheduler_the_kernel_lacks_stops_the_daemon_but_not_a_dry_run") {
        return;
    }
    let netns = Netns::new();
    // `twos` is a kernel scheduler (6.7 and later) that no guest of the VM matrix has: the
    // runner leaves its module out, so the 6.12 guest lacks it as 5.10 and 6.1 do.
    let lacking = netns.sh("! grep -q ip_vs_twos /proc/modules && \
         ! grep -q ip_vs_twos /lib/modules/$(uname -r)/modules.builtin && \
         ! grep -q ip_vs_twos /lib/modules/$(uname -r)/modules.dep && \
         test -s /lib/modules/$(uname -r)/modules.dep");
    assert!(
        lacking.status.success(),
        "the VM kernel must lack ip_vs_twos for this test"
    );
    let config = KUBEADM_CONFIG.replace("scheduler: \"\"", "scheduler: twos");
    let command = daemon_command(&netns, &config);

    let out = netns.sh(&format!("{command} --once"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ip_vs_twos") && stderr.contains("can't use the IPVS proxier"),
        "{stderr}"
    );
    let ipvs = netns.sh_ok("ipvsadm -Sn");
    assert!(ipvs.trim().is_empty(), "nothing programmed: {ipvs}");

    let dry = netns.sh(&format!("{command} --dry-run"));
    let stdout = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success() && stdout.contains("twos"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&dry.stderr)
    );
}
