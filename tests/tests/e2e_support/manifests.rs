//! Services, EndpointSlices and the Node as YAML, the way `kubectl get -o yaml` writes them,
//! for the daemon's `--source-file`.

use std::fmt::Write as _;

/// A protocol of a Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        }
    }
}

/// One Service port (the slice port of the same name is `target`).
#[derive(Debug, Clone)]
pub struct Port {
    pub name: String,
    pub port: u16,
    pub target: u16,
    pub protocol: Proto,
    pub node_port: Option<u16>,
}

impl Port {
    /// A TCP port named `name`.
    pub fn tcp(name: &str, port: u16, target: u16) -> Port {
        Port {
            name: name.to_owned(),
            port,
            target,
            protocol: Proto::Tcp,
            node_port: None,
        }
    }

    /// A port of another protocol.
    pub fn of(protocol: Proto, name: &str, port: u16, target: u16) -> Port {
        Port {
            protocol,
            ..Port::tcp(name, port, target)
        }
    }

    /// With a NodePort.
    pub fn node_port(mut self, node_port: u16) -> Port {
        self.node_port = Some(node_port);
        self
    }
}

/// A Service.
#[derive(Debug, Clone)]
pub struct Svc {
    pub name: String,
    pub cluster_ips: Vec<String>,
    pub ports: Vec<Port>,
    pub kind: &'static str,
    pub external_traffic_local: bool,
    pub internal_traffic_local: bool,
    pub affinity_timeout: Option<u32>,
    pub external_ips: Vec<String>,
    pub lb_ips: Vec<String>,
    pub lb_source_ranges: Vec<String>,
    /// `spec.healthCheckNodePort` (LoadBalancer Services with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<u16>,
    /// `metadata.annotations`.
    pub annotations: Vec<(String, String)>,
}

impl Svc {
    /// A ClusterIP Service (one cluster IP per family given).
    pub fn cluster_ip(name: &str, cluster_ips: &[&str], ports: Vec<Port>) -> Svc {
        Svc {
            name: name.to_owned(),
            cluster_ips: cluster_ips.iter().map(|s| (*s).to_owned()).collect(),
            ports,
            kind: "ClusterIP",
            external_traffic_local: false,
            internal_traffic_local: false,
            affinity_timeout: None,
            external_ips: Vec::new(),
            lb_ips: Vec::new(),
            lb_source_ranges: Vec::new(),
            health_check_node_port: None,
            annotations: Vec::new(),
        }
    }

    /// The Service as a YAML document.
    pub fn to_yaml(&self) -> String {
        let mut y = String::new();
        let families: Vec<&str> = self
            .cluster_ips
            .iter()
            .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" })
            .collect();
        let _ = write!(
            y,
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {}\n  namespace: default\n",
            self.name
        );
        if !self.annotations.is_empty() {
            y.push_str("  annotations:\n");
            for (key, value) in &self.annotations {
                let _ = writeln!(y, "    {key}: \"{value}\"");
            }
        }
        let _ = write!(
            y,
            "spec:\n  type: {}\n  clusterIP: {}\n  clusterIPs:\n",
            self.kind, self.cluster_ips[0]
        );
        for ip in &self.cluster_ips {
            let _ = writeln!(y, "  - \"{ip}\"");
        }
        y.push_str("  ipFamilies:\n");
        for f in &families {
            let _ = writeln!(y, "  - {f}");
        }
        let policy = if families.len() > 1 {
            "RequireDualStack"
        } else {
            "SingleStack"
        };
        let _ = writeln!(y, "  ipFamilyPolicy: {policy}");
        y.push_str("  ports:\n");
        for p in &self.ports {
            let _ = write!(
                y,
                "  - name: {}\n    port: {}\n    targetPort: {}\n    protocol: {}\n",
                p.name,
                p.port,
                p.target,
                p.protocol.as_str()
            );
            if let Some(np) = p.node_port {
                let _ = writeln!(y, "    nodePort: {np}");
            }
        }
        if self.kind == "NodePort" || self.kind == "LoadBalancer" || !self.external_ips.is_empty() {
            let etp = if self.external_traffic_local {
                "Local"
            } else {
                "Cluster"
            };
            let _ = writeln!(y, "  externalTrafficPolicy: {etp}");
        }
        if let Some(port) = self.health_check_node_port {
            let _ = writeln!(y, "  healthCheckNodePort: {port}");
        }
        let itp = if self.internal_traffic_local {
            "Local"
        } else {
            "Cluster"
        };
        let _ = writeln!(y, "  internalTrafficPolicy: {itp}");
        match self.affinity_timeout {
            Some(t) => {
                let _ = write!(
                    y,
                    "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: {t}\n"
                );
            }
            None => y.push_str("  sessionAffinity: None\n"),
        }
        if !self.external_ips.is_empty() {
            y.push_str("  externalIPs:\n");
            for ip in &self.external_ips {
                let _ = writeln!(y, "  - \"{ip}\"");
            }
        }
        if !self.lb_source_ranges.is_empty() {
            y.push_str("  loadBalancerSourceRanges:\n");
            for r in &self.lb_source_ranges {
                let _ = writeln!(y, "  - \"{r}\"");
            }
        }
        if !self.lb_ips.is_empty() {
            y.push_str("status:\n  loadBalancer:\n    ingress:\n");
            for ip in &self.lb_ips {
                let _ = writeln!(y, "    - ip: \"{ip}\"");
            }
        }
        y
    }
}

/// One endpoint of a slice.
#[derive(Debug, Clone)]
pub struct Ep {
    pub address: String,
    pub node: String,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Ep {
    /// A ready endpoint on node `node`.
    pub fn ready(address: &str, node: &str) -> Ep {
        Ep {
            address: address.to_owned(),
            node: node.to_owned(),
            ready: true,
            serving: true,
            terminating: false,
        }
    }

    /// The same endpoint, not ready (and not serving, not terminating).
    pub fn not_ready(mut self) -> Ep {
        self.ready = false;
        self.serving = false;
        self
    }

    /// The same endpoint, terminating but still serving.
    pub fn terminating(mut self) -> Ep {
        self.ready = false;
        self.serving = true;
        self.terminating = true;
        self
    }
}

/// An EndpointSlice of a Service, with the Service's ports' target ports.
#[derive(Debug, Clone)]
pub struct Slice {
    pub name: String,
    pub service: String,
    pub ipv6: bool,
    pub ports: Vec<(String, u16, Proto)>,
    pub endpoints: Vec<Ep>,
}

impl Slice {
    /// The slice of `svc` for one family, with its ports' targets.
    pub fn of(svc: &Svc, ipv6: bool, endpoints: Vec<Ep>) -> Slice {
        Slice {
            name: format!("{}-{}", svc.name, if ipv6 { "v6" } else { "v4" }),
            service: svc.name.clone(),
            ipv6,
            ports: svc
                .ports
                .iter()
                .map(|p| (p.name.clone(), p.target, p.protocol))
                .collect(),
            endpoints,
        }
    }

    /// The slice as a YAML document.
    pub fn to_yaml(&self) -> String {
        let mut y = String::new();
        let _ = write!(
            y,
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {}\n  namespace: default\n  labels:\n    kubernetes.io/service-name: {}\n    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io\naddressType: {}\n",
            self.name,
            self.service,
            if self.ipv6 { "IPv6" } else { "IPv4" }
        );
        y.push_str("ports:\n");
        for (name, port, proto) in &self.ports {
            let _ = write!(
                y,
                "- name: {name}\n  port: {port}\n  protocol: {}\n",
                proto.as_str()
            );
        }
        if self.endpoints.is_empty() {
            y.push_str("endpoints: []\n");
        } else {
            y.push_str("endpoints:\n");
        }
        for e in &self.endpoints {
            let _ = write!(
                y,
                "- addresses:\n  - \"{}\"\n  nodeName: {}\n  conditions:\n    ready: {}\n    serving: {}\n    terminating: {}\n",
                e.address, e.node, e.ready, e.serving, e.terminating
            );
        }
        y
    }
}

/// This node as a Node object with its internal addresses.
pub fn node(name: &str, ip4: &str, ip6: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    kubernetes.io/hostname: {name}\nstatus:\n  addresses:\n  - type: InternalIP\n    address: \"{ip4}\"\n  - type: InternalIP\n    address: \"{ip6}\"\n  - type: Hostname\n    address: {name}\n"
    )
}

/// [`node`] with `spec.podCIDRs` (for `--detect-local-mode=NodeCIDR`).
pub fn node_with_pod_cidrs(name: &str, ip4: &str, ip6: &str, pod_cidrs: &[&str]) -> String {
    let mut text = node(name, ip4, ip6);
    text.push_str("spec:\n  podCIDRs:\n");
    for cidr in pod_cidrs {
        let _ = writeln!(text, "  - \"{cidr}\"");
    }
    text
}
