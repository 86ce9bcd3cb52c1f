//! An in-process NVTX tool for tests, attached through NVTX's *static injection* path.
//!
//! Compiling this module into a test binary defines the strong C symbol
//! `InitializeInjectionNvtx2_fnptr`. The NVTX loader compiled into `nvtx-sys` declares the same
//! symbol weak (`nvtxDetail/nvtxInit.h`, load sequence version 2), so the linker binds it to ours,
//! and on the first NVTX call in the process NVTX calls [`initialize`] with its export table. We
//! then install our own functions in the CORE and CORE2 function tables for `DomainCreateA/W`,
//! `DomainRegisterStringA/W`, `DomainRangePushEx`, `DomainRangePop`, `RangePushA/W`,
//! `RangePushEx`, `RangePop`, `NameOsThreadA` (see [`thread_names`]) and, in the CUDA module,
//! `NameCuStreamA` (see [`stream_names`]); every other NVTX call stays a no-op. Through NVTX's
//! payload extension it also takes boundscope's payload schema and decodes structured payloads
//! ([`super::nvtx_payloads`], [`NvtxEvent::details`]).
//!
//! A dynamic injection (`NVTX_INJECTION64_PATH`, which Nsight Systems sets) takes precedence
//! over static injection: under a real profiler [`is_installed`] is false and nothing is
//! captured.
//!
//! Handles: we implement domain creation and string registration, so we choose the handles. A
//! domain handle is `index + 1` into a global table of domain names (equal names give the same
//! handle); a string handle is `index + 1` into a global table of interned strings, shared by
//! all domains (equal strings give the same handle). The null handle is the default domain,
//! respectively "no string".
//!
//! Every push and pop is recorded in a log owned by the calling thread, so tests running in
//! parallel threads do not see each other's events: use [`events_on_current_thread`]. A global
//! registry of the per-thread logs lets [`take_events`] drain all of them.
//!
//! Return values follow `nvToolsExt.h`, per thread and per domain (the default domain counts as
//! one): a push returns the 0-based level of the range it opens (the number of ranges of that
//! domain already open on this thread), a pop returns the level of the range it closes (the
//! number still open after it) or `-1` when none is open. An unmatched pop is still logged.
//!
//! Steady state allocates nothing, so that tests counting heap allocations are not disturbed:
//! each thread's log reserves [`LOG_CAPACITY`] events on its first event and, when full, drops
//! further events (counted by [`dropped_on_current_thread`]) instead of growing; strings are
//! interned once (the first push of a given message allocates, later ones do not).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

use nvtx_sys::ffi;

use super::nvtx_payloads;

/// Whether an event opens or closes a range.
#[derive(Clone, Debug, PartialEq)]
pub enum NvtxEventKind {
    Push,
    Pop,
}

/// One captured push or pop.
#[derive(Clone, Debug, PartialEq)]
pub struct NvtxEvent {
    pub kind: NvtxEventKind,
    /// The domain's name; `None` for the default domain.
    pub domain: Option<String>,
    /// Pushes only: the ASCII, Unicode or registered message text.
    pub message: Option<String>,
    /// Pushes only (0 otherwise): the event attributes' category.
    pub category: u32,
    /// Pushes only: an integer payload (u64, i64, u32 or i32; signed values sign-extended and
    /// reinterpreted as u64). Floating-point payloads are not recorded.
    pub payload: Option<u64>,
    /// Pushes only: the ARGB color, when the attributes' color type is ARGB.
    pub color: Option<u32>,
    /// Pushes only: a structured payload (`NVTX_PAYLOAD_TYPE_EXT`), decoded with its schema
    /// into one line (see [`super::nvtx_payloads`]).
    pub details: Option<String>,
    /// The thread that made the call.
    pub thread: ThreadId,
}

/// Events each thread's log holds before it drops further events instead of growing.
pub const LOG_CAPACITY: usize = 1 << 14;

/// Drains every thread's log, in call order (a global sequence number orders events across
/// threads). This also steals the events of tests running in parallel: prefer
/// [`events_on_current_thread`].
pub fn take_events() -> Vec<NvtxEvent> {
    let mut raw: Vec<(ThreadId, RawEvent)> = Vec::new();
    {
        let mut logs = lock(&REGISTRY);
        for log in logs.iter() {
            let mut state = lock(&log.state);
            raw.extend(state.events.drain(..).map(|event| (log.thread, event)));
        }
        // Logs of threads that have exited (only the registry holds them) are empty now.
        logs.retain(|log| Arc::strong_count(log) > 1);
    }
    raw.sort_by_key(|(_, event)| event.seq);
    let names = lock(&NAMES);
    raw.into_iter().map(|(thread, event)| names.resolve(thread, event)).collect()
}

/// Drains the current thread's log, in call order.
pub fn events_on_current_thread() -> Vec<NvtxEvent> {
    let Some((thread, raw)) = with_local(|log, state| (log.thread, state.events.drain(..).collect::<Vec<_>>())) else {
        return Vec::new();
    };
    let names = lock(&NAMES);
    raw.into_iter().map(|event| names.resolve(thread, event)).collect()
}

/// How many events the current thread's log dropped because it was full (see
/// [`LOG_CAPACITY`]); resets the count.
pub fn dropped_on_current_thread() -> u64 {
    with_local(|_, state| std::mem::take(&mut state.dropped)).unwrap_or(0)
}

/// Whether NVTX called our initialization, i.e. this capture is the process's NVTX tool. Forces
/// NVTX's lazy initialization first, so the answer does not depend on earlier NVTX calls.
pub fn is_installed() -> bool {
    // SAFETY: `nvtxInitialize` takes a reserved pointer that must be null; it only runs NVTX's
    // one-time initialization, which is thread-safe.
    unsafe { ffi::nvtxInitialize(std::ptr::null()) };
    INSTALLED.load(Ordering::Acquire)
}

/// The static-injection entry point that NVTX's weak symbol of the same name binds to.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static InitializeInjectionNvtx2_fnptr: ffi::NvtxInitializeInjectionNvtxFunc_t = Some(initialize);

static INSTALLED: AtomicBool = AtomicBool::new(false);
static SEQUENCE: AtomicU64 = AtomicU64::new(0);
static NAMES: LazyLock<Mutex<Names>> = LazyLock::new(|| Mutex::new(Names::default()));
static REGISTRY: Mutex<Vec<Arc<ThreadLog>>> = Mutex::new(Vec::new());

thread_local! {
    static LOCAL: Arc<ThreadLog> = ThreadLog::register();
    /// Reused buffer for decoding wide strings, so steady state does not allocate.
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
    /// Reused buffer for decoding structured payloads.
    static DETAILS_SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// An event as logged: handles instead of text, resolved when the log is drained.
#[derive(Clone, Copy)]
struct RawEvent {
    seq: u64,
    push: bool,
    /// Domain handle value: 0 is the default domain.
    domain: usize,
    /// String handle value: 0 is no message.
    message: usize,
    category: u32,
    payload: Option<u64>,
    color: Option<u32>,
    /// String handle value of the decoded structured payload: 0 is none.
    details: usize,
}

#[derive(Default)]
struct Names {
    domains: Vec<Box<str>>,
    domain_handles: HashMap<Box<str>, usize>,
    strings: Vec<Box<str>>,
    string_handles: HashMap<Box<str>, usize>,
}

impl Names {
    fn domain(&mut self, name: &str) -> usize {
        intern(&mut self.domains, &mut self.domain_handles, name)
    }

    fn string(&mut self, text: &str) -> usize {
        intern(&mut self.strings, &mut self.string_handles, text)
    }

    fn resolve(&self, thread: ThreadId, event: RawEvent) -> NvtxEvent {
        let lookup = |table: &[Box<str>], handle: usize, what: &str| match handle {
            0 => None,
            h => Some(table.get(h - 1).map_or_else(|| format!("<unknown {what} handle {h:#x}>"), |s| s.to_string())),
        };
        NvtxEvent {
            kind: if event.push { NvtxEventKind::Push } else { NvtxEventKind::Pop },
            domain: lookup(&self.domains, event.domain, "domain"),
            message: lookup(&self.strings, event.message, "string"),
            category: event.category,
            payload: event.payload,
            color: event.color,
            details: lookup(&self.strings, event.details, "string"),
            thread,
        }
    }
}

/// Returns the handle (`index + 1`) of `text` in `table`, adding it when new.
fn intern(table: &mut Vec<Box<str>>, handles: &mut HashMap<Box<str>, usize>, text: &str) -> usize {
    if let Some(&handle) = handles.get(text) {
        return handle;
    }
    table.push(text.into());
    handles.insert(text.into(), table.len());
    table.len()
}

struct ThreadLog {
    thread: ThreadId,
    state: Mutex<ThreadState>,
}

#[derive(Default)]
struct ThreadState {
    events: Vec<RawEvent>,
    /// Open ranges per domain handle value on this thread.
    depths: Vec<i32>,
    dropped: u64,
}

impl ThreadLog {
    fn register() -> Arc<ThreadLog> {
        let log = Arc::new(ThreadLog { thread: std::thread::current().id(), state: Mutex::default() });
        lock(&REGISTRY).push(Arc::clone(&log));
        log
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of our locks leaves consistent data; never panic in a callback.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on this thread's log, or returns `None` while the thread is being torn down.
fn with_local<R>(f: impl FnOnce(&ThreadLog, &mut ThreadState) -> R) -> Option<R> {
    LOCAL
        .try_with(|log| {
            let mut state = lock(&log.state);
            f(log, &mut state)
        })
        .ok()
}

/// Logs a push and returns the level of the range it opens (`-1` if it could not be logged).
fn push(domain: usize, message: usize, category: u32, payload: Option<u64>, color: Option<u32>) -> c_int {
    push_with_details(domain, message, category, payload, color, 0)
}

/// [`push`], with the string handle of a decoded structured payload (0 for none).
fn push_with_details(
    domain: usize,
    message: usize,
    category: u32,
    payload: Option<u64>,
    color: Option<u32>,
    details: usize,
) -> c_int {
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let event = RawEvent { seq, push: true, domain, message, category, payload, color, details };
    with_local(|_, state| {
        record(state, event);
        if state.depths.len() <= domain {
            state.depths.resize(domain + 1, 0);
        }
        let level = state.depths[domain];
        state.depths[domain] += 1;
        level
    })
    .unwrap_or(-1)
}

/// Logs a pop and returns the level of the range it closes, or `-1` if none was open.
fn pop(domain: usize) -> c_int {
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let event = RawEvent { seq, push: false, domain, message: 0, category: 0, payload: None, color: None, details: 0 };
    with_local(|_, state| {
        record(state, event);
        match state.depths.get_mut(domain) {
            Some(depth) if *depth > 0 => {
                *depth -= 1;
                *depth
            }
            _ => -1,
        }
    })
    .unwrap_or(-1)
}

fn record(state: &mut ThreadState, event: RawEvent) {
    if state.events.capacity() == 0 {
        state.events.reserve_exact(LOG_CAPACITY);
        state.depths.reserve(16);
    }
    if state.events.len() < LOG_CAPACITY {
        state.events.push(event);
    } else {
        state.dropped += 1;
    }
}

/// Interns a NUL-terminated narrow string; 0 for a null pointer.
///
/// # Safety
/// `text` is null or points to a NUL-terminated string valid for the duration of the call.
unsafe fn intern_narrow(text: *const c_char, domain: bool) -> usize {
    if text.is_null() {
        return 0;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let mut names = lock(&NAMES);
    if domain {
        names.domain(&text)
    } else {
        names.string(&text)
    }
}

/// Interns a NUL-terminated wide (`wchar_t`, UTF-32 on Linux) string; 0 for a null pointer.
///
/// # Safety
/// `text` is null or points to a NUL-terminated wide string valid for the duration of the call.
unsafe fn intern_wide(text: *const ffi::wchar_t, domain: bool) -> usize {
    if text.is_null() {
        return 0;
    }
    let decode = |buffer: &mut String| {
        buffer.clear();
        let mut at = text;
        loop {
            // SAFETY: the string is NUL-terminated and we stop at the NUL, so `at` stays inside it.
            let unit = unsafe { at.read() };
            if unit == 0 {
                break;
            }
            buffer.push(char::from_u32(unit as u32).unwrap_or(char::REPLACEMENT_CHARACTER));
            // SAFETY: `unit` was not the terminator, so the next unit is still inside the string.
            at = unsafe { at.add(1) };
        }
        let mut names = lock(&NAMES);
        if domain {
            names.domain(buffer)
        } else {
            names.string(buffer)
        }
    };
    SCRATCH
        .try_with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buffer) => decode(&mut buffer),
            Err(_) => decode(&mut String::new()),
        })
        .unwrap_or_else(|_| decode(&mut String::new()))
}

/// Logs a push described by event attributes.
///
/// # Safety
/// `attributes` is null or points to valid `nvtxEventAttributes_t` whose message pointer (for
/// ASCII and Unicode messages) is a NUL-terminated string, as the NVTX API requires.
unsafe fn push_attributes(domain: usize, attributes: *const ffi::nvtxEventAttributes_t) -> c_int {
    // SAFETY: null or valid, by the caller's contract.
    let Some(attributes) = (unsafe { attributes.as_ref() }) else {
        return push(domain, 0, 0, None, None);
    };
    let message = match attributes.messageType {
        t if t == ffi::nvtxMessageType_t::NVTX_MESSAGE_TYPE_ASCII as i32 => {
            // SAFETY: the message type says the union holds `ascii`, a C string per the contract.
            unsafe { intern_narrow(attributes.message.ascii, false) }
        }
        t if t == ffi::nvtxMessageType_t::NVTX_MESSAGE_TYPE_UNICODE as i32 => {
            // SAFETY: the message type says the union holds `unicode`, a wide C string.
            unsafe { intern_wide(attributes.message.unicode, false) }
        }
        t if t == ffi::nvtxMessageType_t::NVTX_MESSAGE_TYPE_REGISTERED as i32 => {
            // SAFETY: the message type says the union holds `registered`, a handle we made.
            unsafe { attributes.message.registered as usize }
        }
        _ => 0,
    };
    let payload = match attributes.payloadType {
        t if t == ffi::nvtxPayloadType_t::NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 as i32 => {
            // SAFETY: the payload type says which union member was written.
            Some(unsafe { attributes.payload.ullValue })
        }
        t if t == ffi::nvtxPayloadType_t::NVTX_PAYLOAD_TYPE_INT64 as i32 => {
            // SAFETY: the payload type says which union member was written.
            Some(unsafe { attributes.payload.llValue } as u64)
        }
        t if t == ffi::nvtxPayloadType_t::NVTX_PAYLOAD_TYPE_UNSIGNED_INT32 as i32 => {
            // SAFETY: the payload type says which union member was written.
            Some(u64::from(unsafe { attributes.payload.uiValue }))
        }
        t if t == ffi::nvtxPayloadType_t::NVTX_PAYLOAD_TYPE_INT32 as i32 => {
            // SAFETY: the payload type says which union member was written.
            Some(i64::from(unsafe { attributes.payload.iValue }) as u64)
        }
        _ => None,
    };
    let color = (attributes.colorType == ffi::nvtxColorType_t::NVTX_COLOR_ARGB as i32).then_some(attributes.color);
    let details = if attributes.payloadType == nvtx_payloads::PAYLOAD_TYPE_EXT {
        // SAFETY: the payload type says `ullValue` holds the address of `reserved0` payload
        // descriptors, valid for the call per the API.
        unsafe {
            intern_details(domain, attributes.payload.ullValue as usize as *const _, attributes.reserved0 as usize)
        }
    } else {
        0
    };
    push_with_details(domain, message, attributes.category, payload, color, details)
}

/// Decodes a push's structured payloads into one line and interns it (no allocation once the
/// line has been seen).
///
/// # Safety
/// As [`nvtx_payloads::decode`].
unsafe fn intern_details(domain: usize, data: *const nvtx_payloads::PayloadData, count: usize) -> usize {
    let decode = |buffer: &mut String| {
        // SAFETY: forwarded from the caller.
        unsafe { nvtx_payloads::decode(domain, data, count, buffer) };
        lock(&NAMES).string(buffer)
    };
    DETAILS_SCRATCH
        .try_with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buffer) => decode(&mut buffer),
            Err(_) => decode(&mut String::new()),
        })
        .unwrap_or_else(|_| decode(&mut String::new()))
}

// --- The functions installed in NVTX's tables. Their signatures are checked against the
// --- bindgen slot types in `initialize`.

unsafe extern "C" fn domain_create_a(name: *const c_char) -> ffi::nvtxDomainHandle_t {
    // SAFETY: NVTX passes the caller's NUL-terminated name (or null).
    unsafe { intern_narrow(name, true) as ffi::nvtxDomainHandle_t }
}

unsafe extern "C" fn domain_create_w(name: *const ffi::wchar_t) -> ffi::nvtxDomainHandle_t {
    // SAFETY: NVTX passes the caller's NUL-terminated wide name (or null).
    unsafe { intern_wide(name, true) as ffi::nvtxDomainHandle_t }
}

unsafe extern "C" fn domain_register_string_a(
    _domain: ffi::nvtxDomainHandle_t,
    text: *const c_char,
) -> ffi::nvtxStringHandle_t {
    // SAFETY: NVTX passes the caller's NUL-terminated string (or null).
    unsafe { intern_narrow(text, false) as ffi::nvtxStringHandle_t }
}

unsafe extern "C" fn domain_register_string_w(
    _domain: ffi::nvtxDomainHandle_t,
    text: *const ffi::wchar_t,
) -> ffi::nvtxStringHandle_t {
    // SAFETY: NVTX passes the caller's NUL-terminated wide string (or null).
    unsafe { intern_wide(text, false) as ffi::nvtxStringHandle_t }
}

unsafe extern "C" fn domain_range_push_ex(
    domain: ffi::nvtxDomainHandle_t,
    attributes: *const ffi::nvtxEventAttributes_t,
) -> c_int {
    // SAFETY: NVTX passes the caller's attributes, valid per the NVTX API contract.
    unsafe { push_attributes(domain as usize, attributes) }
}

unsafe extern "C" fn domain_range_pop(domain: ffi::nvtxDomainHandle_t) -> c_int {
    pop(domain as usize)
}

unsafe extern "C" fn range_push_ex(attributes: *const ffi::nvtxEventAttributes_t) -> c_int {
    // SAFETY: NVTX passes the caller's attributes, valid per the NVTX API contract.
    unsafe { push_attributes(0, attributes) }
}

unsafe extern "C" fn range_push_a(message: *const c_char) -> c_int {
    // SAFETY: NVTX passes the caller's NUL-terminated message (or null).
    let message = unsafe { intern_narrow(message, false) };
    push(0, message, 0, None, None)
}

unsafe extern "C" fn range_push_w(message: *const ffi::wchar_t) -> c_int {
    // SAFETY: NVTX passes the caller's NUL-terminated wide message (or null).
    let message = unsafe { intern_wide(message, false) };
    push(0, message, 0, None, None)
}

unsafe extern "C" fn range_pop() -> c_int {
    pop(0)
}

/// Stream names given through `nvtxNameCuStreamA`: (stream handle, name), in call order.
static STREAM_NAMES: Mutex<Vec<(usize, String)>> = Mutex::new(Vec::new());

/// The names CUDA streams were given through `nvtxNameCuStreamA` so far, with their handles.
#[allow(dead_code)]
pub fn stream_names() -> Vec<(usize, String)> {
    STREAM_NAMES.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

unsafe extern "C" fn name_cu_stream_a(stream: ffi::nvtx_CUstream, name: *const c_char) {
    if name.is_null() {
        return;
    }
    // SAFETY: NVTX passes the caller's NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
    STREAM_NAMES.lock().unwrap_or_else(|p| p.into_inner()).push((stream as usize, name));
}

/// Thread names given through `nvtxNameOsThreadA`: (OS thread id, name), in call order.
static THREAD_NAMES: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

/// The names threads were given through `nvtxNameOsThreadA` so far, with their OS thread ids.
#[allow(dead_code)]
pub fn thread_names() -> Vec<(u32, String)> {
    THREAD_NAMES.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

unsafe extern "C" fn name_os_thread_a(thread: u32, name: *const c_char) {
    if name.is_null() {
        return;
    }
    // SAFETY: NVTX passes the caller's NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
    THREAD_NAMES.lock().unwrap_or_else(|p| p.into_inner()).push((thread, name));
}

/// Writes `f` into slot `id` of a module's function table, if the table has that slot.
///
/// # Safety
/// `table` and `size` come from `GetModuleFunctionTable`, and `F` is the slot's real type (the
/// bindgen `*_impl_fntype` of callback `id`).
unsafe fn set_slot<F>(table: ffi::NvtxFunctionTable, size: c_uint, id: u32, f: F) -> bool {
    if id == 0 || id >= size {
        return false;
    }
    // SAFETY: `table` has entries `0..=size` (NVTX reports one less than the array's length) and
    // `id < size`.
    let slot = unsafe { table.add(id as usize).read() };
    if slot.is_null() {
        return false;
    }
    // SAFETY: the slot points to NVTX's global function pointer of type `F`, per the contract;
    // NVTX is inside its one-time initialization, so no other thread reads it concurrently.
    unsafe { slot.cast::<F>().write(f) };
    true
}

/// Fetches a module's function table: `(table, size)`, or `None` if NVTX has no such module.
///
/// # Safety
/// `get_module` is NVTX's `GetModuleFunctionTable`.
unsafe fn module_table(
    get_module: unsafe extern "C" fn(ffi::NvtxCallbackModule, *mut ffi::NvtxFunctionTable, *mut c_uint) -> c_int,
    module: ffi::NvtxCallbackModule,
) -> Option<(ffi::NvtxFunctionTable, c_uint)> {
    let mut table: ffi::NvtxFunctionTable = std::ptr::null_mut();
    let mut size: c_uint = 0;
    // SAFETY: both out-pointers are valid for writes.
    let ok = unsafe { get_module(module, &mut table, &mut size) };
    (ok != 0 && !table.is_null()).then_some((table, size))
}

/// NVTX's call into the tool: installs our functions, returns non-zero on success.
unsafe extern "C" fn initialize(get_export_table: ffi::NvtxGetExportTableFunc_t) -> c_int {
    use ffi::NvtxCallbackIdCore as Core;
    use ffi::NvtxCallbackIdCore2 as Core2;
    use ffi::NvtxCallbackModule as Module;

    let Some(get_export_table) = get_export_table else {
        return 0;
    };
    // SAFETY: NVTX's export-table getter accepts any id and returns null for unknown ones.
    let callbacks = unsafe { get_export_table(ffi::NvtxExportTableID::NVTX_ETID_CALLBACKS as u32) }
        .cast::<ffi::NvtxExportTableCallbacks>();
    // SAFETY: for NVTX_ETID_CALLBACKS, NVTX returns null or a pointer to its static table.
    let Some(callbacks) = (unsafe { callbacks.as_ref() }) else {
        return 0;
    };
    if callbacks.struct_size < std::mem::size_of::<ffi::NvtxExportTableCallbacks>() {
        return 0;
    }
    let Some(get_module) = callbacks.GetModuleFunctionTable else {
        return 0;
    };
    // SAFETY: `get_module` is NVTX's `GetModuleFunctionTable`.
    let tables = unsafe {
        (module_table(get_module, Module::NVTX_CB_MODULE_CORE), module_table(get_module, Module::NVTX_CB_MODULE_CORE2))
    };
    let (Some((core, core_size)), Some((core2, core2_size))) = tables else {
        return 0;
    };

    // SAFETY (all `set_slot` calls below): the tables come from `GetModuleFunctionTable`, and each
    // explicit type argument is bindgen's slot type for that callback id, which our function
    // must match to compile.
    let installed = unsafe {
        [
            set_slot::<ffi::nvtxRangePushA_impl_fntype>(
                core,
                core_size,
                Core::NVTX_CBID_CORE_RangePushA as u32,
                Some(range_push_a),
            ),
            set_slot::<ffi::nvtxRangePushW_impl_fntype>(
                core,
                core_size,
                Core::NVTX_CBID_CORE_RangePushW as u32,
                Some(range_push_w),
            ),
            set_slot::<ffi::nvtxRangePushEx_impl_fntype>(
                core,
                core_size,
                Core::NVTX_CBID_CORE_RangePushEx as u32,
                Some(range_push_ex),
            ),
            set_slot::<ffi::nvtxRangePop_impl_fntype>(
                core,
                core_size,
                Core::NVTX_CBID_CORE_RangePop as u32,
                Some(range_pop),
            ),
            set_slot::<ffi::nvtxNameOsThreadA_impl_fntype>(
                core,
                core_size,
                Core::NVTX_CBID_CORE_NameOsThreadA as u32,
                Some(name_os_thread_a),
            ),
            set_slot::<ffi::nvtxDomainCreateA_impl_fntype>(
                core2,
                core2_size,
                Core2::NVTX_CBID_CORE2_DomainCreateA as u32,
                Some(domain_create_a),
            ),
            set_slot::<ffi::nvtxDomainCreateW_impl_fntype>(
                core2,
                core2_size,
                Core2::NVTX_CBID_CORE2_DomainCreateW as u32,
                Some(domain_create_w),
            ),
            set_slot::<ffi::nvtxDomainRegisterStringA_impl_fntype>(
                core2,
                core2_size,
                Core2::NVTX_CBID_CORE2_DomainRegisterStringA as u32,
                Some(domain_register_string_a),
            ),
            set_slot::<ffi::nvtxDomainRegisterStringW_impl_fntype>(
                core2,
                core2_size,
                Core2::NVTX_CBID_CORE2_DomainRegisterStringW as u32,
                Some(domain_register_string_w),
            ),
            set_slot::<ffi::nvtxDomainRangePushEx_impl_fntype>(
                core2,
                core2_size,
                Core2::NVTX_CBID_CORE2_DomainRangePushEx as u32,
                Some(domain_range_push_ex),
            ),
            set_slot::<ffi::nvtxDomainRangePop_impl_fntype>(
                core2,
                core2_size,
                Core2::NVTX_CBID_CORE2_DomainRangePop as u32,
                Some(domain_range_pop),
            ),
        ]
    };
    if installed.contains(&false) {
        return 0;
    }
    // Stream names, where NVTX was built with its CUDA module (optional: nothing else needs it).
    // SAFETY: as above, for the CUDA module's table and its `NameCuStreamA` slot type.
    unsafe {
        if let Some((cuda, cuda_size)) = module_table(get_module, Module::NVTX_CB_MODULE_CUDA) {
            set_slot::<ffi::nvtxNameCuStreamA_fakeimpl_fntype>(
                cuda,
                cuda_size,
                ffi::NvtxCallbackIdCuda::NVTX_CBID_CUDA_NameCuStreamA as u32,
                Some(name_cu_stream_a),
            );
        }
    }
    INSTALLED.store(true, Ordering::Release);
    1
}
