//! Tables and reports of plan documents, for people: one row per virtual server, the bound
//! addresses, and what one sync changed.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use super::{
    DOCUMENT_API_VERSION, NodeDoc, PlanChangeDocument, PlanDocument, RealServerDoc, SummaryDoc,
    VirtualServerDoc, WritesDoc, plan_document,
};
use crate::backend::{AddressBackend, IpvsBackend};
use crate::conntrack::ConntrackBackend;
use crate::desired::Desired;
use crate::engine::Proxier;
use crate::engine::driver::SyncOutcome;
use crate::netfilter::NetfilterBackend;

/// How many bound addresses the table lists before it summarises the rest.
pub const ADDRESSES_SHOWN: usize = 8;

/// How many real servers one table row lists before it summarises the rest.
pub const REAL_SERVERS_SHOWN: usize = 8;

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
    if !doc.local_routes.is_empty() {
        let routes: Vec<String> = doc.local_routes.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "local routes through {}: {}\n",
            doc.dummy_interface,
            routes.join(", ")
        ));
    }
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
        local_routes: Vec::new(),
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
pub fn render_report<I, A, N, C>(proxier: &Proxier<I, A, N, C>, outcome: &SyncOutcome<'_>) -> String
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    render_plan_report(&plan_document(proxier, outcome))
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

pub(crate) fn describe_change(before: &VirtualServerDoc, after: &VirtualServerDoc) -> String {
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
