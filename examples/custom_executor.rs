//! Embedding boundscope: your own symbol and your own fusion executor, beside the built-in
//! ones, with NVTX ranges that still nest correctly.
//!
//! ```text
//! cargo run --release --example custom_executor
//! ```
//! `MyFuser` fuses chains of unary elementwise ops (the built-in ones and our own `swish`) into
//! one loop, and pushes its own NVTX range per region in its own domain (`my_fuser`), as
//! nvFuser does. It declares that it does, so the runtime emits no second range for its
//! regions; it takes the label the runtime would have used from the plan. Exits non-zero if the
//! fused result differs from the reference, or if any region got more or fewer than one range.

use std::process::ExitCode;
use std::sync::Arc;

use boundscope::executors::CpuReference;
use boundscope::guards::{Level, NvtxRange, Recorder, Selection};
use boundscope::passes::{FuseRegions, Pass, ProfileOps};
use boundscope::{Arena, Executor, Plan, Registry, Tensor};

#[path = "shared/my_fuser.rs"]
mod my_fuser;
#[path = "shared/nsys_check.rs"]
mod nsys_check;
use my_fuser::{swish_program, swish_symbol, MyFuser, MY_DOMAIN};

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> boundscope::Result<bool> {
    let mut registry = Registry::with_builtins();
    registry.register(swish_symbol())?;
    let arena = Arena::new();

    let trace = swish_program(&arena, &registry, 256)?;

    // Profile every op and the run, record the range tree, fuse for MyFuser.
    let mut profiled = ProfileOps::new().with_trace_range(NvtxRange::new().label("step")?).run(&trace, &arena)?;
    let recorder = Recorder::new();
    profiled.attach_trace_guard(recorder.clone())?;
    profiled.attach_guard(Selection::All, recorder.clone())?;
    let my_fuser: Arc<dyn Executor> = Arc::new(MyFuser);
    let fused = FuseRegions::new(my_fuser.clone()).run(&profiled, &arena)?;
    println!("{fused}");

    let plan = Plan::compile(&fused, &[my_fuser, CpuReference::shared()])?;
    println!("{plan}");
    let inputs = [
        Tensor::from_fn(&[256, 256], |i| (i % 17) as f32 / 17.0 - 0.5),
        Tensor::from_fn(&[256, 256], |i| (i % 13) as f32 / 130.0),
    ];
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let got = plan.run(&refs)?;
    let reference = Plan::compile(&trace, &[CpuReference::shared()])?.run(&refs)?;
    let diff = got[0].max_abs_diff(&reference[0]);
    println!("max |fused - reference| = {diff:.3e}");

    // The range tree: the run ⊃ one range per op or region, none duplicated.
    let ranges = recorder.ranges();
    for r in &ranges {
        let depth = if r.parent.is_some() { 1 } else { 0 };
        println!(
            "{:indent$}{} [{}] {:.1} us",
            "",
            r.label,
            r.level.name(),
            (r.end_ns - r.start_ns) as f64 / 1e3,
            indent = 2 * depth
        );
    }
    let regions = ranges.iter().filter(|r| r.level == Level::Region).count();
    let one_per_region = regions == 1 && ranges.len() == 1 + fused.len();
    println!(
        "{regions} region range(s) in the record; the NVTX one is pushed by MyFuser in domain `{MY_DOMAIN}`, \
         the runtime pushed none for it"
    );
    // For scripts/nsys-check: the ranges this run pushed, by domain and label.
    nsys_check::write_expected_ranges(&plan.range_map().counts_tsv(1));
    Ok(diff <= 1e-5 && one_per_region)
}
