//! `ipvs-proxier`: a Kubernetes Service proxy for the Linux IPVS data plane, a drop-in
//! replacement for `kube-proxy --proxy-mode=ipvs`.

use std::process::ExitCode;

use clap::Parser;
use std::ffi::OsString;

use proxier_bin::cli::{Cli, ExplainCli};
use proxier_bin::config::{ConfigError, load_config_file};
use proxier_bin::explain::parse_target;
use proxier_bin::settings::{Settings, resolve, system_hostname};

/// mimalloc instead of glibc's malloc: glibc kept the transient memory of the first sync and
/// of every full resync in per-thread arenas (RSS at the peak, and creeping up under churn);
/// mimalloc hands freed pages back to the kernel ([`proxier_bin::allocator`] says when).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sets mimalloc's options before the first allocation, which reserves the arena: `main`
/// runs after the standard library's start-up has allocated, too late for an arena option.
/// See [`proxier_bin::allocator`].
extern "C" fn set_allocator_options() {
    proxier_bin::allocator::set_start_options();
}

/// Runs [`set_allocator_options`] as an ELF constructor, before the Rust runtime starts.
#[used]
#[allow(unsafe_code)]
#[unsafe(link_section = ".init_array")]
static SET_ALLOCATOR_OPTIONS: extern "C" fn() = set_allocator_options;

fn main() -> ExitCode {
    // No transparent huge pages for this process: the allocator's arena is one large mapping,
    // and with THP a 2 MiB page that the first sync's transient peak touched stays resident
    // whole while a few long-lived objects live in it (at 10,000 Services, 33-38 MiB of the
    // settled RSS were such pages). Set before the heap grows; inherited by `nft`.
    if let Err(error) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("ipvs-proxier: cannot disable transparent huge pages: {error}");
    }
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|arg| arg == "explain") {
        args.remove(1);
        let cli = ExplainCli::parse_from(args); // usage errors exit with code 2
        return explain_main(cli);
    }
    let cli = Cli::parse(); // usage errors exit with code 2
    let settings = match settings_of(&cli) {
        Ok(settings) => settings,
        Err(code) => return code,
    };
    tracing::info!(hostname = %settings.hostname, source = ?settings.source,
        dry_run = settings.dry_run, mode = ?settings.run_mode, "starting ipvs-proxier");

    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(proxier_bin::daemon::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "ipvs-proxier stopped");
            eprintln!("ipvs-proxier: {error}");
            ExitCode::from(1)
        }
    }
}

/// The daemon's settings from `cli` and its --config file, with logging set up; the exit
/// code when they cannot be had (1: unreadable file or no logging; 2: invalid settings).
fn settings_of(cli: &Cli) -> Result<Settings, ExitCode> {
    let file = match cli.config.as_deref().map(load_config_file).transpose() {
        Ok(file) => file,
        Err(error) => {
            eprintln!("ipvs-proxier: {error}");
            return Err(match error {
                ConfigError::Read { .. } => ExitCode::from(1),
                _ => ExitCode::from(2),
            });
        }
    };
    let settings = match resolve(cli, file.as_ref(), &system_hostname()) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("ipvs-proxier: {error}");
            return Err(ExitCode::from(2));
        }
    };
    if let Err(error) = proxier_bin::logging::init(settings.log) {
        eprintln!("ipvs-proxier: cannot set up logging: {error}");
        return Err(ExitCode::from(1));
    }
    if let Some(file) = &file {
        for field in &file.ignored_fields {
            match proxier_bin::config::ignored_field_hint(field) {
                Some(hint) => {
                    tracing::warn!(field = %field, hint, "config file field is not used by ipvs-proxier; ignored")
                }
                None => {
                    tracing::warn!(field = %field, "config file field is not used by ipvs-proxier; ignored")
                }
            }
        }
    }
    Ok(settings)
}

/// The daemon's tokio runtime (two workers).
fn async_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_park(proxier_bin::allocator::collect_after_settle)
        .enable_all()
        .build()
        .map_err(|error| {
            eprintln!("ipvs-proxier: cannot start the async runtime: {error}");
            ExitCode::from(1)
        })
}

/// `ipvs-proxier explain`: prints the explanation; exit 0 when explained (whatever it
/// says), 1 when it could not be, 2 on bad usage.
fn explain_main(mut cli: ExplainCli) -> ExitCode {
    let service = match parse_target(&cli.service) {
        Ok(service) => service,
        Err(error) => {
            eprintln!("ipvs-proxier explain: {error}");
            return ExitCode::from(2);
        }
    };
    // --output picks explain's format here, not the dry run's.
    let format = cli.daemon.output.take().unwrap_or_default();
    let settings = match settings_of(&cli.daemon) {
        Ok(settings) => settings,
        Err(code) => return code,
    };
    let runtime = match async_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(proxier_bin::explain::run(
        &settings, format, service, cli.client,
    )) {
        Ok((_, printed)) => {
            print!("{printed}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("ipvs-proxier explain: {error}");
            ExitCode::from(1)
        }
    }
}
