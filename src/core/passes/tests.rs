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
