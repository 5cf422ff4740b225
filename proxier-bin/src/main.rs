//! `ipvs-proxier`: a Kubernetes Service proxy for the Linux IPVS data plane, a drop-in
//! replacement for `kube-proxy --proxy-mode=ipvs`.

use std::process::ExitCode;

use clap::Parser;
use proxier_bin::cli::Cli;
use proxier_bin::config::{ConfigError, load_config_file};
use proxier_bin::settings::{resolve, system_hostname};

/// mimalloc instead of glibc's malloc: glibc kept the transient memory of the first sync and
/// of every full resync in per-thread arenas (RSS at the peak, and creeping up under churn);
/// mimalloc hands freed pages back to the kernel.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // No transparent huge pages for this process: the allocator's arena is one large mapping,
    // and with THP a 2 MiB page that the first sync's transient peak touched stays resident
    // whole while a few long-lived objects live in it (at 10,000 Services, 33-38 MiB of the
    // settled RSS were such pages). Set before the heap grows; inherited by `nft`.
    if let Err(error) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("ipvs-proxier: cannot disable transparent huge pages: {error}");
    }
    let cli = Cli::parse(); // usage errors exit with code 2
    let file = match cli.config.as_deref().map(load_config_file).transpose() {
        Ok(file) => file,
        Err(error) => {
            eprintln!("ipvs-proxier: {error}");
            return match error {
                ConfigError::Read { .. } => ExitCode::from(1),
                _ => ExitCode::from(2),
            };
        }
    };
    let settings = match resolve(&cli, file.as_ref(), &system_hostname()) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("ipvs-proxier: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = proxier_bin::logging::init(settings.log) {
        eprintln!("ipvs-proxier: cannot set up logging: {error}");
        return ExitCode::from(1);
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
    tracing::info!(hostname = %settings.hostname, source = ?settings.source,
        dry_run = settings.dry_run, mode = ?settings.run_mode, "starting ipvs-proxier");

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("ipvs-proxier: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
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
