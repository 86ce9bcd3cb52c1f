//! The in-process NVTX capture (`common::nvtx_capture`) really attaches through NVTX's static
//! injection and records pushes and pops, per thread, with domains, messages and payloads.

mod common;

use std::sync::{Barrier, Mutex, MutexGuard, PoisonError};
use std::thread;

use common::allocations::{allocations_during, CountingAllocator};
use common::nvtx_capture::{self, NvtxEvent, NvtxEventKind};
use nvtx::sys;

/// `take_events` drains every thread's log; tests in this file that read their own thread's log
/// hold this lock so that the draining test cannot steal their events.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts the current thread's allocations while counting is on, as in
/// `steady_state_runs_allocate_nothing`: the capture must not disturb that test.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Event attributes with a registered message, a u64 payload, a category and an ARGB color, built
/// field by field as the `nvtx` crate's `EventAttributes::encode` does.
fn registered_attributes(message: sys::StringHandle, payload: u64, category: u32, color: u32) -> sys::EventAttributes {
    sys::EventAttributes {
        version: sys::NVTX_VERSION as u16,
        size: sys::NVTX_EVENT_ATTRIBUTES_SIZE as u16,
        category,
        colorType: i32::from(sys::ColorType::NVTX_COLOR_ARGB),
        color,
        payloadType: i32::from(sys::PayloadType::NVTX_PAYLOAD_TYPE_UNSIGNED_INT64),
        reserved0: 0,
        payload: sys::PayloadValue { ullValue: payload },
        messageType: i32::from(sys::MessageType::NVTX_MESSAGE_TYPE_REGISTERED),
        message: sys::MessageValue { registered: message.into() },
    }
}

fn push(domain: Option<&str>, message: &str, category: u32, payload: Option<u64>, color: Option<u32>) -> NvtxEvent {
    NvtxEvent {
        kind: NvtxEventKind::Push,
        domain: domain.map(str::to_owned),
        message: Some(message.to_owned()),
        category,
        payload,
        color,
        details: None,
        thread: thread::current().id(),
    }
}

fn pop(domain: Option<&str>) -> NvtxEvent {
    NvtxEvent {
        kind: NvtxEventKind::Pop,
        domain: domain.map(str::to_owned),
        message: None,
        category: 0,
        payload: None,
        color: None,
        details: None,
        thread: thread::current().id(),
    }
}

fn assert_installed() {
    assert!(
        nvtx_capture::is_installed(),
        "NVTX did not call the static injection (is NVTX_INJECTION64_PATH set, e.g. under nsys?)"
    );
}

#[test]
fn nvtx_calls_the_static_injection() {
    assert_installed();
}

#[test]
fn captures_a_registered_domain_range_with_a_nested_ascii_range() {
    let _serial = serial();
    assert_installed();
    let domain = sys::domain_create_ascii(c"boundscope-test");
    let name = sys::domain_register_string_ascii(domain, c"outer op");
    let attributes = registered_attributes(name, 42, 7, 0xFF00_FF00);

    assert_eq!(sys::domain_range_push_ex(domain, &attributes), 0, "level of the first range in the domain");
    assert_eq!(sys::range_push_ascii(c"inner"), 0, "the default domain has its own levels");
    assert_eq!(sys::range_pop(), 0, "level of the range being ended");
    assert_eq!(sys::domain_range_pop(domain), 0);

    let domain_name = Some("boundscope-test");
    assert_eq!(
        nvtx_capture::events_on_current_thread(),
        vec![
            push(domain_name, "outer op", 7, Some(42), Some(0xFF00_FF00)),
            push(None, "inner", 0, None, None),
            pop(None),
            pop(domain_name),
        ]
    );
    assert!(nvtx_capture::events_on_current_thread().is_empty(), "the log was drained");
}

#[test]
fn levels_follow_nvtx_semantics() {
    let _serial = serial();
    assert_installed();
    let domain = sys::domain_create_ascii(c"boundscope-test-levels");
    let name = sys::domain_register_string_ascii(domain, c"level");
    let attributes = registered_attributes(name, 0, 0, 0);

    let pushes: Vec<i32> = (0..3).map(|_| sys::domain_range_push_ex(domain, &attributes)).collect();
    assert_eq!(pushes, [0, 1, 2]);
    let pops: Vec<i32> = (0..3).map(|_| sys::domain_range_pop(domain)).collect();
    assert_eq!(pops, [2, 1, 0]);
    assert_eq!(sys::domain_range_pop(domain), -1, "popping with no open range is an error");

    let events = nvtx_capture::events_on_current_thread();
    let kinds: Vec<_> = events.iter().map(|e| e.kind.clone()).collect();
    use NvtxEventKind::{Pop, Push};
    assert_eq!(kinds, [Push, Push, Push, Pop, Pop, Pop, Pop], "the unmatched pop is logged too");
    assert!(events.iter().all(|e| e.domain.as_deref() == Some("boundscope-test-levels")));
}

#[test]
fn four_threads_each_see_only_their_own_events() {
    let _serial = serial();
    assert_installed();
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 50;
    let barrier = Barrier::new(THREADS as usize);
    thread::scope(|scope| {
        for t in 0..THREADS {
            let barrier = &barrier;
            scope.spawn(move || {
                let domain = sys::domain_create_ascii(c"boundscope-test");
                let label = std::ffi::CString::new(format!("thread {t}")).unwrap();
                let name = sys::domain_register_string_ascii(domain, &label);
                let inner = std::ffi::CString::new(format!("inner {t}")).unwrap();
                barrier.wait();
                for round in 0..ROUNDS {
                    let attributes = registered_attributes(name, t * 1000 + round, t as u32, 0xFF00_0000 | t as u32);
                    assert_eq!(sys::domain_range_push_ex(domain, &attributes), 0);
                    assert_eq!(sys::range_push_ascii(&inner), 0);
                    assert_eq!(sys::range_pop(), 0);
                    assert_eq!(sys::domain_range_pop(domain), 0);
                    if round % 10 == 0 {
                        thread::yield_now();
                    }
                }
                let events = nvtx_capture::events_on_current_thread();
                let domain_name = Some("boundscope-test");
                let expected: Vec<NvtxEvent> = (0..ROUNDS)
                    .flat_map(|round| {
                        [
                            push(
                                domain_name,
                                &format!("thread {t}"),
                                t as u32,
                                Some(t * 1000 + round),
                                Some(0xFF00_0000 | t as u32),
                            ),
                            push(None, &format!("inner {t}"), 0, None, None),
                            pop(None),
                            pop(domain_name),
                        ]
                    })
                    .collect();
                assert_eq!(events, expected, "thread {t}");
            });
        }
    });
}

#[test]
fn take_events_drains_every_thread_in_call_order() {
    let _serial = serial();
    assert_installed();
    nvtx_capture::take_events();
    let domain = sys::domain_create_ascii(c"boundscope-test-take");
    let name = sys::domain_register_string_ascii(domain, c"from a finished thread");
    let other = thread::spawn(move || {
        sys::domain_range_push_ex(domain, &registered_attributes(name, 5, 0, 0));
        sys::domain_range_pop(domain);
        thread::current().id()
    })
    .join()
    .unwrap();
    sys::range_push_ascii(c"here");
    sys::range_pop();

    let events: Vec<_> = nvtx_capture::take_events()
        .into_iter()
        .filter(|e| e.thread == other || e.thread == thread::current().id())
        .collect();
    let summary: Vec<_> = events.iter().map(|e| (e.kind.clone(), e.message.clone(), e.thread == other)).collect();
    assert_eq!(
        summary,
        [
            (NvtxEventKind::Push, Some("from a finished thread".to_owned()), true),
            (NvtxEventKind::Pop, None, true),
            (NvtxEventKind::Push, Some("here".to_owned()), false),
            (NvtxEventKind::Pop, None, false),
        ]
    );
    assert!(nvtx_capture::events_on_current_thread().is_empty());
}

#[test]
fn steady_state_capture_allocates_nothing() {
    let _serial = serial();
    assert_installed();
    let domain = sys::domain_create_ascii(c"boundscope-test-alloc");
    let name = sys::domain_register_string_ascii(domain, c"steady");
    let attributes = registered_attributes(name, 1, 2, 3);
    let round = || {
        sys::domain_range_push_ex(domain, &attributes);
        sys::range_push_ascii(c"steady inner");
        sys::range_pop();
        sys::domain_range_pop(domain);
    };
    round(); // warm-up: the thread's log, its levels and the ASCII message's interned copy
    assert_eq!(allocations_during(|| (0..1000).for_each(|_| round())), 0);
    let events = nvtx_capture::events_on_current_thread();
    assert_eq!(events.len(), 4 * 1001);
    assert_eq!(nvtx_capture::dropped_on_current_thread(), 0);
}

#[test]
fn a_full_log_drops_events_instead_of_growing() {
    let _serial = serial();
    assert_installed();
    nvtx_capture::events_on_current_thread();
    let extra = 10;
    for _ in 0..(nvtx_capture::LOG_CAPACITY + extra) / 2 {
        sys::range_push_ascii(c"many");
        sys::range_pop();
    }
    assert_eq!(nvtx_capture::events_on_current_thread().len(), nvtx_capture::LOG_CAPACITY);
    assert_eq!(nvtx_capture::dropped_on_current_thread(), extra as u64);
    assert_eq!(nvtx_capture::dropped_on_current_thread(), 0, "reading the count resets it");
}
