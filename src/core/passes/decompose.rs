//! Decomposition: replace every composite with the prims it is made of, carrying its guards.

use crate::core::guards::{carried_span, Attachment, GuardPolicy, Level};
use std::sync::Arc;

use crate::core::ir::{prims, Arena, BoundSymbol, Trace, TraceBuilder};
use crate::core::plan::{Executor, OpView};
use crate::error::Result;

use super::Pass;

/// Replaces each composite bound symbol by its subsymbols, recursively, leaving only prims.
/// Fusion regions stay whole: their subsymbols are what an executor runs as one unit, not a
/// decomposition (so the standard pipeline after fusion keeps the regions).
///
/// The subsymbols already use the trace's own value ids, so the replacement is a splice.
/// Guards follow their policy: a composite's guard with [`GuardPolicy::Keep`] or
/// [`GuardPolicy::MoveToEnclosing`] surrounds the prims it became (one range, not one per
/// prim); one with [`GuardPolicy::DropWithReason`] is dropped and listed in
/// [`Trace::dropped_guards`]. Guards on a composite's subsymbols stay on those subsymbols.
///
/// ```
/// use boundscope::guards::{Recorder, Selection};
/// use boundscope::passes::{Decompose, Pass};
/// use boundscope::{Arena, BoundSymbolId, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 4]).unwrap();
/// let y = b.softmax(x).unwrap();
/// b.output(y).unwrap();
/// let mut trace = b.finish().unwrap();
/// trace.attach_guard(Selection::All, Recorder::new()).unwrap();
/// let prims = Decompose.run(&trace, &arena).unwrap();
/// assert_eq!(prims.len(), 5);
/// // One guard, now around all five prims:
/// assert_eq!(prims.guard_attachment_count(), 1);
/// assert!(prims.to_string().contains("@record(softmax: 5 ops)"));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Decompose;

impl Pass for Decompose {
    fn name(&self) -> &str {
        "decompose"
    }

    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        decompose(trace, arena, self.name(), &|_| false)
    }
}

/// [`Decompose`], except for the composites that one of its executors prefers to run whole
/// ([`Executor::prefers_whole`]), such as `linear` on `executors::cuda::CudaOps`,
/// which runs it as one cuBLASLt product with its bias (and on the CPU reference, one product
/// reading the weight transposed), instead of a transpose, a product and an add. What it keeps, a plan compiled with those executors runs whole.
///
/// ```
/// use boundscope::executors::{CpuFusion, CpuReference};
/// use boundscope::passes::{DecomposeFor, Pass};
/// use boundscope::{Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 4]).unwrap();
/// let w = b.input(&[3, 4]).unwrap();
/// let y = b.linear(x, w, None).unwrap();
/// b.output(y).unwrap();
/// let trace = b.finish().unwrap();
/// // The CPU reference runs `linear` whole (one product reading `w` transposed): it is kept.
/// let kept = DecomposeFor::new(&[CpuReference::shared()]).run(&trace, &arena).unwrap();
/// assert_eq!(kept.symbol_name(&kept.bound_symbols()[0]), "linear");
/// // CpuFusion prefers nothing whole: `linear` becomes transpose and matmul.
/// let prims = DecomposeFor::new(&[CpuFusion::shared()]).run(&trace, &arena).unwrap();
/// assert_eq!(prims.len(), 2);
/// ```
#[derive(Clone)]
pub struct DecomposeFor {
    executors: Vec<Arc<dyn Executor>>,
}

impl DecomposeFor {
    /// Keeps what one of `executors` prefers whole.
    pub fn new(executors: &[Arc<dyn Executor>]) -> Self {
        Self { executors: executors.to_vec() }
    }
}

impl Pass for DecomposeFor {
    fn name(&self) -> &str {
        "decompose"
    }

    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        let keep = |bsym: &BoundSymbol<'_>| match OpView::new(trace, bsym) {
            Ok(op) => self.executors.iter().any(|e| e.prefers_whole(&op) && e.claims(&op)),
            Err(_) => false,
        };
        decompose(trace, arena, self.name(), &keep)
    }
}

/// Replaces each composite that `keep` does not keep by its prims (and what it keeps of its
/// subsymbols), carrying guards.
pub(super) fn decompose<'a>(
    trace: &Trace<'a>,
    arena: &'a Arena,
    pass: &str,
    keep: &dyn Fn(&BoundSymbol<'_>) -> bool,
) -> Result<Trace<'a>> {
    let is_composite = |bsym: &BoundSymbol<'_>| is_composite(bsym) && !keep(bsym);
    {
        let mut builder = TraceBuilder::rewrite(trace, arena);
        let mut spans = Vec::with_capacity(trace.len());
        for bsym in trace.bound_symbols() {
            let first = builder.len();
            splice(&mut builder, bsym, bsym.comment(), &is_composite);
            spans.push((first, builder.len() - first));
        }
        let registry = trace.registry();
        let old = &trace.guards;
        let guards = builder.guards_mut();
        for (i, attachments) in old.per_op.iter().enumerate() {
            for a in attachments {
                if a.depth > 0 && is_composite(&trace.bound_symbols()[i]) {
                    let bsym = &trace.bound_symbols()[i];
                    attach_subsymbols(guards, a, bsym, spans[i].0, a.depth as usize, &is_composite);
                    continue;
                }
                let end = (i + a.span as usize).min(spans.len());
                let moved = carried_span(i, a.span, spans.len(), |j| Some(spans[j].0..spans[j].0 + spans[j].1));
                let rewritten = trace.bound_symbols()[i..end].iter().any(is_composite);
                match old.guard(a.guard).policy() {
                    GuardPolicy::DropWithReason(reason) if rewritten => guards.record_drop(
                        a,
                        registry,
                        pass,
                        format!(
                            "`{}` was decomposed into prims; {reason}",
                            trace.symbol_name(&trace.bound_symbols()[i])
                        ),
                    ),
                    _ => {
                        // Every composite becomes at least one prim, so the span survives.
                        if let Some((first, span)) = moved {
                            guards.attach(first, Attachment { span, ..*a });
                        }
                    }
                }
            }
        }
        // A composite's prims take its scopes.
        builder.carry_scopes(trace, |j| Some(spans[j].0..spans[j].0 + spans[j].1), pass);
        builder.finish()
    }
}

/// Whether decomposition replaces this bound symbol (a composite, not a fusion region).
fn is_composite(bsym: &BoundSymbol<'_>) -> bool {
    !bsym.subsymbols().is_empty() && bsym.symbol() != prims::REGION
}

/// Number of bound symbols `bsym` becomes when `is_composite` says which ones decompose.
fn prim_count(bsym: &BoundSymbol<'_>, is_composite: &dyn Fn(&BoundSymbol<'_>) -> bool) -> usize {
    if !is_composite(bsym) {
        1
    } else {
        bsym.subsymbols().iter().map(|s| prim_count(s, is_composite)).sum()
    }
}

/// Attaches `a`'s guard to every subsymbol of `bsym` down to `depth`, as spans over the prims
/// each became (`first` is where `bsym`'s prims begin).
fn attach_subsymbols(
    guards: &mut crate::core::guards::GuardTable,
    a: &Attachment,
    bsym: &BoundSymbol<'_>,
    first: usize,
    depth: usize,
    is_composite: &dyn Fn(&BoundSymbol<'_>) -> bool,
) {
    let mut at = first;
    for sub in bsym.subsymbols() {
        let len = prim_count(sub, is_composite);
        let attachment = Attachment { span: len as u32, depth: 0, level: Level::Subsymbol, origin: sub.symbol(), ..*a };
        guards.attach(at, attachment);
        if depth > 1 && is_composite(sub) {
            attach_subsymbols(guards, a, sub, at, depth - 1, is_composite);
        }
        at += len;
    }
}

/// Pushes `bsym`'s prims (what `is_composite` decomposes); the composite's comment goes to its
/// first prim.
fn splice(
    builder: &mut TraceBuilder<'_>,
    bsym: &BoundSymbol<'_>,
    comment: Option<&str>,
    is_composite: &dyn Fn(&BoundSymbol<'_>) -> bool,
) {
    if !is_composite(bsym) {
        builder.push_copy_with_comment(bsym, comment.or(bsym.comment()));
    } else {
        for (i, sub) in bsym.subsymbols().iter().enumerate() {
            splice(builder, sub, if i == 0 { comment } else { None }, is_composite);
        }
    }
}
