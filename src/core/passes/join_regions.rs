//! Joining independent regions: consecutive regions of one executor that none of them reads
//! from another, under the same guards and scopes, become one region when the executor runs
//! them in one launch ([`Executor::joins`]), as a fused optimizer updates every parameter in
//! one multi-tensor launch.

use crate::core::guards::{carried_span, Attachment};
use crate::core::ir::{Arena, BoundSymbol, FusedBy, Trace, TraceBuilder, ValueId};
use crate::core::plan::{Executor, OpView};
use crate::error::Result;

/// `trace` with each run of consecutive regions of `executor` that it [joins](Executor::joins),
/// where no region reads a value another of the run defines and the same guards (by merge key)
/// and the same scopes hold each, made one region of all their ops, at most `max_ops` of them.
/// The joined region keeps the first region's name and guards. `trace` itself when nothing
/// joins.
pub(super) fn join_independent<'a>(
    trace: Trace<'a>,
    executor: &dyn Executor,
    max_ops: usize,
    pass: &str,
    arena: &'a Arena,
) -> Result<Trace<'a>> {
    let ops = trace.bound_symbols();
    let n = ops.len();
    let mut joinable = Vec::with_capacity(n);
    for bsym in ops {
        let view = OpView::new(&trace, bsym)?;
        joinable.push(view.is_region_of(executor) && executor.joins(&view));
    }
    // Runs of positions, each joined into its first.
    let mut runs: Vec<Vec<usize>> = Vec::new();
    let mut i = 0;
    while i < n {
        let mut run = vec![i];
        if joinable[i] {
            let mut defined: Vec<ValueId> = ops[i].outputs().to_vec();
            let mut count = ops[i].subsymbols().len();
            while let Some(&last) = run.last() {
                let next = last + 1;
                let fits = next < n
                    && joinable[next]
                    && count + ops[next].subsymbols().len() <= max_ops
                    && !ops[next].inputs().any(|v| defined.contains(&v))
                    && held_alike(&trace, i, next);
                if !fits {
                    break;
                }
                run.push(next);
                defined.extend_from_slice(ops[next].outputs());
                count += ops[next].subsymbols().len();
            }
        }
        i = run.last().map_or(i, |&l| l) + 1;
        runs.push(run);
    }
    if runs.len() == n {
        return Ok(trace);
    }

    let mut builder = TraceBuilder::rewrite(&trace, arena);
    let mut new_position = vec![0; n];
    for run in &runs {
        let at = builder.len();
        for &p in run {
            new_position[p] = at;
        }
        if let [only] = run.as_slice() {
            builder.push_copy(&ops[*only]);
            continue;
        }
        let mut inputs: Vec<ValueId> = Vec::new();
        let mut outputs: Vec<ValueId> = Vec::new();
        let mut subsymbols: Vec<BoundSymbol<'_>> = Vec::new();
        for &p in run {
            for v in ops[p].inputs() {
                if !inputs.contains(&v) {
                    inputs.push(v);
                }
            }
            outputs.extend_from_slice(ops[p].outputs());
            subsymbols.extend_from_slice(ops[p].subsymbols());
        }
        let name = ops[run[0]].name().unwrap_or_default();
        builder.push_region(name, FusedBy::of(executor), &inputs, &outputs, &subsymbols);
    }

    // Guards: the first region's stay; the others', equal to them by merge key
    // (`held_alike`), go with the regions; guards over several bound symbols map their span.
    let old = &trace.guards;
    let mut guards = old.without_attachments();
    for (i, attachments) in old.per_op.iter().enumerate() {
        let joined_later = i > 0 && new_position[i] == new_position[i - 1];
        for a in attachments {
            if joined_later && a.span == 1 {
                continue;
            }
            if let Some((first, span)) = carried_span(i, a.span, n, |j| Some(new_position[j]..new_position[j] + 1)) {
                guards.attach(first, Attachment { span, ..*a });
            }
        }
    }
    builder.set_guards(guards);
    builder.carry_scopes(&trace, |j| Some(new_position[j]..new_position[j] + 1), pass);
    builder.finish()
}

/// Whether the same guards and scopes hold the bound symbols at `first` and at `next`: equal
/// guards of their own (one span each, by merge key), and every guard over several bound
/// symbols and every scope holds both or neither.
fn held_alike(trace: &Trace<'_>, first: usize, next: usize) -> bool {
    let table = &trace.guards;
    let key = |a: &Attachment| (a.depth, table.guard(a.guard).merge_key().ok_or(a.guard));
    let own = |p: usize| -> Option<Vec<_>> {
        let attachments = table.at(p);
        if attachments.iter().any(|a| a.span != 1) {
            return None;
        }
        let mut keys: Vec<_> = attachments.iter().map(key).collect();
        keys.sort();
        Some(keys)
    };
    let (Some(a), Some(b)) = (own(first), own(next)) else { return false };
    if a != b {
        return false;
    }
    let covers = |start: usize, span: usize, p: usize| start <= p && p < start + span;
    let spans_alike = table.per_op.iter().enumerate().take(first).all(|(s, attachments)| {
        attachments.iter().all(|a| covers(s, a.span as usize, first) == covers(s, a.span as usize, next))
    });
    let scopes_alike = trace.scopes().iter().all(|s| s.positions().contains(&first) == s.positions().contains(&next));
    spans_alike && scopes_alike
}
