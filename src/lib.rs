//! Traces of bound symbols whose profiler ranges and other scoped guards are op metadata, not
//! trace nodes.
//!
//! Nothing in the core reads the environment or switches profiling on by itself: you attach
//! guards from code, and [`Plan::set_profiling`] switches them off and on. Only the front end
//! ([`frontend`]: [`frontend::ProfiledSession`], [`frontend::Environment::process`]) reads
//! `BOUNDSCOPE_*` variables and detects an attached profiler.
//!
//! boundscope builds, transforms and runs **traces of bound symbols** (ops applied to values,
//! as in ML compilers such as Lightning Thunder). A trace lives in an [`Arena`] owned by the
//! caller, is built through a checked [`TraceBuilder`], rewritten by [`passes`], and compiled
//! against an ordered list of [`Executor`]s into a [`Plan`] that runs many times without
//! allocating per op.
//!
//! # Main types
//! - [`Registry`], [`Symbol`], [`prims`]: op kinds, built-in and your own.
//! - [`Arena`], [`TraceBuilder`], [`Trace`], [`BoundSymbol`], [`ValueId`]: the IR.
//! - [`guards`]: scoped guards attached to bound symbols as metadata: [`guards::Guard`],
//!   [`guards::NvtxRange`], [`guards::Recorder`], [`guards::HostTimer`],
//!   [`guards::ClosureGuard`], [`guards::Timeline`] (a Chrome trace file without Nsight,
//!   and [`guards::folded_stacks`] for flame graphs), [`guards::Selection`].
//! - [`passes::Pass`], [`passes::Pipeline`], [`passes::ProfileOps`]: trace-to-trace rewrites.
//! - [`Executor`], [`Kernel`], [`Plan`], [`Workspace`]: compiling and running.
//! - [`executors::CpuReference`]: the reference executor, oracle for all others.
//! - [`Tensor`], [`TensorRef`], [`TensorMut`]: host data.
//! - [`Error`], [`Result`]: one error type for everything.
//!
//! # Source map
//! | folder | what is there |
//! | --- | --- |
//! | `src/core/ir/` | the IR: arena, ids, symbols and the registry, built-in prims, optimizer steps (`optimizers.rs`), the transformer ops (`transformer_ops.rs`), attention over a packed projection (`packed_attention.rs`), the prims gradients need (`gradient_ops.rs`), bound symbols, traces, builder, named scopes (`scopes.rs`), listings |
//! | `src/core/guards/` | scoped guards: the `Guard` trait, attaching, the side table, `NvtxRange`, `Recorder`, `HostTimer`, `ClosureGuard`, `TracingSpan`, `Timeline` (Chrome trace files), the `tracing` layer `NvtxLayer`, `ScopeDetails`, and structured NVTX payloads (`nvtx_payload.rs`, with its C shim and the vendored NVTX payload headers in `nvtx_payload/`, compiled by `src/build.rs`) |
//! | `src/core/passes/` | the `Pass` trait, the pipeline, decomposition (`Decompose`, `DecomposeFor`), dead-code elimination, fusion (`FuseRegions`), folding epilogues (`FoldEpilogues`), packing attention (`PackAttention`), `ProfileOps`, gradients (`grad/`: `Grad` and the built-ins' rules), the inserted-node baseline |
//! | `src/core/plan/` | the `Executor`, `Kernel` and `Device` traits, plan compilation (with transfers), each dtype's bits in device words (`packing.rs`), one range per scope per domain (`one_per_scope.rs`), the guard schedule, what each scope surrounds (`scope_details.rs`), range filters (`range_filter.rs`), the range map, workspaces and the run loop, device memory shared by values never live together (`buffer_reuse.rs`), updates written over their inputs (`in_place.rs`), device tensors and run inputs (`device_tensor.rs`), graphs (`graph.rs`) |
//! | `src/core/tensor.rs` | host tensors of every dtype (`Element`), and the typed views kernels read and write (`Data`, `DataMut`) |
//! | `src/executors/` | built-in executors: `cpu_reference` (the oracle, the shared scalar `math`, `vector_loops` compiled per instruction set, `in_f32.rs` for 16-bit floats, `products.rs`, `row_kernels.rs` for `softmax` and `layer_norm` whole, `axis_kernels.rs`, `index_kernels.rs` and `select_kernels.rs` for the transformer ops), `cpu_fusion` (blocked fused regions), `worker_pool.rs` (the CPU executors' threads), `cuda` (availability, the device and its graphs, the order of its streams (`stream_order.rs`), `CudaFusion`, `CudaOps`, CUDA C generation for regions, ops and shape ops, row kernels for `softmax` and `layer_norm` (`row_kernels.rs`), cuBLASLt products, batched too (`gemm.rs`), the transformer ops' kernels (`index_ops.rs`, `gather.rs`, `cross_entropy.rs`), cuDNN's fused attention (`attention.rs`), the generated flash attention (`flash_attention.rs`), the libraries' per-stream workspaces (`stream_workspaces.rs`), and the ids checked on the device (`device_checks.rs`), users' own kernels (`user_kernel.rs`), the kernel variants under measurement, chosen by developer options (`variants.rs`)) |
//! | `src/checkpoint/` | safetensors files: `Checkpoint` (mapped, tensors borrowed) and `write` |
//! | `src/distributed/` | several ranks: what a collective does and the `Communicator` trait (`communicator.rs`), ranks as threads (`in_process.rs`), ranks as processes over TCP (`tcp.rs`), `RANK`/`WORLD_SIZE` as `torchrun` sets them (`rank_env.rs`), the collectives as bound symbols and their executor (`collectives.rs`) |
//! | `src/core/options/` | typed option specs and values |
//! | `src/frontend/` | the front end: environment, profiler detection, `ProfiledSession`, `options::list()` |
//! | `src/error.rs` | the one `Error` enum and `Result` alias |
//! | `proptests/` | property tests (`cargo test` runs them), GPT-2 against PyTorch (its reference in `fixtures/`), their naive oracle and an `f64` interpreter of traces (for finite differences), and an NVTX capture (static injection, payload schemas included) |
//! | `scripts/` | `nsys-check` (runs a program under Nsight Systems and checks its NVTX ranges against the range map it writes), `check-instruction-budgets` (instruction counts against `benches/instruction_budgets.tsv`), `timeline-svg` (the README's flame graph), `torch_baseline.py` and `gpu_report.py` (the GPU comparison), `torch_baseline_bf16.py` and `gpu_report_bf16.py` (the same in bf16), `torch_transformer_ops.py` and `transformer_ops_report.py` (the transformer ops against PyTorch), `torch_training.py` (a training step, against `examples/training_bench.rs`), `torch_gpt2.py` and `gpt2_report.py` (GPT-2, against `examples/gpt2.rs --bench`, side by side), `gpt2_reference.py` (the reference `gpt2_matches_pytorch` compares with) |
//! | `benches/` | criterion benchmarks (dispatch, guards, fusion and the CPU executors, tracing, trace building) and the gungraun instruction counts (with a null NVTX tool, `null_nvtx_tool.rs`) |
//! | `examples/` | runnable examples, starting with `quickstart`; `examples/shared/` holds what several use (a user's fusion executor, a user's GPU executor, the timeline examples' plan, GPT-2's model (`gpt2.rs`), the `scripts/nsys-check` hand-off); `timeline_flamegraph.svg` is the README's picture |
//!
//! # The ops
//! Each op checks its shapes, axes and dtypes when it is bound (a typed error naming the op, the
//! shapes and the fix). Composites carry their decomposition, so every executor that runs the
//! prims runs them; `CudaOps` runs some whole. Ops without a GPU kernel yet run on the CPU
//! reference in the same plan, with the transfers it needs. Where each runs:
//!
//! | ops | CPU reference | CpuFusion | CudaOps / CudaFusion |
//! | --- | --- | --- | --- |
//! | elementwise (`neg` ... `gelu`, `add` ... `maximum`, scalars, broadcasts), `cast` | yes | fused | yes / fused |
//! | `sum`, `max` (last axis) | yes | ends a region | yes / ends a region |
//! | `matmul` 2-D; `linear`, `linear_gelu` | yes | - | cuBLASLt, bias and gelu in the epilogue |
//! | `matmul` batched (`[..., m, k] x [..., k, n]`, batch dims broadcast) | yes | - | one cuBLASLt strided batched call (each operand's batch dims the output's or all 1; other broadcasts on the CPU) |
//! | `reshape`, `transpose`/`permute`, `broadcast_to`, `slice`/`narrow`/`split`, `concat` | every dtype | - | every dtype |
//! | `sum_dim`, `max_dim`, `mean_dim` (any axis, keepdim or not), `argmax` (`i64`) | yes | last axis fused | yes |
//! | `embedding(weight, ids)`, `gather_last(x, ids)` (ids `i64`/`i32`; out of range: `Error::IndexOutOfRange`, on the GPU too, after the run) | every dtype | - | every dtype |
//! | `softmax`, `layer_norm` | whole, a row at a time in the cache | fused (decomposed) | one kernel each, laid out by row length (rows up to 32,768 read once) |
//! | `log_softmax`, `cross_entropy(logits, targets)` (mean over rows) | yes | fused (decomposed) | `log_softmax` decomposed and fused; `cross_entropy` whole (targets checked on the device) |
//! | comparisons `lt` ... `ne` (`i32` 0/1 masks: there is no bool dtype), `where`, `where_scalar` | every dtype | - | yes |
//! | `matmul_transposed(a, b)` (`a @ b^T`), `transposed_matmul(a, b)` (`a^T @ b`: products' weight gradients), batched | yes | - | one product reading the operand transposed |
//! | `causal_mask`, `scaled_dot_product_attention(q, k, v, causal, scale)` | yes | - | mask: yes; attention whole: bf16/f16 through cuDNN's fused attention (where `cuda::fused_attention()` finds cuDNN 9), f32 (and 16-bit without cuDNN) through a generated flash-attention kernel (heads up to 64; in f32 its products on tensor cores as split TF32, f32's accuracy, on compute capability 8.0+), else decomposed |
//! | `scaled_dot_product_attention_backward(q, k, v, grad, causal, scale)` (dq, dk, dv packed into one tensor; what `passes::Grad` writes for attention) | yes | fused (decomposed) | bf16/f16 whole through cuDNN's fused attention backward (cuDNN 9.10.2 or later, heads a multiple of 8; before 9.16 key lengths a multiple of 128; not one query and one key); f32 whole through a generated flash-attention backward (heads a multiple of 16 up to 64); else decomposed |
//! | `qkv_attention(qkv, heads, causal, scale)` (q, k, v side by side in `[..., tokens, 3 * heads * head]`, as GPT-2's `c_attn` writes them; result `[..., tokens, heads * head]`; `passes::PackAttention` makes it of the split, views and attention a model writes) and `qkv_attention_backward` (the gradient in `qkv`'s layout) | yes (decomposed: split, views, attention) | fused (decomposed) | as attention and its backward, reading q, k and v in place and writing the result and dq, dk, dv in their final layouts: no split, permute or concat kernels |
//! | `layer_norm_backward(x, grad, eps, weight?)`, `layer_norm_weight_backward(x, grad, eps)` (`f32` `[2, n]`: the weight's and bias's gradients; what `passes::Grad` writes for `layer_norm`) | yes | fused (decomposed) | one row kernel; partial sums per block, then their sum (rows up to 4,096); longer rows decomposed |
//! | `pad`, `scatter_last`, `embedding_backward` (the gradients of `slice`, `gather_last`, `embedding`) | `pad` every dtype; the others floats (`embedding_backward` sums in `f32`) | - | yes (`embedding_backward`: f32 tables, atomic adds; ids checked on the device) |
//!
//! # Invariants
//! Each is a property test in `proptests/`.
//! 1. Attaching guards never changes which bound symbols a trace holds, their order, or its
//!    listing other than the guard annotations.
//! 2. Guards are entered in attach order and exited in reverse order, always: after success,
//!    after an executor error, and while unwinding from a panic, on the thread that runs the op.
//! 3. Per NVTX domain, each scope (run, region, op, subsymbol span) has at most one range; an
//!    executor that pushes its own region ranges declares the domain it pushes into
//!    ([`EmittedRange`]), and the runtime pushes none there. A plan lists every range one run
//!    pushes ([`Plan::range_map`]), and what a profiler records equals that list.
//! 4. Ranges nest (run ⊃ region or op ⊃ subsymbol), and no range has a direct parent with the
//!    same label in the same domain.
//! 5. Passes never lose a guard silently: it is kept, moved to the enclosing region, or dropped
//!    with a recorded reason ([`Trace::dropped_guards`]).
//! 6. With guards attached but profiling off, a run costs what it costs without them, and no
//!    run allocates in steady state.
//! 7. Bad input is a typed [`Error`] that names the problem and the fix, never a panic.
//!
//! # Cargo features
//! - `cuda` (default): CUDA support through `cudarc`, loaded dynamically at run time, so the
//!   crate builds and runs on machines without CUDA.
//!
//! # Example
//! ```
//! use boundscope::{executors::CpuReference, passes::Pipeline, Arena, Plan, Registry, Tensor, TraceBuilder};
//!
//! let registry = Registry::with_builtins();
//! let arena = Arena::new();
//! let mut b = TraceBuilder::new(&arena, &registry);
//! let x = b.input(&[4, 8])?;
//! let w = b.input(&[8, 8])?;
//! let h = b.linear(x, w, None)?;
//! let y = b.gelu(h)?;
//! b.output(y)?;
//! let trace = b.finish()?;
//! let prims = Pipeline::standard().run(&trace, &arena)?;
//! println!("{prims}");
//!
//! let plan = Plan::compile(&prims, &[CpuReference::shared()])?;
//! let out = plan.run(&[&Tensor::from_fn(&[4, 8], |i| i as f32 / 32.0), &Tensor::zeros(&[8, 8])])?;
//! assert_eq!(out[0].to_f32_vec(), &[0.0; 32]);
//! # Ok::<(), boundscope::Error>(())
//! ```
#![warn(missing_docs)]
// Docs that name items of the `cuda` feature (the default, which docs.rs builds) link to them
// there; built without it, those items do not exist and their links cannot resolve.
#![cfg_attr(not(feature = "cuda"), allow(rustdoc::broken_intra_doc_links))]

pub mod checkpoint;
mod core;
pub mod distributed;
mod error;
pub mod executors;
pub mod frontend;

pub use crate::core::guards;
/// Typed options: specs, values, and [`options::list`] of every built-in option.
pub mod options {
    pub use crate::core::options::*;
    pub use crate::frontend::list;
}
/// Optimizer steps as ops of a trace ([`optim::Sgd`], [`optim::AdamW`]).
pub use crate::core::ir::optimizers as optim;
pub use crate::core::ir::{
    checked_numel, path_matches, prims, Arena, Arg, ArgInfo, BoundSymbol, BoundSymbolId, Category, CpuKernelFactory,
    DType, Decomposition, GuardId, Listing, ListingOptions, NamedScope, ParamKind, PassRecord, Registry, Shape,
    ShapeRule, Symbol, SymbolId, SymbolRef, TensorMeta, Trace, TraceBuilder, ValueId, VjpInput, VjpRule,
    SCOPE_SEPARATOR,
};
pub use crate::core::passes;
pub use crate::core::plan::{
    kernel_fn, Availability, Device, DeviceBuffer, DeviceGraph, DeviceKernel, DeviceOutputs, DeviceQueue, DeviceTensor,
    EmittedRange, Executor, Fusible, Kernel, MapKernel, OpView, Outputs, Plan, PlanGraph, PlanInput, PlannedRange,
    PreparedRegionRange, PushedBy, RangeFilter, RangeMap, RegionRange, RunInput, RunInputMut, Workspace,
};
pub use crate::core::tensor::{Data, DataMut, Element, Tensor, TensorMut, TensorRef};
pub use crate::error::{Error, Result};

/// The README's code examples, compiled and run as doctests (in the default build: some use the
/// `cuda` feature's items).
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "cuda"))]
pub struct ReadmeDoctests;
