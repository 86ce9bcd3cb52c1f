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
//! callsite map). Exiting pops the domain that this thread's innermost entry pushed. Nothing
//! is allocated per span, and nothing is stored in the span's extensions (whose map boxes
//! every value it holds). The `nvtx` crate's own layer (feature
//! `tracing`) instead clones strings and takes a global mutex on every enter and exit; see
//! `benches/tracing.rs` for both, side by side.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};

use tracing::callsite::Identifier;
use tracing::span::{Attributes, Id};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::nvtx_range::{executor_color, PreparedNvtxRange};
use super::Level;

/// Forwards `tracing` spans to NVTX push/pop ranges, labelled with the span's name, in the NVTX
/// domain named by the span's target (or one domain for all, [`in_domain`](Self::in_domain)),
/// coloured by target. Events are not forwarded. A layer gives ranges to the first 4,096 span
/// callsites it sees (spans of later ones push nothing).
///
/// Ranges are pushed when a span is entered and popped when it is exited, on the entering
/// thread, as NVTX push/pop requires (`tracing`'s `Entered` guards are not `Send` either).
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
pub struct NvtxLayer {
    /// One domain for every span, else the span's target.
    domain: Option<String>,
    /// The index in `prepared` of every span callsite registered so far.
    callsites: RwLock<HashMap<Identifier, usize>>,
    /// The prepared ranges, by index; set once each, read without a lock.
    prepared: Box<[OnceLock<PreparedNvtxRange>]>,
    /// Span id to callsite index, direct-mapped by id: `(id, index + 1)` per slot.
    spans: Box<[(AtomicU64, AtomicU64)]>,
}

/// Callsites with a prepared range; spans of later callsites push nothing.
const CALLSITES: usize = 4096;
/// Slots of the span table (a power of two).
const SPAN_SLOTS: usize = 4096;

thread_local! {
    /// The domain each span entered on this thread pushed into (null: it pushed nothing),
    /// innermost last; popped on exit. Its capacity stays, so steady state allocates nothing.
    static PUSHED: RefCell<Vec<Option<nvtx::sys::DomainHandle>>> = const { RefCell::new(Vec::new()) };
}

impl Default for NvtxLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl NvtxLayer {
    /// A layer that puts each span in the NVTX domain named by its target.
    pub fn new() -> Self {
        Self {
            domain: None,
            callsites: RwLock::new(HashMap::new()),
            prepared: (0..CALLSITES).map(|_| OnceLock::new()).collect(),
            spans: (0..SPAN_SLOTS).map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect(),
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

    /// Registers the span's name in its domain and builds its attributes, once per callsite;
    /// returns its index.
    fn prepare(&self, metadata: &'static Metadata<'static>) -> Option<usize> {
        let id = metadata.callsite();
        let mut callsites = self.callsites.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(&index) = callsites.get(&id) {
            return Some(index);
        }
        let index = callsites.len();
        let slot = self.prepared.get(index)?;
        let domain = self.domain.as_deref().unwrap_or(metadata.target());
        // A name or target with a NUL cannot be an NVTX string: it is pushed without the NUL.
        let clean = |s: &str| s.replace('\0', "");
        let (label, domain) = (clean(metadata.name()), clean(domain));
        let domain = if domain.is_empty() { super::DEFAULT_DOMAIN } else { domain.as_str() };
        let label = if label.is_empty() { "span" } else { label.as_str() };
        let category = super::nvtx_range::level_category(Level::Op);
        let range = PreparedNvtxRange::new(domain, label, category, executor_color(metadata.target()), None).ok()?;
        let _ = slot.set(range);
        callsites.insert(id, index);
        Some(index)
    }

    fn slot(&self, id: &Id) -> &(AtomicU64, AtomicU64) {
        // Fibonacci hashing of the id: ids of live spans spread over the slots.
        let hash = id.into_u64().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SPAN_SLOTS.trailing_zeros());
        &self.spans[hash as usize]
    }

    /// The prepared range of the span `id`, if it has one.
    #[inline]
    fn range<S>(&self, id: &Id, ctx: &Context<'_, S>) -> Option<PreparedNvtxRange>
    where
        S: Subscriber + for<'lookup> LookupSpan<'lookup>,
    {
        let (key, value) = self.slot(id);
        let raw = id.into_u64();
        let first = key.load(Ordering::Acquire);
        let index = value.load(Ordering::Acquire);
        if first == raw && key.load(Ordering::Acquire) == raw && index > 0 {
            return self.prepared.get(index as usize - 1)?.get().copied();
        }
        // Not in the table: from the registry's metadata, by callsite.
        let metadata = ctx.metadata(id)?;
        let callsites = self.callsites.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let index = *callsites.get(&metadata.callsite())?;
        self.prepared.get(index)?.get().copied()
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

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let metadata = attrs.metadata();
        let known = self.callsites.read().ok().and_then(|c| c.get(&metadata.callsite()).copied());
        // A callsite registered before this layer existed (and not since) is prepared here, once.
        let Some(index) = known.or_else(|| self.prepare(metadata)) else { return };
        // Invalidate, write, publish: a reader that sees the same id before and after reading
        // the index has the index of this span.
        let (key, value) = self.slot(id);
        key.store(0, Ordering::Release);
        value.store(index as u64 + 1, Ordering::Release);
        key.store(id.into_u64(), Ordering::Release);
    }

    #[inline]
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let range = self.range(id, &ctx);
        let domain = range.map(|r| {
            r.push();
            r.domain()
        });
        let _ = PUSHED.try_with(|pushed| pushed.borrow_mut().push(domain));
    }

    #[inline]
    fn on_exit(&self, _id: &Id, _ctx: Context<'_, S>) {
        if let Ok(Some(Some(domain))) = PUSHED.try_with(|pushed| pushed.borrow_mut().pop()) {
            nvtx::sys::domain_range_pop(domain);
        }
    }
}
