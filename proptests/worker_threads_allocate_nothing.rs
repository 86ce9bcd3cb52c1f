//! The CPU executors' worker threads allocate nothing in a steady-state run either. The other
//! allocation tests count the calling thread only (tests run in parallel threads); this binary
//! holds one test, so its counter can count every thread: the worker pool's threads, which run
//! the parts of ops split over the cores, included.

#[path = "common/allocations.rs"]
#[allow(dead_code)]
mod allocations;

use std::sync::Arc;

use allocations::{allocations_on_every_thread_during, CountingAllocator};
use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::passes::Pipeline;
use boundscope::{Arena, Executor, Plan, Registry, Tensor, TraceBuilder};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Ops large enough to be split over the worker threads (a fused chain, a product, row ops,
/// a reduction), run unfused on the CPU reference and fused by CpuFusion: three runs after two
/// warm-up runs allocate nothing on any thread.
#[test]
fn split_ops_allocate_nothing_on_any_thread_once_warm() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[512, 1024]).unwrap();
    let w = b.input(&[1024, 256]).unwrap();
    let e = b.exp(x).unwrap();
    let s = b.mul_scalar(e, 0.5).unwrap();
    let t = b.tanh(s).unwrap();
    let p = b.matmul(t, w).unwrap();
    let soft = b.softmax(p).unwrap();
    let normed = b.layer_norm(soft, 1e-5, None, None).unwrap();
    let total = b.sum(normed).unwrap();
    b.output(total).unwrap();
    b.output(normed).unwrap();
    let trace = b.finish().unwrap();
    let inputs = [
        Tensor::from_fn(&[512, 1024], |i| ((i % 97) as f32 - 48.0) / 64.0),
        Tensor::from_fn(&[1024, 256], |i| ((i % 89) as f32 - 44.0) / 512.0),
    ];
    let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
    let reference: Vec<Arc<dyn Executor>> = vec![CpuReference::shared()];
    let fused: Vec<Arc<dyn Executor>> = vec![CpuFusion::shared(), CpuReference::shared()];
    for executors in [reference, fused] {
        let prepared = Pipeline::for_executors(&executors).run(&trace, &arena).unwrap();
        let plan = Plan::compile(&prepared, &executors).unwrap();
        let mut workspace = plan.workspace().unwrap();
        for _ in 0..2 {
            plan.run_with(&mut workspace, &views).unwrap();
        }
        let allocations = allocations_on_every_thread_during(|| {
            for _ in 0..3 {
                plan.run_with(&mut workspace, &views).unwrap();
            }
        });
        assert_eq!(allocations, 0, "{plan}");
    }
}
