//! Build and test automation for the workspace: the VM test runner
//! (`cargo xtask vm-test`), one-off VM programs and benchmarks
//! (`vm-run`, `vm-bench`), the benchmark page (`bench-report`), the public API guard
//! (`public-api`), the offline advisory check (`advisories`) and the CI entry
//! (`cargo xtask test`).

mod advisories;
mod artifacts;
mod bench_report;
mod ci;
mod cpio;
mod debian_archive;
mod deps;
mod disk;
mod guest_kernel;
mod guest_modules;
mod guest_scripts;
mod initramfs;
mod public_api;
mod qemu;
mod realapi;
mod vm;
mod workspace;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Workspace automation.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// VM options shared by the commands that boot the test VM.
#[derive(Debug, clap::Args)]
struct VmOptions {
    /// Give up (and fail) when the guest has not finished after this many minutes.
    #[arg(long, default_value_t = 40)]
    timeout_minutes: u64,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 2048)]
    memory_mib: u32,
    /// Put binaries into the VM with their debug info (line numbers in
    /// backtraces); by default it is stripped from the VM's copy, which makes
    /// the disk image several times smaller.
    #[arg(long)]
    keep_debug: bool,
    /// vm-test: kill a test binary still running after this many minutes (it counts as failed).
    #[arg(long, default_value_t = 15)]
    binary_timeout_minutes: u64,
    /// The guest kernel: Debian's cloud kernel of bullseye (5.10), bookworm (6.1, the
    /// host's package) or trixie (6.12); the others are fetched from Debian's archive.
    #[arg(long, value_enum, default_value = "6.1")]
    kernel: guest_kernel::KernelChoice,
    /// The guest's nft: the host's (Debian 12, 1.0.6) or trixie's (1.1.x, fetched).
    #[arg(long, value_enum, default_value = "host")]
    nft: guest_kernel::NftChoice,
}

impl VmOptions {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_minutes.saturating_mul(60))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build every test binary of the workspace and run them all as root in a qemu VM
    /// with a real distribution kernel (IPVS, dummy links, nftables).
    VmTest {
        /// Only run tests whose name contains this string (passed to every test binary).
        filter: Option<String>,
        /// Only build and run the tests of these packages (default: the whole workspace).
        /// A failure to build ipvs-proxier is then only a warning.
        #[arg(short, long = "package")]
        packages: Vec<String>,
        /// Only build and run these integration test targets (`tests/tests/NAME.rs`).
        #[arg(long = "test")]
        test_targets: Vec<String>,
        /// Run only these test binaries (target names) of the whole-workspace build: how
        /// `cargo xtask test` runs the matrix's later boots.
        #[arg(long = "only-target", hide = true)]
        only_targets: Vec<String>,
        #[command(flatten)]
        vm: VmOptions,
        /// More arguments for every test binary (after `--`), e.g. `-- --exact`.
        #[arg(last = true)]
        test_args: Vec<String>,
    },
    /// Boot the test VM and run one program in it (a host file is copied in;
    /// otherwise the name is looked up on the guest's PATH). Arguments that name
    /// host files are copied in too and passed by their path in the guest.
    VmRun {
        /// Use the release build of ipvs-proxier as IPVS_PROXIER_BIN.
        #[arg(long)]
        release: bool,
        #[command(flatten)]
        vm: VmOptions,
        /// The program and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Build `tests/src/bin/vm-bench-NAME.rs` in release mode and run it in the VM.
    VmBench {
        #[command(flatten)]
        vm: VmOptions,
        /// Benchmark name: runs the binary `vm-bench-NAME`.
        name: String,
        /// Arguments for the benchmark.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the VM benchmarks (`vm-bench ipvs`, `vm-bench proxier`, `vm-bench traffic`, one
    /// boot each) and write `docs/benchmarks.md` from the reports they print.
    BenchReport {
        /// Virtual services (ClusterIP Services for the daemon).
        #[arg(long, default_value_t = 10_000)]
        services: usize,
        /// Destinations per service (endpoints per Service for the daemon).
        #[arg(long, default_value_t = 5)]
        dests: usize,
        /// Endpoint changes timed through the API server double.
        #[arg(long, default_value_t = 100)]
        changes: usize,
        /// Services of the small cluster the changes are also timed on.
        #[arg(long, default_value_t = 100)]
        small: usize,
        /// Where to write the page (relative to the workspace root).
        #[arg(long, default_value = "docs/benchmarks.md")]
        output: std::path::PathBuf,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = bench_report::DEFAULT_MEMORY_MIB)]
        memory_mib: u32,
        /// Give up on a benchmark whose VM has not finished after this many minutes.
        #[arg(long, default_value_t = 60)]
        timeout_minutes: u64,
        /// Run `vm-bench traffic` alone and rewrite only its section of the page.
        #[arg(long, conflicts_with = "soak_only")]
        traffic_only: bool,
        /// Run `vm-bench soak` alone and rewrite only its section of the page.
        #[arg(long)]
        soak_only: bool,
        /// How long the soak churns (with `--soak-only`), in minutes.
        #[arg(long, default_value_t = 5.0)]
        minutes: f64,
        /// With `--soak-only`: inject faults (kill -9 and restart, API outage, 410 storm)
        /// and write the section of the soak with faults.
        #[arg(long, requires = "soak_only")]
        faults: bool,
        /// With `--soak-only`: the daemon takes the ClusterIP range with one local route
        /// (`--bind-service-cidrs`) and the section of that soak is written.
        #[arg(long, requires = "soak_only", conflicts_with = "faults")]
        bind_service_cidrs: bool,
        /// Run `vm-bench proxier` with the kube source and `--bind-service-cidrs` at 10,000
        /// and at `--services` Services (two boots) and rewrite only the scale section.
        #[arg(long, conflicts_with_all = ["soak_only", "traffic_only"])]
        scale_only: bool,
        /// The guest kernel (as for vm-test).
        #[arg(long, value_enum, default_value = "6.1")]
        kernel: guest_kernel::KernelChoice,
    },
    /// Compare the public API of ipvs-netlink and proxier-core (read from their sources)
    /// with the snapshots in `xtask/public-api/`; print the differences.
    PublicApi {
        /// Rewrite the snapshots from the current sources instead of comparing.
        #[arg(long)]
        bless: bool,
    },
    /// `cargo deny check advisories` against the offline RustSec snapshot beside the clone
    /// (or at $IPVS_PROXIER_ADVISORY_DB), as the full check runs it.
    Advisories,
    /// The full check, as CI runs it: fmt, clippy, public API, library docs, host tests,
    /// packaging of the libraries, cargo-deny (advisories from the offline snapshot), vm-test.
    Test {
        #[command(flatten)]
        vm: VmOptions,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::VmTest {
            filter,
            packages,
            test_targets,
            only_targets,
            vm,
            test_args,
        } => {
            let selection = artifacts::TestSelection {
                packages,
                test_targets,
            };
            let only: Vec<&str> = only_targets.iter().map(String::as_str).collect();
            vm::vm_test_binaries(
                filter.as_deref(),
                &selection,
                &only,
                &test_args,
                &vm.to_config(),
            )
        }
        Command::VmRun {
            release,
            vm,
            command,
        } => vm::vm_run(release, &command, &vm.to_config()),
        Command::VmBench { vm, name, args } => {
            let config = vm::VmConfig {
                single_thread_tcg: false,
                ..vm.to_config()
            };
            vm::vm_bench(&name, &args, &config)
        }
        Command::BenchReport {
            services,
            dests,
            changes,
            small,
            output,
            memory_mib,
            timeout_minutes,
            traffic_only,
            soak_only,
            minutes,
            faults,
            bind_service_cidrs,
            scale_only,
            kernel,
        } => {
            let options = bench_report::Options {
                services,
                dests,
                changes,
                small,
                output,
                traffic_only,
                soak_only,
                minutes,
                faults,
                bind_service_cidrs,
                scale_only,
            };
            let config = vm::VmConfig {
                timeout: Duration::from_secs(timeout_minutes.saturating_mul(60)),
                memory_mib,
                keep_debug: false,
                binary_timeout: Duration::from_secs(timeout_minutes.saturating_mul(60)),
                kernel,
                nft: guest_kernel::NftChoice::Host,
                single_thread_tcg: false,
            };
            bench_report::run(&options, &config)
        }
        Command::PublicApi { bless } => public_api::run(bless),
        Command::Advisories => ci::advisories_only(),
        Command::Test { vm } => ci::full_test(&vm.to_config()),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

impl VmOptions {
    fn to_config(&self) -> vm::VmConfig {
        vm::VmConfig {
            timeout: self.timeout(),
            memory_mib: self.memory_mib,
            keep_debug: self.keep_debug,
            binary_timeout: Duration::from_secs(self.binary_timeout_minutes.saturating_mul(60)),
            kernel: self.kernel,
            nft: self.nft,
            single_thread_tcg: vm::VmConfig::single_thread_for_tests(self.kernel),
        }
    }
}
