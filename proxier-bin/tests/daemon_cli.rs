//! The `ipvs-proxier` binary as a user runs it: exit codes for bad flags, the dry run that
//! prints one plan and exits (as a table, JSON or YAML), and `--dry-run --watch`, which serves
//! health and metrics on loopback only when asked, follows the source file printing only what
//! changed, and stops cleanly on SIGTERM.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::process::{BIN, CLUSTER, Daemon, http_get, listening_address, temp_file, wait_line};

fn exit_code(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().expect("run binary");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_exit_with_code_2() {
    let bad_config = temp_file(
        "bad-kind",
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
    );
    let bad_config_arg = format!("--config={}", bad_config.display());
    for args in [
        vec!["--no-such-flag"],
        vec!["--ipvs-sync-period=soon"],
        vec!["--source-file=x.yaml", "--master=https://127.0.0.1:6443"],
        vec!["--ipvs-min-sync-period=2m", "--ipvs-sync-period=1m"],
        vec!["--proxy-mode=iptables"],
        vec![bad_config_arg.as_str()],
        vec!["--watch"],
        vec!["--dry-run", "--watch", "--once"],
        vec!["--dry-run", "--output=xml"],
        vec!["--detect-local-mode=BridgeInterface"],
        vec!["--detect-local-mode=Nope"],
        // Refused by kube-proxy's validation too.
        vec!["--dry-run", "--ipvs-scheduler=bogus"],
        vec!["--dry-run", "--proxy-mode=IPVS"],
        vec!["--dry-run", "--oom-score-adj=-1001"],
        vec!["--dry-run", "--conntrack-max-per-core=-1"],
    ] {
        let (code, stderr) = exit_code(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(!stderr.trim().is_empty(), "{args:?} must say why");
    }
    let _ = std::fs::remove_file(bad_config);
}

fn dry_run(extra: &[&str]) -> (std::process::ExitStatus, String, String) {
    let path = temp_file(
        &format!("once-{}", extra.join("").replace(['-', '='], "")),
        CLUSTER,
    );
    let out = Command::new(BIN)
        .args(["--hostname-override=node-a"])
        .args(extra)
        .arg(format!("--source-file={}", path.display()))
        .stdin(Stdio::null())
        .output()
        .expect("run binary");
    let _ = std::fs::remove_file(path);
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn dry_run_prints_the_plan_once_and_exits_0() {
    let (status, stdout, stderr) = dry_run(&["--dry-run"]);
    assert!(status.success(), "stderr: {stderr}");
    assert_eq!(status.code(), Some(0));
    assert!(
        stdout.contains("9 services")
            && stdout.contains("10 endpoint slices")
            && stdout.contains("node node-a"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("shop/web") && l.contains("NodePort")),
        "NodePort rows for the node's addresses: {stdout}"
    );
    // Exactly one plan: one summary line.
    assert_eq!(stdout.matches("dry-run full sync:").count(), 1, "{stdout}");
    // Logs are on stderr, without colours when stderr is not a terminal.
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escapes in a pipe: {stderr:?}"
    );
    assert!(!stdout.contains('\u{1b}'), "{stdout:?}");

    // --once is the same as --dry-run alone.
    let (status, once_stdout, _) = dry_run(&["--dry-run", "--once"]);
    assert!(status.success());
    assert_eq!(once_stdout, stdout);
}

#[test]
fn kubeadms_generated_config_file_plans_unchanged() {
    // Compiled in: the kernel tests run this binary in a VM where the source tree is not.
    for (name, fixture) in [
        (
            "kubeadm-v1.31-kube-proxy-unchanged.yaml",
            include_str!("fixtures/kubeadm-v1.31-kube-proxy-unchanged.yaml"),
        ),
        (
            "kubeadm-v1.31-kube-proxy.yaml",
            include_str!("fixtures/kubeadm-v1.31-kube-proxy.yaml"),
        ),
        (
            "kubeadm-v1.20-kube-proxy.yaml",
            include_str!("fixtures/kubeadm-v1.20-kube-proxy.yaml"),
        ),
    ] {
        let source = temp_file(&format!("kubeadm-{}", name.replace('.', "-")), CLUSTER);
        let config = temp_file(&format!("config-{}", name.replace('.', "-")), fixture);
        let out = Command::new(BIN)
            .args(["--hostname-override=node-a", "--dry-run"])
            .arg(format!("--config={}", config.display()))
            .arg(format!("--source-file={}", source.display()))
            .stdin(Stdio::null())
            .output()
            .expect("run binary");
        let _ = std::fs::remove_file(source);
        let _ = std::fs::remove_file(config);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{name}: {stderr}");
        assert!(stdout.contains("9 services"), "{name}: {stdout}");
        // The fields it does not use are named in the log, one line each.
        for field in ["configSyncPeriod", "iptables.syncPeriod", "winkernel"] {
            assert!(
                stderr
                    .lines()
                    .any(|l| l.contains("not used") && l.contains(field)),
                "{name}: {field} not reported: {stderr}"
            );
        }
    }
}

#[test]
fn dry_run_json_and_yaml_are_the_documented_schema() {
    let (status, json, stderr) = dry_run(&["--dry-run", "--output=json"]);
    assert!(status.success(), "{stderr}");
    let doc: proxier_core::view::PlanDocument =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(doc.api_version, "ipvs-proxier.dry-run/v1");
    assert_eq!(doc.kind, "Plan");
    assert_eq!(doc.node.name, "node-a");
    assert_eq!(doc.summary.services, 9);
    assert!(
        doc.writes
            .as_ref()
            .is_some_and(|w| w.total > 0 && w.deletes == 0)
    );
    let web = doc
        .virtual_servers
        .iter()
        .find(|v| v.service_port.starts_with("shop/web") && v.role == "NodePort")
        .expect("shop/web NodePort");
    assert_eq!(web.port, 30080);
    assert!(!web.real_servers.is_empty());
    assert_eq!(doc.bound_addresses.len(), doc.summary.bound_addresses);
    // Round trip: what we parsed serialises back to the same JSON value.
    let value: serde_json::Value = serde_json::from_str(&json).expect("value");
    assert_eq!(serde_json::to_value(&doc).expect("to value"), value);

    let (status, yaml, stderr) = dry_run(&["--dry-run", "-o", "yaml"]);
    assert!(status.success(), "{stderr}");
    assert!(yaml.starts_with("---\n"), "{yaml}");
    let from_yaml: proxier_core::view::PlanDocument =
        serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"));
    // The same plan either way (the write counts too: each run starts from empty memory).
    assert_eq!(from_yaml, doc);
}

#[test]
fn dry_run_watch_serves_follows_the_file_and_stops_on_sigterm() {
    let path = temp_file("daemon", CLUSTER);
    let mut daemon = Daemon::start(&[
        "--dry-run".into(),
        "--watch".into(),
        "--hostname-override=node-a".into(),
        "--healthz-bind-address=127.0.0.1:0".into(),
        "--metrics-bind-address=127.0.0.1:0".into(),
        "--ipvs-min-sync-period=0s".into(),
        "--log-format=json".into(),
        format!("--source-file={}", path.display()),
    ]);
    let metrics = listening_address(&daemon.stderr_lines, "metrics server listening");
    let health = listening_address(&daemon.stderr_lines, "health server listening");

    let first = wait_line(&daemon.stdout_lines, "first sync", |l| {
        l.starts_with("dry-run")
    });
    assert!(first.contains("9 services"), "{first}");

    let (status, body) = http_get(health, "/healthz");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("healthz JSON");
    assert_eq!(v["nodeEligible"], true);
    assert_eq!(http_get(health, "/livez").0, 200);

    // One Service less in the file: a new sync with 8 (the file has 11, headless and ExternalName ones are not proxied).
    let smaller = CLUSTER.replacen(
        "  labels:\n    app: cart\n  name: cart\n",
        "  labels:\n    app: cart\n    service.kubernetes.io/service-proxy-name: other\n  name: cart\n",
        1,
    );
    assert_ne!(smaller, CLUSTER);
    std::fs::write(&path, &smaller).expect("rewrite source");
    let second = wait_line(&daemon.stdout_lines, "sync after change", |l| {
        l.contains("8 services")
    });
    assert!(second.starts_with("dry-run"), "{second}");
    // Only what changed: the removed virtual server and its address, no whole table.
    let changes = wait_line(&daemon.stdout_lines, "change summary", |l| {
        l.starts_with("changes: ") || l.starts_with("SERVICE PORT")
    });
    assert!(
        changes.starts_with("changes: 0 virtual servers added, 1 removed, 0 changed; 0 addresses bound, 1 unbound on kube-ipvs0; a real sync would make"),
        "{changes}"
    );
    let removed = wait_line(&daemon.stdout_lines, "removed row", |l| l.starts_with("- "));
    assert!(
        removed.starts_with("- shop/cart") && removed.contains("10.96.12.51:7070"),
        "{removed}"
    );

    // The Node object is being deleted: load balancers are told to stop sending traffic
    // (`/healthz` 503, nodeEligible false) while the proxier itself stays alive.
    let leaving = smaller.replacen(
        "  name: node-a\n  resourceVersion: \"30012\"\n",
        "  name: node-a\n  resourceVersion: \"30013\"\n  deletionTimestamp: \"2030-01-01T00:00:00Z\"\n",
        1,
    );
    assert_ne!(leaving, smaller);
    std::fs::write(&path, leaving).expect("rewrite source");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (status, body) = http_get(health, "/healthz");
        if status == 503 {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {status} after the Node's deletion: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let v: serde_json::Value = serde_json::from_str(&body).expect("healthz JSON");
    assert_eq!(v["nodeEligible"], false, "{body}");
    assert_eq!(http_get(health, "/livez").0, 200);

    let (status, text) = http_get(metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds"),
        "{text}"
    );

    let pid = daemon.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = daemon.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "daemon did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean stop");
    let _ = std::fs::remove_file(path);
}

/// Inodes of the TCP and UDP sockets in LISTEN state (TCP) or bound (UDP) in this network
/// namespace.
fn listening_inodes() -> std::collections::BTreeSet<String> {
    let mut inodes = std::collections::BTreeSet::new();
    for (file, state) in [
        ("/proc/net/tcp", "0A"),
        ("/proc/net/tcp6", "0A"),
        ("/proc/net/udp", "07"),
        ("/proc/net/udp6", "07"),
    ] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == state {
                inodes.insert(cols[9].to_owned());
            }
        }
    }
    inodes
}

/// Socket inodes the process holds.
fn socket_inodes(pid: u32) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|target| {
                    let t = target.to_string_lossy().into_owned();
                    t.strip_prefix("socket:[")
                        .and_then(|r| r.strip_suffix(']'))
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn dry_run_watch_listens_on_nothing_by_default() {
    let path = temp_file("quiet", CLUSTER);
    let daemon = Daemon::start(&[
        "--dry-run".into(),
        "--watch".into(),
        "--hostname-override=node-a".into(),
        "--log-format=json".into(),
        format!("--source-file={}", path.display()),
    ]);
    wait_line(&daemon.stdout_lines, "first plan", |l| {
        l.starts_with("dry-run")
    });
    let listening = listening_inodes();
    let held = socket_inodes(daemon.child.id());
    let open: Vec<&String> = held.intersection(&listening).collect();
    assert!(open.is_empty(), "the dry run listens on sockets {open:?}");
    // And it said nothing about servers.
    let mut stderr = Vec::new();
    while let Ok(line) = daemon.stderr_lines.recv_timeout(Duration::from_millis(200)) {
        stderr.push(line);
    }
    assert!(
        !stderr.iter().any(|l| l.contains("listening")),
        "{stderr:?}"
    );
    drop(daemon);
    let _ = std::fs::remove_file(path);
}
