//! CUDA C for a fused region of elementwise ops: one kernel, a grid-stride loop over vectors
//! (four `f32` values, eight where an operand is 16-bit; the values past the last whole vector
//! are a tail, an element a thread). Inputs read whole move a vector an access; broadcast ones
//! are read per vector where their rows hold whole vectors; in 16-bit kernels also where the
//! vectors straddle rows (a value per row as two values a vector, a row vector with two
//! aligned accesses and a shift: see [`wide_loop`]); else per element (`f32` kernels over rows
//! of a length not a multiple of 4). Any pattern `broadcast_to` makes is one of those: an
//! operand keeps the last axis whole (`[T, 1, D]` over `[B, T, H, D]`, read a vector an access
//! at its vector's offset) or broadcasts it (`[1, T, H, 1]`, a value per vector). A
//! row broadcast over many rows is read once for several rows by 16-bit kernels
//! ([`rows_per_thread`]). Those full-size vector streams
//! are read and written with the streaming cache hints (`__ldcs`, `__stcs`: used once, evict
//! first), which leaves L2 to what is read again (rows and columns broadcast per vector):
//! measured on the H200, 96% to 103% of the copy bandwidth for the swish chain at 2^28 and 93%
//! to 98% for the norm chain.

use std::fmt::Write;

use crate::core::ir::{prims, Arg, DType, ValueId};
use crate::core::plan::packing;
use crate::core::plan::OpView;
use crate::executors::cpu_reference::kernels::{broadcast_read, broadcast_strides, BroadcastRead};
use crate::executors::cpu_reference::{builtin_prim, fused_shape};

use super::row_kernels::{load_raw, Caching};
use super::KernelVariants;

/// The generated source of one region and how to launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSource {
    /// The kernel's name in `source`.
    pub kernel: String,
    /// CUDA C, for NVRTC.
    pub source: String,
    /// Number of input pointers (first kernel arguments, in region-input order).
    pub inputs: usize,
    /// Number of output pointers (next arguments, in region-output order).
    pub outputs: usize,
    /// Elements of the iteration shape (the last argument, `long long n`).
    pub numel: usize,
    /// Whether the kernel is written over vectors of values (four `f32` values, or eight where
    /// an operand is 16-bit), the values past the last whole vector one a thread (a kernel of
    /// fewer values than a vector has only those).
    pub vectorized: bool,
    /// How many threads have work (at least 1): vectors, or groups of rows of vectors (16-bit
    /// kernels over many rows of a row broadcast), or more where the tail has more values; rows
    /// times the threads per row for a trailing reduction.
    pub threads: usize,
    /// The elements each input buffer must hold (its value's), in parameter order: the kernel
    /// reads no further, and its launcher checks the buffers it is given against these.
    pub input_lengths: Vec<usize>,
    /// The elements each output buffer must hold (its value's), in parameter order.
    pub output_lengths: Vec<usize>,
    /// `(input, output)` parameters the kernel may be run with the output written over the
    /// input (an in-place update: [`OpView::in_place_updates`]): each thread reads an element of
    /// the input before it writes the same element of the output, and the two pointers are not
    /// `__restrict__`.
    pub in_place: Vec<(usize, usize)>,
    /// Blocks of the thread-block cluster its blocks run in, which the source declares
    /// (`__cluster_dims__`), so that a plain launch of [`threads`](Self::threads) in blocks of
    /// 256 runs them as clusters; 1 where it declares none.
    pub cluster: usize,
}

/// A float literal in C.
pub(super) fn literal(x: f32) -> String {
    if x.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if x.is_infinite() {
        if x > 0.0 { "__int_as_float(0x7f800000)" } else { "__int_as_float(0xff800000)" }.into()
    } else {
        format!("{x:e}f")
    }
}

/// The C expression of a prim applied to operand expressions. Where the op's result is typed
/// 16-bit (`to_16_bits`: 8 or 11 bits of precision, though a region keeps it in `float` until
/// it is written), `exp`, `sigmoid` and `gelu` take the hardware's `exp2` and an approximate
/// division (a few units in the last place of `float`, far inside a 16-bit rounding, as
/// `softmax` takes `exp2` for 16-bit results): `gelu`'s
/// `0.5x(1 + tanh(u))` as `x / (1 + exp(-2u))`, the same function without the cancellation of
/// `1 + tanh(u)` for negative `u`. `tanhf` and the `float` forms took about 25 instructions a
/// value, which made 16-bit `gelu` chains compute-bound (81% of a copy's speed over
/// `[8192, 8192]`, where `f32` ones, with half the values per byte, ran at a copy's).
///
/// With [`KernelVariants::fast_exp2`], 16-bit `sigmoid` and `gelu` take `bs_exp2` ([`EXP2`]:
/// one instruction, flushing results below 2^-126 to 0, which their `1 + e` denominators do
/// not see). 16-bit `exp` keeps `exp2f`: its own results reach bf16's subnormals.
fn apply(op: crate::SymbolId, a: &str, b: Option<&str>, to_16_bits: bool, variants: KernelVariants) -> Option<String> {
    let b = b.unwrap_or("");
    let exp2 = if variants.fast_exp2 { "bs_exp2" } else { "exp2f" };
    Some(match op {
        prims::EXP if to_16_bits => format!("exp2f({a} * 1.44269504f)"),
        prims::SIGMOID if to_16_bits => format!("__fdividef(1.0f, 1.0f + {exp2}({a} * -1.44269504f))"),
        // 2 * sqrt(2 / pi) * log2(e) = 2.30220819.
        prims::GELU if to_16_bits => {
            format!("__fdividef({a}, 1.0f + {exp2}(-2.30220819f * ({a} + 0.044715f * {a} * {a} * {a})))")
        }
        prims::NEG => format!("(-{a})"),
        // The conversion is in the loads and stores: a value read as `float` and written as
        // the output's dtype.
        prims::CAST => a.to_string(),
        prims::EXP => format!("expf({a})"),
        prims::LOG => format!("logf({a})"),
        prims::TANH => format!("tanhf({a})"),
        prims::SIGMOID => format!("(1.0f / (1.0f + expf(-{a})))"),
        // NaN propagates through `relu` and `maximum`, as in PyTorch (`fmaxf` drops it).
        prims::RELU => format!("({a} <= 0.0f ? 0.0f : {a})"),
        prims::GELU => format!("(0.5f * {a} * (1.0f + tanhf(0.7978846f * ({a} + 0.044715f * {a} * {a} * {a}))))"),
        prims::ADD => format!("({a} + {b})"),
        prims::SUB => format!("({a} - {b})"),
        prims::MUL => format!("({a} * {b})"),
        prims::DIV => format!("({a} / {b})"),
        prims::MAXIMUM => maximum(a, b),
        _ => return None,
    })
}

/// `maximum(a, b)` in C: NaN if either is, as PyTorch's `maximum`: a call of `bs_max`, which
/// [`MAXIMUM`] defines (every kernel that may call it includes it).
pub(super) fn maximum(a: &str, b: &str) -> String {
    format!("bs_max({a}, {b})")
}

/// The C of `bs_max`: one instruction from Ampere on (`max.NaN.f32`), where the comparisons
/// that keep a NaN took four (a 16-bit maximum over short rows ran at 58-65% of a copy, its
/// sum at 76-79%). Values are those of the comparisons but for two details: a NaN comes back
/// as the canonical NaN (its payload dropped), and the maximum of `+0.0` and `-0.0` may
/// differ in its sign from the comparisons' (and the CPU executors'), which return the second.
/// (The unit tests compile it to PTX only, which NVRTC does not check inside `asm`: the GPU
/// tests run it.)
pub(super) const MAXIMUM: &str = r#"__device__ __forceinline__ float bs_max(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float d; asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d;
#else
  return (a != a || a > b) ? a : b;
#endif
}
"#;

/// The C of `bs_exp2`, 2^x in one instruction: PTX's `ex2.approx.ftz.f32`, of `exp2f`'s
/// accuracy (2 units in the last place) but for results below 2^-126, which it flushes to 0
/// (`exp2f` scales them, in three more instructions that issue though predicated off). For
/// [`KernelVariants::fast_exp2`], where the flush loses nothing.
pub(super) const EXP2: &str = r#"__device__ __forceinline__ float bs_exp2(float x) {
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}
"#;

/// How element `i` of the iteration shape reads region input `k`.
fn index_expression(k: usize, shape: &[usize], input_shape: &[usize]) -> String {
    if input_shape == shape {
        return format!("in{k}[i]");
    }
    if input_shape.iter().product::<usize>() == 1 {
        return format!("in{k}[0]");
    }
    format!("in{k}[{}]", offset_expression(shape, input_shape))
}

/// How an input of an elementwise kernel over vectors is read: a vector an access (read whole),
/// one value (a single one), one value per vector (constant along the last axis) or a vector
/// (contiguous along a last axis as long as the iteration shape's) where rows hold whole
/// vectors, else per element.
enum VectorRead {
    Vector,
    Scalar,
    PerVector,
    PerVectorFloat4,
    /// Per element of the vector, through the broadcast strides: a broadcast whose rows do not
    /// hold whole vectors (rows of a length not a multiple of 4, or 8 in 16-bit kernels, where
    /// [`wide_loop`] reads a per-row value or a 16-bit row per vector all the same). (Every
    /// broadcast keeps the last axis or broadcasts it: `[T, 1, D]` over `[B, T, H, D]` is read
    /// per vector.) The inputs read whole still move a vector per access.
    PerLane,
}

/// How an input of `input_shape` is read by a kernel over vectors of `width` values of `shape`.
fn vector_read(shape: &[usize], input_shape: &[usize], width: usize) -> VectorRead {
    // A broadcast row is read per vector only if vectors never straddle two rows.
    let whole_vectors = shape.last().is_some_and(|last| last.is_multiple_of(width));
    match broadcast_read(input_shape, shape) {
        BroadcastRead::Same => VectorRead::Vector,
        BroadcastRead::Single => VectorRead::Scalar,
        BroadcastRead::RowConstant if whole_vectors => VectorRead::PerVector,
        BroadcastRead::RowVector if whole_vectors => VectorRead::PerVectorFloat4,
        _ => VectorRead::PerLane,
    }
}

/// Threads a kernel of at least this many threads keeps: about twice what the largest GPUs
/// hold at once (132 multiprocessors x 2,048 threads on an H100 or H200: 270,336).
const ENOUGH_THREADS: usize = 1 << 19;

/// Rows each thread of an elementwise kernel takes in turn (1, 2, 4, 8 or 16), where an input
/// is one row repeated along every other axis (`[D]` over `[N, D]`, read per vector): the
/// thread reads its vector of that row once, for all of its rows, where one row per thread
/// read it once per vector of the output. The largest that divides the rows and still leaves
/// [`ENOUGH_THREADS`] threads (1: no input is such a row, or the tensor is too small).
fn rows_per_thread(shape: &[usize], input_shapes: &[Vec<usize>], reads: &[VectorRead], per_thread: usize) -> usize {
    let Some(&row) = shape.last() else { return 1 };
    let rows = shape[..shape.len() - 1].iter().product::<usize>();
    if row == 0 || !row.is_multiple_of(per_thread) || !(0..reads.len()).any(|k| held_row(shape, input_shapes, reads, k))
    {
        return 1;
    }
    let threads = rows * (row / per_thread);
    let mut r = 16;
    while r > 1 && (!rows.is_multiple_of(r) || threads / r < ENOUGH_THREADS) {
        r /= 2;
    }
    r
}

/// Whether input `k` is one row read per vector and the same for every row (its values vary
/// along the last axis only): a thread of a kernel of several rows per thread reads it once.
fn held_row(shape: &[usize], input_shapes: &[Vec<usize>], reads: &[VectorRead], k: usize) -> bool {
    matches!(reads[k], VectorRead::PerVectorFloat4)
        && shape.len() > 1
        && input_shapes[k].iter().product::<usize>() == shape.last().copied().unwrap_or(0)
}

/// Opens the loop of an elementwise kernel over vectors of `per_thread` elements: one vector
/// `j` per thread and turn, or, with `rows > 1` rows per thread ([`rows_per_thread`]), a
/// column `c` of vectors and a group `g` of `rows` rows per turn, then (after `held`, the
/// reads made once per turn) an unrolled loop over the group's rows defining `j`. With a
/// [`RowBatch`] of more than one row, the group's rows go in batches: each batch's loads for
/// all of its rows, then the loop over its rows. Returns how many loops it opened.
fn open_vector_loop(
    source: &mut String,
    shape: &[usize],
    per_thread: usize,
    rows: usize,
    held: &str,
    batch: &RowBatch,
) -> usize {
    let numel: usize = shape.iter().product();
    if rows <= 1 {
        let _ = writeln!(source, "  const long long vectors = n / {per_thread};");
        let _ = writeln!(
            source,
            "  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < vectors; j += stride) {{"
        );
        return 1;
    }
    let cols = shape.last().copied().unwrap_or(1) / per_thread;
    let turns = numel / per_thread / rows;
    let _ = writeln!(source, "  const long long cols = {cols}ll;");
    let _ = writeln!(
        source,
        "  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < {turns}ll; t += stride) {{"
    );
    let _ = writeln!(source, "    const long long c = t % cols, g = t / cols;");
    source.push_str(held);
    if batch.rows > 1 {
        let b = batch.rows;
        let _ = writeln!(source, "    #pragma unroll");
        let _ = writeln!(source, "    for (int q0 = 0; q0 < {rows}; q0 += {b}) {{");
        source.push_str(&batch.declarations);
        let _ = writeln!(source, "    #pragma unroll");
        let _ = writeln!(source, "    for (int q = 0; q < {b}; ++q) {{");
        let _ = writeln!(source, "    const long long i = {per_thread}ll * ((g * {rows}ll + q0 + q) * cols + c);");
        source.push_str(&batch.loads);
        let _ = writeln!(source, "    }}");
        let _ = writeln!(source, "    #pragma unroll");
        let _ = writeln!(source, "    for (int q = 0; q < {b}; ++q) {{");
        let _ = writeln!(source, "    const long long j = (g * {rows}ll + q0 + q) * cols + c;");
        return 3;
    }
    let _ = writeln!(source, "    #pragma unroll");
    let _ = writeln!(source, "    for (int q = 0; q < {rows}; ++q) {{");
    let _ = writeln!(source, "    const long long j = (g * {rows}ll + q) * cols + c;");
    2
}

/// The offset in a broadcast input of element `i` of the iteration shape, as C.
fn offset_expression(shape: &[usize], input_shape: &[usize]) -> String {
    strided_offset(shape, &broadcast_strides(input_shape, shape))
}

/// Element `index` (a C expression) of the iteration shape read from broadcast input `k`.
fn lane_read(k: usize, shape: &[usize], input_shape: &[usize], index: &str) -> String {
    format!("in{k}[{}]", strided_offset_of(shape, &broadcast_strides(input_shape, shape), index))
}

/// The offset, through `strides` (one per axis of `shape`), of element `i` of `shape`, as C:
/// `i` must be in `0..` the shape's element count (the 32-bit arithmetic relies on it).
/// Coordinates are found in 32-bit arithmetic where every element's index fits (a division of
/// 64-bit integers by a constant takes several times the instructions: a broadcast row of
/// odd length, read per element, paid that twice per element).
pub(super) fn strided_offset(shape: &[usize], strides: &[usize]) -> String {
    strided_offset_of(shape, strides, "i")
}

/// [`strided_offset`] of element `i` (a C expression of type `long long`).
fn strided_offset_of(shape: &[usize], strides: &[usize], i: &str) -> String {
    let in_32_bits = shape.iter().product::<usize>() <= u32::MAX as usize;
    let mut terms = Vec::new();
    let mut inner = 1usize;
    for axis in (0..shape.len()).rev() {
        if strides[axis] != 0 {
            let d = shape[axis];
            let coordinate = match (inner, axis, in_32_bits) {
                (1, 0, _) => i.to_string(),
                (1, _, true) => format!("(long long)((unsigned int){i} % {d}u)"),
                (_, 0, true) => format!("(long long)((unsigned int){i} / {inner}u)"),
                (_, _, true) => format!("(long long)((unsigned int){i} / {inner}u % {d}u)"),
                (1, _, false) => format!("({i} % {d}ll)"),
                (_, 0, false) => format!("({i} / {inner}ll)"),
                (_, _, false) => format!("(({i} / {inner}ll) % {d}ll)"),
            };
            terms.push(if strides[axis] == 1 { coordinate } else { format!("{coordinate} * {}ll", strides[axis]) });
        }
        inner *= shape[axis];
    }
    if terms.is_empty() {
        "0".into()
    } else {
        terms.join(" + ")
    }
}

/// Generates the CUDA C of a fused region of elementwise ops, optionally ending in a `sum` or
/// `max` over the last axis.
///
/// # Errors
/// A message when the region holds something this generator does not support (an op other
/// than an elementwise built-in prim or a trailing last-axis reduction), or when its shapes
/// break a relation the kernel relies on (an op that does not fit the built-in's shape rule,
/// an input that does not broadcast to the iteration shape, a reduction over another shape):
/// the generated kernel never reads or writes past the buffers of the shapes it was given.
pub fn region_source(region: &OpView<'_>, kernel: &str) -> Result<RegionSource, String> {
    region_source_for(region, kernel, KernelVariants::default(), RegionTarget::default())
}

/// [`region_source`], generating `variants` of the kernel for the GPU `target`.
///
/// # Errors
/// As for [`region_source`].
pub(super) fn region_source_for(
    region: &OpView<'_>,
    kernel: &str,
    variants: KernelVariants,
    target: RegionTarget,
) -> Result<RegionSource, String> {
    let ops = region.region_ops().map_err(|e| e.to_string())?;
    let inputs: Vec<ValueId> = region.bound_symbol().inputs().collect();
    generate(region, &ops, &inputs, region.bound_symbol().outputs(), kernel, variants, target)
}

/// Generates the CUDA C of one elementwise prim, or a `sum` or `max` over the last axis (a
/// region of one op).
///
/// # Errors
/// As for [`region_source`].
pub fn op_source(op: &OpView<'_>, kernel: &str) -> Result<RegionSource, String> {
    op_source_for(op, kernel, KernelVariants::default(), RegionTarget::default())
}

/// [`op_source`], generating `variants` of the kernel for the GPU `target`.
///
/// # Errors
/// As for [`region_source`].
pub(super) fn op_source_for(
    op: &OpView<'_>,
    kernel: &str,
    variants: KernelVariants,
    target: RegionTarget,
) -> Result<RegionSource, String> {
    // One parameter per tensor argument, repeats included (`mul(x, x)` takes `x` twice), as
    // the plan passes them.
    let inputs: Vec<ValueId> = op.bound_symbol().inputs().collect();
    generate(op, std::slice::from_ref(op), &inputs, op.bound_symbol().outputs(), kernel, variants, target)
}

/// The GPU a region's kernel is generated for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RegionTarget {
    /// Bytes of L2 cache; 0 where unknown (see [`KernelVariants::keep_in_l2`]).
    pub l2_bytes: usize,
    /// SMs; 0 where unknown (then no row is split: [`KernelVariants::split_reductions`]).
    pub sms: usize,
    /// Whether kernels may run as thread-block clusters (compiled for Hopper or later).
    pub clusters: bool,
}

/// How a kernel whose inputs take `read` device words together and its outputs `written`
/// ([`total_words`] of each) moves the tensors it reads or writes whole: with the streaming
/// hints, unless [`KernelVariants::keep_in_l2`] and all of them fit together in
/// [`L2_KEPT_SHARE`] of the GPU's L2 cache of `l2_bytes` (0 where unknown), and the inputs in
/// [`L2_READ_SHARE`].
pub(super) fn whole_tensors(variants: KernelVariants, read: usize, written: usize, l2_bytes: usize) -> Caching {
    let words = read.saturating_add(written);
    if variants.keep_in_l2 && fit_in_l2(words, l2_bytes, L2_KEPT_SHARE) && fit_in_l2(read, l2_bytes, L2_READ_SHARE) {
        Caching::Kept
    } else {
        Caching::Streamed
    }
}

/// The device words of tensors of `lengths` words each, together (saturating).
pub(super) fn total_words(lengths: impl IntoIterator<Item = usize>) -> usize {
    lengths.into_iter().fold(0usize, usize::saturating_add)
}

/// Whether tensors of `words` device words together fit in `share` (numerator, denominator) of
/// an L2 cache of `l2_bytes` (never where its size is unknown, 0).
fn fit_in_l2(words: usize, l2_bytes: usize, (numerator, denominator): (usize, usize)) -> bool {
    words.saturating_mul(4).saturating_mul(denominator) <= l2_bytes.saturating_mul(numerator)
}

/// The share of the L2 cache (numerator, denominator) that a kernel's whole tensors may take
/// for [`KernelVariants::keep_in_l2`] to drop their streaming hints. Measured on the H100 (50
/// MiB of L2), with the variant against without it: tensors of 32 MiB together ran 1.05-1.18x
/// (rows of 32 and 1,024 and broadcast chains over 2^22 values), tensors of 48 MiB (the
/// broadcast chains over [16384, 768] and [4096, 3072] in bf16 and f16) 0.78-0.81x in two
/// runs, where the whole L2 was the bound (a control plan of the same kernels read 0.97-1.01x):
/// there the streamed kernels run at 3,230-3,320 GB/s, the kept ones at 2,550-2,690.
pub(super) const L2_KEPT_SHARE: (usize, usize) = (3, 4);

/// The share of the L2 cache (numerator, denominator) that the inputs of a kernel may take for
/// [`KernelVariants::keep_in_l2`] to drop their streaming hints, beside [`L2_KEPT_SHARE`] for
/// all its tensors. Measured on the H100 (50 MiB of L2; 2026-12-05, `gpu_sweep --variants`,
/// plans on the same inputs): 16-bit `sum` and `max` over 2^24 values (32 MiB read, rows' results
/// written) ran 0.90-0.94x kept against streamed over rows of 512 to 16,384 in bf16 and in f16,
/// 0.95-1.00x over rows of 32, 128 and 50,257, and 1.05-1.10x over [256, 65536], where kernels
/// reading 16 MiB and writing 16 ran kept 1.14-1.39x (f32 `softmax` and `layer_norm` over
/// [4096, 1024] and [131072, 32], broadcast chains over [1024, 4096]). The half lies between
/// those two: inputs of 16 to 32 MiB are not measured. Built with the bound and without, run in
/// turn three times: 1.04-1.09x over rows of 512 to 16,384 (24 cases), 0.89-0.94x over [256,
/// 65536], 0.97-1.00x over rows of 50,257, and 0.90-0.97x over rows of 32 and 128, where the
/// variants sweep had read them 0.95-1.00x kept (the runs in turn, on inputs of their own,
/// read 8 MiB cases the bound leaves alone up to 1.20x apart). The bound also streams
/// elementwise regions of three inputs or more whose inputs take over half of L2 while all
/// their tensors fit in three quarters: no case of the sweep is one, so none is measured
/// (GPT-2 124M's bf16 steps timed the same with the bound and without).
pub(super) const L2_READ_SHARE: (usize, usize) = (1, 2);

/// Threads per row of a region's trailing reduction over rows of `accesses` reads (of up to 16
/// bytes each): a power of two, one access each up to a warp (a warp's reads cover whole
/// sectors of consecutive rows), and enough that none makes more than 8, up to the block.
fn reduction_threads(accesses: usize) -> usize {
    let mut t = accesses.max(1).next_power_of_two().min(32);
    while t < BLOCK_THREADS as usize && accesses.div_ceil(t) > 8 {
        t *= 2;
    }
    t
}

/// Rows a group of lanes takes at once in a trailing reduction over rows of one access a
/// thread, in 16 bits. Measured on the H200 against one (the sweep's `sum` and `max` over
/// rows of 32 and 128, 2^24 values): 1.16-1.23x with 4, 1.12-1.19x with 2, 0.97-1.13x with
/// 8. `f32` rows keep one: 0.85-1.08x with 2 to 8.
const SHORT_ROWS_PER_GROUP: usize = 4;

/// Bytes of a row (of its widest input read whole) from which a trailing reduction over rows
/// more than a quarter as many as SMs, and at most half as many, is split over clusters
/// ([`KernelVariants::split_reductions`]). Measured on an H100 (132 SMs, 2026-12-06), split
/// against unsplit: 100 and 131 rows of 65,536 values (in two blocks) ran at 0.82-0.91x; 64
/// and 66 rows of 65,536 (in four and two) at 0.86-0.98x in 16 bits (128 KB a row) and
/// 0.97-1.00x in `f32` (256 KB), of 262,144 at 1.07-1.63x (512 KB and 1 MB); 40 rows of
/// 65,536 1.14x in `f32`, 0.98-1.03x in 16 bits; 1 to 20 rows of 50,257 to 2^20 values
/// 0.99-6.6x.
const SPLIT_ROW_BYTES: usize = 256 * 1024;

/// Bytes of a row (of its widest input read whole) below which a trailing reduction is never
/// split over clusters ([`KernelVariants::split_reductions`]): the shortest rows measured split
/// were of 50,257 16-bit values (100 KB: 1.05-1.11x over 20 rows) and 65,536 (128 KB: 0.99-1.12x
/// over 16 rows). Shorter rows take a block from 1,025 accesses on (4,097 `f32` values where the
/// access is one value), where a cluster's barriers would be a larger part of the time.
const SHORTEST_SPLIT_ROW_BYTES: usize = 64 * 1024;

/// How a region's trailing last-axis reduction reads its rows.
struct ReductionLayout {
    /// The row's length.
    row: usize,
    /// Rows (one result each, rows of length zero too).
    rows: usize,
    /// Whether each input is read whole (of the region's shape; else broadcast, read per value).
    full: Vec<bool>,
    /// Values an access.
    v: usize,
    /// Whether accesses are aligned to the tensor rather than to the row.
    aligned: bool,
    /// Accesses a row.
    accesses: usize,
    /// Threads a row.
    t: usize,
    /// Rows a group of `t` lanes takes at once (more than one over rows of one access a thread
    /// in 16 bits: [`short_rows`]).
    group_rows: usize,
    /// Accesses of each input read whole that a thread makes before it uses any.
    loads: usize,
    /// Blocks of the thread-block cluster a row is split over
    /// ([`KernelVariants::split_reductions`]; 1 where rows are not split).
    cluster: usize,
}

impl ReductionLayout {
    /// The layout over rows of `shape`'s last axis, of inputs of `input_shapes` and
    /// `input_dtypes`, in a region of `outputs` outputs, with `variants`, for the GPU `target`.
    fn of(
        shape: &[usize],
        input_shapes: &[Vec<usize>],
        input_dtypes: &[DType],
        outputs: usize,
        variants: KernelVariants,
        target: RegionTarget,
    ) -> Result<Self, String> {
        let row = *shape.last().ok_or("a reduction over a rank-0 shape")?;
        // From the shape, not `n / row`: rows of length zero still have one result each.
        let rows: usize = shape[..shape.len() - 1].iter().product();
        // Inputs of the region's shape are read `v` values at a time, 16 bytes of the widest
        // (halved until `v` divides the row), so that 16-bit rows move as many bytes per access
        // as f32 ones; broadcast inputs are read per value.
        let full: Vec<bool> = input_shapes.iter().map(|s| s == shape).collect();
        let widest = input_dtypes.iter().zip(&full).filter(|(_, &f)| f).map(|(d, _)| d.size_bytes()).max();
        let mut v = widest.map_or(1, |w| 16 / w.clamp(1, 16));
        // A row whose length the access does not divide (GPT-2's 50,257 words) is read through
        // accesses aligned to the tensor, not to the row: the values of the rows beside it that
        // an access reads count for nothing (the combination skips them). Only where every
        // input is read whole and the reduction is the only output: nothing else is read or
        // written per value.
        let aligned = v > 1 && !row.is_multiple_of(v) && row < 1 << 30 && full.iter().all(|&f| f) && outputs == 1;
        while !aligned && v > 1 && !row.is_multiple_of(v) {
            v /= 2;
        }
        let accesses = super::row_kernels::RowLayout::accesses(row, v, aligned);
        let t = reduction_threads(accesses);
        // Rows of one access a thread (a few lanes each) in 16 bits: each group of lanes takes
        // `group_rows` rows, and makes their loads before it uses any (one access a thread in
        // flight left the loads' latency uncovered: 69-80% of a copy over rows of 32 and 128).
        let single = accesses <= t && !aligned;
        // (At most 128 bytes a thread in flight, as below: fewer rows a group with more inputs.)
        let read_whole = full.iter().filter(|&&f| f).count().max(1);
        let group_rows = if single && widest.is_some_and(|w| w <= 2) {
            (128 / (16 * read_whole)).clamp(1, SHORT_ROWS_PER_GROUP)
        } else {
            1
        };
        // Each thread makes `loads` accesses of each input before it uses any, so that they are
        // in flight together (a loop unrolled by the compiler reused their registers and kept
        // two: a maximum over 333 rows of 50,257 f32 values ran at 44% of the DRAM's bandwidth,
        // stalled on its loads). Up to 128 bytes a thread in flight (2 to 16 accesses of each
        // input read whole, so more with 5 inputs or more), spread evenly over the batches the
        // thread's accesses take (25 accesses: batches of 7, 7, 7 and 4, not 8, 8, 8 and 1).
        let access_bytes = v * widest.unwrap_or(4);
        let most = (128 / (access_bytes * read_whole)).clamp(2, 16);
        let per_thread = accesses.div_ceil(t).max(1);
        let batches = per_thread.div_ceil(most);
        let loads = per_thread.div_ceil(batches);
        // Rows of a block each, of `SHORTEST_SPLIT_ROW_BYTES` or more, at most a quarter as many
        // as SMs (or half as many, of `SPLIT_ROW_BYTES` or more): split over a cluster, each
        // block with a batch at least.
        let row_bytes = row.saturating_mul(widest.unwrap_or(4));
        let few = row_bytes >= SHORTEST_SPLIT_ROW_BYTES
            && (4 * rows <= target.sms || (2 * rows <= target.sms && row_bytes >= SPLIT_ROW_BYTES));
        let cluster = if variants.split_reductions
            && target.clusters
            && rows > 0
            && few
            && t == BLOCK_THREADS as usize
            && group_rows == 1
        {
            super::row_kernels::cluster_blocks(rows, target.sms, batches)
        } else {
            1
        };
        Ok(Self { row, rows, full, v, aligned, accesses, t, group_rows, loads, cluster })
    }
}

/// The values a trailing reduction's loop takes from each of a thread's accesses: the inputs
/// read whole are loaded an access at a time into `raw{k}[]` (as read, in as few registers as
/// they take) before any is used, then widened and run value by value through the region's
/// elementwise ops. Both of its row loops ([`short_rows`] and the general one) write them so.
struct AccessValues<'a> {
    /// Values per access.
    v: usize,
    /// Whether each input is read whole (else broadcast, read per value at `i`).
    full: &'a [bool],
    input_dtypes: &'a [DType],
    /// The C that reads broadcast input `k` at `i`, as a `float`.
    read: &'a dyn Fn(usize) -> String,
    /// The region's elementwise ops (in terms of `x{k}`, the inputs' values).
    body: &'a str,
    /// The C that writes the region's other outputs at `i`.
    written: &'a str,
    /// How the accesses of the inputs read whole are cached.
    caching: Caching,
}

impl AccessValues<'_> {
    /// The inputs read whole.
    fn whole(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.full.len()).filter(|&k| self.full[k])
    }

    /// Declares `slots` accesses of each input read whole, as read: `raw{k}[slots]`.
    fn declare(&self, source: &mut String, slots: usize) {
        use super::row_kernels::raw_type;
        for k in self.whole() {
            let _ = writeln!(source, "    {} raw{k}[{slots}];", raw_type(self.input_dtypes[k], self.v));
        }
    }

    /// Loads the access at element `at` (declared by the caller) of each input read whole into
    /// `raw{k}[slot]`.
    fn load(&self, source: &mut String, slot: &str) {
        for k in self.whole() {
            let (dtype, raw) = (self.input_dtypes[k], format!("raw{k}[{slot}]"));
            let load = load_raw(dtype, self.v, &format!("in{k} + at"), &raw, self.caching);
            let _ = writeln!(source, "    {load}");
        }
    }

    /// Opens the loop over the values (`e`) of access `raw{k}[slot]`: each input's value `x{k}`
    /// (widened from the access, or read per value at `i = at + e`, which `index` defines), the
    /// region's ops and its other outputs. The caller combines the value reduced and closes
    /// the loop.
    fn open_values(&self, source: &mut String, slot: &str, index: bool) {
        for k in self.whole() {
            let widen = super::row_kernels::widen_raw(
                self.input_dtypes[k],
                self.v,
                &format!("raw{k}[{slot}]"),
                &format!("xs{k}"),
            );
            let _ = writeln!(source, "    float xs{k}[{}];{widen}", self.v);
        }
        let _ = writeln!(source, "    #pragma unroll");
        let _ = writeln!(source, "    for (int e = 0; e < {}; ++e) {{", self.v);
        if index {
            let _ = writeln!(source, "    const long long i = at + e;");
        }
        for k in 0..self.full.len() {
            let read = if self.full[k] { format!("xs{k}[e]") } else { (self.read)(k) };
            let _ = writeln!(source, "    const float x{k} = {read};");
        }
        source.push_str(self.body);
        source.push_str(self.written);
    }
}

/// What [`short_rows`] writes a reduction's rows from.
struct ShortRows<'a> {
    /// Rows a group of `t` lanes takes at once, their loads made before any is used.
    rows: usize,
    t: usize,
    /// The row's length (at most `t * v`: one access a thread).
    row: usize,
    init: &'a str,
    combine: &'a dyn Fn(&str, &str) -> String,
    values: &'a AccessValues<'a>,
    /// The value reduced.
    reduced: &'a str,
    /// The reduction's output and its dtype, where the region outputs it.
    result: Option<(usize, DType)>,
}

/// The row loop of a trailing reduction over rows of one access a thread (the kernel has
/// declared `stride`, `rows`, `lane`, `first` and `lead`): each group of `t` lanes loads an
/// access of each of `rows` rows (`stride / t` apart, so that a warp's loads of one row cover
/// consecutive rows), then reduces them one by one.
fn short_rows(source: &mut String, s: &ShortRows<'_>) {
    let ShortRows { rows: g, t, row, init, values, .. } = *s;
    let v = values.v;
    let _ = writeln!(source, "  const long long groups = stride / {t};");
    let _ = writeln!(source, "  for (long long r0 = lead; r0 < rows; r0 += {g}ll * groups) {{");
    let _ = writeln!(source, "    const long long c = (long long)lane * {v};");
    values.declare(source, g);
    let _ = writeln!(source, "    #pragma unroll");
    let _ = writeln!(source, "    for (int q = 0; q < {g}; ++q) {{");
    let _ = writeln!(source, "      const long long r = r0 + (first - lead) + q * groups;");
    let _ = writeln!(source, "      if (r < rows && c < {row}ll) {{ const long long at = r * {row}ll + c;");
    values.load(source, "q");
    let _ = writeln!(source, "    }} }}");
    let _ = writeln!(source, "    #pragma unroll");
    let _ = writeln!(source, "    for (int q = 0; q < {g}; ++q) {{");
    let _ = writeln!(source, "      const long long r = r0 + (first - lead) + q * groups;");
    let _ = writeln!(source, "      float acc = {init};");
    let _ = writeln!(source, "      if (r < rows && c < {row}ll) {{ const long long at = r * {row}ll + c;");
    values.open_values(source, "q", true);
    let _ = writeln!(source, "      acc = {};", (s.combine)("acc", s.reduced));
    let _ = writeln!(source, "      }}\n      }}");
    super::row_kernels::row_reduce(source, t, s.combine);
    if let Some((o, dtype)) = s.result {
        let _ = writeln!(source, "      if (r < rows && lane == 0) out{o}[r] = {};", narrow(dtype, "acc"));
    }
    let _ = writeln!(source, "    }}\n  }}\n}}");
}

/// Threads per block of every generated kernel (the executors launch with it; the tiled
/// transpose below is written for it).
pub(crate) const BLOCK_THREADS: u32 = 256;
const TRANSPOSE_THREADS: usize = BLOCK_THREADS as usize;

/// A 2-D transpose of `[rows, cols]` through shared memory, a 32 x 32 tile per block of 256
/// threads: both the reads and the writes of each tile are whole rows of 32 floats, where the
/// element-wise form reads one of them a column at a time (measured on the H200: the two
/// 16384 x 4096 weight transposes of the transformer block took 0.96 ms that way).
fn matrix_transpose_source(name: &str, kernel: &str, rows: usize, cols: usize, dtype: DType) -> RegionSource {
    let element = element_type(dtype);
    let tiles = rows.div_ceil(32) * cols.div_ceil(32);
    let mut source = String::new();
    let _ = writeln!(source, "// Generated by boundscope for `{name}`: a tiled transpose of [{rows}, {cols}].");
    let _ = writeln!(
        source,
        "extern \"C\" __global__ void {kernel}(const {element}* __restrict__ in0, {element}* __restrict__ out0, long long n) {{"
    );
    let _ = writeln!(source, "  __shared__ {element} tile[32][33];");
    let _ =
        writeln!(source, "  const long long rows = {rows}ll, cols = {cols}ll, tile_cols = {}ll;", cols.div_ceil(32));
    let _ = writeln!(source, "  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;");
    let _ = writeln!(source, "  for (long long t = blockIdx.x; t < {tiles}ll; t += gridDim.x) {{");
    let _ = writeln!(source, "    const long long r0 = (t / tile_cols) * 32, c0 = (t % tile_cols) * 32;");
    let _ = writeln!(source, "    for (int k = ty; k < 32; k += {}) {{", TRANSPOSE_THREADS / 32);
    let _ = writeln!(source, "      const long long r = r0 + k, c = c0 + tx;");
    let _ = writeln!(source, "      if (r < rows && c < cols) tile[k][tx] = in0[r * cols + c];");
    let _ = writeln!(source, "    }}");
    let _ = writeln!(source, "    __syncthreads();");
    let _ = writeln!(source, "    for (int k = ty; k < 32; k += {}) {{", TRANSPOSE_THREADS / 32);
    let _ = writeln!(source, "      const long long c = c0 + k, r = r0 + tx;");
    let _ = writeln!(source, "      if (c < cols && r < rows) out0[c * rows + r] = tile[tx][k];");
    let _ = writeln!(source, "    }}");
    let _ = writeln!(source, "    __syncthreads();");
    let _ = writeln!(source, "  }}\n}}");
    RegionSource {
        kernel: kernel.to_string(),
        source,
        inputs: 1,
        outputs: 1,
        numel: rows * cols,
        vectorized: false,
        // A block per tile.
        threads: tiles * TRANSPOSE_THREADS,
        input_lengths: vec![packing::words(dtype, rows * cols)],
        output_lengths: vec![packing::words(dtype, rows * cols)],
        in_place: Vec::new(),
        cluster: 1,
    }
}

/// The C type of one element of `dtype` in a kernel: 16-bit values are moved as their bits.
pub(super) fn element_type(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 | DType::F16 => "unsigned short",
        DType::I64 => "long long",
        DType::I32 => "int",
        DType::F32 => "float",
    }
}

/// Generates the CUDA C of a shape op (`reshape`, `transpose`, `broadcast_to`): one thread per
/// output element, reading the input through the strides the op implies; a 2-D transpose goes
/// through shared memory a tile at a time instead.
///
/// # Errors
/// A message when `op` is not one of those built-ins, or does not fit its shape rule.
pub fn shape_op_source(op: &OpView<'_>, kernel: &str) -> Result<RegionSource, String> {
    let id = builtin_prim(op).ok_or(format!("`{}` is not a built-in prim", op.name()))?;
    crate::executors::cpu_reference::check_builtin(id, op)?;
    let input_shape = op.input_shape(0).map_err(|e| e.to_string())?;
    let shape = op.output_shape(0).map_err(|e| e.to_string())?;
    // A shape op moves values, whatever their dtype (the rule keeps it): 16-bit ones as bits.
    let dtype = op.dtype_of(op.bound_symbol().outputs()[0]);
    let element = element_type(dtype);
    if id == prims::TRANSPOSE && input_shape.len() == 2 && op.dims(1).map_err(|e| e.to_string())? == [1, 0] {
        return Ok(matrix_transpose_source(op.name(), kernel, input_shape[0], input_shape[1], dtype));
    }
    // A permutation that keeps the last axis moves whole rows of it: as 16-byte vectors where
    // the row is a whole number of them (attention's [b, t, h, d] -> [b, h, t, d]).
    let mut vector = 1;
    let mut element = element;
    let read = match id {
        prims::RESHAPE => "in0[i]".to_string(),
        prims::BROADCAST_TO => index_expression(0, shape, input_shape),
        prims::TRANSPOSE => {
            let permutation = op.dims(1).map_err(|e| e.to_string())?;
            let rank = input_shape.len();
            let per_vector = 16 / dtype.size_bytes();
            let row = input_shape.last().copied().unwrap_or(1);
            let (mut input_shape, mut shape) = (input_shape.to_vec(), shape.to_vec());
            if rank >= 2 && permutation.last() == Some(&(rank - 1)) && row % per_vector == 0 && row > 0 {
                vector = per_vector;
                element = "uint4";
                input_shape[rank - 1] /= per_vector;
                shape[rank - 1] /= per_vector;
            }
            let mut input_strides = vec![0usize; input_shape.len()];
            let mut inner = 1usize;
            for axis in (0..input_shape.len()).rev() {
                input_strides[axis] = inner;
                inner = inner.saturating_mul(input_shape[axis]);
            }
            let strides: Vec<usize> = permutation.iter().map(|&p| input_strides[p]).collect();
            format!("in0[{}]", strided_offset(&shape, &strides))
        }
        _ => return Err(format!("`{}` is not a shape op", op.name())),
    };
    let numel: usize = shape.iter().product::<usize>() / vector;
    let mut source = String::new();
    let _ = writeln!(source, "// Generated by boundscope for `{}`.", op.name());
    let _ = writeln!(
        source,
        "extern \"C\" __global__ void {kernel}(const {element}* __restrict__ in0, {element}* __restrict__ out0, long long n) {{"
    );
    let _ = writeln!(source, "  const long long stride = (long long)blockDim.x * gridDim.x;");
    let _ = writeln!(
        source,
        "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{"
    );
    let _ = writeln!(source, "    out0[i] = {read};");
    let _ = writeln!(source, "  }}\n}}");
    Ok(RegionSource {
        kernel: kernel.to_string(),
        source,
        inputs: 1,
        outputs: 1,
        numel,
        vectorized: vector > 1,
        threads: numel,
        input_lengths: vec![packing::words(dtype, input_shape.iter().product())],
        output_lengths: vec![packing::words(dtype, numel * vector)],
        in_place: Vec::new(),
        cluster: 1,
    })
}

fn generate(
    region: &OpView<'_>,
    ops: &[OpView<'_>],
    inputs: &[ValueId],
    outputs: &[ValueId],
    kernel: &str,
    variants: KernelVariants,
    target: RegionTarget,
) -> Result<RegionSource, String> {
    let l2_bytes = target.l2_bytes;
    // Every shape relation the generated kernel relies on, checked here: it indexes the
    // buffers the plan sizes from these shapes, and nothing on the device checks bounds.
    let shape = fused_shape(region, ops, inputs)?.to_vec();
    let is_reduction = |op: &OpView<'_>| matches!(builtin_prim(op), Some(prims::SUM | prims::MAX));
    // A trailing last-axis reduction: its op and the value it reduces.
    let reduction = match ops.split_last() {
        Some((last, rest)) if is_reduction(last) => {
            if rest.iter().any(is_reduction) {
                return Err("a reduction must be a region's last op".into());
            }
            let source = last.args().first().and_then(|a| a.value()).ok_or("a reduction without a tensor")?;
            Some((builtin_prim(last).unwrap_or(prims::SUM), source, last.bound_symbol().outputs()[0]))
        }
        _ => None,
    };
    let numel: usize = shape.iter().product();
    let mut input_shapes = Vec::new();
    for &v in inputs {
        input_shapes.push(region.shape_of(v).map_err(|e| e.to_string())?.to_vec());
    }
    let input_dtypes: Vec<DType> = inputs.iter().map(|&v| region.dtype_of(v)).collect();
    let output_dtypes: Vec<DType> = outputs.iter().map(|&v| region.dtype_of(v)).collect();
    // 16-bit values are packed two per device word (`core::plan::packing`).
    let wide = input_dtypes.iter().chain(&output_dtypes).any(|&d| packing::is_packed(d));
    // Lengths in device words, as the plan sizes the buffers.
    let input_lengths: Vec<usize> =
        input_shapes.iter().zip(&input_dtypes).map(|(s, &d)| packing::words(d, s.iter().product())).collect();
    let output_lengths = outputs
        .iter()
        .zip(&output_dtypes)
        .map(|(&v, &d)| region.shape_of(v).map(|s| packing::words(d, s.iter().product())).map_err(|e| e.to_string()))
        .collect::<Result<Vec<usize>, String>>()?;
    // Full-size streams: with the streaming hints (read or written once), unless they stay in L2.
    // (An input passed twice, as in `mul(x, x)`, counts twice: a kernel at the bound may be
    // taken for one past it, never the other way.)
    let (read, written) = (total_words(input_lengths.iter().copied()), total_words(output_lengths.iter().copied()));
    let words = read.saturating_add(written);
    let full_size = whole_tensors(variants, read, written, l2_bytes);
    // Elementwise regions move vectors: four `f32` values, or eight where any operand is 16-bit
    // (each 16-bit operand one 16-byte load or store). Inputs read whole, a vector an access;
    // a single value once; a broadcast input per vector where its rows hold whole vectors
    // (constant along the vector, or a contiguous part of one row), else per element (16-bit
    // kernels read straddled rows per vector all the same: see `wide_loop`). Values past the
    // last whole vector are the tail, an element a thread.
    let per_thread = if wide { 8 } else { 4 };
    let vectorized = !wide && reduction.is_none() && numel > 0;
    let wide_vectorized = wide && reduction.is_none() && numel > 0;
    let reads: Option<Vec<VectorRead>> = (vectorized || wide_vectorized)
        .then(|| input_shapes.iter().map(|s| vector_read(&shape, s, per_thread)).collect());
    let read_as_float = |k: usize, expression: String| widen(input_dtypes[k], &expression);

    // The loop body, in terms of `x{k}` (input values) and `t{id}` (op values).
    let elementwise_ops = if reduction.is_some() { &ops[..ops.len() - 1] } else { ops };
    let body = elementwise_body(elementwise_ops, inputs, &shape, &|v| v.index(), variants)?;
    let layout = match reduction {
        Some(_) => Some(ReductionLayout::of(&shape, &input_shapes, &input_dtypes, outputs.len(), variants, target)?),
        None => None,
    };
    let cluster = layout.as_ref().map_or(1, |l| l.cluster);

    let mut source = String::new();
    let _ = writeln!(source, "// Generated by boundscope for region `{}`.", region.name());
    // (A cast to 16 bits inside the region converts too.)
    if wide || body.contains("bs_to_") {
        source.push_str(HALF_CONVERSIONS);
    }
    if body.contains("bs_max(") || reduction.is_some_and(|(op, ..)| op == prims::MAX) {
        source.push_str(MAXIMUM);
    }
    if body.contains("bs_exp2(") {
        source.push_str(EXP2);
    }
    if cluster > 1 {
        source.push_str(super::row_kernels::CLUSTER_HELPERS);
    }
    // An update may be written over the input it updates, where the input is read whole (not
    // broadcast) in its own dtype, element by element before the output's element is written
    // (not past a trailing reduction, whose rows are read by several threads).
    let in_place: Vec<(usize, usize)> = if reduction.is_some() {
        Vec::new()
    } else {
        region
            .in_place_updates()
            .into_iter()
            .filter(|&(k, o)| input_shapes[k] == shape && input_dtypes[k] == output_dtypes[o])
            .collect()
    };
    let restrict = |written_over: bool| if written_over { "" } else { " __restrict__" };
    let mut params: Vec<String> = input_dtypes
        .iter()
        .enumerate()
        .map(|(k, &d)| format!("const {}*{} in{k}", element_type(d), restrict(in_place.iter().any(|&(i, _)| i == k))))
        .collect();
    params.extend(
        output_dtypes
            .iter()
            .enumerate()
            .map(|(o, &d)| format!("{}*{} out{o}", element_type(d), restrict(in_place.iter().any(|&(_, j)| j == o)))),
    );
    params.push("long long n".into());
    let cluster_dims = if cluster > 1 { format!("__cluster_dims__({cluster}, 1, 1) ") } else { String::new() };
    let _ = writeln!(source, "extern \"C\" __global__ void {cluster_dims}{kernel}({}) {{", params.join(", "));
    let _ = writeln!(source, "  const long long stride = (long long)blockDim.x * gridDim.x;");
    let value_name = |v: ValueId| match inputs.iter().position(|&x| x == v) {
        Some(k) => format!("x{k}"),
        None => format!("t{}", v.index()),
    };
    if let (Some((op, reduced, result)), Some(layout)) = (reduction, &layout) {
        // `t` threads per row (a few for short rows, a warp, up to the block for long ones, or
        // a cluster of blocks): each runs the elementwise ops over every `t`-th access of `v`
        // values of the row (of the block's slice of it) and accumulates, then the row's
        // threads combine with shuffles (and, past a warp, through shared memory; past a block,
        // through distributed shared memory). (The summation order differs from the CPU's
        // sequential one, by rounding.)
        let ReductionLayout { row, rows, v, aligned, accesses, t, group_rows, loads, cluster, .. } = *layout;
        let full = &layout.full;
        // The tensor's values in whole accesses (the aligned path reads the rest one by one).
        let whole = numel - numel % v;
        // The loop runs alike in the whole warp (the whole block, past a warp), so that every
        // lane takes part in each shuffle and barrier.
        let uniform = if t <= 32 { 32 } else { BLOCK_THREADS as usize };
        if t > 32 {
            let _ = writeln!(source, "  __shared__ float partial[{}];", BLOCK_THREADS / 32);
        }
        let init = if op == prims::SUM { "0.0f" } else { "__int_as_float(0xff800000)" };
        let combine = |a: &str, b: &str| if op == prims::SUM { format!("{a} + {b}") } else { maximum(a, b) };
        let _ = writeln!(source, "  const long long rows = {rows}ll;");
        let _ = writeln!(source, "  const int lane = threadIdx.x % {t};");
        if cluster == 1 {
            let _ =
                writeln!(source, "  const long long first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / {t};");
            let _ = writeln!(source, "  const long long lead = first - (threadIdx.x % {uniform}) / {t};");
        }
        let reduction_source = |source: String| RegionSource {
            kernel: kernel.to_string(),
            source,
            inputs: inputs.len(),
            outputs: outputs.len(),
            numel,
            vectorized: false,
            // `t` threads per `group_rows` rows (or `cluster` blocks a row); the launch rounds up
            // to blocks of 256 threads.
            threads: rows.div_ceil(group_rows) * t * cluster,
            input_lengths,
            output_lengths,
            in_place: Vec::new(),
            cluster,
        };
        // The C that writes the region's other outputs at `i` (the reduction's input, say).
        let written: String = outputs
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != result)
            .map(|(o, v)| format!("    out{o}[i] = {};\n", narrow(output_dtypes[o], &format!("t{}", v.index()))))
            .collect();
        let read = |k: usize| read_as_float(k, index_expression(k, &shape, &input_shapes[k]));
        let values = AccessValues {
            v,
            full,
            input_dtypes: &input_dtypes,
            read: &read,
            body: &body,
            written: &written,
            // Inputs read whole are read once, by one row's threads (but for the access two rows
            // share where accesses are aligned to the tensor, which both read: two a row).
            caching: if variants.streaming_rows { full_size } else { Caching::Kept },
        };
        if group_rows > 1 {
            short_rows(
                &mut source,
                &ShortRows {
                    rows: group_rows,
                    t,
                    row,
                    init,
                    combine: &combine,
                    values: &values,
                    reduced: &value_name(reduced),
                    result: outputs.iter().position(|&v| v == result).map(|o| (o, output_dtypes[o])),
                },
            );
            return Ok(reduction_source(source));
        }
        if cluster > 1 {
            // A cluster a row (each of its blocks runs each of the row's cluster barriers), and
            // the block's slice of it by its rank: `chunk` values from `lo`, whole accesses.
            let _ = writeln!(source, "  __shared__ float bs_cluster_part[2];");
            let _ = writeln!(source, "  const unsigned slice = bs_cluster_rank();");
            let _ = writeln!(
                source,
                "  for (long long r = blockIdx.x / {cluster}; r < rows; r += gridDim.x / {cluster}) {{"
            );
        } else {
            let _ = writeln!(source, "  for (long long r0 = lead; r0 < rows; r0 += stride / {t}) {{");
            let _ = writeln!(source, "    const long long r = r0 + (first - lead);");
        }
        let chunk = accesses.div_ceil(cluster) * v;
        // What only the first block of a row's cluster does (the row's tail, its result).
        let first_block = if cluster > 1 { " && slice == 0" } else { "" };
        let _ = writeln!(source, "    float acc = {init};");
        let _ = writeln!(source, "    if (r < rows) {{");
        // One accumulator per value of an access: `v` independent chains of additions (or
        // comparisons), not one as long as the thread's part of the row. (A row of 50,257 f32
        // values over 333 rows ran its maximum at 0.74x PyTorch eager with one.)
        let _ = writeln!(source, "    float accs[{v}];");
        let _ = writeln!(source, "    #pragma unroll");
        let _ = writeln!(source, "    for (int e = 0; e < {v}; ++e) accs[e] = {init};");
        // (`loads` accesses of each input a thread in flight at once: see `ReductionLayout`.)
        let step = t * v;
        // `next` opens access `u` of a batch (where it is in the row); `at` is its element in
        // the tensor.
        let (next, at) = if aligned {
            // `o` walks the row from the access that holds its first value (aligned to the
            // tensor), up to the tensor's last whole access (the values past it, fewer than `v`,
            // are the last row's, read one by one below): no access is cut short. Offsets `o`
            // from the row's first value are 32-bit (rows shorter than 2^30 take this path, so
            // that `o` never overflows), which keeps the per-value test of the row's bounds cheap.
            let _ = writeln!(source, "    const long long start = r * {row}ll, end = start + {row}ll;");
            let _ = writeln!(source, "    const int stop = (int)((end < {whole}ll ? end : {whole}ll) - start);");
            if cluster > 1 {
                let _ = writeln!(source, "    const int lo = (int)slice * {chunk} - (int)(start % {v});");
                let _ = writeln!(source, "    const int hi = lo + {chunk} < stop ? lo + {chunk} : stop;");
                let _ = writeln!(source, "    for (int o0 = lo + lane * {v}; o0 < hi; o0 += {}) {{", loads * step);
                (format!("const int o = o0 + u * {step}; if (o < hi)"), "start + o".to_string())
            } else {
                let _ = writeln!(
                    source,
                    "    for (int o0 = lane * {v} - (int)(start % {v}); o0 < stop; o0 += {}) {{",
                    loads * step
                );
                (format!("const int o = o0 + u * {step}; if (o < stop)"), "start + o".to_string())
            }
        } else if cluster > 1 {
            let _ = writeln!(source, "    const long long lo = (long long)slice * {chunk}ll;");
            let _ = writeln!(source, "    const long long hi = lo + {chunk}ll < {row}ll ? lo + {chunk}ll : {row}ll;");
            let _ = writeln!(source, "    for (long long c0 = lo + lane * {v}; c0 < hi; c0 += {}ll) {{", loads * step);
            (format!("const long long c = c0 + (long long)u * {step}; if (c < hi)"), format!("r * {row}ll + c"))
        } else {
            let _ = writeln!(source, "    for (long long c0 = lane * {v}; c0 < {row}ll; c0 += {}ll) {{", loads * step);
            (format!("const long long c = c0 + (long long)u * {step}; if (c < {row}ll)"), format!("r * {row}ll + c"))
        };
        values.declare(&mut source, loads);
        let _ = writeln!(source, "    #pragma unroll");
        let _ = writeln!(source, "    for (int u = 0; u < {loads}; ++u) {{ {next} {{ const long long at = {at};");
        values.load(&mut source, "u");
        let _ = writeln!(source, "    }} }}");
        let _ = writeln!(source, "    #pragma unroll");
        let _ = writeln!(source, "    for (int u = 0; u < {loads}; ++u) {{ {next} {{ const long long at = {at};");
        // (The index of broadcast reads and of outputs written per value; the aligned path has
        // neither.)
        values.open_values(&mut source, "u", !aligned);
        let guard = if aligned { format!("if (o + e >= 0 && o + e < {row}) ") } else { String::new() };
        let _ = writeln!(source, "    {guard}accs[e] = {};", combine("accs[e]", &value_name(reduced)));
        let _ = writeln!(source, "    }}\n    }} }}\n    }}");
        let _ = writeln!(source, "    #pragma unroll");
        let _ = writeln!(source, "    for (int e = 0; e < {v}; ++e) acc = {};", combine("acc", "accs[e]"));
        if aligned && whole < numel {
            let _ = writeln!(
                source,
                "    if (lane == 0{first_block}) for (long long i = start > {whole}ll ? start : {whole}ll; i < end; ++i) {{"
            );
            for k in 0..inputs.len() {
                let _ = writeln!(source, "    const float x{k} = {};", read_as_float(k, format!("in{k}[i]")));
            }
            source.push_str(&body);
            let _ = writeln!(source, "    acc = {};", combine("acc", &value_name(reduced)));
            let _ = writeln!(source, "    }}");
        }
        let _ = writeln!(source, "    }}");
        super::row_kernels::row_reduce(&mut source, t, &combine);
        if cluster > 1 {
            super::row_kernels::cluster_reduce(&mut source, cluster, &combine);
        }
        if let Some(o) = outputs.iter().position(|&v| v == result) {
            let _ = writeln!(
                source,
                "    if (r < rows && lane == 0{first_block}) out{o}[r] = {};",
                narrow(output_dtypes[o], "acc")
            );
        }
        let _ = writeln!(source, "  }}\n}}");
        return Ok(reduction_source(source));
    }
    // Loops the kernel opened (closed below), and rows per thread of a vectorized kernel.
    let mut loops = 1;
    // (16-bit kernels only: `f32` ones run at a copy's speed with a row per thread, and
    // measured 2-7% slower with 4 or 16 on the H200, where 16-bit ones gained 3-16%.)
    let rows = match &reads {
        Some(reads) if wide_vectorized => rows_per_thread(&shape, &input_shapes, reads, per_thread),
        _ => 1,
    };
    if wide_vectorized {
        let reads = reads.unwrap_or_default();
        // Batches only where the tensors are read from memory: within L2 batching measured no
        // faster (0.98-1.00x, the noise), so those keep the smaller kernel (45 registers, not 78).
        let batch = if variants.batched_rows && !fit_in_l2(words, l2_bytes, (1, 1)) {
            batch_rows(rows, &reads, &input_dtypes)
        } else {
            1
        };
        let operands =
            WideOperands { reads: &reads, shape: &shape, input_shapes: &input_shapes, whole: full_size, batch };
        loops = wide_loop(&mut source, &body, &operands, rows, &input_dtypes, &output_dtypes, outputs);
    } else if vectorized {
        // (A row a thread: `rows` is 1 for `f32` kernels.)
        let reads = reads.unwrap_or_default();
        open_vector_loop(&mut source, &shape, 4, 1, "", &RowBatch::NONE);
        if reads.iter().any(|r| !matches!(r, VectorRead::Vector | VectorRead::Scalar)) {
            let _ = writeln!(source, "    const long long i = 4ll * j;");
        }
        for (k, (s, read)) in input_shapes.iter().zip(&reads).enumerate() {
            let offset = || offset_expression(&shape, s);
            let _ = match read {
                VectorRead::Vector => {
                    writeln!(
                        source,
                        "    const float4 v{k} = {};",
                        full_size.load(&format!("reinterpret_cast<const float4*>(in{k}) + j"))
                    )
                }
                VectorRead::Scalar => writeln!(source, "    const float s{k} = in{k}[0];"),
                VectorRead::PerVector => writeln!(source, "    const float s{k} = in{k}[{}];", offset()),
                VectorRead::PerVectorFloat4 => {
                    writeln!(source, "    const float4 v{k} = *reinterpret_cast<const float4*>(in{k} + {});", offset())
                }
                VectorRead::PerLane => Ok(()),
            };
        }
        for o in 0..outputs.len() {
            let _ = writeln!(source, "    float4 r{o};");
        }
        for (l, lane) in ["x", "y", "z", "w"].into_iter().enumerate() {
            let _ = writeln!(source, "    {{");
            for (k, read) in reads.iter().enumerate() {
                let read = match read {
                    VectorRead::Vector | VectorRead::PerVectorFloat4 => format!("v{k}.{lane}"),
                    VectorRead::Scalar | VectorRead::PerVector => format!("s{k}"),
                    VectorRead::PerLane => lane_read(k, &shape, &input_shapes[k], &format!("(i + {l})")),
                };
                let _ = writeln!(source, "    const float x{k} = {read};");
            }
            source.push_str(&body);
            for (o, v) in outputs.iter().enumerate() {
                let _ = writeln!(source, "    r{o}.{lane} = t{};", v.index());
            }
            let _ = writeln!(source, "    }}");
        }
        for o in 0..outputs.len() {
            let _ = writeln!(
                source,
                "    {}",
                full_size.store(&format!("reinterpret_cast<float4*>(out{o}) + j"), &format!("r{o}"))
            );
        }
    }
    for _ in 1..loops {
        let _ = writeln!(source, "    }}");
    }
    // The tail (or every element, in a kernel of no vectors: one of no elements).
    let tail = numel % per_thread;
    if tail > 0 || !(vectorized || wide_vectorized) {
        if vectorized || wide_vectorized {
            let _ = writeln!(source, "  }}");
        }
        let start = if vectorized || wide_vectorized { numel - tail } else { 0 };
        let _ = writeln!(
            source,
            "  for (long long i = {start}ll + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{"
        );
        for (k, s) in input_shapes.iter().enumerate() {
            let _ = writeln!(source, "    const float x{k} = {};", read_as_float(k, index_expression(k, &shape, s)));
        }
        source.push_str(&body);
        for (o, v) in outputs.iter().enumerate() {
            let _ = writeln!(source, "    out{o}[i] = {};", narrow(output_dtypes[o], &format!("t{}", v.index())));
        }
    }
    let _ = writeln!(source, "  }}\n}}");
    let threads = (numel / per_thread / rows).max(tail).max(1);
    Ok(RegionSource {
        kernel: kernel.to_string(),
        source,
        inputs: inputs.len(),
        outputs: outputs.len(),
        numel,
        vectorized: vectorized || wide_vectorized,
        threads,
        input_lengths,
        output_lengths,
        in_place,
        cluster: 1,
    })
}

/// The loop body of elementwise `ops` over `shape`: one `const float t<n> = ...;` line per
/// op, in terms of `x{k}` for `inputs[k]` and `t<n>` for a value `v` the ops define, `n` being
/// `number(v)`.
pub(super) fn elementwise_body(
    ops: &[OpView<'_>],
    inputs: &[ValueId],
    shape: &[usize],
    number: &dyn Fn(ValueId) -> usize,
    variants: KernelVariants,
) -> Result<String, String> {
    let mut body = String::new();
    for op in ops {
        let id = builtin_prim(op).ok_or(format!("`{}` is not a built-in prim", op.name()))?;
        let operand = |arg: &Arg<'_>| -> Result<String, String> {
            Ok(match *arg {
                Arg::Scalar(s) => literal(s),
                Arg::Value(v) => match inputs.iter().position(|&x| x == v) {
                    Some(k) => format!("x{k}"),
                    None => format!("t{}", number(v)),
                },
                Arg::Dims(_) => return Err(format!("`{}` takes dimensions; only elementwise ops fuse", op.name())),
                Arg::DType(_) => return Err(format!("`{}` takes a dtype; only elementwise ops fuse", op.name())),
            })
        };
        if op.output_shape(0).map_err(|e| e.to_string())? != shape {
            return Err(format!("`{}` does not have the region's shape", op.name()));
        }
        let a = operand(&op.args()[0])?;
        // `cast`'s second argument is its dtype: to 16 bits it rounds (an output's store rounds
        // the same way again, which changes nothing); to `f32` it is the value read.
        let b = if id == prims::CAST { None } else { op.args().get(1).map(operand).transpose()? };
        let value = op.bound_symbol().outputs()[0];
        let to_16_bits = packing::is_packed(op.dtype_of(value));
        let expression = apply(id, &a, b.as_deref(), to_16_bits, variants)
            .ok_or(format!("`{}` cannot be fused on CUDA", op.name()))?;
        let expression = match op.dtype_of(value) {
            d if id == prims::CAST && packing::is_packed(d) => widen(d, &narrow(d, &expression)),
            _ => expression,
        };
        let _ = writeln!(body, "    const float t{} = {expression};", number(value));
    }
    Ok(body)
}

/// Conversions between `float` and the 16-bit dtypes' bits, without NVRTC's headers: bf16 is
/// `float`'s upper half, rounded to nearest even by PTX's `cvt` on GPUs that have it (compute
/// capability 8.0 and newer: one instruction, where rounding by hand took six and made bf16
/// kernels compute-bound) and by hand before (NaN kept quiet, as the `half` crate does; `cvt`
/// gives the canonical NaN); f16 goes through PTX's `cvt` (round to nearest even; overflow to
/// infinity).
pub(super) const HALF_CONVERSIONS: &str = r#"__device__ __forceinline__ float bs_from_bf16(unsigned int h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ unsigned int bs_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  unsigned short s; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(s) : "f"(f)); return (unsigned int)s;
#else
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
#endif
}
__device__ __forceinline__ float bs_from_f16(unsigned int h) { float f; unsigned short s = (unsigned short)h; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s)); return f; }
__device__ __forceinline__ unsigned int bs_to_f16(float f) { unsigned short s; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(s) : "f"(f)); return (unsigned int)s; }
"#;

/// A value of `dtype` read as `float` (`expression` is its element: bits for 16-bit dtypes).
pub(super) fn widen(dtype: DType, expression: &str) -> String {
    match dtype {
        DType::BF16 => format!("bs_from_bf16({expression})"),
        DType::F16 => format!("bs_from_f16({expression})"),
        _ => expression.to_string(),
    }
}

/// A `float` as an element of `dtype` (its bits for 16-bit dtypes).
pub(super) fn narrow(dtype: DType, expression: &str) -> String {
    match dtype {
        DType::BF16 => format!("(unsigned short)bs_to_bf16({expression})"),
        DType::F16 => format!("(unsigned short)bs_to_f16({expression})"),
        _ => expression.to_string(),
    }
}

/// How the inputs of a region with 16-bit operands are read (see [`wide_loop`]).
struct WideOperands<'w> {
    reads: &'w [VectorRead],
    shape: &'w [usize],
    input_shapes: &'w [Vec<usize>],
    /// How inputs read whole and outputs move ([`whole_tensors`]).
    whole: Caching,
    /// Rows of a group of rows per thread whose loads of inputs read whole go first, together
    /// ([`batch_rows`]; 1: each row's as it comes).
    batch: usize,
}

/// The loads that a kernel of several rows per thread makes for a batch of its rows before
/// computing any ([`KernelVariants::batched_rows`]), as C.
struct RowBatch {
    /// Rows a batch (1: no batches).
    rows: usize,
    /// The arrays the loads fill, a place per row of the batch.
    declarations: String,
    /// The loads of the batch's row `q`, whose first element is `i`.
    loads: String,
}

impl RowBatch {
    const NONE: Self = Self { rows: 1, declarations: String::new(), loads: String::new() };
}

/// Accesses a thread of a batched kernel makes at once, at most ([`batch_rows`]).
const BATCHED_ACCESSES: usize = 8;

/// Rows of a group of `rows` (a power of two) per batch: the most whose loads of the inputs
/// read whole (an access for each of [`batch_arrays`]: one `uint4` of a 16-bit input, two
/// `float4`s of an `f32` one) make at most [`BATCHED_ACCESSES`]; 1 where there is no group or
/// no such input.
fn batch_rows(rows: usize, reads: &[VectorRead], input_dtypes: &[DType]) -> usize {
    let accesses: usize = reads
        .iter()
        .zip(input_dtypes)
        .enumerate()
        .filter(|(_, (read, _))| matches!(read, VectorRead::Vector))
        .map(|(k, (_, &dtype))| batch_arrays(k, dtype).0.len())
        .sum();
    if rows <= 1 || accesses == 0 {
        return 1;
    }
    let mut batch = rows;
    while batch > 1 && batch * accesses > BATCHED_ACCESSES {
        batch /= 2;
    }
    batch
}

/// The loop of a region with 16-bit operands: vector `j` is elements `8j..8j + 8` (one a turn
/// per thread, or one per row of a group of `rows`), each 16-bit input read as one 16-byte
/// `uint4` (an `f32` one as two `float4`s; a single value, or a value constant along the
/// eight, once; a broadcast whose rows the vectors straddle per vector where it is constant
/// along rows or a 16-bit row, else per element), `body` run per
/// element in `float` registers, each output written the same way, with streaming cache hints.
/// Broadcast rows read per vector as `PerVector` or `PerVectorFloat4` are read at their offset
/// (the caller checks that rows hold whole vectors); a row broadcast along the last axis once
/// per group of rows. Returns the loops it opened.
fn wide_loop(
    source: &mut String,
    body: &str,
    operands: &WideOperands<'_>,
    rows: usize,
    input_dtypes: &[DType],
    output_dtypes: &[DType],
    outputs: &[ValueId],
) -> usize {
    let WideOperands { reads, shape, input_shapes, whole, batch } = *operands;
    let held = |k: usize| rows > 1 && held_row(shape, input_shapes, reads, k);
    let mut held_reads = String::new();
    for k in (0..reads.len()).filter(|&k| held(k)) {
        wide_load(&mut held_reads, k, input_dtypes[k], Caching::Kept, "8ll * c");
    }
    // Inputs read whole, loaded a batch of rows ahead where rows are batched.
    let batched = |k: usize| batch > 1 && matches!(reads[k], VectorRead::Vector);
    let mut row_batch = RowBatch::NONE;
    if batch > 1 {
        row_batch.rows = batch;
        for k in (0..reads.len()).filter(|&k| batched(k)) {
            let (arrays, ty) = batch_arrays(k, input_dtypes[k]);
            let declared: Vec<String> = arrays.iter().map(|a| format!("{a}[{batch}]")).collect();
            let _ = writeln!(row_batch.declarations, "    {ty} {};", declared.join(", "));
            for (array, read) in arrays.iter().zip(wide_reads(k, input_dtypes[k], whole, "i")) {
                let _ = writeln!(row_batch.loads, "    {array}[q] = {read};");
            }
        }
    }
    let loops = open_vector_loop(source, shape, 8, rows, &held_reads, &row_batch);
    let _ = writeln!(source, "    const long long i = 8ll * j;");
    // Broadcast rows the vectors straddle (rows of a length 8 does not divide, at least 8: a
    // vector holds the end of one row and the start of the next at most), read per vector,
    // not per value: a value constant along each row as two values, a 16-bit row vector with
    // two aligned accesses and a shift (a value at a time where the vector straddles two rows,
    // or where the second access would pass the operand's end). Per value, each took a
    // division and a load (GPT-2's rows of 50,257 words ran at 64% of a copy's speed).
    let row = shape.last().copied().unwrap_or(0);
    let straddled: Vec<Option<BroadcastRead>> = (0..reads.len())
        .map(|k| match (&reads[k], broadcast_read(&input_shapes[k], shape)) {
            (VectorRead::PerLane, BroadcastRead::RowConstant) if row >= 8 => Some(BroadcastRead::RowConstant),
            (VectorRead::PerLane, BroadcastRead::RowVector) if row >= 8 && packing::is_packed(input_dtypes[k]) => {
                Some(BroadcastRead::RowVector)
            }
            _ => None,
        })
        .collect();
    if straddled.iter().any(Option::is_some) {
        // The column of the vector's first value: its offset through strides 1 along the last
        // axis and 0 elsewhere.
        let last_axis: Vec<usize> = (0..shape.len()).map(|a| usize::from(a + 1 == shape.len())).collect();
        let column = strided_offset_of(shape, &last_axis, "i");
        // How many of the vector's values lie in the row of its first.
        let _ = writeln!(source, "    const long long left = {row}ll - {column};");
    }
    for (k, read) in straddled.iter().enumerate() {
        let dtype = input_dtypes[k];
        let strides = broadcast_strides(&input_shapes[k], shape);
        let at = |index: &str| format!("in{k}[{}]", strided_offset_of(shape, &strides, index));
        match read {
            Some(BroadcastRead::RowConstant) => {
                let _ = writeln!(source, "    const float s{k} = {};", widen(dtype, &at("i")));
                let _ = writeln!(source, "    const float z{k} = left < 8 ? {} : s{k};", widen(dtype, &at("(i + 7)")));
            }
            Some(_) => {
                let len: usize = input_shapes[k].iter().product();
                let _ = writeln!(source, "    unsigned int w{k}[4];");
                let _ = writeln!(source, "    {{ const long long o = {};", strided_offset_of(shape, &strides, "i"));
                let _ = writeln!(
                    source,
                    "    if (left >= 8 && {}) {{ uint4 q;",
                    super::row_kernels::shifted_within(8, "o", &format!("{len}ll"))
                );
                let _ = writeln!(
                    source,
                    "    {}",
                    super::row_kernels::load_shifted(dtype, 8, &format!("in{k}"), "o", "long long", "q")
                );
                let _ = writeln!(source, "    w{k}[0] = q.x; w{k}[1] = q.y; w{k}[2] = q.z; w{k}[3] = q.w;");
                let _ = writeln!(source, "    }} else {{");
                for w in 0..4 {
                    let _ = writeln!(
                        source,
                        "    w{k}[{w}] = (unsigned int){} | ((unsigned int){} << 16);",
                        at(&format!("(i + {})", 2 * w)),
                        at(&format!("(i + {})", 2 * w + 1))
                    );
                }
                let _ = writeln!(source, "    }} }}");
            }
            None => {}
        }
    }
    for (k, (read, &dtype)) in
        reads.iter().zip(input_dtypes).enumerate().filter(|&(k, _)| !held(k) && straddled[k].is_none())
    {
        let offset = || offset_expression(shape, &input_shapes[k]);
        let (read_whole, at) = match read {
            VectorRead::Scalar => {
                let _ = writeln!(source, "    const float s{k} = {};", widen(dtype, &format!("in{k}[0]")));
                continue;
            }
            VectorRead::PerVector => {
                let _ = writeln!(source, "    const float s{k} = {};", widen(dtype, &format!("in{k}[{}]", offset())));
                continue;
            }
            VectorRead::Vector => (true, "i".to_string()),
            VectorRead::PerVectorFloat4 => (false, offset()),
            VectorRead::PerLane => continue,
        };
        if batched(k) {
            let row: Vec<String> = batch_arrays(k, dtype).0.iter().map(|a| format!("{a}[q]")).collect();
            unpack_wide(source, k, dtype, &row);
        } else {
            wide_load(source, k, dtype, if read_whole { whole } else { Caching::Kept }, &at);
        }
    }
    for o in 0..outputs.len() {
        let _ = writeln!(source, "    float r{o}[8];");
    }
    let _ = writeln!(source, "    #pragma unroll");
    let _ = writeln!(source, "    for (int l = 0; l < 8; ++l) {{");
    for (k, (read, &dtype)) in reads.iter().zip(input_dtypes).enumerate() {
        let value = match (read, packing::is_packed(dtype)) {
            _ if matches!(straddled[k], Some(BroadcastRead::RowConstant)) => format!("(l < left ? s{k} : z{k})"),
            (VectorRead::Scalar | VectorRead::PerVector, _) => format!("s{k}"),
            // (A straddled 16-bit row is in `w{k}`, as a vector read whole: the arm below.)
            (VectorRead::PerLane, _) if straddled[k].is_none() => {
                widen(dtype, &lane_read(k, shape, &input_shapes[k], "(i + l)"))
            }
            (_, true) => widen(dtype, &format!("(w{k}[l / 2] >> (16 * (l % 2)))")),
            (_, false) => format!("f{k}[l]"),
        };
        let _ = writeln!(source, "    const float x{k} = {value};");
    }
    source.push_str(body);
    for (o, v) in outputs.iter().enumerate() {
        let _ = writeln!(source, "    r{o}[l] = t{};", v.index());
    }
    let _ = writeln!(source, "    }}");
    for (o, &dtype) in output_dtypes.iter().enumerate() {
        if packing::is_packed(dtype) {
            let half = |l: usize| narrow(dtype, &format!("r{o}[{l}]")).replace("(unsigned short)", "");
            let word = |w: usize| format!("({} | ({} << 16))", half(2 * w), half(2 * w + 1));
            let words = format!("make_uint4({}, {}, {}, {})", word(0), word(1), word(2), word(3));
            let _ = writeln!(source, "    {}", whole.write("uint4", &format!("out{o} + i"), &words));
        } else {
            for (at, first) in [("i", 0), ("i + 4", 4)] {
                let values = format!(
                    "make_float4(r{o}[{first}], r{o}[{}], r{o}[{}], r{o}[{}])",
                    first + 1,
                    first + 2,
                    first + 3
                );
                let _ = writeln!(source, "    {}", whole.write("float4", &format!("out{o} + {at}"), &values));
            }
        }
    }
    loops
}

/// Eight values of input `k` from element `at` on, into `w{k}` (16-bit: four words) or `f{k}`
/// (`f32`), read with `caching`: whole inputs are read once, with a streaming hint (unless
/// they stay in L2: [`whole_tensors`]); broadcast rows are read again (by every row, or every
/// group of rows) and stay cached.
fn wide_load(source: &mut String, k: usize, dtype: DType, caching: Caching, at: &str) {
    unpack_wide(source, k, dtype, &wide_reads(k, dtype, caching, at));
}

/// The accesses that read input `k`'s eight values from element `at` on with `caching`, as C:
/// one `uint4` of a 16-bit input, two `float4`s (the first four values, then the next) of an
/// `f32` one.
fn wide_reads(k: usize, dtype: DType, caching: Caching, at: &str) -> Vec<String> {
    let read = |ty: &str, at: &str| caching.read(ty, &format!("in{k} + {at}"));
    if packing::is_packed(dtype) {
        vec![read("uint4", at)]
    } else {
        vec![read("float4", at), read("float4", &format!("{at} + 4"))]
    }
}

/// The arrays a batch of rows ([`RowBatch`]) keeps input `k`'s accesses in, one per access of
/// [`wide_reads`], and their element type.
fn batch_arrays(k: usize, dtype: DType) -> (Vec<String>, &'static str) {
    if packing::is_packed(dtype) {
        (vec![format!("p{k}")], "uint4")
    } else {
        (vec![format!("pa{k}"), format!("pb{k}")], "float4")
    }
}

/// Eight values of input `k` into `w{k}` (16-bit: four words) or `f{k}` (`f32`), from
/// `accesses`, the C of [`wide_reads`]'s accesses (or of where a batch keeps them).
fn unpack_wide(source: &mut String, k: usize, dtype: DType, accesses: &[String]) {
    if packing::is_packed(dtype) {
        let _ = writeln!(source, "    const uint4 u{k} = {};", accesses[0]);
        let _ = writeln!(source, "    const unsigned int w{k}[4] = {{u{k}.x, u{k}.y, u{k}.z, u{k}.w}};");
    } else {
        let _ = writeln!(source, "    const float4 a{k} = {};", accesses[0]);
        let _ = writeln!(source, "    const float4 b{k} = {};", accesses[1]);
        let _ = writeln!(
            source,
            "    const float f{k}[8] = {{a{k}.x, a{k}.y, a{k}.z, a{k}.w, b{k}.x, b{k}.y, b{k}.z, b{k}.w}};"
        );
    }
}

/// A GPU of `l2_bytes` of L2 cache (0 where unknown), of unknown SM count: no row is split.
#[cfg(test)]
fn with_l2(l2_bytes: usize) -> RegionTarget {
    RegionTarget { l2_bytes, ..RegionTarget::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};
    use crate::core::passes::{FuseRegions, Pass};
    use crate::executors::CpuFusion;

    /// Fuses the trace `build` makes and generates the source of its first region, without
    /// kernel variants (each variant's own test shows what it changes; the GPU tests run the
    /// defaults).
    fn generate(build: impl FnOnce(&mut TraceBuilder<'_>)) -> RegionSource {
        generate_with(build, KernelVariants::NONE)
    }

    /// [`generate`], of `variants`.
    fn generate_with(build: impl FnOnce(&mut TraceBuilder<'_>), variants: KernelVariants) -> RegionSource {
        generate_for_l2(build, variants, 0)
    }

    /// [`generate_with`] for a GPU of `l2_bytes` of L2 cache.
    fn generate_for_l2(
        build: impl FnOnce(&mut TraceBuilder<'_>),
        variants: KernelVariants,
        l2_bytes: usize,
    ) -> RegionSource {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        build(&mut b);
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
        let region = OpView::new(&fused, &fused.bound_symbols()[0]).unwrap();
        region_source_for(&region, "region0", variants, with_l2(l2_bytes)).unwrap()
    }

    #[test]
    fn fast_exp2_takes_16_bit_sigmoid_and_gelu_in_one_instruction() {
        use crate::core::ir::TensorMeta;
        let chain = |dtype: DType, variants: KernelVariants| {
            generate_with(
                |b| {
                    let x = b.input_with(&TensorMeta::new(dtype, &[64, 1001])).unwrap();
                    let s = b.sigmoid(x).unwrap();
                    let g = b.gelu(s).unwrap();
                    let e = b.exp(g).unwrap();
                    b.output(e).unwrap();
                },
                variants,
            )
            .source
        };
        let fast = KernelVariants { fast_exp2: true, ..KernelVariants::NONE };
        assert_eq!(chain(DType::F32, fast), chain(DType::F32, KernelVariants::NONE), "f32 has no exp2");
        for dtype in [DType::BF16, DType::F16] {
            let (without, s) = (chain(dtype, KernelVariants::NONE), chain(dtype, fast));
            assert!(!without.contains("bs_exp2") && without.matches("1.0f + exp2f(").count() >= 2, "{without}");
            assert!(s.contains(EXP2), "{s}");
            assert!(s.contains("__fdividef(1.0f, 1.0f + bs_exp2(x0 * -1.44269504f))"), "sigmoid: {s}");
            assert!(s.contains("1.0f + bs_exp2(-2.30220819f * "), "gelu: {s}");
            // `exp`'s own results reach bf16's subnormals: it keeps `exp2f`.
            assert!(s.contains("exp2f(t2 * 1.44269504f)"), "exp: {s}");
            super::super::compiles_with_nvrtc(&s);
        }
    }

    #[test]
    fn updates_may_be_written_over_the_inputs_they_update() {
        // An optimizer's step: w and the moment m updated in place, from g; a broadcast scale s.
        let generated = generate(|b| {
            let (w, m, g) = (b.input(&[64, 16]).unwrap(), b.input(&[64, 16]).unwrap(), b.input(&[64, 16]).unwrap());
            let s = b.input(&[16]).unwrap();
            let m2 = b.mul(m, s).unwrap();
            let m2 = b.add(m2, g).unwrap();
            let step = b.mul_scalar(m2, 0.1).unwrap();
            let w2 = b.sub(w, step).unwrap();
            b.update(w, w2).unwrap();
            b.update(m, m2).unwrap();
        });
        let src = &generated.source;
        // Region inputs in order of first use: m, s, g, w; outputs m2, w2 in the trace's order.
        let mut pairs = generated.in_place.clone();
        pairs.sort_unstable();
        assert_eq!(pairs, vec![(0, 0), (3, 1)], "{src}");
        for param in ["const float* in0", "const float* in3", "float* out0", "float* out1"] {
            assert!(src.contains(param), "{param} may alias: {src}");
        }
        assert!(
            src.contains("const float* __restrict__ in1") && src.contains("const float* __restrict__ in2"),
            "{src}"
        );
        // Nothing to write over without updates.
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[64, 16]).unwrap();
        let y = b.exp(x).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let generated = op_source(&OpView::of(&trace, 0).unwrap(), "exp").unwrap();
        assert!(generated.in_place.is_empty() && generated.source.contains("__restrict__ out0"));
    }

    #[test]
    fn bf16_regions_move_sixteen_bytes_per_access_and_compute_in_float() {
        use crate::core::ir::TensorMeta;
        let bf16 = |shape: &[usize]| TensorMeta::new(DType::BF16, shape);
        // The swish chain: both inputs read whole, eight elements per thread.
        let generated = generate(|b| {
            let x = b.input_with(&bf16(&[64, 16])).unwrap();
            let y = b.input_with(&bf16(&[64, 16])).unwrap();
            let m = b.mul(x, y).unwrap();
            let s = b.sigmoid(m).unwrap();
            let z = b.mul(m, s).unwrap();
            b.output(z).unwrap();
        });
        let src = &generated.source;
        assert_eq!((generated.threads, generated.input_lengths.clone()), (64 * 16 / 8, vec![512, 512]), "{src}");
        assert_eq!(src.matches("__ldcs(reinterpret_cast<const uint4*>(in").count(), 2, "{src}");
        assert!(src.contains("__stcs(reinterpret_cast<uint4*>(out0 + i), make_uint4("), "{src}");
        assert!(src.contains("const unsigned short* __restrict__ in0"), "{src}");
        // The norm chain: a per-row value and a per-column row, read per eight elements.
        let generated = generate(|b| {
            let x = b.input_with(&bf16(&[4, 64])).unwrap();
            let mean = b.input_with(&bf16(&[4, 1])).unwrap();
            let w = b.input_with(&bf16(&[64])).unwrap();
            let c = b.sub(x, mean).unwrap();
            let y = b.mul(c, w).unwrap();
            b.output(y).unwrap();
        });
        let src = &generated.source;
        assert!(src.contains("const float s1 = bs_from_bf16(in1["), "{src}");
        assert!(src.contains("*reinterpret_cast<const uint4*>(in2 + (long long)((unsigned int)i % 64u))"), "{src}");
        // Rows of a length that is not a multiple of eight: `x` still eight values an access,
        // the per-row value read as two per vector (its row's, and the next row's where the
        // vector holds the start of the next), the per-column row with two aligned accesses
        // and a shift, or a value at a time where the vector straddles two rows or the second
        // access would pass the row's end.
        let generated = generate(|b| {
            let x = b.input_with(&bf16(&[8, 12])).unwrap();
            let mean = b.input_with(&bf16(&[8, 1])).unwrap();
            let w = b.input_with(&bf16(&[12])).unwrap();
            let c = b.sub(x, mean).unwrap();
            let d = b.mul(c, w).unwrap();
            b.output(d).unwrap();
        });
        let src = &generated.source;
        assert!(generated.vectorized && generated.threads == 96 / 8, "{src}");
        assert!(src.contains("__ldcs(reinterpret_cast<const uint4*>(in0 + i))"), "{src}");
        assert!(src.contains("const long long left = 12ll - (long long)((unsigned int)i % 12u);"), "{src}");
        assert!(src.contains("const float s1 = bs_from_bf16(in1[(long long)((unsigned int)i / 12u)]);"), "{src}");
        assert!(
            src.contains(
                "const float z1 = left < 8 ? bs_from_bf16(in1[(long long)((unsigned int)(i + 7) / 12u)]) : s1;"
            ),
            "{src}"
        );
        assert!(src.contains("const float x1 = (l < left ? s1 : z1);"), "{src}");
        assert!(src.contains("if (left >= 8 && (o % 8 == 0 || o - o % 8 + 16 <= 12ll)) { uint4 q;"), "{src}");
        assert!(src.contains("const uint4 lo_ = a_[0]; const uint4 hi_ = s_ != 0 ? a_[1] : lo_;"), "{src}");
        assert!(src.contains("q.x = __funnelshift_r(p0_, p1_, h_);"), "{src}");
        assert!(src.contains("w2[3] = (unsigned int)in2[(long long)((unsigned int)(i + 6) % 12u)]"), "{src}");
        assert!(src.contains("const float x2 = bs_from_bf16((w2[l / 2] >> (16 * (l % 2))));"), "{src}");
        assert!(!src.contains("out0[i] ="), "no tail: {src}");
        super::super::compiles_with_nvrtc(src);
    }

    #[test]
    fn a_matrix_transpose_goes_through_shared_memory_a_tile_per_block() {
        let generated = matrix_transpose_source("transpose", "k", 70, 3, DType::F32);
        assert!(generated.source.contains("__shared__ float tile[32][33];"), "{}", generated.source);
        assert!(generated.source.contains("out0[c * rows + r] = tile[tx][k];"), "{}", generated.source);
        // 3 x 1 tiles of 32 x 32, a block of 256 threads each.
        assert_eq!(generated.threads, 3 * 256);
        assert_eq!((generated.input_lengths[0], generated.output_lengths[0]), (210, 210));
    }

    #[test]
    fn swish_chain_golden_source() {
        let generated = generate(|b| {
            let a = b.input(&[1024]).unwrap();
            let c = b.input(&[1024]).unwrap();
            let ab = b.mul(a, c).unwrap();
            let x = b.add_scalar(ab, 1.0).unwrap();
            let s = b.sigmoid(x).unwrap();
            let y = b.mul(x, s).unwrap();
            b.output(y).unwrap();
        });
        assert!(generated.vectorized);
        assert_eq!((generated.inputs, generated.outputs, generated.numel), (2, 1, 1024));
        let lane_x = "    {
    const float x0 = v0.x;
    const float x1 = v1.x;
    const float t2 = (x0 * x1);
    const float t3 = (t2 + 1e0f);
    const float t4 = (1.0f / (1.0f + expf(-t3)));
    const float t5 = (t3 * t4);
    r0.x = t5;
    }
";
        let head = "// Generated by boundscope for region `CpuFusion0`.
extern \"C\" __global__ void region0(const float* __restrict__ in0, const float* __restrict__ in1, float* __restrict__ out0, long long n) {
  const long long stride = (long long)blockDim.x * gridDim.x;
  const long long vectors = n / 4;
  for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < vectors; j += stride) {
    const float4 v0 = __ldcs(reinterpret_cast<const float4*>(in0) + j);
    const float4 v1 = __ldcs(reinterpret_cast<const float4*>(in1) + j);
    float4 r0;
";
        assert!(generated.source.starts_with(head), "{}", generated.source);
        assert!(generated.source.contains(lane_x), "{}", generated.source);
        assert_eq!(generated.source.matches("expf(").count(), 4, "one sigmoid per lane");
        assert!(
            generated.source.ends_with("    __stcs(reinterpret_cast<float4*>(out0) + j, r0);\n  }\n}\n"),
            "{}",
            generated.source
        );
    }

    /// `(x - mean) * w` over `[16, cols]`, `mean` per row, `w` per column.
    fn broadcast_chain(cols: usize) -> RegionSource {
        generate(|b| {
            let x = b.input(&[16, cols]).unwrap();
            let mean = b.input(&[16, 1]).unwrap();
            let w = b.input(&[cols]).unwrap();
            let c = b.sub(x, mean).unwrap();
            let y = b.mul(c, w).unwrap();
            b.output(y).unwrap();
        })
    }

    #[test]
    fn broadcast_inputs_are_read_per_vector_when_rows_hold_whole_vectors() {
        let generated = broadcast_chain(8);
        assert!(generated.vectorized);
        let s = &generated.source;
        assert!(s.contains("    const long long i = 4ll * j;"), "{s}");
        assert!(s.contains("const float4 v0 = __ldcs(reinterpret_cast<const float4*>(in0) + j);"), "{s}");
        assert!(s.contains("const float s1 = in1[(long long)((unsigned int)i / 8u)];"), "{s}");
        assert!(
            s.contains("const float4 v2 = *reinterpret_cast<const float4*>(in2 + (long long)((unsigned int)i % 8u));"),
            "{s}"
        );
        assert!(s.contains("const float x1 = s1;") && s.contains("const float x2 = v2.z;"), "{s}");
    }

    /// `gelu(x * scale + bias)` over `[rows, cols]` in `dtype`, `scale` and `bias` `[cols]`.
    fn scaled_gelu(rows: usize, cols: usize, dtype: DType) -> RegionSource {
        use crate::core::ir::TensorMeta;
        generate(|b| {
            let x = b.input_with(&TensorMeta::new(dtype, &[rows, cols])).unwrap();
            let scale = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
            let bias = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
            let y = b.mul(x, scale).unwrap();
            let y = b.add(y, bias).unwrap();
            let y = b.gelu(y).unwrap();
            b.output(y).unwrap();
        })
    }

    #[test]
    fn a_row_broadcast_along_the_last_axis_is_read_once_for_several_rows() {
        // bf16 over [8192, 8192]: 16 rows per thread, 2^19 threads; each thread reads its
        // eight values of `scale` and `bias` once, before the loop over its rows.
        let generated = scaled_gelu(8192, 8192, DType::BF16);
        let s = &generated.source;
        assert_eq!(generated.threads, 8192 * 8192 / 8 / 16, "{s}");
        let held = s.find("const uint4 u1 = *reinterpret_cast<const uint4*>(in1 + 8ll * c);").expect(s);
        let rows = s.find("for (int q = 0; q < 16; ++q)").expect(s);
        assert!(held < rows && s.contains("const uint4 u2 = *reinterpret_cast<const uint4*>(in2 + 8ll * c);"));
        assert!(s.contains("const uint4 u0 = __ldcs(reinterpret_cast<const uint4*>(in0 + i));"), "{s}");
        assert_eq!(s.matches("in1").count(), 2, "declared and read once: {s}");
        super::super::compiles_with_nvrtc(s);
        // A 16-bit `gelu` takes `exp2` and an approximate division; an `f32` one `tanhf`.
        assert!(s.contains("= __fdividef(t4, 1.0f + exp2f(-2.30220819f * (t4 + 0.044715f * t4 * t4 * t4)));"), "{s}");
        assert!(!s.contains("tanhf"), "{s}");
        // f32 keeps a row per thread (at a copy's speed already; several measured slower).
        let generated = scaled_gelu(8192, 8192, DType::F32);
        assert_eq!(generated.threads, 8192 * 8192 / 4, "{}", generated.source);
        assert!(
            generated.source.contains("tanhf(0.7978846f * (t4 + 0.044715f * t4 * t4 * t4))"),
            "{}",
            generated.source
        );
        // bf16 over GPT-2's [16384, 768]: 2 rows per thread (enough threads left), the rows
        // read as 16-byte words.
        let generated = scaled_gelu(16384, 768, DType::BF16);
        let s = &generated.source;
        assert_eq!(generated.threads, 16384 * 768 / 8 / 2, "{s}");
        assert!(s.contains("const uint4 u1 = *reinterpret_cast<const uint4*>(in1 + 8ll * c);"), "{s}");
        assert!(s.contains("for (int q = 0; q < 2; ++q)"), "{s}");
        super::super::compiles_with_nvrtc(s);
        // Too few rows to split (the grid would be too small), or a row count no power of two
        // divides: a row per thread, as before.
        for (rows, cols) in [(64, 768), (8191, 8192)] {
            let generated = scaled_gelu(rows, cols, DType::BF16);
            assert_eq!(generated.threads, rows * cols / 8, "{}", generated.source);
            assert!(!generated.source.contains("q <"), "{}", generated.source);
        }
    }

    /// With `batched_rows`, a 16-bit kernel of several rows a thread whose tensors do not fit
    /// in L2 loads a batch of its rows (up to 8 accesses) before computing any; without it,
    /// with a row a thread, or with tensors that fit in L2, the kernels are as before.
    #[test]
    fn batched_rows_load_a_batch_of_rows_before_computing_any() {
        use crate::core::ir::TensorMeta;
        const L2: usize = 50 << 20;
        let batched = KernelVariants { batched_rows: true, ..KernelVariants::default() };
        let unbatched = KernelVariants { batched_rows: false, ..KernelVariants::default() };
        // `gelu(x * scale + bias [+ z])`, `z` a second input read whole, in `z_dtype`, for a
        // GPU of `l2` bytes of L2.
        let chain_for_l2 = |rows: usize, cols: usize, dtype: DType, z_dtype: Option<DType>, variants, l2| {
            generate_for_l2(
                |b| {
                    let x = b.input_with(&TensorMeta::new(dtype, &[rows, cols])).unwrap();
                    let scale = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
                    let bias = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
                    let y = b.mul(x, scale).unwrap();
                    let mut y = b.add(y, bias).unwrap();
                    if let Some(z_dtype) = z_dtype {
                        let z = b.input_with(&TensorMeta::new(z_dtype, &[rows, cols])).unwrap();
                        y = b.add(y, z).unwrap();
                    }
                    let y = b.gelu(y).unwrap();
                    b.output(y).unwrap();
                },
                variants,
                l2,
            )
            .source
        };
        // For a GPU of unknown L2: nothing fits in it.
        let chain = |rows: usize, cols: usize, dtype: DType, z_dtype: Option<DType>, variants| {
            chain_for_l2(rows, cols, dtype, z_dtype, variants, 0)
        };
        // bf16 over [8192, 8192]: 16 rows a thread, in two batches of 8 loads of `x`, after
        // `scale` and `bias`, read once for all 16.
        let s = chain(8192, 8192, DType::BF16, None, batched);
        let held = s.find("const uint4 u1 = *reinterpret_cast<const uint4*>(in1 + 8ll * c);").expect(&s);
        let batches = s.find("for (int q0 = 0; q0 < 16; q0 += 8) {").expect(&s);
        let loads = s.find("    p0[q] = __ldcs(reinterpret_cast<const uint4*>(in0 + i));").expect(&s);
        let computed = s.find("    const uint4 u0 = p0[q];").expect(&s);
        assert!(held < batches && batches < loads && loads < computed, "{s}");
        assert!(s.contains("    uint4 p0[8];"), "{s}");
        assert!(s.contains("    const long long i = 8ll * ((g * 16ll + q0 + q) * cols + c);"), "{s}");
        assert_eq!(s.matches("in0").count(), 2, "declared and loaded once: {s}");
        assert_eq!(s.matches("__stcs(").count(), 1, "{s}");
        super::super::compiles_with_nvrtc(&s);
        // With an `f32` input read whole (two accesses a row, three in all), batches of 2.
        let s = chain(8192, 8192, DType::BF16, Some(DType::F32), batched);
        assert!(s.contains("for (int q0 = 0; q0 < 16; q0 += 2) {"), "{s}");
        assert!(s.contains("    uint4 p0[2];") && s.contains("    float4 pa3[2], pb3[2];"), "{s}");
        assert!(s.contains("    pb3[q] = __ldcs(reinterpret_cast<const float4*>(in3 + i + 4));"), "{s}");
        assert!(s.contains("    const float4 b3 = pb3[q];"), "{s}");
        super::super::compiles_with_nvrtc(&s);
        // Without the variant: a row loaded, computed and stored in turn.
        for (rows, cols) in [(8192, 8192), (16384, 768)] {
            let s = chain(rows, cols, DType::BF16, None, unbatched);
            assert!(s.contains("for (int q = 0; q < ") && !s.contains("q0"), "{s}");
        }
        // On a GPU of 50 MiB of L2: [8192, 8192] (256 MiB with the output) is batched;
        // [16384, 768] (48 MiB) fits, and is not.
        assert!(chain_for_l2(8192, 8192, DType::BF16, None, batched, L2).contains("q0 += 8"));
        let s = chain_for_l2(16384, 768, DType::BF16, None, batched, L2);
        assert!(s.contains("for (int q = 0; q < ") && !s.contains("q0"), "{s}");
        assert_eq!(s, chain_for_l2(16384, 768, DType::BF16, None, unbatched, L2));
        // The same kernel on a GPU of 40 MiB of L2, or of unknown L2, is batched.
        for l2 in [40 << 20, 0] {
            assert!(chain_for_l2(16384, 768, DType::BF16, None, batched, l2).contains("q0 += "), "L2 {l2}");
        }
        // A row a thread (too few rows): nothing to batch, the same kernel.
        assert_eq!(chain(64, 768, DType::BF16, None, batched), chain(64, 768, DType::BF16, None, unbatched));
        // 16 rows a thread but no input read whole (`scale` along the last axis, `mean` along
        // the first): nothing to batch either.
        let broadcasts_only = |variants| {
            generate_with(
                |b| {
                    let scale = b.input_with(&TensorMeta::new(DType::BF16, &[8192])).unwrap();
                    let mean = b.input_with(&TensorMeta::new(DType::BF16, &[8192, 1])).unwrap();
                    let y = b.add(mean, scale).unwrap();
                    let y = b.gelu(y).unwrap();
                    b.output(y).unwrap();
                },
                variants,
            )
            .source
        };
        let s = broadcasts_only(batched);
        assert!(s.contains("for (int q = 0; q < 16; ++q)") && !s.contains("q0"), "{s}");
        assert_eq!(s, broadcasts_only(unbatched));
    }

    #[test]
    fn broadcast_inputs_are_indexed_per_element_otherwise() {
        // Rows of 6: vectors of four straddle rows, so the broadcast inputs are read per
        // element of the vector; `x` still a vector an access.
        let generated = broadcast_chain(6);
        assert!(generated.vectorized && generated.threads == 96 / 4);
        let s = &generated.source;
        assert!(s.contains("const float4 v0 = __ldcs(reinterpret_cast<const float4*>(in0) + j);"), "{s}");
        assert!(s.contains("const float x1 = in1[(long long)((unsigned int)(i + 0) / 6u)];"), "{s}");
        assert!(s.contains("const float x2 = in2[(long long)((unsigned int)(i + 3) % 6u)];"), "{s}");
        assert!(s.contains("const float t4 = (t3 * x2);") && s.contains("r0.w = t4;"), "{s}");
        assert_eq!((generated.input_lengths, generated.output_lengths), (vec![96, 16, 6], vec![96]));
        super::super::compiles_with_nvrtc(s);
    }

    #[test]
    fn values_past_the_last_whole_vector_are_a_tail_an_element_a_thread() {
        // [5, 7]: 35 values, 8 vectors of four and a tail of 3 from element 32.
        let generated = generate(|b| {
            let x = b.input(&[5, 7]).unwrap();
            let w = b.input(&[7]).unwrap();
            let y = b.mul(x, w).unwrap();
            let y = b.add_scalar(y, 1.0).unwrap();
            b.output(y).unwrap();
        });
        let s = &generated.source;
        assert!(generated.vectorized && generated.threads == 8, "{s}");
        assert!(s.contains("__stcs(reinterpret_cast<float4*>(out0) + j, r0);"), "{s}");
        let tail =
            s.find("for (long long i = 32ll + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;").expect(s);
        assert!(s[tail..].contains("out0[i] = t3;") && s[tail..].contains("in1[(long long)((unsigned int)i % 7u)]"));
        super::super::compiles_with_nvrtc(s);
        // Fewer values than a vector: the tail alone, on one thread each.
        let generated = generate(|b| {
            let x = b.input(&[3]).unwrap();
            let y = b.exp(x).unwrap();
            let y = b.neg(y).unwrap();
            b.output(y).unwrap();
        });
        assert!(generated.threads == 3 && generated.source.contains("i = 0ll +"), "{}", generated.source);
        super::super::compiles_with_nvrtc(&generated.source);
    }

    #[test]
    fn special_scalars_are_valid_c() {
        assert_eq!(literal(1.0), "1e0f");
        assert_eq!(literal(-0.5), "-5e-1f");
        assert_eq!(literal(f32::INFINITY), "__int_as_float(0x7f800000)");
        assert!(literal(f32::NAN).contains("0x7fc00000"));
    }

    /// A broadcast operand whose last axis is the iteration shape's (`[T, 1, D]` or
    /// `[B, 1, 1, D]` over `[B, T, H, D]`: any pattern `broadcast_to` makes that keeps the
    /// last axis) is read a vector an access, at the offset of the vector's first value, where
    /// the rows hold whole vectors; one constant along the last axis (`[1, T, H, 1]`) a value
    /// per vector. Only rows that do not hold whole vectors (`f32` rows of 6) read it per
    /// element. The kernels compile.
    #[test]
    fn broadcasts_of_any_pattern_keeping_the_last_axis_are_read_a_vector_an_access() {
        use crate::core::ir::TensorMeta;
        let source = |dtype: DType, shape: &[usize], operand: &[usize]| {
            generate_with(
                |b| {
                    let x = b.input_with(&TensorMeta::new(dtype, shape)).unwrap();
                    let y = b.input_with(&TensorMeta::new(dtype, operand)).unwrap();
                    let z = b.mul(x, y).unwrap();
                    let z = b.gelu(z).unwrap();
                    b.output(z).unwrap();
                },
                KernelVariants::default(),
            )
            .source
        };
        let shape = [4, 16, 8, 64];
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let vector = if dtype == DType::F32 {
                "const float4 v1 = *reinterpret_cast<const float4*>(in1 + "
            } else {
                "const uint4 u1 = *reinterpret_cast<const uint4*>(in1 + "
            };
            for operand in [[1, 16, 1, 64], [4, 1, 1, 64], [4, 16, 1, 64], [1, 1, 8, 64]] {
                let s = source(dtype, &shape, &operand);
                assert!(s.contains(vector), "{dtype} {operand:?}: {s}");
                assert!(!s.contains("in1[("), "{dtype} {operand:?}, read per element: {s}");
                super::super::compiles_with_nvrtc(&s);
            }
            // Constant along the last axis: a value per vector.
            let s = source(dtype, &shape, &[1, 16, 8, 1]);
            assert_eq!(s.matches("const float s1 = ").count(), 1, "{dtype}: {s}");
            super::super::compiles_with_nvrtc(&s);
        }
        // f32 rows of 6 values: vectors straddle rows, so the operand is read per element.
        let s = source(DType::F32, &[64, 16, 6], &[16, 6]);
        assert!(!s.contains("const float4 v1") && s.contains("in1["), "{s}");
    }
}

#[cfg(test)]
mod op_tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};

    #[test]
    fn an_op_takes_one_parameter_per_tensor_argument_repeats_included() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[8]).unwrap();
        let y = b.mul(x, x).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let generated = op_source(&OpView::of(&trace, 0).unwrap(), "square").unwrap();
        assert_eq!(generated.inputs, 2);
        assert!(generated
            .source
            .contains("const float* __restrict__ in0, const float* __restrict__ in1, float* __restrict__ out0"));
    }
}

#[cfg(test)]
mod conversion_tests {
    use super::HALF_CONVERSIONS;

    /// Rounding to bf16 is one `cvt` instruction where the GPU has it (compute capability 8.0
    /// on; kernels are compiled for the GPU's own architecture), by hand before.
    #[test]
    fn bf16_rounds_in_one_instruction_where_the_gpu_has_it() {
        let source = format!(
            "{HALF_CONVERSIONS}extern \"C\" __global__ void k(const float* x, unsigned short* y) {{ y[0] = bs_to_bf16(x[0]); }}"
        );
        let Some(hopper) = super::super::nvrtc_ptx(&source, Some("compute_90")) else { return };
        assert!(hopper.unwrap().contains("cvt.rn.bf16.f32"));
        let turing = super::super::nvrtc_ptx(&source, Some("compute_75")).expect("NVRTC loaded").unwrap();
        assert!(!turing.contains("cvt.rn.bf16.f32"));
    }
}

#[cfg(test)]
mod reduction_tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};
    use crate::core::passes::{FuseRegions, Pass};
    use crate::executors::CpuFusion;

    /// With `streaming_rows`, a trailing reduction reads the inputs it reads whole (once) with
    /// the streaming hint, in both of its row loops; a broadcast operand, read again by every
    /// row, stays plain.
    #[test]
    fn streaming_rows_stream_a_trailing_reductions_inputs_read_whole() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let streaming = KernelVariants { streaming_rows: true, ..KernelVariants::NONE };
        for (dtype, cols) in [(DType::BF16, 64), (DType::BF16, 4096), (DType::F32, 65536), (DType::F32, 1001)] {
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&crate::TensorMeta::new(dtype, &[4, cols])).unwrap();
            let w = b.input_with(&crate::TensorMeta::new(dtype, &[cols])).unwrap();
            let y = b.mul(x, w).unwrap();
            let s = b.sum(y).unwrap();
            b.output(s).unwrap();
            let trace = b.finish().unwrap();
            let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
            let region = OpView::of(&fused, 0).unwrap();
            let without = region_source_for(&region, "dot", KernelVariants::NONE, with_l2(0)).unwrap().source;
            let src = region_source_for(&region, "dot", streaming, with_l2(0)).unwrap().source;
            let plain = |s: &str| s.matches("*reinterpret_cast<const ").count();
            assert!(plain(&without) > 0 && plain(&src) == 0, "{src}");
            assert_eq!(src.matches("__ldcs(reinterpret_cast<const ").count(), plain(&without), "{src}");
            assert!(src.contains("(in0 + at))") && !src.contains("(in1 + at))"), "{src}");
            super::super::compiles_with_nvrtc(&src);
        }
    }

    /// With `keep_in_l2`, a region whose tensors fit in three quarters of L2 together, and its
    /// inputs in half, reads and writes them plainly, where every region hints its full-size
    /// streams (and a trailing reduction with `streaming_rows`); past that, or where its size is
    /// unknown (0), the hints stay.
    #[test]
    fn keep_in_l2_leaves_regions_that_fit_in_l2_without_the_streaming_hints() {
        use crate::core::ir::TensorMeta;
        const L2: usize = 50 << 20;
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let streaming = KernelVariants { streaming_rows: true, ..KernelVariants::NONE };
        let kept = KernelVariants { keep_in_l2: true, ..streaming };
        let hinted = |s: &str| s.contains("__ldcs(") || s.contains("__stcs(");
        // gelu(x * scale + bias), scale and bias along the last axis, in f32 and bf16; then the
        // same chain ending in a sum (whether each fits, unreduced and reduced). 2^22 f32 values
        // (32 MiB with the output) fit; [3072, 4096] in bf16 (48 MiB with the output) fits in L2
        // but not in its kept share, and fits once reduced (24 MiB read); [4096, 4096] in bf16
        // reduced fits in the kept share (32 MiB) but reads more than half of L2; 2^24 values
        // do not fit.
        for (dtype, rows, fits) in [
            (DType::F32, 1024, [true, true]),
            (DType::BF16, 2048, [true, true]),
            (DType::BF16, 3072, [false, true]),
            (DType::BF16, 4096, [false, false]),
            (DType::F32, 4096, [false, false]),
            (DType::BF16, 8192, [false, false]),
        ] {
            for (reduce, fits) in [false, true].into_iter().zip(fits) {
                let mut b = TraceBuilder::new(&arena, &registry);
                let x = b.input_with(&TensorMeta::new(dtype, &[rows, 4096])).unwrap();
                let scale = b.input_with(&TensorMeta::new(dtype, &[4096])).unwrap();
                let bias = b.input_with(&TensorMeta::new(dtype, &[4096])).unwrap();
                let y = b.mul(x, scale).unwrap();
                let y = b.add(y, bias).unwrap();
                let y = b.gelu(y).unwrap();
                let y = if reduce { b.sum(y).unwrap() } else { y };
                b.output(y).unwrap();
                let trace = b.finish().unwrap();
                let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
                let region = OpView::of(&fused, 0).unwrap();
                let source = |variants, l2| region_source_for(&region, "chain", variants, with_l2(l2)).unwrap().source;
                let s = source(kept, L2);
                let case = format!("{dtype:?} [{rows}, 4096], reduced: {reduce}");
                assert_eq!(hinted(&s), !fits, "{case}: {s}");
                assert!(hinted(&source(streaming, L2)), "{case}: hinted without keep_in_l2");
                assert!(hinted(&source(kept, 0)), "{case}: hinted where L2 is unknown");
                // The L2's size changes nothing without the variant (and without `batched_rows`
                // too, which batches only tensors past it).
                let neither = KernelVariants { keep_in_l2: false, batched_rows: false, ..KernelVariants::default() };
                for variants in [streaming, neither] {
                    assert_eq!(source(variants, L2), source(variants, 0), "{case}");
                }
                if fits && reduce {
                    assert_eq!(s, source(KernelVariants::NONE, L2), "{case}: as without the hints");
                }
                super::super::compiles_with_nvrtc(&s);
            }
        }
        // A 16-bit input widened to an `f32` output: the output's two `float4` stores a vector.
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(DType::BF16, &[1024, 4096])).unwrap();
        let y = b.cast(x, DType::F32).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let op = OpView::of(&trace, 0).unwrap();
        let source = |variants| op_source_for(&op, "widen", variants, with_l2(L2)).unwrap().source;
        let (hinted_source, plain) = (source(streaming), source(kept));
        for at in ["i", "i + 4"] {
            let ptr = format!("reinterpret_cast<float4*>(out0 + {at})");
            assert!(hinted_source.contains(&format!("__stcs({ptr}, make_float4(")), "{hinted_source}");
            assert!(plain.contains(&format!("*{ptr} = make_float4(")), "{plain}");
        }
        assert!(!hinted(&plain), "{plain}");
        super::super::compiles_with_nvrtc(&plain);
    }

    #[test]
    fn a_trailing_reduction_reads_rows_sixteen_bytes_at_a_time() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[16, 8]).unwrap();
        let e = b.exp(x).unwrap();
        let s = b.sum(e).unwrap();
        b.output(e).unwrap();
        b.output(s).unwrap();
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
        let generated =
            region_source_for(&OpView::of(&fused, 0).unwrap(), "softmax_part", KernelVariants::NONE, with_l2(0))
                .unwrap();
        // Rows of 8: 2 threads each, 16 rows per warp, each thread reading 4 values at once.
        assert_eq!((generated.threads, generated.vectorized, generated.outputs), (16 * 2, false, 2));
        let src = &generated.source;
        assert!(src.contains("const long long rows = 16ll;") && src.contains("float acc = 0.0f;"), "{src}");
        assert!(src.contains("for (long long c0 = lane * 4; c0 < 8ll; c0 += 8ll)"), "{src}");
        assert!(src.contains("uint4 raw0[1];"), "one access a thread, one in flight: {src}");
        assert!(src.contains("raw0[u] = *reinterpret_cast<const uint4*>(in0 + at);"), "{src}");
        assert!(src.contains("float xs0[4]; xs0[0] = __uint_as_float(raw0[u].x);"), "{src}");
        assert!(src.contains("out0[i] = t1;") && src.contains("accs[e] = accs[e] + t1;"), "{src}");
        assert!(src.contains("const float other = __shfl_xor_sync(0xffffffffu, acc, offset);"), "{src}");
        assert!(src.contains("acc = acc + other;"), "{src}");
        assert!(src.contains("if (r < rows && lane == 0) out1[r] = acc;"), "{src}");
        assert_eq!((generated.input_lengths, generated.output_lengths), (vec![128], vec![128, 16]));

        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[4, 8]).unwrap();
        let m = b.max(x).unwrap();
        b.output(m).unwrap();
        let trace = b.finish().unwrap();
        let generated = op_source(&OpView::of(&trace, 0).unwrap(), "row_max").unwrap();
        let src = &generated.source;
        // NaN propagates, as in PyTorch (`fmaxf` drops it); the shuffle runs once per step, in
        // every lane, outside the select.
        assert!(src.contains("accs[e] = bs_max(accs[e], x0);") && src.contains("0xff800000"), "{src}");
        assert!(src.contains("asm(\"max.NaN.f32 %0, %1, %2;\""), "one instruction that keeps a NaN\n{src}");
        super::super::compiles_with_nvrtc(src);
        assert!(src.contains("const float other = __shfl_xor_sync(0xffffffffu, acc, offset);"), "{src}");
        assert!(src.contains("acc = bs_max(acc, other);"), "{src}");
        assert!(!src.contains("fmaxf"), "{src}");

        // 16-bit rows move 16 bytes per access too (eight values), and a broadcast operand
        // is read per value; an odd row is read a value at a time.
        let reduce = |cols: usize| {
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&crate::TensorMeta::new(DType::BF16, &[4, cols])).unwrap();
            let w = b.input_with(&crate::TensorMeta::new(DType::BF16, &[cols])).unwrap();
            let y = b.mul(x, w).unwrap();
            let s = b.sum(y).unwrap();
            b.output(s).unwrap();
            let trace = b.finish().unwrap();
            let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
            region_source_for(&OpView::of(&fused, 0).unwrap(), "dot", KernelVariants::NONE, with_l2(0)).unwrap()
        };
        // Rows of one access a thread: four rows to a group of lanes, their loads made first.
        let generated = reduce(64);
        let src = &generated.source;
        assert_eq!(generated.threads, 8, "eight accesses of eight values a row, four rows a group: {src}");
        assert!(src.contains("uint4 raw0[4];"), "{src}");
        assert!(src.contains("for (long long r0 = lead; r0 < rows; r0 += 4ll * groups)"), "{src}");
        assert!(src.contains("raw0[q] = *reinterpret_cast<const uint4*>(in0 + at);"), "{src}");
        assert!(src.contains("xs0[0] = bs_from_bf16(raw0[q].x); xs0[1] = bs_from_bf16((raw0[q].x >> 16));"), "{src}");
        assert!(src.contains("const float x1 = bs_from_bf16(in1["), "{src}");
        assert!(src.contains("if (r < rows && lane == 0) out0[r] = (unsigned short)bs_to_bf16(acc);"), "{src}");
        super::super::compiles_with_nvrtc(src);
        // With three inputs read whole, two rows a group: at most 128 bytes a thread in flight.
        let mut b = TraceBuilder::new(&arena, &registry);
        let bf16 = crate::TensorMeta::new(DType::BF16, &[4, 64]);
        let (x, y, z) = (b.input_with(&bf16).unwrap(), b.input_with(&bf16).unwrap(), b.input_with(&bf16).unwrap());
        let xy = b.mul(x, y).unwrap();
        let xyz = b.mul(xy, z).unwrap();
        let s = b.sum(xyz).unwrap();
        b.output(s).unwrap();
        let trace = b.finish().unwrap();
        let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
        let src = region_source(&OpView::of(&fused, 0).unwrap(), "dot3").unwrap().source;
        assert!(src.contains("uint4 raw2[2];") && src.contains("r0 += 2ll * groups"), "{src}");
        // Longer rows take a group of lanes each, several accesses a thread.
        let generated = reduce(1024);
        assert_eq!(generated.threads, 4 * 32, "{}", generated.source);
        assert!(generated.source.contains("uint4 raw0[4];") && !generated.source.contains("groups"));
        // An odd row with a broadcast operand is read a value at a time; without one, through
        // accesses aligned to the tensor, skipping the values of the rows beside it.
        let src = reduce(63).source;
        assert!(src.contains("unsigned short raw0[2];"), "both of a thread's values in flight: {src}");
        assert!(src.contains("raw0[u] = *(in0 + at);"), "{src}");
        assert!(src.contains("xs0[0] = bs_from_bf16((unsigned int)raw0[u]);"), "{src}");
        super::super::compiles_with_nvrtc(&src);
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&crate::TensorMeta::new(DType::BF16, &[4, 63])).unwrap();
        let s = b.max(x).unwrap();
        b.output(s).unwrap();
        let trace = b.finish().unwrap();
        let generated = op_source(&OpView::of(&trace, 0).unwrap(), "odd_max").unwrap();
        let src = &generated.source;
        assert_eq!(generated.threads, 4 * 16, "a row spans up to nine accesses of eight values: {src}");
        assert!(src.contains("for (int o0 = lane * 8 - (int)(start % 8); o0 < stop; o0 += 128)"), "{src}");
        assert!(src.contains("const int stop = (int)((end < 248ll ? end : 248ll) - start);"), "{src}");
        assert!(src.contains("uint4 raw0[1];"), "a whole access: {src}");
        assert!(
            src.contains("if (lane == 0) for (long long i = start > 248ll ? start : 248ll; i < end; ++i)"),
            "{src}"
        );
        assert!(src.contains("if (o + e >= 0 && o + e < 63) accs[e] = bs_max(accs[e], "), "{src}");
        super::super::compiles_with_nvrtc(src);
    }

    /// With `split_reductions`, a trailing reduction over rows of a block each (256 threads)
    /// is split over a thread-block cluster where rows of 64 KB or more are at most a quarter as
    /// many as SMs, or half as many of 256 KB or more: the fewest blocks, up to 8, that give
    /// each SM one, each with a batch of loads at least. Each block reduces its slice of the
    /// row (through accesses aligned to the row, or to the tensor), the cluster combines the
    /// blocks' totals between two barriers, and the first block writes the row's result. Every
    /// other kernel is the one without the variant: rows shorter than a block's or than 64 KB,
    /// rows as many as SMs, and any row on a GPU without clusters or of an unknown SM count.
    /// Each split kernel compiles for Hopper.
    #[test]
    fn split_reductions_split_few_long_rows_over_clusters() {
        use crate::core::ir::TensorMeta;
        const HOPPER: RegionTarget = RegionTarget { l2_bytes: 50 << 20, sms: 132, clusters: true };
        let split = KernelVariants::default();
        let unsplit = KernelVariants { split_reductions: false, ..split };
        // `alone`: the reduction is the region's only output, so that rows that 16 bytes do not
        // divide are read through accesses aligned to the tensor.
        let source = |dtype: DType, shape: [usize; 2], max: bool, alone: bool, variants, target| {
            let (arena, registry) = (Arena::new(), Registry::with_builtins());
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, &shape)).unwrap();
            let e = b.exp(x).unwrap();
            let r = if max { b.max(e).unwrap() } else { b.sum(e).unwrap() };
            if !alone {
                b.output(e).unwrap();
            }
            b.output(r).unwrap();
            let trace = b.finish().unwrap();
            let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
            region_source_for(&OpView::of(&fused, 0).unwrap(), "split", variants, target).unwrap()
        };
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            // (Blocks a cluster in f32, and in 16 bits.)
            for (shape, f32_cluster, half_cluster) in [
                ([16, 1 << 20], 8, 8),
                ([1, 1 << 20], 8, 8),
                ([64, 1 << 20], 4, 4),
                ([16, 65536], 8, 4),
                ([33, 65536], 4, 4),
                ([64, 65536], 4, 1),
                ([9, 200003], 8, 8),
                ([66, 1 << 20], 2, 2),
                ([67, 1 << 20], 1, 1),
                ([132, 1 << 20], 1, 1),
                ([16, 16384], 2, 1),
                ([16, 5001], 1, 1),
                ([16, 4096], 1, 1),
                ([4096, 1024], 1, 1),
            ] {
                for (max, alone) in [(false, false), (true, true)] {
                    let what = format!("{dtype} {shape:?} max: {max}, alone: {alone}");
                    let kernel = source(dtype, shape, max, alone, split, HOPPER);
                    let plain = source(dtype, shape, max, alone, unsplit, HOPPER);
                    let (s, old) = (&kernel.source, &plain.source);
                    assert!(!old.contains("cluster") && plain.cluster == 1, "{what}");
                    let cluster = if dtype == DType::F32 { f32_cluster } else { half_cluster };
                    if cluster == 1 {
                        assert_eq!((s, kernel.threads, kernel.cluster), (old, plain.threads, 1), "{what}");
                        continue;
                    }
                    assert!(s.contains(&format!("__cluster_dims__({cluster}, 1, 1)")), "{what}\n{s}");
                    assert_eq!((kernel.threads, kernel.cluster), (shape[0] * cluster * 256, cluster), "{what}");
                    assert_eq!(s.matches("bs_cluster_sync();").count(), 2, "{what}\n{s}");
                    assert!(s.contains("lane == 0 && slice == 0) out"), "{what}\n{s}");
                    let aligned = alone && shape[1] % 4 != 0;
                    let slice = if aligned { "const int hi = lo + " } else { "const long long hi = lo + " };
                    assert!(s.contains(slice), "{what}\n{s}");
                    crate::executors::cuda::compiles_as_clusters(s, &what);
                }
            }
        }
        // A GPU without clusters, or of an unknown SM count: not split.
        for target in [RegionTarget { clusters: false, ..HOPPER }, RegionTarget { sms: 0, ..HOPPER }] {
            let kernel = source(DType::F32, [16, 1 << 20], false, false, split, target);
            let plain = source(DType::F32, [16, 1 << 20], false, false, unsplit, target);
            assert_eq!((kernel.source, kernel.threads), (plain.source, 16 * 256));
        }
    }
}

#[cfg(test)]
mod nan_tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};

    /// `relu` and `maximum` propagate NaN, as in PyTorch: `relu(NaN)` and `maximum` with a NaN
    /// on either side are NaN (`x > 0 ? x : 0` and `fmaxf` give 0 and the other operand).
    #[test]
    fn shape_ops_read_through_their_strides() {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 3, 4]).unwrap();
        let t = b.transpose(x, &[2, 0, 1]).unwrap();
        let r = b.reshape(t, &[8, 3]).unwrap();
        let c = b.input(&[3, 1]).unwrap();
        let w = b.broadcast_to(c, &[2, 3, 5]).unwrap();
        b.output(r).unwrap();
        b.output(w).unwrap();
        let trace = b.finish().unwrap();
        let source = |p: usize| shape_op_source(&OpView::of(&trace, p).unwrap(), "k").unwrap();
        // transpose [2, 3, 4] -> [4, 2, 3]: output (a, b, c) reads input (b, c, a).
        let transpose = source(0);
        assert!(
            transpose.source.contains(
                "out0[i] = in0[(long long)((unsigned int)i % 3u) * 4ll + (long long)((unsigned int)i / 3u % 2u) * 12ll + (long long)((unsigned int)i / 6u)];"
            ),
            "{}",
            transpose.source
        );
        assert_eq!((transpose.input_lengths.clone(), transpose.output_lengths.clone()), (vec![24], vec![24]));
        assert!(source(1).source.contains("out0[i] = in0[i];"));
        // broadcast [3, 1] -> [2, 3, 5]: constant along the last axis and the first.
        let broadcast = source(2);
        let expected = "out0[i] = in0[(long long)((unsigned int)i / 5u % 3u)];";
        assert!(broadcast.source.contains(expected), "{}", broadcast.source);
        assert_eq!((broadcast.input_lengths.clone(), broadcast.output_lengths.clone()), (vec![3], vec![30]));
        // Past 2^32 elements the coordinates are found in 64 bits.
        let mut b = TraceBuilder::new(&arena, &registry);
        let c = b.input(&[3, 1]).unwrap();
        let w = b.broadcast_to(c, &[1 << 20, 3, 1 << 12]).unwrap();
        b.output(w).unwrap();
        let trace = b.finish().unwrap();
        let large = shape_op_source(&OpView::of(&trace, 0).unwrap(), "k").unwrap();
        assert!(large.source.contains("out0[i] = in0[((i / 4096ll) % 3ll)];"), "{}", large.source);
        // Not a shape op: refused.
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[4]).unwrap();
        let y = b.exp(x).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        assert!(shape_op_source(&OpView::of(&trace, 0).unwrap(), "k").is_err());
    }

    #[test]
    fn relu_and_maximum_propagate_nan() {
        let (arena, registry) = (Arena::new(), Registry::with_builtins());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[8]).unwrap();
        let y = b.input(&[8]).unwrap();
        let r = b.relu(x).unwrap();
        let m = b.maximum(r, y).unwrap();
        let s = b.maximum_scalar(m, 0.5).unwrap();
        b.output(s).unwrap();
        let trace = b.finish().unwrap();
        let source = |position| op_source(&OpView::of(&trace, position).unwrap(), "k").unwrap().source;
        let relu = source(0);
        assert!(relu.contains("const float t2 = (x0 <= 0.0f ? 0.0f : x0);"), "{relu}");
        let maximum = source(1);
        assert!(maximum.contains("const float t3 = bs_max(x0, x1);"), "{maximum}");
        let scalar = source(2);
        assert!(scalar.contains("const float t4 = bs_max(x0, 5e-1f);"), "{scalar}");
        // `bs_max` keeps a NaN: `max.NaN` from Ampere on, comparisons before it.
        for src in [&maximum, &scalar] {
            assert!(src.contains(MAXIMUM), "{src}");
            super::super::compiles_with_nvrtc(src);
        }
        assert!(!format!("{relu}{maximum}{scalar}").contains("fmaxf"));
    }
}
