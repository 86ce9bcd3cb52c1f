//! Traces of bound symbols whose profiler ranges and other scoped guards are op metadata, not
//! trace nodes.
//!
//! Nothing in this crate reads the environment or switches profiling on by itself: you attach
//! guards from code, and [`Plan::set_profiling`] switches them off and on.
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
//!   [`guards::ClosureGuard`], [`guards::Selection`].
//! - [`passes::Pass`], [`passes::Pipeline`], [`passes::ProfileOps`]: trace-to-trace rewrites.
//! - [`Executor`], [`Kernel`], [`Plan`], [`Workspace`]: compiling and running.
//! - [`executors::CpuReference`]: the reference executor, oracle for all others.
//! - [`Tensor`], [`TensorRef`], [`TensorMut`]: host data.
//! - [`Error`], [`Result`]: one error type for everything.
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
//! assert_eq!(out[0].data(), &[0.0; 32]);
//! # Ok::<(), boundscope::Error>(())
//! ```
#![warn(missing_docs)]

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
pub use crate::core::ir::{
    checked_numel, prims, Arena, Arg, ArgInfo, BoundSymbol, BoundSymbolId, Category, CpuKernelFactory, DType,
    Decomposition, GuardId, Listing, ListingOptions, ParamKind, PassRecord, Registry, Shape, ShapeRule, Symbol,
    SymbolId, SymbolRef, TensorMeta, Trace, TraceBuilder, ValueId,
};
pub use crate::core::passes;
pub use crate::core::plan::{
    kernel_fn, Availability, Device, DeviceBuffer, DeviceKernel, EmittedRange, Executor, Fusible, Kernel, OpView,
    Outputs, Plan, PlannedRange, PreparedRegionRange, PushedBy, RangeMap, RegionRange, Workspace,
};
pub use crate::core::tensor::{Tensor, TensorMut, TensorRef};
pub use crate::error::{Error, Result};

/// The README's code example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
