//! The session's compiled plans, by what the trace is: a repeated run neither re-runs the
//! passes nor recompiles nor grows the caller's arena.
//!
//! A trace is identified by a fingerprint of everything a plan depends on: its registry (a
//! generation number unique to a registry and its symbols), its bound symbols (symbols by name
//! and id, arguments, outputs, names, decompositions), its values' dtypes and
//! shapes, its inputs and outputs, its guards (the guard objects and where they are
//! attached) and its named scopes (paths, spans and the guards on them). Two independent 64-bit hashes make the 128-bit fingerprint. Computing it
//! allocates nothing. A cached entry keeps the trace's guard objects alive, so that their
//! addresses, part of the fingerprint, cannot be reused by other guards while it is cached.
//!
//! The cache is least-recently-used: a hit makes its entry the most recent, and a new plan
//! past [`CACHED_PLANS`] evicts the entry used longest ago. A trace is compiled once even when
//! several threads ask for it at the same time: the first one compiles, the others wait for
//! its plan (or, if it failed, try again themselves, so each caller sees its own error).

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::core::guards::Guard;
use crate::core::ir::{Arg, BoundSymbol, Trace};
use crate::core::plan::Plan;
use crate::error::Result;

/// How many plans a session keeps: the most recently used ones. Each holds its workspaces
/// and the trace's guard objects, so a program that cycles through more distinct traces than
/// this recompiles them (and grows its arena) as they come back.
pub const CACHED_PLANS: usize = 16;

/// A cached plan, or one being compiled.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    ready: Condvar,
}

#[derive(Default)]
enum SlotState {
    /// A thread is compiling it.
    #[default]
    Compiling,
    Ready(Arc<Plan>),
    /// The compile failed; a later caller compiles it again.
    Failed,
}

struct Entry {
    fingerprint: u128,
    slot: Arc<Slot>,
    _guards: Vec<Arc<dyn Guard>>,
}

/// Plans by trace fingerprint, least recently used first.
#[derive(Default)]
pub(crate) struct PlanCache {
    entries: Mutex<Vec<Entry>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PlanCache {
    /// The cached plan of `trace`, or the one `compile` makes (then cached). Concurrent callers
    /// for one trace share one compile.
    pub fn get_or_compile(&self, trace: &Trace<'_>, compile: impl FnOnce() -> Result<Plan>) -> Result<Arc<Plan>> {
        let fingerprint = fingerprint(trace);
        let mut compile = Some(compile);
        loop {
            let slot = {
                let mut entries = lock(&self.entries);
                match entries.iter().position(|e| e.fingerprint == fingerprint) {
                    Some(i) => {
                        // Most recently used last.
                        let entry = entries.remove(i);
                        let slot = entry.slot.clone();
                        entries.push(entry);
                        slot
                    }
                    None => {
                        if entries.len() >= CACHED_PLANS {
                            entries.remove(0);
                        }
                        let slot = Arc::new(Slot::default());
                        let guards = trace.guards.guards.clone();
                        entries.push(Entry { fingerprint, slot: slot.clone(), _guards: guards });
                        drop(entries);
                        let compile = compile.take().expect("a caller compiles at most once");
                        return self.compile_into(fingerprint, &slot, compile);
                    }
                }
            };
            let mut state = lock(&slot.state);
            loop {
                match &*state {
                    SlotState::Ready(plan) => return Ok(plan.clone()),
                    SlotState::Compiling => state = slot.ready.wait(state).unwrap_or_else(PoisonError::into_inner),
                    SlotState::Failed => break,
                }
            }
            // The compiling caller failed and removed the entry: try again (this caller
            // compiles, unless another one got there first).
        }
    }

    /// Runs `compile` for the new entry `slot`, then wakes its waiters. On failure (or a
    /// panic) the entry leaves the cache first, so that the waiters compile it again.
    fn compile_into(
        &self,
        fingerprint: u128,
        slot: &Slot,
        compile: impl FnOnce() -> Result<Plan>,
    ) -> Result<Arc<Plan>> {
        struct Wake<'s> {
            cache: &'s PlanCache,
            fingerprint: u128,
            slot: &'s Slot,
            plan: Option<Arc<Plan>>,
        }
        impl Drop for Wake<'_> {
            fn drop(&mut self) {
                let state = match self.plan.take() {
                    Some(plan) => SlotState::Ready(plan),
                    None => {
                        let mut entries = lock(&self.cache.entries);
                        let ours = |e: &Entry| e.fingerprint == self.fingerprint && std::ptr::eq(&*e.slot, self.slot);
                        if let Some(i) = entries.iter().position(ours) {
                            entries.remove(i);
                        }
                        SlotState::Failed
                    }
                };
                *lock(&self.slot.state) = state;
                self.slot.ready.notify_all();
            }
        }
        let mut wake = Wake { cache: self, fingerprint, slot, plan: None };
        let plan = Arc::new(compile()?);
        wake.plan = Some(plan.clone());
        Ok(plan)
    }

    /// Number of cached plans.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    /// Whether `trace`'s plan is cached (or being compiled).
    #[cfg(test)]
    pub fn contains(&self, trace: &Trace<'_>) -> bool {
        let fingerprint = fingerprint(trace);
        lock(&self.entries).iter().any(|e| e.fingerprint == fingerprint)
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
    // In-place updates: a plan runs them, so traces that differ only in them differ.
    trace.updates.hash(h);
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
    // Named scopes and the guards on them.
    trace.scopes().len().hash(h);
    for scope in trace.scopes() {
        (scope.path(), scope.positions(), scope.depth(), scope.guard_ids()).hash(h);
    }
    trace.scope_notes().hash(h);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ir::{Arena, Registry, TraceBuilder};
    use crate::executors::CpuReference;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn waiters_share_one_compile_and_retry_after_a_failure() {
        let registry = Registry::with_builtins();
        let cache = PlanCache::default();
        let (compiles, failures) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let threads = 8;
        let barrier = std::sync::Barrier::new(threads);
        std::thread::scope(|s| {
            for _ in 0..threads {
                let (registry, cache, compiles, failures, barrier) =
                    (&registry, &cache, &compiles, &failures, &barrier);
                s.spawn(move || {
                    let arena = Arena::new();
                    let mut b = TraceBuilder::new(&arena, registry);
                    let x = b.input(&[8]).unwrap();
                    let y = b.exp(x).unwrap();
                    b.output(y).unwrap();
                    let trace = b.finish().unwrap();
                    barrier.wait();
                    let result = cache.get_or_compile(&trace, || {
                        let n = compiles.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        // The first compile fails: its waiters compile again, once.
                        if n == 0 {
                            return Err(crate::Error::WorkspaceMismatch);
                        }
                        Plan::compile(&trace, &[CpuReference::shared()])
                    });
                    if result.is_err() {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(compiles.load(Ordering::SeqCst), 2, "one failed compile, then one that every waiter shares");
        assert_eq!(failures.load(Ordering::SeqCst), 1, "only the caller whose compile failed sees the error");
        assert_eq!(cache.len(), 1);
    }
}
