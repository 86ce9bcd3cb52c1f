//! A null NVTX tool for benchmarks: attached through NVTX's static injection (the strong
//! `InitializeInjectionNvtx2_fnptr` and `InitializeInjectionNvtxExtension_fnptr`, which the NVTX
//! loaders declare weak), it takes payload schemas; on every domain range push it reads the
//! structured payload's descriptor (schema id, size, address) and the first word of the block,
//! and, in `copy` mode, copies the whole block into a per-thread buffer, as a profiler copies
//! it into its event buffer; pops do nothing. It measures what entering a range costs on our
//! side once a tool takes payloads (and, in `copy` mode, plus the copy every tool must make),
//! without a real profiler's own cost.
//!
//! It attaches only where `BOUNDSCOPE_BENCH_NVTX_TOOL` is `1` (read) or `copy` when NVTX
//! initializes (its first call in the process); otherwise both entry points decline and NVTX
//! stays a no-op, so one benchmark binary can measure with and without it.

use std::cell::RefCell;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nvtx_sys::ffi;

#[path = "../proptests/common/nvtx_extension_abi.rs"]
mod nvtx_extension_abi;

use nvtx_extension_abi::{install_payload_slot, ModuleInfo};

/// The variable that attaches the tool.
pub const ENABLE: &str = "BOUNDSCOPE_BENCH_NVTX_TOOL";

/// `NVTX_PAYLOAD_TYPE_EXT`.
const PAYLOAD_TYPE_EXT: i32 = 0xDFBD0009_u32 as i32;

/// Whether pushes copy the whole payload block (`copy` mode).
static COPY: AtomicBool = AtomicBool::new(false);
/// What pushes read, kept so the reads are not optimized away.
static SEEN: AtomicU64 = AtomicU64::new(0);

fn enabled() -> bool {
    match std::env::var(ENABLE).as_deref() {
        Ok("1") => true,
        Ok("copy") => {
            COPY.store(true, Ordering::Relaxed);
            true
        }
        _ => false,
    }
}

thread_local! {
    /// Where pushes copy payloads to, as a tool's event buffer.
    static EVENT_BUFFER: RefCell<[u8; 1024]> = const { RefCell::new([0; 1024]) };
}

#[repr(C)]
struct PayloadData {
    schema_id: u64,
    size: usize,
    payload: *const u8,
}

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static InitializeInjectionNvtx2_fnptr: ffi::NvtxInitializeInjectionNvtxFunc_t = Some(initialize);

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static InitializeInjectionNvtxExtension_fnptr: Option<unsafe extern "C" fn(*mut ModuleInfo) -> c_int> =
    Some(initialize_extension);

unsafe extern "C" fn domain_range_push_ex(
    _domain: ffi::nvtxDomainHandle_t,
    attributes: *const ffi::nvtxEventAttributes_t,
) -> c_int {
    // SAFETY: NVTX passes the caller's attributes, valid for the call.
    let Some(attributes) = (unsafe { attributes.as_ref() }) else { return 0 };
    if attributes.payloadType == PAYLOAD_TYPE_EXT {
        // SAFETY: for this payload type `ullValue` is the address of `reserved0` descriptors,
        // each pointing to `size` readable bytes, valid for the call.
        let data = unsafe { &*(attributes.payload.ullValue as usize as *const PayloadData) };
        if !COPY.load(Ordering::Relaxed) {
            // SAFETY: as above; every boundscope block is at least 8 bytes.
            let first = unsafe { data.payload.cast::<u64>().read_unaligned() };
            SEEN.store(data.schema_id ^ data.size as u64 ^ first, Ordering::Relaxed);
            return 0;
        }
        let _ = EVENT_BUFFER.try_with(|buffer| {
            let mut buffer = buffer.borrow_mut();
            let n = data.size.min(buffer.len());
            // SAFETY: as above; `n` is at most the block's size and the buffer's length.
            unsafe { std::ptr::copy_nonoverlapping(data.payload, buffer.as_mut_ptr(), n) };
        });
    }
    0
}

unsafe extern "C" fn domain_range_pop(_domain: ffi::nvtxDomainHandle_t) -> c_int {
    0
}

unsafe extern "C" fn schema_register(_domain: *mut c_void, attr: *const u64) -> u64 {
    // SAFETY: `nvtxPayloadSchemaAttr_t` starts with `fieldMask`; its static schema id is the
    // ninth 8-byte field, after name, type, flags, entries, numEntries, payloadStaticSize and
    // packAlign, on the 64-bit targets we benchmark on.
    unsafe { attr.add(8).read() }
}

unsafe extern "C" fn initialize_extension(info: *mut ModuleInfo) -> c_int {
    if !enabled() {
        return 0;
    }
    let register: unsafe extern "C" fn(*mut c_void, *const u64) -> u64 = schema_register;
    // SAFETY: the loader passes its module info; slot 0 of the payload module is
    // `nvtxPayloadSchemaRegister`, whose signature `register` has.
    c_int::from(unsafe { install_payload_slot(info, 0, register as usize) })
}

unsafe extern "C" fn initialize(get_export_table: ffi::NvtxGetExportTableFunc_t) -> c_int {
    let Some(get_export_table) = get_export_table.filter(|_| enabled()) else { return 0 };
    // SAFETY: NVTX's export-table getter returns null or its static callbacks table.
    let callbacks = unsafe { get_export_table(ffi::NvtxExportTableID::NVTX_ETID_CALLBACKS as u32) }
        .cast::<ffi::NvtxExportTableCallbacks>();
    // SAFETY: as above.
    let Some(get_module) = (unsafe { callbacks.as_ref() }).and_then(|c| c.GetModuleFunctionTable) else {
        return 0;
    };
    let mut table: ffi::NvtxFunctionTable = std::ptr::null_mut();
    let mut size: c_uint = 0;
    // SAFETY: both out-pointers are valid for writes.
    if unsafe { get_module(ffi::NvtxCallbackModule::NVTX_CB_MODULE_CORE2, &mut table, &mut size) } == 0 {
        return 0;
    }
    use ffi::NvtxCallbackIdCore2 as Core2;
    let push: ffi::nvtxDomainRangePushEx_impl_fntype = Some(domain_range_push_ex);
    let pop: ffi::nvtxDomainRangePop_impl_fntype = Some(domain_range_pop);
    for (id, f) in [
        (Core2::NVTX_CBID_CORE2_DomainRangePushEx as u32, push.map(|f| f as usize)),
        (Core2::NVTX_CBID_CORE2_DomainRangePop as u32, pop.map(|f| f as usize)),
    ] {
        if table.is_null() || id == 0 || id >= size {
            return 0;
        }
        // SAFETY: `table` has entries `0..=size` and `id < size`; each non-null slot points to
        // NVTX's function pointer for that callback, whose type ours has (checked above by the
        // bindgen slot types); NVTX is inside its one-time initialization.
        unsafe {
            let slot = table.add(id as usize).read();
            if slot.is_null() {
                return 0;
            }
            slot.cast::<usize>().write(f.unwrap_or(0));
        }
    }
    1
}
