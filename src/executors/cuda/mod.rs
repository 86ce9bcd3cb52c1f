//! CUDA executors: [`CudaFusion`] (one generated kernel per fused region, with its own NVTX
//! range per region) and [`CudaOps`] (a generated kernel per elementwise prim, last-axis
//! reduction, cast or shape op, cuBLASLt for `matmul` and `linear`, a row kernel each for
//! `softmax` and `layer_norm`) on a [`CudaDevice`], in `f32`, bf16 and f16; users' own kernels
//! ([`CudaKernel`], made a plan's kernel by [`device_kernel`]); run-time availability; the CUDA
//! C generator.
//!
//! The crate builds everywhere: `cudarc` loads the driver dynamically, and everything here
//! checks for the driver library and a device before touching the API (cudarc's loader panics
//! when the library is missing). With no driver or no device, CUDA is reported unavailable and
//! the CPU executors run everything.
//!
//! ```no_run
//! # #[cfg(feature = "cuda")] {
//! use std::sync::Arc;
//! use boundscope::executors::cuda::{CudaDevice, CudaFusion, CudaOps};
//! use boundscope::executors::CpuReference;
//! use boundscope::Executor;
//! let gpu = CudaDevice::new()?; // Err(ExecutorUnavailable) without a driver or a device
//! let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()));
//! let executors = [fusion, Arc::new(CudaOps::new(gpu)), CpuReference::shared()];
//! // FuseRegions::new(executors[0].clone()) makes `CudaFusion<N>` regions; Plan::compile(&trace,
//! // &executors) runs them on the GPU, inserting uploads and downloads where needed.
//! # }
//! # Ok::<(), boundscope::Error>(())
//! ```
//!
//! Device-resident plans: inputs uploaded once, runs that transfer nothing, and a graph
//! captured once and replayed as one launch (it needs a GPU, so the doctest compiles it only):
//!
//! ```no_run
//! # #[cfg(feature = "cuda")] {
//! use std::sync::Arc;
//! use boundscope::executors::cuda::{CudaDevice, CudaFusion, CudaOps};
//! use boundscope::passes::{FuseRegions, Pass};
//! use boundscope::{Arena, Device, DeviceTensor, Executor, Plan, Registry, RunInput, Tensor, TraceBuilder};
//!
//! let gpu = CudaDevice::new()?; // the process's one handle of GPU 0, the front end's too
//! let registry = Registry::with_builtins();
//! let arena = Arena::new();
//! let mut b = TraceBuilder::new(&arena, &registry);
//! let x = b.input(&[64, 256])?;
//! let w = b.input(&[256, 256])?;
//! let h = b.linear(x, w, None)?;
//! let y = b.gelu(h)?;
//! b.output(y)?;
//! let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()));
//! let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(gpu.clone()));
//! // Decomposed except what CudaOps runs better whole (`linear`: one cuBLASLt product).
//! let prims = boundscope::passes::Pipeline::for_executors(&[ops.clone()]).run(&b.finish()?, &arena)?;
//! let fused = FuseRegions::new(fusion.clone()).run(&prims, &arena)?;
//! let plan = Plan::compile(&fused, &[fusion, ops])?;
//! let device: Arc<dyn Device> = gpu.clone();
//! let weight = DeviceTensor::upload(&device, Tensor::zeros(&[256, 256]).view())?; // bound once
//! let batch = DeviceTensor::upload(&device, Tensor::zeros(&[64, 256]).view())?;
//! let mut workspace = plan.workspace()?;
//! let outputs = plan.run_on_device(&mut workspace, &[RunInput::from(&batch), RunInput::from(&weight)])?;
//! let y = outputs.to_host(0)?; // the one transfer: it waits for the device
//! assert_eq!(gpu.transfers(), 3); // in this program: two uploads, one download, none by the run
//! // Captured once, replayed as one launch: the graph borrows its input tensors; new data goes
//! // into them in place.
//! let (mut batch, mut weight) = (batch, weight);
//! let mut graph_workspace = plan.workspace()?;
//! let mut graph = plan.capture(&mut graph_workspace, vec![&mut batch, &mut weight])?;
//! assert_eq!(graph.replay()?.to_host(0)?, y);
//! graph.input_mut(0).unwrap().copy_from_host(Tensor::zeros(&[64, 256]).view())?;
//! graph.replay()?;
//! # }
//! # Ok::<(), boundscope::Error>(())
//! ```
//!
//! [`CudaEventTimer`] is a guard that measures device time per op or region with pooled CUDA
//! events.
//!
//! # What runs where
//!
//! Every built-in prim runs on the device (`CudaOps`: elementwise prims, last-axis `sum`/`max`,
//! `reshape`, `transpose` and `broadcast_to` as generated kernels, `matmul` through cuBLASLt),
//! and `CudaOps` runs these composites whole where the pipeline keeps them
//! (`Pipeline::for_executors`, `passes::DecomposeFor`, `Executor::prefers_whole`; the front end
//! does this by itself): `linear`, `softmax`, `layer_norm`, and `linear_gelu`, which
//! `passes::FoldEpilogues` makes of a `linear` whose only reader is the `gelu` right after it (one
//! cuBLASLt product with GELU in its epilogue; other executors get the two ops back, unchanged;
//! a trace with per-op guards is not folded). `scaled_dot_product_attention` runs whole too: in
//! bf16 and f16 as one cuDNN fused-attention kernel, where [`fused_attention`] finds cuDNN 9
//! (and its heuristic an engine for the shape); otherwise (f32 included) as a generated
//! flash-attention kernel for heads up to 64, whose f32 products run on tensor cores as split
//! TF32 ("3xTF32", f32's accuracy) on GPUs that have them and head sizes that 8 divides;
//! beyond that it is decomposed. `qkv_attention`
//! (which `passes::PackAttention` makes of the split, views and attention a model writes over a
//! fused q/k/v projection) runs the same ways, reading q, k and v in place in the projection and
//! writing the heads side by side; its backward runs in 16 bits as cuDNN's and in f32 as a
//! generated flash-attention backward (heads a multiple of 16 up to 64), writing dq, dk and
//! dv in the projection's layout; `scaled_dot_product_attention_backward` runs the same ways. A
//! plan of the quickstart's MLP block with device inputs makes no transfer per run
//! (`proptests/cuda_matches_reference.rs` checks the listing and `CudaDevice::transfers`). Host
//! inputs still work: the plan uploads them, as steps its listing shows. An input given on another
//! device, or that a host step of the plan reads, is a typed error (`Error::InputPlacement`),
//! never a silent copy. On the H200, `proptests/cuda_matches_reference.rs` ran 128 random programs
//! through CUDA plans (each run's NVTX capture equal to its range map, with the application's
//! ranges in a second domain), the quickstart's block host-resident and device-resident, NaN
//! propagation and the launch-time buffer checks: all pass. Build it here with
//! `cargo test --release --no-run` and run the binary there; elsewhere it prints SKIPPED with the
//! reason. The front end picks the GPU by itself (`runtime.device=auto`; `cpu`; `cuda` to require
//! one) and shares its handle: `CudaDevice::new()` (and `with_ordinal(n)`) returns the process's
//! one handle of a GPU, which `ProfiledSession::device` also gives, so tensors uploaded through
//! either run in the other's plans. Without a driver or a device, `executors::cuda::availability()` says why and everything
//! runs on the CPU. `executors::cuda::CudaEventTimer` is a guard that reports device time per op
//! or region from pooled CUDA events. A graph replay runs the captured device work only: the
//! plan's run-level guards surround each replay, per-op and per-region guards do not run in it
//! (`PlanGraph::range_map` lists what a replay pushes); profile in stream mode to see each op.
//! Each workspace queues its runs on a CUDA stream of its own, ordered by events after the device's
//! own stream when a run starts (for the uploads of its inputs; only when work was queued there
//! since the workspace's last run) and before it after the run (for downloads, frees, later
//! inputs and other workspaces' runs; the device's stream waits before its next work), so
//! runs of one plan from several threads, each in its own workspace, may overlap on the GPU (`proptests/cuda_matches_reference.rs` checks that four
//! threads each get their own result). For the quickstart block, stream runs from four threads at once gave 88 to 94 us per run
//! against 66 to 83 us from one: the host's launches bound them, no gain there. Graph replays,
//! which cost the host little, do overlap: four threads, each replaying its own graph in its own
//! workspace, ran 16.4 us per run (in two runs) against 33.2 us for replays from one thread.
//! Nsight shows the runtime's streams and threads by name: the device's stream is
//! `boundscope cuda:0`, each workspace's `boundscope workspace <n>` (`nvtxNameCuStreamA`), and the
//! threads that fill staging buffers are the CPU workers `boundscope-cpu-<k>` (`nvtxNameOsThreadA`);
//! `proptests/cuda_matches_reference.rs` checks the names through an in-process NVTX tool. Runs on
//! the CUDA executors allocate nothing on the host after the first, with device-resident inputs and
//! with host tensors in and out (`proptests/steady_state_runs_allocate_nothing.rs`, run on the
//! H200): generated kernels are launched with their arguments on the stack.
//!
//! Reproduce:
//! ```sh
//! cargo bench --bench dispatch --bench trace_build --bench guards --bench fusion
//! ```
//!
//! # 16-bit values
//!
//! On the GPU, 16-bit values live two per device word (`DeviceTensor::upload` of a bf16 tensor
//! packs them; `to_host` unpacks; a plan's transfers of 16-bit values do the same, through a buffer
//! the workspace keeps). `CudaFusion` regions and `CudaOps` kernels read bf16 and f16 operands with
//! 16-byte vector loads (eight values per thread; an `f32` operand as two `float4`s), compute in
//! `f32` registers and round only what they write (to bf16 with PTX's `cvt` on GPUs of compute
//! capability 8.0 and newer, for which the kernels are compiled; by hand before); `matmul` and `linear` go through cuBLASLt with
//! bf16 or f16 operands and `f32` accumulation (operands of one dtype; cast mixed ones first); and
//! `softmax` and `layer_norm` run whole, laid out by row length, in `f32`, rounding only the result (as
//! PyTorch's fused kernels do); shape ops move 16-bit values as they are. So every built-in runs on
//! the GPU in every dtype. `proptests/cuda_matches_reference.rs` checks, on the H200, bf16 and f16
//! plans against the CPU executors that round at the same points (within one unit in the last
//! place; two for products), the row kernels against the `f32` result rounded once, casts, shape
//! ops and transfers exactly.
//!
//! # Kernel variants
//!
//! Changes to the generated kernels come as variants ([`KernelVariants`]), chosen by developer
//! options (`cuda.fast_exp2`, `cuda.int32_row_columns`, `cuda.streaming_rows`, `cuda.keep_in_l2`,
//! `cuda.batched_rows`, `cuda.async_row_copies`, `cuda.split_rows`, `cuda.split_reductions`,
//! `cuda.tiled_rows`, `cuda.pipelined_tiles`, `cuda.wide_tiles`, `cuda.tile_occupancy`,
//! `cuda.pipelined_passes`, `cuda.overlapped_first_pass`, `cuda.split_row_fills`,
//! `cuda.two_register_blocks`, `cuda.clustered_rows`, `cuda.one_pass_moments`,
//! `cuda.long_rows_as_read`, `cuda.vector_tile_values`, `cuda.streamed_last_pass_hints`,
//! `cuda.streamed_split_waves`, `cuda.wave_clusters_of_16`, `cuda.deeper_streamed_rounds`;
//! [`CUDA_OPTIONS`]): `CudaFusion::with_variants`, `CudaOps::with_variants`, or `from_options`,
//! which the front end calls. A plan whose kernels differ from the defaults lists its variants
//! in its header. `scripts/gpu-variants` runs the GPU tests with the defaults, every variant and
//! none; times each variant flipped from the defaults, case by case, on the sweep; and times GPT-2
//! with the defaults, without `fast_exp2` and `streaming_rows`, with `int32_row_columns`,
//! without `keep_in_l2` and without `batched_rows`: a variant is on by default where it
//! measures faster (`fast_exp2`, `streaming_rows`, `keep_in_l2`, `batched_rows`,
//! `async_row_copies`, `split_rows`, `split_reductions`, `tiled_rows`, `pipelined_tiles`,
//! `wide_tiles`, `tile_occupancy`, `overlapped_first_pass`, `split_row_fills`,
//! `two_register_blocks`, `clustered_rows`, `one_pass_moments` and `long_rows_as_read` are).
//! `scripts/kernel-sass OP DTYPE ROWSxCOLS [VARIANTS]` shows a row kernel's source, registers,
//! spills and SASS as generated for Hopper, without a GPU (`ptxas` and `nvdisasm` from PyPI):
//! where a variant starts.
//!
//! # Measured on an NVIDIA H200
//!
//! Everything through `Plan`, as a user's program runs it, inputs uploaded once as `DeviceTensor`s,
//! side by side with PyTorch 2.11 in one run (2026-11-30 to 2026-12-05; the README says how to
//! reproduce each):
//!
//! | workload | boundscope | PyTorch | goal |
//! | --- | --- | --- | --- |
//! | swish chain `x = a*b + 1; y = x*sigmoid(x)`, 2^28 f32 | 4372 GB/s, 103% of the copy | `torch.compile` 4279 GB/s | met, 1.02x |
//! | norm chain `(x - mean) * rstd * w + b`, 2^28 f32 | 4179 GB/s, 98% of the copy | `torch.compile` 4028 GB/s | met, 1.04x |
//! | the same chains in bf16, 2^28 | 4285 / 3773 GB/s, 102% / 90% of the copy | `torch.compile` 2990 / 3459 | met, 1.43x / 1.09x |
//! | the quickstart block, graph replays | 20.9 us per run, 4.7 us of host time | PyTorch CUDA graph 23.8 us | met |
//! | transformer MLP block, [8192, 4096], f32 | 43.06 ms | `torch.compile` 43.23 ms | met, 1.004x |
//! | the same in bf16 | 2.905 ms | `torch.compile` 2.946 ms | met, 1.01x |
//! | matmul 8192^3, bf16 | 808 TFLOP/s | `torch.matmul` 796 | met, 1.02x |
//! | swish chain 2^24 with host tensors in and out | 5.5 ms (36.5 GB/s; uploads 42-45 GB/s) | | 1.5x the code before |
//! | attention's products at GPT-2's shapes (`q k^T`, `p v`, `x w`; batch 8, 12 heads, 1,024 tokens), f32 / bf16 | 32-47 / 186-653 TFLOP/s | best of eager and `torch.compile` | met, 0.99-1.02x |
//! | `slice`, `permute`, `concat` copies at those shapes, f32 / bf16 | 0.016, 0.016, 0.031 / 0.008, 0.009, 0.016 ms | eager 0.024, 0.023, 0.029 / 0.022, 0.020, 0.015 ms; on 2026-12-04, with `concat`'s vectors streamed (`__ldcs`/`__stcs`): 0.014, 0.014, 0.027 / 0.006, 0.006, 0.013 ms against eager 0.020, 0.022, 0.028 / 0.012, 0.018, 0.014 and `torch.compile` 0.037, 0.033, 0.064 / 0.050, 0.034, 0.054 | met: 1.41x, 1.53x, 1.06x / 2.11x, 2.82x, 1.04x the faster PyTorch (concat 0.90-0.94x before) |
//! | `embedding` of GPT-2's table, ids checked on the device, f32 / bf16 | 0.034 / 0.024-0.029 ms | `torch.compile` 0.035-0.050 / 0.036-0.070 (eager 0.015-0.023) | met against `torch.compile` (1.03x-2.4x); eager 0.4-0.8x |
//! | causal attention, bf16, whole through cuDNN (one kernel; was 1.58 ms decomposed) | 0.047 ms, 272 TFLOP/s (2026-12-04, two runs); 0.049 ms before | `scaled_dot_product_attention` (cuDNN) 0.047-0.048 ms | met: 1.00x (0.96-0.97x before) |
//! | causal attention, f32, the generated flash-attention kernel (was 1.53 ms decomposed) | 0.465 ms, 27.7 TFLOP/s (2026-12-04: both products on tensor cores as 3xTF32, 3 blocks of 4 warps per multiprocessor at 168 registers); 0.687 ms with 2 blocks at 214 registers and 4-byte loads; 0.608-0.640 ms on CUDA cores before | `scaled_dot_product_attention` (memory-efficient kernel, itself 3xTF32) 0.485-0.488 ms | met: 1.04x (0.76-0.80x on CUDA cores) |
//! | attention at other shapes (2026-12-04, `transformer_ops_bench attention_sweep` beside `torch_transformer_ops.py attention_sweep eager`, one run; batch 8, 12 heads), f32 / bf16, ms: 256 tokens causal, head 64 | 0.048 / 0.011 | SDPA 0.055 / 0.019 | 1.15x / 1.70x |
//! | 512 / 2,048 / 4,096 tokens causal, head 64 | f32 0.156 / 1.577 / 5.739; bf16 0.020 / 0.138 / 0.447 | f32 0.159 / 1.663 / 6.101; bf16 0.020 / 0.141 / 0.483 | f32 1.02-1.06x; bf16 0.98-1.08x |
//! | 1,024 tokens causal, heads of 16 / 32 / 48 | f32 0.191 / 0.274 / 0.390; bf16 0.047 each | f32 0.416 / 0.416 / 0.485; bf16 0.047 each | f32 2.18x / 1.52x / 1.24x; bf16 1.00-1.01x |
//! | 1,024 / 4,096 tokens, full (not causal), head 64 | f32 0.702 / 10.278; bf16 0.061 / 0.791 | f32 0.765 / 11.632; bf16 0.064 / 0.864 | f32 1.09x / 1.13x; bf16 1.05x / 1.09x |
//! | causal attention's forward and backward (`attention_training`: the forward, and `scaled_dot_product_attention_backward` from the result's gradient; 2026-12-03), bf16 (cuDNN: the backward runs the forward again for its statistics) / f32 (the generated kernels: the statistics pass, then the backward) | 0.249 ms / 2.353 ms (19.2 TFLOP/s counting the backward as 2.5 forwards) | `scaled_dot_product_attention` and `torch.autograd.grad`, best of eager and compile: 0.204 / 1.682 ms; on 2026-12-04, with the f32 forward on tensor cores: 0.250 / 2.214 ms against 0.254 / 1.683 | 1.01x / 0.76x on 2026-12-04 (f32 not met: its backward runs on CUDA cores); before 0.82x / 0.71x (a variant reading both operands 16 bytes at a time took 2.465 ms: its registers left 2 blocks per multiprocessor) |
//! | `cross_entropy` over [8192, 50257], one row kernel (16-byte loads) and a mean, f32 / bf16 | 0.425-0.433 / 0.288 ms | `torch.compile` 0.625-0.629 / eager 0.566-0.568 | met, 1.44-1.48x / 1.97x |
//! | `softmax` over [16384, 1024], f32 / bf16 (one kernel laid out by row length; was 2439 / 1579 GB/s) | 3623 / 2893 GB/s, 93% / 80% of a copy | best of eager and `torch.compile` 3531 / 2016 | met, 1.03x / 1.44x |
//! | the sweep of memory-bound ops (`examples/gpu_sweep.rs`, 2026-12-04): `softmax`, `layer_norm`, `sum`, `max` over rows of 32 to 65,536 (768, 3,072 and 50,257 among them) at 2^24 values, and at 2^22 and 2^28; `gelu(x * scale + bias)` broadcast along the last and the first axis; f32, bf16 and f16: 204 cases since broadcast chains at six row lengths joined (180 before) | with the default variants (2026-12-05, one run per dtype, `gpu_sweep DTYPE` beside `torch_gpu_sweep.py`): median 1.78x the faster of eager and `torch.compile` (bf16 1.95x, f16 1.99x, f32 1.31x), 0.99x the least, 12 cases at 0.99-1.00x (rows of 1,024 at 2^28 values in `softmax` and `layer_norm`, `sum`/`max` of rows of 65,536 at 2^28, f32 `bcast_first` [1335, 50257]: both sides at 99-108% of a copy); median 103% of a copy, least 47% (16-bit `layer_norm` [333, 50257]), 36 cases under 85% (rows of 50,257 and 65,536, cases of 2^22 values, 16-bit `sum`/`max` over rows of 32 and 128), in each of which PyTorch's faster path is further from the copy (12-79%; 29% for that `layer_norm`). `ncu` over [333, 50257] bf16 (its cache flush and clocks, so not the sweep's times): `layer_norm` 52.1 us, 55 registers a thread, one block of 1,024 an SM (45% of warps active), 17% of the DRAM's bandwidth, against PyTorch's `LayerNormForwardCUDAKernel` 93.5 us (blocks of 256, 11%); `softmax` 33.7 us, 32 registers, two blocks an SM (84% of warps active), 28%, against `cunn_SoftMaxForward` 49.9 us (18%). Before the variants: median 1.70x the faster of eager and `torch.compile` (0.98x the least), median 100% of a copy of the same bytes (least 46%; 32 cases under 85%, 30 of them at 84% or less), after broadcasts read per vector where rows straddle vectors, 16-bit `gelu` on `exp2`, grouped short-row reductions and 16-bit `layer_norm`'s launch bounds (2026-12-04, last run; the run before it: 1.79x (0.98x), 99% (least 40%; 42 under 85%), after the one-instruction maximum and 16-bit `softmax` rows kept as read; before that: 1.44x (0.96x), 97%, `torch.compile`'s own figures moving by up to 2x between runs); with 180 cases: 1.55x (0.98x), 98%, after `layer_norm` kept 16-bit rows in shared memory as read (2026-12-04, later run); before it: 1.44x (0.91x), 98%; 2026-12-03: 1.54x (0.71x), 98%; before: 1.35x (0.68x), 89% | best of eager and `torch.compile`, per case | on an H100 with the seven default variants (2026-12-06, one run per dtype, all 204 cases): least 0.99x (f16 `sum` [4096, 4096], both sides near a copy), median 1.20x (f32), 1.75x (bf16) and 1.75x (f16); median 104-105% of a copy, 11 cases under 85% (`softmax` and `layer_norm` over [333, 50257] and [256, 65536], f16 `softmax` [131072, 32] at 85%), least 57% (bf16 `layer_norm` [333, 50257]; `ncu`: 26% of the DRAM's throughput, 42% of the SMs'); few long rows (the four ops over [16, 2^20], [64, 262144], [9, 200003] and [333, 50257], 48 cases) least 1.03x, median 1.82x, 38-155% of a copy; on an H100 with `keep_in_l2` bounded by the inputs too (half of L2; 2026-12-05, last, bf16 and f16, one run each, which moves the medians by several percent between runs of one build; bf16 `sum` [4096, 1024], which left the cases under 85%, is one the bound leaves alone): least 1.00x, median 1.76x (bf16) and 1.62x (f16), 7 of the 136 cases under 85% of a copy (`softmax` and `layer_norm` over 333 rows of 50,257, `layer_norm` over 256 of 65,536 at 82%, f16 `softmax` [131072, 32] at 83%), least 57% (bf16 `layer_norm` [333, 50257]); the bound, built each side and run in turn three times: 16-bit `sum`/`max` over 2^24 values 1.04-1.09x over rows of 512 to 16,384 (24 cases), 0.89-0.94x over [256, 65536] (which had gained from being kept), 0.97-1.00x over rows of 50,257, 0.90-0.97x over rows of 32 and 128 where the variants sweep had read them 0.95-1.00x kept (the runs in turn read cases the bound leaves alone up to 1.20x apart); before it, with the four default variants (`batched_rows` too; 2026-12-05, last, bf16 and f16, one run each; `f32` kernels are not batched): least 1.00x (`sum`/`max` over [4096, 65536], both sides at 105% of a copy), median 1.79x (bf16) and 1.72x (f16), 16-bit `gelu(x * scale + bias)` over [8192, 8192] 1.01-1.05x at 97-98% of a copy; 8 of the 136 cases under 85% of a copy (`softmax` and `layer_norm` over 333 rows of 50,257, `layer_norm` over 256 of 65,536, bf16 `softmax` [131072, 32] and `sum` [4096, 1024] at 83%), least 56% (bf16 `layer_norm` [333, 50257], PyTorch 37%); with the three default variants (`keep_in_l2` too; 2026-12-05, later, one run per dtype, `gpu_sweep DTYPE` beside `torch_gpu_sweep.py`): median 1.54x (f32 1.19x, bf16 1.67x, f16 1.85x), least 0.96x (f16 `bcast_last` [8192, 8192], bf16 0.99x: ours at 92% of a copy there, `torch.compile` at 96-97%; `bcast_first` at that shape 101%), 17 cases at 0.96-1.00x, median 105% of a copy, least 58% (16-bit `layer_norm` [333, 50257]), 11 cases under 85% (`softmax` and `layer_norm` over 333 rows of 50,257 and 256 of 65,536, f16 `softmax` [131072, 32]), in each of which PyTorch's faster path is further (24-63% of a copy); with the two defaults before it, on another H100 earlier that day: median 1.57x, least 0.96x, 8 cases at 0.96-1.00x (`bcast_last` [8192, 8192] in 16 bits, f32 `softmax` [4096, 1024], f32 `layer_norm` [131072, 128] and [32768, 512], `sum`/`max` [262144, 1024] f32, `sum` [4096, 65536] bf16; f16 `sum` [5461, 3072] read 0.54x once, 1.84x and 2.08x in two runs of its own), median 104% of a copy, least 58% (`layer_norm` [333, 50257] bf16), 17 cases under 85% (rows of 50,257 and 65,536, and cases of 2^22 values); on the H200: not met in 14 of 204 cases (last run, as in the run before), all at 0.98-1.00x, where both sides run at a copy's speed (rows of 1,024 at 2^28, rows of 65,536 at 2^28); with 180: 10 cases at 0.98-0.99x (rows of 1,024 at 2^28 in `softmax` and `layer_norm`, `sum`/`max` of rows of 65,536 at 2^28, f32 `softmax` of rows of 128, f16 `softmax` of rows of 50,257); `layer_norm` of rows of 65,536 in 16 bits went 0.92-0.94x -> 1.46-1.47x (2260 -> 3535 GB/s in bf16: its row had taken 224 KB of shared memory as `float`, stalled on it, `ncu`) |
//! | what moved the sweep, one run each (`gpu_sweep`, then `torch_gpu_sweep.py`) | row kernels' accesses addressed as the thread's first column plus a constant, so that the streaming loads take no address register each (2026-12-05, two builds side by side, two rounds: f32 `softmax` [4096, 1024] 3700 -> 4081 GB/s, the other 27 f32 `softmax` and `layer_norm` cases 0.998-1.018x); `streaming_rows` and `fast_exp2` on by default (2026-12-05, `scripts/gpu-variants sweep`: each alone beside the kernels without variants, interleaved, best of three rounds; the two together, and this table's PyTorch ratios with them, not yet measured; the sweep row's 14 cases at 0.98-1.00x may now include 16-bit `sum`/`max` [256, 65536]): streaming hints median 1.03x in f32 and f16, 1.00x in bf16, up to 1.20x (f32 `layer_norm` [4096, 65536]; `layer_norm` 1.04-1.13x at most lengths), 0.92x at worst (f32 `softmax` [1024, 16384]; 16-bit `sum`/`max` [256, 65536] 0.93x, f32 `layer_norm` [4096, 1024] 0.94x); one-instruction `exp2` up to 1.09x in 16-bit `softmax` and `gelu` chains, median 1.00x; 32-bit row columns 0.94-1.08x, median 1.00x, left off; bf16 rounded by PTX's `cvt` (kernels compiled for the GPU's own architecture), not six integer instructions: `layer_norm` [262144, 1024] bf16 3185 -> 4129 GB/s, broadcast chains in bf16 2482 -> 3026; fused reductions read 16 bytes an access in every dtype: `sum` [4096, 65536] bf16 3503 -> 4423; rows of 65,536 kept in shared memory: `softmax` f32 2545 -> 3855 (90% of a copy), bf16 1903 -> 2915; rows of odd lengths read 16 bytes an access, aligned to the tensor: `softmax` [333, 50257] bf16 1371 -> 1682; reductions' loads batched (`ncu`: the compiler had kept two in flight, 44% of the DRAM's bandwidth): `max` [333, 50257] f32 2209 -> 3289; a maximum that keeps a NaN in one instruction (`max.NaN.f32`), 3 rounds: 16-bit `max` median 1.16-1.18x (up to 1.48x), f32 unchanged; 16-bit `softmax` rows kept in shared memory as read, two blocks an SM, 2 rounds: [333, 50257] 1.09x (bf16) / 1.18x (f16), [256, 65536] 1.15-1.16x; 16-bit broadcast rows the vectors straddle read per vector (two aligned accesses and a shift; a per-row value as two values) and 16-bit `gelu` as `x / (1 + exp2(..))`, 2 rounds: broadcast chains 1.05-1.44x (`ncu`, [1335, 50257] bf16: L1 77% busy from values read one by one, then compute-bound on `tanhf` at 80% of the SM's issue), `layer_norm` [333, 50257] 16-bit 1.16-1.17x (its weight and bias read the same way); 16-bit `layer_norm` rows in registers asking for 1,024 threads an SM: [1024, 16384] 1.24-1.34x; 16-bit `sum`/`max` over rows of 32 and 128, four rows a group of lanes: 1.16-1.23x | | |
//! | `layer_norm` over rows of odd lengths, outside the sweep (an H100, 2026-12-06, one run: `gpu_sweep f32,bf16,f16 layer_norm 32768x513,16384x1001,8192x769,4096x3001,1365x12289,65536x257,2048x2049,600x1001`, then `torch_gpu_sweep.py`), every dtype, 24 cases | 436-2584 GB/s, 42-173% of a copy, median 85% (16-bit [2048, 2049] 42-51%, [8192, 769] 60-65%: small tensors, the copy at L2's speed); 1.05-1.72x the build before (columns in 32 bits, 16-bit rows kept as read, the weight and bias staged in shared memory), which ran 16-bit [32768, 513] and [16384, 1001] at 0.77-0.80x `torch.compile` | the faster of eager and `torch.compile`: 1.22x to 4.35x, median 2.30x | met |
//! | `softmax` over rows of odd lengths, outside the sweep (an H100, 2026-12-06, one run: `gpu_sweep f32,bf16,f16 softmax 32768x513,16384x1001,8192x769,65536x257,2048x2049,4096x3001,1365x12289,262144x9,131072x33,65536x100`, then `torch_gpu_sweep.py`), every dtype, 30 cases | 1118-3488 GB/s, 37-104% of a copy, median 89% (rows of 9 to 100 values 37-99%: bound by instructions); 16-bit rows of 257 to 12,289 1.03-1.68x the build before (kept as read in registers with 32-bit columns), which ran 16-bit [32768, 513] and [65536, 257] at 0.93-1.01x `torch.compile` | the faster of eager and `torch.compile`: 0.97x to 3.00x, median 1.31x | not met at f32 [65536, 257] (0.97x, 96% of a copy) and [32768, 513] (0.99x), f16 [65536, 257] (0.98x; 1.14x in another run) |
//! | 16-bit `softmax` over rows kept as read in registers, its maximum over the words as read (an H100, 2026-12-06, `gpu_sweep f16,bf16 softmax 65536x257,32768x513,16384x1001,8192x769,2048x2049,4096x3001,1365x12289,131072x33` with the build before, two rounds) | 1.00-1.13x, median 1.03x over 16 cases; f16 [65536, 257] 2,362 GB/s (90% of a copy, 1.13x; `ncu` before: 63 registers a thread, 50% occupancy, against bf16's 40 and 75%), f16 [1365, 12289] 1.11x | the build before | f16 now at bf16's speed (2,362 / 2,374 GB/s) |
//! | `layer_norm` over long rows of odd lengths, its last pass written once per shift of the row (an H100, 2026-12-06, `gpu_sweep f32,bf16,f16 layer_norm 333x50257,100x65537,255x65537,167x100003,18x200003,9x200003,419x40001,16x1048577,35x100514,2047x8193` with the build before, two rounds) | 1.00-1.13x, median 1.04x over 30 cases (f32 [333, 50257] 1,945 GB/s, 73% of a copy; 1.11-1.13x over [9, 200003] and bf16 [167, 100003]); rows in registers alone and 16-bit [333, 50257] (two blocks an SM) unchanged, 1.00x | the build before | not the goal: [333, 50257] still 65-73% of a copy |
//! | short rows of odd lengths read and written as tiles (`tiled_rows`; an H100, 2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm 262144x9,131072x33,65536x100,65536x150,65536x129,32768x255,4194304x9,1048576x33,524288x100,1048576x5,2097152x3,262144x65 --variant=tiled_rows`, then the same beside `torch_gpu_sweep.py`) | the 44 cases tiled: 1.03-3.97x the kernels without tiles, median 1.36x; 49-100% of a copy, median 70% (bf16 `softmax` [131072, 33] 37% -> 54%) | the faster of eager and `torch.compile` (39 of the 44 cases; PyTorch's script ran out of time on 5 f16 ones): median 1.93x, least 0.90x (16-bit `softmax` [524288, 100], 0.90-0.92x; about 0.81-0.83x without tiles) | not the goal: under 85% of a copy |
//! | short rows of odd lengths read as pipelined tiles, a block copying its next tile with `cp.async` while it runs one (`pipelined_tiles`; an H100, 2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm 262144x9,131072x33,65536x100,65536x150,65536x129,32768x255,4194304x9,1048576x33,524288x100,1048576x5,2097152x3,262144x65 --variant=pipelined_tiles` with every odd row up to 256 values pipelined, one run) | 72 cases: 0.88-1.57x the kernels before, median 1.07x; the 36 that the gate (rows of 17 to 256 values, f32 up to 64) takes: 0.96-1.53x, median 1.17x, 52-91% of a copy (median 79%, 64% before) | not timed beside PyTorch since (16-bit `softmax` [524288, 100], 0.90-0.92x `torch.compile` with plain tiles, ran 1.08-1.09x faster pipelined) | not the goal: 26 of the 36 under 85% of a copy |
//! | 16-bit short rows of odd lengths in tiles of about 8 KB, several rows a thread (`wide_tiles`; the H200, 2026-12-06, `gpu_sweep f32,bf16,f16 softmax,layer_norm 2097152x3,1048576x5,4194304x9,262144x9,1048576x15`, an experiment build whose kernels at 8 KB are the landed ones, against tiles of a row a thread, two rounds) | 16-bit rows of 3 values 1.35-1.40x (bf16 `softmax` [2097152, 3] 41% of a copy before), of 5 values 1.05-1.12x; rows of 9 and 15 unchanged (two a thread would pass 8 KB); tiles of 16 KB 0.90-1.23x, of 4 KB 1.29-1.32x over rows of 3; f32 rows of 3 0.90x (`softmax`) and 1.07x, so f32 rows of 3 keep a row a thread (f32 rows of 1 and 2 take wide tiles since, below) | tiles of a row a thread | not the goal: with them, 16-bit rows of 3 and 5 values run at 2,151-2,815 GB/s, 55-70% of a copy (12-16 MiB tensors, whose copy runs at L2's 3.1-4.8 TB/s) |
//! | f32 rows of 1 and 2 values in wide tiles (an H100, 2026-12-07, `gpu_sweep f32 softmax,layer_norm 8388608x1,4194304x2,16777216x1,2097152x2,1048577x1,524287x2`, an experiment build whose kernels are the landed ones, against a row a thread, two rounds) | rows of 1 1.19-1.49x (`softmax` [8388608, 1] 1666 -> 2148 GB/s, `layer_norm` 1321 -> 1876), rows of 2 0.98-1.19x | tiles of a row a thread | beside PyTorch (the same H100, the run before): [8388608, 1] `softmax` 0.76x -> about 0.98x the faster (eager, 2199 GB/s), `layer_norm` 0.73x -> about 1.04x (`torch.compile`, 1811) |
//! | 16-bit plain tiles compiled for eight blocks an SM (`tile_occupancy`; an H100, 2026-12-07, `gpu_sweep bf16,f16,f32 softmax,layer_norm 8388608x1,4194304x2,4194304x3,2097152x4,2097152x5,2097152x6,2097152x7,2097152x9,1048576x11,1048576x15 --variant=tile_occupancy`, the landed kernels, one run) | 16-bit rows 0.98-1.18x, median 1.05x (rows of 1 to 5 values 1.01-1.18x, bf16 `layer_norm` [2097152, 5] 1889 -> 2229 GB/s); f32 rows, kernels unchanged, 0.99-1.03x | the kernels without it | on by default |
//! | the first pass over rows copied to shared memory taking each access as its copy lands (`overlapped_first_pass`; an H100, 2026-12-07, `gpu_sweep f32,bf16,f16 softmax,layer_norm 4096x16384,1024x16384,2048x32768,333x50257,256x65536,64x65536,8192x12289,128x16384,1335x50257 --variant=overlapped_first_pass`, 54 cases, three rounds) | `softmax` over [333, 50257] 1.03-1.05x in every dtype, 16-bit [256, 65536] 1.03-1.05x, f32 [1335, 50257] 1.04x; the kernels it leaves (rows through registers, `layer_norm` rows with the streaming hints) 0.98-1.02x; median 1.00x. `ncu` on bf16 `layer_norm` [333, 50257] (the defaults, 68% of a copy in the sweep): 45.9 us, 31% of DRAM's throughput, 13.8 M warp instructions (about 26 a value), 1.87 issued a cycle, 41% of warps active, half the stalls on loads (`L1TEX`), 42,624 spill requests; copied to shared memory without the streaming hints it ran 0.89-0.91x in 16 bits (`softmax` over the same rows: 29.5 us, 9.7 M instructions, 45% of DRAM's throughput) | the kernels without it | on by default |
//! | rows kept in shared memory through registers loading their whole accesses in one loop, the partial ones after (`split_row_fills`; an H100, 2026-12-07, `gpu_sweep f32,bf16,f16 layer_norm 333x50257,256x65536,1335x50257,4096x65536,132x50257,2048x32768,4096x16384,1024x16384,9x200003 --variant=split_row_fills`, an experiment build whose kernels are these, 27 cases) | rows of 50,257 1.00-1.07x ([1335, 50257] 1.04-1.07x in every dtype: 75-79% -> 79-84% of a copy), the other kernels (rows 16 bytes divide, streamed rows) 0.99-1.02x; median 1.00x | the kernels without it | on by default |
//! | 16-bit `layer_norm` rows of 16,385 to 32,768 values held by two blocks of 512 an SM, part in shared memory, not one of 1,024 in registers (`two_register_blocks`; an H100, 2026-12-07, `gpu_sweep bf16,f16 layer_norm 4096x20001,3000x17001,2048x30001,2000x24577,2048x32768,4096x24576,8192x16385,1365x32767 --variant=two_register_blocks`, an experiment build whose kernels are these, 16 cases) | 1.00-1.44x, median 1.17x: rows of 16,385 to 20,001 1.30-1.44x (52-60% -> 72-80% of a copy), [4096, 24576] 1.17x (83% -> 97%), [1365, 32767] (kept in shared memory already) 1.00x; each case's results checked against the CPU reference | the kernels without it | on by default |
//! | `layer_norm` rows (any dtype) and f32 `softmax` rows too long for one block kept on chip by a thread-block cluster of up to 8 blocks, a slice each, not streamed (`clustered_rows`; an H100, 2026-12-07, `gpu_sweep f32,bf16 layer_norm 700x65537,64x100003,500x150001 --variant=clustered_rows` and `gpu_sweep bf16,f32 softmax 300x131072,1000x100003 --variant=clustered_rows`, an experiment build whose kernels are these, 10 cases) | f32 `layer_norm` 1.29-1.69x ([700, 65537] 46% -> 78% of a copy), bf16 [500, 150001] 1.49x (39% -> 58%), f32 `softmax` 1.13-1.18x, rows one block keeps 1.00x; 16-bit `softmax` 0.74-0.78x, so it keeps streaming those; each case's results checked against the CPU reference, and `--check-full` over [7, 100003] and [333, 65537] | the kernels without it | on by default |
//! | few rows too long for a block, clusters against the streamed kernels (`clustered_rows`; the H200, 2026-12-07, `gpu_sweep f32 layer_norm,softmax 16x200003,32x131072,16x262144 --variant=clustered_rows` and `gpu_sweep bf16 layer_norm 16x524288,32x262144 --variant=clustered_rows`, with clusters of up to 8, 4 and 6 blocks, 8 cases each) | up to 8 (5 to 8 taken): 0.63-0.95x; up to 4: 0.72-0.93x (bf16 [16, 524288], which 4 blocks do not hold, 0.99x); up to 6: 0.81-1.19x | the streamed kernels | rows fewer than a quarter of the SMs stayed streamed (33 to 63 rows timed in the next row) |
//! | 33 to 64 rows too long for a block, clusters against the streamed kernels (`clustered_rows`; an H100, 2026-12-07, `gpu_sweep f32 layer_norm,softmax 32x131072,40x262144,48x131072,64x100003,64x200003 --variant=clustered_rows` and `gpu_sweep bf16 layer_norm,softmax 16x524288,48x524288,64x262144 --variant=clustered_rows`) | 40 rows 0.84-0.87x, 48 rows 0.66-0.77x, 64 rows 0.81-1.29x (f32 [64, 100003] 1.14-1.17x, f32 `softmax` [64, 200003] 1.29x, bf16 `softmax` [64, 262144] 0.81x); 16 and 32 rows (streamed either way) 0.98-1.01x | the streamed kernels | clusters keep rows only from two fifths of the SMs (53 on 132) |
//! | 56 and 60 rows too long for a block, clusters against the streamed kernels (`clustered_rows`; an H100, 2026-12-08, `gpu_sweep f32 layer_norm,softmax 56x131072,60x200003 --variant=clustered_rows` and `gpu_sweep bf16 layer_norm,softmax 56x262144 --variant=clustered_rows`) | 56 rows (clusters of 3: 168 blocks, 64% of two waves' SMs) 0.64-0.79x; 60 rows of 200,003 f32 values (clusters of 4: 240 blocks, 91%) 1.06-1.19x | the streamed kernels | clusters keep rows only where their blocks fill at least 70% of their waves' SMs (`CLUSTER_WAVE_FILL`) |
//! | streamed rows: the last pass with streaming hints (`streamed_last_pass_hints`), split over clusters of 8 one block an SM (`streamed_split_waves`), of 16 (`wave_clusters_of_16`) (an H100, 2026-12-08, `gpu_sweep f32,bf16 layer_norm,softmax 64x1048576,16x1048576,132x700001,300x1048576 --variant=streamed_last_pass_hints --variant=streamed_split_waves --variant=streamed_split_waves,wave_clusters_of_16`, 16 cases each) | hints 0.86-1.07x, median 1.00x; waves 0.63-1.14x, median 0.96x; waves of 16 0.70-1.02x, median 0.84x (`ncu`, f32 `layer_norm` [64, 2^20]: 535 -> 405 MB read from DRAM, 67% -> 46% of its peak, 353 -> 418 us) | the defaults | all three off |
//! | 16-bit `layer_norm` rows in tiles moved 8 bytes an access (`vector_tile_values`; an H100, 2026-12-08, `gpu_sweep bf16,f16 layer_norm 393216x20,262144x36,131072x60,524288x100,65536x196 --variant=vector_tile_values`) | 0.96-1.16x: rows of 20 and 196 1.14-1.16x, 36 1.02-1.03x, 60 0.96x, 100 0.97-0.99x | the defaults | off (no rule by length found) |
//! | a streamed row's thread making 8 accesses a round, not 4 (`deeper_streamed_rounds`; an H100, 2026-12-08, `gpu_sweep f32,bf16 layer_norm,softmax 64x1048576,16x1048576,132x700001,300x1048576 --variant=deeper_streamed_rounds`, 16 cases) | 0.63-1.07x, median 1.00x: f32 [64, 2^20] 1.04-1.07x; 16 rows 0.63-0.79x (f32 `layer_norm`, bf16), bf16 `layer_norm` 0.88-0.93x | the defaults | off |
//! | few long rows after the wave-fill gate (`CLUSTER_WAVE_FILL`; an H100, 2026-12-08, `gpu_sweep f32,bf16,f16 layer_norm,softmax 66x131073,56x131072 --variant=clustered_rows --check-full` and `gpu_sweep f32,bf16 layer_norm,softmax 54x131073,53x200003,60x200003,64x100003 --variant=clustered_rows`) | clustered over streamed: f32 [66, 131073] 1.17-1.21x, [64, 100003] 1.12-1.16x, [53, 200003] and [60, 200003] 1.00-1.05x; 16-bit `layer_norm` [66, 131073] 1.08-1.35x but 16-bit `softmax` 0.85-0.88x; 56 and 54 rows now streamed either way (1.00x); every case equal to the CPU reference over the whole tensor | the streamed kernels | kept; 16-bit `softmax` clusters at 64-66 rows are slower (noted) |
//! | a streamed `layer_norm` row's mean and variance in one pass, two reads of the row where there were three (`one_pass_moments`; the H200, 2026-12-07, `gpu_sweep f32,bf16,f16 layer_norm 16x1048576,132x700001,64x1048576 --variant=one_pass_moments`, the landed kernels, 9 cases) | f32 1.13-1.27x ([16, 2^20] 1709 -> 2039 GB/s, 44% -> 53% of a copy; [64, 2^20] 1517 -> 1923), 16-bit 1.12-1.17x, [132, 700001] in 16 bits (kept by clusters) 1.00x; `--check-full` over [7, 1048577] and [16, 1048576] and rows far from zero matched | the kernels without it; `torch.compile` over f32 [64, 2^20] in the same call 1,993 GB/s (0.76x without it, about 0.96x with it) | on by default; under 85% of a copy |
//! | 16-bit `softmax` rows past 90,112 values kept as read, by a block up to 122,880 and by a cluster of up to 3 blocks past that, not streamed (`long_rows_as_read`; an H100, 2026-12-07, `gpu_sweep bf16,f16 softmax 300x100003,300x131072,1000x100003,64x200003,100x122880,16x524288 --variant=long_rows_as_read`, an experiment build whose kernels are these but for [16, 524288], which it kept by clusters of 8), 12 cases | one block 1.15-1.63x ([1000, 100003] 57% -> 91% of a copy, [300, 100003] 49% -> 80%, [100, 122880] 76% -> 87-92%), clusters of 2 and 3 1.18-1.27x ([300, 131072] 58% -> 68%); kept by 8 blocks, [16, 524288] 0.50x (46% -> 23%), so clusters stop at 3 (4 to 7 untimed) and those rows stay streamed | the streamed kernels | 62-92% of a copy; not met (under 85%) over [300, 100003] (80%), [300, 131072] and [64, 200003] (62-68%) |
//! | broadcast chains along a middle axis beside those along the last (an H100, 2026-12-07, `gpu_sweep f32,bf16,f16 bcast_mid,bcast_last`, then `torch_gpu_sweep.py` and `gpu_sweep_report.py`), 36 cases | 85-142% of a copy, median 102% (the least `bcast_mid` [1024, 4096] bf16, 85%; 16-bit `bcast_mid` [1335, 50257], rows of odd length read per element, 88%) | the faster of eager and `torch.compile`: median 1.55x, least 0.98x (f32 `bcast_mid` [1335, 50257] and 0.99x [8192, 8192], both sides at 97-99% of a copy) | met but those two (noise-level) |
//! | 16-bit short rows in wide tiles, again on an H100 (2026-12-07, `gpu_sweep bf16,f16 softmax,layer_norm 4194304x1,2097152x2,2097152x3,1048576x5,1048576x7,4194304x9,1048577x3,262143x5 --variant=wide_tiles`, the build landed with them) | rows of 1 value 1.65-1.77x, of 2 1.30-1.40x, of 3 1.04-1.31x, of 5 0.90-1.04x; rows of 7 (two a thread) 0.85-0.98x, so rows of 6 and 7 now keep a row a thread (`WIDE_TILE_MIN_PASSES`); rows of 9 1.00x | tiles of a row a thread | rows of 6 and 7 not timed since |
//! | pipelined and wide tiles beside PyTorch (an H100, 2026-12-07, `gpu_sweep f32,bf16,f16 softmax,layer_norm 1048576x33,524288x100,262144x17,65536x255,2097152x3,1048576x5,4194304x9 \| python3 scripts/torch_gpu_sweep.py \| python3 scripts/gpu_sweep_report.py`), 42 cases | 0.90-10.5x the faster of eager and `torch.compile`, median 2.38x; under 1.0x: [524288, 100] in every dtype (16-bit `layer_norm` 0.90-0.92x `torch.compile`, `softmax` 0.97-1.00x) and f32 `softmax` [65536, 255] (0.99x); 61-110% of a copy, median 89% (16-bit rows of 3, 5 and 17 at 61-74%) | eager, `torch.compile` | not met on [524288, 100] |
//! | few long rows split over thread-block clusters (an H100, 2026-12-06, `gpu_sweep f32,bf16,f16 OPS SHAPES --variant=split_rows` or `--variant=split_reductions`, then `torch_gpu_sweep.py`): the four row ops over [16, 2^20], [64, 262144], [9, 200003] and [333, 50257], every dtype, 48 cases | `softmax` and `layer_norm` rows too long to keep on chip 1.02x to 6.3x the kernels before, `sum` and `max` 0.97x to 6.6x (f32 `sum` [16, 2^20] 748 -> 2,613 GB/s; the least at f32 [64, 65536]) | the faster of eager and `torch.compile`: at least 1.03x, median 1.82x | met |
//! | the whole sweep on an H100 (2026-12-06, a dtype a run, beside PyTorch), 204 cases | median 104-105% of a copy; 11 cases under 85%, the least 57% (16-bit `layer_norm` over [333, 50257]; `ncu`: 26% of DRAM throughput, 42% of the SMs'). Since then, 16-bit rows of 32,769 to 61,440 values kept on chip run as two blocks an SM: over [333, 50257] `softmax` 79% -> 90% of a copy, `layer_norm` 58% -> 63% (`gpu_sweep bf16,f16 softmax,layer_norm 333x50257`, against the build before) | the faster PyTorch: median 1.20x (f32), 1.75x (bf16), 1.75x (f16); least 0.99x (f16 `sum` [4096, 4096], 3,571 against eager's 3,609 GB/s) | not met for few long rows (under 85% of a copy) |
//! | `softmax` and `layer_norm` over rows of 32 to 2^20, 2^24 values, f32 and bf16 (2026-12-01, `transformer_ops_bench rows`) | 317-3660 GB/s | best of eager and `torch.compile` | met (0.95-10.8x) but for `softmax` rows of 128 in f32 (0.96-0.97x) and of 65,536 in bf16 (0.95x) |
//! | a fused region ending in a last-axis sum, `sum(x * x)`, rows of 32 to 65,536, f32 / bf16 (2026-12-01) | 2774-3349 / 2278-3719 GB/s | best of eager and `torch.compile` | met, 1.7-3.4x / 2.6-8.8x; rows of 2^20 not (0.25-0.33x) |
//! | an optimizer step (2026-12-04): AdamW (weight decay 0.01) over GPT-2 124M's 148 parameters, f32, parameters, gradients and moments on the device, updated in place (`examples/optimizer_bench.rs` beside `scripts/torch_adamw.py`, five rounds in one run, medians) | 0.848 ms with the updates joined into one region (4 launches of a table of chains: `CudaFusion` [joins](crate::Executor::joins) them); 1.302 ms as 99 regions (parameters of one shape side by side fused already) | fused AdamW 1.024 ms (9 CUDA activities), foreach 2.929 ms | met: 1.21x fused AdamW, in fewer launches |
//! | a training step (2026-12-01): MLP classifier, 8192 tokens of 768 -> 3072 (gelu) -> 1024 classes, `cross_entropy`, `passes::Grad`, AdamW in place on the device, f32 (`examples/training_bench.rs`) | 5.36-5.38 ms (products 5.09 ms of it); 5.07 ms on 2026-12-02 with `transposed_matmul` in the gradients | `torch.compile` 4.86-4.87 ms, eager 4.93 (fused AdamW) | not met: 0.90-0.91x, then 0.96x |
//! | its device memory (workspace and inputs; PyTorch's peak in a step) | 419 MiB with the parameters and AdamW's moments updated in their own memory and the values in one block (2026-12-03); 642 MiB with shared buffers of one length (2026-12-02); 930 MiB before | eager 548 MiB, `torch.compile` 388 MiB | met against eager (0.76x its memory); 1.08x compile's |
//! | GPT-2 124M, batch 8 x 1,024 (2026-12-03, `examples/gpt2.rs --bench`, against Hugging Face's `GPT2LMHeadModel` with SDPA, `scripts/torch_gpt2.py`, one run each; no weight decay on either side): bf16 autocast forward / training step (fused AdamW) | on an H100 with the four default variants (2026-12-05, later, timed alone, four runs): 6.43-6.47 / 22.82-22.89 ms; on an H100 (2026-12-05, with `fast_exp2` and `streaming_rows`, two runs): 6.5 / 22.9-23.1 ms against `torch.compile`'s 7.3 / 27.9 and eager's 25.1 / 64.7 in the same call (1.11 / 1.21x); with `keep_in_l2` too, 6.43-6.50 / 22.7-23.1 ms (five runs interleaved with as many without it: forward 1.0-1.3% faster in each pair). On the H200: 6.1 / 20.6 ms (2026-12-04, AdamW's updates joined into one region: `torch.compile` 7.1 / 23.1 in the same run, 1.16 / 1.12x; 1,320 ranges a step); 6.2 / 21.3 ms and 6.3 / 21.6 (two runs) with attention reading q, k and v in place and writing its gradients in `qkv`'s layout (`qkv_attention`: no split, permute or concat kernels; 1,417 ranges a step); 7.1 / 23.6 ms with `layer_norm`'s backward as kernels, the padding copies' aligned loads, the weight sums' rows read together, and AdamW without decay ops when it has no weight decay (148 one-element kernels fewer); 7.4 / 25.4 with the `layer_norm` kernels alone. Before: 7.5 / 28.6 with the loss read from the bf16 logits (8.4 / 30.6 with them cast to f32 first; 31.5 with attention's backward through cuDNN, the split's gradient still pads and adds; 42.2 before, 2026-12-02; earlier: 45.2 before the vectorised causal mask; 84.3 before attention's backward in bf16, `cross_entropy_backward`, fused casts, padded products and the loss on the sliced rows; 92.2 before reshapes were views; 108 before `transposed_matmul`) | beside the 21.3: eager 22.4 / 56.7, `torch.compile` 7.1 / 24.4; beside the 21.6: 22.4 / 56.7, 6.9 / 23.1; beside the 23.6: eager 22.3 / 56.7, compile 6.9 / 23.3 (the 25.4's run: 22.7 / 56.8, 6.9 / 24.3; the 28.6's: 22.5 / 56.6, 7.1 / 23.1) | met: 1.14 / 1.14x and 1.10 / 1.07x compile (3.6 / 2.6x eager); the runs before 0.97 / 0.99x, 0.93 / 0.96x, 0.94 / 0.81x |
//! | the same in f32 (TF32 off): forward / training step | 50.4 / 161.3 ms (2026-12-04, attention's forward on tensor cores and AdamW's updates joined; `torch.compile` 55.9 / 170.1 in the same run: 1.11 / 1.05x; the build before 52.3 / 163.6 in another run); 52.5 / 163.2 ms (2026-12-03, attention's backward through the generated flash-attention backward: 20.6 ms a step for the 12 layers, from 35.9 decomposed; PyTorch's memory-efficient backward took 23.1 ms in an earlier profile; eager 57.7 / 170.7, compile 56.0 / 170.2 in that run: 1.07 / 1.04x compile, 1.10 / 1.05x eager); 52.6 / 178.4 ms (2026-12-03, `qkv_attention`: the forward through the flash kernel reading q, k and v in place, the backward still decomposed; eager 57.8 / 171.0, compile 55.9 / 170.4 in that run: 1.06 / 0.95x compile); 53.8 / 182.7 ms (at `5b031b7`, with f32 attention's gradients packed and sliced as in bf16; f32 wrote them directly after that, not re-measured; 184.9 on 2026-12-02; 55.5 / 191.9 before that stop's changes; 60.0 / 201.7 before views; a step 223.6 before `transposed_matmul`) | eager 57.8 / 171.1, compile 56.0 / 170.3 (the 182.7's run) | met: 1.07 / 1.04x compile (before the flash backward 1.06 / 0.95x: f32 attention's backward was decomposed, cuDNN has no f32 attention) |
//! | device memory of GPT-2's training step (workspace and inputs; not counted: the bf16 padded products' scratch, about 0.9 GB per stream), bf16 / f32 | 5.6 / 9.2 GB (2026-12-03: 5,557 / 9,218 MiB) with the uploads of inputs given on the device not allocated, parameters and AdamW's moments updated in their own memory (`DeviceKernel::in_place`) and the values in one block; 6.3 / 11.3 GB with the first two; 9.2-9.4 / 14.1-14.4 before (bf16: 11.8 with f32 logits for the loss, 13.0 before attention's backward through cuDNN, 15.6 before that, 79 before shared buffers) | peak: eager 12.8 / 14.9 GB, compile 7.4 / 9.9 GB (7,368 / 9,907 MiB on 2026-12-03) | met: 1.33x / 1.07x less than compile's |
//! | a range on every op and module of GPT-2's step (1,417 in bf16 and 1,507 in f32 since `qkv_attention`; about 1,900 in bf16 since `layer_norm`'s backward runs as kernels, 2,300 before; 2,188 in f32), no tool attached | on an H100 with the four default variants (1,320 ranges, 2026-12-05, the profiled step timed twice, the faster kept): +0.79%, -0.03%, -0.37%; +0.71% (bf16, 1,320 ranges, 2026-12-04); +0.86%, -1.12% (bf16) and +0.04% (f32) with `qkv_attention`; +1.74%, +0.68%, -0.08% (bf16, 2026-12-03, three runs of the builds before); -0.01%, -0.26%, +0.51% (bf16, the builds before), +0.06% (f32); 2026-12-02: +0.47%, +0.75% | | met (<= 1%) in all but one run (+1.74%) |
//! | GPT-2's bf16 step's kernels under Nsight Compute (`ncu --metrics gpu__time_duration.sum --clock-control none --cache-control none` on `gpt2 --train-steps 2`, the last step's durations summed; 2026-12-03) | 999 kernels, 21.2 ms with `qkv_attention` (products 9.1, cuDNN's attention 3.5, fused regions 2.8, padding copies 1.5, `layer_norm`'s backward 1.1, `cross_entropy` 1.0, casts 0.9 in 196 kernels, unfused adds 0.5, slices, pads and transposes 0.3 in 154 kernels); before it 1,690 kernels, 29.8 ms, then 1,191 kernels, 24.4 ms (products 9.2, cuDNN's attention 3.5-4.9 (its tuning picked sm80 or sm90 kernels in different runs), fused regions 2.8, padding copies 1.5 (3.2 before), `layer_norm`'s backward 1.1 (about 3.3 before, 13 kernels each), casts 0.9, slices, transposes and concats 2.0, `cross_entropy` and its backward 1.0) | `torch.compile`'s step under `torch.profiler`: 731 kernels, 21.85 ms | |
//! | a user's own kernel in a plan, stream runs (`examples/cuda_user_executor.rs`) | +0.27-0.43 us of host time per step over launching it by hand (12 and 100 steps); one-step plans +0.63-1.00 us (the build before: 1.15-2.34); 2026-12-04, one run: +0.60 (12 steps), +0.88 (100), +1.05 (one step); 2026-12-05, an H100 whose launch floor was 4.5 us, one run: +0.66 (12), +0.95 (100), +1.57 (one step, on a stream of its own; the plan 1.27x the floor, 1.17x on the device's own stream); the H200 after launches read each buffer's address kept in `CudaBuffer` (2026-12-05), one run: +0.35 (12), +0.33 (100), +0.65 (one step) | | met (<= 1 us) in nine runs at 12 and 100 steps; one-step plans +1.05 and +1.57 in the last two |
//! | a plan of `CudaOps` `tanh` steps against its own generated kernel launched by hand (the driver's floor, 2.9-3.5 us per launch here), same example | 1.05x the floor at 100 steps, 1.07-1.08x at 12; 2026-12-04: 1.066x at 100 (4.45 us a step against 4.18), 1.084x at 12, 1.23x for one; 2026-12-05, two rounds: 1.052-1.053x at 100, 1.066-1.075x at 12, 1.223-1.247x for one (the floor 2.8-2.9 us a launch); in the same call a build that recorded a run's leaving event only when something waited for it (`stream_order`) timed 1.164-1.194x for one step, but it only moved the record into the next wait (as many driver calls per run and wait, out of the timed part) and made other workspaces' runs wait for more of a queue than its last run: not kept; on an H100 (2026-12-05, three runs, the floor 3.9-4.8 us a launch), a workspace on the device's own stream (`Plan::workspace_on_device_queue`, no event per run) beside one with a stream of its own: one step 1.18-1.22x against 1.29-1.33x, 12 steps 1.08-1.09x against 1.09-1.11x, 100 steps 1.10-1.12x against 1.12-1.17x; the same after the host path was trimmed (`scripts/host-cost`: a one-step run 2,283 -> 1,990 instructions, a step 1,027 -> 862), on another H100 host (floor 2.8-3.0 us, three runs): one step 1.13-1.17x against 1.19-1.26x, 12 and 100 steps 1.03-1.06x; on a third (floor 4.5 us, one run, 2026-12-05 later): one step 1.17x against 1.27x, 12 steps 1.08x against 1.10x, 100 steps 1.07x against 1.10x; on the H200 after launches read each buffer's address kept in `CudaBuffer` (2026-12-05, one run, floor 3.0-3.2 us a launch): one step 1.10x on the device's stream against 1.21x on a stream of its own, 12 steps 1.05x against 1.06x, 100 steps 1.04x against 1.05x | | H200: within 10% from 12 steps, one step 1.10x on the device's stream (last run); H100: 1.03-1.10x from 12 steps (last runs); one step 1.13-1.17x on the device's stream |

#[cfg(feature = "cuda")]
mod attention;
mod codegen;
#[cfg(feature = "cuda")]
mod cross_entropy;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod device_checks;
#[cfg(feature = "cuda")]
mod event_timer;
#[cfg(feature = "cuda")]
mod executors;
#[cfg(feature = "cuda")]
mod flash_attention;
#[cfg(feature = "cuda")]
mod flash_attention_backward;
#[cfg(feature = "cuda")]
mod flash_attention_tf32;
#[cfg(feature = "cuda")]
mod gather;
#[cfg(feature = "cuda")]
mod gemm;
#[cfg(feature = "cuda")]
mod index_ops;
#[cfg(feature = "cuda")]
mod layer_norm_backward;
#[cfg(feature = "cuda")]
mod multi_tensor;
// Without the `cuda` feature only the generators' row layouts are used (by `codegen`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod row_kernels;
// Short rows of odd lengths, a block's tile of them at a time.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod row_tiles;
// `layer_norm`'s weight and bias staged in shared memory for rows of odd lengths.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod staged_operands;
#[cfg(feature = "cuda")]
mod stream_order;
#[cfg(feature = "cuda")]
mod stream_workspaces;
#[cfg(feature = "cuda")]
mod user_kernel;
mod variants;

#[cfg(feature = "cuda")]
pub use attention::fused_attention;
pub use codegen::{op_source, region_source, shape_op_source, RegionSource};
/// The `cudarc` this crate is built with (its `CudaStream`, `CudaView` and the rest, for users'
/// kernels): use it rather than a `cudarc` of your own, whose types would be other types.
#[cfg(feature = "cuda")]
pub use cudarc;
#[cfg(feature = "cuda")]
pub use device::{CudaBuffer, CudaDevice};
#[cfg(feature = "cuda")]
pub use event_timer::CudaEventTimer;
#[cfg(feature = "cuda")]
pub use executors::{CudaFusion, CudaOps};
#[cfg(feature = "cuda")]
pub use user_kernel::{device_kernel, CudaKernel, CudaRun, DeviceElement, DeviceMemory};
pub use variants::{KernelVariants, CUDA_OPTIONS};

use crate::core::plan::Availability;

/// Whether CUDA can run here: the driver library is present and device 0 can be opened.
///
/// ```
/// use boundscope::executors::cuda;
/// use boundscope::Availability;
/// match cuda::availability() {
///     Availability::Available => println!("CUDA device found"),
///     Availability::Unavailable(why) => println!("CPU only: {why}"),
/// }
/// ```
pub fn availability() -> Availability {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only checks whether the driver library can be loaded; no CUDA call is made.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Availability::Unavailable("no CUDA driver library (libcuda.so) was found".into());
        }
        match cudarc::driver::CudaContext::new(0) {
            Ok(_) => Availability::Available,
            Err(e) => {
                Availability::Unavailable(format!("the CUDA driver is present but device 0 cannot be used ({e})"))
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        Availability::Unavailable("boundscope was built without its `cuda` feature".into())
    }
}

/// `Ok` if CUDA is available, else [`Error::ExecutorUnavailable`](crate::Error) saying why:
/// for programs that require a GPU instead of falling back to the CPU.
///
/// # Errors
/// [`Error::ExecutorUnavailable`](crate::Error::ExecutorUnavailable).
pub fn require() -> crate::Result<()> {
    match availability() {
        Availability::Available => Ok(()),
        Availability::Unavailable(reason) => Err(crate::Error::ExecutorUnavailable { executor: "cuda".into(), reason }),
    }
}

/// Compiles `source` with NVRTC where it can be loaded (it is loaded dynamically: on machines
/// without CUDA, or in a build without the `cuda` feature, the test says so and checks the
/// rest; the GPU tests compile every kernel), for NVRTC's default architecture and for
/// Hopper's (sources may branch on `__CUDA_ARCH__`).
#[cfg(test)]
fn compiles_with_nvrtc(source: &str) {
    for arch in [None, Some("compute_90")] {
        match nvrtc_ptx(source, arch) {
            None => return,
            Some(Err(e)) => panic!("NVRTC rejects the kernel for {arch:?}: {e}\n{source}"),
            Some(Ok(_)) => {}
        }
    }
}

/// Compiles `source`, a kernel whose blocks run as thread-block clusters, with NVRTC for
/// Hopper where NVRTC can be loaded (as [`compiles_with_nvrtc`]), and checks that its PTX
/// takes the cluster's barrier and reads another block's shared memory (`mapa`); `what` names
/// the case in a failure.
#[cfg(test)]
fn compiles_as_clusters(source: &str, what: &str) {
    match nvrtc_ptx(source, Some("compute_90")) {
        None => {}
        Some(Err(e)) => panic!("NVRTC rejects the kernel for compute_90: {e}\n{source}"),
        Some(Ok(ptx)) => assert!(ptx.contains("barrier.cluster") && ptx.contains("mapa"), "{what}"),
    }
}

/// The PTX NVRTC makes of `source` for `arch` (its default where `None`), or `None`, with a
/// line on stderr saying why, where NVRTC cannot be used here.
#[cfg(test)]
fn nvrtc_ptx(source: &str, arch: Option<&'static str>) -> Option<Result<String, String>> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only looks for the library (loading it if present).
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("SKIPPED compiling with NVRTC: it cannot be loaded here (no CUDA); the GPU tests compile it");
            return None;
        }
        let options = cudarc::nvrtc::CompileOptions { arch, ..Default::default() };
        Some(cudarc::nvrtc::compile_ptx_with_opts(source, options).map(|p| p.to_src()).map_err(|e| format!("{e:?}")))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (source, arch);
        eprintln!("SKIPPED compiling with NVRTC: built without the `cuda` feature; the GPU tests compile it");
        None
    }
}
