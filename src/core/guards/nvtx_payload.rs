//! Structured NVTX payloads: a range's [`ScopeDetails`] as a binary block that the profiler
//! decodes with a schema registered once per domain (NVTX's payload extension).
//!
//! The block is built when the plan is compiled and lives as long as the prepared range, so
//! entering the range is the same single `nvtxDomainRangePushEx` as without it: only the
//! attributes differ (payload type `NVTX_PAYLOAD_TYPE_EXT`, pointing at the block's
//! descriptor). The schema is registered through a small C shim (`nvtx_payload/shim.c`),
//! because the extension is header-only. When no tool is attached, or the tool does not take
//! payload schemas (Nsight Systems 2022.4 returns no schema id), registration yields nothing
//! and ranges keep their plain `u64` payload.

use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex};

use nvtx::sys as nvtx_sys;

use super::ScopeDetails;

/// Bytes of the embedded inputs string, NUL included (`BOUNDSCOPE_INPUTS_LEN` in the shim).
pub(crate) const INPUTS_LEN: usize = 160;
/// Bytes of the embedded outputs string, NUL included (`BOUNDSCOPE_OUTPUTS_LEN` in the shim).
pub(crate) const OUTPUTS_LEN: usize = 96;

/// The static schema id boundscope registers in each domain (NVTX's static ids start at 2^24).
pub const DETAILS_SCHEMA_ID: u64 = (1 << 24) + 0xB5;

/// The binary block a range's payload points to; `boundscope_details_t` in the shim, field for
/// field (checked by a test).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DetailsBlock {
    plan: u64,
    first_step: u64,
    steps: u64,
    ops: u64,
    bytes_read: u64,
    bytes_written: u64,
    flops: u64,
    inputs: [c_char; INPUTS_LEN],
    outputs: [c_char; OUTPUTS_LEN],
}

/// `nvtxPayloadData_t`: which schema decodes the block, its size and where it is.
#[repr(C)]
struct PayloadData {
    schema_id: u64,
    size: usize,
    payload: *const c_void,
}

extern "C" {
    /// `domain` is an `nvtxDomainHandle_t`.
    fn boundscope_register_details_schema(domain: *mut c_void, schema_id: u64) -> u64;
    #[cfg(test)]
    fn boundscope_details_layout(out: *mut u64, count: usize);
}

/// The schema id of `domain`, registered on first use; `None` when no tool takes it.
pub(crate) fn schema_id(domain: nvtx_sys::DomainHandle) -> Option<u64> {
    // Keyed by the handle's address: handles are process-lifetime pointers NVTX gives.
    static SCHEMAS: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());
    let key = raw_domain(domain) as usize;
    let mut schemas = SCHEMAS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let id = match schemas.iter().find(|(k, _)| *k == key) {
        Some(&(_, id)) => id,
        None => {
            // SAFETY: `domain` is a handle NVTX created; the shim passes it and a static
            // schema description to `nvtxPayloadSchemaRegister`, which copies what it keeps.
            let id = unsafe { boundscope_register_details_schema(raw_domain(domain), DETAILS_SCHEMA_ID) };
            schemas.push((key, id));
            id
        }
    };
    (id != 0).then_some(id)
}

/// The `nvtxDomainHandle_t` inside `nvtx`'s handle, which wraps it alone and offers no getter.
fn raw_domain(domain: nvtx_sys::DomainHandle) -> *mut c_void {
    const _: () = assert!(std::mem::size_of::<nvtx_sys::DomainHandle>() == std::mem::size_of::<*mut c_void>());
    // SAFETY: the handle is a struct of one field, the C handle (a pointer), and the sizes are
    // equal (checked above); we only read its bits.
    unsafe { std::mem::transmute_copy::<nvtx_sys::DomainHandle, *mut c_void>(&domain) }
}

/// A range's payload: the block and its descriptor, at a fixed heap address for as long as
/// any copy of the prepared range lives.
pub(crate) struct DetailsPayload {
    data: PayloadData,
    /// The block `data.payload` points to: from `Box::into_raw`, freed by `Drop`.
    block: std::ptr::NonNull<DetailsBlock>,
}

// SAFETY: both parts are immutable after construction; the only pointers (`data.payload`,
// `block`) point to the block, which the payload owns.
unsafe impl Send for DetailsPayload {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for DetailsPayload {}

impl DetailsPayload {
    /// The payload for `details`, decoded by schema `schema_id`.
    pub(crate) fn new(details: &ScopeDetails, schema_id: u64) -> Arc<Self> {
        // A raw allocation, so that the pointer NVTX is given stays valid however the owner moves.
        let block = std::ptr::NonNull::from(Box::leak(Box::new(block_of(details))));
        let data = PayloadData {
            schema_id,
            size: std::mem::size_of::<DetailsBlock>(),
            payload: block.as_ptr().cast_const().cast(),
        };
        Arc::new(Self { data, block })
    }

    /// What the event attributes' `payload.ullValue` holds: the descriptor's address.
    pub(crate) fn descriptor_address(&self) -> u64 {
        std::ptr::from_ref(&self.data) as usize as u64
    }
}

impl Drop for DetailsPayload {
    fn drop(&mut self) {
        // SAFETY: `block` came from `Box::leak` in `new` and is freed once, here; no prepared
        // range (which holds this payload through an `Arc`) can push it any more.
        drop(unsafe { Box::from_raw(self.block.as_ptr()) });
    }
}

fn block_of(d: &ScopeDetails) -> DetailsBlock {
    DetailsBlock {
        plan: d.plan,
        first_step: u64::from(d.first_step),
        steps: u64::from(d.steps),
        ops: u64::from(d.ops),
        bytes_read: d.bytes_read,
        bytes_written: d.bytes_written,
        flops: d.flops,
        inputs: embedded(&d.inputs_text()),
        outputs: embedded(&d.outputs_text()),
    }
}

/// `text` as a NUL-terminated string of at most `N - 1` bytes: cut at a character boundary
/// with `...` at the end when it is longer.
fn embedded<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    let fits = truncated(text, N - 1);
    for (slot, byte) in out.iter_mut().zip(fits.bytes()) {
        *slot = byte as c_char;
    }
    out
}

/// `text` cut to at most `max` bytes, ending in `...` when cut.
pub(crate) fn truncated(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end]).into()
}

/// Size, then each field's offset, as the C compiler lays `boundscope_details_t` out.
#[cfg(test)]
fn c_layout() -> [u64; 10] {
    let mut out = [0u64; 10];
    // SAFETY: the shim writes at most `out.len()` values into `out`.
    unsafe { boundscope_details_layout(out.as_mut_ptr(), out.len()) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn rust_and_c_lay_the_block_out_alike() {
        let rust = [
            size_of::<DetailsBlock>() as u64,
            offset_of!(DetailsBlock, plan) as u64,
            offset_of!(DetailsBlock, first_step) as u64,
            offset_of!(DetailsBlock, steps) as u64,
            offset_of!(DetailsBlock, ops) as u64,
            offset_of!(DetailsBlock, bytes_read) as u64,
            offset_of!(DetailsBlock, bytes_written) as u64,
            offset_of!(DetailsBlock, flops) as u64,
            offset_of!(DetailsBlock, inputs) as u64,
            offset_of!(DetailsBlock, outputs) as u64,
        ];
        assert_eq!(rust, c_layout());
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        assert_eq!(truncated("f32[1]", 10), "f32[1]");
        assert_eq!(truncated("abcdefghijkl", 10), "abcdefg...");
        let cut = truncated("ααααααα", 10);
        assert!(cut.len() <= 10 && cut.ends_with("..."), "{cut}");
        let block: [c_char; 8] = embedded("f32[64, 256]");
        let bytes: Vec<u8> = block.iter().map(|&c| c as u8).collect();
        assert_eq!(&bytes, b"f32[...\0");
    }

    #[test]
    fn without_a_tool_no_schema_is_registered() {
        // Unit tests link no NVTX tool, and none is injected when they run under `cargo test`.
        if std::env::var_os("NVTX_INJECTION64_PATH").is_some() {
            eprintln!("skipped: an NVTX tool is injected (NVTX_INJECTION64_PATH is set)");
            return;
        }
        let domain = super::super::nvtx_range::domain_handle("boundscope unit test").expect("valid name");
        assert_eq!(schema_id(domain), None);
    }
}
