//! The VM commands: build what the guest needs, pack it, boot, judge the result.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::artifacts::{self, Executable, Profile, TestSelection};
use crate::deps::{self, HostTools};
use crate::disk::DiskStaging;
use crate::guest_kernel::{self, GuestKernel, GuestNft, KernelChoice, NftChoice};
use crate::guest_scripts::{self, GuestTest, RunLayout};
use crate::initramfs;
use crate::qemu::{self, BootSpec, GuestOutcome};
use crate::realapi;
use crate::workspace::Workspace;

/// Where the disk's copy of the target directory is mounted in the guest.
const DISK_TARGET_DIR: &str = "/mnt/target";

/// Options of one VM boot.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Kill the guest (and fail) after this long.
    pub timeout: Duration,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Copy binaries with their debug info (else DWARF is stripped on the disk copy).
    pub keep_debug: bool,
    /// Kill a test binary (and count it failed) after this long.
    pub binary_timeout: Duration,
    /// The kernel to boot.
    pub kernel: KernelChoice,
    /// The `nft` the guest runs.
    pub nft: NftChoice,
    /// Both vCPUs on one host thread ([`VmConfig::single_thread_for_tests`]).
    pub single_thread_tcg: bool,
}

impl VmConfig {
    /// Whether a test run boots `kernel` with single-threaded TCG: multi-threaded TCG left
    /// a stale int3 of a static-key patch on the other vCPU of a 6.12 guest (an Oops in
    /// `NF_HOOK` from the IPv6 router-solicitation timer), so the fetched kernels run their
    /// vCPUs on one host thread. Benchmarks keep multi-threaded TCG on every kernel, so
    /// that kernels compare under the same emulation.
    pub fn single_thread_for_tests(kernel: KernelChoice) -> bool {
        kernel != KernelChoice::Bookworm
    }
}

/// Durations of the runner's own steps.
#[derive(Debug, Default)]
struct Timings {
    cargo_build: Duration,
    initramfs: Duration,
    initramfs_cache_hit: bool,
    disk_image: Duration,
    boot_to_init: Option<Duration>,
    guest_total: Duration,
}

impl Timings {
    fn print(&self, total: Duration) {
        let boot = self.boot_to_init.map_or_else(
            || "never reached".to_owned(),
            |d| format!("{:.1}s", d.as_secs_f64()),
        );
        println!(
            "xtask: timings: cargo build {:.1}s, initramfs {:.1}s ({}), disk image {:.1}s, \
             boot to /init {boot}, guest run {:.1}s, total {:.1}s",
            self.cargo_build.as_secs_f64(),
            self.initramfs.as_secs_f64(),
            if self.initramfs_cache_hit {
                "cache hit"
            } else {
                "built"
            },
            self.disk_image.as_secs_f64(),
            self.guest_total.as_secs_f64(),
            total.as_secs_f64(),
        );
    }
}

/// This run's scratch directory (`target/vm/run-<pid>`), removed on drop.
struct RunDir(PathBuf);

impl RunDir {
    const PREFIX: &'static str = "run-";

    fn create(vm_dir: &Path) -> Result<RunDir> {
        remove_abandoned_run_dirs(vm_dir);
        let path = vm_dir.join(format!("{}{}", Self::PREFIX, std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(RunDir(path))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes scratch directories of runs whose process is gone (killed runs).
fn remove_abandoned_run_dirs(vm_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(vm_dir) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(RunDir::PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Everything prepared for one boot.
struct Prepared {
    workspace: Workspace,
    tools: HostTools,
    kernel: GuestKernel,
    nft: Option<GuestNft>,
    run_dir: RunDir,
}

fn prepare(config: &VmConfig) -> Result<Prepared> {
    let tools = deps::ensure()?;
    let workspace = Workspace::locate()?;
    let kernel = guest_kernel::resolve(config.kernel, &workspace.vm_dir())?;
    let nft = guest_kernel::resolve_nft(config.nft, &workspace.vm_dir())?;
    println!(
        "xtask: guest kernel {} ({}), nft {}",
        config.kernel.name(),
        kernel.version,
        config.nft.name()
    );
    let run_dir = RunDir::create(&workspace.vm_dir())?;
    Ok(Prepared {
        workspace,
        tools,
        kernel,
        nft,
        run_dir,
    })
}

/// Path of a host file on the disk image, and in the guest.
fn disk_relative(workspace: &Workspace, host: &Path) -> PathBuf {
    match host.strip_prefix(&workspace.target_dir) {
        Ok(inside) => Path::new("target").join(inside),
        Err(_) => Path::new("extra").join(host.file_name().unwrap_or(host.as_os_str())),
    }
}

fn guest_path(workspace: &Workspace, host: &Path) -> PathBuf {
    if host.starts_with(&workspace.target_dir) {
        host.to_path_buf()
    } else {
        Path::new("/mnt").join(disk_relative(workspace, host))
    }
}

/// Packs the initramfs and disk, boots, and returns the console outcome. `files` are our
/// binaries (their libraries go into the initramfs, their debug info is stripped unless
/// kept); `as_is` are other files for the disk, copied unchanged.
fn boot_with(
    prepared: &Prepared,
    config: &VmConfig,
    files: &[PathBuf],
    as_is: &[PathBuf],
    run_script: &str,
    timings: &mut Timings,
) -> Result<GuestOutcome> {
    let Prepared {
        workspace,
        tools,
        kernel,
        nft,
        run_dir,
    } = prepared;
    let run_dir = &run_dir.0;

    let started = Instant::now();
    let root = initramfs::assemble(tools, kernel, nft.as_ref(), files)?;
    let initramfs = initramfs::build_or_reuse(&root, kernel, &workspace.vm_dir(), started)?;
    timings.initramfs = initramfs.elapsed;
    timings.initramfs_cache_hit = initramfs.cache_hit;
    println!(
        "xtask: initramfs {} in {:.1}s: {}",
        if initramfs.cache_hit {
            "cache hit"
        } else {
            "built"
        },
        initramfs.elapsed.as_secs_f64(),
        initramfs.path.display()
    );

    let started = Instant::now();
    let mut staging = DiskStaging::new(run_dir.join("disk-root"))?;
    for file in files {
        staging.add_file(file, &disk_relative(workspace, file), !config.keep_debug)?;
    }
    for file in as_is {
        staging.add_file(file, &disk_relative(workspace, file), false)?;
    }
    staging.add_content("run.sh", run_script, true)?;
    let disk = run_dir.join("disk.img");
    let size = staging.build_image(&disk)?;
    timings.disk_image = started.elapsed();
    println!(
        "xtask: disk image {} MiB in {:.1}s",
        size >> 20,
        timings.disk_image.as_secs_f64()
    );

    let console_log = workspace.vm_dir().join("last-console.log");
    let spec = BootSpec {
        qemu: &tools.qemu,
        kernel_image: &kernel.image,
        initramfs: &initramfs.path,
        disk: &disk,
        memory_mib: config.memory_mib,
        timeout: config.timeout,
        console_log: run_dir.join("console.log"),
        single_thread: config.single_thread_tcg,
    };
    let outcome = qemu::boot(&spec);
    let _ = std::fs::rename(run_dir.join("console.log"), &console_log);
    let _ = std::fs::remove_file(&disk);
    let outcome = outcome?;
    timings.boot_to_init = outcome.boot_to_init;
    timings.guest_total = outcome.total;
    println!("xtask: console log saved to {}", console_log.display());
    Ok(outcome)
}

/// Why a guest run did not complete (None when it did).
fn incomplete(outcome: &GuestOutcome, timeout: Duration) -> Option<String> {
    if outcome.timed_out {
        return Some(format!(
            "timeout: the guest did not finish within {} minutes",
            timeout.as_secs() / 60
        ));
    }
    if outcome.panicked {
        return Some("the guest kernel panicked".to_owned());
    }
    None
}

/// Verdict of a test run: Ok when the guest reported PASS.
pub fn test_verdict(outcome: &GuestOutcome, timeout: Duration) -> Result<String, String> {
    if let Some(reason) = incomplete(outcome, timeout) {
        return Err(reason);
    }
    match &outcome.test_result {
        Some(result) if result.starts_with("PASS") => Ok(result.clone()),
        Some(result) => Err(result.clone()),
        None => Err(format!(
            "the guest never printed its {} line (qemu {})",
            guest_scripts::TEST_RESULT_MARKER,
            outcome
                .qemu_status
                .map_or_else(|| "still running".to_owned(), |s| s.to_string())
        )),
    }
}

/// Exit status of a program run: the program's own, or an error.
pub fn run_verdict(outcome: &GuestOutcome, timeout: Duration) -> Result<i32, String> {
    if let Some(reason) = incomplete(outcome, timeout) {
        return Err(reason);
    }
    outcome.run_exit.ok_or_else(|| {
        format!(
            "the guest never printed its {} line",
            guest_scripts::RUN_EXIT_MARKER
        )
    })
}

fn layout<'a>(
    workspace: &'a Workspace,
    bin_dirs: Vec<&'a Path>,
    proxier: &'a Path,
) -> RunLayout<'a> {
    RunLayout {
        host_target_dir: &workspace.target_dir,
        disk_target_dir: DISK_TARGET_DIR,
        bin_dirs,
        proxier_bin: proxier,
        exports: Vec::new(),
    }
}

fn parent_dirs(executables: &[&Executable]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = executables
        .iter()
        .filter_map(|e| e.path.parent().map(Path::to_path_buf))
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// `cargo xtask vm-test [FILTER]`, running only the test binaries of these targets (empty:
/// every one built).
/// The build is the selection's: a run that keeps some binaries of a whole-workspace
/// build reuses it as it is (`-p`/`--test` would build with other features).
pub fn vm_test_binaries(
    filter: Option<&str>,
    selection: &TestSelection,
    only_targets: &[&str],
    extra_args: &[String],
    config: &VmConfig,
) -> Result<ExitCode> {
    let total = Instant::now();
    let prepared = prepare(config)?;
    let workspace = &prepared.workspace;
    let mut timings = Timings::default();

    let started = Instant::now();
    let build = artifacts::build_test_binaries(workspace, selection)?;
    let proxier = match build.proxier() {
        Some(proxier) => Some(proxier.clone()),
        None => match artifacts::build_proxier(workspace, Profile::Debug) {
            Ok(proxier) => Some(proxier),
            Err(err) if !selection.is_everything() => {
                println!("xtask: warning: {err:#}; IPVS_PROXIER_BIN will point to a missing file");
                None
            }
            Err(err) => return Err(err),
        },
    };
    let programs = match build.test_programs() {
        Some(programs) => programs,
        None => artifacts::build_test_programs(workspace, Profile::Debug)?,
    };
    let mut tests = build.tests;
    if !only_targets.is_empty() {
        tests.retain(|t| only_targets.contains(&t.target_name.as_str()));
        let missing: Vec<&&str> = only_targets
            .iter()
            .filter(|name| !tests.iter().any(|t| t.target_name == **name))
            .collect();
        anyhow::ensure!(missing.is_empty(), "no test binary for {missing:?}");
    }
    timings.cargo_build = started.elapsed();

    let mut files: Vec<PathBuf> = tests.iter().map(|t| t.path.clone()).collect();
    let proxier_path = proxier.as_ref().map_or_else(
        || workspace.target_dir.join("debug").join("ipvs-proxier"),
        |p| p.path.clone(),
    );
    files.extend(proxier.as_ref().map(|p| p.path.clone()));
    files.extend(programs.iter().map(|p| p.path.clone()));
    let guest_tests: Vec<GuestTest> = tests
        .iter()
        .map(|t| GuestTest {
            name: format!("{}/{}", t.package, t.target_name),
            path: guest_path(workspace, &t.path),
        })
        .collect();
    println!("xtask: {} test binaries for the VM", guest_tests.len());
    let mut program_refs: Vec<&Executable> = programs.iter().collect();
    program_refs.extend(proxier.as_ref());
    let bin_dirs = parent_dirs(&program_refs);
    let mut layout = layout(
        workspace,
        bin_dirs.iter().map(PathBuf::as_path).collect(),
        &proxier_path,
    );
    let realapi = realapi::stage(workspace)?;
    if let Some(realapi) = &realapi {
        layout
            .exports
            .push((realapi::REALAPI_ENV, realapi.dir.clone()));
    }
    let plan = guest_scripts::TestPlan {
        tests: &guest_tests,
        filter,
        extra_args,
        binary_timeout_secs: config.binary_timeout.as_secs().max(1),
    };
    let script = guest_scripts::test_run_script(&layout, &plan);

    let as_is = realapi.map(|r| r.files).unwrap_or_default();
    let outcome = boot_with(&prepared, config, &files, &as_is, &script, &mut timings)?;
    timings.print(total.elapsed());
    match test_verdict(&outcome, config.timeout) {
        Ok(result) => {
            println!("xtask: vm-test PASSED: {result}");
            Ok(ExitCode::SUCCESS)
        }
        Err(reason) => {
            println!("xtask: vm-test FAILED: {reason}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// One program to run in the guest, with what it needs on the disk.
struct ProgramRun<'a> {
    files: Vec<PathBuf>,
    program: &'a str,
    args: &'a [String],
    layout: RunLayout<'a>,
}

fn run_program(
    prepared: &Prepared,
    config: &VmConfig,
    run: ProgramRun<'_>,
    mut timings: Timings,
    total: Instant,
) -> Result<ExitCode> {
    let ProgramRun {
        mut files,
        program,
        args,
        layout,
    } = run;
    let workspace = &prepared.workspace;
    let host_program = Path::new(program);
    let program = if host_program.is_file() {
        let absolute = std::fs::canonicalize(host_program)?;
        files.push(absolute.clone());
        guest_path(workspace, &absolute)
            .to_string_lossy()
            .into_owned()
    } else {
        program.to_owned()
    };
    // Arguments that name host files (a script's inputs, test binaries to loop) are
    // copied in as well and passed by their guest path.
    let mut guest_args = Vec::with_capacity(args.len());
    for arg in args {
        let host = Path::new(arg);
        if host.is_file() {
            let absolute = std::fs::canonicalize(host)?;
            files.push(absolute.clone());
            guest_args.push(
                guest_path(workspace, &absolute)
                    .to_string_lossy()
                    .into_owned(),
            );
        } else {
            guest_args.push(arg.clone());
        }
    }
    let script = guest_scripts::program_run_script(&layout, &program, &guest_args);
    let outcome = boot_with(prepared, config, &files, &[], &script, &mut timings)?;
    timings.print(total.elapsed());
    match run_verdict(&outcome, config.timeout) {
        Ok(0) => Ok(ExitCode::SUCCESS),
        Ok(status) => {
            println!("xtask: {program} exited with status {status} in the VM");
            Ok(ExitCode::from(u8::try_from(status).unwrap_or(1).max(1)))
        }
        Err(reason) => {
            println!("xtask: VM run FAILED: {reason}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `cargo xtask vm-run -- PROGRAM [ARGS...]`.
pub fn vm_run(release: bool, command: &[String], config: &VmConfig) -> Result<ExitCode> {
    let total = Instant::now();
    let (program, args) = command
        .split_first()
        .context("vm-run needs a program to run")?;
    let prepared = prepare(config)?;
    let workspace = &prepared.workspace;
    let profile = if release {
        Profile::Release
    } else {
        Profile::Debug
    };
    let mut timings = Timings::default();
    let started = Instant::now();
    let proxier = artifacts::build_proxier(workspace, profile)?;
    let programs = artifacts::build_test_programs(workspace, profile)?;
    timings.cargo_build = started.elapsed();
    let mut files: Vec<PathBuf> = programs.iter().map(|p| p.path.clone()).collect();
    files.push(proxier.path.clone());
    let mut refs: Vec<&Executable> = programs.iter().collect();
    refs.push(&proxier);
    let bin_dirs = parent_dirs(&refs);
    let layout = layout(
        workspace,
        bin_dirs.iter().map(PathBuf::as_path).collect(),
        &proxier.path,
    );
    let run = ProgramRun {
        files,
        program,
        args,
        layout,
    };
    run_program(&prepared, config, run, timings, total)
}

/// `cargo xtask vm-bench NAME [ARGS...]`.
pub fn vm_bench(name: &str, args: &[String], config: &VmConfig) -> Result<ExitCode> {
    let total = Instant::now();
    let prepared = prepare(config)?;
    let workspace = &prepared.workspace;
    let mut timings = Timings::default();
    let started = Instant::now();
    let bench = artifacts::build_bench(workspace, name)?;
    let proxier = artifacts::build_proxier(workspace, Profile::Release)?;
    timings.cargo_build = started.elapsed();
    let files = vec![bench.path.clone(), proxier.path.clone()];
    let bin_dirs = parent_dirs(&[&bench, &proxier]);
    let layout = layout(
        workspace,
        bin_dirs.iter().map(PathBuf::as_path).collect(),
        &proxier.path,
    );
    let program = bench.path.to_string_lossy().into_owned();
    let run = ProgramRun {
        files,
        program: &program,
        args,
        layout,
    };
    run_program(&prepared, config, run, timings, total)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn passed() -> GuestOutcome {
        GuestOutcome {
            test_result: Some("PASS 2 binaries, 0 failed".into()),
            ..GuestOutcome::default()
        }
    }

    #[test]
    fn only_a_pass_marker_passes() {
        let timeout = Duration::from_secs(60);
        assert!(test_verdict(&passed(), timeout).is_ok());
        let failed = GuestOutcome {
            test_result: Some("FAIL 2 binaries, 1 failed".into()),
            ..GuestOutcome::default()
        };
        assert!(test_verdict(&failed, timeout).is_err());
        assert!(test_verdict(&GuestOutcome::default(), timeout).is_err());
    }

    #[test]
    fn panic_or_timeout_fails_even_after_a_pass_marker() {
        let timeout = Duration::from_secs(60);
        let panicked = GuestOutcome {
            panicked: true,
            ..passed()
        };
        assert!(test_verdict(&panicked, timeout).is_err());
        let timed_out = GuestOutcome {
            timed_out: true,
            ..passed()
        };
        assert!(
            test_verdict(&timed_out, timeout)
                .unwrap_err()
                .contains("timeout")
        );
    }

    #[test]
    fn program_status_is_passed_through() {
        let timeout = Duration::from_secs(60);
        let outcome = GuestOutcome {
            run_exit: Some(3),
            ..GuestOutcome::default()
        };
        assert_eq!(run_verdict(&outcome, timeout), Ok(3));
        assert!(run_verdict(&GuestOutcome::default(), timeout).is_err());
    }
}
