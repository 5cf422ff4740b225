//! kill -9 with part of the IPVS table programmed (the daemon's test hook stops it inside
//! its first batch), then a restart: the table converges with nothing stale and nothing
//! missing, and a TCP connection through a Service that was already programmed survives.

#![allow(clippy::unwrap_used)]

mod e2e_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use e2e_support::manifests::{Ep, Port, Slice, Svc};
use e2e_support::{NODE_NAME, Topology, pod_ip, pod_name};
use ipvs_proxier_tests::require_kernel;

const SERVICES: usize = 150;
/// Every virtual server is added first (150 writes), then real servers: stopping after 200
/// writes leaves 50 Services with their endpoint and 100 without.
const PAUSE_AFTER: usize = 200;
const HOLD_SECS: u32 = 40;

fn vip(i: usize) -> String {
    format!("10.96.1.{}", i + 1)
}

/// `ipvsadm -Sn` lines of the whole plan.
fn expected_rules() -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    for i in 0..SERVICES {
        lines.insert(format!("-A -t {}:80 -s rr", vip(i)));
        lines.insert(format!("-a -t {}:80 -r {}:8080 -m -w 1", vip(i), pod_ip(0)));
    }
    lines
}

fn rules(t: &Topology) -> BTreeSet<String> {
    t.node
        .sh_ok("ipvsadm -Sn")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn kill_9_inside_a_batch_then_restart_converges_and_keeps_connections() {
    require_kernel!();
    let mut t = Topology::new(1);
    t.serve_slow_tcp(0, 8080, HOLD_SECS);
    let services: Vec<Svc> = (0..SERVICES)
        .map(|i| Svc::cluster_ip(&format!("s{i}"), &[&vip(i)], vec![Port::tcp("p", 80, 8080)]))
        .collect();
    let slices: Vec<Slice> = services
        .iter()
        .map(|svc| Slice::of(svc, false, vec![Ep::ready(&pod_ip(0), NODE_NAME)]))
        .collect();
    t.write_source(&services, &slices);
    let pause = PAUSE_AFTER.to_string();
    t.start_daemon_with_env(&[], &[("IPVS_PROXIER_TEST_PAUSE_AFTER_OPS", &pause)]);

    // Stopped inside its first batch, part of the table written.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !t.daemon_log().contains("test hook: paused") {
        assert!(
            Instant::now() < deadline,
            "never paused:\n{}",
            t.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let partial = rules(&t);
    let with_endpoint = partial.iter().filter(|l| l.starts_with("-a ")).count();
    assert_eq!(
        partial.len(),
        PAUSE_AFTER,
        "exactly the writes before the pause:\n{partial:?}"
    );
    assert!(
        with_endpoint > 0 && with_endpoint < SERVICES,
        "{with_endpoint}"
    );
    assert!(
        partial.contains(&format!(
            "-a -t {}:80 -r {}:8080 -m -w 1",
            vip(0),
            pod_ip(0)
        )),
        "the first Service is programmed whole"
    );

    // A held connection through the first Service, which has its endpoint.
    let out = t.source().with_extension("conn");
    let _ = std::fs::remove_file(&out);
    let client = &t.client;
    t.background.spawn(
        client,
        &format!(
            "bash -c 'socat -T{} -u TCP4:{}:80,connect-timeout=5 - > {}'",
            HOLD_SECS + 30,
            vip(0),
            out.display()
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&out).unwrap_or_default().trim() != pod_name(0) {
        assert!(
            Instant::now() < deadline,
            "the held connection never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // kill -9, restart without the hook: converged, nothing stale, nothing missing.
    t.daemon().stop();
    t.start_daemon(&[]);
    let want = expected_rules();
    let deadline = Instant::now() + Duration::from_secs(90);
    while rules(&t) != want {
        assert!(
            Instant::now() < deadline,
            "never converged:\n{:?}\nlog:\n{}",
            rules(&t).symmetric_difference(&want).collect::<Vec<_>>(),
            t.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let vips = t.node.sh_ok("ip -o -4 addr show dev kube-ipvs0 | wc -l");
    assert_eq!(vips.trim(), SERVICES.to_string());

    // The connection made before the crash completes.
    let deadline = Instant::now() + Duration::from_secs(u64::from(HOLD_SECS) + 20);
    loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if text.contains(&format!("done-{}", pod_name(0))) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the connection did not survive the restart: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
