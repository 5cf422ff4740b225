//! The calling thread's capability sets (`capset(2)`), for tests that confine a child process
//! (between fork and exec) or one thread of their own.
// capset(2) has no std or libc wrapper.
#![allow(unsafe_code)]

/// `_LINUX_CAPABILITY_VERSION_3` (linux/capability.h): two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Sets the calling thread's effective and permitted sets to `keep` (a mask of `1 << CAP_*`
/// bits) and empties its inheritable set. Other threads keep theirs; threads it starts
/// afterwards inherit these. One system call and no allocation, so it may run between fork
/// and exec.
pub fn set_thread_capabilities(keep: u64) -> std::io::Result<()> {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let (low, high) = ((keep & 0xffff_ffff) as u32, (keep >> 32) as u32);
    let data = [
        CapData {
            effective: low,
            permitted: low,
            inheritable: 0,
        },
        CapData {
            effective: high,
            permitted: high,
            inheritable: 0,
        },
    ];
    // SAFETY: capset(2) reads the header and the two data words, which live until it returns.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
