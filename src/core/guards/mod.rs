//! Scoped guards: context managers attached to bound symbols as metadata, entered just before
//! the op runs and exited just after, whatever happens.
//!
//! A [`Guard`] is the attachable description (an NVTX range, a recorder, a timer, your own);
//! when a plan is compiled, each attachment is *prepared* once for its site into a
//! [`ScopedGuard`], which does all string registration and attribute building up front, so
//! that entering and exiting at run time is only the essential call. Guards are kept in a side
//! table of the trace, never in the arena and never as nodes of the trace: attaching one does
//! not change which bound symbols a trace holds or how they print, apart from a short
//! annotation.
//!
//! ## The guards overhead ladder (`cargo bench --bench guards`), ns per op
//! One plan of 1,000 trivial ops; medians of 31 interleaved rounds, printed by the bench.
//! 2026-12-04, three runs on a busy 2-core machine (the figures of 2026-11-30 in brackets,
//! before elementwise kernels ran as maps):
//!
//! | rung | ns per op |
//! | --- | --- |
//! | (a) no guards | 6.11-7.66 (14.76) |
//! | (b) NVTX range on every op, profiling off | 6.11-6.52 (14.75) |
//! | (b2) as (b), plus one non-profiling closure guard around the run (the guarded loop runs) | 7.52-7.65 (15.34) |
//! | (c) NVTX range on every op, profiling on, no tool attached | 12.00-12.18 (21.48) |
//! | (d) push/pop inserted as bound symbols, same runtime | 22.06-23.56 (37.57) |
//! | (e) floor: bare `nvtx::sys` push/pop pair | 2.98-3.53 (4.70) |
//! | (e2) the calls a range makes: `nvtxDomainRangePushEx` (registered label, category, colour) and `nvtxDomainRangePop` | 3.26 (one run) |
//!
//! Goals: (b) - (a) within 1 ns: **-0.09, -0.01, -1.14 ns** ((a) and (b) run the very same
//! loop, so this is the runs' noise; 0.00 on 2026-11-30); ((c) - (a)) / (e) at most 1.5:
//! **1.90, 2.00, 1.28** (met in one run of three; 1.43 on 2026-11-30, 1.2-1.8 over runs then):
//! the floor is 1.2-1.7 ns cheaper than it was, (c) - (a) 4.5-6.0 ns against 6.7, of which
//! (e2) says 3.3 ns are NVTX's own domain calls and 1.3 ns the runtime around them (in the run
//! that printed both); (c) / (d) = **0.52-0.55** (cheaper: met). Wall-clock rungs move by a
//! nanosecond between runs here; the instruction counts below are exact. Under Nsight Systems
//! (`scripts/nsys-check`, in CI) the quickstart's 8,080 ranges arrive balanced and nested, each
//! region's once; `profiled_session` switches profiling on by itself there at 1.01-1.03x the cost of
//! a plan compiled by hand.
//!
//! ### Instruction counts (`scripts/check-instruction-budgets`)
//! The same plan under Valgrind's Callgrind (exact counts; CI fails a case past its budget in
//! `benches/instruction_budgets.tsv` plus 3%). 2026-12-04: **107 Ir per op** with no guards
//! (182 before elementwise kernels ran as maps, 280 before narrow steps and a kernel type per
//! elementwise op; 293 on 2026-12-01), the same with a range on every op and profiling off
//! ((b) / (a) = **1.000**); +89 per op for a push and pop no tool receives; +4 per structured
//! payload.
//! ```text
//! cargo install gungraun-runner --version 0.20.0 --locked
//! scripts/check-instruction-budgets
//! ```

mod attach;
mod closure;
mod host_timer;
mod nvtx_layer;
mod nvtx_payload;
mod nvtx_range;
mod recorder;
mod relabeled;
mod scope_details;
mod table;
mod timeline;
mod tracing_span;

use std::fmt;
use std::marker::PhantomData;

pub use attach::Selection;
pub use closure::ClosureGuard;
pub use host_timer::{HostTimer, TimerStats};
#[doc(hidden)]
pub use nvtx_range::PreparedNvtxRange;

pub use nvtx_layer::NvtxLayer;
pub(crate) use nvtx_range::takes_details;
pub use nvtx_range::{NvtxRange, DEFAULT_DOMAIN};
pub use recorder::{RecordedRange, Recorder};
pub(crate) use relabeled::Relabeled;
pub use scope_details::ScopeDetails;
pub use table::DroppedGuard;
pub(crate) use table::{carried_span, Attachment, GuardTable};
pub use timeline::{folded_stacks, Timeline, CUDA_EVENTS_TRACK, DEFAULT_CAPACITY, PAST_BOUND_LABEL};
pub use tracing_span::{TracingSpan, TRACING_TARGET};

use crate::error::Result;

/// What kind of thing a guard is. Executors declare which kinds they emit themselves, so that
/// the runtime never emits a second copy; listings print the kind as an annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GuardKind {
    /// An NVTX push/pop range.
    NvtxRange,
    /// The in-process range recorder.
    Recorder,
    /// The host timer.
    HostTimer,
    /// A pair of user closures.
    Closure,
    /// A `tracing` span.
    TracingSpan,
    /// The timeline of host scopes ([`Timeline`]).
    Timeline,
    /// A user-defined kind, named (`@count`, say). Listings print a name of one word as it is,
    /// and any other (empty, or with spaces or control characters) quoted and escaped, so that
    /// a listing keeps one line per op.
    Custom(&'static str),
}

impl GuardKind {
    /// Its annotation (`@nvtx`, `@record`, ...): listings print it through `Display`, which
    /// quotes a custom name of more than one word.
    pub fn annotation(&self) -> &'static str {
        match self {
            GuardKind::NvtxRange => "@nvtx",
            GuardKind::Recorder => "@record",
            GuardKind::HostTimer => "@timer",
            GuardKind::Closure => "@closure",
            GuardKind::TracingSpan => "@span",
            GuardKind::Timeline => "@timeline",
            GuardKind::Custom(name) => name,
        }
    }
}

impl fmt::Display for GuardKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.annotation() {
            word if !word.is_empty() && !word.chars().any(|c| c.is_whitespace() || c.is_control()) => f.write_str(word),
            other => write!(f, "{other:?}"),
        }
    }
}

/// What happens to a guard when a pass rewrites the bound symbol it is attached to.
///
/// Whatever the policy, a guard is never lost silently: if it cannot follow its bound symbol,
/// it is listed in [`Trace::dropped_guards`](crate::Trace::dropped_guards) with the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardPolicy {
    /// Stay on the bound symbol itself: a decomposed composite's guard covers the prims it
    /// became, and a fusion pass leaves an op with such a guard unfused (the guard would
    /// otherwise surround the other ops of the region too). For guards that change behaviour
    /// around one op.
    Keep,
    /// Move to the enclosing unit: a fused op's guard moves to its region (and merges with the
    /// same guard of the region's other ops); a decomposed composite's guard covers the prims
    /// it became. For profiling guards.
    MoveToEnclosing,
    /// Be dropped, with this reason recorded, when the bound symbol is rewritten.
    DropWithReason(&'static str),
}

/// What [`passes::Grad`](crate::passes::Grad) puts around the backward ops of an op (or a
/// scope) that a guard surrounds in the forward trace ([`Guard::on_backward`]).
#[derive(Clone)]
#[non_exhaustive]
pub enum OnBackward {
    /// Nothing: the guard stays on the forward op only (the default: guards that change
    /// behaviour around one op are not repeated where it is not).
    Nothing,
    /// The same guard object, with this label instead of the site's (clones of one
    /// [`Recorder`] or [`HostTimer`] record the backward too).
    Relabeled(String),
    /// This guard.
    Guard(std::sync::Arc<dyn Guard>),
}

impl fmt::Debug for OnBackward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OnBackward::Nothing => f.write_str("Nothing"),
            OnBackward::Relabeled(label) => f.debug_tuple("Relabeled").field(label).finish(),
            OnBackward::Guard(g) => f.debug_tuple("Guard").field(&g.kind()).finish(),
        }
    }
}

/// The label the built-in profiling guards give the backward of what they surround:
/// `<label> (backward)`.
pub fn backward_label(forward_label: &str) -> String {
    format!("{forward_label} (backward)")
}

/// The level of a range in the nesting `trace ⊃ scope ⊃ region or op ⊃ subsymbol`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Level {
    /// Around a whole run.
    Trace,
    /// Around a named scope of the trace (`h.3.attn`; see
    /// [`TraceBuilder::scope`](crate::TraceBuilder::scope)); nested scopes nest.
    Scope,
    /// Around a fused region.
    Region,
    /// Around a top-level bound symbol (or the prims a composite became).
    Op,
    /// Around a subsymbol of a composite.
    Subsymbol,
}

impl Level {
    /// Lower-case name (`trace`, `scope`, `region`, `op`, `subsymbol`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Trace => "trace",
            Level::Scope => "scope",
            Level::Region => "region",
            Level::Op => "op",
            Level::Subsymbol => "subsymbol",
        }
    }

    /// All levels, outermost first.
    pub const ALL: [Level; 5] = [Level::Trace, Level::Scope, Level::Region, Level::Op, Level::Subsymbol];
}

/// Where a guard is being prepared: what it will surround.
///
/// A plan builds one per scope when it is compiled, with [`details`](Self::details); build
/// your own with [`GuardSite::new`] to prepare a guard by hand (in a test, say).
///
/// ```
/// use boundscope::guards::{GuardSite, Level, ScopeDetails};
/// let details = ScopeDetails { ops: 3, ..ScopeDetails::default() };
/// let site = GuardSite::new("mlp", Level::Op, "cpu_reference", 3).with_details(&details);
/// assert_eq!(site.details.map(|d| d.ops), Some(3));
/// ```
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct GuardSite<'s> {
    /// The default label: the symbol's name (`add`), the composite's name for the prims it
    /// became, or `trace` for a whole run.
    pub label: &'s str,
    /// The level of the range.
    pub level: Level,
    /// The executor that runs what the guard surrounds (`runtime` for a whole run).
    pub executor: &'s str,
    /// How many compiled ops the guard surrounds (a payload for regions and spans).
    pub ops: u32,
    /// What the scope reads, writes and computes: always set by a plan, `None` in a site built
    /// by hand without [`with_details`](Self::with_details).
    pub details: Option<&'s ScopeDetails>,
}

impl<'s> GuardSite<'s> {
    /// A site with this label, level, executor and op count, without details.
    pub fn new(label: &'s str, level: Level, executor: &'s str, ops: u32) -> Self {
        Self { label, level, executor, ops, details: None }
    }

    /// The same site, with these details.
    pub fn with_details(self, details: &'s ScopeDetails) -> Self {
        Self { details: Some(details), ..self }
    }
}

/// A context manager that can be attached to bound symbols, regions or whole traces.
///
/// Implement it for your own guards; see [`ClosureGuard`] for the quickest way.
///
/// # One per scope
/// A plan runs each guard at most once per scope (a run, a region, an op, a subsymbol span):
/// - guards that report an NVTX domain ([`nvtx_domain`](Self::nvtx_domain)): one range per
///   domain per scope, merged as that method says; in the domain an executor pushes its own
///   region ranges into ([`EmittedRange`](crate::EmittedRange)), none from the runtime;
/// - other guards: one guard object attached twice to one scope, or two guards with the same
///   [`merge_key`](Self::merge_key) (clones of one [`Recorder`] or [`HostTimer`]), run once.
///
/// # Exits that panic
/// `on_exit` must not panic. If one does anyway, the run still exits every other guard it
/// entered, innermost first, and then resumes that panic (the run does not return, and a kernel
/// error it was returning is lost); if the run was already unwinding from a kernel's panic,
/// the exit's panic is discarded and the kernel's panic goes on. The process never aborts.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use boundscope::guards::{Guard, GuardKind, GuardSite, ScopedGuard};
///
/// /// Counts entries per plan site.
/// struct CountCalls(Arc<AtomicU64>);
/// struct Counting(Arc<AtomicU64>);
/// impl ScopedGuard for Counting {
///     fn on_enter(&self) -> u64 { self.0.fetch_add(1, Ordering::Relaxed); 0 }
///     fn on_exit(&self, _entered: u64) {}
/// }
/// impl Guard for CountCalls {
///     fn kind(&self) -> GuardKind { GuardKind::Custom("@count") }
///     fn prepare(&self, _site: &GuardSite<'_>) -> boundscope::Result<Box<dyn ScopedGuard>> {
///         Ok(Box::new(Counting(self.0.clone())))
///     }
/// }
/// ```
pub trait Guard: Send + Sync + 'static {
    /// Its kind.
    fn kind(&self) -> GuardKind;

    /// What passes do with it when they rewrite its bound symbol. Default: [`GuardPolicy::Keep`].
    fn policy(&self) -> GuardPolicy {
        GuardPolicy::Keep
    }

    /// Whether it is a profiling guard, switched off with
    /// [`Plan::set_profiling`](crate::Plan::set_profiling). Default: `true`. Guards that change
    /// behaviour (setting thread-local state, say) return `false` and always run.
    fn is_profiling(&self) -> bool {
        true
    }

    /// A label that overrides the site's default label, if the user set one.
    fn label(&self) -> Option<&str> {
        None
    }

    /// Guards with the same key, moved onto one fusion region, merge into one (an NVTX range
    /// per domain; one range per recorder; one timing per timer). `None`: never merged with
    /// another guard object. Default: `None`.
    fn merge_key(&self) -> Option<String> {
        None
    }

    /// For NVTX ranges: the domain they emit into. Default: `None`.
    ///
    /// A guard that reports a domain is an NVTX range for the plan's rule: per domain, every
    /// scope (a run, a region, an op, a subsymbol span) gets at most one range. When several
    /// guards of one domain land on one scope, the first one attached is the range; for
    /// built-in [`NvtxRange`]s the first explicit label, colour, category or payload among them
    /// wins, and a conflict is reported as a note of the plan ([`Plan::notes`](crate::Plan::notes)).
    fn nvtx_domain(&self) -> Option<&str> {
        None
    }

    /// For built-in NVTX ranges: the range's settings, so that several ranges of one domain on
    /// one scope merge into one. Default: `None`.
    fn as_nvtx_range(&self) -> Option<&NvtxRange> {
        None
    }

    /// What goes around the backward ops of what it surrounds when
    /// [`passes::Grad`](crate::passes::Grad) differentiates the trace: `forward_label` is its
    /// label there (its own, or the forward op's or scope's name) and `forward_position` the
    /// forward op's position in the trace (`None` for a scope). Default: [`OnBackward::Nothing`];
    /// the built-in profiling guards (NVTX ranges, recorders, timers, timelines, tracing spans)
    /// repeat themselves, labelled [`backward_label`], and an NVTX range's payload is the
    /// forward op's position, pairing the two as PyTorch's `emit_nvtx` does with sequence
    /// numbers.
    fn on_backward(&self, forward_label: &str, forward_position: Option<usize>) -> OnBackward {
        let _ = (forward_label, forward_position);
        OnBackward::Nothing
    }

    /// Prepares the guard for one site of a plan: called once, when the plan is compiled.
    ///
    /// # Errors
    /// Whatever makes the guard unusable at this site; the plan fails to compile with it.
    fn prepare(&self, site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>>;
}

/// A guard prepared for one site of a plan: entering and exiting are all that is left to do.
///
/// `on_exit` must not panic or fail loudly (it may run while unwinding); a guard that can fail
/// records the error and reports it from its own API.
pub trait ScopedGuard: Send + Sync {
    /// Enters the scope; returns a word of state handed back to `on_exit` (a start time, an
    /// id), so that no per-entry allocation is needed.
    fn on_enter(&self) -> u64;

    /// Exits the scope entered by the `on_enter` call that returned `entered`.
    fn on_exit(&self, entered: u64);

    /// For built-in NVTX ranges: the domain and attributes, so that the run loop can push and
    /// pop them directly instead of through two virtual calls. Others return `None`.
    #[doc(hidden)]
    fn as_nvtx_range(&self) -> Option<&nvtx_range::PreparedNvtxRange> {
        None
    }
}

impl dyn ScopedGuard + '_ {
    /// Enters the scope; dropping the returned token exits it (also while unwinding).
    ///
    /// The token stays on the entering thread, so the exit happens there, as NVTX push/pop
    /// requires. Dropped on the thread that entered, it exits the scope:
    /// ```
    /// use boundscope::guards::{Guard, GuardSite, Level, Recorder, ScopedGuard};
    /// let recorder = Recorder::new();
    /// let site = GuardSite::new("add", Level::Op, "cpu", 1);
    /// // Leaked, so that the token borrows nothing local: it is `'static`.
    /// let prepared: &'static dyn ScopedGuard = Box::leak(recorder.prepare(&site).unwrap());
    /// let token = prepared.enter();
    /// std::thread::spawn(|| 6 * 7).join().unwrap();
    /// drop(token);
    /// assert_eq!(recorder.ranges().len(), 1);
    /// ```
    /// The same code sending the token to another thread does not compile, and `Send` is the
    /// only reason (the token is `'static`, so no borrow is at stake):
    /// ```compile_fail
    /// use boundscope::guards::{Guard, GuardSite, Level, Recorder, ScopedGuard};
    /// let recorder = Recorder::new();
    /// let site = GuardSite::new("add", Level::Op, "cpu", 1);
    /// let prepared: &'static dyn ScopedGuard = Box::leak(recorder.prepare(&site).unwrap());
    /// let token = prepared.enter();
    /// std::thread::spawn(move || drop(token)).join().unwrap(); // error: `*mut ()` cannot be sent between threads
    /// ```
    pub fn enter(&self) -> Entered<'_> {
        Entered { guard: self, state: self.on_enter(), _not_send: PhantomData }
    }

    /// Runs `f` inside the scope.
    ///
    /// ```
    /// use boundscope::guards::{Guard, GuardSite, Level, Recorder};
    /// let recorder = Recorder::new();
    /// let site = GuardSite::new("work", Level::Op, "me", 1);
    /// let prepared = recorder.prepare(&site).unwrap();
    /// let answer = prepared.in_scope(|| 6 * 7);
    /// assert_eq!(answer, 42);
    /// assert_eq!(recorder.ranges()[0].label.as_ref(), "work");
    /// ```
    pub fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _entered = self.enter();
        f()
    }
}

/// An entered scope; dropping it exits the scope. Not `Send`: the exit happens on the
/// entering thread, as NVTX push/pop requires.
#[must_use = "the scope exits when this token is dropped; bind it to a named variable"]
pub struct Entered<'g> {
    guard: &'g dyn ScopedGuard,
    state: u64,
    _not_send: PhantomData<*mut ()>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Unwinding already (the scope's body panicked): an exit that panics too would abort
            // the process. Its panic is dropped; the body's goes on.
            let guard = self.guard;
            let state = self.state;
            drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guard.on_exit(state))));
        } else {
            self.guard.on_exit(self.state);
        }
    }
}

/// Checks a user label: non-empty and without interior NUL (NVTX takes C strings).
/// Checks what the runtime takes from a guard as it is attached: its label, and the name of the
/// NVTX domain it reports (refused as [`NvtxRange::domain`] refuses it).
pub(crate) fn check_guard(guard: &dyn Guard) -> Result<()> {
    if let Some(label) = guard.label() {
        check_label(label)?;
    }
    if let Some(domain) = guard.nvtx_domain() {
        check_domain(domain)?;
    }
    Ok(())
}

/// Checks the name of an NVTX domain: not empty, no NUL.
pub(crate) fn check_domain(name: &str) -> Result<()> {
    check_label(name).map_err(|e| match e {
        crate::Error::InvalidLabel { label, detail } => {
            crate::Error::InvalidLabel { label, detail: detail.replace("a label", "an NVTX domain name") }
        }
        other => other,
    })
}

pub(crate) fn check_label(label: &str) -> Result<()> {
    if label.is_empty() {
        return Err(crate::Error::InvalidLabel { label: label.into(), detail: "a label must not be empty".into() });
    }
    if label.contains('\0') {
        return Err(crate::Error::InvalidLabel {
            label: label.escape_default().to_string(),
            detail: "a label must not contain a NUL character (NVTX takes C strings)".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
