//! An [`Explanation`] as text for people: the verdict and the reasons first, then each
//! Service port's virtual servers with the plan next to the kernel.

use std::fmt::Write as _;

use super::{AddressState, Explanation, Severity};

fn severity_word(severity: Severity) -> &'static str {
    match severity {
        Severity::Blocking => "BLOCKING",
        Severity::Warning => "WARNING",
        Severity::Info => "info",
    }
}

fn address_word(state: AddressState, link: &str) -> String {
    match state {
        AddressState::Bound => format!("bound on {link}"),
        AddressState::Routed => format!("routed by a Service CIDR on {link}"),
        AddressState::NodeAddress => "a node address".to_owned(),
        AddressState::Missing => format!("MISSING from {link}"),
        AddressState::Unknown => format!("{link} unreadable"),
    }
}

fn weight(w: Option<u32>) -> String {
    w.map_or_else(|| "-".to_owned(), |w| w.to_string())
}

/// Renders `explanation` for a terminal; `link` names the dummy link in the address column.
pub fn render_text(explanation: &Explanation, link: &str) -> String {
    let mut out = String::new();
    let verdict = if explanation.healthy {
        "healthy".to_owned()
    } else {
        match explanation.worst() {
            Some(Severity::Blocking) => "NOT ANSWERING on some path".to_owned(),
            _ => "answering, with warnings".to_owned(),
        }
    };
    let _ = writeln!(
        out,
        "Service {} on node {}: {verdict}",
        explanation.service, explanation.node
    );
    if let Some(client) = explanation.client {
        let _ = writeln!(out, "Client: {client}");
    }
    if explanation.reasons.is_empty() {
        let _ = writeln!(out, "\nNo reason a client would not get through.");
    } else {
        let _ = writeln!(out, "\nReasons:");
        for reason in &explanation.reasons {
            let mut place = Vec::new();
            if let Some(port) = &reason.port {
                place.push(port.as_str());
            }
            if let Some(vs) = &reason.virtual_server {
                place.push(vs.as_str());
            }
            let place = if place.is_empty() {
                String::new()
            } else {
                format!(" [{}]", place.join(" "))
            };
            let _ = writeln!(
                out,
                "  {:<8} {:?}{place}: {}",
                severity_word(reason.severity),
                reason.kind,
                reason.message
            );
        }
    }
    for port in &explanation.ports {
        let e = &port.endpoints;
        let _ = writeln!(
            out,
            "\nPort {}: {} endpoints, {} ready, {} serving while terminating, {} usable on this node",
            port.name, e.total, e.ready, e.serving_terminating, e.local_usable
        );
        for vs in &port.virtual_servers {
            let kernel = vs.kernel.as_ref().map_or_else(
                || "kernel: NONE".to_owned(),
                |k| {
                    format!(
                        "kernel: {} persistence {}",
                        k.scheduler,
                        weight(k.persistence_timeout_seconds)
                    )
                },
            );
            let _ = writeln!(
                out,
                "  {} {}:{}/{}  plan: {} persistence {}  {kernel}  address: {}",
                vs.role,
                vs.address,
                vs.port,
                vs.protocol,
                vs.planned.scheduler,
                weight(vs.planned.persistence_timeout_seconds),
                address_word(vs.address_state, link)
            );
            for rs in &vs.real_servers {
                let draining = if rs.draining { "  draining" } else { "" };
                let _ = writeln!(
                    out,
                    "    -> {}:{}  weight plan {} kernel {}  active {} inactive {}{draining}",
                    rs.address,
                    rs.port,
                    weight(rs.planned_weight),
                    weight(rs.kernel_weight),
                    rs.active_connections,
                    rs.inactive_connections
                );
            }
        }
    }
    if !explanation.netfilter.is_empty() {
        let present = explanation
            .netfilter
            .iter()
            .filter(|m| m.present == Some(true))
            .count();
        let unknown = explanation
            .netfilter
            .iter()
            .filter(|m| m.present.is_none())
            .count();
        let _ = writeln!(
            out,
            "\nnftables: {present} of {} set elements present{}",
            explanation.netfilter.len(),
            if unknown > 0 {
                format!(", {unknown} not checked (set or table unreadable or missing)")
            } else {
                String::new()
            }
        );
    }
    if let Some(check) = &explanation.health_check {
        let answered = check
            .answered_status
            .map_or_else(|| "no answer".to_owned(), |s| s.to_string());
        let _ = writeln!(
            out,
            "\nHealth check: node port {}, {} local endpoints, expected {}, answered {answered}",
            check.node_port, check.local_endpoints, check.expected_status
        );
    }
    if !explanation.foreign_virtual_servers.is_empty() {
        let _ = writeln!(
            out,
            "\nForeign virtual servers on its addresses: {}",
            explanation.foreign_virtual_servers.join(", ")
        );
    }
    out
}
