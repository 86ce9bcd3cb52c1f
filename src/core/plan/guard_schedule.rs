//! Where a plan enters and exits its guards.
//!
//! Each attachment becomes a [`Scope`] over a contiguous range of steps, prepared once. Scopes
//! nest (trace ⊃ op ⊃ subsymbol; spans from decomposition nest by construction), so a run only
//! needs, per step, which scopes to enter before it and how many to exit after it, taken from
//! a stack. Two schedules are precomputed: with profiling on (every guard) and off (only guards
//! that are not profiling guards), so that switching profiling costs nothing per step when the
//! second one is empty.

use smallvec::SmallVec;

use crate::core::guards::{GuardKind, GuardSite, GuardTable, Level, ScopedGuard};
use crate::core::ir::{prims, BoundSymbol, Trace};
use crate::error::{Error, Result};

/// Where one bound symbol's steps are in the plan.
pub(crate) struct CompiledNode {
    pub first: usize,
    pub len: usize,
    /// Its subsymbols, if it was decomposed into them when compiled (empty if claimed whole).
    pub children: Vec<CompiledNode>,
    /// The NVTX domain of the region range handed to the executor that runs it whole, when
    /// that executor emits its own region ranges: the runtime emits none in that domain.
    pub emitted_nvtx_domain: Option<String>,
}

/// One prepared guard over the steps `first..end`.
pub(crate) struct Scope {
    pub guard: Box<dyn ScopedGuard>,
    /// A copy of a built-in NVTX range, which the run loop pushes and pops without virtual
    /// calls.
    pub nvtx: Option<crate::core::guards::PreparedNvtxRange>,
    pub first: u32,
    pub end: u32,
    /// Its level, which orders scopes over the same steps (op outside subsymbol). Trace-level
    /// scopes are entered before the first step and exited after the last.
    pub level: Level,
    pub profiling: bool,
}

impl Scope {
    fn new(guard: Box<dyn ScopedGuard>, first: usize, end: usize, level: Level, profiling: bool) -> Self {
        let nvtx = guard.as_nvtx_range().copied();
        Self { guard, nvtx, first: first as u32, end: end as u32, level, profiling }
    }

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

    fn build(scopes: &[Scope], steps: usize, include: impl Fn(&Scope) -> bool) -> Schedule {
        let mut order: Vec<u32> = (0..scopes.len() as u32).filter(|&i| include(&scopes[i as usize])).collect();
        // Outer before inner: whole-run, earlier start, later end, outer level, attach order.
        order.sort_by_key(|&i| {
            let s = &scopes[i as usize];
            (s.level != Level::Trace, s.first, std::cmp::Reverse(s.end), s.level, i)
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

/// Entered scopes of one run; exits whatever is still entered, innermost first, when dropped
/// (after an error, or while unwinding from a panic).
pub(crate) struct GuardStack<'p> {
    scopes: &'p [Scope],
    entered: SmallVec<[(u32, u64); 16]>,
}

impl<'p> GuardStack<'p> {
    pub fn new(scopes: &'p [Scope]) -> Self {
        Self { scopes, entered: SmallVec::new() }
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

impl Drop for GuardStack<'_> {
    fn drop(&mut self) {
        while self.exit_one() {}
    }
}

/// Prepares every attachment of `trace` over the compiled steps. Returns the scopes and the
/// attachments that cannot run (subsymbol guards of a composite an executor runs whole).
pub(crate) fn prepare_scopes(
    trace: &Trace<'_>,
    nodes: &[CompiledNode],
    step_executor: &[&str],
) -> Result<(Vec<Scope>, Vec<crate::core::guards::DroppedGuard>)> {
    let guards: &GuardTable = &trace.guards;
    let registry = trace.registry();
    let steps = step_executor.len();
    let mut scopes = Vec::new();
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
    for &g in &guards.trace_level {
        let guard = guards.guard(g);
        let site = GuardSite {
            label: guard.label().unwrap_or("trace"),
            level: Level::Trace,
            executor: "runtime",
            ops: steps as u32,
        };
        scopes.push(Scope::new(guard.prepare(&site)?, 0, steps, Level::Trace, guard.is_profiling()));
    }
    for (position, attachments) in guards.per_op.iter().enumerate() {
        let is_region = trace.bound_symbols().get(position).is_some_and(|b| b.symbol() == prims::REGION);
        let region_label = is_region.then(|| super::compile::region_label(trace, position));
        // A region gets one range per merge key (one NVTX range per domain, ...), and none in
        // the domain whose range its executor pushes itself.
        let emitted_domain = nodes.get(position).and_then(|n| n.emitted_nvtx_domain.as_deref());
        let mut merged: SmallVec<[String; 4]> = SmallVec::new();
        for a in attachments {
            let guard = guards.guard(a.guard);
            let on_region = is_region && a.depth == 0 && a.span == 1;
            if on_region {
                if guard.kind() == GuardKind::NvtxRange
                    && emitted_domain.is_some()
                    && guard.nvtx_domain() == emitted_domain
                {
                    continue;
                }
                if let Some(key) = guard.merge_key() {
                    if merged.contains(&key) {
                        continue;
                    }
                    merged.push(key);
                }
            }
            let (label, level) = match (&region_label, on_region) {
                (Some(label), true) => (label.clone(), Level::Region),
                _ => (guards.label_of(a, registry), a.level),
            };
            let mut push = |first: usize, end: usize, level: Level, label: &str| -> Result<()> {
                let site = GuardSite { label, level, executor: executor_of(first, end), ops: (end - first) as u32 };
                scopes.push(Scope::new(guard.prepare(&site)?, first, end, level, guard.is_profiling()));
                Ok(())
            };
            let Some(node) = nodes.get(position) else {
                return Err(Error::MalformedTrace {
                    position: Some(position),
                    detail: "a guard is attached to a bound symbol the trace does not have".into(),
                });
            };
            if a.depth == 0 {
                let last = nodes.get(position + a.span as usize - 1).unwrap_or(node);
                push(node.first, last.first + last.len, level, &label)?;
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
                subsymbol_sites(bsym, node, a.depth as usize, trace, &mut sites, &mut whole);
                for (first, end, name) in sites {
                    push(first, end, Level::Subsymbol, name)?;
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
    Ok((scopes, dropped.dropped))
}

/// The step ranges of `bsym`'s subsymbols down to `depth`, and the names of subsymbols whose
/// own subsymbols the guard should reach but that an executor runs whole.
fn subsymbol_sites<'t>(
    bsym: &BoundSymbol<'t>,
    node: &CompiledNode,
    depth: usize,
    trace: &Trace<'t>,
    sites: &mut Vec<(usize, usize, &'t str)>,
    whole: &mut Vec<&'t str>,
) {
    for (sub, child) in bsym.subsymbols().iter().zip(&node.children) {
        sites.push((child.first, child.first + child.len, trace.symbol_name(sub)));
        if depth > 1 && !sub.subsymbols().is_empty() {
            if child.children.is_empty() {
                whole.push(trace.symbol_name(sub));
            } else {
                subsymbol_sites(sub, child, depth - 1, trace, sites, whole);
            }
        }
    }
}

/// The two schedules: profiling on (every scope) and off (non-profiling scopes only).
pub(crate) fn schedules(scopes: &[Scope], steps: usize) -> [Schedule; 2] {
    [Schedule::build(scopes, steps, |_| true), Schedule::build(scopes, steps, |s| !s.profiling)]
}
