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
//!
//! Interning is a hash map lookup, and it stops at [`INTERNED_CALLSITES`] callsites: labels
//! that vary per request or per plan would otherwise leak a callsite each, forever. Past the
//! cap, spans share one callsite per level, named `boundscope`, and carry their label in a
//! field.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

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
/// Each distinct span name (with its level) gets a callsite of its own, leaked once per process
/// and shared by every plan, up to 4,096 in all. Past that, spans with new names share one
/// callsite per level named `boundscope`, and carry the name they would have had in an extra
/// field, `label`; so labels that vary per request (`label(&format!("request {i}"))`) stay
/// searchable, and a long-running process that compiles such plans keeps a bounded footprint.
/// Filter such spans by field rather than by name, or keep labels few.
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
            Level::Trace | Level::Scope | Level::Region => tracing::Level::INFO,
            Level::Op => tracing::Level::DEBUG,
            Level::Subsymbol => tracing::Level::TRACE,
        })
    }
}

/// The cached interest of a callsite, as tracing's own `DefaultCallsite` keeps it.
const NEVER: u8 = 0;
const SOMETIMES: u8 = 1;
const ALWAYS: u8 = 2;

/// Span names interned with a callsite of their own (one per name and level, at most this many
/// in all). Past it, spans share one callsite per level named [`SHARED_NAME`] and carry their
/// name in the field [`LABEL_FIELD`], so that labels that vary per request leak nothing more.
pub(crate) const INTERNED_CALLSITES: usize = 4096;

/// The name of the shared callsites that spans use once [`INTERNED_CALLSITES`] are taken.
const SHARED_NAME: &str = "boundscope";

/// The field in which a span of a shared callsite carries the name it would have had.
pub(crate) const LABEL_FIELD: &str = "label";

/// Whether `metadata` is one of the shared callsites, whose spans carry their label in
/// [`LABEL_FIELD`] (what [`NvtxLayer`](super::NvtxLayer) names their ranges after).
pub(crate) fn carries_label(metadata: &Metadata<'_>) -> bool {
    metadata.name() == SHARED_NAME
        && metadata.target() == TRACING_TARGET
        && metadata.fields().field(LABEL_FIELD).is_some()
}

/// The fields of the shared callsites: [`FIELDS`] and the label.
const SHARED_FIELDS: &[&str] = &["executor", "ops", "level", LABEL_FIELD];

/// The field handles of a callsite's metadata.
struct SpanFields {
    executor: Field,
    ops: Field,
    level: Field,
    /// Shared callsites only.
    label: Option<Field>,
}

/// One span site: its metadata (set once, right after the callsite is leaked, since the
/// metadata names the callsite) and the interest `tracing` caches in it.
struct SpanCallsite {
    metadata: OnceLock<Metadata<'static>>,
    interest: AtomicU8,
    fields: OnceLock<SpanFields>,
}

/// Metadata for callsites whose metadata is somehow missing: never the case after
/// [`leak_callsite`] returns, but `Callsite::metadata` must return something.
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

/// Makes, leaks and registers with `tracing` the callsite of spans named `name` at `level`
/// with the fields `fields` ([`FIELDS`] or [`SHARED_FIELDS`]).
fn leak_callsite(name: &'static str, level: tracing::Level, fields: &'static [&'static str]) -> &'static SpanCallsite {
    let site: &'static SpanCallsite = Box::leak(Box::new(SpanCallsite {
        metadata: OnceLock::new(),
        interest: AtomicU8::new(NEVER),
        fields: OnceLock::new(),
    }));
    let metadata = site.metadata.get_or_init(|| {
        Metadata::new(
            name,
            TRACING_TARGET,
            level,
            Some(file!()),
            Some(line!()),
            Some(module_path!()),
            FieldSet::new(fields, Identifier(site)),
            Kind::SPAN,
        )
    });
    let set = metadata.fields();
    if let (Some(executor), Some(ops), Some(scope_level)) =
        (set.field("executor"), set.field("ops"), set.field("level"))
    {
        let label = set.field(LABEL_FIELD);
        let _ = site.fields.set(SpanFields { executor, ops, level: scope_level, label });
    }
    // Asks every subscriber for its interest and caches it in the callsite (and again whenever
    // a subscriber is set later).
    tracing::callsite::register(site);
    site
}

/// The position of a `tracing` level in the per-level arrays of [`Callsites`].
fn level_index(level: tracing::Level) -> usize {
    [tracing::Level::TRACE, tracing::Level::DEBUG, tracing::Level::INFO, tracing::Level::WARN, tracing::Level::ERROR]
        .iter()
        .position(|l| *l == level)
        .unwrap_or(0)
}

/// The callsites made so far: one per name and level, up to a cap, then one shared per level.
///
/// A hash map, so that preparing a site costs the same however many names the process has
/// seen; a cap, because each interned callsite is leaked (as `tracing`'s macros' statics are,
/// and because `tracing` keeps a `&'static` to every registered callsite) and a server that
/// labels spans per request would otherwise grow without bound.
struct Callsites {
    /// How many callsites may be interned with a name of their own.
    cap: usize,
    /// By name (leaked once, shared by its levels), one callsite per level.
    by_name: HashMap<&'static str, [Option<&'static SpanCallsite>; 5]>,
    /// Callsites interned with a name of their own so far (at most `cap`).
    interned: usize,
    /// The callsites named [`SHARED_NAME`], per level, made when first needed.
    shared: [Option<&'static SpanCallsite>; 5],
}

impl Callsites {
    fn new(cap: usize) -> Self {
        Self { cap, by_name: HashMap::new(), interned: 0, shared: [None; 5] }
    }

    /// The callsite of spans named `name` at `level`, and whether it is shared (the span then
    /// carries `name` in its `label` field).
    fn callsite(&mut self, name: &str, level: tracing::Level) -> (&'static SpanCallsite, bool) {
        let at = level_index(level);
        if let Some(site) = self.by_name.get(name).and_then(|levels| levels[at]) {
            return (site, false);
        }
        if self.interned >= self.cap {
            let site = *self.shared[at].get_or_insert_with(|| leak_callsite(SHARED_NAME, level, SHARED_FIELDS));
            return (site, true);
        }
        let name: &'static str = match self.by_name.get_key_value(name) {
            Some((&known, _)) => known,
            None => Box::leak(name.to_string().into_boxed_str()),
        };
        let site = leak_callsite(name, level, FIELDS);
        self.by_name.entry(name).or_insert([None; 5])[at] = Some(site);
        self.interned += 1;
        (site, false)
    }
}

/// The process's callsites, shared by every plan.
static CALLSITES: LazyLock<Mutex<Callsites>> = LazyLock::new(|| Mutex::new(Callsites::new(INTERNED_CALLSITES)));

/// How many callsites the process has interned with a name of their own (at most
/// [`INTERNED_CALLSITES`]).
#[cfg(test)]
pub(crate) fn interned_callsites() -> usize {
    CALLSITES.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).interned
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
    /// The spans this thread entered through the guard, innermost last; `None` where a span was
    /// exited while one entered after it was still open (trimmed once nothing open is above it).
    /// Its capacity stays, so that steady state allocates nothing here.
    static ENTERED: RefCell<Vec<Option<tracing::span::EnteredSpan>>> = const { RefCell::new(Vec::new()) };
}

/// A span site prepared for one scope of a plan.
struct PreparedSpan {
    callsite: &'static SpanCallsite,
    level: tracing::Level,
    executor: &'static str,
    ops: u64,
    scope_level: &'static str,
    /// The span's name, when its callsite is a shared one (recorded in the `label` field).
    label: Option<Box<str>>,
}

impl PreparedSpan {
    /// Prepares the span `name` at `level` for `site`, with a callsite from `callsites`.
    fn new(callsites: &mut Callsites, name: &str, level: tracing::Level, site: &GuardSite<'_>) -> Self {
        let (callsite, shared) = callsites.callsite(name, level);
        Self {
            callsite,
            level,
            executor: executor_name(site.executor),
            ops: u64::from(site.ops),
            scope_level: site.level.name(),
            label: shared.then(|| name.into()),
        }
    }

    /// Whether a span is wanted now: the cached interest, then the level filters, then (only
    /// when the interest is "sometimes") the subscriber.
    #[inline(always)]
    fn wanted(&self) -> Option<(&'static Metadata<'static>, &'static SpanFields)> {
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
    /// Returns the span's position in this thread's [`ENTERED`] plus one (0: no span).
    #[inline]
    fn on_enter(&self) -> u64 {
        let Some((metadata, fields)) = self.wanted() else { return 0 };
        let span = match (fields.label.as_ref(), self.label.as_deref()) {
            (Some(label_field), Some(label)) => {
                let values: [(&Field, Option<&dyn Value>); 4] = [
                    (&fields.executor, Some(&self.executor as &dyn Value)),
                    (&fields.ops, Some(&self.ops as &dyn Value)),
                    (&fields.level, Some(&self.scope_level as &dyn Value)),
                    (label_field, Some(&label as &dyn Value)),
                ];
                Span::new(metadata, &metadata.fields().value_set(&values))
            }
            _ => {
                let values: [(&Field, Option<&dyn Value>); 3] = [
                    (&fields.executor, Some(&self.executor as &dyn Value)),
                    (&fields.ops, Some(&self.ops as &dyn Value)),
                    (&fields.level, Some(&self.scope_level as &dyn Value)),
                ];
                Span::new(metadata, &metadata.fields().value_set(&values))
            }
        };
        let span = span.entered();
        // After thread-local storage is gone (a run during thread exit), the span just closes.
        ENTERED
            .try_with(|entered| {
                let mut entered = entered.borrow_mut();
                entered.push(Some(span));
                entered.len() as u64
            })
            .unwrap_or(0)
    }

    /// Exits the span at the position `on_enter` returned, even when spans entered after it are
    /// still open (tokens of `dyn ScopedGuard::enter` may be dropped in any order): a position
    /// is only reused once its span and every span above it have been exited.
    #[inline]
    fn on_exit(&self, entered: u64) {
        let Some(at) = (entered as usize).checked_sub(1) else { return };
        // Dropped outside the borrow: a subscriber's exit may run guards of its own.
        let span = ENTERED
            .try_with(|spans| {
                let mut spans = spans.borrow_mut();
                let span = spans.get_mut(at).and_then(Option::take);
                while let Some(None) = spans.last() {
                    spans.pop();
                }
                span
            })
            .ok()
            .flatten();
        drop(span);
    }
}

impl Guard for TracingSpan {
    /// The backward of what it surrounds is recorded too, labelled `<label> (backward)`.
    fn on_backward(&self, forward_label: &str, _forward_position: Option<usize>) -> super::OnBackward {
        super::OnBackward::Relabeled(super::backward_label(forward_label))
    }

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
        let mut callsites = CALLSITES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(Box::new(PreparedSpan::new(&mut callsites, name, level, site)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const INFO: tracing::Level = tracing::Level::INFO;

    fn site(label: &str) -> GuardSite<'_> {
        GuardSite::new(label, Level::Op, "cpu_reference", 1)
    }

    /// What a [`Recording`] subscriber saw: spans made (name and `label` field) and exited.
    #[derive(Default)]
    struct Seen {
        made: Vec<(String, Option<String>)>,
        exited: Vec<String>,
    }

    /// A subscriber that records the name and `label` field of every span made, and the name
    /// of every span exited.
    #[derive(Clone, Default)]
    struct Recording {
        seen: Arc<Mutex<Seen>>,
    }

    struct LabelOf(Option<String>);
    impl tracing::field::Visit for LabelOf {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == LABEL_FIELD {
                self.0 = Some(value.to_string());
            }
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == LABEL_FIELD {
                self.0 = Some(format!("{value:?}"));
            }
        }
    }

    impl tracing::Subscriber for Recording {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let mut label = LabelOf(None);
            span.record(&mut label);
            let mut seen = self.seen.lock().unwrap();
            seen.made.push((span.metadata().name().to_string(), label.0));
            tracing::span::Id::from_u64(seen.made.len() as u64)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, span: &tracing::span::Id) {
            let mut seen = self.seen.lock().unwrap();
            let name = seen.made[span.into_u64() as usize - 1].0.clone();
            seen.exited.push(name);
        }
    }

    #[test]
    fn one_callsite_per_name_and_level_whatever_the_number_of_plans() {
        let mut callsites = Callsites::new(16);
        let (a, _) = callsites.callsite("interned", INFO);
        let (b, _) = callsites.callsite("interned", INFO);
        let (c, _) = callsites.callsite("interned", tracing::Level::DEBUG);
        assert!(std::ptr::eq(a, b));
        assert!(!std::ptr::eq(a, c));
        assert_eq!(callsites.interned, 2);
        assert_eq!(callsites.by_name.len(), 1, "one leaked name for both levels");
        assert_eq!(a.metadata().name(), "interned");
        assert_eq!(a.metadata().fields().len(), 3);
        assert!(a.metadata().is_span());
    }

    /// Past the cap, new names share one callsite per level, named `boundscope`, and names
    /// interned before still have their own.
    #[test]
    fn past_the_cap_new_names_share_one_callsite_per_level() {
        let mut callsites = Callsites::new(8);
        let sites: Vec<_> = (0..100).map(|i| callsites.callsite(&format!("request {i}"), INFO)).collect();
        assert_eq!(callsites.interned, 8);
        assert_eq!(callsites.by_name.len(), 8);
        assert!(sites[..8].iter().all(|(_, shared)| !shared));
        assert!(sites[8..].iter().all(|(site, shared)| *shared && std::ptr::eq(*site, sites[8].0)));
        assert_eq!(sites[8].0.metadata().name(), SHARED_NAME);
        assert_eq!(sites[8].0.metadata().fields().len(), 4);
        let (debug, shared) = callsites.callsite("request 99", tracing::Level::DEBUG);
        assert!(shared && !std::ptr::eq(debug, sites[8].0) && debug.metadata().level() == &tracing::Level::DEBUG);
        let (again, shared) = callsites.callsite("request 3", INFO);
        assert!(!shared && std::ptr::eq(again, sites[3].0));
    }

    /// Preparing spans labelled per request interns at most [`INTERNED_CALLSITES`] callsites in
    /// the process, however many labels it sees.
    #[test]
    fn per_request_labels_intern_at_most_the_cap() {
        for i in 0..INTERNED_CALLSITES + 500 {
            let guard = TracingSpan::new().label(&format!("request {i}")).unwrap();
            drop(guard.prepare(&site("op")).unwrap());
        }
        assert_eq!(interned_callsites(), INTERNED_CALLSITES);
    }

    /// A span of a shared callsite is named `boundscope` and carries its label in a field.
    #[test]
    fn spans_past_the_cap_carry_their_label_in_a_field() {
        let mut callsites = Callsites::new(1);
        let first = PreparedSpan::new(&mut callsites, "first", INFO, &site("first"));
        let later = PreparedSpan::new(&mut callsites, "CpuFusion0: (exp, tanh)", INFO, &site("x"));
        let recording = Recording::default();
        tracing::subscriber::with_default(recording.clone(), || {
            let guards: [&dyn ScopedGuard; 2] = [&first, &later];
            for guard in guards {
                guard.in_scope(|| ());
            }
        });
        let made = &recording.seen.lock().unwrap().made;
        assert_eq!(
            *made,
            [("first".to_string(), None), (SHARED_NAME.to_string(), Some("CpuFusion0: (exp, tanh)".to_string()))]
        );
    }

    /// Tokens dropped out of order each exit their own span.
    #[test]
    fn tokens_dropped_out_of_order_exit_their_own_spans() {
        let mut callsites = Callsites::new(16);
        let a = PreparedSpan::new(&mut callsites, "a", INFO, &site("a"));
        let b = PreparedSpan::new(&mut callsites, "b", INFO, &site("b"));
        let recording = Recording::default();
        tracing::subscriber::with_default(recording.clone(), || {
            let (a, b): (&dyn ScopedGuard, &dyn ScopedGuard) = (&a, &b);
            let entered_a = a.enter();
            let entered_b = b.enter();
            drop(entered_a);
            assert_eq!(recording.seen.lock().unwrap().exited, ["a"]);
            drop(entered_b);
            assert_eq!(recording.seen.lock().unwrap().exited, ["a", "b"]);
            // The thread's stack is empty again: a new span is entered at the bottom.
            let entered_a = a.enter();
            assert_eq!(ENTERED.with(|e| e.borrow().len()), 1);
            drop(entered_a);
        });
        assert_eq!(ENTERED.with(|e| e.borrow().len()), 0);
    }
}
