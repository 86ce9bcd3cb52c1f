//! A timeline without Nsight: runs a small fused plan a few times with a `guards::Timeline`
//! around each run and on every op or region, and writes one Chrome trace event file into
//! `BOUNDSCOPE_TRACE_DIR` (or the working directory). Prints only the file's path; open it in
//! ui.perfetto.dev or chrome://tracing.
//!
//! `cargo run --release --example timeline`

use std::process::ExitCode;

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::frontend::Environment;
use boundscope::guards::{Selection, Timeline};
use boundscope::passes::{FuseRegions, FusionStrategy, Pass, Pipeline};
use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};

const RUNS: usize = 5;

fn main() -> ExitCode {
    match run() {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("timeline: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> boundscope::Result<std::path::PathBuf> {
    let dir = Environment::process().trace_dir()?;

    // A matmul and a SiLU-style tail that fuses into one region, then a softmax.
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

    let timeline = Timeline::new();
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
    timeline.write_chrome_trace(dir)
}
