//! `NvtxLayer`: a `tracing_subscriber` layer that forwards your own `tracing` spans to NVTX, so
//! that Nsight Systems shows them beside boundscope's ranges.
//!
//! Built for spans entered in hot loops: the span's name is registered as an NVTX string once
//! per callsite, when `tracing` registers the callsite with the subscriber, and the event
//! attributes are built then too, in a table indexed by callsite. When a span is created, its
//! id and its callsite's index go into a small direct-mapped table of atomics, so that entering
//! it needs no lookup in the subscriber's registry, no lock and no hash map: three relaxed
//! loads and one `nvtxDomainRangePushEx` (a span entered on another thread than the one that
//! made it, or whose slot another span took, falls back to the registry's metadata and the
//! callsite map). Each slot is a small sequence lock: a writer claims it with a
//! compare-exchange, so two spans created at once never leave one's id with the other's index.
//! Exiting finds the span in a fixed-capacity stack per thread and pops its domain (see
//! [`PushedStack::exit`] for spans exited out of order). Nothing is allocated per span, and nothing is stored in the span's extensions (whose map boxes
//! every value it holds). The `nvtx` crate's own layer (feature
//! `tracing`) instead clones strings and takes a global mutex on every enter and exit; see
//! `benches/tracing.rs` for both, side by side.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};

use tracing::callsite::Identifier;
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::nvtx_range::{executor_color, OwnedNvtxRange, PreparedNvtxRange};
use super::Level;

/// Forwards `tracing` spans to NVTX push/pop ranges, labelled with the span's name, in the NVTX
/// domain named by the span's target (or one domain for all, [`in_domain`](Self::in_domain)),
/// coloured by target. Events are not forwarded.
///
/// Every span gets its range. The first [`PREPARED_CALLSITES`](Self::PREPARED_CALLSITES) span callsites a layer sees (or
/// [`prepared_callsites`](Self::prepared_callsites)) get a prepared range (their name
/// registered once; nothing allocated per span). Spans of later callsites, and the
/// spans that [`TracingSpan`](super::TracingSpan) opens on its shared callsites once it has
/// interned its 4,096 labels (they carry their label in a `label` field, which names their
/// range), take a slower path: the span keeps its own range, with its label copied, in its
/// extensions (two small allocations per span) and enters it from there.
///
/// Ranges are pushed when a span is entered and popped when it is exited, on the entering
/// thread, as NVTX push/pop requires (`tracing`'s `Entered` guards are not `Send` either).
/// Spans may be exited in any order: a span exited while a span of another domain entered
/// after it is still open pops its own range. NVTX ranges of one domain nest, so a span exited
/// while a later span *of the same domain* is still open keeps its range open until that later
/// range closes, and it closes then. A thread with more than 128 spans entered at once pushes
/// no range for the deeper ones.
///
/// ```
/// use boundscope::guards::NvtxLayer;
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let subscriber = tracing_subscriber::registry().with(NvtxLayer::new().in_domain("my_app").unwrap());
/// tracing::subscriber::with_default(subscriber, || {
///     let span = tracing::info_span!("load batch");
///     let _entered = span.enter(); // an NVTX range `load batch` in domain `my_app`, under Nsight
/// });
/// ```
///
/// With a plan whose scopes open spans ([`TracingSpan`](super::TracingSpan)), your spans and the
/// plan's become ranges of one domain:
///
/// ```
/// use boundscope::guards::{NvtxLayer, Selection, TracingSpan};
/// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[64])?;
/// let y = b.exp(x)?;
/// b.output(y)?;
/// let mut trace = b.finish()?;
/// trace.attach_guard(Selection::All, TracingSpan::new())?;
/// let plan = Plan::compile(&trace, &[CpuReference::shared()])?;
/// // Your spans and the plan's, as NVTX ranges in the domain `my_app`.
/// let subscriber = tracing_subscriber::registry().with(NvtxLayer::new().in_domain("my_app")?);
/// tracing::subscriber::with_default(subscriber, || {
///     let _step = tracing::info_span!("training step").entered();
///     plan.run(&[&Tensor::zeros(&[64])])
/// })?;
/// # Ok::<(), boundscope::Error>(())
/// ```
///
/// `proptests/every_span_gets_a_range.rs` checks that 10,000 labels each get a range.
pub struct NvtxLayer {
    /// One domain for every span, else the span's target.
    domain: Option<String>,
    /// The index in `prepared` of every span callsite registered so far.
    callsites: RwLock<HashMap<Identifier, usize>>,
    /// The prepared ranges and the numbers of their domains (see [`domain_number`]), by index,
    /// in chunks of [`CHUNK`] made as needed; set once each, read without a lock.
    prepared: Box<[OnceLock<Chunk>]>,
    /// How many callsites get a prepared range.
    capacity: usize,
    /// Span id to callsite index, direct-mapped by id.
    spans: Box<[SpanSlot]>,
}

/// Prepared ranges per chunk of the table.
const CHUNK: usize = 1024;

/// [`CHUNK`] prepared ranges, each with its domain's number, set once each.
type Chunk = Box<[OnceLock<(PreparedNvtxRange, u32)>]>;
/// Slots of the span table (a power of two).
const SPAN_SLOTS: usize = 4096;

/// Spans one thread can have entered at once with a range; deeper ones push none.
const PUSHED_CAPACITY: usize = 128;

/// A number per NVTX domain name, the same in every layer: `DomainHandle` cannot be compared,
/// and [`PushedStack::exit`] needs to know whether two ranges are in one domain.
fn domain_number(name: &str) -> u32 {
    static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let at = names.iter().position(|n| n == name).unwrap_or_else(|| {
        names.push(name.to_string());
        names.len() - 1
    });
    at as u32
}

/// One span entered on this thread.
#[derive(Clone, Copy)]
struct Pushed {
    /// The span's id.
    span: u64,
    /// The domain its range was pushed into; `None`: it pushed nothing.
    domain: Option<nvtx::sys::DomainHandle>,
    /// That domain's [`domain_number`].
    domain_number: u32,
    /// Exited, but its range stays open under a later range of its domain (see
    /// [`PushedStack::exit`]).
    exited: bool,
}

impl Pushed {
    const EMPTY: Self = Self { span: 0, domain: None, domain_number: 0, exited: false };

    fn in_domain(&self, number: u32) -> bool {
        self.domain.is_some() && self.domain_number == number
    }
}

/// The spans entered on one thread, innermost last: a fixed-capacity stack, so that entering
/// and exiting never allocate.
struct PushedStack {
    entries: [Pushed; PUSHED_CAPACITY],
    len: usize,
    /// How many entries are marked exited (their ranges held open): while none is, a span
    /// exiting in order is the top entry and nothing below it waits.
    held_open: usize,
}

impl PushedStack {
    const EMPTY: Self = Self { entries: [Pushed::EMPTY; PUSHED_CAPACITY], len: 0, held_open: 0 };

    /// Records an entered span; `false` (and nothing recorded) when the stack is full.
    fn push(&mut self, entry: Pushed) -> bool {
        let Some(slot) = self.entries.get_mut(self.len) else { return false };
        *slot = entry;
        self.len += 1;
        true
    }

    fn remove(&mut self, at: usize) {
        self.entries.copy_within(at + 1..self.len, at);
        self.len -= 1;
    }

    /// Exits the innermost entry of `span` still open, and calls `pop` with the domain and its
    /// number for every NVTX range that closes, in order.
    ///
    /// `tracing` lets spans exit in any order, but NVTX pops the innermost open range of a
    /// domain. So: a span with no later entry of its domain pops its range now; one with a
    /// later entry of its domain is marked exited and keeps its range open (NVTX cannot close
    /// it alone), and closes it right after the last such later range closes. Its range then
    /// ends late, but every range keeps its own label and the nesting stays valid.
    #[inline]
    fn exit(&mut self, span: u64, mut pop: impl FnMut(nvtx::sys::DomainHandle, u32)) {
        // The common case, spans exiting in the order they entered: the top entry, and no range
        // held open below it.
        if self.held_open == 0 && self.len > 0 && self.entries[self.len - 1].span == span {
            self.len -= 1;
            let entry = self.entries[self.len];
            if let Some(domain) = entry.domain {
                pop(domain, entry.domain_number);
            }
            return;
        }
        self.exit_out_of_order(span, pop);
    }

    #[cold]
    fn exit_out_of_order(&mut self, span: u64, mut pop: impl FnMut(nvtx::sys::DomainHandle, u32)) {
        let Some(at) = self.entries[..self.len].iter().rposition(|e| e.span == span && !e.exited) else { return };
        let entry = self.entries[at];
        let Some(domain) = entry.domain else {
            self.remove(at);
            return;
        };
        if self.entries[at + 1..self.len].iter().any(|e| e.in_domain(entry.domain_number)) {
            self.entries[at].exited = true;
            self.held_open += 1;
            return;
        }
        self.remove(at);
        pop(domain, entry.domain_number);
        // Ranges of this domain exited earlier and kept open under this one close now.
        while let Some(below) = self.entries[..self.len].iter().rposition(|e| e.in_domain(entry.domain_number)) {
            if !self.entries[below].exited {
                break;
            }
            self.remove(below);
            self.held_open -= 1;
            pop(domain, entry.domain_number);
        }
    }
}

thread_local! {
    /// The spans entered on this thread through an `NvtxLayer`, innermost last.
    static PUSHED: RefCell<PushedStack> = const { RefCell::new(PushedStack::EMPTY) };
}

/// One slot of the span table: a span id and its callsite index + 1 (0: none), under a
/// sequence number that is odd while a writer holds the slot.
///
/// Two stores cannot be published as one, so without the sequence number two writers hashing
/// to one slot could interleave (writer 1 clears the id and stores index b, writer 2 stores
/// index c and id c, writer 1 stores id b) and leave id b with the index of c: span b would
/// push c's range. A writer now claims the slot with a compare-exchange from an even sequence
/// number to the next, odd one, stores, and publishes the next even number; a second writer
/// waits for that. A reader takes the pair only if the sequence number was even and unchanged
/// around its loads, and otherwise falls back to the registry.
#[derive(Default)]
struct SpanSlot {
    sequence: AtomicU64,
    span: AtomicU64,
    range: AtomicU64,
}

impl SpanSlot {
    /// Claims the slot for writing: the sequence number to hand to `publish`, or `None` if
    /// another writer holds it.
    fn try_claim(&self) -> Option<u64> {
        let sequence = self.sequence.load(Ordering::Relaxed);
        (sequence.is_multiple_of(2)
            && self.sequence.compare_exchange(sequence, sequence + 1, Ordering::Acquire, Ordering::Relaxed).is_ok())
        .then_some(sequence)
    }

    /// Stores the pair; only between `try_claim` and `publish`. Release stores, so that a
    /// reader that sees either value also sees the odd sequence number stored before it.
    fn store(&self, span: u64, range: u64) {
        self.span.store(span, Ordering::Release);
        self.range.store(range, Ordering::Release);
    }

    /// Releases the slot claimed as `sequence`.
    fn publish(&self, sequence: u64) {
        self.sequence.store(sequence + 2, Ordering::Release);
    }

    /// Writes the pair, waiting while another writer holds the slot (a writer holds it for two
    /// stores; a span creation that waits is rare, an enter never waits).
    fn write(&self, span: u64, range: u64) {
        let mut tries = 0u32;
        let sequence = loop {
            if let Some(sequence) = self.try_claim() {
                break sequence;
            }
            tries += 1;
            if tries < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        };
        self.store(span, range);
        self.publish(sequence);
    }

    /// The index + 1 stored for `span`, if the slot holds it and no writer got in the way.
    #[inline]
    fn read(&self, span: u64) -> Option<u64> {
        let before = self.sequence.load(Ordering::Acquire);
        let key = self.span.load(Ordering::Acquire);
        let range = self.range.load(Ordering::Acquire);
        // Not reordered before the loads above: they are acquire loads.
        let after = self.sequence.load(Ordering::Relaxed);
        (before.is_multiple_of(2) && before == after && key == span && range > 0).then_some(range)
    }
}

impl Default for NvtxLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl NvtxLayer {
    /// Callsites with a prepared range, by default and at most; spans of later callsites keep a
    /// range of their own in their extensions.
    pub const PREPARED_CALLSITES: usize = CHUNK * 256;

    /// A layer that puts each span in the NVTX domain named by its target.
    pub fn new() -> Self {
        Self {
            domain: None,
            callsites: RwLock::new(HashMap::new()),
            prepared: (0..Self::PREPARED_CALLSITES / CHUNK).map(|_| OnceLock::new()).collect(),
            capacity: Self::PREPARED_CALLSITES,
            spans: (0..SPAN_SLOTS).map(|_| SpanSlot::default()).collect(),
        }
    }

    /// Puts every span in the NVTX domain `name` instead.
    ///
    /// # Errors
    /// [`Error::InvalidLabel`](crate::Error::InvalidLabel) if the name is empty or contains NUL.
    pub fn in_domain(mut self, name: &str) -> crate::Result<Self> {
        super::check_label(name)?;
        self.domain = Some(name.to_string());
        Ok(self)
    }

    /// Gives prepared ranges to the first `callsites` span callsites only (at most
    /// [`PREPARED_CALLSITES`](Self::PREPARED_CALLSITES), the default); spans of later callsites take the slower path
    /// described on the type. Each prepared callsite costs about 100 bytes, allocated 1,024 at
    /// a time as callsites come.
    pub fn prepared_callsites(mut self, callsites: usize) -> Self {
        self.capacity = callsites.min(Self::PREPARED_CALLSITES);
        self
    }

    /// This layer's address, which tells its own ranges in a span's extensions from another
    /// layer's (a layer lives as long as its subscriber, which outlives the spans).
    fn address(&self) -> usize {
        self as *const Self as usize
    }

    /// The prepared range at `index`, if it is set.
    #[inline]
    fn prepared_at(&self, index: usize) -> Option<&(PreparedNvtxRange, u32)> {
        self.prepared.get(index / CHUNK)?.get()?.get(index % CHUNK)?.get()
    }

    /// Registers the span's name in its domain and builds its attributes, once per callsite;
    /// returns its index. `None` for callsites past the table and for shared callsites, whose
    /// spans carry their label in a field.
    fn prepare(&self, metadata: &'static Metadata<'static>) -> Option<usize> {
        if super::tracing_span::carries_label(metadata) {
            return None;
        }
        let id = metadata.callsite();
        // Past the table, under the read lock only: every span of a later callsite asks.
        let full = |c: &HashMap<Identifier, usize>| c.len() >= self.capacity && !c.contains_key(&id);
        if self.callsites.read().is_ok_and(|c| full(&c)) {
            return None;
        }
        let mut callsites = self.callsites.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(&index) = callsites.get(&id) {
            return Some(index);
        }
        let index = callsites.len();
        if index >= self.capacity {
            return None;
        }
        let chunk = self.prepared.get(index / CHUNK)?.get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        let slot = chunk.get(index % CHUNK)?;
        let (domain, label) = self.names(metadata, metadata.name());
        let range =
            PreparedNvtxRange::new(&domain, &label, span_category(), executor_color(metadata.target()), None, None)
                .ok()?;
        let _ = slot.set((range, domain_number(&domain)));
        callsites.insert(id, index);
        Some(index)
    }

    /// The domain and label of a span of `metadata` named `name`: a name or target with a NUL
    /// cannot be an NVTX string, so it goes without the NUL; empty ones get defaults.
    fn names(&self, metadata: &Metadata<'_>, name: &str) -> (String, String) {
        let clean = |s: &str| s.replace('\0', "");
        let (mut label, mut domain) = (clean(name), clean(self.domain.as_deref().unwrap_or(metadata.target())));
        if domain.is_empty() {
            domain = super::DEFAULT_DOMAIN.to_string();
        }
        if label.is_empty() {
            label = "span".to_string();
        }
        (domain, label)
    }

    /// The range of a span with no prepared one (see the type's docs): labelled with its
    /// `label` field on a shared callsite, else with its name.
    fn own_range(&self, attrs: &Attributes<'_>) -> Option<(OwnedNvtxRange, u32)> {
        let metadata = attrs.metadata();
        let mut label = LabelField(None);
        if super::tracing_span::carries_label(metadata) {
            attrs.record(&mut label);
        }
        let (domain, label) = self.names(metadata, label.0.as_deref().unwrap_or(metadata.name()));
        let handle = super::nvtx_range::domain_handle(&domain).ok()?;
        let range = OwnedNvtxRange::new(handle, &label, span_category(), executor_color(metadata.target()));
        Some((range, domain_number(&domain)))
    }

    fn slot(&self, id: &Id) -> &SpanSlot {
        // Fibonacci hashing of the id: ids of live spans spread over the slots.
        let hash = id.into_u64().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SPAN_SLOTS.trailing_zeros());
        &self.spans[hash as usize]
    }

    /// The prepared range of the span `id` and its domain's number, if it has one.
    #[inline]
    fn range<S>(&self, id: &Id, ctx: &Context<'_, S>) -> Option<&(PreparedNvtxRange, u32)>
    where
        S: Subscriber + for<'lookup> LookupSpan<'lookup>,
    {
        if let Some(index) = self.slot(id).read(id.into_u64()) {
            return self.prepared_at(index as usize - 1);
        }
        // Not in the table: from the registry's metadata, by callsite.
        let metadata = ctx.metadata(id)?;
        let callsites = self.callsites.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let index = *callsites.get(&metadata.callsite())?;
        self.prepared_at(index)
    }
}

impl<S> Layer<S> for NvtxLayer
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
{
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.is_span() {
            self.prepare(metadata);
        }
        Interest::always()
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let metadata = attrs.metadata();
        let known = self.callsites.read().ok().and_then(|c| c.get(&metadata.callsite()).copied());
        // A callsite registered before this layer existed (and not since) is prepared here, once.
        if let Some(index) = known.or_else(|| self.prepare(metadata)) {
            self.slot(id).write(id.into_u64(), index as u64 + 1);
            return;
        }
        // No prepared range: the span keeps one of its own. Its id may be a closed span's
        // (the registry reuses them), whose table entry must not be taken for it.
        self.slot(id).write(id.into_u64(), 0);
        if let (Some(range), Some(span)) = (self.own_range(attrs), ctx.span(id)) {
            // Several layers may keep a range in one span: each finds its own by address.
            let mut extensions = span.extensions_mut();
            let entry = (self.address(), range);
            match extensions.get_mut::<OwnRanges>() {
                Some(ranges) => ranges.0.push(entry),
                None => extensions.insert(OwnRanges(smallvec::smallvec![entry])),
            }
        }
    }

    #[inline]
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let entry = |domain, domain_number| Pushed { span: id.into_u64(), domain, domain_number, exited: false };
        // Pushed only once recorded, so that every push has its pop (after thread-local storage
        // is gone, or past the stack's capacity, the span pushes nothing).
        let record = |pushed: Pushed| PUSHED.try_with(|stack| stack.borrow_mut().push(pushed)).unwrap_or(false);
        if let Some((range, number)) = self.range(id, &ctx) {
            if record(entry(Some(range.domain()), *number)) {
                range.push();
            }
            return;
        }
        let own = ctx.span(id);
        let extensions = own.as_ref().map(|span| span.extensions());
        let mine = extensions
            .as_ref()
            .and_then(|e| e.get::<OwnRanges>())
            .and_then(|ranges| ranges.0.iter().find(|(layer, _)| *layer == self.address()).map(|(_, range)| range));
        match mine {
            Some((range, number)) => {
                if record(entry(Some(range.domain()), *number)) {
                    range.push();
                }
            }
            None => {
                record(entry(None, 0));
            }
        }
    }

    #[inline]
    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        let _ = PUSHED.try_with(|pushed| {
            pushed.borrow_mut().exit(id.into_u64(), |domain, _| {
                nvtx::sys::domain_range_pop(domain);
            })
        });
    }
}

/// The category of every span's range: the op level's.
fn span_category() -> u32 {
    super::nvtx_range::level_category(Level::Op)
}

/// A span's own ranges and their domains' numbers, in its extensions (see [`NvtxLayer`]), one
/// per layer that keeps one, by the layer's address.
struct OwnRanges(smallvec::SmallVec<[(usize, (OwnedNvtxRange, u32)); 1]>);

/// Reads the `label` field of a span of a shared callsite.
struct LabelField(Option<String>);

impl tracing::field::Visit for LabelField {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == super::tracing_span::LABEL_FIELD {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == super::tracing_span::LABEL_FIELD && self.0.is_none() {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two writers of one slot: the second cannot claim it until the first has published, and
    /// a reader never takes a pair mid-write. (Before, the steps interleaved as writer 1 clears
    /// the id and stores index b, writer 2 stores index c and id c, writer 1 stores id b, and
    /// left id b with index c.)
    #[test]
    fn a_slot_never_pairs_one_span_with_anothers_index() {
        let slot = SpanSlot::default();
        let (b, c) = (7, 9);
        let first = slot.try_claim().expect("a free slot");
        assert_eq!(slot.try_claim(), None, "a second writer waits");
        slot.store(b, 2);
        assert_eq!(slot.read(b), None, "mid-write, readers fall back");
        slot.publish(first);
        assert_eq!(slot.read(b), Some(2));
        let second = slot.try_claim().expect("free again");
        slot.store(c, 3);
        slot.publish(second);
        assert_eq!((slot.read(b), slot.read(c)), (None, Some(3)));
        slot.write(b, 4);
        assert_eq!((slot.read(b), slot.read(c)), (Some(4), None));
    }

    /// Out-of-order exits: a range with no later range of its domain pops at once; one with a
    /// later range of its domain pops right after that one.
    #[test]
    fn out_of_order_exits_pop_the_right_domains() {
        let handle = super::super::nvtx_range::domain_handle("out of order").unwrap();
        let entry = |span, domain_number| Pushed { span, domain: Some(handle), domain_number, exited: false };
        let mut stack = PushedStack::EMPTY;
        let mut popped = Vec::new();
        // a (domain 1), b (domain 2), c (domain 1), d (no range).
        for e in [entry(1, 1), entry(2, 2), entry(3, 1), Pushed { span: 4, ..Pushed::EMPTY }] {
            assert!(stack.push(e));
        }
        stack.exit(1, |_, n| popped.push((1, n))); // a waits under c
        stack.exit(2, |_, n| popped.push((2, n))); // b pops its own domain
        assert_eq!(popped, [(2, 2)]);
        stack.exit(3, |_, n| popped.push((3, n))); // c pops, then a
        assert_eq!(popped, [(2, 2), (3, 1), (3, 1)]);
        stack.exit(4, |_, n| popped.push((4, n)));
        stack.exit(4, |_, n| popped.push((4, n))); // not entered any more: nothing
        assert_eq!((popped.len(), stack.len), (3, 0));
    }

    /// A full stack records nothing more, and says so.
    #[test]
    fn a_full_stack_records_nothing_more() {
        let mut stack = PushedStack::EMPTY;
        for span in 0..PUSHED_CAPACITY as u64 {
            assert!(stack.push(Pushed { span, ..Pushed::EMPTY }));
        }
        assert!(!stack.push(Pushed::EMPTY));
    }
}
