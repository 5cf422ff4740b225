//! What kube-proxy does to the node before its proxier starts, and every program that runs
//! the engine on a node should do too (never in a dry run): check that the kernel has the
//! IPVS scheduler, set the process's `oom_score_adj` and the conntrack sysctls. Only a missing
//! scheduler is an error (as kube-proxy's start-up check); a setting the kernel refuses is
//! logged and skipped.

use proxier_core::kernel_modules::{ModuleFiles, ModuleStatus, module_status, scheduler_module};
use proxier_core::model::Scheduler;
use proxier_core::sysctl::{
    ConntrackSettings, ProcSysctl, SysctlStore, apply_conntrack, machine_cpus,
};

/// What to prepare on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSetup {
    /// The IPVS scheduler the proxier will use (its module must be there).
    pub scheduler: Scheduler,
    /// The process's `oom_score_adj` (kube-proxy's default: -999).
    pub oom_score_adj: i32,
    /// kube-proxy's conntrack settings.
    pub conntrack: ConntrackSettings,
}

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

/// Prepares the node for `setup`, reading and writing the real `/proc` and `/sys`.
pub fn prepare(setup: &NodeSetup) -> Result<(), NodeSetupError> {
    let proc_sys = ProcSysctl::default();
    let release = proc_sys.read("kernel/osrelease").unwrap_or_default();
    check_scheduler(&setup.scheduler, &ModuleFiles::for_release(&release))?;
    apply_oom_score_adj(setup.oom_score_adj);
    apply_conntrack(
        &proc_sys,
        &ProcSysctl::new("/sys/module"),
        &setup.conntrack,
        machine_cpus(),
    );
    Ok(())
}

/// Fails when `files` show that the kernel cannot provide `scheduler`; warns when they
/// cannot tell.
pub fn check_scheduler(scheduler: &Scheduler, files: &ModuleFiles) -> Result<(), NodeSetupError> {
    let scheduler = scheduler.name();
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
