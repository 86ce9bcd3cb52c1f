//! The CPU reference executor: every built-in prim on contiguous row-major host buffers.
//!
//! It is simple and obviously correct on purpose: it is the oracle that every other executor
//! is tested against. Each kernel does its shape analysis (broadcast strides, permutations)
//! when it is compiled, so a run is only the arithmetic.

pub(crate) mod kernels;
pub mod math;

use std::sync::Arc;

use crate::core::ir::prims::{self, BUILTIN_NAMES};
use crate::core::ir::SymbolId;
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
/// assert!((out[0].data()[0] - 1.0 / 3.0).abs() < 1e-6);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuReference;

impl CpuReference {
    /// The executor's name.
    pub const NAME: &'static str = "cpu_reference";

    /// A shared handle, ready for a plan's executor list.
    pub fn shared() -> Arc<dyn Executor> {
        Arc::new(CpuReference)
    }
}

/// The built-in prim this bound symbol applies, if it is one (by id and name, so that a
/// user's registry that reuses an id for another symbol is not mistaken for a built-in).
pub(crate) fn builtin_prim(op: &OpView<'_>) -> Option<SymbolId> {
    let id = op.symbol_id();
    let is_prim = id.index() <= prims::BROADCAST_TO.index();
    (is_prim && BUILTIN_NAMES.get(id.index()) == Some(&op.name())).then_some(id)
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
        op.symbol().has_cpu_kernel() || builtin_prim(op).is_some()
    }

    fn compile(&self, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
        if let Some(factory) = &op.symbol().cpu_kernel {
            return factory(op);
        }
        let id = builtin_prim(op)
            .ok_or_else(|| Error::NoExecutor { symbol: op.name().to_string(), tried: vec![Self::NAME.to_string()] })?;
        kernels::compile(id, op)
    }
}
