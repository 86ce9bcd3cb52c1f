//! One range per scope per NVTX domain, with a user's executor and a user's domains.
//!
//! ```text
//! cargo run --release --example ranges_in_three_domains
//! scripts/nsys-check target/release/examples/ranges_in_three_domains   # under Nsight Systems
//! ```
//! `MyFuser` (the user's fusion executor of `custom_executor`) pushes its region ranges in its
//! own domain, `my_fuser`. The trace is profiled twice with `ProfileOps` (domain `boundscope`),
//! and the application adds its own ranges in a third domain, `my_app`, around the run and
//! every op, plus a label for MyFuser's regions in `my_fuser`. The plan prints which ranges one
//! run pushes, and who pushes them: one per scope and domain, none twice. `scripts/nsys-check`
//! compares what Nsight Systems recorded with that map. Exits non-zero if the fused result
//! differs from the reference.

use std::process::ExitCode;
use std::sync::Arc;

use boundscope::executors::CpuReference;
use boundscope::guards::{NvtxRange, Selection};
use boundscope::passes::{FuseRegions, Pass, ProfileOps};
use boundscope::{prims, Arena, BoundSymbolId, Executor, Plan, Registry, Tensor};

#[path = "shared/my_fuser.rs"]
mod my_fuser;
#[path = "shared/nsys_check.rs"]
mod nsys_check;
use my_fuser::{swish_program, swish_symbol, MyFuser, MY_DOMAIN};

const APP_DOMAIN: &str = "my_app";
const RUNS: usize = 20;

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
    let trace = swish_program(&arena, &registry, 128)?;

    // Profiled twice, as happens when a library and its caller both ask for it.
    let profile = ProfileOps::new().with_trace_range(NvtxRange::new().label("step")?);
    let mut profiled = profile.run(&profile.run(&trace, &arena)?, &arena)?;
    // The application's own ranges, in its own domain.
    profiled.attach_trace_guard(NvtxRange::new().domain(APP_DOMAIN)?.label("training step")?)?;
    profiled.attach_guard(Selection::All, NvtxRange::new().domain(APP_DOMAIN)?)?;

    let my_fuser: Arc<dyn Executor> = Arc::new(MyFuser);
    let mut fused = FuseRegions::new(my_fuser.clone()).run(&profiled, &arena)?;
    // A label for MyFuser's own range of each region, given in MyFuser's domain.
    for p in 0..fused.len() {
        if fused.bound_symbols()[p].symbol() == prims::REGION {
            let label = NvtxRange::new().domain(MY_DOMAIN)?.label("activation chain")?;
            fused.attach_guard(Selection::Op(BoundSymbolId::from_index(p)), label)?;
        }
    }
    let plan = Plan::compile(&fused, &[my_fuser, CpuReference::shared()])?;
    println!("{plan:#}");

    let inputs = [
        Tensor::from_fn(&[128, 128], |i| (i % 17) as f32 / 17.0 - 0.5),
        Tensor::from_fn(&[128, 128], |i| (i % 13) as f32 / 130.0),
    ];
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let mut workspace = plan.workspace()?;
    for _ in 0..RUNS {
        plan.run_with(&mut workspace, &views)?;
    }
    let got = plan.run_with(&mut workspace, &views)?.to_tensors();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let reference = Plan::compile(&trace, &[CpuReference::shared()])?.run(&refs)?;
    let diff = got[0].max_abs_diff(&reference[0]);
    println!("max |fused - reference| = {diff:.3e}");
    for domain in ["boundscope", MY_DOMAIN, APP_DOMAIN] {
        println!("ranges per run in `{domain}`: {}", plan.range_map().count_in(domain));
    }
    nsys_check::write_expected_ranges(&plan.range_map().counts_tsv(RUNS + 1));
    // On stderr (stdout is the example's own output): whether the attached profiler took the
    // structured payload schema, and one range's details.
    let ranges = plan.range_map().ranges();
    match ranges.iter().find_map(|r| r.details.as_ref().map(|d| (r, d))) {
        Some((r, d)) => eprintln!(
            "structured payloads: taken by the profiler ({} of {} ranges); `{}`: {d}",
            ranges.iter().filter(|r| r.details.is_some()).count(),
            ranges.len(),
            r.label
        ),
        None => eprintln!("structured payloads: not taken (no tool, or it registers no payload schema): u64 op counts"),
    }
    Ok(diff <= 1e-5)
}
