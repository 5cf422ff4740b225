//! Booting the guest under qemu (software emulation, no network) and
//! watching its serial console.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::guest_scripts::{INIT_UP_MARKER, RUN_EXIT_MARKER, TEST_RESULT_MARKER};

/// What to boot.
#[derive(Debug)]
pub struct BootSpec<'a> {
    /// `qemu-system-x86_64`.
    pub qemu: &'a Path,
    /// Kernel image (`/boot/vmlinuz-...`).
    pub kernel_image: &'a Path,
    /// The gzip'd cpio initramfs.
    pub initramfs: &'a Path,
    /// ext4 image attached as virtio disk `/dev/vda`.
    pub disk: &'a Path,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Kill the guest after this long.
    pub timeout: Duration,
    /// Copy of the console output.
    pub console_log: PathBuf,
    /// Run both vCPUs on one host thread (`-accel tcg,thread=single`): code the kernel
    /// patches at run time (static keys) is then seen by every vCPU at once.
    pub single_thread: bool,
}

/// What the console showed.
#[derive(Debug, Default)]
pub struct GuestOutcome {
    /// Time from starting qemu to the guest's `/init` announcing itself.
    pub boot_to_init: Option<Duration>,
    /// Time from starting qemu to qemu exiting.
    pub total: Duration,
    /// The text after `VM-TEST-RESULT:` (e.g. `PASS 3 binaries, 0 failed`).
    pub test_result: Option<String>,
    /// The status after `VM-RUN-EXIT:`.
    pub run_exit: Option<i32>,
    /// The kernel panicked.
    pub panicked: bool,
    /// The timeout passed and the guest was killed.
    pub timed_out: bool,
    /// qemu's own exit status.
    pub qemu_status: Option<ExitStatus>,
}

/// qemu arguments: TCG (KVM hangs on these machines), no NIC at all.
fn qemu_args(spec: &BootSpec<'_>) -> Vec<String> {
    let accel = if spec.single_thread {
        "tcg,thread=single"
    } else {
        "tcg"
    };
    let mut args: Vec<String> = [
        "-accel",
        accel,
        "-cpu",
        "max",
        "-smp",
        "2",
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push("-m".to_owned());
    args.push(spec.memory_mib.to_string());
    args.push("-kernel".to_owned());
    args.push(spec.kernel_image.to_string_lossy().into_owned());
    args.push("-initrd".to_owned());
    args.push(spec.initramfs.to_string_lossy().into_owned());
    args.push("-drive".to_owned());
    args.push(format!(
        "file={},if=virtio,format=raw",
        spec.disk.to_string_lossy().replace(',', ",,")
    ));
    args.push("-append".to_owned());
    args.push("console=ttyS0 quiet panic=-1".to_owned());
    args
}

/// Removes terminal control sequences (SeaBIOS clears the screen and resets
/// the terminal) so the streamed console stays readable.
fn strip_terminal_controls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for next in chars.by_ref() {
                if ('@'..='~').contains(&next) {
                    break;
                }
            }
        }
    }
    out
}

/// Feeds one console line to the outcome.
fn observe(outcome: &mut GuestOutcome, line: &str, since_start: Duration) {
    if outcome.boot_to_init.is_none() && line.contains(INIT_UP_MARKER) {
        outcome.boot_to_init = Some(since_start);
    }
    if line.contains("Kernel panic - not syncing") {
        outcome.panicked = true;
    }
    if let Some((_, rest)) = line.split_once(TEST_RESULT_MARKER) {
        outcome.test_result = Some(rest.trim().to_owned());
    }
    if let Some((_, rest)) = line.split_once(RUN_EXIT_MARKER) {
        outcome.run_exit = rest.trim().parse().ok();
    }
}

/// Boots the guest, streams its console to stdout (and the log file) and
/// returns what it saw once qemu exits or the timeout passes.
pub fn boot(spec: &BootSpec<'_>) -> Result<GuestOutcome> {
    let args = qemu_args(spec);
    println!("xtask: {} {}", spec.qemu.display(), args.join(" "));
    let mut log = std::fs::File::create(&spec.console_log)
        .with_context(|| format!("creating {}", spec.console_log.display()))?;
    let started = Instant::now();
    let mut child = Command::new(spec.qemu)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", spec.qemu.display()))?;
    let stdout = child.stdout.take().context("qemu has no stdout")?;
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buffer);
                    let line = strip_terminal_controls(line.trim_end_matches(['\n', '\r']));
                    if lines_tx.send(line).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut outcome = GuestOutcome::default();
    let deadline = started + spec.timeout;
    let stdout = std::io::stdout();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) => {
                observe(&mut outcome, &line, started.elapsed());
                let mut out = stdout.lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                let _ = writeln!(log, "{line}");
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                outcome.timed_out = true;
                println!(
                    "xtask: guest still running after {:?}: killing qemu",
                    spec.timeout
                );
                let _ = child.kill();
                break;
            }
        }
    }
    outcome.qemu_status = Some(child.wait().context("waiting for qemu")?);
    let _ = reader.join();
    outcome.total = started.elapsed();
    Ok(outcome)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_never_gets_a_network_card_or_kvm() {
        let spec = BootSpec {
            qemu: Path::new("qemu-system-x86_64"),
            kernel_image: Path::new("/boot/vmlinuz"),
            initramfs: Path::new("/tmp/i.cpio.gz"),
            disk: Path::new("/tmp/disk.img"),
            memory_mib: 2048,
            timeout: Duration::from_secs(1),
            console_log: PathBuf::from("/tmp/log"),
            single_thread: false,
        };
        let args = qemu_args(&spec).join(" ");
        assert!(args.contains("-nic none"));
        assert!(args.contains("-accel tcg"));
        assert!(!args.contains("kvm"));
        assert!(args.contains("file=/tmp/disk.img,if=virtio,format=raw"));
    }

    #[test]
    fn terminal_controls_are_stripped() {
        assert_eq!(
            strip_terminal_controls("\u{1b}c\u{1b}[?7l\u{1b}[2J\u{1b}[0mSeaBIOS"),
            "SeaBIOS"
        );
        assert_eq!(strip_terminal_controls("plain"), "plain");
    }

    #[test]
    fn console_markers_are_recognised() {
        let mut outcome = GuestOutcome::default();
        observe(&mut outcome, "[    0.1] booting", Duration::from_secs(1));
        observe(
            &mut outcome,
            "VM-INIT: up at 3.2s guest uptime",
            Duration::from_secs(4),
        );
        observe(
            &mut outcome,
            "VM-TEST-RESULT: FAIL 3 binaries, 1 failed",
            Duration::from_secs(9),
        );
        observe(&mut outcome, "VM-RUN-EXIT: 7", Duration::from_secs(9));
        assert_eq!(outcome.boot_to_init, Some(Duration::from_secs(4)));
        assert_eq!(
            outcome.test_result.as_deref(),
            Some("FAIL 3 binaries, 1 failed")
        );
        assert_eq!(outcome.run_exit, Some(7));
        assert!(!outcome.panicked);
        observe(
            &mut outcome,
            "Kernel panic - not syncing: Attempted to kill init!",
            Duration::from_secs(9),
        );
        assert!(outcome.panicked);
    }
}
