//! Building the binaries that go into the VM, and reading cargo's JSON
//! messages to find them.

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context, Result, bail};

use crate::workspace::Workspace;

/// One executable cargo produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executable {
    /// Name of the cargo target (`kernel_smoke`, `ipvs-proxier`, ...).
    pub target_name: String,
    /// Package the target belongs to.
    pub package: String,
    /// Absolute path of the file.
    pub path: PathBuf,
    /// Built with the test harness (a test binary), as opposed to a program.
    pub is_test: bool,
}

/// Extracts the executables from cargo's `--message-format=json` output.
pub fn parse_executables(json_lines: &str) -> Vec<Executable> {
    let mut found = Vec::new();
    for line in json_lines.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(path) = message["executable"].as_str() else {
            continue;
        };
        let package_id = message["package_id"].as_str().unwrap_or_default();
        found.push(Executable {
            target_name: message["target"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            package: package_name(package_id),
            path: PathBuf::from(path),
            is_test: message["profile"]["test"].as_bool().unwrap_or(false),
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found.dedup_by(|a, b| a.path == b.path);
    found
}

/// Package name from a cargo package id, in either the old
/// (`name 0.1.0 (path+file://...)`) or the new (`path+file:///dir#name@0.1.0`) form.
fn package_name(package_id: &str) -> String {
    if let Some((_, fragment)) = package_id.rsplit_once('#') {
        let name = fragment.split('@').next().unwrap_or(fragment);
        // `path+file:///x/tests#0.1.0` when the name equals the directory name.
        if name.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            let dir = package_id[..package_id.len() - fragment.len() - 1]
                .rsplit('/')
                .next();
            return dir.unwrap_or_default().to_owned();
        }
        return name.to_owned();
    }
    package_id.split(' ').next().unwrap_or_default().to_owned()
}

/// Runs `cargo <args> --message-format=json-render-diagnostics` and returns the executables.
fn cargo_executables(workspace: &Workspace, args: &[&str]) -> Result<Vec<Executable>> {
    let shown = format!("cargo {}", args.join(" "));
    println!("xtask: {shown}");
    let output = workspace
        .cargo()
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {shown}"))?;
    if !output.status.success() {
        bail!("{shown} failed ({})", output.status);
    }
    Ok(parse_executables(&String::from_utf8_lossy(&output.stdout)))
}

/// Which test binaries to build: all of the workspace, or some packages and/or test targets.
#[derive(Debug, Clone, Default)]
pub struct TestSelection {
    /// `-p` packages (empty: the whole workspace).
    pub packages: Vec<String>,
    /// `--test` integration test targets (empty: every test target).
    pub test_targets: Vec<String>,
}

impl TestSelection {
    /// Whether every test binary of the workspace is selected.
    pub fn is_everything(&self) -> bool {
        self.packages.is_empty() && self.test_targets.is_empty()
    }

    fn cargo_args(&self) -> Vec<&str> {
        let mut args = vec!["test", "--no-run"];
        if self.packages.is_empty() {
            args.push("--workspace");
        }
        for package in &self.packages {
            args.extend(["-p", package.as_str()]);
        }
        for test in &self.test_targets {
            args.extend(["--test", test.as_str()]);
        }
        args
    }
}

/// The daemon's binary target (package `proxier-bin`).
const DAEMON: &str = "ipvs-proxier";

/// The packages whose programs go into the VM beside the daemon ([`build_test_programs`]).
const PROGRAM_PACKAGES: [&str; 2] = ["ipvs-proxier-tests", "ipvs-proxier-examples"];

/// What one `cargo test --no-run` produced: the test binaries, and the programs cargo built
/// beside them (a package's binaries are built whenever one of its integration tests is).
#[derive(Debug, Clone, Default)]
pub struct TestBuild {
    /// The test binaries.
    pub tests: Vec<Executable>,
    /// The programs (`bin` targets) built for the tests.
    pub programs: Vec<Executable>,
}

impl TestBuild {
    fn from_executables(executables: Vec<Executable>) -> TestBuild {
        let (tests, programs) = executables.into_iter().partition(|e| e.is_test);
        TestBuild { tests, programs }
    }

    /// The daemon, if the test build made it.
    pub fn proxier(&self) -> Option<&Executable> {
        self.programs.iter().find(|e| e.target_name == DAEMON)
    }

    /// The programs [`build_test_programs`] would build, if the test build made them: taking
    /// them from it spares a second build of the dependencies with other features (cargo
    /// unifies a dependency's features over what one invocation builds, so `cargo build -p`
    /// of one package compiles another copy of each dependency whose features differ, and a
    /// CI machine's disk holds every copy).
    pub fn test_programs(&self) -> Option<Vec<Executable>> {
        let programs: Vec<Executable> = self
            .programs
            .iter()
            .filter(|e| PROGRAM_PACKAGES.contains(&e.package.as_str()))
            .cloned()
            .collect();
        let complete = PROGRAM_PACKAGES
            .iter()
            .all(|package| programs.iter().any(|e| e.package == *package));
        complete.then_some(programs)
    }
}

/// The selected test binaries (`cargo test --workspace --no-run` by default), with the
/// programs built beside them.
pub fn build_test_binaries(workspace: &Workspace, selection: &TestSelection) -> Result<TestBuild> {
    let all = cargo_executables(workspace, &selection.cargo_args())?;
    Ok(TestBuild::from_executables(all))
}

/// Build profile of the programs put into the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `dev` (debug) profile.
    Debug,
    /// `release` profile.
    Release,
}

impl Profile {
    fn flag(self) -> Option<&'static str> {
        match self {
            Profile::Debug => None,
            Profile::Release => Some("--release"),
        }
    }
}

/// The `ipvs-proxier` daemon binary.
pub fn build_proxier(workspace: &Workspace, profile: Profile) -> Result<Executable> {
    let mut args = vec!["build", "-p", "proxier-bin", "--bin", DAEMON];
    args.extend(profile.flag());
    let found = cargo_executables(workspace, &args)?;
    found
        .into_iter()
        .find(|e| e.target_name == DAEMON)
        .context("cargo build -p proxier-bin produced no ipvs-proxier executable")
}

/// The programs in `tests/src/bin/` (benchmarks and helpers) and `examples/src/bin/` (the
/// example programs, which VM tests run: they land next to `ipvs-proxier`, on the guest's PATH).
pub fn build_test_programs(workspace: &Workspace, profile: Profile) -> Result<Vec<Executable>> {
    let mut args = vec!["build"];
    for package in PROGRAM_PACKAGES {
        args.extend(["-p", package]);
    }
    args.push("--bins");
    args.extend(profile.flag());
    cargo_executables(workspace, &args)
}

/// One benchmark program `vm-bench-NAME`, release build.
pub fn build_bench(workspace: &Workspace, name: &str) -> Result<Executable> {
    let bin = format!("vm-bench-{name}");
    let found = cargo_executables(
        workspace,
        &[
            "build",
            "--release",
            "-p",
            "ipvs-proxier-tests",
            "--bin",
            &bin,
        ],
    )?;
    found
        .into_iter()
        .find(|e| e.target_name == bin)
        .with_context(|| format!("cargo produced no executable for {bin}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn test_binaries_and_programs_are_told_apart() {
        let json = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/tests#ipvs-proxier-tests@0.1.0","target":{"kind":["test"],"name":"kernel_smoke"},"profile":{"test":true},"executable":"/w/target/debug/deps/kernel_smoke-1"}
{"reason":"compiler-artifact","package_id":"path+file:///w/tests#ipvs-proxier-tests@0.1.0","target":{"kind":["lib"],"name":"ipvs_proxier_tests"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w/proxier-bin#0.1.0","target":{"kind":["bin"],"name":"ipvs-proxier"},"profile":{"test":false},"executable":"/w/target/debug/ipvs-proxier"}
{"reason":"build-finished","success":true}
not json"#;
        let found = parse_executables(json);
        assert_eq!(found.len(), 2);
        let daemon = found
            .iter()
            .find(|e| e.target_name == "ipvs-proxier")
            .unwrap();
        assert_eq!(daemon.package, "proxier-bin");
        assert_eq!(daemon.path, PathBuf::from("/w/target/debug/ipvs-proxier"));
        assert!(!daemon.is_test);
        let smoke = found
            .iter()
            .find(|e| e.target_name == "kernel_smoke")
            .unwrap();
        assert_eq!(smoke.package, "ipvs-proxier-tests");
        assert!(smoke.is_test);
    }

    fn program(package: &str, name: &str) -> Executable {
        Executable {
            target_name: name.to_owned(),
            package: package.to_owned(),
            path: PathBuf::from(format!("/w/target/debug/{name}")),
            is_test: false,
        }
    }

    #[test]
    fn a_test_build_gives_its_programs_only_when_it_made_those_of_every_program_package() {
        let test = Executable {
            is_test: true,
            ..program("ipvs-proxier-tests", "kernel_smoke")
        };
        let everything = TestBuild::from_executables(vec![
            test.clone(),
            program("proxier-bin", "ipvs-proxier"),
            program("ipvs-proxier-tests", "vm-bench-ipvs"),
            program("ipvs-proxier-examples", "cni-proxier"),
        ]);
        assert_eq!(everything.tests, std::slice::from_ref(&test));
        assert_eq!(everything.proxier().unwrap().package, "proxier-bin");
        let names: Vec<String> = everything
            .test_programs()
            .unwrap()
            .into_iter()
            .map(|e| e.target_name)
            .collect();
        assert_eq!(names, ["vm-bench-ipvs", "cni-proxier"]);

        // `--test kernel_smoke -p ipvs-proxier-tests`: the examples' programs were not built.
        let some =
            TestBuild::from_executables(vec![test, program("ipvs-proxier-tests", "vm-bench-ipvs")]);
        assert!(some.proxier().is_none());
        assert!(some.test_programs().is_none());
    }

    #[test]
    fn selection_maps_to_cargo_test_arguments() {
        assert_eq!(
            TestSelection::default().cargo_args(),
            ["test", "--no-run", "--workspace"]
        );
        let some = TestSelection {
            packages: vec!["a".into()],
            test_targets: vec!["t".into()],
        };
        assert_eq!(
            some.cargo_args(),
            ["test", "--no-run", "-p", "a", "--test", "t"]
        );
        assert!(!some.is_everything());
    }

    #[test]
    fn old_style_package_ids_give_the_name() {
        assert_eq!(package_name("xtask 0.1.0 (path+file:///w/xtask)"), "xtask");
    }
}
