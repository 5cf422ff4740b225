//! `cargo xtask test`: every check CI runs, in order, stopping at the first failure:
//! fmt, clippy, public API, library docs, host tests, packaging of the library crates,
//! cargo-deny (licenses, bans, sources; then advisories against the offline snapshot),
//! kernel tests in a VM on each kernel and nft of the matrix ([`KERNEL_MATRIX`]).

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::advisories;
use crate::artifacts::TestSelection;
use crate::deps;
use crate::guest_kernel::{self, KernelChoice, NftChoice};
use crate::public_api;
use crate::vm::{self, VmConfig};
use crate::workspace::Workspace;

/// One host step of the full check: `cargo <args>` with `env` set.
struct Step {
    name: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, OsString)>,
}

impl Step {
    fn new(name: &'static str, args: &[&str]) -> Step {
        Step {
            name,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: Vec::new(),
        }
    }

    /// The step with `-p <package>` for each package appended.
    fn packages(mut self, packages: &[String]) -> Step {
        for package in packages {
            self.args.extend(["-p".to_owned(), package.clone()]);
        }
        self
    }

    fn env(mut self, key: &'static str, value: impl Into<OsString>) -> Step {
        self.env.push((key, value.into()));
        self
    }

    fn uses_cargo_deny(&self) -> bool {
        self.args.first().is_some_and(|a| a == "deny")
    }
}

/// The step that packages the libraries (see [`forget_extracted_packages`]).
const PACKAGE_STEP: &str = "package libraries";

/// Removes the workspace libraries' sources that an earlier `cargo package` extracted under
/// `$CARGO_HOME/registry/src/` (and their `.crate` copies under `registry/cache/`). Packaging
/// verifies each library against the others' packages through a temporary local registry,
/// whose sources cargo extracts once and then trusts while the version stays the same: a
/// second run on the same machine would build against the first run's code.
fn forget_extracted_packages(libraries: &[String]) -> Result<()> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    for kind in ["src", "cache"] {
        let Ok(registries) = std::fs::read_dir(cargo_home.join("registry").join(kind)) else {
            continue;
        };
        for registry in registries.flatten() {
            let Ok(entries) = std::fs::read_dir(registry.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let ours = libraries.iter().any(|library| {
                    name.strip_prefix(library.as_str())
                        .and_then(|rest| rest.strip_prefix('-'))
                        .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
                });
                if !ours {
                    continue;
                }
                let path = entry.path();
                let removed = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                removed.with_context(|| format!("removing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

/// Between clippy and the library docs: `cargo xtask public-api` (reads sources only, so it
/// runs in-process and compiles nothing).
const PUBLIC_API_AFTER: &str = "clippy";

/// The host steps, in order. The library crates are the workspace's publishable packages
/// ([`Workspace::published_packages`]): a new library crate is documented and packaged
/// here as soon as its manifest says `publish = true`.
fn host_steps(workspace: &Workspace) -> Result<Vec<Step>> {
    let libraries = workspace.published_packages()?;
    anyhow::ensure!(
        !libraries.is_empty(),
        "no publishable package in the workspace"
    );
    let mut steps = vec![
        Step::new("format", &["fmt", "--all", "--check"]),
        Step::new(
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        Step::new("library docs", &["doc", "--no-deps"])
            .packages(&libraries)
            .env("RUSTDOCFLAGS", "-D warnings"),
        Step::new("host tests", &["test", "--workspace"]),
        // All libraries in one call: a library that depends on another by path and version
        // is packaged against the other's package (a local registry of them), not
        // crates.io. Verifying builds each package as crates.io would (after the host
        // tests, most dependencies are already built); --allow-dirty so that a local run
        // with uncommitted changes packages them rather than failing.
        Step::new(PACKAGE_STEP, &["package", "--locked", "--allow-dirty"]).packages(&libraries),
        Step::new(
            "licenses, bans and sources",
            &["deny", "check", "licenses", "bans", "sources"],
        ),
    ];
    // After the licenses step, whose `cargo deny` fetched every crate of the graph.
    steps.extend(advisory_step(workspace)?);
    Ok(steps)
}

/// `cargo deny --offline check advisories` against the snapshot laid out by
/// [`advisories::prepare`]: `--offline` keeps cargo-deny from fetching the database, and
/// from fetching crates, so they must have been fetched before. `None` (printed) when there
/// is no snapshot outside CI; in CI that is an error.
fn advisory_step(workspace: &Workspace) -> Result<Option<Step>> {
    let snapshot = match advisories::find_snapshot(workspace) {
        Ok(snapshot) => snapshot,
        Err(err) if std::env::var_os("CI").is_some() => {
            return Err(err.context("the advisory check needs the RustSec snapshot in CI"));
        }
        Err(err) => {
            println!("xtask: the advisory check will be skipped: {err:#}");
            return Ok(None);
        }
    };
    let version =
        advisories::snapshot_version(&snapshot).unwrap_or_else(|| "of unknown date".to_owned());
    println!(
        "xtask: advisories from the RustSec snapshot at {} ({version})",
        snapshot.display()
    );
    let root = advisories::prepare(workspace, &snapshot)?;
    Ok(Some(
        Step::new("advisories", &["deny", "--offline", "check", "advisories"])
            .env(advisories::DB_ROOT_ENV, root),
    ))
}

/// `cargo xtask advisories`: the advisory step alone, after a `cargo fetch`.
pub fn advisories_only() -> Result<ExitCode> {
    let workspace = Workspace::locate()?;
    ensure_cargo_deny(&workspace)?;
    let Some(step) = advisory_step(&workspace)? else {
        return Ok(ExitCode::FAILURE);
    };
    if !run(workspace.cargo().arg("fetch"))? {
        println!("xtask: cargo fetch failed");
        return Ok(ExitCode::FAILURE);
    }
    println!("xtask: == {}: {}", step.name, shown(&step));
    let passed = run(workspace
        .cargo()
        .args(&step.args)
        .envs(step.env.iter().cloned()))?;
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Makes sure `cargo deny` works, installing cargo-deny when it is missing.
fn ensure_cargo_deny(workspace: &Workspace) -> Result<()> {
    let works = workspace
        .cargo()
        .args(["deny", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if works {
        return Ok(());
    }
    if deps::find_command("cargo-deny").is_some() {
        return Ok(());
    }
    println!("xtask: cargo-deny missing: cargo install cargo-deny --locked");
    let status = workspace
        .cargo()
        .args(["install", "cargo-deny", "--locked"])
        .status()
        .context("running cargo install cargo-deny")?;
    anyhow::ensure!(
        status.success(),
        "cargo install cargo-deny failed ({status})"
    );
    Ok(())
}

/// Runs the host steps ([`host_steps`], the public API check after clippy) and then the VM
/// tests.
pub fn full_test(config: &VmConfig) -> Result<ExitCode> {
    let started = Instant::now();
    let workspace = Workspace::locate()?;
    for step in host_steps(&workspace)? {
        if step.uses_cargo_deny() {
            ensure_cargo_deny(&workspace)?;
        }
        if step.name == PACKAGE_STEP {
            forget_extracted_packages(&workspace.published_packages()?)?;
        }
        let shown = shown(&step);
        println!("xtask: == {}: {shown}", step.name);
        let step_started = Instant::now();
        let status = run(workspace
            .cargo()
            .args(&step.args)
            .envs(step.env.iter().cloned()))?;
        if !status {
            println!(
                "xtask: FAILED at step '{}' ({shown}){}; fix it and run `cargo xtask test` \
                 again",
                step.name,
                free_disk(&workspace.target_dir)
            );
            return Ok(ExitCode::FAILURE);
        }
        println!(
            "xtask: == {} passed in {:.1}s{}",
            step.name,
            step_started.elapsed().as_secs_f64(),
            free_disk(&workspace.target_dir)
        );
        if step.name == PUBLIC_API_AFTER && !public_api_step(&workspace)? {
            return Ok(ExitCode::FAILURE);
        }
    }
    if !kernel_matrix(&workspace, config)? {
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "xtask: all checks passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs [`KERNEL_MATRIX`]: the first boot (the whole suite, both host cores under
/// multi-threaded TCG) alone, then the others in their lanes at once, each boot a
/// `cargo xtask vm-test` of its own (the fetched kernels boot with single-threaded TCG, one
/// host core each), its output kept in a file and printed when its lane is done. Whether
/// every boot passed.
fn kernel_matrix(workspace: &Workspace, config: &VmConfig) -> Result<bool> {
    let Some((first, later)) = KERNEL_MATRIX.split_first() else {
        return Ok(true);
    };
    let shown = first.command();
    println!("xtask: == kernel tests: {shown}");
    let started = Instant::now();
    let config_first = VmConfig {
        kernel: first.kernel,
        nft: first.nft,
        single_thread_tcg: VmConfig::single_thread_for_tests(first.kernel),
        ..config.clone()
    };
    // Every boot takes its binaries from the one whole-workspace build. A kernel or nft
    // that cannot be fetched is an error here, not a skipped boot.
    let code = vm::vm_test_binaries(
        None,
        &TestSelection::default(),
        &first.binaries(),
        &[],
        &config_first,
    )?;
    if code != ExitCode::SUCCESS {
        println!(
            "xtask: FAILED at step 'kernel tests' ({shown}){}",
            free_disk(&workspace.target_dir)
        );
        return Ok(false);
    }
    first.passed(started.elapsed());

    // The later boots' kernels and nft, fetched one at a time (they share one apt state).
    let vm_dir = workspace.vm_dir();
    for run in later {
        guest_kernel::resolve(run.kernel, &vm_dir)?;
        guest_kernel::resolve_nft(run.nft, &vm_dir)?;
    }
    let lanes: Vec<Vec<&MatrixRun>> = (0..=later.iter().map(|r| r.lane).max().unwrap_or(0))
        .map(|lane| later.iter().filter(|r| r.lane == lane).collect())
        .collect();
    println!(
        "xtask: == kernel tests: {} boots in {} lanes at once: {}",
        later.len(),
        lanes.len(),
        later
            .iter()
            .map(|r| format!("{}/{}", r.kernel.name(), r.nft.name()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let results: Vec<Result<Vec<BootResult>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = lanes
            .iter()
            .map(|lane| scope.spawn(|| run_lane(&vm_dir, lane, config)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a lane of boots panicked")))
            })
            .collect()
    });
    let mut passed = true;
    for lane in results {
        for boot in lane? {
            println!("xtask: == kernel tests: {}", boot.run.command());
            let log = std::fs::read_to_string(&boot.log).unwrap_or_default();
            print!("{log}");
            if boot.passed {
                boot.run.passed(boot.took);
            } else {
                println!(
                    "xtask: FAILED at step 'kernel tests' ({}) after {:.1}s; its output: {}",
                    boot.run.command(),
                    boot.took.as_secs_f64(),
                    boot.log.display()
                );
                passed = false;
            }
        }
    }
    Ok(passed)
}

/// What one boot of a lane did.
struct BootResult {
    run: &'static MatrixRun,
    passed: bool,
    took: std::time::Duration,
    log: std::path::PathBuf,
}

/// Runs a lane's boots one after another, each as `xtask vm-test` with its output in
/// `target/vm/matrix-<kernel>-<nft>.log`; stops at the first that fails.
fn run_lane(
    vm_dir: &Path,
    lane: &[&'static MatrixRun],
    config: &VmConfig,
) -> Result<Vec<BootResult>> {
    let xtask = std::env::current_exe().context("finding the xtask binary")?;
    let mut done = Vec::new();
    for run in lane {
        let log = vm_dir.join(format!(
            "matrix-{}-{}.log",
            run.kernel.name(),
            run.nft.name()
        ));
        let output =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut command = Command::new(&xtask);
        command
            .args([
                "vm-test",
                "--kernel",
                run.kernel.name(),
                "--nft",
                run.nft.name(),
            ])
            .arg(format!(
                "--timeout-minutes={}",
                config.timeout.as_secs().div_ceil(60)
            ))
            .arg(format!("--memory-mib={}", config.memory_mib))
            .arg(format!(
                "--binary-timeout-minutes={}",
                config.binary_timeout.as_secs().div_ceil(60)
            ));
        if config.keep_debug {
            command.arg("--keep-debug");
        }
        for test in run.binaries() {
            command.arg(format!("--only-target={test}"));
        }
        println!(
            "xtask: starting {} (output: {})",
            run.command(),
            log.display()
        );
        let started = Instant::now();
        let status = command
            .stdin(std::process::Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .status()
            .with_context(|| format!("running {}", xtask.display()))?;
        let passed = status.success();
        done.push(BootResult {
            run,
            passed,
            took: started.elapsed(),
            log,
        });
        if !passed {
            break;
        }
    }
    Ok(done)
}

/// One boot of the kernel matrix: a kernel, the guest's nft, and the test binaries of
/// [`KERNEL_TESTS_PACKAGE`] it runs (empty: every test binary of the workspace).
struct MatrixRun {
    kernel: KernelChoice,
    nft: NftChoice,
    tests: &'static [&'static str],
    /// Binaries of `tests` this boot leaves out, each with its reason at the run.
    except: &'static [&'static str],
    /// The boots after the first run in lanes at once; a lane's boots one after another.
    lane: u8,
}

impl MatrixRun {
    /// The test binaries this boot runs (empty: every one).
    fn binaries(&self) -> Vec<&'static str> {
        self.tests
            .iter()
            .copied()
            .filter(|test| !self.except.contains(test))
            .collect()
    }
}

impl MatrixRun {
    fn passed(&self, took: std::time::Duration) {
        println!(
            "xtask: == kernel tests on {} with nft {} passed in {:.1}s",
            self.kernel.name(),
            self.nft.name(),
            took.as_secs_f64()
        );
    }

    /// The `cargo xtask vm-test` command line that runs the same boot.
    fn command(&self) -> String {
        let mut command = format!(
            "cargo xtask vm-test --kernel {} --nft {}",
            self.kernel.name(),
            self.nft.name()
        );
        if !self.tests.is_empty() {
            command.push_str(&format!(" -p {KERNEL_TESTS_PACKAGE}"));
            for test in self.binaries() {
                command.push_str(&format!(" --test {test}"));
            }
        }
        command
    }
}

/// The package of the kernel-facing suites.
const KERNEL_TESTS_PACKAGE: &str = "ipvs-proxier-tests";

/// The suites that touch what differs between kernels and nft releases: IPVS, the dummy
/// link's addresses, netfilter, Services end to end with real traffic, the takeover.
const KERNEL_FACING: &[&str] = &[
    "kernel_smoke",
    "ipvs_ops",
    "ipvs_roundtrip",
    "ipvs_errors",
    "reconciler_kernel",
    "netfilter_atomic",
    "netfilter_conntrack",
    "netfilter_sysctl",
    "netfilter_traffic",
    "netfilter_kernels",
    "e2e_services",
    "e2e_endpoints",
    "takeover_kube_proxy",
    "daemon_kernel",
];

/// The suites that differ by nft release alone.
const NFT_FACING: &[&str] = &[
    "netfilter_atomic",
    "netfilter_traffic",
    "netfilter_kernels",
    "e2e_services",
    "e2e_explain",
];

/// What CI boots (docs/kernels.md): the whole suite on the host's kernel and nft, the
/// kernel-facing suites on the oldest and newest kernels (the newest with the nft Debian 12
/// nodes have, the oldest with the nft the image ships), and the nft-facing suites on the
/// newest kernel with the image's nft. The first boot runs alone; the others in two lanes
/// at once (see [`kernel_matrix`]), balanced by their durations on a 2-core machine.
const KERNEL_MATRIX: &[MatrixRun] = &[
    MatrixRun {
        kernel: KernelChoice::Bookworm,
        nft: NftChoice::Host,
        tests: &[],
        except: &[],
        lane: 0,
    },
    MatrixRun {
        kernel: KernelChoice::Trixie,
        nft: NftChoice::Host,
        tests: KERNEL_FACING,
        except: &[],
        lane: 0,
    },
    MatrixRun {
        kernel: KernelChoice::Bullseye,
        nft: NftChoice::Trixie,
        tests: KERNEL_FACING,
        // Debian 12's iptables-nft (1.8.9) cannot insert into the nat table's built-in
        // chains on 5.10 (`RULE_INSERT failed (No such file or directory)`, even a plain
        // jump), so the takeover test cannot build kube-proxy's footprint there.
        except: &["takeover_kube_proxy"],
        lane: 1,
    },
    MatrixRun {
        kernel: KernelChoice::Trixie,
        nft: NftChoice::Trixie,
        tests: NFT_FACING,
        except: &[],
        lane: 1,
    },
];

/// `", N GiB free on the target directory's disk"`, or nothing when `df` cannot tell: a step
/// that fails for want of disk then says so beside its own error.
fn free_disk(target_dir: &Path) -> String {
    let Ok(output) = Command::new("df").arg("-Pk").arg(target_dir).output() else {
        return String::new();
    };
    match free_kib(&String::from_utf8_lossy(&output.stdout)) {
        Some(kib) => format!(", {:.1} GiB free for target/", kib as f64 / 1024.0 / 1024.0),
        None => String::new(),
    }
}

/// The available KiB in `df -Pk`'s output (its second line's fourth column).
fn free_kib(df_output: &str) -> Option<u64> {
    df_output
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

/// The "public API" step: the snapshots in `xtask/public-api/` must match the sources.
fn public_api_step(workspace: &Workspace) -> Result<bool> {
    println!("xtask: == public API: cargo xtask public-api");
    let started = Instant::now();
    if !public_api::check(workspace, false)? {
        println!(
            "xtask: FAILED at step 'public API' (cargo xtask public-api); if the change is \
             intended, run `cargo xtask public-api --bless`, commit the snapshots and run \
             `cargo xtask test` again"
        );
        return Ok(false);
    }
    println!(
        "xtask: == public API passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(true)
}

/// The step's command line as a shell would take it (environment first).
fn shown(step: &Step) -> String {
    let mut words: Vec<String> = step
        .env
        .iter()
        .map(|(key, value)| {
            let value = value.to_string_lossy();
            if value.contains(' ') {
                format!("{key}='{value}'")
            } else {
                format!("{key}={value}")
            }
        })
        .collect();
    words.push("cargo".to_owned());
    words.extend(step.args.iter().cloned());
    words.join(" ")
}

fn run(command: &mut Command) -> Result<bool> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_is_read_from_df_portable_output() {
        let df = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n\
                  /dev/vda        263174212  82903624  13631488      86% /\n";
        assert_eq!(free_kib(df), Some(13_631_488));
        assert_eq!(free_kib("df: /nowhere: No such file or directory\n"), None);
    }
}
