//! A plan run in a reused workspace allocates nothing, whatever the program.

mod common;

use boundscope::executors::CpuReference;
use boundscope::{Arena, Plan, Registry};
use common::allocations::{allocations_during, CountingAllocator};
use common::program::programs;
use proptest::prelude::*;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

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
        let mut workspace = plan.workspace().unwrap();
        plan.run_with(&mut workspace, &views).unwrap();
        let count = allocations_during(|| {
            for _ in 0..3 {
                plan.run_with(&mut workspace, &views).unwrap();
            }
        });
        prop_assert_eq!(count, 0, "{} steps", plan.len());
    }
}
