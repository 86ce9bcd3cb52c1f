//! Variants of the generated kernels, each chosen by a developer option (`cuda.*`, set through
//! [`Options::set_developer`]). A variant is on by default once the GPU has shown it faster on the
//! sweep (`examples/gpu_sweep.rs --variants`, which times each variant flipped from the defaults,
//! case by case, in one run) or on GPT-2's steps: `fast_exp2` and `streaming_rows` are (2026-12-05,
//! the H200's sweep), `keep_in_l2` (2026-12-05, an H100, with GPT-2's steps), `batched_rows` (the
//! same H100's sweep), `async_row_copies` (the H200 and an H100, 2026-12-05 and 2026-12-06),
//! `split_rows` (an H100, 2026-12-06, over 141 cases of few long rows), `split_reductions` (an
//! H100, 2026-12-06, over 66 cases of few long rows), `tiled_rows` and `pipelined_tiles` (an H100,
//! 2026-12-06, over 44 and 72 cases of short rows of odd lengths), `wide_tiles` (the H200,
//! 2026-12-06, over 30 cases of rows of up to 15 values), `tile_occupancy` (an H100, 2026-12-07,
//! over 60 cases of rows of 1 to 15 values), `overlapped_first_pass`, `split_row_fills`,
//! `two_register_blocks`, `clustered_rows` and `long_rows_as_read` (an H100, 2026-12-07, over 54,
//! 27, 16, 10 and 12 cases of long rows), `one_pass_moments` (the H200, 2026-12-07, over 9 cases
//! of streamed rows); `int32_row_columns`, `pipelined_passes`, `vector_tile_values`,
//! `streamed_last_pass_hints`, `streamed_split_waves`, `wave_clusters_of_16` and
//! `deeper_streamed_rounds` are not.
//! Their options stay so that the comparison can be run again, and so do those of the variants on
//! by default, to time the kernels without them. A plan whose kernels differ from the defaults
//! lists its variants in its header. Both executors that generate kernels, `CudaFusion` and
//! `CudaOps`, take them (`with_variants`, or `from_options`); the front end configures them from
//! its options.
//!
//! ```
//! use boundscope::executors::cuda::KernelVariants;
//! use boundscope::options::Options;
//!
//! let mut options = Options::new();
//! let defaults = KernelVariants::from_options(&options)?;
//! assert_eq!(defaults, KernelVariants::default());
//! assert!(defaults.fast_exp2 && defaults.streaming_rows && !defaults.int32_row_columns);
//! // Developer options: the user API refuses them, and says how to opt in.
//! assert!(options.set("cuda.fast_exp2", false).is_err());
//! options.set_developer("cuda.fast_exp2", false)?;
//! let variants = KernelVariants::from_options(&options)?;
//! assert!(!variants.fast_exp2 && variants.streaming_rows);
//! # Ok::<(), boundscope::Error>(())
//! ```

use crate::error::Result;
use crate::options::{Audience, OptionSpec, OptionType, OptionValue, Options};

/// Declares [`KernelVariants`], one field a variant, and [`CUDA_OPTIONS`], one developer option
/// a variant (`cuda.` and the field's name), from one list: each variant's docs, its default
/// and its option's doc. Everything else about the variants is written once, over their flags
/// (`KernelVariants::flags` and `from_flags`, in the list's order): a new variant is one entry.
macro_rules! kernel_variants {
    ($($(#[doc = $doc:literal])* $name:ident = $default:literal, $option:literal;)*) => {
        /// Which variant of each generated kernel to emit. [`Default`] gives the fastest measured
        /// (`fast_exp2`, `streaming_rows`, `keep_in_l2`, `batched_rows`, `async_row_copies`,
        /// `split_rows`, `split_reductions`, `tiled_rows`, `pipelined_tiles`, `wide_tiles`,
        /// `tile_occupancy`, `overlapped_first_pass`, `split_row_fills`, `two_register_blocks`,
        /// `clustered_rows`, `one_pass_moments` and `long_rows_as_read`);
        /// [`KernelVariants::NONE`], the kernels before any variant.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct KernelVariants {
            $($(#[doc = $doc])* pub $name: bool,)*
        }

        impl KernelVariants {
            /// Each variant's name (its option's, past `cuda.`), in the order of its fields.
            const NAMES: [&'static str; COUNT] = [$(stringify!($name)),*];

            /// Each variant's default, in the order of [`NAMES`](Self::NAMES).
            const DEFAULTS: [bool; COUNT] = [$($default),*];

            /// Whether each variant is on, in the order of [`NAMES`](Self::NAMES).
            const fn flags(&self) -> [bool; COUNT] {
                [$(self.$name),*]
            }

            /// The variants that `flags` turn on, in the order of [`NAMES`](Self::NAMES).
            const fn from_flags(flags: [bool; COUNT]) -> Self {
                let mut i = 0;
                $(let $name = flags[i]; i += 1;)*
                let _ = i;
                Self { $($name),* }
            }
        }

        /// How many variants there are.
        const COUNT: usize = [$(stringify!($name)),*].len();

        /// The developer options of the CUDA executors: which [`KernelVariants`] they generate.
        pub const CUDA_OPTIONS: &[OptionSpec] = &[$(OptionSpec {
            name: concat!("cuda.", stringify!($name)),
            ty: OptionType::Bool,
            default: OptionValue::Bool($default),
            doc: $option,
            audience: Audience::Developer,
            env: None,
        }),*];
    };
}

kernel_variants! {
    /// `softmax`, `sigmoid` and `gelu` with 16-bit results take PTX's `ex2.approx.ftz.f32`, one
    /// instruction, where `exp2f` takes four (three of them scale results below 2^-126, and
    /// issue though predicated off). Nothing is lost to the flush: sums and `1 + e`
    /// denominators each hold a 1, f16's least value is 2^-24, and bf16 `softmax` takes its
    /// results as `ex2(y + 8) * 2^-8`, so that one that rounds to a bf16 value (down to 2^-133)
    /// never flushes. `ptxas` (sm_90): 16-bit `softmax` kernels have up to 28% fewer
    /// instructions (bf16 rows of 65,536 kept as read: 1,536 -> 1,224). On by default: on the
    /// H200 it timed 1.00x the kernels without it at the median over 130 of the sweep's 16-bit
    /// cases, up to 1.09x faster (bf16 `softmax` over rows of 65,536; 1.07x `gelu` over rows of
    /// 50,257); one case 0.94x (f16 `softmax` over 333 rows of 50,257, kept as read by two
    /// blocks an SM: under their 32-register bound `ptxas` spills 56 bytes a thread with the
    /// variant and none without, so the loss may be real).
    fast_exp2 = true,
        "16-bit softmax, sigmoid and gelu take the one-instruction ex2.approx.ftz (KernelVariants::fast_exp2).";
    /// Row kernels (`softmax`, `layer_norm`) count their columns in 32 bits for rows under
    /// 2^30 values: a bounds test is one comparison rather than two, and no 64-bit multiplies.
    /// (`layer_norm` over rows whose length 16 bytes do not divide always does: 1.05-1.58x
    /// faster on an H100 over rows of 257 to 12,289 values, whose 16-bit kernels spilled with
    /// 64-bit columns; so does `softmax` over such 16-bit rows kept as read in registers.)
    /// `ptxas`: up to 30% fewer instructions over rows of odd lengths (16-bit `layer_norm` over
    /// rows of 1,001: 2,000 -> 1,544), about the same where 16 bytes divide the row; three f32
    /// `layer_norm` kernels over streamed rows grow (464 -> 640 over rows of 65,536). Off by
    /// default: on the H200 it timed 1.00x at the median over 198 of the sweep's 204 cases, from 0.94x
    /// to 1.08x, as often slower as faster.
    int32_row_columns = false,
        "Row kernels count columns in 32 bits for rows under 2^30 values (KernelVariants::int32_row_columns).";
    /// Row kernels that keep their row on chip (read once, written once) read and write it with
    /// the streaming cache hints (`__ldcs`, `__stcs`: evicted first), as fused elementwise
    /// regions do (96-103% of a copy's speed with them over 2^28 values, measured), and fused
    /// regions ending in a last-axis `sum` or `max` read the inputs they read whole so: L2 is
    /// left to what is read again (`layer_norm`'s weight and bias, broadcast operands). Rows
    /// streamed in several passes keep plain loads, their later passes reading from L2. On by
    /// default: on the H200 it timed 1.03x the kernels without it at the median over the
    /// sweep's f32 and f16 cases and 1.00x over bf16's, up to 1.20x faster (f32 `layer_norm`
    /// over 4,096 rows of 65,536; 1.04-1.13x for `layer_norm` at most lengths in every dtype);
    /// slower in 17 of 198 cases by over 2%, by 6-8% in f32 `softmax` over 1,024 rows of 16,384
    /// (0.92x), 16-bit `sum` and `max` over 256 rows of 65,536 (0.93x) and f32 `layer_norm` over
    /// 4,096 rows of 1,024 (0.94x).
    streaming_rows = true,
        "Row kernels and fused reductions read rows read once, and row kernels write results, with streaming cache hints (KernelVariants::streaming_rows).";
    /// Kernels whose tensors fit together in three quarters of the GPU's L2 cache, and their
    /// inputs in half of it (the bytes they read whole and write, against
    /// `CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE`: 50 MiB on the H100 and H200) read and write them
    /// without the streaming hints (`__ldcs`, `__stcs`) that fused elementwise regions always
    /// take and row kernels take with [`streaming_rows`](Self::streaming_rows): the hints mark
    /// lines to be evicted first, which a tensor the next kernel reads gains nothing from where
    /// it fits. Row kernels and trailing reductions take hints only with `streaming_rows`, so
    /// this variant alone changes fused elementwise regions only. Joined regions (an optimizer's updates,
    /// `multi_tensor`) and `concat`'s copies keep their hints. On by default: on the H100
    /// (2026-12-05), GPT-2 124M's bf16 forward pass ([8, 1024] tokens) ran 1.0-1.3% faster
    /// with it in each of five interleaved pairs and its training step the same within the
    /// noise (0.4% faster on average); on the sweep's cases of 2^22 values it ran up to 1.17x
    /// faster (`softmax` and `layer_norm` over rows of 32, broadcast chains over [1024, 4096]:
    /// 77-84% of a copy's speed without it), and 0.94x on 16-bit `sum` and `max` over [16384,
    /// 1024] (125% of a copy's speed without it: the sweep's loop reads the same input again).
    /// Measured again on the same inputs (2026-12-05): up to 1.39x (f32 `softmax` over [4096,
    /// 1024], 16 MiB read and 16 written); on 16-bit `sum` and `max` over 2^24 values (32 MiB
    /// read) 0.90-0.94x over rows of 512 to 16,384, 0.95-1.00x over rows of 32, 128 and 50,257
    /// and 1.05-1.10x over [256, 65536], hence half of L2 for the inputs (between 16 and 32
    /// MiB, not measured in between).
    /// At the whole L2 (48 MiB, the sweep's 16-bit broadcast chains over [16384, 768] and
    /// [4096, 3072]) it ran
    /// 0.78-0.81x (bf16 and f16, both axes, two runs; 0.87-0.93x measured before the sweep
    /// timed its plans on the same inputs), hence the three quarters.
    keep_in_l2 = true,
        "Kernels whose tensors fit in three quarters of the GPU's L2 together, and their inputs in half, read and write them without streaming cache hints (KernelVariants::keep_in_l2).";
    /// 16-bit elementwise kernels that take several rows a thread (where a row broadcast along
    /// the last axis is read once for them) load those rows' vectors of the inputs they read
    /// whole in batches of up to 8 accesses before computing any, where each row was loaded,
    /// computed and stored in turn. Without it `ptxas` (sm_90) keeps one load a thread in
    /// flight, the next row's waiting for this row's store: the bf16 `gelu(x * scale + bias)`
    /// over [8192, 8192], 16 rows a thread at 45 registers, ran at 86% of a copy's speed on the
    /// H200 (92% on an H100), where the same chain with `scale` and `bias` along the first axis
    /// (a row a thread, 25 registers) ran at 100-101%. With it the same kernel keeps 8 loads a
    /// thread in flight, at 78 registers.
    ///
    /// Only kernels whose tensors do not fit in the GPU's L2 together are batched (all where its
    /// size is unknown): the loads it overlaps are those that wait on memory. Measured on an
    /// H100 (`scripts/gpu-variants sweep bf16,f16 bcast_last,bcast_first`), 16-bit broadcast
    /// chains over [8192, 8192] ran 1.06x with it (92% -> 98% of a copy; 1.01-1.05x
    /// `torch.compile`, from 0.96-0.99x) and over [65536, 256] 1.03-1.05x; batched within L2 too
    /// (the chains over [16384, 768] and [4096, 3072], 48 MiB), they ran 0.98-1.00x, within
    /// the 3% that two plans of the same kernels read apart, so those keep the smaller kernel
    /// (45 registers rather than 78). GPT-2 124M's bf16 steps are the same within the noise
    /// with it or without it.
    batched_rows = true,
        "16-bit elementwise kernels that take several rows a thread, and whose tensors do not fit in the GPU's L2, load those rows in batches before computing any (KernelVariants::batched_rows).";
    /// Row kernels (`softmax`, `layer_norm`) that keep part of a row in shared memory as read (a
    /// 16-bit row, or an `f32` one: 16 bytes an access) copy its accesses there with `cp.async`
    /// (Ampere and later), which takes no register, rather than loading each into registers and
    /// storing it. Without it `ptxas` (sm_90) keeps only the first few of a thread's loads in
    /// flight and makes the rest one at a time, each waiting for the one before: a bf16
    /// `layer_norm` over rows of 50,257 (seven accesses a thread, six of them in shared memory)
    /// loads three at once, then three in turn. Measured on the H200 (2026-12-05,
    /// `gpu_sweep f32,bf16,f16 softmax,layer_norm 333x50257,256x65536 --variants`, plans on the
    /// same inputs, best of three rounds; a second plan of the defaults read 0.99-1.00x): 1.06x
    /// the defaults at the median over those 12 cases, 0.99x to 1.15x; `softmax` 1.06-1.15x in 16
    /// bits (bf16 [256, 65536] 82% -> 87% of a copy; f16 [333, 50257] 67% -> 77%), 0.99-1.07x in
    /// `f32`; `layer_norm` 1.01-1.06x (its rows are then bound by other things: [333, 50257] in 16
    /// bits 49-50% -> 52-53%). Each case's results checked against the CPU reference, the same
    /// as the defaults'. On an H100 (2026-12-06, the same command): 1.05x at the median over
    /// the same 12 cases, 0.99x to 1.11x (16-bit `softmax` 1.05-1.11x, `layer_norm` 1.00-1.06x);
    /// over the other shapes that keep rows in shared memory (`1024x16384,4096x65536`, 12
    /// cases) 1.00x at the median, 0.98x to 1.06x, where two plans of the defaults read
    /// 0.99-1.01x apart. On by default since `cuda_matches_reference` passed with it (all 42
    /// tests, on the H100: its row test runs every variant alone and all of them, over rows of
    /// 16,384 to 200,003 in every dtype).
    ///
    /// No copy carries an L2 cache hint. `softmax` rows are copied so always; `layer_norm`
    /// rows only where the streaming hints leave their accesses as they are (tensors that fit
    /// in L2, with [`keep_in_l2`](Self::keep_in_l2)): hinted ones are read through registers
    /// with the hint, as without the variant, since `layer_norm` reads its weight and bias
    /// again for every row, and rows not marked to be evicted first push them out of L2 (f32
    /// `layer_norm` over 1 GiB copied without the hint ran at 0.82x). Hinted copies
    /// (`cp.async` with `.L2::cache_hint`) stopped f32 `softmax` over [100, 65537] and
    /// [200, 65537] with `CUDA_ERROR_ILLEGAL_INSTRUCTION` on an H100 (2026-12-06, the defaults;
    /// `compute-sanitizer` put it at the copy), tensors past half of L2 that the tests had not
    /// covered (the row test now runs such tensors). Against the hinted copies, where those ran
    /// (H100, `gpu_sweep f32,bf16,f16 softmax,layer_norm 333x50257,256x65536,4096x65536`, one
    /// process each, two rounds), with every hinted row read through registers: 0.97x at the
    /// median, 0.88x (f16 `softmax` [333, 50257]) to 1.02x. Hinted `softmax` rows copied, against
    /// that (an H100, the same day, `gpu_sweep f32,bf16,f16 softmax
    /// 333x50257,256x65536,4096x65536,100x65537,200x65537`, two rounds a build): 1.06x at the
    /// median, 0.98x to 1.18x.
    async_row_copies = true,
        "Row kernels copy the part of a row they keep in shared memory as read there with cp.async, without registers: softmax always, layer_norm where the streaming hints leave the row unmarked (KernelVariants::async_row_copies).";
    /// Rows too long to keep on chip (streamed: read once per pass; on Hopper, `layer_norm`
    /// rows past 65,536 values in `f32` and 122,880 in 16 bits, `softmax` rows past 90,112 in
    /// `f32` and 122,880 in 16 bits, or further where a cluster keeps them) are
    /// split over a thread-block cluster of up to 8
    /// blocks (Hopper and later) where the tensor has fewer rows than the GPU has SMs: each
    /// block passes over its slice of the row (whole rounds of its threads' accesses, as many as
    /// the other blocks' or one fewer), and the blocks combine their sums and maxima through
    /// distributed shared memory, in the same order in each, so that every block ends with the
    /// same row totals. Each pass over a split row runs the other way from the pass before, so
    /// that it first reads again what that pass read last, the part still in L2. Without it
    /// such a row takes one block: 16 rows of 2^20 values ran on 16 of the H100's 132 SMs.
    /// Other kernels are the same with it or without it.
    ///
    /// On by default. On an H100 (2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm SHAPES
    /// --variant=split_rows`, plans on the same inputs, best of three rounds, results checked
    /// against the CPU reference), over rows of 65,537, 262,144 and 2^20 values, 1 to 133 of
    /// them (141 cases): 1.02x to 6.3x where rows are split (1 to 8 rows of 2^20: 5.2-6.3x,
    /// `softmax` f32 [8, 2^20] 282 -> 1480 GB/s; 16 rows 2.3-4.2x; 40 rows 1.6-2.2x; 64 to 131
    /// rows 1.02-1.37x), 0.98-1.01x where they are not (rows kept on chip, or 133 rows).
    /// Where the GPU cannot run a kernel's clusters at once (`cuOccupancyMaxActiveClusters`
    /// finds none: a MIG instance or an MPS limit may leave too few SMs of a GPC), `CudaOps`
    /// plans its rows unsplit.
    ///
    /// A first form also split rows that a block of 1,024 threads keeps partly in shared
    /// memory (16-bit rows of 50,257 and 65,536, `f32` `softmax` up to 65,536) over two blocks of
    /// 512, each keeping half. It was slower where it ran (bf16 [333, 50257] `softmax` 0.81x,
    /// `layer_norm` 0.84x; [256, 65536] `layer_norm` 0.84x), and was dropped. It also faulted
    /// (`CUDA_ERROR_ILLEGAL_INSTRUCTION`) where its rows were copied to shared memory with an L2
    /// cache hint, which turned out to fault in some kernels without clusters too (see
    /// [`async_row_copies`](Self::async_row_copies)).
    split_rows = true,
        "Streamed rows split over thread-block clusters of up to 8 blocks where rows are fewer than SMs, each pass running the other way from the one before (KernelVariants::split_rows).";
    /// A fused region's trailing last-axis `sum` or `max` (or the op alone) over rows of 64 KB
    /// or more (16,384 `f32` values, 32,768 16-bit ones), which take a block of 256 threads each,
    /// is split over a thread-block cluster of up to 8 blocks (Hopper and later) where the
    /// tensor has at most a quarter as many rows as the GPU has SMs, or half as many rows of
    /// 256 KB or more, as
    /// [`split_rows`](Self::split_rows) splits a row kernel's streamed rows: each block reduces
    /// a contiguous slice of the row (whole accesses, as many as the others' or fewer), and the
    /// blocks combine their totals through distributed shared memory in rank order, so that the
    /// result has the same bits on every run. Without it such a row takes one block: 16 rows of
    /// 2^20 values ran on 16 of the H100's 132 SMs (`f32` `sum` at 748 GB/s). Other kernels
    /// are the same with it or without it. Where the GPU cannot run a kernel's clusters at
    /// once (`cuOccupancyMaxActiveClusters` finds none), the executor generates it unsplit.
    ///
    /// On by default. On an H100 (2026-12-06, `gpu_sweep f32,bf16,f16 sum,max SHAPES
    /// --variant=split_reductions`, plans on the same inputs, best of three rounds, results
    /// checked against the CPU reference), over 1 to 64 rows of 50,257 to 2^20 values: 1.02x
    /// to 6.6x (f32 `sum` [16, 2^20] 3.5x, 2,613 GB/s; [8, 2^20] 6.6x; 40 rows of 262,144
    /// 1.5-2.1x; 64 rows 1.2-1.6x; 9 rows of 200,003 2.5-3.1x), 0.99-1.33x over the 2-4 MiB
    /// tensors of 16 rows of 65,536. Rows past a quarter of the SMs, split, ran at 0.82-0.91x
    /// over 100 and 131 rows of 65,536 and 0.86-1.00x over 64 and 66 rows of
    /// 65,536 (128 KB a row in 16 bits, 256 KB in `f32`), but 1.07-1.63x over 64 and 66 rows of
    /// 262,144, so such rows are split only from 256 KB a row and only up to half as many as
    /// SMs: `f32` [64, 65536] (256 KB a row) is split, at 0.97x, and [40, 65536] at 1.14x.
    split_reductions = true,
        "Fused regions' trailing sums and maxima over rows of a block or more split over thread-block clusters of up to 8 blocks where rows are at most a quarter as many as SMs, or half as many of 256 KB or more (KernelVariants::split_reductions).";
    /// `softmax` and `layer_norm` over short rows whose length in bytes 16 does not divide (in
    /// their input or their result): rows of up to 128 bytes (f32 rows of up to 32 values,
    /// 16-bit ones of up to 64), and 16-bit `softmax` rows of up to 256 values. A block of 256
    /// threads copies a run of whole rows into shared memory with 16-byte accesses aligned to
    /// the tensor, every one of them whole (but the tensor's last), runs each row from
    /// there (1 to 16 threads a row, up to 16 values a thread), and writes the run back the
    /// same way. Without it such a row is read in place, with accesses aligned to the tensor of
    /// which the two it shares with the rows beside it are made a value at a time, by a power
    /// of two of threads that its accesses may not fill (a bf16 row of 33 values: 5 accesses,
    /// 2 of them shared, 8 threads).
    ///
    /// On by default: on an H100 (2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm
    /// --variant=tiled_rows` over rows of 3 to 255 values, 2^21 to 2^26 values in all, plans on
    /// the same inputs), the 44 cases it now takes ran 1.03x to 3.97x the kernels without it,
    /// median 1.36x (rows of 5: 3.8-4.0x in 16 bits; bf16 `softmax` [131072, 33] 37% -> 54% of
    /// a copy's speed). Over longer rows it ran 0.74x to 1.12x in f32 and 0.78x to 1.22x for
    /// 16-bit `layer_norm` (rows of 65 to 255 values), so those are read in place
    /// (`row_tiles`). The 128 bytes are the input's: a bf16 row written as f32 (`layer_norm`
    /// with f32 weight and bias) takes up to 256 bytes in its result.
    ///
    /// With [`pipelined_tiles`](Self::pipelined_tiles) (on by default), rows of 17 values or
    /// more are read as pipelined tiles whether this variant is on or not: by default, this
    /// variant alone chooses how rows of up to 16 values are read.
    tiled_rows = true,
        "softmax and layer_norm over short rows whose length in bytes 16 does not divide (up to 128 bytes; 16-bit softmax rows up to 256 values) read and write a block's run of rows through shared memory, 16 bytes an access (KernelVariants::tiled_rows).";
    /// Rows of odd lengths of 17 to 256 values (f32 rows up to 64) read as tiles (as
    /// [`tiled_rows`](Self::tiled_rows) reads shorter ones), pipelined: a grid of up to 4 blocks
    /// an SM, each copying its next tile into shared memory with `cp.async` while it runs the one
    /// before, where a tiled kernel's block loads its one tile, waits, then runs it. Shorter rows
    /// (a thread a row) keep `tiled_rows`' kernels, and so do the tiles without this variant;
    /// without both variants, no row is tiled.
    ///
    /// On by default: on an H100 (2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm
    /// --variant=pipelined_tiles`, plans on the same inputs), pipelined tiles over every odd row
    /// of up to 256 values ran 0.88x to 1.57x the kernels before them, median 1.07x over 72
    /// cases: 1.03x to 1.53x over 16-bit rows of 33 to 255 values (16-bit `layer_norm` rows of
    /// 65 to 255, read in place before, 1.04x to 1.34x), 1.05x to 1.36x over f32 rows of 33; 0.91x
    /// to 1.00x over f32 rows of 100 to 255, which stay read in place, and 0.88x to 0.98x over
    /// 16-bit rows of 3 and 5 values, which keep `tiled_rows`' kernels. The 36 cases that this
    /// gate takes ran 0.96x to 1.53x, median 1.17x (52-91% of a copy's speed, median 79%; 64%
    /// before); the least, 16-bit `softmax` over [131072, 33], whose 8 MiB stay in L2. Rows of
    /// 17 to 32 values and f32 rows of 34 to 63 were not among the cases timed. The copies
    /// take no streaming cache hint (`cp.async.cg` caches in L2 only), whatever
    /// [`streaming_rows`](Self::streaming_rows) says; the results' stores take it.
    pipelined_tiles = true,
        "softmax and layer_norm over rows of odd lengths of 17 to 256 values (f32 up to 64) read as tiles by a few blocks an SM, each copying its next tile with cp.async while it runs the one before (KernelVariants::pipelined_tiles).";
    /// The tiles of [`tiled_rows`](Self::tiled_rows) over rows of a thread's own (up to 16 values)
    /// hold about 8 KB of input: each thread runs several rows in turn (16-bit rows of 3 values, 5
    /// rows a thread), where a tile held a row a thread (1.5 KB over 16-bit rows of 3: 96 loads of
    /// 16 bytes for a block of 256 threads, too few in flight). So it takes rows of up to 10 bytes,
    /// at least three a thread: 16-bit rows of up to 5 values, f32 rows of 1 or 2; longer ones
    /// (16-bit rows of 6 and 7 values, two a thread, ran 0.85x to 0.98x on an H100; from 9 values
    /// two would pass 8 KB; f32 rows of 3, two a thread, 0.90x to 1.07x on the H200) and pipelined
    /// tiles are laid out as before. It changes only the tiles of `tiled_rows`: without that
    /// variant it does nothing.
    ///
    /// On by default: on the H200 (2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm
    /// 2097152x3,1048576x5,4194304x9,262144x9,1048576x15`, two rounds, tiles of 8 KB against
    /// tiles of a row a thread), 16-bit rows of 3 values ran 1.35x to 1.40x (bf16 `softmax` over
    /// [2097152, 3] from 41% to 55% of a copy's speed), of 5 values 1.05x to 1.12x. f32 rows of
    /// 3 ran 0.90x (`softmax`) and 1.07x, so they keep a row a thread; 16 KB tiles were mixed
    /// (0.90x to 1.23x). (Timed as an experiment build, whose kernels at 8 KB are these,
    /// byte for byte but for their first comment line.) On an H100 (2026-12-07, `gpu_sweep
    /// bf16,f16 softmax,layer_norm
    /// 4194304x1,2097152x2,2097152x3,1048576x5,1048576x7,4194304x9,1048577x3,262143x5
    /// --variant=wide_tiles`): rows of 1 value 1.65x to 1.77x, of 2 1.30x to 1.40x, of 3 1.04x
    /// to 1.31x, of 5 0.90x to 1.04x; rows of 7 (two a thread) 0.85x to 0.98x, so they keep a
    /// row a thread. f32 rows of 1 and 2 (since 2026-12-07; an H100, `gpu_sweep f32
    /// softmax,layer_norm 8388608x1,4194304x2,16777216x1,2097152x2,1048577x1,524287x2`, two
    /// rounds, an experiment build whose kernels are these, against a row a thread): rows of 1
    /// 1.19x to 1.49x (`softmax` over [8388608, 1] 1666 -> 2148 GB/s, 0.76x -> 0.98x the
    /// faster PyTorch), rows of 2 0.98x to 1.19x.
    wide_tiles = true,
        "softmax and layer_norm over rows of odd lengths of up to 10 bytes (16-bit rows of up to 5 values, f32 rows of 1 or 2) read as tiles of about 8 KB, several rows a thread, where tiled_rows reads them as tiles (KernelVariants::wide_tiles).";
    /// The plain tiles of [`tiled_rows`](Self::tiled_rows) over 16-bit rows (not the pipelined
    /// ones, nor f32 rows: untimed with it, and some of their tiles leave shared memory for only
    /// seven blocks) ask `ptxas` for eight blocks of 256 threads an SM (`__launch_bounds__(256,
    /// 8)`: at most 32 registers a thread), where it took up to 72 (16-bit `layer_norm` over rows
    /// of 1 value in wide tiles) and 40 to 64 at most short lengths: five or six blocks an SM, a
    /// wide tile's 8 KB of loads each. `ptxas` (sm_90) spills 4 to 20 bytes a thread with it in
    /// 16-bit `softmax` over rows of 1 and 4 values, nowhere else over rows of 1 to 15.
    ///
    /// On by default. On an H100 (2026-12-07, `gpu_sweep bf16,f16,f32 softmax,layer_norm
    /// 8388608x1,4194304x2,4194304x3,2097152x4,2097152x5,2097152x6,2097152x7,2097152x9,1048576x11,1048576x15
    /// --variant=tile_occupancy`, 60 cases, one run): 16-bit rows 0.98x to 1.18x, median 1.05x
    /// (rows of 1 to 5 values 1.01x to 1.18x: bf16 `layer_norm` [2097152, 5] 1.18x, [8388608, 1]
    /// 1.11x to 1.12x, `softmax` [4194304, 2] 1.11x to 1.12x; rows of 6 to 15 0.98x to 1.11x);
    /// f32 rows, whose kernels it leaves, 0.99x to 1.03x. Before, an experiment build whose
    /// kernels are these (the same bounds, on every plain tile) ran on an H100 (2026-12-07,
    /// `gpu_sweep bf16,f16 softmax,layer_norm
    /// 4194304x1,2097152x2,2097152x3,1048576x5,1048576x7,4194304x9,1048577x3,262143x5`, two
    /// rounds a build, interleaved): 1.00x to 1.11x over 16-bit rows of 1 to 9 values, median
    /// 1.03x (`softmax` over [4194304, 9] 1.08x to 1.09x, 40 registers down to 32), 0.95x once
    /// (bf16 `softmax` [262143, 5], 5 MB, whose rounds moved by 10%); `layer_norm` over rows of
    /// 7 in wide tiles 0.67x to 0.68x, spilling 68 bytes a thread, which `wide_tiles` no longer
    /// makes (rows of 7 keep a row a thread, 32 registers without the bounds: 1.00x to 1.03x
    /// with the variant, above).
    tile_occupancy = true,
        "softmax and layer_norm over short 16-bit rows read as plain tiles compile for eight blocks an SM, at most 32 registers a thread (KernelVariants::tile_occupancy).";
    /// The pipelined tiles of [`pipelined_tiles`](Self::pipelined_tiles) hold about 16 KB of
    /// input: each thread runs several rows in turn (16-bit rows of 100 values, two a thread:
    /// tiles of 64 rows, 12.8 KB), where a tile held a row a thread's share (32 rows of 100, 6.4
    /// KB). A block copies its next tile while it runs one; with up to four blocks an SM, a tile
    /// of 6.4 KB keeps about 25 KB an SM in flight, near what HBM's bandwidth and latency ask
    /// for (`ncu` on an H100, bf16 `layer_norm` over [524288, 100]: 68.5% of DRAM's bandwidth,
    /// 0.90x `torch.compile`). A block's two input tiles and its results' stay within 48 KB of
    /// shared memory (a bf16 row written as f32, whose results take twice its input's bytes,
    /// keeps fewer rows a thread), so four blocks fit an SM. These kernels ask `ptxas` for the
    /// blocks an SM that their grid takes (`__launch_bounds__(256, 4)`): the blocks loop over
    /// the tiles, and all of them are then resident at once, none in a second wave. Without the
    /// bound, 16-bit `softmax` over rows of 17 took 74 registers a thread (three blocks an SM);
    /// with it, 32 to 47 and no spills over 16-bit rows of 17 to 255 (`ptxas`, sm_90). Rows of
    /// which 16 KB hold fewer than two passes (f32 rows, whose passes take 8 KB or more) keep
    /// their tiles, byte for byte. It changes only the tiles of `pipelined_tiles`: without that
    /// variant it does nothing.
    ///
    /// Off by default: slower. On an H100 (2026-12-07, `gpu_sweep bf16,f16 softmax,layer_norm
    /// 1048576x17,1048576x33,524288x65,524288x100,262144x129,262144x255,65536x255,131072x33
    /// --variant=pipelined_passes`, 32 cases, one run): 0.88x to 1.03x, median 0.97x; over
    /// [524288, 100], the shape it was for, `layer_norm` 0.92x to 0.93x and `softmax` 0.97x
    /// (the kernels without it ran that `layer_norm` at 91-92% of a copy on that GPU).
    pipelined_passes = false,
        "softmax and layer_norm over rows read as pipelined tiles hold about 16 KB a tile, several rows a thread (KernelVariants::pipelined_passes).";
    /// Rows copied asynchronously into shared memory ([`async_row_copies`](Self::async_row_copies))
    /// commit each of a thread's copies as a group of its own, and the kernel's first pass over
    /// the row (`softmax`'s maximum, `layer_norm`'s sum) takes each access as soon as its copy has
    /// landed (`cp.async.wait_group`, counting down), the later copies still in flight, where it
    /// waited for all of them before its first pass. Without `async_row_copies` it does nothing.
    ///
    /// On by default: on an H100 (2026-12-07, `gpu_sweep f32,bf16,f16 softmax,layer_norm
    /// 4096x16384,1024x16384,2048x32768,333x50257,256x65536,64x65536,8192x12289,128x16384,1335x50257
    /// --variant=overlapped_first_pass`, 54 cases, the two plans on the same inputs, three rounds),
    /// 1.00x at the median, 0.98x to 1.05x: `softmax` over rows kept in shared memory 1.03x to
    /// 1.05x over [333, 50257] in every dtype, 1.03x to 1.05x over 16-bit [256, 65536] and 1.04x
    /// over f32 [1335, 50257]; the kernels it leaves as they were (rows read through registers,
    /// `layer_norm` rows with the streaming hints) 0.98x to 1.02x, the noise. An earlier run the
    /// same day (12 `softmax` cases of 50,257 and 65,536 values): 0.98x to 1.05x, median 1.03x.
    overlapped_first_pass = true,
        "Row kernels that copy their rows to shared memory run their first pass over each access as its copy lands (KernelVariants::overlapped_first_pass).";
    /// Row kernels that load the part of a row they keep in shared memory through registers
    /// (`layer_norm` rows with the streaming hints, and every row without
    /// [`async_row_copies`](Self::async_row_copies)) load the accesses the row holds whole in one
    /// loop, then fill the two it shares with the rows beside it, value by value, in a second,
    /// where one loop did both. Over rows of odd lengths `ptxas` (sm_90) had kept each access's
    /// value-by-value branch between the whole loads, so that a thread waited on its loads in
    /// four rounds (16-bit `layer_norm` over rows of 50,257: 8, 1, 3 and 1 of its 13 accesses
    /// at a time); in two with this (6 and 7). Rows that 16 bytes divide have no partial
    /// access to branch on.
    ///
    /// On by default: on an H100 (2026-12-07, `gpu_sweep f32,bf16,f16 layer_norm
    /// 333x50257,256x65536,1335x50257,4096x65536,132x50257,2048x32768,4096x16384,1024x16384,9x200003
    /// --variant=split_row_fills`, 27 cases, an experiment build whose kernels are these), 0.99x
    /// to 1.07x, median 1.00x: rows of 50,257 1.00x to 1.07x ([1335, 50257] 1.04x to 1.07x in every
    /// dtype), the others (rows that 16 bytes divide, streamed rows) 0.99x to 1.02x. Again with
    /// the landed build (`gpu_sweep f32,bf16,f16 layer_norm
    /// 1335x50257,333x50257,8192x12289,2000x30001,4096x20001,700x65537,64x50257
    /// --variant=split_row_fills`, 21 cases, the variant turned off): the kernels without it ran
    /// 0.94x to 1.01x ([1335, 50257] 0.94x to 0.96x, 16-bit [700, 65537] 0.97x).
    split_row_fills = true,
        "Rows kept in shared memory load their whole accesses first, then the partial ones (KernelVariants::split_row_fills).";
    /// A 16-bit `layer_norm` row that a block of 1,024 threads would hold in registers alone
    /// (rows of about 16,385 to 32,768 values), whose accesses are 16 bytes of its input (not
    /// where a wider weight or bias narrows them), is held by a block of 512: each thread's first
    /// access in registers, the rest in shared memory as read (at most 56 KB a block), two blocks
    /// an SM (`__launch_bounds__(512, 2)`), as 16-bit rows of 32,769 to 61,440 values are; only
    /// where two such blocks fit an SM's shared memory (Hopper's and Ampere's A100's: 228 and 164
    /// KB; not GPUs of 100 KB an SM, whose rows keep their registers). A block of
    /// 1,024 threads took the SM's registers and ran its loads, reductions and writes in turn,
    /// the SM's loads idle while it reduced; two blocks overlap them. (Held in registers alone
    /// by 512 threads, `ptxas` (sm_90) spilled 44 to 268 bytes a thread; this way none.)
    ///
    /// On by default: on an H100 (2026-12-07, `gpu_sweep bf16,f16 layer_norm
    /// 4096x20001,3000x17001,2048x30001,2000x24577,2048x32768,4096x24576,8192x16385,1365x32767
    /// --variant=two_register_blocks`, an experiment build whose kernels are these, 16 cases):
    /// 1.00x to 1.44x, median 1.17x; rows of 16,385 to 20,001 values 1.30x to 1.44x (52-60% ->
    /// 72-80% of a copy), [4096, 24576] 1.17x (83% -> 97%), [2048, 32768] 1.04x to 1.05x;
    /// [1365, 32767] (not held in registers alone) 1.00x.
    two_register_blocks = true,
        "16-bit layer_norm rows that 1,024 threads would hold in registers are held by two blocks of 512 an SM, partly in shared memory (KernelVariants::two_register_blocks).";
    /// A `layer_norm` row (any dtype) or an f32 `softmax` row too long for one block to keep on
    /// chip (past 65,536 f32 `layer_norm` values, 122,880 16-bit ones, 90,112 f32 `softmax`
    /// ones) is kept by a thread-block cluster (`__cluster_dims__`) of the fewest blocks of
    /// 1,024 threads whose slices fit, up to 8 (and, where rows are fewer than SMs, of enough
    /// for a block an SM): each block keeps its slice of the row's accesses in registers and
    /// shared memory as a block keeps a whole row, and the cluster combines each block's sums
    /// through distributed shared memory. The row is read once and written once, where streamed
    /// it was read three times (`layer_norm`) or twice (`softmax`). Rows too long for 8 blocks
    /// are streamed as before ([`split_rows`](Self::split_rows)). 16-bit `softmax` rows only as
    /// read, by clusters of up to 3 ([`long_rows_as_read`](Self::long_rows_as_read)): kept as
    /// `float`s they ran at 0.74x to 0.78x their streamed kernels. Where the GPU
    /// cannot run such a cluster at once, the kernel is generated without it, as
    /// [`split_rows`](Self::split_rows)' are. Rows fewer than two fifths of the SMs (52 or fewer
    /// on 132 SMs) stay streamed, split over clusters by [`split_rows`](Self::split_rows) (with
    /// it off, or the SM count unknown, clusters keep them): on the H200 (2026-12-07,
    /// `gpu_sweep f32 layer_norm,softmax 16x200003,32x131072,16x262144` and `bf16 layer_norm
    /// 16x524288,32x262144` `--variant=clustered_rows`), kept by clusters of 5 to 8 they ran at
    /// 0.63x to 0.95x their streamed kernels, and capped at 4 or 6 blocks mostly slower too
    /// (0.72x to 1.19x, 2 of 15 cases faster); on an H100 (2026-12-07, f32 `layer_norm` and
    /// `softmax` over [40, 262144], [48, 131072], [64, 100003] and [64, 200003], bf16 over
    /// [48, 524288] and [64, 262144]) 40 rows ran at
    /// 0.84x to 0.87x and 48 rows at 0.66x to 0.77x, and 64 rows at 0.81x to 1.29x (4 of 6
    /// faster). Nor where the clusters' blocks leave much of their last wave idle: 56 rows by
    /// clusters of 3 (168 blocks, one an SM, on 132 SMs) ran at 0.64x to 0.79x (an H100,
    /// 2026-12-08, f32 [56, 131072] and bf16 [56, 262144]), 60 rows of 200,003 f32 values by
    /// clusters of 4 (240 blocks) at 1.06x to 1.19x.
    ///
    /// On by default: on an H100 (2026-12-07, `gpu_sweep f32,bf16 layer_norm
    /// 700x65537,64x100003,500x150001 --variant=clustered_rows` and `gpu_sweep bf16,f32 softmax
    /// 300x131072,1000x100003 --variant=clustered_rows`, an experiment build whose kernels are
    /// these): f32 `layer_norm` 1.29x to 1.69x ([700, 65537]: 46% -> 78% of a copy), bf16
    /// `layer_norm` [500, 150001] 1.49x (39% -> 58%), f32 `softmax` 1.13x to 1.18x; rows one
    /// block keeps (bf16 [700, 65537] and [64, 100003]) the same kernels, 1.00x. `--check-full`
    /// over bf16 and f32 `[7, 100003]` and `[333, 65537]`: every row equal to the CPU reference
    /// within the sweep's tolerance.
    clustered_rows = true,
        "layer_norm and f32 softmax rows too long for one block to keep on chip are kept by a thread-block cluster of up to 8 blocks, a slice each, and 16-bit softmax rows kept as read by up to 3 (KernelVariants::clustered_rows).";
    /// A streamed `layer_norm` row (too long for a block or a cluster to keep on chip: past
    /// 524,288 f32 values or 983,040 16-bit ones on Hopper, or past one block's where clusters
    /// are off or unavailable or the rows fewer than two fifths of the SMs) takes its sum and its
    /// squared deviations in one pass over the row, then the pass that writes: two reads of the
    /// row where there were three (its mean, its variance, its results). Each thread folds each
    /// of its accesses into its own count, mean and sum of squared deviations (Chan's update: an
    /// access's values less their own mean, then the two means' difference), and the row's sum
    /// of squared deviations is the threads' sums, each with its count times the square of its
    /// mean's distance from the row's: exact as the two passes were, also for rows far from
    /// zero, where the mean square less the squared mean is not. A row split over a cluster (`split_rows`) goes back over its slice in
    /// the pass that writes, so that it starts on the values the first pass left in L2.
    ///
    /// On by default: on the H200 (2026-12-07, `gpu_sweep f32,bf16,f16 layer_norm
    /// 16x1048576,132x700001,64x1048576 --variant=one_pass_moments`, the landed kernels, both
    /// plans on the same inputs): f32 1.19x ([16, 2^20], 1709 -> 2039 GB/s) and 1.27x ([64, 2^20],
    /// 1517 -> 1923), 16-bit 1.12x and 1.17x; [132, 700001] 1.13x in f32, 1.00x in 16 bits (a
    /// cluster keeps those rows: the same kernels). `--check-full` over [7, 1048577] and
    /// [16, 1048576] in f32 and bf16 and the GPU test of rows far from zero matched the CPU
    /// reference.
    one_pass_moments = true,
        "Streamed layer_norm rows take their mean and variance in one pass over the row (KernelVariants::one_pass_moments).";
    /// A 16-bit `softmax` row too long to keep on chip as `float`s (past 90,112 values on
    /// Hopper) is kept as read, two bytes a value, 8 of a thread's values in registers and the
    /// rest in shared memory, each exponential taken twice (for the sum and for the result), as
    /// shorter 16-bit rows are: by one block up to 122,880 values, past that by a thread-block
    /// cluster of up to 3 blocks ([`clustered_rows`](Self::clustered_rows)), where it was
    /// streamed and read twice. Rows too long for 3 blocks are streamed as before: kept by a
    /// cluster of 8, 16 rows of 524,288 values ran at 0.50x their streamed kernels (clusters of 4
    /// to 7 were not timed).
    ///
    /// On by default: on an H100 (2026-12-07, `gpu_sweep bf16,f16 softmax
    /// 300x100003,300x131072,1000x100003,64x200003,100x122880,16x524288
    /// --variant=long_rows_as_read`, timed with an experiment build whose kernels are these but
    /// for the cluster of 8, which then kept [16, 524288]) in both dtypes: one block 1.15x to
    /// 1.63x ([1000, 100003] 57% -> 91% of a copy, [300, 100003] 49% -> 80%), clusters of 2
    /// and 3 ([300, 131072], [64, 200003]) 1.18x to 1.27x; every case equal to the CPU
    /// reference at 2^18 values.
    long_rows_as_read = true,
        "16-bit softmax rows too long to keep on chip as floats are kept as read, by a block or a cluster of up to 3 (KernelVariants::long_rows_as_read).";
    /// Rows read as tiles ([`tiled_rows`](Self::tiled_rows),
    /// [`pipelined_tiles`](Self::pipelined_tiles)) move between shared memory and registers a
    /// run of values an access, where they moved a value an access: each thread of a row takes
    /// runs of `w` values, `w` the most (4 in 16 bits, 2 in f32: up to 8 bytes of the input) that
    /// divides the row's length, so that every run is aligned in the tile (whose rows start at
    /// multiples of the length), and `layer_norm`'s weight and bias (widened to `float` in shared
    /// memory, up to 16 bytes a run) are read the same way. Rows of
    /// odd lengths keep a value an access. Over 16-bit rows of 100 values (8 threads a row), a
    /// thread's 13 loads and 13 stores of 2 bytes each (`LDS.U16`, `STS.U16`, each its own
    /// instruction) become 4 and 4 of 8 bytes. Without tiles it does nothing.
    ///
    /// Off by default: mixed. On an H100 (2026-12-07, `gpu_sweep bf16,f16 softmax,layer_norm
    /// 1048576x4,524288x12,262144x36,524288x100,65536x252,131072x254
    /// --variant=vector_tile_values` and f32 over rows of 2, 6 and 62; 30 cases) 0.90x to
    /// 1.11x, median 1.02x (16-bit `softmax` over rows of 36 0.90-0.93x); 16-bit `layer_norm`
    /// alone, on an H100 (2026-12-08, rows of 20, 36, 60, 100 and 196) 0.96x to 1.16x: rows of
    /// 20 and 196 1.14-1.16x, of 60 and 100 0.96-0.99x.
    vector_tile_values = false,
        "Rows read as tiles move between shared memory and registers up to 8 bytes an access, where their length allows (KernelVariants::vector_tile_values).";
    /// A streamed row's last pass (too long for a block or a cluster to keep on chip: see
    /// [`split_rows`](Self::split_rows)) reads the row and writes its results with the
    /// streaming hints (`__ldcs`, `__stcs`: lines marked to be evicted first), where the
    /// kernel's tensors do not fit in L2 ([`keep_in_l2`](Self::keep_in_l2)'s rule): the lines it
    /// reads for the last time and the results it writes leave L2 first, so that the lines of
    /// the first pass that the last reads back stay there longer. Without hints every pass
    /// kept its lines, and the results (as many bytes as the row) pushed out what the last
    /// pass was about to read. The first pass keeps plain loads.
    ///
    /// Off by default: on an H100 (2026-12-08, `gpu_sweep f32,bf16 layer_norm,softmax
    /// 64x1048576,16x1048576,132x700001,300x1048576 --variant=streamed_last_pass_hints`, 16
    /// cases) 0.86x to 1.07x, median 1.00x: bf16 1.00-1.07x, f32 0.86-1.02x (f32 [300, 2^20]
    /// 0.86-0.89x).
    streamed_last_pass_hints = false,
        "A streamed row's last pass reads the row and writes results with streaming cache hints, where the tensors do not fit in L2 (KernelVariants::streamed_last_pass_hints).";
    /// Streamed rows (too long for a block or a cluster to keep on chip) are split over
    /// thread-block clusters of 8 blocks however many the rows (fewer where the row has fewer
    /// rounds: each block one at least), not only where rows are fewer than SMs
    /// ([`split_rows`](Self::split_rows)), and each block takes half an SM's shared memory, so
    /// that an SM runs one at a time: the blocks run in waves of about one an SM, and the bytes
    /// read between a block's first pass over its slice and its last (all the slices in flight)
    /// are an eighth of the rows' in flight, where L2 keeps more of them for the last pass. Over
    /// f32 `layer_norm` [64, 2^20], rows split over 4 blocks, two an SM, put the whole 256 MiB
    /// tensor in flight (every block resident); split over 8, one an SM, 64 MiB. Needs
    /// `split_rows` and clusters.
    ///
    /// Off by default: on an H100 (2026-12-08, the same 16 cases as
    /// [`streamed_last_pass_hints`](Self::streamed_last_pass_hints)) 0.63x to 1.14x, median
    /// 0.96x (16 rows 0.63-0.76x; bf16 `softmax` [300, 2^20] 1.14x). Under Nsight Compute
    /// (`ncu --metrics dram__bytes_read.sum,...`, f32 `layer_norm` [64, 2^20], with
    /// [`wave_clusters_of_16`](Self::wave_clusters_of_16) and the hints) the kernel read 405 MB
    /// from DRAM where the defaults read 535 (the tensor is 268 MB: the last pass found 42% of
    /// it in L2, not 0%), but ran at 46% of the DRAM's peak where the defaults ran at 67%, one
    /// block of 16 warps an SM keeping too few loads in flight: 353 -> 418 us.
    streamed_split_waves = false,
        "Streamed rows are split over clusters of 8 blocks however many the rows, one block an SM, so that L2 holds more of each slice between its passes (KernelVariants::streamed_split_waves).";
    /// With [`streamed_split_waves`](Self::streamed_split_waves), clusters of up to 16 blocks,
    /// not 8: CUDA's non-portable cluster size, which Hopper runs where a kernel opts in
    /// (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`, set on the kernels that take
    /// it), the slices half as long, and so the bytes in flight between a slice's passes
    /// (f32 `layer_norm` [64, 2^20]: 32 MiB, under the 50 MiB of L2). Where the GPU cannot run
    /// such clusters at once, the kernel is generated unsplit, as
    /// [`split_rows`](Self::split_rows)' are. Alone it changes nothing.
    ///
    /// Off by default: on an H100 (2026-12-08, the same 16 cases, with
    /// [`streamed_split_waves`](Self::streamed_split_waves) against the defaults) 0.70x to
    /// 1.02x, median 0.84x.
    wave_clusters_of_16 = false,
        "With streamed_split_waves, clusters of up to 16 blocks (CUDA's non-portable size), not 8 (KernelVariants::wave_clusters_of_16).";
    /// A thread of a streamed row (too long for a block or a cluster to keep on chip) makes
    /// twice the accesses a round before it uses any (8 of 16 bytes, where it made 4), so that
    /// more of the row's loads are in flight: under Nsight Compute, f32 `layer_norm` [64, 2^20]
    /// ran at 67% of the DRAM's peak with half its warps active (an H100, 2026-12-08). Twice
    /// the registers for the round's values; the rounds, and so the blocks a split row takes
    /// ([`split_rows`](Self::split_rows)), half as many.
    ///
    /// Off by default: on an H100 (2026-12-08, `gpu_sweep f32,bf16 layer_norm,softmax
    /// 64x1048576,16x1048576,132x700001,300x1048576 --variant=deeper_streamed_rounds`, 16 cases)
    /// 0.63x to 1.07x, median 1.00x: f32 over [64, 2^20] 1.04-1.07x (`layer_norm` 1,554 -> 1,612
    /// GB/s), but 16 rows 0.63-0.79x in f32 `layer_norm` and in bf16, and bf16 `layer_norm`
    /// 0.88-0.93x (16-bit rounds of 8 accesses hold 64 values a thread).
    deeper_streamed_rounds = false,
        "A streamed row's thread makes twice the accesses a round before using any, more loads in flight (KernelVariants::deeper_streamed_rounds).";
}

impl Default for KernelVariants {
    /// The variants measured faster: `fast_exp2`, `streaming_rows`, `keep_in_l2`,
    /// `batched_rows`, `async_row_copies`, `split_rows`, `split_reductions`, `tiled_rows`,
    /// `pipelined_tiles`, `wide_tiles`, `tile_occupancy`, `overlapped_first_pass`,
    /// `split_row_fills`, `two_register_blocks`, `clustered_rows`, `one_pass_moments` and
    /// `long_rows_as_read`.
    fn default() -> Self {
        Self::from_flags(Self::DEFAULTS)
    }
}

impl KernelVariants {
    /// Every variant off: the kernels before any variant.
    pub const NONE: Self = Self::from_flags([false; COUNT]);

    /// Every variant on.
    pub const ALL: Self = Self::from_flags([true; COUNT]);

    /// Each variant alone, with its name (its option's, past `cuda.`).
    pub const EACH: [(&'static str, Self); COUNT] = {
        let mut each = [("", Self::NONE); COUNT];
        let mut i = 0;
        while i < COUNT {
            let mut flags = [false; COUNT];
            flags[i] = true;
            each[i] = (Self::NAMES[i], Self::from_flags(flags));
            i += 1;
        }
        each
    };

    /// These variants with the one named `name` (as in [`EACH`](Self::EACH)) flipped, or
    /// `None` for a name `EACH` lacks.
    ///
    /// ```
    /// use boundscope::executors::cuda::KernelVariants;
    /// let without = KernelVariants::default().flipped("fast_exp2").unwrap();
    /// assert!(!without.fast_exp2 && without.streaming_rows);
    /// assert_eq!(KernelVariants::NONE.flipped("int32_row_columns"), Some(KernelVariants::EACH[1].1));
    /// assert_eq!(KernelVariants::NONE.flipped("fast_exp"), None);
    /// ```
    pub fn flipped(self, name: &str) -> Option<Self> {
        let (_, one) = Self::EACH.iter().find(|(n, _)| *n == name)?;
        let (mut flags, one) = (self.flags(), one.flags());
        for (flag, one) in flags.iter_mut().zip(one) {
            *flag ^= one;
        }
        Some(Self::from_flags(flags))
    }

    /// These variants with no kernel's rows split over thread-block clusters (`split_rows`,
    /// `split_reductions` and `clustered_rows` off): what the executors generate where the GPU
    /// cannot run a kernel's clusters at once.
    #[cfg(feature = "cuda")]
    pub(crate) fn unsplit(self) -> Self {
        Self { split_rows: false, split_reductions: false, clustered_rows: false, ..self }
    }

    /// The variants `options` choose (`cuda.*`).
    ///
    /// # Errors
    /// [`Error::UnknownOption`](crate::Error::UnknownOption) if `options` lack the CUDA
    /// executors' specs ([`CUDA_OPTIONS`]: [`Options::new`] has them).
    pub fn from_options(options: &Options) -> Result<Self> {
        let mut flags = [false; COUNT];
        for (flag, spec) in flags.iter_mut().zip(CUDA_OPTIONS) {
            *flag = options.bool(spec.name)?;
        }
        Ok(Self::from_flags(flags))
    }

    /// Each option of [`CUDA_OPTIONS`] with the value that gives these variants (for
    /// [`Executor::configured_options`](crate::Executor::configured_options)).
    pub fn configured(&self) -> Vec<(&'static str, OptionValue)> {
        CUDA_OPTIONS.iter().zip(self.flags()).map(|(spec, on)| (spec.name, OptionValue::Bool(on))).collect()
    }
}

/// The variants either side has on.
///
/// ```
/// use boundscope::executors::cuda::KernelVariants;
/// let all = KernelVariants::EACH.iter().fold(KernelVariants::NONE, |all, &(_, one)| all | one);
/// assert_eq!(all, KernelVariants::ALL);
/// assert_eq!(KernelVariants::NONE | KernelVariants::default(), KernelVariants::default());
/// ```
impl std::ops::BitOr for KernelVariants {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        let (mut flags, other) = (self.flags(), other.flags());
        for (flag, other) in flags.iter_mut().zip(other) {
            *flag |= other;
        }
        Self::from_flags(flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_round_trips_and_defaults_to_the_measured_kernels() {
        let options = Options::with_specs(CUDA_OPTIONS);
        assert_eq!(KernelVariants::from_options(&options).unwrap(), KernelVariants::default());
        // Each spec's default is the `Default` impl's.
        for ((spec, (name, value)), (each, _)) in
            CUDA_OPTIONS.iter().zip(KernelVariants::default().configured()).zip(KernelVariants::EACH)
        {
            assert_eq!((spec.name, &spec.default), (name, &value), "{each}");
        }
        // Every variant on, and every variant off (`fast_exp2` and `streaming_rows` away from
        // their defaults), round trip through options.
        for variants in [KernelVariants::ALL, KernelVariants::NONE] {
            let configured = variants.configured();
            assert_eq!(configured.len(), CUDA_OPTIONS.len(), "every spec is configured");
            let mut options = Options::with_specs(CUDA_OPTIONS);
            for (spec, (name, value)) in CUDA_OPTIONS.iter().zip(&configured) {
                assert_eq!(spec.name, *name);
                assert_eq!(spec.audience, Audience::Developer, "{name} is for developers");
                options.set_developer(name, value.clone()).unwrap();
            }
            assert_eq!(KernelVariants::from_options(&options).unwrap(), variants);
        }
        assert!(matches!(
            KernelVariants::from_options(&Options::runtime_only()),
            Err(crate::Error::UnknownOption { .. })
        ));
        // `EACH` names each option once, with its one variant on.
        for ((name, variants), spec) in KernelVariants::EACH.iter().zip(CUDA_OPTIONS) {
            assert_eq!(format!("cuda.{name}"), spec.name);
            let on: Vec<_> = variants.configured().into_iter().filter(|(_, v)| *v == OptionValue::Bool(true)).collect();
            assert_eq!(on, [(spec.name, OptionValue::Bool(true))]);
        }
        assert_eq!(KernelVariants::EACH.len(), CUDA_OPTIONS.len());
    }
}
