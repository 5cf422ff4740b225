//! The daemon's allocator, mimalloc, and when it hands freed memory back to the kernel.
//!
//! A start (and a restart's adoption) allocates and frees in a burst: list pages decoded and
//! dropped, the whole plan made, the kernel's table read. Freed memory handed back to the
//! kernel at once is faulted in again, page by page, by the next allocation of the burst;
//! kept for a while, it is reused as it is. So until the first sync is done freed memory is
//! kept for [`START_PURGE_DELAY_MS`]; then [`settle`] hands back what the start left and
//! from there it goes back at once, which keeps the settled RSS low while syncs come and go.
//!
//! The `#[global_allocator]` is the binary's (`main.rs`); the options are set by an ELF
//! constructor there, before the first allocation, through [`set_start_options`], and the
//! async runtime's threads call [`collect_after_settle`] when they go idle.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// mimalloc's `mi_option_arena_eager_commit` (the fifth option of `mi_option_e` in
/// mimalloc.h, v3): whether an arena is committed whole when it is reserved.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
/// mimalloc's `mi_option_purge_delay` (the sixteenth option of `mi_option_e` in mimalloc.h,
/// v2 and v3): milliseconds between freeing memory and returning it to the kernel.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How many times [`settle`] ran: a thread that has not collected since does it when it
/// goes idle ([`collect_after_settle`]).
static SETTLED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The value of [`SETTLED`] when this thread last collected.
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

/// How long freed memory is kept before it goes back to the kernel until the first sync is
/// done: longer than a restart's adoption at 10,000 Services takes (2–3 s in the VM), so
/// nothing the adoption frees is handed back and faulted in again before it ends. In the VM
/// at 10,000 Services (kube source, protobuf lists), a restart's adoption handing it back at
/// once took 5.81 s of the daemon's CPU time (2.93 s of it in the kernel) and 3.54 s;
/// keeping it 1 s (mimalloc v3's own default), 4.3–4.9 s (1.9–2.1 s) and 2.7–3.0 s. With
/// the adoption's best-effort table read, 1 s: 4.35–4.70 s (1.81–2.09 s) and 2.74–2.95 s;
/// 10 s: 3.88–3.93 s (1.48–1.67 s) and 2.41–2.46 s, and the same peak RSS at a first start
/// (88.4 MiB against 88.1) (CHANGELOG). The file source pays for it at its first start: RSS
/// 2 s after programmed 62.8–63.2 MiB (five runs, 3 or 10 s) against 55.9–59.2 (three runs,
/// 1 s), with the same RSS after a restart's adoption and after changes (57.1–60.1 against
/// 56.2–59.6); lowering the delay again once the source is known (before the runtime
/// starts) did not bring it back (62.8 MiB).
///
/// What the delay costs: memory freed meanwhile is reused without being handed back, and a
/// page that lives on after the start keeps resident whatever the freed memory had touched
/// beyond its own blocks (mimalloc's view of its pages accounts for it nowhere). In the VM at
/// 10,000 × 5 (kube source, two boots of one build): settled RSS 58.5 MiB and peak 88.8
/// against 51.3 and 71.3 with no delay, restart adoption 2.30 s (daemon CPU 3.85 s, about
/// 17,000 page faults) against 3.53 s (5.82 s, 30,000). Kept for the adoption; the fault
/// soak's RSS growth compares a fresh daemon with a restarted one, each with its own share.
pub const START_PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// Sets mimalloc's options for the start; call before the first allocation, which reserves
/// the arena:
///
/// - Arenas are committed on demand, slice by slice, not eagerly (Linux's default with
///   overcommit): at 10,000 Services the settled RSS was about 2.5 MiB lower (host, dry run
///   against the API double, eight pairs).
/// - Freed memory is kept for [`START_PURGE_DELAY_MS`] (see the module).
pub fn set_start_options() {
    // SAFETY: sets two of mimalloc's process-wide options, which it reads when it reserves
    // an arena or schedules a purge; no memory is touched.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, START_PURGE_DELAY_MS);
    }
}

/// Ends the start: freed memory goes back to the kernel at once from now on, and what is
/// waiting for its delay goes now (this thread's free pages now, the runtime's other
/// threads' when they next go idle). A sync frees its transient memory while the next
/// allocations come; with a delay they took fresh pages while the freed ones still counted,
/// so syncs peaked higher and the RSS between them held pages about to be returned.
pub fn settle() {
    // SAFETY: asks mimalloc to collect this thread's free pages and purge the freed memory
    // its arenas hold, then sets one of its process-wide options (read when a purge is
    // scheduled); neither touches memory in use. In this order: with no delay, mimalloc
    // takes it that nothing is scheduled and a forced collection purges nothing.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true);
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
    let settled = SETTLED.fetch_add(1, Ordering::Relaxed) + 1;
    COLLECTED.with(|collected| collected.set(settled));
}

/// For the async runtime's threads, as they go idle (`on_thread_park`): hands the free
/// pages the thread holds back to mimalloc, and so to the kernel, once after each
/// [`settle`] (pages are per thread: the source's decoding runs on these). Otherwise an
/// atomic load.
pub fn collect_after_settle() {
    let settled = SETTLED.load(Ordering::Relaxed);
    if settled == 0 || COLLECTED.with(Cell::get) == settled {
        return;
    }
    COLLECTED.with(|collected| collected.set(settled));
    // SAFETY: asks mimalloc to collect this thread's free pages; memory in use is untouched.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}
