//! A global allocator that counts the bytes currently allocated (and the largest single
//! allocation): the system allocator with counters beside it. Shared by the test and bench
//! binaries that measure heap sizes (`#[path]`-included; each binary installs it with
//! `#[global_allocator]`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// The system allocator, counting live bytes in [`live_bytes`].
pub struct CountingAllocator;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static PEAK_BYTES: AtomicIsize = AtomicIsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// Bytes allocated through [`CountingAllocator`] and not yet freed.
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// The most bytes live at once since the last [`reset_peak`] (or since the start).
#[allow(dead_code)]
pub fn peak_bytes() -> isize {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// Starts a new peak from the bytes live now.
#[allow(dead_code)]
pub fn reset_peak() {
    PEAK_BYTES.store(live_bytes(), Ordering::Relaxed);
}

/// The largest single allocation (or reallocation's new size) since the last
/// [`reset_largest`] (or since the start).
#[allow(dead_code)]
pub fn largest_allocation() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

/// Starts watching for the largest allocation anew.
#[allow(dead_code)]
pub fn reset_largest() {
    LARGEST.store(0, Ordering::Relaxed);
}

fn delta(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

/// Adds `change` to the live bytes and raises the peak when the sum passes it.
fn count(change: isize) {
    let live = LIVE_BYTES.fetch_add(change, Ordering::Relaxed) + change;
    PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is only
// bookkeeping and never affects the returned memory.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(delta(layout.size()));
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(delta(layout.size()));
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-delta(layout.size()));
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(delta(new_size) - delta(layout.size()));
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
