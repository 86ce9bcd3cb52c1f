//! `softmax` and `layer_norm` whole on the CPU: each row read from memory once and kept in the
//! cache while its passes run, where their decompositions write and read a tensor per prim.
//!
//! `layer_norm` computes exactly what its decomposition computes on the CPU reference, prim by
//! prim, in the same order (the same lane sums, the same scalar functions, the same roundings),
//! so the results are the same bits; only the traffic through memory differs. `softmax` is
//! within 4 ulps of its decomposition (tested): its exponentials are [`math::exp_fused`] (fused
//! multiply-adds, 1 ulp from the exact value, about two thirds of `exp`'s operations, as
//! PyTorch's vectorised `exp` also uses them), and its last step is a product with the
//! reciprocal of the sum where the decomposition divides (as PyTorch's CPU kernel does). Both
//! are the same bits on every processor. Rows are never cut between threads, so the split does
//! not change the results either.
//!
//! The loops over 16 or 64 lanes (sums, the row's maximum) are written with AVX-512's
//! instructions where the processor has them ([`math::LaneSum::add_mapped`], `wide_max`): the
//! compiler vectorises them with 128-bit registers, two to three times slower.

use std::ops::Range;

use multiversion::multiversion;

use super::math::{self, LaneMap, LaneSum};
use crate::core::plan::{Kernel, OpView};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::Result;
use crate::executors::worker_pool::{parts_for, run_parts_writing, MIN_COSTLY_ELEMENTS_PER_PART};

/// `softmax` over the last axis: `exp(x - max) / sum(exp(x - max))` per row.
pub(super) struct Softmax {
    cols: usize,
    parts: usize,
}

/// `layer_norm` over the last axis, with an optional weight and bias of the row's length.
pub(super) struct LayerNorm {
    cols: usize,
    eps: f32,
    parts: usize,
}

/// The row length of `op`'s first input and the parts its rows are split into.
fn rows_of(op: &OpView<'_>, threads: usize) -> Result<(usize, usize)> {
    let shape = op.input_shape(0)?;
    let cols = shape.last().copied().unwrap_or(1);
    let numel: usize = shape.iter().product();
    Ok((cols, parts_for(threads, numel, MIN_COSTLY_ELEMENTS_PER_PART)))
}

impl Softmax {
    pub(super) fn new(op: &OpView<'_>, threads: usize) -> Result<Self> {
        let (cols, parts) = rows_of(op, threads)?;
        Ok(Self { cols, parts })
    }
}

impl LayerNorm {
    pub(super) fn new(op: &OpView<'_>, threads: usize) -> Result<Self> {
        let (cols, parts) = rows_of(op, threads)?;
        Ok(Self { cols, eps: op.scalar(1)?, parts })
    }
}

impl Kernel for Softmax {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (x, cols) = (inputs[0].values::<f32>()?, self.cols);
        if cols == 0 {
            return Ok(());
        }
        run_parts_writing(outputs[0].values_mut::<f32>()?, self.parts, cols, |rows: Range<usize>, out: &mut [f32]| {
            softmax_rows(&x[rows.start * cols..rows.end * cols], cols, out);
        });
        Ok(())
    }
}

impl Kernel for LayerNorm {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (x, cols) = (inputs[0].values::<f32>()?, self.cols);
        let weight = inputs.get(1).map(|w| w.values::<f32>()).transpose()?;
        let bias = inputs.get(2).map(|b| b.values::<f32>()).transpose()?;
        if cols == 0 {
            return Ok(());
        }
        let affine = Affine { weight, bias };
        run_parts_writing(outputs[0].values_mut::<f32>()?, self.parts, cols, |rows: Range<usize>, out: &mut [f32]| {
            layer_norm_rows(&x[rows.start * cols..rows.end * cols], cols, self.eps, affine, out);
        });
        Ok(())
    }
}

/// `layer_norm`'s weight and bias, each of the row's length.
#[derive(Clone, Copy)]
struct Affine<'a> {
    weight: Option<&'a [f32]>,
    bias: Option<&'a [f32]>,
}

/// Softmax of each row of `x` (rows of `cols > 0`) into `out`: the maximum, then in one pass
/// each exponential ([`math::exp_fused`]) of the difference to it, written (the row stays in
/// the cache) and added to their sum (as the decomposition's `sum` adds them), then each times
/// the reciprocal of the sum, as PyTorch's CPU kernel does (within 4 ulps of the
/// decomposition). Three passes over the row, as PyTorch's.
#[multiversion(targets = "simd")]
fn softmax_rows(x: &[f32], cols: usize, out: &mut [f32]) {
    for (row, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let max = wide_max(row);
        let exp = |v: f32| math::exp_fused(math::sub(v, max));
        // Each exponential written and added to its lane of the sum in one pass (the row stays
        // in the cache), in `row_sum`'s order.
        let full = cols - cols % LaneSum::LANES;
        let mut sum = LaneSum::new();
        sum.add_written(exp, &row[..full], &mut out[..full]);
        for (o, &v) in out[full..].iter_mut().zip(&row[full..]) {
            *o = exp(v);
        }
        let inv_sum = 1.0 / sum.finish(&out[full..]);
        for o in out.iter_mut() {
            *o = math::mul(*o, inv_sum);
        }
    }
}

/// The largest element of `row` as [`math::row_max`] finds it (NaN if any is NaN), with more
/// independent lanes, so that the loop is not bound by the latency of one compare and select
/// per lane. Only the sign of a zero maximum can differ from `row_max` (which `x - max` and so
/// softmax never sees).
#[inline(always)]
fn wide_max(row: &[f32]) -> f32 {
    const LANES: usize = 64;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = math::row_max(chunks.remainder());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the processor has AVX-512F, checked just above.
        unsafe { max_lanes_avx512(&mut lanes, &row[..row.len() - row.len() % LANES]) };
        return math::maximum(math::row_max(&lanes), rest);
    }
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = math::maximum(*lane, x);
        }
    }
    math::maximum(math::row_max(&lanes), rest)
}

/// [`wide_max`]'s lanes with AVX-512's instructions: `lane = math::maximum(lane, x)` for 64
/// lanes (four registers), element `i` of `x` (whole chunks of 64) to lane `i % 64`. The
/// compiler vectorises the plain loop with 128-bit registers.
///
/// # Safety
/// The processor has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_lanes_avx512(lanes: &mut [f32; 64], x: &[f32]) {
    use std::arch::x86_64::*;
    // SAFETY: loads and stores of 16 floats inside `lanes` and inside each whole chunk of `x`.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 4];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(lanes.as_ptr().add(16 * j));
        }
        for chunk in x.chunks_exact(64) {
            for (j, a) in acc.iter_mut().enumerate() {
                let v = _mm512_loadu_ps(chunk.as_ptr().add(16 * j));
                // `math::maximum`: the lane where it is larger or NaN, else the element.
                let keep = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(*a, v) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(*a, *a);
                *a = _mm512_mask_blend_ps(keep, v, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(lanes.as_mut_ptr().add(16 * j), *a);
        }
    }
}

/// Layer norm of each row of `x` (rows of `cols > 0`) into `out`, exactly as the decomposition
/// computes it: the mean (sum times `1 / n`), the centred values `x - mean`, the variance (the
/// sum of their squares times `1 / n`), `exp(log(variance + eps) * -0.5)`, then the product
/// with it, the weight and the bias. Three passes over the row, which stays in the cache (the
/// sum; the squares, added; the centred values again, written once with the rest).
#[multiversion(targets = "simd")]
fn layer_norm_rows(x: &[f32], cols: usize, eps: f32, affine: Affine<'_>, out: &mut [f32]) {
    let inv_n = 1.0 / cols as f32;
    for (row, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let mean = math::mul(math::row_sum(row), inv_n);
        let square_sum = lane_sum(row, LaneMap::CentredSquare(mean));
        let variance = math::mul(square_sum, inv_n);
        let inv_std = math::exp(math::mul(math::log(math::add(variance, eps)), -0.5));
        let normed = |v: f32| math::mul(math::sub(v, mean), inv_std);
        match (affine.weight, affine.bias) {
            (Some(w), Some(b)) => {
                for (((o, &v), &w), &b) in out.iter_mut().zip(row).zip(w).zip(b) {
                    *o = math::add(math::mul(normed(v), w), b);
                }
            }
            (Some(w), None) => {
                for ((o, &v), &w) in out.iter_mut().zip(row).zip(w) {
                    *o = math::mul(normed(v), w);
                }
            }
            _ => {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = normed(v);
                }
            }
        }
    }
}

/// The sum of `map(v)` over `row`, added as [`math::row_sum`] adds a row of those values.
#[inline(always)]
fn lane_sum(row: &[f32], map: LaneMap) -> f32 {
    let full = row.len() - row.len() % LaneSum::LANES;
    let mut tail = [0.0f32; LaneSum::LANES];
    for (t, &v) in tail.iter_mut().zip(&row[full..]) {
        *t = map.apply(v);
    }
    LaneSum::of_row(&row[..full], map, &tail[..row.len() - full])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `layer_norm` whole gives the bits of its decomposition's prims, computed one at a time;
    /// `softmax` whole is within 4 ulps of its decomposition (its exponentials fused
    /// multiply-adds, its last step a product with the reciprocal of the sum, where the
    /// decomposition divides). A NaN anywhere in a row makes the whole softmax row NaN.
    #[test]
    fn rows_equal_their_decompositions_bit_for_bit() {
        for cols in [1, 7, 16, 33, 64, 65, 130, 768, 1000] {
            let rows = 3;
            let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173).collect();
            let weight: Vec<f32> = (0..cols).map(|i| 0.5 + (i % 5) as f32 * 0.25).collect();
            let bias: Vec<f32> = (0..cols).map(|i| (i % 3) as f32 - 1.0).collect();
            let mut softmax = vec![0.0; x.len()];
            softmax_rows(&x, cols, &mut softmax);
            let mut norm = vec![0.0; x.len()];
            layer_norm_rows(&x, cols, 1e-5, Affine { weight: Some(&weight), bias: Some(&bias) }, &mut norm);
            for r in 0..rows {
                let row = &x[r * cols..(r + 1) * cols];
                let max = math::row_max(row);
                // Softmax: exactly its documented steps (`exp_fused`, the lane sum, a product
                // with the reciprocal), and within 4 ulps of the decomposition's bits.
                let e: Vec<f32> = row.iter().map(|&v| math::exp_fused(v - max)).collect();
                let inv_sum = 1.0 / math::row_sum(&e);
                let decomposed_sum = math::row_sum(&row.iter().map(|&v| math::exp(v - max)).collect::<Vec<_>>());
                for (c, &e) in e.iter().enumerate() {
                    let got = softmax[r * cols + c];
                    assert_eq!(got.to_bits(), (e * inv_sum).to_bits(), "softmax, cols {cols}");
                    let decomposed = math::exp(row[c] - max) / decomposed_sum;
                    assert!(
                        got.to_bits().abs_diff(decomposed.to_bits()) <= 4,
                        "softmax, cols {cols}: {got} vs {decomposed}"
                    );
                }
                let inv_n = 1.0 / cols as f32;
                let mean = math::row_sum(row) * inv_n;
                let centered: Vec<f32> = row.iter().map(|&v| v - mean).collect();
                let squares: Vec<f32> = centered.iter().map(|&c| c * c).collect();
                let variance = math::row_sum(&squares) * inv_n;
                let inv_std = math::exp(math::log(variance + 1e-5) * -0.5);
                for (c, &v) in centered.iter().enumerate() {
                    let want = v * inv_std * weight[c] + bias[c];
                    assert_eq!(norm[r * cols + c].to_bits(), want.to_bits(), "layer_norm, cols {cols}");
                }
            }
            let mut with_nan = x[..cols].to_vec();
            with_nan[cols * 2 / 3] = f32::NAN;
            let mut out = vec![0.0; cols];
            softmax_rows(&with_nan, cols, &mut out);
            assert!(out.iter().all(|v| v.is_nan()), "softmax of a row with a NaN, cols {cols}");
        }
    }
}

#[cfg(test)]
mod plans {
    use crate::executors::CpuReference;
    use crate::guards::Recorder;
    use crate::passes::{Pass, Pipeline};
    use crate::{Arena, BoundSymbolId, Plan, Registry, Tensor, TraceBuilder};

    /// A plan of `softmax` and `layer_norm` (with its weight and bias) over rows of `cols`.
    fn rows_plan_inputs(cols: usize) -> [Tensor; 3] {
        [
            Tensor::from_fn(&[5, cols], |i| ((i * 13 % 31) as f32 - 15.0) * 0.21),
            Tensor::from_fn(&[cols], |i| 1.0 + (i % 3) as f32 * 0.5),
            Tensor::from_fn(&[cols], |i| (i % 4) as f32 * 0.1),
        ]
    }

    /// The CPU reference runs `softmax` and `layer_norm` whole (one step each, as the standard
    /// passes leave them for it), equal to their decompositions; with a guard on their
    /// subsymbols it runs the decompositions, and the guard runs.
    #[test]
    fn the_cpu_reference_runs_row_ops_whole_unless_guards_sit_inside_them() {
        let registry = Registry::with_builtins();
        for cols in [1, 17, 768] {
            let arena = Arena::new();
            let mut b = TraceBuilder::new(&arena, &registry);
            let (x, w, bias) = (b.input(&[5, cols]).unwrap(), b.input(&[cols]).unwrap(), b.input(&[cols]).unwrap());
            let n = b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap();
            let y = b.softmax(n).unwrap();
            b.output(y).unwrap();
            let trace = b.finish().unwrap();
            let cpu = [CpuReference::shared()];
            let kept = Pipeline::for_executors(&cpu).run(&trace, &arena).unwrap();
            let whole = Plan::compile(&kept, &cpu).unwrap();
            assert_eq!(whole.steps_per_executor(), [("cpu_reference", 2)], "{whole}");
            let inputs = rows_plan_inputs(cols);
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let got = whole.run(&refs).unwrap();
            let decomposed = Plan::compile(&crate::passes::Decompose.run(&trace, &arena).unwrap(), &cpu).unwrap();
            assert!(decomposed.steps_per_executor()[0].1 > 10, "{decomposed}");
            let expected = decomposed.run(&refs).unwrap();
            let diff = got[0].max_abs_diff(&expected[0]);
            assert!(diff <= 1e-6, "cols {cols}: whole and decomposed differ by {diff}");

            let mut guarded = trace.clone();
            let recorder = Recorder::new();
            guarded.attach_subsymbol_guard(BoundSymbolId::from_index(0), 1, recorder.clone()).unwrap();
            let kept = Pipeline::for_executors(&cpu).run(&guarded, &arena).unwrap();
            let plan = Plan::compile(&kept, &cpu).unwrap();
            assert!(plan.steps_per_executor()[0].1 > 2, "layer_norm decomposed: {plan}");
            let got = plan.run(&refs).unwrap();
            assert!(got[0].max_abs_diff(&expected[0]) <= 1e-6);
            assert!(!recorder.is_empty(), "the subsymbols' guard ran");
        }
    }
}
