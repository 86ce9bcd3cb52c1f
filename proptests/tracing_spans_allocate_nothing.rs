//! `tracing` interop: boundscope's `NvtxLayer` turns a user's spans into NVTX push/pop ranges
//! labelled with the span's name and allocates nothing per span in steady state; the
//! `TracingSpan` guard allocates nothing per scope, opens no span without a subscriber, and its
//! spans reach NVTX through the layer; spans exited out of order pop their own domains.

mod common;

use std::sync::Mutex;

use boundscope::executors::CpuReference;
use boundscope::guards::{NvtxLayer, Selection, TracingSpan};
use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
use common::allocations::{allocations_during, CountingAllocator};
use common::nvtx_capture::{self, NvtxEventKind};
use common::ranges::pushes_of;
use tracing_subscriber::layer::SubscriberExt;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// `tracing` caches interest per callsite across all subscribers of the process: the tests run
/// one at a time so that one test's subscriber does not change what another measures.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// `(domain, label)` of every push the capture saw on this thread since the last call.
fn pushes() -> Vec<(String, String)> {
    pushes_of(&nvtx_capture::events_on_current_thread()).into_iter().map(|p| (p.domain, p.label)).collect()
}

/// The layer pushes one range per span entered, named after the span, in its domain, and pops
/// it on exit; after a warm-up, a thousand spans created, entered, exited and closed allocate
/// nothing.
#[test]
fn the_layer_forwards_spans_to_nvtx_and_allocates_nothing_per_span() {
    let _serial = one_at_a_time();
    let subscriber = tracing_subscriber::registry().with(NvtxLayer::new().in_domain("spans").unwrap());
    tracing::subscriber::with_default(subscriber, || {
        let work = || {
            let outer = tracing::info_span!("load batch");
            let _outer = outer.enter();
            let inner = tracing::debug_span!(target: "my_app", "decode");
            inner.in_scope(|| std::hint::black_box(1));
        };
        nvtx_capture::events_on_current_thread();
        work();
        if nvtx_capture::is_installed() {
            let events = nvtx_capture::events_on_current_thread();
            let kinds: Vec<NvtxEventKind> = events.iter().map(|e| e.kind.clone()).collect();
            assert_eq!(kinds, [NvtxEventKind::Push, NvtxEventKind::Push, NvtxEventKind::Pop, NvtxEventKind::Pop]);
            let labels: Vec<(String, String)> = pushes_of(&events).into_iter().map(|p| (p.domain, p.label)).collect();
            assert_eq!(labels, [("spans".into(), "load batch".into()), ("spans".into(), "decode".into())]);
        } else {
            eprintln!("SKIPPED the capture check: the NVTX capture is not this process's NVTX tool");
        }
        for _ in 0..10 {
            work();
        }
        nvtx_capture::events_on_current_thread();
        let allocations = allocations_during(|| {
            for _ in 0..500 {
                work();
            }
        });
        assert_eq!(allocations, 0, "allocations for 1,000 spans");
        nvtx_capture::events_on_current_thread();
    });
}

/// `(kind, domain, label)` of every push and pop the capture saw on this thread since the last
/// call (pops have no label).
fn pushes_and_pops() -> Vec<(NvtxEventKind, String, Option<String>)> {
    nvtx_capture::events_on_current_thread()
        .into_iter()
        .map(|e| (e.kind, e.domain.unwrap_or_default(), e.message))
        .collect()
}

/// Spans exited out of order pop their own NVTX domains: a span whose domain has no later
/// range open pops at once, and one under a later range of its domain pops right after it.
#[test]
fn spans_exited_out_of_order_pop_their_own_domains() {
    let _serial = one_at_a_time();
    if !nvtx_capture::is_installed() {
        eprintln!("SKIPPED: the NVTX capture is not this process's NVTX tool");
        return;
    }
    let subscriber = tracing_subscriber::registry().with(NvtxLayer::new());
    tracing::subscriber::with_default(subscriber, || {
        let push = |domain: &str, label: &str| (NvtxEventKind::Push, domain.to_string(), Some(label.to_string()));
        let pop = |domain: &str| (NvtxEventKind::Pop, domain.to_string(), None);
        let a = tracing::info_span!(target: "dom_a", "a");
        let b = tracing::info_span!(target: "dom_b", "b");
        pushes_and_pops();
        let entered_a = a.enter();
        let entered_b = b.enter();
        drop(entered_a);
        drop(entered_b);
        assert_eq!(pushes_and_pops(), [push("dom_a", "a"), push("dom_b", "b"), pop("dom_a"), pop("dom_b")]);

        // a and c share a domain: a's range stays open under c's and closes right after it.
        let c = tracing::info_span!(target: "dom_a", "c");
        let entered_a = a.enter();
        let entered_b = b.enter();
        let entered_c = c.enter();
        drop(entered_a);
        assert_eq!(pushes_and_pops(), [push("dom_a", "a"), push("dom_b", "b"), push("dom_a", "c")]);
        drop(entered_b);
        assert_eq!(pushes_and_pops(), [pop("dom_b")]);
        drop(entered_c);
        assert_eq!(pushes_and_pops(), [pop("dom_a"), pop("dom_a")]);
    });
}

/// The `nvtx` crate's own layer allocates per span: the count above is a property of ours,
/// not of any layer.
#[test]
fn the_nvtx_crates_layer_allocates_per_span() {
    let _serial = one_at_a_time();
    let subscriber = tracing_subscriber::registry().with(nvtx::tracing::NvtxLayer::default());
    tracing::subscriber::with_default(subscriber, || {
        let work = || tracing::info_span!("load batch").in_scope(|| std::hint::black_box(1));
        for _ in 0..10 {
            work();
        }
        let allocations = allocations_during(|| {
            for _ in 0..100 {
                work();
            }
        });
        assert!(allocations >= 100, "{allocations} allocations for 100 spans");
        nvtx_capture::events_on_current_thread();
    });
}

/// A plan whose ops carry `TracingSpan`s allocates nothing per run without a subscriber, and
/// with `NvtxLayer` its spans become NVTX ranges named after the ops, still allocating nothing
/// per run in steady state.
#[test]
fn tracing_span_guards_allocate_nothing_and_reach_nvtx_through_the_layer() {
    let _serial = one_at_a_time();
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[16]).unwrap();
    let e = b.exp(x).unwrap();
    let y = b.neg(e).unwrap();
    b.output(y).unwrap();
    let mut trace = b.finish().unwrap();
    trace.attach_trace_guard(TracingSpan::new().label("step").unwrap()).unwrap();
    trace.attach_guard(Selection::All, TracingSpan::new().level(tracing::Level::INFO)).unwrap();
    // No subscriber anywhere in the process yet: the callsites' cached interest is "never".
    tracing::callsite::rebuild_interest_cache();
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let input = Tensor::zeros(&[16]);
    let mut workspace = plan.workspace().unwrap();
    plan.run_with(&mut workspace, &[input.view()]).unwrap();
    let quiet = allocations_during(|| {
        for _ in 0..10 {
            plan.run_with(&mut workspace, &[input.view()]).unwrap();
        }
    });
    assert_eq!(quiet, 0, "allocations for 10 runs without a subscriber");

    let subscriber = tracing_subscriber::registry().with(NvtxLayer::new());
    tracing::subscriber::with_default(subscriber, || {
        pushes();
        plan.run_with(&mut workspace, &[input.view()]).unwrap();
        if nvtx_capture::is_installed() {
            let expected: Vec<(String, String)> =
                ["step", "exp", "neg"].iter().map(|l| ("boundscope".to_string(), l.to_string())).collect();
            assert_eq!(pushes(), expected);
        }
        let traced = allocations_during(|| {
            for _ in 0..10 {
                plan.run_with(&mut workspace, &[input.view()]).unwrap();
            }
        });
        assert_eq!(traced, 0, "allocations for 10 runs with spans forwarded to NVTX");
        pushes();
    });
}
