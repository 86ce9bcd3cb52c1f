//! The approach boundscope replaces, kept as a baseline: NVTX push/pop inserted into the trace
//! as bound symbols around every op.
//!
//! It exists so that listings and benchmarks can compare the two side by side; do not use it
//! to profile.

use std::ffi::CString;

use crate::core::ir::{Arena, Arg, Category, ParamKind, Registry, Symbol, SymbolId, TensorMeta, Trace, TraceBuilder};
use crate::core::plan::kernel_fn;
use crate::error::{Error, Result};

use super::Pass;

/// Name of the inserted push symbol.
pub const PUSH: &str = "nvtx_range_push";
/// Name of the inserted pop symbol.
pub const POP: &str = "nvtx_range_pop";

/// Inserts `nvtx_range_push` before and `nvtx_range_pop` after every bound symbol, as nodes of
/// the trace: three lines per op instead of one. The push node's argument is the id of the
/// symbol it announces; its CPU kernel pushes that symbol's name.
///
/// ```
/// use boundscope::passes::{InsertRangeNodes, Pass};
/// use boundscope::{Arena, Registry, TraceBuilder};
/// let mut registry = Registry::with_builtins();
/// InsertRangeNodes::register(&mut registry).unwrap();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[4]).unwrap();
/// let y = b.exp(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let noisy = InsertRangeNodes.run(&trace, &arena).unwrap();
/// assert_eq!(noisy.len(), 3 * trace.len());
/// ```
///
/// Guards attached to an op stay on it (between its push and its pop), and its scopes hold
/// all three.
#[derive(Clone, Copy, Debug, Default)]
pub struct InsertRangeNodes;

impl InsertRangeNodes {
    /// Registers the push and pop symbols (with CPU kernels) in `registry`.
    ///
    /// # Errors
    /// [`Error::DuplicateSymbol`] if they are already registered.
    pub fn register(registry: &mut Registry) -> Result<(SymbolId, SymbolId)> {
        let token = |_: &[crate::ArgInfo<'_>]| Ok(TensorMeta::f32(&[]));
        let push = Symbol::new(PUSH, Category::Shape).params(&[ParamKind::Dims]).shape_rule(token).cpu_kernel(|op| {
            let symbol = op.dims(0)?.first().copied().unwrap_or(usize::MAX);
            let name = op.registry().get(SymbolId::from_index(symbol))?.symbol.name().to_string();
            let name = CString::new(name)
                .map_err(|_| Error::InvalidLabel { label: PUSH.into(), detail: "symbol names have no NUL".into() })?;
            Ok(kernel_fn(move |_, outputs| {
                nvtx::sys::range_push_ascii(&name);
                outputs[0].data.set_f32(0, 0.0);
                Ok(())
            }))
        });
        let pop = Symbol::new(POP, Category::Shape).params(&[ParamKind::Tensor]).shape_rule(token).cpu_kernel(|_| {
            Ok(kernel_fn(|_, outputs| {
                nvtx::sys::range_pop();
                outputs[0].data.set_f32(0, 0.0);
                Ok(())
            }))
        });
        Ok((registry.register(push)?, registry.register(pop)?))
    }
}

impl Pass for InsertRangeNodes {
    fn name(&self) -> &str {
        "insert_range_nodes"
    }

    /// # Errors
    /// [`Error::UnknownSymbol`] if [`InsertRangeNodes::register`] was not called on the
    /// trace's registry.
    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        let registry = trace.registry();
        let (push, pop) = (registry.lookup(PUSH)?, registry.lookup(POP)?);
        let mut builder = TraceBuilder::rewrite(trace, arena);
        for bsym in trace.bound_symbols() {
            let token = builder.bind(push, &[Arg::Dims(&[bsym.symbol().index()])])?;
            builder.push_copy(bsym);
            builder.bind(pop, &[Arg::Value(token)])?;
        }
        // Each bound symbol became three: its push, itself and its pop. Its guards stay on it,
        // and its scopes hold all three.
        let positions: Vec<Option<usize>> = (0..trace.len()).map(|i| Some(3 * i + 1)).collect();
        builder.carry_guards(trace, &positions, self.name(), |i| format!("bound symbol {i} was removed"))?;
        builder.carry_scopes(trace, |i| Some(3 * i..3 * i + 3), self.name());
        builder.finish()
    }
}
