//! Logging: `tracing-subscriber` to stderr, as text or JSON, at a level chosen from klog's
//! `-v` (`RUST_LOG` overrides it when set).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

use crate::cli::LogFormat;
use crate::settings::LogSettings;

/// The tracing level for a klog verbosity: 0-1 info, 2-4 debug, 5 and more trace.
pub fn level_for_verbosity(verbosity: u8) -> LevelFilter {
    match verbosity {
        0..=1 => LevelFilter::INFO,
        2..=4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Whether log lines may carry ANSI colours: only when stderr is a terminal and `NO_COLOR`
/// is unset or empty (<https://no-color.org>), so that files, pipes and log collectors get
/// plain text.
pub fn use_colours(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber. Fails only if one is already installed.
pub fn init(settings: LogSettings) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use std::io::IsTerminal as _;
    let filter = EnvFilter::builder()
        .with_default_directive(level_for_verbosity(settings.verbosity).into())
        .from_env_lossy();
    let ansi = use_colours(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match settings.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
}
