//! `--dry-run`: the engine on proxier-core's in-memory backends instead of the kernel.
//!
//! A dry run prints the plan once and exits (`terraform plan`); with `--watch` it keeps
//! following its source and, after the first plan, prints only what each sync changed:
//! virtual servers and real servers added, removed or changed, addresses bound or unbound
//! on the dummy link, and the writes a real sync would make. `--output` picks a table for
//! people or JSON / YAML documents for programs: [`proxier_core::view`]'s documents, whose
//! schema is written down in `docs/dry-run.md`.

use std::io::Write;

use proxier_core::engine::driver::{SyncObserver, SyncOutcome};
use proxier_core::view::{
    change_document, link_name, plan_document,
    render::{render_change_report, render_plan_report},
};
use proxier_core::{Desired, MemoryProxier};

use crate::cli::OutputFormat;
use proxier_runtime::observer::RuntimeObserver;

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

/// Prints every sync of an in-memory proxier (and reports it like the daemon does): the
/// first as the whole plan, later ones as what changed.
#[derive(Debug)]
pub struct DryRunObserver<W> {
    daemon: RuntimeObserver,
    out: W,
    format: OutputFormat,
    /// The plan as of the last printed sync.
    previous: Option<Desired>,
    /// Whether more than one sync will be printed (JSON then goes one document a line).
    watching_flag: bool,
}

impl<W: Write> DryRunObserver<W> {
    /// Prints tables to `out`; metrics and health go through `daemon`.
    pub fn new(daemon: RuntimeObserver, out: W) -> Self {
        Self::with_format(daemon, out, OutputFormat::Table)
    }

    /// Prints to `out` in `format`.
    pub fn with_format(daemon: RuntimeObserver, out: W, format: OutputFormat) -> Self {
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
            format => serialize(&doc, format, !self.watching_flag),
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
    format: OutputFormat,
    pretty: bool,
) -> Result<String, String> {
    match format {
        OutputFormat::Yaml => serde_yaml::to_string(doc)
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
