//! Malformed builder input and malformed traces always give the right typed error, never a
//! panic, and never leave anything half-added.

mod common;

use boundscope::executors::CpuReference;
use boundscope::{prims, Arena, Arg, DType, Error, Plan, Registry, TensorMeta, TraceBuilder, ValueId};
use common::program::programs;
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
enum Corruption {
    UndefinedValue,
    Arity,
    ArgumentKind,
    ReshapeCount,
    MatmulInner,
    UnknownName,
}

fn corruptions() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        Just(Corruption::UndefinedValue),
        Just(Corruption::Arity),
        Just(Corruption::ArgumentKind),
        Just(Corruption::ReshapeCount),
        Just(Corruption::MatmulInner),
        Just(Corruption::UnknownName),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Each kind of bad builder call returns its own error variant, adds nothing, and leaves
    /// the builder usable.
    #[test]
    fn bad_builder_calls_give_the_right_error(
        program in programs(true),
        corruption in corruptions(),
        r in any::<u32>(),
    ) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 3]).unwrap();
        let r = r as usize;
        let result = match corruption {
            Corruption::UndefinedValue => b.exp(ValueId::from_index(1 + r % 1000)),
            Corruption::Arity => {
                // Every bindable built-in (fusion regions are made by the fusion pass only).
                let id = boundscope::SymbolId::from_index(r % prims::REGION.index());
                let symbol = registry.get(id).unwrap().symbol;
                let n = symbol.param_kinds().len() + 1 + r % 3;
                b.bind(id, &vec![Arg::Value(x); n])
            }
            Corruption::ArgumentKind => b.bind(prims::UNARY[r % prims::UNARY.len()], &[Arg::Scalar(1.0)]),
            Corruption::ReshapeCount => b.reshape(x, &[6 + 1 + r % 5]),
            Corruption::MatmulInner => {
                let y = b.input(&[3 + 1 + r % 4, 2]).unwrap();
                b.matmul(x, y)
            }
            Corruption::UnknownName => b.call(&format!("{}_zz{}", prims::BUILTIN_NAMES[r % 21], r % 7), &[x.into()]),
        };
        let err = result.expect_err("corrupted call must fail");
        let right_variant = match corruption {
            Corruption::UndefinedValue => matches!(err, Error::UndefinedValue { .. }),
            Corruption::Arity => matches!(err, Error::ArityMismatch { .. }),
            Corruption::ArgumentKind => matches!(err, Error::ArgumentKind { .. }),
            Corruption::ReshapeCount | Corruption::MatmulInner => matches!(err, Error::ShapeMismatch { .. }),
            Corruption::UnknownName => matches!(err, Error::UnknownSymbol { .. }),
        };
        prop_assert!(right_variant, "{:?} gave {:?}", corruption, err);
        prop_assert!(!err.to_string().is_empty());
        // The builder is still usable and the failed call added nothing.
        let y = b.neg(x).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        prop_assert_eq!(trace.len(), 1);
        trace.verify().unwrap();
        // And a real program built afterwards in the same arena is unaffected.
        let built = program.build(&arena, &registry).unwrap();
        prop_assert_eq!(built.len(), program.ops.len());
    }

    /// Moving the last bound symbol to the front gives a trace that `TraceBuilder::finish`
    /// refuses with `MalformedTrace` exactly when it uses a value that another bound symbol
    /// defines; one it finishes verifies and compiles.
    #[test]
    fn reordered_traces_are_rejected_when_they_use_values_too_early(program in programs(true)) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = program.build(&arena, &registry).unwrap();
        let ops = trace.bound_symbols();
        let last = ops[ops.len() - 1];
        let mut b = TraceBuilder::rewrite(&trace, &arena);
        b.push_copy(&last);
        for op in &ops[..ops.len() - 1] {
            b.push_copy(op);
        }
        let uses_defined_value = last.inputs().any(|v| !trace.inputs().contains(&v));
        match b.finish() {
            Ok(reordered) => {
                prop_assert!(!uses_defined_value);
                reordered.verify().unwrap();
                prop_assert!(Plan::compile(&reordered, &[CpuReference::shared()]).is_ok());
            }
            Err(e) => {
                prop_assert!(uses_defined_value, "unexpected error {}", e);
                prop_assert!(matches!(e, Error::MalformedTrace { position: Some(0), .. }), "{}", e);
            }
        }
    }
}

/// `compare_scalar` given a symbol that is not a comparison names itself and the argument, not
/// an internal symbol id as a definition gone wrong.
#[test]
fn compare_scalar_of_a_symbol_that_is_not_a_comparison_names_the_argument() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let err = b.compare_scalar(prims::ADD, x, 1.0).unwrap_err();
    assert!(matches!(&err, Error::ArgumentKind { symbol, position: 0, .. } if symbol == "compare_scalar"), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("prims::COMPARISONS") && !message.contains("invalid definition"), "{message}");
    // The builder is still usable.
    b.compare_scalar(prims::LT, x, 1.0).unwrap();
}

/// `narrow` and `split` given an axis or sizes past any tensor's report themselves and what was
/// asked, not the `slice` they are made of (or a saturated end).
#[test]
fn narrow_and_split_past_any_axis_name_themselves() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let shape_error = |err: Error, name: &str, says: &str| {
        assert!(matches!(&err, Error::ShapeMismatch { symbol, .. } if symbol == name), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
    };
    shape_error(b.narrow(x, 1, usize::MAX, 2).unwrap_err(), "narrow", &format!("start {} plus length 2", usize::MAX));
    shape_error(b.split(x, 5, &[usize::MAX, 2]).unwrap_err(), "split", "no axis 5");
    shape_error(b.split(x, 5, &[1, 2]).unwrap_err(), "split", "no axis 5");
    shape_error(b.split(x, 1, &[usize::MAX, 4]).unwrap_err(), "split", "do not add up");
    // And the builder still works.
    assert_eq!(b.split(x, 1, &[1, 2]).unwrap().len(), 2);
    b.narrow(x, 1, 1, 2).unwrap();
}

/// `sum_dim`, `max_dim` and `argmax` over an axis the tensor lacks, and `sum_dim`, `mean_dim` and
/// `max_dim` of an integer tensor, name themselves, not the prim they bind (`sum_axis`, `sum`,
/// ...).
#[test]
fn reductions_over_a_missing_axis_name_themselves() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let results =
        [("sum_dim", b.sum_dim(x, 6, false)), ("max_dim", b.max_dim(x, 2, true)), ("argmax", b.argmax(x, 9, false))];
    for (name, result) in results {
        let err = result.unwrap_err();
        assert!(matches!(&err, Error::ShapeMismatch { symbol, .. } if symbol == name), "{err:?}");
        assert!(err.to_string().contains("there is no axis"), "{err}");
    }
    // The axes it has still reduce.
    assert!(b.sum_dim(x, 0, false).is_ok() && b.max_dim(x, 1, true).is_ok() && b.argmax(x, 1, false).is_ok());
    // An integer tensor, which the reductions refuse, over the last axis (the last-axis prims,
    // `sum` and `max`) or another (`sum_axis`, `max_axis`): named as the call, with the fix.
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[2, 3])).unwrap();
    for axis in [0, 1] {
        for keepdim in [false, true] {
            let results = [
                ("sum_dim", b.sum_dim(ids, axis, keepdim)),
                ("mean_dim", b.mean_dim(ids, axis, keepdim)),
                ("max_dim", b.max_dim(ids, axis, keepdim)),
            ];
            for (name, result) in results {
                let err = result.unwrap_err();
                assert!(matches!(&err, Error::ShapeMismatch { symbol, .. } if symbol == name), "{err:?}");
                assert!(err.to_string().contains("i64") && err.to_string().contains("cast"), "{err}");
            }
        }
    }
}

/// An empty axis has no maximum: `max_dim` and `argmax` over it are errors that say so, as in
/// PyTorch (`torch.amax`, `torch.argmax`), at every position of the empty axis, while its sum
/// is 0 and `softmax` of empty rows is empty.
#[test]
fn maxima_over_an_empty_axis_are_errors() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    for shape in [[0usize, 3, 4], [2, 0, 4], [2, 3, 0]] {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&shape).unwrap();
        let axis = shape.iter().position(|&n| n == 0).unwrap();
        for keepdim in [false, true] {
            let err = b.max_dim(x, axis, keepdim).unwrap_err();
            assert!(matches!(&err, Error::ShapeMismatch { symbol, .. } if symbol == "max_dim"), "{err:?}");
            assert!(err.to_string().contains("empty") && err.to_string().contains("non-empty axis"), "{err}");
            assert!(b.argmax(x, axis, keepdim).is_err());
            assert!(b.sum_dim(x, axis, keepdim).is_ok());
        }
        // Over a non-empty axis of the same tensor, the maximum is defined (and empty).
        let other = (axis + 1) % 3;
        assert!(b.max_dim(x, other, false).is_ok());
    }
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 0]).unwrap();
    let y = b.softmax(x).unwrap();
    b.output(y).unwrap();
    let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    let out = plan.run(&[&boundscope::Tensor::zeros(&[2, 0])]).unwrap();
    assert_eq!(out[0].shape(), &[2, 0]);
}

/// A user's executor named as another executor of the list (here the built-in reference's name),
/// or with no name, is refused when the plan is compiled: the plan would credit its steps to the
/// other (`# step 0, cpu_reference` for a step the user's executor ran). The same executor given
/// twice is one executor, and compiles.
#[test]
fn executors_sharing_a_name_or_without_one_are_refused() {
    use boundscope::{kernel_fn, Executor, Kernel, OpView};
    use std::sync::Arc;
    struct Named(&'static str);
    impl Executor for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn claims(&self, _op: &OpView<'_>) -> bool {
            true
        }
        fn compile(&self, _op: &OpView<'_>) -> boundscope::Result<Box<dyn Kernel>> {
            Ok(kernel_fn(|_, outputs| {
                outputs[0].values_mut::<f32>()?.fill(7.0);
                Ok(())
            }))
        }
    }
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let reference: Arc<dyn Executor> = CpuReference::shared();
    let impostor: Arc<dyn Executor> = Arc::new(Named("cpu_reference"));
    let err = Plan::compile(&trace, &[impostor, reference.clone()]).unwrap_err();
    assert!(matches!(&err, Error::ExecutorName { name, .. } if name == "cpu_reference"), "{err:?}");
    assert!(err.to_string().contains("executors 0 and 1") && err.to_string().contains("rename"), "{err}");
    let err = Plan::compile(&trace, &[Arc::new(Named("")), reference.clone()]).unwrap_err();
    assert!(matches!(&err, Error::ExecutorName { name, .. } if name.is_empty()), "{err:?}");
    // Names a list of names (`runtime.nvtx_executors`) or a plan listing could not hold.
    for bad in ["a,b", " padded", "two\nlines"] {
        let err = Plan::compile(&trace, &[Arc::new(Named(bad)), reference.clone()]).unwrap_err();
        assert!(matches!(&err, Error::ExecutorName { .. }), "{bad:?}: {err:?}");
        assert!(err.to_string().contains("holds no `,`"), "{err}");
    }
    // The same executor twice, and distinct names, compile.
    Plan::compile(&trace, &[reference.clone(), reference.clone()]).unwrap();
    Plan::compile(&trace, &[Arc::new(Named("sevens")), reference]).unwrap();
}
