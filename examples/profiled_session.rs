//! The front end, for people who never look at traces: one call from a trace to results, with
//! NVTX ranges that switch on by themselves under a profiler.
//!
//! ```text
//! cargo run --release --example profiled_session                 # no ranges, no cost
//! scripts/nsys-check target/release/examples/profiled_session    # ranges, with no code change
//! BOUNDSCOPE_NVTX=1 cargo run --release --example profiled_session   # ranges, forced on
//! ```
//! Run plainly, it prints the cost of a call to the session next to a plan compiled by hand with
//! no guards at all, measured side by side.

use std::process::ExitCode;
use std::time::Instant;

use boundscope::frontend::ProfiledSession;
use boundscope::passes::{FuseRegions, Pass, Pipeline};
use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};

#[path = "shared/nsys_check.rs"]
mod nsys_check;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> boundscope::Result<()> {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[256, 512])?;
    let w = b.input(&[512, 512])?;
    let bias = b.input(&[512])?;
    let h = b.linear(x, w, Some(bias))?;
    let g = b.gelu(h)?;
    let y = b.softmax(g)?;
    b.output(y)?;
    let trace = b.finish()?;

    // Everything a user does: make a session, run.
    let session = ProfiledSession::from_env()?;
    let inputs = [
        Tensor::from_fn(&[256, 512], |i| (i % 7) as f32 / 7.0),
        Tensor::from_fn(&[512, 512], |i| (i % 5) as f32 / 500.0),
        Tensor::zeros(&[512]),
    ];
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = session.run(&trace, &arena, &refs)?;
    println!("profiling: {} ({})", session.profiling().level, session.profiling().reason);
    println!("output row sums to {:.4}", out[0].to_f32_vec()[..512].iter().sum::<f32>());

    // Its cost per call, on the user's path (the session's cached plan, run from its pool, owned
    // outputs), against a plan compiled by hand with no guards at all (the same passes and
    // fusion, run the same way), side by side. A session that recompiled on every call, or
    // whose guards cost something with profiling off, would show here.
    let plan = session.plan(&trace, &arena)?;
    println!("{plan}");
    // The same executors as the session's (its fusion executor first), on the CPU or the GPU.
    let executors = session.executors();
    let bare_trace = FuseRegions::new(executors[0].clone()).run(&Pipeline::standard().run(&trace, &arena)?, &arena)?;
    let bare = Plan::compile(&bare_trace, executors)?;
    let (mut t_session, mut t_bare) = (Vec::new(), Vec::new());
    let rounds = 15;
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..10 {
            session.run(&trace, &arena, &refs)?;
        }
        t_session.push(start.elapsed().as_secs_f64() * 1e5);
        let start = Instant::now();
        for _ in 0..10 {
            bare.run(&refs)?;
        }
        t_bare.push(start.elapsed().as_secs_f64() * 1e5);
    }
    t_session.sort_by(f64::total_cmp);
    t_bare.sort_by(f64::total_cmp);
    let (s, b) = (t_session[rounds / 2], t_bare[rounds / 2]);
    println!(
        "per call: session.run {s:.1} us, a hand-compiled plan without guards {b:.1} us, ratio {:.3} \
         (median of {rounds} interleaved rounds)",
        s / b
    );

    // For scripts/nsys-check: what the session's runs pushed, as its plan's range map says.
    nsys_check::write_expected_ranges(&plan.range_map().counts_tsv(1 + 10 * rounds));
    Ok(())
}
