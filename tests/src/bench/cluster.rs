//! The synthetic cluster the daemon benchmarks program: N ClusterIP TCP Services (port 80 to
//! 8080), each with one EndpointSlice of M ready endpoints on this node, as a source file,
//! as API objects for the server double, and as the `ipvsadm` / `ip` / ipvs-netlink input
//! that programs the same table without the daemon.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use ipvs_netlink::{Destination, Op, Scheduler, Service, ServiceKey};
use serde_json::{Value, json};

/// The node the daemon runs as.
pub const NODE: &str = "node-a";
/// The node the endpoints run on: another one, as nearly all endpoints of a large cluster
/// are (a node runs ~100 pods), so an endpoint change is IPVS work only, no nftables
/// element (local endpoints are in the hairpin set).
pub const ENDPOINT_NODE: &str = "node-b";
/// The namespace of every benchmark Service.
pub const NAMESPACE: &str = "bench";
/// The shell commands that give a namespace a route to every endpoint address (masquerading
/// real servers need one): a dummy link on 10.200.0.0/16.
pub const ENDPOINT_ROUTE: &str = "ip link add bench0 type dummy && ip link set bench0 up && \
     ip addr add 10.200.255.254/16 dev bench0";

/// The range every [`vip`] falls in: what `--bind-service-cidrs` takes with one local route.
pub const SERVICE_CIDR: &str = "10.100.0.0/14";

/// The ClusterIP of service `i` (up to 250,000 services: 10.100-103.x.y).
pub fn vip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        100 + (i / 62_500) as u8,
        ((i / 250) % 250) as u8,
        (i % 250 + 1) as u8,
    )
}

/// Endpoint `j` (< 250) of service `i`: 10.200.j.x.
pub fn endpoint(i: usize, j: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, j as u8, (i % 250 + 1) as u8)
}

/// The `k`-th replacement endpoint (k < 750): 10.200.251-253.x, never one of [`endpoint`]'s.
pub fn replacement(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 200, 251 + (k / 250) as u8, (k % 250 + 1) as u8)
}

/// Service `i`'s name.
pub fn service_name(i: usize) -> String {
    format!("s{i}")
}

/// The IPVS key of service `i`'s virtual server.
pub fn service_key(i: usize) -> ServiceKey {
    ServiceKey::tcp(IpAddr::V4(vip(i)), 80)
}

/// The Node object, as YAML.
fn node_yaml() -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\nstatus: {{addresses: [{{type: InternalIP, address: \"192.168.50.1\"}}]}}\n"
    )
}

/// The daemon's source file: the Node, then every Service with its slice; `endpoints_of(i)`
/// gives service `i`'s endpoint addresses.
pub fn source_file(services: usize, endpoints_of: impl Fn(usize) -> Vec<Ipv4Addr>) -> String {
    let mut y = String::with_capacity(services * 1100);
    y.push_str(&node_yaml());
    for i in 0..services {
        let v = vip(i);
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: {NAMESPACE}}}\nspec: {{type: ClusterIP, clusterIP: \"{v}\", clusterIPs: [\"{v}\"], ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-1, namespace: {NAMESPACE}, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n"
        );
        for a in endpoints_of(i) {
            let _ = writeln!(
                y,
                "- {{addresses: [\"{a}\"], conditions: {{ready: true, serving: true, terminating: false}}, nodeName: {ENDPOINT_NODE}}}"
            );
        }
    }
    y
}

/// Service `i`'s endpoints as first programmed: `endpoint(i, 0..m)`.
pub fn initial_endpoints(i: usize, m: usize) -> Vec<Ipv4Addr> {
    (0..m).map(|j| endpoint(i, j)).collect()
}

/// The Node object for the API server double.
pub fn node_object() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
           "status": {"addresses": [{"type": "InternalIP", "address": "192.168.50.1"},
                                    {"type": "Hostname", "address": NODE}]}})
}

/// Service `i` for the API server double, with the metadata a real API server adds (uid,
/// creation time, managed fields, an annotation): what a watcher receives in a cluster.
pub fn service_object(i: usize) -> Value {
    let v = vip(i).to_string();
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": service_name(i), "namespace": NAMESPACE,
                        "uid": format!("00000000-0000-4000-8000-{i:012}"),
                        "creationTimestamp": "2026-01-01T00:00:00Z",
                        "labels": {"app": service_name(i)},
                        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                        "managedFields": [{"manager": "kubectl", "operation": "Update",
                                           "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
                                           "fieldsType": "FieldsV1",
                                           "fieldsV1": {"f:spec": {"f:ports": {}, "f:selector": {}}}}]},
           "spec": {"clusterIP": v, "clusterIPs": [v], "type": "ClusterIP",
                    "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                    "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
                    "selector": {"app": service_name(i)},
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                               "targetPort": 8080}]}})
}

/// Service `i`'s EndpointSlice for the API server double, with `endpoints`.
pub fn slice_object(i: usize, endpoints: &[Ipv4Addr]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|ip| {
            json!({"addresses": [ip.to_string()],
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": ENDPOINT_NODE,
                   "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": format!("pod-{ip}")}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
           "metadata": {"name": format!("{}-1", service_name(i)), "namespace": NAMESPACE,
                        "uid": format!("00000000-0000-4000-9000-{i:012}"),
                        "creationTimestamp": "2026-01-01T00:00:00Z",
                        "labels": {"kubernetes.io/service-name": service_name(i),
                                   "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                           "apiVersion": "discovery.k8s.io/v1",
                                           "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                                           "fieldsV1": {"f:endpoints": {}, "f:ports": {}}}]},
           "endpoints": endpoints,
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

/// `ipvsadm -R` input for the initial table.
pub fn restore_file(services: usize, m: usize) -> String {
    let mut s = String::with_capacity(services * (m + 1) * 48);
    for i in 0..services {
        let v = vip(i);
        let _ = writeln!(s, "-A -t {v}:80 -s rr");
        for a in initial_endpoints(i, m) {
            let _ = writeln!(s, "-a -t {v}:80 -r {a}:8080 -m -w 1");
        }
    }
    s
}

/// `ip -batch` input binding every ClusterIP on `dev`.
pub fn addr_batch(services: usize, dev: &str) -> String {
    let mut s = String::with_capacity(services * 40);
    for i in 0..services {
        let _ = writeln!(s, "addr add {}/32 dev {dev}", vip(i));
    }
    s
}

/// The ipvs-netlink batch that programs the initial table.
pub fn library_ops(services: usize, m: usize) -> Vec<Op> {
    let mut ops = Vec::with_capacity(services * (m + 1));
    for i in 0..services {
        let key = service_key(i);
        ops.push(Op::AddService(Service::new(key, Scheduler::RoundRobin)));
        for a in initial_endpoints(i, m) {
            ops.push(Op::AddDestination(
                key,
                Destination::new(IpAddr::V4(a), 8080),
            ));
        }
    }
    ops
}

/// Every ClusterIP.
pub fn vips(services: usize) -> Vec<IpAddr> {
    (0..services).map(|i| IpAddr::V4(vip(i))).collect()
}

/// Normalised `-A`/`-a` lines of `ipvsadm -Sn` output.
pub fn normalise(save: &str) -> BTreeSet<String> {
    save.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}
