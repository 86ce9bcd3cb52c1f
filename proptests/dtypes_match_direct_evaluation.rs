//! bf16 and f16 end to end on the CPU: random chains over inputs of random dtypes, with casts,
//! mixed-dtype ops (PyTorch's promotion), row sums and maxima, slices and concatenations of
//! columns, `log_softmax` and matrix products, run by the CPU reference and by CpuFusion, against a direct evaluation in `f64` that rounds each op's
//! result to the op's dtype with a rounding of its own (not the `half` crate's). Plus the typed
//! errors of the dtype paths, each named by the issue: a dtype no executor takes (found when
//! the plan is compiled), host data of the wrong dtype (found when it runs), casts that
//! overflow (to infinities, as in PyTorch), and an unknown dtype name.

mod common;

use std::sync::Arc;

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::passes::{FuseRegions, Pass};
use boundscope::{
    kernel_fn, prims, Arena, Category, DType, Error, Executor, Kernel, OpView, ParamKind, Plan, Registry, Symbol,
    Tensor, TensorMeta, TraceBuilder,
};
use proptest::prelude::*;

/// `x` rounded to `dtype` to nearest, ties to even, from its `f64` value: an implementation
/// independent of boundscope's (which goes through `f32` and the `half` crate).
fn round_to(dtype: DType, x: f64) -> f64 {
    let (mantissa_bits, min_exponent, max_finite) = match dtype {
        DType::BF16 => (8, -126, (2.0 - 2f64.powi(-7)) * 2f64.powi(127)),
        DType::F16 => (11, -14, 65504.0),
        _ => return x as f32 as f64,
    };
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    // x's binary exponent, from its bits (subnormal targets share the smallest quantum).
    let exponent = (((x.abs().to_bits() >> 52) & 0x7ff) as i32 - 1023).max(min_exponent);
    let quantum = 2f64.powi(exponent - (mantissa_bits - 1));
    let scaled = x / quantum;
    let mut rounded = scaled.round();
    if (scaled - scaled.trunc()).abs() == 0.5 && rounded % 2.0 != 0.0 {
        rounded -= scaled.signum(); // a tie: to even
    }
    let y = rounded * quantum;
    if y.abs() > max_finite {
        return f64::INFINITY.copysign(x);
    }
    y
}

/// A bound on the rounding error of one result `v` of `dtype`: half a unit in its last place
/// (taken as a whole unit), plus `f32`'s own before it, plus the smallest subnormal's.
fn ulp(dtype: DType, v: f64) -> f64 {
    let eps = match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 0.0,
    };
    v.abs() * (eps + 2f64.powi(-22)) + 2f64.powi(-24)
}

#[derive(Clone, Debug)]
enum Step {
    Unary(&'static str, usize),
    Binary(&'static str, usize, usize),
    Scalar(usize, f32),
    Cast(usize, DType),
    Sum(usize),
    /// `max_dim` over the columns, keepdim.
    Max(usize),
    /// The last half of the columns (all of one column).
    Slice(usize),
    /// The columns of one then the other (the second cast to the first's dtype).
    Concat(usize, usize),
    LogSoftmax(usize),
}

#[derive(Clone, Debug)]
struct Program {
    cols: usize,
    input_dtypes: Vec<DType>,
    steps: Vec<Step>,
    /// A matrix product of the last value with a `[product_width, 3]` input of this dtype, at
    /// the end.
    matmul: Option<DType>,
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::BF16), Just(DType::F16)]
}

fn program() -> impl Strategy<Value = Program> {
    (1usize..6, prop::collection::vec(dtype(), 1..4), prop::option::of(dtype())).prop_flat_map(
        |(cols, input_dtypes, matmul)| {
            let inputs = input_dtypes.len();
            let step =
                (0u8..9, any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0usize..5, dtype(), -2.0f32..2.0);
            prop::collection::vec(step, 1..8).prop_map(move |raw| {
                let mut steps = Vec::new();
                // Value `values` is the one this step defines: it may use those before it.
                for (values, (kind, a, b, which, to, s)) in (inputs..).zip(raw) {
                    let (a, b) = (a.index(values), b.index(values));
                    steps.push(match kind {
                        0 => Step::Unary(["exp", "tanh", "sigmoid", "neg", "gelu"][which], a),
                        1 => Step::Binary(["add", "sub", "mul", "maximum"][which % 4], a, b),
                        2 => Step::Scalar(a, s),
                        3 => Step::Cast(a, to),
                        4 => Step::Sum(a),
                        5 => Step::Max(a),
                        6 => Step::Slice(a),
                        7 => Step::Concat(a, b),
                        _ => Step::LogSoftmax(a),
                    });
                }
                Program { cols, input_dtypes: input_dtypes.clone(), steps, matmul }
            })
        },
    )
}

/// The first column of [`Step::Slice`] of a value `width` wide.
fn slice_start(width: usize) -> usize {
    width / 2
}

/// Each value's `[rows, width]` shape: inputs are `[2, cols]`, a sum or maximum makes a `[2, 1]`.
/// (Widths other than 1 and `cols` come from slices and concatenations; a binary op of two
/// such widths broadcasts only when one is 1, so `build` skips it then: see [`binary_fits`].)
fn widths(p: &Program) -> Vec<usize> {
    let mut w: Vec<usize> = vec![p.cols; p.input_dtypes.len()];
    for s in &p.steps {
        let width = match *s {
            Step::Unary(_, a) | Step::Scalar(a, _) | Step::Cast(a, _) | Step::LogSoftmax(a) => w[a],
            Step::Binary(_, a, b) if binary_fits(w[a], w[b]) => w[a].max(w[b]),
            Step::Binary(_, a, _) => w[a],
            Step::Sum(_) | Step::Max(_) => 1,
            Step::Slice(a) => w[a] - slice_start(w[a]),
            Step::Concat(a, b) => w[a] + w[b],
        };
        w.push(width);
    }
    w
}

/// The rows of the product's `[k, 3]` input: the last value's width (a width of 1 is broadcast
/// to `cols` first).
fn product_width(p: &Program) -> usize {
    match *widths(p).last().expect("a width") {
        1 => p.cols,
        w => w,
    }
}

/// Whether values of widths `a` and `b` broadcast together (else the binary op applies to `a`
/// and itself).
fn binary_fits(a: usize, b: usize) -> bool {
    a == b || a == 1 || b == 1
}

fn input_data(p: &Program, seed: u64) -> Vec<Tensor> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    let mut tensors: Vec<Tensor> =
        p.input_dtypes.iter().map(|&d| Tensor::from_fn(&[2, p.cols], |_| next()).to_dtype(d)).collect();
    if let Some(d) = p.matmul {
        tensors.push(Tensor::from_fn(&[product_width(p), 3], |_| next()).to_dtype(d));
    }
    tensors
}

/// One value of the direct evaluation: elements, dtype, and per element a bound on how far
/// any evaluation that rounds at most where this one does (per op, or only some ops' results,
/// as a fused region) can be from the exact result.
#[derive(Clone)]
struct Evaluated {
    data: Vec<f64>,
    dtype: DType,
    error: Vec<f64>,
}

/// The direct evaluation: values in `f64`, each op's result rounded to its dtype, with the
/// error bound of each element carried through each op by the op's derivative.
fn evaluate(p: &Program, inputs: &[Tensor]) -> Evaluated {
    let rows = 2;
    let w = widths(p);
    let mut values: Vec<Evaluated> = inputs[..p.input_dtypes.len()]
        .iter()
        .map(|t| Evaluated {
            data: t.to_f32_vec().iter().map(|&x| x as f64).collect(),
            dtype: t.dtype(),
            error: vec![0.0; t.to_f32_vec().len()],
        })
        .collect();
    let idx = |width: usize, r: usize, c: usize| r * width + if width == 1 { 0 } else { c };
    for (i, s) in p.steps.iter().enumerate() {
        let out_w = w[p.input_dtypes.len() + i];
        let mut out = Evaluated { data: Vec::new(), dtype: DType::F32, error: Vec::new() };
        match *s {
            Step::Unary(name, a) => {
                let v = &values[a];
                out.dtype = v.dtype;
                for (&x, &e) in v.data.iter().zip(&v.error) {
                    let (y, slope) = match name {
                        "exp" => (x.exp(), (x + e).exp()),
                        "tanh" => (x.tanh(), 1.0),
                        "sigmoid" => (1.0 / (1.0 + (-x).exp()), 0.25),
                        "neg" => (-x, 1.0),
                        _ => (
                            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()),
                            1.2 + (x.abs() + e) * 0.5,
                        ),
                    };
                    out.data.push(y);
                    out.error.push(slope * e);
                }
            }
            Step::Binary(name, a, b) => {
                let b = if binary_fits(w[a], w[b]) { b } else { a };
                let (va, vb) = (&values[a], &values[b]);
                out.dtype = DType::promote(va.dtype, vb.dtype);
                for r in 0..rows {
                    for c in 0..out_w {
                        let (ia, ib) = (idx(w[a], r, c), idx(w[b], r, c));
                        let (x, y, ex, ey) = (va.data[ia], vb.data[ib], va.error[ia], vb.error[ib]);
                        let (z, e) = match name {
                            "add" => (x + y, ex + ey),
                            "sub" => (x - y, ex + ey),
                            "mul" => (x * y, (y.abs() + ey) * ex + x.abs() * ey),
                            _ => (x.max(y), ex.max(ey)),
                        };
                        out.data.push(z);
                        out.error.push(e);
                    }
                }
            }
            Step::Scalar(a, s) => {
                let v = &values[a];
                out.dtype = v.dtype;
                out.data = v.data.iter().map(|&x| x * s as f64).collect();
                out.error = v.error.iter().map(|&e| e * (s as f64).abs()).collect();
            }
            Step::Cast(a, to) => {
                out = values[a].clone();
                out.dtype = to;
            }
            Step::Sum(a) => {
                let (v, width) = (&values[a], w[a]);
                out.dtype = v.dtype;
                for r in 0..rows {
                    let row = r * width..(r + 1) * width;
                    out.data.push(v.data[row.clone()].iter().sum());
                    // f32 partial sums: a rounding per addition, at most the row's magnitude each.
                    let magnitude: f64 = v.data[row.clone()].iter().map(|x| x.abs()).sum();
                    out.error.push(v.error[row].iter().sum::<f64>() + width as f64 * magnitude * 2f64.powi(-23));
                }
            }
            Step::Max(a) => {
                let (v, width) = (&values[a], w[a]);
                out.dtype = v.dtype;
                for r in 0..rows {
                    let row = r * width..(r + 1) * width;
                    out.data.push(v.data[row.clone()].iter().copied().fold(f64::NEG_INFINITY, f64::max));
                    out.error.push(v.error[row].iter().copied().fold(0.0, f64::max));
                }
            }
            Step::Slice(a) => {
                let (v, width) = (&values[a], w[a]);
                out.dtype = v.dtype;
                for r in 0..rows {
                    let row = r * width + slice_start(width)..(r + 1) * width;
                    out.data.extend_from_slice(&v.data[row.clone()]);
                    out.error.extend_from_slice(&v.error[row]);
                }
            }
            Step::Concat(a, b) => {
                let (va, vb) = (&values[a], &values[b]);
                out.dtype = va.dtype;
                for r in 0..rows {
                    out.data.extend_from_slice(&va.data[r * w[a]..(r + 1) * w[a]]);
                    out.error.extend_from_slice(&va.error[r * w[a]..(r + 1) * w[a]]);
                    // The second part cast to the first's dtype: its own rounding.
                    for i in r * w[b]..(r + 1) * w[b] {
                        out.data.push(round_to(va.dtype, vb.data[i]));
                        out.error.push(vb.error[i] + ulp(va.dtype, vb.data[i]));
                    }
                }
            }
            Step::LogSoftmax(a) => {
                let (v, width) = (&values[a], w[a]);
                out.dtype = v.dtype;
                for r in 0..rows {
                    let row = &v.data[r * width..(r + 1) * width];
                    let top = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let log_sum = row.iter().map(|x| (x - top).exp()).sum::<f64>().ln();
                    // Each result moves by at most its input's error and the largest in the row
                    // (the log-sum-exp's slope sums to 1); computed in f32 (a few roundings of
                    // values up to the row's spread and the log of its width).
                    let worst = v.error[r * width..(r + 1) * width].iter().copied().fold(0.0, f64::max);
                    let spread = row.iter().map(|x| (x - top).abs()).fold(0.0, f64::max) + log_sum.abs();
                    for (&x, &e) in row.iter().zip(&v.error[r * width..(r + 1) * width]) {
                        out.data.push(x - top - log_sum);
                        out.error.push(e + worst + (spread + x.abs() + 1.0) * 2f64.powi(-20));
                    }
                }
            }
        }
        // This op's own rounding, to its dtype.
        let dtype = out.dtype;
        for (x, e) in out.data.iter_mut().zip(out.error.iter_mut()) {
            let exact = *x;
            *x = round_to(dtype, exact);
            *e += ulp(dtype, exact);
        }
        values.push(out);
    }
    let last = values.last().cloned().expect("a value");
    let Some(md) = p.matmul else { return last };
    let width = *w.last().expect("a width");
    let b = &inputs[p.input_dtypes.len()];
    let dtype = DType::promote(last.dtype, md);
    let mut out = Evaluated { data: Vec::new(), dtype, error: Vec::new() };
    for r in 0..rows {
        for j in 0..3 {
            let (mut dot, mut error, mut magnitude) = (0.0, 0.0, 0.0);
            for k in 0..product_width(p) {
                let (x, e, y) =
                    (last.data[idx(width, r, k)], last.error[idx(width, r, k)], b.data().f32_at(k * 3 + j) as f64);
                dot += x * y;
                error += e * y.abs();
                magnitude += (x * y).abs();
            }
            out.data.push(round_to(dtype, dot));
            out.error.push(error + product_width(p) as f64 * magnitude * 2f64.powi(-23) + ulp(dtype, dot));
        }
    }
    out
}

/// The program as a trace (the last value is broadcast back to `[2, cols]` before a product).
fn build<'a>(p: &Program, arena: &'a Arena, registry: &'a Registry) -> boundscope::Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let mut values: Vec<_> =
        p.input_dtypes.iter().map(|&d| b.input_with(&TensorMeta::new(d, &[2, p.cols])).unwrap()).collect();
    let widths_so_far = widths(p);
    for s in &p.steps {
        let v = match *s {
            Step::Unary(name, a) => b.call(name, &[values[a].into()]).unwrap(),
            Step::Binary(name, a, c) => {
                let c = if binary_fits(widths_so_far[a], widths_so_far[c]) { c } else { a };
                b.call(name, &[values[a].into(), values[c].into()]).unwrap()
            }
            Step::Scalar(a, s) => b.mul_scalar(values[a], s).unwrap(),
            Step::Cast(a, to) => b.cast(values[a], to).unwrap(),
            Step::Sum(a) => b.sum(values[a]).unwrap(),
            Step::Max(a) => b.max_dim(values[a], 1, true).unwrap(),
            Step::Slice(a) => {
                let width = widths_so_far[a];
                b.slice(values[a], 1, slice_start(width), width).unwrap()
            }
            Step::Concat(a, c) => {
                let dtype = b.dtype(values[a]).unwrap();
                let second =
                    if b.dtype(values[c]).unwrap() == dtype { values[c] } else { b.cast(values[c], dtype).unwrap() };
                b.concat(&[values[a], second], 1).unwrap()
            }
            Step::LogSoftmax(a) => b.log_softmax(values[a]).unwrap(),
        };
        values.push(v);
    }
    let mut last = *values.last().expect("a value");
    if let Some(d) = p.matmul {
        let w = b.input_with(&TensorMeta::new(d, &[product_width(p), 3])).unwrap();
        if b.shape(last).unwrap()[1] == 1 {
            last = b.broadcast_to(last, &[2, p.cols]).unwrap();
        }
        last = b.matmul(last, w).unwrap();
    }
    b.output(last).unwrap();
    b.finish().unwrap()
}

/// `got` is of `expected`'s dtype, each element a value of it within the error bound (twice:
/// both evaluations may err, each by the bound) of the direct evaluation.
fn check(got: &Tensor, expected: &Evaluated, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.dtype(), expected.dtype, "{}: dtype", what);
    prop_assert_eq!(got.to_f32_vec().len(), expected.data.len(), "{}: length", what);
    for (i, ((&g, &e), &bound)) in got.to_f32_vec().iter().zip(&expected.data).zip(&expected.error).enumerate() {
        let g = g as f64;
        if !e.is_finite() || !g.is_finite() || !bound.is_finite() {
            // Overflow to an infinity (or NaN after it) depends on which rounding came first.
            continue;
        }
        prop_assert!((g - e).abs() <= 2.0 * bound, "{}[{}]: {} against {} (bound {:e})", what, i, g, e, bound);
        // Every element is a value of its dtype.
        prop_assert_eq!(
            expected.dtype.round(g as f32),
            g as f32,
            "{}[{}] = {} is not a {} value",
            what,
            i,
            g,
            expected.dtype
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn cpu_executors_match_per_op_rounding(p in program(), seed in any::<u64>()) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = build(&p, &arena, &registry);
        let inputs = input_data(&p, seed);
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let expected = evaluate(&p, &inputs);
        let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
        check(&reference[0], &expected, "cpu_reference")?;
        // CpuFusion keeps its temporaries in f32 and rounds only a region's outputs: fewer
        // roundings, within the same bound.
        let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
        let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
        let got = plan.run(&refs).unwrap();
        check(&got[0], &expected, "cpu_fusion")?;
    }
}

#[test]
fn the_listing_shows_dtypes() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input_with(&TensorMeta::new(DType::BF16, &[2, 4])).unwrap();
    let y = b.exp(x).unwrap();
    let z = b.cast(y, DType::F32).unwrap();
    b.output(z).unwrap();
    let trace = b.finish().unwrap();
    let listing = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().to_string();
    assert!(listing.contains("exp(t0)  # bf16[2, 4]"), "{listing}");
    assert!(listing.contains("cast(t1, f32)  # f32[2, 4]"), "{listing}");
    assert!(trace.to_string().contains("bf16[2, 4]"), "{trace}");
}

/// A user's executor that runs `exp` in f32 only (the default `Executor::dtypes`).
struct F32Exp;

impl Executor for F32Exp {
    fn name(&self) -> &str {
        "f32_exp"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol().builtin_prim() == Some(prims::EXP)
    }
    fn compile(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn Kernel>> {
        CpuReference::new().compile(op)
    }
}

#[test]
fn a_dtype_no_executor_takes_is_a_typed_error_when_compiling() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input_with(&TensorMeta::new(DType::F16, &[4])).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let err = Plan::compile(&trace, &[Arc::new(F32Exp)]).unwrap_err();
    match &err {
        Error::UnsupportedDType { symbol, dtype, tried } => {
            assert_eq!((symbol.as_str(), *dtype), ("exp", DType::F16));
            assert_eq!(tried, &vec!["f32_exp takes f32".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("no executor runs `exp` in f16"), "{err}");
    // With the CPU reference after it, the reference runs it (the user's executor never sees f16).
    let plan = Plan::compile(&trace, &[Arc::new(F32Exp), CpuReference::shared()]).unwrap();
    assert_eq!(plan.steps_per_executor(), vec![("cpu_reference", 1)]);
}

#[test]
fn host_data_of_another_dtype_is_a_typed_error_when_running() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input_with(&TensorMeta::new(DType::BF16, &[4])).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    let f32_data = Tensor::zeros(&[4]);
    let err = plan.run(&[&f32_data]).unwrap_err();
    assert_eq!(err, Error::InputDType { index: 0, expected: DType::BF16, got: DType::F32 });
    assert!(err.to_string().contains("to_dtype(bf16)"), "{err}");
    let ok = plan.run(&[&f32_data.to_dtype(DType::BF16)]).unwrap();
    assert_eq!((ok[0].dtype(), ok[0].to_f32_vec()), (DType::BF16, vec![1.0f32; 4]));
}

#[test]
fn casts_that_overflow_give_infinities_as_in_pytorch() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let h = b.cast(x, DType::F16).unwrap();
    let bf = b.cast(x, DType::BF16).unwrap();
    b.output(h).unwrap();
    b.output(bf).unwrap();
    let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    let x = Tensor::new(&[4], vec![65504.0, 65520.0, -1.0e6, f32::MAX]).unwrap();
    let got = plan.run(&[&x]).unwrap();
    // torch.tensor([65504., 65520., -1e6, 3.4028235e38]).half() -> [65504, inf, -inf, inf]
    assert_eq!(got[0].to_f32_vec(), &[65504.0, f32::INFINITY, f32::NEG_INFINITY, f32::INFINITY]);
    // .bfloat16() -> [65536, 65536, -999424, inf]: f32::MAX rounds past bf16's largest value.
    assert_eq!(got[1].to_f32_vec(), &[65536.0, 65536.0, -999424.0, f32::INFINITY]);
}

#[test]
fn unknown_dtype_names_are_typed_errors() {
    let err = "fp8".parse::<DType>().unwrap_err();
    assert!(matches!(&err, Error::UnknownDType { name, .. } if name == "fp8"));
    assert!(err.to_string().contains("use one of f32, bf16, f16"), "{err}");
}

/// A user's symbol declares its dtype in its shape rule; its CPU kernel sees it in its views.
#[test]
fn users_symbols_declare_their_dtype_rule() {
    let mut registry = Registry::with_builtins();
    let halve = Symbol::new("to_bf16_halved", Category::Elementwise)
        .params(&[ParamKind::Tensor])
        .shape_rule(|args| Ok(TensorMeta::new(DType::BF16, args[0].shape().ok_or("a tensor")?)))
        .cpu_kernel(|_| {
            Ok(kernel_fn(|inputs, outputs| {
                assert_eq!((inputs[0].dtype(), outputs[0].dtype()), (DType::F32, DType::BF16));
                for (o, &i) in outputs[0].values_mut::<half::bf16>()?.iter_mut().zip(inputs[0].values::<f32>()?) {
                    *o = half::bf16::from_f32(i / 2.0);
                }
                Ok(())
            }))
        });
    registry.register(halve).unwrap();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2]).unwrap();
    let y = b.call("to_bf16_halved", &[x.into()]).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    assert_eq!(trace.value_meta(y).unwrap().dtype, DType::BF16);
    let got = Plan::compile(&trace, &[CpuReference::shared()])
        .unwrap()
        .run(&[&Tensor::new(&[2], vec![1.0, 1.0 / 3.0]).unwrap()])
        .unwrap();
    assert_eq!(got[0].dtype(), DType::BF16);
    assert_eq!(got[0].to_f32_vec(), &[0.5, DType::BF16.round(1.0 / 6.0)]);
}

/// The composites PyTorch runs as one kernel (`softmax`, `layer_norm`, `gelu`, `linear`,
/// `linear_gelu`) are computed in `f32` and rounded once to their dtype, on the CPU reference,
/// in CpuFusion and through the front end alike: each element is within half a unit in the
/// last place (plus `f32`'s own error) of an `f64` evaluation. The rows make per-prim rounding
/// visible: a bf16 `layer_norm` of a row alternating 100 and 100.5 is `[-1, 1]` (rounding each
/// prim gave `[0, 1.414]`), and sums of many terms lose their low bits in 16 bits.
#[test]
fn composites_are_computed_in_f32_and_rounded_once() {
    use boundscope::frontend::{Environment, ProfiledSession};
    use boundscope::options::Options;
    let (rows, cols, out) = (4usize, 64usize, 24usize);
    // Row 0 alternates 100 and 100.5; the others spread over a few units with fine steps.
    let x_at = |i: usize| {
        let (r, c) = (i / cols, i % cols);
        if r == 0 {
            100.0 + 0.5 * (c % 2) as f32
        } else {
            ((c * 37 + r * 11) % 61) as f32 / 61.0 * 4.0 - 2.0 + r as f32 * 0.37
        }
    };
    let session =
        ProfiledSession::new(Options::new(), &Environment::from_pairs(&[("BOUNDSCOPE_DEVICE", "cpu")])).unwrap();
    for dtype in [DType::BF16, DType::F16] {
        let t = |shape: &[usize]| TensorMeta::new(dtype, shape);
        let x = Tensor::from_fn(&[rows, cols], x_at).to_dtype(dtype);
        let gamma = Tensor::from_fn(&[cols], |c| 1.0 + (c % 5) as f32 / 8.0).to_dtype(dtype);
        let beta = Tensor::from_fn(&[cols], |c| (c % 3) as f32 / 4.0 - 0.25).to_dtype(dtype);
        let w = Tensor::from_fn(&[out, cols], |i| ((i * 29) % 41) as f32 / 41.0 - 0.5).to_dtype(dtype);
        let bias = Tensor::from_fn(&[out], |i| (i % 7) as f32 / 7.0).to_dtype(dtype);
        let small = Tensor::from_fn(&[rows, cols], |i| x_at(i + cols) / 4.0).to_dtype(dtype);
        let at = |t: &Tensor, r: usize, c: usize, n: usize| f64::from(t.data().f32_at(r * n + c));
        let gelu = |v: f64| 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh());
        let linear = |r: usize, o: usize| -> (f64, f64) {
            let terms = (0..cols).map(|c| at(&small, r, c, cols) * at(&w, o, c, cols));
            let scale: f64 = terms.clone().map(f64::abs).sum::<f64>() + at(&bias, 0, o, out).abs();
            (terms.sum::<f64>() + at(&bias, 0, o, out), scale)
        };
        // (name, inputs, the f64 value and its scale at [r, c], output columns)
        type Exact<'e> = Box<dyn Fn(usize, usize) -> (f64, f64) + 'e>;
        let cases: Vec<(&str, Vec<&Tensor>, Exact<'_>, usize)> = vec![
            (
                "softmax",
                vec![&x],
                Box::new(|r, c| {
                    let row: Vec<f64> = (0..cols).map(|k| at(&x, r, k, cols)).collect();
                    let m = row.iter().copied().fold(f64::MIN, f64::max);
                    let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
                    ((row[c] - m).exp() / z, 1.0)
                }),
                cols,
            ),
            (
                "layer_norm",
                vec![&x, &gamma, &beta],
                Box::new(|r, c| {
                    let row: Vec<f64> = (0..cols).map(|k| at(&x, r, k, cols)).collect();
                    let mean = row.iter().sum::<f64>() / cols as f64;
                    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
                    let y = (row[c] - mean) / (var + 1e-5).sqrt() * at(&gamma, 0, c, cols) + at(&beta, 0, c, cols);
                    (y, y.abs().max(1.0) * 8.0)
                }),
                cols,
            ),
            ("gelu", vec![&small], Box::new(|r, c| (gelu(at(&small, r, c, cols)), 1.0)), cols),
            ("linear", vec![&small, &w, &bias], Box::new(linear), out),
            (
                "linear_gelu",
                vec![&small, &w, &bias],
                Box::new(|r, o| {
                    let (h, scale) = linear(r, o);
                    (gelu(h), scale)
                }),
                out,
            ),
        ];
        let registry = Registry::with_builtins();
        for (name, inputs, exact, n) in cases {
            let arena = Arena::new();
            let mut b = TraceBuilder::new(&arena, &registry);
            let ids: Vec<_> = inputs.iter().map(|i| b.input_with(&t(i.shape())).unwrap()).collect();
            let y = match name {
                "softmax" => b.softmax(ids[0]),
                "layer_norm" => b.layer_norm(ids[0], 1e-5, Some(ids[1]), Some(ids[2])),
                "gelu" => b.gelu(ids[0]),
                "linear" => b.linear(ids[0], ids[1], Some(ids[2])),
                _ => b.call("linear_gelu", &[ids[0].into(), ids[1].into(), ids[2].into()]),
            }
            .unwrap();
            b.output(y).unwrap();
            let trace = b.finish().unwrap();
            let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
            let runs = [
                ("cpu_reference", Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&inputs)),
                (
                    "cpu_fusion",
                    Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap().run(&inputs),
                ),
                ("session", session.run(&trace, &arena, &inputs)),
            ];
            for (executor, got) in runs {
                let got = got.unwrap();
                assert_eq!(got[0].dtype(), dtype);
                for r in 0..rows {
                    for c in 0..n {
                        let (e, scale) = exact(r, c);
                        let g = f64::from(got[0].data().f32_at(r * n + c));
                        let bound = ulp(dtype, e) + 1e-5 * scale;
                        assert!(
                            (g - e).abs() <= bound,
                            "{dtype} {name} on {executor} [{r}, {c}]: {g} against {e} (rounded once: {}; bound {bound:e})",
                            round_to(dtype, e)
                        );
                    }
                }
            }
        }
    }
}

/// Inside a fused region, an op reads the `f32` value of a 16-bit value made earlier in the
/// region, also when that value is an output of the region (stored rounded): `torch.compile`'s
/// rule. Outside regions (the CPU reference), each op reads the rounded value: PyTorch eager's.
/// Here `y = x + 1/512` rounds to 1 in bf16 (a tie, to even), so `z = (y - 1) * 512` is 1 from
/// the `f32` value and 0 from the rounded one. (CudaFusion follows the same rule:
/// `proptests/cuda_matches_reference.rs` checks it on the GPU.)
#[test]
fn a_fused_region_reads_the_f32_value_of_its_own_16_bit_outputs() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = common::program::reads_its_own_16_bit_output(&arena, &registry, 8);
    let ones = Tensor::from_fn(&[8], |_| 1.0).to_dtype(DType::BF16);
    let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    assert_eq!(plan.steps_per_executor(), [("cpu_fusion", 1)], "{plan}");
    let out = plan.run(&[&ones]).unwrap();
    assert_eq!(out[0].to_f32_vec(), [1.0; 8], "y is stored rounded");
    assert_eq!(out[1].to_f32_vec(), [1.0; 8], "z reads y's f32 value inside the region");
    let eager = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&ones]).unwrap();
    assert_eq!(
        (eager[0].to_f32_vec(), eager[1].to_f32_vec()),
        (vec![1.0; 8], vec![0.0; 8]),
        "op by op: the rounded value"
    );
}
