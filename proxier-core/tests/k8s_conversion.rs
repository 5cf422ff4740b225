//! Conversions from k8s-openapi objects: what is proxied, what is skipped as kube-proxy skips
//! it, and malformed objects rejected on their own with an error naming them.
#![cfg(feature = "k8s")]
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service as K8sService};
use k8s_openapi::api::discovery::v1::EndpointSlice as K8sSlice;
use proxier_core::desired::{Protocol, Scheduler};
use proxier_core::k8s::{
    ServiceConversion, SkipReason, convert_endpoint_slice, convert_service, node_context,
    service_change, slice_change,
};
use proxier_core::model::{
    ConversionError, IpMode, ModelWarning, ServiceName, SessionAffinity, TrafficPolicy,
};
use proxier_core::{Change, ClusterState, plan};
use serde_json::{Value, json};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn service(name: &str, spec: Value) -> K8sService {
    service_with(name, json!({}), spec, json!({}))
}

fn service_with(name: &str, metadata: Value, spec: Value, status: Value) -> K8sService {
    let mut meta = json!({"namespace": "default", "name": name});
    if let (Some(m), Some(extra)) = (meta.as_object_mut(), metadata.as_object()) {
        m.extend(extra.clone());
    }
    serde_json::from_value(json!({"metadata": meta, "spec": spec, "status": status})).unwrap()
}

fn proxied(s: &K8sService) -> proxier_core::model::Service {
    match convert_service(s) {
        Ok(ServiceConversion::Proxied(svc)) => svc,
        other => panic!("expected a proxied Service, got {other:?}"),
    }
}

fn rejected(s: &K8sService) -> ConversionError {
    match convert_service(s) {
        Err(e) => e,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn basic_spec() -> Value {
    json!({"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]})
}

#[test]
fn a_plain_service_converts_with_kube_proxy_defaults() {
    let s = proxied(&service("web", basic_spec()));
    assert_eq!(s.name, ServiceName::new("default", "web"));
    assert_eq!(s.cluster_ips, vec![ip("10.96.0.10")]);
    assert_eq!(s.ports.len(), 1);
    assert_eq!(
        s.ports[0].protocol,
        Protocol::Tcp,
        "protocol defaults to TCP"
    );
    assert_eq!(s.ports[0].node_port, None);
    assert_eq!(s.session_affinity, SessionAffinity::None);
    assert_eq!(s.external_traffic_policy, TrafficPolicy::Cluster);
    assert_eq!(s.scheduler, None);
    assert!(s.warnings.is_empty());
}

#[test]
fn every_field_of_a_load_balancer_service_converts() {
    let s = proxied(&service_with(
        "lb",
        json!({"annotations": {"ipvs.proxier.io/scheduler": "mh"}}),
        json!({
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.11",
            "clusterIPs": ["10.96.0.11", "fd00::11"],
            "ports": [
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "nodePort": 30053},
                {"name": "dns-udp", "port": 53, "protocol": "UDP", "nodePort": 30053},
                {"name": "sctp", "port": 9999, "protocol": "SCTP"}
            ],
            "externalIPs": ["50.60.70.81"],
            "loadBalancerSourceRanges": [" 1.2.3.0/24 ", "0.0.0.0/0"],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 300}},
            "externalTrafficPolicy": "Local",
            "internalTrafficPolicy": "Local",
            "healthCheckNodePort": 32000
        }),
        json!({"loadBalancer": {"ingress": [
            {"ip": "1.2.3.4"},
            {"ip": "1.2.3.5", "ipMode": "Proxy"},
            {"hostname": "lb.example.invalid"}
        ]}}),
    ));
    assert_eq!(s.cluster_ips, vec![ip("10.96.0.11"), ip("fd00::11")]);
    assert_eq!(s.ports.len(), 3);
    assert_eq!(s.ports[1].protocol, Protocol::Udp);
    assert_eq!(s.ports[1].node_port, Some(30053));
    assert_eq!(s.ports[2].protocol, Protocol::Sctp);
    assert_eq!(s.external_ips, vec![ip("50.60.70.81")]);
    assert_eq!(
        s.load_balancer_ingress.len(),
        2,
        "hostname-only ingress carries no IP"
    );
    assert_eq!(s.load_balancer_ingress[0].ip_mode, IpMode::Vip);
    assert_eq!(s.load_balancer_ingress[1].ip_mode, IpMode::Proxy);
    assert_eq!(
        s.load_balancer_vips().collect::<Vec<_>>(),
        vec![ip("1.2.3.4")]
    );
    assert_eq!(s.load_balancer_source_ranges.len(), 2);
    assert_eq!(
        s.session_affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: 300
        }
    );
    assert_eq!(s.external_traffic_policy, TrafficPolicy::Local);
    assert_eq!(s.internal_traffic_policy, TrafficPolicy::Local);
    assert_eq!(s.health_check_node_port, Some(32000));
    assert_eq!(s.scheduler, Some(Scheduler::MaglevHashing));
}

#[test]
fn client_ip_affinity_without_timeout_defaults_to_three_hours() {
    let mut spec = basic_spec();
    spec["sessionAffinity"] = json!("ClientIP");
    let s = proxied(&service("aff", spec));
    assert_eq!(
        s.session_affinity,
        SessionAffinity::ClientIp {
            timeout_seconds: 10800
        }
    );
}

#[test]
fn external_traffic_policy_counts_for_externally_accessible_services() {
    // As kube-proxy's ExternallyAccessible: NodePort, LoadBalancer, or ClusterIP with
    // externalIPs.
    let mut spec = basic_spec();
    spec["externalTrafficPolicy"] = json!("Local");
    assert_eq!(
        proxied(&service("internal", spec.clone())).external_traffic_policy,
        TrafficPolicy::Cluster,
        "a ClusterIP Service without externalIPs is not reachable from outside"
    );
    spec["externalIPs"] = json!(["50.60.70.81"]);
    assert_eq!(
        proxied(&service("c", spec.clone())).external_traffic_policy,
        TrafficPolicy::Local,
        "a ClusterIP Service with externalIPs is"
    );
    spec["type"] = json!("NodePort");
    let s = proxied(&service("n", spec));
    assert_eq!(s.external_traffic_policy, TrafficPolicy::Local);
    assert_eq!(
        s.health_check_node_port, None,
        "only LoadBalancers have a health-check port"
    );
}

#[test]
fn invalid_scheduler_annotation_falls_back_with_a_warning() {
    for bad in ["bogus", "", "a-very-long-scheduler-name"] {
        let s = proxied(&service_with(
            "sch",
            json!({"annotations": {"ipvs.proxier.io/scheduler": bad}}),
            basic_spec(),
            json!({}),
        ));
        assert_eq!(s.scheduler, None, "{bad:?}");
        assert!(
            matches!(&s.warnings[..], [ModelWarning::InvalidScheduler { value, .. }] if value == bad),
            "{bad:?}: {:?}",
            s.warnings
        );
        assert!(s.warnings[0].to_string().contains("default/sch"));
    }
}

#[test]
fn services_kube_proxy_ignores_are_skipped_and_become_deletions() {
    let cases = [
        (
            "external-name",
            service(
                "ext",
                json!({"type": "ExternalName", "externalName": "db.example.invalid"}),
            ),
            SkipReason::ExternalName,
        ),
        (
            "headless",
            service("hl", json!({"clusterIP": "None", "ports": [{"port": 80}]})),
            SkipReason::Headless,
        ),
        (
            "no cluster IP",
            service("noip", json!({"ports": [{"port": 80}]})),
            SkipReason::Headless,
        ),
        (
            "service-proxy-name",
            service_with(
                "other",
                json!({"labels": {"service.kubernetes.io/service-proxy-name": "cilium"}}),
                basic_spec(),
                json!({}),
            ),
            SkipReason::OtherProxy,
        ),
        (
            "headless label",
            service_with(
                "hl2",
                json!({"labels": {"service.kubernetes.io/headless": ""}}),
                basic_spec(),
                json!({}),
            ),
            SkipReason::Headless,
        ),
    ];
    for (what, svc, reason) in cases {
        match convert_service(&svc) {
            Ok(ServiceConversion::Skipped(_, r)) => assert_eq!(r, reason, "{what}"),
            other => panic!("{what}: expected skip, got {other:?}"),
        }
        assert!(
            matches!(service_change(&svc), Ok(Change::DeleteService(_))),
            "{what}: a skipped Service must drop what it had"
        );
    }
}

#[test]
fn malformed_services_are_rejected_with_an_error_naming_them() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "bad-cluster-ip",
            json!({"clusterIP": "10.96.0.300", "ports": [{"port": 80}]}),
            "10.96.0.300",
        ),
        (
            "port-zero",
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 0}]}),
            "port 0",
        ),
        (
            "port-big",
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 70000}]}),
            "70000",
        ),
        (
            "node-port-bad",
            json!({"clusterIP": "10.96.0.1", "type": "NodePort", "ports": [{"port": 80, "nodePort": -1}]}),
            "nodePort",
        ),
        (
            "proto",
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80, "protocol": "ICMP"}]}),
            "ICMP",
        ),
        (
            "dup-name",
            json!({"clusterIP": "10.96.0.1", "ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}),
            "duplicate port name \"a\"",
        ),
        (
            "dup-number",
            json!({"clusterIP": "10.96.0.1", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80, "protocol": "TCP"}]}),
            "duplicate port 80/TCP",
        ),
        (
            "bad-external-ip",
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}], "externalIPs": ["nope"]}),
            "externalIPs",
        ),
        (
            "bad-range",
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}], "loadBalancerSourceRanges": ["1.2.3.4/33"]}),
            "loadBalancerSourceRanges",
        ),
        (
            "bad-affinity",
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}], "sessionAffinity": "Cookie"}),
            "Cookie",
        ),
        (
            "bad-timeout",
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}),
            "timeoutSeconds",
        ),
        (
            "bad-policy",
            json!({"clusterIP": "10.96.0.1", "type": "NodePort", "ports": [{"port": 80}], "externalTrafficPolicy": "Nearby"}),
            "Nearby",
        ),
        (
            "two-v4",
            json!({"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "10.96.0.2"], "ports": [{"port": 80}]}),
            "one address per family",
        ),
    ];
    for (name, spec, needle) in cases {
        let err = rejected(&service(name, spec));
        let text = err.to_string();
        assert!(text.contains(&format!("Service default/{name}")), "{text}");
        assert!(
            text.contains(needle),
            "{name}: {text:?} should mention {needle:?}"
        );
        assert_eq!(err.object().name, name);
    }
    let err = rejected(&service_with(
        "bad-lb",
        json!({}),
        basic_spec(),
        json!({"loadBalancer": {"ingress": [{"ip": "1.2.3"}]}}),
    ));
    assert!(err.to_string().contains("default/bad-lb"), "{err}");
}

#[test]
fn same_port_number_with_different_protocols_is_fine() {
    let s = proxied(&service(
        "dns",
        json!({"clusterIP": "10.96.0.10", "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"}
        ]}),
    ));
    assert_eq!(s.ports.len(), 2);
}

#[test]
fn unknown_ip_mode_is_treated_as_proxy_with_a_warning() {
    let s = proxied(&service_with(
        "lbm",
        json!({}),
        basic_spec(),
        json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4", "ipMode": "Tunnel"}]}}),
    ));
    assert_eq!(s.load_balancer_ingress[0].ip_mode, IpMode::Proxy);
    assert!(matches!(
        s.warnings[..],
        [ModelWarning::UnknownIpMode { .. }]
    ));
}

fn slice_json(name: &str, extra_meta: Value, body: Value) -> K8sSlice {
    let mut meta = json!({
        "namespace": "default",
        "name": name,
        "labels": {"kubernetes.io/service-name": "web"}
    });
    if let (Some(m), Some(extra)) = (meta.as_object_mut(), extra_meta.as_object()) {
        m.extend(extra.clone());
    }
    let mut obj = json!({"metadata": meta, "addressType": "IPv4"});
    if let (Some(o), Some(b)) = (obj.as_object_mut(), body.as_object()) {
        o.extend(b.clone());
    }
    serde_json::from_value(obj).unwrap()
}

#[test]
fn endpoint_slice_converts_conditions_hints_and_weights() {
    let s = convert_endpoint_slice(&slice_json(
        "web-abc",
        json!({"annotations": {"ipvs.proxier.io/weights": "10.1.0.1=5, 10.1.0.2=0, bogus, 10.1.0.3=x"}}),
        json!({
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "nameless-port"}],
            "endpoints": [
                {"addresses": ["10.1.0.1"], "nodeName": "n1", "zone": "z1",
                 "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "n1"}]}},
                {"addresses": ["10.1.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.1.0.3", "10.1.0.33"], "conditions": {"ready": false}},
                {"addresses": []}
            ]
        }),
    ))
    .unwrap()
    .unwrap();
    assert_eq!(s.service, ServiceName::new("default", "web"));
    assert_eq!(
        s.ports.len(),
        1,
        "a port without a number is ignored, as kube-proxy does"
    );
    assert_eq!(s.port_for("http", Protocol::Tcp), Some(8080));
    assert_eq!(
        s.endpoints.len(),
        3,
        "an endpoint without addresses is ignored"
    );
    let (a, b, c) = (&s.endpoints[0], &s.endpoints[1], &s.endpoints[2]);
    assert!(
        a.ready && a.serving && !a.terminating,
        "absent conditions mean ready and serving"
    );
    assert_eq!(a.node_name.as_deref(), Some("n1"));
    assert_eq!(a.zone.as_deref(), Some("z1"));
    assert_eq!(a.zone_hints.len(), 1);
    assert_eq!(a.node_hints.len(), 1);
    assert_eq!(a.weight, Some(5));
    assert!(!b.ready && b.serving && b.terminating);
    assert_eq!(b.weight, None, "weight 0 is refused");
    assert_eq!(c.address, ip("10.1.0.3"), "the first address is used");
    assert!(!c.ready && c.serving, "serving defaults to true when unset");
    let weight_warnings = s
        .warnings
        .iter()
        .filter(|w| matches!(w, ModelWarning::InvalidWeight { .. }))
        .count();
    assert_eq!(weight_warnings, 3, "{:?}", s.warnings);
    assert!(
        s.warnings
            .iter()
            .any(|w| matches!(w, ModelWarning::IgnoredEndpointPort { .. }))
    );
}

#[test]
fn fqdn_slices_are_ignored_and_malformed_slices_rejected() {
    let fqdn = slice_json(
        "web-fqdn",
        json!({}),
        json!({"addressType": "FQDN", "endpoints": []}),
    );
    assert_eq!(convert_endpoint_slice(&fqdn).unwrap(), None);
    assert_eq!(slice_change(&fqdn).unwrap(), None);

    let cases: Vec<(&str, K8sSlice, &str)> = vec![
        (
            "web-badip",
            slice_json(
                "web-badip",
                json!({}),
                json!({"endpoints": [{"addresses": ["10.1.0.999"]}]}),
            ),
            "10.1.0.999",
        ),
        (
            "web-proto",
            slice_json(
                "web-proto",
                json!({}),
                json!({"ports": [{"name": "x", "port": 80, "protocol": "GRE"}]}),
            ),
            "GRE",
        ),
        (
            "web-port",
            slice_json(
                "web-port",
                json!({}),
                json!({"ports": [{"name": "x", "port": 65536}]}),
            ),
            "65536",
        ),
        (
            "web-dup",
            slice_json(
                "web-dup",
                json!({}),
                json!({"ports": [{"name": "x", "port": 80}, {"name": "x", "port": 81}]}),
            ),
            "duplicate port",
        ),
        (
            "web-nolabel",
            slice_json("web-nolabel", json!({"labels": {}}), json!({})),
            "kubernetes.io/service-name",
        ),
    ];
    for (name, s, needle) in cases {
        let err = convert_endpoint_slice(&s).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("EndpointSlice default/{name}")),
            "{text}"
        );
        assert!(text.contains(needle), "{text:?} should mention {needle:?}");
    }
}

#[test]
fn a_rejected_object_leaves_the_others_planned() {
    let objects = vec![
        service(
            "good-1",
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}),
        ),
        service(
            "bad",
            json!({"clusterIP": "10.96.0.2", "ports": [{"port": 80, "protocol": "ICMP"}]}),
        ),
        service(
            "good-2",
            json!({"clusterIP": "10.96.0.3", "ports": [{"port": 443}]}),
        ),
    ];
    let mut state = ClusterState::new();
    let mut errors = Vec::new();
    for object in &objects {
        match service_change(object) {
            Ok(change) => {
                state.apply(change);
            }
            Err(e) => errors.push(e),
        }
    }
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].object().name, "bad");
    let desired = plan(&state, &Default::default(), &Default::default());
    let addresses: Vec<IpAddr> = desired
        .virtual_servers()
        .map(|(_, k, _)| k.address)
        .collect();
    assert_eq!(addresses, vec![ip("10.96.0.1"), ip("10.96.0.3")]);
}

#[test]
fn node_context_reads_name_zone_and_primary_ips() {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z1"}},
        "status": {"addresses": [
            {"type": "Hostname", "address": "n1"},
            {"type": "ExternalIP", "address": "203.0.113.5"},
            {"type": "InternalIP", "address": "192.168.0.5"},
            {"type": "InternalIP", "address": "192.168.0.6"},
            {"type": "InternalIP", "address": "fd00::5"}
        ]}
    }))
    .unwrap();
    let ctx = node_context(&node).unwrap();
    assert_eq!(ctx.name, "n1");
    assert_eq!(ctx.zone.as_deref(), Some("z1"));
    assert_eq!(ctx.primary_ips, vec![ip("192.168.0.5"), ip("fd00::5")]);
}

#[test]
fn weights_annotation_accepts_ipv6_addresses() {
    let object = proxier_core::model::ObjectRef::new(
        proxier_core::model::ObjectKind::EndpointSlice,
        "default",
        "w6",
    );
    let (weights, warnings) =
        proxier_core::k8s::parse_weights(&object, "fd00::5=2, 10.0.0.1=65535,10.0.0.2=65536");
    assert_eq!(weights.get(&ip("fd00::5")), Some(&2));
    assert_eq!(weights.get(&ip("10.0.0.1")), Some(&65535));
    assert_eq!(weights.get(&ip("10.0.0.2")), None);
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].to_string().contains("EndpointSlice default/w6"));
}

#[test]
fn is_proxied_leaves_out_other_proxies_and_headless_objects_like_kube_proxy_s_selector() {
    use proxier_core::k8s::is_proxied;
    let labelled =
        |labels: Value| service_with("x", json!({"labels": labels}), json!({}), json!({}));
    assert!(is_proxied(&service("x", json!({})).metadata), "no labels");
    assert!(is_proxied(&labelled(json!({"app": "web"})).metadata));
    assert!(!is_proxied(
        &labelled(json!({"service.kubernetes.io/service-proxy-name": "other"})).metadata
    ));
    assert!(!is_proxied(
        &labelled(json!({"service.kubernetes.io/headless": ""})).metadata
    ));
}

#[test]
fn trigger_time_reads_the_endpoint_slice_controller_s_annotation() {
    use proxier_core::k8s::{LAST_CHANGE_TRIGGER_TIME_ANNOTATION, trigger_time};
    use std::time::{Duration, SystemTime};
    let slice = |annotation: Option<&str>| -> K8sSlice {
        let annotations = match annotation {
            Some(at) => json!({ LAST_CHANGE_TRIGGER_TIME_ANNOTATION: at }),
            None => json!({}),
        };
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "web-1", "annotations": annotations},
            "addressType": "IPv4", "endpoints": [],
        }))
        .unwrap()
    };
    assert_eq!(
        trigger_time(&slice(Some("2030-01-01T00:00:00Z"))),
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_456_000))
    );
    assert_eq!(
        trigger_time(&slice(Some("2030-01-01T00:00:00.25+01:00"))),
        Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_893_452_400_250))
    );
    assert_eq!(trigger_time(&slice(Some("yesterday"))), None);
    assert_eq!(trigger_time(&slice(None)), None);
}

#[test]
fn addresses_are_read_as_kube_proxy_reads_them_leading_zeros_and_mapped_ipv4() {
    // netutils.ParseIPSloppy: IPv4 parts with leading zeros (objects stored before strict
    // validation) are decimal; an IPv4-mapped IPv6 address is its IPv4 address.
    let s = proxied(&service(
        "legacy",
        json!({
            "clusterIP": "010.096.000.010",
            "externalIPs": ["192.168.001.009", "::ffff:192.168.1.10"],
            "loadBalancerSourceRanges": ["010.0.0.0/8"],
            "type": "LoadBalancer",
            "ports": [{"name": "http", "port": 80, "nodePort": 30080}]
        }),
    ));
    assert_eq!(s.cluster_ips, vec![ip("10.96.0.10")]);
    assert_eq!(s.external_ips, vec![ip("192.168.1.9"), ip("192.168.1.10")]);
    assert_eq!(
        s.load_balancer_source_ranges,
        vec!["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]
    );
    let slice = convert_endpoint_slice(&slice_json(
        "legacy-abc",
        json!({}),
        json!({
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.001.000.005"]}, {"addresses": ["::ffff:10.1.0.6"]}]
        }),
    ))
    .unwrap()
    .unwrap();
    let addresses: Vec<IpAddr> = slice.endpoints.iter().map(|e| e.address).collect();
    assert_eq!(addresses, vec![ip("10.1.0.5"), ip("10.1.0.6")]);
    // Still refused: not an address in any spelling.
    for bad in [
        "10.0.0.256",
        "10.0.0",
        "10.0.0.1.2",
        "0x0a.0.0.1",
        "10.0.0.-1",
        "1e1.0.0.1",
    ] {
        let mut spec = basic_spec();
        spec["clusterIP"] = json!(bad);
        let err = rejected(&service("bad", spec));
        assert!(
            matches!(err, ConversionError::InvalidIp { .. }),
            "{bad}: {err}"
        );
    }
}
