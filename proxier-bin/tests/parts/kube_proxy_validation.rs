//! kube-proxy's validation (`pkg/proxy/apis/config/validation/validation_test.go`), case by
//! case for the fields ipvs-proxier reads, through what a user writes: a
//! `KubeProxyConfiguration` file (after kube-proxy's defaulting, as kube-proxy reads one) or
//! flags. Each row names its upstream test function and case in a comment; a refused value
//! must name kube-proxy's field path (flags name the flag) and say what kube-proxy says.
//! Upstream cases on fields ipvs-proxier ignores (udpIdleTimeout, configSyncPeriod,
//! iptables.*, clientConnection.burst) are left out; see docs/migration.md.

use std::path::Path;

use proxier_bin::cli::Cli;
use proxier_bin::config::parse_config;
use proxier_bin::settings::{Settings, resolve};

/// Resolves `flags` over a file holding `fields` (none: no file), any error as its message.
fn load(flags: &[&str], fields: Option<&str>) -> Result<Settings, String> {
    let cli = Cli::try_parse_args(std::iter::once("ipvs-proxier").chain(flags.iter().copied()))
        .map_err(|e| e.to_string())?;
    let file = fields
        .map(|fields| {
            let text = format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{fields}"
            );
            parse_config(&text, Path::new("t.yaml")).map_err(|e| e.to_string())
        })
        .transpose()?;
    resolve(&cli, file.as_ref(), "node").map_err(|e| e.to_string())
}

/// What a case expects: acceptance, or an error naming `.0` and saying `.1`.
type Expect = Option<(&'static str, &'static str)>;

const OK: Expect = None;

fn run(cases: &[(&str, &[&str], Option<&str>, Expect)]) {
    let mut failures = Vec::new();
    for (name, flags, file, expect) in cases {
        match (load(flags, *file), expect) {
            (Ok(_), None) => {}
            (Err(msg), Some((path, says))) if msg.contains(path) && msg.contains(says) => {}
            (got, want) => failures.push(format!(
                "{name}: want {want:?}, got {:?}",
                got.map(|_| "accepted")
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const IPVS: &str = "KubeProxyConfiguration.KubeProxyIPVSConfiguration";
const CONNTRACK: &str = "KubeProxyConfiguration.KubeProxyConntrackConfiguration";

#[test]
fn kube_proxy_configuration_cases() {
    // The body of upstream's TestValidateKubeProxyConfiguration success cases.
    const VALID: &str = "bindAddress: 192.168.59.103\nhealthzBindAddress: 0.0.0.0:10256\n\
        metricsBindAddress: 127.0.0.1:10249\nclusterCIDR: 192.168.59.0/24\n\
        iptables:\n  masqueradeAll: true\nmode: ipvs\nipvs:\n  syncPeriod: 10s\n  minSyncPeriod: 5s\n\
        conntrack:\n  maxPerCore: 1\n  min: 1\n  tcpEstablishedTimeout: 5s\n  tcpCloseWaitTimeout: 5s\n";
    let with = |from: &str, to: &str| VALID.replace(from, to);
    let blank_healthz = with(
        "healthzBindAddress: 0.0.0.0:10256",
        "healthzBindAddress: \"\"",
    );
    let ipv6 = with(
        "bindAddress: 192.168.59.103",
        "bindAddress: fd00:192:168:59::103",
    )
    .replace("127.0.0.1:10249", "\"[::1]:10249\"")
    .replace("192.168.59.0/24", "fd00:192:168:59::/64");
    let other_port = with("0.0.0.0:10256", "0.0.0.0:12345");
    let v6_cluster = with("192.168.59.0/24", "fd00:192:168::/64");
    let dual = with("192.168.59.0/24", "192.168.59.0/24,fd00:192:168::/64");
    let bad_bind = with(
        "bindAddress: 192.168.59.103",
        "bindAddress: 10.10.12.11:2000",
    );
    let bare_healthz = with("0.0.0.0:10256", "0.0.0.0");
    let bad_cidr = with("192.168.59.0/24", "192.168.59.0");
    let three_cidrs = with(
        "192.168.59.0/24",
        "192.168.59.0/24,fd00:192:168::/64,10.0.0.0/16",
    );
    let zero_sync = with(
        "syncPeriod: 10s\n  minSyncPeriod: 5s",
        "syncPeriod: 0s\n  minSyncPeriod: 5s",
    );
    run(&[
        // TestValidateKubeProxyConfiguration, success cases 1-7.
        ("success: IPVS mode", &[], Some(VALID), OK),
        (
            "success: blank HealthzBindAddress",
            &[],
            Some(&blank_healthz),
            OK,
        ),
        ("success: IPv6", &[], Some(&ipv6), OK),
        ("success: other healthz port", &[], Some(&other_port), OK),
        ("success: IPv6 ClusterCIDR", &[], Some(&v6_cluster), OK),
        ("success: dual-stack ClusterCIDR", &[], Some(&dual), OK),
        // "invalid BindAddress"
        (
            "invalid BindAddress",
            &[],
            Some(&bad_bind),
            Some(("KubeProxyConfiguration.BindAddress", "10.10.12.11:2000")),
        ),
        // "invalid HealthzBindAddress": upstream validates before defaulting there; a file
        // is defaulted first (AppendPortIfNeeded), so kube-proxy reads a bare IP as ip:10256.
        (
            "invalid HealthzBindAddress (defaulted)",
            &[],
            Some(&bare_healthz),
            OK,
        ),
        // "ClusterCIDR missing subset range"
        (
            "ClusterCIDR missing subset range",
            &[],
            Some(&bad_cidr),
            Some(("clusterCIDR", "192.168.59.0")),
        ),
        // "Invalid number of ClusterCIDRs"
        (
            "Invalid number of ClusterCIDRs",
            &[],
            Some(&three_cidrs),
            Some((
                "KubeProxyConfiguration.ClusterCIDR",
                "one CIDR per IP family",
            )),
        ),
        // "IPVS mode selected without providing required SyncPeriod": a file's 0s is
        // defaulted to 30s; a flag's 0 is refused.
        (
            "required SyncPeriod (file, defaulted)",
            &[],
            Some(&zero_sync),
            OK,
        ),
        (
            "required SyncPeriod (flag)",
            &["--ipvs-sync-period=0s"],
            None,
            Some(("--ipvs-sync-period", "must be greater than 0")),
        ),
        // Validate's OOMScoreAdj rule (no upstream case).
        (
            "OOMScoreAdj in range",
            &[],
            Some("oomScoreAdj: -1000\n"),
            OK,
        ),
        (
            "OOMScoreAdj too large",
            &[],
            Some("oomScoreAdj: 1001\n"),
            Some((
                "KubeProxyConfiguration.OOMScoreAdj",
                "must be within the range [-1000, 1000]",
            )),
        ),
        (
            "OOMScoreAdj too small (flag)",
            &["--oom-score-adj=-1001"],
            None,
            Some(("--oom-score-adj", "must be within the range [-1000, 1000]")),
        ),
    ]);
}

#[test]
fn ipvs_configuration_cases() {
    let ipvs =
        |sync: &str, min: &str| format!("ipvs:\n  syncPeriod: {sync}\n  minSyncPeriod: {min}\n");
    let cases: Vec<(&str, Vec<&str>, Option<String>, Expect)> = vec![
        // "SyncPeriod is not greater than 0"
        ("SyncPeriod is not greater than 0", vec![], Some(ipvs("-5s", "2s")), Some(("KubeProxyConfiguration.KubeProxyIPVSConfiguration.SyncPeriod", "must be greater than 0"))),
        // "SyncPeriod cannot be 0": refused as a flag, defaulted (30s >= 10s) in a file.
        ("SyncPeriod cannot be 0 (flag)", vec!["--ipvs-sync-period=0s", "--ipvs-min-sync-period=10s"], None, Some(("--ipvs-sync-period", "must be greater than 0"))),
        ("SyncPeriod cannot be 0 (file, defaulted)", vec![], Some(ipvs("0s", "10s")), OK),
        // "MinSyncPeriod cannot be less than 0"
        ("MinSyncPeriod cannot be less than 0", vec![], Some(ipvs("5s", "-1s")), Some(("KubeProxyConfiguration.KubeProxyIPVSConfiguration.MinSyncPeriod", "must be greater than or equal to 0"))),
        // "SyncPeriod must be greater than MinSyncPeriod"
        ("SyncPeriod must be greater than MinSyncPeriod", vec![], Some(ipvs("1s", "5s")), Some(("KubeProxyConfiguration.KubeProxyIPVSConfiguration.SyncPeriod", "must be greater than or equal to KubeProxyConfiguration.KubeProxyIPVSConfiguration.MinSyncPeriod"))),
        // "SyncPeriod == MinSyncPeriod"
        ("SyncPeriod == MinSyncPeriod", vec![], Some(ipvs("10s", "10s")), OK),
        // "SyncPeriod should be > MinSyncPeriod"
        ("SyncPeriod should be > MinSyncPeriod", vec![], Some(ipvs("10s", "5s")), OK),
        // "MinSyncPeriod can be 0"
        ("MinSyncPeriod can be 0", vec![], Some(ipvs("5s", "0s")), OK),
        // "IPVS Timeout can be 0"
        ("IPVS Timeout can be 0", vec![], Some("ipvs:\n  syncPeriod: 5s\n  tcpTimeout: 0s\n  tcpFinTimeout: 0s\n  udpTimeout: 0s\n".into()), OK),
        // "IPVS Timeout > 0"
        ("IPVS Timeout > 0", vec![], Some("ipvs:\n  syncPeriod: 5s\n  tcpTimeout: 1s\n  tcpFinTimeout: 2s\n  udpTimeout: 3s\n".into()), OK),
        // "TCP,TCPFin,UDP Timeouts < 0", one field at a time.
        ("TCPTimeout < 0", vec![], Some("ipvs:\n  tcpTimeout: -1s\n".into()), Some((concat!("KubeProxyConfiguration.KubeProxyIPVSConfiguration", ".TCPTimeout"), "must be greater than or equal to 0"))),
        ("TCPFinTimeout < 0", vec![], Some("ipvs:\n  tcpFinTimeout: -1s\n".into()), Some(("KubeProxyConfiguration.KubeProxyIPVSConfiguration.TCPFinTimeout", "must be greater than or equal to 0"))),
        ("UDPTimeout < 0", vec![], Some("ipvs:\n  udpTimeout: -1s\n".into()), Some(("KubeProxyConfiguration.KubeProxyIPVSConfiguration.UDPTimeout", "must be greater than or equal to 0"))),
    ];
    let cases: Vec<(&str, &[&str], Option<&str>, Expect)> = cases
        .iter()
        .map(|(n, f, t, e)| (*n, f.as_slice(), t.as_deref(), *e))
        .collect();
    run(&cases);
    assert!(IPVS.ends_with("KubeProxyIPVSConfiguration"));
}

#[test]
fn conntrack_configuration_cases() {
    let ct = |fields: &str| format!("conntrack:\n{fields}");
    let cases: Vec<(&str, Vec<&str>, Option<String>, Expect)> = vec![
        // "valid 5 second timeouts"
        (
            "valid 5 second timeouts",
            vec![],
            Some(ct(
                "  maxPerCore: 1\n  min: 1\n  tcpEstablishedTimeout: 5s\n  tcpCloseWaitTimeout: 5s\n",
            )),
            OK,
        ),
        // "valid duration equal to 0 second timeout"
        (
            "valid duration equal to 0 second timeout",
            vec![],
            Some(ct(
                "  maxPerCore: 1\n  min: 1\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n",
            )),
            OK,
        ),
        // "invalid MaxPerCore < 0"
        (
            "invalid MaxPerCore < 0",
            vec![],
            Some(ct("  maxPerCore: -1\n  min: 1\n")),
            Some((
                "KubeProxyConfiguration.KubeProxyConntrackConfiguration.MaxPerCore",
                "must be greater than or equal to 0",
            )),
        ),
        (
            "invalid MaxPerCore < 0 (flag)",
            vec!["--conntrack-max-per-core=-1"],
            None,
            Some((
                "--conntrack-max-per-core",
                "must be greater than or equal to 0",
            )),
        ),
        // "invalid minimum < 0"
        (
            "invalid minimum < 0",
            vec![],
            Some(ct("  maxPerCore: 1\n  min: -1\n")),
            Some((
                "KubeProxyConfiguration.KubeProxyConntrackConfiguration.Min",
                "must be greater than or equal to 0",
            )),
        ),
        (
            "invalid minimum < 0 (flag)",
            vec!["--conntrack-min", "-1"],
            None,
            Some(("--conntrack-min", "must be greater than or equal to 0")),
        ),
        // "invalid EstablishedTimeout < 0"
        (
            "invalid EstablishedTimeout < 0",
            vec![],
            Some(ct("  tcpEstablishedTimeout: -5s\n")),
            Some((
                "KubeProxyConfiguration.KubeProxyConntrackConfiguration.TCPEstablishedTimeout",
                "must be greater than or equal to 0",
            )),
        ),
        // "invalid CloseWaitTimeout < 0"
        (
            "invalid CloseWaitTimeout < 0",
            vec![],
            Some(ct("  tcpCloseWaitTimeout: -5s\n")),
            Some((
                "KubeProxyConfiguration.KubeProxyConntrackConfiguration.TCPCloseWaitTimeout",
                "must be greater than or equal to 0",
            )),
        ),
        // "invalid UDPTimeout < 0"
        (
            "invalid UDPTimeout < 0",
            vec![],
            Some(ct("  udpTimeout: -5s\n")),
            Some((
                "KubeProxyConfiguration.KubeProxyConntrackConfiguration.UDPTimeout",
                "must be greater than or equal to 0",
            )),
        ),
        // "invalid UDPStreamTimeout < 0"
        (
            "invalid UDPStreamTimeout < 0",
            vec![],
            Some(ct("  udpStreamTimeout: -5s\n")),
            Some((
                "KubeProxyConfiguration.KubeProxyConntrackConfiguration.UDPStreamTimeout",
                "must be greater than or equal to 0",
            )),
        ),
    ];
    let cases: Vec<(&str, &[&str], Option<&str>, Expect)> = cases
        .iter()
        .map(|(n, f, t, e)| (*n, f.as_slice(), t.as_deref(), *e))
        .collect();
    run(&cases);
    assert!(CONNTRACK.ends_with("KubeProxyConntrackConfiguration"));
}

#[test]
fn proxy_mode_cases() {
    run(&[
        // TestValidateProxyMode: "blank mode should default" (to ipvs here).
        ("blank mode should default", &[], Some("mode: \"\"\n"), OK),
        ("ipvs", &[], Some("mode: ipvs\n"), OK),
        // "invalid mode non-existent"
        (
            "invalid mode non-existent",
            &[],
            Some("mode: non-existing\n"),
            Some((
                "KubeProxyConfiguration.Mode.ProxyMode",
                "must be iptables,ipvs,nftables or blank",
            )),
        ),
        // kube-proxy compares the mode exactly: `IPVS` is not `ipvs`.
        (
            "mode compared exactly",
            &[],
            Some("mode: IPVS\n"),
            Some(("KubeProxyConfiguration.Mode.ProxyMode", "\"IPVS\"")),
        ),
        (
            "mode compared exactly (flag)",
            &["--proxy-mode=IPVS"],
            None,
            Some(("--proxy-mode", "\"IPVS\"")),
        ),
        // Valid for kube-proxy, not implemented here: refused as a conflict.
        (
            "iptables mode",
            &[],
            Some("mode: iptables\n"),
            Some(("iptables", "only implements \"ipvs\"")),
        ),
    ]);
}

#[test]
fn host_port_cases() {
    // TestValidateHostPort, through both bind address fields of a file.
    for field in ["healthzBindAddress", "metricsBindAddress"] {
        let path: &'static str = if field == "healthzBindAddress" {
            "KubeProxyConfiguration.HealthzBindAddress"
        } else {
            "KubeProxyConfiguration.MetricsBindAddress"
        };
        let f = |value: &str| format!("{field}: \"{value}\"\n");
        let cases: Vec<(&str, Option<String>, Expect)> = vec![
            // success cases
            ("0.0.0.0:10256", Some(f("0.0.0.0:10256")), OK),
            ("127.0.0.1:10256", Some(f("127.0.0.1:10256")), OK),
            ("10.10.10.10:10256", Some(f("10.10.10.10:10256")), OK),
            // "missing port": valid once defaulted (the default port is appended).
            ("missing port (defaulted)", Some(f("10.10.10.10")), OK),
            // "digits outside of 1-255"
            (
                "digits outside of 1-255",
                Some(f("123.456.789.10:12345")),
                Some((path, "123.456.789.10")),
            ),
            // "invalid named-port"
            (
                "invalid named-port",
                Some(f("10.10.10.10:foo")),
                Some((path, "10.10.10.10:foo")),
            ),
            // "port cannot be 0"
            (
                "port cannot be 0",
                Some(f("10.10.10.10:0")),
                Some((path, "must be a valid port")),
            ),
            // "port is greater than allowed range"
            (
                "port is greater than allowed range",
                Some(f("10.10.10.10:65536")),
                Some((path, "10.10.10.10:65536")),
            ),
        ];
        let cases: Vec<(&str, &[&str], Option<&str>, Expect)> = cases
            .iter()
            .map(|(n, t, e)| (*n, &[][..], t.as_deref(), *e))
            .collect();
        run(&cases);
    }
}

#[test]
fn ipvs_scheduler_cases() {
    // TestValidateIPVSSchedulerMethod: every supported method, and blank.
    for name in [
        "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "",
    ] {
        let file = format!("ipvs:\n  scheduler: \"{name}\"\n");
        assert!(load(&[], Some(&file)).is_ok(), "scheduler {name:?} refused");
    }
    run(&[
        // "non-existent scheduler method"
        (
            "non-existent scheduler method",
            &[],
            Some("ipvs:\n  scheduler: non-existing\n"),
            Some((
                "KubeProxyConfiguration.KubeProxyIPVSConfiguration.Scheduler.Scheduler",
                "blank means the default algorithm method (currently rr)",
            )),
        ),
        (
            "non-existent scheduler method (flag)",
            &["--ipvs-scheduler=bogus"],
            None,
            Some(("--ipvs-scheduler", "\"bogus\"")),
        ),
        // The kernel's schedulers kube-proxy's list lacks are accepted (the kernel decides).
        ("kernel scheduler mh", &["--ipvs-scheduler=mh"], None, OK),
    ]);
}

#[test]
fn node_port_address_cases() {
    // TestValidateKubeProxyNodePortAddress success cases.
    for list in [
        "[]",
        "[127.0.0.0/8]",
        "[0.0.0.0/0]",
        "[\"::/0\"]",
        "[127.0.0.1/32, 1.2.3.0/24]",
        "[\"::1/128\"]",
        "[1.2.3.4/32]",
        "[10.20.0.0/16, 100.200.0.0/16]",
        "[\"2001:db8::/32\"]",
        "[primary]",
    ] {
        let file = format!("nodePortAddresses: {list}\n");
        assert!(load(&[], Some(&file)).is_ok(), "{list} refused");
    }
    let path = "KubeProxyConfiguration.NodePortAddresses";
    run(&[
        // "invalid foo address"
        (
            "invalid foo address",
            &[],
            Some("nodePortAddresses: [foo]\n"),
            Some((path, "\"foo\"")),
        ),
        // "invalid octet address"
        (
            "invalid octet address",
            &[],
            Some("nodePortAddresses: [10.0.0.0/0, 1.2.3]\n"),
            Some((path, "\"1.2.3\"")),
        ),
        // "address cannot be 0"
        (
            "address cannot be 0",
            &[],
            Some("nodePortAddresses: [127.0.0.1/32, \"0\", 1.2.3.0/24]\n"),
            Some((path, "\"0\"")),
        ),
        // "address missing subnet range"
        (
            "address missing subnet range",
            &[],
            Some("nodePortAddresses: [127.0.0.1/32, 10.20.30.40, 1.2.3.0/24]\n"),
            Some((path, "\"10.20.30.40\"")),
        ),
        // "missing ipv6 subnet ranges"
        (
            "missing ipv6 subnet ranges",
            &[],
            Some("nodePortAddresses: [\"::0\", \"::1\", \"2001:db8::/32\"]\n"),
            Some((path, "\"::0\"")),
        ),
        // "invalid ipv6 ip format"
        (
            "invalid ipv6 ip format",
            &[],
            Some("nodePortAddresses: [\"::1/128\", \"2001:db8::/32\", \"2001:db8:xyz/64\"]\n"),
            Some((path, "\"2001:db8:xyz/64\"")),
        ),
        // "primary" and CIDRs together (upstream's NodePortAddressesPrimary rule)
        (
            "primary with CIDRs",
            &[],
            Some("nodePortAddresses: [primary, 10.0.0.0/8]\n"),
            Some((path, "primary")),
        ),
    ]);
}

#[test]
fn exclude_cidr_cases() {
    // TestValidateKubeProxyExcludeCIDRs success cases.
    for list in [
        "[]",
        "[127.0.0.0/8]",
        "[\"::/0\"]",
        "[127.0.0.1/32, 1.2.3.0/24]",
        "[\"2001:db8::/32\"]",
    ] {
        let file = format!("ipvs:\n  excludeCIDRs: {list}\n");
        assert!(load(&[], Some(&file)).is_ok(), "{list} refused");
    }
    let path = "KubeProxyConfiguration.KubeProxyIPVSConfiguration.ExcludeCIDRs";
    let exclude = |list: &str| format!("ipvs:\n  excludeCIDRs: {list}\n");
    let cases: Vec<(&str, Option<String>, Expect)> = vec![
        (
            "invalid foo address",
            Some(exclude("[foo]")),
            Some((path, "\"foo\"")),
        ),
        (
            "invalid octet address",
            Some(exclude("[10.0.0.0/0, 1.2.3]")),
            Some((path, "\"1.2.3\"")),
        ),
        (
            "address cannot be 0",
            Some(exclude("[127.0.0.1/32, \"0\", 1.2.3.0/24]")),
            Some((path, "\"0\"")),
        ),
        (
            "address missing subnet range",
            Some(exclude("[127.0.0.1/32, 10.20.30.40]")),
            Some((path, "\"10.20.30.40\"")),
        ),
        (
            "missing ipv6 subnet ranges",
            Some(exclude("[\"::0\", \"::1\"]")),
            Some((path, "\"::0\"")),
        ),
        (
            "invalid ipv6 ip format",
            Some(exclude("[\"::1/128\", \"2001:db8:xyz/64\"]")),
            Some((path, "\"2001:db8:xyz/64\"")),
        ),
    ];
    let cases: Vec<(&str, &[&str], Option<&str>, Expect)> = cases
        .iter()
        .map(|(n, t, e)| (*n, &[][..], t.as_deref(), *e))
        .collect();
    run(&cases);
}
