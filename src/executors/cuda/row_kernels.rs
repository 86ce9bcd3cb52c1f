//! CUDA C for the built-in composites that reduce the last axis and use the result on the same
//! row, `softmax` and `layer_norm`, as one kernel each, laid out by the row's length
//! ([`RowLayout`]): a few threads per row for short rows, a warp for rows of hundreds, a block
//! of up to 1,024 threads for long ones. Each thread reads its part of the row with 16-byte
//! accesses in every dtype (aligned to the tensor where they do not divide the row, as in
//! GPT-2's rows of 50,257 words: only the accesses a row shares with its neighbours are read
//! and written a value at a time) and keeps it on chip, so that the
//! row is read once and written once: in registers up to 32 values a thread (32,768 a row), and
//! past that in shared memory too, as far as the GPU gives a block (227 KB on Hopper: rows of
//! 65,536 f32 values, GPT-2's 50,257 words; a 16-bit row is kept there as read, in half the
//! bytes and half the shared-memory traffic, `softmax` then taking its exponentials twice; two
//! blocks share an SM where the row fits twice: of 512 threads each for `layer_norm` up to
//! 61,440 values and for `softmax` over rows 16 bytes do not divide up to 61,433, of 1,024 for
//! `softmax` over other rows up to 65,536). 16-bit `softmax` rows past 90,112 values are kept
//! as read too, by a block up to 122,880 ([`KernelVariants::long_rows_as_read`]). Longer rows
//! are kept on chip by a thread-block cluster of up to 8 such blocks (3 for 16-bit `softmax`), a
//! slice each, the cluster combining the blocks' sums through distributed shared memory
//! ([`KernelVariants::clustered_rows`]), where the rows are at least two fifths of the SMs. Rows
//! longer still, or fewer, are streamed by half a block, each thread with several reads in
//! flight: two passes for `softmax` (its maximum and sum in one, online), two for `layer_norm`
//! (its sum and squared deviations in one, [`KernelVariants::one_pass_moments`]); where such
//! rows are fewer than SMs, a row is split over a thread-block cluster of up to 8 blocks
//! ([`KernelVariants::split_rows`]). Lanes combine with
//! shuffles, warps through shared memory. `layer_norm`'s weight and bias are read per access
//! too: where the row's accesses are aligned to the tensor rather than to the columns, with
//! two aligned accesses and a shift ([`load_shifted`]), or, over rows held in registers whose
//! copies fit, from copies staged in shared memory, one per shift ([`StagedOperands`]).
//! The arithmetic is the decomposition's, op for op (`layer_norm`'s `1/sqrt(v)` is
//! `exp(-0.5 * log(v))`), so results differ from the CPU reference by the order of the sums
//! and by CUDA's `expf` and `logf`, a few units in the last place. bf16 and f16 rows are
//! computed in `float` throughout, rounding only the result (as PyTorch's fused `layer_norm` and
//! `softmax` kernels do; the CPU reference, which rounds each prim of the decomposition, is
//! further from exact).
//!
//! Few long rows (333 of 50,257 words) leave these kernels short of a copy's speed (on an H100,
//! 2026-12-06: `softmax` 78-91%, `layer_norm` 63-72%): a block a row runs in waves, loading,
//! reducing and writing in turn. Measured on the H200 against
//! them and not kept, being slower on most of those shapes: a row kept on chip shared by a
//! cluster of 2-8 blocks through distributed shared memory (0.61-1.24x; as two blocks of 512,
//! `split_rows`' first form, 0.81-0.92x on an H100); a persistent block loading its next
//! row while it writes this one (0.78-1.09x); two kernels, a row's statistics then its results
//! by chunk, the second reading from L2 (0.45-1.03x, in two layouts); streaming rows past
//! 32,768 values rather than keeping them (0.59-1.07x). Taking a kept row's statistics in one pass as
//! it arrives (`softmax`'s maximum and sum online, `layer_norm`'s mean and squared deviations
//! an access at a time, merged by Chan et al.'s update) was slower too: 0.76-0.91x over few
//! long rows, 0.76-1.01x over others of 2^24 values or more ([4096, 1024] moved by 15% between
//! identical kernels). Over few long rows these kernels are bound by their instructions as
//! much as by memory (every SM in the same phase at once).

use std::fmt::Write as _;

use super::codegen::{literal, maximum, widen, RegionSource, RegionTarget, EXP2, HALF_CONVERSIONS, MAXIMUM};
use super::row_tiles::RowTiles;
use super::staged_operands::StagedOperands;
use super::KernelVariants;
use crate::core::ir::{prims, DType, SymbolId};
use crate::core::plan::{packing, OpView};

/// Values a thread keeps in registers per row: rows up to `1024 * REGISTER_VALUES` are read once.
const REGISTER_VALUES: usize = 32;

/// Threads per row at most (a block).
const MAX_ROW_THREADS: usize = 1024;

/// Threads an SM runs at once (Hopper, Ampere).
const MAX_SM_THREADS: usize = 2048;

/// Bytes of shared memory CUDA reserves for each block (for its own use, on Hopper).
pub(super) const CUDA_BLOCK_SHARED_BYTES: usize = 1024;

/// Bytes of shared memory a block of a row kernel takes past its row's, at most: the kilobyte
/// CUDA reserves per block, and the kernel's own arrays (a `float` per warp; twice for a
/// streamed `softmax`).
const RESERVED_SHARED_BYTES: usize = CUDA_BLOCK_SHARED_BYTES + 2 * 4 * MAX_ROW_THREADS / 32;

/// Whether `blocks` blocks of a row kernel that each take `shared_bytes` of shared memory fit
/// an SM's `sm_shared` bytes, with [`RESERVED_SHARED_BYTES`] more a block.
pub(super) fn fit_an_sm(blocks: usize, shared_bytes: usize, sm_shared: usize) -> bool {
    blocks * (shared_bytes + RESERVED_SHARED_BYTES) <= sm_shared
}

/// Threads per streamed row (one too long for registers and shared memory).
const STREAMED_ROW_THREADS: usize = 512;

/// Blocks a streamed row is split over at most ([`KernelVariants::split_rows`]): CUDA's portable
/// cluster size.
pub(super) const MAX_CLUSTER_BLOCKS: usize = 8;

/// Blocks a streamed row is split over at most with [`KernelVariants::wave_clusters_of_16`]:
/// CUDA's non-portable cluster size on Hopper.
const MAX_WAVE_CLUSTER_BLOCKS: usize = 16;

/// Clusters keep rows too long for a block only where the rows are at least this share of the
/// GPU's SMs, as (numerator, denominator) ([`KernelVariants::clustered_rows`]): two fifths, 53
/// rows on 132 SMs; fewer stay streamed, split over clusters ([`KernelVariants::split_rows`]).
/// Kept by clusters, 16 and 32 rows ran at 0.63x to 0.95x their split kernels (the H200), 40
/// rows at 0.84x to 0.87x and 48 at 0.66x to 0.77x (an H100, 2026-12-07, f32 and bf16
/// `layer_norm` and `softmax`); 64 rows mostly gained (0.81x to 1.29x: f32 [64, 100003]
/// 1.14-1.17x, f32 `softmax` [64, 200003] 1.29x).
const CLUSTERED_ROWS_SM_SHARE: (usize, usize) = (2, 5);

/// And only where the clusters' blocks fill at least this share (numerator, denominator) of
/// the SM slots their waves take ([`wave_fill`]): kept by clusters of 3, one block an SM, 56
/// rows (168 blocks: two waves on 132 SMs, the second a quarter full, 64% of the slots) ran at
/// 0.64x to 0.79x their split kernels (an H100, 2026-12-08, f32 [56, 131072] and bf16 [56,
/// 262144], `layer_norm` and `softmax`), 60 rows of 200,003 f32 values by clusters of 4 (91%)
/// at 1.06x to 1.19x, 64 rows by clusters of 3 (73%) at 0.81x to 1.17x (3 of 4 faster).
const CLUSTER_WAVE_FILL: (usize, usize) = (7, 10);

/// Whether `blocks`, `per_sm` of them an SM at once on `sms` SMs, fill at least
/// [`CLUSTER_WAVE_FILL`] of the slots of the waves they take (a wave: every SM's slots).
fn wave_fill(blocks: usize, per_sm: usize, sms: usize) -> bool {
    let slots = (per_sm * sms).max(1);
    let (numerator, denominator) = CLUSTER_WAVE_FILL;
    blocks * denominator >= blocks.div_ceil(slots) * slots * numerator
}

/// Blocks of a cluster that keeps a 16-bit `softmax` row as read, at most
/// ([`KernelVariants::long_rows_as_read`]): clusters of 2 and 3 were timed faster than the
/// streamed kernels, of 8 slower; 4 to 7 were not timed.
const MAX_RAW_SOFTMAX_CLUSTER: usize = 3;

/// Accesses a thread of a streamed row makes at once, at least (16 bytes each where the row's
/// length allows; more, up to 16, of narrower ones).
const STREAMED_LOADS: usize = 4;

/// How a row kernel lays a row over threads, from its length and the widest dtype it touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RowLayout {
    /// Threads per row: a power of two, up to 32 (lanes of one warp, several rows per warp) or
    /// up to 1,024 (a block per row).
    pub threads_per_row: usize,
    /// Values per access: 16 bytes of the widest dtype; halved until it divides the row, unless
    /// the accesses are [`aligned`](Self::aligned) to the tensor.
    pub vector: usize,
    /// Accesses per thread, kept on chip; `None` for rows too long for that (streamed).
    pub per_thread: Option<usize>,
    /// Of those, the accesses kept in registers (the first ones); the rest are kept in shared
    /// memory (see [`shared_bytes`](Self::shared_bytes)).
    pub in_registers: usize,
    /// Threads per block: 256, or the threads of a row when a block holds one row.
    pub block: usize,
    /// Whether accesses are aligned to the tensor rather than to the row (rows whose length
    /// the 16-byte access does not divide, such as GPT-2's 50,257 words): a row's first access
    /// starts up to `vector - 1` values before it, in the row above, and the values of the
    /// rows beside it that an access reads count for nothing. An access the row holds whole is
    /// one load; one it shares with a neighbour (two a row at most) is read and written a value
    /// at a time, so that no value past the tensor is read and no row writes another's values.
    pub aligned: bool,
    /// Bytes a value kept in shared memory takes: 4 (widened to `float`), or 2 where a kernel
    /// keeps a 16-bit row there as it was read (`layer_norm` and `softmax` in 16 bits: half the
    /// shared memory and half its traffic).
    pub shared_value_bytes: usize,
}

impl RowLayout {
    /// The layout for rows of `cols` values whose widest dtype takes `widest` bytes, keeping at
    /// most `values` values of a row per thread in registers ([`REGISTER_VALUES`] for a kernel
    /// that keeps one array of a row, fewer for kernels that keep several: rows past
    /// `1024 * values` are streamed).
    pub fn within(cols: usize, widest: usize, values: usize) -> Self {
        Self::laid_out(cols, widest, values, false)
    }

    /// [`within`](Self::within), with accesses aligned to the tensor where `aligned` allows it
    /// and the row's length is not a multiple of 16 bytes (see [`aligned`](Self::aligned)).
    fn laid_out(cols: usize, widest: usize, values: usize, aligned: bool) -> Self {
        let mut vector = 16 / widest.clamp(1, 16);
        // A row no longer than one access gains nothing from it. (Rows of 2^30 values or more
        // keep narrower accesses, as the fused reductions do, whose aligned path counts in
        // 32 bits; the row kernels count in 64, or in 32 below 2^30 with
        // `KernelVariants::int32_row_columns`, and always for `layer_norm`'s aligned rows and
        // 16-bit `softmax` rows kept as read in registers.)
        let aligned = aligned && vector > 1 && !cols.is_multiple_of(vector) && cols > vector && cols < 1 << 30;
        while !aligned && vector > 1 && !cols.is_multiple_of(vector) {
            vector /= 2;
        }
        let vectors = Self::accesses(cols, vector, aligned);
        // At least 8 threads on a row that has the accesses for them, so that one access of a
        // group reads 128 contiguous bytes (a thread per row would scatter a warp's access over
        // 32 rows).
        let mut threads_per_row = vectors.min(8).next_power_of_two();
        while threads_per_row < MAX_ROW_THREADS && vectors.div_ceil(threads_per_row) * vector > values {
            threads_per_row *= 2;
        }
        let fits = vectors.div_ceil(threads_per_row) * vector <= values;
        let per_thread = fits.then(|| vectors.div_ceil(threads_per_row));
        if !fits {
            // Streamed rows take half a block's threads, so that up to four blocks share an SM
            // (as their registers allow): a few hundred rows fill the GPU in one wave, not two.
            threads_per_row = STREAMED_ROW_THREADS;
        }
        let block = if threads_per_row <= 32 { 256 } else { threads_per_row };
        Self {
            threads_per_row,
            vector,
            per_thread,
            in_registers: per_thread.unwrap_or(0),
            block,
            aligned,
            shared_value_bytes: std::mem::size_of::<f32>(),
        }
    }

    /// Accesses of `vector` values that cover a row of `cols` values: one more where they are
    /// aligned to the tensor and the row may start inside one.
    pub(super) fn accesses(cols: usize, vector: usize, aligned: bool) -> usize {
        if aligned {
            (cols + vector - 1).div_ceil(vector)
        } else {
            cols.div_ceil(vector).max(1)
        }
    }

    /// The layout of [`within`](Self::within) with [`REGISTER_VALUES`], but keeping a row too
    /// long for registers in `values` values a thread of registers and up to `shared_limit`
    /// bytes of shared memory (a block of 1,024 threads per row): rows of 65,536 f32 values
    /// take 128 KB past 32 values a thread and are then read once, where streaming them reads
    /// them twice.
    /// (A block of 1,024 threads has 64 registers a thread: kernels that keep more than the row
    /// in them pass fewer `values`, or the row would be spilled to local memory.)
    ///
    /// Rows longer than one access whose length 16 bytes do not divide (shorter than 2^30
    /// values) are read with accesses aligned to the tensor ([`aligned`](Self::aligned)), the
    /// kernels of `softmax` and `layer_norm` being written for that.
    ///
    /// Each value kept in shared memory takes `shared_value_bytes` (see
    /// [`shared_value_bytes`](Self::shared_value_bytes)): 4, or a 16-bit dtype's 2 where the
    /// kernel keeps its row as read.
    pub fn on_chip(cols: usize, widest: usize, values: usize, shared_limit: usize, shared_value_bytes: usize) -> Self {
        Self::on_chip_by(cols, widest, values, shared_limit, shared_value_bytes, MAX_ROW_THREADS)
    }

    /// [`on_chip`](Self::on_chip), with a block of `threads` per row (a power of two, 1,024 at
    /// most) where the row is kept in shared memory too: each thread keeps more of it there, in
    /// `values` values of registers as before.
    fn on_chip_by(
        cols: usize,
        widest: usize,
        values: usize,
        shared_limit: usize,
        shared_value_bytes: usize,
        threads: usize,
    ) -> Self {
        let layout = Self::laid_out(cols, widest, REGISTER_VALUES, true);
        if layout.per_thread.is_some() {
            return layout;
        }
        let accesses = Self::accesses(cols, layout.vector, layout.aligned);
        let kept = layout.kept(accesses, threads, values, shared_value_bytes);
        if kept.shared_bytes() <= shared_limit {
            kept
        } else {
            layout
        }
    }

    /// The layout of a slice of a row of `cols` values kept on chip by a thread-block cluster of
    /// `cluster` blocks of 1,024 threads ([`KernelVariants::clustered_rows`]): the row's
    /// accesses (as [`on_chip`](Self::on_chip) lays them) in `cluster` runs of as many (the
    /// last one shorter), block `k` of the cluster keeping the `k`-th, `values` values a thread
    /// in registers and the rest in shared memory; `None` where a slice takes more than
    /// `shared_limit`.
    fn kept_by_cluster(
        cols: usize,
        widest: usize,
        values: usize,
        shared_limit: usize,
        shared_value_bytes: usize,
        cluster: usize,
    ) -> Option<Self> {
        let layout = Self::laid_out(cols, widest, REGISTER_VALUES, true);
        let slice = Self::accesses(cols, layout.vector, layout.aligned).div_ceil(cluster);
        let kept = layout.kept(slice, MAX_ROW_THREADS, values, shared_value_bytes);
        (kept.shared_bytes() <= shared_limit).then_some(kept)
    }

    /// A block of `threads` that keeps `accesses` of this layout's accesses (its `vector` and
    /// `aligned`), `values` values a thread in registers and the rest in shared memory,
    /// `shared_value_bytes` a value.
    fn kept(self, accesses: usize, threads: usize, values: usize, shared_value_bytes: usize) -> Self {
        let per_thread = accesses.div_ceil(threads);
        Self {
            threads_per_row: threads,
            per_thread: Some(per_thread),
            in_registers: (values / self.vector).clamp(1, per_thread),
            block: threads,
            shared_value_bytes,
            ..self
        }
    }

    /// Bytes of shared memory a block keeps its row's values in (past those in registers).
    pub fn shared_bytes(&self) -> usize {
        let spilled = self.per_thread.unwrap_or(0).saturating_sub(self.in_registers);
        spilled * self.threads_per_row * self.vector * self.shared_value_bytes
    }

    /// Whether the row is held in registers alone (none of it in shared memory).
    pub fn in_registers_alone(&self) -> bool {
        self.per_thread == Some(self.in_registers)
    }

    /// Rows one block handles.
    pub fn rows_per_block(&self) -> usize {
        self.block / self.threads_per_row
    }

    /// Accesses a thread of a streamed row makes at once: [`STREAMED_LOADS`], more (up to 16)
    /// of accesses narrower than 16 bytes.
    pub fn streamed_loads(&self) -> usize {
        (16 / self.vector).clamp(STREAMED_LOADS, 16)
    }

    /// Values of a streamed row its threads take in one round (each making
    /// [`streamed_loads`](Self::streamed_loads) accesses).
    pub fn streamed_stride(&self) -> usize {
        self.streamed_loads() * self.threads_per_row * self.vector
    }

    /// A thread's rounds over a streamed row of `cols` values, at most (its first column is
    /// `-shift` or later).
    pub fn streamed_rounds(&self, cols: usize) -> usize {
        (Self::accesses(cols, self.vector, self.aligned) * self.vector).div_ceil(self.streamed_stride())
    }
}

/// The GPU a row kernel is generated for: the limits its layout is chosen from.
#[derive(Clone, Copy, Debug)]
pub(super) struct RowTarget {
    /// Bytes of shared memory a block may keep a row in (0 streams rows too long for
    /// registers).
    pub shared_limit: usize,
    /// Bytes of shared memory an SM holds; 0 where unknown.
    pub sm_shared: usize,
    /// What every generated kernel is chosen by: L2, SMs, clusters.
    pub region: RegionTarget,
}

/// A row kernel's source and its launch.
#[derive(Debug)]
pub(super) struct RowSource {
    pub source: RegionSource,
    /// Its layout (a launch gives each block [`shared_bytes`](Self::shared_bytes) of shared
    /// memory).
    pub layout: RowLayout,
    /// Blocks to launch (each loops over further rows past CUDA's grid limit, and past the
    /// blocks an SM runs at once where `layer_norm` stages its weight and bias). A kernel that
    /// splits its rows over thread-block clusters ([`KernelVariants::split_rows`]) declares
    /// their size (`__cluster_dims__`), so that a plain launch runs its blocks as clusters:
    /// then a whole number of clusters ([`RegionSource::cluster`]).
    pub blocks: u32,
    /// Bytes of shared memory a block takes: the row's ([`RowLayout::shared_bytes`]), or
    /// `layer_norm`'s weight and bias [staged](StagedOperands) there.
    pub shared_bytes: usize,
}

/// Where an access's cache lines go: kept as usual, or marked to be evicted first (PTX's
/// `.cs` hint, `__ldcs` and `__stcs`: data read or written once, which leaves L2 to what is
/// read again). [`KernelVariants::streaming_rows`] streams the rows that row kernels keep on
/// chip, and the inputs that fused reductions read whole (`codegen`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Caching {
    /// Plain loads and stores.
    Kept,
    /// `__ldcs` and `__stcs`.
    Streamed,
}

impl Caching {
    /// The C that reads one access of type `ty` at element pointer `ptr`.
    pub(super) fn read(self, ty: &str, ptr: &str) -> String {
        match self {
            Caching::Kept => format!("*reinterpret_cast<const {ty}*>({ptr})"),
            Caching::Streamed => format!("__ldcs(reinterpret_cast<const {ty}*>({ptr}))"),
        }
    }

    /// The C statement that writes `value`, one access of type `ty`, at element pointer `ptr`.
    pub(super) fn write(self, ty: &str, ptr: &str, value: &str) -> String {
        match self {
            Caching::Kept => format!("*reinterpret_cast<{ty}*>({ptr}) = {value};"),
            Caching::Streamed => format!("__stcs(reinterpret_cast<{ty}*>({ptr}), {value});"),
        }
    }

    /// The C that reads one access at `typed`, a pointer of the access's own type.
    pub(super) fn load(self, typed: &str) -> String {
        match self {
            Caching::Kept => format!("*({typed})"),
            Caching::Streamed => format!("__ldcs({typed})"),
        }
    }

    /// The C statement that writes `value` at `typed`, a pointer of the value's own type.
    pub(super) fn store(self, typed: &str, value: &str) -> String {
        match self {
            Caching::Kept => format!("*({typed}) = {value};"),
            Caching::Streamed => format!("__stcs({typed}, {value});"),
        }
    }
}

/// The C that loads `vector` values of `dtype` at element pointer `ptr` (aligned to the
/// access) into `float dst[0..vector]`, with one access of up to 16 bytes.
pub(super) fn load(dtype: DType, vector: usize, ptr: &str, dst: &str) -> String {
    load_cached(dtype, vector, ptr, dst, Caching::Kept)
}

/// [`load`], its access cached as `caching` says (a value narrower than 4 bytes is read plainly).
fn load_cached(dtype: DType, vector: usize, ptr: &str, dst: &str, caching: Caching) -> String {
    debug_assert!(!dtype.is_integer(), "row loads read floats, not {dtype}");
    if vector * dtype.size_bytes() < 4 {
        return format!("{dst}[0] = {};", widen(dtype, &format!("(unsigned int)*({ptr})")));
    }
    let ty = raw_type(dtype, vector);
    format!("{{ const {ty} t = {};{} }}", caching.read(ty, ptr), widen_raw(dtype, vector, "t", dst))
}

/// The CUDA type that holds `vector` values of `dtype` as one access reads them (the bits, not
/// yet widened to `float`): for kernels that keep several accesses in flight in as few
/// registers as they take.
pub(super) fn raw_type(dtype: DType, vector: usize) -> &'static str {
    let bytes = vector * dtype.size_bytes();
    if bytes < 4 {
        "unsigned short"
    } else {
        word_vector(bytes / 4).0
    }
}

/// The C that loads `vector` values of `dtype` at `ptr` (aligned to the access) into `raw`, of
/// [`raw_type`], with one access cached as `caching` says (a value narrower than 4 bytes is
/// read plainly).
pub(super) fn load_raw(dtype: DType, vector: usize, ptr: &str, raw: &str, caching: Caching) -> String {
    debug_assert!(!dtype.is_integer(), "row loads read floats, not {dtype}");
    if vector * dtype.size_bytes() < 4 {
        return format!("{raw} = *({ptr});");
    }
    let ty = raw_type(dtype, vector);
    format!("{raw} = {};", caching.read(ty, ptr))
}

/// The C that widens `raw` (of [`raw_type`]) to `float dst[0..vector]`.
pub(super) fn widen_raw(dtype: DType, vector: usize, raw: &str, dst: &str) -> String {
    let bytes = vector * dtype.size_bytes();
    if bytes < 4 {
        return format!(" {dst}[0] = {};", widen(dtype, &format!("(unsigned int){raw}")));
    }
    let fields = word_vector(bytes / 4).1;
    let mut c = String::new();
    for (w, f) in fields.iter().enumerate() {
        let word = if fields.len() == 1 { raw.to_string() } else { format!("{raw}.{f}") };
        if dtype.size_bytes() == 4 {
            let _ = write!(c, " {dst}[{w}] = __uint_as_float({word});");
        } else {
            let _ = write!(c, " {dst}[{}] = {};", 2 * w, widen(dtype, &word));
            let _ = write!(c, " {dst}[{}] = {};", 2 * w + 1, widen(dtype, &format!("({word} >> 16)")));
        }
    }
    c
}

/// The C that reads the `vector` values of `dtype` (16 bytes of them) at element `o` of `ptr`
/// (an expression of C type `index`, `long long` or `int`, at least 0), where `o` need not be
/// a multiple of `vector`, into `dst` (a `uint4`, as [`load_raw`] reads an aligned access): the
/// aligned access that holds the first value, the next one where the values run into it, and a
/// shift of their words. Two 16-byte loads and a few register moves, where reading the values
/// one by one took `vector` loads (and the L1 bandwidth of as many accesses). The caller checks
/// that both accesses lie in the tensor: `o + vector <= len`, and [`shifted_within`].
pub(super) fn load_shifted(dtype: DType, vector: usize, ptr: &str, o: &str, index: &str, dst: &str) -> String {
    load_shifted_by(dtype, vector, ptr, o, index, dst, &format!("(int)(o_ % {vector})"))
}

/// [`load_shifted`], where `shift` (a C expression, often a constant) is `o % vector`.
pub(super) fn load_shifted_by(
    dtype: DType,
    vector: usize,
    ptr: &str,
    o: &str,
    index: &str,
    dst: &str,
    shift: &str,
) -> String {
    debug_assert_eq!(vector * dtype.size_bytes(), 16, "16-byte accesses");
    let per_word = 4 / dtype.size_bytes();
    let mut c = format!(
        "{{ const {index} o_ = {o}; const int s_ = {shift}; \
         const uint4* const a_ = reinterpret_cast<const uint4*>({ptr} + (o_ - s_)); \
         const uint4 lo_ = a_[0]; const uint4 hi_ = s_ != 0 ? a_[1] : lo_; \
         const unsigned int w_[8] = {{lo_.x, lo_.y, lo_.z, lo_.w, hi_.x, hi_.y, hi_.z, hi_.w}}; \
         const int q_ = s_ / {per_word};"
    );
    // Word `k` of the values' first four (and the next): a select of four, by the shift.
    for k in 0..5 {
        let _ = write!(
            c,
            " const unsigned int p{k}_ = q_ == 0 ? w_[{k}] : q_ == 1 ? w_[{}] : q_ == 2 ? w_[{}] : w_[{}];",
            k + 1,
            k + 2,
            k + 3
        );
    }
    if per_word == 2 {
        // An odd shift takes each word's upper half and the next word's lower half.
        c.push_str(" const unsigned int h_ = (unsigned int)(s_ & 1) * 16u;");
        for (w, f) in ["x", "y", "z", "w"].iter().enumerate() {
            let _ = write!(c, " {dst}.{f} = __funnelshift_r(p{w}_, p{}_, h_);", w + 1);
        }
    } else {
        for (w, f) in ["x", "y", "z", "w"].iter().enumerate() {
            let _ = write!(c, " {dst}.{f} = p{w}_;");
        }
    }
    c.push_str(" }");
    c
}

/// The C condition that the second access [`load_shifted`] makes at element `o` (an integer
/// expression, at least 0) lies in a tensor of `len` elements (an expression), where it makes
/// one: `o` on an access, or the access after `o`'s in the tensor.
pub(super) fn shifted_within(vector: usize, o: &str, len: &str) -> String {
    format!("({o} % {vector} == 0 || {o} - {o} % {vector} + {} <= {len})", 2 * vector)
}

/// The C that stores `float src[0..vector]` as `vector` values of `dtype` at `ptr`, rounding
/// each once, with one access.
pub(super) fn store(dtype: DType, vector: usize, ptr: &str, src: &str) -> String {
    store_cached(dtype, vector, ptr, src, Caching::Kept)
}

/// [`store`], its access cached as `caching` says (a value narrower than 4 bytes is written
/// plainly).
fn store_cached(dtype: DType, vector: usize, ptr: &str, src: &str, caching: Caching) -> String {
    let bits = |e: String| match dtype {
        DType::BF16 => format!("bs_to_bf16({e})"),
        DType::F16 => format!("bs_to_f16({e})"),
        _ => format!("__float_as_uint({e})"),
    };
    let bytes = vector * dtype.size_bytes();
    if bytes < 4 {
        return format!("*({ptr}) = (unsigned short){};", bits(format!("{src}[0]")));
    }
    let (ty, fields) = word_vector(bytes / 4);
    let words: Vec<String> = (0..fields.len())
        .map(|w| match dtype.size_bytes() {
            4 => bits(format!("{src}[{w}]")),
            _ => format!("({} | ({} << 16))", bits(format!("{src}[{}]", 2 * w)), bits(format!("{src}[{}]", 2 * w + 1))),
        })
        .collect();
    if fields.len() == 1 {
        return caching.write(ty, ptr, &words[0]);
    }
    caching.write(ty, ptr, &format!("make_{ty}({})", words.join(", ")))
}

/// The CUDA type of `words` 32-bit words and its fields.
fn word_vector(words: usize) -> (&'static str, &'static [&'static str]) {
    match words {
        4 => ("uint4", &["x", "y", "z", "w"]),
        2 => ("uint2", &["x", "y"]),
        _ => ("unsigned int", &["x"]),
    }
}

/// The C that combines `float acc` over the `t` threads of each row (a power of two: lanes of
/// one warp up to 32, else whole warps of one block, through `__shared__ float partial[]` of a
/// slot per warp of the block, which the kernel declares), so that every thread of the row ends
/// with the row's total. Every lane of the warp (every thread of the block, past a warp) must
/// run it.
pub(super) fn row_reduce(c: &mut String, t: usize, combine: &dyn Fn(&str, &str) -> String) {
    let _ = writeln!(c, "    for (int offset = {}; offset > 0; offset /= 2) {{", t.min(32) / 2);
    // Every lane shuffles, then combines (a shuffle inside a conditional would not run in
    // every lane, and the combination may read its operand twice).
    let _ = writeln!(c, "      const float other = __shfl_xor_sync(0xffffffffu, acc, offset);");
    let _ = writeln!(c, "      acc = {};", combine("acc", "other"));
    let _ = writeln!(c, "    }}");
    if t > 32 {
        // The row's warps: `t / 32` of them from `base` (in a scope of its own: a kernel may
        // reduce several times).
        let _ = writeln!(c, "    {{ const int base = (threadIdx.x / {t}) * {};", t / 32);
        let _ = writeln!(c, "    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;");
        let _ = writeln!(c, "    __syncthreads();");
        let _ = writeln!(c, "    acc = partial[base];");
        let _ = writeln!(c, "    for (int w = 1; w < {}; ++w) acc = {};", t / 32, combine("acc", "partial[base + w]"));
        let _ = writeln!(c, "    __syncthreads(); }}");
    }
}

/// The C that takes the values `float x[vector]` into a thread's running maximum `m` and sum
/// `acc` of exponentials against it (`softmax` read in one pass: the sum is rescaled as the
/// maximum grows).
fn online_softmax_update(c: &mut String, v: usize) {
    let _ = writeln!(c, "      float mv = m; for (int e = 0; e < {v}; ++e) mv = {};", maximum("mv", "x[e]"));
    // Rescaled only when the maximum grows (rarely, after the row's first values).
    let _ = writeln!(c, "      if (mv != m) {{ acc = bs_rescale(acc, m, mv); m = mv; }}");
    let _ = writeln!(
        c,
        "      if (mv != __int_as_float(0xff800000)) for (int e = 0; e < {v}; ++e) acc = acc + bs_exp(x[e] - mv);"
    );
}

/// The C that combines the running maxima `m` and sums `acc` of [`online_softmax_update`] over
/// the `t` threads of a row (as [`row_reduce`]; past a warp through `__shared__ float
/// partial[]` and `partial_sum[]`, a slot per warp), so that every thread ends with the row's.
fn online_softmax_merge(c: &mut String, t: usize) {
    let top = t.min(32);
    let _ = writeln!(c, "    for (int offset = {}; offset > 0; offset /= 2) {{", top / 2);
    let _ = writeln!(c, "      const float om = __shfl_xor_sync(0xffffffffu, m, offset);");
    let _ = writeln!(c, "      const float os = __shfl_xor_sync(0xffffffffu, acc, offset);");
    let _ = writeln!(c, "      const float mm = {};", maximum("m", "om"));
    let _ = writeln!(c, "      acc = bs_rescale(acc, m, mm) + bs_rescale(os, om, mm); m = mm;");
    let _ = writeln!(c, "    }}");
    if t > 32 {
        let _ = writeln!(
            c,
            "    if (threadIdx.x % 32 == 0) {{ partial[threadIdx.x / 32] = m; partial_sum[threadIdx.x / 32] = acc; }}"
        );
        let _ = writeln!(c, "    __syncthreads();");
        let _ = writeln!(c, "    m = partial[0]; acc = partial_sum[0];");
        let _ = writeln!(c, "    for (int w = 1; w < {}; ++w) {{", t / 32);
        let _ = writeln!(c, "      const float mm = {};", maximum("m", "partial[w]"));
        let _ = writeln!(c, "      acc = bs_rescale(acc, m, mm) + bs_rescale(partial_sum[w], partial[w], mm); m = mm;");
        let _ = writeln!(c, "    }}");
        let _ = writeln!(c, "    __syncthreads();");
    }
}

/// Opens the loop over rows of a row kernel whose rows are split over thread-block clusters of
/// `cluster` blocks ([`KernelVariants::split_rows`]), as [`open_rows`] does for a block a row:
/// each cluster takes a row (`valid` throughout, so that every block of the cluster runs each
/// cluster barrier), and `slice` is the block's part of it (its rank in the cluster, set by
/// the caller before the loop: `bs_cluster_rank()`). The caller closes it.
fn open_cluster_rows(c: &mut String, cluster: usize, rows: usize, cols: usize) {
    let _ = writeln!(c, "  const int lane = threadIdx.x;");
    let _ = writeln!(c, "  const unsigned slice = bs_cluster_rank();");
    let _ = writeln!(c, "  for (long long r = blockIdx.x / {cluster}; r < {rows}ll; r += gridDim.x / {cluster}) {{");
    let _ = writeln!(c, "    const bool valid = true;");
    let _ = writeln!(c, "    const long long row = r * {cols}ll;");
}

/// The C a kernel whose rows are split over thread-block clusters begins with (Hopper and
/// later): `bs_cluster_rank()`, the block's rank in its cluster; `bs_cluster_sync()`, a barrier
/// of the cluster's threads that makes each block's shared writes before it visible to the
/// others' reads after it (not `.aligned`, which PTX leaves undefined where a warp arrives
/// diverged, as warp 0 may after thread 0's write; `ptxas` makes the same `UCGABAR_ARV` and
/// `UCGABAR_WAIT` of both, sm_90); `bs_cluster_read(p, rank)`, the `float` at `p` in the shared memory
/// of the cluster's block `rank`.
pub(super) const CLUSTER_HELPERS: &str = r#"__device__ __forceinline__ unsigned bs_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void bs_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ float bs_cluster_read(const float* p, unsigned rank) {
  const unsigned local = (unsigned)__cvta_generic_to_shared(p);
  unsigned remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}
"#;

/// The C that combines `float acc`, each block's total (held by all its threads, after
/// [`row_reduce`]), over the `cluster` blocks of a split row, through each block's `__shared__
/// float bs_cluster_part[2]`: every block combines the totals in rank order, so that all end
/// with the same bits. The second barrier keeps a block from writing its part again (the next
/// reduction, the next row) before the others have read it.
pub(super) fn cluster_reduce(c: &mut String, cluster: usize, combine: &dyn Fn(&str, &str) -> String) {
    let _ = writeln!(c, "    if (threadIdx.x == 0) bs_cluster_part[0] = acc;");
    let _ = writeln!(c, "    bs_cluster_sync();");
    let _ = writeln!(c, "    acc = bs_cluster_read(bs_cluster_part, 0);");
    let _ = writeln!(
        c,
        "    for (unsigned q = 1; q < {cluster}; ++q) {{ const float other = bs_cluster_read(bs_cluster_part, q); acc = {}; }}",
        combine("acc", "other")
    );
    let _ = writeln!(c, "    bs_cluster_sync();");
}

/// [`cluster_reduce`] for the running maxima `m` and sums `acc` of
/// [`online_softmax_merge`]: the pairs of the cluster's blocks, merged in rank order.
fn cluster_softmax_merge(c: &mut String, cluster: usize) {
    let _ = writeln!(c, "    if (threadIdx.x == 0) {{ bs_cluster_part[0] = m; bs_cluster_part[1] = acc; }}");
    let _ = writeln!(c, "    bs_cluster_sync();");
    let _ = writeln!(c, "    m = bs_cluster_read(bs_cluster_part, 0); acc = bs_cluster_read(bs_cluster_part + 1, 0);");
    let _ = writeln!(c, "    for (unsigned q = 1; q < {cluster}; ++q) {{");
    let _ = writeln!(
        c,
        "      const float om = bs_cluster_read(bs_cluster_part, q), os = bs_cluster_read(bs_cluster_part + 1, q);"
    );
    let _ = writeln!(c, "      const float mm = {};", maximum("m", "om"));
    let _ = writeln!(c, "      acc = bs_rescale(acc, m, mm) + bs_rescale(os, om, mm); m = mm;");
    let _ = writeln!(c, "    }}");
    let _ = writeln!(c, "    bs_cluster_sync();");
}

/// Blocks of the thread-block cluster a streamed row is split over
/// ([`KernelVariants::split_rows`]), where a thread's loop over the whole row takes
/// `iterations`: the fewest (a power of two up to [`MAX_CLUSTER_BLOCKS`], each block with an
/// iteration at least) that give each of the GPU's `sms` a block, for `rows` rows; 1 where
/// there are as many rows as SMs, or the SM count is unknown (0).
pub(super) fn cluster_blocks(rows: usize, sms: usize, iterations: usize) -> usize {
    let mut blocks = 1;
    while blocks < MAX_CLUSTER_BLOCKS && rows * blocks < sms && 2 * blocks <= iterations {
        blocks *= 2;
    }
    blocks
}

/// Opens the loop over rows of a row kernel: groups of `t` threads (`lane` of the row), one
/// row `r` each (`valid` where the row exists, starting at element `row`); the loop runs alike
/// in a whole warp (block, for `t > 32`), so that every lane takes part in each shuffle (and
/// barrier). The caller closes it.
pub(super) fn open_rows(c: &mut String, t: usize, rows: usize, cols: usize) {
    let _ = writeln!(c, "  const int lane = threadIdx.x % {t};");
    let _ = writeln!(c, "  const long long first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / {t};");
    let _ = writeln!(c, "  const long long stride = (long long)gridDim.x * blockDim.x / {t};");
    let lead = if t >= 32 { "first".to_string() } else { format!("first - (threadIdx.x % 32) / {t}") };
    let _ = writeln!(c, "  const long long lead = {lead};");
    let _ = writeln!(c, "  for (long long r0 = lead; r0 < {rows}ll; r0 += stride) {{");
    let _ = writeln!(c, "    const long long r = r0 + (first - lead);");
    let _ = writeln!(c, "    const bool valid = r < {rows}ll;");
    let _ = writeln!(c, "    const long long row = r * {cols}ll;");
}

/// One round of a streamed row's loop (its column `col0`): `u` accesses `step` values apart
/// loaded into `float xs[u][vector]` as `accesses` cache them, then, access by access, its
/// values as `float* const x` and whether it `touches` the row as `in_row`. The caller closes
/// the second loop and the round.
fn streamed_round(accesses: &RowAccesses, u: usize, step: usize, touches: &str) -> String {
    let (ix, v, widen) = (accesses.index(), accesses.vector, accesses.widen());
    format!(
        " float xs[{u}][{v}];\n    #pragma unroll\n    for (int u = 0; u < {u}; ++u) {{ const {ix} col = col0 + {widen}u * {step}; {} }}\n    #pragma unroll\n    for (int u = 0; u < {u}; ++u) {{ const {ix} col = col0 + {widen}u * {step}; const bool in_row = {touches}; float* const x = xs[u];",
        accesses.fill("xs[u]"),
    )
}

/// The C of a row kernel's accesses to its row, of `vector` values each. The generated code
/// names the row's first element `row`, the access's first column `col`, whether the access is
/// the thread's to make `valid`, and, where accesses are [`aligned`](RowLayout::aligned) to the
/// tensor, how far before the row its first access starts `shift`. Inputs are `in0`, `in1`,
/// ..., the output `out0`. Columns are of C type [`index`](Self::index).
struct RowAccesses {
    /// The row's dtype (input 0).
    pub input: DType,
    pub vector: usize,
    pub cols: usize,
    /// Whether accesses are aligned to the tensor ([`RowLayout::aligned`]).
    pub aligned: bool,
    /// Whether a value outside the row must be nothing to the row's maximum (`softmax`'s), not
    /// to its sum (`layer_norm`'s): see [`neutral`](Self::neutral).
    pub for_maximum: bool,
    /// Whether columns are counted in 32 bits ([`KernelVariants::int32_row_columns`], and
    /// always `layer_norm`'s [`aligned`](RowLayout::aligned) rows and 16-bit `softmax` rows
    /// kept as read in registers; rows
    /// under 2^30 values: a column, the row's length past it and `shift` all fit).
    pub int_columns: bool,
    /// How the row's whole accesses (input 0's and the output's) are cached.
    pub caching: Caching,
    /// The accesses of each block's slice, where the row is kept by a thread-block cluster, a
    /// slice a block ([`KernelVariants::clustered_rows`]): a block's access `k` is the row's
    /// `k` past the slice's first (at column `slice_col`), and one past the slice (`k` at
    /// least this) lies at column `cols`, outside the row.
    pub slice_accesses: Option<usize>,
}

impl RowAccesses {
    /// The C type of a column (and of `shift`): `int` or `long long`.
    pub fn index(&self) -> &'static str {
        if self.int_columns {
            "int"
        } else {
            "long long"
        }
    }

    /// `n` as a C literal of the columns' type.
    pub fn literal(&self, n: usize) -> String {
        if self.int_columns {
            n.to_string()
        } else {
            format!("{n}ll")
        }
    }

    /// The row's length, as a C literal of the columns' type.
    pub fn count(&self) -> String {
        self.literal(self.cols)
    }

    /// The cast that makes a column expression of `int`s one of the columns' type.
    pub fn widen(&self) -> &'static str {
        if self.int_columns {
            ""
        } else {
            "(long long)"
        }
    }

    /// The column of access `j` of the thread at `lane` of `t` threads a row (an expression):
    /// the thread's first column, then `j` whole strides of the row's threads. Written so, the
    /// compiler addresses each access as one pointer plus a constant (`[p+4096]`); written as
    /// `(j * t + lane) * v`, it joined `j * t` and `lane` by a bitwise or and kept an address
    /// register per access from the loads to the stores, where the streaming hints' loads
    /// (inline assembly) take a register each: f32 `softmax` over rows of 1,024 took 80
    /// registers a thread rather than 64, three blocks an SM rather than four (`ptxas`, sm_90).
    pub fn column_of_access(&self, j: &str, t: usize) -> String {
        if self.slice_accesses.is_some() {
            return self.column_of_access_by_index(j, t);
        }
        let first = self.column(&format!("{}lane", self.widen()));
        format!("{first} + {j} * {}", self.literal(t * self.vector))
    }

    /// [`column_of_access`](Self::column_of_access) as the access's index times `vector`,
    /// `(j * t + lane) * v`: for rows kept partly in shared memory, under whose register bounds
    /// `ptxas` spilled more with the pointer-plus-constant form (f16 `softmax` over rows of
    /// 50,257: 48 -> 72 bytes a thread).
    pub fn column_of_access_by_index(&self, j: &str, t: usize) -> String {
        self.column(&format!("{}{j} * {t} + lane", self.widen()))
    }

    /// What a value outside the row reads as (C): -infinity for a maximum, 0 for a sum.
    pub fn neutral(&self) -> &'static str {
        if self.for_maximum {
            "__int_as_float(0xff800000)"
        } else {
            "0.0f"
        }
    }

    /// [`neutral`](Self::neutral) as a 16-bit value kept as read (C): -infinity's bits in bf16
    /// or f16, or 0.
    pub fn raw_neutral(&self) -> &'static str {
        match (self.for_maximum, self.input) {
            (true, DType::BF16) => "(unsigned short)0xff80",
            (true, _) => "(unsigned short)0xfc00",
            _ => "(unsigned short)0",
        }
    }

    /// The column of the row's access `k` (an expression), of its first value.
    pub fn column(&self, k: &str) -> String {
        let v = self.vector;
        let (slice, shift) = (
            if self.slice_accesses.is_some() { " + slice_col" } else { "" },
            if self.aligned { " - shift" } else { "" },
        );
        let column = format!("({k}) * {v}{shift}{slice}");
        match self.slice_accesses {
            Some(a) => format!("(({k}) < {} ? {column} : {})", self.literal(a), self.count()),
            None => column,
        }
    }

    /// Whether the access at `col` lies in the row whole (one load or store).
    pub fn whole(&self) -> String {
        let (v, cols) = (self.vector, self.count());
        if self.aligned {
            format!("col >= 0 && col + {v} <= {cols}")
        } else {
            format!("col < {cols}")
        }
    }

    /// Whether the access at `col` is the thread's and holds any of the row's values.
    pub fn touches(&self) -> String {
        let (v, cols) = (self.vector, self.count());
        if self.aligned {
            format!("valid && col > -{v} && col < {cols}")
        } else {
            format!("valid && {}", self.whole())
        }
    }

    /// Whether value `e` of the access at `col` is the row's (where an access is shared with
    /// the rows beside it).
    pub fn in_this_row(&self, e: &str) -> String {
        format!("col + {e} >= 0 && col + {e} < {}", self.count())
    }

    /// The C that fills `float dst[vector]` from the access at `col`: the row's values, and
    /// `neutral` for the rest.
    pub fn fill(&self, dst: &str) -> String {
        let load_whole = load_cached(self.input, self.vector, "in0 + row + col", dst, self.caching);
        format!("if (valid && {}) {load_whole}\n      else {{ {} }}", self.whole(), self.fill_part(dst))
    }

    /// The C that fills `float dst[vector]` from an access at `col` that the row does not
    /// hold whole: its values that are the row's (one by one), `neutral` for the rest.
    pub fn fill_part(&self, dst: &str) -> String {
        let (v, neutral) = (self.vector, self.neutral());
        if self.aligned {
            format!(
                "for (int e = 0; e < {v}; ++e) {{ if (valid && {}) {} else {dst}[e] = {neutral}; }}",
                self.in_this_row("e"),
                load(self.input, 1, "in0 + row + col + e", &format!("({dst} + e)"))
            )
        } else {
            format!("for (int e = 0; e < {v}; ++e) {dst}[e] = {neutral};")
        }
    }

    /// The C that fills `*dst` (`dst` points to a [`raw_type`]: 16-bit values as read) from
    /// the access at `col`: one load where the row holds it whole, else the row's values one by
    /// one and `raw_neutral` for the rest, as [`fill`](Self::fill) does in `float`s.
    pub fn fill_raw(&self, dst: &str) -> String {
        let whole_load = load_raw(self.input, self.vector, "in0 + row + col", &format!("*{dst}"), self.caching);
        format!("if (valid && {}) {whole_load}\n      else {{ {} }}", self.whole(), self.fill_raw_part(dst))
    }

    /// The whole-access half of [`fill_raw`](Self::fill_raw) (`raw`) or [`fill`](Self::fill):
    /// the one load where the row holds the access whole, nothing else.
    pub fn fill_whole(&self, dst: &str, raw: bool) -> String {
        let load = if raw {
            load_raw(self.input, self.vector, "in0 + row + col", &format!("*{dst}"), self.caching)
        } else {
            load_cached(self.input, self.vector, "in0 + row + col", dst, self.caching)
        };
        format!("if (valid && {}) {load}", self.whole())
    }

    /// The other half: the access's values one by one where the row does not hold it whole.
    pub fn fill_rest(&self, dst: &str, raw: bool) -> String {
        let part = if raw { self.fill_raw_part(dst) } else { self.fill_part(dst) };
        format!("if (!(valid && {})) {{ {part} }}", self.whole())
    }

    /// The C that fills `*dst` (as [`fill_raw`](Self::fill_raw)) from an access at `col` that
    /// the row does not hold whole: its values that are the row's, one by one, and
    /// `raw_neutral` for the rest.
    fn fill_raw_part(&self, dst: &str) -> String {
        let (v, raw_neutral) = (self.vector, self.raw_neutral());
        let rest = if self.aligned {
            format!("(valid && {}) ? *(in0 + row + col + e) : {raw_neutral}", self.in_this_row("e"))
        } else {
            raw_neutral.to_string()
        };
        format!("unsigned short parts[{v}]; for (int e = 0; e < {v}; ++e) parts[e] = {rest}; memcpy({dst}, parts, sizeof(parts));")
    }

    /// The C that fills the 16 bytes of shared memory at `dst` with the access at `col` as read
    /// (a 16-bit row kept as read, `raw`; else `f32` values, whose bits are the same): where the
    /// row holds the access whole, one asynchronous copy that takes no register
    /// ([`KernelVariants::async_row_copies`], `bs_copy_async`, waited for by `bs_copies_done`, or
    /// access by access by `bs_copies_wait` with [`KernelVariants::overlapped_first_pass`]),
    /// else as [`fill_raw`](Self::fill_raw) or [`fill`](Self::fill) fill it, value by value.
    pub fn fill_async(&self, dst: &str, raw: bool) -> String {
        let part = if raw { self.fill_raw_part(dst) } else { self.fill_part(dst) };
        format!("if (valid && {}) bs_copy_async({dst}, in0 + row + col);\n      else {{ {part} }}", self.whole())
    }

    /// The C that writes `float y[vector]` to the row's values of the access at `col`, as
    /// `dtype`.
    pub fn put(&self, dtype: DType) -> String {
        let v = self.vector;
        let store_whole = store_cached(dtype, v, "out0 + row + col", "y", self.caching);
        if self.aligned {
            format!(
                "if ({}) {store_whole}\n        else for (int e = 0; e < {v}; ++e) if ({}) {}",
                self.whole(),
                self.in_this_row("e"),
                store(dtype, 1, "out0 + row + col + e", "(y + e)")
            )
        } else {
            store_whole
        }
    }

    /// The C that reads `float p[vector]` of a `[cols]` operand `in{k}` of `dtype` at the
    /// access's columns. `shift` is `col % vector` for an access the row holds whole (the same
    /// for every access of the row), where it is known when the kernel is generated; `None`
    /// takes it at run time.
    pub fn read_columns(&self, k: usize, dtype: DType, shift: Option<usize>) -> String {
        let (v, cols) = (self.vector, self.count());
        let per_value = format!(
            "for (int e = 0; e < {v}; ++e) {{ if ({}) {} else p[e] = 0.0f; }}",
            self.in_this_row("e"),
            load(dtype, 1, &format!("in{k} + col + e"), "(p + e)")
        );
        if self.aligned && v * dtype.size_bytes() == 16 {
            // The row's accesses are aligned to the tensor, not to the columns: an access the
            // row holds whole reads its columns with two aligned accesses and a shift, where
            // both lie in the operand; the rest a value at a time.
            format!(
                "if (col >= 0 && col + {v} <= {cols} && {}) {{ uint4 q; {}{} }}\n          else {per_value}",
                shifted_within(v, "col", &cols),
                match shift {
                    Some(s) => load_shifted_by(dtype, v, &format!("in{k}"), "col", self.index(), "q", &s.to_string()),
                    None => load_shifted(dtype, v, &format!("in{k}"), "col", self.index(), "q"),
                },
                widen_raw(dtype, v, "q", "p")
            )
        } else if self.aligned {
            per_value
        } else {
            load(dtype, v, &format!("in{k} + col"), "p")
        }
    }
}

/// log2 of the factor by which a bf16 `softmax` with [`KernelVariants::fast_exp2`] scales the
/// exponentials of its results (`bs_exp_out`) so that none that rounds to a bf16 value (down to
/// 2^-133) falls below 2^-126, where `bs_exp2` flushes to 0: the smallest such result is at
/// least 2^-134 before the scale, 2^-126 after it. The largest, 2^8, leaves every sum of up to
/// 2^30 values finite.
const OUT_SCALE_LOG2: i32 = 8;

/// The C of [`KernelVariants::async_row_copies`]: `bs_copy_async(dst, src)` copies 16 bytes of
/// global memory into shared memory without passing through registers (`cp.async.cg`, on
/// Ampere and later; a load and a store before); `bs_copies_done()` waits for the thread's
/// copies; `bs_copies_commit()` closes a group of them and `bs_copies_wait<N>()` waits for all
/// but the last `N` groups ([`KernelVariants::overlapped_first_pass`]).
///
/// No copy takes an L2 cache hint. `softmax` rows take them always; `layer_norm` rows only
/// where their accesses are kept as usual ([`Caching::Kept`]): rows the streaming hints mark
/// are read through registers with the hint, as without the variant, so that they leave the
/// weight and bias in L2. The copies took the hint's L2 eviction policy until some kernels
/// stopped on an H100 with `CUDA_ERROR_ILLEGAL_INSTRUCTION` (2026-12-06): f32 `softmax` over
/// [100, 65537] and [200, 65537] with the default variants, where `compute-sanitizer` put the
/// fault at the copy (`LDGSTS.E.BYPASS.128 [R47+UR0], desc[UR1][R44.64]`). In every kernel
/// that faulted, `ptxas` (sm_90) had addressed shared memory through a uniform register and
/// put the policy in an odd one (`desc[UR1]`); in every one that ran, neither; creating the
/// policy inside the copy's own `asm` gave the same code. Copies without the policy ran f32
/// `layer_norm` over 1 GiB ([4096, 65536]) at 0.82x, most likely because rows not marked to be
/// evicted first pushed the weight and bias, read again by every row, out of L2; so hinted
/// `layer_norm` rows keep their loads. `softmax`, which reads nothing again, copies hinted
/// rows too: 1.06x at the median over 15 cases of 50,257 to 65,537 values (an H100).
fn async_copies() -> String {
    format!(
        "{COPY_ASYNC}__device__ __forceinline__ void bs_copies_done() {{\n\
         #if __CUDA_ARCH__ >= 800\n  asm volatile(\"cp.async.wait_all;\" ::: \"memory\");\n#endif\n}}\n\
         __device__ __forceinline__ void bs_copies_commit() {{\n\
         #if __CUDA_ARCH__ >= 800\n  asm volatile(\"cp.async.commit_group;\" ::: \"memory\");\n#endif\n}}\n\
         template <int N> __device__ __forceinline__ void bs_copies_wait() {{\n\
         #if __CUDA_ARCH__ >= 800\n  asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(N) : \"memory\");\n#endif\n}}\n"
    )
}

/// The C of `bs_copy_async(dst, src)`: 16 bytes of global memory copied into shared memory
/// without passing through registers (`cp.async.cg`, on Ampere and later; a load and a store
/// before), as [`async_copies`] and the pipelined tiles (`row_tiles`) take it.
pub(super) const COPY_ASYNC: &str = "__device__ __forceinline__ void bs_copy_async(void* dst, const void* src) {\n\
     #if __CUDA_ARCH__ >= 800\n  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);\n  \
     asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16;\" :: \"r\"(s), \"l\"(src) : \"memory\");\n\
     #else\n  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);\n#endif\n}\n";

/// The C of `bs_max2(a, b)`: the maximum of two 32-bit words of two `dtype` (f16 or bf16)
/// values each, half by half, NaN if either half is, as [`maximum`] of the widened values
/// (exact: a maximum rounds nothing). One instruction from Ampere on (`max.NaN.f16x2`,
/// `max.NaN.bf16x2`); before, each half compared as `float`.
fn max_of_pairs(dtype: DType) -> String {
    let ty = if dtype == DType::BF16 { "bf16x2" } else { "f16x2" };
    format!(
        "__device__ __forceinline__ unsigned int bs_max2(unsigned int a, unsigned int b) {{\n\
         #if __CUDA_ARCH__ >= 800\n  unsigned int d; asm(\"max.NaN.{ty} %0, %1, %2;\" : \"=r\"(d) : \"r\"(a), \"r\"(b)); return d;\n\
         #else\n  unsigned int d = 0u;\n  for (int h = 0; h < 32; h += 16) {{ const float x = {}, y = {}; \
         d |= (((x != x || x > y) ? a >> h : b >> h) & 0xffffu) << h; }}\n  return d;\n#endif\n}}\n",
        widen(dtype, "(a >> h)"),
        widen(dtype, "(b >> h)")
    )
}

/// Two `dtype` (f16 or bf16) values of minus infinity in a 32-bit word: where `bs_max2` starts.
fn lowest_pair(dtype: DType) -> &'static str {
    if dtype == DType::BF16 {
        "0xff80ff80u"
    } else {
        "0xfc00fc00u"
    }
}

/// A built-in `softmax` or `layer_norm` bound symbol, as its kernels read it.
pub(super) struct RowOp {
    /// Which of the two.
    pub id: SymbolId,
    pub rows: usize,
    /// The row's length (the last axis).
    pub cols: usize,
    /// The tensors' dtypes: the rows', then `layer_norm`'s weight and bias where it has them.
    pub dtypes: Vec<DType>,
    pub out_dtype: DType,
    /// The kernel parameters of those tensors (`in0`, `in1`, ...).
    pub params: Vec<String>,
    /// Their lengths in words.
    pub input_lengths: Vec<usize>,
}

impl RowOp {
    /// The op, or why it is not one of those composites (or breaks their rules: checked
    /// again here, since the kernels rely on them).
    pub fn of(op: &OpView<'_>) -> Result<Self, String> {
        let id =
            op.symbol().builtin_composite().ok_or_else(|| format!("`{}` is not a built-in composite", op.name()))?;
        let shape = op.input_shape(0).map_err(|e| e.to_string())?;
        let cols = *shape.last().ok_or_else(|| format!("`{}` of a rank-0 tensor", op.name()))?;
        let rows: usize = shape[..shape.len() - 1].iter().product();
        let tensors = op.bound_symbol().inputs().count();
        let dtypes: Vec<DType> = op.bound_symbol().inputs().map(|v| op.dtype_of(v)).collect();
        let out_dtype = op.dtype_of(op.bound_symbol().outputs()[0]);
        let mut input_lengths = vec![packing::words(dtypes[0], rows * cols)];
        let mut params = vec![format!("const {}* __restrict__ in0", super::codegen::element_type(dtypes[0]))];
        match id {
            prims::SOFTMAX if tensors == 1 => {}
            prims::LAYER_NORM if tensors <= 3 => {
                for (k, &dtype) in dtypes.iter().enumerate().skip(1) {
                    let s = op.input_shape(k).map_err(|e| e.to_string())?;
                    if s != [cols] {
                        return Err(format!("layer_norm's weight and bias must be [{cols}], not {s:?}"));
                    }
                    params.push(format!("const {}* __restrict__ in{k}", super::codegen::element_type(dtype)));
                    input_lengths.push(packing::words(dtype, cols));
                }
            }
            _ => return Err(format!("no row kernel for `{}` with {tensors} tensor argument(s)", op.name())),
        }
        Ok(Self { id, rows, cols, dtypes, out_dtype, params, input_lengths })
    }

    /// Whether a `softmax` into `out_dtype` takes its results' exponentials with `bs_exp_out`,
    /// scaled by 2^[`OUT_SCALE_LOG2`]: bf16 results with `fast_exp2`, whose subnormals
    /// (2^-133 to 2^-126) `bs_exp2` would flush to 0. (f16's least value is 2^-24.)
    pub fn scales_results(out_dtype: DType, fast_exp2: bool) -> bool {
        fast_exp2 && out_dtype == DType::BF16
    }

    /// The C the kernels of `softmax` (`id`) or `layer_norm` over `dtypes` into `out_dtype`
    /// begin with: 16-bit conversions, and `softmax`'s maximum and exponential, with
    /// `bs_rescale` where its sums are `rescaled` (taken against different maxima). With
    /// `fast_exp2` ([`KernelVariants::fast_exp2`]) a 16-bit `softmax` takes `bs_exp2`, and a
    /// bf16 one also `bs_exp_out`, its results' exponential times 2^[`OUT_SCALE_LOG2`] (see
    /// [`scales_results`](Self::scales_results)).
    pub fn preamble(id: SymbolId, dtypes: &[DType], out_dtype: DType, rescaled: bool, fast_exp2: bool) -> String {
        let mut c = String::new();
        if dtypes.iter().chain([&out_dtype]).any(|&d| packing::is_packed(d)) {
            c.push_str(HALF_CONVERSIONS);
        }
        if id == prims::SOFTMAX {
            c.push_str(MAXIMUM);
            // `expf` for f32 results; for 16-bit ones the hardware's `exp2` (2 units in the last
            // place of f32, far inside a 16-bit rounding, as `torch.compile`'s kernels take it).
            let exp = match (packing::is_packed(out_dtype), fast_exp2) {
                (true, true) => {
                    c.push_str(EXP2);
                    "bs_exp2(x * 1.44269504088896341f)"
                }
                (true, false) => "exp2f(x * 1.44269504088896341f)",
                _ => "expf(x)",
            };
            let _ = writeln!(c, "__device__ __forceinline__ float bs_exp(float x) {{ return {exp}; }}");
            if Self::scales_results(out_dtype, fast_exp2) {
                // 2^8 e^x: `x * log2(e) + 8` in one rounding (its exponent's error, 2^-18 at most
                // near 2^-126, 2e-6 relative, is far inside bf16's rounding), so that results
                // down to 2^-134 are not flushed.
                let _ = writeln!(
                    c,
                    "__device__ __forceinline__ float bs_exp_out(float x) {{ return bs_exp2(fmaf(x, 1.44269504088896341f, {OUT_SCALE_LOG2}.0f)); }}"
                );
            }
        }
        if id == prims::SOFTMAX && rescaled {
            // A sum of exponentials taken against maximum `from`, against `to` instead (equal
            // ones, infinities included, need no factor; a NaN stays NaN). Rescaled sums are of
            // `bs_exp`, never scaled by `bs_exp_out`'s factor.
            c.push_str("__device__ __forceinline__ float bs_rescale(float s, float from, float to) {\n");
            c.push_str("  return from == to ? s : s * bs_exp(from - to);\n}\n");
        }
        c
    }
}

/// The kernel for a built-in `softmax` or `layer_norm` bound symbol, or why there is none, for
/// the GPU `target`. Rows too long for registers are kept in up to its `shared_limit` bytes of
/// shared memory per block beside them ([`RowLayout::on_chip`]; 0 streams them). A 16-bit row
/// kept there as read runs two blocks an SM, not one, where two fit in its `sm_shared` bytes
/// (an SM's shared memory): blocks of 512 threads (64 registers a thread) for `layer_norm` and
/// for `softmax` over rows 16 bytes do not divide, where two blocks of 512 fit; blocks of
/// 1,024 (32 registers) for `softmax` over other rows, where two of 1,024 fit. `variants`
/// chooses the kernel's [`KernelVariants`]: `keep_in_l2` against the target's `l2_bytes`,
/// `split_rows` against its `sms` and `clusters`.
///
/// # Errors
/// Not one of those composites, or shapes that break their rules (checked again here, since
/// the kernel relies on them).
pub(super) fn row_source(
    op: &OpView<'_>,
    kernel: &str,
    target: RowTarget,
    variants: KernelVariants,
) -> Result<RowSource, String> {
    let RowTarget { shared_limit, sm_shared, region: RegionTarget { l2_bytes, sms, clusters } } = target;
    let row = RowOp::of(op)?;
    // Short rows of odd lengths: a block's tile of them at a time (`row_tiles`).
    if let Some(tiles) = RowTiles::for_rows(row.id, row.rows, row.cols, row.dtypes[0], row.out_dtype, variants) {
        return tiles.source(row, op, kernel, target, variants);
    }
    let RowOp { id, rows, cols, dtypes, out_dtype, mut params, input_lengths } = row;
    let numel = rows * cols;
    let tensors = dtypes.len();
    params.push(format!("{}* __restrict__ out0", super::codegen::element_type(out_dtype)));
    params.push("long long n".into());
    let widest = dtypes.iter().chain([&out_dtype]).map(|d| d.size_bytes()).max().unwrap_or(4);
    // `layer_norm` keeps its weight and bias beside the row: a quarter of the registers for the
    // row where it is kept in shared memory too (ptxas spilled 276 bytes a thread with 32
    // values, 80 with 16, none with 8, at rows of 65,536 f32 values).
    // A 16-bit row is kept in shared memory as read, half the bytes of `float`s (`softmax`
    // then takes each exponential twice, for the sum and for the result, where it kept them),
    // and with a quarter of the registers too, so that two blocks share an SM where the row
    // fits twice (see `two_blocks` below). `softmax` does so for rows it kept on chip as
    // `float`s (up to 90,112 values), and for longer ones with `long_rows_as_read`, which were
    // streamed.
    let kept_as_floats = RowLayout::on_chip(cols, widest, REGISTER_VALUES, shared_limit, std::mem::size_of::<f32>());
    let raw_shared = packing::is_packed(dtypes[0])
        && (id == prims::LAYER_NORM || kept_as_floats.per_thread.is_some() || variants.long_rows_as_read);
    // (`layer_norm` measured again with 16 and 32 values in registers, on the H200 after its
    // weight and bias were read per access: 0.81-1.10x, mixed by shape and dtype, so 8 stays.)
    let values = if id == prims::LAYER_NORM || raw_shared { REGISTER_VALUES / 4 } else { REGISTER_VALUES };
    let shared_value_bytes = if raw_shared { dtypes[0].size_bytes() } else { std::mem::size_of::<f32>() };
    let layout = RowLayout::on_chip(cols, widest, values, shared_limit, shared_value_bytes);
    // A 16-bit row kept as read in shared memory by a block of 512 threads, not 1,024, where
    // two such blocks fit an SM's shared memory (16-bit rows of 32,769 to 61,440 values): two
    // rows an SM, each block with 64 registers a thread, where a block of 1,024 had 55 and the
    // SM to itself (`layer_norm`), or 32 and spilled (`softmax`, whose aligned rows spilled
    // 32-44 bytes a thread, rows 16 bytes divide 0-12). Measured on an H100 against those
    // (2026-12-06, two runs of two rounds, `gpu_sweep bf16,f16 softmax,layer_norm` over 36,000 to 61,440
    // values, 64 to 4,096 rows): `layer_norm` 0.99-1.43x (1.09-1.13x over [333, 50257], 1.38-1.43x
    // over 1,335 and 4,096 rows, 0.99-1.00x over 64 and 132 rows: one a block an SM either way);
    // `softmax` over rows of 45,001 and 50,257 1.08-1.31x, over rows 16 bytes divide 0.95-1.08x,
    // so those keep two blocks of 1,024.
    // (Whether two blocks of a layout that keeps part of its row in shared memory fit an SM's,
    // with the kilobyte CUDA reserves per block and the kernel's own arrays.)
    let fits_twice = |l: &RowLayout| l.shared_bytes() > 0 && fit_an_sm(2, l.shared_bytes(), sm_shared);
    let halved = RowLayout::on_chip_by(cols, widest, values, shared_limit, shared_value_bytes, MAX_ROW_THREADS / 2);
    let two_halves = raw_shared
        && layout.shared_bytes() > 0
        && (id == prims::LAYER_NORM || layout.aligned)
        && halved.per_thread.is_some()
        && fits_twice(&halved);
    let layout = if two_halves { halved } else { layout };
    // A 16-bit `layer_norm` row held in registers alone by 1,024 threads (rows of about 16,385
    // to 32,768 values), its accesses 16 bytes of its input: held by 512 instead, the first
    // access a thread in registers and the rest in shared memory as read, two blocks an SM
    // (`KernelVariants::two_register_blocks`), where two such blocks fit an SM's shared memory
    // and one fits a block's limit.
    let held_by_512 = (variants.two_register_blocks
        && id == prims::LAYER_NORM
        && raw_shared
        && layout.in_registers_alone()
        && layout.block == MAX_ROW_THREADS
        && layout.vector * dtypes[0].size_bytes() == 16)
        .then(|| {
            let per_thread = RowLayout::accesses(cols, layout.vector, layout.aligned).div_ceil(MAX_ROW_THREADS / 2);
            RowLayout {
                threads_per_row: MAX_ROW_THREADS / 2,
                block: MAX_ROW_THREADS / 2,
                per_thread: Some(per_thread),
                in_registers: 1,
                shared_value_bytes,
                ..layout
            }
        })
        .filter(|l| l.shared_bytes() <= shared_limit && fits_twice(l));
    let two_register_blocks = held_by_512.is_some();
    let layout = held_by_512.unwrap_or(layout);
    // A row too long for a block to keep on chip, kept by a thread-block cluster of the fewest
    // blocks whose slices fit, and, where rows are fewer than SMs, of enough for a block an SM
    // (`KernelVariants::clustered_rows`): read once and written once, where streamed it was
    // read two or three times. 16-bit `softmax` rows only as read (`long_rows_as_read`): kept
    // as `float`s (32 values a thread in registers: `ptxas` spilled them) they ran at
    // 0.74-0.78x their streamed kernels (an H100, 2026-12-07, [300, 131072] and [1000, 100003]).
    // 16-bit `softmax` rows kept as read (`KernelVariants::long_rows_as_read`) take clusters
    // of up to 3 blocks (2 and 3 were timed faster): kept by 8, 16 rows of 524,288 values ran
    // at 0.50x their streamed kernels (an H100, 2026-12-07; 16 clusters of 8 may not all fit
    // the GPCs at once). Rows fewer than two fifths of the SMs, and clusters whose blocks leave
    // much of their last wave's SMs idle, stay streamed where the streamed row is split over
    // clusters (`CLUSTERED_ROWS_SM_SHARE`, `CLUSTER_WAVE_FILL`); where it would not be
    // (the SM count unknown, or `split_rows` off: a block a row, a few SMs busy), clusters keep it.
    // A streamed thread's accesses a round, twice the layout's with `deeper_streamed_rounds`.
    let depth = if variants.deeper_streamed_rounds { 2 } else { 1 };
    let split = if variants.split_rows && clusters {
        cluster_blocks(rows, sms, layout.streamed_rounds(cols).div_ceil(depth))
    } else {
        1
    };
    let sixteen_bit_softmax = id == prims::SOFTMAX && packing::is_packed(dtypes[0]);
    let most = if sixteen_bit_softmax { MAX_RAW_SOFTMAX_CLUSTER } else { MAX_CLUSTER_BLOCKS };
    let kept_by_cluster = (variants.clustered_rows
        && clusters
        && shared_limit > 0
        && layout.per_thread.is_none()
        && (split == 1 || rows * CLUSTERED_ROWS_SM_SHARE.1 >= sms * CLUSTERED_ROWS_SM_SHARE.0)
        && (!sixteen_bit_softmax || variants.long_rows_as_read))
        .then(|| {
            let least = sms.div_ceil(rows.max(1)).clamp(2, most);
            (least..=most).find_map(|k| {
                RowLayout::kept_by_cluster(cols, widest, values, shared_limit, shared_value_bytes, k).map(|l| (k, l))
            })
        })
        .flatten()
        // Where the row would be split streamed, only clusters whose blocks fill their waves
        // (`CLUSTER_WAVE_FILL`): blocks an SM runs at once by shared memory and threads.
        .filter(|(k, l)| {
            if split == 1 || sm_shared == 0 {
                return true;
            }
            let by_threads = (MAX_SM_THREADS / l.block).max(1);
            let per_sm = (1..=by_threads).rev().find(|&n| fit_an_sm(n, l.shared_bytes(), sm_shared)).unwrap_or(1);
            wave_fill(rows * k, per_sm, sms)
        });
    let layout = kept_by_cluster.map_or(layout, |(_, l)| l);
    let RowLayout { threads_per_row: t, vector: v, block, in_registers, .. } = layout;

    let mut c = String::new();
    let _ = writeln!(c, "// Generated by boundscope for `{}` over rows of {cols}: {layout:?}.", op.name());
    c.push_str(&RowOp::preamble(id, &dtypes, out_dtype, layout.per_thread.is_none(), variants.fast_exp2));
    // A 16-bit row aligned to the tensor and held in registers alone is kept there as read, a
    // `uint4` an access (4 registers for 8 values, not 8), widened in each pass (but
    // `softmax`'s maximum, taken over the values as read: `max_of_pairs`), and counts its
    // columns in 32 bits (`softmax` then takes its exponentials twice, for the sum and for the
    // results). `layer_norm`: `ptxas` (sm_90) spilled such rows under their bound of 64
    // registers (bf16 rows of 12,289: 172 bytes a thread with 64-bit columns, 88 kept as read;
    // none with 32-bit columns, with or without); on an H100 (2026-12-06, `gpu_sweep bf16,f16
    // layer_norm`, with 32-bit columns both ways) 1.04-1.25x over rows of 257 to 12,289 values
    // (1.24-1.25x over [1365, 12289]); over the sweep's 16-bit rows, which 16 bytes divide,
    // 0.95-1.01x (1.00x but one 8 MiB case), so those keep `float`s. `softmax`, on an H100
    // (2026-12-06, `gpu_sweep f32,bf16,f16 softmax` over 7 odd lengths from 257 to 12,289, two
    // rounds, one call): 1.04-1.66x in 16 bits (1.62-1.66x over [1365, 12289], 1.28x bf16
    // [65536, 257], 1.11-1.16x over 513 and 1,001), kept as read alone 1.00-1.61x, 32-bit
    // columns alone 0.94-1.10x; as landed, against the build before in two more calls,
    // 1.03-1.68x. Not over rows of 8 threads or fewer (16-bit rows up to 32 accesses, about
    // 250 values), which are bound by their instructions more than by memory and pay for the
    // second exponentials: [262144, 9] 0.88-0.91x, [65536, 100] 0.90-0.95x ([131072, 33]
    // 1.02-1.05x).
    // `f32` rows keep 64-bit columns: 32-bit ones ran f32 `softmax` [2048, 2049] at 0.83x.
    let raw_registers = layout.aligned
        && layout.in_registers_alone()
        && packing::is_packed(dtypes[0])
        && v * dtypes[0].size_bytes() == 16
        && (id == prims::LAYER_NORM || t >= 16);
    if id == prims::SOFTMAX && raw_registers {
        c.push_str(&max_of_pairs(dtypes[0]));
    }
    // Two blocks of a 16-bit `softmax` row each an SM where their shared memory fits twice
    // (with the kilobyte CUDA reserves per block and the kernel's own arrays): rows of up to
    // 65,536 values kept as read, 8 of a thread's values in registers. A block of 1,024
    // threads with more than 32 registers a thread has the SM to itself: 333 rows of 50,257
    // took three rounds of 132 blocks. Measured on the H200 against one block an SM: `softmax`
    // 1.09-1.18x over 256 and 333 rows, 0.99-1.02x over 4,096; `layer_norm` (kept as read
    // already) only 1.01-1.08x over few rows and 0.92x over 4,096, so it keeps one. (Rows kept
    // as `float`s, 32 values a thread in registers, ran at 0.4x with two: spilled.) `layer_norm`
    // with two, again on an H100 (2026-12-05, `gpu_sweep --variants`, plans on the same inputs):
    // 0.56-0.65x over [333, 50257], 1.15x (bf16) and 0.88x (f16) over [256, 65536], f16 0.72x
    // over [4096, 65536] (bf16 0.98x), the sweep's other 22 16-bit cases 0.97-1.01x. (Two
    // blocks of 512 threads, `two_halves` above, give it the registers those lacked: both are
    // two blocks an SM.)
    let two_blocks = two_halves
        || two_register_blocks
        || (id == prims::SOFTMAX && raw_shared && block == MAX_ROW_THREADS && fits_twice(&layout));
    // A 16-bit `layer_norm` row held in registers alone, by blocks of 256 threads or more: 1,024
    // threads an SM (64 registers a thread), where the compiler took up to 71 and left one
    // block of 512 an SM, its loads idle while it reduced. Measured on the H200 against the
    // compiler's choice: rows of 16,384 1.24-1.34x, of 1,024 1.01-1.02x; `f32` rows spilled
    // (0.49-0.52x) and `softmax` gained nothing (0.99-1.00x), so they keep it. Rows whose
    // accesses are aligned to the tensor (odd lengths), 4 accesses a thread, spilled under it
    // with 64-bit columns (`ptxas`, sm_90: 172-192 bytes a thread over rows of 769, 1,001 and
    // 12,289); half as many threads an SM, `(block, 512 / block)`, spilled nothing but timed
    // 0.74-0.80x over 1,001 and 12,289 (1.05x over 769) on an H100 (2026-12-06), so they keep
    // it too, and since they count their columns in 32 bits and keep their row as read
    // (`raw_registers`, above): no spills.
    let registers_for_1024 =
        id == prims::LAYER_NORM && packing::is_packed(dtypes[0]) && layout.in_registers_alone() && block >= 256;
    let bounds = if two_blocks {
        format!("{block}, 2")
    } else if registers_for_1024 {
        format!("{block}, {}", MAX_ROW_THREADS / block)
    } else {
        block.to_string()
    };
    // `layer_norm`'s weight and bias over rows of odd lengths held in registers: staged in
    // shared memory, a copy for each shift of the row's accesses, where the copies fit the
    // blocks an SM of 1,024 threads (16-bit rows up to 1,017 values, f32 up to 1,021), so that
    // an access reads each with one load where it took two and a shift of their words. On an
    // H100 (2026-12-06, `gpu_sweep f32,bf16,f16 layer_norm`, two runs, with 32-bit columns
    // and 16-bit rows kept as read both ways): 16-bit rows of 257 1.25-1.26x, of 513
    // 1.27-1.28x, of 1,001 1.10x, of 769 1.02-1.03x; f32 rows of 769 1.14x, of 1,001 1.06x, of
    // 257 1.01x, of 513 0.98x. Longer rows (not staged) 0.98-1.01x.
    let staged = (id == prims::LAYER_NORM)
        .then(|| {
            StagedOperands::for_rows(cols, &layout, &dtypes[1..], MAX_ROW_THREADS / block, shared_limit, sm_shared)
        })
        .flatten();
    // A row kept on chip is read once and written once; a streamed row is read again.
    let caching = if variants.streaming_rows && layout.per_thread.is_some() {
        let read = super::codegen::total_words(input_lengths.iter().copied());
        super::codegen::whole_tensors(variants, read, packing::words(out_dtype, numel), l2_bytes)
    } else {
        Caching::Kept
    };
    // Accesses kept in shared memory as read (16 bytes each) are copied there asynchronously:
    // `ptxas` (sm_90) kept a load, then its store, one at a time for all but the first few
    // (16-bit `layer_norm` over rows of 50,257, blocks of 1,024: of the six accesses a thread
    // keeps there, three at once, then three in turn). Not where the streaming hints mark a
    // `layer_norm` row's accesses (`Caching::Streamed`, see `async_copies`): those keep the
    // hint's loads.
    let copy_async = variants.async_row_copies
        && (caching == Caching::Kept || id == prims::SOFTMAX)
        && layout.shared_bytes() > 0
        && (raw_shared || dtypes[0] == DType::F32)
        && v * dtypes[0].size_bytes() == 16;
    if copy_async {
        c.push_str(&async_copies());
    }
    // Each access's copy a group of its own, the first pass waiting for each in turn
    // (`KernelVariants::overlapped_first_pass`): see `close_first` below.
    let overlapped = copy_async && variants.overlapped_first_pass;
    // A streamed thread makes `streamed_loads` accesses at once, `streamed_stride` values of
    // the row apart from one round to the next. With `split_rows`, a row is split over a
    // cluster of blocks where rows are fewer than SMs, in slices of whole rounds, and the passes
    // over a split row alternate in direction.
    // (Rows a block keeps on chip are not split over clusters, only rows too long for one
    // (`clustered_rows`, above): an experiment build split them over clusters of 2 or 4
    // blocks of 256 or 512 threads, each keeping its slice on chip and the cluster combining
    // the sums through distributed shared memory, and so kept f32 rows of 65,536 on chip. On
    // the H200 (2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm
    // 333x50257,256x65536,4096x65536,1024x16384,132x50257`, two rounds) it ran 0.55x to 1.18x
    // the kernels here, median 0.82x to 0.90x by configuration: only f32 `softmax` over
    // [333, 50257] gained (1.08x to 1.18x), `layer_norm` lost up to 0.55x in f32 and 16-bit
    // `softmax` 0.71x to 0.93x.)
    let streamed = layout.per_thread.is_none();
    let (streamed_loads, streamed_stride) = (layout.streamed_loads() * depth, layout.streamed_stride() * depth);
    let streamed_rounds = layout.streamed_rounds(cols).div_ceil(depth);
    // Split over clusters of up to 8 however many the rows, one block an SM
    // (`KernelVariants::streamed_split_waves`): see `shared_bytes` below.
    let waves = streamed && variants.streamed_split_waves && variants.split_rows && clusters && sm_shared > 0;
    let cluster = match kept_by_cluster {
        Some((k, _)) => k,
        None if waves => {
            let most = if variants.wave_clusters_of_16 { MAX_WAVE_CLUSTER_BLOCKS } else { MAX_CLUSTER_BLOCKS };
            (0..).map(|p| 1 << p).take_while(|&k| k <= most && (k == 1 || k <= streamed_rounds)).last().unwrap_or(1)
        }
        None if streamed => split,
        None => 1,
    };
    if cluster > 1 {
        c.push_str(CLUSTER_HELPERS);
    }
    let cluster_dims = if cluster > 1 { format!("__cluster_dims__({cluster}, 1, 1) ") } else { String::new() };
    let _ = writeln!(
        c,
        "extern \"C\" __global__ void {cluster_dims}__launch_bounds__({bounds}) {kernel}({}) {{",
        params.join(", ")
    );
    // A 16-bit row kept as read: one element of `cache` per access.
    let raw = raw_type(dtypes[0], v);
    if layout.shared_bytes() > 0 {
        let _ = writeln!(c, "  extern __shared__ __align__(16) {} cache[];", if raw_shared { raw } else { "float" });
    }
    if t > 32 {
        let _ = writeln!(c, "  __shared__ float partial[{}];", t / 32);
    }
    if t > 32 && id == prims::SOFTMAX && layout.per_thread.is_none() {
        let _ = writeln!(c, "  __shared__ float partial_sum[{}];", t / 32);
    }
    if let Some(staged) = &staged {
        c.push_str(&staged.fill());
    }
    if cluster > 1 {
        let _ = writeln!(c, "  __shared__ float bs_cluster_part[2];");
        open_cluster_rows(&mut c, cluster, rows, cols);
    } else {
        open_rows(&mut c, t, rows, cols);
    }
    let reduce = |c: &mut String, combine: &dyn Fn(&str, &str) -> String| {
        row_reduce(c, t, combine);
        if cluster > 1 {
            cluster_reduce(c, cluster, combine);
        }
    };
    let sum = |a: &str, b: &str| format!("{a} + {b}");
    let max = |a: &str, b: &str| maximum(a, b);
    // The passes: over registers (`j`: the thread's accesses), or, streamed, over the row.
    let aligned = layout.aligned;
    // Values outside the row are nothing to `softmax`'s maximum and sum, and to `layer_norm`'s
    // sums.
    let accesses = RowAccesses {
        input: dtypes[0],
        vector: v,
        cols,
        aligned,
        for_maximum: id == prims::SOFTMAX,
        // `layer_norm`'s aligned rows (all under 2^30 values) count in 32 bits whatever the
        // variant: 64-bit columns spilled them (16-bit rows of 769 and 1,001 in registers: 184
        // and 192 bytes a thread under their bound of 64 registers; none in 32 bits). On an
        // H100 (2026-12-06, `gpu_sweep f32,bf16,f16 layer_norm --variant=int32_row_columns`,
        // two runs): 1.11-1.58x over rows of 257 to 12,289 in 16 bits (1.58x over [8192, 769]),
        // 1.05-1.19x in f32, 0.99-1.04x over rows of 50,257 to 200,003. `softmax` over the same
        // rows gained nothing (0.97-1.10x, f32 [2048, 2049] 0.84x) but where its 16-bit rows
        // are kept as read (`raw_registers`, above); elsewhere it keeps the variant's choice.
        int_columns: (variants.int32_row_columns || (aligned && id == prims::LAYER_NORM) || raw_registers)
            && cols < 1 << 30,
        caching,
        slice_accesses: kept_by_cluster.map(|(k, _)| RowLayout::accesses(cols, v, aligned).div_ceil(k)),
    };
    let ix = accesses.index();
    if aligned {
        // How far before the row its first access starts.
        let _ = writeln!(c, "    const {ix} shift = row % {v};");
    }
    if let Some(a) = accesses.slice_accesses {
        // The column of the block's slice's first access.
        let _ = writeln!(c, "    const {ix} slice_col = ({ix})slice * {};", accesses.literal(a * v));
    }
    let touches = accesses.touches();
    // A streamed row's last pass, its loads the row's last and its stores the results, with
    // the streaming hints where the kernel's tensors do not fit in L2
    // (`KernelVariants::streamed_last_pass_hints`): the first pass's lines, which the last
    // reads back, stay in L2 longer. `streamed_last`: its loops, forward and back.
    let last_accesses = RowAccesses {
        caching: if streamed && variants.streamed_last_pass_hints {
            let read = super::codegen::total_words(input_lengths.iter().copied());
            super::codegen::whole_tensors(variants, read, packing::words(out_dtype, numel), l2_bytes)
        } else {
            accesses.caching
        },
        ..accesses
    };
    let mut streamed_last = None;
    // Each pass opens with `open`, or, where it follows one that ran forward over a split row,
    // with `back` (the same where the row is not split).
    let mut as_read = None;
    let (open, back, close, close_first) = match layout.per_thread {
        Some(n) if in_registers == n => {
            let col = accesses.column_of_access("j", t);
            // The row's registers, the C that fills access `j` of them, and the pass's view of
            // that access's values as `float* const x`.
            let (row, fill, values) = if raw_registers {
                (
                    format!("{raw} vr[{n}];"),
                    format!("{raw}* const dst = vr + j;\n      {}", accesses.fill_raw("dst")),
                    format!(
                        "const {raw} w = vr[j]; float xs[{v}];{} float* const x = xs;",
                        widen_raw(dtypes[0], v, "w", "xs")
                    ),
                )
            } else {
                (
                    format!("float v[{}];", n * v),
                    accesses.fill(&format!("(v + j * {v})")),
                    format!("float* const x = v + j * {v};"),
                )
            };
            let _ = writeln!(c, "    {row}");
            let _ = writeln!(c, "    #pragma unroll");
            let _ = writeln!(c, "    for (int j = 0; j < {n}; ++j) {{");
            let _ = writeln!(c, "      const {ix} col = {col};");
            let _ = writeln!(c, "      {fill}");
            let _ = writeln!(c, "    }}");
            let each = format!("    #pragma unroll\n    for (int j = 0; j < {n}; ++j) {{ const {ix} col = {col}; const bool in_row = {touches};");
            let open = format!("{each} {values}");
            // A pass over a row kept as read that reads its words as they are (`w`).
            as_read = raw_registers.then(|| format!("{each} const {raw} w = vr[j];"));
            (open.clone(), open, "    }".to_string(), "    }".to_string())
        }
        // The first `in_registers` accesses in registers, the rest in shared memory (a block
        // per row: access `j` of thread `lane` at `cache[((j - r) * t + lane) * v]`). Each pass
        // is a lambda over an access, run over both.
        Some(n) => {
            let r = in_registers;
            let col = accesses.column_of_access_by_index("j", t);
            // Registers are indexed only where the loop is unrolled (a constant index), or they
            // would go to local memory.
            let (in_registers, in_shared) = if raw_shared {
                (format!("v + j * {v}"), format!("cache + ((j - {r}) * {t} + lane)"))
            } else {
                (format!("v + j * {v}"), format!("cache + ((j - {r}) * {t} + lane) * {v}"))
            };
            let _ = writeln!(c, "    float v[{}];", r * v);
            for (from, to, dst) in [(0, r, &in_registers), (r, n, &in_shared)] {
                let shared = dst == &in_shared;
                // A 16-bit row kept as read in shared memory (the values outside the row
                // `neutral` in 16 bits); `float`s elsewhere.
                let ty = if shared && raw_shared { raw } else { "float" };
                // A loop over the accesses from `from` to `to` that fills each at `dst` by `body`.
                let fill_loop = |c: &mut String, body: &str| {
                    let _ = writeln!(c, "    #pragma unroll");
                    let _ = writeln!(c, "    for (int j = {from}; j < {to}; ++j) {{");
                    let _ = writeln!(c, "      const {ix} col = {col};");
                    let _ = writeln!(c, "      {ty}* const dst = {dst};");
                    let _ = writeln!(c, "      {body}");
                    let _ = writeln!(c, "    }}");
                };
                let split = shared && !copy_async && variants.split_row_fills;
                let mut fill = if shared && copy_async {
                    accesses.fill_async("dst", raw_shared)
                } else if split {
                    accesses.fill_whole("dst", raw_shared)
                } else if shared && raw_shared {
                    accesses.fill_raw("dst")
                } else {
                    accesses.fill("dst")
                };
                if shared && overlapped {
                    fill.push_str("\n      bs_copies_commit();");
                }
                fill_loop(&mut c, &fill);
                if split {
                    fill_loop(&mut c, &accesses.fill_rest("dst", raw_shared));
                }
            }
            if copy_async && !overlapped {
                // Each thread reads back only its own accesses: no barrier.
                let _ = writeln!(c, "    bs_copies_done();");
            }
            let run = |dst: &str| format!("const {ix} col = {col}; pass({dst}, col, {touches});");
            // A raw access is widened into `float`s for each pass.
            let run_shared = if raw_shared {
                format!(
                    "const {ix} col = {col}; const {raw} w = *({in_shared}); float xs[{v}];{} pass(xs, col, {touches});",
                    widen_raw(dtypes[0], v, "w", "xs")
                )
            } else {
                run(&in_shared)
            };
            let open = format!("    {{ auto pass = [&](float* const x, const {ix} col, const bool in_row) {{");
            // The lambda closed and run over the accesses in registers, then those in shared memory.
            let over_registers = format!(
                "    }};\n    #pragma unroll\n    for (int j = 0; j < {r}; ++j) {{ {} }}\n",
                run(&in_registers)
            );
            let close = format!(
                "{over_registers}    #pragma unroll 4\n    for (int j = {r}; j < {n}; ++j) {{ {run_shared} }} }}"
            );
            // Overlapped: the first pass takes each access kept in shared memory as soon as its
            // copy (a group of its own) has landed, the later ones still in flight.
            let close_first = if overlapped {
                let mut first = over_registers;
                for j in r..n {
                    let _ =
                        writeln!(first, "    {{ const int j = {j}; bs_copies_wait<{}>(); {run_shared} }}", n - 1 - j);
                }
                first.push_str("    }");
                first
            } else {
                close.clone()
            };
            (open.clone(), open, close, close_first)
        }
        // Streamed: `STREAMED_LOADS` accesses are made before any is used, so that each thread
        // has that many in flight (one at a time, a pass waited on every load in turn).
        None => {
            let (u, step) = (streamed_loads, t * v);
            let (count, widen, stride) = (accesses.count(), accesses.widen(), accesses.literal(streamed_stride));
            let first = accesses.column(&format!("{widen}lane"));
            let (rounds, last_rounds) =
                (streamed_round(&accesses, u, step, &touches), streamed_round(&last_accesses, u, step, &touches));
            if cluster == 1 {
                let pass = |rounds: &str| {
                    format!("    for ({ix} col0 = {first}; col0 < {count}; col0 += {stride}) {{{rounds}")
                };
                let last = pass(&last_rounds);
                streamed_last = Some((last.clone(), last));
                let open = pass(&rounds);
                (open.clone(), open, "    } }".to_string(), "    } }".to_string())
            } else {
                // The thread's rounds over its block's slice, from its first column there,
                // `from`, up to `upto`, forward; or back from its last. Block `slice` of the
                // cluster takes rounds `slice * R / k` up to `(slice + 1) * R / k` of the row's
                // `R`: as many as the others, or one fewer.
                let (r, k) = (streamed_rounds, cluster);
                let _ = writeln!(c, "    const {ix} from = {first} + ({ix})(slice * {r}u / {k}u) * {stride};");
                let _ = writeln!(c, "    const {ix} end = {first} + ({ix})((slice + 1u) * {r}u / {k}u) * {stride};");
                let _ = writeln!(c, "    const {ix} upto = end < {count} ? end : {count};");
                let forward =
                    |rounds: &str| format!("    for ({ix} col0 = from; col0 < upto; col0 += {stride}) {{{rounds}");
                let backward = |rounds: &str| {
                    format!(
                    "    for ({ix} round = (upto - from + {stride} - 1) / {stride} - 1; round >= 0; --round) {{ const {ix} col0 = from + round * {stride};{rounds}"
                )
                };
                streamed_last = Some((forward(&last_rounds), backward(&last_rounds)));
                (forward(&rounds), backward(&rounds), "    } }".to_string(), "    } }".to_string())
            }
        }
    };
    let (last_forward, last_back) = streamed_last.unwrap_or_else(|| (open.clone(), back.clone()));
    // Where the results' exponentials are scaled (`bs_exp_out`, see `RowOp::scales_results`),
    // the sums that are not of them are scaled too, once, in `inv_z`: an exact power of 2.
    let (exp_out, inv_z) = if RowOp::scales_results(out_dtype, variants.fast_exp2) {
        ("bs_exp_out", format!("{} / acc", literal(2f32.powi(-OUT_SCALE_LOG2))))
    } else {
        ("bs_exp", "1.0f / acc".to_string())
    };
    if id == prims::SOFTMAX && streamed {
        // Streamed: the maximum and the sum in one pass (the sum rescaled as the maximum
        // grows), then the pass that writes: two reads of the row, not three.
        let _ = writeln!(c, "    float m = __int_as_float(0xff800000), acc = 0.0f;");
        let _ = writeln!(c, "{open}");
        online_softmax_update(&mut c, v);
        let _ = writeln!(c, "{close}");
        online_softmax_merge(&mut c, t);
        if cluster > 1 {
            cluster_softmax_merge(&mut c, cluster);
        }
        // One division per row, a product per value (within an ulp of dividing each).
        let _ = writeln!(c, "    const float inv_z = {inv_z};");
        let _ = writeln!(c, "{last_back}");
        let _ = writeln!(
            c,
            "      if (in_row) {{ float y[{v}]; for (int e = 0; e < {v}; ++e) y[e] = {exp_out}(x[e] - m) * inv_z;"
        );
        let _ = writeln!(c, "        {} }}", last_accesses.put(out_dtype));
        let _ = writeln!(c, "{close}");
    } else if id == prims::SOFTMAX {
        let _ = writeln!(c, "    float acc = __int_as_float(0xff800000);");
        if let Some(as_read) = &as_read {
            // A row kept as read takes its maximum over the words as read, two values at a time
            // (`bs_max2`: `max.NaN.f16x2` or `.bf16x2`, exact in 16 bits), then widens one word:
            // its first pass widens nothing. Widened, the first two passes converted the same
            // values, and `ptxas` (sm_90) kept f16 rows' conversions from one to the other: 63
            // registers a thread over rows of 257, 1,001 and 12,289 values, 40 this way (bf16's
            // are shifts, taken again). On an H100 (2026-12-06, `gpu_sweep f16,bf16 softmax`
            // over 8 lengths from 33 to 12,289, against the build before, two rounds, one
            // call): 1.00-1.13x, median 1.03x; f16 [65536, 257] 1.13x and [1365, 12289] 1.11x,
            // bf16 1.00-1.05x.
            let _ = writeln!(c, "    unsigned int m2 = {};", lowest_pair(dtypes[0]));
            let _ = writeln!(c, "{as_read}");
            let _ = writeln!(c, "      if (in_row) {{ m2 = bs_max2(m2, w.x); m2 = bs_max2(m2, w.y); m2 = bs_max2(m2, w.z); m2 = bs_max2(m2, w.w); }}");
            let _ = writeln!(c, "{close}");
            let _ = writeln!(c, "    acc = {};", maximum(&widen(dtypes[0], "m2"), &widen(dtypes[0], "(m2 >> 16)")));
        } else {
            let _ = writeln!(c, "{open}");
            let _ = writeln!(c, "      if (in_row) for (int e = 0; e < {v}; ++e) acc = {};", maximum("acc", "x[e]"));
            let _ = writeln!(c, "{close_first}");
        }
        reduce(&mut c, &max);
        let _ = writeln!(c, "    const float m = acc;");
        let _ = writeln!(c, "    acc = 0.0f;");
        let _ = writeln!(c, "{open}");
        // Kept in registers, each exponential is taken once.
        // (Values kept as read, in shared memory or in registers, are widened for each pass:
        // their exponentials are taken again.)
        let recomputed = (raw_shared && layout.shared_bytes() > 0) || raw_registers;
        // Kept, the sum is of the results' exponentials, scaled or not: `1 / acc` divides the
        // scale out. Recomputed, it is of `bs_exp`'s and `inv_z` takes the scale.
        let (keep, exp, out, inv_z) = if !streamed && !recomputed {
            (format!("x[e] = {exp_out}(x[e] - m); "), "x[e]", "x[e]".to_string(), "1.0f / acc".to_string())
        } else {
            (String::new(), "bs_exp(x[e] - m)", format!("{exp_out}(x[e] - m)"), inv_z)
        };
        let _ = writeln!(c, "      if (in_row) for (int e = 0; e < {v}; ++e) {{ {keep}acc = acc + {exp}; }}");
        let _ = writeln!(c, "{close}");
        reduce(&mut c, &sum);
        // One division per row, a product per value (within an ulp of dividing each).
        let _ = writeln!(c, "    const float inv_z = {inv_z};");
        let _ = writeln!(c, "{open}");
        let _ = writeln!(c, "      if (in_row) {{ float y[{v}]; for (int e = 0; e < {v}; ++e) y[e] = {out} * inv_z;");
        let _ = writeln!(c, "        {} }}", accesses.put(out_dtype));
        let _ = writeln!(c, "{close}");
    } else {
        let eps = op.scalar(1).map_err(|e| e.to_string())?;
        let inverse = literal(1.0 / cols as f32);
        // (Testing each value only in the two accesses a row shares with its neighbours, not in
        // every access of aligned rows: 0.95-1.05x, median 1.00x, over 27 `layer_norm` cases on
        // an H100, 2026-12-06: the tests are not what bounds these kernels.)
        let in_this_row = if aligned { accesses.in_this_row("e") } else { "true".to_string() };
        // A streamed row (`KernelVariants::one_pass_moments`): its sum and its squared
        // deviations in one pass, each thread's deviations from its own mean (Chan's update, an
        // access at a time), then from the row's mean: two reads of the row, not three.
        let one_pass = streamed && variants.one_pass_moments;
        let _ = writeln!(c, "    float acc = 0.0f;");
        if one_pass {
            let _ = writeln!(c, "    float n_t = 0.0f, mean_t = 0.0f, m2_t = 0.0f;");
        }
        let _ = writeln!(c, "{open}");
        if one_pass {
            let _ = writeln!(c, "      if (in_row) {{ float s = 0.0f, nb = 0.0f;");
            let _ = writeln!(
                c,
                "        for (int e = 0; e < {v}; ++e) if ({in_this_row}) {{ s = s + x[e]; nb = nb + 1.0f; }}"
            );
            let _ = writeln!(c, "        if (nb > 0.0f) {{ const float mb = s / nb; float qb = 0.0f;");
            let _ = writeln!(
                c,
                "          for (int e = 0; e < {v}; ++e) if ({in_this_row}) {{ const float d = x[e] - mb; qb = qb + d * d; }}"
            );
            let _ = writeln!(c, "          const float n = n_t + nb, delta = mb - mean_t, w = nb / n;");
            let _ = writeln!(
                c,
                "          mean_t = mean_t + delta * w; m2_t = m2_t + qb + delta * delta * n_t * w; n_t = n;"
            );
            let _ = writeln!(c, "          acc = acc + s; }} }}");
        } else {
            let _ = writeln!(c, "      if (in_row) for (int e = 0; e < {v}; ++e) acc = acc + x[e];");
        }
        let _ = writeln!(c, "{close_first}");
        reduce(&mut c, &sum);
        let _ = writeln!(c, "    const float mean = acc * {inverse};");
        if one_pass {
            let _ = writeln!(c, "    {{ const float d = mean_t - mean; acc = m2_t + n_t * d * d; }}");
        } else {
            let _ = writeln!(c, "    acc = 0.0f;");
            let _ = writeln!(c, "{back}");
            let _ = writeln!(
                c,
                "      if (in_row) for (int e = 0; e < {v}; ++e) if ({in_this_row}) {{ const float d = x[e] - mean; acc = acc + d * d; }}"
            );
            let _ = writeln!(c, "{close}");
        }
        reduce(&mut c, &sum);
        let _ = writeln!(c, "    const float variance = acc * {inverse};");
        let _ = writeln!(c, "    const float inv_std = expf(logf(variance + {}) * -0.5f);", literal(eps));
        // The last pass reads the weight and the bias at the row's columns. Over rows of odd
        // lengths, not staged, each access reads them shifted (two aligned loads and a select of
        // their words by `col % v`), and `col % v` is the row's: so where the row is long (kept
        // in shared memory by a block of its own, or streamed) the pass is written once for each
        // shift, its selects resolved when it is compiled. On an H100 (2026-12-06, `gpu_sweep
        // f32,bf16,f16 layer_norm`, two rounds, one call): 1.02-1.11x over rows of 50,257 (f32),
        // 65,537, 100,003 and 200,003 (bf16 [167, 100003] 1.10-1.11x). Not over rows held in
        // registers alone, where the copies cost registers: 0.77-0.92x over [2048, 2049] and
        // 16-bit [1365, 12289], 0.99-1.04x over [2047, 8193]; nor over two blocks of 512 an SM
        // (16-bit [333, 50257]: 0.95-1.01x), which spilled more, written per shift, under their
        // 64 registers. As landed, against the build before (30 cases, two rounds, one call):
        // 1.00-1.13x, median 1.04x, none slower.
        let by_shift = aligned
            && staged.is_none()
            && !layout.in_registers_alone()
            && !two_blocks
            && dtypes[1..].iter().any(|d| v * d.size_bytes() == 16);
        // The last pass goes back over a split row where the first went forward.
        let last_open = if one_pass { &last_back } else { &last_forward };
        let last = |c: &mut String, shift: Option<usize>| {
            let _ = writeln!(c, "{last_open}");
            let _ = writeln!(c, "      if (in_row) {{ float y[{v}];");
            let _ = writeln!(c, "        for (int e = 0; e < {v}; ++e) y[e] = (x[e] - mean) * inv_std;");
            for (k, &dtype) in dtypes.iter().enumerate().skip(1) {
                let read = match &staged {
                    Some(staged) => staged.read(k),
                    None => accesses.read_columns(k, dtype, shift),
                };
                let _ = writeln!(c, "        {{ float p[{v}]; {read}");
                let combine = if k == 1 { "y[e] = y[e] * p[e]" } else { "y[e] = y[e] + p[e]" };
                let _ = writeln!(c, "          for (int e = 0; e < {v}; ++e) {combine}; }}");
            }
            let _ = writeln!(c, "        {} }}", last_accesses.put(out_dtype));
            let _ = writeln!(c, "{close}");
        };
        if by_shift {
            // A row that starts `shift` values past an access's first starts each of its
            // accesses' columns at `(v - shift) % v` past a multiple of `v`.
            let _ = writeln!(c, "    switch ((int)shift) {{");
            for s in 0..v {
                let _ = writeln!(c, "    case {s}: {{");
                last(&mut c, Some((v - s) % v));
                let _ = writeln!(c, "    }} break;");
            }
            let _ = writeln!(c, "    }}");
        } else {
            last(&mut c, None);
        }
    }
    let _ = writeln!(c, "  }}\n}}");
    let blocks = if cluster > 1 {
        (rows.clamp(1, i32::MAX as usize / cluster) * cluster) as u32
    } else {
        let needed = rows.div_ceil(layout.rows_per_block()).clamp(1, i32::MAX as usize);
        staged.as_ref().map_or(needed, |staged| staged.blocks(needed, sms)) as u32
    };
    let source = RegionSource {
        kernel: kernel.to_string(),
        source: c,
        inputs: tensors,
        outputs: 1,
        numel,
        vectorized: v > 1,
        threads: blocks as usize * block,
        input_lengths,
        output_lengths: vec![packing::words(out_dtype, numel)],
        in_place: Vec::new(),
        cluster,
    };
    let shared_bytes = staged.map_or(layout.shared_bytes(), |staged| staged.bytes);
    // Half an SM's shared memory: one block an SM (`KernelVariants::streamed_split_waves`).
    let shared_bytes = if waves { shared_bytes.max(sm_shared / 2) } else { shared_bytes };
    Ok(RowSource { source, layout, blocks, shared_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};

    /// An SM's shared memory on Hopper.
    const HOPPER_SM: usize = 228 * 1024;

    /// An H100 or H200 (the tests set its shared memory and L2 themselves).
    const HOPPER: RowTarget = RowTarget {
        shared_limit: 0,
        sm_shared: HOPPER_SM,
        region: RegionTarget { l2_bytes: 0, sms: 132, clusters: true },
    };

    fn source_of(build: impl Fn(&mut TraceBuilder<'_>) -> crate::ValueId) -> Result<RowSource, String> {
        source_within(build, 0)
    }

    /// The kernel with `shared_limit` bytes of shared memory per block to keep rows in.
    fn source_within(
        build: impl Fn(&mut TraceBuilder<'_>) -> crate::ValueId,
        shared_limit: usize,
    ) -> Result<RowSource, String> {
        // Without kernel variants: each variant's own test shows what it changes.
        source_with(build, shared_limit, KernelVariants::NONE)
    }

    /// [`source_within`], generating `variants`.
    fn source_with(
        build: impl Fn(&mut TraceBuilder<'_>) -> crate::ValueId,
        shared_limit: usize,
        variants: KernelVariants,
    ) -> Result<RowSource, String> {
        source_for(build, shared_limit, variants, 0)
    }

    /// [`source_with`], for a GPU of `l2_bytes` of L2 cache.
    fn source_for(
        build: impl Fn(&mut TraceBuilder<'_>) -> crate::ValueId,
        shared_limit: usize,
        variants: KernelVariants,
        l2_bytes: usize,
    ) -> Result<RowSource, String> {
        source_targeting(
            build,
            RowTarget { shared_limit, region: RegionTarget { l2_bytes, ..HOPPER.region }, ..HOPPER },
            variants,
        )
    }

    /// The kernel for the GPU `target`.
    fn source_targeting(
        build: impl Fn(&mut TraceBuilder<'_>) -> crate::ValueId,
        target: RowTarget,
        variants: KernelVariants,
    ) -> Result<RowSource, String> {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let y = build(&mut b);
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let bsym = trace.bound_symbols().last().unwrap();
        row_source(&OpView::new(&trace, bsym).unwrap(), "k", target, variants)
    }

    /// `layer_norm` over `[rows, cols]` of `dtype` with `operands` of its weight and bias (none,
    /// the weight, or both), of `operand_dtype`: its kernel for `target`, of the default
    /// variants.
    fn layer_norm_for(
        dtype: DType,
        operand_dtype: DType,
        shape: [usize; 2],
        operands: usize,
        target: RowTarget,
    ) -> RowSource {
        layer_norm_with(dtype, operand_dtype, shape, operands, target, KernelVariants::default())
    }

    /// [`layer_norm_for`], of `variants`.
    fn layer_norm_with(
        dtype: DType,
        operand_dtype: DType,
        [rows, cols]: [usize; 2],
        operands: usize,
        target: RowTarget,
        variants: KernelVariants,
    ) -> RowSource {
        source_targeting(
            |b| {
                let x = b.input_with(&crate::TensorMeta::new(dtype, &[rows, cols])).unwrap();
                let mut operand = || b.input_with(&crate::TensorMeta::new(operand_dtype, &[cols])).unwrap();
                let w = (operands > 0).then(&mut operand);
                let bias = (operands > 1).then(&mut operand);
                b.layer_norm(x, 1e-5, w, bias).unwrap()
            },
            target,
            variants,
        )
        .unwrap()
    }

    /// `softmax` (or `layer_norm` with weight and bias) over `[rows, cols]` of `dtype`, its
    /// kernel with `shared_limit` bytes of shared memory a block, of `variants`.
    fn row_op_with(
        layer_norm: bool,
        dtype: DType,
        [rows, cols]: [usize; 2],
        shared_limit: usize,
        variants: KernelVariants,
    ) -> RowSource {
        row_op_for(layer_norm, dtype, [rows, cols], shared_limit, variants, 0)
    }

    /// [`row_op_with`], for a GPU of `l2_bytes` of L2 cache.
    fn row_op_for(
        layer_norm: bool,
        dtype: DType,
        [rows, cols]: [usize; 2],
        shared_limit: usize,
        variants: KernelVariants,
        l2_bytes: usize,
    ) -> RowSource {
        use crate::core::ir::TensorMeta;
        source_for(
            |b| {
                let x = b.input_with(&TensorMeta::new(dtype, &[rows, cols])).unwrap();
                if !layer_norm {
                    return b.softmax(x).unwrap();
                }
                let w = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
                let bias = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
                b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap()
            },
            shared_limit,
            variants,
            l2_bytes,
        )
        .unwrap()
    }

    /// Shared memory a Hopper block may keep a row in, as `CudaOps` asks.
    const HOPPER_BLOCK: usize = 227 * 1024 - 1024;

    /// The defaults are the variants measured faster, together: one-instruction `exp2`, the
    /// streaming hints (dropped where the tensors fit in three quarters of L2, their inputs in
    /// half), batched rows, asynchronous copies to shared memory, few streamed rows split over
    /// clusters and short rows read as tiles, in one kernel, which compiles; 32-bit columns stay
    /// off.
    #[test]
    fn the_default_kernels_take_the_variants_measured_faster() {
        let defaults = KernelVariants::default();
        assert_eq!(
            defaults,
            KernelVariants {
                fast_exp2: true,
                int32_row_columns: false,
                streaming_rows: true,
                keep_in_l2: true,
                batched_rows: true,
                async_row_copies: true,
                split_rows: true,
                split_reductions: true,
                tiled_rows: true,
                pipelined_tiles: true,
                wide_tiles: true,
                tile_occupancy: true,
                pipelined_passes: false,
                overlapped_first_pass: true,
                split_row_fills: true,
                two_register_blocks: true,
                clustered_rows: true,
                one_pass_moments: true,
                long_rows_as_read: true,
                vector_tile_values: false,
                streamed_last_pass_hints: false,
                streamed_split_waves: false,
                wave_clusters_of_16: false,
                deeper_streamed_rounds: false,
            }
        );
        for dtype in [DType::BF16, DType::F16] {
            // Streamed past three quarters of a 50 MiB L2 (or one of unknown size), plain within.
            for (rows, l2, hinted) in [(64, 0, true), (64, 50 << 20, false), (16384, 50 << 20, true)] {
                let kernel = row_op_for(false, dtype, [rows, 1024], HOPPER_BLOCK, defaults, l2);
                let s = &kernel.source.source;
                assert!(s.contains(EXP2), "{s}");
                assert_eq!(s.contains("__ldcs(") && s.contains("__stcs("), hinted, "[{rows}, 1024], L2 {l2}: {s}");
                assert!(s.contains("long long col") && !s.contains("int col"), "{s}");
                super::super::compiles_with_nvrtc(s);
            }
        }
    }

    #[test]
    fn fast_exp2_takes_one_instruction_and_keeps_bf16_results_below_the_normal_range() {
        let fast = KernelVariants { fast_exp2: true, ..KernelVariants::NONE };
        // f32 results, and `layer_norm`, have no `exp2`: the same kernels.
        for (layer_norm, dtype) in [(false, DType::F32), (true, DType::F32), (true, DType::BF16)] {
            for cols in [1024, 65536] {
                let without = row_op_with(layer_norm, dtype, [64, cols], HOPPER_BLOCK, KernelVariants::NONE);
                let variant = row_op_with(layer_norm, dtype, [64, cols], HOPPER_BLOCK, fast);
                assert_eq!(without.source.source, variant.source.source);
            }
        }
        // bf16 `softmax`, in each of its three layouts. Kept in registers: the sum is of the
        // scaled exponentials it keeps, and `1 / acc` divides the scale out.
        let kept = row_op_with(false, DType::BF16, [64, 1024], HOPPER_BLOCK, fast);
        let s = &kept.source.source;
        assert!(kept.layout.shared_bytes() == 0 && kept.layout.per_thread.is_some(), "{s}");
        assert!(s.contains("{ x[e] = bs_exp_out(x[e] - m); acc = acc + x[e]; }"), "{s}");
        assert!(s.contains("const float inv_z = 1.0f / acc;") && s.contains("y[e] = x[e] * inv_z;"), "{s}");
        // Kept as read in shared memory, each exponential taken twice; and streamed: the sum is
        // of `bs_exp`'s, never scaled, and `inv_z` takes the scale, 2^-8, exactly.
        let recomputed = row_op_with(false, DType::BF16, [256, 65536], HOPPER_BLOCK, fast);
        let streamed = row_op_with(false, DType::BF16, [4, 1 << 20], HOPPER_BLOCK, fast);
        assert!(recomputed.layout.shared_bytes() > 0 && streamed.layout.per_thread.is_none());
        for (generated, sum) in [(&recomputed, "acc = acc + bs_exp(x[e] - m);"), (&streamed, "bs_rescale(acc, m, mv)")]
        {
            let s = &generated.source.source;
            assert!(s.contains(sum), "{s}");
            assert!(s.contains("const float inv_z = 3.90625e-3f / acc;"), "{s}");
            assert!(s.contains("y[e] = bs_exp_out(x[e] - m) * inv_z;"), "{s}");
        }
        assert_eq!(literal(2f32.powi(-OUT_SCALE_LOG2)), "3.90625e-3f");
        for generated in [&kept, &recomputed, &streamed] {
            let s = &generated.source.source;
            assert!(s.contains(EXP2) && s.contains("bs_exp2(x * 1.44269504088896341f)"), "{s}");
            assert!(s.contains("return bs_exp2(fmaf(x, 1.44269504088896341f, 8.0f));"), "{s}");
            assert!(!s.contains("exp2f("), "no four-instruction exp2 left: {s}");
            crate::executors::cuda::compiles_with_nvrtc(s);
        }
        // f16's least value, 2^-24, is far above the flush: no scale.
        for cols in [1024, 65536, 1 << 20] {
            let generated = row_op_with(false, DType::F16, [4, cols], HOPPER_BLOCK, fast);
            let s = &generated.source.source;
            assert!(s.contains("bs_exp2(x * 1.44269504088896341f)") && !s.contains("bs_exp_out"), "{s}");
            assert!(s.contains("const float inv_z = 1.0f / acc;"), "{s}");
            crate::executors::cuda::compiles_with_nvrtc(s);
        }
        // The scale keeps every bf16 result: the least, half of bf16's least subnormal (2^-133),
        // rounds up to it; its exponential, 2^-134, scaled is 2^-126, the least `bs_exp2` keeps.
        // The greatest, e^0 = 1, scaled is 256: a sum of 2^30 of them is finite.
        assert_eq!(-134 + OUT_SCALE_LOG2, -126);
        assert!(((1u64 << 30) as f32 * 2f32.powi(OUT_SCALE_LOG2)).is_finite());
    }

    /// With `keep_in_l2`, a row kernel whose tensors fit in three quarters of L2 together (the
    /// row's input and its results, and `layer_norm`'s weight and bias) reads and writes them
    /// plainly, where `streaming_rows` would hint them; past that, or where its size is unknown
    /// (0), the hints stay. (The bound on the inputs alone, half of L2, never binds here: the
    /// results take as many values as the row.)
    #[test]
    fn keep_in_l2_leaves_rows_that_fit_in_l2_without_the_streaming_hints() {
        const L2: usize = 50 << 20;
        let streaming = KernelVariants { streaming_rows: true, ..KernelVariants::NONE };
        let kept = KernelVariants { keep_in_l2: true, ..streaming };
        let hinted = |s: &str| s.contains("__ldcs(") || s.contains("__stcs(");
        // [rows, cols] of f32: 2^22 values (32 MiB read and written) fit; 2^24 (128 MiB) do not;
        // [240, 50257] in bf16 (46 MiB) fits in L2 but not in the share kept.
        for layer_norm in [false, true] {
            for (dtype, shape, fits) in [
                (DType::F32, [4096, 1024], true),
                (DType::BF16, [96, 50257], true),
                (DType::BF16, [240, 50257], false),
                (DType::F32, [16384, 1024], false),
                (DType::BF16, [1335, 50257], false),
            ] {
                let source =
                    |variants, l2| row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, variants, l2).source.source;
                let s = source(kept, L2);
                assert_eq!(hinted(&s), !fits, "{layer_norm} {dtype:?} {shape:?}: {s}");
                assert!(hinted(&source(streaming, L2)), "without keep_in_l2, hinted");
                assert!(hinted(&source(kept, 0)), "L2 of unknown size: hinted");
                for variants in [streaming, KernelVariants { keep_in_l2: false, ..KernelVariants::default() }] {
                    assert_eq!(source(variants, L2), source(variants, 0), "the L2's size alone changes nothing");
                }
                if fits {
                    // Plain accesses where the hints were: the same kernel otherwise.
                    assert_eq!(s, source(KernelVariants::NONE, L2));
                    super::super::compiles_with_nvrtc(&s);
                }
            }
        }
    }

    #[test]
    fn streaming_rows_read_and_write_rows_kept_on_chip_with_the_streaming_hints() {
        let streaming = KernelVariants { streaming_rows: true, ..KernelVariants::NONE };
        // Kept in registers, in shared memory (as read and as `float`s), aligned to the tensor:
        // every whole access of the row is `__ldcs`, every whole write `__stcs`; `layer_norm`'s
        // weight and bias, read again by every row, keep plain loads.
        // (Case, accesses of the row read from global memory in the kernel's text: the loop
        // into registers, and the loop into shared memory where there is one.)
        let cases = [
            (false, DType::F32, [64, 1024], 1),
            (true, DType::BF16, [9, 50257], 2),
            (false, DType::BF16, [333, 50257], 2),
            (true, DType::F32, [4, 65536], 2),
            (false, DType::F16, [64, 1001], 1),
            (true, DType::F32, [64, 1001], 1),
        ];
        let row_types = ["uint4", "uint2", "unsigned int"];
        for (layer_norm, dtype, shape, loads) in cases {
            let without = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, KernelVariants::NONE);
            let variant = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, streaming);
            let (d, s) = (&without.source.source, &variant.source.source);
            assert!(variant.layout.per_thread.is_some(), "kept on chip: {s}");
            assert!(!d.contains("__ldcs") && !d.contains("__stcs"), "{d}");
            for ty in row_types {
                let plain_read = format!("*reinterpret_cast<const {ty}*>(in0 + row + col)");
                let plain_write = format!("*reinterpret_cast<{ty}*>(out0 + row + col) =");
                assert!(!s.contains(&plain_read) && !s.contains(&plain_write), "no whole access left plain: {s}");
            }
            // Every hinted load is of the row (none of the weight's or the bias's), as many as
            // the kernel reads it; the one write of the results is hinted.
            let hinted: Vec<&str> = s.split("__ldcs(reinterpret_cast<const ").skip(1).collect();
            assert_eq!(hinted.len(), loads, "{s}");
            assert!(hinted
                .iter()
                .all(|h| h.split_once(">(").is_some_and(|(_, at)| at.starts_with("in0 + row + col))"))));
            assert_eq!(s.matches("__stcs(reinterpret_cast<").count(), 1, "{s}");
            assert!(s.matches("__stcs(reinterpret_cast<").all(|_| s.contains("(out0 + row + col), ")), "{s}");
            crate::executors::cuda::compiles_with_nvrtc(s);
        }
        // A streamed row is read again by its later passes: plain loads and stores.
        let streamed = row_op_with(false, DType::BF16, [2, 1 << 20], HOPPER_BLOCK, streaming);
        assert!(streamed.layout.per_thread.is_none());
        let s = &streamed.source.source;
        assert!(!s.contains("__ldcs") && !s.contains("__stcs"), "{s}");
    }

    #[test]
    fn int32_row_columns_count_columns_in_32_bits_below_2_to_the_30() {
        let narrow = KernelVariants { int32_row_columns: true, ..KernelVariants::NONE };
        // In registers, aligned to the tensor (with weight and bias read shifted), in shared
        // memory as read, and streamed.
        let cases = [
            (false, DType::F32, [3, 1001]),
            (true, DType::F32, [3, 1001]),
            (true, DType::BF16, [9, 50257]),
            (false, DType::BF16, [333, 50257]),
            (true, DType::F32, [4, 65536]),
            (false, DType::BF16, [2, 200003]),
            (true, DType::F16, [2, 1 << 20]),
        ];
        for (layer_norm, dtype, shape) in cases {
            let without = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, KernelVariants::NONE);
            let variant = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, narrow);
            assert_eq!(without.layout, variant.layout, "the same layout");
            let (d, s) = (&without.source.source, &variant.source.source);
            assert!(!s.contains(" long long col"), "{s}");
            // (The row's first element, `row`, stays 64-bit.)
            assert!(!s.contains(&format!("< {}ll", shape[1])), "bounds against an int: {s}");
            // Without the variant, 64-bit columns; but `layer_norm`'s aligned rows count in 32
            // bits whatever the variant.
            let always = layer_norm && without.layout.aligned;
            assert_eq!(d.contains(" long long col"), !always, "{d}");
            assert_eq!(d.contains(&format!("< {}ll", shape[1])), !always, "{d}");
            if always {
                assert_eq!(d, s, "the same kernel with the variant and without");
            }
            assert!(s.contains("const int col = ") || s.contains("for (int col0 = "), "{s}");
            if variant.layout.aligned {
                assert!(s.contains(&format!("const int shift = row % {};", variant.layout.vector)), "{s}");
            }
            if layer_norm && variant.layout.aligned && variant.layout.vector * dtype.size_bytes() == 16 {
                // Weight and bias staged in shared memory (a row in registers alone), else read
                // shifted, in 32 bits either way.
                let read = if variant.shared_bytes > variant.layout.shared_bytes() {
                    "bs_staged1 + (int)(shift * "
                } else {
                    "const int o_ = col;"
                };
                assert!(s.contains(read), "weight and bias read in 32 bits: {s}");
            }
            crate::executors::cuda::compiles_with_nvrtc(s);
        }
        // Rows of 2^30 values or more keep 64-bit columns (their accesses are not aligned).
        let long = row_op_with(false, DType::F32, [1, 1 << 30], 0, narrow);
        assert!(long.source.source.contains("long long col0"), "{}", long.source.source);
    }

    #[test]
    fn rows_are_laid_out_by_length_and_dtype() {
        let layout = |cols, widest| {
            let l = RowLayout::within(cols, widest, REGISTER_VALUES);
            (l.threads_per_row, l.vector, l.per_thread, l.block)
        };
        // f32: four per access, up to 32 values per thread, so a warp holds rows of 1,024.
        assert_eq!(layout(1024, 4), (32, 4, Some(8), 256));
        assert_eq!(layout(768, 4), (32, 4, Some(6), 256));
        // Short rows: 8 threads a row where it has 8 accesses, for 128 contiguous bytes.
        assert_eq!(layout(64, 4), (8, 4, Some(2), 256));
        assert_eq!(layout(32, 4), (8, 4, Some(1), 256));
        assert_eq!(layout(8, 4), (2, 4, Some(1), 256));
        assert_eq!(layout(1, 4), (1, 1, Some(1), 256));
        assert_eq!(layout(4096, 4), (128, 4, Some(8), 128));
        assert_eq!(layout(32768, 4), (1024, 4, Some(8), 1024));
        // Longer rows are streamed by a block; odd lengths take narrower accesses.
        assert_eq!(layout(1 << 20, 4), (512, 4, None, 512));
        assert_eq!(layout(1001, 4), (32, 1, Some(32), 256));
        assert_eq!(layout(1002, 4), (32, 2, Some(16), 256));
        // 16-bit: eight per access.
        assert_eq!(layout(1024, 2), (32, 8, Some(4), 256));
        assert_eq!(layout(50257, 2), (512, 1, None, 512));
    }

    #[test]
    fn softmax_reads_its_row_once_into_registers() {
        let generated = source_of(|b| {
            let x = b.input(&[64, 256]).unwrap();
            b.softmax(x).unwrap()
        })
        .unwrap();
        let (layout, src) = (generated.layout, &generated.source.source);
        assert_eq!((layout.threads_per_row, layout.vector, layout.per_thread), (8, 4, Some(8)));
        assert_eq!(generated.blocks, 2, "32 rows per block of 256");
        assert_eq!(src.matches("reinterpret_cast<const uint4*>(in0").count(), 1, "one read of the row\n{src}");
        assert_eq!(src.matches("reinterpret_cast<uint4*>(out0").count(), 1, "{src}");
        assert_eq!(src.matches("__shfl_xor_sync").count(), 2, "{src}");
        assert_eq!(src.matches("bs_exp(").count(), 2, "each exponential once (and its definition)\n{src}");
        // Access `j` is the thread's first column plus `j` strides of 32 columns (8 threads of
        // 4 values): one pointer and a constant offset per access (see `column_of_access`).
        assert_eq!(src.matches("const long long col = ((long long)lane) * 4 + j * 32ll;").count(), 4, "{src}");
        // In 16 bits too, where the row is held in registers alone (nothing kept as read).
        let generated = source_within(
            |b| {
                let x = b.input_with(&crate::TensorMeta::new(DType::BF16, &[64, 1024])).unwrap();
                b.softmax(x).unwrap()
            },
            227 * 1024,
        )
        .unwrap();
        let src = &generated.source.source;
        assert_eq!(generated.layout.shared_bytes(), 0, "{:?}", generated.layout);
        assert!(src.contains("x[e] = bs_exp(x[e] - m); acc = acc + x[e];"), "kept, not taken again\n{src}");
        assert!(src.contains("y[e] = x[e] * inv_z;"), "{src}");
    }

    #[test]
    fn long_rows_are_streamed_by_a_block() {
        let generated = source_of(|b| {
            let x = b.input(&[2, 1 << 16]).unwrap();
            b.softmax(x).unwrap()
        })
        .unwrap();
        let src = &generated.source.source;
        assert_eq!(generated.layout.per_thread, None);
        assert_eq!(src.matches("reinterpret_cast<const uint4*>(in0").count(), 2, "two passes\n{src}");
        assert!(src.contains("__shared__ float partial[16]") && src.contains("__syncthreads()"), "{src}");
        assert!(src.contains("float xs[4][4];"), "four 16-byte reads in flight\n{src}");
    }

    #[test]
    fn rows_too_long_for_registers_are_kept_in_shared_memory() {
        const HOPPER: usize = 227 * 1024;
        let kept = |cols, widest, limit| {
            let l = RowLayout::on_chip(cols, widest, REGISTER_VALUES, limit, 4);
            (l.threads_per_row, l.vector, l.per_thread, l.in_registers, l.shared_bytes())
        };
        // 65,536 f32 values: 16 accesses of 4 per thread of 1,024, 8 in registers, 8 in 128 KB.
        assert_eq!(kept(65536, 4, HOPPER), (1024, 4, Some(16), 8, 8 * 1024 * 4 * 4));
        // GPT-2's vocabulary, an odd length: 16-byte accesses aligned to the tensor (6,283 of
        // them cover any row), 7 per thread, 4 in registers and 3 in 96 KB.
        assert_eq!(kept(50257, 2, HOPPER), (1024, 8, Some(7), 4, 3 * 1024 * 8 * 4));
        assert!(RowLayout::on_chip(50257, 2, REGISTER_VALUES, HOPPER, 4).aligned);
        // Without variants (`long_rows_as_read` off), 16-bit `softmax` rows keep their row as
        // read only where they kept it as `float`s: past that (rows of 100,003 here) they are
        // streamed.
        let bf16_softmax = |cols| {
            source_within(
                |b| {
                    let x = b.input_with(&crate::TensorMeta::new(DType::BF16, &[2, cols])).unwrap();
                    b.softmax(x).unwrap()
                },
                HOPPER,
            )
            .unwrap()
            .layout
        };
        assert_eq!((bf16_softmax(50257).shared_value_bytes, bf16_softmax(100003).per_thread), (2, None));
        // Without the room, or past it, rows are streamed; rows that fit registers stay there.
        assert_eq!(kept(65536, 4, 100 * 1024).2, None);
        assert_eq!(kept(1 << 20, 4, HOPPER).2, None);
        assert_eq!(
            RowLayout::on_chip(1024, 4, REGISTER_VALUES, HOPPER, 4),
            RowLayout::within(1024, 4, REGISTER_VALUES)
        );
        // A quarter of the registers (`layer_norm`): more of the row in shared memory (224 KB).
        assert_eq!(RowLayout::on_chip(65536, 4, 8, HOPPER, 4).shared_bytes(), 14 * 1024 * 4 * 4);

        // `layer_norm` keeps a 16-bit row in shared memory as read: half the bytes of `float`s.
        assert_eq!(
            RowLayout::on_chip(65536, 2, 8, HOPPER, 2).shared_bytes(),
            (8 - 1) * 1024 * 8 * 2,
            "eight accesses of 8 a thread, one in registers"
        );

        for (cols, dtype) in [(65536, DType::F32), (50257, DType::BF16), (65536, DType::F16)] {
            let input = |b: &mut TraceBuilder<'_>, shape: &[usize]| {
                b.input_with(&crate::TensorMeta::new(dtype, shape)).unwrap()
            };
            let softmax = source_within(
                |b| {
                    let x = input(b, &[3, cols]);
                    b.softmax(x).unwrap()
                },
                HOPPER,
            )
            .unwrap();
            let layer_norm = source_within(
                |b| {
                    let x = input(b, &[3, cols]);
                    let w = input(b, &[cols]);
                    b.layer_norm(x, 1e-5, Some(w), Some(w)).unwrap()
                },
                HOPPER,
            )
            .unwrap();
            for (generated, is_layer_norm) in [(softmax, false), (layer_norm, true)] {
                let src = &generated.source.source;
                let kept = if dtype != DType::F32 { "uint4" } else { "float" };
                // Two blocks an SM where 16-bit rows, kept as read, fit twice in its shared
                // memory: of 512 threads for `layer_norm` and for `softmax` over rows 16 bytes
                // do not divide, of 1,024 for `softmax` over others; one block elsewhere.
                let bounds = match (kept, is_layer_norm, cols) {
                    ("uint4", _, 50257) => "512, 2",
                    ("uint4", false, _) => "1024, 2",
                    _ => "1024",
                };
                if !is_layer_norm && kept == "uint4" {
                    // The exponentials are taken again in the pass that writes, as read; the
                    // values of a neighbouring row an aligned access holds are kept as
                    // -infinity, nothing to the row's maximum or sum.
                    assert!(src.contains("y[e] = bs_exp(x[e] - m) * inv_z;"), "{src}");
                    let minus_infinity = if dtype == DType::BF16 { "0xff80" } else { "0xfc00" };
                    assert!(src.contains(&format!("(unsigned short){minus_infinity}")), "{src}");
                }
                assert!(src.contains(&format!("__launch_bounds__({bounds}) k(")), "{src}");
                assert!(
                    generated.layout.shared_bytes() > 0
                        && src.contains(&format!("extern __shared__ __align__(16) {kept} cache[];")),
                    "{src}"
                );
                if kept == "uint4" {
                    // As read: per value kept there, half of what a `float` takes.
                    let l = generated.layout;
                    let values = (l.per_thread.unwrap() - l.in_registers) * l.threads_per_row * l.vector;
                    assert_eq!(l.shared_bytes(), values * 2);
                }
                // One read of the row: the loads fill registers, then shared memory.
                let reads =
                    src.matches("*(in0 + row + col)").count() + src.matches("const uint4*>(in0 + row + col)").count();
                assert_eq!(reads, 2, "{src}");
                assert!(!src.contains("bs_rescale"), "not streamed\n{src}");
                super::super::compiles_with_nvrtc(src);
            }
        }
    }

    #[test]
    fn sixteen_bit_rows_kept_as_read_share_an_sm_two_blocks_of_512_where_they_fit_twice() {
        // (op is layer_norm, dtype, cols) -> threads a row and `__launch_bounds__`.
        let cases = [
            // Up to 32,768 16-bit values a row stay in registers.
            (true, DType::BF16, 32768, 1024, "1024, 1"),
            // Past that, kept as read in shared memory: two blocks of 512 an SM up to 61,440
            // values (15 accesses a thread, 14 in shared memory: 2 x 113.25 KB).
            (true, DType::BF16, 32776, 512, "512, 2"),
            (true, DType::F16, 50257, 512, "512, 2"),
            (true, DType::BF16, 61440, 512, "512, 2"),
            (true, DType::BF16, 61448, 1024, "1024"),
            (true, DType::F16, 65536, 1024, "1024"),
            // `softmax` halves its block only over rows 16 bytes do not divide; over others it
            // keeps two blocks of 1,024 (32 registers a thread).
            (false, DType::BF16, 50257, 512, "512, 2"),
            (false, DType::F16, 45001, 512, "512, 2"),
            (false, DType::BF16, 40000, 1024, "1024, 2"),
            (false, DType::F16, 65536, 1024, "1024, 2"),
            // `float` rows are kept widened, one block an SM.
            (true, DType::F32, 50257, 1024, "1024"),
            (false, DType::F32, 40001, 1024, "1024"),
        ];
        for (layer_norm, dtype, cols, threads, bounds) in cases {
            let generated = row_op_with(layer_norm, dtype, [333, cols], HOPPER_BLOCK, KernelVariants::NONE);
            let src = &generated.source.source;
            let what = format!("layer_norm {layer_norm}, {dtype} over {cols}");
            assert_eq!(generated.layout.threads_per_row, threads, "{what}: {:?}", generated.layout);
            assert_eq!(generated.layout.block, threads, "{what}");
            assert!(src.contains(&format!("__launch_bounds__({bounds}) k(")), "{what}\n{src}");
            if bounds.ends_with(", 2") {
                // Two blocks' shared memory, and what CUDA and the kernel take past it, fit
                // an SM's.
                let block_bytes = generated.layout.shared_bytes() + RESERVED_SHARED_BYTES;
                assert!(2 * block_bytes <= HOPPER_SM, "{what}: {block_bytes}");
            }
        }
        // On a GPU whose SM holds one such row only, a block of 1,024 keeps it (one an SM).
        for layer_norm in [false, true] {
            let generated = source_targeting(
                |b| {
                    let x = b.input_with(&crate::core::ir::TensorMeta::new(DType::BF16, &[333, 50257])).unwrap();
                    if layer_norm {
                        b.layer_norm(x, 1e-5, None, None).unwrap()
                    } else {
                        b.softmax(x).unwrap()
                    }
                },
                RowTarget { shared_limit: 160 * 1024, sm_shared: 164 * 1024, ..HOPPER },
                KernelVariants::NONE,
            )
            .unwrap();
            assert_eq!(generated.layout.block, 1024, "layer_norm {layer_norm}");
            assert!(generated.source.source.contains("__launch_bounds__(1024) k("), "layer_norm {layer_norm}");
        }
        // They compile (for sm_90 too).
        for layer_norm in [false, true] {
            let generated = row_op_with(layer_norm, DType::BF16, [333, 50257], HOPPER_BLOCK, KernelVariants::default());
            super::super::compiles_with_nvrtc(&generated.source.source);
        }
    }

    #[test]
    fn rows_of_odd_lengths_are_read_with_accesses_aligned_to_the_tensor() {
        // Rows of 1,001 f32 values: 16-byte accesses (not one value each), the row's first one
        // starting `row % 4` values before it; the accesses it shares with its neighbours are
        // read and written a value at a time. Layouts of every kind: registers (a warp per
        // row), shared memory beside them, streamed.
        const HOPPER: usize = 227 * 1024;
        for (cols, shared_limit, per_thread) in [(1001, 0, true), (40001, HOPPER, true), ((1 << 20) + 1, HOPPER, false)]
        {
            for layer_norm in [false, true] {
                let generated = source_within(
                    |b| {
                        let x = b.input(&[3, cols]).unwrap();
                        if layer_norm {
                            let w = b.input(&[cols]).unwrap();
                            b.layer_norm(x, 1e-5, Some(w), Some(w)).unwrap()
                        } else {
                            b.softmax(x).unwrap()
                        }
                    },
                    shared_limit,
                )
                .unwrap();
                let (layout, src) = (generated.layout, &generated.source.source);
                assert!(layout.aligned && layout.vector == 4, "{layout:?}");
                assert_eq!(layout.per_thread.is_some(), per_thread, "{layout:?}");
                // (`layer_norm`'s aligned rows count their columns in 32 bits.)
                let index = if layer_norm { "int" } else { "long long" };
                assert!(src.contains(&format!("const {index} shift = row % 4;")), "{src}");
                assert!(src.contains("reinterpret_cast<const uint4*>(in0 + row + col)"), "{src}");
                assert!(src.contains("reinterpret_cast<uint4*>(out0 + row + col)"), "{src}");
                // The shared accesses: a value at a time, each tested against the row's bounds.
                assert!(src.contains("*reinterpret_cast<const unsigned int*>(in0 + row + col + e)"), "{src}");
                assert!(src.contains("*reinterpret_cast<unsigned int*>(out0 + row + col + e)"), "{src}");
                let suffix = if layer_norm { "" } else { "ll" };
                assert!(src.contains(&format!("col + e >= 0 && col + e < {cols}{suffix})")), "{src}");
                if layer_norm {
                    // The weight and bias, aligned to their columns, not to the row: two
                    // aligned accesses and a shift where the access is the row's whole.
                    let whole = format!("if (col >= 0 && col + 4 <= {cols} && (col % 4 == 0 || col - col % 4 + 8 <= {cols})) {{ uint4 q;");
                    assert!(src.contains(&whole), "{src}");
                    assert!(src.contains("const uint4 lo_ = a_[0]; const uint4 hi_ = s_ != 0 ? a_[1] : lo_;"), "{src}");
                    assert!(src.contains("q.x = p0_;") && src.contains("p[0] = __uint_as_float(q.x);"), "{src}");
                }
                super::super::compiles_with_nvrtc(src);
            }
        }
        // Where 16 bytes divide the row, or the row is shorter than one access, nothing changes.
        assert!(!RowLayout::on_chip(1024, 4, REGISTER_VALUES, HOPPER, 4).aligned);
        assert!(!RowLayout::on_chip(3, 4, REGISTER_VALUES, HOPPER, 4).aligned);
        assert!(!RowLayout::within(1001, 4, REGISTER_VALUES).aligned, "other kernels keep rows' own alignment");
    }

    #[test]
    fn sixteen_bit_rows_of_odd_lengths_in_registers_are_kept_as_read_with_32_bit_columns() {
        // (Rows of up to 256 values are read as tiles by default, `tiled_rows` and
        // `pipelined_tiles`: this test is of rows read in place.)
        let generated = |dtype: DType, cols: usize, layer_norm: bool| {
            let variants = KernelVariants { tiled_rows: false, pipelined_tiles: false, ..KernelVariants::default() };
            row_op_with(layer_norm, dtype, [4, cols], HOPPER_BLOCK, variants)
        };
        for dtype in [DType::BF16, DType::F16] {
            for layer_norm in [true, false] {
                for cols in [257, 1001, 2049, 12289] {
                    let g = generated(dtype, cols, layer_norm);
                    let (layout, src) = (g.layout, &g.source.source);
                    assert!(layout.aligned && layout.per_thread == Some(layout.in_registers), "{layout:?}");
                    let n = layout.in_registers;
                    assert!(src.contains(&format!("uint4 vr[{n}];")), "{src}");
                    assert!(!src.contains("float v["), "no row of `float`s: {src}");
                    // Widened in each of the three passes; `softmax`'s maximum is taken over
                    // the words as read, two values at a time, and one word widened.
                    let widened = if layer_norm { 3 } else { 2 };
                    assert_eq!(src.matches("const uint4 w = vr[j]; float xs[8];").count(), widened, "{src}");
                    assert!(src.contains("const int col = ") && !src.contains("long long col"), "{src}");
                    if !layer_norm {
                        let (ty, lowest, widen) = match dtype {
                            DType::BF16 => ("bf16x2", "0xff80ff80u", "bs_from_bf16"),
                            _ => ("f16x2", "0xfc00fc00u", "bs_from_f16"),
                        };
                        assert!(src.contains(&format!("asm(\"max.NaN.{ty} %0, %1, %2;\"")), "{src}");
                        assert!(src.contains(&format!("unsigned int m2 = {lowest};")), "{src}");
                        assert!(
                            src.contains("const uint4 w = vr[j];\n      if (in_row) { m2 = bs_max2(m2, w.x);"),
                            "{src}"
                        );
                        assert!(src.contains(&format!("acc = bs_max({widen}(m2), {widen}((m2 >> 16)));")), "{src}");
                        // The exponentials are taken for the sum and again for the results.
                        assert!(src.contains("acc = acc + bs_exp(x[e] - m);"), "{src}");
                        assert!(!src.contains("x[e] = bs_exp"), "nowhere to keep them: {src}");
                    }
                    crate::executors::cuda::compiles_with_nvrtc(src);
                }
            }
            // `softmax` over rows of 8 threads or fewer keeps `float`s: one exponential a value.
            for cols in [9, 33, 100, 150] {
                let short = generated(dtype, cols, false);
                assert!(short.layout.aligned && short.layout.threads_per_row <= 8, "{:?}", short.layout);
                assert!(!short.source.source.contains("vr[") && short.source.source.contains("x[e] = bs_exp"));
                assert!(!short.source.source.contains("bs_max2"), "{}", short.source.source);
            }
            // Rows 16 bytes divide keep `float`s and 64-bit columns.
            let kept = generated(dtype, 1024, true).source.source;
            assert!(kept.contains("float v[32];") && kept.contains("long long col"), "{kept}");
            assert!(generated(dtype, 1024, false).source.source.contains("float v[32];"));
        }
        // As do f32 rows, whose columns stay as the variant says for `softmax` (32-bit ones ran
        // f32 `softmax` over [2048, 2049] at 0.83x).
        assert!(!generated(DType::F32, 1001, true).source.source.contains("vr["));
        let f32_softmax = generated(DType::F32, 2049, false).source.source;
        assert!(!f32_softmax.contains("vr[") && f32_softmax.contains("long long col"), "{f32_softmax}");
    }

    #[test]
    fn layer_norm_over_long_rows_of_odd_lengths_writes_its_last_pass_once_per_shift() {
        let hopper = RowTarget { shared_limit: HOPPER_BLOCK, ..HOPPER };
        let ln = |dtype: DType, shape: [usize; 2]| layer_norm_for(dtype, dtype, shape, 2, hopper);
        // Kept in shared memory by a block of its own (f32 [333, 50257], bf16 [167, 100003]) and
        // streamed (f32 [18, 200003]): a copy of the pass for each shift of the row, each
        // reading the weight and the bias at the shift of its columns, a constant.
        for (dtype, shape) in [(DType::F32, [333, 50257]), (DType::BF16, [167, 100003]), (DType::F32, [18, 200003])] {
            let g = ln(dtype, shape);
            let (src, v) = (&g.source.source, g.layout.vector);
            assert!(g.layout.block >= 512 && !g.layout.in_registers_alone(), "{:?}", g.layout);
            assert!(src.contains("switch ((int)shift) {"), "{src}");
            for s in 0..v {
                assert!(src.contains(&format!("case {s}: {{")), "{src}");
                assert!(src.contains(&format!("const int s_ = {};", (v - s) % v)), "{src}");
            }
            assert!(!src.contains("const int s_ = (int)(o_ %"), "{src}");
            // (Streamed over clusters of blocks: Hopper's alone.)
            if let Some(ptx) = crate::executors::cuda::nvrtc_ptx(src, Some("compute_90")) {
                ptx.unwrap_or_else(|e| panic!("NVRTC rejects the kernel: {e}\n{src}"));
            }
        }
        // Held in registers alone ([2048, 2049], [1365, 12289]), or two blocks of 512 an SM
        // (bf16 [333, 50257]): one pass, the shift of each access taken as it runs.
        for (dtype, shape) in [(DType::F32, [2048, 2049]), (DType::BF16, [1365, 12289]), (DType::BF16, [333, 50257])] {
            let g = ln(dtype, shape);
            let src = &g.source.source;
            assert!(!src.contains("switch ((int)shift)"), "{:?}: {src}", g.layout);
            assert!(src.contains(&format!("const int s_ = (int)(o_ % {});", g.layout.vector)), "{src}");
        }
        let two_blocks = ln(DType::BF16, [333, 50257]);
        assert_eq!((two_blocks.layout.block, two_blocks.layout.in_registers_alone()), (512, false));
        // Streamed rows split over clusters take it too.
        assert!(ln(DType::F32, [18, 200003]).source.source.contains("__cluster_dims__("));
        // bf16 rows with f32 weight and bias: accesses of 4 values, the operands' 16 bytes read
        // at the constant shift, 4 copies.
        let mixed = layer_norm_for(DType::BF16, DType::F32, [167, 100003], 2, hopper);
        let src = &mixed.source.source;
        assert_eq!(mixed.layout.vector, 4, "{:?}", mixed.layout);
        assert!(src.contains("case 3: {") && !src.contains("case 4: {") && src.contains("const int s_ = 1;"), "{src}");
        crate::executors::cuda::compiles_with_nvrtc(src);
    }

    #[test]
    fn layer_norm_over_rows_of_odd_lengths_stages_its_weight_and_bias_a_copy_per_shift() {
        let ln = |dtype: DType, shape: [usize; 2], operands: usize, target: RowTarget| {
            layer_norm_for(dtype, dtype, shape, operands, target)
        };
        let hopper = RowTarget { shared_limit: HOPPER_BLOCK, ..HOPPER };
        // bf16 rows of 1,001 by a warp each, 8 rows a block of 256, four blocks an SM: two
        // operands of 8 copies of 1,016 values (1,008 and one access more) each.
        let g = ln(DType::BF16, [16384, 1001], 2, hopper);
        let src = &g.source.source;
        assert_eq!(g.shared_bytes, 2 * 8 * 1016 * 2);
        assert_eq!(g.layout.shared_bytes(), 0, "the row in registers alone");
        assert_eq!(g.blocks, 132 * 4, "as many blocks as run at once, each looping over rows");
        assert!(
            src.contains("unsigned short* const bs_staged2 = reinterpret_cast<unsigned short*>(bs_staged + 16256);"),
            "{src}"
        );
        // Copy `s` holds column `c` at `c + s`: filled 16 bytes at a time, then one barrier,
        // before the loop over rows.
        assert!(src.contains("for (int i = threadIdx.x; i < 1016; i += blockDim.x)"), "{src}");
        assert!(src.contains("const int s = i / 127; const int c0 = (i - s * 127) * 8 - s;"), "{src}");
        let barrier = src.find("__syncthreads();").unwrap();
        assert!(barrier < src.find("for (long long r0 = lead;").unwrap(), "{src}");
        for k in [1, 2] {
            assert!(src.contains(&format!("bs_staged{k} + (int)(shift * 1016 + col + shift))")), "{src}");
            assert!(!src.contains(&format!("reinterpret_cast<const uint4*>(in{k} + (o_ - s_))")), "not shifted: {src}");
        }
        crate::executors::cuda::compiles_with_nvrtc(src);
        // Few rows: as many blocks as they need. f32 rows: 4 copies of 1,008 values. The weight
        // alone: one operand.
        assert_eq!(ln(DType::BF16, [40, 1001], 2, hopper).blocks, 5);
        let f32_rows = ln(DType::F32, [3, 1001], 2, hopper);
        assert_eq!(f32_rows.shared_bytes, 2 * 4 * 1008 * 4);
        crate::executors::cuda::compiles_with_nvrtc(&f32_rows.source.source);
        let weight = ln(DType::F16, [64, 513], 1, hopper);
        assert_eq!(weight.shared_bytes, 8 * 528 * 2);
        assert!(weight.source.source.contains("bs_staged1") && !weight.source.source.contains("bs_staged2"));
        crate::executors::cuda::compiles_with_nvrtc(&weight.source.source);
        // A bf16 row with f32 weight and bias: accesses of 4 values, 4 f32 copies each.
        let mixed = layer_norm_for(DType::BF16, DType::F32, [64, 1001], 2, hopper);
        assert_eq!(mixed.shared_bytes, 2 * 4 * 1008 * 4);
        assert!(mixed.source.source.contains("__float_as_uint(in2[col])"), "{}", mixed.source.source);
        crate::executors::cuda::compiles_with_nvrtc(&mixed.source.source);
        // Not staged: rows 16 bytes divide; no operands; rows kept in shared memory too; rows by
        // blocks of 128 (eight an SM, 66 KB of copies each); a GPU whose SM holds fewer copies
        // than blocks (four of 33 KB in 128 KB); `softmax`.
        let plain = |g: RowSource| g.shared_bytes == g.layout.shared_bytes() && !g.source.source.contains("bs_staged");
        assert!(plain(ln(DType::BF16, [64, 1024], 2, hopper)));
        assert!(plain(ln(DType::BF16, [64, 1001], 0, hopper)));
        assert!(plain(ln(DType::BF16, [64, 50257], 2, hopper)));
        assert!(plain(ln(DType::BF16, [64, 2049], 2, hopper)));
        assert!(plain(ln(DType::BF16, [64, 1001], 2, RowTarget { sm_shared: 128 * 1024, ..hopper })));
        assert!(plain(row_op_with(false, DType::BF16, [64, 1001], HOPPER_BLOCK, KernelVariants::default())));
    }

    #[test]
    fn layer_norm_reads_its_weight_and_bias_per_column() {
        let bf16 = |b: &mut TraceBuilder<'_>, shape: &[usize]| {
            b.input_with(&crate::TensorMeta::new(DType::BF16, shape)).unwrap()
        };
        let generated = source_of(|b| {
            let x = bf16(b, &[8, 4, 32]);
            let w = bf16(b, &[32]);
            let bias = bf16(b, &[32]);
            b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap()
        })
        .unwrap();
        assert_eq!(generated.source.input_lengths, vec![8 * 4 * 32 / 2, 16, 16]);
        let src = &generated.source.source;
        assert_eq!(generated.layout.vector, 8, "16 bytes of bf16");
        assert!(src.contains("reinterpret_cast<const uint4*>(in1 + col)"), "{src}");
        assert!(src.contains("reinterpret_cast<const uint4*>(in2 + col)"), "{src}");
        assert!(src.contains("expf(logf(variance + "), "{src}");
    }

    #[test]
    fn sixteen_bit_layer_norm_rows_in_registers_ask_for_1024_threads_an_sm() {
        let bounds = |dtype: DType, cols: usize, layer_norm: bool| {
            let g = source_within(
                |b| {
                    let x = b.input_with(&crate::TensorMeta::new(dtype, &[4, cols])).unwrap();
                    if layer_norm {
                        let w = b.input_with(&crate::TensorMeta::new(dtype, &[cols])).unwrap();
                        b.layer_norm(x, 1e-5, Some(w), Some(w)).unwrap()
                    } else {
                        b.softmax(x).unwrap()
                    }
                },
                227 * 1024,
            )
            .unwrap();
            let src = g.source.source;
            let at = src.find("__launch_bounds__(").unwrap() + "__launch_bounds__(".len();
            src[at..at + src[at..].find(')').unwrap()].to_string()
        };
        // Rows of 16,384 by 512 threads: two blocks an SM; of 1,024 by 256 threads: four.
        assert_eq!(bounds(DType::BF16, 16384, true), "512, 2");
        assert_eq!(bounds(DType::F16, 1024, true), "256, 4");
        // `f32` rows, `softmax`, and rows kept in shared memory too keep the compiler's choice.
        assert_eq!(bounds(DType::F32, 16384, true), "512");
        assert_eq!(bounds(DType::BF16, 16384, false), "512");
        assert_eq!(bounds(DType::BF16, 65536, true), "1024");
    }

    /// With `tiled_rows`, `softmax` and `layer_norm` over rows of up to 128 bytes (16-bit
    /// `softmax` rows of up to 256 values) whose length in bytes 16 does not divide read and
    /// write a block's run of rows through shared memory: every access 16 bytes, a block of 256
    /// threads a tile, a tile's rows as many as the block's threads over a row's. Other rows,
    /// and every row without the variant, are read in place.
    #[test]
    fn short_rows_of_odd_lengths_are_read_and_written_as_tiles() {
        let tiled = KernelVariants { pipelined_tiles: false, wide_tiles: false, ..KernelVariants::default() };
        let in_place = KernelVariants { tiled_rows: false, ..tiled };
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for cols in [1, 3, 9, 33, 100, 150, 255, 256, 257, 1001] {
                let (odd, bytes) = (!(cols * dtype.size_bytes()).is_multiple_of(16), cols * dtype.size_bytes());
                for layer_norm in [false, true] {
                    let rows = 1000;
                    let what = format!("{dtype} [{rows}, {cols}], layer_norm: {layer_norm}");
                    let kernel = row_op_with(layer_norm, dtype, [rows, cols], HOPPER_BLOCK, tiled);
                    let src = &kernel.source.source;
                    let id = if layer_norm { prims::LAYER_NORM } else { prims::SOFTMAX };
                    let tiles = RowTiles::for_rows(id, rows, cols, dtype, dtype, tiled);
                    let short = bytes <= 128 || (!layer_norm && dtype != DType::F32 && cols <= 256);
                    assert_eq!(tiles.is_some(), odd && short, "{what}");
                    assert_eq!(src.contains("tile_in["), tiles.is_some(), "{what}\n{src}");
                    if let Some(tiles) = tiles {
                        let t = tiles.threads_per_row;
                        assert!(
                            t.is_power_of_two() && tiles.per_thread <= 16 && tiles.per_thread * t >= cols,
                            "{what}"
                        );
                        assert_eq!((kernel.layout.block, tiles.rows_per_tile), (256, 256 / t), "{what}");
                        assert_eq!(kernel.blocks as usize, rows.div_ceil(256 / t), "{what}");
                        // Every access of the tensor 16 bytes, but those of a tile's ends.
                        assert!(src.contains("reinterpret_cast<const uint4*>(in0 + at)"), "{what}\n{src}");
                        assert!(src.contains("reinterpret_cast<uint4*>(out0 + at)"), "{what}\n{src}");
                        super::super::compiles_with_nvrtc(src);
                    }
                    let kernel = row_op_with(layer_norm, dtype, [rows, cols], HOPPER_BLOCK, in_place);
                    assert!(!kernel.source.source.contains("tile_in["), "{what}, without the variant");
                }
            }
        }
        // A bf16 row written as f32 (`layer_norm` with f32 weight and bias): odd in either.
        let mixed = layer_norm_for(DType::BF16, DType::F32, [7001, 33], 2, HOPPER);
        assert!(mixed.source.source.contains("tile_in["), "{}", mixed.source.source);
        // (Pipelined, by default: two bf16 input tiles of 64 rows and one f32 tile of results.)
        assert_eq!(mixed.shared_bytes, (64 * 33 + 16) * (2 + 2 + 4));
        super::super::compiles_with_nvrtc(&mixed.source.source);
        // The rule, case by case: tiles without `pipelined_tiles`, and with it (the defaults),
        // pipelined or not.
        let (softmax, layer_norm) = (prims::SOFTMAX, prims::LAYER_NORM);
        let defaults = KernelVariants::default();
        for (id, dtype, cols, plain, by_default) in [
            (softmax, DType::F32, 9, true, Some(false)),
            (layer_norm, DType::F32, 31, true, Some(true)),
            (softmax, DType::F32, 32, false, None), // 128 bytes: 16 divides them
            (softmax, DType::F32, 33, false, Some(true)), // 132 bytes
            (layer_norm, DType::F32, 63, false, Some(true)),
            (layer_norm, DType::F32, 65, false, None),       // 260 bytes
            (layer_norm, DType::BF16, 5, true, Some(false)), // one thread a row
            (layer_norm, DType::BF16, 17, true, Some(true)),
            (layer_norm, DType::BF16, 33, true, Some(true)),
            (layer_norm, DType::BF16, 100, false, Some(true)),
            (softmax, DType::BF16, 100, true, Some(true)),
            (softmax, DType::F16, 255, true, Some(true)),
            (softmax, DType::F16, 256, false, None), // 512 bytes
            (layer_norm, DType::F16, 257, false, None),
        ] {
            let what = format!("{dtype} rows of {cols}, {id:?}");
            assert_eq!(RowTiles::for_rows(id, 4096, cols, dtype, dtype, tiled).is_some(), plain, "{what}");
            let pipelined = RowTiles::for_rows(id, 4096, cols, dtype, dtype, defaults).map(|t| t.pipelined);
            assert_eq!(pipelined, by_default, "{what}");
        }
        // No rows, no columns, or rows too long for a tile's threads.
        for variants in [tiled, defaults] {
            assert_eq!(RowTiles::for_rows(softmax, 0, 33, DType::BF16, DType::BF16, variants), None);
            assert_eq!(RowTiles::for_rows(softmax, 10, 0, DType::BF16, DType::BF16, variants), None);
            assert_eq!(RowTiles::for_rows(softmax, 10, 257, DType::BF16, DType::BF16, variants), None);
        }
    }

    /// With `wide_tiles` (on by default), the plain tiles of rows of up to 10 bytes (16-bit rows
    /// of up to 5 values, f32 rows of 1 or 2) hold about 8 KB of input, each thread running
    /// several rows in turn, alike in every thread of the block (a loop over its rows, the same
    /// count for each); rows of which 8 KB hold fewer than three a thread, and pipelined tiles,
    /// keep a row a thread, and their kernels as before, byte for byte. The kernels compile, and
    /// their tiles fit the 48 KB of static shared memory.
    #[test]
    fn wide_tiles_run_several_short_rows_a_thread() {
        let defaults = KernelVariants::default();
        let narrow = KernelVariants { wide_tiles: false, ..defaults };
        let rows = 100_003;
        // (dtype, cols, rows a thread): 8,192 bytes over 256 rows of `cols` values where that
        // is at least 3, else 1.
        let bits16 = [(1, 16), (2, 8), (3, 5), (4, 4), (5, 3), (6, 1), (7, 1), (9, 1), (15, 1), (33, 1)];
        let f32s = [(1, 8), (2, 4), (3, 1), (5, 1), (33, 1)];
        let cases = (bits16.iter().flat_map(|&(c, p)| [(DType::BF16, c, p), (DType::F16, c, p)]))
            .chain(f32s.iter().map(|&(c, p)| (DType::F32, c, p)));
        for (dtype, cols, passes) in cases {
            for is_layer_norm in [false, true] {
                let what = format!("{dtype} [{rows}, {cols}], layer_norm: {is_layer_norm}");
                let id = if is_layer_norm { prims::LAYER_NORM } else { prims::SOFTMAX };
                let tiles = RowTiles::for_rows(id, rows, cols, dtype, dtype, defaults).expect("tiled");
                assert_eq!(tiles.passes, passes, "{what}");
                assert_eq!(tiles.pipelined, cols > 16, "{what}");
                let per_pass = 256 / tiles.threads_per_row;
                assert_eq!(tiles.rows_per_tile, per_pass * passes, "{what}");
                let kernel = row_op_with(is_layer_norm, dtype, [rows, cols], HOPPER_BLOCK, defaults);
                let src = &kernel.source.source;
                let r = tiles.rows_per_tile;
                let looped =
                    format!("for (int slot = threadIdx.x / {}; slot < {r}; slot += {per_pass})", tiles.threads_per_row);
                assert_eq!(src.contains(&looped), passes > 1, "{what}\n{src}");
                assert!(src.contains(&format!("t * {r}ll + slot < {rows}ll")), "{what}\n{src}");
                if !tiles.pipelined {
                    assert_eq!(kernel.blocks as usize, rows.div_ceil(r), "{what}");
                    // The input and results tiles, as declared, in static shared memory
                    // under its 48 KB (with `layer_norm`'s weight and bias as floats).
                    let held = tiles.tile_values() + 16;
                    let ty = super::super::codegen::element_type(dtype);
                    assert!(src.contains(&format!("{ty} tile_in[{held}];")), "{what}\n{src}");
                    assert!(src.contains(&format!("{ty} tile_out[{held}];")), "{what}\n{src}");
                    assert!(2 * held * dtype.size_bytes() + 2 * 4 * cols <= 48 * 1024, "{what}");
                }
                super::super::compiles_with_nvrtc(src);
                // Without the variant, a row a thread, and no loop over the rows; where the
                // variant makes no loop, the same kernel.
                let plain = RowTiles::for_rows(id, rows, cols, dtype, dtype, narrow).expect("tiled");
                assert_eq!((plain.passes, plain.rows_per_tile), (1, per_pass), "{what}");
                let without = row_op_with(is_layer_norm, dtype, [rows, cols], HOPPER_BLOCK, narrow);
                assert!(!without.source.source.contains("for (int slot"), "{what}");
                if passes == 1 {
                    assert_eq!(without.source.source, *src, "{what}");
                }
            }
        }
        // A bf16 row written as f32 takes the f32 results' tile beside its 8 KB of input (rows
        // of 3: 1,280 rows, about 23 KB in all).
        let mixed = layer_norm_for(DType::BF16, DType::F32, [rows, 3], 2, HOPPER);
        let src = &mixed.source.source;
        assert!(src.contains("slot < 1280; slot += 256"), "{src}");
        assert!(src.contains("unsigned short tile_in[3856];") && src.contains("float tile_out[3856];"), "{src}");
        super::super::compiles_with_nvrtc(src);
        // Alone (without `tiled_rows`), the variant tiles nothing.
        let alone = KernelVariants::NONE.flipped("wide_tiles").expect("a variant");
        assert_eq!(RowTiles::for_rows(prims::SOFTMAX, rows, 3, DType::BF16, DType::BF16, alone), None);
    }

    /// With `tile_occupancy` (on by default), the plain tiles' kernels over 16-bit rows ask for
    /// eight blocks an SM and are otherwise those without it, byte for byte; f32 tiles, pipelined
    /// tiles and untiled rows are unchanged. Eight blocks' tiles fit in an SM's shared memory.
    /// The kernels compile.
    #[test]
    fn tile_occupancy_asks_plain_16_bit_tiles_for_eight_blocks_an_sm() {
        let without = KernelVariants { tile_occupancy: false, ..KernelVariants::default() };
        let occupied = KernelVariants { tile_occupancy: true, ..without };
        let rows = 100_003;
        let mut asked = 0;
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for is_layer_norm in [false, true] {
                // (cols, how the defaults lay them out): plain tiles, pipelined tiles, or none.
                for (cols, layout) in [
                    (1, "plain"),
                    (3, "plain"),
                    (5, "plain"),
                    (7, "plain"),
                    (15, "plain"),
                    (33, "pipelined"),
                    (1024, "none"),
                ] {
                    let what = format!("{dtype} [{rows}, {cols}], layer_norm: {is_layer_norm}");
                    let id = if is_layer_norm { prims::LAYER_NORM } else { prims::SOFTMAX };
                    let tiles = RowTiles::for_rows(id, rows, cols, dtype, dtype, without);
                    let got = tiles.map_or("none", |t| if t.pipelined { "pipelined" } else { "plain" });
                    assert_eq!(got, layout, "{what}");
                    let before = row_op_with(is_layer_norm, dtype, [rows, cols], HOPPER_BLOCK, without).source.source;
                    let with = row_op_with(is_layer_norm, dtype, [rows, cols], HOPPER_BLOCK, occupied).source.source;
                    let bounded = layout == "plain" && dtype != DType::F32;
                    assert_eq!(with.contains("__launch_bounds__(256, 8)"), bounded, "{what}\n{with}");
                    if bounded {
                        asked += 1;
                        assert_eq!(
                            with.replace("__launch_bounds__(256, 8)", "__launch_bounds__(256)"),
                            before,
                            "{what}"
                        );
                        // Eight blocks' tiles in and out (with `layer_norm`'s weight and bias
                        // as floats) in an SM's shared memory, with what each block reserves.
                        let t = tiles.expect("tiled");
                        let block = 2 * (t.tile_values() + 16) * dtype.size_bytes() + 2 * 4 * cols;
                        assert!(fit_an_sm(8, block, HOPPER_SM), "{what}: {block} bytes a block");
                        super::super::compiles_with_nvrtc(&with);
                    } else {
                        assert_eq!(with, before, "{what}");
                    }
                }
            }
        }
        assert_eq!(asked, 2 * 2 * 5);
    }

    /// With `pipelined_tiles` (on by default), rows of odd lengths of 17 to 256 values (f32 ones
    /// up to 64) are read as tiles by a grid of at most 4 blocks an SM (as many as its shared
    /// memory holds), each copying its next tile with `cp.async` into dynamic shared memory of
    /// two input tiles and one of results; shorter rows keep `tiled_rows`' kernels, and without
    /// either variant no row is tiled. The kernels compile.
    #[test]
    fn pipelined_tiles_copy_the_next_tile_while_running_one() {
        let defaults = KernelVariants::default();
        let alone = KernelVariants { tiled_rows: false, ..defaults };
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for cols in [3, 17, 33, 63, 65, 100, 255, 256, 257] {
                let odd = !(cols * dtype.size_bytes()).is_multiple_of(16);
                let expected = odd && cols > 16 && cols <= if dtype == DType::F32 { 64 } else { 256 };
                for layer_norm in [false, true] {
                    let rows = 1 << 20;
                    let what = format!("{dtype} [{rows}, {cols}], layer_norm: {layer_norm}");
                    let id = if layer_norm { prims::LAYER_NORM } else { prims::SOFTMAX };
                    for variants in [defaults, alone] {
                        let tiles = RowTiles::for_rows(id, rows, cols, dtype, dtype, variants);
                        assert_eq!(tiles.is_some_and(|t| t.pipelined), expected, "{what}");
                        let kernel = row_op_with(layer_norm, dtype, [rows, cols], HOPPER_BLOCK, variants);
                        let src = &kernel.source.source;
                        assert_eq!(src.contains("bs_copy_async(tiles_in"), expected, "{what}\n{src}");
                        if !variants.tiled_rows {
                            assert_eq!(tiles.is_some(), expected, "{what}: no other tiles without tiled_rows");
                        }
                        let Some(tiles) = tiles.filter(|t| t.pipelined) else { continue };
                        let held = (tiles.tile_values() + 16) * dtype.size_bytes();
                        assert_eq!(kernel.shared_bytes, 3 * held, "{what}");
                        // The next tile copied into the other input tile, its copies committed,
                        // then all but them waited for, before the barrier and the rows.
                        let values = tiles.tile_values() + 16;
                        let next = format!("bs_copy_async((tiles_in + (b ^ 1) * {values}) + i, in0 + at);");
                        let wait = "bs_commit();\n    bs_wait_prior();\n";
                        let (at_next, at_wait) = (src.find(&next), src.find(wait));
                        assert!(at_next.is_some() && at_wait > at_next, "{what}\n{src}");
                        assert!(src.contains("cp.async.wait_group 1;"), "{what}");
                        let rows_at = src.find("const bool valid").unwrap();
                        assert!(src[at_wait.unwrap()..rows_at].contains("__syncthreads();"), "{what}\n{src}");
                        let block = 3 * held + usize::from(layer_norm) * 2 * cols * 4 + 1024;
                        let per_sm = (HOPPER.sm_shared / block).min(4);
                        assert_eq!(kernel.blocks as usize, tiles.tiles().min(132 * per_sm), "{what}");
                        assert!(kernel.blocks < tiles.tiles() as u32, "{what}: a block runs many tiles");
                        if variants == defaults {
                            super::super::compiles_with_nvrtc(src);
                        }
                    }
                    let none = KernelVariants { pipelined_tiles: false, tiled_rows: false, ..defaults };
                    let kernel = row_op_with(layer_norm, dtype, [rows, cols], HOPPER_BLOCK, none);
                    assert!(!kernel.source.source.contains("tile_in"), "{what}, without either variant");
                }
            }
        }
    }

    /// With `pipelined_passes`, the pipelined tiles of 16-bit rows hold about 16 KB of input, each
    /// thread running two or more rows in turn (a loop over its rows, alike in every thread);
    /// f32 rows, whose passes take 8 KB or more, keep their kernels byte for byte, as does every
    /// row without `pipelined_tiles`. Each block's two input tiles and its results tile take
    /// the dynamic shared memory the launch gives it, as many blocks an SM (up to four) as fit
    /// run, and the kernel asks `ptxas` for that many (its blocks loop over the tiles: all of
    /// them resident at once, none in a second wave). The kernels compile.
    #[test]
    fn pipelined_passes_run_several_rows_a_thread_in_16_kb_tiles() {
        let defaults = KernelVariants::default();
        let deep = KernelVariants { pipelined_passes: true, ..defaults };
        let rows = 1 << 20;
        // (cols, rows a thread in 16 bits): 16,384 bytes over the rows a pass holds (256 over
        // the threads a row, a power of two), where that is at least 2.
        for (cols, passes) in [(17, 3), (31, 2), (33, 3), (63, 2), (65, 3), (100, 2), (127, 2), (129, 3), (255, 2)] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for layer_norm in [false, true] {
                    let what = format!("{dtype} [{rows}, {cols}], layer_norm: {layer_norm}");
                    let id = if layer_norm { prims::LAYER_NORM } else { prims::SOFTMAX };
                    let before = row_op_with(layer_norm, dtype, [rows, cols], HOPPER_BLOCK, defaults);
                    let with = row_op_with(layer_norm, dtype, [rows, cols], HOPPER_BLOCK, deep);
                    let Some(tiles) = RowTiles::for_rows(id, rows, cols, dtype, dtype, deep) else {
                        // f32 rows past 64 values are read in place.
                        assert!(dtype == DType::F32 && cols > 64, "{what}");
                        assert_eq!(with.source.source, before.source.source, "{what}");
                        continue;
                    };
                    assert!(tiles.pipelined, "{what}");
                    let per_pass = 256 / tiles.threads_per_row;
                    if dtype == DType::F32 {
                        assert!(per_pass * cols * 4 > 8192, "{what}");
                        assert_eq!(tiles.passes, 1, "{what}");
                        assert_eq!(with.source.source, before.source.source, "{what}");
                        continue;
                    }
                    assert_eq!(tiles.passes, passes, "{what}");
                    assert_eq!(tiles.rows_per_tile, per_pass * passes, "{what}");
                    assert!(tiles.tile_values() * 2 <= 16384 && tiles.tile_values() * 2 > 8192, "{what}");
                    let src = &with.source.source;
                    let (g, r) = (tiles.threads_per_row, tiles.rows_per_tile);
                    let looped = format!("for (int slot = threadIdx.x / {g}; slot < {r}; slot += {per_pass})");
                    assert!(src.contains(&looped), "{what}\n{src}");
                    assert!(src.contains(&format!("t * {r}ll + slot < {rows}ll")), "{what}\n{src}");
                    let held = (tiles.tile_values() + 16) * 2;
                    assert_eq!(with.shared_bytes, 3 * held, "{what}");
                    let block = 3 * held + usize::from(layer_norm) * 2 * cols * 4 + 1024;
                    let per_sm = (HOPPER.sm_shared / block).min(4);
                    assert_eq!(per_sm, 4, "{what}: {block} bytes a block");
                    // The grid's blocks loop over the tiles: `ptxas` is asked to fit them all.
                    assert!(src.contains("__launch_bounds__(256, 4)"), "{what}\n{src}");
                    assert_eq!(with.blocks as usize, tiles.tiles().min(132 * per_sm), "{what}");
                    super::super::compiles_with_nvrtc(src);
                    // Without the variant, a row a thread's share, no loop over the rows.
                    let plain = RowTiles::for_rows(id, rows, cols, dtype, dtype, defaults).expect("tiled");
                    assert_eq!((plain.passes, plain.rows_per_tile), (1, per_pass), "{what}");
                    assert!(!before.source.source.contains("for (int slot"), "{what}");
                }
            }
        }
        // A bf16 row written as f32 (`layer_norm` with f32 weight and bias): the results' tile
        // takes twice the input's, and the block stays within 48 KB with fewer rows a thread.
        for (cols, passes) in [(17, 2), (33, 2), (65, 2), (100, 1), (129, 2), (255, 1)] {
            let tiles =
                RowTiles::for_rows(prims::LAYER_NORM, rows, cols, DType::BF16, DType::F32, deep).expect("tiled");
            assert_eq!(tiles.passes, passes, "bf16 rows of {cols} written as f32");
            let mixed = source_targeting(
                |b| {
                    let x = b.input_with(&crate::TensorMeta::new(DType::BF16, &[rows, cols])).unwrap();
                    let mut operand = || b.input_with(&crate::TensorMeta::new(DType::F32, &[cols])).unwrap();
                    let (w, bias) = (operand(), operand());
                    b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap()
                },
                HOPPER,
                deep,
            )
            .unwrap();
            let held = tiles.tile_values() + 16;
            assert_eq!(mixed.shared_bytes, held * (2 * 2 + 4), "bf16 rows of {cols} written as f32");
            assert!(mixed.shared_bytes <= 48 * 1024, "bf16 rows of {cols} written as f32");
            assert!(mixed.source.source.contains("float* const tile_out"), "{}", mixed.source.source);
            if passes > 1 {
                assert!(mixed.source.source.contains("__launch_bounds__(256, 4)"), "{}", mixed.source.source);
                super::super::compiles_with_nvrtc(&mixed.source.source);
            }
        }
        // Without `pipelined_tiles`, the variant changes nothing.
        let plain = KernelVariants { pipelined_tiles: false, ..defaults };
        for cols in [3, 33, 100] {
            let before = row_op_with(true, DType::BF16, [rows, cols], HOPPER_BLOCK, plain);
            let with =
                row_op_with(true, DType::BF16, [rows, cols], HOPPER_BLOCK, plain.flipped("pipelined_passes").unwrap());
            assert_eq!(with.source.source, before.source.source, "bf16 rows of {cols}");
        }
    }

    /// With `vector_tile_values`, a tiled row's values move between shared memory and registers
    /// in runs of the most values up to 8 bytes that divide its length (4 in 16 bits, 2 in f32),
    /// each run one aligned access, `layer_norm`'s weight and bias read the same way; rows of odd
    /// lengths, and every row without tiles, keep their kernels byte for byte. The kernels
    /// compile.
    #[test]
    fn vector_tile_values_move_runs_of_values_an_access() {
        let defaults = KernelVariants::default();
        let vectors = KernelVariants { vector_tile_values: true, ..defaults };
        // (cols, run in 16 bits, run in f32): wide tiles (4), plain tiles (12, 9), pipelined
        // (36 to 254).
        for (cols, run16, run32) in
            [(2, 2, 2), (4, 4, 1), (9, 1, 1), (12, 4, 1), (36, 4, 1), (62, 2, 2), (100, 4, 1), (254, 2, 1)]
        {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for layer_norm in [false, true] {
                    let what = format!("{dtype} [65536, {cols}], layer_norm: {layer_norm}");
                    let id = if layer_norm { prims::LAYER_NORM } else { prims::SOFTMAX };
                    let before = row_op_with(layer_norm, dtype, [65536, cols], HOPPER_BLOCK, defaults);
                    let with = row_op_with(layer_norm, dtype, [65536, cols], HOPPER_BLOCK, vectors);
                    let Some(tiles) = RowTiles::for_rows(id, 65536, cols, dtype, dtype, vectors) else {
                        // Rows 16 bytes divide, or f32 rows past 64 values: read in place.
                        assert_eq!(with.source.source, before.source.source, "{what}");
                        continue;
                    };
                    let w = if dtype == DType::F32 { run32 } else { run16 };
                    assert_eq!(tiles.vector, w, "{what}");
                    let plain = RowTiles::for_rows(id, 65536, cols, dtype, dtype, defaults).expect("tiled");
                    assert_eq!(tiles, RowTiles { vector: w, per_thread: tiles.per_thread, ..plain }, "{what}");
                    let g = tiles.threads_per_row;
                    assert!(tiles.per_thread <= 16 && tiles.per_thread.is_multiple_of(w), "{what}");
                    assert!(tiles.per_thread * g >= cols && (tiles.per_thread - w) * g < cols, "{what}");
                    let src = &with.source.source;
                    if w == 1 {
                        let header = |s: &str| s.lines().skip(1).collect::<Vec<_>>().join("\n");
                        assert_eq!(header(src), header(&before.source.source), "{what}");
                        continue;
                    }
                    let (raw, out) = (raw_type(dtype, w), raw_type(dtype, w));
                    let read = format!("*reinterpret_cast<const {raw}*>(tile_in + first + (lane + 0) * {w})");
                    let write = format!("*reinterpret_cast<{out}*>(tile_out + first + (lane + 0) * {w}) =");
                    assert!(src.contains(&read) && src.contains(&write), "{what}\n{src}");
                    assert!(!src.contains("tile_in[first") && !src.contains("tile_out[first"), "{what}\n{src}");
                    if layer_norm {
                        let weight = format!(
                            "reinterpret_cast<const {}*>(operand1 + (lane + 0) * {w})",
                            raw_type(DType::F32, w)
                        );
                        assert!(
                            src.contains(&weight) && src.contains("__shared__ __align__(16) float operand1"),
                            "{what}\n{src}"
                        );
                    }
                    super::super::compiles_with_nvrtc(src);
                }
            }
        }
        // A bf16 row written as f32 (`layer_norm` with f32 weight and bias): runs of 4 read as 8
        // bytes, written as 16.
        let mixed = source_targeting(
            |b| {
                let x = b.input_with(&crate::TensorMeta::new(DType::BF16, &[65536, 100])).unwrap();
                let mut operand = || b.input_with(&crate::TensorMeta::new(DType::F32, &[100])).unwrap();
                let (w, bias) = (operand(), operand());
                b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap()
            },
            HOPPER,
            vectors,
        )
        .unwrap();
        let src = &mixed.source.source;
        assert!(src.contains("*reinterpret_cast<const uint2*>(tile_in + first + (lane + 0) * 4)"), "{src}");
        assert!(src.contains("*reinterpret_cast<uint4*>(tile_out + first + (lane + 0) * 4) ="), "{src}");
        super::super::compiles_with_nvrtc(src);
        // Without tiles, the variant changes nothing.
        let in_place = KernelVariants { tiled_rows: false, pipelined_tiles: false, ..defaults };
        for cols in [4, 36, 100] {
            let before = row_op_with(true, DType::BF16, [65536, cols], HOPPER_BLOCK, in_place);
            let with = row_op_with(
                true,
                DType::BF16,
                [65536, cols],
                HOPPER_BLOCK,
                in_place.flipped("vector_tile_values").unwrap(),
            );
            assert_eq!(with.source.source, before.source.source, "bf16 rows of {cols}");
        }
    }

    /// With `streamed_last_pass_hints`, a streamed row's last pass reads the row and writes the
    /// results with the streaming hints where the kernel's tensors do not fit in three quarters
    /// of L2, or its inputs in half (`keep_in_l2`'s rule); the passes before it read plainly.
    /// Streamed rows whose tensors fit, and rows kept on chip, keep their kernels byte for byte.
    /// The kernels compile.
    #[test]
    fn streamed_last_pass_hints_mark_the_last_pass_only() {
        let defaults = KernelVariants::default();
        let hinted = defaults.flipped("streamed_last_pass_hints").unwrap();
        const L2: usize = 50 << 20;
        for (layer_norm, dtype, shape) in [
            (true, DType::F32, [64, 1 << 20]),
            (false, DType::F32, [16, 1 << 20]),
            (true, DType::BF16, [16, 1 << 20]),
            (false, DType::F16, [300, 1 << 20]),
            (true, DType::F32, [3, 1 << 22]),
            // Odd lengths: accesses aligned to the tensor.
            (true, DType::BF16, [40, 1000003]),
            (false, DType::F32, [20, 700001]),
            // One-pass moments off: three passes, the last one forward.
            (true, DType::F32, [9, 1 << 21]),
        ] {
            let what = format!("layer_norm: {layer_norm}, {dtype} {shape:?}");
            let variants =
                |v: KernelVariants| if shape == [9, 1 << 21] { v.flipped("one_pass_moments").unwrap() } else { v };
            let before = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, variants(defaults), L2);
            let with = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, variants(hinted), L2);
            assert!(before.layout.per_thread.is_none(), "{what}: streamed");
            let (b, s) = (&before.source.source, &with.source.source);
            assert!(!b.contains("__ldcs(") && !b.contains("__stcs("), "{what}: no hints without it\n{b}");
            // The first load of the row is plain; the last pass's loads and stores are hinted.
            let first = s.find("in0 + row + col").unwrap();
            assert!(!s[..first].ends_with("__ldcs(reinterpret_cast<const uint4*>("), "{what}\n{s}");
            assert!(s.contains("__ldcs(reinterpret_cast<const uint4*>(in0 + row + col))"), "{what}\n{s}");
            assert!(s.contains("__stcs(reinterpret_cast<uint4*>(out0 + row + col)"), "{what}\n{s}");
            // Every pass before the last reads plainly, the last (from its first hinted load on)
            // with hints only.
            let plain = "*reinterpret_cast<const uint4*>(in0 + row + col)";
            let last = s.find("__ldcs(").unwrap();
            let passes_before = if shape == [9, 1 << 21] { 2 } else { 1 };
            assert!(s[..last].matches(plain).count() >= passes_before, "{what}\n{s}");
            assert!(!s[last..].contains(plain), "{what}: a plain load in the last pass\n{s}");
            assert_eq!((with.blocks, with.source.cluster), (before.blocks, before.source.cluster), "{what}");
            if with.source.cluster > 1 {
                crate::executors::cuda::compiles_as_clusters(s, &what);
            } else {
                super::super::compiles_with_nvrtc(s);
            }
        }
        // Tensors that fit in L2, and rows kept on chip: unchanged.
        for (layer_norm, dtype, shape) in
            [(true, DType::F32, [2, 1 << 20]), (false, DType::BF16, [2, 1 << 21]), (true, DType::F32, [4096, 1024])]
        {
            let before = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, defaults, L2);
            let with = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, hinted, L2);
            assert_eq!(with.source.source, before.source.source, "{layer_norm} {dtype} {shape:?}");
        }
    }

    /// With `deeper_streamed_rounds`, a streamed row's thread makes twice the accesses a round
    /// (its rounds half as many, and the blocks of a split row at most as many as those);
    /// rows kept on chip keep their kernels. The kernels compile.
    #[test]
    fn deeper_streamed_rounds_make_twice_the_accesses_a_round() {
        let defaults = KernelVariants::default();
        let deeper = defaults.flipped("deeper_streamed_rounds").unwrap();
        for (layer_norm, dtype, shape) in [
            (true, DType::F32, [64, 1 << 20]),
            (false, DType::BF16, [16, 1 << 20]),
            (true, DType::F16, [300, 1000003]),
            (false, DType::F32, [3, 100003]),
        ] {
            let what = format!("layer_norm: {layer_norm}, {dtype} {shape:?}");
            let before = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, defaults);
            let with = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, deeper);
            assert!(before.layout.per_thread.is_none(), "{what}: streamed");
            let loads = before.layout.streamed_loads();
            let v = before.layout.vector;
            let (b, s) = (&before.source.source, &with.source.source);
            assert!(b.contains(&format!("float xs[{loads}][{v}];")), "{what}\n{b}");
            assert!(s.contains(&format!("float xs[{}][{v}];", 2 * loads)), "{what}\n{s}");
            assert!(with.source.cluster <= before.source.cluster, "{what}");
            if with.source.cluster > 1 {
                crate::executors::cuda::compiles_as_clusters(s, &what);
            } else {
                super::super::compiles_with_nvrtc(s);
            }
        }
        for (layer_norm, dtype, shape) in [(true, DType::F32, [64, 4096]), (false, DType::BF16, [700, 65537])] {
            let before = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, defaults);
            let with = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, deeper);
            assert_eq!(with.source.source, before.source.source, "{dtype} {shape:?}");
        }
    }

    /// With `streamed_split_waves`, a streamed row is split over a cluster of 8 blocks (16 with
    /// `wave_clusters_of_16`; fewer where its rounds are fewer: each block one at least)
    /// however many the rows, and
    /// each block takes half an SM's shared memory, so that an SM runs one; rows kept on chip,
    /// and every row where the SM's shared memory is unknown, keep their kernels. The kernels
    /// compile.
    #[test]
    fn streamed_split_waves_split_every_streamed_row_one_block_an_sm() {
        let defaults = KernelVariants::default();
        let waves = defaults.flipped("streamed_split_waves").unwrap();
        // (shape, the cluster without the variant, with it, with `wave_clusters_of_16` too)
        for (layer_norm, dtype, shape, without, with, sixteen) in [
            (true, DType::F32, [64, 1 << 20], 4, 8, 16),
            (false, DType::F32, [16, 1 << 20], 8, 8, 16),
            (true, DType::BF16, [300, 1 << 20], 1, 8, 16),
            (false, DType::BF16, [132, 700001], 1, 8, 16),
            (true, DType::F32, [40, 1000003], 4, 8, 16),
            // Rows of 13 rounds (of 8,192 f32 values): 8 blocks at most.
            (false, DType::F32, [40, 100003], 4, 8, 8),
        ] {
            let what = format!("layer_norm: {layer_norm}, {dtype} {shape:?}");
            let before = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, defaults);
            let kernel = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, waves);
            assert!(kernel.layout.per_thread.is_none(), "{what}: streamed");
            assert_eq!((before.source.cluster, kernel.source.cluster), (without, with), "{what}");
            assert_eq!(kernel.blocks as usize, shape[0] * with, "{what}");
            assert!(fit_an_sm(1, kernel.shared_bytes, HOPPER_SM), "{what}: {}", kernel.shared_bytes);
            assert!(!fit_an_sm(2, kernel.shared_bytes, HOPPER_SM), "{what}: {}", kernel.shared_bytes);
            crate::executors::cuda::compiles_as_clusters(&kernel.source.source, &what);
            // Clusters of 16 with `wave_clusters_of_16` (where the rounds allow); alone, nothing.
            let by_16 =
                row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, waves.flipped("wave_clusters_of_16").unwrap());
            assert_eq!((by_16.source.cluster, by_16.blocks as usize), (sixteen, shape[0] * sixteen), "{what}");
            crate::executors::cuda::compiles_as_clusters(&by_16.source.source, &what);
            let alone =
                row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, defaults.flipped("wave_clusters_of_16").unwrap());
            assert_eq!(
                (alone.source.source, alone.blocks, alone.shared_bytes),
                (before.source.source.clone(), before.blocks, before.shared_bytes),
                "{what}"
            );
        }
        // Rows kept on chip (by a block, by a cluster), and the SM's shared memory unknown.
        for (layer_norm, dtype, shape) in [(true, DType::F32, [64, 4096]), (true, DType::F32, [66, 200003])] {
            let before = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, defaults);
            let kernel = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, waves);
            assert_eq!(
                (&kernel.source.source, kernel.blocks, kernel.shared_bytes),
                (&before.source.source, before.blocks, before.shared_bytes),
                "{dtype} {shape:?}"
            );
        }
        let unknown = RowTarget { shared_limit: HOPPER_BLOCK, sm_shared: 0, ..HOPPER };
        let of = |variants| {
            source_targeting(
                |b| {
                    let x = b.input_with(&crate::TensorMeta::new(DType::F32, &[64, 1 << 20])).unwrap();
                    b.softmax(x).unwrap()
                },
                unknown,
                variants,
            )
            .unwrap()
        };
        let (before, kernel) = (of(defaults), of(waves));
        assert_eq!((kernel.source.source, kernel.shared_bytes), (before.source.source, before.shared_bytes));
    }

    #[test]
    fn other_symbols_have_no_row_kernel() {
        let err = source_of(|b| {
            let x = b.input(&[4]).unwrap();
            b.exp(x).unwrap()
        })
        .unwrap_err();
        assert!(err.contains("not a built-in composite"), "{err}");
    }

    /// With `async_row_copies`, the accesses a row kernel keeps in shared memory as read (16-bit
    /// rows, `f32` rows) are copied there with `cp.async`, whole ones only and with no L2 cache
    /// hint, then waited for once: `softmax` rows always, `layer_norm` rows where the streaming
    /// hints do not mark their accesses; every other kernel (hinted `layer_norm` too) is the
    /// same source with the variant or without it. Both compile (for the GPU's architecture and
    /// for NVRTC's default, which has no `cp.async`).
    #[test]
    fn async_row_copies_copy_the_shared_part_of_rows_kept_as_read() {
        // (Waited for once: without `overlapped_first_pass`, below.)
        // (Rows too long for a block streamed, not kept by a cluster: `clustered_rows`' test.)
        let with = KernelVariants { overlapped_first_pass: false, clustered_rows: false, ..KernelVariants::default() };
        let without = KernelVariants { async_row_copies: false, ..with };
        // An L2 that every tensor here fits: no streaming hints.
        let kept = 1 << 40;
        for layer_norm in [false, true] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for shape in [[333, 50257], [256, 65536], [9, 16384], [4096, 1024], [8, 200003]] {
                    let plain = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, without, kept);
                    let copied = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, with, kept);
                    assert_eq!(plain.layout, copied.layout);
                    let (src, what) = (&copied.source.source, format!("{layer_norm} {dtype} {shape:?}"));
                    if plain.layout.shared_bytes() == 0 {
                        assert_eq!(plain.source.source, *src, "{what}");
                        continue;
                    }
                    assert!(!plain.source.source.contains("cp.async"), "{what}");
                    assert_eq!(src.matches("bs_copy_async(dst, in0 + row + col)").count(), 1, "{what}\n{src}");
                    assert_eq!(src.matches("    bs_copies_done();").count(), 1, "{what}\n{src}");
                    assert!(src.contains("cp.async.cg.shared.global [%0]"), "{what}\n{src}");
                    assert!(!src.contains("cache_hint") && !src.contains("createpolicy"), "{what}\n{src}");
                    crate::executors::cuda::compiles_with_nvrtc(src);
                    // Hinted (an L2 of unknown size): `layer_norm` reads through registers with
                    // the hint's loads, no copies; `softmax`, which reads nothing again, copies
                    // all the same, without the hint.
                    let hinted = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, with, 0);
                    let unhinted = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, without, 0);
                    let hinted = &hinted.source.source;
                    if layer_norm {
                        assert_eq!(*hinted, unhinted.source.source, "{what}");
                        assert!(hinted.contains("__ldcs("), "{what}");
                    } else {
                        assert!(hinted.contains("bs_copy_async(dst, in0 + row + col)"), "{what}\n{hinted}");
                        assert!(!hinted.contains("cache_hint") && !hinted.contains("createpolicy"), "{what}");
                        crate::executors::cuda::compiles_with_nvrtc(hinted);
                    }
                }
            }
        }
    }

    /// With `overlapped_first_pass`, each copy of a row's accesses to shared memory is a group of
    /// its own, and the first pass waits for each access's group in turn (`cp.async.wait_group`
    /// counting down from the accesses after it to 0), not for all of them at once; the other
    /// passes are as before. Kernels that copy nothing are the same source with the variant or
    /// without it. Each overlapped kernel compiles.
    #[test]
    fn overlapped_first_pass_takes_each_access_as_its_copy_lands() {
        // (Rows too long for a block streamed, not kept by a cluster: `clustered_rows`' test.)
        let with = KernelVariants { clustered_rows: false, ..KernelVariants::default() };
        let without = KernelVariants { overlapped_first_pass: false, ..with };
        let kept = 1 << 40;
        for layer_norm in [false, true] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for shape in [[333, 50257], [256, 65536], [9, 16384], [4096, 1024], [8, 200003]] {
                    let plain = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, without, kept);
                    let overlapped = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, with, kept);
                    let (src, what) = (&overlapped.source.source, format!("{layer_norm} {dtype} {shape:?}"));
                    if !plain.source.source.contains("bs_copy_async(dst") {
                        assert_eq!(plain.source.source, *src, "{what}");
                        continue;
                    }
                    let layout = overlapped.layout;
                    let in_shared = layout.per_thread.unwrap() - layout.in_registers;
                    assert!(in_shared > 1, "{what}");
                    assert_eq!(src.matches("      bs_copies_commit();").count(), 1, "{what}\n{src}");
                    assert!(!src.contains("    bs_copies_done();"), "{what}\n{src}");
                    for after in 0..in_shared {
                        let wait = format!("bs_copies_wait<{after}>();");
                        assert_eq!(src.matches(&wait).count(), 1, "{what}: {wait}\n{src}");
                    }
                    assert!(!src.contains(&format!("bs_copies_wait<{in_shared}>")), "{what}\n{src}");
                    // The first pass's accesses in shared memory, each after its wait; the later
                    // passes' loops as before.
                    let passes = |s: &str| s.matches("for (int j = ").count();
                    assert_eq!(passes(src) + 1, passes(&plain.source.source), "{what}\n{src}");
                    crate::executors::cuda::compiles_with_nvrtc(src);
                }
            }
        }
    }

    /// With `split_row_fills`, a row kernel that loads the part of its row kept in shared memory
    /// through registers (hinted `layer_norm` rows) loads the whole accesses in one loop with no
    /// other branch, then fills the partial ones in a second loop; the passes are as before. Rows
    /// copied asynchronously, and rows held in registers alone, are the same source with it or
    /// without it. Each split kernel compiles.
    #[test]
    fn split_row_fills_load_whole_accesses_before_the_partial_ones() {
        let with = KernelVariants::default();
        let without = KernelVariants { split_row_fills: false, ..with };
        for layer_norm in [false, true] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for shape in [[333, 50257], [256, 65536], [4096, 1024], [1335, 50257]] {
                    // An L2 of unknown size: the streaming hints on every row.
                    let plain = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, without, 0);
                    let split = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, with, 0);
                    let (src, old) = (&split.source.source, &plain.source.source);
                    let what = format!("{layer_norm} {dtype} {shape:?}");
                    if plain.layout.shared_bytes() == 0 || old.contains("bs_copy_async(dst") {
                        assert_eq!(old, src, "{what}");
                        continue;
                    }
                    assert!(layer_norm, "{what}: softmax copies its rows");
                    let (loops, old_loops) =
                        (src.matches("for (int j = ").count(), old.matches("for (int j = ").count());
                    assert_eq!(loops, old_loops + 1, "{what}\n{src}");
                    assert_eq!(src.matches("if (!(valid && ").count(), 1, "{what}\n{src}");
                    assert!(!old.contains("if (!(valid && "), "{what}");
                    // The whole loads stand alone: no `else` follows the fill of the shared part.
                    let fills = src.split("if (!(valid && ").next().unwrap();
                    let shared_fill = fills.rsplit("for (int j = ").nth(1).unwrap();
                    assert!(shared_fill.contains("__ldcs(") && !shared_fill.contains("else"), "{what}\n{shared_fill}");
                    crate::executors::cuda::compiles_with_nvrtc(src);
                }
            }
        }
    }

    /// With `two_register_blocks`, a 16-bit `layer_norm` row that 1,024 threads would hold in
    /// registers alone is held by a block of 512 (its first access a thread in registers, the
    /// rest in shared memory as read), two blocks an SM; f32 rows, `softmax`, rows held by fewer
    /// threads, rows whose weight and bias are wider than they are (accesses of 4 values), and
    /// rows on a GPU whose SM holds one such block only (100 KB, as sm_86 to sm_89) keep their
    /// kernels. Each compiles.
    #[test]
    fn two_register_blocks_hold_16_bit_rows_by_two_blocks_of_512() {
        let with = KernelVariants::default();
        let without = KernelVariants { two_register_blocks: false, ..with };
        for layer_norm in [false, true] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for shape in [[4096, 20001], [8192, 16385], [2048, 32768], [4096, 16384], [1365, 32767]] {
                    let what = format!("{layer_norm} {dtype} {shape:?}");
                    let plain = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, without);
                    let kernel = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, with);
                    let held = plain.layout.in_registers_alone() && plain.layout.block == 1024;
                    if !(layer_norm && dtype != DType::F32 && held) {
                        assert_eq!(plain.source.source, kernel.source.source, "{what}");
                        continue;
                    }
                    let layout = kernel.layout;
                    assert_eq!((layout.block, layout.threads_per_row, layout.in_registers), (512, 512, 1), "{what}");
                    assert_eq!(layout.shared_value_bytes, 2, "{what}");
                    assert!(layout.shared_bytes() > 0 && layout.shared_bytes() <= 56 * 1024, "{what}: {layout:?}");
                    let s = &kernel.source.source;
                    assert!(s.contains("__launch_bounds__(512, 2)"), "{what}\n{s}");
                    crate::executors::cuda::compiles_with_nvrtc(s);
                    // An SM of 100 KB (99 KB a block, as sm_86 to sm_89) holds two such blocks
                    // of up to about 48 KB: longer rows keep their registers there.
                    let small = RowTarget { shared_limit: 99 * 1024 - 1024, sm_shared: 100 * 1024, ..HOPPER };
                    let (there, unheld) = (
                        layer_norm_with(dtype, dtype, shape, 2, small, with),
                        layer_norm_with(dtype, dtype, shape, 2, small, without),
                    );
                    let fits = fit_an_sm(2, layout.shared_bytes(), 100 * 1024);
                    // (Rows of 20,001: 32 KB a block, two fit; of 32,768: 56 KB, one.)
                    assert_eq!(fits, shape[1] < 30000, "{what}");
                    if fits {
                        assert_eq!(there.layout, layout, "{what}");
                    } else {
                        assert!(there.layout.in_registers_alone() && there.layout.block == 1024, "{what}");
                        assert_eq!(there.source.source, unheld.source.source, "{what}");
                    }
                    // A bf16 row with an f32 weight and bias: accesses of 4 values, kept as before.
                    let hopper = RowTarget { shared_limit: HOPPER_BLOCK, ..HOPPER };
                    let mixed = |variants| layer_norm_with(dtype, DType::F32, shape, 2, hopper, variants).source.source;
                    assert_eq!(mixed(with), mixed(without), "{what}");
                }
            }
        }
    }

    /// With `split_rows`, a streamed row (too long to keep on chip) is split over a
    /// thread-block cluster where rows are fewer than SMs: the fewest blocks, up to 8, that
    /// give each SM one (16 rows of 2^20 values: 8, 128 blocks on 132 SMs), and the passes over
    /// it alternate in direction. Every other kernel is the one without the variant: rows kept
    /// on chip, streamed rows as many as SMs or more, and any row on a GPU without clusters or
    /// of an unknown SM count. Each split kernel compiles for Hopper.
    #[test]
    fn split_rows_split_few_streamed_rows_over_clusters() {
        // (Rows too long for a block streamed, not kept by a cluster: `clustered_rows`' test;
        // `layer_norm`'s two passes before the one that writes, not one: `one_pass_moments`'.)
        let split = KernelVariants { clustered_rows: false, one_pass_moments: false, ..KernelVariants::default() };
        let unsplit = KernelVariants { split_rows: false, ..split };
        for layer_norm in [false, true] {
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                for (shape, streamed_cluster) in [
                    ([16, 1 << 20], 8),
                    ([1, 1 << 20], 8),
                    ([64, 1 << 20], 4),
                    ([9, 200003], 8),
                    ([132, 1 << 20], 1),
                    ([256, 65536], 1),
                    ([333, 50257], 1),
                    ([4096, 1024], 1),
                ] {
                    let what = format!("{layer_norm} {dtype} {shape:?}");
                    let plain = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, unsplit);
                    let kernel = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, split);
                    let (s, old) = (&kernel.source.source, &plain.source.source);
                    assert!(!old.contains("round") && !old.contains("cluster"), "{what}");
                    // Kept on chip, or as many rows as SMs: the same kernel.
                    let cluster = if plain.layout.per_thread.is_some() { 1 } else { streamed_cluster };
                    if cluster == 1 {
                        assert_eq!((s, kernel.blocks, kernel.source.cluster), (old, plain.blocks, 1), "{what}");
                        continue;
                    }
                    assert_eq!(kernel.layout, plain.layout, "{what}");
                    // The pass after a forward one runs back: one per kernel.
                    assert_eq!(s.matches("--round").count(), 1, "{what}\n{s}");
                    assert!(s.contains(&format!("__cluster_dims__({cluster}, 1, 1)")), "{what}\n{s}");
                    assert_eq!(
                        (kernel.blocks as usize, kernel.source.cluster),
                        (shape[0] * cluster, cluster),
                        "{what}"
                    );
                    // Each reduction is combined across the cluster, between two barriers:
                    // `softmax`'s one (maximum and sum at once), `layer_norm`'s two.
                    let reductions = if layer_norm { 2 } else { 1 };
                    assert_eq!(s.matches("bs_cluster_sync();").count(), 2 * reductions, "{what}\n{s}");
                    crate::executors::cuda::compiles_as_clusters(s, &what);
                }
            }
        }
        // A GPU without clusters, or of an unknown SM count: not split.
        let without_clusters = RegionTarget { clusters: false, ..HOPPER.region };
        let unknown_sms = RegionTarget { sms: 0, ..HOPPER.region };
        for target in [RowTarget { region: without_clusters, ..HOPPER }, RowTarget { region: unknown_sms, ..HOPPER }] {
            let softmax = |b: &mut TraceBuilder<'_>| {
                let x = b.input_with(&crate::core::ir::TensorMeta::new(DType::F32, &[16, 1 << 20])).unwrap();
                b.softmax(x).unwrap()
            };
            let kernel = source_targeting(softmax, target, split).unwrap();
            let plain = source_targeting(softmax, target, unsplit).unwrap();
            assert_eq!((kernel.source.source, kernel.blocks), (plain.source.source, 16));
        }
    }

    /// `KernelVariants::clustered_rows` keeps a `layer_norm` or f32 `softmax` row (and, with
    /// `long_rows_as_read`, a 16-bit `softmax` row, in up to 3 blocks) too long for one block on
    /// a thread-block cluster: the fewest blocks whose slices fit (at least as many
    /// as give each SM one, where rows are fewer), each slice the row's accesses over the
    /// blocks, the last one shorter, so that the slices cover the row once, and every column
    /// the kernel takes in its block's slice; both reductions combined across the cluster. Rows
    /// a block keeps, rows too long for 8 blocks (3 for 16-bit `softmax`) and rows fewer than
    /// two fifths of the SMs (where the streamed row is split over clusters) get the kernels
    /// without the variant. Each clustered kernel compiles for Hopper.
    #[test]
    fn clustered_rows_keep_rows_too_long_for_a_block_on_a_cluster() {
        let with = KernelVariants::default();
        let without = KernelVariants { clustered_rows: false, ..with };
        for (layer_norm, dtype, shape, cluster) in [
            (true, DType::F32, [700, 65537], 2),
            (true, DType::F32, [66, 200003], 4),
            (true, DType::F32, [53, 200003], 4),
            // The GPU row tests' clustered shape, in every op and dtype.
            (true, DType::F32, [66, 131073], 3),
            (false, DType::F32, [66, 131073], 2),
            (true, DType::F16, [66, 131073], 2),
            (false, DType::BF16, [66, 131073], 2),
            (true, DType::BF16, [500, 150001], 2),
            (true, DType::F16, [64, 262144], 3),
            (false, DType::F32, [300, 131072], 2),
            (false, DType::F32, [1000, 100003], 2),
            // 16-bit `softmax` rows kept as read (`long_rows_as_read`): by a cluster of up to 3,
            // by a block (with or without clusters), or streamed past 3 blocks.
            (false, DType::BF16, [300, 131072], 2),
            (false, DType::F16, [64, 200003], 3),
            (false, DType::BF16, [66, 300007], 3),
            // Rows fewer than two fifths of the SMs (53 of 132 here): streamed.
            (true, DType::F32, [32, 200003], 1),
            (true, DType::F32, [52, 200003], 1),
            (false, DType::F32, [40, 262144], 1),
            (false, DType::BF16, [40, 300007], 1),
            // Clusters that leave most of their second wave's SMs idle (`CLUSTER_WAVE_FILL`):
            // 56 and 54 rows by clusters of 3, 168 and 162 blocks on 132 SMs; streamed.
            (true, DType::F32, [56, 131072], 1),
            (false, DType::F32, [56, 131072], 1),
            (false, DType::BF16, [56, 262144], 1),
            (true, DType::F16, [54, 131073], 1),
            (false, DType::BF16, [60, 300007], 1),
            (true, DType::BF16, [16, 524288], 1),
            (false, DType::BF16, [32, 300007], 1),
            (false, DType::BF16, [300, 400003], 1),
            (false, DType::BF16, [1000, 100003], 1),
            (false, DType::F16, [16, 524288], 1),
            (true, DType::F32, [700, 65536], 1),
            (false, DType::F16, [4096, 16384], 1),
            (true, DType::F32, [16, 1 << 20], 1),
        ] {
            let what = format!("{layer_norm} {dtype} {shape:?}");
            let plain = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, without);
            let kernel = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, with);
            let s = &kernel.source.source;
            if cluster == 1 {
                assert_eq!((s, kernel.blocks), (&plain.source.source, plain.blocks), "{what}");
                continue;
            }
            assert!(plain.layout.per_thread.is_none(), "{what}: streamed without the variant");
            let l = kernel.layout;
            assert_eq!((kernel.source.cluster, kernel.blocks as usize), (cluster, shape[0] * cluster), "{what}");
            assert!(s.contains(&format!("__cluster_dims__({cluster}, 1, 1)")), "{what}");
            assert!(l.per_thread.is_some() && l.shared_bytes() > 0 && l.shared_bytes() <= HOPPER_BLOCK, "{what}");
            // The slices: as many accesses each, the block's threads enough for one.
            let accesses = RowLayout::accesses(shape[1], l.vector, l.aligned);
            let per_slice = accesses.div_ceil(cluster);
            assert!(l.per_thread.unwrap() * l.threads_per_row >= per_slice, "{what}");
            assert!(s.contains(&format!("slice * {}", per_slice * l.vector)), "{what}\n{s}");
            assert!(s.contains(&format!("< {per_slice}")), "{what}\n{s}");
            // Every column the kernel takes (fills, passes, weight and bias, results) is in the
            // block's slice.
            let columns = s.matches(" col = ").count();
            assert!(columns > 0 && columns == s.matches("+ slice_col :").count(), "{what}\n{s}");
            // The fewest blocks: one fewer would not fit (unless there were too few for the SMs).
            let values = if layer_norm || l.shared_value_bytes == 2 { REGISTER_VALUES / 4 } else { REGISTER_VALUES };
            let fewer = RowLayout::kept_by_cluster(
                shape[1],
                dtype.size_bytes(),
                values,
                HOPPER_BLOCK,
                l.shared_value_bytes,
                cluster - 1,
            );
            assert!(fewer.is_none() || shape[0] * (cluster - 1) < 132, "{what}");
            // Each reduction combined across the cluster between two barriers (`softmax` kept on chip
            // takes two too: its maximum, then its sum).
            assert_eq!(s.matches("bs_cluster_sync();").count(), 4, "{what}\n{s}");
            crate::executors::cuda::compiles_as_clusters(s, &what);
        }
        // Few rows are streamed, split over clusters of 8 (`split_rows`); where the streamed row
        // would not be split (the SM count unknown, or `split_rows` off), they are kept by
        // clusters still: the fewest blocks that fit where the SMs are unknown, enough for a
        // block an SM on 132.
        let hopper = RowTarget { shared_limit: HOPPER_BLOCK, ..HOPPER };
        let unknown_sms = RowTarget { region: RegionTarget { sms: 0, ..HOPPER.region }, ..hopper };
        let unsplit = KernelVariants { split_rows: false, ..with };
        for (target, variants, kept, cluster) in
            [(hopper, with, false, 8), (unknown_sms, with, true, 4), (hopper, unsplit, true, 8)]
        {
            let kernel = layer_norm_with(DType::F32, DType::F32, [16, 200003], 2, target, variants);
            assert_eq!(
                (kernel.layout.per_thread.is_some(), kernel.source.cluster),
                (kept, cluster),
                "{variants:?}, {} SMs",
                target.region.sms
            );
        }
    }

    /// `KernelVariants::one_pass_moments`: a streamed `layer_norm` row (too long for a block or
    /// a cluster to keep on chip, or any row too long for a block where clusters are off) takes
    /// its sum and each thread's squared deviations in one pass (Chan's update an access at a
    /// time, then the deviations of each thread's mean from the row's), then the pass that
    /// writes: two passes over the row where there were three. A row split over a cluster goes
    /// back over it in the pass that writes (its last values still in L2). Rows kept on chip get
    /// the kernels without the variant. Each kernel compiles.
    #[test]
    fn one_pass_moments_read_a_streamed_row_twice() {
        let with = KernelVariants { one_pass_moments: true, ..KernelVariants::default() };
        let without = KernelVariants { one_pass_moments: false, ..with };
        let unclustered = KernelVariants { clustered_rows: false, ..with };
        for (dtype, shape, variants, split) in [
            (DType::F32, [16, 1 << 20], with, true),
            (DType::BF16, [7, 1048577], with, true),
            (DType::F16, [200, 2000003], with, false),
            (DType::F32, [700, 65537], unclustered, false),
            (DType::BF16, [333, 150001], unclustered, false),
        ] {
            let what = format!("{dtype} {shape:?}");
            let kernel = row_op_with(true, dtype, shape, HOPPER_BLOCK, variants);
            let plain =
                row_op_with(true, dtype, shape, HOPPER_BLOCK, KernelVariants { one_pass_moments: false, ..variants });
            let (s, p) = (&kernel.source.source, &plain.source.source);
            assert!(kernel.layout.per_thread.is_none(), "{what}: streamed");
            assert_eq!((kernel.source.cluster > 1, kernel.blocks), (split, plain.blocks), "{what}");
            // Passes over the row before the one that writes (written once, or once for each
            // shift of the row's accesses): one, where there were two.
            let before = |s: &str| s[..s.find("const float variance").unwrap()].matches("float xs[").count();
            assert_eq!((before(s), before(p)), (1, 2), "{what}\n{s}");
            assert!(
                s.contains("mean_t = mean_t + delta * w;") && s.contains("acc = m2_t + n_t * d * d;"),
                "{what}\n{s}"
            );
            assert!(!p.contains("m2_t"), "{what}");
            // Split: the pass that writes goes back over the row, after the variance.
            let back = s.find("--round)");
            assert_eq!(back.is_some(), split, "{what}\n{s}");
            assert!(back.is_none_or(|b| b > s.find("const float variance").unwrap()), "{what}\n{s}");
            if split {
                crate::executors::cuda::compiles_as_clusters(s, &what);
            } else {
                super::super::compiles_with_nvrtc(s);
            }
        }
        // Rows kept on chip: by registers, shared memory, two blocks an SM, or a cluster.
        for (dtype, shape) in [(DType::F32, [4096, 1024]), (DType::BF16, [333, 50257]), (DType::F32, [700, 65537])] {
            let kernel = row_op_with(true, dtype, shape, HOPPER_BLOCK, with);
            let plain = row_op_with(true, dtype, shape, HOPPER_BLOCK, without);
            assert!(kernel.layout.per_thread.is_some(), "{dtype} {shape:?}");
            assert_eq!(kernel.source.source, plain.source.source, "{dtype} {shape:?}");
        }
    }

    /// `KernelVariants::long_rows_as_read` keeps a 16-bit `softmax` row too long to keep as
    /// `float`s as read, two bytes a value, each exponential taken twice: by a block up to
    /// 122,880 values, past that by a cluster of up to 3 blocks; rows too long for 3, or fewer
    /// than two fifths of the SMs, are streamed by the kernels without the variant, and so are
    /// rows kept as `float`s, f32 rows and `layer_norm` rows. Each kept kernel compiles.
    #[test]
    fn long_rows_as_read_keep_long_16_bit_softmax_rows_on_chip() {
        let with = KernelVariants::default();
        let without = KernelVariants { long_rows_as_read: false, ..with };
        for (dtype, shape, cluster) in [
            (DType::BF16, [300, 100003], 1),
            (DType::F16, [100, 122880], 1),
            (DType::BF16, [300, 131072], 2),
            (DType::F16, [64, 200003], 3),
            (DType::BF16, [66, 300007], 3),
        ] {
            let what = format!("{dtype} {shape:?}");
            let kernel = row_op_with(false, dtype, shape, HOPPER_BLOCK, with);
            let plain = row_op_with(false, dtype, shape, HOPPER_BLOCK, without);
            let (l, s) = (kernel.layout, &kernel.source.source);
            assert!(plain.layout.per_thread.is_none(), "{what}: streamed without the variant");
            assert!(l.per_thread.is_some() && l.shared_value_bytes == 2 && l.in_registers == 1, "{what}: {l:?}");
            assert_eq!(kernel.source.cluster, cluster, "{what}");
            assert!(s.contains("cache[]") && s.contains("acc = acc + bs_exp(x[e] - m);"), "{what}\n{s}");
            if cluster > 1 {
                crate::executors::cuda::compiles_as_clusters(s, &what);
            } else {
                super::super::compiles_with_nvrtc(s);
            }
        }
        for (layer_norm, dtype, shape) in [
            (false, DType::BF16, [16, 524288]),
            // Rows fewer than two fifths of the SMs: streamed (`CLUSTERED_ROWS_SM_SHARE`).
            (false, DType::BF16, [32, 300007]),
            (false, DType::BF16, [52, 300007]),
            (false, DType::F16, [300, 400003]),
            (false, DType::F16, [4, 1 << 20]),
            (false, DType::BF16, [333, 50257]),
            (false, DType::F32, [300, 131072]),
            (true, DType::BF16, [300, 131072]),
        ] {
            let kernel = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, with);
            let plain = row_op_with(layer_norm, dtype, shape, HOPPER_BLOCK, without);
            assert_eq!(
                (kernel.source.source, kernel.blocks),
                (plain.source.source, plain.blocks),
                "{layer_norm} {dtype} {shape:?}"
            );
        }
    }

    /// The longest rows a block keeps on chip on Hopper (227 KB of shared memory a block), per
    /// op and dtype, as `KernelVariants::split_rows`' and `clustered_rows`' docs, the README
    /// and the CHANGELOG give them: past these, rows are kept by a cluster
    /// (`clustered_rows`), else streamed (and, fewer than SMs, split over clusters).
    #[test]
    fn rows_are_streamed_past_the_lengths_the_docs_give() {
        for (layer_norm, dtype, longest) in [
            (true, DType::F32, 65536),
            (false, DType::F32, 90112),
            (false, DType::BF16, 122880),
            (false, DType::F16, 122880),
            (true, DType::BF16, 122880),
            (true, DType::F16, 122880),
        ] {
            let kept = |cols| {
                let one_block = KernelVariants { clustered_rows: false, ..KernelVariants::default() };
                let kernel = row_op_with(layer_norm, dtype, [4, cols], HOPPER_BLOCK, one_block);
                kernel.layout.per_thread.is_some()
            };
            assert!(kept(longest), "{layer_norm} {dtype} {longest}");
            assert!(!kept(longest + 1), "{layer_norm} {dtype} {}", longest + 1);
        }
    }

    /// A developer's tool, not a check (`scripts/kernel-sass` runs it): writes the row kernel
    /// that `BOUNDSCOPE_ROW_KERNEL` names, `OP DTYPE ROWSxCOLS [VARIANT,...]` (`softmax` or
    /// `layer_norm`; each variant named flipped from the defaults, as `gpu_sweep --variants`
    /// names them), generated for an H100 or H200, into the folder `BOUNDSCOPE_ROW_KERNEL_OUT`:
    /// its source (`kernel.cu`), its launch (`launch.txt`) and NVRTC's PTX for `compute_90`
    /// (`kernel.ptx`), for `ptxas` and `nvdisasm` to read without a GPU.
    #[test]
    #[ignore = "a developer's tool: scripts/kernel-sass runs it"]
    fn write_row_kernel() {
        let spec =
            std::env::var("BOUNDSCOPE_ROW_KERNEL").expect("BOUNDSCOPE_ROW_KERNEL: OP DTYPE ROWSxCOLS [VARIANTS]");
        let out =
            std::path::PathBuf::from(std::env::var("BOUNDSCOPE_ROW_KERNEL_OUT").expect("BOUNDSCOPE_ROW_KERNEL_OUT"));
        let words: Vec<&str> = spec.split_whitespace().collect();
        let [op, dtype, shape, rest @ ..] = words.as_slice() else { panic!("`{spec}`: OP DTYPE ROWSxCOLS [VARIANTS]") };
        let layer_norm = match *op {
            "softmax" => false,
            "layer_norm" => true,
            other => panic!("`{other}`: softmax or layer_norm"),
        };
        let dtype: DType = dtype.parse().unwrap_or_else(|e| panic!("{e}"));
        let (rows, cols) = shape.split_once('x').expect("ROWSxCOLS");
        let shape = [rows.parse().expect("rows"), cols.parse().expect("columns")];
        let mut variants = KernelVariants::default();
        for name in rest.iter().flat_map(|r| r.split(',')) {
            variants = variants.flipped(name).unwrap_or_else(|| panic!("`{name}` is none of KernelVariants::EACH"));
        }
        let kernel = row_op_for(layer_norm, dtype, shape, HOPPER_BLOCK, variants, 50 << 20);
        let ptx = crate::executors::cuda::nvrtc_ptx(&kernel.source.source, Some("compute_90"))
            .expect("NVRTC loads")
            .unwrap_or_else(|e| panic!("NVRTC: {e}"));
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("kernel.cu"), &kernel.source.source).unwrap();
        std::fs::write(out.join("kernel.ptx"), ptx).unwrap();
        let launch = format!(
            "{spec}\nvariants: {variants:?}\nblocks: {} (clusters of {})\nlayout: {:?}\nshared bytes a block: {}\n",
            kernel.blocks, kernel.source.cluster, kernel.layout, kernel.shared_bytes
        );
        std::fs::write(out.join("launch.txt"), launch).unwrap();
    }
}
