//! Errors and warnings about input objects.

use std::fmt;

/// Which kind of object an error or warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A core/v1 Service.
    Service,
    /// A discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
    /// A core/v1 Node.
    Node,
    /// A networking.k8s.io/v1 ServiceCIDR.
    ServiceCidr,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Service => "Service",
            ObjectKind::EndpointSlice => "EndpointSlice",
            ObjectKind::Node => "Node",
            ObjectKind::ServiceCidr => "ServiceCIDR",
        })
    }
}

/// Names an object: kind plus `namespace/name` (just `name` for cluster-scoped objects).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// Kind of the object.
    pub kind: ObjectKind,
    /// Namespace (empty for cluster-scoped objects).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// A reference to a namespaced object.
    pub fn new(kind: ObjectKind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectRef {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// An object that cannot be used at all: it is rejected on its own, the others are unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    /// A field holds something that is not a valid IP address.
    #[error("{object}: {field} {value:?} is not a valid IP address")]
    InvalidIp {
        /// The rejected object.
        object: ObjectRef,
        /// Which field.
        field: &'static str,
        /// The offending value.
        value: String,
    },
    /// A field holds something that is not a valid CIDR.
    #[error("{object}: {field} {value:?} is not a valid CIDR")]
    InvalidCidr {
        /// The rejected object.
        object: ObjectRef,
        /// Which field.
        field: &'static str,
        /// The offending value.
        value: String,
    },
    /// A port number outside 1..=65535.
    #[error("{object}: {field} {value} of port {port_name:?} is not in 1..=65535")]
    InvalidPort {
        /// The rejected object.
        object: ObjectRef,
        /// Which field (`port`, `nodePort`, `healthCheckNodePort`).
        field: &'static str,
        /// Name of the port entry.
        port_name: String,
        /// The offending value.
        value: i64,
    },
    /// A protocol IPVS cannot serve.
    #[error("{object}: protocol {value:?} of port {port_name:?} is not TCP, UDP or SCTP")]
    UnknownProtocol {
        /// The rejected object.
        object: ObjectRef,
        /// Name of the port entry.
        port_name: String,
        /// The offending value.
        value: String,
    },
    /// Two ports share a name, or a number and protocol.
    #[error("{object}: duplicate port {what}")]
    DuplicatePort {
        /// The rejected object.
        object: ObjectRef,
        /// What is duplicated, e.g. `name "http"` or `80/TCP`.
        what: String,
    },
    /// An enumerated field holds a value this proxier does not know.
    #[error("{object}: {field} {value:?} is not one of {expected}")]
    UnknownValue {
        /// The rejected object.
        object: ObjectRef,
        /// Which field.
        field: &'static str,
        /// The offending value.
        value: String,
        /// The accepted values.
        expected: &'static str,
    },
    /// A numeric field out of its valid range.
    #[error("{object}: {field} {value} is out of range {range}")]
    OutOfRange {
        /// The rejected object.
        object: ObjectRef,
        /// Which field.
        field: &'static str,
        /// The offending value.
        value: i64,
        /// The accepted range.
        range: &'static str,
    },
    /// A required field or label is missing.
    #[error("{object}: {what} is missing")]
    Missing {
        /// The rejected object.
        object: ObjectRef,
        /// What is missing.
        what: &'static str,
    },
}

impl ConversionError {
    /// The rejected object.
    pub fn object(&self) -> &ObjectRef {
        match self {
            ConversionError::InvalidIp { object, .. }
            | ConversionError::InvalidCidr { object, .. }
            | ConversionError::InvalidPort { object, .. }
            | ConversionError::UnknownProtocol { object, .. }
            | ConversionError::DuplicatePort { object, .. }
            | ConversionError::UnknownValue { object, .. }
            | ConversionError::OutOfRange { object, .. }
            | ConversionError::Missing { object, .. } => object,
        }
    }
}

/// Something in an accepted object that was ignored (the object is still used).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelWarning {
    /// The scheduler annotation names no scheduler the kernel ships; the default is used.
    #[error(
        "{object}: scheduler annotation {value:?} is not a known IPVS scheduler, using the default"
    )]
    InvalidScheduler {
        /// The Service.
        object: ObjectRef,
        /// The annotation value.
        value: String,
    },
    /// An entry of the weights annotation could not be used; its endpoint gets weight 1.
    #[error("{object}: weights annotation entry {entry:?} ignored: {reason}")]
    InvalidWeight {
        /// The EndpointSlice.
        object: ObjectRef,
        /// The entry.
        entry: String,
        /// Why it was ignored.
        reason: &'static str,
    },
    /// A port entry of an EndpointSlice without a name or number; kube-proxy ignores it too.
    #[error("{object}: endpoint port {port_name:?} has no name or number and is ignored")]
    IgnoredEndpointPort {
        /// The EndpointSlice.
        object: ObjectRef,
        /// Name of the port entry, if any.
        port_name: Option<String>,
    },
    /// A load-balancer ingress with an ipMode this proxier does not know: treated like `Proxy`.
    #[error("{object}: load-balancer ingress {ip} has unknown ipMode {value:?}, treated as Proxy")]
    UnknownIpMode {
        /// The Service.
        object: ObjectRef,
        /// The ingress IP.
        ip: String,
        /// The ipMode value.
        value: String,
    },
}
