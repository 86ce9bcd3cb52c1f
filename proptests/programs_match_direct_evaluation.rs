//! Random well-formed programs run by a plan on the CPU reference executor equal a naive,
//! independent evaluation of the same math.

mod common;

use boundscope::executors::CpuReference;
use boundscope::passes::Pipeline;
use boundscope::{Arena, Plan, Registry};
use common::program::{programs, Program};
use proptest::prelude::*;

/// Relative tolerance: kernels and oracle sum in the same order, so differences come only from
/// `exp(-0.5 log v)` against `1 / sqrt(v)` in layer_norm.
const TOLERANCE: f32 = 1e-4;

fn check(program: &Program, seed: u64) -> Result<(), TestCaseError> {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = program.build(&arena, &registry).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let inputs = program.input_data(seed);
    let refs: Vec<_> = inputs.iter().collect();
    let got = plan.run(&refs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (expected, spread) = common::oracle::evaluate_with_spread(program, &inputs);
    for (out, &index) in got.iter().zip(&program.outputs) {
        common::close(out.view(), &expected[index], &spread[index], TOLERANCE)
            .map_err(|e| TestCaseError::fail(format!("output t{index}: {e}\n{trace}")))?;
    }
    // The standard passes never change results either.
    let passed = Pipeline::standard().run(&trace, &arena).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let plan = Plan::compile(&passed, &[CpuReference::shared()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let again = plan.run(&refs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    // Bit for bit (NaN included): the passes only remove and splice, they do not reorder math.
    let bits = |ts: &[boundscope::Tensor]| {
        ts.iter().map(|t| t.data().iter().map(|x| x.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    prop_assert_eq!(bits(&got), bits(&again));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A plan's outputs equal the naive evaluation of elementwise, reduction, matmul and shape
    /// programs, within a relative tolerance of 1e-4.
    #[test]
    fn prim_programs_match_direct_evaluation(program in programs(false), seed in any::<u64>()) {
        check(&program, seed)?;
    }
}
