//! Random well-formed programs run by a plan on the CPU reference executor equal a naive,
//! independent evaluation of the same math.

mod common;

use boundscope::executors::CpuReference;
use boundscope::passes::Pipeline;
use boundscope::{Arena, Plan, Registry};
use common::program::{programs, transformer_programs, Program};
use proptest::prelude::*;

/// Relative tolerance: kernels and oracle sum in the same order, so differences come only from
/// `exp(-0.5 log v)` against `1 / sqrt(v)` in layer_norm.
const TOLERANCE: f32 = 1e-4;

/// `program`'s plan against the oracle, and against the plan of the standard passes' trace:
/// bit for bit where `bitwise` (prims only), else within the tolerance (a composite the CPU
/// reference runs whole, such as `softmax`, may differ from its decomposition by rounding).
fn check(program: &Program, seed: u64, bitwise: bool) -> Result<(), TestCaseError> {
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
    if !bitwise {
        for (out, &index) in again.iter().zip(&program.outputs) {
            common::close(out.view(), &expected[index], &spread[index], TOLERANCE)
                .map_err(|e| TestCaseError::fail(format!("output t{index} after the passes: {e}\n{passed}")))?;
        }
        return Ok(());
    }
    // Bit for bit (NaN included): the passes only remove and splice, they do not reorder math.
    let bits = |ts: &[boundscope::Tensor]| {
        ts.iter().map(|t| t.to_f32_vec().iter().map(|x| x.to_bits()).collect::<Vec<_>>()).collect::<Vec<_>>()
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
        check(&program, seed, true)?;
    }

    /// The same with composites and the ops of a transformer mixed in: `slice` and `concat`
    /// along any axis, `sum_dim` and `max_dim` over any axis, `causal_mask`, `log_softmax`.
    #[test]
    fn transformer_programs_match_direct_evaluation(program in transformer_programs(), seed in any::<u64>()) {
        check(&program, seed, false)?;
    }
}

/// The oracle's tolerance can fail where rounding alone can overflow an element: a wrong
/// finite value is still wrong there (the spread of such an element was infinite, which
/// accepted every finite value).
#[test]
fn the_tolerance_rejects_wrong_values_next_to_an_overflow() {
    use common::program::Op;
    use common::{close, oracle};
    // exp just below and just above where f32 overflows; the nudges move t0 up and t1 down
    // (checked below through what the evaluations give).
    let program = Program {
        inputs: vec![vec![1], vec![1]],
        ops: vec![Op::Unary("exp", 0), Op::Unary("exp", 1)],
        outputs: vec![2, 3],
    };
    let inputs =
        [boundscope::Tensor::new(&[1], vec![88.7228]).unwrap(), boundscope::Tensor::new(&[1], vec![88.7229]).unwrap()];
    let (expected, spread) = oracle::evaluate_with_spread(&program, &inputs);
    let check = |index: usize, got: f32| {
        let got = boundscope::Tensor::new(&[1], vec![got]).unwrap();
        close(got.view(), &expected[index], &spread[index], 1e-4)
    };
    // t2 is finite; a nudged run overflows.
    let finite = expected[2].data[0];
    assert!(finite.is_finite() && finite > 3.0e38, "{finite}");
    check(2, finite).unwrap();
    check(2, f32::INFINITY).expect("rounding alone can overflow it");
    check(2, 0.0).expect_err("0 is no rounding of 3.4e38");
    check(2, finite * 0.5).expect_err("half of it is no rounding of it");
    check(2, f32::NEG_INFINITY).expect_err("overflow keeps the sign");
    // t3 overflows; a nudged run stays finite.
    assert_eq!(expected[3].data[0], f32::INFINITY);
    check(3, 3.4027e38).expect("the finite value a nudged run gives");
    check(3, 0.0).expect_err("0 is no rounding of an overflow");
    check(3, 1.0e38).expect_err("1e38 is no rounding of an overflow");
}

/// An element that divides by what cancels to zero is decided by rounding alone, and the
/// tolerance says so without accepting everything: what CI found (a plan's exact zero divided
/// where the oracle's residue was not zero, and the reverse) passes; a wrong value next to it,
/// or a finite value far from a near-zero element that only changes sign, does not.
#[test]
fn the_tolerance_accepts_what_a_cancelled_divisor_can_give_and_no_more() {
    use common::close;
    use common::oracle::{Spread, Value};
    let check = |got: f32, plain: f32, nudged: [f32; 2]| {
        let expected = Value { shape: vec![1], data: vec![plain] };
        let finite =
            nudged.iter().filter(|n| n.is_finite() && plain.is_finite()).map(|n| (n - plain).abs()).fold(0.0, f32::max);
        let got = boundscope::Tensor::new(&[1], vec![got]).unwrap();
        close(got.view(), &expected, &[Spread { finite, nudged }], 1e-4)
    };
    // The oracle's divisor an exact zero, the nudged ones not (both positive): the plan's residue
    // may be of either sign and smaller.
    check(-5.9512e6, f32::INFINITY, [270509.56, 258747.53]).expect("a residue of the other sign");
    check(f32::NEG_INFINITY, f32::INFINITY, [270509.56, 258747.53]).expect("an exact zero, the other sign");
    check(1.0, f32::INFINITY, [270509.56, 258747.53]).expect_err("1 is no quotient by a residue here");
    // The oracle's residue and the nudged ones of both signs: the plan's may be an exact zero.
    check(f32::INFINITY, 38894.125, [-589.2991, -589.30426]).expect("an exact zero divided");
    check(f32::NAN, 38894.125, [-589.2991, -589.30426]).expect("0 / 0");
    // A near-zero element that only changes sign is held to its spread.
    check(5.0, 1e-8, [-1e-8, 2e-8]).expect_err("5 is no rounding of a value near zero");
    check(1.5e-8, 1e-8, [-1e-8, 2e-8]).expect("within the spread");
    // An overflow next to the threshold keeps the rules of the test above.
    check(0.0, f32::INFINITY, [3.4027e38, f32::INFINITY]).expect_err("0 is no rounding of an overflow");
}
