//! UDP conntrack cleanup through proxier-core's ctnetlink code, with real traffic: a client
//! keeps sending from one source port (as DNS resolvers, statsd and SIP clients do) while the
//! Service's endpoint is replaced. The `conntrack` tool is only the oracle.

#![allow(clippy::unwrap_used)]

mod netfilter_support;

use std::time::Duration;

use ipvs_proxier_tests::require_kernel;
use netfilter_support::*;
use proxier_core::conntrack::{
    ConntrackBackend, FlowFilter, KernelConntrack, stale_udp_flows_of_port,
};
use proxier_core::desired::Protocol;
use proxier_core::planner::plan_service_port;

const VIP: &str = "10.96.0.20";

/// A UDP server in pod `i` answering every datagram with `name`.
fn serve_udp(t: &mut Topology, i: usize, name: &str) {
    let pod = &t.pods[i];
    t.background.spawn(
        pod,
        &format!("socat UDP-RECVFROM:5353,fork SYSTEM:'echo {name}'"),
    );
    wait_listening(pod, 5353);
}

/// One UDP query from the client, always from source port 40000 (same conntrack entry).
fn ask(t: &Topology) -> Option<String> {
    request(
        &t.client,
        &format!("UDP:{VIP}:53,sourceport=40000,reuseaddr,bind={CLIENT_IP}"),
    )
    .map(|s| s.lines().last().unwrap_or_default().trim().to_owned())
}

/// Asks up to `tries` times until `want` answers (software-emulated VMs are slow).
fn ask_until(t: &Topology, want: &str, tries: usize) -> Vec<Option<String>> {
    let mut seen = Vec::new();
    for _ in 0..tries {
        let answer = ask(t);
        let done = answer.as_deref() == Some(want);
        seen.push(answer);
        if done {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    seen
}

fn udp_flows(t: &Topology) -> String {
    t.node
        .sh_ok(&format!("conntrack -L -p udp --orig-dst {VIP} 2>/dev/null"))
}

fn delete_in_node(t: &Topology, filters: Vec<FlowFilter>) -> usize {
    t.node.block_on(|| async move {
        let mut ct = KernelConntrack::new().unwrap();
        ct.delete_flows(&filters).unwrap()
    })
}

fn topology() -> Topology {
    let mut t = Topology::new(2);
    serve_udp(&mut t, 0, "pod-a");
    serve_udp(&mut t, 1, "pod-b");
    t.bind_vip(VIP);
    // The client is outside the cluster CIDR: our table masquerades it.
    let svc = service("dns", VIP, 53, Protocol::Udp, None);
    t.apply_netfilter(
        &state(vec![svc], vec![slice("dns", &[0, 1], 5353, Protocol::Udp)]),
        &config(),
    );
    t
}

#[test]
fn replaced_udp_endpoint_flows_are_deleted_and_traffic_moves_on() {
    require_kernel!();
    let t = topology();
    t.ipvsadm(&format!("-A -u {VIP}:53 -s rr"));
    t.ipvsadm(&format!(
        "-a -u {VIP}:53 -r {}:5353 -m",
        Topology::pod_ip(0)
    ));
    let first = ask_until(&t, "pod-a", 5);
    assert_eq!(first.last().unwrap().as_deref(), Some("pod-a"), "{first:?}");
    let flows = udp_flows(&t);
    assert!(flows.contains("src=10.244.0.10 dst=10.244.0.1"), "{flows}");

    // Endpoint replaced: pod-a leaves, pod-b joins.
    let name = proxier_core::ServicePortName {
        namespace: "default".into(),
        name: "dns".into(),
        port: "p".into(),
        protocol: Protocol::Udp,
    };
    let node = t.node_context();
    let cfg = config();
    let svc = service("dns", VIP, 53, Protocol::Udp, None);
    let old = plan_service_port(
        &state(
            vec![svc.clone()],
            vec![slice("dns", &[0], 5353, Protocol::Udp)],
        ),
        &name,
        &node,
        &cfg,
    );
    let new = plan_service_port(
        &state(vec![svc], vec![slice("dns", &[1], 5353, Protocol::Udp)]),
        &name,
        &node,
        &cfg,
    );
    let filters: Vec<FlowFilter> = stale_udp_flows_of_port(old.as_ref(), new.as_ref())
        .into_iter()
        .collect();
    assert_eq!(
        filters,
        vec![FlowFilter::to_removed_endpoint(
            format!("{VIP}:53").parse().unwrap(),
            "10.244.0.10:5353".parse().unwrap()
        )]
    );
    // A filter for another endpoint leaves the flow alone.
    let unrelated = FlowFilter::to_removed_endpoint(
        format!("{VIP}:53").parse().unwrap(),
        "10.244.0.11:5353".parse().unwrap(),
    );
    assert_eq!(delete_in_node(&t, vec![unrelated]), 0);
    assert!(udp_flows(&t).contains("src=10.244.0.10"));

    // The plan's filter deletes exactly the flow to the removed endpoint. (The kernel may
    // also expire it on its own after the real server is gone, with expire_nodest_conn=1
    // and vs/conntrack=1: deleting it first makes the hand-over independent of that.)
    assert_eq!(
        delete_in_node(&t, filters.clone()),
        1,
        "the old flow was not deleted"
    );
    let flows = udp_flows(&t);
    assert!(
        !flows.contains("src=10.244.0.10"),
        "stale flow left: {flows}"
    );
    // Deleting again finds nothing (and is not an error).
    assert_eq!(delete_in_node(&t, filters), 0);

    t.ipvsadm(&format!(
        "-a -u {VIP}:53 -r {}:5353 -m",
        Topology::pod_ip(1)
    ));
    t.ipvsadm(&format!("-d -u {VIP}:53 -r {}:5353", Topology::pod_ip(0)));

    let after = ask_until(&t, "pod-b", 5);
    assert_eq!(after.last().unwrap().as_deref(), Some("pod-b"), "{after:?}");
    let flows = udp_flows(&t);
    assert!(flows.contains("src=10.244.0.11 dst=10.244.0.1"), "{flows}");
}

#[test]
fn flows_from_a_window_without_the_service_blackhole_until_deleted() {
    require_kernel!();
    let t = topology();
    // The VIP is bound but its virtual server is gone (a restart, or the endpoint replaced
    // through a window with no endpoint): the client's datagrams meet the node's own stack,
    // and conntrack records the flow without any NAT.
    let refused = ask(&t);
    assert_eq!(refused, None);
    let flows = udp_flows(&t);
    assert!(flows.contains("UNREPLIED"), "{flows}");

    // The virtual server comes back with the new endpoint.
    t.ipvsadm(&format!("-A -u {VIP}:53 -s rr"));
    t.ipvsadm(&format!(
        "-a -u {VIP}:53 -r {}:5353 -m",
        Topology::pod_ip(1)
    ));

    // Without cleanup the stale entry (refreshed by every datagram) keeps the flow
    // un-NATed: the backend's answers never make it back.
    for attempt in 0..3 {
        assert_eq!(
            ask(&t),
            None,
            "attempt {attempt} got through without cleanup"
        );
    }

    // The plan diff says: this UDP Service port gained endpoints; delete its flows.
    let name = proxier_core::ServicePortName {
        namespace: "default".into(),
        name: "dns".into(),
        port: "p".into(),
        protocol: Protocol::Udp,
    };
    let svc = service("dns", VIP, 53, Protocol::Udp, None);
    let node = t.node_context();
    let cfg = config();
    let old = plan_service_port(&state(vec![svc.clone()], vec![]), &name, &node, &cfg);
    let new = plan_service_port(
        &state(vec![svc], vec![slice("dns", &[1], 5353, Protocol::Udp)]),
        &name,
        &node,
        &cfg,
    );
    let filters: Vec<FlowFilter> = stale_udp_flows_of_port(old.as_ref(), new.as_ref())
        .into_iter()
        .collect();
    assert_eq!(
        filters,
        vec![FlowFilter::to_service(format!("{VIP}:53").parse().unwrap())]
    );
    assert!(delete_in_node(&t, filters) >= 1);

    let after = ask_until(&t, "pod-b", 5);
    assert_eq!(after.last().unwrap().as_deref(), Some("pod-b"), "{after:?}");
}
