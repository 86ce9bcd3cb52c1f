//! Passes: functions from a trace to a new trace, and the pipeline that runs them in order and
//! records what ran.
//!
//! A pass never mutates its input (a plan may be using it); it builds a new trace, usually in
//! a new arena, with [`TraceBuilder::rewrite`](crate::TraceBuilder::rewrite).

mod dead_code;
mod decompose;
mod fold_epilogues;
mod fuse;
mod grad;
pub mod inserted_ranges;
mod join_regions;
mod pack_attention;
mod profile_ops;

use std::time::Instant;

pub use dead_code::DeadCodeElimination;
pub use decompose::{Decompose, DecomposeFor};
pub use fold_epilogues::FoldEpilogues;
pub use fuse::{FuseRegions, FusionStrategy};
pub use grad::{FinishReduction, Grad, GradientBuckets, StartReduction, TrainingStep, BACKWARD_SCOPE, GRAD_SYNC_SCOPE};
pub use inserted_ranges::InsertRangeNodes;
pub use pack_attention::PackAttention;
pub use profile_ops::ProfileOps;

use crate::core::ir::{Arena, Trace};
use crate::error::Result;

/// A trace-to-trace transformation.
///
/// ```
/// use boundscope::passes::{Decompose, Pass};
/// use boundscope::{Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 4]).unwrap();
/// let y = b.softmax(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let prims = Decompose.run(&trace, &arena).unwrap();
/// assert_eq!(prims.len(), 5);
/// ```
pub trait Pass {
    /// A short name, shown in listing headers.
    fn name(&self) -> &str;

    /// Builds the transformed trace in `arena`.
    ///
    /// # Errors
    /// Whatever makes the pass unable to produce a well-formed trace.
    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>>;
}

/// How many times each value of `trace` is read by its top-level bound symbols, a trace output
/// counting as a read: what the rewriting passes check before they fold a value away.
pub(crate) fn top_level_reads(trace: &Trace<'_>) -> Vec<usize> {
    let mut reads = vec![0usize; trace.value_count()];
    for v in trace.bound_symbols().iter().flat_map(|b| b.inputs()).chain(trace.outputs().iter().copied()) {
        if let Some(r) = reads.get_mut(v.index()) {
            *r += 1;
        }
    }
    reads
}

/// Passes run in order; each result is verified, and each pass is recorded with its time in
/// the trace's header. If a pass carried none of the guards its input had, the pipeline lists
/// them in [`Trace::dropped_guards`] rather than losing them silently.
///
/// ```
/// use boundscope::passes::{DeadCodeElimination, Decompose, Pipeline};
/// use boundscope::{Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 4]).unwrap();
/// let _unused = b.exp(x).unwrap();
/// let y = b.softmax(x).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// let out = Pipeline::standard().run(&trace, &arena).unwrap();
/// assert_eq!(out.len(), 5);
/// assert_eq!(out.history().len(), 2);
/// assert!(out.to_string().contains("# passes: decompose ("));
/// ```
#[derive(Default)]
pub struct Pipeline {
    passes: Vec<Box<dyn Pass>>,
}

impl Pipeline {
    /// An empty pipeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decomposition, then dead-code elimination.
    pub fn standard() -> Self {
        Self::new().then(Decompose).then(DeadCodeElimination)
    }

    /// [`standard`](Self::standard), keeping the composites one of `executors` prefers to run
    /// whole ([`DecomposeFor`]), after packing attention over a split projection
    /// ([`PackAttention`]) and folding activations into the products before them
    /// ([`FoldEpilogues`]), both undone by the decomposition where no executor prefers the
    /// packed or folded form: what the front end runs, and what a plan for the CUDA executors
    /// wants (`linear` stays one cuBLASLt product, `gelu(linear(...))` one product with a GELU
    /// epilogue, attention reads q, k and v in place).
    pub fn for_executors(executors: &[std::sync::Arc<dyn crate::core::plan::Executor>]) -> Self {
        Self::new().then(PackAttention).then(FoldEpilogues).then(DecomposeFor::new(executors)).then(DeadCodeElimination)
    }

    /// Appends a pass.
    pub fn then(mut self, pass: impl Pass + 'static) -> Self {
        self.passes.push(Box::new(pass));
        self
    }

    /// Names of the passes, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.passes.iter().map(|p| p.name())
    }

    /// Runs every pass in order. Each result is well formed: a pass builds its trace with a
    /// [`TraceBuilder`](crate::TraceBuilder), whose `finish` verifies what it was given
    /// unchecked.
    ///
    /// # Errors
    /// The first pass error ([`Error::MalformedTrace`](crate::Error::MalformedTrace) where a
    /// pass built a trace that does not verify).
    pub fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        let mut current = trace.clone();
        for pass in &self.passes {
            let start = Instant::now();
            let mut next = pass.run(&current, arena)?;
            let elapsed = start.elapsed();
            // A pass that built its trace without carrying any guard (a user's pass that
            // forgot `TraceBuilder::carry_guards`) must not lose them silently.
            let carried = next.guards.attachment_count() - next.guards.trace_level.len();
            let before = current.guards.attachment_count() - current.guards.trace_level.len();
            if before > 0 && carried == 0 && next.guards.dropped.len() == current.guards.dropped.len() {
                for (i, attachments) in current.guards.per_op.iter().enumerate() {
                    for a in attachments {
                        let reason = format!(
                            "pass `{}` carried no guards (bound symbol {i} had this one); a pass that rewrites \
                             a trace carries them with `TraceBuilder::carry_guards` or as the built-in passes do",
                            pass.name()
                        );
                        next.guards.record_drop(a, current.registry(), pass.name(), reason);
                    }
                }
            }
            next.history.push(crate::core::ir::PassRecord { name: pass.name().to_string(), elapsed });
            current = next;
        }
        Ok(current)
    }
}

#[cfg(test)]
mod tests;
