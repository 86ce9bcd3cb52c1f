//! The CPU reference kernels. Each is built once per bound symbol with its shape analysis done,
//! and runs on contiguous row-major buffers.

use smallvec::smallvec;

use super::math::{with_binary, with_unary};
use crate::core::ir::{prims, Arg, Shape, SymbolId};
use crate::core::plan::{Kernel, OpView};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::{Error, Result};

pub(super) fn compile(id: SymbolId, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
    let out_shape = op.output_shape(0)?;
    Ok(match id {
        prims::SUM | prims::MAX => {
            let n = op.input_shape(0)?.last().copied().unwrap_or(1);
            Box::new(ReduceLastAxis { op: id, n })
        }
        prims::MATMUL => {
            let (a, b) = (op.input_shape(0)?, op.input_shape(1)?);
            Box::new(Matmul { m: a[0], k: a[1], n: b[1] })
        }
        prims::RESHAPE => Box::new(Copy),
        prims::TRANSPOSE => {
            let input_strides = contiguous_strides(op.input_shape(0)?);
            let source_strides = op.dims(1)?.iter().map(|&p| input_strides[p]).collect();
            Box::new(StridedCopy { out_shape: Shape::from_slice(out_shape), source_strides })
        }
        prims::BROADCAST_TO => Box::new(StridedCopy {
            out_shape: Shape::from_slice(out_shape),
            source_strides: broadcast_strides(op.input_shape(0)?, out_shape),
        }),
        _ if with_unary!(id, _f => true, _ => false) => Box::new(Unary { op: id }),
        _ if with_binary!(id, _f => true, _ => false) => Box::new(Binary::new(id, op, out_shape)?),
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

struct Unary {
    op: SymbolId,
}

impl Kernel for Unary {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (x, out) = (inputs[0].data, &mut *outputs[0].data);
        with_unary!(self.op, f => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = f(v);
            }
        }, _ => unreachable!("checked when compiled"));
        Ok(())
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

struct Binary {
    op: SymbolId,
    mode: BinaryMode,
}

impl Binary {
    fn new(op: SymbolId, view: &OpView<'_>, out_shape: &[usize]) -> Result<Self> {
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
        Ok(Self { op, mode })
    }
}

impl Kernel for Binary {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let out = &mut *outputs[0].data;
        let a = inputs[0].data;
        with_binary!(self.op, f => match &self.mode {
            BinaryMode::SameShape => {
                for ((o, &x), &y) in out.iter_mut().zip(a).zip(inputs[1].data) {
                    *o = f(x, y);
                }
            }
            BinaryMode::Scalar(s) => {
                for (o, &x) in out.iter_mut().zip(a) {
                    *o = f(x, *s);
                }
            }
            BinaryMode::Broadcast { out_shape, a_strides, b_strides } => {
                let b = inputs[1].data;
                let inner = out_shape.last().copied().unwrap_or(1);
                let (sa, sb) = (a_strides.last().copied().unwrap_or(0), b_strides.last().copied().unwrap_or(0));
                if inner > 0 {
                    for (row, o) in out.chunks_exact_mut(inner).enumerate() {
                        let ao = row_offset(row, out_shape, a_strides);
                        let bo = row_offset(row, out_shape, b_strides);
                        match (sa, sb) {
                            (0, 0) => o.fill(f(a[ao], b[bo])),
                            (0, _) => o.iter_mut().zip(&b[bo..bo + inner]).for_each(|(o, &y)| *o = f(a[ao], y)),
                            (_, 0) => o.iter_mut().zip(&a[ao..ao + inner]).for_each(|(o, &x)| *o = f(x, b[bo])),
                            _ => o
                                .iter_mut()
                                .zip(&a[ao..ao + inner])
                                .zip(&b[bo..bo + inner])
                                .for_each(|((o, &x), &y)| *o = f(x, y)),
                        }
                    }
                }
            }
        }, _ => unreachable!("checked when compiled"));
        Ok(())
    }
}

struct ReduceLastAxis {
    op: SymbolId,
    n: usize,
}

impl Kernel for ReduceLastAxis {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let out = &mut *outputs[0].data;
        if self.n == 0 {
            out.fill(if self.op == prims::SUM { 0.0 } else { f32::NEG_INFINITY });
            return Ok(());
        }
        for (o, row) in out.iter_mut().zip(inputs[0].data.chunks_exact(self.n)) {
            *o = if self.op == prims::SUM { row.iter().sum() } else { super::math::row_max(row) };
        }
        Ok(())
    }
}

struct Matmul {
    m: usize,
    k: usize,
    n: usize,
}

/// Rows of `b` processed together, so they stay in cache across the rows of `a`.
const MATMUL_K_BLOCK: usize = 128;

impl Kernel for Matmul {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (a, b, out) = (inputs[0].data, inputs[1].data, &mut *outputs[0].data);
        let Matmul { m, k, n } = *self;
        out.fill(0.0);
        if n == 0 {
            return Ok(());
        }
        for k0 in (0..k).step_by(MATMUL_K_BLOCK) {
            let k1 = (k0 + MATMUL_K_BLOCK).min(k);
            for i in 0..m {
                let out_row = &mut out[i * n..(i + 1) * n];
                for p in k0..k1 {
                    let scale = a[i * k + p];
                    for (o, &y) in out_row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                        *o += scale * y;
                    }
                }
            }
        }
        Ok(())
    }
}

struct Copy;

impl Kernel for Copy {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        outputs[0].data.copy_from_slice(inputs[0].data);
        Ok(())
    }
}

/// Ranks up to this one count output indices on the stack; higher ranks divide instead.
const MAX_COUNTED_RANK: usize = 8;

/// Writes the output in order, reading the input through arbitrary strides (transpose,
/// broadcast).
struct StridedCopy {
    out_shape: Shape,
    source_strides: Shape,
}

impl Kernel for StridedCopy {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let (input, out) = (inputs[0].data, &mut *outputs[0].data);
        let rank = self.out_shape.len();
        if rank > MAX_COUNTED_RANK {
            // No room for a counter per axis without allocating: find each source by division.
            for (i, o) in out.iter_mut().enumerate() {
                let (mut rest, mut source) = (i, 0);
                for axis in (0..rank).rev() {
                    source += (rest % self.out_shape[axis]) * self.source_strides[axis];
                    rest /= self.out_shape[axis];
                }
                *o = input[source];
            }
            return Ok(());
        }
        let mut index = [0usize; MAX_COUNTED_RANK];
        let mut source = 0;
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
        Ok(())
    }
}
