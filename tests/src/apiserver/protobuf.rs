//! The API server double's protobuf encoding (`application/vnd.kubernetes.protobuf`) of the
//! Services and EndpointSlices it stores as JSON: every field the API's `generated.proto`
//! declares for them (managed fields, owner and Pod references included), so that a reader
//! skips what a real server sends. A JSON field the encoder does not know is a panic: the
//! double never serves less than it stores.
//!
//! Like the Go encoder, strings that are not pointers are written even when empty (name,
//! generateName, namespace, uid, resourceVersion of every object's metadata).

use serde_json::{Map, Value};

/// Kubernetes' protobuf content type.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The content type of a watch answered in protobuf: a stream of length-prefixed frames
/// ([`watch_frame`]).
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// The annotation of the bookmark that ends a streaming list's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// A whole list body: the magic, then `runtime.Unknown` holding the list (`kind`:
/// `ServiceList`, `EndpointSliceList`) of the encoded `items`.
pub fn list_body(
    api_version: &str,
    kind: &str,
    resource_version: &str,
    continue_token: Option<&str>,
    items: &[&[u8]],
) -> Vec<u8> {
    let mut list_meta = Vec::new();
    string(&mut list_meta, 2, resource_version);
    if let Some(token) = continue_token {
        string(&mut list_meta, 3, token);
    }
    let mut list = Vec::new();
    bytes(&mut list, 1, &list_meta);
    for item in items {
        bytes(&mut list, 2, item);
    }
    object_body(api_version, kind, &list)
}

/// One object as a body of its own (a list's, or a watch event's object): the magic
/// `k8s\0`, then `runtime.Unknown` {1: typeMeta {1: `api_version`, 2: `kind`}, 2: raw =
/// `message` (the object's message bytes), 3: contentEncoding "", 4: contentType ""}.
pub fn object_body(api_version: &str, kind: &str, message: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    string(&mut type_meta, 1, api_version);
    string(&mut type_meta, 2, kind);
    let mut unknown = Vec::new();
    bytes(&mut unknown, 1, &type_meta);
    bytes(&mut unknown, 2, message);
    string(&mut unknown, 3, "");
    string(&mut unknown, 4, "");
    let mut body = b"k8s\0".to_vec();
    body.extend_from_slice(&unknown);
    body
}

/// One frame of a protobuf watch: the length of the `metav1.WatchEvent` that follows (a
/// big-endian u32), then the event {1: type = `event_type` (`ADDED`, `MODIFIED`, `DELETED`,
/// `BOOKMARK`, `ERROR`), 2: object = `runtime.RawExtension` {1: raw = `object`}}, where
/// `object` is an [`object_body`].
pub fn watch_frame(event_type: &str, object: &[u8]) -> Vec<u8> {
    let mut raw_extension = Vec::new();
    bytes(&mut raw_extension, 1, object);
    let mut event = Vec::new();
    string(&mut event, 1, event_type);
    bytes(&mut event, 2, &raw_extension);
    let length = u32::try_from(event.len()).expect("a watch event under 4 GiB");
    let mut frame = Vec::with_capacity(4 + event.len());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(&event);
    frame
}

/// Appends to `out` the frame [`watch_frame`] makes of `event_type` and the
/// [`object_body`] of `message`, without building either part on its own: the frame's
/// nested lengths are counted first. The double's streaming lists write thousands of these
/// at once, on the CPUs the daemon under test also uses.
pub fn append_watch_frame(
    out: &mut Vec<u8>,
    event_type: &str,
    api_version: &str,
    kind: &str,
    message: &[u8],
) {
    let type_meta = field_len(1, api_version.len()) + field_len(2, kind.len());
    let unknown = field_len(1, type_meta) + field_len(2, message.len()) + 2 * field_len(3, 0);
    let body = 4 + unknown;
    let raw_extension = field_len(1, body);
    let event = field_len(1, event_type.len()) + field_len(2, raw_extension);
    let length = u32::try_from(event).expect("a watch event under 4 GiB");
    out.reserve(4 + event);
    out.extend_from_slice(&length.to_be_bytes());
    string(out, 1, event_type);
    header(out, 2, raw_extension);
    header(out, 1, body);
    out.extend_from_slice(b"k8s\0");
    header(out, 1, type_meta);
    string(out, 1, api_version);
    string(out, 2, kind);
    bytes(out, 2, message);
    string(out, 3, "");
    string(out, 4, "");
}

/// Bytes a length-delimited field of `len` bytes takes, its tag and length included.
fn field_len(number: u32, len: usize) -> usize {
    varint_len((u64::from(number) << 3) | 2) + varint_len(len as u64) + len
}

/// Bytes `value` takes as a varint.
fn varint_len(value: u64) -> usize {
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// The tag and length of a length-delimited field whose `len` bytes follow.
fn header(out: &mut Vec<u8>, number: u32, len: usize) {
    varint(out, (u64::from(number) << 3) | 2);
    varint(out, len as u64);
}

/// The message of a bookmark's object (a Service or an EndpointSlice: both hold their
/// ObjectMeta in field 1): metadata only, with `resource_version` and, when
/// `initial_events_end`, the annotation [`INITIAL_EVENTS_END`]: `"true"`. Wrap it with
/// [`object_body`].
pub fn bookmark(resource_version: &str, initial_events_end: bool) -> Vec<u8> {
    let mut meta = serde_json::json!({"resourceVersion": resource_version});
    if initial_events_end {
        meta["annotations"] = serde_json::json!({INITIAL_EVENTS_END: "true"});
    }
    let mut out = Vec::new();
    bytes(&mut out, 1, &object_meta(&meta));
    out
}

/// A whole `metav1.Status` body (the object of an ERROR event): [`object_body`] of kind
/// `Status`, `v1`, whose message is {1: metadata (an empty ListMeta), 2: status `Failure`,
/// 3: `message`, 4: `reason`, 6: `code`}.
pub fn status_body(code: u16, reason: &str, message: &str) -> Vec<u8> {
    let mut status = Vec::new();
    bytes(&mut status, 1, &[]);
    string(&mut status, 2, "Failure");
    string(&mut status, 3, message);
    string(&mut status, 4, reason);
    varint_field(&mut status, 6, u64::from(code));
    object_body("v1", "Status", &status)
}

/// A v1 Service.
pub fn service(obj: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(obj, "Service") {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => bytes(&mut out, 1, &object_meta(value)),
            "spec" => bytes(&mut out, 2, &service_spec(value)),
            "status" => bytes(&mut out, 3, &service_status(value)),
            other => unknown("Service", other),
        }
    }
    out
}

/// A discovery.k8s.io/v1 EndpointSlice.
pub fn endpoint_slice(obj: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(obj, "EndpointSlice") {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => bytes(&mut out, 1, &object_meta(value)),
            "endpoints" => {
                for endpoint in array(value) {
                    bytes(&mut out, 2, &slice_endpoint(endpoint));
                }
            }
            "ports" => {
                for port in array(value) {
                    bytes(&mut out, 3, &endpoint_port(port));
                }
            }
            "addressType" => string(&mut out, 4, text(value)),
            other => unknown("EndpointSlice", other),
        }
    }
    out
}

fn object_meta(meta: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    // The Go encoder writes these strings whatever their value.
    for (number, key) in [
        (1, "name"),
        (2, "generateName"),
        (3, "namespace"),
        (5, "uid"),
    ] {
        string(&mut out, number, meta[key].as_str().unwrap_or(""));
    }
    string(&mut out, 6, meta["resourceVersion"].as_str().unwrap_or(""));
    for (key, value) in fields(meta, "ObjectMeta") {
        match key.as_str() {
            "name" | "generateName" | "namespace" | "uid" | "resourceVersion" => {}
            "generation" => varint_field(&mut out, 7, number(value) as u64),
            "creationTimestamp" => bytes(&mut out, 8, &time(value)),
            "deletionTimestamp" => bytes(&mut out, 9, &time(value)),
            "deletionGracePeriodSeconds" => varint_field(&mut out, 10, number(value) as u64),
            "labels" => map(&mut out, 11, value),
            "annotations" => map(&mut out, 12, value),
            "ownerReferences" => {
                for reference in array(value) {
                    bytes(&mut out, 13, &owner_reference(reference));
                }
            }
            "finalizers" => strings(&mut out, 14, value),
            "managedFields" => {
                for entry in array(value) {
                    bytes(&mut out, 17, &managed_fields_entry(entry));
                }
            }
            other => unknown("ObjectMeta", other),
        }
    }
    out
}

fn owner_reference(reference: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(reference, "OwnerReference") {
        match key.as_str() {
            "kind" => string(&mut out, 1, text(value)),
            "name" => string(&mut out, 3, text(value)),
            "uid" => string(&mut out, 4, text(value)),
            "apiVersion" => string(&mut out, 5, text(value)),
            "controller" => boolean(&mut out, 6, value),
            "blockOwnerDeletion" => boolean(&mut out, 7, value),
            other => unknown("OwnerReference", other),
        }
    }
    out
}

fn managed_fields_entry(entry: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(entry, "ManagedFieldsEntry") {
        match key.as_str() {
            "manager" => string(&mut out, 1, text(value)),
            "operation" => string(&mut out, 2, text(value)),
            "apiVersion" => string(&mut out, 3, text(value)),
            "time" => bytes(&mut out, 4, &time(value)),
            "fieldsType" => string(&mut out, 6, text(value)),
            "fieldsV1" => {
                let mut raw = Vec::new();
                bytes(&mut raw, 1, value.to_string().as_bytes());
                bytes(&mut out, 7, &raw);
            }
            "subresource" => string(&mut out, 8, text(value)),
            other => unknown("ManagedFieldsEntry", other),
        }
    }
    out
}

fn service_spec(spec: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(spec, "ServiceSpec") {
        match key.as_str() {
            "ports" => {
                for port in array(value) {
                    bytes(&mut out, 1, &service_port(port));
                }
            }
            "selector" => map(&mut out, 2, value),
            "clusterIP" => string(&mut out, 3, text(value)),
            "type" => string(&mut out, 4, text(value)),
            "externalIPs" => strings(&mut out, 5, value),
            "sessionAffinity" => string(&mut out, 7, text(value)),
            "loadBalancerIP" => string(&mut out, 8, text(value)),
            "loadBalancerSourceRanges" => strings(&mut out, 9, value),
            "externalName" => string(&mut out, 10, text(value)),
            "externalTrafficPolicy" => string(&mut out, 11, text(value)),
            "healthCheckNodePort" => varint_field(&mut out, 12, number(value) as u64),
            "publishNotReadyAddresses" => boolean(&mut out, 13, value),
            "sessionAffinityConfig" => {
                let mut config = Vec::new();
                if let Some(timeout) = value["clientIP"].get("timeoutSeconds") {
                    let mut client_ip = Vec::new();
                    varint_field(&mut client_ip, 1, number(timeout) as u64);
                    bytes(&mut config, 1, &client_ip);
                }
                bytes(&mut out, 14, &config);
            }
            "ipFamilyPolicy" => string(&mut out, 17, text(value)),
            "clusterIPs" => strings(&mut out, 18, value),
            "ipFamilies" => strings(&mut out, 19, value),
            "allocateLoadBalancerNodePorts" => boolean(&mut out, 20, value),
            "loadBalancerClass" => string(&mut out, 21, text(value)),
            "internalTrafficPolicy" => string(&mut out, 22, text(value)),
            "trafficDistribution" => string(&mut out, 23, text(value)),
            other => unknown("ServiceSpec", other),
        }
    }
    out
}

fn service_port(port: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(port, "ServicePort") {
        match key.as_str() {
            "name" => string(&mut out, 1, text(value)),
            "protocol" => string(&mut out, 2, text(value)),
            "port" => varint_field(&mut out, 3, number(value) as u64),
            "targetPort" => {
                let mut target = Vec::new();
                match value {
                    Value::String(name) => {
                        varint_field(&mut target, 1, 1);
                        string(&mut target, 3, name);
                    }
                    other => {
                        varint_field(&mut target, 1, 0);
                        varint_field(&mut target, 2, number(other) as u64);
                    }
                }
                bytes(&mut out, 4, &target);
            }
            "nodePort" => varint_field(&mut out, 5, number(value) as u64),
            "appProtocol" => string(&mut out, 6, text(value)),
            other => unknown("ServicePort", other),
        }
    }
    out
}

fn service_status(status: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(status, "ServiceStatus") {
        match key.as_str() {
            "loadBalancer" => {
                let mut load_balancer = Vec::new();
                for ingress in value.get("ingress").map(array).unwrap_or_default() {
                    let mut entry = Vec::new();
                    for (key, value) in fields(ingress, "LoadBalancerIngress") {
                        match key.as_str() {
                            "ip" => string(&mut entry, 1, text(value)),
                            "hostname" => string(&mut entry, 2, text(value)),
                            "ipMode" => string(&mut entry, 3, text(value)),
                            "ports" => {
                                for port in array(value) {
                                    let mut status = Vec::new();
                                    varint_field(&mut status, 1, number(&port["port"]) as u64);
                                    string(&mut status, 2, port["protocol"].as_str().unwrap_or(""));
                                    bytes(&mut entry, 4, &status);
                                }
                            }
                            other => unknown("LoadBalancerIngress", other),
                        }
                    }
                    bytes(&mut load_balancer, 1, &entry);
                }
                bytes(&mut out, 1, &load_balancer);
            }
            "conditions" => {
                for condition in array(value) {
                    let mut encoded = Vec::new();
                    for (key, value) in fields(condition, "Condition") {
                        match key.as_str() {
                            "type" => string(&mut encoded, 1, text(value)),
                            "status" => string(&mut encoded, 2, text(value)),
                            "observedGeneration" => {
                                varint_field(&mut encoded, 3, number(value) as u64)
                            }
                            "lastTransitionTime" => bytes(&mut encoded, 4, &time(value)),
                            "reason" => string(&mut encoded, 5, text(value)),
                            "message" => string(&mut encoded, 6, text(value)),
                            other => unknown("Condition", other),
                        }
                    }
                    bytes(&mut out, 2, &encoded);
                }
            }
            other => unknown("ServiceStatus", other),
        }
    }
    out
}

fn slice_endpoint(endpoint: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(endpoint, "Endpoint") {
        match key.as_str() {
            "addresses" => strings(&mut out, 1, value),
            "conditions" => {
                let mut conditions = Vec::new();
                for (key, value) in fields(value, "EndpointConditions") {
                    let number = match key.as_str() {
                        "ready" => 1,
                        "serving" => 2,
                        "terminating" => 3,
                        other => unknown("EndpointConditions", other),
                    };
                    boolean(&mut conditions, number, value);
                }
                bytes(&mut out, 2, &conditions);
            }
            "hostname" => string(&mut out, 3, text(value)),
            "targetRef" => {
                let mut reference = Vec::new();
                for (key, value) in fields(value, "ObjectReference") {
                    let number = match key.as_str() {
                        "kind" => 1,
                        "namespace" => 2,
                        "name" => 3,
                        "uid" => 4,
                        "apiVersion" => 5,
                        "resourceVersion" => 6,
                        "fieldPath" => 7,
                        other => unknown("ObjectReference", other),
                    };
                    string(&mut reference, number, text(value));
                }
                bytes(&mut out, 4, &reference);
            }
            "deprecatedTopology" => map(&mut out, 5, value),
            "nodeName" => string(&mut out, 6, text(value)),
            "zone" => string(&mut out, 7, text(value)),
            "hints" => {
                let mut hints = Vec::new();
                for (key, value) in fields(value, "EndpointHints") {
                    let number = match key.as_str() {
                        "forZones" => 1,
                        "forNodes" => 2,
                        other => unknown("EndpointHints", other),
                    };
                    for entry in array(value) {
                        let mut named = Vec::new();
                        string(&mut named, 1, entry["name"].as_str().unwrap_or(""));
                        bytes(&mut hints, number, &named);
                    }
                }
                bytes(&mut out, 8, &hints);
            }
            other => unknown("Endpoint", other),
        }
    }
    out
}

fn endpoint_port(port: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields(port, "EndpointPort") {
        match key.as_str() {
            "name" => string(&mut out, 1, text(value)),
            "protocol" => string(&mut out, 2, text(value)),
            "port" => varint_field(&mut out, 3, number(value) as u64),
            "appProtocol" => string(&mut out, 4, text(value)),
            other => unknown("EndpointPort", other),
        }
    }
    out
}

/// `metav1.Time`: seconds since the epoch of an RFC 3339 UTC time (`2026-01-01T00:00:00Z`).
fn time(value: &Value) -> Vec<u8> {
    let text = text(value);
    let parse = |range: std::ops::Range<usize>| -> i64 {
        text.get(range)
            .and_then(|digits| digits.parse().ok())
            .unwrap_or_else(|| panic!("the double's protobuf encoder: time {text:?}"))
    };
    let (year, month, day) = (parse(0..4), parse(5..7), parse(8..10));
    let (hour, minute, second) = (parse(11..13), parse(14..16), parse(17..19));
    // Days from the civil date (proleptic Gregorian), March-based years.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let mut out = Vec::new();
    varint_field(
        &mut out,
        1,
        (days * 86_400 + hour * 3600 + minute * 60 + second) as u64,
    );
    out
}

fn fields<'a>(value: &'a Value, message: &str) -> &'a Map<String, Value> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("the double's protobuf encoder: {message} is not an object"))
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or("")
}

fn number(value: &Value) -> i64 {
    value.as_i64().unwrap_or(0)
}

fn unknown(message: &str, field: &str) -> ! {
    panic!("the double's protobuf encoder does not know {message}.{field}")
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_field(out: &mut Vec<u8>, number: u32, value: u64) {
    varint(out, u64::from(number) << 3);
    varint(out, value);
}

fn bytes(out: &mut Vec<u8>, number: u32, value: &[u8]) {
    varint(out, (u64::from(number) << 3) | 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn string(out: &mut Vec<u8>, number: u32, value: &str) {
    bytes(out, number, value.as_bytes());
}

fn strings(out: &mut Vec<u8>, number: u32, value: &Value) {
    for entry in array(value) {
        string(out, number, text(entry));
    }
}

fn boolean(out: &mut Vec<u8>, number: u32, value: &Value) {
    varint_field(out, number, u64::from(value.as_bool().unwrap_or(false)));
}

/// A `map<string, string>`: one entry message (key 1, value 2) per pair, in key order.
fn map(out: &mut Vec<u8>, number: u32, value: &Value) {
    for (key, entry) in value.as_object().into_iter().flatten() {
        let mut pair = Vec::new();
        string(&mut pair, 1, key);
        string(&mut pair, 2, text(entry));
        bytes(out, number, &pair);
    }
}

/// A reader of the wire format, for tests: enough to take apart what the encoders write.
#[cfg(test)]
pub(crate) mod wire {
    /// One field's value: a varint, or length-delimited bytes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Field<'a> {
        Varint(u64),
        Bytes(&'a [u8]),
    }

    fn varint(buf: &[u8], pos: &mut usize) -> u64 {
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let byte = buf[*pos];
            *pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return value;
            }
        }
        panic!("a varint longer than 10 bytes");
    }

    /// Every field of the message `buf`, in order: (number, value). Panics on a wire type
    /// other than varint and length-delimited, or on a truncated message.
    pub(crate) fn fields(buf: &[u8]) -> Vec<(u64, Field<'_>)> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < buf.len() {
            let tag = varint(buf, &mut pos);
            let value = match tag & 7 {
                0 => Field::Varint(varint(buf, &mut pos)),
                2 => {
                    let len = varint(buf, &mut pos) as usize;
                    let value = &buf[pos..pos + len];
                    pos += len;
                    Field::Bytes(value)
                }
                other => panic!("wire type {other}"),
            };
            out.push((tag >> 3, value));
        }
        out
    }

    /// The bytes of every field `number` of `buf`.
    pub(crate) fn all(buf: &[u8], number: u64) -> Vec<&[u8]> {
        fields(buf)
            .into_iter()
            .filter(|(n, _)| *n == number)
            .map(|(_, value)| match value {
                Field::Bytes(bytes) => bytes,
                Field::Varint(_) => panic!("field {number} is a varint"),
            })
            .collect()
    }

    /// The bytes of the one field `number` of `buf`.
    pub(crate) fn one(buf: &[u8], number: u64) -> &[u8] {
        match all(buf, number).as_slice() {
            [value] => value,
            other => panic!("field {number} occurs {} times", other.len()),
        }
    }

    /// The text of the one field `number` of `buf`.
    pub(crate) fn text(buf: &[u8], number: u64) -> &str {
        std::str::from_utf8(one(buf, number)).expect("UTF-8")
    }

    /// The varint field `number` of `buf`.
    pub(crate) fn number(buf: &[u8], number: u64) -> u64 {
        let values: Vec<u64> = fields(buf)
            .into_iter()
            .filter(|(n, _)| *n == number)
            .map(|(_, value)| match value {
                Field::Varint(value) => value,
                Field::Bytes(_) => panic!("field {number} is not a varint"),
            })
            .collect();
        match values.as_slice() {
            [value] => *value,
            other => panic!("varint {number} occurs {} times", other.len()),
        }
    }

    /// A watch event taken apart: its type, and its object's apiVersion, kind and message.
    #[derive(Debug)]
    pub(crate) struct Event<'a> {
        pub event_type: &'a str,
        pub api_version: &'a str,
        pub kind: &'a str,
        pub message: &'a [u8],
    }

    /// The first frame of `buf`, if whole, and the bytes it takes (prefix included).
    pub(crate) fn frame(buf: &[u8]) -> Option<(Event<'_>, usize)> {
        let length = u32::from_be_bytes(buf.get(..4)?.try_into().expect("4 bytes")) as usize;
        let event = buf.get(4..4 + length)?;
        let body = one(one(event, 2), 1);
        let unknown = body.strip_prefix(b"k8s\0").expect("the magic");
        let type_meta = one(unknown, 1);
        assert_eq!(text(unknown, 3), "", "contentEncoding");
        assert_eq!(text(unknown, 4), "", "contentType");
        let event = Event {
            event_type: text(event, 1),
            api_version: text(type_meta, 1),
            kind: text(type_meta, 2),
            message: one(unknown, 2),
        };
        Some((event, 4 + length))
    }

    /// The annotations of an ObjectMeta message, as (key, value).
    pub(crate) fn annotations(meta: &[u8]) -> Vec<(&str, &str)> {
        all(meta, 12)
            .into_iter()
            .map(|pair| (text(pair, 1), text(pair, 2)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{self, Field};
    use super::*;
    use serde_json::json;

    fn service_json() -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "default", "resourceVersion": "7"},
               "spec": {"clusterIP": "10.96.0.10", "type": "ClusterIP",
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP",
                                   "targetPort": 8080}]}})
    }

    #[test]
    fn a_frame_appended_in_place_equals_the_one_built_in_parts() {
        let service = service(&service_json());
        // Lengths on both sides of every varint width a frame's nested lengths cross.
        let mut messages = vec![Vec::new(), service];
        messages.extend([100, 127, 128, 16_300, 16_384, 200_000].map(|n| vec![0x5a; n]));
        for message in &messages {
            for (event_type, api_version, kind) in [
                ("ADDED", "v1", "Service"),
                ("MODIFIED", "discovery.k8s.io/v1", "EndpointSlice"),
            ] {
                let mut out = b"before".to_vec();
                append_watch_frame(&mut out, event_type, api_version, kind, message);
                let built = watch_frame(event_type, &object_body(api_version, kind, message));
                assert_eq!(&out[..6], b"before");
                assert_eq!(out[6..], built[..], "{} bytes, {kind}", message.len());
            }
        }
    }

    #[test]
    fn a_frame_is_a_length_then_a_watch_event_of_the_wrapped_object() {
        let message = service(&service_json());
        let frame = watch_frame("ADDED", &object_body("v1", "Service", &message));
        let length = u32::from_be_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        assert_eq!(length, frame.len() - 4);
        // WatchEvent: exactly type then object.
        let fields = wire::fields(&frame[4..]);
        assert_eq!(fields.len(), 2);
        assert_eq!(fields[0], (1, Field::Bytes(b"ADDED")));
        let (event, taken) = wire::frame(&frame).expect("a whole frame");
        assert_eq!(taken, frame.len());
        assert_eq!(event.event_type, "ADDED");
        assert_eq!((event.api_version, event.kind), ("v1", "Service"));
        assert_eq!(event.message, message.as_slice());
        let meta = wire::one(event.message, 1);
        assert_eq!(wire::text(meta, 1), "web");
        assert_eq!(wire::text(meta, 3), "default");
        assert_eq!(wire::text(meta, 6), "7");
        // A frame cut short is not whole.
        assert!(wire::frame(&frame[..frame.len() - 1]).is_none());
        assert!(wire::frame(&frame[..3]).is_none());
    }

    #[test]
    fn a_list_body_wraps_the_list_as_an_object_body_does() {
        let message = service(&service_json());
        let list = list_body("v1", "ServiceList", "9", Some("default/web"), &[&message]);
        let unknown = list.strip_prefix(b"k8s\0").expect("the magic");
        let type_meta = wire::one(unknown, 1);
        assert_eq!(wire::text(type_meta, 2), "ServiceList");
        let list_message = wire::one(unknown, 2);
        assert_eq!(wire::text(wire::one(list_message, 1), 2), "9");
        assert_eq!(wire::text(wire::one(list_message, 1), 3), "default/web");
        assert_eq!(wire::all(list_message, 2), vec![message.as_slice()]);
    }

    #[test]
    fn the_end_bookmark_holds_the_resource_version_and_the_annotation() {
        let body = object_body(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            &bookmark("123", true),
        );
        let frame = watch_frame("BOOKMARK", &body);
        let (event, _) = wire::frame(&frame).expect("a whole frame");
        assert_eq!(event.event_type, "BOOKMARK");
        assert_eq!(
            (event.api_version, event.kind),
            ("discovery.k8s.io/v1", "EndpointSlice")
        );
        // Metadata only.
        assert_eq!(wire::fields(event.message).len(), 1);
        let meta = wire::one(event.message, 1);
        assert_eq!(wire::text(meta, 6), "123");
        assert_eq!(wire::text(meta, 1), "");
        assert_eq!(wire::annotations(meta), vec![(INITIAL_EVENTS_END, "true")]);
        // A bookmark that ends nothing has no annotation.
        let meta = wire::one(&bookmark("124", false), 1).to_vec();
        assert_eq!(wire::text(&meta, 6), "124");
        assert!(wire::annotations(&meta).is_empty());
    }

    #[test]
    fn an_error_event_holds_a_status() {
        let frame = watch_frame(
            "ERROR",
            &status_body(410, "Expired", "too old resource version"),
        );
        let (event, _) = wire::frame(&frame).expect("a whole frame");
        assert_eq!(event.event_type, "ERROR");
        assert_eq!((event.api_version, event.kind), ("v1", "Status"));
        let status = event.message;
        assert_eq!(wire::one(status, 1), b"");
        assert_eq!(wire::text(status, 2), "Failure");
        assert_eq!(wire::text(status, 3), "too old resource version");
        assert_eq!(wire::text(status, 4), "Expired");
        assert_eq!(wire::number(status, 6), 410);
        assert!(wire::all(status, 5).is_empty(), "no details");
        // A code over 127 takes two varint bytes.
        let status = status_body(500, "InternalError", "x");
        let unknown = status.strip_prefix(b"k8s\0").expect("the magic");
        assert_eq!(wire::number(wire::one(unknown, 2), 6), 500);
    }
}
