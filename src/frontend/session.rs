//! `ProfiledSession`: from a trace to results in one call, with sane defaults.

use std::sync::Arc;

use super::environment::{Environment, ProfilingDecision};
use super::plan_cache::PlanCache;
use crate::core::guards::{NvtxRange, Selection};
use crate::core::ir::{Arena, Trace};
use crate::core::options::Options;
use crate::core::passes::{FuseRegions, FusionStrategy, Pass, Pipeline, ProfileOps};
use crate::core::plan::{Device, Executor, Plan};
use crate::core::tensor::Tensor;
use crate::error::Result;
use crate::executors::cuda::KernelVariants;
use crate::executors::{CpuFusion, CpuReference};

/// The label of the range around each run of a session's plans.
pub const RUN_LABEL: &str = "boundscope run";

/// A front end for people who never look at traces: options from the environment on top of
/// sane defaults, the standard passes, fusion, and NVTX ranges that switch on by themselves
/// when a profiler is attached (Nsight Systems, Nsight Compute), or with `BOUNDSCOPE_NVTX=1`.
///
/// ```
/// use boundscope::frontend::{Environment, ProfiledSession};
/// use boundscope::options::Options;
/// use boundscope::{Arena, Registry, Tensor, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 8]).unwrap();
/// let y = b.softmax(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
///
/// let session = ProfiledSession::new(Options::new(), &Environment::from_pairs(&[])).unwrap();
/// assert!(!session.profiling().is_on()); // no profiler attached, nothing asked for
/// let out = session.run(&trace, &arena, &[&Tensor::zeros(&[2, 8])]).unwrap();
/// assert!((out[0].to_f32_vec()[0] - 0.125).abs() < 1e-6);
///
/// let profiled = ProfiledSession::new(Options::new(), &Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "1")])).unwrap();
/// assert!(profiled.profiling().is_on());
/// assert!(ProfiledSession::new(Options::new(), &Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "yes")])).is_err());
/// ```
pub struct ProfiledSession {
    options: Options,
    profiling: ProfilingDecision,
    /// The executor fusion regions are made for (CUDA or CPU).
    fusion: Arc<dyn Executor>,
    max_region_ops: usize,
    executors: Vec<Arc<dyn Executor>>,
    /// Compiled plans, by trace fingerprint.
    pub(super) plans: PlanCache,
}

impl ProfiledSession {
    /// A session configured from the process environment.
    ///
    /// # Errors
    /// [`Error::InvalidEnvironment`](crate::Error::InvalidEnvironment) for a variable with a
    /// value it does not accept (or one that is not Unicode),
    /// [`Error::UnknownEnvironmentVariable`](crate::Error::UnknownEnvironmentVariable) for a
    /// `BOUNDSCOPE_*` variable the front end does not read (see [`Environment::apply_to`]).
    pub fn from_env() -> Result<Self> {
        Self::new(Options::new(), &Environment::process())
    }

    /// A session with `options` (set in code; they win), the rest from `env`.
    ///
    /// ```
    /// use boundscope::frontend::ProfiledSession;
    /// use boundscope::options::Options;
    /// use boundscope::{Arena, Registry, Tensor, TraceBuilder};
    ///
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[8, 8])?;
    /// let y = b.softmax(x)?;
    /// b.output(y)?;
    /// let trace = b.finish()?;
    /// // Options from code win; the rest come from BOUNDSCOPE_* variables; profiling switches on by
    /// // itself under Nsight Systems or Nsight Compute (or with BOUNDSCOPE_NVTX=1).
    /// let mut options = Options::new();
    /// options.set_str("runtime.fusion_strategy", "dataflow")?;
    /// let session = ProfiledSession::new(options, &boundscope::frontend::Environment::process())?;
    /// let out = session.run(&trace, &arena, &[&Tensor::zeros(&[8, 8])])?;
    /// # Ok::<(), boundscope::Error>(())
    /// ```
    ///
    /// Options made with only some specs ([`Options::runtime_only`], [`Options::with_specs`])
    /// get the rest at their defaults.
    ///
    /// # Errors
    /// As for [`from_env`](Self::from_env), or an option error
    /// ([`Error::ConflictingOption`](crate::Error::ConflictingOption) where `options` hold a
    /// spec of their own under a built-in option's name).
    pub fn new(mut options: Options, env: &Environment) -> Result<Self> {
        options.declare(Options::new().specs())?;
        env.apply_to(&mut options)?;
        let profiling = ProfilingDecision::decide(&options, env)?;
        let threads = usize::try_from(options.int("runtime.cpu_threads")?).unwrap_or(0);
        let cpu_fusion = CpuFusion::from_options(&options)?.threads(threads);
        let max_region_ops = cpu_fusion.max_region_ops();
        let cpu_fusion: Arc<dyn Executor> = Arc::new(cpu_fusion);
        let cpu_reference: Arc<dyn Executor> = Arc::new(CpuReference::new().threads(threads));
        let gpu = usize::try_from(options.int("runtime.gpu")?).unwrap_or(0);
        let variants = KernelVariants::from_options(&options)?;
        let (fusion, executors) = match gpu_executors(options.enum_value("runtime.device")?, gpu, variants)? {
            Some(gpu) => (gpu[0].clone(), gpu.into_iter().chain([cpu_fusion, cpu_reference]).collect()),
            None => (cpu_fusion.clone(), vec![cpu_fusion, cpu_reference]),
        };
        Ok(Self { options, profiling, fusion, max_region_ops, executors, plans: PlanCache::default() })
    }

    /// Whether (and why) this session profiles.
    pub fn profiling(&self) -> &ProfilingDecision {
        &self.profiling
    }

    /// The options in effect.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The device its plans run on: the process's handle of the GPU it chose
    /// (`runtime.device`, `BOUNDSCOPE_DEVICE`), or `None` on the CPU. Upload inputs through it
    /// (or through `CudaDevice::new()`, the same handle) to pass them as device tensors.
    ///
    /// ```
    /// use boundscope::frontend::{Environment, ProfiledSession};
    /// use boundscope::options::Options;
    /// let session = ProfiledSession::new(Options::new(), &Environment::from_pairs(&[("BOUNDSCOPE_DEVICE", "cpu")])).unwrap();
    /// assert!(session.device().is_none());
    /// ```
    pub fn device(&self) -> Option<Arc<dyn Device>> {
        // The executors' device, as `Plan::compile` takes it.
        self.executors.iter().find_map(|e| e.device())
    }

    /// The executors, in the order plans try them: those added by
    /// [`with_executor`](Self::with_executor), then the device's (fusion first), then the CPU's.
    pub fn executors(&self) -> &[Arc<dyn Executor>] {
        &self.executors
    }

    /// The same session with `executor` tried first: an executor of your own symbols, or the
    /// collectives' of a rank (`distributed::NcclExecutor` on the session's GPU,
    /// `distributed::CollectiveExecutor` on the CPU). Plans cached before are dropped.
    ///
    /// ```
    /// use boundscope::distributed::{CollectiveExecutor, Collectives, InProcessGroup, ReduceOp};
    /// use boundscope::frontend::{Environment, ProfiledSession};
    /// use boundscope::{options::Options, Arena, Registry, Tensor, TraceBuilder};
    /// let mut registry = Registry::with_builtins();
    /// let collectives = Collectives::register(&mut registry).unwrap();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[3]).unwrap();
    /// let y = collectives.all_reduce(&mut b, x, ReduceOp::Sum).unwrap();
    /// let y = b.exp(y).unwrap();
    /// b.output(y).unwrap();
    /// let trace = b.finish().unwrap();
    /// let comm = InProcessGroup::new("one", 1).unwrap().remove(0);
    /// let env = Environment::from_pairs(&[("BOUNDSCOPE_DEVICE", "cpu")]);
    /// let session = ProfiledSession::new(Options::new(), &env)
    ///     .unwrap()
    ///     .with_executor(CollectiveExecutor::new(comm, &collectives).shared());
    /// assert_eq!(session.executors()[0].name(), "collectives");
    /// let out = session.run(&trace, &arena, &[&Tensor::zeros(&[3])]).unwrap();
    /// assert_eq!(out[0].to_f32_vec(), [1.0; 3]);
    /// ```
    pub fn with_executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.executors.insert(0, executor);
        self.plans = PlanCache::default();
        self
    }

    /// The trace a session's plan runs: standard passes, profiling guards as decided, fusion
    /// as the options say.
    ///
    /// # Errors
    /// Errors of the passes.
    pub fn prepare<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        let mut prepared = Pipeline::for_executors(&self.executors).run(trace, arena)?;
        // Never a second range on what the user already profiled, in any domain.
        // Named scopes get a range at every level that profiles (one per module: cheap, and
        // what a profile is read by); ops only at `ops`.
        match self.profiling.level {
            "ops" => prepared = ProfileOps::new().skip_profiled().run(&prepared, arena)?,
            "scopes" | "regions" => prepared = ProfileOps::new().ops(false).skip_profiled().run(&prepared, arena)?,
            _ => {}
        }
        if self.options.bool("runtime.fusion")? {
            let strategy = match self.options.enum_value("runtime.fusion_strategy")? {
                "dataflow" => FusionStrategy::Dataflow,
                _ => FusionStrategy::Consecutive,
            };
            prepared = FuseRegions::new(self.fusion.clone())
                .strategy(strategy)
                .max_ops(self.max_region_ops)
                .run(&prepared, arena)?;
        }
        if self.profiling.level == "regions" {
            let profiled =
                |p: usize| prepared.guards.at(p).iter().any(|a| prepared.guards.guard(a.guard).nvtx_domain().is_some());
            let regions: Vec<usize> = (0..prepared.len())
                .filter(|&p| prepared.bound_symbols()[p].symbol() == crate::prims::REGION && !profiled(p))
                .collect();
            for p in regions {
                prepared.attach_guard(Selection::Op(crate::BoundSymbolId::from_index(p)), NvtxRange::new())?;
            }
        }
        let run_profiled =
            prepared.guards.trace_level.iter().any(|&g| prepared.guards.guard(g).nvtx_domain().is_some());
        if self.profiling.is_on() && !run_profiled {
            prepared.attach_trace_guard(NvtxRange::new().label(RUN_LABEL)?)?;
        }
        Ok(prepared)
    }

    /// Compiles `trace` for this session's executors (a new plan each time; see
    /// [`plan`](Self::plan) for the cached one).
    ///
    /// # Errors
    /// Errors of the passes and of [`Plan::compile`].
    pub fn compile(&self, trace: &Trace<'_>, arena: &Arena) -> Result<Plan> {
        let prepared = self.prepare(trace, arena)?;
        Plan::compile_with_options(&prepared, &self.executors, &self.options)
    }

    /// The session's plan for `trace`: compiled by the first call for a trace, then taken from
    /// the session's cache (the [`CACHED_PLANS`](super::CACHED_PLANS) most recently used),
    /// without running the passes again or growing `arena`. A trace that changes in any way
    /// a plan depends on (its registry, ops, shapes, dtypes, guards, or named scopes and the
    /// guards on them) gets a new plan; guards
    /// count by object, so a trace rebuilt with new guard objects is a new trace to the cache
    /// (attach the same guard objects to reuse its plan). Run it with
    /// [`Plan::run_with`] and a workspace of your own to allocate nothing per run.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use boundscope::frontend::{Environment, ProfiledSession};
    /// use boundscope::{options::Options, Arena, Registry, Tensor, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[2, 8]).unwrap();
    /// let y = b.softmax(x).unwrap();
    /// b.output(y).unwrap();
    /// let trace = b.finish().unwrap();
    /// let session = ProfiledSession::new(Options::new(), &Environment::from_pairs(&[])).unwrap();
    /// let plan = session.plan(&trace, &arena).unwrap();
    /// let grown = arena.allocated_bytes();
    /// assert!(Arc::ptr_eq(&plan, &session.plan(&trace, &arena).unwrap()));
    /// session.run(&trace, &arena, &[&Tensor::zeros(&[2, 8])]).unwrap();
    /// assert_eq!(arena.allocated_bytes(), grown);
    /// ```
    ///
    /// # Errors
    /// As for [`compile`](Self::compile).
    pub fn plan(&self, trace: &Trace<'_>, arena: &Arena) -> Result<Arc<Plan>> {
        self.plans.get_or_compile(trace, || self.compile(trace, arena))
    }

    /// From a trace to results, in one call: the cached [`plan`](Self::plan), run from its pool
    /// of workspaces. After the first call for a trace, it allocates only the owned outputs.
    ///
    /// # Errors
    /// Errors of [`plan`](Self::plan) and [`Plan::run`].
    pub fn run(&self, trace: &Trace<'_>, arena: &Arena, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.plan(trace, arena)?.run(inputs)
    }
}

/// What `runtime.device=auto` says on stderr when it runs on the CPU, from the error that
/// opening the GPU gave: why there is no GPU, not that error's own text, which is meant for
/// `runtime.device=cuda` (an executor "required", a requirement to drop).
#[cfg(feature = "cuda")]
pub(super) fn auto_fallback_note(e: crate::Error) -> String {
    let why = match e {
        crate::Error::ExecutorUnavailable { reason, .. } => reason,
        other => other.to_string(),
    };
    format!(
        "boundscope: running on the CPU (runtime.device=auto), as no GPU can be used here: {why}; \
         BOUNDSCOPE_DEVICE=cpu chooses the CPU without this note"
    )
}

/// The CUDA executors (fusion first) for `runtime.device`, generating `variants` of their
/// kernels, or `None` for the CPU. With `auto` and no usable GPU, says so once per process on
/// stderr.
fn gpu_executors(device: &str, ordinal: usize, variants: KernelVariants) -> Result<Option<Vec<Arc<dyn Executor>>>> {
    if device == "cpu" {
        return Ok(None);
    }
    #[cfg(feature = "cuda")]
    {
        use crate::executors::cuda::{CudaDevice, CudaFusion, CudaOps};
        match CudaDevice::with_ordinal(ordinal) {
            Ok(gpu) => {
                let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()).with_variants(variants));
                Ok(Some(vec![fusion, Arc::new(CudaOps::new(gpu).with_variants(variants))]))
            }
            // A GPU named by its ordinal (a rank's `LOCAL_RANK`) must exist where there are GPUs:
            // a rank that fell back to the CPU would not take part in its peers' collectives.
            Err(e) if device == "cuda" => Err(e),
            Err(e) if ordinal != 0 && crate::executors::cuda::availability() == crate::Availability::Available => {
                Err(e)
            }
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| eprintln!("{}", auto_fallback_note(e)));
                Ok(None)
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, variants);
        match device {
            "cuda" => Err(crate::Error::ExecutorUnavailable {
                executor: "cuda".into(),
                reason: "boundscope was built without its `cuda` feature".into(),
            }),
            _ => Ok(None),
        }
    }
}
