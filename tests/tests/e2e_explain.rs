//! `ipvs-proxier explain`: every reason class a client would not get through, reproduced on
//! a real node (the daemon programs it; the kernel is then changed behind its back for the
//! drift cases) and reported; a healthy Service that really answers is reported healthy,
//! with its connections counted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e_support/mod.rs"]
mod e2e_support;

use std::collections::BTreeSet;

use e2e_support::*;
use ipvs_proxier_tests::require_kernel;
use serde_json::Value;

const HEALTHY_IP: &str = "10.96.0.60";
const DRIFT_IP: &str = "10.96.0.68";
const FOREIGN_IP: &str = "10.96.0.69";
const SCHED_IP: &str = "10.96.0.67";
const LB_LOCAL_IP: &str = "192.168.70.64";
const LB_RANGES_IP: &str = "192.168.70.66";
const HEALTH_CHECK_PORT: u16 = 32_064;
const NUMERIC_IP: &str = "10.96.0.70";

/// One explained case: the Service, the flags, what to do to the kernel first (shell, in
/// the node), and the reasons expected as `(kind, severity)`: exactly these kinds, no other.
struct Case {
    service: &'static str,
    extra: &'static [&'static str],
    prefix: &'static str,
    expect: &'static [(&'static str, &'static str)],
}

fn port(name: &str, port: u16) -> Port {
    Port::tcp(name, port, 8080)
}

fn ready(i: usize) -> Ep {
    Ep::ready(&pod_ip(i), NODE_NAME)
}

fn elsewhere(i: usize) -> Ep {
    Ep::ready(&pod_ip(i), OTHER_NODE)
}

/// Every Service of the table, with its slices.
fn cluster() -> (Vec<Svc>, Vec<Slice>) {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    let mut add = |svc: Svc, endpoints: Option<Vec<Ep>>| {
        if let Some(endpoints) = endpoints {
            slices.push(Slice::of(&svc, false, endpoints));
        }
        services.push(svc);
    };
    let mut healthy = Svc::cluster_ip(
        "healthy",
        &[HEALTHY_IP],
        vec![port("http", 80).node_port(30_060)],
    );
    healthy.kind = "NodePort";
    add(healthy, Some(vec![ready(0), ready(1)]));
    add(
        Svc::cluster_ip("empty", &["10.96.0.61"], vec![port("http", 80)]),
        None,
    );
    add(
        Svc::cluster_ip("unready", &["10.96.0.62"], vec![port("http", 80)]),
        Some(vec![ready(0).not_ready()]),
    );
    add(
        Svc::cluster_ip("terminating", &["10.96.0.63"], vec![port("http", 80)]),
        Some(vec![ready(0).terminating()]),
    );
    let mut lb_local = Svc::cluster_ip(
        "lb-local",
        &["10.96.0.64"],
        vec![port("http", 80).node_port(30_064)],
    );
    lb_local.kind = "LoadBalancer";
    lb_local.lb_ips = vec![LB_LOCAL_IP.into()];
    lb_local.external_traffic_local = true;
    lb_local.health_check_node_port = Some(HEALTH_CHECK_PORT);
    add(lb_local, Some(vec![elsewhere(0)]));
    let mut itp = Svc::cluster_ip("itp-local", &["10.96.0.65"], vec![port("http", 80)]);
    itp.internal_traffic_local = true;
    add(itp, Some(vec![elsewhere(0)]));
    let mut ranges = Svc::cluster_ip(
        "ranges",
        &["10.96.0.66"],
        vec![port("http", 80).node_port(30_066)],
    );
    ranges.kind = "LoadBalancer";
    ranges.lb_ips = vec![LB_RANGES_IP.into()];
    ranges.lb_source_ranges = vec![format!("{OTHER_CLIENT_IP}/32")];
    add(ranges, Some(vec![ready(0)]));
    let mut sched = Svc::cluster_ip("sched", &[SCHED_IP], vec![port("http", 80)]);
    sched.annotations = vec![("ipvs.proxier.io/scheduler".into(), "ovf".into())];
    add(sched, Some(vec![ready(0)]));
    add(
        Svc::cluster_ip("drift", &[DRIFT_IP], vec![port("http", 80)]),
        Some(vec![ready(0), ready(1)]),
    );
    add(
        Svc::cluster_ip("foreign", &[FOREIGN_IP], vec![port("http", 80)]),
        Some(vec![ready(0)]),
    );
    (services, slices)
}

/// Loads a kernel module again when dropped.
struct ReloadModule(&'static str);

impl Drop for ReloadModule {
    fn drop(&mut self) {
        let loaded = std::process::Command::new("modprobe")
            .arg(self.0)
            .status()
            .is_ok_and(|status| status.success());
        if !loaded {
            eprintln!(
                "cannot load {} again: later tests that need it will fail",
                self.0
            );
        }
    }
}

/// The reasons of a document as `(kind, severity)`.
fn reasons(doc: &Value) -> BTreeSet<(String, String)> {
    doc["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().expect("kind").to_owned(),
                r["severity"].as_str().expect("severity").to_owned(),
            )
        })
        .collect()
}

fn check(t: &Topology, case: &Case) -> Value {
    let doc = t.explain_json(
        case.prefix,
        &format!("default/{}", case.service),
        case.extra,
    );
    let expected: BTreeSet<(String, String)> = case
        .expect
        .iter()
        .map(|(k, s)| ((*k).to_owned(), (*s).to_owned()))
        .collect();
    assert_eq!(
        reasons(&doc),
        expected,
        "{}: {}",
        case.service,
        serde_json::to_string_pretty(&doc).unwrap()
    );
    assert_eq!(doc["apiVersion"], "ipvs-proxier.explain/v1");
    assert_eq!(doc["healthy"], expected.iter().all(|(_, s)| s == "info"));
    doc
}

/// The ClusterIP virtual server of a document's first port.
fn cluster_ip_vs(doc: &Value) -> &Value {
    doc["ports"][0]["virtualServers"]
        .as_array()
        .expect("virtual servers")
        .iter()
        .find(|vs| vs["role"] == "ClusterIP")
        .expect("a ClusterIP virtual server")
}

#[test]
fn every_reason_class_is_reproduced_and_reported() {
    require_kernel!();
    let mut t = Topology::new(2);
    let from = t.add_pod();
    for i in 0..2 {
        t.serve_tcp(i, 8080);
    }
    let (services, slices) = cluster();
    t.write_source(&services, &slices);
    t.start_daemon(&[]);
    t.wait_backends(&format!("TCP  {HEALTHY_IP}:80"), &backends(&[0, 1], 8080));
    for vip in [DRIFT_IP, FOREIGN_IP, SCHED_IP] {
        t.wait_ipvs(vip, |table| {
            table.service(&format!("TCP  {vip}:80")).is_some()
        });
    }

    // A healthy Service that really answers: healthy, its connections counted.
    for _ in 0..3 {
        tcp_request(&t.pods[from], &format!("{HEALTHY_IP}:80"), None).expect("an answer");
    }
    let doc = check(
        &t,
        &Case {
            service: "healthy",
            extra: &[],
            prefix: "",
            expect: &[],
        },
    );
    let vs = cluster_ip_vs(&doc);
    assert_eq!(vs["addressState"], "bound", "{vs}");
    assert_eq!(vs["kernel"]["scheduler"], "rr", "{vs}");
    let connections: u64 = vs["realServers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rs| {
            rs["activeConnections"].as_u64().unwrap() + rs["inactiveConnections"].as_u64().unwrap()
        })
        .sum();
    assert!(
        connections >= 1,
        "the three connections are in the kernel's counts: {vs}"
    );
    let netfilter = doc["netfilter"].as_array().unwrap();
    assert!(
        netfilter.iter().any(|m| m["set"] == "cluster-ips"
            && m["element"] == format!("{HEALTHY_IP} . tcp . 80")
            && m["present"] == true),
        "the ClusterIP is read back from the kernel's set: {netfilter:?}"
    );
    assert!(
        netfilter.iter().all(|m| m["present"] == true),
        "{netfilter:?}"
    );
    let text = t.explain("", "default/healthy", &[]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("Service default/healthy on node node-a: healthy"),
        "{text}"
    );

    // What the source says, with the daemon answering its health checks.
    let with_daemon = [
        Case {
            service: "empty",
            extra: &[],
            prefix: "",
            expect: &[("noEndpoints", "blocking")],
        },
        Case {
            service: "unready",
            extra: &[],
            prefix: "",
            expect: &[("noReadyEndpoints", "blocking")],
        },
        Case {
            service: "terminating",
            extra: &[],
            prefix: "",
            expect: &[("onlyTerminatingEndpoints", "warning")],
        },
        Case {
            service: "lb-local",
            extra: &[],
            prefix: "",
            expect: &[("externalPolicyLocalNoLocalEndpoints", "blocking")],
        },
        Case {
            service: "itp-local",
            extra: &[],
            prefix: "",
            expect: &[("internalPolicyLocalNoLocalEndpoints", "blocking")],
        },
        Case {
            service: "ranges",
            extra: &["--client", CLIENT_IP],
            prefix: "",
            expect: &[("sourceRangesExcludeClient", "blocking")],
        },
        Case {
            service: "ranges",
            extra: &["--client", OTHER_CLIENT_IP],
            prefix: "",
            expect: &[("sourceRangesRestrict", "info")],
        },
        Case {
            service: "ghost",
            extra: &[],
            prefix: "",
            expect: &[("serviceNotFound", "blocking")],
        },
    ];
    for case in &with_daemon {
        let doc = check(&t, case);
        if case.service == "lb-local" {
            // The daemon's health check really answers 503: no local endpoint.
            let check = &doc["healthCheck"];
            assert_eq!(check["nodePort"], HEALTH_CHECK_PORT, "{check}");
            assert_eq!(check["answeredStatus"], 503, "{check}");
        }
    }

    // The kernel changed behind the daemon's back: stop it first, so that no resync repairs
    // the drift while it is being explained (the data plane stays programmed).
    t.daemon().stop();
    // The VM loads every module up front and cannot autoload one: whatever happens here,
    // the scheduler's module is back for the tests that run after this one.
    let _reload = ReloadModule("ip_vs_ovf");
    let pod0 = hostport(&pod_ip(0), 8080);
    t.node.sh_ok(&format!(
        "set -e
         ipvsadm -d -t {DRIFT_IP}:80 -r {pod0}
         ipvsadm -A -t {FOREIGN_IP}:9999 -s rr
         ipvsadm -D -t {SCHED_IP}:80
         for i in 1 2 3 4 5 6 7 8 9 10; do
           rmmod ip_vs_ovf 2>/dev/null && break
           sleep 0.5
         done
         ! grep -q '^ip_vs_ovf ' /proc/modules"
    ));
    // The scheduler's module hidden from the files (in explain's own mount namespace).
    let hide_ovf = "set -e
        dir=/lib/modules/$(uname -r)
        grep -v '/ip_vs_ovf\\.ko' \"$dir/modules.dep\" > /tmp/explain-modules.dep
        mount --bind /tmp/explain-modules.dep \"$dir/modules.dep\"
        ! grep -q '^ip_vs_ovf ' /proc/modules";
    let without_daemon = [
        Case {
            service: "drift",
            extra: &[],
            prefix: "",
            expect: &[("drift", "warning")],
        },
        Case {
            service: "foreign",
            extra: &[],
            prefix: "",
            expect: &[("foreignVirtualServer", "warning")],
        },
        Case {
            service: "sched",
            extra: &[],
            prefix: hide_ovf,
            expect: &[
                ("schedulerModuleMissing", "blocking"),
                ("drift", "blocking"),
            ],
        },
    ];
    for case in &without_daemon {
        let doc = check(&t, case);
        let text = serde_json::to_string(&doc["reasons"]).unwrap();
        match case.service {
            "drift" => assert!(
                text.contains(&pod0),
                "names the missing real server: {text}"
            ),
            "foreign" => assert!(text.contains(":9999"), "names the foreign one: {text}"),
            _ => assert!(text.contains("ip_vs_ovf"), "names the module: {text}"),
        }
    }
}

/// Hides `/etc/protocols` (in the shell's own mount namespace), as on a node without
/// `netbase`: nft then prints the protocol of a set element as its number.
const HIDE_PROTOCOLS: &str = "set -e
    mount --bind /dev/null /etc/protocols";

#[test]
fn a_healthy_service_is_explained_healthy_where_nft_prints_protocols_as_numbers() {
    require_kernel!();
    let mut t = Topology::new(1);
    let _ = t.node.sh("modprobe sctp");
    t.serve_tcp(0, 8080);
    let svc = Svc::cluster_ip(
        "numeric",
        &[NUMERIC_IP],
        vec![
            port("http", 80),
            Port::of(Proto::Udp, "dns", 53, 5353),
            Port::of(Proto::Sctp, "sig", 3868, 3868),
        ],
    );
    let slice = Slice::of(&svc, false, vec![ready(0)]);
    t.write_source(&[svc], &[slice]);
    t.start_daemon(&[]);
    t.wait_backends(&format!("TCP  {NUMERIC_IP}:80"), &backends(&[0], 8080));
    t.wait_backends(&format!("UDP  {NUMERIC_IP}:53"), &backends(&[0], 5353));
    t.wait_backends(&format!("SCTP  {NUMERIC_IP}:3868"), &backends(&[0], 3868));
    let pod0 = pod_ip(0);
    let numeric = [
        ("cluster-ips", format!("{NUMERIC_IP} . 6 . 80")),
        ("cluster-ips", format!("{NUMERIC_IP} . 17 . 53")),
        ("cluster-ips", format!("{NUMERIC_IP} . 132 . 3868")),
        ("hairpin", format!("{pod0} . 6 . 8080 . {pod0}")),
    ];
    ipvs_proxier_tests::wait_until(
        CONVERGE,
        "nft prints the Service's elements with numbers where /etc/protocols is hidden",
        || {
            numeric.iter().all(|(set, element)| {
                let out = t.node.sh(&format!(
                    "{HIDE_PROTOCOLS}\nnft list set ip ipvs-proxier {set}"
                ));
                String::from_utf8_lossy(&out.stdout)
                    .split([',', '{', '}'])
                    .any(|e| e.split_whitespace().collect::<Vec<_>>().join(" ") == *element)
            })
        },
        || {
            t.node
                .sh_ok(&format!("{HIDE_PROTOCOLS}\nnft list table ip ipvs-proxier"))
        },
    );

    let doc = check(
        &t,
        &Case {
            service: "numeric",
            extra: &[],
            prefix: HIDE_PROTOCOLS,
            expect: &[],
        },
    );
    let netfilter = doc["netfilter"].as_array().unwrap();
    for element in [
        format!("{NUMERIC_IP} . tcp . 80"),
        format!("{NUMERIC_IP} . udp . 53"),
        format!("{NUMERIC_IP} . sctp . 3868"),
        format!("{pod0} . tcp . 8080 . {pod0}"),
    ] {
        assert!(
            netfilter
                .iter()
                .any(|m| m["element"] == element.as_str() && m["present"] == true),
            "{element} is read back from the kernel's sets: {netfilter:?}"
        );
    }
    assert!(
        netfilter.iter().all(|m| m["present"] == true),
        "{netfilter:?}"
    );
    let text = t.explain(HIDE_PROTOCOLS, "default/numeric", &[]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("Service default/numeric on node node-a: healthy"),
        "{text}"
    );
}
