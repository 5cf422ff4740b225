//! Tests of `proxier_bin::cli`.

use ipvs_netlink::Scheduler;
use proxier_bin::cli::*;
use std::path::PathBuf;
use std::time::Duration;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_args(std::iter::once("ipvs-proxier").chain(args.iter().copied()))
}

#[test]
fn no_flags_leaves_everything_unset() {
    let cli = parse(&[]).expect("parses");
    assert!(cli.ipvs_sync_period.is_none());
    assert!(cli.masquerade_all.is_none());
    assert!(cli.metrics_bind_address.is_none());
}

#[test]
fn kube_proxy_flags_parse() {
    let cli = parse(&[
        "--kubeconfig=/etc/kube/kubeconfig",
        "--hostname-override",
        "node-a",
        "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
        "--masquerade-all",
        "--nodeport-addresses=192.0.2.0/24",
        "--ipvs-scheduler=wlc",
        "--ipvs-sync-period=1m30s",
        "--ipvs-min-sync-period=500ms",
        "--ipvs-exclude-cidrs=198.51.100.0/24,203.0.113.0/24",
        "--ipvs-strict-arp=false",
        "--ipvs-tcp-timeout=15m",
        "--ipvs-tcpfin-timeout=2m",
        "--ipvs-udp-timeout=30s",
        "--metrics-bind-address=127.0.0.1:10249",
        "--healthz-bind-address=0.0.0.0:10256",
        "--v=4",
    ])
    .expect("parses");
    assert_eq!(cli.kubeconfig, Some(PathBuf::from("/etc/kube/kubeconfig")));
    assert_eq!(cli.hostname_override.as_deref(), Some("node-a"));
    let cidrs = cli.cluster_cidr.expect("set");
    assert_eq!(cidrs.len(), 2);
    assert_eq!(cidrs[1].to_string(), "fd00:10:244::/56");
    assert_eq!(cli.masquerade_all, Some(true));
    assert_eq!(cli.ipvs_scheduler, Some(Scheduler::WeightedLeastConnection));
    assert_eq!(cli.ipvs_sync_period, Some(Duration::from_secs(90)));
    assert_eq!(cli.ipvs_min_sync_period, Some(Duration::from_millis(500)));
    assert_eq!(cli.ipvs_exclude_cidrs.map(|v| v.len()), Some(2));
    assert_eq!(cli.ipvs_strict_arp, Some(false));
    assert_eq!(cli.ipvs_tcp_timeout, Some(Duration::from_secs(900)));
    assert_eq!(cli.ipvs_tcpfin_timeout, Some(Duration::from_secs(120)));
    assert_eq!(cli.ipvs_udp_timeout, Some(Duration::from_secs(30)));
    assert_eq!(cli.verbosity, Some(4));
}

#[test]
fn klog_short_verbosity_forms() {
    assert_eq!(parse(&["-v", "2"]).expect("parses").verbosity, Some(2));
    assert_eq!(parse(&["-v=3"]).expect("parses").verbosity, Some(3));
    assert_eq!(parse(&["-v5"]).expect("parses").verbosity, Some(5));
}

#[test]
fn bool_flags_take_only_attached_values() {
    assert_eq!(parse(&["--dry-run"]).expect("parses").dry_run, Some(true));
    assert_eq!(
        parse(&["--dry-run=false"]).expect("parses").dry_run,
        Some(false)
    );
    // Like pflag, a bool flag does not swallow the next argument.
    assert!(parse(&["--dry-run", "false"]).is_err());
}

#[test]
fn bad_values_are_usage_errors_with_exit_code_2() {
    for args in [
        &["--no-such-flag"][..],
        &["--ipvs-sync-period=30"],
        &["--ipvs-sync-period=-5s"],
        &["--cluster-cidr=10.244.0.0/33"],
        &["--bind-address=not-an-ip"],
        &["--ipvs-scheduler=a-very-long-scheduler"],
        &["--log-format=xml"],
        &["--masquerade-all=maybe"],
    ] {
        let err = parse(args).expect_err(&format!("{args:?} should fail"));
        assert_eq!(err.exit_code(), 2, "{args:?}");
    }
}
