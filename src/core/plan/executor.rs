//! The executor contract: which bound symbols an executor claims, and the kernels it compiles
//! for them.
//!
//! Executors are asked once, when a plan is compiled; what they return is a [`Kernel`] that
//! has already done all per-op analysis (broadcast strides, generated code, ...), so that
//! running it is only the computation.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use super::device::{Device, DeviceKernel};
use crate::core::guards::{GuardKind, Level, PreparedNvtxRange, ScopeDetails};
use crate::core::ir::{prims, Arg, BoundSymbol, Category, FusedBy, Symbol, SymbolId, Trace, ValueId};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::{Error, Result};
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A compiled bound symbol, ready to run many times (from several threads at once).
pub trait Kernel: Send + Sync {
    /// Computes the outputs from the inputs. Inputs are the bound symbol's tensor arguments in
    /// order; outputs are pre-sized to the shapes the trace declares.
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()>;

    /// The kernel as an elementwise map of `f32` values, where it is one (none by default).
    ///
    /// Where its step has one output and at most four tensor inputs, all `f32` of one element
    /// count (all the plan checks: not that the shapes are equal), the run loop calls
    /// [`MapKernel::map`] with their values instead of [`run`](Self::run): no views, no dtype
    /// checks in the kernel (the plan made them once). Small ops are dominated by that
    /// dispatch: the CPU reference's 1-element ops take 0.63x the time they took through
    /// `run`. Both forms must compute the same values.
    fn as_map(&self) -> Option<&dyn MapKernel> {
        None
    }
}

/// An elementwise kernel of `f32` values: output element `i` is computed from element `i` of
/// each input. A [`Kernel`] that is one returns itself from [`Kernel::as_map`].
///
/// ```
/// use boundscope::{Kernel, MapKernel, TensorMut, TensorRef};
///
/// /// `out = 2 * x`, as a kernel and as a map.
/// struct Double;
/// impl Kernel for Double {
///     fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> boundscope::Result<()> {
///         self.map(&[inputs[0].values::<f32>()?], outputs[0].values_mut::<f32>()?);
///         Ok(())
///     }
///     fn as_map(&self) -> Option<&dyn MapKernel> {
///         Some(self)
///     }
/// }
/// impl MapKernel for Double {
///     fn map(&self, inputs: &[&[f32]], out: &mut [f32]) {
///         for (o, x) in out.iter_mut().zip(inputs[0]) {
///             *o = 2.0 * x;
///         }
///     }
/// }
/// let mut out = [0.0; 2];
/// Double.as_map().unwrap().map(&[&[1.0, 2.0]], &mut out);
/// assert_eq!(out, [2.0, 4.0]);
/// ```
pub trait MapKernel: Send + Sync {
    /// Writes `out` from `inputs`: the bound symbol's tensor arguments in order, each of
    /// `out`'s length.
    fn map(&self, inputs: &[&[f32]], out: &mut [f32]);
}

/// A kernel made from a closure.
///
/// ```
/// use boundscope::{kernel_fn, Kernel, Tensor, TensorMut};
/// let double = kernel_fn(|inputs, outputs| {
///     for (o, x) in outputs[0].values_mut::<f32>()?.iter_mut().zip(inputs[0].values::<f32>()?) {
///         *o = 2.0 * x;
///     }
///     Ok(())
/// });
/// let x = Tensor::new(&[2], vec![1.0, 2.0]).unwrap();
/// let mut out = [0.0; 2];
/// double.run(&[x.view()], &mut [TensorMut::new(&[2], &mut out[..]).unwrap()]).unwrap();
/// assert_eq!(out, [2.0, 4.0]);
/// ```
pub fn kernel_fn<F>(f: F) -> Box<dyn Kernel>
where
    F: Fn(&[TensorRef<'_>], &mut [TensorMut<'_>]) -> Result<()> + Send + Sync + 'static,
{
    struct FnKernel<F>(F);
    impl<F> Kernel for FnKernel<F>
    where
        F: Fn(&[TensorRef<'_>], &mut [TensorMut<'_>]) -> Result<()> + Send + Sync,
    {
        fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
            (self.0)(inputs, outputs)
        }
    }
    Box::new(FnKernel(f))
}

/// Runs bound symbols. A plan asks each executor in its list, in order, whether it claims a
/// bound symbol; the first that does compiles a kernel for it.
///
/// Recognise built-in prims by [`Symbol::builtin_prim`], not by id or name (a user's registry
/// may give both to symbols of its own), and your own fusion regions by
/// [`OpView::is_region_of`]. Executors are `'static` types (the trait requires [`Any`]): a
/// region records the type of the executor it was made for.
///
/// ```
/// use std::sync::Arc;
/// use boundscope::{kernel_fn, prims, Arena, Executor, Kernel, OpView, Plan, Registry, Result, Tensor, TraceBuilder};
///
/// /// Runs only `relu`, and counts nothing: the smallest possible executor.
/// struct ReluOnly;
/// impl Executor for ReluOnly {
///     fn name(&self) -> &str { "relu_only" }
///     fn claims(&self, op: &OpView<'_>) -> bool { op.symbol().builtin_prim() == Some(prims::RELU) }
///     fn compile(&self, _op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
///         Ok(kernel_fn(|inputs, outputs| {
///             for (o, &x) in outputs[0].values_mut::<f32>()?.iter_mut().zip(inputs[0].values::<f32>()?) { *o = if x > 0.0 || x.is_nan() { x } else { 0.0 }; }
///             Ok(())
///         }))
///     }
/// }
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[3]).unwrap();
/// let y = b.relu(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let plan = Plan::compile(&trace, &[Arc::new(ReluOnly)]).unwrap();
/// let out = plan.run(&[&Tensor::new(&[3], vec![-1.0, 0.5, 2.0]).unwrap()]).unwrap();
/// assert_eq!(out[0].to_f32_vec(), &[0.0, 0.5, 2.0]);
/// ```
pub trait Executor: Any + Send + Sync {
    /// A short name, not empty and unique among a plan's executors (used in listings, notes,
    /// range filters and errors; [`Plan::compile`](crate::Plan::compile) refuses a list where
    /// two executors share one), without `,`, control characters or surrounding spaces (which
    /// `Plan::compile` refuses too: `runtime.nvtx_executors` lists names split at `,`).
    fn name(&self) -> &str;

    /// Whether this executor runs this bound symbol.
    fn claims(&self, op: &OpView<'_>) -> bool;

    /// Compiles a host kernel for a bound symbol that [`claims`](Self::claims) accepted.
    /// Executors that run on a device implement [`compile_device`](Self::compile_device)
    /// instead.
    ///
    /// # Errors
    /// Whatever stops the executor from running it; the plan fails to compile with it.
    fn compile(&self, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
        Err(Error::Execution {
            executor: self.name().to_string(),
            symbol: op.name().to_string(),
            message: "this executor has no host kernels (it runs on a device: see Executor::device)".into(),
        })
    }

    /// The dtypes its kernels take and produce. A plan asks it to claim only bound symbols
    /// whose tensors are all of these dtypes; when no executor takes a bound symbol's dtypes,
    /// compiling fails with [`Error::UnsupportedDType`], naming
    /// the op, the dtype and the executors tried. Default: `f32` only, so that a kernel written
    /// for `f32` never sees anything else.
    fn dtypes(&self) -> &[crate::DType] {
        &[crate::DType::F32]
    }

    /// Whether this executor runs this composite better whole than as the prims it decomposes
    /// into (one cuBLASLt product with its bias for `linear`, say), so that
    /// [`DecomposeFor`](crate::passes::DecomposeFor) and the front end keep it for the executor
    /// to claim. Default: no composite.
    fn prefers_whole(&self, _op: &OpView<'_>) -> bool {
        false
    }

    /// The device this executor runs on, if any; its kernels then come from
    /// [`compile_device`](Self::compile_device) and read and write device buffers. Default:
    /// none (host).
    fn device(&self) -> Option<Arc<dyn Device>> {
        None
    }

    /// Compiles a device kernel for a bound symbol that [`claims`](Self::claims) accepted.
    ///
    /// On a CUDA device, write the kernel as an `executors::cuda::CudaKernel` and return
    /// `executors::cuda::device_kernel(..)` of it: it gets typed device memory, the run's
    /// stream and state per workspace, and its rustdoc states the contract (what a kernel may
    /// touch, on which stream, when buffers are reused, errors, what is `unsafe` and why).
    /// `examples/cuda_user_executor.rs` is a complete one.
    ///
    /// # Errors
    /// Whatever stops the executor from running it; the plan fails to compile with it.
    fn compile_device(&self, op: &OpView<'_>) -> Result<Box<dyn DeviceKernel>> {
        Err(Error::Execution {
            executor: self.name().to_string(),
            symbol: op.name().to_string(),
            message: "this executor has no device kernels".into(),
        })
    }

    /// The guard kinds this executor emits itself, at which level, and for NVTX ranges in which
    /// domain (for example an NVTX range per fusion region, as nvFuser does).
    ///
    /// An executor that declares [`EmittedRange::nvtx_regions`] must push exactly one range in
    /// that domain around each region that [`OpView::region_range`] gives a range for (the
    /// regions that carry NVTX guards in any domain), and none otherwise: the runtime then pushes
    /// no range in that domain for the region, and one per other domain with NVTX guards on it.
    /// [`EmittedRange::nvtx_ops`] states the same rule for the top-level ops (not regions) it
    /// claims. [`Plan::range_map`](crate::Plan::range_map) lists those ranges as pushed by the
    /// executor. Only the first NVTX declaration per level counts, at the region and op levels
    /// only; the rest are listed in [`Plan::notes`](crate::Plan::notes). Default: none.
    fn emits(&self) -> &[EmittedRange] {
        &[]
    }

    /// Whether it can run on this machine. Default: available.
    fn availability(&self) -> Availability {
        Availability::Available
    }

    /// How a fusion pass may group this op into this executor's regions. Default:
    /// [`Fusible::No`] (the executor does not fuse).
    fn fusible(&self, _op: &OpView<'_>) -> Fusible {
        Fusible::No
    }

    /// Whether `region`, one of this executor's own regions, may run in one launch together
    /// with the independent regions beside it, as PyTorch's fused optimizers update every
    /// parameter in one multi-tensor launch. [`FuseRegions`](crate::passes::FuseRegions) joins
    /// consecutive regions for which this holds, where none reads what another computes and the
    /// same guards and scopes hold each, into one region with all their ops: its ops then have
    /// several shapes, one per independent chain, and the executor's kernel for it runs each
    /// chain over its own shape. Chains may share inputs: a kernel that runs them apart offers
    /// to write an update over its input ([`DeviceKernel::in_place`]) only where no other chain
    /// reads that input. Default: `false` (regions of one shape only).
    fn joins(&self, _region: &OpView<'_>) -> bool {
        false
    }

    /// Whether the device op `op`'s one output is a view of its input `i`: the same device
    /// memory, the output's values the input's first ones in order (a reshape is one; so is
    /// `all_reduce_wait` of a whole started value, which only orders streams). The plan then
    /// gives the output the input's buffer (as long as the input's buffer lives) and still
    /// runs the op's kernel, with the inputs only and no output buffer: the kernel must write
    /// nothing. Not for an output of the trace, which keeps a buffer of its own (the kernel then
    /// gets its output as usual). Default: none.
    fn output_views(&self, _op: &OpView<'_>) -> Option<usize> {
        None
    }

    /// The prefix of its regions' names, `<prefix>Fusion<N>`. Default: its name. A name is
    /// only a name: which executor a region was made for is recorded apart from it (see
    /// [`OpView::is_region_of`]).
    fn fusion_prefix(&self) -> &str {
        self.name()
    }

    /// The options it reads, named `<owner>.<option>`, the owner its name or a family of
    /// executors' (`cuda.*` is both CUDA executors'; see [`crate::options`]). Default: none.
    fn options(&self) -> &[crate::options::OptionSpec] {
        &[]
    }

    /// The value of each option in [`options`](Self::options) that this executor was actually
    /// configured with, however it was configured (from [`crate::options::Options`] or by its
    /// own builder methods). A plan lists the developer options among them that differ from
    /// their defaults in its header, and reports an option set in `Options` that the executor
    /// was not configured with as unused. Default: none.
    fn configured_options(&self) -> Vec<(&'static str, crate::options::OptionValue)> {
        Vec::new()
    }
}

/// A guard kind an executor emits itself, at a level, and for NVTX ranges the domain it
/// pushes them into.
///
/// The rule for NVTX region ranges, per region that is profiled (that has NVTX guards in any
/// domain), and the same for op ranges ([`nvtx_ops`](Self::nvtx_ops)), per top-level op that
/// the executor claims and that is profiled:
/// - the executor pushes exactly one range, in its declared `domain`, around the region: the
///   one [`OpView::region_range`] describes, labelled by the NVTX guards of that domain if they
///   give a label, else `<Executor>Fusion<N>: (op, ...)` (for an op, its name);
/// - the runtime pushes no range in that domain for the region;
/// - for every other domain with NVTX guards on the region, the runtime pushes exactly one
///   range, labelled from that domain's guards only.
///
/// ```
/// use boundscope::guards::{GuardKind, Level};
/// use boundscope::EmittedRange;
/// // Declared once, in a `const`, for `Executor::emits`.
/// const EMITS: [EmittedRange; 1] = [EmittedRange::nvtx_regions("my_fuser")];
/// assert_eq!(EMITS[0].kind, GuardKind::NvtxRange);
/// assert_eq!(EMITS[0].level, Level::Region);
/// assert_eq!(EMITS[0].domain, "my_fuser");
/// // A domain chosen at run time.
/// let emits = EmittedRange::nvtx_regions_in(format!("fuser{}", 2));
/// assert_eq!(emits.domain, "fuser2");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmittedRange {
    /// What it emits (e.g. [`GuardKind::NvtxRange`]).
    pub kind: GuardKind,
    /// Around what (e.g. [`Level::Region`]).
    pub level: Level,
    /// For NVTX ranges, the domain it pushes into (for example
    /// [`DEFAULT_DOMAIN`](crate::guards::DEFAULT_DOMAIN), or a domain of its own); unused for
    /// other kinds.
    pub domain: Cow<'static, str>,
}

impl EmittedRange {
    /// An NVTX range around each of its regions, pushed into `domain`.
    pub const fn nvtx_regions(domain: &'static str) -> Self {
        Self { kind: GuardKind::NvtxRange, level: Level::Region, domain: Cow::Borrowed(domain) }
    }

    /// Like [`nvtx_regions`](Self::nvtx_regions), for a domain name made at run time.
    pub fn nvtx_regions_in(domain: impl Into<String>) -> Self {
        Self { kind: GuardKind::NvtxRange, level: Level::Region, domain: Cow::Owned(domain.into()) }
    }

    /// An NVTX range around each top-level op it claims (regions excepted: declare
    /// [`nvtx_regions`](Self::nvtx_regions) for those), pushed into `domain`: for an executor
    /// whose kernels emit a range per op (a library that wraps each call in a range of its
    /// own). The range to push is [`OpView::region_range`]'s, as for regions.
    ///
    /// ```
    /// use boundscope::guards::Level;
    /// use boundscope::EmittedRange;
    /// const EMITS: [EmittedRange; 1] = [EmittedRange::nvtx_ops("my_kernels")];
    /// assert_eq!(EMITS[0].level, Level::Op);
    /// assert_eq!(EmittedRange::nvtx_ops_in("lib2").domain, "lib2");
    /// ```
    pub const fn nvtx_ops(domain: &'static str) -> Self {
        Self { kind: GuardKind::NvtxRange, level: Level::Op, domain: Cow::Borrowed(domain) }
    }

    /// Like [`nvtx_ops`](Self::nvtx_ops), for a domain name made at run time.
    pub fn nvtx_ops_in(domain: impl Into<String>) -> Self {
        Self { kind: GuardKind::NvtxRange, level: Level::Op, domain: Cow::Owned(domain.into()) }
    }
}

/// Whether an executor can run here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// It can.
    Available,
    /// It cannot, and why (no driver, no device, ...).
    Unavailable(String),
}

/// How a fusion pass may use an op for an executor's regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fusible {
    /// Not in a region.
    No,
    /// Inside a region: one output element per element of the region's iteration shape.
    Elementwise,
    /// As the last op of a region (a last-axis reduction over the iteration shape).
    EndsRegion,
}

/// The NVTX range an executor that emits its own region (or op) ranges must push around a
/// region (or op), in the domain it declared ([`EmittedRange::domain`]): the label, category, colour and payload
/// resolved from the NVTX guards of that domain on the region (the first explicit value of
/// each wins), else the runtime's defaults, so that the range is the same whoever emits it.
///
/// Push it with [`prepare`](Self::prepare) once, when the kernel is compiled, and
/// [`PreparedRegionRange::in_scope`] around each run of the region. It follows the profiling
/// decision that the run took when it started ([`Plan::set_profiling`](crate::Plan::set_profiling)
/// during a run changes nothing until the next run).
#[derive(Clone, Debug)]
pub struct RegionRange {
    label: String,
    domain: String,
    level: Level,
    ops: u32,
    category: u32,
    color: u32,
    payload: Option<u64>,
    details: Option<ScopeDetails>,
    profiling: Arc<AtomicBool>,
}

/// What a [`RegionRange`] pushes, resolved when the plan is compiled.
pub(crate) struct RegionRangeParts {
    pub label: String,
    pub domain: String,
    /// [`Level::Region`], or [`Level::Op`] for an executor that pushes op ranges.
    pub level: Level,
    pub ops: u32,
    pub category: u32,
    pub color: u32,
    pub payload: Option<u64>,
    /// The structured payload it would carry; kept only where the domain's profiler takes it.
    pub details: Option<ScopeDetails>,
}

impl RegionRange {
    pub(crate) fn new(parts: RegionRangeParts, profiling: Arc<AtomicBool>) -> Self {
        let RegionRangeParts { label, domain, level, ops, category, color, payload, details } = parts;
        let details = details.filter(|_| crate::core::guards::takes_details(&domain));
        let payload = if details.is_some() { None } else { payload };
        Self { label, domain, level, ops, category, color, payload, details, profiling }
    }

    /// Around what: [`Level::Region`] for a region, [`Level::Op`] for an op of an executor that
    /// declared [`EmittedRange::nvtx_ops`].
    pub fn level(&self) -> Level {
        self.level
    }

    /// The label: the one the domain's NVTX guards give, else `<Executor>Fusion<N>: (mul, add, ...)`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The NVTX domain: the one the executor declared in [`Executor::emits`].
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The number of fused ops.
    pub fn ops(&self) -> u32 {
        self.ops
    }

    /// The NVTX category (the region level's, unless a guard set one).
    pub fn category(&self) -> u32 {
        self.category
    }

    /// The ARGB colour (the executor's, unless a guard set one).
    pub fn color(&self) -> u32 {
        self.color
    }

    /// The `u64` payload (the number of fused ops, unless a guard set one), where it carries
    /// no structured payload.
    pub fn payload(&self) -> Option<u64> {
        self.payload
    }

    /// The same range, pushed by the kernel of compiled step `step` (its details say so).
    pub(crate) fn at_step(&self, step: usize) -> RegionRange {
        let mut range = self.clone();
        if let Some(d) = &mut range.details {
            (d.first_step, d.steps) = (step as u32, 1);
        }
        range
    }

    /// The structured payload, where the domain's profiler takes payload schemas.
    pub fn details(&self) -> Option<&ScopeDetails> {
        self.details.as_ref()
    }

    /// Registers the label and builds the attributes, once, when the kernel is compiled.
    ///
    /// # Errors
    /// [`Error::InvalidLabel`] if the domain name or the label cannot be used.
    pub fn prepare(&self) -> Result<PreparedRegionRange> {
        let range = PreparedNvtxRange::new(
            &self.domain,
            &self.label,
            self.category,
            self.color,
            self.payload,
            self.details.as_ref(),
        )?;
        Ok(PreparedRegionRange { range, profiling: self.profiling.clone() })
    }
}

/// A region range ready to push from inside a kernel; pushes nothing when the run it is part
/// of has profiling off.
pub struct PreparedRegionRange {
    range: PreparedNvtxRange,
    profiling: Arc<AtomicBool>,
}

impl PreparedRegionRange {
    /// Runs `f` inside the range (if the current run profiles; outside a run, if the plan's
    /// profiling switch is on).
    #[inline]
    pub fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let profiling = match RUN_PROFILING.with(Cell::get) {
            RunProfiling::On => true,
            RunProfiling::Off => false,
            RunProfiling::NoRun => self.profiling.load(Ordering::Relaxed),
        };
        if !profiling {
            return f();
        }
        struct Pop<'r>(&'r PreparedNvtxRange);
        impl Drop for Pop<'_> {
            fn drop(&mut self) {
                self.0.pop();
            }
        }
        self.range.push();
        let _pop = Pop(&self.range);
        f()
    }
}

/// The profiling decision of the run in progress on this thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunProfiling {
    NoRun,
    On,
    Off,
}

thread_local! {
    static RUN_PROFILING: Cell<RunProfiling> = const { Cell::new(RunProfiling::NoRun) };
}

/// Holds a run's profiling decision for the kernels it calls on this thread, so that a run
/// keeps one decision from its first step to its last; restores the previous one (a run that
/// called this one) when dropped, also while unwinding.
pub(crate) struct RunDecision {
    previous: RunProfiling,
}

impl RunDecision {
    #[inline]
    pub fn enter(profiling: bool) -> Self {
        let decision = if profiling { RunProfiling::On } else { RunProfiling::Off };
        Self { previous: RUN_PROFILING.with(|d| d.replace(decision)) }
    }
}

impl Drop for RunDecision {
    #[inline]
    fn drop(&mut self) {
        RUN_PROFILING.with(|d| d.set(self.previous));
    }
}

/// What an executor sees of one bound symbol when it is asked to claim and compile it.
#[derive(Clone, Copy)]
pub struct OpView<'t> {
    pub(crate) trace: &'t Trace<'t>,
    pub(crate) bound_symbol: &'t BoundSymbol<'t>,
    pub(crate) symbol: &'t Symbol,
    pub(crate) region_range: Option<&'t RegionRange>,
}

impl<'t> OpView<'t> {
    pub(crate) fn new(trace: &'t Trace<'t>, bound_symbol: &'t BoundSymbol<'t>) -> Result<Self> {
        let symbol = trace.registry().get(bound_symbol.symbol())?.symbol;
        Ok(Self { trace, bound_symbol, symbol, region_range: None })
    }

    /// Whether guards are attached to this bound symbol's subsymbols (which run only if it is
    /// decomposed): an executor that would run it whole leaves it to its decomposition then, so
    /// that no guard is dropped.
    pub fn has_subsymbol_guards(&self) -> bool {
        let Some(position) = self.trace.bound_symbols().iter().position(|b| std::ptr::eq(b, self.bound_symbol)) else {
            // A subsymbol itself (inside a composite being decomposed): guards that reach
            // below the top level could be meant for its subsymbols.
            return self.trace.guards.per_op.iter().flatten().any(|a| a.depth > 1);
        };
        (0..=position).any(|owner| {
            self.trace.guards.at(owner).iter().any(|a| a.depth > 0 && owner + (a.span.max(1) as usize) > position)
        })
    }

    /// The view of the top-level bound symbol at `position`, for tools that compile or inspect
    /// bound symbols outside a plan (code generators, benchmarks).
    ///
    /// # Errors
    /// [`Error::InvalidBoundSymbol`] past the end; [`Error::UnknownSymbol`] for a symbol the
    /// registry lacks.
    pub fn of(trace: &'t Trace<'t>, position: usize) -> Result<Self> {
        let bound_symbol = trace
            .bound_symbols()
            .get(position)
            .ok_or(Error::InvalidBoundSymbol { index: position, len: trace.len() })?;
        Self::new(trace, bound_symbol)
    }

    /// Whether this is a fusion region that [`FuseRegions`](crate::passes::FuseRegions) made
    /// for an executor of `executor`'s type (named `<its prefix>Fusion<N>`): the regions an
    /// executor should claim. A region made by another executor's fusion, or by hand, is not
    /// one, whatever its name.
    ///
    /// ```
    /// use boundscope::executors::{CpuFusion, CpuReference};
    /// use boundscope::passes::{FuseRegions, Pass};
    /// use boundscope::{Arena, OpView, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[8]).unwrap();
    /// let e = b.exp(x).unwrap();
    /// let y = b.neg(e).unwrap();
    /// b.output(y).unwrap();
    /// let fused = FuseRegions::new(CpuFusion::shared()).run(&b.finish().unwrap(), &arena).unwrap();
    /// let region = OpView::of(&fused, 0).unwrap();
    /// assert!(region.is_region_of(&CpuFusion::new()));
    /// assert!(!region.is_region_of(&CpuReference::new()));
    /// ```
    pub fn is_region_of(&self, executor: &dyn Executor) -> bool {
        self.symbol_id() == prims::REGION
            && self.bound_symbol.fused_by() == Some(FusedBy::of(executor))
            && self.name().strip_prefix(executor.fusion_prefix()).is_some_and(|rest| rest.starts_with("Fusion"))
    }

    /// For a fusion region whose executor declared that it emits NVTX region ranges
    /// ([`Executor::emits`]), and that carries NVTX guards in any domain: the one range to push
    /// around the region, in the declared domain. Likewise for a top-level op (not a region)
    /// whose executor declared [`EmittedRange::nvtx_ops`]: the range to push around the op.
    pub fn region_range(&self) -> Option<&'t RegionRange> {
        self.region_range
    }

    /// The ops of a fusion region (its subsymbols), each as an `OpView`.
    pub fn region_ops(&self) -> Result<Vec<OpView<'t>>> {
        self.bound_symbol.subsymbols().iter().map(|s| OpView::new(self.trace, s)).collect()
    }

    /// The `(input, output)` positions (tensor inputs, outputs) where this bound symbol's
    /// output `output` updates in place ([`TraceBuilder::update`](crate::TraceBuilder::update))
    /// the trace input it reads at position `input` (and nowhere else), of the same shape and
    /// dtype: the pairs a device kernel may offer to write over ([`DeviceKernel::in_place`]).
    /// Empty for most ops; an optimizer's fused update lists its parameter and its state.
    ///
    /// ```
    /// use boundscope::{Arena, OpView, Registry, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let (w, g) = (b.input(&[4]).unwrap(), b.input(&[4]).unwrap());
    /// let step = b.mul_scalar(g, 0.1).unwrap();
    /// let updated = b.sub(w, step).unwrap(); // w - 0.1 g
    /// b.update(w, updated).unwrap();
    /// let trace = b.finish().unwrap();
    /// assert_eq!(OpView::of(&trace, 1).unwrap().in_place_updates().as_slice(), &[(0, 0)]);
    /// assert!(OpView::of(&trace, 0).unwrap().in_place_updates().is_empty());
    /// ```
    pub fn in_place_updates(&self) -> smallvec::SmallVec<[(usize, usize); 4]> {
        let mut pairs = smallvec::SmallVec::new();
        for &(input, value) in self.trace.updates() {
            let Some(output) = self.bound_symbol.outputs().iter().position(|&o| o == value) else {
                continue;
            };
            let mut reads = self.bound_symbol.inputs().enumerate().filter(|&(_, v)| v == input).map(|(k, _)| k);
            let (Some(k), None) = (reads.next(), reads.next()) else {
                continue;
            };
            let (a, b) = (self.trace.meta(input), self.trace.meta(value));
            if a.is_some_and(|a| b.is_some_and(|b| a.shape == b.shape && a.dtype == b.dtype)) {
                pairs.push((k, output));
            }
        }
        pairs
    }

    /// Whether output `i` is an output of the trace (so it keeps a buffer of its own, also
    /// where [`Executor::output_views`] says it is a view).
    pub fn is_trace_output(&self, i: usize) -> bool {
        self.bound_symbol.outputs().get(i).is_some_and(|o| self.trace.outputs().contains(o))
    }

    /// The number of values a region (or any bound symbol) defines.
    pub fn output_count(&self) -> usize {
        self.bound_symbol.outputs().len()
    }

    /// The registry the trace's symbols come from.
    pub fn registry(&self) -> &'t crate::core::ir::Registry {
        self.trace.registry()
    }

    /// The symbol's id.
    pub fn symbol_id(&self) -> SymbolId {
        self.bound_symbol.symbol()
    }

    /// The symbol's definition.
    pub fn symbol(&self) -> &'t Symbol {
        self.symbol
    }

    /// The bound symbol's name: its own (regions: `CpuFusion0`) or its symbol's.
    pub fn name(&self) -> &'t str {
        self.bound_symbol.name().unwrap_or(&self.symbol.name)
    }

    /// The symbol's category.
    pub fn category(&self) -> Category {
        self.symbol.category
    }

    /// The bound symbol itself.
    pub fn bound_symbol(&self) -> &'t BoundSymbol<'t> {
        self.bound_symbol
    }

    /// All arguments, in order.
    pub fn args(&self) -> &'t [Arg<'t>] {
        self.bound_symbol.args()
    }

    /// The dtype of a value of the trace (`f32` for a value it does not have).
    pub fn dtype_of(&self, value: ValueId) -> crate::DType {
        self.trace.dtype_of(value)
    }

    /// The distinct dtypes of its tensor inputs and outputs, in order of first appearance.
    pub fn dtypes(&self) -> smallvec::SmallVec<[crate::DType; 3]> {
        let mut dtypes = smallvec::SmallVec::new();
        for v in self.bound_symbol.inputs().chain(self.bound_symbol.outputs().iter().copied()) {
            let d = self.dtype_of(v);
            if !dtypes.contains(&d) {
                dtypes.push(d);
            }
        }
        dtypes
    }

    /// The dtypes of its outputs, in order.
    pub fn output_dtypes(&self) -> impl Iterator<Item = crate::DType> + '_ {
        self.bound_symbol.outputs().iter().map(|&v| self.dtype_of(v))
    }

    /// The shape of a value of the trace.
    pub fn shape_of(&self, value: ValueId) -> Result<&'t [usize]> {
        self.trace
            .meta(value)
            .map(|m| m.shape)
            .ok_or(Error::UndefinedValue { value, used_by: self.symbol.name.clone() })
    }

    /// The shape of the `i`-th tensor argument.
    pub fn input_shape(&self, i: usize) -> Result<&'t [usize]> {
        let value =
            self.bound_symbol.inputs().nth(i).ok_or_else(|| self.missing(i, "a tensor (counting tensors only)"))?;
        self.shape_of(value)
    }

    /// The shape of the `i`-th output.
    pub fn output_shape(&self, i: usize) -> Result<&'t [usize]> {
        let value = *self.bound_symbol.outputs().get(i).ok_or_else(|| Error::MalformedTrace {
            position: None,
            detail: format!("`{}` has no output {i}", self.symbol.name),
        })?;
        self.shape_of(value)
    }

    /// The `i`-th argument (of any kind) as a scalar.
    pub fn scalar(&self, i: usize) -> Result<f32> {
        match self.args().get(i) {
            Some(Arg::Scalar(s)) => Ok(*s),
            _ => Err(self.missing(i, "a scalar")),
        }
    }

    /// The `i`-th argument (of any kind) as a dimension list.
    pub fn dims(&self, i: usize) -> Result<&'t [usize]> {
        match self.args().get(i) {
            Some(Arg::Dims(d)) => Ok(d),
            _ => Err(self.missing(i, "a list of dimensions")),
        }
    }

    fn missing(&self, position: usize, expected: &'static str) -> Error {
        Error::ArgumentKind {
            symbol: self.symbol.name.clone(),
            position,
            expected,
            got: self.args().get(position).map_or("nothing", Arg::kind_name),
        }
    }
}

impl fmt::Debug for OpView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpView").field("symbol", &self.symbol.name).field("args", &self.args()).finish()
    }
}
