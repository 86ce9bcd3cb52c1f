//! The executors layer: the built-in executors. Users' own executors implement
//! [`Executor`](crate::Executor) the same way and sit beside these in a plan's list.
//!
//! # The CPU executors: what a user can rely on
//!
//! - **Vector instructions chosen at run time.** The scalar functions in `executors::math` are
//!   branch-free (`exp`, `log` within 1 ulp, `tanh` within 2 ulps, tested), and every CPU loop over
//!   them is compiled for AVX-512, AVX2 + FMA, SSE4.1 and NEON by `multiversion`, which picks the
//!   widest the processor has once per process. One binary runs everywhere, and every version
//!   gives the same bits (Rust never fuses `a * b + c` on its own), so a plan's results do not
//!   depend on the machine it runs on.
//! - **All cores, without oversubscription.** Ops and fused regions of at least 2^17 elements are
//!   split into one part per core (never inside a row, so results are bit for bit those of one
//!   thread: tested), on worker threads named `boundscope-cpu-<k>` (in Nsight too). One split op
//!   holds the workers at a time: plans run from several threads wait for them rather than
//!   oversubscribing. Guards and NVTX ranges stay on the calling thread, around the whole op.
//!   `CpuReference::new().threads(n)`, `CpuFusion::new().threads(n)`, or `runtime.cpu_threads` /
//!   `BOUNDSCOPE_CPU_THREADS` in the front end (0 = every core, 1 = the calling thread only).
//! - **Memory.** The unfused plans hold 256 MiB of buffers, the fused ones 64 MiB (their outputs),
//!   plus fusion scratch per thread that runs a part: one block-sized temporary (4 KiB at the
//!   default block of 1,024 elements, plus an 80-byte stagger) per temporary of the largest region
//!   the thread has run, whatever the tensor size (rows longer than a block run in tiles). Steady-
//!   state runs allocate nothing, on any thread (tested).
//! - **16-bit floats and integers.** Tensors hold each dtype's own values; a float kernel written
//!   for `f32` runs on bf16 and f16 views through per-thread `f32` scratch (widened once, the
//!   result rounded once into the output's dtype); moves, casts, gathers, comparisons and `where`
//!   read and write every dtype as it is, so integer ids stay exact.
//!
//! Measured on the 2-core development machine (`cargo bench --bench fusion`, 2026-11-30), large
//! single ops of `CpuReference` on both cores against `threads(1)`: `exp` and `add` over 2^24
//! floats 8.3-9.0 ms against 15.3-17.0 (1.80-1.92x), a 1024^3 `matmul` 52.2-54.0 ms against
//! 94.7-100.7 (1.75-1.91x); fused regions 3.3x and 2.2x faster than the SSE2, one-core code
//! before (commit `b897e02`: 105.1 / 61.1 ms and 53.6 / 23.5 ms unfused / fused), and the
//! dispatch of small ops unchanged by the split (12.6-12.9 us per 1,000 ops against 12.7-12.8).
//!
//! ## CPU executors (`cargo bench --bench fusion`), 2^24 floats, ms per run
//! Medians of 9 interleaved rounds on the 2-core development machine (AVX-512, chosen at run
//! time), side by side. *Hand loop*: one loop of the same function, same instructions and threads.
//! *Stream*: the same bytes moved with no arithmetic (the memory-bandwidth limit). 2026-11-30:
//!
//! | chain | unfused | fused | hand loop | stream | fused / stream (goal <= 1.5) | unfused / fused (goal >= 2) | fused / hand (goal <= 1.3) |
//! | --- | --- | --- | --- | --- | --- | --- | --- |
//! | `x = a*b + 1; y = x*sigmoid(x)` | 46.4-50.4 | 17.6-21.5 | 18.3-24.3 | 13.2-15.7 | 1.18-1.38 | 2.16-2.78 | 0.89-1.02 |
//! | `y = (x - mean) * rstd * w + b`, `[16384, 1024]` | 32.8-34.6 | 10.4-11.0 | 13.4-18.3 | 9.7-10.6 | 0.98-1.12 | 3.13-3.18 | 0.57-0.81 |
//!
//! All goals met in each run (single large ops on both cores run 1.75-1.92x faster than on one;
//! how the CPU executors work, and those figures: the rustdoc of `executors`).
//!
//! ## Against PyTorch on 2 cores (`examples/cpu_bench.rs`)
//! 2026-12-04, on a development machine with an AMD EPYC (AVX-512), after the map dispatch
//! (`Kernel::as_map`): five interleaved rounds, PyTorch 2.15's time over ours, the median
//! (range) of the rounds' ratios (goal >= 1.0; the chain >= 2.0 against `torch.compile`). The
//! machine was busy: single rounds range widely. Earlier the same day, after the three-pass
//! `softmax`, `sigmoid` through `exp_fused` and the narrow steps of the run loop, five rounds gave
//! 1.10-1.22x for the products, 1.37x for the quickstart block, 1.18x for GPT-2's MLP,
//! 1.23-1.30x for `softmax`, 1.23-1.68x for `layer_norm` and 1.98x (1.75-2.61) for the chain.
//!
//! | workload | boundscope ms | PyTorch ms | ratio |
//! | --- | --- | --- | --- |
//! | `matmul` `[1024]^3` | 12.0 | 12.4 | 1.08x (0.93-1.56) |
//! | `matmul` `[64, 256] x [256, 256]` | 0.055 | 0.061 | 1.10x (0.92-1.15) |
//! | `matmul` `[512, 768] x [768, 3072]` | 13.9 | 14.6 | 1.06x (0.96-1.22) |
//! | the quickstart block (`[64, 256]`, hidden 256) | 0.124 | 0.186 | 1.41x (1.25-1.64) |
//! | GPT-2's MLP, `linear, gelu, linear` at `[512, 768]`, hidden 3072 | 25.7 | 29.3 | 1.12x (1.08-1.29) |
//! | `softmax` over 512 rows of 768 / 1,024 / 2,048 / 4,096 | 0.118-0.539 | 0.122-0.672 | 1.14x / 1.26x / 1.24x / 1.29x |
//! | `layer_norm` with weight and bias, the same rows | 0.057-0.316 | 0.067-0.442 | 1.17x / 1.27x / 1.30x / 1.42x |
//! | swish chain `x = a * b + 1; x * sigmoid(x)`, 2^24 values (13.6 GB/s) | 14.8 | compile 32.4, eager 104 | 2.19x (1.69-2.75) |
//!
//! Before, 2026-12-02 (commit `0884a88`, before the grid split below), through `Plan`
//! (CpuFusion and the CPU reference), side by side with PyTorch 2.15 on the same 2 cores
//! (eager; `torch.compile` for the chain), on a development machine with an Intel Xeon with
//! AVX-512. Products run register
//! blocks written per instruction set (12 x 32 on AVX-512, 6 x 16 on AVX2;
//! `cpu_reference/products.rs`), rows run whole with their sums and maxima in AVX-512 registers
//! (`cpu_reference/row_kernels.rs`). The machine is shared and noisy: five interleaved rounds,
//! the median time of each side and the median (range) of the rounds' ratios, PyTorch's time
//! over ours (goal >= 1.0; the chain >= 2.0 against `torch.compile`):
//!
//! | workload | boundscope ms | PyTorch ms | ratio |
//! | --- | --- | --- | --- |
//! | `matmul` `[1024]^3` | 12.8 | 11.3 | 0.88x (0.77-1.16) |
//! | `matmul` `[64, 256] x [256, 256]` | 0.067 | 0.057 | 0.94x (0.50-1.14) |
//! | `matmul` `[512, 768] x [768, 3072]` | 15.6 | 12.8 | 0.79x (0.74-1.04) |
//! | the quickstart block (`[64, 256]`, hidden 256) | 0.201 | 0.238 | 1.13x (0.95-1.35) |
//! | GPT-2's MLP, `linear, gelu, linear` at `[512, 768]`, hidden 3072 | 34.2 | 29.6 | 0.89x (0.68-0.95) |
//! | `softmax` over 512 rows of 768 / 1,024 / 2,048 / 4,096 | 0.242-1.126 | 0.206-1.137 | 0.87x / 0.91x / 0.96x / 0.99x |
//! | `layer_norm` with weight and bias, the same rows | 0.120-0.677 | 0.127-0.730 | 1.02x / 0.90x / 1.00x / 1.07x |
//! | swish chain `x = a * b + 1; x * sigmoid(x)`, 2^24 values (8.7 GB/s) | 23.1 | compile 36.7, eager 113 | 1.59x (1.45-1.82) |
//!
//! ## Against PyTorch on 16 cores (`examples/cpu_bench.rs`)
//! Single-threaded, the AVX-512 product runs at MKL's speed (about 100-110 GFLOP/s at `[1024]^3` on
//! both sides). On the GPU machine's 16 cores (Intel Xeon, AVX-512, quieter than the 2-core
//! development machine; three rounds, 2026-12-03, products split as a grid of row and column
//! parts), PyTorch 2.15 eager's time over ours: `matmul` `[1024]^3` 1.83 ms against 1.80 (0.92x),
//! `[64, 256] x [256, 256]` 0.92x, `[512, 768] x [768, 3072]` 0.90x, the quickstart block 1.05x,
//! GPT-2's MLP 0.92x, `layer_norm` 1.02-1.24x, `softmax` 0.73-1.05x, the swish chain 2.43x
//! `torch.compile` (two rounds, before the grid). Again on 2026-12-04 (three rounds, PyTorch
//! 2.11, after this stop's changes): products 0.76x / 0.93x / 0.91x (`[64, 256] x [256, 256]`,
//! `[1024]^3`, `[512, 768] x [768, 3072]`), the quickstart block 1.02x, GPT-2's MLP 0.85x,
//! `softmax` 0.78x / 0.84x / 0.96x / 1.24x and `layer_norm` 0.83x / 0.98x / 1.42x / 1.19x over
//! rows of 768 / 1,024 / 2,048 / 4,096 (the short ones are 30-45 us ops split over 16 threads),
//! the swish chain 2.98x `torch.compile`.

mod cpu_fusion;
pub(crate) mod cpu_reference;
pub mod cuda;
pub(crate) mod host_buffers;
pub(crate) mod worker_pool;

pub use cpu_fusion::{
    scratch_bytes as cpu_fusion_scratch_bytes, CpuFusion, FusedRegion, CPU_FUSION_OPTIONS, DEFAULT_BLOCK,
};
pub use cpu_reference::{math, CpuReference};
