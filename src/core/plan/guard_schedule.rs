//! Where a plan enters and exits its guards.
//!
//! Each attachment becomes a [`Scope`] over a contiguous range of steps, prepared once. Scopes
//! nest (trace ⊃ named scope ⊃ region or op ⊃ subsymbol; spans from decomposition nest by
//! construction, and passes keep regions inside or outside each named scope), so a run only
//! needs, per step, which scopes to enter before it and how many to exit after it, taken from
//! a stack. Two schedules are precomputed: with profiling on (every guard) and off (only guards
//! that are not profiling guards), so that switching profiling costs nothing per step when the
//! second one is empty.

use super::one_per_scope::{ScopeEntry, ScopeGuards};
use super::range_filter::RangeFilter;
use super::range_map::{PlannedRange, PushedBy, RangeMap};
use super::scope_details::DetailsOf;
use crate::core::guards::{Attachment, GuardSite, GuardTable, Level, ScopeDetails, ScopedGuard};
use crate::core::ir::{prims, BoundSymbol, Category, Trace};
use crate::error::{Error, Result};

/// Where one bound symbol's steps are in the plan.
pub(crate) struct CompiledNode {
    pub first: usize,
    pub len: usize,
    /// Its subsymbols, if it was decomposed into them when compiled (empty if claimed whole).
    pub children: Vec<CompiledNode>,
    /// The region (or op) range its executor pushes itself (it declared NVTX region or op
    /// ranges and the bound symbol carries NVTX guards): the runtime pushes none in that domain.
    pub emitted: Option<EmittedRegionRange>,
}

/// A region (or op) range an executor pushes from inside its kernel.
pub(crate) struct EmittedRegionRange {
    /// The step whose kernel pushes it.
    pub step: usize,
    pub executor: String,
    pub range: super::executor::RegionRange,
}

/// What the range map says of a scope's NVTX range.
#[derive(Clone)]
pub(crate) struct NvtxPlan {
    pub domain: String,
    pub label: String,
    pub category: Option<u32>,
    pub color: Option<u32>,
    pub payload: Option<u64>,
    /// The structured payload, when the prepared range carries one.
    pub details: Option<ScopeDetails>,
}

/// One prepared guard over the steps `first..end`.
pub(crate) struct Scope {
    pub guard: Box<dyn ScopedGuard>,
    /// A copy of a built-in NVTX range (sharing its payload), which the run loop pushes and
    /// pops without virtual calls.
    pub nvtx: Option<crate::core::guards::PreparedNvtxRange>,
    pub first: u32,
    pub end: u32,
    /// Its level, which orders scopes over the same steps (op outside subsymbol). Trace-level
    /// scopes are entered before the first step and exited after the last.
    pub level: Level,
    /// How deep it is among scopes of its level over the same steps (a named scope's nesting,
    /// a subsymbol's depth in its composite): the outer one is entered first. (A `u16` beside
    /// `level`, so that it packs into their padding: the run loop strides over scopes.)
    pub depth: u16,
    pub profiling: bool,
    /// For a guard that reports an NVTX domain: the range, for the range map.
    pub planned: Option<NvtxPlan>,
}

impl Scope {
    #[inline(always)]
    fn nvtx(&self) -> Option<&crate::core::guards::PreparedNvtxRange> {
        self.nvtx.as_ref()
    }
}

/// The entries and exits of one run, for one profiling setting.
#[derive(Default)]
pub(crate) struct Schedule {
    /// Scope indices in entry order.
    pub order: Vec<u32>,
    /// `order[run_enter.0..run_enter.1]` are entered before the first step.
    pub run_enter: (u32, u32),
    /// Per step: `order[enter.0..enter.1]` are entered before it.
    pub enter: Vec<(u32, u32)>,
    /// Per step: how many scopes to exit after it.
    pub exit: Vec<u32>,
}

impl Schedule {
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The most scopes entered at once during a run.
    pub fn max_depth(&self) -> usize {
        let mut depth = (self.run_enter.1 - self.run_enter.0) as usize;
        let mut deepest = depth;
        for (&(a, b), &exits) in self.enter.iter().zip(&self.exit) {
            depth += (b - a) as usize;
            deepest = deepest.max(depth);
            depth -= exits as usize;
        }
        deepest
    }

    fn build(scopes: &[Scope], steps: usize, include: impl Fn(&Scope) -> bool) -> Schedule {
        let mut order: Vec<u32> = (0..scopes.len() as u32).filter(|&i| include(&scopes[i as usize])).collect();
        // Outer before inner: whole-run, earlier start, later end, outer level, attach order.
        order.sort_by_key(|&i| {
            let s = &scopes[i as usize];
            (s.level != Level::Trace, s.first, std::cmp::Reverse(s.end), s.level, s.depth, i)
        });
        let mut schedule = Schedule { enter: vec![(0, 0); steps], exit: vec![0; steps], ..Default::default() };
        let run_level = order.iter().take_while(|&&i| scopes[i as usize].level == Level::Trace).count() as u32;
        schedule.run_enter = (0, run_level);
        let mut k = run_level as usize;
        for step in 0..steps {
            let start = k;
            while k < order.len() && scopes[order[k] as usize].first as usize == step {
                k += 1;
            }
            schedule.enter[step] = (start as u32, k as u32);
        }
        for &i in &order[run_level as usize..] {
            let s = &scopes[i as usize];
            schedule.exit[s.end as usize - 1] += 1;
        }
        schedule.order = order;
        schedule
    }
}

/// Entered scopes of one run; exits whatever is still entered, innermost first, when finished
/// or dropped (after an error, or while unwinding from a panic).
pub(crate) struct GuardStack<'p> {
    scopes: &'p [Scope],
    /// Borrowed from the workspace, with room for the plan's deepest nesting.
    entered: Vec<(u32, u64)>,
}

impl<'p> GuardStack<'p> {
    pub fn new(scopes: &'p [Scope], mut storage: Vec<(u32, u64)>) -> Self {
        storage.clear();
        Self { scopes, entered: storage }
    }

    /// Exits whatever is still entered and gives the storage back for the next run.
    pub fn finish(mut self) -> Vec<(u32, u64)> {
        self.exit_all();
        std::mem::take(&mut self.entered)
    }

    #[inline(always)]
    pub fn enter(&mut self, order: &[u32]) {
        for &i in order {
            let scope = &self.scopes[i as usize];
            let state = match scope.nvtx() {
                Some(range) => range.push() as u64,
                None => scope.guard.on_enter(),
            };
            self.entered.push((i, state));
        }
    }

    #[inline(always)]
    pub fn exit(&mut self, count: u32) {
        for _ in 0..count {
            self.exit_one();
        }
    }

    #[inline(always)]
    fn exit_one(&mut self) -> bool {
        let Some((i, state)) = self.entered.pop() else { return false };
        let scope = &self.scopes[i as usize];
        match scope.nvtx() {
            Some(range) => range.pop(),
            None => scope.guard.on_exit(state),
        }
        true
    }
}

impl GuardStack<'_> {
    /// Exits every scope still entered, innermost first. A guard exit that panics does not stop
    /// the others: they are all exited, then the first such panic resumes, unless the thread is
    /// already unwinding (a kernel panicked), in which case that panic goes on and the exit's is
    /// discarded, so that the process never aborts.
    fn exit_all(&mut self) {
        let mut first_panic = None;
        while !self.entered.is_empty() {
            let exited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.exit_one()));
            if let Err(payload) = exited {
                first_panic.get_or_insert(payload);
            }
        }
        if let Some(payload) = first_panic {
            if !std::thread::panicking() {
                std::panic::resume_unwind(payload);
            }
        }
    }
}

impl Drop for GuardStack<'_> {
    fn drop(&mut self) {
        self.exit_all();
    }
}

/// A scope being gathered: its steps, level, default label, executor, and merged guards.
struct PendingScope<'l> {
    first: usize,
    end: usize,
    level: Level,
    depth: usize,
    label: String,
    executor: &'l str,
    /// The categories of the symbols it surrounds, for the plan's [`RangeFilter`].
    categories: Vec<Category>,
    guards: ScopeGuards,
    /// What it surrounds, for its guards' sites.
    details: ScopeDetails,
}

/// Prepares every attachment of `trace` over the compiled steps, one range per scope and NVTX
/// domain (see [`ScopeGuards`]). Returns the scopes, the attachments that cannot run
/// (subsymbol guards of a composite an executor runs whole), and the plan's notes (merge
/// conflicts, parts of `filter` that match nothing). NVTX ranges that `filter` does not admit
/// are not prepared at all.
pub(crate) fn prepare_scopes(
    trace: &Trace<'_>,
    nodes: &[CompiledNode],
    step_executor: &[&str],
    filter: &RangeFilter,
    details_of: &DetailsOf<'_, '_>,
) -> Result<(Vec<Scope>, Vec<crate::core::guards::DroppedGuard>, Vec<String>)> {
    let guards: &GuardTable = &trace.guards;
    let registry = trace.registry();
    let steps = step_executor.len();
    // Guard objects for the names in drop records; only the drops found here are returned.
    let mut dropped = GuardTable { guards: guards.guards.clone(), ..GuardTable::default() };
    // The executor that runs a range of steps, transfers aside; "runtime" when several do.
    let executor_of = |first: usize, end: usize| {
        let mut executors = step_executor[first..end].iter().copied().filter(|e| *e != "runtime");
        match executors.next() {
            Some(e) if executors.all(|x| x == e) => e,
            _ => "runtime",
        }
    };
    // Scopes in order of first attachment, and where each is by steps, level and, for
    // subsymbol spans, depth in the composite's decomposition (1: a direct subsymbol), so that
    // a subsymbol and its only child stay two scopes.
    let mut pending: Vec<PendingScope<'_>> = Vec::new();
    let mut index: std::collections::HashMap<(usize, usize, Level, usize), usize> = Default::default();
    let mut notes = Vec::new();
    let mut add = |first: usize,
                   end: usize,
                   level: Level,
                   depth: usize,
                   label: &str,
                   categories: &[Category],
                   details: &dyn Fn() -> ScopeDetails,
                   attachment: Attachment| {
        let i = *index.entry((first, end, level, depth)).or_insert_with(|| {
            let executor = if level == Level::Trace { "runtime" } else { executor_of(first, end) };
            let label = label.to_string();
            let (categories, guards, details) = (Vec::new(), ScopeGuards::default(), details());
            pending.push(PendingScope { first, end, level, depth, label, executor, categories, guards, details });
            pending.len() - 1
        });
        let scope = &mut pending[i];
        for c in categories {
            if !scope.categories.contains(c) {
                scope.categories.push(*c);
            }
        }
        let label = &scope.label;
        scope.guards.add(guards, attachment, |note| {
            notes.push(format!("{} `{label}` (steps {first}..{end}): {note}", level.name()));
        });
    };
    for &g in &guards.trace_level {
        let attachment = Attachment { guard: g, span: 1, depth: 0, level: Level::Trace, origin: prims::REGION };
        add(0, steps, Level::Trace, 0, "trace", &[], &|| details_of.of_run(steps), attachment);
    }
    for (position, attachments) in guards.per_op.iter().enumerate() {
        let Some(node) = nodes.get(position) else {
            if attachments.is_empty() {
                continue;
            }
            return Err(Error::MalformedTrace {
                position: Some(position),
                detail: "a guard is attached to a bound symbol the trace does not have".into(),
            });
        };
        let is_region = trace.bound_symbols()[position].symbol() == prims::REGION;
        let category_of = |id| registry.get(id).map(|s| s.symbol.category()).ok();
        // A region is of the category `Fusion` and of each of its ops'.
        let region_categories: Vec<Category> = if is_region {
            let ops = trace.bound_symbols()[position].subsymbols().iter().filter_map(|s| category_of(s.symbol()));
            std::iter::once(Category::Fusion).chain(ops).collect()
        } else {
            Vec::new()
        };
        for a in attachments {
            let label = if is_region && a.depth == 0 && a.span == 1 {
                super::compile::region_label(trace, position)
            } else {
                registry.get(a.origin).map(|s| s.symbol.name().to_string()).unwrap_or_default()
            };
            if a.depth == 0 {
                let level = if is_region && a.span == 1 { Level::Region } else { a.level };
                let last = nodes.get(position + a.span as usize - 1).unwrap_or(node);
                let categories = match level {
                    Level::Region => region_categories.clone(),
                    _ => category_of(a.origin).into_iter().collect(),
                };
                let (first, end) = (node.first, last.first + last.len);
                let details = || details_of.of_span(position, a.span as usize, first, end);
                add(first, end, level, 0, &label, &categories, &details, *a);
            } else if node.children.is_empty() {
                dropped.record_drop(
                    a,
                    registry,
                    "Plan::compile",
                    format!(
                        "an executor runs `{label}` whole, so its subsymbols never run separately; \
                         attach the guard to `{label}` itself"
                    ),
                );
            } else {
                let bsym = &trace.bound_symbols()[position];
                let mut sites = Vec::new();
                let mut whole = Vec::new();
                subsymbol_sites(bsym, node, a.depth as usize, 1, trace, &mut sites, &mut whole);
                for (sub, first, end, depth, name, category) in sites {
                    let categories: Vec<Category> = category.into_iter().collect();
                    let details = || details_of.of_subsymbol(sub, first, end);
                    add(first, end, Level::Subsymbol, depth, name, &categories, &details, *a);
                }
                for name in whole {
                    dropped.record_drop(
                        a,
                        registry,
                        "Plan::compile",
                        format!("an executor runs the subsymbol `{name}` of `{label}` whole, so its own subsymbols never run separately"),
                    );
                }
            }
        }
    }
    // Named scopes with guards: one scope each, labelled with its path, over the steps of its
    // bound symbols.
    for scope in trace.scopes().iter().filter(|s| s.guard_count() > 0) {
        let positions = scope.positions();
        let (Some(head), Some(tail)) = (nodes.get(positions.start), nodes.get(positions.end.saturating_sub(1))) else {
            return Err(Error::MalformedTrace {
                position: Some(positions.start),
                detail: format!("scope `{}` spans bound symbols the trace does not have", scope.path()),
            });
        };
        let (first, end) = (head.first, tail.first + tail.len);
        if first >= end {
            continue;
        }
        let details = || details_of.of_span(positions.start, positions.len(), first, end);
        for attachment in scope.attachments() {
            add(first, end, Level::Scope, scope.depth() + 1, scope.path(), &[], &details, attachment);
        }
    }
    check_scopes_nest(&pending)?;
    // The domain each region's (or op's) executor pushes its own range into, by its steps and
    // level.
    let emitted: Vec<(usize, usize, Level, &str)> = nodes
        .iter()
        .filter_map(|n| n.emitted.as_ref().map(|e| (n.first, n.first + n.len, e.range.level(), e.range.domain())))
        .collect();
    let mut scopes = Vec::new();
    // The scopes with NVTX guards, before filtering: what each part of the filter could match.
    let mut ranged = Vec::new();
    for p in &pending {
        let admitted = filter.admits(p.level, p.executor, &p.categories);
        if p.guards.has_nvtx() {
            ranged.push((p.level, p.executor.to_string(), p.categories.clone()));
        }
        let skip_domain = match p.level {
            Level::Region | Level::Op if p.depth == 0 => emitted
                .iter()
                .find(|&&(first, end, level, _)| (first, end, level) == (p.first, p.end, p.level))
                .map(|&(.., d)| d),
            _ => None,
        };
        let site = GuardSite::new(&p.label, p.level, p.executor, (p.end - p.first) as u32).with_details(&p.details);
        for entry in &p.guards.entries {
            let (guard_id, planned, prepared) = match entry {
                // Left out by the plan's filter: never prepared.
                ScopeEntry::Nvtx { .. } if !admitted => continue,
                ScopeEntry::Nvtx { domain, guard, merged, .. } if Some(domain.as_str()) == skip_domain => {
                    // The executor pushes this domain's range itself; a guard of another kind
                    // than `NvtxRange` in it does not run, and the plan says so.
                    if merged.is_none() {
                        let level = p.level.name();
                        notes.push(format!(
                            "{level} `{}` (steps {}..{}): a `{}` guard in NVTX domain `{domain}` does not run: the \
                             {level}'s executor pushes that domain's range itself (with the guard's label, if it \
                             gives one)",
                            p.label,
                            p.first,
                            p.end,
                            guards.guard(*guard).kind()
                        ));
                    }
                    continue;
                }
                ScopeEntry::Nvtx { domain, guard, merged: Some(range), .. } => {
                    let r = range.resolve(&site);
                    let prepared = range.prepare_at(&site)?;
                    let details = prepared.has_details().then(|| p.details.clone());
                    let planned = NvtxPlan {
                        domain: domain.clone(),
                        label: r.label.to_string(),
                        category: Some(r.category),
                        color: Some(r.color),
                        payload: if details.is_some() { None } else { r.payload },
                        details,
                    };
                    (*guard, Some(planned), Box::new(prepared) as Box<dyn ScopedGuard>)
                }
                ScopeEntry::Nvtx { domain, guard, merged: None, .. } => {
                    let g = guards.guard(*guard);
                    let own = GuardSite { label: g.label().unwrap_or(&p.label), ..site };
                    let planned = NvtxPlan {
                        domain: domain.clone(),
                        label: own.label.to_string(),
                        category: None,
                        color: None,
                        payload: None,
                        details: None,
                    };
                    (*guard, Some(planned), g.prepare(&own)?)
                }
                ScopeEntry::Other { guard, .. } => {
                    let g = guards.guard(*guard);
                    let own = GuardSite { label: g.label().unwrap_or(&p.label), ..site };
                    (*guard, None, g.prepare(&own)?)
                }
            };
            let nvtx = prepared.as_nvtx_range().cloned();
            scopes.push(Scope {
                guard: prepared,
                nvtx,
                first: p.first as u32,
                end: p.end as u32,
                level: p.level,
                depth: u16::try_from(p.depth).unwrap_or(u16::MAX),
                profiling: guards.guard(guard_id).is_profiling(),
                planned,
            });
        }
    }
    // The ranges executors push themselves: (step, executor, domain, label).
    let pushed_by_executors: Vec<(usize, &str, &str, &str)> = nodes
        .iter()
        .filter_map(|n| n.emitted.as_ref())
        .map(|e| (e.step, e.executor.as_str(), e.range.domain(), e.range.label()))
        .collect();
    // The ranges around executors' twins first: dropping one moves its children up a level,
    // where one can become a twin, which the second pass then drops. (The other order could
    // drop a range as its parent's twin, then the parent as an executor's.)
    drop_ranges_around_their_executor_twin(&mut scopes, &pushed_by_executors, &mut notes);
    drop_ranges_inside_their_twin(&mut scopes, &mut notes);
    notes.extend(filter.unmatched_notes(&ranged));
    Ok((scopes, dropped.dropped, notes))
}

/// Drops every NVTX range that would sit directly inside a range of the same domain with the
/// same label (a run labelled like one of its ops, say): one range is what the user meant.
fn drop_ranges_inside_their_twin(scopes: &mut Vec<Scope>, notes: &mut Vec<String>) {
    let order = entry_order(scopes);
    let mut open: Vec<(&str, usize)> = Vec::new();
    let mut dropped = vec![false; scopes.len()];
    for &i in &order {
        let s = &scopes[i];
        // Scopes nest (checked before): one that ends before this one starts contains none that
        // come after it. Popped, the stack holds only the scopes around this one, and the search
        // below takes the nesting depth, not the number of ranges so far.
        while open.last().is_some_and(|&(_, o)| scopes[o].end <= s.first) {
            open.pop();
        }
        let Some(planned) = &s.planned else { continue };
        let parent = open.iter().rev().copied().find(|&(domain, o)| {
            let outer = &scopes[o];
            domain == planned.domain && outer.first <= s.first && s.end <= outer.end
        });
        if parent.is_some_and(|(_, o)| scopes[o].planned.as_ref().is_some_and(|p| p.label == planned.label)) {
            dropped[i] = true;
            notes.push(format!(
                "{} `{}` (steps {}..{}): its range in NVTX domain `{}` is dropped, as it would sit directly \
                 inside a range of that domain with the same label",
                s.level.name(),
                planned.label,
                s.first,
                s.end,
                planned.domain
            ));
            continue;
        }
        open.push((planned.domain.as_str(), i));
    }
    retain_undropped(scopes, &dropped);
}

/// The scopes' indices in the order a run enters them ([`Schedule::build`]'s): outer before
/// inner.
fn entry_order(scopes: &[Scope]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scopes.len()).collect();
    order.sort_by_key(|&i| {
        let s = &scopes[i];
        (s.level != Level::Trace, s.first, std::cmp::Reverse(s.end), s.level, s.depth, i)
    });
    order
}

/// Drops every NVTX range of the runtime's that a range an executor pushes itself (`pushed`:
/// its step, the executor, its domain and label) would sit directly inside with the same label
/// and domain, and then the next one out where it is a twin too. The executor's range cannot be
/// dropped (its kernel pushes it). The plan leaves it out where it sees the twin when the
/// executor's kernel is made; it does not see it there where a range between the two turns out
/// to be left out by the plan's filter (a composite's span over steps of several executors,
/// under a filter by executor or category), so the runtime's range goes here.
fn drop_ranges_around_their_executor_twin(
    scopes: &mut Vec<Scope>,
    pushed: &[(usize, &str, &str, &str)],
    notes: &mut Vec<String>,
) {
    if pushed.is_empty() {
        return;
    }
    let order = entry_order(scopes);
    let mut pushed = pushed.to_vec();
    pushed.sort_by_key(|p| p.0);
    let mut dropped = vec![false; scopes.len()];
    // One sweep in run order: the scopes open at each executor's range, innermost last. A
    // range dropped for one executor's range can leave another's directly inside a twin that
    // an earlier one passed (`a` > `b` > [`a` pushed, `b` pushed]), so sweeps repeat until
    // one drops nothing.
    loop {
        let mut any = false;
        let mut open: Vec<usize> = Vec::new();
        let mut next = 0;
        for &(step, executor, domain, label) in &pushed {
            while let Some(&i) = order.get(next).filter(|&&i| scopes[i].first as usize <= step) {
                while open.last().is_some_and(|&o| scopes[o].end <= scopes[i].first) {
                    open.pop();
                }
                open.push(i);
                next += 1;
            }
            while open.last().is_some_and(|&o| scopes[o].end as usize <= step) {
                open.pop();
            }
            // The innermost range of the domain still there, while it is the twin.
            for &i in open.iter().rev() {
                let s = &scopes[i];
                let Some(planned) = s.planned.as_ref().filter(|p| p.domain == domain && !dropped[i]) else { continue };
                if planned.label != label {
                    break;
                }
                dropped[i] = true;
                any = true;
                notes.push(format!(
                    "{} `{}` (steps {}..{}): its range in NVTX domain `{domain}` is dropped, as the range executor \
                     `{executor}` pushes itself at step {step} would sit directly inside it with the same label",
                    s.level.name(),
                    planned.label,
                    s.first,
                    s.end,
                ));
            }
        }
        if !any {
            break;
        }
    }
    retain_undropped(scopes, &dropped);
}

/// Keeps the scopes not marked `dropped`.
fn retain_undropped(scopes: &mut Vec<Scope>, dropped: &[bool]) {
    let mut index = 0;
    scopes.retain(|_| {
        index += 1;
        !dropped[index - 1]
    });
}

/// Scopes must nest (or be disjoint): the run loop exits them by count, innermost first, so two
/// that overlap would exit the wrong one.
fn check_scopes_nest(pending: &[PendingScope<'_>]) -> Result<()> {
    let mut spans: Vec<(usize, usize, &str)> =
        pending.iter().filter(|p| p.level != Level::Trace).map(|p| (p.first, p.end, p.label.as_str())).collect();
    spans.sort_by_key(|&(first, end, _)| (first, std::cmp::Reverse(end)));
    let mut open: Vec<(usize, usize, &str)> = Vec::new();
    for span in spans {
        while open.last().is_some_and(|o| o.1 <= span.0) {
            open.pop();
        }
        if let Some(outer) = open.last() {
            if span.1 > outer.1 {
                return Err(Error::OverlappingGuards {
                    first: format!("`{}` over steps {}..{}", outer.2, outer.0, outer.1),
                    second: format!("`{}` over steps {}..{}", span.2, span.0, span.1),
                });
            }
        }
        open.push(span);
    }
    Ok(())
}

/// A subsymbol scope: the subsymbol, its steps `first..end`, its depth, name and category.
type SubsymbolSite<'t> = (&'t BoundSymbol<'t>, usize, usize, usize, &'t str, Option<Category>);

/// The step ranges of `bsym`'s subsymbols down to `depth`, with how deep each is (`at` for the
/// direct ones), and the names of subsymbols whose own subsymbols the guard should reach but
/// that an executor runs whole.
fn subsymbol_sites<'t>(
    bsym: &BoundSymbol<'t>,
    node: &CompiledNode,
    depth: usize,
    at: usize,
    trace: &Trace<'t>,
    sites: &mut Vec<SubsymbolSite<'t>>,
    whole: &mut Vec<&'t str>,
) {
    for (sub, child) in bsym.subsymbols().iter().zip(&node.children) {
        let category = trace.registry().get(sub.symbol()).map(|s| s.symbol.category()).ok();
        sites.push((sub, child.first, child.first + child.len, at, trace.symbol_name(sub), category));
        if depth > 1 && !sub.subsymbols().is_empty() {
            if child.children.is_empty() {
                whole.push(trace.symbol_name(sub));
            } else {
                subsymbol_sites(sub, child, depth - 1, at + 1, trace, sites, whole);
            }
        }
    }
}

/// The two schedules: profiling on (every scope) and off (non-profiling scopes only).
pub(crate) fn schedules(scopes: &[Scope], steps: usize) -> [Schedule; 2] {
    [Schedule::build(scopes, steps, |_| true), Schedule::build(scopes, steps, |s| !s.profiling)]
}

/// The NVTX ranges one run pushes with `schedule`, in push order: the scopes entered before
/// each step, then the range the step's executor pushes from inside its kernel (when
/// `profiling`, the run's decision, is on).
pub(crate) fn range_map(scopes: &[Scope], schedule: &Schedule, nodes: &[CompiledNode], profiling: bool) -> RangeMap {
    let mut emitted: Vec<&EmittedRegionRange> = nodes.iter().filter_map(|n| n.emitted.as_ref()).collect();
    emitted.sort_by_key(|e| e.step);
    let mut emitted = emitted.into_iter().peekable();
    let mut ranges = Vec::new();
    let push_scopes = |indices: &[u32], ranges: &mut Vec<PlannedRange>| {
        for &i in indices {
            let scope = &scopes[i as usize];
            if let Some(p) = &scope.planned {
                ranges.push(PlannedRange {
                    steps: scope.first as usize..scope.end as usize,
                    level: scope.level,
                    domain: p.domain.clone(),
                    label: p.label.clone(),
                    category: p.category,
                    color: p.color,
                    payload: p.payload,
                    details: p.details.clone(),
                    pushed_by: PushedBy::Runtime,
                });
            }
        }
    };
    let (a, b) = schedule.run_enter;
    push_scopes(&schedule.order[a as usize..b as usize], &mut ranges);
    for (step, &(a, b)) in schedule.enter.iter().enumerate() {
        push_scopes(&schedule.order[a as usize..b as usize], &mut ranges);
        while let Some(e) = emitted.next_if(|e| e.step == step) {
            if profiling {
                let r = &e.range;
                ranges.push(PlannedRange {
                    steps: step..step + 1,
                    level: r.level(),
                    domain: r.domain().to_string(),
                    label: r.label().to_string(),
                    category: Some(r.category()),
                    color: Some(r.color()),
                    payload: r.payload(),
                    details: r.details().cloned(),
                    pushed_by: PushedBy::Executor(e.executor.clone()),
                });
            }
        }
    }
    RangeMap { ranges }
}
