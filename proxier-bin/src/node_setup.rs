//! What kube-proxy does to the node before its proxier starts, and the daemon does too
//! (never in a dry run): check that the kernel has the IPVS scheduler, set the process's
//! `oom_score_adj` and the conntrack sysctls. Only a missing scheduler stops the daemon (as
//! kube-proxy's start-up check does); a setting the kernel refuses is logged and skipped.

use proxier_core::kernel_modules::{ModuleFiles, ModuleStatus, module_status, scheduler_module};
use proxier_core::sysctl::{ProcSysctl, SysctlStore, apply_conntrack, machine_cpus};

use crate::settings::Settings;

/// Why the node cannot run the proxier.
#[derive(Debug, thiserror::Error)]
pub enum NodeSetupError {
    /// The configured IPVS scheduler's module is neither loaded, built in nor installed.
    #[error(
        "can't use the IPVS proxier: the kernel has no IPVS scheduler {scheduler:?} \
         (module {module} is not loaded, not built in and not in {modules_dir}/modules.dep)"
    )]
    MissingScheduler {
        /// The scheduler's name.
        scheduler: String,
        /// The module that would provide it.
        module: String,
        /// The kernel's module directory that was searched.
        modules_dir: String,
    },
}

/// Prepares the node for `settings`, reading and writing the real `/proc` and `/sys`.
pub fn prepare(settings: &Settings) -> Result<(), NodeSetupError> {
    let proc_sys = ProcSysctl::default();
    let release = proc_sys.read("kernel/osrelease").unwrap_or_default();
    check_scheduler(settings, &ModuleFiles::for_release(&release))?;
    apply_oom_score_adj(settings.oom_score_adj);
    apply_conntrack(
        &proc_sys,
        &ProcSysctl::new("/sys/module"),
        &settings.conntrack,
        machine_cpus(),
    );
    Ok(())
}

/// Fails when `files` show that the kernel cannot provide the configured scheduler; warns
/// when they cannot tell.
pub fn check_scheduler(settings: &Settings, files: &ModuleFiles) -> Result<(), NodeSetupError> {
    let scheduler = settings.planner.scheduler.name();
    let module = scheduler_module(scheduler);
    match module_status(files, &module) {
        ModuleStatus::Loaded | ModuleStatus::BuiltIn | ModuleStatus::Installed => Ok(()),
        ModuleStatus::Missing => Err(NodeSetupError::MissingScheduler {
            scheduler: scheduler.to_owned(),
            module,
            modules_dir: files.installed.display().to_string(),
        }),
        ModuleStatus::Unknown { reason } => {
            tracing::warn!(
                scheduler,
                module,
                "cannot tell whether the kernel has the IPVS scheduler ({reason}); the first virtual server will tell"
            );
            Ok(())
        }
    }
}

/// Sets this process's `oom_score_adj` as kube-proxy does; a refusal (lowering it needs
/// CAP_SYS_RESOURCE) is logged, not fatal.
fn apply_oom_score_adj(value: i32) {
    let path = "/proc/self/oom_score_adj";
    if std::fs::read_to_string(path).is_ok_and(|held| held.trim() == value.to_string()) {
        return;
    }
    match std::fs::write(path, value.to_string()) {
        Ok(()) => tracing::info!(oom_score_adj = value, "oom_score_adj set"),
        Err(error) => {
            tracing::info!(oom_score_adj = value, %error, "cannot set oom_score_adj; left as is")
        }
    }
}
