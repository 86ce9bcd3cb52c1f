//! `TracingSpan`: a [`tracing`] span around what it is attached to, for the subscribers a
//! program already has (logs, OpenTelemetry, `tracing-chrome`).
//!
//! `tracing`'s macros keep one static callsite per span site, with its metadata and a cached
//! "interest" (whether any subscriber wants it), so that a span nobody wants costs one relaxed
//! load. A plan's sites are only known when it is compiled, so the guard builds the same at
//! compile time: preparing interns one callsite per label and level (leaked once per process,
//! like the macros' statics, and shared by every plan), registers it with `tracing` (which
//! asks the subscribers and caches the answer in it, and asks again when a subscriber is set
//! later), and keeps the field handles. Entering then loads the cached interest and the level
//! filter, and builds a span only when someone wants it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::callsite::{Callsite, Identifier};
use tracing::field::{Field, FieldSet, Value};
use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
use tracing::metadata::Kind;
use tracing::subscriber::Interest;
use tracing::{Metadata, Span};

use super::{Guard, GuardKind, GuardPolicy, GuardSite, Level, ScopedGuard};
use crate::error::Result;

/// The target of every span the guard opens.
pub const TRACING_TARGET: &str = "boundscope";

/// The fields of every span the guard opens: the executor, the number of ops, the level.
const FIELDS: &[&str] = &["executor", "ops", "level"];

/// A [`tracing`] span around what it is attached to: named after the site (the symbol, the
/// region label, or your label), with target `boundscope` and the fields `executor`, `ops` and
/// `level`. Run and region spans are at `INFO`, op spans at `DEBUG`, subsymbol spans at
/// `TRACE`, unless you choose one level for all.
///
/// Without a subscriber, or with one that does not want the span (filtered out by level or
/// target), entering and exiting cost one relaxed load each (about 1 ns; see
/// `benches/tracing.rs`): the callsite and its cached interest are prepared when the plan is
/// compiled, as `tracing`'s macros prepare theirs.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use boundscope::guards::{Selection, TracingSpan};
/// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
///
/// /// Collects the names of the spans it sees entered.
/// struct Names(Arc<Mutex<Vec<String>>>);
/// impl tracing::Subscriber for Names {
///     fn enabled(&self, _: &tracing::Metadata<'_>) -> bool { true }
///     fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
///         self.0.lock().unwrap().push(span.metadata().name().to_string());
///         tracing::span::Id::from_u64(1)
///     }
///     fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
///     fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
///     fn event(&self, _: &tracing::Event<'_>) {}
///     fn enter(&self, _: &tracing::span::Id) {}
///     fn exit(&self, _: &tracing::span::Id) {}
/// }
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[4]).unwrap();
/// let y = b.exp(x).unwrap();
/// b.output(y).unwrap();
/// let mut trace = b.finish().unwrap();
/// trace.attach_trace_guard(TracingSpan::new().label("step").unwrap()).unwrap();
/// trace.attach_guard(Selection::All, TracingSpan::new()).unwrap();
/// let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
///
/// plan.run(&[&Tensor::zeros(&[4])]).unwrap(); // no subscriber: nothing happens
/// let names = Arc::new(Mutex::new(Vec::new()));
/// tracing::subscriber::with_default(Names(names.clone()), || plan.run(&[&Tensor::zeros(&[4])]).unwrap());
/// assert_eq!(*names.lock().unwrap(), ["step", "exp"]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TracingSpan {
    label: Option<String>,
    level: Option<tracing::Level>,
}

impl TracingSpan {
    /// A span named after its site, at its level's `tracing` level.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names the span `label` instead of after its site.
    ///
    /// # Errors
    /// [`Error::InvalidLabel`](crate::Error::InvalidLabel) if it is empty or contains NUL.
    pub fn label(mut self, label: &str) -> Result<Self> {
        super::check_label(label)?;
        self.label = Some(label.to_string());
        Ok(self)
    }

    /// Opens every span at this `tracing` level.
    pub fn level(mut self, level: tracing::Level) -> Self {
        self.level = Some(level);
        self
    }

    /// The `tracing` level of a span at `level`.
    fn tracing_level(&self, level: Level) -> tracing::Level {
        self.level.unwrap_or(match level {
            Level::Trace | Level::Region => tracing::Level::INFO,
            Level::Op => tracing::Level::DEBUG,
            Level::Subsymbol => tracing::Level::TRACE,
        })
    }
}

/// The cached interest of a callsite, as tracing's own `DefaultCallsite` keeps it.
const NEVER: u8 = 0;
const SOMETIMES: u8 = 1;
const ALWAYS: u8 = 2;

/// One span site: its metadata (set once, right after the callsite is leaked, since the
/// metadata names the callsite) and the interest `tracing` caches in it.
struct SpanCallsite {
    metadata: OnceLock<Metadata<'static>>,
    interest: AtomicU8,
    /// The metadata's field handles, in [`FIELDS`] order.
    fields: OnceLock<[Field; 3]>,
}

/// Metadata for callsites whose metadata is somehow missing: never the case after
/// [`callsite`] returns, but `Callsite::metadata` must return something.
static PLACEHOLDER: SpanCallsite =
    SpanCallsite { metadata: OnceLock::new(), interest: AtomicU8::new(NEVER), fields: OnceLock::new() };

impl Callsite for SpanCallsite {
    fn set_interest(&self, interest: Interest) {
        let cached = if interest.is_never() {
            NEVER
        } else if interest.is_always() {
            ALWAYS
        } else {
            SOMETIMES
        };
        self.interest.store(cached, Ordering::Relaxed);
    }

    fn metadata(&self) -> &Metadata<'_> {
        self.metadata.get().unwrap_or_else(|| placeholder_metadata())
    }
}

fn placeholder_metadata() -> &'static Metadata<'static> {
    PLACEHOLDER.metadata.get_or_init(|| {
        Metadata::new(
            "boundscope placeholder",
            TRACING_TARGET,
            tracing::Level::TRACE,
            None,
            None,
            None,
            FieldSet::new(&[], Identifier(&PLACEHOLDER)),
            Kind::SPAN,
        )
    })
}

/// The callsite of spans named `name` at `level`: made, leaked and registered with `tracing`
/// the first time, then shared. Leaked as `tracing`'s macros' statics are: one per distinct
/// name and level in the process, however many plans are compiled.
fn callsite(name: &str, level: tracing::Level) -> &'static SpanCallsite {
    type Sites = Vec<((String, tracing::Level), &'static SpanCallsite)>;
    static SITES: Mutex<Sites> = Mutex::new(Vec::new());
    let mut sites = SITES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, site)) = sites.iter().find(|((n, l), _)| n == name && *l == level) {
        return site;
    }
    let site: &'static SpanCallsite = Box::leak(Box::new(SpanCallsite {
        metadata: OnceLock::new(),
        interest: AtomicU8::new(NEVER),
        fields: OnceLock::new(),
    }));
    let name: &'static str = Box::leak(name.to_string().into_boxed_str());
    let metadata = site.metadata.get_or_init(|| {
        let fields = FieldSet::new(FIELDS, Identifier(site));
        Metadata::new(
            name,
            TRACING_TARGET,
            level,
            Some(file!()),
            Some(line!()),
            Some(module_path!()),
            fields,
            Kind::SPAN,
        )
    });
    let fields = metadata.fields();
    let mut handles = FIELDS.iter().filter_map(|f| fields.field(f));
    if let (Some(a), Some(b), Some(c)) = (handles.next(), handles.next(), handles.next()) {
        let _ = site.fields.set([a, b, c]);
    }
    // Asks every subscriber for its interest and caches it in the callsite (and again whenever
    // a subscriber is set later).
    tracing::callsite::register(site);
    sites.push(((name.to_string(), level), site));
    site
}

/// Interned executor names, as `&'static str` field values.
fn executor_name(name: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(known) = names.iter().find(|n| **n == name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.push(leaked);
    leaked
}

thread_local! {
    /// The spans this thread entered through the guard, innermost last. Its capacity stays, so
    /// that steady state allocates nothing here.
    static ENTERED: RefCell<Vec<tracing::span::EnteredSpan>> = const { RefCell::new(Vec::new()) };
}

/// A span site prepared for one scope of a plan.
struct PreparedSpan {
    callsite: &'static SpanCallsite,
    level: tracing::Level,
    executor: &'static str,
    ops: u64,
    scope_level: &'static str,
}

impl PreparedSpan {
    /// Whether a span is wanted now: the cached interest, then the level filters, then (only
    /// when the interest is "sometimes") the subscriber.
    #[inline(always)]
    fn wanted(&self) -> Option<(&'static Metadata<'static>, &'static [Field; 3])> {
        // The cached interest first: without a subscriber that wants the span, nothing else.
        let interest = self.callsite.interest.load(Ordering::Relaxed);
        if interest == NEVER || self.level > STATIC_MAX_LEVEL || self.level > LevelFilter::current() {
            return None;
        }
        let (Some(metadata), Some(fields)) = (self.callsite.metadata.get(), self.callsite.fields.get()) else {
            return None;
        };
        if interest == SOMETIMES && !tracing::dispatcher::get_default(|d| d.enabled(metadata)) {
            return None;
        }
        Some((metadata, fields))
    }
}

impl ScopedGuard for PreparedSpan {
    #[inline]
    fn on_enter(&self) -> u64 {
        let Some((metadata, fields)) = self.wanted() else { return 0 };
        let values: [(&Field, Option<&dyn Value>); 3] = [
            (&fields[0], Some(&self.executor as &dyn Value)),
            (&fields[1], Some(&self.ops as &dyn Value)),
            (&fields[2], Some(&self.scope_level as &dyn Value)),
        ];
        let span = Span::new(metadata, &metadata.fields().value_set(&values)).entered();
        // After thread-local storage is gone (a run during thread exit), the span just closes.
        let _ = ENTERED.try_with(|entered| entered.borrow_mut().push(span));
        1
    }

    #[inline]
    fn on_exit(&self, entered: u64) {
        if entered == 0 {
            return;
        }
        // Dropped outside the borrow: a subscriber's exit may run guards of its own.
        let span = ENTERED.try_with(|spans| spans.borrow_mut().pop()).ok().flatten();
        drop(span);
    }
}

impl Guard for TracingSpan {
    fn kind(&self) -> GuardKind {
        GuardKind::TracingSpan
    }

    /// A fused op's span moves to its region, as NVTX ranges do.
    fn policy(&self) -> GuardPolicy {
        GuardPolicy::MoveToEnclosing
    }

    fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// All spans on one scope merge into one.
    fn merge_key(&self) -> Option<String> {
        Some("tracing".to_string())
    }

    fn prepare(&self, site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>> {
        let level = self.tracing_level(site.level);
        let name = self.label.as_deref().unwrap_or(site.label);
        Ok(Box::new(PreparedSpan {
            callsite: callsite(name, level),
            level,
            executor: executor_name(site.executor),
            ops: u64::from(site.ops),
            scope_level: site.level.name(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_callsite_per_name_and_level_whatever_the_number_of_plans() {
        let a = callsite("interned", tracing::Level::INFO);
        let b = callsite("interned", tracing::Level::INFO);
        let c = callsite("interned", tracing::Level::DEBUG);
        assert!(std::ptr::eq(a, b));
        assert!(!std::ptr::eq(a, c));
        assert_eq!(a.metadata().name(), "interned");
        assert_eq!(a.metadata().fields().len(), 3);
        assert!(a.metadata().is_span());
    }
}
