//! `NvtxRange`: an NVTX push/pop range, prepared once per plan site.
//!
//! We call `nvtx::sys` directly instead of the `nvtx` crate's convenience ranges: those
//! validate and rebuild the event attributes on every call (about 23.5 ns against 3.8 ns for a
//! bare push/pop pair, measured here). Preparing registers the label string in the domain and
//! builds the attributes once; entering is then one `nvtxDomainRangePushEx` and exiting one
//! `nvtxDomainRangePop`.

use std::ffi::CString;
use std::sync::{Arc, Mutex};

use nvtx::sys as nvtx_sys;

use super::nvtx_payload::{self, DetailsPayload};
use super::{check_label, Guard, GuardKind, GuardPolicy, GuardSite, Level, ScopeDetails, ScopedGuard};
use crate::error::{Error, Result};

/// The NVTX domain boundscope's ranges go to unless a guard names another.
pub const DEFAULT_DOMAIN: &str = "boundscope";

/// An NVTX range around what it is attached to: in the `boundscope` domain (or the one you
/// name), labelled with the symbol's name (or your label), categorised by level (trace,
/// region, op, subsymbol), coloured by executor.
///
/// **Payload.** Where the profiler takes NVTX payload schemas, each range carries its scope's
/// [`ScopeDetails`] as a structured payload: plan, first step, steps, ops, bytes read and
/// written, estimated FLOPs, and the dtypes and shapes of its inputs and outputs (cut to 159
/// and 95 bytes). Elsewhere (no tool, or Nsight Systems 2022.4, which registers no schema)
/// it carries the number of ops where it covers more than one, as a `u64`. Both are prepared
/// when the plan is compiled: entering the range costs the same either way.
/// [`payload`](Self::payload) replaces both with your number; [`details`](Self::details)
/// switches the structured payload off.
///
/// ```
/// use boundscope::guards::NvtxRange;
/// let range = NvtxRange::new().label("attention").unwrap().color(0xFF76B900);
/// assert!(NvtxRange::new().label("").is_err());
/// assert!(NvtxRange::new().label("a\0b").is_err());
/// # drop(range);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvtxRange {
    domain: Option<String>,
    label: Option<String>,
    color: Option<u32>,
    category: Option<u32>,
    payload: Option<u64>,
    details: Option<bool>,
}

impl NvtxRange {
    /// A range in the `boundscope` domain, labelled by its site.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses this label instead of the site's.
    ///
    /// # Errors
    /// [`Error::InvalidLabel`] if it is empty or contains NUL.
    pub fn label(mut self, label: &str) -> Result<Self> {
        check_label(label)?;
        self.label = Some(label.to_string());
        Ok(self)
    }

    /// Emits into this NVTX domain instead of `boundscope`.
    ///
    /// # Errors
    /// [`Error::InvalidLabel`] if the name is empty or contains NUL.
    pub fn domain(mut self, name: &str) -> Result<Self> {
        super::check_domain(name)?;
        self.domain = Some(name.to_string());
        Ok(self)
    }

    /// Uses this ARGB color instead of the executor's.
    pub fn color(mut self, argb: u32) -> Self {
        self.color = Some(argb);
        self
    }

    /// Uses this category instead of the level's (1 trace, 2 region, 3 op, 4 subsymbol).
    pub fn category(mut self, category: u32) -> Self {
        self.category = Some(category);
        self
    }

    /// Attaches this payload instead of the scope's details or op count.
    pub fn payload(mut self, payload: u64) -> Self {
        self.payload = Some(payload);
        self
    }

    /// Whether the range carries its scope's [`ScopeDetails`] as a structured payload where
    /// the profiler takes one (the default), or only the op count.
    ///
    /// ```
    /// use boundscope::guards::NvtxRange;
    /// let lean = NvtxRange::new().details(false);
    /// # drop(lean);
    /// ```
    pub fn details(mut self, on: bool) -> Self {
        self.details = Some(on);
        self
    }

    /// The domain name this range emits into.
    pub fn domain_name(&self) -> &str {
        self.domain.as_deref().unwrap_or(DEFAULT_DOMAIN)
    }
}

/// What a range pushes at one site: its settings, else the site's defaults.
pub(crate) struct ResolvedRange<'s> {
    pub label: &'s str,
    pub category: u32,
    pub color: u32,
    pub payload: Option<u64>,
    /// The details to send as a structured payload (when the domain's schema registers).
    pub details: Option<&'s ScopeDetails>,
}

impl NvtxRange {
    /// The label, category, colour and payload it pushes at `site`.
    pub(crate) fn resolve<'s>(&'s self, site: &GuardSite<'s>) -> ResolvedRange<'s> {
        ResolvedRange {
            label: self.label.as_deref().unwrap_or(site.label),
            category: self.category.unwrap_or(level_category(site.level)),
            color: self.color.unwrap_or(executor_color(site.executor)),
            payload: self.payload.or((site.level == Level::Region || site.ops > 1).then_some(site.ops as u64)),
            details: site.details.filter(|_| self.payload.is_none() && self.details != Some(false)),
        }
    }

    /// Prepares the range it pushes at `site`, with the settings resolved there.
    pub(crate) fn prepare_at(&self, site: &GuardSite<'_>) -> Result<PreparedNvtxRange> {
        let r = self.resolve(site);
        PreparedNvtxRange::new(self.domain_name(), r.label, r.category, r.color, r.payload, r.details)
    }

    /// The same settings without a label (sites label it).
    pub(crate) fn without_label(&self) -> NvtxRange {
        NvtxRange { label: None, ..self.clone() }
    }

    /// Its label, or `default`.
    pub(crate) fn label_or<'s>(&'s self, default: &'s str) -> &'s str {
        self.label.as_deref().unwrap_or(default)
    }

    /// Merges `later`, a range of the same domain on the same scope, into this one: each setting
    /// this one lacks is taken from `later`. Returns the settings both set differently (this
    /// one's value is kept), for the plan's notes.
    pub(crate) fn merge(&mut self, later: &NvtxRange) -> Vec<String> {
        fn take<T: Clone + PartialEq + std::fmt::Debug>(
            mine: &mut Option<T>,
            theirs: &Option<T>,
            name: &str,
            conflicts: &mut Vec<String>,
        ) {
            match (mine.as_ref(), theirs) {
                (None, Some(t)) => *mine = Some(t.clone()),
                (Some(m), Some(t)) if m != t => conflicts.push(format!("{name} {m:?} kept, {t:?} ignored")),
                _ => {}
            }
        }
        let mut conflicts = Vec::new();
        take(&mut self.label, &later.label, "label", &mut conflicts);
        take(&mut self.color, &later.color, "colour", &mut conflicts);
        take(&mut self.category, &later.category, "category", &mut conflicts);
        take(&mut self.payload, &later.payload, "payload", &mut conflicts);
        take(&mut self.details, &later.details, "details", &mut conflicts);
        conflicts
    }
}

/// The NVTX category of a level; named in every domain we create.
pub(crate) fn level_category(level: Level) -> u32 {
    match level {
        Level::Trace => 1,
        Level::Region => 2,
        Level::Op => 3,
        Level::Subsymbol => 4,
        Level::Scope => 5,
    }
}

/// A stable color per executor name.
pub(crate) fn executor_color(executor: &str) -> u32 {
    const PALETTE: [u32; 8] =
        [0xFF76B900, 0xFF1F77B4, 0xFFFF7F0E, 0xFF9467BD, 0xFF17BECF, 0xFFD62728, 0xFF8C564B, 0xFFE377C2];
    let hash = executor.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    PALETTE[(hash % PALETTE.len() as u64) as usize]
}

/// Domains are created once per process and name, with the level categories named.
pub(crate) fn domain_handle(name: &str) -> Result<nvtx_sys::DomainHandle> {
    static DOMAINS: Mutex<Vec<(String, nvtx_sys::DomainHandle)>> = Mutex::new(Vec::new());
    let mut domains = DOMAINS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, handle)) = domains.iter().find(|(n, _)| n == name) {
        return Ok(*handle);
    }
    let c_name = c_string(name)?;
    let handle = nvtx_sys::domain_create_ascii(&c_name);
    for level in Level::ALL {
        let c_level = c_string(level.name())?;
        nvtx_sys::domain_name_category_ascii(handle, level_category(level), &c_level);
    }
    domains.push((name.to_string(), handle));
    Ok(handle)
}

fn c_string(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidLabel {
        label: s.escape_default().to_string(),
        detail: "a label must not contain a NUL character (NVTX takes C strings)".into(),
    })
}

/// Whether ranges in `domain` can carry a structured payload: the profiler took the schema.
pub(crate) fn takes_details(domain: &str) -> bool {
    domain_handle(domain).ok().and_then(nvtx_payload::schema_id).is_some()
}

/// Builds the event attributes of a range with a registered message.
pub(crate) fn event_attributes(
    message: nvtx_sys::StringHandle,
    category: u32,
    color: u32,
    payload: Option<u64>,
) -> nvtx_sys::EventAttributes {
    let message =
        (nvtx_sys::MessageType::NVTX_MESSAGE_TYPE_REGISTERED, nvtx_sys::MessageValue { registered: message.into() });
    attributes_of(message, category, color, payload)
}

/// Event attributes with this message (its type and value).
fn attributes_of(
    (message_type, message): (nvtx_sys::MessageType, nvtx_sys::MessageValue),
    category: u32,
    color: u32,
    payload: Option<u64>,
) -> nvtx_sys::EventAttributes {
    let (payload_type, payload_value) = match payload {
        Some(p) => (nvtx_sys::PayloadType::NVTX_PAYLOAD_TYPE_UNSIGNED_INT64, nvtx_sys::PayloadValue { ullValue: p }),
        None => (nvtx_sys::PayloadType::NVTX_PAYLOAD_UNKNOWN, nvtx_sys::PayloadValue { ullValue: 0 }),
    };
    nvtx_sys::EventAttributes {
        version: nvtx_sys::NVTX_VERSION as u16,
        size: nvtx_sys::NVTX_EVENT_ATTRIBUTES_SIZE as u16,
        category,
        colorType: i32::from(nvtx_sys::ColorType::NVTX_COLOR_ARGB),
        color,
        payloadType: i32::from(payload_type),
        reserved0: 0,
        payload: payload_value,
        messageType: i32::from(message_type),
        message,
    }
}

/// A range whose label is its own C string rather than a registered one: for spans that have
/// no prepared range ([`NvtxLayer`](super::NvtxLayer)'s slow path). It owns its label, which
/// its attributes point to.
pub(crate) struct OwnedNvtxRange {
    domain: nvtx_sys::DomainHandle,
    attributes: SendAttributes,
    _label: CString,
}

impl OwnedNvtxRange {
    /// A range labelled `label` (NUL characters left out) in `domain`.
    pub(crate) fn new(domain: nvtx_sys::DomainHandle, label: &str, category: u32, color: u32) -> Self {
        let label = CString::new(label.replace('\0', "")).unwrap_or_default();
        let message =
            (nvtx_sys::MessageType::NVTX_MESSAGE_TYPE_ASCII, nvtx_sys::MessageValue { ascii: label.as_ptr() });
        let attributes = attributes_of(message, category, color, None);
        Self { domain, attributes: SendAttributes(attributes), _label: label }
    }

    /// Pushes the range on this thread.
    pub(crate) fn push(&self) {
        nvtx_sys::domain_range_push_ex(self.domain, &self.attributes.0);
    }

    /// Its domain.
    pub(crate) fn domain(&self) -> nvtx_sys::DomainHandle {
        self.domain
    }
}

/// A range prepared for one site: the domain, the finished attributes and, when they point to
/// one, the structured payload (kept alive here).
#[doc(hidden)]
#[derive(Clone)]
pub struct PreparedNvtxRange {
    domain: nvtx_sys::DomainHandle,
    attributes: SendAttributes,
    details: Option<Arc<DetailsPayload>>,
}

/// Event attributes hold a registered-string handle (a pointer NVTX owns for the life of the
/// process), plain values and, for a structured payload, the address of a payload descriptor
/// that the prepared range keeps alive; they are only read after construction.
#[derive(Clone, Copy)]
struct SendAttributes(nvtx_sys::EventAttributes);
// SAFETY: the attributes are immutable after construction; the pointers they hold are a
// registered-string handle, which NVTX keeps valid for the whole process and on every thread,
// a payload descriptor owned (immutably, `Sync`) by the same prepared range, or the C string
// an `OwnedNvtxRange` owns (immutably) beside them.
unsafe impl Send for SendAttributes {}
// SAFETY: as above; shared references only ever read the attributes.
unsafe impl Sync for SendAttributes {}

impl PreparedNvtxRange {
    /// A range of `domain`: the structured payload of `details` where the domain's schema
    /// registers, else `payload` as a `u64`.
    pub(crate) fn new(
        domain: &str,
        label: &str,
        category: u32,
        color: u32,
        payload: Option<u64>,
        details: Option<&ScopeDetails>,
    ) -> Result<Self> {
        let domain = domain_handle(domain)?;
        let message = nvtx_sys::domain_register_string_ascii(domain, &c_string(label)?);
        let mut attributes = event_attributes(message, category, color, payload);
        let details = details.and_then(|d| Some(DetailsPayload::new(d, nvtx_payload::schema_id(domain)?)));
        if let Some(block) = &details {
            attributes.payloadType = NVTX_PAYLOAD_TYPE_EXT;
            // The number of `nvtxPayloadData_t` descriptors `payload.ullValue` points to.
            attributes.reserved0 = 1;
            attributes.payload = nvtx_sys::PayloadValue { ullValue: block.descriptor_address() };
        }
        Ok(Self { domain, attributes: SendAttributes(attributes), details })
    }

    /// Whether it carries a structured payload.
    pub(crate) fn has_details(&self) -> bool {
        self.details.is_some()
    }
}

/// `NVTX_PAYLOAD_TYPE_EXT` (`nvToolsExtPayload.h`): the payload is an array of payload
/// descriptors, `reserved0` of them.
const NVTX_PAYLOAD_TYPE_EXT: i32 = 0xDFBD0009_u32 as i32;

impl PreparedNvtxRange {
    /// Pushes the range on this thread.
    #[inline]
    pub fn push(&self) -> i32 {
        nvtx_sys::domain_range_push_ex(self.domain, &self.attributes.0)
    }

    /// Its domain.
    #[inline]
    pub(crate) fn domain(&self) -> nvtx_sys::DomainHandle {
        self.domain
    }

    /// Pops the innermost range of this domain on this thread.
    #[inline]
    pub fn pop(&self) {
        nvtx_sys::domain_range_pop(self.domain);
    }
}

impl ScopedGuard for PreparedNvtxRange {
    #[inline]
    fn on_enter(&self) -> u64 {
        self.push() as u64
    }

    #[inline]
    fn on_exit(&self, _entered: u64) {
        self.pop();
    }

    fn as_nvtx_range(&self) -> Option<&PreparedNvtxRange> {
        Some(self)
    }
}

impl Guard for NvtxRange {
    /// The same range around the backward, labelled `<label> (backward)`, its payload the forward
    /// op's position (unless it has a payload of its own).
    fn on_backward(&self, forward_label: &str, forward_position: Option<usize>) -> super::OnBackward {
        let range = NvtxRange {
            label: Some(super::backward_label(forward_label)),
            payload: self.payload.or(forward_position.map(|p| p as u64)),
            ..self.clone()
        };
        super::OnBackward::Guard(std::sync::Arc::new(range))
    }

    fn kind(&self) -> GuardKind {
        GuardKind::NvtxRange
    }

    /// NVTX ranges of fused ops merge into their region's range.
    fn policy(&self) -> GuardPolicy {
        GuardPolicy::MoveToEnclosing
    }

    fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    fn merge_key(&self) -> Option<String> {
        Some(format!("nvtx:{}", self.domain_name()))
    }

    fn nvtx_domain(&self) -> Option<&str> {
        Some(self.domain_name())
    }

    fn as_nvtx_range(&self) -> Option<&NvtxRange> {
        Some(self)
    }

    fn prepare(&self, site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>> {
        Ok(Box::new(self.prepare_at(site)?))
    }
}
