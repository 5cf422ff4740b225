//! `cni-proxier --dry-run` (in-memory backends, no root): the sample manifests become the
//! table their Services describe; with `--watch`, an edit of the file is followed and a torn
//! file changes nothing; a malformed file fails a one-shot run. The expected rows are written
//! from `examples/cni-services.yaml` by hand, not from the program's output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The sample, compiled in: the kernel tests run this binary in a VM where the source tree
/// is not.
const SAMPLE: &str = include_str!("../cni-services.yaml");

fn cni_proxier(args: &[&str], file: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cni-proxier"));
    command
        .args(["--dry-run", "--node", "node-a"])
        .args(args)
        .arg(file);
    command.env_remove("RUST_LOG").env_remove("RUST_BACKTRACE");
    command
}

/// The table rows (virtual server, persistence, real servers) of a printed plan, spaces
/// collapsed.
fn rows(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| line.contains("ClusterIP"))
        .map(|line| {
            line.split_whitespace()
                .skip(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn expected(rows: &[&str]) -> BTreeSet<String> {
    rows.iter().map(|row| (*row).to_owned()).collect()
}

/// A directory of its own under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cni-dry-run-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_sample_becomes_the_table_its_manifests_describe() {
    let dir = scratch("sample");
    let file = dir.join("cni-services.yaml");
    std::fs::write(&file, SAMPLE).unwrap();
    let out = cni_proxier(&[], &file).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("full sync of 4 service ports"),
        "{stdout}"
    );
    // shop/cart is internalTrafficPolicy: Local: only its endpoint on node-a.
    let table = expected(&[
        "TCP 10.96.0.10:80 rr - 10.244.1.2:8080, 10.244.2.3:8080",
        "UDP 10.96.0.53:53 rr - 10.244.1.5:5353, 10.244.2.6:5353",
        "TCP 10.96.0.53:53 rr - 10.244.1.5:5353, 10.244.2.6:5353",
        "UDP [fd00:10:96::53]:53 rr - [fd00:10:244:1::5]:5353",
        "TCP [fd00:10:96::53]:53 rr - [fd00:10:244:1::5]:5353",
        "TCP 10.96.0.30:443 rr 600s 10.244.1.7:8443",
    ]);
    assert_eq!(rows(&stdout), table, "{stdout}");
    assert!(
        stdout.contains(
            "addresses on kube-ipvs0: 10.96.0.10, 10.96.0.30, 10.96.0.53, fd00:10:96::53"
        ),
        "{stdout}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_malformed_file_fails_a_one_shot_run_and_plans_nothing() {
    let dir = scratch("malformed");
    let file = dir.join("services.yaml");
    let sample = SAMPLE.to_owned();
    std::fs::write(
        &file,
        sample.replace("timeoutSeconds: 600", "timeoutSeconds: [600]"),
    )
    .unwrap();
    let out = cni_proxier(&[], &file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("refused whole") && stderr.contains(&*file.to_string_lossy()),
        "{stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--watch --dry-run` in the background, its standard output read line by line.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    /// Lines printed until one contains `wanted` (panics after 30 s).
    fn until(&self, wanted: &str) -> String {
        let mut seen = String::new();
        while !seen.lines().any(|line| line.contains(wanted)) {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => seen.push_str(&format!("{line}\n")),
                Err(error) => panic!("no {wanted:?} ({error}); printed:\n{seen}"),
            }
        }
        seen
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn watch_follows_an_edit_and_a_torn_file_changes_nothing() {
    let dir = scratch("watch");
    let file = dir.join("services.yaml");
    let sample = SAMPLE.to_owned();
    std::fs::write(&file, &sample).unwrap();
    let mut child = cni_proxier(&["--watch"], &file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        stdout
            .lines()
            .map_while(Result::ok)
            .try_for_each(|l| tx.send(l))
    });
    let watch = Watch { child, lines };
    let first = watch.until("addresses on kube-ipvs0:");
    assert_eq!(rows(&first).len(), 6, "{first}");

    // default/web loses its endpoint on node-b. A torn write of that file (cut mid-line)
    // comes first: refused whole, it must print nothing, nor remove what it no longer lists.
    let pod_on_b =
        "- addresses:\n  - 10.244.2.3\n  conditions:\n    ready: true\n  nodeName: node-b\n";
    let edited = sample.replace(pod_on_b, "");
    assert_ne!(edited, sample);
    let torn = &edited[..edited.find("name: dns").unwrap() + 2];
    std::fs::write(&file, torn).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        watch.lines.try_recv().is_err(),
        "a torn file changed the plan"
    );
    let tmp = dir.join("services.yaml.tmp");
    std::fs::write(&tmp, &edited).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let change = watch.until("~ ");
    assert!(
        change.starts_with("sync of default/web:http/TCP:"),
        "{change}"
    );
    let row = change.lines().find(|line| line.starts_with("~ ")).unwrap();
    assert!(
        row.contains("TCP 10.96.0.10:80") && row.contains("10.244.2.3:8080"),
        "{change}"
    );
    drop(watch);
    std::fs::remove_dir_all(dir).unwrap();
}
