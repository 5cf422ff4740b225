//! Smallest VM benchmark: proves the `cargo xtask vm-bench` plumbing.
//! Prints the guest kernel, the IPVS version and its arguments, times adding
//! and listing a few IPVS services with ipvsadm in a fresh namespace, and
//! exits with the status given by `--exit N` (default 0).

use std::process::{Command, ExitCode};
use std::time::Instant;

use ipvs_proxier_tests::Netns;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("vm-bench-smoke: args {args:?}");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("vm-bench-smoke: kernel {}", kernel.trim());
    let ipvs = std::fs::read_to_string("/proc/net/ip_vs").unwrap_or_default();
    println!(
        "vm-bench-smoke: {}",
        ipvs.lines().next().unwrap_or("no IPVS")
    );
    match std::env::var("IPVS_PROXIER_BIN") {
        Ok(bin) => println!(
            "vm-bench-smoke: IPVS_PROXIER_BIN={bin} (exists: {})",
            std::path::Path::new(&bin).is_file()
        ),
        Err(_) => println!("vm-bench-smoke: IPVS_PROXIER_BIN not set"),
    }

    if ipvs_proxier_tests::kernel_tests_enabled("vm-bench-smoke") {
        let netns = Netns::new();
        let services = 100;
        let script: String = (0..services)
            .map(|i| format!("-A -t 10.96.{}.{}:80 -s rr\n", i / 250, i % 250 + 1))
            .collect();
        let started = Instant::now();
        let restore = Command::new("ip")
            .args(["netns", "exec", netns.name(), "ipvsadm", "-R"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(script.as_bytes())?;
                }
                child.wait()
            });
        let programmed = started.elapsed();
        let listed = netns.sh_ok("ipvsadm -Sn | wc -l");
        println!(
            "vm-bench-smoke: ipvsadm -R of {services} services: {:?} in {programmed:?}; listed {} lines",
            restore.map(|s| s.success()),
            listed.trim()
        );
    }

    let status = args
        .iter()
        .position(|a| a == "--exit")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse::<u8>().ok())
        .unwrap_or(0);
    ExitCode::from(status)
}
