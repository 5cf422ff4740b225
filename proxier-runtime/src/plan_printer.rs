//! Prints the plan of an engine on in-memory backends, as a dry run shows it: a
//! [`PlanPrinter`] wraps another [`SyncObserver`] (usually the
//! [`RuntimeObserver`](crate::observer::RuntimeObserver), so metrics and health go on as in a
//! real run) and writes every sync it sees.
//!
//! The first sync is printed as the whole plan (`terraform plan`); when the printer follows
//! every sync ([`PlanPrinter::watching`]), later ones are printed as what they changed: virtual
//! servers and real servers added, removed or changed, addresses bound or unbound on the dummy
//! link, and the writes a real sync would make. [`PlanFormat`] picks a table for people or JSON
//! / YAML documents for programs: [`proxier_core::view`]'s documents, whose schema is written
//! down in `docs/dry-run.md`.

use std::io::Write;

use proxier_core::engine::SyncReport;
use proxier_core::engine::driver::{SyncObserver, SyncOutcome};
use proxier_core::view::{
    change_document, link_name, plan_document,
    render::{render_change_report, render_plan_report},
};
use proxier_core::{Desired, EngineError, MemoryProxier, SyncKind};

/// How a [`PlanPrinter`] writes a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PlanFormat {
    /// A summary and one row per virtual server (for people).
    #[default]
    Table,
    /// The plan as a JSON document (schema in `docs/dry-run.md`): pretty when the printer
    /// prints one plan, one document a line when it follows every sync.
    Json,
    /// The plan as a `---` YAML document (same schema), one per sync.
    Yaml,
}

/// Prints every sync of an in-memory proxier after `O` has observed it: the first as the whole
/// plan, later ones as what changed.
#[derive(Debug)]
pub struct PlanPrinter<O, W> {
    observer: O,
    out: W,
    format: PlanFormat,
    /// The plan as of the last printed sync.
    previous: Option<Desired>,
    /// Whether more than one sync will be printed (JSON then goes one document a line).
    watching_flag: bool,
}

impl<O, W: Write> PlanPrinter<O, W> {
    /// Prints tables to `out`; every sync is first handed to `observer`.
    pub fn new(observer: O, out: W) -> Self {
        Self::with_format(observer, out, PlanFormat::Table)
    }

    /// Prints to `out` in `format`.
    pub fn with_format(observer: O, out: W, format: PlanFormat) -> Self {
        PlanPrinter {
            observer,
            out,
            format,
            previous: None,
            watching_flag: false,
        }
    }

    /// Marks this printer as following every sync: JSON documents are then written one a
    /// line.
    pub fn watching(mut self) -> Self {
        self.watching_flag = true;
        self
    }

    /// The writer (tests read what was printed).
    pub fn into_writer(self) -> W {
        self.out
    }

    /// Prints the whole plan (a dry run that prints once, and the first sync of one that
    /// follows every sync).
    pub fn print_plan(&mut self, proxier: &MemoryProxier, outcome: &SyncOutcome<'_>) {
        let doc = plan_document(proxier, outcome);
        let text = match self.format {
            PlanFormat::Table => Ok(render_plan_report(&doc)),
            format => serialize(&doc, format, !self.watching_flag),
        };
        self.write(text);
        self.previous = Some(proxier.desired().clone());
    }

    /// Prints the whole plan after a full sync run by hand, outside the driver (a dry run
    /// that syncs once); `result` is what [`Proxier::sync`](proxier_core::Proxier::sync)
    /// returned.
    pub fn print_full_sync(
        &mut self,
        proxier: &MemoryProxier,
        result: &Result<SyncReport, EngineError>,
    ) {
        let outcome = SyncOutcome {
            kind: SyncKind::Full,
            took: result.as_ref().map(|r| r.timings.total).unwrap_or_default(),
            result,
            succeeded: result.is_ok(),
            changes_pending: false,
        };
        self.print_plan(proxier, &outcome);
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
            PlanFormat::Table => Ok(render_change_report(&doc, &link_name(proxier))),
            format => serialize(&doc, format, false),
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

/// A document as JSON (pretty, or one line when `pretty` is false) or as a `---` YAML
/// document.
fn serialize(
    doc: &impl serde::Serialize,
    format: PlanFormat,
    pretty: bool,
) -> Result<String, String> {
    match format {
        PlanFormat::Yaml => serde_yaml::to_string(doc)
            .map(|t| format!("---\n{t}"))
            .map_err(|e| e.to_string()),
        _ if pretty => serde_json::to_string_pretty(doc)
            .map(|t| t + "\n")
            .map_err(|e| e.to_string()),
        _ => serde_json::to_string(doc)
            .map(|t| t + "\n")
            .map_err(|e| e.to_string()),
    }
}

impl<O, W> SyncObserver<MemoryProxier> for PlanPrinter<O, W>
where
    O: SyncObserver<MemoryProxier>,
    W: Write,
{
    fn queued(&mut self) {
        self.observer.queued();
    }

    fn synced(&mut self, proxier: &MemoryProxier, outcome: &SyncOutcome<'_>) {
        self.observer.synced(proxier, outcome);
        match self.previous.take() {
            None => self.print_plan(proxier, outcome),
            Some(before) => self.print_changes(before, proxier, outcome),
        }
    }
}
