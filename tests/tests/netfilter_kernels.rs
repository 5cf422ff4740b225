//! What differs between the kernels and nft releases of the matrix (docs/kernels.md), on the
//! real kernel in the VM: the construct kernels from 6.12 on refuse from nft before 1.1 (an
//! interval lookup whose key holds `meta l4proto`), that the tables we render load with every
//! pair, and that a start on a pair that refuses its tables stops before its first write,
//! naming the rule, the kernel and nft's version.
//!
//! Each expectation is derived from the running kernel's release and `nft --version`, so
//! the same test asserts the refusal on the pair that refuses and the acceptance elsewhere.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use ipvs_proxier_tests::{Netns, PROXIER_BIN_ENV, require_kernel};
use proxier_core::netfilter::{NetfilterBackend, NetfilterError, NftBackend};

/// A table whose source-range rule looks up `daddr . meta l4proto . dport . saddr` in an
/// interval set: the construct kernels from 6.12 on refuse from nft before 1.1, which puts a
/// byte-order conversion of the one-byte protocol into the key.
const L4PROTO_INTERVAL_TABLE: &str = "table ip l4proto-interval-probe {
  set ranges {
    type ipv4_addr . inet_proto . inet_service . ipv4_addr;
    flags interval;
    elements = { 10.96.0.1 . tcp . 80 . 10.0.0.0/8 };
  }
  chain input {
    type filter hook input priority filter; policy accept;
    ip daddr . meta l4proto . th dport . ip saddr @ranges return
  }
}
";

/// `(major, minor)` of a version text's first `N.N` (`6.12.117+deb13-cloud-amd64`,
/// `nftables v1.0.6 (Lester Gooch #5)`).
fn major_minor(text: &str) -> (u32, u32) {
    let start = text.find(|c: char| c.is_ascii_digit()).unwrap();
    let mut parts = text[start..]
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The running kernel's release and what `nft --version` prints.
fn kernel_and_nft(ns: &Netns) -> (String, String) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_owned();
    let nft = ns.sh_ok("nft --version").trim().to_owned();
    (kernel, nft)
}

/// Whether this pair refuses [`L4PROTO_INTERVAL_TABLE`]: a kernel of 6.12 or later with an
/// nft before 1.1.
fn refuses_l4proto_intervals(kernel: &str, nft: &str) -> bool {
    major_minor(kernel) >= (6, 12) && major_minor(nft) < (1, 1)
}

#[test]
fn an_interval_lookup_keyed_by_meta_l4proto_is_refused_exactly_by_new_kernels_with_old_nft() {
    require_kernel!();
    let ns = Netns::new();
    let (kernel, nft) = kernel_and_nft(&ns);
    let refused = refuses_l4proto_intervals(&kernel, &nft);
    eprintln!("netfilter_kernels: kernel {kernel}, {nft}: refusal expected: {refused}");
    let result = ns.block_on(|| async {
        NftBackend::new("nft")
            .check(L4PROTO_INTERVAL_TABLE.to_owned())
            .expect("the nft backend checks")
            .await
    });
    match (refused, result) {
        (false, Ok(())) => {}
        (true, Err(error @ NetfilterError::TablesRefused { .. })) => {
            let text = error.to_string();
            for part in [
                kernel.as_str(),
                nft.as_str(),
                "Operation not supported",
                "meta l4proto",
                "docs/kernels.md",
            ] {
                assert!(text.contains(part), "the refusal lacks {part:?}: {text}");
            }
        }
        (expected, got) => {
            panic!("kernel {kernel}, {nft}: refusal expected {expected}, got {got:?}")
        }
    }
    // A check writes nothing, refused or not.
    assert!(
        !ns.sh_ok("nft list tables")
            .contains("l4proto-interval-probe"),
        "nft --check left a table behind"
    );
}

/// The directory of a wrapper `nft` that runs the real one, adding [`L4PROTO_INTERVAL_TABLE`]
/// to every script it is asked to `--check`: the daemon's start check then asks the kernel
/// about a rule this pair may refuse.
fn nft_adding_the_probe_to_checks(dir: &std::path::Path) -> PathBuf {
    let real = String::from_utf8(
        std::process::Command::new("bash")
            .args(["-c", "command -v nft"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let probe = dir.join("probe.nft");
    std::fs::write(&probe, L4PROTO_INTERVAL_TABLE).unwrap();
    let wrapper = dir.join("nft");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/bash\nif [ \"$1\" = --check ]; then\n  {{ cat; cat {probe}; }} | {real} \"$@\"\n  exit ${{PIPESTATUS[1]}}\nfi\nexec {real} \"$@\"\n",
            probe = probe.display(),
            real = real.trim()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["+x"])
        .arg(&wrapper)
        .status()
        .unwrap();
    dir.to_path_buf()
}

#[test]
fn a_start_whose_tables_the_kernel_refuses_stops_before_its_first_write() {
    require_kernel!();
    if std::env::var_os(PROXIER_BIN_ENV).is_none() {
        eprintln!(
            "SKIP a_start_whose_tables_the_kernel_refuses_stops_before_its_first_write: {PROXIER_BIN_ENV} is not set"
        );
        return;
    }
    ipvs_proxier_tests::load_modules(&["nf_reject_ipv4", "nf_reject_ipv6", "nft_reject_ipv4"]);
    let ns = Netns::new();
    let (kernel, nft) = kernel_and_nft(&ns);
    let refused = refuses_l4proto_intervals(&kernel, &nft);
    let dir = std::env::temp_dir().join(format!("netfilter-kernels-{}", ns.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin_dir = nft_adding_the_probe_to_checks(&dir);
    let source = dir.join("cluster.yaml");
    std::fs::write(
        &source,
        include_str!("../fixtures/web-and-dns.yaml").replace("DNS_ENDPOINT", "10.244.0.2"),
    )
    .unwrap();
    ns.sh_ok(
        "ip link add pods type dummy && ip link set pods up && ip addr add 10.244.0.1/24 dev pods",
    );
    let out = ns.sh(&format!(
        "PATH={}:$PATH \"${PROXIER_BIN_ENV}\" --source-file {} --hostname-override node-a --once",
        bin_dir.display(),
        source.display()
    ));
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ipvs = ns.sh_ok("ipvsadm -Sn");
    let tables = ns.sh_ok("nft list tables");
    let link = ns.sh("ip link show kube-ipvs0").status.success();
    let _ = std::fs::remove_dir_all(&dir);
    if refused {
        assert!(
            !out.status.success(),
            "the start went on with tables the kernel refuses: {output}"
        );
        for part in [
            "refuses the proxier's nftables tables",
            kernel.as_str(),
            nft.as_str(),
            "meta l4proto",
            "nothing was written",
        ] {
            assert!(
                output.contains(part),
                "the refusal lacks {part:?}: {output}"
            );
        }
        assert!(
            ipvs.trim().is_empty(),
            "IPVS written before the check: {ipvs}"
        );
        assert!(!tables.contains("ipvs-proxier"), "tables written: {tables}");
        assert!(!link, "kube-ipvs0 created before the check");
    } else {
        assert!(out.status.success(), "--once failed: {output}");
        assert!(ipvs.contains("-A -t 10.96.0.10:80 -s rr"), "{ipvs}");
        assert!(tables.contains("table ip ipvs-proxier"), "{tables}");
    }
}

#[test]
fn major_and_minor_are_read_from_kernel_releases_and_nft_versions() {
    assert_eq!(major_minor("6.12.117+deb13-cloud-amd64"), (6, 12));
    assert_eq!(major_minor("5.10.0-32-cloud-amd64"), (5, 10));
    assert_eq!(major_minor("nftables v1.0.6 (Lester Gooch #5)"), (1, 0));
    assert_eq!(
        major_minor("nftables v1.1.3 (Commodore Bullmoose #4)"),
        (1, 1)
    );
    assert!(refuses_l4proto_intervals(
        "6.12.117+deb13-cloud-amd64",
        "nftables v1.0.6 (Lester Gooch #5)"
    ));
    assert!(!refuses_l4proto_intervals(
        "6.1.0-57-cloud-amd64",
        "nftables v1.0.6 (Lester Gooch #5)"
    ));
    assert!(!refuses_l4proto_intervals(
        "6.12.117+deb13-cloud-amd64",
        "nftables v1.1.3 (Commodore Bullmoose #4)"
    ));
}
