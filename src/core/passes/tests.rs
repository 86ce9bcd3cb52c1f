//! The built-in passes on the inputs a careless user gives them: dead fusible ops, the standard
//! pipeline run after fusion, and guards whose policies differ.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{FuseRegions, Pass, Pipeline};
use crate::core::guards::{ClosureGuard, GuardPolicy, Recorder, Selection};
use crate::core::ir::{prims, Arena, BoundSymbolId, Registry, TraceBuilder};
use crate::core::plan::Plan;
use crate::core::tensor::Tensor;
use crate::executors::{CpuFusion, CpuReference};

#[test]
fn a_dead_fusible_group_is_left_unfused_not_made_a_region_without_outputs() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8]).unwrap();
    let e = b.exp(x).unwrap();
    b.neg(e).unwrap(); // dead: nothing uses it
    let (l, r) = (b.reshape(x, &[2, 4]).unwrap(), b.reshape(x, &[4, 2]).unwrap());
    let y = b.matmul(l, r).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
    for bsym in fused.bound_symbols().iter().filter(|b| b.symbol() == prims::REGION) {
        assert!(!bsym.outputs().is_empty(), "{fused}");
    }
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    let input = Tensor::from_fn(&[8], |i| i as f32);
    let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    assert_eq!(plan.run(&[&input]).unwrap(), reference.run(&[&input]).unwrap());
}

#[test]
fn the_standard_pipeline_after_fusion_keeps_the_regions() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 8]).unwrap();
    let e = b.exp(x).unwrap();
    let n = b.neg(e).unwrap();
    let y = b.softmax(n).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
    let regions =
        |t: &crate::core::ir::Trace<'_>| t.bound_symbols().iter().filter(|b| b.symbol() == prims::REGION).count();
    assert_eq!(regions(&fused), 1, "{fused}");
    let again = Pipeline::standard().run(&fused, &arena).unwrap();
    assert_eq!(regions(&again), 1, "{again}");
    // The softmax after the region was decomposed; the region was not.
    assert!(again.len() > fused.len(), "{again}");
    let plan = Plan::compile(&again, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    assert_eq!(plan.steps_per_executor()[0].0, "cpu_fusion");
}

#[test]
fn keep_holds_an_op_out_of_regions_and_move_to_enclosing_moves_to_the_region() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[16]).unwrap();
    let e = b.exp(x).unwrap();
    let t = b.tanh(e).unwrap();
    let n = b.neg(t).unwrap();
    b.output(n).unwrap();
    let mut trace = b.finish().unwrap();
    let entered = Arc::new(AtomicUsize::new(0));
    let count = entered.clone();
    let on_tanh = ClosureGuard::new(
        move || {
            count.fetch_add(1, Ordering::Relaxed);
        },
        || {},
    );
    assert_eq!(crate::guards::Guard::policy(&on_tanh), GuardPolicy::Keep);
    trace.attach_guard(Selection::Op(BoundSymbolId::from_index(1)), on_tanh).unwrap();
    let recorder = Recorder::new();
    trace.attach_guard(Selection::All, recorder.clone()).unwrap();
    let fused = FuseRegions::new(CpuFusion::shared()).min_ops(1).run(&trace, &arena).unwrap();
    // `tanh` keeps its own guard, so it is not fused: exp and neg are regions of their own.
    let names: Vec<String> = fused.bound_symbols().iter().map(|b| fused.symbol_name(b).to_string()).collect();
    assert_eq!(names, ["CpuFusion0", "tanh", "CpuFusion1"], "{fused}");
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    plan.run(&[&Tensor::zeros(&[16])]).unwrap();
    assert_eq!(entered.load(Ordering::Relaxed), 1);
    // The recorder (MoveToEnclosing) moved to each region: one range per region and for tanh.
    let labels: Vec<String> = recorder.ranges().iter().map(|r| r.label.to_string()).collect();
    assert_eq!(labels, ["CpuFusion0: (exp)", "tanh", "CpuFusion1: (neg)"]);
}

/// A user's executor that runs `softmax` whole (with the CPU reference's decomposed arithmetic,
/// for the test) and says it prefers to.
struct WholeSoftmax;

impl crate::core::plan::Executor for WholeSoftmax {
    fn name(&self) -> &str {
        "whole_softmax"
    }
    fn claims(&self, op: &crate::core::plan::OpView<'_>) -> bool {
        op.symbol().builtin_composite() == Some(prims::SOFTMAX)
    }
    fn prefers_whole(&self, op: &crate::core::plan::OpView<'_>) -> bool {
        self.claims(op)
    }
    fn compile(&self, _op: &crate::core::plan::OpView<'_>) -> crate::Result<Box<dyn crate::core::plan::Kernel>> {
        Ok(crate::core::plan::kernel_fn(|inputs, outputs| {
            let cols = *inputs[0].shape.last().unwrap_or(&1);
            for (row, out) in
                inputs[0].values::<f32>()?.chunks(cols).zip(outputs[0].values_mut::<f32>()?.chunks_mut(cols))
            {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = row.iter().map(|x| (x - m).exp()).sum();
                for (o, x) in out.iter_mut().zip(row) {
                    *o = (x - m).exp() / z;
                }
            }
            Ok(())
        }))
    }
}

/// `DecomposeFor` keeps exactly the composites one of its executors prefers whole (a user's,
/// here, and the CPU reference's `linear`), decomposes the rest, and the plan runs what it kept
/// on that executor; with executors that prefer nothing it is `Decompose`.
#[test]
fn decompose_for_keeps_what_a_users_executor_prefers_whole() {
    use super::DecomposeFor;
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 4]).unwrap();
    let w = b.input(&[4, 4]).unwrap();
    let s = b.softmax(x).unwrap();
    let y = b.linear(s, w, None).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let mine: Arc<dyn crate::core::plan::Executor> = Arc::new(WholeSoftmax);
    let kept = DecomposeFor::new(&[mine.clone(), CpuReference::shared()]).run(&trace, &arena).unwrap();
    let names: Vec<&str> = kept.bound_symbols().iter().map(|b| kept.symbol_name(b)).collect();
    // The CPU reference prefers `linear` whole (one product reading the weight transposed).
    assert_eq!(names, ["softmax", "linear"], "{kept}");
    let plan = Plan::compile(&kept, &[mine, CpuReference::shared()]).unwrap();
    assert!(plan.steps_per_executor().contains(&("whole_softmax", 1)), "{plan}");
    let input = Tensor::from_fn(&[2, 4], |i| i as f32 / 4.0);
    let weight = Tensor::from_fn(&[4, 4], |i| (i % 5) as f32 / 5.0);
    let got = plan.run(&[&input, &weight]).unwrap();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&input, &weight]).unwrap();
    assert!(got[0].max_abs_diff(&expected[0]) < 1e-6);
    let plain = DecomposeFor::new(&[crate::executors::CpuFusion::shared()]).run(&trace, &arena).unwrap();
    assert_eq!(plain.to_string(), super::Decompose.run(&trace, &arena).unwrap().to_string());
}

/// `FoldEpilogues` folds only a `gelu` that is the sole reader of the `linear` just before it,
/// keeps whole-run guards, leaves a trace with per-op guards alone, and the CPU executors run
/// the folded trace exactly as the unfolded one.
#[test]
fn fold_epilogues_folds_only_what_it_may() {
    use super::{DecomposeFor, FoldEpilogues};
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 4]).unwrap();
    let w = b.input(&[4, 4]).unwrap();
    let h1 = b.linear(x, w, None).unwrap();
    let g1 = b.gelu(h1).unwrap(); // folds
    let h2 = b.linear(g1, w, None).unwrap();
    let g2 = b.gelu(h2).unwrap(); // h2 is also an output: stays
    b.output(g2).unwrap();
    b.output(h2).unwrap();
    let mut trace = b.finish().unwrap();
    trace.attach_trace_guard(Recorder::new()).unwrap();
    let folded = FoldEpilogues.run(&trace, &arena).unwrap();
    let names: Vec<&str> = folded.bound_symbols().iter().map(|b| folded.symbol_name(b)).collect();
    assert_eq!(names, ["linear_gelu", "linear", "gelu"], "{folded}");
    assert_eq!(folded.guards.trace_level.len(), 1, "the whole-run guard stays");
    let unfolded = DecomposeFor::new(&[CpuReference::shared()]).run(&folded, &arena).unwrap();
    let input = Tensor::from_fn(&[2, 4], |i| i as f32 / 8.0 - 0.5);
    let weight = Tensor::from_fn(&[4, 4], |i| (i % 3) as f32 / 3.0);
    let run = |t: &crate::core::ir::Trace<'_>| {
        Plan::compile(t, &[CpuReference::shared()]).unwrap().run(&[&input, &weight]).unwrap()
    };
    assert_eq!(run(&unfolded), run(&trace));
    let mut guarded = trace.clone();
    guarded.attach_guard(Selection::Named("gelu"), Recorder::new()).unwrap();
    let untouched = FoldEpilogues.run(&guarded, &arena).unwrap();
    assert_eq!(untouched.to_string(), guarded.to_string());
}

/// A user's executor that fuses what the CPU executors fuse and joins every region it makes
/// ([`Executor::joins`](crate::core::plan::Executor::joins)); only its trace is looked at.
struct Joining;

impl crate::core::plan::Executor for Joining {
    fn name(&self) -> &str {
        "joining"
    }
    fn claims(&self, op: &crate::core::plan::OpView<'_>) -> bool {
        op.is_region_of(self)
    }
    fn fusible(&self, op: &crate::core::plan::OpView<'_>) -> crate::core::plan::Fusible {
        crate::executors::cpu_reference::builtin_fusible(op)
    }
    fn joins(&self, _region: &crate::core::plan::OpView<'_>) -> bool {
        true
    }
}

/// An update `p - lr * exp(p)` of each of `shapes`, the last `dependent` of them reading the
/// first's result; returns the trace.
fn updates<'a>(
    arena: &'a Arena,
    registry: &'a Registry,
    shapes: &[&[usize]],
    dependent: bool,
    scoped: bool,
) -> crate::core::ir::Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let lr = b.input(&[]).unwrap();
    // The sum of the first update, which the last one reads when `dependent`.
    let mut total = None;
    for (i, shape) in shapes.iter().enumerate() {
        let p = b.input(shape).unwrap();
        let step = |b: &mut TraceBuilder<'_>| {
            let e = b.exp(p)?;
            let s = b.mul(e, lr)?;
            b.sub(p, s)
        };
        let mut next = if scoped { b.scope(&format!("p{i}"), step).unwrap() } else { step(&mut b).unwrap() };
        if let (Some(total), true) = (total, i + 1 == shapes.len()) {
            next = b.add(next, total).unwrap();
        }
        if dependent && i == 0 {
            total = Some(b.sum(next).unwrap());
        }
        b.output(next).unwrap();
    }
    b.finish().unwrap()
}

fn region_count(trace: &crate::core::ir::Trace<'_>) -> usize {
    trace.bound_symbols().iter().filter(|b| b.symbol() == prims::REGION).count()
}

/// Independent regions of several shapes become one region for an executor that joins them,
/// keeping every op, input and output; not for one that does not, nor when asked not to.
#[test]
fn independent_regions_join_for_an_executor_that_joins_them() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let shapes: [&[usize]; 4] = [&[3], &[4, 5], &[7], &[4, 5]];
    let trace = updates(&arena, &registry, &shapes, false, false);
    let joined = FuseRegions::new(Arc::new(Joining)).run(&trace, &arena).unwrap();
    assert_eq!((joined.len(), region_count(&joined)), (1, 1), "{joined}");
    let region = &joined.bound_symbols()[0];
    assert_eq!(region.subsymbols().len(), 12, "{joined}");
    assert_eq!(region.inputs().count(), 5, "lr once, each parameter once: {joined}");
    assert_eq!(region.outputs().len(), 4, "{joined}");
    assert!(crate::core::plan::OpView::new(&joined, region).unwrap().is_region_of(&Joining));
    for unjoined in [
        FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap(),
        FuseRegions::new(Arc::new(Joining)).join(false).run(&trace, &arena).unwrap(),
    ] {
        assert_eq!(region_count(&unjoined), 4, "{unjoined}");
    }
    // At most `max_ops` ops a region: joined two by two.
    let capped = FuseRegions::new(Arc::new(Joining)).max_ops(6).run(&trace, &arena).unwrap();
    assert_eq!(region_count(&capped), 2, "{capped}");
}

/// A region that reads what the one before computes, and regions in different scopes or under
/// different guards, stay apart: one launch must not hold a dependence, nor a range or scope
/// hold another's work.
#[test]
fn regions_join_only_when_independent_and_held_alike() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let shapes: [&[usize]; 3] = [&[3], &[4], &[5]];
    // The first region ends in a reduction and joins the second; the last reads the sum.
    let dependent = updates(&arena, &registry, &shapes, true, false);
    let fused = FuseRegions::new(Arc::new(Joining)).run(&dependent, &arena).unwrap();
    assert_eq!(region_count(&fused), 2, "{fused}");
    let [first, last] = [0, 1].map(|i| &fused.bound_symbols()[i]);
    assert!(last.inputs().any(|v| first.outputs().contains(&v)), "{fused}");

    let scoped = updates(&arena, &registry, &shapes, false, true);
    let fused = FuseRegions::new(Arc::new(Joining)).run(&scoped, &arena).unwrap();
    assert_eq!(region_count(&fused), 3, "one scope each: {fused}");

    let mut guarded = updates(&arena, &registry, &shapes, false, false);
    let recorder = Recorder::new();
    guarded.attach_guard(Selection::Positions(0..3), recorder.clone()).unwrap();
    let fused = FuseRegions::new(Arc::new(Joining)).run(&guarded, &arena).unwrap();
    assert_eq!(region_count(&fused), 2, "the recorder holds the first only: {fused}");
    // The same guard kind on every op: joined, with one attachment.
    let mut profiled = updates(&arena, &registry, &shapes, false, false);
    profiled.attach_guard(Selection::All, recorder).unwrap();
    let fused = FuseRegions::new(Arc::new(Joining)).run(&profiled, &arena).unwrap();
    assert_eq!((region_count(&fused), fused.guard_attachment_count()), (1, 1), "{fused}");
}

/// A region's range names its first 16 ops and counts the rest: a joined optimizer step holds
/// thousands, which no profiler's timeline shows whole.
#[test]
fn a_long_region_label_counts_its_ops_past_sixteen() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let mut x = b.input(&[4]).unwrap();
    for _ in 0..20 {
        x = b.neg(x).unwrap();
    }
    b.output(x).unwrap();
    let mut trace = b.finish().unwrap();
    let recorder = Recorder::new();
    trace.attach_guard(Selection::All, recorder.clone()).unwrap();
    let fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    plan.run(&[&Tensor::zeros(&[4])]).unwrap();
    let labels: Vec<String> = recorder.ranges().iter().map(|r| r.label.to_string()).collect();
    let sixteen = vec!["neg"; 16].join(", ");
    assert_eq!(labels, [format!("CpuFusion0: ({sixteen}, and 4 more)")]);
}

#[test]
fn comments_survive_decomposition_folding_and_fusion() {
    use super::{Decompose, FoldEpilogues};
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 4]).unwrap();
    let w = b.input(&[4, 4]).unwrap();
    b.comment("the projection");
    let h = b.linear(x, w, None).unwrap();
    let g = b.gelu(h).unwrap();
    b.comment("the normalisation");
    let y = b.softmax(g).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let comments = |t: &crate::core::ir::Trace<'_>| -> Vec<(String, String)> {
        t.bound_symbols()
            .iter()
            .filter_map(|b| b.comment().map(|c| (t.symbol_name(b).to_string(), c.to_string())))
            .collect()
    };
    let pair = |name: &str, comment: &str| (name.to_string(), comment.to_string());
    assert_eq!(comments(&trace), [pair("linear", "the projection"), pair("softmax", "the normalisation")]);
    // Folded: the linear's comment goes to what replaces it.
    let folded = FoldEpilogues.run(&trace, &arena).unwrap();
    assert_eq!(comments(&folded), [pair("linear_gelu", "the projection"), pair("softmax", "the normalisation")]);
    assert!(folded.to_string().contains("# the projection"), "{folded}");
    // Decomposed: each comment goes to the first prim of what it was on.
    let prims = Decompose.run(&folded, &arena).unwrap();
    let firsts: Vec<(String, String)> = comments(&prims);
    assert_eq!(firsts.len(), 2, "{prims}");
    assert_eq!(firsts[0].1, "the projection");
    assert_eq!(firsts[1], pair("max", "the normalisation"));
    // Fused: regions are named after their executor and carry its mark, also through a
    // decomposition after fusion (which keeps regions whole), and a plan runs them.
    let fused = FuseRegions::new(CpuFusion::shared()).run(&prims, &arena).unwrap();
    let cpu_fusion = crate::core::ir::FusedBy::of(&*CpuFusion::shared());
    let regions = |t: &crate::core::ir::Trace<'_>| -> Vec<String> {
        t.bound_symbols()
            .iter()
            .filter(|b| b.fused_by() == Some(cpu_fusion))
            .map(|b| b.name().unwrap_or("(no name)").to_string())
            .collect()
    };
    let made = regions(&fused);
    assert!(!made.is_empty() && made.iter().all(|n| n.starts_with("CpuFusion")), "{made:?}: {fused}");
    let decomposed = Decompose.run(&fused, &arena).unwrap();
    assert_eq!(regions(&decomposed), made, "{decomposed}");
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    let input = Tensor::from_fn(&[2, 4], |i| i as f32 / 8.0 - 0.5);
    let weight = Tensor::from_fn(&[4, 4], |i| (i % 3) as f32 / 3.0);
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&input, &weight]).unwrap();
    let got = plan.run(&[&input, &weight]).unwrap();
    assert_eq!(got.len(), expected.len());
    for (a, b) in got.iter().zip(&expected) {
        assert!(a.to_f32_vec().iter().zip(b.to_f32_vec()).all(|(p, q)| (p - q).abs() < 1e-5));
    }
}

/// `InsertRangeNodes` run by itself (not in a `Pipeline`) keeps each op's guards on the op,
/// between its push and pop nodes, and its scopes over all three: it dropped them silently.
#[test]
fn inserted_range_nodes_keep_each_ops_guards_and_scopes() {
    use super::InsertRangeNodes;
    let mut registry = Registry::with_builtins();
    InsertRangeNodes::register(&mut registry).unwrap();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let y = b.scope("layer", |b| b.exp(x)).unwrap();
    let z = b.neg(y).unwrap();
    b.output(z).unwrap();
    let mut trace = b.finish().unwrap();
    let recorder = Recorder::new();
    trace.attach_guard(Selection::All, recorder.clone()).unwrap();
    let noisy = InsertRangeNodes.run(&trace, &arena).unwrap();
    assert_eq!((noisy.guard_attachment_count(), noisy.dropped_guards().len()), (2, 0));
    assert_eq!(noisy.scope_path(0), Some("layer"));
    assert_eq!(noisy.scope_path(2), Some("layer"));
    assert_eq!(noisy.scope_path(3), None);
    let plan = Plan::compile(&noisy, &[CpuReference::shared()]).unwrap();
    plan.run(&[&Tensor::zeros(&[4])]).unwrap();
    let labels: Vec<String> = recorder.ranges().iter().map(|r| r.label.to_string()).collect();
    assert_eq!(labels, ["exp", "neg"]);
}

/// A user's pass that removes an op without carrying scopes drops them (a note each), and now
/// records the guards attached to them as dropped: they were lost without a record.
#[test]
fn guards_on_scopes_a_pass_drops_are_recorded() {
    struct DropFirst;
    impl Pass for DropFirst {
        fn name(&self) -> &str {
            "drop_first"
        }
        fn run<'a>(&self, trace: &crate::Trace<'a>, arena: &'a Arena) -> crate::Result<crate::Trace<'a>> {
            let mut b = TraceBuilder::rewrite(trace, arena);
            trace.bound_symbols()[1..].iter().for_each(|bsym| b.push_copy(bsym));
            b.finish()
        }
    }
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    b.exp(x).unwrap(); // dead
    let y = b.scope("blk", |b| b.neg(x)).unwrap();
    b.output(y).unwrap();
    let mut trace = b.finish().unwrap();
    trace.attach_guard(Selection::Scope("blk"), Recorder::new()).unwrap();
    for out in [DropFirst.run(&trace, &arena).unwrap(), Pipeline::new().then(DropFirst).run(&trace, &arena).unwrap()] {
        let dropped = out.dropped_guards();
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert!(dropped[0].reason.contains("scope `blk` was dropped"), "{dropped:?}");
        assert_eq!(out.scope_notes().len(), 1);
    }
}
