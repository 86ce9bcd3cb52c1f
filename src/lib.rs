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

pub mod checkpoint;
mod core;
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
    EmittedRange, Executor, Fusible, Kernel, OpView, Outputs, Plan, PlanGraph, PlanInput, PlannedRange,
    PreparedRegionRange, PushedBy, RangeFilter, RangeMap, RegionRange, RunInput, RunInputMut, Workspace,
};
pub use crate::core::tensor::{Data, DataMut, Element, Tensor, TensorMut, TensorRef};
pub use crate::error::{Error, Result};

/// The README's code example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
