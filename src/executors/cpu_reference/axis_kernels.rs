//! CPU reference reductions over any axis (`sum_axis`, `max_axis` in `f32`) and `argmax` (any
//! float dtype in, `i64` out). A tensor reduced over axis `a` is `[outer, n, inner]`: `outer`
//! the product of the axes before `a`, `inner` of those after. Each result adds (or compares)
//! the `n` elements in an order fixed by their positions, so results do not depend on the
//! thread count; over the last axis (`inner == 1`) they are the last-axis `sum` and `max`
//! prims' own loops, so `sum_dim(x, -1)` equals `sum(x)` bit for bit. Over another axis, a sum adds its rows in blocks of
//! [`COLUMN_BLOCK`], each block's sum to a running sum of blocks, every `COLUMN_BLOCK` of those
//! to the next level, and so on (running sums the kernel keeps from its compilation, so runs
//! allocate nothing): no running sum holds more than `COLUMN_BLOCK` terms below the top level,
//! so the rounding error no longer grows with the rows (one running sum of 2^20 rows was
//! 6.9e-5 off).

use std::ops::Range;
use std::sync::Mutex;

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

/// Rows of a block, and blocks (or sums of blocks) a level of a sum over an axis other than
/// the last adds before its sum moves up a level: 256, as in each lane of a row's block
/// (`math::LaneSum`).
pub(super) const COLUMN_BLOCK: usize = 256;

/// Levels of running sums above the open block: the top one holds sums of `256^2` blocks, 2^24
/// rows, so that it adds more than [`COLUMN_BLOCK`] terms only past 2^32 rows.
const COLUMN_LEVELS: usize = 3;

/// `sum_axis` or `max_axis`.
pub(super) struct ReduceAxis {
    op: SymbolId,
    outer: usize,
    n: usize,
    inner: usize,
    parts: usize,
    /// For a sum of more than [`COLUMN_BLOCK`] rows over an axis other than the last: the
    /// levels' running sums (`COLUMN_LEVELS` rows of `inner`) for each part that runs at once
    /// (each takes a free one).
    levels: Vec<Mutex<Vec<f32>>>,
}

impl ReduceAxis {
    pub(super) fn new(op_id: SymbolId, op: &OpView<'_>, threads: usize) -> Result<Self> {
        let (outer, n, inner) = layout(op)?;
        let parts = parts_for(threads, outer * n * inner, MIN_ELEMENTS_PER_PART);
        let wide = op_id == prims::SUM_AXIS && inner > 1 && n > COLUMN_BLOCK;
        let busy = if wide { parts.min(outer) } else { 0 };
        let levels = (0..busy).map(|_| Mutex::new(vec![0.0; COLUMN_LEVELS * inner])).collect();
        Ok(Self { op: op_id, outer, n, inner, parts, levels })
    }

    /// `block`'s columns (rows of `out.len()` elements) summed into `out`, from +0 (as the
    /// last-axis sums and the decomposition start: a sum of -0 alone is +0 on every axis):
    /// the rows added in order to the open block's sums (`out`), which move up to the first
    /// level every [`COLUMN_BLOCK`] rows, whose sums move up to the next every
    /// `COLUMN_BLOCK` blocks, and so on; then the open block's sums and the levels', lowest
    /// first. Columns of [`COLUMN_BLOCK`] rows or fewer are one running sum each, as before
    /// levels.
    fn column_sums(&self, block: &[f32], out: &mut [f32]) {
        let inner = out.len();
        out.fill(0.0);
        if self.n <= COLUMN_BLOCK {
            for slice in block.chunks_exact(inner) {
                add(out, slice);
            }
            return;
        }
        // A run's parts take a list each (there are as many as run at once); runs of the plan
        // on other threads at the same time may find none free and wait for the first. (A
        // poisoned list, left by a panic elsewhere, is overwritten anyway.)
        let free = self.levels.iter().find_map(|m| match m.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        });
        let mut levels = free.unwrap_or_else(|| self.levels[0].lock().unwrap_or_else(|p| p.into_inner()));
        levels.fill(0.0);
        for (i, slice) in block.chunks_exact(inner).enumerate() {
            if i > 0 && i.is_multiple_of(COLUMN_BLOCK) {
                // A block closes: its sums move up, and with them every level that now holds
                // `COLUMN_BLOCK` terms (the top one keeps them all).
                move_up(out, &mut levels[..inner]);
                let mut terms = i / COLUMN_BLOCK;
                for level in 1..COLUMN_LEVELS {
                    if !terms.is_multiple_of(COLUMN_BLOCK) {
                        break;
                    }
                    terms /= COLUMN_BLOCK;
                    let (lower, upper) = levels.split_at_mut(level * inner);
                    move_up(&mut lower[(level - 1) * inner..], &mut upper[..inner]);
                }
            }
            add(out, slice);
        }
        for level in levels.chunks_exact(inner) {
            add(out, level);
        }
    }
}

/// `sums += x`, element by element.
#[inline(always)]
fn add(sums: &mut [f32], x: &[f32]) {
    sums.iter_mut().zip(x).for_each(|(s, &v)| *s += v);
}

/// `to += from`, then `from = 0`, element by element.
#[inline(always)]
fn move_up(from: &mut [f32], to: &mut [f32]) {
    to.iter_mut().zip(from.iter_mut()).for_each(|(t, f)| *t += std::mem::take(f));
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
                    self.column_sums(block, row);
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

#[cfg(test)]
mod tests {
    use crate::core::ir::{Arena, Registry, TraceBuilder};
    use crate::core::plan::Plan;
    use crate::core::tensor::Tensor;
    use crate::executors::CpuReference;

    /// `sum_dim(x, axis)` through a plan, on `threads` threads; runs of the plan on three
    /// threads at once (sharing its kernels' running sums, each waiting for a free one) give
    /// the same bits.
    fn axis_sums(x: &Tensor, axis: usize, threads: usize) -> Vec<f32> {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let v = b.input(x.shape()).unwrap();
        let s = b.sum_dim(v, axis, false).unwrap();
        b.output(s).unwrap();
        let executor = std::sync::Arc::new(CpuReference::new().threads(threads));
        let plan = Plan::compile(&b.finish().unwrap(), &[executor]).unwrap();
        let out = plan.run(&[x]).unwrap().remove(0).to_f32_vec();
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| assert_eq!(plan.run(&[x]).unwrap()[0].to_f32_vec(), out));
            }
        });
        out
    }

    /// `[outer, n, inner]` of values in [0.1, 0.2).
    fn values(shape: &[usize]) -> Tensor {
        Tensor::from_fn(shape, |i| 0.1 + ((i * 7919) % 1000) as f32 * 1e-4)
    }

    /// Each column's exact sum over axis 1 of `[outer, n, inner]`.
    fn exact(x: &Tensor) -> Vec<f64> {
        let (outer, n, inner) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let v = x.to_f32_vec();
        (0..outer * inner)
            .map(|k| (0..n).map(|r| f64::from(v[((k / inner) * n + r) * inner + k % inner])).sum())
            .collect()
    }

    /// Columns of many rows are summed within 1e-6 of their exact sums (one running sum was
    /// 6.9e-5 off over 2^20 rows like these; these read 7e-8 at 2^20 rows, 6.4e-7 past 2^24,
    /// where 256 sums of 2^16 rows each have been added in one running sum): through the first
    /// level, the second, and with several parts (outer indices split over threads, each with
    /// its own running sums), the same bits on one thread and on two.
    #[test]
    fn columns_of_many_rows_sum_to_within_a_millionth() {
        for shape in [[1, 1 << 20, 3], [1, (1 << 24) + 300, 2], [1, 3 * super::COLUMN_BLOCK + 7, 1030], [8, 600, 64]] {
            let x = values(&shape);
            let sums = axis_sums(&x, 1, 1);
            for (k, (&got, exact)) in sums.iter().zip(exact(&x)).enumerate() {
                assert!((f64::from(got) / exact - 1.0).abs() < 1e-6, "{shape:?} column {k}: {got} against {exact}");
            }
            assert_eq!(axis_sums(&x, 1, 2), sums, "{shape:?} on 2 threads");
        }
    }

    /// Columns of [`COLUMN_BLOCK`](super::COLUMN_BLOCK) rows or fewer give the bits of one
    /// running sum from +0.
    #[test]
    fn columns_of_one_block_are_one_running_sum() {
        for shape in [[1, 1, 3], [1, super::COLUMN_BLOCK, 70], [3, 17, 5]] {
            let x = Tensor::from_fn(&shape, |i| ((i * 13) % 29) as f32 * 0.11 - 1.3);
            let (n, inner, v) = (shape[1], shape[2], x.to_f32_vec());
            let running: Vec<f32> = (0..shape[0] * inner)
                .map(|k| (0..n).fold(0.0f32, |s, r| s + v[((k / inner) * n + r) * inner + k % inner]))
                .collect();
            assert_eq!(axis_sums(&x, 1, 2), running, "{shape:?}");
        }
    }
}
