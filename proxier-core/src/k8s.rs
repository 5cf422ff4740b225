//! Conversions from k8s-openapi objects (feature `k8s`, on by default).
//!
//! Services are skipped exactly where kube-proxy skips them: `type: ExternalName`, headless
//! (`clusterIP: None`) or without a ClusterIP, and those labelled
//! `service.kubernetes.io/service-proxy-name` or `service.kubernetes.io/headless` (kube-proxy's
//! informers never see those). A skipped Service becomes [`Change::DeleteService`] so that a
//! Service that *becomes* skipped loses its virtual servers.
//!
//! A malformed object is rejected on its own with a [`ConversionError`] naming it; nothing
//! about other objects changes.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::IpNet;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::desired::{Protocol, Scheduler};
use crate::model::{
    ConversionError, DEFAULT_CLIENT_IP_TIMEOUT_SECONDS, Endpoint, EndpointPort, EndpointSlice,
    IpMode, LoadBalancerIngress, MAX_WEIGHT, ModelWarning, NodeContext, ObjectKind, ObjectRef,
    SCHEDULER_ANNOTATION, Service, ServiceCidr, ServiceName, ServicePortSpec, SessionAffinity,
    SliceKey, TrafficPolicy, WEIGHTS_ANNOTATION, node::ZONE_LABEL,
};
use crate::state::Change;

/// Label that hands a Service to another proxy: kube-proxy (and we) ignore such Services.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Label that marks a Service headless: kube-proxy (and we) ignore such Services.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// Label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// kube-proxy's label selector for Services and EndpointSlices: neither another proxy's
/// objects nor those of headless Services.
pub const PROXIED_OBJECTS_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
/// Annotation the EndpointSlice controller sets to the time of the change (a Pod or Service
/// update) that the slice reflects.
pub const LAST_CHANGE_TRIGGER_TIME_ANNOTATION: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";

/// Whether an object passes [`PROXIED_OBJECTS_SELECTOR`]: the filter kube-proxy asks the API
/// server for, for input that comes without a server (a file, an embedder's own watch).
pub fn is_proxied(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_none_or(|labels| {
        !labels.contains_key(SERVICE_PROXY_NAME_LABEL) && !labels.contains_key(HEADLESS_LABEL)
    })
}

/// The slice's [`LAST_CHANGE_TRIGGER_TIME_ANNOTATION`], when it carries a valid one: where
/// the network programming latency is measured from.
pub fn trigger_time(slice: &discovery::EndpointSlice) -> Option<SystemTime> {
    let annotations = slice.metadata.annotations.as_ref()?;
    let at: jiff::Timestamp = annotations
        .get(LAST_CHANGE_TRIGGER_TIME_ANNOTATION)?
        .parse()
        .ok()?;
    Some(SystemTime::from(at))
}

/// The longest ClientIP affinity timeout the API accepts (one day).
const MAX_CLIENT_IP_TIMEOUT_SECONDS: i64 = 86_400;

/// Why a Service is not proxied (it is not an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// `type: ExternalName`.
    ExternalName,
    /// `clusterIP: None`, or no ClusterIP at all.
    Headless,
    /// Labelled `service.kubernetes.io/service-proxy-name` (another proxy serves it).
    OtherProxy,
}

/// The result of reading a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceConversion {
    /// Proxied.
    Proxied(Service),
    /// Not proxied, for this reason.
    Skipped(ServiceName, SkipReason),
}

impl ServiceConversion {
    /// The state change this conversion calls for.
    pub fn into_change(self) -> Change {
        match self {
            ServiceConversion::Proxied(service) => Change::UpsertService(service),
            ServiceConversion::Skipped(name, _) => Change::DeleteService(name),
        }
    }
}

/// The state change for an added or updated Service.
pub fn service_change(service: &core::Service) -> Result<Change, ConversionError> {
    convert_service(service).map(ServiceConversion::into_change)
}

/// The state change for a deleted Service.
pub fn service_deleted(service: &core::Service) -> Change {
    Change::DeleteService(ServiceName::new(
        service.metadata.namespace.clone().unwrap_or_default(),
        service.metadata.name.clone().unwrap_or_default(),
    ))
}

/// The state change for an added or updated EndpointSlice (`None`: an FQDN slice, ignored).
pub fn slice_change(slice: &discovery::EndpointSlice) -> Result<Option<Change>, ConversionError> {
    Ok(convert_endpoint_slice(slice)?.map(Change::UpsertSlice))
}

/// The state change for a deleted EndpointSlice.
pub fn slice_deleted(slice: &discovery::EndpointSlice) -> Change {
    Change::DeleteSlice(SliceKey::new(
        slice.metadata.namespace.clone().unwrap_or_default(),
        slice.metadata.name.clone().unwrap_or_default(),
    ))
}

fn parse_protocol(
    object: &ObjectRef,
    port_name: &str,
    value: Option<&str>,
) -> Result<Protocol, ConversionError> {
    match value.unwrap_or("TCP") {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err(ConversionError::UnknownProtocol {
            object: object.clone(),
            port_name: port_name.to_owned(),
            value: other.to_owned(),
        }),
    }
}

fn parse_port(
    object: &ObjectRef,
    field: &'static str,
    port_name: &str,
    value: i32,
) -> Result<u16, ConversionError> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ConversionError::InvalidPort {
            object: object.clone(),
            field,
            port_name: port_name.to_owned(),
            value: value.into(),
        })
}

fn parse_ip(
    object: &ObjectRef,
    field: &'static str,
    value: &str,
) -> Result<IpAddr, ConversionError> {
    sloppy_ip(value.trim()).ok_or_else(|| ConversionError::InvalidIp {
        object: object.clone(),
        field,
        value: value.to_owned(),
    })
}

/// An address as kube-proxy reads one (`netutils.ParseIPSloppy`): objects stored before the
/// API server's strict validation may hold IPv4 parts with leading zeros, which are read as
/// decimal (`010.001.002.003` is 10.1.2.3), and an IPv4-mapped IPv6 address
/// (`::ffff:10.1.2.3`) is the IPv4 address it maps.
fn sloppy_ip(text: &str) -> Option<IpAddr> {
    // Dotted decimal first, by hand: nearly every address of a cluster is IPv4, and this is
    // the conversions' most frequent call (every endpoint address).
    if let Some(v4) = sloppy_ipv4(text) {
        return Some(IpAddr::V4(v4));
    }
    let ip = text.parse::<IpAddr>().ok()?;
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    })
}

/// Four decimal parts of one to three digits, each at most 255, leading zeros read as
/// decimal; `None` for anything else (an IPv6 address among others). One pass over the
/// bytes.
fn sloppy_ipv4(text: &str) -> Option<std::net::Ipv4Addr> {
    let mut octets = [0u8; 4];
    let (mut part, mut value, mut digits) = (0usize, 0u16, 0u8);
    for &byte in text.as_bytes() {
        match byte {
            b'0'..=b'9' if digits < 3 => {
                value = value * 10 + u16::from(byte - b'0');
                digits += 1;
            }
            b'.' if digits > 0 && part < 3 => {
                octets[part] = u8::try_from(value).ok()?;
                (part, value, digits) = (part + 1, 0, 0);
            }
            _ => return None,
        }
    }
    if part != 3 || digits == 0 {
        return None;
    }
    octets[3] = u8::try_from(value).ok()?;
    Some(std::net::Ipv4Addr::from(octets))
}

/// A CIDR as kube-proxy reads one (`netutils.ParseCIDRSloppy`): its address as
/// [`sloppy_ip`] reads it (an IPv4-mapped IPv6 network is left as written).
fn sloppy_cidr(text: &str) -> Option<IpNet> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Some(net);
    }
    let (address, prefix) = text.split_once('/')?;
    let IpAddr::V4(address) = sloppy_ip(address)? else {
        return None;
    };
    IpNet::new(IpAddr::V4(address), prefix.parse().ok()?).ok()
}

/// Reads a Service: proxied, skipped (as kube-proxy skips it) or rejected.
pub fn convert_service(service: &core::Service) -> Result<ServiceConversion, ConversionError> {
    let meta = &service.metadata;
    let name = ServiceName::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    let object = ObjectRef::new(ObjectKind::Service, &*name.namespace, &*name.name);
    let labels = meta.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL)) {
        return Ok(ServiceConversion::Skipped(name, SkipReason::OtherProxy));
    }
    if labels.is_some_and(|l| l.contains_key(HEADLESS_LABEL)) {
        return Ok(ServiceConversion::Skipped(name, SkipReason::Headless));
    }
    let Some(spec) = service.spec.as_ref() else {
        return Err(ConversionError::Missing {
            object,
            what: "spec",
        });
    };
    let service_type = spec.type_.as_deref().unwrap_or("ClusterIP");
    match service_type {
        "ExternalName" => return Ok(ServiceConversion::Skipped(name, SkipReason::ExternalName)),
        "ClusterIP" | "NodePort" | "LoadBalancer" => {}
        other => {
            return Err(ConversionError::UnknownValue {
                object,
                field: "type",
                value: other.to_owned(),
                expected: "ClusterIP, NodePort, LoadBalancer, ExternalName",
            });
        }
    }

    // ClusterIPs: the list when present, else the single field.
    let raw_cluster_ips: Vec<&str> = match spec.cluster_ips.as_ref() {
        Some(list) if !list.is_empty() => list.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.as_deref().into_iter().collect(),
    };
    if raw_cluster_ips.is_empty()
        || raw_cluster_ips
            .iter()
            .any(|ip| ip.is_empty() || *ip == "None")
    {
        return Ok(ServiceConversion::Skipped(name, SkipReason::Headless));
    }
    let mut cluster_ips = Vec::with_capacity(raw_cluster_ips.len());
    for raw in raw_cluster_ips {
        let ip = parse_ip(&object, "clusterIPs", raw)?;
        if cluster_ips
            .iter()
            .any(|c: &IpAddr| c.is_ipv4() == ip.is_ipv4())
        {
            return Err(ConversionError::UnknownValue {
                object,
                field: "clusterIPs",
                value: raw.to_owned(),
                expected: "at most one address per family",
            });
        }
        cluster_ips.push(ip);
    }

    // Sized exactly: a vector grown by pushes keeps room for four ports, and most Services
    // have one (it lives as long as the Service).
    let mut ports = Vec::with_capacity(spec.ports.as_ref().map_or(0, Vec::len));
    let mut names = HashSet::new();
    let mut numbers = HashSet::new();
    for p in spec.ports.iter().flatten() {
        let port_name = p.name.clone().unwrap_or_default();
        let protocol = parse_protocol(&object, &port_name, p.protocol.as_deref())?;
        let port = parse_port(&object, "port", &port_name, p.port)?;
        let node_port = match p.node_port {
            None | Some(0) => None,
            Some(n) => Some(parse_port(&object, "nodePort", &port_name, n)?),
        };
        if !names.insert(port_name.clone()) {
            return Err(ConversionError::DuplicatePort {
                object,
                what: format!("name {port_name:?}"),
            });
        }
        if !numbers.insert((port, protocol)) {
            return Err(ConversionError::DuplicatePort {
                object,
                what: format!("{port}/{protocol}"),
            });
        }
        ports.push(ServicePortSpec {
            name: port_name,
            port,
            protocol,
            node_port,
        });
    }

    let external_ips = spec
        .external_ips
        .iter()
        .flatten()
        .map(|ip| parse_ip(&object, "externalIPs", ip))
        .collect::<Result<Vec<_>, _>>()?;

    let mut warnings = Vec::new();
    let mut load_balancer_ingress = Vec::new();
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    for entry in ingress.into_iter().flatten() {
        let Some(raw_ip) = entry.ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue; // hostname-only ingress: nothing to serve locally
        };
        let ip = parse_ip(&object, "status.loadBalancer.ingress.ip", raw_ip)?;
        let ip_mode = match entry.ip_mode.as_deref() {
            None | Some("VIP") => IpMode::Vip,
            Some("Proxy") => IpMode::Proxy,
            Some(other) => {
                warnings.push(ModelWarning::UnknownIpMode {
                    object: object.clone(),
                    ip: raw_ip.to_owned(),
                    value: other.to_owned(),
                });
                IpMode::Proxy
            }
        };
        load_balancer_ingress.push(LoadBalancerIngress { ip, ip_mode });
    }

    let load_balancer_source_ranges = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .map(|raw| {
            sloppy_cidr(raw.trim()).ok_or_else(|| ConversionError::InvalidCidr {
                object: object.clone(),
                field: "loadBalancerSourceRanges",
                value: raw.clone(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let session_affinity = match spec.session_affinity.as_deref() {
        None | Some("None") => SessionAffinity::None,
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            let timeout_seconds = match timeout {
                None => DEFAULT_CLIENT_IP_TIMEOUT_SECONDS,
                Some(t) if (1..=MAX_CLIENT_IP_TIMEOUT_SECONDS).contains(&i64::from(t)) => {
                    t.unsigned_abs()
                }
                Some(t) => {
                    return Err(ConversionError::OutOfRange {
                        object,
                        field: "sessionAffinityConfig.clientIP.timeoutSeconds",
                        value: t.into(),
                        range: "1..=86400",
                    });
                }
            };
            SessionAffinity::ClientIp { timeout_seconds }
        }
        Some(other) => {
            return Err(ConversionError::UnknownValue {
                object,
                field: "sessionAffinity",
                value: other.to_owned(),
                expected: "None, ClientIP",
            });
        }
    };

    let parse_policy = |field: &'static str, value: Option<&str>| match value {
        None | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(ConversionError::UnknownValue {
            object: object.clone(),
            field,
            value: other.to_owned(),
            expected: "Cluster, Local",
        }),
    };
    let requested_external = parse_policy(
        "externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
    )?;
    let internal_traffic_policy = parse_policy(
        "internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
    )?;
    // kube-proxy's ExternallyAccessible: the external policy applies to NodePort and
    // LoadBalancer Services, and to ClusterIP Services with externalIPs.
    let has_external_ips = spec
        .external_ips
        .as_ref()
        .is_some_and(|ips| !ips.is_empty());
    let externally_accessible =
        matches!(service_type, "NodePort" | "LoadBalancer") || has_external_ips;
    let external_traffic_policy = if externally_accessible {
        requested_external
    } else {
        TrafficPolicy::Cluster
    };
    let health_check_node_port =
        if service_type == "LoadBalancer" && external_traffic_policy == TrafficPolicy::Local {
            match spec.health_check_node_port {
                None | Some(0) => None,
                Some(n) => Some(parse_port(&object, "healthCheckNodePort", "", n)?),
            }
        } else {
            None
        };

    let scheduler = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(SCHEDULER_ANNOTATION))
        .and_then(|value| match value.trim().parse::<Scheduler>() {
            Ok(s) if !matches!(s, Scheduler::Other(_)) => Some(s),
            _ => {
                warnings.push(ModelWarning::InvalidScheduler {
                    object: object.clone(),
                    value: value.clone(),
                });
                None
            }
        });

    Ok(ServiceConversion::Proxied(Service {
        name,
        cluster_ips,
        ports,
        external_ips,
        load_balancer_ingress,
        load_balancer_source_ranges,
        session_affinity,
        external_traffic_policy,
        internal_traffic_policy,
        health_check_node_port,
        scheduler,
        warnings,
    }))
}

/// Parses the [`WEIGHTS_ANNOTATION`] value into weights by address, with a warning per bad entry.
pub fn parse_weights(
    object: &ObjectRef,
    value: &str,
) -> (BTreeMap<IpAddr, u32>, Vec<ModelWarning>) {
    let mut weights = BTreeMap::new();
    let mut warnings = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let warn = |reason| ModelWarning::InvalidWeight {
            object: object.clone(),
            entry: entry.to_owned(),
            reason,
        };
        let Some((address, weight)) = entry.rsplit_once('=') else {
            warnings.push(warn("expected address=weight"));
            continue;
        };
        let Ok(address) = address.trim().parse::<IpAddr>() else {
            warnings.push(warn("not an IP address"));
            continue;
        };
        match weight.trim().parse::<u32>() {
            Ok(w) if (1..=MAX_WEIGHT).contains(&w) => {
                weights.insert(address, w);
            }
            _ => warnings.push(warn("weight is not an integer in 1..=65535")),
        }
    }
    (weights, warnings)
}

/// Reads an EndpointSlice (`None`: an FQDN slice, which kube-proxy ignores).
pub fn convert_endpoint_slice(
    slice: &discovery::EndpointSlice,
) -> Result<Option<EndpointSlice>, ConversionError> {
    let meta = &slice.metadata;
    let key = SliceKey::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    );
    let object = ObjectRef::new(ObjectKind::EndpointSlice, &*key.namespace, &*key.name);
    match slice.address_type.as_str() {
        "IPv4" | "IPv6" => {}
        "FQDN" => return Ok(None),
        other => {
            return Err(ConversionError::UnknownValue {
                object,
                field: "addressType",
                value: other.to_owned(),
                expected: "IPv4, IPv6, FQDN",
            });
        }
    }
    let Some(service_name) = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .filter(|n| !n.is_empty())
    else {
        return Err(ConversionError::Missing {
            object,
            what: "label kubernetes.io/service-name",
        });
    };
    let service = ServiceName::new(Arc::clone(&key.namespace), service_name.as_str());

    let mut warnings = Vec::new();
    let mut ports = Vec::with_capacity(slice.ports.as_ref().map_or(0, Vec::len));
    let mut names = HashSet::new();
    for p in slice.ports.iter().flatten() {
        let (Some(port_name), Some(number)) = (p.name.as_ref(), p.port.filter(|n| *n != 0)) else {
            warnings.push(ModelWarning::IgnoredEndpointPort {
                object: object.clone(),
                port_name: p.name.clone(),
            });
            continue;
        };
        let protocol = parse_protocol(&object, port_name, p.protocol.as_deref())?;
        let port = parse_port(&object, "port", port_name, number)?;
        if !names.insert((port_name.clone(), protocol)) {
            return Err(ConversionError::DuplicatePort {
                object,
                what: format!("name {port_name:?} ({protocol})"),
            });
        }
        ports.push(EndpointPort {
            name: port_name.clone(),
            port,
            protocol,
        });
    }

    let (weights, weight_warnings) = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(WEIGHTS_ANNOTATION))
        .map(|v| parse_weights(&object, v))
        .unwrap_or_default();
    warnings.extend(weight_warnings);

    let source_endpoints = slice.endpoints.as_deref().unwrap_or_default();
    let mut endpoints = Vec::with_capacity(source_endpoints.len());
    for ep in source_endpoints {
        let Some(raw) = ep.addresses.first() else {
            continue; // kube-proxy ignores endpoints without addresses
        };
        let address = parse_ip(&object, "endpoints.addresses", raw)?;
        let conditions = ep.conditions.as_ref();
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let serving = conditions.and_then(|c| c.serving).unwrap_or(true);
        let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
        let hints = ep.hints.as_ref();
        endpoints.push(Endpoint {
            address,
            ready,
            serving,
            terminating,
            node_name: ep.node_name.as_deref().map(Arc::from),
            zone: ep.zone.as_deref().map(Arc::from),
            zone_hints: hints
                .and_then(|h| h.for_zones.as_ref())
                .into_iter()
                .flatten()
                .map(|z| Arc::from(z.name.as_str()))
                .collect(),
            node_hints: hints
                .and_then(|h| h.for_nodes.as_ref())
                .into_iter()
                .flatten()
                .map(|n| Arc::from(n.name.as_str()))
                .collect(),
            weight: weights.get(&address).copied(),
        });
    }
    Ok(Some(EndpointSlice {
        key,
        service,
        ports,
        endpoints,
        warnings,
        trigger_time: trigger_time(slice),
    }))
}

/// Reads a ServiceCIDR: its name and its ranges (`spec.cidrs`, host bits cleared). A
/// malformed range rejects the object; one being deleted (`metadata.deletionTimestamp`)
/// converts as any other, since its ranges keep live Services until the object is gone.
pub fn convert_service_cidr(
    object: &networking::ServiceCIDR,
) -> Result<ServiceCidr, ConversionError> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let reference = ObjectRef::new(ObjectKind::ServiceCidr, "", &name);
    let listed = object
        .spec
        .as_ref()
        .and_then(|spec| spec.cidrs.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut cidrs: Vec<IpNet> = Vec::with_capacity(listed.len());
    for raw in listed {
        let net = sloppy_cidr(raw.trim())
            .ok_or_else(|| ConversionError::InvalidCidr {
                object: reference.clone(),
                field: "spec.cidrs",
                value: raw.clone(),
            })?
            .trunc();
        if !cidrs.contains(&net) {
            cidrs.push(net);
        }
    }
    Ok(ServiceCidr { name, cidrs })
}

/// The state change for an added or updated ServiceCIDR.
pub fn service_cidr_change(object: &networking::ServiceCIDR) -> Result<Change, ConversionError> {
    convert_service_cidr(object).map(Change::UpsertServiceCidr)
}

/// The state change for a deleted ServiceCIDR.
pub fn service_cidr_deleted(object: &networking::ServiceCIDR) -> Change {
    Change::DeleteServiceCidr(object.metadata.name.clone().unwrap_or_default())
}

/// Taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Whether a node may take traffic, as kube-proxy's `/healthz` decides it: not while it is
/// being deleted or tainted [`TO_BE_DELETED_TAINT`].
pub fn node_eligible(node: &core::Node) -> bool {
    let being_deleted = node.metadata.deletion_timestamp.is_some();
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
    !being_deleted && !tainted
}

/// Reads what the engine needs from this node's Node object: name, labels, zone, primary
/// IPs (the first InternalIP of each family, else the first ExternalIP), as
/// `local_addresses` every InternalIP and ExternalIP it lists, its pod CIDRs
/// (`spec.podCIDRs`, else `spec.podCIDR`; a malformed one rejects the Node) and whether it
/// may take traffic ([`node_eligible`]). A proxier that reads the node's interfaces
/// ([`crate::ProxierConfig::node_addresses_from_kernel`]) uses those instead.
pub fn node_context(node: &core::Node) -> Result<NodeContext, ConversionError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let object = ObjectRef::new(ObjectKind::Node, "", &name);
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut primary_ips: Vec<IpAddr> = Vec::new();
    let mut local_addresses: Vec<IpAddr> = Vec::new();
    for wanted in ["InternalIP", "ExternalIP"] {
        for address in addresses.iter().filter(|a| a.type_ == wanted) {
            let ip = parse_ip(&object, "status.addresses", &address.address)?;
            if !primary_ips.iter().any(|p| p.is_ipv4() == ip.is_ipv4()) {
                primary_ips.push(ip);
            }
            if !local_addresses.contains(&ip) {
                local_addresses.push(ip);
            }
        }
    }
    // `spec.podCIDRs` (dual-stack); older objects may only carry `spec.podCIDR`.
    let spec = node.spec.as_ref();
    let listed = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    let raw_cidrs = if listed.is_empty() {
        spec.and_then(|s| s.pod_cidr.clone()).into_iter().collect()
    } else {
        listed
    };
    let mut pod_cidrs: Vec<IpNet> = Vec::new();
    for raw in &raw_cidrs {
        let net = sloppy_cidr(raw.trim())
            .ok_or_else(|| ConversionError::InvalidCidr {
                object: object.clone(),
                field: "spec.podCIDRs",
                value: raw.clone(),
            })?
            .trunc();
        if !pod_cidrs.contains(&net) {
            pod_cidrs.push(net);
        }
    }
    Ok(NodeContext {
        zone: labels.get(ZONE_LABEL).cloned(),
        name,
        primary_ips,
        local_addresses,
        labels,
        pod_cidrs,
        eligible: node_eligible(node),
    })
}

#[cfg(test)]
mod service_cidr_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn object(value: serde_json::Value) -> networking::ServiceCIDR {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_service_cidr_converts_to_its_name_and_ranges_even_while_being_deleted() {
        let dual = object(serde_json::json!({
            "metadata": {"name": "kubernetes", "deletionTimestamp": "2026-12-01T10:00:00Z",
                         "finalizers": ["networking.k8s.io/service-cidr-finalizer"]},
            "spec": {"cidrs": ["10.96.0.0/12", "fd00:96::/108"]}
        }));
        assert_eq!(
            service_cidr_change(&dual).unwrap(),
            Change::UpsertServiceCidr(ServiceCidr {
                name: "kubernetes".into(),
                cidrs: vec![
                    "10.96.0.0/12".parse().unwrap(),
                    "fd00:96::/108".parse().unwrap()
                ],
            })
        );
        assert_eq!(
            service_cidr_deleted(&dual),
            Change::DeleteServiceCidr("kubernetes".into())
        );
        let empty = object(serde_json::json!({"metadata": {"name": "e"}}));
        assert!(convert_service_cidr(&empty).unwrap().cidrs.is_empty());
    }

    #[test]
    fn a_malformed_range_rejects_the_service_cidr_naming_it() {
        let bad = object(serde_json::json!({
            "metadata": {"name": "extra"},
            "spec": {"cidrs": ["10.100.0.0/16", "10.300.0.0/16"]}
        }));
        let error = service_cidr_change(&bad).unwrap_err();
        assert_eq!(
            error.to_string(),
            "ServiceCIDR extra: spec.cidrs \"10.300.0.0/16\" is not a valid CIDR"
        );
    }
}

#[cfg(test)]
mod pod_cidr_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn node(spec: serde_json::Value) -> core::Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn pod_cidrs_come_from_spec_pod_cidrs_then_pod_cidr() {
        let dual = node(serde_json::json!({
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24", "fd00:244:1::/64"]
        }));
        let nets: Vec<IpNet> = vec![
            "10.244.1.0/24".parse().unwrap(),
            "fd00:244:1::/64".parse().unwrap(),
        ];
        assert_eq!(node_context(&dual).unwrap().pod_cidrs, nets);

        let old = node(serde_json::json!({"podCIDR": "10.244.2.7/24"}));
        let nets: Vec<IpNet> = vec!["10.244.2.0/24".parse().unwrap()];
        assert_eq!(node_context(&old).unwrap().pod_cidrs, nets);

        assert!(
            node_context(&node(serde_json::json!({})))
                .unwrap()
                .pod_cidrs
                .is_empty()
        );

        let bad = node(serde_json::json!({"podCIDRs": ["10.244.1.0/33"]}));
        assert!(matches!(
            node_context(&bad),
            Err(ConversionError::InvalidCidr {
                field: "spec.podCIDRs",
                ..
            })
        ));
    }
}

#[cfg(test)]
mod sloppy_ip_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    proptest! {
        /// Every IPv4 address, each part written with up to two leading zeros, reads as the
        /// address (the canonical form as the standard library reads it).
        #[test]
        fn dotted_decimal_reads_as_its_decimal_parts(
            octets in any::<[u8; 4]>(),
            zeros in proptest::collection::vec(0usize..3, 4),
        ) {
            let text = octets
                .iter()
                .zip(&zeros)
                .map(|(octet, &z)| {
                    let digits = octet.to_string();
                    "0".repeat(z.min(3 - digits.len())) + &digits
                })
                .collect::<Vec<_>>()
                .join(".");
            let want = IpAddr::V4(Ipv4Addr::from(octets));
            prop_assert_eq!(sloppy_ip(&text), Some(want));
            prop_assert_eq!(Ipv4Addr::from(octets).to_string().parse::<IpAddr>().unwrap(), want);
        }

        /// Whatever the text, an address read is one the standard library reads too (once
        /// its IPv4 parts lose their leading zeros), and one it reads is read the same.
        #[test]
        fn any_text_reads_as_the_standard_library_reads_it(text in "[0-9a-f:.x +]{0,20}") {
            let standard = text.parse::<IpAddr>().ok().map(|ip| match ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                v4 => v4,
            });
            match sloppy_ip(&text) {
                Some(ip) if standard.is_none() => {
                    // Only leading zeros may make the difference.
                    let stripped = text
                        .split('.')
                        .map(|part| part.trim_start_matches('0'))
                        .map(|part| if part.is_empty() { "0" } else { part })
                        .collect::<Vec<_>>()
                        .join(".");
                    prop_assert_eq!(stripped.parse::<IpAddr>().ok(), Some(ip));
                }
                read => prop_assert_eq!(read, standard),
            }
        }
    }

    #[test]
    fn malformed_dotted_text_is_no_address() {
        for text in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "1..3.4",
            "256.1.1.1",
            "1.2.3.1000",
            "0000.1.1.1",
            "+1.2.3.4",
            "1.2.3.4 ",
            "1.2.3.0x4",
            "1.2.3.",
            ".1.2.3",
        ] {
            assert_eq!(sloppy_ip(text), None, "{text:?}");
        }
        assert_eq!(
            sloppy_ip("010.001.002.003"),
            Some(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)))
        );
        assert_eq!(
            sloppy_ip("::ffff:10.1.2.3"),
            Some(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)))
        );
        assert_eq!(sloppy_ip("fd00::1"), Some("fd00::1".parse().unwrap()));
    }
}
