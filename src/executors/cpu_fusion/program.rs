//! A fused region compiled into a small program over block-sized temporaries.

use super::SCRATCH;
use crate::core::ir::{prims, Arg, DType, Shape, SymbolId, ValueId};
use crate::core::plan::{Kernel, OpView, PreparedRegionRange};
use crate::core::tensor::{Data, DataMut, TensorMut, TensorRef};
use crate::error::Result;
use crate::executors::cpu_reference::kernels::{broadcast_read, broadcast_strides, BroadcastRead};
use crate::executors::cpu_reference::math::{maximum, with_binary, with_unary, LaneSum};
use crate::executors::cpu_reference::vector_loops::{
    add_to_lanes, map_binary, map_binary_scalar_left, map_binary_scalar_right, map_unary, row_maxima, row_sums,
};
use crate::executors::cpu_reference::{builtin_prim, fused_shape};
use crate::executors::host_buffers::HostBuffers;
use crate::executors::worker_pool::{
    min_elements_per_part, part_range, parts_for, run_parts, SharedMut, MIN_ELEMENTS_PER_PART,
};
use smallvec::SmallVec;

/// A region's output buffers, or one part's pieces of them.
type Outputs<'o> = SmallVec<[&'o mut [f32]; 16]>;

/// Where an instruction reads an operand.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The region's `k`-th input.
    Input(usize),
    /// Temporary `t`.
    Temp(usize),
    /// The region's `o`-th output (written directly, read back from there).
    Output(usize),
    /// A constant.
    Scalar(f32),
}

/// Where an instruction writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    Temp(usize),
    Output(usize),
}

#[derive(Clone, Copy, Debug)]
enum Instruction {
    Unary { op: SymbolId, a: Source, out: Dest },
    Binary { op: SymbolId, a: Source, b: Source, out: Dest },
}

/// How a region input is read for a block of the iteration shape.
#[derive(Clone, Debug)]
enum Load {
    /// Same shape: a slice of the input.
    Contiguous,
    /// One element: a constant.
    Scalar,
    /// Constant along each row (last-axis stride 0), or one contiguous row repeated (stride 1
    /// over a full row): read per row, no copy. Blocks then hold whole rows.
    PerRow { strides: Shape },
    /// Broadcast: gathered into temporary `temp` through these strides.
    Gather { strides: Shape, temp: usize },
}

/// Renumbers the temporaries the instructions write (those from `pinned` on: the ones before
/// are the loads', read by any instruction) so that one whose value is read for the last time
/// is written again by a later instruction, and returns how many temporaries there are then.
/// A chain of n ops so needs two (and one more per value read again further on), not n: the scratch a thread keeps is a few blocks, not one per
/// op of the longest region it ran. An instruction never writes a temporary it reads (the run
/// loop moves its destination out while it reads its sources), and the trailing reduction's
/// source is kept to the end. Segments of a block run every instruction in turn over their own
/// elements, so a temporary written again holds each segment's value until its last reader.
fn reuse_temps(
    instructions: &mut [Instruction],
    reduce: &mut Option<(SymbolId, Source, usize)>,
    pinned: usize,
    temps: usize,
) -> usize {
    let sources = |i: &Instruction| match *i {
        Instruction::Unary { a, .. } => [Some(a), None],
        Instruction::Binary { a, b, .. } => [Some(a), Some(b)],
    };
    // The last instruction that reads each temporary (`usize::MAX`: the reduction, at the end).
    let mut last_read = vec![0; temps];
    for (k, instruction) in instructions.iter().enumerate() {
        for source in sources(instruction).into_iter().flatten() {
            if let Source::Temp(t) = source {
                last_read[t] = k;
            }
        }
    }
    if let Some((_, Source::Temp(t), _)) = reduce {
        last_read[*t] = usize::MAX;
    }
    let mut renamed: Vec<usize> = (0..temps).collect();
    let mut free: Vec<usize> = Vec::new();
    // The new temporaries that come free before each instruction.
    let mut freed_at: Vec<Vec<usize>> = vec![Vec::new(); instructions.len() + 1];
    let mut count = pinned;
    for (k, instruction) in instructions.iter_mut().enumerate() {
        free.append(&mut freed_at[k]);
        let rename = |s: &mut Source| {
            if let Source::Temp(t) = s {
                *t = renamed[*t];
            }
        };
        let out = match instruction {
            Instruction::Unary { a, out, .. } => {
                rename(a);
                out
            }
            Instruction::Binary { a, b, out, .. } => {
                rename(a);
                rename(b);
                out
            }
        };
        if let Dest::Temp(t) = out {
            let new = free.pop().unwrap_or_else(|| {
                count += 1;
                count - 1
            });
            renamed[*t] = new;
            // Read last at `last_read` (or never: free after this instruction).
            if let Some(slot) = last_read[*t].max(k).checked_add(1).and_then(|at| freed_at.get_mut(at)) {
                slot.push(new);
            }
            *t = new;
        }
    }
    if let Some((_, Source::Temp(t), _)) = reduce {
        *t = renamed[*t];
    }
    count
}

/// A region, compiled: instructions over temporaries, one load per input, and where each
/// output comes from.
pub struct FusedRegion {
    /// The dtype (`f32`) and elements of each input and output buffer, checked before each
    /// run: the loops index them without bounds checks of their own beyond Rust's.
    buffers: HostBuffers,
    shape: Shape,
    numel: usize,
    block: usize,
    /// Instructions run over segments of this many elements: the block, or one row.
    segment: usize,
    /// The length of the iteration shape's rows.
    row_len: usize,
    /// Whether rows are longer than a block and run in tiles of at most a block, each inside
    /// one row (a trailing reduction then accumulates across a row's tiles, in order).
    tile_rows: bool,
    /// Whether blocks hold whole rows (a reduction, or loads per row): parts then split at rows.
    by_rows: bool,
    /// Parts the region's elements are split into, one per thread (1: the calling thread only).
    parts: usize,
    loads: Vec<Load>,
    instructions: Vec<Instruction>,
    temps: usize,
    /// Which region output the trailing reduction writes, if there is one.
    reduce_output: Option<usize>,
    /// A trailing last-axis reduction: op, source, row length.
    reduce: Option<(SymbolId, Source, usize)>,
    range: Option<PreparedRegionRange>,
}

impl FusedRegion {
    pub(super) fn compile(
        region: &OpView<'_>,
        block: usize,
        threads: usize,
        range: Option<PreparedRegionRange>,
    ) -> std::result::Result<Self, String> {
        let ops = region.region_ops().map_err(|e| e.to_string())?;
        let inputs: Vec<ValueId> = region.bound_symbol().inputs().collect();
        // Every shape relation the program relies on, checked here: the loads and blocks below
        // index the buffers the plan sizes from these shapes.
        let shape = Shape::from_slice(fused_shape(region, &ops, &inputs)?);
        let numel: usize = shape.iter().product();
        let mut temps = 0;
        let mut loads = Vec::with_capacity(inputs.len());
        for &v in &inputs {
            let s = region.shape_of(v).map_err(|e| e.to_string())?;
            loads.push(match broadcast_read(s, &shape) {
                BroadcastRead::Same => Load::Contiguous,
                BroadcastRead::Single => Load::Scalar,
                BroadcastRead::RowConstant | BroadcastRead::RowVector => {
                    Load::PerRow { strides: broadcast_strides(s, &shape) }
                }
                BroadcastRead::Other => {
                    temps += 1;
                    Load::Gather { strides: broadcast_strides(s, &shape), temp: temps - 1 }
                }
            });
        }
        // The temporaries the loads gather into come first, kept for the whole block.
        let gathered = temps;
        let region_outputs: &[ValueId] = region.bound_symbol().outputs();
        // Where each value the region's ops define is written (by value: a scan made regions of
        // n ops take n^2 / 2 steps to compile).
        let mut value_temp: std::collections::HashMap<ValueId, Dest> = std::collections::HashMap::new();
        let source = |arg: &Arg<'_>, value_temp: &std::collections::HashMap<ValueId, Dest>| match *arg {
            Arg::Scalar(s) => Ok(Source::Scalar(s)),
            Arg::Value(v) => {
                if let Some(&d) = value_temp.get(&v) {
                    Ok(match d {
                        Dest::Temp(t) => Source::Temp(t),
                        Dest::Output(o) => Source::Output(o),
                    })
                } else {
                    inputs.iter().position(|&x| x == v).map(Source::Input).ok_or(format!("{v} is not an input"))
                }
            }
            Arg::Dims(_) => Err("an elementwise op with a dimension list".into()),
            Arg::DType(_) => Err("an elementwise op with a dtype argument".into()),
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
            let value = op.bound_symbol().outputs()[0];
            // A value the region returns is computed straight into its output buffer.
            let out = match region_outputs.iter().position(|&o| o == value) {
                Some(o) => Dest::Output(o),
                None => {
                    temps += 1;
                    Dest::Temp(temps - 1)
                }
            };
            let a = source(&args[0], &value_temp)?;
            instructions.push(if prims::UNARY.contains(&id) {
                Instruction::Unary { op: id, a, out }
            } else if prims::BINARY.contains(&id) {
                Instruction::Binary { op: id, a, b: source(&args[1], &value_temp)?, out }
            } else {
                return Err(format!("`{}` cannot be fused", op.name()));
            });
            value_temp.insert(value, out);
        }
        let temps = reuse_temps(&mut instructions, &mut reduce, gathered, temps);
        let reduced = ops.last().filter(|_| reduce.is_some()).map(|op| op.bound_symbol().outputs()[0]);
        let reduce_output = reduced.and_then(|r| region_outputs.iter().position(|&o| o == r));
        for &o in region_outputs {
            if Some(o) != reduced && !value_temp.contains_key(&o) {
                return Err(format!("region output {o} is defined by none of its ops"));
            }
        }
        // With a reduction or per-row loads, blocks hold whole rows and run a row at a time;
        // rows longer than a block are cut into tiles of at most a block, so that the scratch
        // stays `temps x block` whatever the row length.
        let row_len = shape.last().copied().unwrap_or(1).max(1);
        let by_rows = reduce.is_some() || loads.iter().any(|l| matches!(l, Load::PerRow { .. }));
        // Tiles of a long row hold a multiple of 16 elements, so that their partial sums line
        // up with those of a whole row (`LaneSum`).
        let block = if by_rows { block.next_multiple_of(LaneSum::LANES) } else { block };
        let tile_rows = by_rows && row_len > block;
        let (block, segment) = match (by_rows, tile_rows) {
            (true, false) => ((block / row_len).max(1) * row_len, row_len),
            _ => (block, block),
        };
        // The loops read and write `f32` only.
        let buffers = HostBuffers::of(region, Some(DType::F32)).map_err(|e| e.to_string())?;
        // Parts of whole blocks, or of whole rows when blocks hold rows.
        let units = if by_rows { numel / row_len } else { numel.div_ceil(block) };
        // Costly functions (exponentials, tanh, ...) are worth splitting at fewer elements.
        let min_per_part = instructions
            .iter()
            .map(|i| match i {
                Instruction::Unary { op, .. } => min_elements_per_part(*op),
                _ => MIN_ELEMENTS_PER_PART,
            })
            .min()
            .unwrap_or(MIN_ELEMENTS_PER_PART);
        let parts = parts_for(threads, numel, min_per_part).min(units).max(1);
        Ok(Self {
            buffers,
            shape,
            numel,
            block,
            segment,
            row_len,
            tile_rows,
            by_rows,
            parts,
            loads,
            instructions,
            temps,
            reduce_output,
            reduce,
            range,
        })
    }

    /// Runs the region: on the calling thread, or split at block (or row) boundaries into
    /// [`parts`](Self::parts) that run on the worker threads at once, each on its own
    /// thread's scratch and its own pieces of the outputs.
    fn run_parts(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) {
        if self.numel == 0 {
            // Rows of length zero: a reduction still has one result per row.
            if let (Some((op, _, _)), Some(o)) = (self.reduce, self.reduce_output) {
                floats_mut(&mut outputs[o].data).fill(if op == prims::SUM { 0.0 } else { f32::NEG_INFINITY });
            }
            return;
        }
        if self.parts == 1 {
            let mut outs: Outputs<'_> = outputs.iter_mut().map(|o| floats_mut(&mut o.data)).collect();
            self.run_range(0, self.numel, inputs, &mut outs);
            return;
        }
        let shared: SmallVec<[(SharedMut, usize); 16]> = outputs
            .iter_mut()
            .map(|o| (o.data.len(), floats_mut(&mut o.data)))
            .map(|(n, o)| (SharedMut::new(o), n))
            .collect();
        let (unit, units) = if self.by_rows {
            (self.row_len, self.numel / self.row_len)
        } else {
            (self.block, self.numel.div_ceil(self.block))
        };
        run_parts(self.parts, &|part| {
            let r = part_range(part, self.parts, units);
            let (lo, hi) = (r.start * unit, (r.end * unit).min(self.numel));
            let mut outs: Outputs<'_> = shared
                .iter()
                .enumerate()
                .map(|(o, &(buffer, len))| {
                    let (start, end) =
                        if Some(o) == self.reduce_output { (lo / self.row_len, hi / self.row_len) } else { (lo, hi) };
                    debug_assert!(end <= len);
                    // SAFETY: parts cover disjoint element ranges (and so disjoint rows), inside
                    // the buffer (its length was checked against the region's shape), which
                    // the caller lends exclusively until the section ends.
                    unsafe { std::slice::from_raw_parts_mut(buffer.get().add(start), end.min(len) - start.min(end)) }
                })
                .collect();
            self.run_range(lo, hi, inputs, &mut outs);
        });
    }

    /// Runs elements `lo..hi` (whole blocks, or whole rows) on the current thread's scratch
    /// temporaries; `outs` hold those elements of each output (those rows of a reduction's).
    fn run_range(&self, lo: usize, hi: usize, inputs: &[TensorRef<'_>], outs: &mut Outputs<'_>) {
        SCRATCH.with(|scratch| {
            let mut temps = scratch.borrow_mut();
            if temps.len() < self.temps {
                temps.resize_with(self.temps, Vec::new);
            }
            for (i, t) in temps.iter_mut().take(self.temps).enumerate() {
                if t.len() < skew(i) + self.block {
                    t.resize(skew(i) + self.block, 0.0);
                }
            }
            let mut part = Part { lo, row0: lo / self.row_len, row_sum: LaneSum::new() };
            let mut start = lo;
            while start < hi {
                let mut len = self.block.min(hi - start);
                if self.tile_rows {
                    len = len.min(self.row_len - start % self.row_len);
                }
                self.run_block(&mut part, start, len, inputs, &mut temps, outs);
                start += len;
            }
        });
    }

    #[inline]
    fn run_block(
        &self,
        part: &mut Part,
        start: usize,
        len: usize,
        inputs: &[TensorRef<'_>],
        temps: &mut [Vec<f32>],
        outputs: &mut Outputs<'_>,
    ) {
        for (k, load) in self.loads.iter().enumerate() {
            if let Load::Gather { strides, temp } = load {
                gather(floats(inputs[k].data), &self.shape, strides, start, &mut temps[*temp][skew(*temp)..][..len]);
            }
        }
        let mut segment_start = start;
        while segment_start < start + len {
            let segment_len = self.segment.min(start + len - segment_start);
            self.run_segment(*part, start, segment_start, segment_len, inputs, temps, outputs);
            segment_start += segment_len;
        }
        self.reduce_block(part, start, len, inputs, temps, outputs);
    }

    /// Runs every instruction over `len` elements from `at` (inside the block from `start`).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn run_segment(
        &self,
        part: Part,
        start: usize,
        at: usize,
        len: usize,
        inputs: &[TensorRef<'_>],
        temps: &mut [Vec<f32>],
        outputs: &mut Outputs<'_>,
    ) {
        let offset = at - start;
        for instruction in &self.instructions {
            let (op, a, b, out) = match *instruction {
                Instruction::Unary { op, a, out } => (op, a, None, out),
                Instruction::Binary { op, a, b, out } => (op, a, Some(b), out),
            };
            // Move the destination out so that sources can be borrowed beside it.
            let (mut temp, output): (Vec<f32>, &mut [f32]) = match out {
                Dest::Temp(t) => (std::mem::take(&mut temps[t]), &mut []),
                Dest::Output(o) => (Vec::new(), std::mem::take(&mut outputs[o])),
            };
            {
                let dest: &mut [f32] = match out {
                    Dest::Temp(t) => &mut temp[skew(t) + offset..][..len],
                    Dest::Output(_) => &mut output[at - part.lo..][..len],
                };
                let a = self.read(part, a, offset, at, len, inputs, temps, outputs);
                match b {
                    None => apply_unary(op, a, dest),
                    Some(b) => apply_binary(op, a, self.read(part, b, offset, at, len, inputs, temps, outputs), dest),
                }
            }
            match out {
                Dest::Temp(t) => temps[t] = temp,
                Dest::Output(o) => outputs[o] = output,
            }
        }
    }

    /// The trailing reduction over the block's rows, if the region has one.
    #[inline]
    fn reduce_block(
        &self,
        part: &mut Part,
        start: usize,
        len: usize,
        inputs: &[TensorRef<'_>],
        temps: &mut [Vec<f32>],
        outputs: &mut Outputs<'_>,
    ) {
        let reduce_output = self.reduce_output;
        if let (Some((op, source, n)), Some(i)) = (self.reduce, reduce_output) {
            if n == 0 {
                return;
            }
            let out = std::mem::take(&mut outputs[i]);
            let row0 = start / n - part.row0;
            if self.tile_rows {
                // One tile of one row: carry on from the row's earlier tiles, in the order the
                // reference adds a whole row (tiles hold a multiple of 16 elements but the last).
                let first = start.is_multiple_of(n);
                let last = (start + len).is_multiple_of(n);
                let x = self.read(*part, source, 0, start, len, inputs, temps, outputs);
                if op == prims::SUM {
                    if first {
                        part.row_sum = LaneSum::new();
                    }
                    let block = match x {
                        Block::Slice(x) => x,
                        Block::Scalar(x) => {
                            part.row_sum.add_constant(x, len - if last { len % LaneSum::LANES } else { 0 });
                            if last {
                                let rest = [x; LaneSum::LANES];
                                out[row0] = part.row_sum.finish(&rest[..len % LaneSum::LANES]);
                            }
                            outputs[i] = out;
                            return;
                        }
                    };
                    let full = if last { len - len % LaneSum::LANES } else { len };
                    add_to_lanes(&mut part.row_sum, &block[..full]);
                    if last {
                        out[row0] = part.row_sum.finish(&block[full..]);
                    }
                } else {
                    let carried = if first { f32::NEG_INFINITY } else { out[row0] };
                    // NaN propagates through `max`, as in PyTorch (`f32::max` would drop it).
                    out[row0] = match x {
                        Block::Slice(x) => maximum(carried, crate::executors::cpu_reference::math::row_max(x)),
                        Block::Scalar(x) => maximum(carried, x),
                    };
                }
                outputs[i] = out;
                return;
            }
            let rows = &mut out[row0..row0 + len / n];
            match self.read(*part, source, 0, start, len, inputs, temps, outputs) {
                Block::Slice(x) if op == prims::SUM => row_sums(x, n, rows),
                Block::Slice(x) => row_maxima(x, n, rows),
                Block::Scalar(x) => rows.fill(if op == prims::SUM { constant_row_sum(x, n) } else { x }),
            }
            outputs[i] = out;
        }
    }

    /// The `len` elements from `at` of a source; `offset` is `at`'s place in its block.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn read<'b>(
        &self,
        part: Part,
        source: Source,
        offset: usize,
        at: usize,
        len: usize,
        inputs: &[TensorRef<'b>],
        temps: &'b [Vec<f32>],
        outputs: &'b [&mut [f32]],
    ) -> Block<'b> {
        match source {
            Source::Scalar(s) => Block::Scalar(s),
            Source::Temp(t) => Block::Slice(&temps[t][skew(t) + offset..][..len]),
            Source::Output(o) => Block::Slice(&outputs[o][at - part.lo..][..len]),
            Source::Input(k) => match &self.loads[k] {
                Load::Contiguous => Block::Slice(&floats(inputs[k].data)[at..at + len]),
                Load::Scalar => Block::Scalar(floats(inputs[k].data)[0]),
                Load::PerRow { strides } => {
                    // Segments lie inside one row: whole rows, or tiles of a long one.
                    let base = row_base(at, &self.shape, strides);
                    if strides.last() == Some(&0) {
                        Block::Scalar(floats(inputs[k].data)[base])
                    } else {
                        let within = at % self.row_len;
                        Block::Slice(&floats(inputs[k].data)[base + within..base + within + len])
                    }
                }
                Load::Gather { temp, .. } => Block::Slice(&temps[*temp][skew(*temp) + offset..][..len]),
            },
        }
    }

    /// Block-sized temporaries this region uses: its extra memory is this times the block
    /// size times 4 bytes.
    pub fn temporaries(&self) -> usize {
        self.temps
    }
}

/// Where temporary `t` starts in its buffer, in elements. Temporaries of the same size
/// would otherwise sit a multiple of 4 KiB apart, and a loop that reads one and writes another
/// at the same offset would stall on 4K aliasing (the store buffer matches addresses by their
/// low 12 bits): staggering them by 80 bytes apiece keeps them apart.
#[inline(always)]
fn skew(t: usize) -> usize {
    20 * (t % 48)
}

#[derive(Clone, Copy)]
enum Block<'b> {
    Slice(&'b [f32]),
    Scalar(f32),
}

/// Reads `out.len()` elements of the iteration shape from `start`, through broadcast strides,
/// a row segment at a time: along the last axis a broadcast input is either constant (stride
/// 0: a fill) or contiguous (stride 1: a copy).
fn gather(input: &[f32], shape: &[usize], strides: &[usize], start: usize, out: &mut [f32]) {
    let rank = shape.len();
    if rank == 0 {
        out.fill(input[0]);
        return;
    }
    let n = shape[rank - 1];
    let last_stride = strides[rank - 1];
    let mut at = start;
    let mut written = 0;
    while written < out.len() {
        let (row, column) = (at / n, at % n);
        let take = (n - column).min(out.len() - written);
        // Offset of (row, column) in the input.
        let mut rest = row;
        let mut base = column * last_stride;
        for axis in (0..rank - 1).rev() {
            base += (rest % shape[axis]) * strides[axis];
            rest /= shape[axis];
        }
        let segment = &mut out[written..written + take];
        if last_stride == 0 {
            segment.fill(input[base]);
        } else {
            segment.copy_from_slice(&input[base..base + take]);
        }
        written += take;
        at += take;
    }
}

/// Offset in a broadcast input of the first element of the row that flat index `at` (a row
/// start) begins.
#[inline(always)]
fn row_base(at: usize, shape: &[usize], strides: &[usize]) -> usize {
    let rank = shape.len();
    let mut rest = at / shape[rank - 1].max(1);
    let mut base = 0;
    for axis in (0..rank - 1).rev() {
        base += (rest % shape[axis]) * strides[axis];
        rest /= shape[axis];
    }
    base
}

#[inline(always)]
fn apply_unary(op: SymbolId, a: Block<'_>, dest: &mut [f32]) {
    match a {
        Block::Slice(x) => with_unary!(op, f => map_unary(f, x, dest), _ => {}),
        Block::Scalar(x) => with_unary!(op, f => dest.fill(f(x)), _ => {}),
    }
}

#[inline(always)]
fn apply_binary(op: SymbolId, a: Block<'_>, b: Block<'_>, dest: &mut [f32]) {
    with_binary!(op, f => match (a, b) {
        (Block::Slice(x), Block::Slice(y)) => map_binary(f, x, y, dest),
        (Block::Slice(x), Block::Scalar(y)) => map_binary_scalar_right(f, x, y, dest),
        (Block::Scalar(x), Block::Slice(y)) => map_binary_scalar_left(f, x, y, dest),
        (Block::Scalar(x), Block::Scalar(y)) => dest.fill(f(x, y)),
    }, _ => {});
}

/// The sum of a row of `n` copies of `x`, added in the order `row_sum` adds a row.
fn constant_row_sum(x: f32, n: usize) -> f32 {
    let mut sum = LaneSum::new();
    sum.add_constant(x, n - n % LaneSum::LANES);
    sum.finish(&[x; LaneSum::LANES][..n % LaneSum::LANES])
}

/// Where a part starts: its first element, and its first row (of a reduction's output); and
/// the partial sums of the row it is adding in tiles.
#[derive(Clone, Copy)]
struct Part {
    lo: usize,
    row0: usize,
    row_sum: LaneSum,
}

/// The `f32` values of a view that [`HostBuffers::check`] accepted (so `f32`; anything else
/// reads as no values).
#[inline(always)]
fn floats(data: Data<'_>) -> &[f32] {
    match data {
        Data::F32(x) => x,
        _ => &[],
    }
}

/// The `f32` values of an output view that [`HostBuffers::check`] accepted.
#[inline(always)]
fn floats_mut<'m>(data: &'m mut DataMut<'_>) -> &'m mut [f32] {
    match data {
        DataMut::F32(x) => x,
        _ => &mut [],
    }
}

impl Kernel for FusedRegion {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        self.buffers.check(super::CpuFusion::NAME, "fused region", inputs, outputs)?;
        match &self.range {
            Some(range) => range.in_scope(|| self.run_parts(inputs, outputs)),
            None => self.run_parts(inputs, outputs),
        }
        Ok(())
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Input(k) => write!(f, "in{k}"),
            Source::Temp(t) => write!(f, "tmp{t}"),
            Source::Output(o) => write!(f, "out{o}"),
            Source::Scalar(s) => write!(f, "{s:?}"),
        }
    }
}

impl std::fmt::Display for FusedRegion {
    /// The program: iteration shape, block, how each input is read, one line per instruction.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "  shape {:?}, blocks of {}, segments of {}, {} temporaries",
            self.shape.as_slice(),
            self.block,
            self.segment,
            self.temps
        )?;
        for (k, load) in self.loads.iter().enumerate() {
            let how = match load {
                Load::Contiguous => "contiguous".to_string(),
                Load::Scalar => "one element".to_string(),
                Load::PerRow { .. } => "per row".to_string(),
                Load::Gather { temp, .. } => format!("gathered into tmp{temp}"),
            };
            writeln!(f, "  in{k}: {how}")?;
        }
        let name = |op: SymbolId| crate::core::ir::prims::BUILTIN_NAMES.get(op.index()).copied().unwrap_or("?");
        for instruction in &self.instructions {
            let (op, a, b, out) = match *instruction {
                Instruction::Unary { op, a, out } => (op, a, None, out),
                Instruction::Binary { op, a, b, out } => (op, a, Some(b), out),
            };
            let out = match out {
                Dest::Temp(t) => Source::Temp(t),
                Dest::Output(o) => Source::Output(o),
            };
            match b {
                Some(b) => writeln!(f, "  {out} = {}({a}, {b})", name(op))?,
                None => writeln!(f, "  {out} = {}({a})", name(op))?,
            }
        }
        if let (Some((op, source, n)), Some(o)) = (self.reduce, self.reduce_output) {
            writeln!(f, "  out{o} = {}({source}) over rows of {n}", name(op))?;
        }
        Ok(())
    }
}
