//! The capture's side of NVTX's payload extension: schema registration and the decoding of
//! structured payloads, as a profiler that takes them would do.
//!
//! Compiling this module defines the strong C symbol `InitializeInjectionNvtxExtension_fnptr`,
//! which the extension's loader (compiled into boundscope from `nvtxExtInit.h`) declares weak,
//! so the extension finds this tool the way the core finds [`super::nvtx_capture`]'s. We take
//! `nvtxPayloadSchemaRegister` for static schemas whose entries are `UINT64` values and
//! fixed-size embedded C strings (what boundscope registers) and refuse other schemas (id 0),
//! as a tool that does not know them would.
//!
//! A push whose payload type is `NVTX_PAYLOAD_TYPE_EXT` is decoded with its schema into one
//! line, `name=value` per entry in schema order joined by `; ` (strings up to their NUL), and
//! the line is interned like a message, so that steady state does not allocate.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use super::nvtx_extension_abi::{install_payload_slot, ModuleInfo};

/// `NVTX_PAYLOAD_TYPE_EXT`.
pub const PAYLOAD_TYPE_EXT: i32 = 0xDFBD0009_u32 as i32;
/// `NVTX3EXT_CBID_nvtxPayloadSchemaRegister`.
const CBID_SCHEMA_REGISTER: usize = 0;
const ENTRY_TYPE_UINT64: u64 = 18;
const ENTRY_TYPE_CSTRING: u64 = 75;
const SCHEMA_TYPE_STATIC: u64 = 1;
const FIELD_SCHEMA_ID: u64 = 1 << 8;
const FIELD_STATIC_SIZE: u64 = 1 << 6;

#[repr(C)]
struct SchemaEntry {
    flags: u64,
    kind: u64,
    name: *const c_char,
    description: *const c_char,
    array_or_union_detail: u64,
    offset: u64,
    semantics: *const c_void,
    reserved: *const c_void,
}

#[repr(C)]
struct SchemaAttr {
    field_mask: u64,
    name: *const c_char,
    kind: u64,
    flags: u64,
    entries: *const SchemaEntry,
    num_entries: usize,
    payload_static_size: usize,
    pack_align: usize,
    schema_id: u64,
    extension: *mut c_void,
}

/// `nvtxPayloadData_t`.
#[repr(C)]
pub struct PayloadData {
    schema_id: u64,
    size: usize,
    payload: *const c_void,
}

/// One registered schema, as the decoder needs it.
struct Schema {
    size: usize,
    /// `(name, offset, string length or 0 for a u64)`.
    entries: Vec<(String, usize, usize)>,
}

static SCHEMAS: LazyLock<Mutex<HashMap<(usize, u64), Schema>>> = LazyLock::new(Mutex::default);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Schemas registered so far, over all domains.
pub fn schemas_registered() -> usize {
    lock(&SCHEMAS).len()
}

/// The extension loader's static-injection entry point.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static InitializeInjectionNvtxExtension_fnptr: Option<unsafe extern "C" fn(*mut ModuleInfo) -> c_int> =
    Some(initialize_extension);

/// Installs `nvtxPayloadSchemaRegister` in the payload module; takes no other module.
unsafe extern "C" fn initialize_extension(info: *mut ModuleInfo) -> c_int {
    let register: unsafe extern "C" fn(*mut c_void, *const SchemaAttr) -> u64 = schema_register;
    // SAFETY: the loader passes its module info; `register` has the slot's signature.
    c_int::from(unsafe { install_payload_slot(info, CBID_SCHEMA_REGISTER, register as usize) })
}

unsafe extern "C" fn schema_register(domain: *mut c_void, attr: *const SchemaAttr) -> u64 {
    // SAFETY: the caller passes its schema attributes, valid for the call.
    let Some(attr) = (unsafe { attr.as_ref() }) else { return 0 };
    let needed = FIELD_SCHEMA_ID | FIELD_STATIC_SIZE;
    if attr.kind != SCHEMA_TYPE_STATIC || attr.field_mask & needed != needed || attr.entries.is_null() {
        return 0;
    }
    // SAFETY: `entries` points to `num_entries` entries, per the API.
    let entries = unsafe { std::slice::from_raw_parts(attr.entries, attr.num_entries) };
    let mut decoded = Vec::with_capacity(entries.len());
    for e in entries {
        let name = if e.name.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null entry name is a C string, per the API.
            unsafe { CStr::from_ptr(e.name) }.to_string_lossy().into_owned()
        };
        let length = match e.kind {
            ENTRY_TYPE_UINT64 if e.flags == 0 => 0,
            ENTRY_TYPE_CSTRING if e.flags == 0 && e.array_or_union_detail > 0 => e.array_or_union_detail as usize,
            _ => return 0,
        };
        let end = e.offset as usize + length.max(8);
        if end > attr.payload_static_size {
            return 0;
        }
        decoded.push((name, e.offset as usize, length));
    }
    let schema = Schema { size: attr.payload_static_size, entries: decoded };
    lock(&SCHEMAS).insert((domain as usize, attr.schema_id), schema);
    attr.schema_id
}

/// Decodes the `count` payloads at `data` of a push in `domain` into one line written to
/// `out`: the [module docs](self)' format, payloads separated by ` | `; `<unknown schema N>`
/// or `<bad size N>` where one cannot be decoded.
///
/// # Safety
/// `data` points to `count` payload descriptors whose blocks are valid for their sizes.
pub unsafe fn decode(domain: usize, data: *const PayloadData, count: usize, out: &mut String) {
    out.clear();
    if data.is_null() {
        out.push_str("<null payload>");
        return;
    }
    let schemas = lock(&SCHEMAS);
    for k in 0..count {
        if k > 0 {
            out.push_str(" | ");
        }
        // SAFETY: `k < count` descriptors, per the contract.
        let d = unsafe { &*data.add(k) };
        let Some(schema) = schemas.get(&(domain, d.schema_id)) else {
            let _ = write!(out, "<unknown schema {}>", d.schema_id);
            continue;
        };
        if d.size != schema.size || d.payload.is_null() {
            let _ = write!(out, "<bad size {}>", d.size);
            continue;
        }
        let base = d.payload.cast::<u8>();
        for (i, (name, offset, length)) in schema.entries.iter().enumerate() {
            if i > 0 {
                out.push_str("; ");
            }
            let _ = write!(out, "{name}=");
            // SAFETY: registration checked that each entry lies inside the block, whose size
            // the descriptor confirms.
            let bytes = unsafe { std::slice::from_raw_parts(base.add(*offset), (*length).max(8)) };
            if *length == 0 {
                let value = u64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes"));
                let _ = write!(out, "{value}");
            } else {
                let text = &bytes[..*length];
                let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
                out.push_str(&String::from_utf8_lossy(&text[..end]));
            }
        }
    }
}
