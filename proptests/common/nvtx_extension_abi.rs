//! The C structures through which NVTX's extension loader (`nvtxExtInit.h`) hands a module's
//! function slots to a tool's `InitializeInjectionNvtxExtension`, as `nvtxExtTypes.h` defines
//! them; shared by the test capture (`nvtx_payloads.rs`) and the benchmarks' null tool.

use std::ffi::c_void;

/// `NVTX_EXT_PAYLOAD_MODULEID`.
pub const PAYLOAD_MODULE_ID: u16 = 2;

/// `nvtxExtModuleSegment_t`.
#[repr(C)]
pub struct ModuleSegment {
    pub segment_id: usize,
    pub slot_count: usize,
    pub function_slots: *mut isize,
}

/// `nvtxExtModuleInfo_t`.
#[repr(C)]
pub struct ModuleInfo {
    pub nvtx_ver: u16,
    pub struct_size: u16,
    pub module_id: u16,
    pub compat_id: u16,
    pub segments_count: usize,
    pub segments: *mut ModuleSegment,
    pub get_export_function: *const c_void,
    pub ext_info: *const c_void,
}

/// Writes `function` into slot `slot` of the payload module's first segment; `false` when
/// `info` is not the payload module or has no such slot.
///
/// # Safety
/// `info` is null or the module info the loader passed to the tool's initialization.
pub unsafe fn install_payload_slot(info: *mut ModuleInfo, slot: usize, function: usize) -> bool {
    // SAFETY: null or valid, by the contract.
    let Some(info) = (unsafe { info.as_ref() }) else { return false };
    if info.module_id != PAYLOAD_MODULE_ID || info.segments_count < 1 || info.segments.is_null() {
        return false;
    }
    // SAFETY: `segments` points to `segments_count` (at least one) segments.
    let segment = unsafe { &*info.segments };
    if segment.slot_count <= slot || segment.function_slots.is_null() {
        return false;
    }
    // SAFETY: `function_slots` has `slot_count` slots; the loader reads this one as the function
    // of that callback id, whose signature the caller's function has.
    unsafe { segment.function_slots.add(slot).write(function as isize) };
    true
}
