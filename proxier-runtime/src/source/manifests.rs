//! Parsing Kubernetes manifests as `kubectl get -o yaml` writes them: one or more YAML
//! documents separated by `---`, each an object or a `kind: List` with `items`. A document
//! that cannot be read is reported and skipped; the others are kept.

use std::fmt;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

/// Where an object sits in the file: document index (from 0) and, inside a list, item index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestPosition {
    /// Index of the YAML document in the file, from 0.
    pub document: usize,
    /// Index in the document's `items`, when the document is a list.
    pub item: Option<usize>,
}

impl fmt::Display for ManifestPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.item {
            Some(item) => write!(f, "document {} item {}", self.document, item),
            None => write!(f, "document {}", self.document),
        }
    }
}

/// A problem with one document or list item. The rest of the file is still used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestProblem {
    /// Not valid YAML.
    Syntax {
        /// Where.
        at: ManifestPosition,
        /// The parser's message.
        message: String,
    },
    /// An object of a supported kind that does not match its schema.
    Invalid {
        /// Where.
        at: ManifestPosition,
        /// Kind of the object.
        kind: String,
        /// Its name (or `<unnamed>`).
        name: String,
        /// The parser's message.
        message: String,
    },
    /// A kind ipvs-proxier does not use (Deployment, ConfigMap, ...); skipped.
    UnknownKind {
        /// Where.
        at: ManifestPosition,
        /// apiVersion as written.
        api_version: String,
        /// kind as written.
        kind: String,
        /// Its name (or `<unnamed>`).
        name: String,
    },
}

impl ManifestProblem {
    /// Whether this is only an object ipvs-proxier does not use, not an error.
    pub fn is_unknown_kind(&self) -> bool {
        matches!(self, ManifestProblem::UnknownKind { .. })
    }
}

impl fmt::Display for ManifestProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ManifestProblem::Syntax { at, message } => write!(f, "{at}: invalid YAML: {message}"),
            ManifestProblem::Invalid {
                at,
                kind,
                name,
                message,
            } => write!(f, "{at}: {kind} {name:?} is invalid: {message}"),
            ManifestProblem::UnknownKind {
                at,
                api_version,
                kind,
                name,
            } => write!(
                f,
                "{at}: skipping {api_version} {kind} {name:?} (not used by ipvs-proxier)"
            ),
        }
    }
}

/// The objects found in a file, in file order, and the problems met.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// Services.
    pub services: Vec<Service>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Documents or items that were skipped, and why.
    pub problems: Vec<ManifestProblem>,
}

/// Splits a YAML stream into its documents' text at `---` lines (a `...` line ends a document).
/// Splitting before parsing keeps a syntax error inside its own document.
pub fn split_documents(text: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut seen_marker_or_content = false;
    for line in text.lines() {
        let is_start = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if is_start {
            if seen_marker_or_content {
                docs.push(std::mem::take(&mut current));
            }
            seen_marker_or_content = true;
            // Content after the marker on the same line belongs to the new document.
            current.push_str(line[3..].trim_start());
            current.push('\n');
            continue;
        }
        if line == "..." {
            docs.push(std::mem::take(&mut current));
            seen_marker_or_content = false;
            continue;
        }
        if !line.trim().is_empty() && !line.trim_start().starts_with('#') {
            seen_marker_or_content = true;
        }
        current.push_str(line);
        current.push('\n');
    }
    if seen_marker_or_content {
        docs.push(current);
    }
    docs
}

fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn object_name(value: &Value) -> String {
    value
        .get("metadata")
        .and_then(|m| {
            let name = m.get("name").and_then(Value::as_str)?;
            Some(match m.get("namespace").and_then(Value::as_str) {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_owned(),
            })
        })
        .unwrap_or_else(|| "<unnamed>".to_owned())
}

fn decode<T: DeserializeOwned>(
    value: Value,
    at: ManifestPosition,
    kind: &str,
    name: &str,
    problems: &mut Vec<ManifestProblem>,
) -> Option<T> {
    match serde_yaml::from_value::<T>(value) {
        Ok(obj) => Some(obj),
        Err(e) => {
            problems.push(ManifestProblem::Invalid {
                at,
                kind: kind.to_owned(),
                name: name.to_owned(),
                message: e.to_string(),
            });
            None
        }
    }
}

/// Namespaced objects written without a namespace land in `default`, as `kubectl apply` does.
fn default_namespace(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".to_owned());
    }
}

impl Manifests {
    fn add_object(&mut self, value: Value, at: ManifestPosition) {
        let api_version = str_field(&value, "apiVersion").unwrap_or("").to_owned();
        let kind = str_field(&value, "kind").unwrap_or("").to_owned();
        let name = object_name(&value);
        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Service") => {
                if let Some(mut svc) =
                    decode::<Service>(value, at, &kind, &name, &mut self.problems)
                {
                    default_namespace(&mut svc.metadata);
                    self.services.push(svc);
                }
            }
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                if let Some(mut slice) =
                    decode::<EndpointSlice>(value, at, &kind, &name, &mut self.problems)
                {
                    default_namespace(&mut slice.metadata);
                    self.endpoint_slices.push(slice);
                }
            }
            ("v1", "Node") => {
                if let Some(node) = decode::<Node>(value, at, &kind, &name, &mut self.problems) {
                    self.nodes.push(node);
                }
            }
            _ => self.problems.push(ManifestProblem::UnknownKind {
                at,
                api_version,
                kind,
                name,
            }),
        }
    }
}

impl Manifests {
    fn extend(&mut self, other: Manifests) {
        self.services.extend(other.services);
        self.endpoint_slices.extend(other.endpoint_slices);
        self.nodes.extend(other.nodes);
        self.problems.extend(other.problems);
    }
}

/// Parses a multi-document YAML text. Never fails as a whole: bad documents are listed in
/// [`Manifests::problems`].
pub fn parse_manifests(text: &str) -> Manifests {
    let mut out = Manifests::default();
    for (document, doc_text) in split_documents(text).iter().enumerate() {
        out.extend(parse_document(doc_text, document));
    }
    out
}

/// Parses the documents at `indices`, spread over the machine's cores; problems carry
/// their document's index.
pub fn parse_in_parallel(documents: &[String], indices: &[usize]) -> Vec<(usize, Manifests)> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    if threads < 2 || indices.len() < 64 {
        return indices
            .iter()
            .map(|&i| (i, parse_document(&documents[i], i)))
            .collect();
    }
    let chunk = indices.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = indices
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|&i| (i, parse_document(&documents[i], i)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| match worker.join() {
                Ok(parsed) => parsed,
                // A parser panic is a bug; surface it where it happened.
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

/// Parses one YAML document of a file (the `document`-th, for problem positions).
fn parse_document(doc_text: &str, document: usize) -> Manifests {
    let mut out = Manifests::default();
    let at = ManifestPosition {
        document,
        item: None,
    };
    let value: Value = match serde_yaml::from_str(doc_text) {
        Ok(v) => v,
        Err(e) => {
            out.problems.push(ManifestProblem::Syntax {
                at,
                message: e.to_string(),
            });
            return out;
        }
    };
    if value.is_null() {
        return out;
    }
    let kind = str_field(&value, "kind").unwrap_or("");
    let is_list = kind == "List" || (kind.ends_with("List") && value.get("items").is_some());
    if is_list {
        let kind = kind.to_owned();
        let name = object_name(&value);
        // A list's items are taken out by value: each is decoded once, never copied.
        let items = match value {
            Value::Mapping(mut map) => map.remove("items"),
            _ => None,
        };
        match items {
            Some(Value::Sequence(items)) => {
                for (item, obj) in items.into_iter().enumerate() {
                    out.add_object(
                        obj,
                        ManifestPosition {
                            document,
                            item: Some(item),
                        },
                    );
                }
            }
            Some(Value::Null) | None => {}
            Some(_) => out.problems.push(ManifestProblem::Invalid {
                at,
                kind,
                name,
                message: "items is not a list".to_owned(),
            }),
        }
    } else {
        out.add_object(value, at);
    }
    out
}
