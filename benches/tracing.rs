//! `tracing` interop, with no NVTX tool attached:
//!
//! (a) the `TracingSpan` guard's enter and exit with no subscriber, and with a subscriber that
//! does not want the span (its level is filtered out), next to an empty scope;
//! (b) one span entered and exited (and one created, entered, exited and closed) under a
//! `tracing_subscriber` registry with boundscope's `NvtxLayer`, with the `nvtx` crate's own
//! layer (feature `tracing`), and with no layer at all.
//!
//! Figures it exists to show: (a) about 1 ns per scope over a no-op guard (the two virtual
//! calls every prepared guard costs); (b) boundscope's layer at least 5x cheaper per span
//! enter+exit than the `nvtx` crate's (measured 5.1-5.2x, with exits matched to span ids and a
//! fast path for spans that exit in order). The ratios are measured side by side,
//! interleaved in rounds, and printed after criterion's figures.
//!
//! `cargo bench --bench tracing`

use std::hint::black_box;
use std::time::Instant;

use boundscope::guards::{Guard, GuardSite, Level, NvtxLayer, ScopedGuard, TracingSpan};
use criterion::Criterion;
use tracing::level_filters::LevelFilter;
use tracing::Dispatch;
use tracing_subscriber::layer::SubscriberExt;

fn prepared_span() -> Box<dyn ScopedGuard> {
    let site = GuardSite::new("bench op", Level::Op, "cpu_reference", 1);
    TracingSpan::new().prepare(&site).expect("prepares")
}

fn boundscope_layer() -> Dispatch {
    Dispatch::new(tracing_subscriber::registry().with(NvtxLayer::new()))
}

fn nvtx_crate_layer() -> Dispatch {
    Dispatch::new(tracing_subscriber::registry().with(nvtx::tracing::NvtxLayer::default()))
}

fn no_layer() -> Dispatch {
    Dispatch::new(tracing_subscriber::registry())
}

/// The floor of every prepared guard entered through `dyn ScopedGuard`: two virtual calls.
struct NoOp;
impl ScopedGuard for NoOp {
    fn on_enter(&self) -> u64 {
        0
    }
    fn on_exit(&self, _entered: u64) {}
}

fn guard_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("tracing_span_guard");
    let guard = prepared_span();
    let no_op: Box<dyn ScopedGuard> = Box::new(NoOp);
    group.bench_function("empty scope", |b| b.iter(|| black_box(1u64)));
    group.bench_function("no-op guard (two virtual calls)", |b| b.iter(|| no_op.in_scope(|| black_box(1u64))));
    group.bench_function("no subscriber", |b| b.iter(|| guard.in_scope(|| black_box(1u64))));
    let disabled = Dispatch::new(tracing_subscriber::registry().with(LevelFilter::ERROR));
    tracing::dispatcher::with_default(&disabled, || {
        let guard = prepared_span();
        group.bench_function("subscriber that filters it out", |b| b.iter(|| guard.in_scope(|| black_box(1u64))));
    });
    group.finish();
}

fn layer_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("tracing_layers");
    for (name, dispatch) in [
        ("boundscope NvtxLayer", boundscope_layer()),
        ("nvtx crate NvtxLayer", nvtx_crate_layer()),
        ("no layer", no_layer()),
    ] {
        tracing::dispatcher::with_default(&dispatch, || {
            let span = tracing::info_span!("bench span");
            group.bench_function(format!("{name}: enter+exit"), |b| b.iter(|| span.in_scope(|| black_box(1u64))));
            group.bench_function(format!("{name}: new+enter+exit+close"), |b| {
                b.iter(|| tracing::info_span!("bench span").in_scope(|| black_box(1u64)))
            });
        });
    }
    group.finish();
}

/// Nanoseconds per span enter+exit under `dispatch`, over `n` spans.
fn enter_exit_ns(dispatch: &Dispatch, n: u32) -> f64 {
    tracing::dispatcher::with_default(dispatch, || {
        let span = tracing::info_span!("bench span");
        let start = Instant::now();
        for _ in 0..n {
            span.in_scope(|| black_box(1u64));
        }
        start.elapsed().as_nanos() as f64 / f64::from(n)
    })
}

/// Nanoseconds per scope of the guard with no subscriber, over `n` scopes.
fn guard_ns(guard: &dyn ScopedGuard, n: u32) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        guard.in_scope(|| black_box(1u64));
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

fn ratios() {
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // The subscribers of the criterion runs are gone: callsites ask again who wants them.
    tracing::callsite::rebuild_interest_cache();
    let guard = prepared_span();
    let no_op: Box<dyn ScopedGuard> = Box::new(NoOp);
    let (mut g, mut n) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        g.push(guard_ns(&*guard, 2_000_000));
        n.push(guard_ns(&*no_op, 2_000_000));
    }
    let (ours, theirs) = (boundscope_layer(), nvtx_crate_layer());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        a.push(enter_exit_ns(&ours, 200_000));
        b.push(enter_exit_ns(&theirs, 200_000));
    }
    let (a, b, g, n) = (median(&mut a), median(&mut b), median(&mut g), median(&mut n));
    println!(
        "span enter+exit, no NVTX tool: boundscope NvtxLayer {a:.1} ns, nvtx crate NvtxLayer {b:.1} ns: {:.1}x cheaper",
        b / a
    );
    println!(
        "TracingSpan guard, no subscriber: {g:.2} ns per scope (enter+exit); a no-op guard {n:.2} ns: {:.2} ns more",
        g - n
    );
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    guard_benches(&mut criterion);
    layer_benches(&mut criterion);
    criterion.final_summary();
    ratios();
}
