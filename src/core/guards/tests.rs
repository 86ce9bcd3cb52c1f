//! Attaching, carrying through passes, dropping with reasons, and the profiling switch.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::*;
use crate::core::ir::{prims, Arena, BoundSymbolId, Registry, Trace, TraceBuilder};
use crate::core::passes::{DeadCodeElimination, Decompose, Pass};
use crate::core::plan::{Executor, Kernel, OpView, Plan};
use crate::core::tensor::Tensor;
use crate::error::Error;
use crate::executors::CpuReference;

/// `t0 -> exp (dead) ; softmax(t0) -> output`.
fn trace<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[2, 3]).unwrap();
    b.exp(x).unwrap();
    let y = b.softmax(x).unwrap();
    b.output(y).unwrap();
    b.finish().unwrap()
}

#[test]
fn bad_attachments_are_typed_errors() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    let far = BoundSymbolId::from_index(9);
    assert!(matches!(
        t.attach_guard(Selection::Op(far), Recorder::new()),
        Err(Error::InvalidBoundSymbol { index: 9, len: 2 })
    ));
    assert!(matches!(
        t.attach_guard(Selection::Positions(1..5), Recorder::new()),
        Err(Error::InvalidBoundSymbol { .. })
    ));
    let err = t.attach_guard(Selection::Named("softmx"), Recorder::new()).unwrap_err();
    assert!(err.to_string().contains("did you mean `softmax`"), "{err}");
    let exp = BoundSymbolId::from_index(0);
    assert!(matches!(t.attach_subsymbol_guard(exp, 1, Recorder::new()), Err(Error::DepthOutOfRange { max: 0, .. })));
    let softmax = BoundSymbolId::from_index(1);
    assert!(matches!(t.attach_subsymbol_guard(softmax, 0, Recorder::new()), Err(Error::DepthOutOfRange { .. })));
    assert!(matches!(NvtxRange::new().label(""), Err(Error::InvalidLabel { .. })));
    assert!(matches!(NvtxRange::new().domain("a\0"), Err(Error::InvalidLabel { .. })));
    // Nothing was attached by the failed calls.
    assert_eq!(t.guard_attachment_count(), 0);
}

#[test]
fn position_ranges_name_what_is_wrong_with_them() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry); // two bound symbols
    #[allow(clippy::reversed_empty_ranges)]
    let err = t.attach_guard(Selection::Positions(3..1), Recorder::new()).unwrap_err();
    assert!(matches!(err, Error::ReversedRange { start: 3, end: 1 }), "{err:?}");
    assert!(!err.to_string().contains("no bound symbol"), "{err}");
    assert!(err.to_string().contains("1..3"), "{err}");
    // Past the end: the first position that does not exist.
    let err = t.attach_guard(Selection::Positions(1..5), Recorder::new()).unwrap_err();
    assert!(matches!(err, Error::InvalidBoundSymbol { index: 2, len: 2 }), "{err:?}");
    assert!(matches!(
        t.attach_guard(Selection::Positions(4..4), Recorder::new()),
        Err(Error::InvalidBoundSymbol { index: 4, len: 2 })
    ));
    // An empty range inside the trace selects nothing, as slicing does.
    assert_eq!(t.attach_guard(Selection::Positions(2..2), Recorder::new()).unwrap(), 0);
    assert_eq!(t.attach_guard(Selection::Positions(0..2), Recorder::new()).unwrap(), 2);
}

#[test]
fn passes_carry_or_drop_with_reason() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    let timer = HostTimer::new();
    t.attach_guard(Selection::All, timer.clone()).unwrap();
    let fragile = ClosureGuard::new(|| {}, || {}).with_policy(GuardPolicy::DropWithReason("it wraps one op"));
    t.attach_guard(Selection::Named("softmax"), fragile).unwrap();
    assert_eq!(t.guard_kinds_at(BoundSymbolId::from_index(1)), vec![GuardKind::HostTimer, GuardKind::Closure]);

    let decomposed = Decompose.run(&t, &arena).unwrap();
    // The timer now surrounds softmax's five prims; the closure guard was dropped, with why.
    assert_eq!(decomposed.guard_attachment_count(), 2);
    let dropped = decomposed.dropped_guards();
    assert_eq!(dropped.len(), 1);
    assert_eq!(dropped[0].kind, GuardKind::Closure);
    assert!(dropped[0].reason.contains("decomposed") && dropped[0].reason.contains("it wraps one op"));
    assert!(decomposed.to_string().contains("@timer(softmax: 5 ops)"));

    let live = DeadCodeElimination.run(&decomposed, &arena).unwrap();
    assert_eq!(live.guard_attachment_count(), 1);
    let dropped = live.dropped_guards();
    assert_eq!(dropped.len(), 2);
    assert_eq!(dropped[1].label, "exp");
    assert!(dropped[1].reason.contains("dead code"), "{}", dropped[1].reason);

    let plan = Plan::compile(&live, &[CpuReference::shared()]).unwrap();
    assert_eq!(plan.dropped_guards().len(), 2);
    plan.run(&[&Tensor::zeros(&[2, 3])]).unwrap();
    let stats = timer.stats();
    assert_eq!((stats.len(), stats[0].label.as_str(), stats[0].count), (1, "softmax", 1));
}

/// Claims `softmax` whole, so its subsymbols never run separately.
struct WholeSoftmax;

impl Executor for WholeSoftmax {
    fn name(&self) -> &str {
        "whole_softmax"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::SOFTMAX
    }
    fn compile(&self, _op: &OpView<'_>) -> crate::Result<Box<dyn Kernel>> {
        Ok(crate::kernel_fn(|_, outputs| {
            outputs[0].values_mut::<f32>()?.fill(0.5);
            Ok(())
        }))
    }
}

#[test]
fn subsymbol_guards_of_a_composite_run_whole_are_reported() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    let recorder = Recorder::new();
    t.attach_subsymbol_guard(BoundSymbolId::from_index(1), 1, recorder.clone()).unwrap();
    t.attach_guard(Selection::Named("softmax"), recorder.clone()).unwrap();
    let plan = Plan::compile(&t, &[Arc::new(WholeSoftmax), CpuReference::shared()]).unwrap();
    assert_eq!(plan.dropped_guards().len(), 1);
    assert!(plan.dropped_guards()[0].reason.contains("whole"));
    plan.run(&[&Tensor::zeros(&[2, 3])]).unwrap();
    assert_eq!(recorder.len(), 1); // softmax itself, as one op

    // Decomposed on the CPU, the five subsymbols nest inside softmax's range.
    let plan = Plan::compile(&t, &[CpuReference::shared()]).unwrap();
    recorder.clear();
    plan.run(&[&Tensor::zeros(&[2, 3])]).unwrap();
    let ranges = recorder.ranges();
    assert_eq!(ranges.len(), 6);
    let softmax = ranges.iter().find(|r| r.label.as_ref() == "softmax").unwrap();
    assert_eq!(softmax.level, Level::Op);
    for r in ranges.iter().filter(|r| r.level == Level::Subsymbol) {
        assert_eq!(r.parent, Some(softmax.id));
    }
}

#[test]
fn profiling_switch_spares_non_profiling_guards() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    let entries = Arc::new(AtomicUsize::new(0));
    let counter = entries.clone();
    t.attach_guard(Selection::All, ClosureGuard::new(move || _ = counter.fetch_add(1, Ordering::Relaxed), || {}))
        .unwrap();
    let timer = HostTimer::new();
    t.attach_trace_guard(timer.clone()).unwrap();
    let plan = Plan::compile(&t, &[CpuReference::shared()]).unwrap();
    plan.set_profiling(false);
    plan.run(&[&Tensor::zeros(&[2, 3])]).unwrap();
    assert_eq!(entries.load(Ordering::Relaxed), 2);
    assert!(timer.stats().is_empty());
    plan.set_profiling(true);
    plan.run(&[&Tensor::zeros(&[2, 3])]).unwrap();
    assert_eq!(entries.load(Ordering::Relaxed), 4);
    assert_eq!(timer.stats()[0].label, "trace");
}

#[test]
fn chrome_trace_has_one_complete_event_per_range() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    let recorder = Recorder::new();
    t.attach_trace_guard(recorder.clone()).unwrap();
    t.attach_guard(Selection::All, recorder.clone()).unwrap();
    let plan = Plan::compile(&t, &[CpuReference::shared()]).unwrap();
    plan.run(&[&Tensor::zeros(&[2, 3])]).unwrap();
    let json = recorder.to_chrome_trace();
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed["traceEvents"].as_array().map(Vec::len), Some(3));
    assert_eq!(parsed["otherData"]["dropped_ranges"], 0);
    assert_eq!(json.matches("\"ph\":\"X\"").count(), 3);
    assert!(json.contains("\"cat\":\"trace\"") && json.contains("\"name\":\"softmax\""));
}

#[test]
fn a_full_recorder_drops_and_counts_ranges_and_keeps_no_orphans() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    let recorder = Recorder::with_capacity(4);
    // Clears the recorder as each op begins, inside the run's range (entered before the ops').
    let clearing = recorder.clone();
    let clear_now = Arc::new(AtomicBool::new(false));
    let armed = clear_now.clone();
    t.attach_trace_guard(recorder.clone()).unwrap();
    t.attach_guard(
        Selection::All,
        ClosureGuard::new(
            move || {
                if armed.load(Ordering::Relaxed) {
                    clearing.clear();
                }
            },
            || {},
        ),
    )
    .unwrap();
    t.attach_guard(Selection::All, recorder.clone()).unwrap();
    let plan = Plan::compile(&t, &[CpuReference::shared()]).unwrap();
    let x = Tensor::zeros(&[2, 3]);
    let kept_parents = |ranges: &[crate::guards::RecordedRange]| {
        ranges.iter().all(|r| r.parent.is_none_or(|p| ranges.iter().any(|q| q.id == p)))
    };
    // The run's range and its two ops': 3 of 4 kept.
    plan.run(&[&x]).unwrap();
    assert_eq!((recorder.len(), recorder.dropped_ranges()), (3, 0));
    // The run's range takes the last place; its ops are dropped.
    plan.run(&[&x]).unwrap();
    assert_eq!((recorder.len(), recorder.dropped_ranges()), (4, 2));
    // Full: all three dropped.
    plan.run(&[&x]).unwrap();
    assert_eq!((recorder.len(), recorder.dropped_ranges()), (4, 5));
    assert!(kept_parents(&recorder.ranges()));
    // The run's range is dropped (still full); the ops' ranges begin after a clear, with room,
    // but inside a dropped range: dropped too, not kept with a parent that is not there.
    clear_now.store(true, Ordering::Relaxed);
    plan.run(&[&x]).unwrap();
    assert_eq!((recorder.len(), recorder.dropped_ranges()), (0, 8));
    // Cleared with room again, nothing open: a whole run is kept.
    clear_now.store(false, Ordering::Relaxed);
    plan.run(&[&x]).unwrap();
    assert_eq!((recorder.len(), recorder.dropped_ranges()), (3, 8));
    assert!(kept_parents(&recorder.ranges()));
    let parsed: serde_json::Value = serde_json::from_str(&recorder.to_chrome_trace()).unwrap();
    assert_eq!(parsed["otherData"]["dropped_ranges"], 8);
}

#[test]
fn a_pass_that_forgets_guards_does_not_lose_them_silently() {
    use crate::core::passes::Pipeline;
    struct Forgetful;
    impl Pass for Forgetful {
        fn name(&self) -> &str {
            "forgetful"
        }
        fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> crate::Result<Trace<'a>> {
            let mut b = TraceBuilder::rewrite(trace, arena);
            for bsym in trace.bound_symbols() {
                b.push_copy(bsym);
            }
            b.finish()
        }
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    t.attach_guard(Selection::All, Recorder::new()).unwrap();
    let out = Pipeline::new().then(Forgetful).run(&t, &arena).unwrap();
    assert_eq!(out.guard_attachment_count(), 0);
    assert_eq!(out.dropped_guards().len(), 2);
    assert!(out.dropped_guards()[0].reason.contains("carry_guards"), "{:?}", out.dropped_guards());
}

#[test]
fn region_ranges_in_another_domain_are_emitted_by_the_runtime() {
    use crate::core::passes::{FuseRegions, ProfileOps};
    use crate::executors::CpuFusion;
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let e = b.exp(x).unwrap();
    let y = b.neg(e).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let profiled = ProfileOps::new().run(&trace, &arena).unwrap();
    let mut fused = FuseRegions::new(CpuFusion::shared()).run(&profiled, &arena).unwrap();
    fused.attach_guard(Selection::All, NvtxRange::new().domain("mine").unwrap()).unwrap();
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    // CpuFusion pushes the `boundscope` range itself; the runtime pushes the one in `mine`.
    assert_eq!(plan.guard_scope_count(), 1);
}

/// A prepared guard's scope whose body panics, the guard's exit panicking too, unwinds with the
/// body's panic: the exit's second panic, during unwinding, aborted the process.
#[test]
fn an_exit_that_panics_while_the_body_unwinds_does_not_abort() {
    let exits = Arc::new(AtomicUsize::new(0));
    let counted = exits.clone();
    let guard = ClosureGuard::new(
        || {},
        move || {
            counted.fetch_add(1, Ordering::Relaxed);
            panic!("the exit panics");
        },
    );
    let site = GuardSite::new("work", Level::Op, "me", 1);
    let prepared = guard.prepare(&site).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepared.in_scope(|| panic!("the body"))));
    let payload = unwound.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the body"));
    assert_eq!(exits.load(Ordering::Relaxed), 1);
    // Outside an unwind the exit's panic is the scope's, as before.
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepared.in_scope(|| 42)));
    assert_eq!(unwound.unwrap_err().downcast_ref::<&str>(), Some(&"the exit panics"));
}

/// `Recorder::write_chrome_trace` names the path it cannot write.
#[test]
fn a_recorder_that_cannot_write_names_the_path() {
    let err = Recorder::new().write_chrome_trace("/nonexistent/dir/trace.json").unwrap_err();
    assert!(matches!(&err, Error::UnwritableFile { path, .. } if path == "/nonexistent/dir/trace.json"), "{err}");
}

/// Two `TracingSpan`s landing on one op merge into the first (one per scope and merge key);
/// where the later one's label is lost, the plan says so in its notes (it said nothing).
#[test]
fn a_labelled_span_merged_into_another_is_a_plan_note() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 2]).unwrap();
    let y = b.matmul(x, x).unwrap();
    b.output(y).unwrap();
    let bare = b.finish().unwrap();
    let mut trace = bare.clone();
    trace.attach_guard(Selection::All, TracingSpan::new()).unwrap();
    trace.attach_guard(Selection::Named("matmul"), TracingSpan::new().label("gemm").unwrap()).unwrap();
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    assert!(plan.notes().iter().any(|n| n.contains("\"gemm\" merged into the one attached first")), "{plan}");
    // Spans of one label merge without a note.
    let mut same = bare.clone();
    same.attach_guard(Selection::All, TracingSpan::new().label("mm").unwrap()).unwrap();
    same.attach_guard(Selection::Named("matmul"), TracingSpan::new().label("mm").unwrap()).unwrap();
    let plan = Plan::compile(&same, &[CpuReference::shared()]).unwrap();
    assert!(!plan.notes().iter().any(|n| n.contains("merged into the one attached first")), "{plan}");
}

/// A custom kind's name is printed as it is where it is one word, and quoted with escapes
/// otherwise: a name with a line break does not split the listing's line.
#[test]
fn custom_kinds_of_more_than_one_word_are_quoted_in_listings() {
    struct Named(&'static str);
    impl Guard for Named {
        fn kind(&self) -> GuardKind {
            GuardKind::Custom(self.0)
        }
        fn prepare(&self, _site: &GuardSite<'_>) -> crate::Result<Box<dyn ScopedGuard>> {
            unreachable!("not run")
        }
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    let plain = t.to_string();
    t.attach_guard(Selection::Named("softmax"), Named("@count")).unwrap();
    t.attach_guard(Selection::Named("softmax"), Named("two words\nand a line")).unwrap();
    t.attach_guard(Selection::Named("softmax"), Named("")).unwrap();
    let listed = t.to_string();
    assert_eq!(listed.lines().count(), plain.lines().count(), "{listed}");
    assert!(listed.contains(r#"@count "two words\nand a line" """#), "{listed}");
}

/// A user's guard that reports an NVTX domain is held to the rule `NvtxRange::domain` keeps:
/// an empty name, or one with a NUL, is refused when it is attached, on every way to attach.
#[test]
fn users_guards_with_a_bad_nvtx_domain_name_are_refused() {
    struct InDomain(&'static str);
    impl Guard for InDomain {
        fn kind(&self) -> GuardKind {
            GuardKind::Custom("@range")
        }
        fn nvtx_domain(&self) -> Option<&str> {
            Some(self.0)
        }
        fn prepare(&self, _site: &GuardSite<'_>) -> crate::Result<Box<dyn ScopedGuard>> {
            unreachable!("not run")
        }
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut t = trace(&arena, &registry);
    for bad in ["", "a\0b"] {
        let err = t.attach_guard(Selection::All, InDomain(bad)).unwrap_err();
        assert!(matches!(err, Error::InvalidLabel { .. }), "{err:?}");
        assert!(err.to_string().contains("an NVTX domain name must not"), "{err}");
        assert!(t.attach_trace_guard(InDomain(bad)).is_err());
        assert!(t.attach_subsymbol_guard(BoundSymbolId::from_index(1), 1, InDomain(bad)).is_err());
    }
    assert_eq!(t.guard_attachment_count(), 0);
    assert_eq!(t.attach_guard(Selection::All, InDomain("mine")).unwrap(), 2);
}
