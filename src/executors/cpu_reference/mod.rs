//! The CPU reference executor: every built-in prim on contiguous row-major host buffers.
//!
//! It is simple and obviously correct on purpose: it is the oracle that every other executor
//! is tested against. Each kernel does its shape analysis (broadcast strides, permutations)
//! when it is compiled, so a run is only the arithmetic. That arithmetic still runs at the
//! machine's speed: its loops use the widest vector instructions the processor has (chosen at
//! run time, with identical results on every instruction set), and large ops are split over
//! the cores.

mod axis_kernels;
mod checked_buffers;
pub(crate) mod in_f32;
mod index_kernels;
pub(crate) mod kernels;
pub mod math;
mod products;
mod row_kernels;
mod select_kernels;
pub(crate) mod vector_loops;

use std::sync::Arc;

use smallvec::SmallVec;

use crate::core::ir::{prims, Arg, ArgInfo, SymbolId, ValueId};
use crate::core::plan::{Executor, Kernel, OpView};
use crate::error::{Error, Result};

/// Runs every built-in prim, and every user symbol that has a CPU kernel, on the host.
///
/// Composites are not claimed: a plan decomposes them into prims.
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[1, 3]).unwrap();
/// let y = b.softmax(x).unwrap();
/// b.output(y).unwrap();
/// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
/// let out = plan.run(&[&Tensor::new(&[1, 3], vec![1.0, 1.0, 1.0]).unwrap()]).unwrap();
/// assert!((out[0].to_f32_vec()[0] - 1.0 / 3.0).abs() < 1e-6);
/// ```
///
/// Ops with at least 2^16 elements a part (and matmuls with as many multiply-adds) are split
/// over the machine's cores, a part per core, on worker threads named `boundscope-cpu-<k>` (in
/// Nsight too); costly ones (`exp`, `log`, `tanh`, `sigmoid`, `gelu`, `softmax`, `layer_norm`)
/// from 2^13 elements a part; smaller ones run on the calling thread. Products with few rows a
/// part are split by columns. A worker that finished a part polls for the next one for 100 us
/// before it sleeps, so that plans of small ops, run back to back, do not pay for waking it.
/// Guards and NVTX ranges stay on the calling thread, around the whole op. Results do not
/// depend on the split: rows are never cut, so each element and each row's sum is computed in
/// the same order.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuReference {
    threads: usize,
}

impl CpuReference {
    /// The executor's name.
    pub const NAME: &'static str = "cpu_reference";

    /// Every core (the default).
    pub const fn new() -> Self {
        Self { threads: 0 }
    }

    /// Splits large ops over at most `threads` threads, the calling one included; 0 means
    /// every core the machine offers, 1 keeps every op on the calling thread. More threads
    /// than cores are capped at the cores.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use boundscope::executors::CpuReference;
    /// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[1 << 18]).unwrap();
    /// let y = b.exp(x).unwrap();
    /// b.output(y).unwrap();
    /// let trace = b.finish().unwrap();
    /// let x = Tensor::from_fn(&[1 << 18], |i| (i % 7) as f32);
    /// let one = Plan::compile(&trace, &[Arc::new(CpuReference::new().threads(1))]).unwrap();
    /// let all = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    /// assert_eq!(one.run(&[&x]).unwrap()[0].to_f32_vec(), all.run(&[&x]).unwrap()[0].to_f32_vec());
    /// ```
    pub const fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// A shared handle, ready for a plan's executor list.
    pub fn shared() -> Arc<dyn Executor> {
        Arc::new(CpuReference::new())
    }
}

/// The built-in prim this bound symbol applies, if it is one: by the mark only the built-ins'
/// registration sets ([`Symbol::builtin_prim`](crate::Symbol::builtin_prim)), never by id or
/// name, which a user's registry may give to symbols of its own.
pub(crate) fn builtin_prim(op: &OpView<'_>) -> Option<SymbolId> {
    op.symbol().builtin_prim()
}

/// Checks a bound symbol of built-in prim `id` against that prim's own signature and shape
/// rule, on the trace's metadata: every shape relation the built-in kernels (CPU and generated
/// CUDA) rely on. The error says which relation does not hold.
pub(crate) fn check_builtin(id: SymbolId, op: &OpView<'_>) -> std::result::Result<(), String> {
    let name = op.name();
    let (params, rule) = prims::prim_rule(id).ok_or_else(|| format!("`{name}` is not a built-in prim"))?;
    let args = op.args();
    if args.len() != params.len() {
        return Err(format!("`{name}` has {} argument(s); the built-in takes {}", args.len(), params.len()));
    }
    let mut infos: SmallVec<[ArgInfo<'_>; 4]> = SmallVec::new();
    for (i, (arg, kind)) in args.iter().zip(params).enumerate() {
        if !kind.accepts(arg) {
            return Err(format!("argument {i} of `{name}` must be {}", kind.describe()));
        }
        infos.push(match *arg {
            Arg::Value(v) => {
                let meta = op.trace.meta(v).ok_or_else(|| format!("`{name}` uses {v}, which has no metadata"))?;
                ArgInfo::Tensor { dtype: meta.dtype, shape: meta.shape }
            }
            Arg::Scalar(s) => ArgInfo::Scalar(s),
            Arg::Dims(d) => ArgInfo::Dims(d),
            Arg::DType(d) => ArgInfo::DType(d),
        });
    }
    let expected =
        rule(&infos).map_err(|detail| format!("`{name}` does not fit the built-in's shape rule: {detail}"))?;
    let [output] = op.bound_symbol().outputs() else {
        return Err(format!("`{name}` defines {} values; the built-in defines one", op.output_count()));
    };
    let meta = op.trace.meta(*output).ok_or_else(|| format!("`{name}` defines {output}, which has no metadata"))?;
    if meta.dtype != expected.dtype || meta.shape != expected.shape.as_slice() {
        return Err(format!(
            "`{name}` defines {output} as {}{:?}, but the built-in gives {}{:?}",
            meta.dtype,
            meta.shape,
            expected.dtype,
            expected.shape.as_slice()
        ));
    }
    Ok(())
}

/// [`check_builtin`] as the typed error of `executor`.
pub(crate) fn require_builtin(executor: &str, id: SymbolId, op: &OpView<'_>) -> Result<()> {
    check_builtin(id, op).map_err(|detail| Error::KernelPrecondition {
        executor: executor.into(),
        symbol: op.name().into(),
        detail,
    })
}

/// The iteration shape of ops that the built-in fusion executors (CPU and CUDA) run as one
/// kernel (a region's ops, or a single op), once every relation those kernels rely on is
/// checked: each op is a built-in elementwise prim defining that shape, or a last-axis `sum`
/// or `max` of that shape as the last op, each fitting the built-in's own rule
/// ([`check_builtin`]); each of `inputs` (the values the kernel reads, from `view`'s trace)
/// broadcasts to that shape.
pub(crate) fn fused_shape<'t>(
    view: &OpView<'t>,
    ops: &[OpView<'t>],
    inputs: &[ValueId],
) -> std::result::Result<&'t [usize], String> {
    let mut shape: Option<&'t [usize]> = None;
    for (i, op) in ops.iter().enumerate() {
        let name = op.name();
        let id = builtin_prim(op).ok_or_else(|| format!("`{name}` is not a built-in prim"))?;
        let reduction = matches!(id, prims::SUM | prims::MAX);
        // `cast` is elementwise too: the value, read as `f32` and written as its dtype (it is
        // never fusible, as a region rounds only its outputs; CudaOps runs it alone).
        if !reduction && !prims::UNARY.contains(&id) && !prims::BINARY.contains(&id) && id != prims::CAST {
            return Err(format!("`{name}` cannot be fused: only elementwise prims and a last `sum` or `max` can"));
        }
        if reduction && i + 1 != ops.len() {
            return Err(format!("the reduction `{name}` must be the region's last op"));
        }
        check_builtin(id, op)?;
        let op_shape = if reduction { op.input_shape(0) } else { op.output_shape(0) }.map_err(|e| e.to_string())?;
        match shape {
            Some(s) if s != op_shape => {
                return Err(format!("`{name}` iterates over {op_shape:?}, not the region's shape {s:?}"))
            }
            _ => shape = Some(op_shape),
        }
    }
    let shape = shape.ok_or("an empty region")?;
    for &v in inputs {
        let s = view.shape_of(v).map_err(|e| e.to_string())?;
        if prims::broadcast_shapes(s, shape).ok().as_deref() != Some(shape) {
            return Err(format!("input {v} has shape {s:?}, which does not broadcast to the region's shape {shape:?}"));
        }
    }
    Ok(shape)
}

/// How the built-in fusion executors (CPU and CUDA) may group a built-in prim: elementwise
/// prims inside a region, a last-axis `sum` or `max` at its end, nothing else.
pub(crate) fn builtin_fusible(op: &OpView<'_>) -> crate::core::plan::Fusible {
    use crate::core::plan::Fusible;
    match builtin_prim(op) {
        Some(id) if prims::UNARY.contains(&id) || prims::BINARY.contains(&id) => Fusible::Elementwise,
        Some(prims::SUM | prims::MAX) => Fusible::EndsRegion,
        _ => Fusible::No,
    }
}

impl Executor for CpuReference {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol().has_cpu_kernel() || builtin_prim(op).is_some() || self.prefers_whole(op)
    }

    /// `linear` and `matmul_transposed` (of float operands): one product that reads its second
    /// operand transposed (and adds `linear`'s bias as it writes each row), where their
    /// decompositions copy the transpose first. `softmax` and `layer_norm`: each row read once
    /// and kept in the cache for its passes, where the decompositions write and read a tensor
    /// per prim (the same bits: see `row_kernels`). Not where guards sit on their subsymbols,
    /// which only the decomposition runs.
    fn prefers_whole(&self, op: &OpView<'_>) -> bool {
        matches!(
            op.symbol().builtin_composite(),
            Some(prims::LINEAR | prims::MATMUL_TRANSPOSED | prims::SOFTMAX | prims::LAYER_NORM)
        ) && op.dtypes().iter().all(|d| d.is_float())
            && !op.has_subsymbol_guards()
    }

    /// Every dtype: built-in prims compute in `f32` and round their results to the op's dtype;
    /// your symbols' CPU kernels see the dtypes in their views and round their own results.
    fn dtypes(&self) -> &[crate::DType] {
        &crate::DType::ALL
    }

    fn compile(&self, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
        if let Some(factory) = &op.symbol().cpu_kernel {
            return factory(op);
        }
        // The built-in kernels check the buffers they are given (see `checked_buffers`); your
        // symbols' kernels are yours.
        if let Some(id) = op.symbol().builtin_composite().filter(|_| self.prefers_whole(op)) {
            return checked_buffers::CheckedBuffers::wrap(kernels::compile_composite(id, op, self.threads)?, op);
        }
        let id = builtin_prim(op)
            .ok_or_else(|| Error::NoExecutor { symbol: op.name().to_string(), tried: vec![Self::NAME.to_string()] })?;
        require_builtin(Self::NAME, id, op)?;
        checked_buffers::CheckedBuffers::wrap(kernels::compile(id, op, self.threads)?, op)
    }
}
