//! CPU reference kernels that move values by position: `concat`, `embedding`, `gather_last`,
//! `pad`, `scatter_last` and `embedding_backward` (which sums in `f32`)
//! (in every dtype, exactly; ids of `i64` or `i32`), and the `causal_mask`. (`slice` is a
//! strided copy: see `kernels`.)

use crate::core::plan::{Kernel, OpView};
use crate::core::tensor::{with_values, Data, DataMut, Element, TensorMut, TensorRef};
use crate::error::{Error, Result};

/// `concat(a, b, [axis])`: for each index of the axes before `axis`, a block of `a` then one
/// of `b`.
pub(super) struct Concat {
    /// Elements per block of `a` and of `b` (the axis and every axis after it).
    a_block: usize,
    b_block: usize,
}

impl Concat {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        let (a, b) = (op.input_shape(0)?, op.input_shape(1)?);
        let axis = op.dims(2)?.first().copied().unwrap_or(0);
        Ok(Self { a_block: a[axis..].iter().product(), b_block: b[axis..].iter().product() })
    }
}

impl Kernel for Concat {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        fn join<T: Element>(a: &[T], b: &[T], out: &mut [T], a_block: usize, b_block: usize) {
            let block = a_block + b_block;
            if block == 0 {
                return;
            }
            for (i, out) in out.chunks_exact_mut(block).enumerate() {
                out[..a_block].copy_from_slice(&a[i * a_block..][..a_block]);
                out[a_block..].copy_from_slice(&b[i * b_block..][..b_block]);
            }
        }
        let (a_block, b_block) = (self.a_block, self.b_block);
        with_values!(DataMut, outputs[0].data.reborrow(), out => {
            join(inputs[0].values()?, inputs[1].values()?, out, a_block, b_block)
        });
        Ok(())
    }
}

/// Checks every id of a view against `bound`: the first one outside `0..bound` is
/// [`Error::IndexOutOfRange`]; ids that are not integers are [`Error::DTypeMismatch`].
fn check_ids(symbol: &str, ids: Data<'_>, bound: usize) -> Result<()> {
    let check = |(position, index): (usize, i64)| {
        if index < 0 || index as u64 >= bound as u64 {
            Err(Error::IndexOutOfRange { symbol: symbol.into(), index, position, bound })
        } else {
            Ok(())
        }
    };
    match ids {
        Data::I64(x) => x.iter().copied().enumerate().try_for_each(check),
        Data::I32(x) => x.iter().map(|&i| i64::from(i)).enumerate().try_for_each(check),
        other => Err(Error::DTypeMismatch {
            what: format!("the ids of `{symbol}`"),
            expected: crate::DType::I64,
            got: other.dtype(),
        }),
    }
}

/// The id at position `i`, as `usize` (only called on ids [`check_ids`] accepted).
#[inline]
fn id_at(ids: Data<'_>, i: usize) -> usize {
    match ids {
        Data::I64(x) => x[i] as usize,
        Data::I32(x) => x[i] as usize,
        _ => 0,
    }
}

/// `embedding(weight, ids)`: row `ids[i]` of the weight, for each `i`.
pub(super) struct Embedding {
    rows: usize,
    width: usize,
}

impl Embedding {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        let weight = op.input_shape(0)?;
        Ok(Self { rows: weight[0], width: weight[1] })
    }
}

impl Kernel for Embedding {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let ids = inputs[1].data;
        check_ids("embedding", ids, self.rows)?;
        let width = self.width;
        if width == 0 {
            return Ok(());
        }
        with_values!(DataMut, outputs[0].data.reborrow(), out => {
            let weight = inputs[0].values()?;
            for (i, row) in out.chunks_exact_mut(width).enumerate() {
                row.copy_from_slice(&weight[id_at(ids, i) * width..][..width]);
            }
        });
        Ok(())
    }
}

/// `gather_last(x, ids)`: element `ids[r]` of row `r` of `x`.
pub(super) struct GatherLast {
    n: usize,
}

impl GatherLast {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        Ok(Self { n: op.input_shape(0)?.last().copied().unwrap_or(1) })
    }
}

impl Kernel for GatherLast {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let ids = inputs[1].data;
        check_ids("gather_last", ids, self.n)?;
        let n = self.n;
        with_values!(DataMut, outputs[0].data.reborrow(), out => {
            let x = inputs[0].values()?;
            for (r, o) in out.iter_mut().enumerate() {
                *o = x[r * n + id_at(ids, r)];
            }
        });
        Ok(())
    }
}

/// `causal_mask(x)` in `f32`: `-inf` where the column is past the row.
pub(super) struct CausalMask {
    rows: usize,
    cols: usize,
}

impl CausalMask {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        let shape = op.input_shape(0)?;
        Ok(Self { rows: shape[shape.len() - 2], cols: shape[shape.len() - 1] })
    }
}

impl Kernel for CausalMask {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (x, out) = (inputs[0].values::<f32>()?, outputs[0].values_mut::<f32>()?);
        let (rows, cols) = (self.rows.max(1), self.cols);
        if cols == 0 {
            return Ok(());
        }
        for (r, (o, x)) in out.chunks_exact_mut(cols).zip(x.chunks_exact(cols)).enumerate() {
            let keep = (r % rows + 1).min(cols);
            o[..keep].copy_from_slice(&x[..keep]);
            o[keep..].fill(f32::NEG_INFINITY);
        }
        Ok(())
    }
}

/// `pad(x, [axis, before, after], fill)`: for each index of the axes before `axis`, `before`
/// blocks of `fill`, the block of `x`, `after` blocks of `fill` (in every dtype).
pub(super) struct Pad {
    /// Elements of one index of `axis` and every axis after it, in `x`.
    block: usize,
    /// Elements of fill before and after each block.
    before: usize,
    after: usize,
    fill: f32,
}

impl Pad {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        let shape = op.input_shape(0)?;
        let (axis, before, after) = match op.dims(1)? {
            &[axis, before, after] => (axis, before, after),
            _ => (0, 0, 0),
        };
        let inner: usize = shape[axis + 1..].iter().product();
        let fill = match op.args().get(2) {
            Some(crate::Arg::Scalar(s)) => *s,
            _ => 0.0,
        };
        Ok(Self { block: shape[axis] * inner, before: before * inner, after: after * inner, fill })
    }
}

impl Kernel for Pad {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        fn pad<T: Element>(x: &[T], out: &mut [T], p: &Pad) {
            let row = p.before + p.block + p.after;
            if row == 0 {
                return;
            }
            let fill = T::from_f32(p.fill);
            for (i, out) in out.chunks_exact_mut(row).enumerate() {
                out[..p.before].fill(fill);
                out[p.before..p.before + p.block].copy_from_slice(&x[i * p.block..][..p.block]);
                out[p.before + p.block..].fill(fill);
            }
        }
        with_values!(DataMut, outputs[0].data.reborrow(), out => pad(inputs[0].values()?, out, self));
        Ok(())
    }
}

/// `scatter_last(values, ids, [n])`: rows of `n` zeros with `values[r]` at column `ids[r]`.
pub(super) struct ScatterLast {
    n: usize,
}

impl ScatterLast {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        Ok(Self { n: op.dims(2)?.first().copied().unwrap_or(0) })
    }
}

impl Kernel for ScatterLast {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        fn scatter<T: Element>(values: &[T], ids: Data<'_>, out: &mut [T], n: usize) {
            out.fill(T::default());
            for (r, &v) in values.iter().enumerate() {
                out[r * n + id_at(ids, r)] = v;
            }
        }
        let ids = inputs[1].data;
        check_ids("scatter_last", ids, self.n)?;
        with_values!(DataMut, outputs[0].data.reborrow(), out => scatter(inputs[0].values()?, ids, out, self.n));
        Ok(())
    }
}

thread_local! {
    /// The `f32` sums of a 16-bit `embedding_backward`, kept per thread so that steady-state
    /// runs allocate nothing.
    static SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `embedding_backward(grad, ids, [rows])`: row `ids[i]` of the table accumulates row `i` of
/// `grad`, in `f32` (in place for `f32` tables, in per-thread scratch for 16-bit ones, rounded
/// once at the end), rows in the order of the ids.
pub(super) struct EmbeddingBackward {
    rows: usize,
    width: usize,
}

impl EmbeddingBackward {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        let width = op.input_shape(0)?.last().copied().unwrap_or(0);
        Ok(Self { rows: op.dims(2)?.first().copied().unwrap_or(0), width })
    }
}

impl Kernel for EmbeddingBackward {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        fn accumulate<T: Element>(grad: &[T], ids: Data<'_>, sums: &mut [f32], width: usize) {
            sums.fill(0.0);
            for (i, row) in grad.chunks_exact(width).enumerate() {
                let at = id_at(ids, i) * width;
                for (s, g) in sums[at..at + width].iter_mut().zip(row) {
                    *s += g.to_f32();
                }
            }
        }
        let ids = inputs[1].data;
        check_ids("embedding_backward", ids, self.rows)?;
        let width = self.width;
        if width == 0 {
            return Ok(());
        }
        if let DataMut::F32(out) = outputs[0].data.reborrow() {
            with_values!(Data, inputs[0].data, grad => accumulate(grad, ids, out, width));
            return Ok(());
        }
        SUMS.with(|sums| {
            let mut sums = sums.borrow_mut();
            sums.resize(self.rows * width, 0.0);
            with_values!(Data, inputs[0].data, grad => accumulate(grad, ids, &mut sums, width));
            super::in_f32::narrow(&sums, outputs[0].data.reborrow());
        });
        Ok(())
    }
}
