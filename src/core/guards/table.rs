//! The trace's side table of guards: the guard objects, what each bound symbol has attached,
//! and the guards that passes had to drop, with their reasons.

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use super::{Guard, GuardKind, Level};
use crate::core::ir::{GuardId, Registry, SymbolId};

/// One guard attached to one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attachment {
    pub guard: GuardId,
    /// How many consecutive top-level bound symbols it surrounds, starting at its owner (more
    /// than one after a composite was decomposed into prims).
    pub span: u32,
    /// 0: the bound symbols themselves; `d >= 1`: every subsymbol down to depth `d` instead.
    pub depth: u8,
    /// The level its ranges report.
    pub level: Level,
    /// The symbol whose name is the default label.
    pub origin: SymbolId,
}

/// A guard that a pass could not carry, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DroppedGuard {
    /// The guard's kind.
    pub kind: GuardKind,
    /// The guard's label (its own, or the name of the symbol it was attached to).
    pub label: String,
    /// The pass (or `Plan::compile`) that dropped it.
    pub pass: String,
    /// Why.
    pub reason: String,
}

/// Guards of one trace, keyed by top-level bound-symbol position. Not in the arena: guard
/// objects need `Drop`.
#[derive(Clone, Default)]
pub(crate) struct GuardTable {
    pub guards: Vec<Arc<dyn Guard>>,
    pub per_op: Vec<SmallVec<[Attachment; 2]>>,
    pub trace_level: SmallVec<[GuardId; 2]>,
    pub dropped: Vec<DroppedGuard>,
    /// The id of each guard object by its address, for `add_guard` (a scan of `guards` made
    /// attaching a guard per op, or `Grad` over a profiled trace, quadratic). Rebuilt there
    /// when it does not cover `guards` (a table made with its `guards` set directly).
    pub(crate) by_address: HashMap<usize, GuardId>,
}

/// The address `Arc::ptr_eq` compares.
fn address(guard: &Arc<dyn Guard>) -> usize {
    Arc::as_ptr(guard) as *const () as usize
}

impl GuardTable {
    /// The id of `guard`: the one it already has if this very object was added before (so that
    /// one object attached twice is one guard), else a new one.
    pub fn add_guard(&mut self, guard: Arc<dyn Guard>) -> GuardId {
        if self.by_address.len() != self.guards.len() {
            self.by_address.clear();
            for (i, g) in self.guards.iter().enumerate() {
                self.by_address.entry(address(g)).or_insert(GuardId::from_index(i));
            }
        }
        let next = GuardId::from_index(self.guards.len());
        let id = *self.by_address.entry(address(&guard)).or_insert(next);
        if id == next {
            self.guards.push(guard);
        }
        id
    }

    pub fn guard(&self, id: GuardId) -> &dyn Guard {
        &*self.guards[id.index()]
    }

    pub fn attach(&mut self, position: usize, attachment: Attachment) {
        if self.per_op.len() <= position {
            self.per_op.resize_with(position + 1, SmallVec::new);
        }
        self.per_op[position].push(attachment);
    }

    pub fn at(&self, position: usize) -> &[Attachment] {
        self.per_op.get(position).map_or(&[], |a| a.as_slice())
    }

    /// Number of attachments (trace-level included).
    pub fn attachment_count(&self) -> usize {
        self.trace_level.len() + self.per_op.iter().map(SmallVec::len).sum::<usize>()
    }

    /// The same guard objects and trace-level guards, with no per-op attachments: the start of
    /// a rewritten trace's table.
    pub fn without_attachments(&self) -> GuardTable {
        GuardTable {
            guards: self.guards.clone(),
            per_op: Vec::new(),
            trace_level: self.trace_level.clone(),
            dropped: self.dropped.clone(),
            by_address: self.by_address.clone(),
        }
    }

    pub fn label_of(&self, attachment: &Attachment, registry: &Registry) -> String {
        let guard = self.guard(attachment.guard);
        guard
            .label()
            .map(str::to_string)
            .unwrap_or_else(|| registry.get(attachment.origin).map(|s| s.symbol.name().to_string()).unwrap_or_default())
    }

    pub fn record_drop(&mut self, attachment: &Attachment, registry: &Registry, pass: &str, reason: String) {
        let dropped = DroppedGuard {
            kind: self.guard(attachment.guard).kind(),
            label: self.label_of(attachment, registry),
            pass: pass.to_string(),
            reason,
        };
        self.dropped.push(dropped);
    }

    /// Records as dropped the guards `guards` of scope `path`, which `pass` dropped: each is
    /// labelled with its own label, else the scope's path.
    pub fn record_scope_drop(&mut self, guards: &[GuardId], path: &str, pass: &str, reason: &str) {
        for &id in guards {
            let guard = self.guard(id);
            let dropped = DroppedGuard {
                kind: guard.kind(),
                label: guard.label().unwrap_or(path).to_string(),
                pass: pass.to_string(),
                reason: reason.to_string(),
            };
            self.dropped.push(dropped);
        }
    }

    /// Carries attachments through a pass that keeps or removes whole top-level bound symbols
    /// (`new_position[i]` is where old bound symbol `i` went, `None` if removed): spans shrink
    /// to their survivors; an attachment with no survivor is dropped with `reason`.
    pub fn carry_through_removal(
        &self,
        new_position: &[Option<usize>],
        registry: &Registry,
        pass: &str,
        reason: impl Fn(usize) -> String,
    ) -> GuardTable {
        let mut out = self.without_attachments();
        for (old, attachments) in self.per_op.iter().enumerate() {
            for a in attachments {
                let moved = carried_span(old, a.span, new_position.len(), |i| new_position[i].map(|p| p..p + 1));
                match moved {
                    Some((first, span)) => out.attach(first, Attachment { span, ..*a }),
                    None => out.record_drop(a, registry, pass, reason(old)),
                }
            }
        }
        out
    }
}

impl GuardTable {
    /// Checks that the spans of the attachments nest (or are disjoint); `pass` names who made
    /// them in the error.
    pub fn check_spans_nest(&self, pass: &str) -> crate::error::Result<()> {
        self.check_spans_nest_with(&[], pass)
    }

    /// [`check_spans_nest`](Self::check_spans_nest), with more spans (named scopes', as
    /// positions `first..end`) that must nest with the guards' and each other.
    pub fn check_spans_nest_with(&self, more: &[(usize, usize)], pass: &str) -> crate::error::Result<()> {
        let mut spans: Vec<(usize, usize)> = self
            .per_op
            .iter()
            .enumerate()
            .flat_map(|(p, attachments)| attachments.iter().map(move |a| (p, p + a.span as usize)))
            .chain(more.iter().copied())
            .collect();
        spans.sort_by_key(|&(first, end)| (first, std::cmp::Reverse(end)));
        let mut open: Vec<(usize, usize)> = Vec::new();
        for span in spans {
            while open.last().is_some_and(|o| o.1 <= span.0) {
                open.pop();
            }
            if let Some(&(first, end)) = open.last() {
                if span.1 > end {
                    return Err(crate::error::Error::OverlappingGuards {
                        first: format!("a guard over positions {first}..{end}"),
                        second: format!("a guard over positions {}..{} (after `{pass}`)", span.0, span.1),
                    });
                }
            }
            open.push(span);
        }
        Ok(())
    }
}

/// Where a span of old top-level bound symbols, `span` of them from `first`, lands after a
/// rewrite that puts old bound symbol `i` at the new positions `new_range(i)` (`None` or empty:
/// removed): its first new position and new length, or `None` if none of it survives. Every
/// pass that carries guards uses it, so spans move the same way through all of them.
pub(crate) fn carried_span(
    first: usize,
    span: u32,
    old_len: usize,
    new_range: impl Fn(usize) -> Option<std::ops::Range<usize>>,
) -> Option<(usize, u32)> {
    let mut start: Option<usize> = None;
    let mut end = 0;
    for i in first..(first + span as usize).min(old_len) {
        if let Some(range) = new_range(i).filter(|r| !r.is_empty()) {
            start = Some(start.map_or(range.start, |s| s.min(range.start)));
            end = end.max(range.end);
        }
    }
    start.map(|s| (s, (end - s) as u32))
}

impl std::fmt::Debug for GuardTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardTable")
            .field("guards", &self.guards.len())
            .field("attachments", &self.attachment_count())
            .field("dropped", &self.dropped)
            .finish()
    }
}
