//! `ipvs-proxier explain NAMESPACE/SERVICE`: the daemon's settings and source, handed to
//! [`proxier_runtime::explain`]; the answer printed as text, JSON or YAML.

use std::time::Duration;

use proxier_core::ProxierConfig;
use proxier_core::explain::Explanation;
use proxier_core::explain::render::render_text;
use proxier_core::model::ServiceName;
use proxier_runtime::explain::{ExplainError, ExplainRequest, explain};
use proxier_runtime::source::{self, SourceHandle};

use crate::cli::OutputFormat;
use crate::daemon::{DaemonError, source_name, start_source};
use crate::settings::{Settings, SourceSettings};

/// How long the source has to deliver its first picture.
pub const FIRST_PICTURE_TIMEOUT: Duration = Duration::from_secs(120);

/// Why `explain` could not answer (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum ExplainCommandError {
    /// Not `NAMESPACE/NAME`.
    #[error("{0:?} is not NAMESPACE/SERVICE")]
    Target(String),
    /// The source could not be read.
    #[error(transparent)]
    Source(#[from] DaemonError),
    /// The source did not deliver its first picture in time.
    #[error("the {0} source did not deliver Services and EndpointSlices within {1:?}")]
    SourceTimeout(&'static str, Duration),
    /// Planning failed.
    #[error(transparent)]
    Explain(#[from] ExplainError),
    /// The document could not be written.
    #[error("cannot print the explanation: {0}")]
    Print(String),
}

/// Parses `namespace/name`.
pub fn parse_target(target: &str) -> Result<ServiceName, ExplainCommandError> {
    match target.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok(ServiceName::new(namespace, name))
        }
        _ => Err(ExplainCommandError::Target(target.to_owned())),
    }
}

/// Explains `service` with the daemon's `settings` and returns the document, and the
/// document printed in `format` (table: text).
pub async fn run(
    settings: &Settings,
    format: OutputFormat,
    service: ServiceName,
    client: Option<std::net::IpAddr>,
) -> Result<(Explanation, String), ExplainCommandError> {
    let first = match &settings.source {
        SourceSettings::File { path } => source::file::load(path, &settings.hostname)
            .map_err(|e| ExplainCommandError::Source(e.into()))?,
        SourceSettings::Kube { .. } => {
            let SourceHandle { mut events, .. } = start_source(settings).await?;
            match tokio::time::timeout(FIRST_PICTURE_TIMEOUT, events.recv()).await {
                Ok(Some(batch)) => batch,
                Ok(None) => {
                    return Err(DaemonError::SourceEnded(source_name(settings)).into());
                }
                Err(_) => {
                    return Err(ExplainCommandError::SourceTimeout(
                        source_name(settings),
                        FIRST_PICTURE_TIMEOUT,
                    ));
                }
            }
        }
    };
    let mut request = ExplainRequest::new(
        ProxierConfig::new(settings.hostname.clone(), settings.planner.clone()),
        service,
    );
    request.client = client;
    request.link = settings.dummy_interface.clone();
    let explanation = explain(first, &request).await?;
    let printed = match format {
        OutputFormat::Table => render_text(&explanation, &request.link),
        OutputFormat::Json => serde_json::to_string_pretty(&explanation)
            .map(|s| s + "\n")
            .map_err(|e| ExplainCommandError::Print(e.to_string()))?,
        OutputFormat::Yaml => serde_yaml::to_string(&explanation)
            .map_err(|e| ExplainCommandError::Print(e.to_string()))?,
    };
    Ok((explanation, printed))
}
