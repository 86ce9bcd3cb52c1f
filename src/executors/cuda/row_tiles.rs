//! Short rows of odd lengths read and written as tiles ([`KernelVariants::tiled_rows`]): a
//! block copies a run of whole rows, contiguous in memory, into shared memory with 16-byte
//! accesses aligned to the tensor, runs each row from there, and writes the run back the same
//! way.
//!
//! A row kernel that reads its rows in place ([`row_kernels`](super::row_kernels)) reads a row
//! whose length 16 bytes do not divide with accesses aligned to the tensor, and makes the two
//! accesses it shares with the rows beside it a value at a time. Over short rows those are most
//! of its accesses (a bf16 row of 33 values takes five accesses, two of them shared; one of 9
//! takes two, both shared), and a row's threads are a power of two, 8 for 5 accesses: on an
//! H100, `softmax` over bf16 [131072, 33] ran at 37% of a copy's speed and [262144, 9] at 43%.
//! A tile holds 16 to 4,096 rows (a multiple of 16), so it starts on a multiple of 16 values:
//! every access of its run is whole (but the tensor's last, where 16 bytes do not divide the
//! tensor), from every thread of the block, whatever the row's length; the rows' values move
//! between shared memory and registers a value at a time, where accesses need no alignment.
//!
//! Rows of 17 values or more (two threads a row or more) are read as pipelined tiles
//! ([`KernelVariants::pipelined_tiles`]): a grid of up to 4 blocks an SM, each looping over
//! every `gridDim.x`-th tile, copies its next tile into a second input tile with `cp.async`
//! while it runs the one it holds, where a block of the plain tiles loads its one tile, waits,
//! then runs it. Plain tiles keep a block's loads in flight only while it loads; over rows of 17
//! to 255 values pipelining ran up to 1.53x faster (see [`PIPELINED_F32_ROW_BYTES`]), over rows
//! of a thread's own (up to 16 values) it did not.

use std::fmt::Write as _;

use super::codegen::{element_type, literal, maximum, narrow, widen, RegionSource};
use super::row_kernels::{
    row_reduce, store, Caching, RowLayout, RowOp, RowSource, RowTarget, COPY_ASYNC, CUDA_BLOCK_SHARED_BYTES,
};
use super::KernelVariants;
use crate::core::ir::{prims, DType, SymbolId};
use crate::core::plan::{packing, OpView};

/// Threads of a tiled row kernel's block.
const TILE_THREADS: usize = 256;

/// Values of a row a thread keeps in registers, at most.
const TILE_VALUES: usize = 16;

/// Rows of up to this many bytes (in their input's dtype) are read as tiles: f32 rows of up to
/// 32 values, 16-bit ones of up to 64. Measured on an H100 (2026-12-06, `gpu_sweep f32,bf16,f16
/// softmax,layer_norm --variant=tiled_rows`, tiles against rows read in place on the same
/// inputs): rows of 3 to 9 values 1.23x to 3.97x in every dtype, 16-bit rows of 33 1.05x to
/// 1.49x; longer f32 rows 0.74x to 1.12x (0.92-1.12x over 33 values, 0.74-0.85x over 65 to
/// 255) and 16-bit `layer_norm` rows of 65 to 255 values 0.78x to 1.22x, which kept their
/// kernels. (Since, rows of 17 values or more are read as pipelined tiles by default, see
/// [`PIPELINED_F32_ROW_BYTES`]: this gate is for rows of up to 16 values, and for every row
/// without [`KernelVariants::pipelined_tiles`].)
const TILE_ROW_BYTES: usize = 128;

/// 16-bit `softmax` rows of up to this many values are read as tiles whatever their bytes:
/// 1.03x to 1.34x over rows of 65 to 255 values on the same H100 (a row takes up to 16
/// threads).
const TILE_MAX_COLS: usize = 256;

/// Rows of more than [`TILE_VALUES`] values (two threads or more a row), up to [`TILE_MAX_COLS`]
/// in 16 bits and up to this many bytes in f32, are read as pipelined tiles
/// ([`KernelVariants::pipelined_tiles`]). Measured on an H100 (2026-12-06, `gpu_sweep
/// f32,bf16,f16 softmax,layer_norm --variant=pipelined_tiles`, pipelined tiles everywhere up to
/// 256 values against the kernels before them on the same inputs): 16-bit rows of 33 to 255
/// values 1.03x to 1.53x (but `softmax` over [131072, 33], 0.96-0.97x), f32 rows of 33 1.05x to
/// 1.36x; f32 rows of 65 0.98x to 1.06x, of 100 to 255 0.91x to 1.00x (read in place, as
/// before); rows of 3 to 9 values, one thread a row, 0.88x to 1.43x (16-bit rows of 3 and 5 0.88x
/// to 0.98x), which keep the tiles of [`KernelVariants::tiled_rows`].
const PIPELINED_F32_ROW_BYTES: usize = 256;

/// A plain tile of rows of up to 10 bytes holds about this many bytes of input
/// ([`KernelVariants::wide_tiles`]): each thread runs `WIDE_TILE_BYTES / (256 * bytes of a row)`
/// rows in turn where that is at least [`WIDE_TILE_MIN_PASSES`], else one (16-bit rows of 3 values:
/// 5 a thread, tiles of 1,280 rows; f32 rows of 1 value: 8 a thread). Measured on the H200
/// (2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm
/// 2097152x3,1048576x5,4194304x9,262144x9,1048576x15`, two rounds, against tiles of a row a
/// thread). 8 KB: 16-bit rows of 3 1.35x to 1.40x, of 5 1.05x to 1.12x; rows of 9 and 15 one a
/// thread as before (two a thread would pass 8 KB). Tiles of 4 KB gained less (1.29x to 1.32x over
/// rows of 3); of 16 KB, 0.90x to 1.23x (16-bit `layer_norm` over [4194304, 9] 1.23x, `softmax`
/// 0.94x to 0.95x). f32 rows of 3 ran 0.90x (`softmax`) and 1.07x (`layer_norm`) with 8 KB (two a
/// thread), so they keep a row a thread. f32 rows of 1 and 2 (8 and 4 a thread), on an H100
/// (2026-12-07, `gpu_sweep f32 softmax,layer_norm
/// 8388608x1,4194304x2,16777216x1,2097152x2,1048577x1,524287x2`, two rounds, an experiment build
/// whose kernels are these): rows of 1 1.19x to 1.49x (`softmax` [8388608, 1] 1666 -> 2148
/// GB/s), rows of 2 0.98x to 1.19x.
const WIDE_TILE_BYTES: usize = 8192;

/// The fewest rows a thread that a wide tile runs: rows of which [`WIDE_TILE_BYTES`] hold fewer
/// a thread keep a row a thread. Two a thread (16-bit rows of 6 and 7 values) lost on an H100
/// (2026-12-07, `gpu_sweep bf16,f16 softmax,layer_norm 1048576x7 --variant=wide_tiles`):
/// `softmax` 0.85x to 0.94x, `layer_norm` 0.97x to 0.98x; three a thread (16-bit rows of 5) ran
/// 0.90x to 1.04x there and 1.05x to 1.12x on the H200; five or more (16-bit rows of 1 to 3)
/// 1.04x to 1.77x on the H100. 16-bit rows of 4 (four a thread) were not timed; f32 rows of 2
/// (four a thread) ran 0.98x to 1.19x, of 1 (eight) 1.19x to 1.49x (see [`WIDE_TILE_BYTES`]).
const WIDE_TILE_MIN_PASSES: usize = 3;

/// A pipelined tile holds about this many bytes of input with
/// [`KernelVariants::pipelined_passes`]: each thread runs `PIPELINED_TILE_BYTES / (bytes of the
/// rows a pass holds)` rows in turn where that is at least two, else one (16-bit rows of 100
/// values: two a thread, tiles of 64 rows, 12,800 bytes; of 33 values: three, 192 rows, 12,672
/// bytes), as long as the block's two input tiles and its results tile fit in
/// [`PIPELINED_SHARED_BYTES`].
const PIPELINED_TILE_BYTES: usize = 16384;

/// The shared memory a block of pipelined tiles of several rows a thread takes, at most: what
/// every GPU since Volta gives a block (more takes an opt-in that some lack), and four blocks'
/// worth on Hopper. (A bf16 row written as f32, whose results tile takes twice its input's,
/// keeps fewer passes: rows of 100, one.)
const PIPELINED_SHARED_BYTES: usize = 48 * 1024;

/// Blocks an SM that plain tiles of 16-bit rows ask `ptxas` to fit with
/// [`KernelVariants::tile_occupancy`] (`__launch_bounds__(256, 8)`): 32 registers a thread. Their
/// tiles in and out (at most about 24 KB a block, a bf16 row written as f32) leave shared memory
/// for all eight; f32 tiles of rows of 14 and 15 values (about 30 KB) would not, and f32 rows were
/// not timed with these bounds, so they keep theirs.
const TILE_MIN_BLOCKS: usize = 8;

/// Blocks an SM of a pipelined tiled kernel, at most: each block loops over every `sms * 4`-th
/// tile. (Up to 8 timed the same, 0.93x to 1.57x against 0.95x to 1.52x over 24 cases.)
const PIPELINED_BLOCKS_PER_SM: usize = 4;

/// The C of a pipelined tile's copies, past `bs_copy_async` ([`COPY_ASYNC`]): `bs_commit()`
/// closes a tile's copies, `bs_wait_prior()` waits for all but the last tile's.
const PIPELINE: &str = r#"__device__ __forceinline__ void bs_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void bs_wait_prior() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}
"#;

/// Bytes of dynamic shared memory a block of pipelined tiles of `values` values takes: two input
/// tiles (the one run and the next, in flight) and the results', each holding 16 values past the
/// tile's (see `pad` in [`RowTiles::source`]).
fn pipelined_block_bytes(values: usize, input: DType, output: DType) -> usize {
    (values + 16) * (2 * input.size_bytes() + output.size_bytes())
}

/// How a tiled row kernel lays out its rows: `threads_per_row` threads a row, each keeping up to
/// [`TILE_VALUES`] of its values (`per_thread`) in runs of `vector` values that it moves
/// between shared memory and registers an access at a time ([`KernelVariants::vector_tile_values`];
/// 1 without it), and a tile of `rows_per_tile` rows a block (all [`TILE_THREADS`] threads of
/// it, each running `passes` rows in turn, [`KernelVariants::wide_tiles`]); `pipelined`, a few
/// blocks an SM, each copying its next tile while it runs one
/// ([`KernelVariants::pipelined_tiles`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RowTiles {
    pub rows: usize,
    pub cols: usize,
    pub threads_per_row: usize,
    pub per_thread: usize,
    pub vector: usize,
    pub rows_per_tile: usize,
    pub passes: usize,
    pub pipelined: bool,
}

impl RowTiles {
    /// The tiles for `softmax` or `layer_norm` (`id`) over `rows` rows of `cols` values, read as
    /// `input` and written as `output`, where `variants` take them: rows whose length in bytes
    /// 16 does not divide, in the input or in the output (rows that it divides are read whole by
    /// the kernels that read them in place, 16 bytes an access), and
    /// - with [`KernelVariants::pipelined_tiles`], pipelined, of more than [`TILE_VALUES`]
    ///   values, up to [`TILE_MAX_COLS`] in 16 bits and [`PIPELINED_F32_ROW_BYTES`] in f32;
    /// - otherwise, with [`KernelVariants::tiled_rows`], of up to [`TILE_ROW_BYTES`] (16-bit
    ///   `softmax` rows up to [`TILE_MAX_COLS`] values); with [`KernelVariants::wide_tiles`],
    ///   rows of up to 10 bytes (16-bit rows of up to 5 values, f32 rows of 1 or 2) in tiles of
    ///   about [`WIDE_TILE_BYTES`], several rows a thread.
    ///
    /// With [`KernelVariants::pipelined_passes`], pipelined tiles hold about
    /// [`PIPELINED_TILE_BYTES`], several rows a thread, where that is two or more. With
    /// [`KernelVariants::vector_tile_values`], a thread's values are runs of the most values, up
    /// to 8 bytes, that divide the row's length.
    pub fn for_rows(
        id: SymbolId,
        rows: usize,
        cols: usize,
        input: DType,
        output: DType,
        variants: KernelVariants,
    ) -> Option<Self> {
        let odd = [input, output].iter().any(|d| !(cols * d.size_bytes()).is_multiple_of(16));
        let packed = packing::is_packed(input);
        let pipelined = variants.pipelined_tiles
            && cols > TILE_VALUES
            && cols <= TILE_MAX_COLS
            && (packed || cols * input.size_bytes() <= PIPELINED_F32_ROW_BYTES);
        let plain = variants.tiled_rows
            && (cols * input.size_bytes() <= TILE_ROW_BYTES
                || (id == prims::SOFTMAX && packed && cols <= TILE_MAX_COLS));
        if rows == 0 || cols == 0 || !odd || !(pipelined || plain) {
            return None;
        }
        let threads_per_row = cols.div_ceil(TILE_VALUES).next_power_of_two();
        let once = TILE_THREADS / threads_per_row;
        let pass_bytes = once * cols * input.size_bytes();
        // The rows a thread runs, and the fewest worth a loop over them.
        let (passes, fewest) = if pipelined {
            let mut passes = if variants.pipelined_passes { PIPELINED_TILE_BYTES / pass_bytes } else { 1 };
            while passes > 1 && pipelined_block_bytes(once * passes * cols, input, output) > PIPELINED_SHARED_BYTES {
                passes -= 1;
            }
            (passes, 2)
        } else {
            let passes = if variants.wide_tiles { WIDE_TILE_BYTES / pass_bytes } else { 1 };
            (passes, WIDE_TILE_MIN_PASSES)
        };
        let passes = if passes >= fewest { passes } else { 1 };
        // Runs of `vector` values start at multiples of it in the tile: its rows start at
        // multiples of `cols`, and the tile at a multiple of 16 values (`pad` is 0).
        let widest = if variants.vector_tile_values { 8 / input.size_bytes() } else { 1 };
        let vector = (1..=widest).rev().find(|&w| w.is_power_of_two() && cols.is_multiple_of(w)).unwrap_or(1);
        let per_thread = (cols / vector).div_ceil(threads_per_row) * vector;
        let rows_per_tile = once * passes;
        Some(Self { rows, cols, threads_per_row, per_thread, vector, rows_per_tile, passes, pipelined })
    }

    /// Values a tile holds.
    pub fn tile_values(&self) -> usize {
        self.rows_per_tile * self.cols
    }

    /// Tiles over all the rows.
    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(self.rows_per_tile)
    }

    /// The C of the kernel `kernel` for `op` (`softmax` or `layer_norm`, as `row` reads it) over
    /// these tiles, and its launch: one block a tile, up to CUDA's grid limit (each block loops
    /// over further tiles past it); pipelined, up to [`PIPELINED_BLOCKS_PER_SM`] blocks an SM,
    /// as many as its shared memory holds, each over every `gridDim.x`-th tile.
    pub fn source(
        &self,
        row: RowOp,
        op: &OpView<'_>,
        kernel: &str,
        target: RowTarget,
        variants: KernelVariants,
    ) -> Result<RowSource, String> {
        let RowOp { id, rows, cols, dtypes, out_dtype, mut params, input_lengths } = row;
        let (g, k, r, w) = (self.threads_per_row, self.per_thread, self.rows_per_tile, self.vector);
        let (tile, numel) = (self.tile_values(), rows * cols);
        let (input, tensors) = (dtypes[0], dtypes.len());
        // 16 bytes an access, read and written.
        let (vi, vo) = (16 / input.size_bytes(), 16 / out_dtype.size_bytes());
        params.push(format!("{}* __restrict__ out0", element_type(out_dtype)));
        params.push("long long n".into());
        let caching = if variants.streaming_rows {
            let read = super::codegen::total_words(input_lengths.iter().copied());
            super::codegen::whole_tensors(variants, read, packing::words(out_dtype, numel), target.region.l2_bytes)
        } else {
            Caching::Kept
        };

        let pipelined = self.pipelined;
        let mut c = String::new();
        let _ = writeln!(c, "// Generated by boundscope for `{}` over rows of {cols}: {self:?}.", op.name());
        c.push_str(&RowOp::preamble(id, &dtypes, out_dtype, false, variants.fast_exp2));
        if pipelined {
            c.push_str(COPY_ASYNC);
            c.push_str(PIPELINE);
        }
        // A tile's values sit at `pad` past the start of its arrays, `pad` being its first
        // value's offset from a multiple of 8 values: an access aligned to the tensor (4 or 8
        // values) is then aligned in shared memory too, and the arrays hold the accesses a tile
        // would share with the tiles beside it. (The tiles `for_rows` makes start on a multiple
        // of 16 values, so `pad` is 0 and none is shared; the code keeps the general case, so
        // that other tile sizes stay correct.)
        let held = tile + 16;
        // Pipelined, two input tiles (the one run and the next, in flight) and the results, in
        // dynamic shared memory; a few blocks an SM (as many as its shared memory holds, with
        // `layer_norm`'s widened weight and bias and CUDA's reserve, up to
        // `PIPELINED_BLOCKS_PER_SM`), each over many tiles.
        let in_bytes = held * input.size_bytes();
        let shared_bytes = if pipelined { pipelined_block_bytes(tile, input, out_dtype) } else { 0 };
        let per_block = shared_bytes + (tensors - 1) * cols * 4 + CUDA_BLOCK_SHARED_BYTES;
        let per_sm = if target.sm_shared > 0 { target.sm_shared / per_block } else { PIPELINED_BLOCKS_PER_SM };
        let per_sm = per_sm.clamp(1, PIPELINED_BLOCKS_PER_SM);
        // Plain tiles of 16-bit rows may ask for `TILE_MIN_BLOCKS` blocks an SM
        // (`tile_occupancy`); pipelined tiles of several rows a thread (`pipelined_passes`) for
        // their grid's blocks an SM, which loop over the tiles: all of them resident at once,
        // no second wave.
        let bounds = if variants.tile_occupancy && !pipelined && packing::is_packed(input) {
            format!("{TILE_THREADS}, {TILE_MIN_BLOCKS}")
        } else if pipelined && self.passes > 1 {
            format!("{TILE_THREADS}, {per_sm}")
        } else {
            TILE_THREADS.to_string()
        };
        let _ =
            writeln!(c, "extern \"C\" __global__ void __launch_bounds__({bounds}) {kernel}({}) {{", params.join(", "));
        let (in_ty, out_ty) = (element_type(input), element_type(out_dtype));
        if pipelined {
            let _ = writeln!(c, "  extern __shared__ __align__(16) unsigned char bs_tiles[];");
            let _ = writeln!(c, "  {in_ty}* const tiles_in = reinterpret_cast<{in_ty}*>(bs_tiles);");
            let _ =
                writeln!(c, "  {out_ty}* const tile_out = reinterpret_cast<{out_ty}*>(bs_tiles + {});", 2 * in_bytes);
        } else {
            let _ = writeln!(c, "  __shared__ __align__(16) {in_ty} tile_in[{held}];");
            let _ = writeln!(c, "  __shared__ __align__(16) {out_ty} tile_out[{held}];");
        }
        // `layer_norm`'s weight and bias, widened once a block.
        for (k, &dtype) in dtypes.iter().enumerate().skip(1) {
            let _ = writeln!(c, "  __shared__ {}float operand{k}[{cols}];", if w > 1 { "__align__(16) " } else { "" });
            let _ = writeln!(
                c,
                "  for (int c = threadIdx.x; c < {cols}; c += {TILE_THREADS}) operand{k}[c] = {};",
                widen(dtype, &format!("in{k}[c]"))
            );
        }
        if tensors > 1 {
            c.push_str("  __syncthreads();\n");
        }
        let _ = writeln!(c, "  const int lane = threadIdx.x % {g};");
        if self.passes == 1 {
            let _ = writeln!(c, "  const int slot = threadIdx.x / {g};");
        }
        // The block's threads take a tile's accesses of `v` values in turn, from the one that
        // holds its first value (`at`, the access's first element; `i`, its place in the tile's
        // arrays).
        let accesses = |c: &mut String, v: usize| {
            let count = (tile + 2 * v).div_ceil(v).div_ceil(TILE_THREADS);
            let _ = writeln!(c, "    {{ const long long from = base - base % {v};");
            let _ = writeln!(c, "    #pragma unroll");
            let _ = writeln!(c, "    for (int u = 0; u < {count}; ++u) {{");
            let _ =
                writeln!(c, "      const long long at = from + (long long)(threadIdx.x + u * {TILE_THREADS}) * {v};");
            let _ = writeln!(c, "      const int i = (int)(at - base) + pad;");
        };
        // Tile `t`'s first and last values (`base`, `end`) and `pad`.
        let bounds = |c: &mut String, t: &str| {
            let _ = writeln!(c, "    const long long base = {t} * {tile}ll;");
            let _ = writeln!(c, "    const long long end = base + {tile}ll < {numel}ll ? base + {tile}ll : {numel}ll;");
            let _ = writeln!(c, "    const int pad = (int)(base % 8);");
        };
        // Tile `t`'s input into `dst`: whole accesses where they lie in the tensor (its last
        // may not), copied with `cp.async` where `pipelined`.
        let load = |c: &mut String, t: &str, dst: &str| {
            bounds(c, t);
            accesses(c, vi);
            let whole = if pipelined {
                format!("bs_copy_async({dst} + i, in0 + at);")
            } else {
                format!("*reinterpret_cast<uint4*>({dst} + i) = {};", caching.read("uint4", "in0 + at"))
            };
            let _ = writeln!(c, "      if (at + {vi} <= {numel}ll) {{ if (at < end) {whole} }}");
            let _ = writeln!(c, "      else if (at < end) for (int e = 0; e < {vi}; ++e) if (at + e < {numel}ll) {dst}[i + e] = in0[at + e];");
            let _ = writeln!(c, "    }} }}");
        };
        let tiles = self.tiles();
        if pipelined {
            // Each block runs tiles `blockIdx.x`, `+ gridDim.x`, ...: the next one's copies in
            // flight while it runs this one. (Its stores need no barrier after them: the next
            // copies go to the other input tile, and the next results wait for the next
            // tile's first barrier.)
            let _ = writeln!(c, "  long long t = blockIdx.x;");
            let _ = writeln!(c, "  if (t < {tiles}ll) {{");
            load(&mut c, "t", "tiles_in");
            let _ = writeln!(c, "  }}\n  bs_commit();");
            let _ = writeln!(c, "  for (int b = 0; t < {tiles}ll; t += gridDim.x, b ^= 1) {{");
            let _ = writeln!(c, "    {in_ty}* const tile_in = tiles_in + b * {held};");
            let _ = writeln!(c, "    if (t + gridDim.x < {tiles}ll) {{");
            load(&mut c, "(t + gridDim.x)", &format!("(tiles_in + (b ^ 1) * {held})"));
            let _ = writeln!(c, "    }}\n    bs_commit();\n    bs_wait_prior();");
            bounds(&mut c, "t");
        } else {
            let _ = writeln!(c, "  for (long long t = blockIdx.x; t < {tiles}ll; t += gridDim.x) {{");
            load(&mut c, "t", "tile_in");
        }
        c.push_str("    __syncthreads();\n");
        // The rows, `TILE_THREADS / g` at a time (`passes` times, alike in every thread): run `j`
        // of a thread (its values `x[j * w ..][..w]`) at columns `(lane + j * g) * w ..`, in the
        // row for every `j` but the last (a value a run without `vector_tile_values`: column
        // `lane + j * g`).
        if self.passes > 1 {
            let _ = writeln!(c, "    for (int slot = threadIdx.x / {g}; slot < {r}; slot += {}) {{", TILE_THREADS / g);
        }
        let _ = writeln!(c, "    {{ const bool valid = t * {r}ll + slot < {rows}ll;");
        let _ = writeln!(c, "    const int first = pad + slot * {cols};");
        let runs = k / w;
        let in_row = |j: usize| {
            if j + 1 < runs {
                "valid".to_string()
            } else {
                format!("valid && lane + {} < {}", j * g, cols / w)
            }
        };
        // Run `j`'s first column.
        let run = |j: usize| if w == 1 { format!("lane + {}", j * g) } else { format!("(lane + {}) * {w}", j * g) };
        // Each value of the thread: its run and its place in `x`.
        let values = || (0..runs).flat_map(move |j| (0..w).map(move |e| (j, j * w + e)));
        let neutral = if id == prims::SOFTMAX { "__int_as_float(0xff800000)" } else { "0.0f" };
        let _ = writeln!(c, "    float x[{k}];");
        for j in 0..runs {
            if w == 1 {
                let at = format!("tile_in[first + {}]", run(j));
                let value = if packing::is_packed(input) { widen(input, &format!("(unsigned int){at}")) } else { at };
                let _ = writeln!(c, "    x[{j}] = ({}) ? {value} : {neutral};", in_row(j));
            } else {
                let fill = (0..w).map(|e| format!(" x[{}] = {neutral};", j * w + e)).collect::<String>();
                let read = super::row_kernels::load(
                    input,
                    w,
                    &format!("tile_in + first + {}", run(j)),
                    &format!("(x + {})", j * w),
                );
                let _ = writeln!(c, "    if ({}) {read} else {{{fill} }}", in_row(j));
            }
        }
        let sum = |a: &str, b: &str| format!("{a} + {b}");
        let max = |a: &str, b: &str| maximum(a, b);
        let softmax = id == prims::SOFTMAX;
        if softmax {
            let _ = writeln!(c, "    float acc = __int_as_float(0xff800000);");
            for (j, i) in values() {
                let _ = writeln!(c, "    if ({}) acc = {};", in_row(j), maximum("acc", &format!("x[{i}]")));
            }
            row_reduce(&mut c, g, &max);
            let _ = writeln!(c, "    const float m = acc;");
            let _ = writeln!(c, "    acc = 0.0f;");
            // The sum is of the results' exponentials, scaled or not: `1 / acc` divides the
            // scale out (see `RowOp::scales_results`).
            let exp = if RowOp::scales_results(out_dtype, variants.fast_exp2) { "bs_exp_out" } else { "bs_exp" };
            for (j, i) in values() {
                let _ = writeln!(c, "    if ({}) {{ x[{i}] = {exp}(x[{i}] - m); acc = acc + x[{i}]; }}", in_row(j));
            }
            row_reduce(&mut c, g, &sum);
            let _ = writeln!(c, "    const float inv_z = 1.0f / acc;");
        } else {
            let eps = op.scalar(1).map_err(|e| e.to_string())?;
            let inverse = literal(1.0 / cols as f32);
            let _ = writeln!(c, "    float acc = 0.0f;");
            for (j, i) in values() {
                let _ = writeln!(c, "    if ({}) acc = acc + x[{i}];", in_row(j));
            }
            row_reduce(&mut c, g, &sum);
            let _ = writeln!(c, "    const float mean = acc * {inverse};");
            let _ = writeln!(c, "    acc = 0.0f;");
            for (j, i) in values() {
                let _ = writeln!(c, "    if ({}) {{ const float d = x[{i}] - mean; acc = acc + d * d; }}", in_row(j));
            }
            row_reduce(&mut c, g, &sum);
            let _ = writeln!(c, "    const float variance = acc * {inverse};");
            let _ = writeln!(c, "    const float inv_std = expf(logf(variance + {}) * -0.5f);", literal(eps));
        }
        // The result at the thread's value `i`, as C (`operands`: `layer_norm`'s weight and bias
        // there).
        let result = |i: usize, operands: &[String]| {
            if softmax {
                return format!("x[{i}] * inv_z");
            }
            let mut y = format!("(x[{i}] - mean) * inv_std");
            for (operand, combine) in operands.iter().zip(["*", "+"]) {
                y = format!("({y}) {combine} {operand}");
            }
            y
        };
        // The results, a run at a time (`layer_norm`'s weight and bias read as the values are).
        for j in 0..runs {
            if w == 1 {
                let operands: Vec<String> = (1..tensors).map(|o| format!("operand{o}[{}]", run(j))).collect();
                let y = narrow(out_dtype, &result(j, &operands));
                let _ = writeln!(c, "    if ({}) tile_out[first + {}] = {y};", in_row(j), run(j));
                continue;
            }
            let _ = writeln!(c, "    if ({}) {{", in_row(j));
            for o in 1..tensors {
                let read =
                    super::row_kernels::load(DType::F32, w, &format!("operand{o} + {}", run(j)), &format!("o{o}"));
                let _ = writeln!(c, "      float o{o}[{w}]; {read}");
            }
            let _ = writeln!(c, "      float y[{w}];");
            for e in 0..w {
                let operands: Vec<String> = (1..tensors).map(|o| format!("o{o}[{e}]")).collect();
                let _ = writeln!(c, "      y[{e}] = {};", result(j * w + e, &operands));
            }
            let write = store(out_dtype, w, &format!("tile_out + first + {}", run(j)), "y");
            let _ = writeln!(c, "      {write}\n    }}");
        }
        c.push_str(if self.passes > 1 { "    } }\n    __syncthreads();\n" } else { "    }\n    __syncthreads();\n" });
        // The tile's results, the accesses that lie in it whole with one store each; one it
        // shares with the tensor's end (or with a tile beside it, see `pad`) a value at a time.
        accesses(&mut c, vo);
        let _ = writeln!(
            c,
            "      if (at >= base && at + {vo} <= end) {}",
            caching.write("uint4", "out0 + at", "*reinterpret_cast<const uint4*>(tile_out + i)")
        );
        let _ = writeln!(c, "      else if (at < end) for (int e = 0; e < {vo}; ++e) if (at + e >= base && at + e < end) out0[at + e] = tile_out[i + e];");
        let _ = writeln!(c, "    }} }}");
        // (The next tile's loads write `tile_in`, read before the barrier above, and its results
        // `tile_out` after its own first barrier: this one is not needed, and stays as timed.)
        c.push_str(if pipelined { "  }\n}\n" } else { "    __syncthreads();\n  }\n}\n" });

        let blocks = if pipelined && target.region.sms > 0 { tiles.min(target.region.sms * per_sm) } else { tiles };
        let blocks = blocks.clamp(1, i32::MAX as usize) as u32;
        let layout = RowLayout {
            threads_per_row: g,
            vector: vi,
            per_thread: Some(k),
            in_registers: k,
            block: TILE_THREADS,
            aligned: true,
            shared_value_bytes: input.size_bytes(),
        };
        let source = RegionSource {
            kernel: kernel.to_string(),
            source: c,
            inputs: tensors,
            outputs: 1,
            numel,
            vectorized: true,
            threads: blocks as usize * TILE_THREADS,
            input_lengths,
            output_lengths: vec![packing::words(out_dtype, numel)],
            in_place: Vec::new(),
            cluster: 1,
        };
        Ok(RowSource { source, layout, blocks, shared_bytes })
    }
}
