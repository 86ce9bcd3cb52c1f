//! The session's compiled plans, by what the trace is: a repeated run neither re-runs the
//! passes nor recompiles nor grows the caller's arena.
//!
//! A trace is identified by a fingerprint of everything a plan depends on: its registry (a
//! generation number unique to a registry and its symbols), its bound symbols (symbols by name
//! and id, arguments, outputs, names, decompositions), its values' dtypes and
//! shapes, its inputs and outputs, and its guards (the guard objects and where they are
//! attached). Two independent 64-bit hashes make the 128-bit fingerprint. Computing it
//! allocates nothing. A cached entry keeps the trace's guard objects alive, so that their
//! addresses, part of the fingerprint, cannot be reused by other guards while it is cached.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use crate::core::guards::Guard;
use crate::core::ir::{Arg, BoundSymbol, Trace};
use crate::core::plan::Plan;
use crate::error::Result;

/// How many plans a session keeps (the most recently used).
pub const CACHED_PLANS: usize = 16;

struct Entry {
    fingerprint: u128,
    plan: Arc<Plan>,
    _guards: Vec<Arc<dyn Guard>>,
}

/// Plans by trace fingerprint, most recently used last.
#[derive(Default)]
pub(crate) struct PlanCache {
    entries: Mutex<Vec<Entry>>,
}

impl PlanCache {
    /// The cached plan of `trace`, or the one `compile` makes (then cached).
    pub fn get_or_compile(&self, trace: &Trace<'_>, compile: impl FnOnce() -> Result<Plan>) -> Result<Arc<Plan>> {
        let fingerprint = fingerprint(trace);
        {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = entries.iter().position(|e| e.fingerprint == fingerprint) {
                let plan = entries[i].plan.clone();
                let last = entries.len() - 1;
                entries.swap(i, last);
                return Ok(plan);
            }
        }
        let plan = Arc::new(compile()?);
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= CACHED_PLANS {
            entries.remove(0);
        }
        let guards = trace.guards.guards.clone();
        entries.push(Entry { fingerprint, plan: plan.clone(), _guards: guards });
        Ok(plan)
    }

    /// Number of cached plans.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.len())
    }
}

/// The trace's 128-bit fingerprint.
pub(crate) fn fingerprint(trace: &Trace<'_>) -> u128 {
    let mut low = std::collections::hash_map::DefaultHasher::new();
    let mut high = std::collections::hash_map::DefaultHasher::new();
    0xb0u8.hash(&mut high);
    for hasher in [&mut low, &mut high] {
        hash_trace(trace, hasher);
    }
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

fn hash_trace(trace: &Trace<'_>, h: &mut impl Hasher) {
    // Which symbols the ids mean: two registries can give the same id and name to different
    // definitions.
    trace.registry().generation().hash(h);
    for meta in trace.values {
        meta.dtype.hash(h);
        meta.shape.hash(h);
    }
    trace.inputs.hash(h);
    trace.outputs.hash(h);
    trace.bound_symbols.len().hash(h);
    for bsym in trace.bound_symbols {
        hash_bound_symbol(trace, bsym, h);
    }
    let guards = &trace.guards;
    for guard in &guards.guards {
        (Arc::as_ptr(guard) as *const () as usize).hash(h);
    }
    guards.trace_level.hash(h);
    for (position, attachments) in guards.per_op.iter().enumerate() {
        for a in attachments {
            (position, a.guard, a.span, a.depth, a.level, a.origin).hash(h);
        }
    }
}

fn hash_bound_symbol(trace: &Trace<'_>, bsym: &BoundSymbol<'_>, h: &mut impl Hasher) {
    bsym.symbol().hash(h);
    trace.symbol_name(bsym).hash(h);
    bsym.name().hash(h);
    bsym.args().len().hash(h);
    for arg in bsym.args() {
        match arg {
            Arg::Value(v) => (0u8, v).hash(h),
            Arg::Scalar(s) => (1u8, s.to_bits()).hash(h),
            Arg::Dims(d) => (2u8, d).hash(h),
            Arg::DType(d) => (3u8, d).hash(h),
        }
    }
    bsym.outputs().hash(h);
    bsym.subsymbols().len().hash(h);
    for sub in bsym.subsymbols() {
        hash_bound_symbol(trace, sub, h);
    }
}
