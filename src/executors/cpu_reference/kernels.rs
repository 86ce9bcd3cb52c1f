//! The CPU reference kernels. Each is built once per bound symbol with its shape analysis done,
//! and runs on contiguous row-major buffers.

use std::ops::Range;

use smallvec::smallvec;

use super::in_f32::InF32;
use super::math::{with_binary, with_unary};
use super::products::{matmul_block, BLayout};
use super::vector_loops::{
    map_binary, map_binary_scalar_left, map_binary_scalar_right, map_unary, row_maxima, row_sums,
};
use super::{axis_kernels, index_kernels, select_kernels};
use crate::core::ir::{prims, Arg, Shape, SymbolId};
use crate::core::plan::{Kernel, MapKernel, OpView};
use crate::core::tensor::{with_same_values, with_values, Data, DataMut, Element, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::executors::worker_pool::{
    min_elements_per_part, part_range, parts_for, run_parts, run_parts_writing, SharedMut, MIN_ELEMENTS_PER_PART,
};

/// Compiles the kernel of built-in prim `id`, splitting large ops over up to `threads` threads
/// (0: every core). Kernels that move values (reshape, transpose, broadcast, cast) take every
/// dtype as it is; the float math computes in `f32` ([`InF32`]).
pub(super) fn compile(id: SymbolId, op: &OpView<'_>, threads: usize) -> Result<Box<dyn Kernel>> {
    let kernel = compile_kernel(id, op, threads)?;
    Ok(match id {
        prims::RESHAPE
        | prims::CAST
        | prims::TRANSPOSE
        | prims::BROADCAST_TO
        | prims::SLICE
        | prims::CONCAT
        | prims::EMBEDDING
        | prims::GATHER_LAST
        | prims::PAD
        | prims::SCATTER_LAST
        | prims::EMBEDDING_BACKWARD
        | prims::ARGMAX
        | prims::WHERE => kernel,
        _ if prims::COMPARISONS.contains(&id) => kernel,
        _ => InF32::wrap(kernel, op),
    })
}

fn compile_kernel(id: SymbolId, op: &OpView<'_>, threads: usize) -> Result<Box<dyn Kernel>> {
    let out_shape = op.output_shape(0)?;
    let numel: usize = out_shape.iter().product();
    let streaming = parts_for(threads, numel, MIN_ELEMENTS_PER_PART);
    Ok(match id {
        prims::SUM | prims::MAX => {
            let n = op.input_shape(0)?.last().copied().unwrap_or(1);
            let parts = parts_for(threads, numel * n, MIN_ELEMENTS_PER_PART);
            Box::new(ReduceLastAxis { op: id, n, parts })
        }
        prims::MATMUL => Box::new(Matmul::new(op, out_shape, BLayout::Rows, threads)?),
        prims::RESHAPE => Box::new(Copy { parts: streaming }),
        prims::CAST => Box::new(Cast { parts: streaming }),
        prims::TRANSPOSE => {
            let input_strides = contiguous_strides(op.input_shape(0)?);
            let source_strides = op.dims(1)?.iter().map(|&p| input_strides[p]).collect();
            Box::new(StridedCopy {
                out_shape: Shape::from_slice(out_shape),
                source_strides,
                offset: 0,
                parts: streaming,
            })
        }
        prims::BROADCAST_TO => Box::new(StridedCopy {
            out_shape: Shape::from_slice(out_shape),
            source_strides: broadcast_strides(op.input_shape(0)?, out_shape),
            offset: 0,
            parts: streaming,
        }),
        prims::SLICE => {
            // The input's own strides, from the first element of the slice.
            let source_strides = contiguous_strides(op.input_shape(0)?);
            let (axis, start) = match op.dims(1)? {
                &[axis, start, _] => (axis, start),
                _ => (0, 0),
            };
            let offset = start * source_strides.get(axis).copied().unwrap_or(0);
            Box::new(StridedCopy { out_shape: Shape::from_slice(out_shape), source_strides, offset, parts: streaming })
        }
        prims::CONCAT => Box::new(index_kernels::Concat::new(op)?),
        prims::EMBEDDING => Box::new(index_kernels::Embedding::new(op)?),
        prims::GATHER_LAST => Box::new(index_kernels::GatherLast::new(op)?),
        prims::CAUSAL_MASK => Box::new(index_kernels::CausalMask::new(op)?),
        prims::PAD => Box::new(index_kernels::Pad::new(op)?),
        prims::SCATTER_LAST => Box::new(index_kernels::ScatterLast::new(op)?),
        prims::EMBEDDING_BACKWARD => Box::new(index_kernels::EmbeddingBackward::new(op)?),
        prims::SUM_AXIS | prims::MAX_AXIS => Box::new(axis_kernels::ReduceAxis::new(id, op, threads)?),
        prims::ARGMAX => Box::new(axis_kernels::Argmax::new(op)?),
        prims::WHERE => Box::new(select_kernels::Where::new(op)?),
        _ if prims::COMPARISONS.contains(&id) => Box::new(select_kernels::Compare::new(id, op)?),
        // A kernel type per op (the scalar function a zero-sized type), so that a run makes no
        // choice of op.
        _ if with_unary!(id, _f => true, _ => false) => {
            let parts = parts_for(threads, numel, min_elements_per_part(id));
            with_unary!(id, f => Box::new(Unary { f, parts }), _ => unreachable!("checked just above"))
        }
        _ if with_binary!(id, _f => true, _ => false) => {
            with_binary!(id, f => Box::new(Binary::new(f, op, out_shape, streaming)?), _ => unreachable!("checked just above"))
        }
        _ => {
            return Err(Error::NoExecutor {
                symbol: op.name().to_string(),
                tried: vec![super::CpuReference::NAME.into()],
            })
        }
    })
}

/// Row-major strides of a contiguous tensor.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Shape {
    let mut strides: Shape = smallvec![0; shape.len()];
    let mut s = 1;
    for (stride, &d) in strides.iter_mut().zip(shape).rev() {
        *stride = s;
        s *= d;
    }
    strides
}

/// Strides that read an input of `in_shape` broadcast to `out_shape` (0 along broadcast axes).
pub(crate) fn broadcast_strides(in_shape: &[usize], out_shape: &[usize]) -> Shape {
    let offset = out_shape.len() - in_shape.len().min(out_shape.len());
    let contiguous = contiguous_strides(in_shape);
    let mut strides: Shape = smallvec![0; out_shape.len()];
    for (i, (&d, &s)) in in_shape.iter().zip(&contiguous).enumerate() {
        strides[offset + i] = if d == 1 { 0 } else { s };
    }
    strides
}

/// How an input of `input_shape` is read while iterating over `shape` (which it broadcasts
/// to): the classification both fusion executors (CPU and CUDA) build their loads on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BroadcastRead {
    /// The same shape: element `i` is element `i`.
    Same,
    /// One element, read everywhere.
    Single,
    /// Constant along each row (last-axis stride 0).
    RowConstant,
    /// One contiguous row, repeated (last-axis stride 1 over a full row).
    RowVector,
    /// Anything else: element by element, through the strides.
    Other,
}

pub(crate) fn broadcast_read(input_shape: &[usize], shape: &[usize]) -> BroadcastRead {
    if input_shape == shape {
        return BroadcastRead::Same;
    }
    if input_shape.iter().product::<usize>() == 1 {
        return BroadcastRead::Single;
    }
    match broadcast_strides(input_shape, shape).last() {
        Some(0) => BroadcastRead::RowConstant,
        Some(1) if input_shape.last() == shape.last() => BroadcastRead::RowVector,
        _ => BroadcastRead::Other,
    }
}

/// Offset of the first element of row `row` (all axes but the last) under `strides`.
#[inline]
fn row_offset(mut row: usize, shape: &[usize], strides: &[usize]) -> usize {
    let mut offset = 0;
    let outer = shape.len().saturating_sub(1);
    for axis in (0..outer).rev() {
        let d = shape[axis];
        offset += (row % d) * strides[axis];
        row /= d;
    }
    offset
}

/// An elementwise op of one input, `f` its scalar function.
struct Unary<F> {
    f: F,
    parts: usize,
}

impl<F: Fn(f32) -> f32 + std::marker::Copy + Send + Sync> Kernel for Unary<F> {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let x = inputs[0].values::<f32>()?;
        self.map(&[x], outputs[0].values_mut::<f32>()?);
        Ok(())
    }

    fn as_map(&self) -> Option<&dyn MapKernel> {
        Some(self)
    }
}

impl<F: Fn(f32) -> f32 + std::marker::Copy + Send + Sync> MapKernel for Unary<F> {
    #[inline]
    fn map(&self, inputs: &[&[f32]], out: &mut [f32]) {
        let (x, f) = (inputs[0], self.f);
        run_parts_writing(out, self.parts, 1, |r: Range<usize>, out: &mut [f32]| map_unary(f, &x[r], out));
    }
}

enum BinaryMode {
    /// Both inputs have the output's shape.
    SameShape,
    /// The second argument is a scalar.
    Scalar(f32),
    /// Numpy broadcasting; strides per output axis (0 along broadcast axes).
    Broadcast { out_shape: Shape, a_strides: Shape, b_strides: Shape },
}

/// An elementwise op of two operands, `f` its scalar function.
struct Binary<F> {
    f: F,
    mode: BinaryMode,
    parts: usize,
}

impl<F> Binary<F> {
    fn new(f: F, view: &OpView<'_>, out_shape: &[usize], parts: usize) -> Result<Self> {
        let a = view.input_shape(0)?;
        let mode = match view.args().get(1) {
            Some(Arg::Scalar(s)) => BinaryMode::Scalar(*s),
            _ => {
                let b = view.input_shape(1)?;
                if a == out_shape && b == out_shape {
                    BinaryMode::SameShape
                } else {
                    BinaryMode::Broadcast {
                        out_shape: Shape::from_slice(out_shape),
                        a_strides: broadcast_strides(a, out_shape),
                        b_strides: broadcast_strides(b, out_shape),
                    }
                }
            }
        };
        Ok(Self { f, mode, parts })
    }
}

impl<F: Fn(f32, f32) -> f32 + std::marker::Copy + Send + Sync> Kernel for Binary<F> {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let a = inputs[0].values::<f32>()?;
        let f = self.f;
        match &self.mode {
            BinaryMode::SameShape => {
                let b = inputs[1].values::<f32>()?;
                self.map(&[a, b], outputs[0].values_mut::<f32>()?);
            }
            BinaryMode::Scalar(_) => self.map(&[a], outputs[0].values_mut::<f32>()?),
            BinaryMode::Broadcast { out_shape, a_strides, b_strides } => {
                let b = inputs[1].values::<f32>()?;
                let inner = out_shape.last().copied().unwrap_or(1);
                let (sa, sb) = (a_strides.last().copied().unwrap_or(0), b_strides.last().copied().unwrap_or(0));
                if inner == 0 {
                    return Ok(());
                }
                // Parts of whole rows.
                run_parts_writing(
                    outputs[0].values_mut::<f32>()?,
                    self.parts,
                    inner,
                    |rows: Range<usize>, out: &mut [f32]| {
                        for (row, o) in rows.zip(out.chunks_exact_mut(inner)) {
                            let ao = row_offset(row, out_shape, a_strides);
                            let bo = row_offset(row, out_shape, b_strides);
                            match (sa, sb) {
                                (0, 0) => o.fill(f(a[ao], b[bo])),
                                (0, _) => map_binary_scalar_left(f, a[ao], &b[bo..bo + inner], o),
                                (_, 0) => map_binary_scalar_right(f, &a[ao..ao + inner], b[bo], o),
                                _ => map_binary(f, &a[ao..ao + inner], &b[bo..bo + inner], o),
                            }
                        }
                    },
                );
            }
        }
        Ok(())
    }

    fn as_map(&self) -> Option<&dyn MapKernel> {
        match self.mode {
            BinaryMode::SameShape | BinaryMode::Scalar(_) => Some(self),
            BinaryMode::Broadcast { .. } => None,
        }
    }
}

impl<F: Fn(f32, f32) -> f32 + std::marker::Copy + Send + Sync> MapKernel for Binary<F> {
    /// Same shapes (two inputs) or a scalar second argument (one input); broadcasts are not a map.
    #[inline]
    fn map(&self, inputs: &[&[f32]], out: &mut [f32]) {
        let f = self.f;
        match (&self.mode, inputs) {
            (BinaryMode::Scalar(s), &[a, ..]) => {
                run_parts_writing(out, self.parts, 1, |r, out: &mut [f32]| map_binary_scalar_right(f, &a[r], *s, out))
            }
            (_, &[a, b, ..]) => run_parts_writing(out, self.parts, 1, |r: Range<usize>, out: &mut [f32]| {
                map_binary(f, &a[r.clone()], &b[r], out)
            }),
            // `as_map` offers the map for those two modes only, whose steps have these inputs.
            _ => unreachable!("a binary map called with {} inputs", inputs.len()),
        }
    }
}

struct ReduceLastAxis {
    op: SymbolId,
    n: usize,
    parts: usize,
}

impl Kernel for ReduceLastAxis {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (n, x) = (self.n, inputs[0].values::<f32>()?);
        if n == 0 {
            outputs[0].values_mut::<f32>()?.fill(if self.op == prims::SUM { 0.0 } else { f32::NEG_INFINITY });
            return Ok(());
        }
        // Parts of whole rows: each row is added in the same order whatever the split.
        run_parts_writing(outputs[0].values_mut::<f32>()?, self.parts, 1, |rows: Range<usize>, out: &mut [f32]| {
            let rows = &x[rows.start * n..rows.end * n];
            if self.op == prims::SUM {
                row_sums(rows, n, out)
            } else {
                row_maxima(rows, n, out)
            }
        });
        Ok(())
    }
}

/// `matmul`, batched: `[..., m, k] x [..., k, n]`, each batch index's operands found through
/// the broadcast strides of the batch dimensions (a batch of one for 2-D operands); or, with `b`
/// stored `[..., n, k]` and read transposed, `matmul_transposed` and `linear` (whose bias, the
/// third input, is added to each row of the product as it is written).
struct Matmul {
    m: usize,
    k: usize,
    n: usize,
    layout: BLayout,
    bias: bool,
    /// The output's batch dimensions, and the strides (in matrices) that read each operand's
    /// matrix for a batch index (0 along broadcast dimensions).
    batch: Shape,
    a_strides: Shape,
    b_strides: Shape,
    /// The parts a run splits into: `(row parts, column parts)` ([`product_grid`]).
    grid: (usize, usize),
}

/// Columns of a part when a product is split by columns: a multiple of every register block's
/// width, so parts add no partial blocks.
const COLUMNS_PER_UNIT: usize = 32;

impl Matmul {
    fn new(op: &OpView<'_>, out_shape: &[usize], layout: BLayout, threads: usize) -> Result<Self> {
        let (a, b) = (op.input_shape(0)?, op.input_shape(1)?);
        let (ra, rb, ro) = (a.len(), b.len(), out_shape.len());
        if ra < 2 || rb < 2 || ro < 2 {
            return Err(Error::KernelPrecondition {
                executor: super::CpuReference::NAME.into(),
                symbol: op.name().into(),
                detail: format!("a product takes operands of rank 2 or more, not {a:?} and {b:?}"),
            });
        }
        let (m, k) = (a[ra - 2], a[ra - 1]);
        let n = if layout == BLayout::Rows { b[rb - 1] } else { b[rb - 2] };
        let batch = Shape::from_slice(&out_shape[..ro - 2]);
        let batches: usize = batch.iter().product();
        // Parts of rows worth at least as many multiply-adds as a streaming part's elements.
        let work = batches.saturating_mul(m).saturating_mul(k).saturating_mul(n);
        Ok(Self {
            m,
            k,
            n,
            layout,
            bias: op.bound_symbol().inputs().count() > 2,
            a_strides: broadcast_strides(&a[..ra - 2], &batch),
            b_strides: broadcast_strides(&b[..rb - 2], &batch),
            grid: product_grid(batches * m, n, parts_for(threads, work, MIN_ELEMENTS_PER_PART)),
            batch,
        })
    }
}

impl Kernel for Matmul {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (a, b) = (inputs[0].values::<f32>()?, inputs[1].values::<f32>()?);
        let bias = if self.bias { Some(inputs[2].values::<f32>()?) } else { None };
        let (m, k, n, layout) = (self.m, self.k, self.n, self.layout);
        if n == 0 || m == 0 {
            return Ok(());
        }
        let (a_matrix, b_matrix) = (m * k, k * n);
        let out = outputs[0].values_mut::<f32>()?;
        let rows_total = out.len() / n;
        let shared = SharedMut::new(out);
        // Part `part` of the grid: a range of the output's rows (all batches' rows in order)
        // by a range of its columns; each run of rows within one batch index is one product.
        let (row_parts, column_parts) = self.grid;
        run_parts(row_parts * column_parts, &|part| {
            let rows = part_range(part / column_parts, row_parts, rows_total);
            let units = part_range(part % column_parts, column_parts, n.div_ceil(COLUMNS_PER_UNIT));
            let columns = units.start * COLUMNS_PER_UNIT..(units.end * COLUMNS_PER_UNIT).min(n);
            let mut row = rows.start;
            while row < rows.end {
                let index = row / m;
                let end = ((index + 1) * m).min(rows.end);
                let a_at = row_offset_in(index, &self.batch, &self.a_strides) * a_matrix;
                let b_at = row_offset_in(index, &self.batch, &self.b_strides) * b_matrix;
                let (a, b) = (&a[a_at..a_at + a_matrix], &b[b_at..b_at + b_matrix]);
                // SAFETY: rows `row..end` lie inside the output (`rows_total` rows of `n`), and
                // the grid's parts write disjoint blocks of rows and columns of it while the
                // section holds its borrow.
                unsafe {
                    matmul_block(
                        a,
                        b,
                        layout,
                        bias,
                        shared.get().add(row * n),
                        row - index * m..end - index * m,
                        columns.clone(),
                        k,
                        n,
                    )
                };
                row = end;
            }
        });
        Ok(())
    }
}

/// How a product of `rows` rows (all batches'), depth `k` and `n` columns splits into `parts`
/// parts: a grid of `(row parts, column parts)`. Each part packs the panels of `a` for its rows
/// (again for every 1,024 columns of `b` it covers) and the panels of `b` for its columns, so
/// the grid that packs least per part is chosen (rows first where two tie): on 2 cores a
/// square product splits its rows and one of few rows its columns; on 16 cores a square one
/// splits 4 x 4, where splitting rows alone would have every part pack all of `b`. Column parts
/// are whole register blocks' columns.
fn product_grid(rows: usize, n: usize, parts: usize) -> (usize, usize) {
    let column_units = n.div_ceil(COLUMNS_PER_UNIT);
    let packed = |(r, c): (usize, usize)| {
        let (part_rows, part_columns) = (rows.div_ceil(r), n.div_ceil(c));
        part_rows * part_columns.div_ceil(1024) + part_columns
    };
    (1..=parts)
        .filter(|&c| parts.is_multiple_of(c) && c <= column_units && parts / c <= rows.max(1))
        .map(|c| (parts / c, c))
        .min_by_key(|&grid| packed(grid))
        .unwrap_or((1, 1))
}

/// Compiles built-in composite `id` whole ([`super::CpuReference`] prefers `linear` and
/// `matmul_transposed` so: one product reading the weight transposed, no transpose copy).
pub(super) fn compile_composite(id: SymbolId, op: &OpView<'_>, threads: usize) -> Result<Box<dyn Kernel>> {
    let out_shape = op.output_shape(0)?;
    match id {
        prims::LINEAR | prims::MATMUL_TRANSPOSED => {
            Ok(InF32::wrap(Box::new(Matmul::new(op, out_shape, BLayout::Transposed, threads)?), op))
        }
        prims::SOFTMAX => Ok(InF32::wrap(Box::new(super::row_kernels::Softmax::new(op, threads)?), op)),
        prims::LAYER_NORM => Ok(InF32::wrap(Box::new(super::row_kernels::LayerNorm::new(op, threads)?), op)),
        _ => Err(Error::KernelPrecondition {
            executor: super::CpuReference::NAME.into(),
            symbol: op.name().into(),
            detail: "the CPU reference runs this composite through its decomposition".into(),
        }),
    }
}

/// The offset of batch index `index` (flat, row-major over `shape`) under `strides`.
#[inline]
fn row_offset_in(mut index: usize, shape: &[usize], strides: &[usize]) -> usize {
    let mut offset = 0;
    for axis in (0..shape.len()).rev() {
        let d = shape[axis].max(1);
        offset += (index % d) * strides[axis];
        index /= d;
    }
    offset
}

struct Copy {
    parts: usize,
}

impl Kernel for Copy {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        with_same_values!(inputs[0].data, outputs[0].data.reborrow(), (x, out) => {
            run_parts_writing(out, self.parts, 1, |r: Range<usize>, out: &mut [_]| out.copy_from_slice(&x[r]));
            Ok(())
        }, _ => Err(mismatch("reshape", &inputs[0], &outputs[0])))
    }
}

/// `cast`: each value converted to the output's dtype, as [`Element::convert`] does.
struct Cast {
    parts: usize,
}

impl Kernel for Cast {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        fn convert<S: Element, T: Element>(x: &[S], out: &mut [T], parts: usize) {
            run_parts_writing(out, parts, 1, |r: Range<usize>, out: &mut [T]| {
                for (o, &v) in out.iter_mut().zip(&x[r]) {
                    *o = T::convert(v);
                }
            });
        }
        let parts = self.parts;
        with_values!(Data, inputs[0].data, x => with_values!(DataMut, outputs[0].data.reborrow(), out => convert(x, out, parts)));
        Ok(())
    }
}

/// The error of a kernel given views of other dtypes than its op's.
pub(crate) fn mismatch(op: &str, input: &TensorRef<'_>, output: &TensorMut<'_>) -> Error {
    Error::KernelPrecondition {
        executor: super::CpuReference::NAME.into(),
        symbol: op.into(),
        detail: format!("the input is {} but the output {}: the views are not the op's", input.dtype(), output.dtype()),
    }
}

/// Ranks up to this one count output indices on the stack; higher ranks divide instead.
const MAX_COUNTED_RANK: usize = 8;

/// Writes the output in order, reading the input through arbitrary strides (transpose,
/// broadcast), in any dtype.
struct StridedCopy {
    out_shape: Shape,
    source_strides: Shape,
    /// Where the source starts (a slice's first element).
    offset: usize,
    parts: usize,
}

impl Kernel for StridedCopy {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        with_same_values!(inputs[0].data, outputs[0].data.reborrow(), (input, out) => {
            run_parts_writing(out, self.parts, 1, |r: Range<usize>, out: &mut [_]| self.copy_range(input, r.start, out));
            Ok(())
        }, _ => Err(mismatch("a strided copy", &inputs[0], &outputs[0])))
    }
}

impl StridedCopy {
    /// Output elements from `first` on, into `out`.
    fn copy_range<T: std::marker::Copy>(&self, input: &[T], first: usize, out: &mut [T]) {
        let rank = self.out_shape.len();
        // The output index of element `first`, and its source, by division once.
        let mut index = [0usize; MAX_COUNTED_RANK];
        let mut source = self.offset;
        let mut rest = first;
        for axis in (0..rank).rev() {
            let i = rest % self.out_shape[axis].max(1);
            rest /= self.out_shape[axis].max(1);
            source += i * self.source_strides[axis];
            if axis < MAX_COUNTED_RANK {
                index[axis] = i;
            }
        }
        if rank > MAX_COUNTED_RANK {
            // No room for a counter per axis without allocating: find each source by division.
            for (i, o) in (first..).zip(out.iter_mut()) {
                let (mut rest, mut source) = (i, self.offset);
                for axis in (0..rank).rev() {
                    source += (rest % self.out_shape[axis]) * self.source_strides[axis];
                    rest /= self.out_shape[axis];
                }
                *o = input[source];
            }
            return;
        }
        for o in out.iter_mut() {
            *o = input[source];
            for axis in (0..rank).rev() {
                index[axis] += 1;
                source += self.source_strides[axis];
                if index[axis] < self.out_shape[axis] {
                    break;
                }
                source -= self.source_strides[axis] * self.out_shape[axis];
                index[axis] = 0;
            }
        }
    }
}

#[cfg(test)]
mod product_grid_tests {
    use super::product_grid;

    /// The grid packs least per part: rows for square products on 2 cores, columns for few
    /// rows, 4 x 4 on 16 cores, and never more parts along an axis than it has rows or blocks.
    #[test]
    fn the_grid_packs_least_per_part() {
        assert_eq!(product_grid(1024, 1024, 2), (2, 1));
        assert_eq!(product_grid(64, 256, 2), (1, 2));
        assert_eq!(product_grid(1024, 1024, 16), (4, 4));
        assert_eq!(product_grid(1, 50, 2), (1, 2));
        assert_eq!(product_grid(1, 10, 2), (1, 1));
        assert_eq!(product_grid(4096, 16, 4), (4, 1));
        for (rows, n, parts) in [(7, 3000, 16), (3000, 7, 16), (12, 64, 8), (0, 0, 4)] {
            let (r, c) = product_grid(rows, n, parts);
            assert!(r * c == parts || (r, c) == (1, 1), "{rows}x{n} in {parts}: {r}x{c}");
            assert!(r <= rows.max(1) && c <= n.div_ceil(32).max(1), "{rows}x{n} in {parts}: {r}x{c}");
        }
    }
}
