//! A fused region compiled into a small program over block-sized temporaries.

use smallvec::SmallVec;

use super::SCRATCH;
use crate::core::ir::{prims, Arg, Shape, SymbolId, ValueId};
use crate::core::plan::{Kernel, OpView, PreparedRegionRange};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::Result;
use crate::executors::cpu_reference::builtin_prim;
use crate::executors::cpu_reference::kernels::broadcast_strides;
use crate::executors::cpu_reference::math::{with_binary, with_unary};

/// Where an instruction reads an operand.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The region's `k`-th input.
    Input(usize),
    /// Temporary `t`.
    Temp(usize),
    /// A constant.
    Scalar(f32),
}

#[derive(Clone, Copy, Debug)]
enum Instruction {
    Unary { op: SymbolId, a: Source, out: usize },
    Binary { op: SymbolId, a: Source, b: Source, out: usize },
}

/// How a region input is read for a block of the iteration shape.
#[derive(Clone, Debug)]
enum Load {
    /// Same shape: a slice of the input.
    Contiguous,
    /// One element: a constant.
    Scalar,
    /// Broadcast: gathered into temporary `temp` through these strides.
    Gather { strides: Shape, temp: usize },
}

/// A region, compiled: instructions over temporaries, one load per input, and where each
/// output comes from.
pub struct FusedRegion {
    shape: Shape,
    numel: usize,
    block: usize,
    loads: Vec<Load>,
    instructions: Vec<Instruction>,
    temps: usize,
    /// Per region output: the temporary holding it, or `None` for the reduction's result.
    outputs: Vec<Option<usize>>,
    /// A trailing last-axis reduction: op, source, row length.
    reduce: Option<(SymbolId, Source, usize)>,
    range: Option<PreparedRegionRange>,
}

impl FusedRegion {
    pub(super) fn compile(
        region: &OpView<'_>,
        block: usize,
        range: Option<PreparedRegionRange>,
    ) -> std::result::Result<Self, String> {
        let ops = region.region_ops().map_err(|e| e.to_string())?;
        let inputs: Vec<ValueId> = region.bound_symbol().inputs().collect();
        let first = ops.first().ok_or("an empty region")?;
        let shape = Shape::from_slice(
            match builtin_prim(first) {
                Some(prims::SUM | prims::MAX) => first.input_shape(0),
                _ => first.output_shape(0),
            }
            .map_err(|e| e.to_string())?,
        );
        let numel: usize = shape.iter().product();
        let mut temps = 0;
        let mut loads = Vec::with_capacity(inputs.len());
        for &v in &inputs {
            let s = region.shape_of(v).map_err(|e| e.to_string())?;
            loads.push(if s == shape.as_slice() {
                Load::Contiguous
            } else if s.iter().product::<usize>() == 1 {
                Load::Scalar
            } else {
                temps += 1;
                Load::Gather { strides: broadcast_strides(s, &shape), temp: temps - 1 }
            });
        }
        let mut value_temp: Vec<(ValueId, usize)> = Vec::new();
        let source = |arg: &Arg<'_>, value_temp: &[(ValueId, usize)]| -> std::result::Result<Source, String> {
            match *arg {
                Arg::Scalar(s) => Ok(Source::Scalar(s)),
                Arg::Value(v) => {
                    if let Some(&(_, t)) = value_temp.iter().find(|(x, _)| *x == v) {
                        Ok(Source::Temp(t))
                    } else {
                        inputs.iter().position(|&x| x == v).map(Source::Input).ok_or(format!("{v} is not an input"))
                    }
                }
                Arg::Dims(_) => Err("an elementwise op with a dimension list".into()),
            }
        };
        let mut instructions = Vec::new();
        let mut reduce = None;
        for (i, op) in ops.iter().enumerate() {
            let id = builtin_prim(op).ok_or(format!("`{}` is not a built-in prim", op.name()))?;
            let args = op.args();
            if matches!(id, prims::SUM | prims::MAX) {
                if i + 1 != ops.len() {
                    return Err("a reduction must be a region's last op".into());
                }
                let n = *shape.last().ok_or("a reduction over a rank-0 shape")?;
                reduce = Some((id, source(&args[0], &value_temp)?, n));
                continue;
            }
            if op.output_shape(0).map_err(|e| e.to_string())? != shape.as_slice() {
                return Err(format!("`{}` does not have the region's shape {:?}", op.name(), shape.as_slice()));
            }
            let out = temps;
            temps += 1;
            let a = source(&args[0], &value_temp)?;
            instructions.push(if prims::UNARY.contains(&id) {
                Instruction::Unary { op: id, a, out }
            } else if prims::BINARY.contains(&id) {
                Instruction::Binary { op: id, a, b: source(&args[1], &value_temp)?, out }
            } else {
                return Err(format!("`{}` cannot be fused", op.name()));
            });
            value_temp.push((op.bound_symbol().outputs()[0], out));
        }
        let reduced = ops.last().filter(|_| reduce.is_some()).map(|op| op.bound_symbol().outputs()[0]);
        let outputs = region
            .bound_symbol()
            .outputs()
            .iter()
            .map(|&o| {
                if Some(o) == reduced {
                    Ok(None)
                } else {
                    value_temp.iter().find(|(v, _)| *v == o).map(|&(_, t)| Some(t)).ok_or(format!("output {o}"))
                }
            })
            .collect::<std::result::Result<_, String>>()?;
        // With a reduction, blocks hold whole rows.
        let block = match reduce {
            Some((_, _, n)) if n > 0 => (block / n).max(1) * n,
            _ => block,
        };
        Ok(Self { shape, numel, block, loads, instructions, temps, outputs, reduce, range })
    }

    /// Runs the region on the current thread's scratch temporaries.
    fn run_blocks(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) {
        SCRATCH.with(|scratch| {
            let mut temps = scratch.borrow_mut();
            if temps.len() < self.temps {
                temps.resize_with(self.temps, Vec::new);
            }
            for t in temps.iter_mut().take(self.temps) {
                if t.len() < self.block {
                    t.resize(self.block, 0.0);
                }
            }
            let mut start = 0;
            while start < self.numel {
                let len = self.block.min(self.numel - start);
                self.run_block(start, len, inputs, &mut temps, outputs);
                start += len;
            }
        });
    }

    #[inline]
    fn run_block(
        &self,
        start: usize,
        len: usize,
        inputs: &[TensorRef<'_>],
        temps: &mut [Vec<f32>],
        outputs: &mut [TensorMut<'_>],
    ) {
        for (k, load) in self.loads.iter().enumerate() {
            if let Load::Gather { strides, temp } = load {
                gather(inputs[k].data, &self.shape, strides, start, &mut temps[*temp][..len]);
            }
        }
        for instruction in &self.instructions {
            match *instruction {
                Instruction::Unary { op, a, out } => {
                    let mut o = std::mem::take(&mut temps[out]);
                    match self.read(a, start, len, inputs, temps) {
                        Block::Slice(x) => with_unary!(op, f => {
                            for (o, &x) in o[..len].iter_mut().zip(x) { *o = f(x); }
                        }, _ => {}),
                        Block::Scalar(x) => with_unary!(op, f => o[..len].fill(f(x)), _ => {}),
                    }
                    temps[out] = o;
                }
                Instruction::Binary { op, a, b, out } => {
                    let mut o = std::mem::take(&mut temps[out]);
                    let (a, b) = (self.read(a, start, len, inputs, temps), self.read(b, start, len, inputs, temps));
                    let o = &mut o;
                    with_binary!(op, f => match (a, b) {
                        (Block::Slice(x), Block::Slice(y)) => {
                            for ((o, &x), &y) in o[..len].iter_mut().zip(x).zip(y) { *o = f(x, y); }
                        }
                        (Block::Slice(x), Block::Scalar(y)) => {
                            for (o, &x) in o[..len].iter_mut().zip(x) { *o = f(x, y); }
                        }
                        (Block::Scalar(x), Block::Slice(y)) => {
                            for (o, &y) in o[..len].iter_mut().zip(y) { *o = f(x, y); }
                        }
                        (Block::Scalar(x), Block::Scalar(y)) => o[..len].fill(f(x, y)),
                    }, _ => {});
                    temps[out] = std::mem::take(o);
                }
            }
        }
        let mut reduce_output = None;
        for (i, source) in self.outputs.iter().enumerate() {
            match source {
                Some(t) => outputs[i].data[start..start + len].copy_from_slice(&temps[*t][..len]),
                None => reduce_output = Some(i),
            }
        }
        if let (Some((op, source, n)), Some(i)) = (self.reduce, reduce_output) {
            let out = &mut outputs[i].data;
            if n == 0 {
                return;
            }
            let row0 = start / n;
            match self.read(source, start, len, inputs, temps) {
                Block::Slice(x) => {
                    for (r, row) in x.chunks_exact(n).enumerate() {
                        out[row0 + r] = if op == prims::SUM {
                            row.iter().sum()
                        } else {
                            row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                        };
                    }
                }
                Block::Scalar(x) => {
                    let value = if op == prims::SUM { (0..n).map(|_| x).sum() } else { x };
                    out[row0..row0 + len / n].fill(value);
                }
            }
        }
    }

    #[inline(always)]
    fn read<'b>(
        &self,
        source: Source,
        start: usize,
        len: usize,
        inputs: &[TensorRef<'b>],
        temps: &'b [Vec<f32>],
    ) -> Block<'b> {
        match source {
            Source::Scalar(s) => Block::Scalar(s),
            Source::Temp(t) => Block::Slice(&temps[t][..len]),
            Source::Input(k) => match &self.loads[k] {
                Load::Contiguous => Block::Slice(&inputs[k].data[start..start + len]),
                Load::Scalar => Block::Scalar(inputs[k].data[0]),
                Load::Gather { temp, .. } => Block::Slice(&temps[*temp][..len]),
            },
        }
    }

    /// Block-sized temporaries this region uses: its extra memory is this times the block
    /// size times 4 bytes.
    pub fn temporaries(&self) -> usize {
        self.temps
    }
}

#[derive(Clone, Copy)]
enum Block<'b> {
    Slice(&'b [f32]),
    Scalar(f32),
}

/// Reads `out.len()` elements of the iteration shape from `start`, through broadcast strides.
fn gather(input: &[f32], shape: &[usize], strides: &[usize], start: usize, out: &mut [f32]) {
    let rank = shape.len();
    let mut index: SmallVec<[usize; 8]> = SmallVec::from_elem(0, rank);
    let mut rest = start;
    let mut source = 0;
    for axis in (0..rank).rev() {
        index[axis] = rest % shape[axis];
        rest /= shape[axis];
        source += index[axis] * strides[axis];
    }
    for o in out.iter_mut() {
        *o = input[source];
        for axis in (0..rank).rev() {
            index[axis] += 1;
            source += strides[axis];
            if index[axis] < shape[axis] {
                break;
            }
            source -= strides[axis] * shape[axis];
            index[axis] = 0;
        }
    }
}

impl Kernel for FusedRegion {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        match &self.range {
            Some(range) => range.in_scope(|| self.run_blocks(inputs, outputs)),
            None => self.run_blocks(inputs, outputs),
        }
        Ok(())
    }
}
