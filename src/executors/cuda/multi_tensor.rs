//! One launch for a region of independent elementwise chains of several shapes (regions that
//! [`FuseRegions`](crate::passes::FuseRegions) joined because [`CudaFusion`](super::CudaFusion)
//! [joins](crate::Executor::joins) them): an optimizer's update of every parameter, as PyTorch's
//! fused optimizers run it with multi-tensor launches.
//!
//! Each chain (a *segment*: the ops of the region connected through the values they define) runs
//! over its own shape. Segments of the same code (ops, dtypes, which inputs are single values,
//! whether they are read four at a time) share one device function, a *kind*; a launch takes a
//! table of segments as its one parameter (pointers, lengths, first blocks, kinds: at most 4 KB,
//! the parameter space every CUDA device has), and each block finds its segment in it by a binary
//! search over the first blocks. A region of more segments than one table holds takes several
//! launches, inside the region's one range.

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt::Write;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::codegen::{element_type, elementwise_body, narrow, widen, EXP2, HALF_CONVERSIONS, MAXIMUM};
use super::device::{address, CudaDevice};
use super::device_checks::BufferLengths;
use super::KernelVariants;
use crate::core::ir::{DType, ValueId};
use crate::core::plan::{packing, DeviceBuffer, DeviceKernel, OpView, PreparedRegionRange};
use crate::error::Result;
use crate::executors::cpu_reference::builtin_prim;

/// Threads per block.
const THREADS: u32 = super::codegen::BLOCK_THREADS;
/// The most bytes of a launch's parameter (CUDA's limit on every device and driver).
const PARAMETER_BYTES: usize = 4096;
/// The most blocks a segment takes; larger segments loop over their elements.
const MOST_BLOCKS: usize = 1 << 16;

/// Which kernel buffer a segment's pointer is: a region input or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Input(usize),
    Output(usize),
}

/// One chain of the region, over its own shape.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Segment {
    /// Its pointers, in its kind's parameter order: inputs, then outputs.
    slots: Vec<Slot>,
    /// Threads' work items: vectors of four elements, or elements.
    units: usize,
    kind: usize,
}

/// The generated source of a joined region and how to launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct JoinedSource {
    pub kernel: String,
    pub source: String,
    segments: Vec<Segment>,
    /// Pointers in each segment's row of the table (the most any kind takes).
    pointers: usize,
    /// Segments in one launch's table.
    per_launch: usize,
    pub input_lengths: Vec<usize>,
    pub output_lengths: Vec<usize>,
    /// `(input, output)` parameters the region may be run with the output written over the
    /// input: pairs whose input no other chain reads, so that each element is read before the
    /// same element is written, by the same thread.
    pub in_place: Vec<(usize, usize)>,
}

impl JoinedSource {
    /// The bytes of a table of `segments` rows of `pointers` pointers: pointers, lengths, first
    /// blocks (one more), kinds (4 bytes each), padded to 8 bytes.
    fn table_bytes(segments: usize, pointers: usize) -> usize {
        8 * (segments * pointers + segments + segments + 1) + (4 * segments).next_multiple_of(8)
    }

    /// How many kernel launches a run takes.
    #[cfg(test)]
    fn launches(&self) -> usize {
        self.segments.len().div_ceil(self.per_launch)
    }
}

/// Whether `region` is elementwise over one shape per chain, with every input either of its
/// chain's shape or a single value, in float dtypes: what [`joined_source`] generates.
pub(super) fn joinable(region: &OpView<'_>) -> bool {
    let Ok(ops) = region.region_ops() else { return false };
    let Some(Ok(shape)) = ops.first().map(|op| op.output_shape(0)) else { return false };
    let elementwise = ops.iter().all(|op| {
        !matches!(builtin_prim(op), Some(crate::prims::SUM | crate::prims::MAX) | None)
            && op.output_shape(0).is_ok_and(|s| s == shape)
    });
    elementwise
        && region.dtypes().iter().all(|d| d.is_float())
        && region
            .bound_symbol()
            .inputs()
            .all(|v| region.shape_of(v).is_ok_and(|s| s == shape || s.iter().product::<usize>() == 1))
}

/// Whether a region's `ops` have several shapes (reductions aside, whose results are a row
/// shorter): a region joined from regions of one shape each.
pub(super) fn is_joined(ops: &[OpView<'_>]) -> bool {
    let mut shapes = ops
        .iter()
        .filter(|op| !matches!(builtin_prim(op), Some(crate::prims::SUM | crate::prims::MAX)))
        .map(|op| op.output_shape(0).ok());
    let first = shapes.next();
    shapes.any(|s| Some(s) != first)
}

/// Generates the CUDA C of a region whose ops are independent chains of several shapes.
///
/// # Errors
/// A message when an op is not an elementwise built-in prim, or an input of a chain is neither
/// of the chain's shape nor a single value.
pub(super) fn joined_source(
    region: &OpView<'_>,
    kernel: &str,
    variants: KernelVariants,
) -> Result<JoinedSource, String> {
    let ops = region.region_ops().map_err(|e| e.to_string())?;
    let inputs: Vec<ValueId> = region.bound_symbol().inputs().collect();
    let outputs: &[ValueId] = region.bound_symbol().outputs();
    let lengths = |values: &mut dyn Iterator<Item = ValueId>| -> Result<Vec<usize>, String> {
        values
            .map(|v| {
                let shape = region.shape_of(v).map_err(|e| e.to_string())?;
                Ok(packing::words(region.dtype_of(v), shape.iter().product()))
            })
            .collect()
    };
    let input_lengths = lengths(&mut inputs.iter().copied())?;
    let output_lengths = lengths(&mut outputs.iter().copied())?;

    // Chains: ops joined through the values they define (union-find over op positions).
    let defined_by: HashMap<ValueId, usize> =
        ops.iter().enumerate().flat_map(|(j, op)| op.bound_symbol().outputs().iter().map(move |&v| (v, j))).collect();
    let mut parent: Vec<usize> = (0..ops.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (j, op) in ops.iter().enumerate() {
        for v in op.bound_symbol().inputs() {
            if let Some(&i) = defined_by.get(&v) {
                let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                parent[a] = b;
            }
        }
    }
    let mut chains: Vec<Vec<usize>> = Vec::new();
    let mut chain_of: Vec<Option<usize>> = vec![None; ops.len()];
    for j in 0..ops.len() {
        let r = root(&mut parent, j);
        match chain_of[r] {
            Some(c) => chains[c].push(j),
            None => {
                chain_of[r] = Some(chains.len());
                chains.push(vec![j]);
            }
        }
    }
    // Each chain's inputs in the order its ops read them (so that chains of the same code name
    // them alike), and its outputs in the region's order.
    let io: Vec<(Vec<usize>, Vec<usize>)> = chains
        .iter()
        .map(|chain| {
            let mut reads: Vec<usize> = Vec::new();
            for v in chain.iter().flat_map(|&j| ops[j].bound_symbol().inputs()) {
                if let Some(k) = inputs.iter().position(|&x| x == v).filter(|k| !reads.contains(k)) {
                    reads.push(k);
                }
            }
            let writes = (0..outputs.len())
                .filter(|&o| defined_by.get(&outputs[o]).is_some_and(|j| chain.contains(j)))
                .collect();
            (reads, writes)
        })
        .collect();

    // An output may be written over the input it updates only where no other chain reads that
    // input: chains run in different blocks, and only within a chain is each element read
    // before it is written, by the same thread.
    let in_place: Vec<(usize, usize)> = region
        .in_place_updates()
        .into_iter()
        .filter(|&(k, o)| io.iter().all(|(reads, writes)| !reads.contains(&k) || writes.contains(&o)))
        .collect();
    let mut kinds: Vec<String> = Vec::new();
    let mut segments = Vec::new();
    for (chain, (reads, writes)) in chains.iter().zip(&io) {
        let chain_ops: Vec<OpView<'_>> = chain.iter().map(|&j| ops[j]).collect();
        let shape = chain_ops[0].output_shape(0).map_err(|e| e.to_string())?.to_vec();
        let numel: usize = shape.iter().product();
        let defined: Vec<ValueId> = chain_ops.iter().flat_map(|op| op.bound_symbol().outputs().to_vec()).collect();
        if writes.is_empty() || numel == 0 {
            continue;
        }
        let mut whole = Vec::new();
        for &k in reads {
            let s = region.shape_of(inputs[k]).map_err(|e| e.to_string())?;
            match (s == shape.as_slice(), s.iter().product::<usize>()) {
                (true, _) => whole.push(true),
                (false, 1) => whole.push(false),
                _ => return Err(format!("input {k} has shape {s:?}, neither its chain's {shape:?} nor one value")),
            }
        }
        let chain_inputs: Vec<ValueId> = reads.iter().map(|&k| inputs[k]).collect();
        let local = |v: ValueId| defined.iter().position(|&d| d == v).unwrap_or(usize::MAX);
        let body = elementwise_body(&chain_ops, &chain_inputs, &shape, &local, variants)?;
        let input_dtypes: Vec<DType> = chain_inputs.iter().map(|&v| region.dtype_of(v)).collect();
        let output_dtypes: Vec<DType> = writes.iter().map(|&o| region.dtype_of(outputs[o])).collect();
        let results: Vec<usize> = writes.iter().map(|&o| local(outputs[o])).collect();
        // Four elements a thread when the chain's length allows (16-bit values: 8 bytes).
        let vector = numel.is_multiple_of(4);
        let function = kind_function(&body, &input_dtypes, &whole, &output_dtypes, &results, vector, |w| {
            let o = writes[w];
            in_place.iter().any(|&(k, out)| out == o && reads.contains(&k))
        });
        let kind = kinds.iter().position(|f| *f == function).unwrap_or_else(|| {
            kinds.push(function);
            kinds.len() - 1
        });
        let slots = reads.iter().map(|&k| Slot::Input(k)).chain(writes.iter().map(|&o| Slot::Output(o))).collect();
        segments.push(Segment { slots, units: if vector { numel / 4 } else { numel }, kind });
    }

    let pointers = segments.iter().map(|s| s.slots.len()).max().unwrap_or(1);
    let mut per_launch = segments.len().max(1);
    while per_launch > 1 && JoinedSource::table_bytes(per_launch, pointers) > PARAMETER_BYTES {
        per_launch -= 1;
    }
    if JoinedSource::table_bytes(per_launch, pointers) > PARAMETER_BYTES {
        return Err(format!("a chain of {pointers} buffers does not fit a launch's {PARAMETER_BYTES} bytes"));
    }

    let mut source = String::new();
    let _ = writeln!(source, "// Generated by boundscope for region `{}`: {} chains.", region.name(), segments.len());
    if kinds.iter().any(|k| k.contains("bs_to_") || k.contains("bs_from_")) {
        source.push_str(HALF_CONVERSIONS);
    }
    if kinds.iter().any(|k| k.contains("bs_max(")) {
        source.push_str(MAXIMUM);
    }
    if kinds.iter().any(|k| k.contains("bs_exp2(")) {
        source.push_str(EXP2);
    }
    for (i, function) in kinds.iter().enumerate() {
        let _ = writeln!(source, "__device__ __forceinline__ void kind{i}{function}");
    }
    let s = per_launch;
    let _ = writeln!(
        source,
        "struct Segments {{ unsigned long long p[{s}][{pointers}]; long long units[{s}]; long long first[{}]; int kind[{s}]; }};",
        s + 1
    );
    let _ = writeln!(source, "extern \"C\" __global__ void {kernel}(const Segments s) {{");
    let _ = writeln!(source, "  const long long b = blockIdx.x;");
    // The last segment whose first block is at or before this one (segments of no blocks share
    // their first block with the next, which is then the one found).
    let _ = writeln!(source, "  int lo = 0, hi = {};", s - 1);
    let _ = writeln!(source, "  while (lo < hi) {{ const int mid = (lo + hi + 1) / 2; if (s.first[mid] <= b) lo = mid; else hi = mid - 1; }}");
    let _ = writeln!(source, "  const long long blocks = s.first[lo + 1] - s.first[lo];");
    let _ = writeln!(source, "  const long long start = (b - s.first[lo]) * blockDim.x + threadIdx.x;");
    let _ = writeln!(source, "  const long long stride = blocks * blockDim.x;");
    let _ = writeln!(source, "  switch (s.kind[lo]) {{");
    for i in 0..kinds.len() {
        let _ = writeln!(source, "    case {i}: kind{i}(s.p[lo], s.units[lo], start, stride); break;");
    }
    let _ = writeln!(source, "  }}\n}}");

    Ok(JoinedSource {
        kernel: kernel.to_string(),
        source,
        segments,
        pointers,
        per_launch,
        input_lengths,
        output_lengths,
        in_place,
    })
}

/// The parameter list and body of a kind's device function: `(p, units, start, stride)`, its
/// pointers read from `p` (inputs, then outputs), each thread taking work items `start`,
/// `start + stride`, ... below `units`.
fn kind_function(
    body: &str,
    input_dtypes: &[DType],
    whole: &[bool],
    output_dtypes: &[DType],
    results: &[usize],
    vector: bool,
    written_over: impl Fn(usize) -> bool,
) -> String {
    let mut f = String::new();
    let _ = writeln!(f, "(const unsigned long long* p, long long units, long long start, long long stride) {{");
    let inputs = input_dtypes.len();
    for (k, &d) in input_dtypes.iter().enumerate() {
        let _ = writeln!(f, "  const {}* in{k} = (const {0}*)p[{k}];", element_type(d));
    }
    for (o, &d) in output_dtypes.iter().enumerate() {
        // An output written over an input is read through that input's pointer too.
        let restrict = if written_over(o) { "" } else { " __restrict__" };
        let _ = writeln!(f, "  {}*{restrict} out{o} = ({0}*)p[{}];", element_type(d), inputs + o);
    }
    for (k, &d) in input_dtypes.iter().enumerate().filter(|&(k, _)| !whole[k]) {
        let _ = writeln!(f, "  const float s{k} = {};", widen(d, &format!("in{k}[0]")));
    }
    let _ = writeln!(f, "  for (long long j = start; j < units; j += stride) {{");
    if !vector {
        for (k, &d) in input_dtypes.iter().enumerate() {
            let read = if whole[k] { widen(d, &format!("in{k}[j]")) } else { format!("s{k}") };
            let _ = writeln!(f, "    const float x{k} = {read};");
        }
        f.push_str(body);
        for (o, &d) in output_dtypes.iter().enumerate() {
            let _ = writeln!(f, "    out{o}[j] = {};", narrow(d, &format!("t{}", results[o])));
        }
        let _ = writeln!(f, "  }}\n}}");
        return f;
    }
    // Four elements: one `float4` of f32 values, one `uint2` of 16-bit ones (element `4j` in
    // the low half of the first word).
    for (k, &d) in input_dtypes.iter().enumerate().filter(|&(k, _)| whole[k]) {
        let _ = match d {
            DType::F32 => writeln!(f, "    const float4 v{k} = __ldcs(reinterpret_cast<const float4*>(in{k}) + j);"),
            _ => writeln!(f, "    const uint2 v{k} = __ldcs(reinterpret_cast<const uint2*>(in{k}) + j);"),
        };
    }
    for (o, &d) in output_dtypes.iter().enumerate() {
        let _ = writeln!(f, "    {} r{o};", if d == DType::F32 { "float4" } else { "uint2" });
    }
    let lanes = [
        ("x", "x", "& 0xffffu", ""),
        ("y", "x", ">> 16", " << 16"),
        ("z", "y", "& 0xffffu", ""),
        ("w", "y", ">> 16", " << 16"),
    ];
    for (lane, word, part, shift) in lanes {
        let _ = writeln!(f, "    {{");
        for (k, &d) in input_dtypes.iter().enumerate() {
            let read = match (whole[k], d) {
                (false, _) => format!("s{k}"),
                (true, DType::F32) => format!("v{k}.{lane}"),
                (true, d) => widen(d, &format!("(v{k}.{word} {part})")),
            };
            let _ = writeln!(f, "    const float x{k} = {read};");
        }
        f.push_str(body);
        for (o, &d) in output_dtypes.iter().enumerate() {
            let value = format!("t{}", results[o]);
            let _ = match d {
                DType::F32 => writeln!(f, "    r{o}.{lane} = {value};"),
                d if shift.is_empty() => writeln!(f, "    r{o}.{word} = (unsigned int){};", narrow(d, &value)),
                d => writeln!(f, "    r{o}.{word} |= (unsigned int){}{shift};", narrow(d, &value)),
            };
        }
        let _ = writeln!(f, "    }}");
    }
    for (o, &d) in output_dtypes.iter().enumerate() {
        let vector_type = if d == DType::F32 { "float4" } else { "uint2" };
        let _ = writeln!(f, "    __stcs(reinterpret_cast<{vector_type}*>(out{o}) + j, r{o});");
    }
    let _ = writeln!(f, "  }}\n}}");
    f
}

/// A joined region's kernel, launched once per table of segments.
pub(super) struct JoinedKernel {
    device: Arc<CudaDevice>,
    function: CudaFunction,
    joined: JoinedSource,
    lengths: BufferLengths,
    /// Blocks of each segment, in order.
    blocks: Vec<usize>,
    range: Option<PreparedRegionRange>,
}

impl JoinedKernel {
    pub(super) fn new(
        device: &Arc<CudaDevice>,
        joined: JoinedSource,
        range: Option<PreparedRegionRange>,
    ) -> Result<Self> {
        let function = device.hand_launched(&joined.kernel, joined.source.clone())?;
        let lengths = BufferLengths { inputs: joined.input_lengths.clone(), outputs: joined.output_lengths.clone() };
        let blocks = joined.segments.iter().map(|s| s.units.div_ceil(THREADS as usize).clamp(1, MOST_BLOCKS)).collect();
        Ok(Self { device: device.clone(), function, joined, lengths, blocks, range })
    }

    fn launch(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        let joined = &self.joined;
        self.lengths.check_in_place(&joined.kernel, inputs, outputs, &joined.in_place)?;
        let stream = self.device.stream();
        // The table, on the stack (no allocation per run): 4 KB of words.
        let mut table = [0u64; PARAMETER_BYTES / 8];
        let (s, p) = (joined.per_launch, joined.pointers);
        for (launch, segments) in joined.segments.chunks(s).enumerate() {
            table.fill(0);
            let blocks = &self.blocks[launch * s..launch * s + segments.len()];
            let mut first = 0u64;
            for (i, segment) in segments.iter().enumerate() {
                for (j, slot) in segment.slots.iter().enumerate() {
                    table[i * p + j] = match *slot {
                        Slot::Input(k) => match joined.in_place.iter().find(|&&(i, _)| i == k) {
                            // An input written over is empty: its value is in its output.
                            Some(&(_, o)) if inputs[k].is_empty() => address(&*outputs[o])?,
                            _ => address(inputs[k])?,
                        },
                        Slot::Output(o) => address(&*outputs[o])?,
                    };
                }
                table[s * p + i] = segment.units as u64;
                table[s * p + s + i] = first;
                first += blocks[i] as u64;
            }
            // Unused rows start at the grid's end: no block finds them.
            for i in segments.len()..=s {
                table[s * p + s + i] = first;
            }
            for (i, segment) in segments.iter().enumerate() {
                let word = &mut table[s * p + 2 * s + 1 + i / 2];
                *word |= (segment.kind as u64) << (32 * (i % 2));
            }
            let config =
                LaunchConfig { grid_dim: (first as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut params: [*mut c_void; 1] = [table.as_mut_ptr().cast::<c_void>()];
            // SAFETY: the kernel takes one parameter, a `Segments` table laid out as `table`
            // (`table_bytes(s, p)` bytes, within the array): per segment its pointers, which
            // `lengths` checked hold what the segment's shape reads and writes, its work items,
            // its first block and its kind. The grid is the blocks of the table's segments, at
            // most 2^16 each of at most 4 KB / 8 segments (below CUDA's grid limit).
            unsafe { super::device_checks::launch(&self.function, &stream, config, &mut params)? };
        }
        Ok(())
    }
}

impl DeviceKernel for JoinedKernel {
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()> {
        match &self.range {
            Some(range) => range.in_scope(|| self.launch(inputs, outputs)),
            None => self.launch(inputs, outputs),
        }
    }

    fn in_place(&self, input: usize, output: usize) -> bool {
        self.joined.in_place.contains(&(input, output))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::core::ir::{Arena, Registry, TensorMeta, TraceBuilder};
    use crate::core::passes::{FuseRegions, Pass};
    use crate::core::plan::{Executor, Fusible};
    use crate::optim::AdamW;

    /// What `CudaFusion` fuses and joins, without a device.
    struct Joins;

    impl Executor for Joins {
        fn name(&self) -> &str {
            "joins"
        }
        fn claims(&self, op: &OpView<'_>) -> bool {
            op.is_region_of(self)
        }
        fn dtypes(&self) -> &[DType] {
            &DType::FLOATS
        }
        fn fusible(&self, op: &OpView<'_>) -> Fusible {
            if builtin_prim(op) == Some(crate::prims::CAST) {
                return Fusible::Elementwise;
            }
            crate::executors::cpu_reference::builtin_fusible(op)
        }
        fn joins(&self, region: &OpView<'_>) -> bool {
            joinable(region)
        }
    }

    /// An AdamW step (with weight decay) over `count` parameters of GPT-2-like shapes, some of
    /// odd lengths, every third in bf16 with an f32 gradient; fused and joined.
    fn adamw_source(count: usize) -> JoinedSource {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let adamw = AdamW::new().weight_decay(0.01);
        let step = adamw.step_inputs(&mut b).unwrap();
        let shapes: [&[usize]; 4] = [&[768], &[3, 7], &[64, 32], &[5]];
        for i in 0..count {
            let dtype = if i % 3 == 2 { DType::BF16 } else { DType::F32 };
            let p = b.input_with(&TensorMeta::new(dtype, shapes[i % 4])).unwrap();
            let g = b.input(shapes[i % 4]).unwrap();
            adamw.update(&mut b, &step, p, g).unwrap();
        }
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(Arc::new(Joins)).run(&trace, &arena).unwrap();
        let regions: Vec<_> = fused.bound_symbols().iter().filter(|b| b.symbol() == crate::prims::REGION).collect();
        assert_eq!(regions.len(), 1, "every update in one region: {fused}");
        let region = OpView::new(&fused, regions[0]).unwrap();
        assert!(is_joined(&region.region_ops().unwrap()));
        joined_source(&region, "joined", KernelVariants::default()).unwrap()
    }

    /// GPT-2's 148 parameters' updates: one chain each, a few kinds of code (f32 and bf16
    /// parameters, four or one element a thread), a few launches of tables that fit 4 KB.
    #[test]
    fn an_optimizer_step_over_many_parameters_takes_a_few_launches() {
        let joined = adamw_source(148);
        assert_eq!(joined.segments.len(), 148);
        let kinds = joined.segments.iter().map(|s| s.kind).max().unwrap() + 1;
        assert_eq!(kinds, 4, "f32 and bf16, vectors and single elements");
        assert!(JoinedSource::table_bytes(joined.per_launch, joined.pointers) <= PARAMETER_BYTES);
        assert!(JoinedSource::table_bytes(joined.per_launch + 1, joined.pointers) > PARAMETER_BYTES);
        assert_eq!(joined.launches(), 148usize.div_ceil(joined.per_launch));
        assert!(joined.launches() <= 4, "{} launches", joined.launches());
        // Every update is written over its parameter and moments.
        assert_eq!(joined.in_place.len(), 3 * 148);
        // Odd lengths go one element a thread; the rest four.
        let units: Vec<usize> = joined.segments[..4].iter().map(|s| s.units).collect();
        assert_eq!(units, [192, 21, 512, 5]);
        super::super::compiles_with_nvrtc(&joined.source);
    }

    /// Two chains of two shapes: two rows of one table, each with its own buffers.
    #[test]
    fn two_chains_of_two_shapes_are_two_rows_of_one_table() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let (x, y) = (b.input(&[8]).unwrap(), b.input(&[3]).unwrap());
        let e = b.exp(x).unwrap();
        let n = b.neg(e).unwrap();
        let t = b.tanh(y).unwrap();
        let r = b.relu(t).unwrap();
        b.output(n).unwrap();
        b.output(r).unwrap();
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(Arc::new(Joins)).run(&trace, &arena).unwrap();
        assert_eq!(fused.len(), 1, "{fused}");
        let region = OpView::new(&fused, &fused.bound_symbols()[0]).unwrap();
        let joined = joined_source(&region, "joined", KernelVariants::default()).unwrap();
        assert_eq!((joined.segments.len(), joined.launches()), (2, 1));
        assert_eq!(joined.segments[0].slots, [Slot::Input(0), Slot::Output(0)]);
        assert_eq!(joined.segments[1].slots, [Slot::Input(1), Slot::Output(1)]);
        super::super::compiles_with_nvrtc(&joined.source);
    }

    /// With `fast_exp2`, 16-bit `sigmoid` and `gelu` in a joined region call `bs_exp2`, which
    /// its source then defines (or it would not compile).
    #[test]
    fn a_joined_region_defines_the_exp2_its_chains_call() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(DType::BF16, &[8])).unwrap();
        let y = b.input_with(&TensorMeta::new(DType::F16, &[3])).unwrap();
        let s = b.sigmoid(x).unwrap();
        let s = b.mul_scalar(s, 2.0).unwrap();
        let g = b.gelu(y).unwrap();
        let g = b.neg(g).unwrap();
        b.output(s).unwrap();
        b.output(g).unwrap();
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(Arc::new(Joins)).run(&trace, &arena).unwrap();
        let region = OpView::new(&fused, &fused.bound_symbols()[0]).unwrap();
        assert!(is_joined(&region.region_ops().unwrap()), "{fused}");
        let fast = KernelVariants { fast_exp2: true, ..KernelVariants::NONE };
        let joined = joined_source(&region, "joined", fast).unwrap();
        assert!(joined.source.contains(EXP2) && joined.source.matches("bs_exp2(").count() >= 3, "{}", joined.source);
        super::super::compiles_with_nvrtc(&joined.source);
        let without = joined_source(&region, "joined", KernelVariants::NONE).unwrap();
        assert!(!without.source.contains("bs_exp2"), "{}", without.source);
    }

    /// An update written over its parameter while another chain of the region reads the
    /// parameter (an average of the weights beside the optimizer's step) would race with that
    /// chain's blocks: that pair is not offered in place; the average's own is.
    #[test]
    fn an_input_another_chain_reads_is_not_written_over() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let (p, g, ema, other) =
            (b.input(&[8]).unwrap(), b.input(&[8]).unwrap(), b.input(&[8]).unwrap(), b.input(&[3]).unwrap());
        let step = b.mul_scalar(g, 0.1).unwrap();
        let next = b.sub(p, step).unwrap();
        let kept = b.mul_scalar(ema, 0.9).unwrap();
        let fresh = b.mul_scalar(p, 0.1).unwrap();
        let average = b.add(kept, fresh).unwrap();
        b.update(p, next).unwrap();
        b.update(ema, average).unwrap();
        let e = b.exp(other).unwrap();
        let n = b.neg(e).unwrap();
        b.output(n).unwrap();
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(Arc::new(Joins)).run(&trace, &arena).unwrap();
        assert_eq!(fused.len(), 1, "{fused}");
        let region = OpView::new(&fused, &fused.bound_symbols()[0]).unwrap();
        assert_eq!(region.in_place_updates().len(), 2, "{fused}");
        let joined = joined_source(&region, "joined", KernelVariants::default()).unwrap();
        let inputs: Vec<ValueId> = region.bound_symbol().inputs().collect();
        let ema_at = inputs.iter().position(|&v| v == ema).unwrap();
        assert_eq!(joined.in_place.len(), 1, "{:?}", joined.in_place);
        assert_eq!(joined.in_place[0].0, ema_at);
        super::super::compiles_with_nvrtc(&joined.source);
    }
}
