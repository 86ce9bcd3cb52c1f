//! Decomposing composites (softmax, layer_norm, linear) into prims preserves their results.

mod common;

use boundscope::executors::CpuReference;
use boundscope::passes::{Decompose, Pass};
use boundscope::{Arena, Category, Plan, Registry};
use common::program::{programs, transformer_programs};
use proptest::prelude::*;

const TOLERANCE: f32 = 1e-4;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After `Decompose`, a program with composites has no composites left, and its outputs
    /// equal the textbook formulas of the composites, evaluated directly.
    #[test]
    fn decomposition_preserves_results(program in prop_oneof![programs(true), transformer_programs()], seed in any::<u64>()) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = program.build(&arena, &registry).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let decomposed = Decompose.run(&trace, &arena).map_err(|e| TestCaseError::fail(e.to_string()))?;
        decomposed.verify().map_err(|e| TestCaseError::fail(e.to_string()))?;
        for bsym in decomposed.bound_symbols() {
            let category = registry.get(bsym.symbol()).unwrap().symbol.category();
            prop_assert_ne!(category, Category::Composite);
            prop_assert!(bsym.subsymbols().is_empty());
        }
        let inputs = program.input_data(seed);
        let refs: Vec<_> = inputs.iter().collect();
        let plan = Plan::compile(&decomposed, &[CpuReference::shared()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got = plan.run(&refs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (expected, spread) = common::oracle::evaluate_with_spread(&program, &inputs);
        for (out, &index) in got.iter().zip(&program.outputs) {
            common::close(out.view(), &expected[index], &spread[index], TOLERANCE)
                .map_err(|e| TestCaseError::fail(format!("output {index}: {e} spread {:?} inputs {:?}\n{trace}", spread[index], inputs)))?;
        }
    }
}
