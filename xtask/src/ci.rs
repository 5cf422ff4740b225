//! `cargo xtask test`: every check CI runs, in order, stopping at the first failure:
//! fmt, clippy, public API, host tests, cargo-deny, kernel tests in a VM.

use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::artifacts::TestSelection;
use crate::deps;
use crate::public_api;
use crate::vm::{self, VmConfig};
use crate::workspace::Workspace;

/// One host step of the full check.
struct Step {
    name: &'static str,
    args: &'static [&'static str],
}

/// Between clippy and the host tests: `cargo xtask public-api` (reads sources only, so it
/// runs in-process and compiles nothing).
const PUBLIC_API_AFTER: &str = "clippy";

const HOST_STEPS: &[Step] = &[
    Step {
        name: "format",
        args: &["fmt", "--all", "--check"],
    },
    Step {
        name: "clippy",
        args: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    },
    Step {
        name: "host tests",
        args: &["test", "--workspace"],
    },
    Step {
        name: "licenses, bans and sources",
        args: &["deny", "check", "licenses", "bans", "sources"],
    },
];

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

/// Runs fmt, clippy, the public API check, host tests, cargo-deny and then the VM tests.
pub fn full_test(config: &VmConfig) -> Result<ExitCode> {
    let started = Instant::now();
    let workspace = Workspace::locate()?;
    for step in HOST_STEPS {
        if step.args[0] == "deny" {
            ensure_cargo_deny(&workspace)?;
        }
        println!("xtask: == {}: cargo {}", step.name, step.args.join(" "));
        let step_started = Instant::now();
        let status = run(workspace.cargo().args(step.args))?;
        if !status {
            println!(
                "xtask: FAILED at step '{}' (cargo {}); fix it and run `cargo xtask test` again",
                step.name,
                step.args.join(" ")
            );
            return Ok(ExitCode::FAILURE);
        }
        println!(
            "xtask: == {} passed in {:.1}s",
            step.name,
            step_started.elapsed().as_secs_f64()
        );
        if step.name == PUBLIC_API_AFTER && !public_api_step(&workspace)? {
            return Ok(ExitCode::FAILURE);
        }
    }
    println!("xtask: == kernel tests: cargo xtask vm-test");
    let code = vm::vm_test(None, &TestSelection::default(), &[], config)?;
    if code == ExitCode::SUCCESS {
        println!(
            "xtask: all checks passed in {:.1}s",
            started.elapsed().as_secs_f64()
        );
    } else {
        println!("xtask: FAILED at step 'kernel tests' (cargo xtask vm-test)");
    }
    Ok(code)
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

fn run(command: &mut Command) -> Result<bool> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    Ok(status.success())
}
