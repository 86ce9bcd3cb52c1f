//! The plan the timeline examples run (`timeline`, `timeline_flamegraph`): a matmul, a
//! SiLU-style tail that fuses into one region, then a softmax, on the CPU.

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::guards::{Selection, Timeline};
use boundscope::passes::{FuseRegions, FusionStrategy, Pass, Pipeline};
use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};

/// How many times [`run_plan`] runs the plan.
const RUNS: usize = 5;

/// Builds the plan with `timeline` around each run and on every op or region, runs it [`RUNS`]
/// times and returns that number; the scopes are in `timeline`, for the caller to drain.
pub fn run_plan(timeline: &Timeline) -> boundscope::Result<usize> {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[128, 256])?;
    let w = b.input(&[256, 256])?;
    let h = b.matmul(x, w)?;
    let a = b.add_scalar(h, 1.0)?;
    let s = b.sigmoid(a)?;
    let y = b.mul(a, s)?;
    let z = b.softmax(y)?;
    b.output(z)?;
    let prims = Pipeline::standard().run(&b.finish()?, &arena)?;
    let mut fused = FuseRegions::new(CpuFusion::shared()).strategy(FusionStrategy::Dataflow).run(&prims, &arena)?;

    fused.attach_trace_guard(timeline.clone())?;
    fused.attach_guard(Selection::All, timeline.clone())?;
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()])?;

    let inputs = [
        Tensor::from_fn(&[128, 256], |i| (i % 17) as f32 / 17.0 - 0.5),
        Tensor::from_fn(&[256, 256], |i| (i % 13) as f32 / 130.0),
    ];
    for _ in 0..RUNS {
        plan.run(&[&inputs[0], &inputs[1]])?;
    }
    Ok(RUNS)
}
