//! The collectives as bound symbols ([`Collectives`]) and the executor that runs them on a
//! rank's communicator ([`CollectiveExecutor`]).

use std::sync::{Arc, Mutex, OnceLock};

use super::communicator::{Collective, Communicator, ReduceOp};
use crate::core::ir::{
    Arg, ArgInfo, Category, DType, ParamKind, Registry, Symbol, SymbolId, TensorMeta, TraceBuilder, ValueId,
};
use crate::core::plan::{EmittedRange, Executor, Kernel, OpView, PreparedRegionRange};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::{Error, Result};

const REDUCE_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max];

/// The dtypes collectives take.
pub(super) const COLLECTIVE_DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// The NVTX domain the collective executors push their ranges into by default.
pub(super) const COLLECTIVES_DOMAIN: &str = "collectives";

/// The collective symbols, registered in a [`Registry`] through the same API as a user's own
/// symbols, and the methods that bind them in a trace:
///
/// | symbol | arguments | output shape |
/// | --- | --- | --- |
/// | `all_reduce_sum`, `_mean`, `_max` | `x` | `x`'s |
/// | `all_gather` | `x`, the world size | `[world * d0, d1, ...]`: the ranks' `x` along the first axis |
/// | `reduce_scatter_sum`, `_mean`, `_max` | `x`, the world size | `[d0 / world, d1, ...]`: this rank's part of the combination |
/// | `broadcast` | `x`, the root | `x`'s |
/// | `all_reduce_start_sum`, `_mean`, `_max` | `x` | `x`'s: read only by `all_reduce_wait` |
/// | `all_reduce_wait` | the started value, `x`, an offset, a shape | the shape: that part of the result |
///
/// Tensors of rank 1 or more, in `f32`, bf16 or f16; the world size is part of the trace
/// (shapes depend on it), and the executors ([`CollectiveExecutor`] on the host,
/// `NcclExecutor` on GPUs) refuse a trace whose world size is not their communicator's, and a
/// started `all_reduce` that anything but its waits reads. No other executor claims them: a
/// plan without one of those is [`Error::NoExecutor`] naming the symbol.
///
/// Gradients ([`passes::Grad`](crate::passes::Grad)) are those of the sum of the ranks'
/// losses, as `torch.distributed.nn.functional`'s: `all_reduce`'s is the `all_reduce` of the
/// ranks' gradients (sum or mean), `all_gather`'s this rank's part of their sum
/// (`reduce_scatter`), `reduce_scatter`'s their `all_gather` (over the world for `mean`). The
/// maxima and `broadcast` have none yet ([`Error::NoGradient`] names them).
///
/// ```
/// use std::thread;
/// use boundscope::distributed::{CollectiveExecutor, Collectives, Communicator, InProcessGroup, ReduceOp};
/// use boundscope::executors::CpuReference;
/// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
/// let mut registry = Registry::with_builtins();
/// let collectives = Collectives::register(&mut registry).unwrap();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2]).unwrap();
/// let doubled = b.mul_scalar(x, 2.0).unwrap();
/// let summed = collectives.all_reduce(&mut b, doubled, ReduceOp::Sum).unwrap();
/// b.output(summed).unwrap();
/// let trace = b.finish().unwrap();
/// let results: Vec<Vec<f32>> = thread::scope(|s| {
///     let ranks = InProcessGroup::new("example", 2).unwrap();
///     let (trace, collectives) = (&trace, &collectives);
///     let handles: Vec<_> = ranks
///         .into_iter()
///         .map(|comm| {
///             s.spawn(move || {
///                 let rank = comm.rank() as f32;
///                 let executor = CollectiveExecutor::new(comm, collectives);
///                 let plan = Plan::compile(trace, &[executor.shared(), CpuReference::shared()]).unwrap();
///                 let input = Tensor::new(&[2], vec![rank, 10.0 * rank]).unwrap();
///                 plan.run(&[&input]).unwrap()[0].to_f32_vec()
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// // Rank 0 doubles [0, 0], rank 1 [1, 10]: both get the sum.
/// assert_eq!(results, vec![vec![2.0, 20.0], vec![2.0, 20.0]]);
/// ```
#[derive(Clone, Debug)]
pub struct Collectives {
    all_reduce: [SymbolId; 3],
    all_gather: SymbolId,
    reduce_scatter: [SymbolId; 3],
    broadcast: SymbolId,
    all_reduce_start: [SymbolId; 3],
    all_reduce_wait: SymbolId,
}

/// What one collective symbol does, as an executor runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CollectiveStep {
    /// The whole collective: its result is ready when the step ends.
    Whole(Collective),
    /// `all_reduce_start`: starts an `all_reduce`, which may run on while later steps run.
    Start(ReduceOp),
    /// `all_reduce_wait`: a part of the result of a started `all_reduce` (from its value
    /// `offset`), once it has ended.
    Wait {
        /// The part's first value.
        offset: usize,
    },
}

impl Collectives {
    /// Registers the collective symbols in `registry`.
    ///
    /// # Errors
    /// [`Error::DuplicateSymbol`] if the registry already has them (register them once per
    /// registry).
    pub fn register(registry: &mut Registry) -> Result<Self> {
        // The gradient rules bind collectives themselves: they find the ids here once all are
        // registered.
        let ids: Arc<OnceLock<Collectives>> = Arc::new(OnceLock::new());
        let tensor = ParamKind::Tensor;
        let mut reduce = |name: &str, op: Option<ReduceOp>| {
            let symbol = Symbol::new(name, Category::Collective).params(&[tensor]).shape_rule(|args| {
                let (dtype, shape) = collective_tensor(args)?;
                Ok(TensorMeta::new(dtype, shape))
            });
            // The gradient of the sum (mean) of the ranks' losses: the sum (mean) of the ranks'
            // gradients, as `torch.distributed.nn.functional.all_reduce`.
            let symbol = match (op, ids.clone()) {
                (Some(op), ids) => {
                    symbol.vjp(move |b, v| Ok(vec![Some(grad_ids(&ids)?.all_reduce(b, v.cotangent, op)?)]))
                }
                (None, _) => symbol,
            };
            registry.register(symbol)
        };
        let all_reduce = [
            reduce("all_reduce_sum", Some(ReduceOp::Sum))?,
            reduce("all_reduce_mean", Some(ReduceOp::Mean))?,
            reduce("all_reduce_max", None)?,
        ];
        let with_world = |name: &str, gather: bool| {
            Symbol::new(name, Category::Collective).params(&[tensor, ParamKind::Scalar]).shape_rule(move |args| {
                let (dtype, shape) = collective_tensor(args)?;
                let world = count(args.get(1), "the world size", 1)?;
                let mut out = shape.to_vec();
                if gather {
                    out[0] = shape[0].checked_mul(world).ok_or_else(|| {
                        format!("all_gather of {} rows on {world} ranks: the row count overflows", shape[0])
                    })?;
                } else if !shape[0].is_multiple_of(world) {
                    return Err(format!(
                        "reduce_scatter gives each of {world} ranks an equal part of the first axis, but it has \
                         {} rows: make it a multiple of the world size",
                        shape[0]
                    ));
                } else {
                    out[0] /= world;
                }
                Ok(TensorMeta::new(dtype, &out))
            })
        };
        let world_of = |v: &crate::VjpInput<'_, '_>| match v.args.get(1) {
            Some(crate::Arg::Scalar(w)) => Ok(*w as usize),
            _ => Err(Error::InvalidGradient {
                detail: format!("`{}`'s second argument, the world size, is not a scalar", v.name),
            }),
        };
        // all_gather's gradient: this rank's part of the sum of the ranks' gradients; and back.
        let gather_ids = ids.clone();
        let all_gather = registry.register(with_world("all_gather", true).vjp(move |b, v| {
            let world = world_of(v)?;
            Ok(vec![Some(grad_ids(&gather_ids)?.reduce_scatter(b, v.cotangent, ReduceOp::Sum, world)?), None])
        }))?;
        let scatter = |name: &str, op: ReduceOp| {
            let ids = ids.clone();
            let symbol = with_world(name, false);
            if op == ReduceOp::Max {
                return symbol;
            }
            symbol.vjp(move |b, v| {
                let world = world_of(v)?;
                let gathered = grad_ids(&ids)?.all_gather(b, v.cotangent, world)?;
                let grad = if op == ReduceOp::Mean { b.mul_scalar(gathered, 1.0 / world as f32)? } else { gathered };
                Ok(vec![Some(grad), None])
            })
        };
        let reduce_scatter = [
            registry.register(scatter("reduce_scatter_sum", ReduceOp::Sum))?,
            registry.register(scatter("reduce_scatter_mean", ReduceOp::Mean))?,
            registry.register(scatter("reduce_scatter_max", ReduceOp::Max))?,
        ];
        let broadcast = registry.register(
            Symbol::new("broadcast", Category::Collective).params(&[tensor, ParamKind::Scalar]).shape_rule(|args| {
                let (dtype, shape) = collective_tensor(args)?;
                count(args.get(1), "the root rank", 0)?;
                Ok(TensorMeta::new(dtype, shape))
            }),
        )?;
        let mut start = |name: &str| {
            registry.register(Symbol::new(name, Category::Collective).params(&[tensor]).shape_rule(|args| {
                let (dtype, shape) = collective_tensor(args)?;
                Ok(TensorMeta::new(dtype, shape))
            }))
        };
        let all_reduce_start =
            [start("all_reduce_start_sum")?, start("all_reduce_start_mean")?, start("all_reduce_start_max")?];
        let wait_params = [tensor, tensor, ParamKind::Dims, ParamKind::Dims];
        let all_reduce_wait =
            registry
                .register(Symbol::new("all_reduce_wait", Category::Collective).params(&wait_params).shape_rule(|args| {
                let (dtype, shape) = collective_tensor(args)?;
                if !matches!(args.get(1), Some(ArgInfo::Tensor { dtype: d, shape: s }) if *d == dtype && *s == shape) {
                    return Err("all_reduce_wait takes the started value and the tensor the all_reduce started from, \
                                of one dtype and shape: pass `all_reduce_start`'s output and its input"
                        .into());
                }
                let (Some(ArgInfo::Dims([offset])), Some(ArgInfo::Dims(part))) = (args.get(2), args.get(3)) else {
                    return Err("all_reduce_wait's part is an offset ([n]) and a shape".into());
                };
                let len: usize = shape.iter().product();
                let fits = part.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).and_then(|n| n.checked_add(*offset));
                if fits.is_none_or(|end| end > len) {
                    return Err(format!(
                        "all_reduce_wait's part {part:?} at offset {offset} does not fit in the {len} values started: \
                         give a part inside them"
                    ));
                }
                Ok(TensorMeta::new(dtype, part))
            }))?;
        let collectives = Self { all_reduce, all_gather, reduce_scatter, broadcast, all_reduce_start, all_reduce_wait };
        let _ = ids.set(collectives.clone());
        Ok(collectives)
    }

    /// `x` combined over the ranks by `op` (every rank gets the result).
    ///
    /// # Errors
    /// `x` is not a float tensor (`f32`, bf16 or f16) of rank 1 or more
    /// ([`Error::InvalidSymbol`] and friends, from the shape rule), or this registry is not the
    /// builder's.
    pub fn all_reduce<'a>(&self, b: &mut TraceBuilder<'a>, x: ValueId, op: ReduceOp) -> Result<ValueId> {
        b.bind(self.all_reduce[reduce_index(op)], &[x.into()])
    }

    /// The ranks' `x` one after the other along the first axis, on a world of `world` ranks.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce), and a world of 0.
    pub fn all_gather<'a>(&self, b: &mut TraceBuilder<'a>, x: ValueId, world: usize) -> Result<ValueId> {
        b.bind(self.all_gather, &[x.into(), (world as f32).into()])
    }

    /// This rank's part (a `world`-th of the first axis) of `x` combined over the ranks by `op`.
    ///
    /// # Errors
    /// As [`all_gather`](Self::all_gather), and a first axis that `world` does not divide.
    pub fn reduce_scatter<'a>(
        &self,
        b: &mut TraceBuilder<'a>,
        x: ValueId,
        op: ReduceOp,
        world: usize,
    ) -> Result<ValueId> {
        b.bind(self.reduce_scatter[reduce_index(op)], &[x.into(), (world as f32).into()])
    }

    /// Rank `root`'s `x`, on every rank.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce).
    pub fn broadcast<'a>(&self, b: &mut TraceBuilder<'a>, x: ValueId, root: usize) -> Result<ValueId> {
        b.bind(self.broadcast, &[x.into(), (root as f32).into()])
    }

    /// Starts the `all_reduce` of `x` by `op`, to overlap it with the steps after it: its
    /// value may be read only by [`all_reduce_wait`](Self::all_reduce_wait), with `x`, which
    /// gives the result. On a GPU ([`NcclExecutor`](super::NcclExecutor)) the collective runs
    /// on a stream of its own between the two, while the run's stream goes on; on the host
    /// ([`CollectiveExecutor`]) it runs whole at the start. Not differentiable: for gradients
    /// after a backward, as [`DataParallel`](super::DataParallel) places them.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce).
    pub fn all_reduce_start<'a>(&self, b: &mut TraceBuilder<'a>, x: ValueId, op: ReduceOp) -> Result<ValueId> {
        b.bind(self.all_reduce_start[reduce_index(op)], &[x.into()])
    }

    /// A part of the result of the `all_reduce` that [`all_reduce_start`](Self::all_reduce_start)
    /// started from `x` as `started`, once it has ended (the run's stream waits for it): the
    /// values from `offset` on (in `x`'s order), as a tensor of `shape` (`x`'s own shape at 0
    /// for the whole). Passing `x` keeps its memory from being reused while the collective may
    /// still read it (another tensor is a typed error when the plan compiles). Each part is one
    /// copy.
    ///
    /// # Errors
    /// `started` and `x` of different dtypes or shapes, a part outside them, and as
    /// [`all_reduce`](Self::all_reduce).
    pub fn all_reduce_wait<'a>(
        &self,
        b: &mut TraceBuilder<'a>,
        started: ValueId,
        x: ValueId,
        offset: usize,
        shape: &[usize],
    ) -> Result<ValueId> {
        b.bind(self.all_reduce_wait, &[started.into(), x.into(), Arg::Dims(&[offset]), Arg::Dims(shape)])
    }

    /// What a bound symbol of these runs, and the world size its trace assumes (`None` where
    /// its shapes do not depend on it); `None` for other symbols.
    pub(super) fn collective_of(&self, op: &OpView<'_>) -> Result<Option<(CollectiveStep, Option<usize>)>> {
        let id = op.symbol_id();
        // The shape rule has checked the scalars.
        let scalar = |i: usize| op.scalar(i).map(|s| s as usize);
        let whole = |c: Collective| CollectiveStep::Whole(c);
        if let Some(i) = self.all_reduce.iter().position(|&s| s == id) {
            return Ok(Some((whole(Collective::AllReduce(REDUCE_OPS[i])), None)));
        }
        if let Some(i) = self.reduce_scatter.iter().position(|&s| s == id) {
            return Ok(Some((whole(Collective::ReduceScatter(REDUCE_OPS[i])), Some(scalar(1)?))));
        }
        if id == self.all_gather {
            return Ok(Some((whole(Collective::AllGather), Some(scalar(1)?))));
        }
        if id == self.broadcast {
            return Ok(Some((whole(Collective::Broadcast { root: scalar(1)? }), None)));
        }
        if let Some(i) = self.all_reduce_start.iter().position(|&s| s == id) {
            return Ok(Some((CollectiveStep::Start(REDUCE_OPS[i]), None)));
        }
        if id == self.all_reduce_wait {
            let offset = op.dims(2)?.first().copied().unwrap_or(0);
            return Ok(Some((CollectiveStep::Wait { offset }, None)));
        }
        Ok(None)
    }
}

/// The ids a gradient rule binds (set when registration ends).
fn grad_ids(ids: &OnceLock<Collectives>) -> Result<&Collectives> {
    ids.get().ok_or_else(|| Error::InvalidGradient {
        detail: "a collective's gradient was asked for before `Collectives::register` finished".into(),
    })
}

fn reduce_index(op: ReduceOp) -> usize {
    REDUCE_OPS.iter().position(|&o| o == op).unwrap_or(0)
}

/// The first argument, a tensor of rank 1 or more of one of [`COLLECTIVE_DTYPES`].
fn collective_tensor<'m>(args: &[ArgInfo<'m>]) -> std::result::Result<(DType, &'m [usize]), String> {
    match args.first() {
        Some(ArgInfo::Tensor { dtype, shape }) if COLLECTIVE_DTYPES.contains(dtype) && !shape.is_empty() => {
            Ok((*dtype, shape))
        }
        Some(ArgInfo::Tensor { dtype, .. }) if COLLECTIVE_DTYPES.contains(dtype) => {
            Err("collectives take tensors of rank 1 or more, not a scalar: reshape it to [1]".into())
        }
        Some(ArgInfo::Tensor { dtype, .. }) => {
            Err(format!("collectives run on f32, bf16 or f16 tensors, not {dtype}: cast it to one of those first"))
        }
        _ => Err("the first argument must be a tensor".into()),
    }
}

/// A whole-number scalar argument of at least `least`.
fn count(arg: Option<&ArgInfo<'_>>, what: &str, least: usize) -> std::result::Result<usize, String> {
    match arg {
        Some(&ArgInfo::Scalar(v)) if v.fract() == 0.0 && v >= least as f32 && v < 1e9 => Ok(v as usize),
        Some(&ArgInfo::Scalar(v)) => Err(format!("{what} must be a whole number of at least {least}, not {v}")),
        _ => Err(format!("{what} must be given as a scalar")),
    }
}

/// The executor of one rank: runs the [`Collectives`] of its plans on its [`Communicator`]
/// (list it beside the executors that run the rest, in any order: it claims nothing else).
/// It pushes an op range around each collective in its own NVTX domain (`collectives` unless
/// [`in_domain`](Self::in_domain) says otherwise), declared as executors declare the ranges
/// they push ([`EmittedRange::nvtx_ops`]), so that the plan's range map lists them and the
/// one-range-per-scope rule holds.
///
/// Each collective blocks its rank's run until the ranks it needs have taken part. Every rank
/// must run plans with the same collectives in the same order.
pub struct CollectiveExecutor {
    communicator: Arc<dyn Communicator>,
    collectives: Collectives,
    name: String,
    emits: [EmittedRange; 1],
}

impl CollectiveExecutor {
    /// The executor of `communicator`'s rank, for the symbols `collectives` registered.
    pub fn new(communicator: impl Communicator + 'static, collectives: &Collectives) -> Self {
        Self::of(Arc::new(communicator), collectives)
    }

    /// [`new`](Self::new), for a communicator shared with other code.
    pub fn of(communicator: Arc<dyn Communicator>, collectives: &Collectives) -> Self {
        Self {
            communicator,
            collectives: collectives.clone(),
            name: "collectives".into(),
            emits: [EmittedRange::nvtx_ops(COLLECTIVES_DOMAIN)],
        }
    }

    /// The same, pushing its ranges in NVTX domain `domain`.
    pub fn in_domain(mut self, domain: impl Into<String>) -> Self {
        self.emits = [EmittedRange::nvtx_ops_in(domain)];
        self
    }

    /// As an `Arc<dyn Executor>`, for [`Plan::compile`](crate::Plan::compile)'s list.
    pub fn shared(self) -> Arc<dyn Executor> {
        Arc::new(self)
    }

    /// Its communicator.
    pub fn communicator(&self) -> &Arc<dyn Communicator> {
        &self.communicator
    }
}

impl Executor for CollectiveExecutor {
    fn name(&self) -> &str {
        &self.name
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        matches!(self.collectives.collective_of(op), Ok(Some(_)))
    }

    fn dtypes(&self) -> &[DType] {
        &COLLECTIVE_DTYPES
    }

    fn compile(&self, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
        let comm = &self.communicator;
        let (step, count) = checked_collective(&self.collectives, &self.name, op, comm.name(), comm.world_size())?;
        let range = op.region_range().map(|r| r.prepare()).transpose()?;
        // On the host a started all_reduce runs whole, and its wait copies.
        let collective = match step {
            CollectiveStep::Whole(collective) => Some(collective),
            CollectiveStep::Start(op) => Some(Collective::AllReduce(op)),
            CollectiveStep::Wait { .. } => None,
        };
        let offset = match step {
            CollectiveStep::Wait { offset } => offset,
            _ => 0,
        };
        // 16-bit values are combined in f32 and rounded once, in buffers kept with the kernel.
        let widened = (collective.is_some() && op.dtypes().first().is_some_and(|&d| d != DType::F32)).then(|| {
            let out = collective.map_or(0, |c| c.output_len(count, comm.world_size()).unwrap_or(0));
            Mutex::new((vec![0.0; count], vec![0.0; out]))
        });
        Ok(Box::new(CollectiveKernel { communicator: comm.clone(), collective, offset, range, widened }))
    }

    fn emits(&self) -> &[EmittedRange] {
        &self.emits
    }
}

/// Checks that `executor` can run `op` (one of `collectives`) on a communicator named `comm`
/// of `world` ranks: the collective and its input's length.
pub(super) fn checked_collective(
    collectives: &Collectives,
    executor: &str,
    op: &OpView<'_>,
    comm: &str,
    world: usize,
) -> Result<(CollectiveStep, usize)> {
    let failed =
        |message: String| Error::Execution { executor: executor.to_string(), symbol: op.name().to_string(), message };
    let Some((step, assumed)) = collectives.collective_of(op)? else {
        return Err(failed("not a collective of the symbols this executor was made for".into()));
    };
    if let Some(assumed) = assumed.filter(|&a| a != world) {
        return Err(failed(format!(
            "the trace was built for a world of {assumed} ranks, but communicator `{comm}` has {world}: build it \
             with the communicator's world size"
        )));
    }
    let input: usize = op.input_shape(0)?.iter().product();
    match step {
        CollectiveStep::Whole(collective) => {
            collective.output_len(input, world).map_err(failed)?;
        }
        CollectiveStep::Start(_) => collectives.check_started(op).map_err(failed)?,
        CollectiveStep::Wait { .. } => {}
    }
    Ok((step, input))
}

impl Collectives {
    /// Whether `op`'s output, a started `all_reduce`, is read by `all_reduce_wait`s only (as
    /// the value they wait for, with the start's input beside it) and at least one, and is no
    /// output of the trace: anything else would read it while the collective may still write
    /// it, let the input's memory go while the collective reads it, or never join its stream.
    /// It looks at the trace's top-level ops: a start and its waits inside a composite that an
    /// executor decomposes are refused (bind them at the top level, as `DataParallel` does).
    fn check_started(&self, op: &OpView<'_>) -> std::result::Result<(), String> {
        let Some(&started) = op.bound_symbol().outputs().first() else { return Ok(()) };
        let from = op.bound_symbol().inputs().next();
        let trace = op.trace;
        if trace.outputs().contains(&started) {
            return Err("a started all_reduce is an output of the trace: output its all_reduce_wait instead".into());
        }
        let mut waits = 0;
        for bsym in trace.bound_symbols() {
            if !bsym.inputs().any(|v| v == started) {
                continue;
            }
            let args = bsym.args();
            let waits_for_it =
                bsym.symbol() == self.all_reduce_wait && matches!(args.first(), Some(Arg::Value(v)) if *v == started);
            if waits_for_it && !matches!(args.get(1), Some(Arg::Value(v)) if Some(*v) == from) {
                return Err("an all_reduce_wait's second argument is not the tensor its all_reduce started from: \
                            pass that tensor, whose memory the collective reads until the wait"
                    .into());
            }
            if !waits_for_it {
                let name = trace.registry().get(bsym.symbol()).map(|s| s.symbol.name().to_string()).unwrap_or_default();
                return Err(format!(
                    "`{name}` reads a started all_reduce, which only all_reduce_wait may read (before it, the \
                     collective may still be writing it): read the wait's result instead"
                ));
            }
            waits += 1;
        }
        if waits == 0 {
            return Err("a started all_reduce has no all_reduce_wait: wait for it before the run ends".into());
        }
        Ok(())
    }
}

struct CollectiveKernel {
    communicator: Arc<dyn Communicator>,
    /// `None` for `all_reduce_wait`, a copy of its input's part from `offset`.
    collective: Option<Collective>,
    offset: usize,
    range: Option<PreparedRegionRange>,
    /// For 16-bit values: the input and output widened to `f32`.
    widened: Option<Mutex<(Vec<f32>, Vec<f32>)>>,
}

impl Kernel for CollectiveKernel {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let mut run = move || match (self.collective, &self.widened) {
            (None, _) => {
                for i in 0..outputs[0].data.len() {
                    outputs[0].data.set_f32(i, inputs[0].data.f32_at(self.offset + i));
                }
                Ok(())
            }
            (Some(collective), None) => {
                self.communicator.run(collective, inputs[0].values::<f32>()?, outputs[0].values_mut::<f32>()?)
            }
            (Some(collective), Some(buffers)) => {
                let mut buffers = buffers.lock().unwrap_or_else(|p| p.into_inner());
                let (input, output) = &mut *buffers;
                for (i, x) in input.iter_mut().enumerate() {
                    *x = inputs[0].data.f32_at(i);
                }
                self.communicator.run(collective, input, output)?;
                for (i, &x) in output.iter().enumerate() {
                    outputs[0].data.set_f32(i, x);
                }
                Ok(())
            }
        };
        match &self.range {
            Some(range) => range.in_scope(run),
            None => run(),
        }
    }
}
