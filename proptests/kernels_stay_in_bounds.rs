//! A safe program never makes a kernel read out of bounds: executors recognise the built-in
//! prims by identity, not by name (and a registry gives a built-in's id only to a copy of
//! it), check the shapes their kernels rely on when a plan is compiled, and run only the fusion
//! regions their own fusion pass made; no trace that fails `Trace::verify` is ever finished.
//!
//! Each test uses the public API only, as any user program could.

use std::sync::Arc;

use boundscope::executors::cuda::{op_source, region_source};
use boundscope::executors::{math, CpuFusion, CpuReference};
use boundscope::passes::{FuseRegions, Pass};
use boundscope::{
    kernel_fn, prims, Arena, Arg, ArgInfo, Category, Error, Executor, Fusible, Kernel, OpView, ParamKind, Plan,
    Registry, Symbol, Tensor, TensorMeta, Trace, TraceBuilder,
};

fn tensor_shape<'m>(args: &[ArgInfo<'m>], i: usize) -> Result<&'m [usize], String> {
    args.get(i).and_then(ArgInfo::shape).ok_or_else(|| format!("argument {i} must be a tensor"))
}

/// A registry with no built-ins, whose symbols have the built-in prims' names (not their ids,
/// which a registry gives only to copies of the built-ins: these come past them) but
/// signatures and shape rules of their own:
/// - the unary names (`neg` ...) take two tensors of one shape and compute `a - b` with a CPU
///   kernel of their own;
/// - the binary names (`add` ...) take two tensors and give `[numel(a) + numel(b) + 3]`;
/// - `sum` and `max` give `[1]` whatever the input;
/// - `matmul` gives `[a[0], b[1]]` without comparing the inner dimensions;
/// - `reshape`, `transpose` and `broadcast_to` give the dimensions they are passed.
fn lookalike_registry() -> Registry {
    use Category::*;
    use ParamKind::*;
    let mut registry = Registry::empty();
    for (i, &name) in prims::BUILTIN_NAMES[..=prims::BROADCAST_TO.index()].iter().enumerate() {
        let id = prims::BUILTIN_NAMES.iter().position(|n| *n == name).map(boundscope::SymbolId::from_index);
        let symbol = match id {
            Some(id) if prims::UNARY.contains(&id) => {
                Symbol::new(name, Elementwise).params(&[Tensor, Tensor]).shape_rule(same_shapes).cpu_kernel(|_| {
                    Ok(kernel_fn(|inputs, outputs| {
                        for ((o, a), b) in outputs[0]
                            .values_mut::<f32>()?
                            .iter_mut()
                            .zip(inputs[0].values::<f32>()?)
                            .zip(inputs[1].values::<f32>()?)
                        {
                            *o = a - b;
                        }
                        Ok(())
                    }))
                })
            }
            Some(id) if prims::BINARY.contains(&id) => {
                Symbol::new(name, Elementwise).params(&[Tensor, Tensor]).shape_rule(|args| {
                    let (a, b) = (tensor_shape(args, 0)?, tensor_shape(args, 1)?);
                    let n = a.iter().product::<usize>() + b.iter().product::<usize>() + 3;
                    Ok(TensorMeta::new(boundscope::DType::F32, &[n]))
                })
            }
            Some(prims::SUM | prims::MAX) => Symbol::new(name, Reduction)
                .params(&[Tensor])
                .shape_rule(|_| Ok(TensorMeta::new(boundscope::DType::F32, &[1]))),
            Some(prims::MATMUL) => Symbol::new(name, Matmul).params(&[Tensor, Tensor]).shape_rule(|args| {
                let (a, b) = (tensor_shape(args, 0)?, tensor_shape(args, 1)?);
                Ok(TensorMeta::new(boundscope::DType::F32, &[a[0], b[1]]))
            }),
            _ => Symbol::new(name, Shape).params(&[Tensor, Dims]).shape_rule(|args| {
                let dims = args.get(1).and_then(ArgInfo::dims).ok_or("argument 1 must be dimensions")?;
                Ok(TensorMeta::new(boundscope::DType::F32, dims))
            }),
        };
        let past_the_builtins = prims::BUILTIN_NAMES.len() + i;
        assert_eq!(registry.register(symbol).unwrap().index(), past_the_builtins, "`{name}`");
    }
    registry
}

fn same_shapes(args: &[ArgInfo<'_>]) -> Result<TensorMeta, String> {
    let (a, b) = (tensor_shape(args, 0)?, tensor_shape(args, 1)?);
    if a != b {
        return Err(format!("{a:?} and {b:?} differ"));
    }
    Ok(TensorMeta::new(boundscope::DType::F32, a))
}

/// One op of the look-alike registry: its name, its inputs' shapes, and its dimensions.
struct Case {
    name: &'static str,
    inputs: &'static [&'static [usize]],
    dims: Option<&'static [usize]>,
}

/// Ops that a built-in kernel would index out of bounds (or compute wrongly), if it took them
/// for the built-ins they are named after.
const MISLEADING: &[Case] = &[
    Case { name: "add", inputs: &[&[2], &[3]], dims: None },
    Case { name: "maximum", inputs: &[&[4], &[4]], dims: None },
    Case { name: "sum", inputs: &[&[4, 8]], dims: None },
    Case { name: "max", inputs: &[&[4, 8]], dims: None },
    Case { name: "matmul", inputs: &[&[2, 8], &[2, 4]], dims: None },
    Case { name: "reshape", inputs: &[&[3]], dims: Some(&[5]) },
    Case { name: "transpose", inputs: &[&[2, 3]], dims: Some(&[3, 2]) },
    Case { name: "broadcast_to", inputs: &[&[3]], dims: Some(&[2, 5]) },
];

fn one_op<'a>(arena: &'a Arena, registry: &'a Registry, case: &Case) -> Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let mut args: Vec<Arg<'_>> = case.inputs.iter().map(|s| b.input(s).unwrap().into()).collect();
    if let Some(dims) = case.dims {
        args.push(Arg::Dims(dims));
    }
    let y = b.call(case.name, &args).unwrap();
    b.output(y).unwrap();
    b.finish().unwrap()
}

fn inputs_of(case: &Case) -> Vec<Tensor> {
    case.inputs.iter().map(|s| Tensor::from_fn(s, |i| i as f32)).collect()
}

#[test]
fn the_reference_does_not_take_user_symbols_for_the_builtins_they_are_named_after() {
    let registry = lookalike_registry();
    for case in MISLEADING {
        let arena = Arena::new();
        let trace = one_op(&arena, &registry, case);
        match Plan::compile(&trace, &[CpuReference::shared()]) {
            Err(Error::NoExecutor { symbol, .. }) => assert_eq!(symbol, case.name),
            Err(other) => panic!("`{}`: unexpected error {other}", case.name),
            Ok(plan) => {
                let inputs = inputs_of(case);
                let refs: Vec<&Tensor> = inputs.iter().collect();
                panic!("`{}` compiled against the built-in kernel (run: {:?})", case.name, plan.run(&refs));
            }
        }
    }
}

#[test]
fn user_symbols_named_like_builtins_with_their_own_kernel_give_their_own_result() {
    let registry = lookalike_registry();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8]).unwrap();
    let y = b.input(&[8]).unwrap();
    let u = b.call("neg", &[x.into(), y.into()]).unwrap();
    let v = b.call("relu", &[u.into(), y.into()]).unwrap();
    b.output(v).unwrap();
    let trace = b.finish().unwrap();
    let (xs, ys) = (Tensor::from_fn(&[8], |i| i as f32), Tensor::from_fn(&[8], |i| 1.0 - i as f32));
    // (x - y) - y: the symbols' own kernels, not -x and relu.
    let expected: Vec<f32> = (0..8).map(|i| (i as f32 - (1.0 - i as f32)) - (1.0 - i as f32)).collect();

    let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    assert_eq!(reference.run(&[&xs, &ys]).unwrap()[0].to_f32_vec(), expected.as_slice());

    let fused = FuseRegions::new(CpuFusion::shared()).min_ops(1).run(&trace, &arena).unwrap();
    assert!(!fused.to_string().contains("CpuFusion"), "user symbols were fused as built-ins:\n{fused}");
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    assert_eq!(plan.run(&[&xs, &ys]).unwrap()[0].to_f32_vec(), expected.as_slice());
}

#[test]
fn fusion_does_not_take_user_symbols_for_builtins() {
    let registry = lookalike_registry();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let a = b.input(&[2]).unwrap();
    let c = b.input(&[3]).unwrap();
    let z = b.input(&[8]).unwrap();
    let s = b.call("add", &[a.into(), c.into()]).unwrap(); // [8] by its own rule
    let t = b.call("mul", &[s.into(), z.into()]).unwrap(); // [19]
    b.output(t).unwrap();
    let trace = b.finish().unwrap();
    let fused = FuseRegions::new(CpuFusion::shared()).min_ops(1).run(&trace, &arena).unwrap();
    assert!(!fused.to_string().contains("CpuFusion"), "user symbols were fused as built-ins:\n{fused}");
    let result = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]);
    assert!(matches!(result, Err(Error::NoExecutor { .. })), "{:?}", result.err());
}

#[test]
fn generated_cuda_refuses_user_symbols_named_like_builtins() {
    let registry = lookalike_registry();
    for case in MISLEADING {
        let arena = Arena::new();
        let trace = one_op(&arena, &registry, case);
        let op = OpView::of(&trace, 0).unwrap();
        if let Ok(generated) = op_source(&op, "k") {
            panic!("`{}` generated as a built-in:\n{}", case.name, generated.source);
        }
    }
}

/// Trace A, `exp(x)` and `sum(y)` over `[2, 4]`, fused into one region; that region copied into
/// a trace B of the same values where `y` has shape `y_shape` (so `sum(y)` is `[1, 1]`). Every
/// op of the copy still fits its shape rule, so B verifies; but `y` does not fit the region's
/// iteration shape `[2, 4]`.
fn transplanted_region<'a>(arena: &'a Arena, registry: &'a Registry, y_shape: &[usize]) -> Trace<'a> {
    let build = |y_shape: &[usize]| {
        let mut b = TraceBuilder::new(arena, registry);
        let x = b.input(&[2, 4]).unwrap();
        let y = b.input(y_shape).unwrap();
        let e = b.exp(x).unwrap();
        let s = b.sum(y).unwrap();
        b.output(e).unwrap();
        b.output(s).unwrap();
        b.finish().unwrap()
    };
    let a = build(&[2, 4]);
    let fused = FuseRegions::new(CpuFusion::shared()).run(&a, arena).unwrap();
    assert_eq!(fused.len(), 1, "{fused}");
    let b = build(y_shape);
    let mut rewritten = TraceBuilder::rewrite(&b, arena);
    rewritten.push_copy(&fused.bound_symbols()[0]);
    let transplanted = rewritten.finish().unwrap();
    transplanted.verify().unwrap();
    transplanted
}

#[test]
fn a_region_whose_inputs_do_not_fit_its_shape_is_a_typed_error() {
    let registry = Registry::with_builtins();
    // `[1, 2]` does not broadcast to `[2, 4]`; `[1, 4]` does, but the reduction would write a
    // row per row of `[2, 4]` into the one element of `sum(y)`.
    for y_shape in [&[1, 2][..], &[1, 4]] {
        let arena = Arena::new();
        let trace = transplanted_region(&arena, &registry, y_shape);
        let result = Plan::compile(&trace, &[CpuFusion::shared(), CpuReference::shared()]);
        match result {
            Err(Error::KernelPrecondition { executor, symbol, detail }) => {
                assert_eq!((executor.as_str(), symbol.as_str()), ("cpu_fusion", "CpuFusion0"));
                assert!(detail.contains(&format!("{y_shape:?}")) && detail.contains("[2, 4]"), "{detail}");
            }
            Err(other) => panic!("unexpected error {other}"),
            Ok(plan) => {
                let inputs = [Tensor::zeros(&[2, 4]), Tensor::zeros(y_shape)];
                panic!("compiled (run: {:?})", plan.run(&[&inputs[0], &inputs[1]]));
            }
        }
        let generated = region_source(&OpView::of(&trace, 0).unwrap(), "k");
        assert!(generated.is_err(), "{}", generated.unwrap().source);
    }
}

/// A built-in `matmul` copied, unchecked, into a trace whose values have other shapes:
/// `[2, 3] x [5, 4] -> [5, 4]`. `TraceBuilder::finish` refuses it, so no executor's `compile`
/// (public, and reachable without `Plan::compile`) ever meets it; the executors still check the
/// shapes their kernels rely on.
#[test]
fn a_builtin_whose_shapes_break_its_rule_never_makes_a_trace() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut a = TraceBuilder::new(&arena, &registry);
    let (x, w) = (a.input(&[2, 3]).unwrap(), a.input(&[3, 4]).unwrap());
    let y = a.matmul(x, w).unwrap();
    a.output(y).unwrap();
    let a = a.finish().unwrap();
    let mut b = TraceBuilder::new(&arena, &registry);
    let (_, w) = (b.input(&[2, 3]).unwrap(), b.input(&[5, 4]).unwrap());
    let y = b.exp(w).unwrap();
    b.output(y).unwrap();
    let b = b.finish().unwrap();
    let mut rewritten = TraceBuilder::rewrite(&b, &arena);
    rewritten.push_copy(&a.bound_symbols()[0]);
    match rewritten.finish() {
        Err(Error::MalformedTrace { position: Some(0), detail }) => assert!(detail.contains("matmul"), "{detail}"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(trace) => panic!("a malformed trace was finished:\n{trace}"),
    }
}

#[test]
fn a_copy_of_a_builtin_stays_one_until_it_is_changed() {
    let builtins = Registry::with_builtins();
    let copy = |id| builtins.get(id).unwrap().symbol.clone();
    let mut registry = Registry::empty();
    let exp = registry.register(copy(prims::EXP)).unwrap();
    let neg = registry.register(copy(prims::NEG)).unwrap();
    // `matmul` with a shape rule that ignores the inner dimensions: no longer the built-in.
    let matmul = registry
        .register(copy(prims::MATMUL).shape_rule(|args| {
            let (a, b) = (tensor_shape(args, 0)?, tensor_shape(args, 1)?);
            Ok(TensorMeta::new(boundscope::DType::F32, &[a[0], b[1]]))
        }))
        .unwrap();
    assert_eq!(registry.get(exp).unwrap().symbol.builtin_prim(), Some(prims::EXP));
    assert_eq!(registry.get(matmul).unwrap().symbol.builtin_prim(), None);

    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let e = b.bind(exp, &[x.into()]).unwrap();
    let y = b.bind(neg, &[e.into()]).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    assert_eq!(CpuFusion::new().fusible(&OpView::of(&trace, 0).unwrap()), Fusible::Elementwise);
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let out = plan.run(&[&Tensor::from_fn(&[4], |i| i as f32)]).unwrap();
    assert_eq!(out[0].to_f32_vec(), &[-math::exp(0.0), -math::exp(1.0), -math::exp(2.0), -math::exp(3.0)]);

    let mut b = TraceBuilder::new(&arena, &registry);
    let (p, q) = (b.input(&[2, 8]).unwrap(), b.input(&[2, 4]).unwrap());
    let y = b.bind(matmul, &[p.into(), q.into()]).unwrap();
    b.output(y).unwrap();
    let result = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]);
    assert!(matches!(result, Err(Error::NoExecutor { .. })), "{:?}", result.err());
}

/// Fuses `exp` and `neg` into regions named like CpuFusion's (prefix `Cpu`), and runs any
/// region it is given. Not CpuFusion: CpuFusion must leave its regions alone.
struct LookalikeFusion;

impl Executor for LookalikeFusion {
    fn name(&self) -> &str {
        "lookalike_fusion"
    }
    fn fusion_prefix(&self) -> &str {
        "Cpu"
    }
    fn fusible(&self, op: &OpView<'_>) -> Fusible {
        if matches!(op.symbol_id(), prims::EXP | prims::NEG) {
            Fusible::Elementwise
        } else {
            Fusible::No
        }
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::REGION
    }
    fn compile(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn Kernel>> {
        let chain: Vec<fn(f32) -> f32> = op
            .region_ops()?
            .iter()
            .map(|o| if o.symbol_id() == prims::EXP { math::exp as fn(f32) -> f32 } else { math::neg })
            .collect();
        Ok(kernel_fn(move |inputs, outputs| {
            for (o, &x) in outputs[0].values_mut::<f32>()?.iter_mut().zip(inputs[0].values::<f32>()?) {
                *o = chain.iter().fold(x, |v, f| f(v));
            }
            Ok(())
        }))
    }
}

#[test]
fn a_fusion_executor_runs_only_the_regions_its_own_fusion_made() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let e = b.exp(x).unwrap();
    let y = b.neg(e).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let lookalike: Arc<dyn Executor> = Arc::new(LookalikeFusion);
    let fused = FuseRegions::new(lookalike.clone()).run(&trace, &arena).unwrap();
    assert!(fused.to_string().contains("CpuFusion0"), "{fused}");

    let plan = Plan::compile(&fused, &[CpuFusion::shared(), lookalike, CpuReference::shared()]).unwrap();
    assert_eq!(plan.steps_per_executor(), vec![("lookalike_fusion", 1)]);
    let out = plan.run(&[&Tensor::from_fn(&[4], |i| i as f32)]).unwrap();
    assert_eq!(out[0].to_f32_vec(), &[-math::exp(0.0), -math::exp(1.0), -math::exp(2.0), -math::exp(3.0)]);
}

/// The reference's built-in kernels, compiled for an op and run outside a plan (by an executor
/// of one's own, say) with buffers of another count, dtype or length, give a typed error
/// naming what they take: they indexed out of bounds (`exp` over 8 values given 4).
#[test]
fn built_in_kernels_run_outside_a_plan_check_their_buffers() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8]).unwrap();
    let e = b.exp(x).unwrap();
    let rows = b.reshape(e, &[2, 4]).unwrap();
    let s = b.softmax(rows).unwrap();
    b.output(s).unwrap();
    let trace = b.finish().unwrap();
    let exp = CpuReference::new().compile(&OpView::of(&trace, 0).unwrap()).unwrap();
    let softmax = CpuReference::new().compile(&OpView::of(&trace, 2).unwrap()).unwrap();
    let (four, eight) = (Tensor::zeros(&[4]), Tensor::zeros(&[8]));
    let mut out = Tensor::zeros(&[8]);
    let ints = Tensor::try_zeros_of(boundscope::DType::I32, &[8]).unwrap();
    let wrong: [(&dyn Kernel, Vec<&Tensor>); 5] = [
        (&*exp, vec![&four]),
        (&*exp, vec![]),
        (&*exp, vec![&eight, &eight]),
        (&*exp, vec![&ints]),
        (&*softmax, vec![&four]),
    ];
    for (kernel, inputs) in wrong {
        let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
        let err = kernel.run(&views, &mut [out.view_mut()]).unwrap_err();
        assert!(matches!(err, Error::Execution { .. }), "{err}");
        assert!(err.to_string().contains("compiled for"), "{err}");
    }
    // An output of another length, or none.
    assert!(exp.run(&[eight.view()], &mut [four.clone().view_mut()]).is_err());
    assert!(exp.run(&[eight.view()], &mut []).is_err());
    // The right buffers run.
    exp.run(&[eight.view()], &mut [out.view_mut()]).unwrap();
    assert_eq!(out.to_f32_vec(), vec![1.0; 8]);
}
