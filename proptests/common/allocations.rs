//! A global allocator that counts the allocations of the current thread while counting is
//! on, so that tests running in parallel threads do not disturb each other's counts; or, for a
//! binary of one test, of every thread ([`allocations_on_every_thread_during`]). A test binary
//! that needs it declares it:
//! `#[global_allocator] static ALLOCATOR: CountingAllocator = CountingAllocator;`

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Counts allocations made by the current thread while counting is switched on, so that other
/// tests running in parallel threads do not disturb the count.
pub struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// Whether every thread's allocations count, and how many they made.
static EVERY_THREAD: AtomicBool = AtomicBool::new(false);
static EVERY_THREADS_ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Counts one allocation, if counting is on for this thread or for every thread (atomics and
/// const-initialised thread-locals: counting never allocates).
fn count() {
    if EVERY_THREAD.load(Ordering::Relaxed) {
        EVERY_THREADS_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    } else if COUNTING.with(Cell::get) {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts on the side,
// through const-initialised thread-locals that never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

pub fn allocations_during(f: impl FnOnce()) -> usize {
    ALLOCATIONS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

/// The allocations every thread (worker threads included) makes while `f` runs. Only for a
/// test binary of one test: another test running beside it would be counted too.
pub fn allocations_on_every_thread_during(f: impl FnOnce()) -> usize {
    EVERY_THREADS_ALLOCATIONS.store(0, Ordering::Relaxed);
    EVERY_THREAD.store(true, Ordering::Relaxed);
    f();
    EVERY_THREAD.store(false, Ordering::Relaxed);
    EVERY_THREADS_ALLOCATIONS.load(Ordering::Relaxed)
}
