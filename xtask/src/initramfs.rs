//! The guest's root file system: busybox, the real networking tools with
//! their shared libraries, the kernel's (pruned) module tree and `/init`,
//! packed as a gzip'd cpio archive and cached under `target/vm/`.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cpio::{CpioWriter, Kind};
use crate::deps::{GUEST_PLUGIN_DIRS, GUEST_TOOLS, HostTools};
use crate::guest_kernel::{GUEST_NFT_ROOT, GuestKernel, GuestNft};
use crate::guest_modules;
use crate::guest_scripts;

/// Where a member's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Dir,
    HostFile {
        path: PathBuf,
        size: u64,
        mtime_ns: i128,
    },
    Inline(Vec<u8>),
    Symlink(String),
    CharDev {
        major: u32,
        minor: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    source: Source,
    permissions: u32,
}

/// The guest root file system being assembled; paths have no leading `/`.
#[derive(Debug, Default)]
pub struct RootFs {
    members: BTreeMap<String, Member>,
}

/// Archive path (no leading slash) of an absolute path.
fn archive_path(path: &Path) -> String {
    path.to_string_lossy().trim_start_matches('/').to_owned()
}

/// Resolves `.` and `..` lexically in an absolute path.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

impl RootFs {
    fn insert(&mut self, path: String, source: Source, permissions: u32) {
        self.members.entry(path).or_insert(Member {
            source,
            permissions,
        });
    }

    /// Adds a directory (and its parents) that does not exist on the host.
    pub fn add_dir(&mut self, path: &str) {
        let mut prefix = String::new();
        for part in path.trim_matches('/').split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            self.insert(prefix.clone(), Source::Dir, 0o755);
        }
    }

    /// Adds a file with the given content.
    pub fn add_inline(&mut self, path: &str, content: Vec<u8>, permissions: u32) {
        if let Some((parent, _)) = path.trim_matches('/').rsplit_once('/') {
            self.add_dir(parent);
        }
        self.insert(
            path.trim_matches('/').to_owned(),
            Source::Inline(content),
            permissions,
        );
    }

    /// Adds a symlink at `path` pointing to `target`.
    pub fn add_symlink(&mut self, path: &str, target: &str) {
        if let Some((parent, _)) = path.trim_matches('/').rsplit_once('/') {
            self.add_dir(parent);
        }
        self.insert(
            path.trim_matches('/').to_owned(),
            Source::Symlink(target.to_owned()),
            0o777,
        );
    }

    fn add_char_dev(&mut self, path: &str, major: u32, minor: u32) {
        self.insert(path.to_owned(), Source::CharDev { major, minor }, 0o600);
    }

    fn contains(&self, path: &str) -> bool {
        self.members.contains_key(path.trim_matches('/'))
    }

    /// Copies a host file at the same path, mirroring every symlink on the
    /// way (e.g. `/lib -> usr/lib`, `libc.so.6 -> libc-2.36.so`).
    pub fn add_host_path(&mut self, path: &Path) -> Result<()> {
        self.add_host_path_depth(&normalize(path), 0)
    }

    fn add_host_path_depth(&mut self, path: &Path, depth: u32) -> Result<()> {
        if depth > 16 {
            bail!("too many levels of symlinks at {}", path.display());
        }
        let parts: Vec<Component> = path
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .collect();
        let mut current = PathBuf::from("/");
        for (index, part) in parts.iter().enumerate() {
            current.push(part);
            let meta = std::fs::symlink_metadata(&current)
                .with_context(|| format!("reading {}", current.display()))?;
            let name = archive_path(&current);
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&current)
                    .with_context(|| format!("reading link {}", current.display()))?;
                self.insert(
                    name,
                    Source::Symlink(target.to_string_lossy().into_owned()),
                    0o777,
                );
                let base = current.parent().unwrap_or(Path::new("/"));
                let mut resolved = base.join(&target);
                for rest in &parts[index + 1..] {
                    resolved.push(rest);
                }
                return self.add_host_path_depth(&normalize(&resolved), depth + 1);
            }
            let permissions = meta.permissions().mode() & 0o7777;
            if meta.is_dir() {
                self.insert(name, Source::Dir, permissions);
            } else {
                let mtime_ns =
                    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
                let source = Source::HostFile {
                    path: current.clone(),
                    size: meta.len(),
                    mtime_ns,
                };
                self.insert(name, source, permissions);
                return Ok(());
            }
        }
        Ok(())
    }

    /// Adds the host file `host` at `path` in the archive (no leading `/`), whatever its
    /// host path.
    pub fn add_host_file_at(&mut self, path: &str, host: &Path) -> Result<()> {
        let meta =
            std::fs::metadata(host).with_context(|| format!("reading {}", host.display()))?;
        if let Some((parent, _)) = path.trim_matches('/').rsplit_once('/') {
            self.add_dir(parent);
        }
        let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        self.insert(
            path.trim_matches('/').to_owned(),
            Source::HostFile {
                path: host.to_path_buf(),
                size: meta.len(),
                mtime_ns,
            },
            meta.permissions().mode() & 0o7777,
        );
        Ok(())
    }

    /// Adds the host directory `host` with everything below it (symlinks as symlinks) at
    /// `path` in the archive.
    pub fn add_host_tree_at(&mut self, path: &str, host: &Path) -> Result<()> {
        self.add_dir(path);
        let mut entries: Vec<PathBuf> = std::fs::read_dir(host)
            .with_context(|| format!("reading {}", host.display()))?
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for entry in entries {
            let Some(name) = entry.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            let inside = format!("{}/{name}", path.trim_matches('/'));
            let meta = std::fs::symlink_metadata(&entry)
                .with_context(|| format!("reading {}", entry.display()))?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&entry)?;
                self.add_symlink(&inside, &target.to_string_lossy());
            } else if meta.is_dir() {
                self.add_host_tree_at(&inside, &entry)?;
            } else if meta.is_file() {
                self.add_host_file_at(&inside, &entry)?;
            }
        }
        Ok(())
    }

    /// Adds the shared libraries (and the dynamic loader) `ldd` lists for `binary`.
    pub fn add_libraries_of(&mut self, binary: &Path) -> Result<()> {
        for library in shared_libraries(binary)? {
            self.add_host_path(&library)?;
        }
        Ok(())
    }

    /// Stable 64-bit digest of everything that ends up in the archive
    /// (paths, modes, host file sizes and mtimes, inline contents).
    pub fn digest(&self) -> u64 {
        let mut hash = Fnv1a::default();
        for (path, member) in &self.members {
            hash.write(path.as_bytes());
            hash.write(&member.permissions.to_le_bytes());
            match &member.source {
                Source::Dir => hash.write(b"d"),
                Source::HostFile {
                    path,
                    size,
                    mtime_ns,
                } => {
                    hash.write(b"f");
                    hash.write(path.as_os_str().as_encoded_bytes());
                    hash.write(&size.to_le_bytes());
                    hash.write(&mtime_ns.to_le_bytes());
                }
                Source::Inline(content) => {
                    hash.write(b"i");
                    hash.write(content);
                }
                Source::Symlink(target) => {
                    hash.write(b"l");
                    hash.write(target.as_bytes());
                }
                Source::CharDev { major, minor } => {
                    hash.write(b"c");
                    hash.write(&major.to_le_bytes());
                    hash.write(&minor.to_le_bytes());
                }
            }
            hash.write(&[0]);
        }
        hash.finish()
    }

    /// Writes the archive as cpio newc into `out`.
    fn write_cpio<W: Write>(&self, out: W) -> Result<W> {
        let mut cpio = CpioWriter::new(out);
        for (path, member) in &self.members {
            match &member.source {
                Source::Dir => {
                    cpio.header(path, Kind::Dir, member.permissions)?;
                }
                Source::CharDev { major, minor } => {
                    cpio.header(
                        path,
                        Kind::CharDev {
                            major: *major,
                            minor: *minor,
                        },
                        member.permissions,
                    )?;
                }
                Source::Symlink(target) => {
                    cpio.header(
                        path,
                        Kind::Symlink {
                            target_len: len_u32(target.len(), path)?,
                        },
                        0o777,
                    )?;
                    cpio.data(target.as_bytes())?;
                }
                Source::Inline(content) => {
                    cpio.header(
                        path,
                        Kind::File {
                            size: len_u32(content.len(), path)?,
                        },
                        member.permissions,
                    )?;
                    cpio.data(content)?;
                }
                Source::HostFile { path: host, .. } => {
                    let content = std::fs::read(host)
                        .with_context(|| format!("reading {}", host.display()))?;
                    cpio.header(
                        path,
                        Kind::File {
                            size: len_u32(content.len(), path)?,
                        },
                        member.permissions,
                    )?;
                    cpio.data(&content)?;
                }
            }
            cpio.end_data()?;
        }
        Ok(cpio.finish()?)
    }

    fn file_bytes(&self) -> u64 {
        self.members
            .values()
            .map(|m| match &m.source {
                Source::HostFile { size, .. } => *size,
                Source::Inline(content) => content.len() as u64,
                _ => 0,
            })
            .sum()
    }
}

fn len_u32(len: usize, path: &str) -> Result<u32> {
    u32::try_from(len).with_context(|| format!("{path} is too large for a cpio archive"))
}

/// FNV-1a, 64 bit: a tiny stable hash for cache keys (std's hasher may change between releases).
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Shared libraries `ldd` lists for a binary (none for a static one).
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .with_context(|| format!("running ldd {}", binary.display()))?;
    Ok(parse_ldd(&String::from_utf8_lossy(&output.stdout)))
}

/// Paths in `ldd` output: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`
/// and the loader line `/lib64/ld-linux-x86-64.so.2 (0x...)`.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let candidate = match line.split_once("=>") {
                Some((_, right)) => right.trim(),
                None => line,
            };
            let path = candidate.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Adds the selected modules with a matching `modules.dep`; returns the
/// modules `/init` loads.
fn add_modules(root: &mut RootFs, kernel: &GuestKernel) -> Result<Vec<String>> {
    let selection = guest_modules::select(
        kernel,
        guest_scripts::GUEST_MODULES,
        guest_scripts::REQUIRED_MODULES,
    )?;
    let guest_dir = kernel.guest_modules_dir();
    for file in &selection.files {
        root.add_host_file_at(&format!("{guest_dir}/{file}"), &kernel.modules.join(file))?;
    }
    for index in &selection.index_files {
        let path = kernel.modules.join(index);
        if path.is_file() {
            root.add_host_file_at(&format!("{guest_dir}/{index}"), &path)?;
        }
    }
    root.add_inline(
        &format!("{guest_dir}/modules.dep"),
        selection.modules_dep.into_bytes(),
        0o644,
    );
    Ok(selection.load)
}

/// Adds busybox and its applet links, never over a real tool.
fn add_busybox(root: &mut RootFs, busybox: &Path) -> Result<()> {
    root.add_host_path(busybox)?;
    let busybox_real = std::fs::canonicalize(busybox)?;
    let output = Command::new(busybox)
        .arg("--list-full")
        .output()
        .context("busybox --list-full")?;
    for applet in String::from_utf8_lossy(&output.stdout).lines() {
        let applet = applet.trim();
        let Some((dir, name)) = applet.rsplit_once('/') else {
            continue;
        };
        if GUEST_TOOLS.contains(&name) || name == "sh" {
            continue;
        }
        // Resolve merged-/usr links the way the host has them (/sbin -> usr/sbin).
        let host_dir = std::fs::canonicalize(Path::new("/").join(dir))
            .unwrap_or_else(|_| PathBuf::from("/usr/bin"));
        let link = host_dir.join(name);
        let link = archive_path(&link);
        if root.contains(&link) {
            continue;
        }
        root.add_symlink(&link, &busybox_real.to_string_lossy());
    }
    Ok(())
}

/// Assembles the guest root file system.
pub fn assemble(
    tools: &HostTools,
    kernel: &GuestKernel,
    nft: Option<&GuestNft>,
    extra_binaries: &[PathBuf],
) -> Result<RootFs> {
    let mut root = RootFs::default();
    // Another nft first: the first member at a path wins, so the host's is not copied.
    if let Some(nft) = nft {
        root.add_host_tree_at(GUEST_NFT_ROOT, &nft.root)?;
        let host_nft = crate::deps::find_command("nft").context("nft not found")?;
        let host_nft = std::fs::canonicalize(&host_nft).unwrap_or(host_nft);
        root.add_inline(
            &archive_path(&host_nft),
            GuestNft::wrapper_script().into_bytes(),
            0o755,
        );
    }
    for dir in [
        "proc", "sys", "dev", "run", "tmp", "mnt", "root", "etc", "var",
    ] {
        root.add_dir(dir);
    }
    root.add_char_dev("dev/console", 5, 1);
    root.add_char_dev("dev/null", 1, 3);
    root.add_symlink("var/run", "../run");
    for tool in &tools.guest_tools {
        root.add_host_path(tool)?;
        root.add_libraries_of(tool)?;
    }
    for binary in extra_binaries {
        root.add_libraries_of(binary)?;
    }
    for dir in GUEST_PLUGIN_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut plugins: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        plugins.sort();
        for plugin in plugins {
            root.add_host_path(&plugin)?;
            root.add_libraries_of(&plugin)?;
        }
    }
    // /bin/sh is bash: busybox's sh prefers its own cut-down applets over PATH.
    let bash = tools
        .guest_tools
        .iter()
        .find(|t| t.file_name().is_some_and(|n| n == "bash"))
        .context("bash missing from the guest tools")?;
    let bash_real = std::fs::canonicalize(bash)?;
    let sh_dir = std::fs::canonicalize("/bin").unwrap_or_else(|_| PathBuf::from("/bin"));
    root.add_host_path(Path::new("/bin"))?;
    root.add_symlink(
        &archive_path(&sh_dir.join("sh")),
        &bash_real.to_string_lossy(),
    );
    add_busybox(&mut root, &tools.busybox)?;
    // The CA bundle: TLS clients (kube's rustls) refuse to start without system roots,
    // even when they only ever talk plain HTTP to a loopback test double.
    for file in [
        "/etc/protocols",
        "/etc/services",
        "/etc/ssl/certs/ca-certificates.crt",
    ] {
        if Path::new(file).is_file() {
            root.add_host_path(Path::new(file))?;
        }
    }
    root.add_inline(
        "etc/hosts",
        b"127.0.0.1 localhost\n::1 localhost\n".to_vec(),
        0o644,
    );
    root.add_inline(
        "etc/passwd",
        b"root:x:0:0:root:/root:/bin/bash\n".to_vec(),
        0o644,
    );
    root.add_inline("etc/group", b"root:x:0:\n".to_vec(), 0o644);
    let load = add_modules(&mut root, kernel)?;
    root.add_inline(
        "init",
        guest_scripts::init_script(&load).into_bytes(),
        0o755,
    );
    Ok(root)
}

/// A ready initramfs.
#[derive(Debug)]
pub struct Initramfs {
    /// The gzip'd cpio file.
    pub path: PathBuf,
    /// Whether it came from the cache.
    pub cache_hit: bool,
    /// Time spent assembling (and, on a miss, packing) it.
    pub elapsed: Duration,
}

/// Returns the cached initramfs for this content, building it on a miss.
pub fn build_or_reuse(
    root: &RootFs,
    kernel: &GuestKernel,
    cache_dir: &Path,
    started: Instant,
) -> Result<Initramfs> {
    std::fs::create_dir_all(cache_dir)?;
    let key = format!("{}-{:016x}", kernel.version, root.digest());
    let path = cache_dir.join(format!("initramfs-{key}.cpio.gz"));
    if path.is_file() {
        return Ok(Initramfs {
            path,
            cache_hit: true,
            elapsed: started.elapsed(),
        });
    }
    let temporary = cache_dir.join(format!("initramfs-{key}.tmp-{}", std::process::id()));
    let output = std::fs::File::create(&temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    let mut gzip = Command::new("gzip")
        .args(["-n", "-6", "-c"])
        .stdin(Stdio::piped())
        .stdout(output)
        .spawn()
        .context("starting gzip")?;
    let stdin = gzip.stdin.take().context("gzip has no stdin")?;
    let written = root.write_cpio(BufWriter::with_capacity(1 << 20, stdin));
    let flushed = written.and_then(|w| {
        w.into_inner()
            .map_err(|e| anyhow::anyhow!("flushing to gzip: {e}"))
    });
    drop(flushed?);
    let status = gzip.wait()?;
    if !status.success() {
        let _ = std::fs::remove_file(&temporary);
        bail!("gzip failed ({status})");
    }
    std::fs::rename(&temporary, &path)?;
    prune_cache(cache_dir, &path);
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "xtask: initramfs {} ({} MiB of files, {} MiB packed)",
        path.display(),
        root.file_bytes() >> 20,
        size >> 20
    );
    Ok(Initramfs {
        path,
        cache_hit: false,
        elapsed: started.elapsed(),
    })
}

/// Keeps the few newest cached archives (other runs may still use them).
fn prune_cache(cache_dir: &Path, keep: &Path) {
    let Ok(dir) = std::fs::read_dir(cache_dir) else {
        return;
    };
    let mut cached: Vec<(std::time::SystemTime, PathBuf)> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("initramfs-"))
        })
        .filter(|p| p.extension().is_some_and(|e| e == "gz") && p != keep)
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    cached.sort();
    let excess = cached.len().saturating_sub(3);
    for (_, old) in cached.into_iter().take(excess) {
        let _ = std::fs::remove_file(old);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_library_and_loader_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        assert!(parse_ldd("\tnot a dynamic executable\n").is_empty());
    }

    #[test]
    fn digest_changes_with_content() {
        let mut a = RootFs::default();
        a.add_inline("init", b"one".to_vec(), 0o755);
        let mut b = RootFs::default();
        b.add_inline("init", b"two".to_vec(), 0o755);
        assert_ne!(a.digest(), b.digest());
        let mut c = RootFs::default();
        c.add_inline("init", b"one".to_vec(), 0o755);
        assert_eq!(a.digest(), c.digest());
    }

    #[test]
    fn normalize_resolves_parent_components() {
        assert_eq!(
            normalize(Path::new("/usr/bin/../lib/x")),
            PathBuf::from("/usr/lib/x")
        );
    }

    #[test]
    fn parents_sort_before_children() {
        let mut root = RootFs::default();
        root.add_inline("usr/lib/x", Vec::new(), 0o644);
        root.add_dir("usr/lib-extra");
        let order: Vec<&String> = root.members.keys().collect();
        let lib = order.iter().position(|p| *p == "usr/lib").unwrap();
        let file = order.iter().position(|p| *p == "usr/lib/x").unwrap();
        assert!(lib < file);
    }
}
