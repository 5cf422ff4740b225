//! `--dry-run`: the engine on proxier-core's in-memory backends instead of the kernel.
//!
//! A dry run prints the plan once and exits (`terraform plan`); with `--watch` it keeps
//! following its source and, after the first plan, prints only what each sync changed:
//! virtual servers and real servers added, removed or changed, addresses bound or unbound
//! on the dummy link, and the writes a real sync would make. `--output` picks a table for
//! people or JSON / YAML documents for programs, whose schema is written down in
//! `docs/dry-run.md` ([`PlanDocument`], [`PlanChangeDocument`]).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write;
use std::net::IpAddr;

use proxier_core::backend::AddressBackend;
use proxier_core::engine::driver::{SyncObserver, SyncOutcome};
use proxier_core::{
    Desired, MemoryProxier, ServicePortName, SyncKind, VirtualServer, VirtualServerKey,
    VirtualServerRole,
};
use serde::{Deserialize, Serialize};

use crate::cli::OutputFormat;
use crate::sync_observer::DaemonObserver;

/// The `apiVersion` of every dry-run document.
pub const DOCUMENT_API_VERSION: &str = "ipvs-proxier.dry-run/v1";

/// How many bound addresses the table lists before it summarises the rest.
pub const ADDRESSES_SHOWN: usize = 8;

/// How many real servers one table row lists before it summarises the rest.
pub const REAL_SERVERS_SHOWN: usize = 8;

fn role_name(role: VirtualServerRole) -> &'static str {
    match role {
        VirtualServerRole::ClusterIp => "ClusterIP",
        VirtualServerRole::NodePort => "NodePort",
        VirtualServerRole::ExternalIp => "ExternalIP",
        VirtualServerRole::LoadBalancer => "LoadBalancer",
    }
}

/// One real server of a virtual server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RealServerDoc {
    /// Endpoint address.
    pub address: IpAddr,
    /// Endpoint port.
    pub port: u16,
    /// IPVS weight (0: draining, kept for established connections only).
    pub weight: u32,
}

/// One IPVS virtual server and its real servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualServerDoc {
    /// The Service port it implements: `namespace/name[:port]/PROTOCOL`.
    pub service_port: String,
    /// `ClusterIP`, `NodePort`, `ExternalIP` or `LoadBalancer`.
    pub role: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// Virtual address.
    pub address: IpAddr,
    /// Virtual port.
    pub port: u16,
    /// IPVS scheduler name (`rr`, `wrr`, `mh`, ...).
    pub scheduler: String,
    /// ClientIP session affinity: the IPVS persistence timeout in seconds, or `null`.
    pub persistence_timeout_seconds: Option<u32>,
    /// Whether the scheduler hashes the source port too (`mh`/`sh` flag).
    pub hash_source_port: bool,
    /// Real servers, ordered by address and port.
    pub real_servers: Vec<RealServerDoc>,
}

impl VirtualServerDoc {
    fn of(name: &ServicePortName, key: &VirtualServerKey, vs: &VirtualServer) -> Self {
        VirtualServerDoc {
            service_port: name.to_string(),
            role: role_name(vs.role).to_owned(),
            protocol: key.protocol.to_string(),
            address: key.address,
            port: key.port,
            scheduler: vs.scheduler.to_string(),
            persistence_timeout_seconds: vs.persistence_timeout,
            hash_source_port: vs.hash_source_port,
            real_servers: vs
                .real_servers
                .iter()
                .map(|(rs, settings)| RealServerDoc {
                    address: rs.address,
                    port: rs.port,
                    weight: settings.weight,
                })
                .collect(),
        }
    }

    fn key(&self) -> String {
        match self.address {
            IpAddr::V4(a) => format!("{} {}:{}", self.protocol, a, self.port),
            IpAddr::V6(a) => format!("{} [{}]:{}", self.protocol, a, self.port),
        }
    }
}

/// The node the plan is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeDoc {
    /// Node name (`--hostname-override`).
    pub name: String,
    /// Whether the source held a Node object of that name (without one there are no
    /// NodePorts: the node's addresses are unknown).
    pub node_object: bool,
    /// The node's primary IPs (from its Node object).
    #[serde(rename = "primaryIPs")]
    pub primary_ips: Vec<IpAddr>,
}

/// What a real sync of this plan would write to the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WritesDoc {
    /// IPVS and address writes (adds, updates, deletes).
    pub total: usize,
    /// Of those, deletes.
    pub deletes: usize,
    /// Whether the nftables tables would be written.
    pub nftables: bool,
}

/// Counts of the source and the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SummaryDoc {
    /// Services planned.
    pub services: usize,
    /// Their ports.
    pub service_ports: usize,
    /// EndpointSlices of those Services.
    pub endpoint_slices: usize,
    /// Endpoints in them.
    pub endpoints: usize,
    /// Virtual servers in the plan.
    pub virtual_servers: usize,
    /// Real servers in the plan.
    pub real_servers: usize,
    /// Addresses bound on the dummy link.
    pub bound_addresses: usize,
}

/// The whole plan (`kind: Plan`): what `--dry-run` prints, and the first document of
/// `--dry-run --watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanDocument {
    /// [`DOCUMENT_API_VERSION`].
    pub api_version: String,
    /// `Plan`.
    pub kind: String,
    /// `full` or `incremental`.
    pub sync: String,
    /// The node.
    pub node: NodeDoc,
    /// The dummy link VIPs are bound on.
    pub dummy_interface: String,
    /// Counts.
    pub summary: SummaryDoc,
    /// Writes a real sync would make; `null` when the plan could not be applied.
    pub writes: Option<WritesDoc>,
    /// Why the plan could not be applied in memory, or `null`.
    pub error: Option<String>,
    /// Every virtual server, ordered by Service port then address.
    pub virtual_servers: Vec<VirtualServerDoc>,
    /// Every address bound on the dummy link, ordered.
    pub bound_addresses: Vec<IpAddr>,
}

/// A virtual server whose settings or real servers changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualServerChangeDoc {
    /// Before the sync.
    pub before: VirtualServerDoc,
    /// After it.
    pub after: VirtualServerDoc,
}

/// Virtual servers that came, went or changed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualServerChangesDoc {
    /// New virtual servers.
    pub added: Vec<VirtualServerDoc>,
    /// Virtual servers no longer planned.
    pub removed: Vec<VirtualServerDoc>,
    /// Virtual servers with other settings or real servers.
    pub changed: Vec<VirtualServerChangeDoc>,
}

/// Addresses bound or unbound on the dummy link.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AddressChangesDoc {
    /// Newly bound.
    pub added: Vec<IpAddr>,
    /// No longer bound.
    pub removed: Vec<IpAddr>,
}

/// What one sync changed (`kind: PlanChange`): every document of `--dry-run --watch` after
/// the first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanChangeDocument {
    /// [`DOCUMENT_API_VERSION`].
    pub api_version: String,
    /// `PlanChange`.
    pub kind: String,
    /// `full` or `incremental`.
    pub sync: String,
    /// Counts after the sync.
    pub summary: SummaryDoc,
    /// Writes a real sync would make; `null` when the plan could not be applied.
    pub writes: Option<WritesDoc>,
    /// Why the plan could not be applied in memory, or `null`.
    pub error: Option<String>,
    /// Virtual server changes.
    pub virtual_servers: VirtualServerChangesDoc,
    /// Dummy-link address changes.
    pub bound_addresses: AddressChangesDoc,
}

impl PlanChangeDocument {
    /// Whether the plan stayed the same.
    pub fn is_empty(&self) -> bool {
        self.virtual_servers == VirtualServerChangesDoc::default()
            && self.bound_addresses == AddressChangesDoc::default()
    }
}

fn sync_name(kind: SyncKind) -> &'static str {
    match kind {
        SyncKind::Full => "full",
        SyncKind::Incremental => "incremental",
    }
}

fn link_name(proxier: &MemoryProxier) -> String {
    proxier
        .reconciler()
        .address_backend()
        .link_name()
        .to_owned()
}

fn summary_of(proxier: &MemoryProxier) -> SummaryDoc {
    let state = proxier.state();
    let service_ports: usize = state.services().map(|s| s.ports.len()).sum();
    let slices: Vec<_> = state
        .services()
        .flat_map(|s| state.slices_of(&s.name))
        .collect();
    let endpoints: usize = slices.iter().map(|s| s.endpoints.len()).sum();
    let size = proxier.plan_size();
    SummaryDoc {
        services: state.service_count(),
        service_ports,
        endpoint_slices: state.slice_count(),
        endpoints,
        virtual_servers: size.virtual_servers,
        real_servers: size.real_servers,
        bound_addresses: size.bound_addresses,
    }
}

fn writes_of(outcome: &SyncOutcome<'_>) -> (Option<WritesDoc>, Option<String>) {
    match outcome.result {
        Ok(report) => (
            Some(WritesDoc {
                total: report.ipvs.writes,
                deletes: report.ipvs.deletes,
                nftables: report.netfilter_written,
            }),
            None,
        ),
        Err(error) => (None, Some(error.to_string())),
    }
}

/// The plan of `proxier` after the sync of `outcome`, as a document.
pub fn plan_document(proxier: &MemoryProxier, outcome: &SyncOutcome<'_>) -> PlanDocument {
    let (writes, error) = writes_of(outcome);
    PlanDocument {
        api_version: DOCUMENT_API_VERSION.to_owned(),
        kind: "Plan".to_owned(),
        sync: sync_name(outcome.kind).to_owned(),
        node: NodeDoc {
            name: proxier.node().name.clone(),
            node_object: proxier.state().node().is_some(),
            primary_ips: proxier.node().primary_ips.clone(),
        },
        dummy_interface: link_name(proxier),
        summary: summary_of(proxier),
        writes,
        error,
        virtual_servers: proxier
            .desired()
            .virtual_servers()
            .map(|(name, key, vs)| VirtualServerDoc::of(name, key, vs))
            .collect(),
        bound_addresses: proxier.desired().bound_addresses().into_iter().collect(),
    }
}

/// What changed from `before` to the plan of `proxier` after the sync of `outcome`.
pub fn change_document(
    before: &Desired,
    proxier: &MemoryProxier,
    outcome: &SyncOutcome<'_>,
) -> PlanChangeDocument {
    let after = proxier.desired();
    let (writes, error) = writes_of(outcome);
    let mut virtual_servers = VirtualServerChangesDoc::default();
    // Both sides are ordered by Service port then key: one merge pass.
    let mut old = before.virtual_servers().peekable();
    let mut new = after.virtual_servers().peekable();
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((on, ok, _)), Some((nn, nk, _))) => (on, ok).cmp(&(nn, nk)),
        };
        match order {
            std::cmp::Ordering::Less => {
                if let Some((n, k, vs)) = old.next() {
                    virtual_servers.removed.push(VirtualServerDoc::of(n, k, vs));
                }
            }
            std::cmp::Ordering::Greater => {
                if let Some((n, k, vs)) = new.next() {
                    virtual_servers.added.push(VirtualServerDoc::of(n, k, vs));
                }
            }
            std::cmp::Ordering::Equal => {
                if let (Some((on, ok, ovs)), Some((nn, nk, nvs))) = (old.next(), new.next())
                    && ovs != nvs
                {
                    virtual_servers.changed.push(VirtualServerChangeDoc {
                        before: VirtualServerDoc::of(on, ok, ovs),
                        after: VirtualServerDoc::of(nn, nk, nvs),
                    });
                }
            }
        }
    }
    let old_bound = before.bound_addresses();
    let new_bound = after.bound_addresses();
    PlanChangeDocument {
        api_version: DOCUMENT_API_VERSION.to_owned(),
        kind: "PlanChange".to_owned(),
        sync: sync_name(outcome.kind).to_owned(),
        summary: summary_of(proxier),
        writes,
        error,
        virtual_servers,
        bound_addresses: AddressChangesDoc {
            added: new_bound.difference(&old_bound).copied().collect(),
            removed: old_bound.difference(&new_bound).copied().collect(),
        },
    }
}

fn list_shortened<T: ToString>(items: &[T], shown: usize, more_hint: &str) -> String {
    if items.is_empty() {
        return "(none)".to_owned();
    }
    let mut text = items
        .iter()
        .take(shown)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > shown {
        let _ = write!(text, ", … {} more{more_hint}", items.len() - shown);
    }
    text
}

fn real_server_text(rs: &RealServerDoc) -> String {
    let key = match rs.address {
        IpAddr::V4(a) => format!("{a}:{}", rs.port),
        IpAddr::V6(a) => format!("[{a}]:{}", rs.port),
    };
    if rs.weight == 1 {
        key
    } else {
        format!("{key} (w{})", rs.weight)
    }
}

fn row_of(vs: &VirtualServerDoc) -> [String; 6] {
    let reals: Vec<String> = vs.real_servers.iter().map(real_server_text).collect();
    [
        vs.service_port.clone(),
        vs.role.clone(),
        vs.key(),
        vs.scheduler.clone(),
        vs.persistence_timeout_seconds
            .map_or_else(|| "-".to_owned(), |t| format!("{t}s")),
        list_shortened(&reals, REAL_SERVERS_SHOWN, ""),
    ]
}

/// Lays rows out in aligned columns (the last one unpadded), each line prefixed.
fn columns(rows: &[(String, [String; 6])]) -> String {
    let mut widths = [0usize; 6];
    for (_, row) in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for (prefix, row) in rows {
        let mut text = prefix.clone();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

fn addresses_line(dummy_interface: &str, bound: &[IpAddr]) -> String {
    if bound.len() <= 2 * ADDRESSES_SHOWN {
        format!(
            "addresses on {dummy_interface}: {}\n",
            list_shortened(bound, bound.len(), "")
        )
    } else {
        format!(
            "addresses on {dummy_interface}: {} ({}; --output json lists them all)\n",
            bound.len(),
            list_shortened(bound, ADDRESSES_SHOWN, "")
        )
    }
}

/// A table of a plan document: one row per virtual server, then the bound addresses (all of
/// them up to 16, else their count and the first few).
pub fn render_plan_table(doc: &PlanDocument) -> String {
    let header = [
        "SERVICE PORT",
        "ROLE",
        "VIRTUAL SERVER",
        "SCHED",
        "PERSIST",
        "REAL SERVERS",
    ]
    .map(str::to_owned);
    let mut rows = vec![(String::new(), header)];
    rows.extend(
        doc.virtual_servers
            .iter()
            .map(|vs| (String::new(), row_of(vs))),
    );
    let mut out = columns(&rows);
    out.push_str(&addresses_line(&doc.dummy_interface, &doc.bound_addresses));
    out
}

/// A table of the plan: one row per virtual server, then the addresses to bind.
pub fn render_plan(desired: &Desired, dummy_interface: &str) -> String {
    let doc = PlanDocument {
        api_version: DOCUMENT_API_VERSION.to_owned(),
        kind: "Plan".to_owned(),
        sync: "full".to_owned(),
        node: NodeDoc {
            name: String::new(),
            node_object: false,
            primary_ips: Vec::new(),
        },
        dummy_interface: dummy_interface.to_owned(),
        summary: SummaryDoc {
            services: 0,
            service_ports: 0,
            endpoint_slices: 0,
            endpoints: 0,
            virtual_servers: 0,
            real_servers: 0,
            bound_addresses: 0,
        },
        writes: None,
        error: None,
        virtual_servers: desired
            .virtual_servers()
            .map(|(name, key, vs)| VirtualServerDoc::of(name, key, vs))
            .collect(),
        bound_addresses: desired.bound_addresses().into_iter().collect(),
    };
    render_plan_table(&doc)
}

fn summary_line(sync: &str, summary: &SummaryDoc, node: Option<&NodeDoc>) -> String {
    let mut text = format!(
        "dry-run {sync} sync: {} services ({} ports), {} endpoint slices ({} endpoints)",
        summary.services, summary.service_ports, summary.endpoint_slices, summary.endpoints
    );
    if let Some(node) = node {
        let _ = write!(text, ", node {}", node.name);
        if !node.node_object {
            text.push_str(" (no Node object)");
        }
    }
    text.push('\n');
    text
}

fn writes_text(writes: &Option<WritesDoc>, error: &Option<String>) -> String {
    match (writes, error) {
        (Some(w), _) => format!(
            "a real sync would make {} writes ({} deletes)",
            w.total, w.deletes
        ),
        (None, Some(error)) => format!("plan could not be applied in memory: {error}"),
        (None, None) => "plan could not be applied in memory".to_owned(),
    }
}

/// The summary and table of a whole plan.
pub fn render_plan_report(doc: &PlanDocument) -> String {
    let mut text = summary_line(&doc.sync, &doc.summary, Some(&doc.node));
    match &doc.writes {
        Some(_) => {
            let _ = writeln!(
                text,
                "plan: {} virtual servers, {} real servers, {} addresses on {}; {}",
                doc.summary.virtual_servers,
                doc.summary.real_servers,
                doc.summary.bound_addresses,
                doc.dummy_interface,
                writes_text(&doc.writes, &doc.error)
            );
        }
        None => {
            let _ = writeln!(text, "{}", writes_text(&doc.writes, &doc.error));
        }
    }
    text.push_str(&render_plan_table(doc));
    text
}

/// The summary and table of one dry-run sync.
pub fn render_report(proxier: &MemoryProxier, outcome: &SyncOutcome<'_>) -> String {
    render_plan_report(&plan_document(proxier, outcome))
}

/// `--take-over-kube-proxy --dry-run`: lists what the takeover would remove from this node
/// (read only). On standard output before the plan table; on standard error with
/// `--output json|yaml`, which keep standard output one document.
pub async fn print_takeover(
    takeover: &proxier_core::takeover::KubeProxyTakeover,
    format: OutputFormat,
) {
    let text = match takeover.plan().await {
        Ok(plan) => format!("kube-proxy takeover would:\n{plan}"),
        Err(error) => format!("kube-proxy takeover: cannot read the node: {error}\n"),
    };
    if format == OutputFormat::Table {
        print!("{text}");
    } else {
        eprint!("{text}");
    }
}

/// What changed in one sync, for people: a summary line, one line per virtual server added
/// (`+`), removed (`-`) or changed (`~`, with its real servers added, removed or re-weighted
/// and its settings before and after), and the addresses bound or unbound.
pub fn render_change_report(doc: &PlanChangeDocument, dummy_interface: &str) -> String {
    let mut text = summary_line(&doc.sync, &doc.summary, None);
    let vs = &doc.virtual_servers;
    if doc.is_empty() {
        let _ = writeln!(text, "no change; {}", writes_text(&doc.writes, &doc.error));
        return text;
    }
    let _ = writeln!(
        text,
        "changes: {} virtual servers added, {} removed, {} changed; {} addresses bound, {} unbound on {dummy_interface}; {}",
        vs.added.len(),
        vs.removed.len(),
        vs.changed.len(),
        doc.bound_addresses.added.len(),
        doc.bound_addresses.removed.len(),
        writes_text(&doc.writes, &doc.error)
    );
    let mut rows: Vec<(String, [String; 6])> = Vec::new();
    rows.extend(vs.added.iter().map(|v| ("+ ".to_owned(), row_of(v))));
    rows.extend(vs.removed.iter().map(|v| ("- ".to_owned(), row_of(v))));
    for change in &vs.changed {
        let mut row = row_of(&change.after);
        row[5] = describe_change(&change.before, &change.after);
        rows.push(("~ ".to_owned(), row));
    }
    text.push_str(&columns(&rows));
    if !doc.bound_addresses.added.is_empty() {
        let _ = writeln!(
            text,
            "+ addresses on {dummy_interface}: {}",
            list_shortened(&doc.bound_addresses.added, ADDRESSES_SHOWN, "")
        );
    }
    if !doc.bound_addresses.removed.is_empty() {
        let _ = writeln!(
            text,
            "- addresses on {dummy_interface}: {}",
            list_shortened(&doc.bound_addresses.removed, ADDRESSES_SHOWN, "")
        );
    }
    text
}

fn describe_change(before: &VirtualServerDoc, after: &VirtualServerDoc) -> String {
    let mut parts: Vec<String> = Vec::new();
    if before.scheduler != after.scheduler {
        parts.push(format!(
            "scheduler {} -> {}",
            before.scheduler, after.scheduler
        ));
    }
    if before.persistence_timeout_seconds != after.persistence_timeout_seconds {
        let show = |t: Option<u32>| t.map_or_else(|| "-".to_owned(), |t| format!("{t}s"));
        parts.push(format!(
            "persistence {} -> {}",
            show(before.persistence_timeout_seconds),
            show(after.persistence_timeout_seconds)
        ));
    }
    if before.hash_source_port != after.hash_source_port {
        parts.push(format!(
            "hash source port {} -> {}",
            before.hash_source_port, after.hash_source_port
        ));
    }
    if before.role != after.role {
        parts.push(format!("role {} -> {}", before.role, after.role));
    }
    let key = |rs: &RealServerDoc| (rs.address, rs.port);
    let old: BTreeSet<(IpAddr, u16)> = before.real_servers.iter().map(key).collect();
    let new: BTreeSet<(IpAddr, u16)> = after.real_servers.iter().map(key).collect();
    let added: Vec<String> = after
        .real_servers
        .iter()
        .filter(|rs| !old.contains(&key(rs)))
        .map(real_server_text)
        .collect();
    let removed: Vec<String> = before
        .real_servers
        .iter()
        .filter(|rs| !new.contains(&key(rs)))
        .map(real_server_text)
        .collect();
    let reweighted: Vec<String> = after
        .real_servers
        .iter()
        .filter_map(|rs| {
            before
                .real_servers
                .iter()
                .find(|b| key(b) == key(rs) && b.weight != rs.weight)
                .map(|b| {
                    let mut text = real_server_text(&RealServerDoc {
                        weight: 1,
                        ..rs.clone()
                    });
                    let _ = write!(text, " w{} -> w{}", b.weight, rs.weight);
                    text
                })
        })
        .collect();
    if !added.is_empty() {
        parts.push(format!(
            "real servers +{}",
            list_shortened(&added, REAL_SERVERS_SHOWN, "")
        ));
    }
    if !removed.is_empty() {
        parts.push(format!(
            "real servers -{}",
            list_shortened(&removed, REAL_SERVERS_SHOWN, "")
        ));
    }
    if !reweighted.is_empty() {
        parts.push(format!(
            "weights {}",
            list_shortened(&reweighted, REAL_SERVERS_SHOWN, "")
        ));
    }
    parts.join("; ")
}

/// Prints every sync of an in-memory proxier (and reports it like the daemon does): the
/// first as the whole plan, later ones as what changed.
#[derive(Debug)]
pub struct DryRunObserver<W> {
    daemon: DaemonObserver,
    out: W,
    format: OutputFormat,
    /// The plan as of the last printed sync.
    previous: Option<Desired>,
    /// Whether more than one sync will be printed (JSON then goes one document a line).
    watching_flag: bool,
}

impl<W: Write> DryRunObserver<W> {
    /// Prints tables to `out`; metrics and health go through `daemon`.
    pub fn new(daemon: DaemonObserver, out: W) -> Self {
        Self::with_format(daemon, out, OutputFormat::Table)
    }

    /// Prints to `out` in `format`.
    pub fn with_format(daemon: DaemonObserver, out: W, format: OutputFormat) -> Self {
        DryRunObserver {
            daemon,
            out,
            format,
            previous: None,
            watching_flag: false,
        }
    }

    /// Marks this observer as following every sync (`--watch`): JSON documents are then
    /// written one a line.
    pub fn watching(mut self) -> Self {
        self.watching_flag = true;
        self
    }

    /// The writer (tests read what was printed).
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Prints the whole plan (`--dry-run` without `--watch`, and the first sync with it).
    pub fn print_plan(&mut self, proxier: &MemoryProxier, outcome: &SyncOutcome<'_>) {
        let doc = plan_document(proxier, outcome);
        let text = match self.format {
            OutputFormat::Table => Ok(render_plan_report(&doc)),
            OutputFormat::Json if !self.watching_flag => serde_json::to_string_pretty(&doc)
                .map(|t| t + "\n")
                .map_err(|e| e.to_string()),
            OutputFormat::Json => serde_json::to_string(&doc)
                .map(|t| t + "\n")
                .map_err(|e| e.to_string()),
            OutputFormat::Yaml => serde_yaml::to_string(&doc)
                .map(|t| format!("---\n{t}"))
                .map_err(|e| e.to_string()),
        };
        self.write(text);
        self.previous = Some(proxier.desired().clone());
    }

    /// Prints what changed since `before`, the last printed plan.
    fn print_changes(
        &mut self,
        before: Desired,
        proxier: &MemoryProxier,
        outcome: &SyncOutcome<'_>,
    ) {
        let doc = change_document(&before, proxier, outcome);
        let text = match self.format {
            OutputFormat::Table => Ok(render_change_report(&doc, &link_name(proxier))),
            OutputFormat::Json => serde_json::to_string(&doc)
                .map(|t| t + "\n")
                .map_err(|e| e.to_string()),
            OutputFormat::Yaml => serde_yaml::to_string(&doc)
                .map(|t| format!("---\n{t}"))
                .map_err(|e| e.to_string()),
        };
        self.write(text);
        self.previous = Some(if doc.is_empty() {
            before
        } else {
            proxier.desired().clone()
        });
    }

    fn write(&mut self, text: Result<String, String>) {
        let result = match text {
            Ok(text) => self
                .out
                .write_all(text.as_bytes())
                .and_then(|()| self.out.flush())
                .map_err(|e| e.to_string()),
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            tracing::error!(%error, "writing the dry-run report");
        }
    }
}

impl<W: Write> SyncObserver<MemoryProxier> for DryRunObserver<W> {
    fn queued(&mut self) {
        SyncObserver::<MemoryProxier>::queued(&mut self.daemon);
    }

    fn synced(&mut self, proxier: &MemoryProxier, outcome: &SyncOutcome<'_>) {
        self.daemon.synced(proxier, outcome);
        match self.previous.take() {
            None => self.print_plan(proxier, outcome),
            Some(before) => self.print_changes(before, proxier, outcome),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proxier_core::engine::driver::{self, DriverConfig, ProxierHandle};
    use proxier_core::model::Config;
    use proxier_core::{Backends, Change, Proxier, ProxierConfig};
    use tokio::sync::watch;

    use super::*;
    use crate::health::ProxyHealth;
    use crate::source::SourceEvent;
    use crate::source::manifests::parse_manifests;

    fn example_changes() -> Vec<Change> {
        let text = include_str!("../../examples/cluster.yaml");
        let snapshot =
            crate::source::file::snapshot_from_manifests(parse_manifests(text), "node-a");
        crate::feed::convert(&SourceEvent::Snapshot(snapshot)).changes
    }

    fn proxier() -> MemoryProxier {
        let config = ProxierConfig::new("node-a", Config::default());
        let mut proxier = Proxier::new(config, Backends::in_memory()).expect("proxier");
        for change in example_changes() {
            proxier.apply(change);
        }
        proxier
    }

    fn row<'a>(table: &'a str, service_port: &str, vip: &str) -> &'a str {
        table
            .lines()
            .find(|l| l.starts_with(service_port) && l.contains(vip))
            .unwrap_or_else(|| panic!("no row for {service_port} {vip} in:\n{table}"))
    }

    #[tokio::test]
    async fn example_cluster_plan_table() {
        let mut proxier = proxier();
        proxier.sync(SyncKind::Full).await.expect("sync");
        assert_eq!(
            proxier.node().primary_ips.len(),
            2,
            "IPv4 and IPv6 InternalIPs"
        );
        let table = render_plan(proxier.desired(), "kube-ipvs0");

        // ClusterIP with the API server behind it.
        assert!(
            row(&table, "default/kubernetes", "TCP 10.96.0.1:443").contains("192.0.2.100:6443")
        );
        // DNS over UDP and TCP.
        assert!(
            row(&table, "kube-system/kube-dns:dns/UDP", "10.96.0.10:53").contains("10.244.2.3:53")
        );
        assert!(
            row(&table, "kube-system/kube-dns:dns-tcp/TCP", "10.96.0.10:53")
                .contains("10.244.1.2:53")
        );
        // ClientIP affinity becomes persistence.
        assert!(row(&table, "shop/cart", "10.96.12.51:7070").contains("600s"));
        // NodePort on the node's address; LoadBalancer ingress.
        assert!(row(&table, "shop/web", "192.0.2.10:30080").contains("NodePort"));
        assert!(row(&table, "shop/storefront", "203.0.113.10:443").contains("LoadBalancer"));
        // eTP=Local: the load balancer VIP only has the local endpoint.
        let lb_local = row(&table, "shop/checkout", "203.0.113.11:443");
        assert!(
            lb_local.contains("10.244.1.41:8443") && !lb_local.contains("10.244.2.42"),
            "{lb_local}"
        );
        // Dual-stack: one virtual server per family.
        assert!(
            row(&table, "monitoring/prometheus", "[fd00:10:96::28]:9090")
                .contains("[fd00:10:244:1::7]:9090")
        );
        assert!(
            row(&table, "monitoring/prometheus", "10.96.40.5:9090").contains("10.244.1.7:9090")
        );
        // Skipped: headless, ExternalName, other proxy.
        for skipped in [
            "shop/orders-db",
            "shop/payments-gateway",
            "shop/legacy-billing",
        ] {
            assert!(
                !table.contains(skipped),
                "{skipped} must not be planned:\n{table}"
            );
        }
        let vips = table.lines().last().expect("addresses line");
        assert!(vips.starts_with("addresses on kube-ipvs0: "), "{vips}");
        assert!(
            vips.contains("10.96.0.1,")
                && vips.contains("203.0.113.11")
                && vips.contains("192.0.2.50"),
            "{vips}"
        );
        assert!(
            !vips.contains("192.0.2.10,") && !vips.ends_with("192.0.2.10"),
            "node IPs are not bound: {vips}"
        );
    }

    #[tokio::test]
    async fn the_driver_prints_each_sync_and_a_removed_service_deletes() {
        let mut proxier = proxier();
        let (handle, commands) = ProxierHandle::new();
        let (stop, shutdown) = watch::channel(false);
        let daemon = DaemonObserver::new(
            ProxyHealth::new(std::time::Duration::from_secs(60)),
            Arc::default(),
        );
        let mut observer = DryRunObserver::new(daemon, Vec::new());
        let config = DriverConfig::new(
            std::time::Duration::from_secs(3600),
            std::time::Duration::ZERO,
            2,
        );
        let feeder = async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            handle.apply(vec![Change::DeleteService(
                proxier_core::model::ServiceName::new("shop", "cart"),
            )]);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            stop.send_replace(true);
        };
        tokio::join!(
            driver::run(&mut proxier, config, commands, &mut observer, shutdown),
            feeder
        );
        let printed = String::from_utf8(observer.into_inner()).expect("utf8");
        let plans: Vec<&str> = printed
            .lines()
            .filter(|l| l.starts_with("plan: ") || l.starts_with("changes: "))
            .collect();
        assert_eq!(plans.len(), 2, "{printed}");
        assert!(
            plans[0].starts_with("plan: "),
            "the whole plan first: {printed}"
        );
        assert!(!plans[0].contains("would make 0 writes"), "{}", plans[0]);
        assert!(
            plans[1].starts_with("changes: "),
            "then only changes: {printed}"
        );
        assert!(
            !plans[1].ends_with("(0 deletes)"),
            "removing a Service deletes: {}",
            plans[1]
        );
        let second = printed.split("changes: ").nth(1).expect("second report");
        assert!(second.contains("- shop/cart"), "{second}");
        assert!(!second.contains("shop/web"), "{second}");
        let first = printed.lines().next().expect("summary");
        // The example's 11 Services less the headless and the ExternalName one; the slice
        // of the headless Service is filtered by the file source.
        assert_eq!(
            first,
            "dry-run full sync: 9 services (11 ports), 10 endpoint slices (18 endpoints), node node-a"
        );
    }

    fn outcome(
        result: &Result<proxier_core::engine::SyncReport, proxier_core::EngineError>,
        kind: SyncKind,
    ) -> SyncOutcome<'_> {
        SyncOutcome {
            kind,
            took: std::time::Duration::ZERO,
            result,
            succeeded: result.is_ok(),
            changes_pending: false,
        }
    }

    fn observer(format: OutputFormat) -> DryRunObserver<Vec<u8>> {
        let daemon = DaemonObserver::new(
            ProxyHealth::new(std::time::Duration::from_secs(60)),
            Arc::default(),
        );
        DryRunObserver::with_format(daemon, Vec::new(), format).watching()
    }

    #[tokio::test]
    async fn plan_documents_round_trip_through_json_and_yaml() {
        let mut proxier = proxier();
        let result = proxier.sync(SyncKind::Full).await;
        let doc = plan_document(&proxier, &outcome(&result, SyncKind::Full));
        assert_eq!(doc.api_version, DOCUMENT_API_VERSION);
        assert!(doc.virtual_servers.iter().any(|v| v.role == "NodePort"));
        assert!(doc.writes.as_ref().is_some_and(|w| w.total > 0));

        let json = serde_json::to_string_pretty(&doc).expect("json");
        let back: PlanDocument = serde_json::from_str(&json).expect("parse json");
        assert_eq!(back, doc);
        let yaml = serde_yaml::to_string(&doc).expect("yaml");
        let back: PlanDocument = serde_yaml::from_str(&yaml).expect("parse yaml");
        assert_eq!(back, doc);

        // The names the schema documents (docs/dry-run.md).
        let v: serde_json::Value = serde_json::from_str(&json).expect("value");
        for field in [
            "apiVersion",
            "kind",
            "sync",
            "node",
            "dummyInterface",
            "summary",
            "writes",
            "error",
            "virtualServers",
            "boundAddresses",
        ] {
            assert!(v.get(field).is_some(), "{field} missing: {json}");
        }
        let vs = &v["virtualServers"][0];
        for field in [
            "servicePort",
            "role",
            "protocol",
            "address",
            "port",
            "scheduler",
            "persistenceTimeoutSeconds",
            "hashSourcePort",
            "realServers",
        ] {
            assert!(vs.get(field).is_some(), "{field} missing: {vs}");
        }
        assert!(v["node"].get("primaryIPs").is_some());
        assert!(
            v["virtualServers"][0]["realServers"][0]
                .get("weight")
                .is_some()
        );
        // Unknown fields are refused: a consumer's schema and ours cannot drift silently.
        let mut extra = v.clone();
        extra["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<PlanDocument>(extra).is_err());
    }

    #[tokio::test]
    async fn watch_prints_the_plan_then_only_what_changed() {
        let mut proxier = proxier();
        let mut obs = observer(OutputFormat::Table);
        let result = proxier.sync(SyncKind::Full).await;
        obs.synced(&proxier, &outcome(&result, SyncKind::Full));

        // Nothing changed: one summary line and "no change".
        let result = proxier.sync(SyncKind::Full).await;
        obs.synced(&proxier, &outcome(&result, SyncKind::Full));

        // cart goes away; web gets one endpoint more.
        proxier.apply(Change::DeleteService(
            proxier_core::model::ServiceName::new("shop", "cart"),
        ));
        let result = proxier.sync(SyncKind::Incremental).await;
        obs.synced(&proxier, &outcome(&result, SyncKind::Incremental));

        let printed = String::from_utf8(obs.into_inner()).expect("utf8");
        let reports: Vec<&str> = printed
            .split("dry-run ")
            .filter(|r| !r.is_empty())
            .collect();
        assert_eq!(reports.len(), 3, "{printed}");
        assert!(reports[0].contains("SERVICE PORT"), "{}", reports[0]);
        assert!(
            reports[1].contains("no change; a real sync would make 0 writes"),
            "{}",
            reports[1]
        );
        assert!(!reports[1].contains("SERVICE PORT"), "{}", reports[1]);
        let change = reports[2];
        assert!(!change.contains("SERVICE PORT"), "no whole table: {change}");
        assert!(
            change.contains("changes: 0 virtual servers added, 1 removed, 0 changed; 0 addresses bound, 1 unbound on kube-ipvs0; a real sync would make"),
            "{change}"
        );
        let removed: Vec<&str> = change.lines().filter(|l| l.starts_with("- ")).collect();
        assert_eq!(removed.len(), 2, "{change}");
        assert!(
            removed[0].starts_with("- shop/cart") && removed[0].contains("10.96.12.51:7070"),
            "{change}"
        );
        assert_eq!(removed[1], "- addresses on kube-ipvs0: 10.96.12.51");
        assert!(!change.contains("shop/web"), "{change}");
    }

    #[test]
    fn changed_virtual_servers_name_their_real_server_changes() {
        let rs = |a: &str, w: u32| RealServerDoc {
            address: a.parse().expect("ip"),
            port: 8080,
            weight: w,
        };
        let before = VirtualServerDoc {
            service_port: "shop/web:http/TCP".into(),
            role: "ClusterIP".into(),
            protocol: "TCP".into(),
            address: "10.96.12.50".parse().expect("ip"),
            port: 80,
            scheduler: "rr".into(),
            persistence_timeout_seconds: None,
            hash_source_port: false,
            real_servers: vec![rs("10.244.1.5", 1), rs("10.244.1.6", 1)],
        };
        let after = VirtualServerDoc {
            scheduler: "wrr".into(),
            real_servers: vec![rs("10.244.1.6", 3), rs("10.244.1.7", 1)],
            ..before.clone()
        };
        assert_eq!(
            describe_change(&before, &after),
            "scheduler rr -> wrr; real servers +10.244.1.7:8080; real servers -10.244.1.5:8080; weights 10.244.1.6:8080 w1 -> w3"
        );
    }

    #[tokio::test]
    async fn a_large_plan_keeps_the_addresses_line_short() {
        let mut state_changes = Vec::new();
        let cluster = proxier_core::testing::state(10_000, 2);
        for service in cluster.services() {
            state_changes.push(Change::UpsertService(service.clone()));
            for slice in cluster.slices_of(&service.name) {
                state_changes.push(Change::UpsertSlice(slice.clone()));
            }
        }
        let config = ProxierConfig::new(
            proxier_core::testing::NODE_NAME,
            proxier_core::testing::config(),
        );
        let mut proxier = Proxier::new(config, Backends::in_memory()).expect("proxier");
        proxier.apply(Change::UpsertNode(proxier_core::testing::node()));
        for change in state_changes {
            proxier.apply(change);
        }
        let result = proxier.sync(SyncKind::Full).await;
        let text = render_report(&proxier, &outcome(&result, SyncKind::Full));
        let line = text
            .lines()
            .find(|l| l.starts_with("addresses on "))
            .expect("addresses line");
        assert!(line.len() < 300, "{line}");
        assert!(line.contains(": 10000 ("), "{line}");
        assert!(
            line.contains("… 9992 more; --output json lists them all"),
            "{line}"
        );
        assert_eq!(
            text.lines().filter(|l| l.contains("ClusterIP")).count(),
            10_000
        );
    }
}
