//! `ClosureGuard`: a pair of closures for a user's own enter and exit.

use std::sync::Arc;

use super::{Guard, GuardKind, GuardPolicy, GuardSite, ScopedGuard};
use crate::error::Result;

type Hook = Arc<dyn Fn() + Send + Sync>;

/// Runs `enter` before and `exit` after what it is attached to, for example to set and restore
/// thread-local state. Not a profiling guard by default: it runs whether profiling is on or
/// off.
///
/// ```
/// use std::cell::Cell;
/// use boundscope::guards::{ClosureGuard, Guard, GuardSite, Level};
/// thread_local!(static IN_OP: Cell<bool> = const { Cell::new(false) });
/// let guard = ClosureGuard::new(|| IN_OP.with(|c| c.set(true)), || IN_OP.with(|c| c.set(false)));
/// let site = GuardSite::new("add", Level::Op, "cpu", 1);
/// let prepared = guard.prepare(&site).unwrap();
/// prepared.in_scope(|| assert!(IN_OP.with(|c| c.get())));
/// assert!(!IN_OP.with(|c| c.get()));
/// ```
#[derive(Clone)]
pub struct ClosureGuard {
    enter: Hook,
    exit: Hook,
    policy: GuardPolicy,
    profiling: bool,
}

impl ClosureGuard {
    /// A guard that calls `enter` on entry and `exit` on exit. `exit` must not panic.
    pub fn new(enter: impl Fn() + Send + Sync + 'static, exit: impl Fn() + Send + Sync + 'static) -> Self {
        Self { enter: Arc::new(enter), exit: Arc::new(exit), policy: GuardPolicy::Keep, profiling: false }
    }

    /// Declares what passes do with it (default [`GuardPolicy::Keep`]).
    pub fn with_policy(mut self, policy: GuardPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Makes it a profiling guard, switched off with `Plan::set_profiling(false)`.
    pub fn as_profiling(mut self) -> Self {
        self.profiling = true;
        self
    }
}

struct PreparedClosure {
    enter: Hook,
    exit: Hook,
}

impl ScopedGuard for PreparedClosure {
    fn on_enter(&self) -> u64 {
        (self.enter)();
        0
    }

    fn on_exit(&self, _entered: u64) {
        (self.exit)();
    }
}

impl Guard for ClosureGuard {
    fn kind(&self) -> GuardKind {
        GuardKind::Closure
    }

    fn policy(&self) -> GuardPolicy {
        self.policy
    }

    fn is_profiling(&self) -> bool {
        self.profiling
    }

    fn prepare(&self, _site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>> {
        Ok(Box::new(PreparedClosure { enter: self.enter.clone(), exit: self.exit.clone() }))
    }
}
