//! CPU reference reductions over any axis (`sum_axis`, `max_axis` in `f32`) and `argmax` (any
//! float dtype in, `i64` out). A tensor reduced over axis `a` is `[outer, n, inner]`: `outer`
//! the product of the axes before `a`, `inner` of those after. Each result adds (or compares)
//! the `n` elements in order, so results do not depend on the thread count; over the last axis
//! (`inner == 1`) they are the last-axis `sum` and `max` prims' own loops, so `sum_dim(x, -1)`
//! equals `sum(x)` bit for bit.

use std::ops::Range;

use super::math::maximum;
use super::vector_loops::{row_maxima, row_sums};
use crate::core::ir::{prims, SymbolId};
use crate::core::plan::{Kernel, OpView};
use crate::core::tensor::{with_values, Data, Element, TensorMut, TensorRef};
use crate::error::Result;
use crate::executors::worker_pool::{parts_for, run_parts_writing, MIN_ELEMENTS_PER_PART};

/// `[outer, n, inner]` of `op`'s input reduced over its axis.
fn layout(op: &OpView<'_>) -> Result<(usize, usize, usize)> {
    let shape = op.input_shape(0)?;
    let axis = op.dims(1)?.first().copied().unwrap_or(0);
    Ok((shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product()))
}

/// `sum_axis` or `max_axis`.
pub(super) struct ReduceAxis {
    op: SymbolId,
    outer: usize,
    n: usize,
    inner: usize,
    parts: usize,
}

impl ReduceAxis {
    pub(super) fn new(op_id: SymbolId, op: &OpView<'_>, threads: usize) -> Result<Self> {
        let (outer, n, inner) = layout(op)?;
        let parts = parts_for(threads, outer * n * inner, MIN_ELEMENTS_PER_PART);
        Ok(Self { op: op_id, outer, n, inner, parts })
    }
}

impl Kernel for ReduceAxis {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (x, out) = (inputs[0].values::<f32>()?, outputs[0].values_mut::<f32>()?);
        let (n, inner, sum) = (self.n, self.inner, self.op == prims::SUM_AXIS);
        if out.is_empty() {
            // An axis after this one of size 0: no results.
            return Ok(());
        }
        if n == 0 {
            out.fill(if sum { 0.0 } else { f32::NEG_INFINITY });
            return Ok(());
        }
        if inner == 1 {
            // The last axis: the last-axis prims' loops.
            run_parts_writing(out, self.parts, 1, |rows: Range<usize>, out: &mut [f32]| {
                let rows = &x[rows.start * n..rows.end * n];
                if sum {
                    row_sums(rows, n, out)
                } else {
                    row_maxima(rows, n, out)
                }
            });
            return Ok(());
        }
        // Parts of whole outer indices: each `[n, inner]` block reduced into one `[inner]` row.
        debug_assert_eq!(out.len(), self.outer * inner);
        run_parts_writing(out, self.parts, inner, |outers: Range<usize>, out: &mut [f32]| {
            for (o, row) in outers.zip(out.chunks_exact_mut(inner)) {
                let block = &x[o * n * inner..][..n * inner];
                if sum {
                    // From +0, as the last-axis sums (`math::row_sum`) and the decomposition
                    // start: a sum of -0 alone is +0 on every axis, not -0 on all but the last.
                    row.fill(0.0);
                    for slice in block.chunks_exact(inner) {
                        row.iter_mut().zip(slice).for_each(|(r, &v)| *r += v);
                    }
                } else {
                    row.copy_from_slice(&block[..inner]);
                    for slice in block.chunks_exact(inner).skip(1) {
                        row.iter_mut().zip(slice).for_each(|(r, &v)| *r = maximum(*r, v));
                    }
                }
            }
        });
        Ok(())
    }
}

/// `argmax`: the index of the first maximum along the axis; a NaN is the maximum (the first
/// NaN wins), as in PyTorch.
pub(super) struct Argmax {
    n: usize,
    inner: usize,
}

impl Argmax {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        let (_, n, inner) = layout(op)?;
        Ok(Self { n, inner })
    }
}

impl Kernel for Argmax {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        fn argmax<T: Element>(x: &[T], out: &mut [i64], n: usize, inner: usize) {
            for (j, o) in out.iter_mut().enumerate() {
                let (outer, i) = (j / inner, j % inner);
                let at = |p: usize| x[(outer * n + p) * inner + i].to_f32();
                let (mut best, mut value) = (0, at(0));
                for p in 1..n {
                    let v = at(p);
                    if !value.is_nan() && (v > value || v.is_nan()) {
                        (best, value) = (p, v);
                    }
                }
                *o = best as i64;
            }
        }
        let out = outputs[0].values_mut::<i64>()?;
        let (n, inner) = (self.n, self.inner.max(1));
        with_values!(Data, inputs[0].data, x => argmax(x, out, n, inner));
        Ok(())
    }
}
