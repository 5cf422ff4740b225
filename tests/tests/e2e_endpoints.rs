//! Conformance suite, endpoint life cycle, with the real daemon and real traffic: a readiness
//! transition stops new connections while an established one completes; a deleted
//! (terminating) endpoint drains gracefully; endpoint churn under constant client load loses
//! no connection attempt.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e_support/mod.rs"]
mod e2e_support;

use std::time::{Duration, Instant};

use e2e_support::*;
use ipvs_proxier_tests::require_kernel;

/// How long a slow connection stays established: longer than a sync under TCG.
const HOLD_SECS: u32 = 30;

/// A Service with a fast port (80 -> 8081) and a slow one (81 -> 8080, held open).
fn two_port_service(vip: &str) -> Svc {
    Svc::cluster_ip(
        "drain",
        &[vip],
        vec![Port::tcp("fast", 80, 8081), Port::tcp("slow", 81, 8080)],
    )
}

/// Pods 0 and 1 serving both ports; the daemon running with both endpoints ready.
fn drain_setup(vip: &str) -> (Topology, Svc) {
    let mut t = Topology::new(2);
    for i in 0..2 {
        t.serve_slow_tcp(i, 8080, HOLD_SECS);
        t.serve_tcp(i, 8081);
    }
    let svc = two_port_service(vip);
    let eps = (0..2).map(|i| Ep::ready(&pod_ip(i), NODE_NAME)).collect();
    t.write_one(&svc, &[Slice::of(&svc, false, eps)]);
    t.start_daemon(&[]);
    t.wait_backends(&format!("TCP  {vip}:81"), &backends(&[0, 1], 8080));
    t.wait_backends(&format!("TCP  {vip}:80"), &backends(&[0, 1], 8081));
    (t, svc)
}

/// Opens a held connection from the client to `vip:81`; returns (output file, pod index).
fn open_held_connection(t: &mut Topology, vip: &str) -> (std::path::PathBuf, usize) {
    let out = t.source().with_extension("conn");
    let _ = std::fs::remove_file(&out);
    let client = &t.client;
    t.background.spawn(
        client,
        &format!(
            "bash -c 'socat -T{} -u TCP4:{vip}:81,connect-timeout=5 - > {}'",
            HOLD_SECS + 30,
            out.display()
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if let Some(first) = text.lines().next() {
            let pod = (0..2)
                .find(|i| first.trim() == pod_name(*i))
                .unwrap_or_else(|| panic!("unexpected answer {first:?}"));
            return (out, pod);
        }
        assert!(
            Instant::now() < deadline,
            "the held connection never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// After the endpoint change: new connections avoid `gone`, and the held connection to it
/// completes (its server's second line arrives).
fn check_drain(t: &mut Topology, vip: &str, out: &std::path::Path, gone: usize) {
    let stays = 1 - gone;
    t.wait_backends(&format!("TCP  {vip}:80"), &backends(&[stays], 8081));
    t.wait_backends(&format!("TCP  {vip}:81"), &backends(&[stays], 8080));
    let text = std::fs::read_to_string(out).unwrap_or_default();
    assert!(
        !text.contains("done-"),
        "the held connection ended before the change was applied; raise HOLD_SECS: {text:?}"
    );
    let target = format!("{vip}:80");
    let answers: Vec<Option<String>> = (0..6).map(|_| t.client_tcp(&target, None)).collect();
    assert!(
        answers.iter().all(Option::is_some),
        "new connections went unanswered: {answers:?}\n{}",
        t.diagnostics()
    );
    let answers: Vec<String> = answers.into_iter().flatten().collect();
    assert_eq!(name_set(&answers), pods(&[stays]), "{answers:?}");

    let deadline = Instant::now() + Duration::from_secs(u64::from(HOLD_SECS) + 30);
    let done = format!("done-{}", pod_name(gone));
    loop {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        if text.contains(&done) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the established connection to {} did not complete: {text:?}\nipvs:\n{}",
            pod_name(gone),
            t.ipvs().text
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn readiness_transition_stops_new_connections_and_keeps_established_one() {
    require_kernel!();
    let vip = "10.96.0.40";
    let (mut t, svc) = drain_setup(vip);
    let (out, held) = open_held_connection(&mut t, vip);
    let eps = (0..2)
        .map(|i| {
            let ep = Ep::ready(&pod_ip(i), NODE_NAME);
            if i == held { ep.not_ready() } else { ep }
        })
        .collect();
    t.write_one(&svc, &[Slice::of(&svc, false, eps)]);
    check_drain(&mut t, vip, &out, held);
}

#[test]
fn terminating_then_deleted_endpoint_drains_gracefully() {
    require_kernel!();
    let vip = "10.96.0.41";
    let (mut t, svc) = drain_setup(vip);
    let (out, held) = open_held_connection(&mut t, vip);
    let stays = 1 - held;
    // Terminating (still serving) first, as the EndpointSlice controller reports a pod being
    // deleted ...
    let eps = vec![
        Ep::ready(&pod_ip(held), NODE_NAME).terminating(),
        Ep::ready(&pod_ip(stays), NODE_NAME),
    ];
    t.write_one(&svc, &[Slice::of(&svc, false, eps)]);
    t.wait_backends(&format!("TCP  {vip}:81"), &backends(&[stays], 8080));
    // ... then gone from the slice.
    let eps = vec![Ep::ready(&pod_ip(stays), NODE_NAME)];
    t.write_one(&svc, &[Slice::of(&svc, false, eps)]);
    check_drain(&mut t, vip, &out, held);
}

#[test]
fn endpoint_churn_under_load_loses_no_connection_attempt() {
    require_kernel!();
    let mut t = Topology::new(3);
    for i in 0..3 {
        t.serve_tcp(i, 8080);
    }
    let vip = "10.96.0.42";
    let svc = Svc::cluster_ip("churn", &[vip], vec![Port::tcp("http", 80, 8080)]);
    let with = |other: usize| {
        Slice::of(
            &svc,
            false,
            vec![
                Ep::ready(&pod_ip(0), NODE_NAME),
                Ep::ready(&pod_ip(other), NODE_NAME),
            ],
        )
    };
    t.write_one(&svc, &[with(1)]);
    t.start_daemon(&[]);
    t.wait_backends(&format!("TCP  {vip}:80"), &backends(&[0, 1], 8080));

    const ATTEMPTS: usize = 30;
    let (output, flips) = std::thread::scope(|scope| {
        let client = &t.client;
        let load = scope.spawn(move || {
            client.sh_ok(&format!(
                "for i in $(seq {ATTEMPTS}); do
                   r=$(socat -T10 -u TCP4:{vip}:80,connect-timeout=5 -) || r=\"FAIL $i\"
                   echo \"${{r:-NOANSWER $i}}\"
                 done"
            ))
        });
        let mut flips = 0;
        while !load.is_finished() && flips < 200 {
            std::thread::sleep(Duration::from_millis(700));
            flips += 1;
            t.write_one(&svc, &[with(1 + flips % 2)]);
        }
        (load.join().expect("client load thread"), flips)
    });
    let lines: Vec<&str> = output.lines().map(str::trim).collect();
    let failures = lines.iter().filter(|l| !l.starts_with("pod-")).count();
    assert_eq!(
        lines.len(),
        ATTEMPTS,
        "one answer per attempt expected: {lines:?}"
    );
    assert_eq!(
        failures,
        0,
        "{failures} attempts failed across {flips} endpoint changes: {lines:?}\nipvs connections:\n{}\ndaemon log:\n{}",
        t.node.sh_ok("ipvsadm -Lnc"),
        t.daemon_log()
    );
    assert!(lines.iter().any(|l| l.starts_with("pod-0")), "{lines:?}");
    assert!(flips >= 2, "the load ended before any churn: {flips}");
    t.daemon().assert_running();
}
