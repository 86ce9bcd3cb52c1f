//! A plan run in a reused workspace allocates nothing, whatever the program.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use boundscope::executors::CpuReference;
use boundscope::{Arena, Plan, Registry};
use common::program::programs;
use proptest::prelude::*;

/// Counts allocations made by the current thread while counting is switched on, so that other
/// tests running in parallel threads do not disturb the count.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts on the side,
// through const-initialised thread-locals that never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations_during(f: impl FnOnce()) -> usize {
    ALLOCATIONS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn the_counter_counts() {
    assert_eq!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 64]))), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After one warm-up run, running a plan again in the same workspace makes zero heap
    /// allocations, for random programs including composites.
    #[test]
    fn steady_state_runs_allocate_nothing(program in programs(true), seed in any::<u64>()) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = program.build(&arena, &registry).unwrap();
        let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let inputs = program.input_data(seed);
        let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
        let mut workspace = plan.workspace();
        plan.run_with(&mut workspace, &views).unwrap();
        let count = allocations_during(|| {
            for _ in 0..3 {
                plan.run_with(&mut workspace, &views).unwrap();
            }
        });
        prop_assert_eq!(count, 0, "{} steps", plan.len());
    }
}
