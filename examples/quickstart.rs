//! A newcomer's first run: build a 2-layer MLP block as a trace, print it before and after the
//! standard passes, attach an NVTX range to every op as metadata, fuse its elementwise chains,
//! run it unfused (CPU reference executor) and fused (CPU fusion executor), check both against
//! the same math written out by hand, and time them with profiling off and on.
//!
//! Run it under Nsight Systems (`scripts/nsys-check target/release/examples/quickstart`) to see
//! the ranges and check them against the plans' range maps.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
//! Exits non-zero if the plan's result differs from the direct computation.

use std::process::ExitCode;
use std::time::Instant;

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::guards::NvtxRange;
use boundscope::passes::{FuseRegions, InsertRangeNodes, Pass, Pipeline, ProfileOps};
use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};

const BATCH: usize = 64;
const HIDDEN: usize = 256;
const EPS: f32 = 1e-5;
const TOLERANCE: f32 = 1e-4;

#[path = "shared/nsys_check.rs"]
mod nsys_check;

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
    // Only for the comparison below: the push/pop symbols of the inserted-node approach.
    InsertRangeNodes::register(&mut registry)?;
    let arena = Arena::new();

    // 1. Build the program: linear, gelu, linear, residual add, layer_norm, softmax.
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[BATCH, HIDDEN])?;
    let w1 = b.input(&[HIDDEN, HIDDEN])?;
    let b1 = b.input(&[HIDDEN])?;
    let w2 = b.input(&[HIDDEN, HIDDEN])?;
    let b2 = b.input(&[HIDDEN])?;
    let gamma = b.input(&[HIDDEN])?;
    let beta = b.input(&[HIDDEN])?;
    b.comment("MLP: linear -> gelu -> linear");
    let h = b.linear(x, w1, Some(b1))?;
    let g = b.gelu(h)?;
    let o = b.linear(g, w2, Some(b2))?;
    b.comment("residual, then normalise");
    let r = b.add(o, x)?;
    let n = b.layer_norm(r, EPS, Some(gamma), Some(beta))?;
    let y = b.softmax(n)?;
    b.output(y)?;
    let trace = b.finish()?;
    println!("== the trace as built ==\n{trace}");

    // 2. Decompose composites into prims and remove dead code.
    let prims = Pipeline::standard().run(&trace, &arena)?;
    println!("== after the standard passes ==\n{prims}");

    // 3. Profile every op, as metadata: the trace keeps its 26 bound symbols.
    let profiled = ProfileOps::new().with_trace_range(NvtxRange::new().label("mlp_block")?).run(&prims, &arena)?;
    println!("== with an NVTX range on every op ==\n{profiled}");
    let inserted = InsertRangeNodes.run(&prims, &arena)?;
    println!(
        "listing lines: {} with ranges as guards, {} with push/pop inserted as nodes ({} bound symbols vs {})\n",
        profiled.to_string().lines().count(),
        inserted.to_string().lines().count(),
        profiled.len(),
        inserted.len()
    );

    // 4. Fuse: elementwise chains become regions that CpuFusion runs in one pass. The NVTX
    //    ranges of the fused ops merge into one range per region, which CpuFusion emits itself.
    let fused = FuseRegions::new(CpuFusion::shared()).run(&profiled, &arena)?;
    println!("== fused for CpuFusion ==\n{fused}");

    let inputs = [
        random(&[BATCH, HIDDEN], 1, 1.0),
        random(&[HIDDEN, HIDDEN], 2, 1.0 / (HIDDEN as f32).sqrt()),
        random(&[HIDDEN], 3, 0.1),
        random(&[HIDDEN, HIDDEN], 4, 1.0 / (HIDDEN as f32).sqrt()),
        random(&[HIDDEN], 5, 0.1),
        random(&[HIDDEN], 6, 1.0),
        random(&[HIDDEN], 7, 0.1),
    ];
    let expected = direct_mlp_block(&inputs);
    let mut ok = true;
    let mut expected_ranges = String::new();
    for (name, trace, executors) in [
        ("unfused", &profiled, vec![CpuReference::shared()]),
        ("fused", &fused, vec![CpuFusion::shared(), CpuReference::shared()]),
    ] {
        // 5. Compile, run, and check against the same math written out directly.
        let plan = Plan::compile(trace, &executors)?;
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let out = plan.run(&refs)?;
        let diff = out[0].max_abs_diff(&expected);
        let matches = diff <= TOLERANCE;
        ok &= matches;
        println!(
            "{name}: max |plan - direct| = {diff:.3e} (tolerance {TOLERANCE:e}): {}",
            if matches { "OK" } else { "MISMATCH" }
        );
        // 6. Time it, reusing one workspace (no allocation per run), profiling off then on.
        let profiled_runs = time_profiling_off_and_on(&plan, &inputs)? + 1;
        // What those runs pushed, as the plan's range map says; for scripts/nsys-check.
        expected_ranges += &plan.range_map().counts_tsv(profiled_runs);
    }
    nsys_check::write_expected_ranges(&expected_ranges);
    Ok(ok)
}

/// Times `plan` with profiling off, then on; returns how many runs were profiled.
fn time_profiling_off_and_on(plan: &Plan, inputs: &[Tensor]) -> boundscope::Result<usize> {
    let mut workspace = plan.workspace()?;
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let runs = 200;
    plan.run_with(&mut workspace, &views)?;
    let mut profiled_runs = 1; // the warm-up
    for profiling in [false, true] {
        plan.set_profiling(profiling);
        let start = Instant::now();
        for _ in 0..runs {
            plan.run_with(&mut workspace, &views)?;
        }
        let per_run = start.elapsed() / runs;
        profiled_runs += if profiling { runs as usize } else { 0 };
        println!(
            "  {} steps on {:?}, profiling {}: {per_run:.2?} per run (mean of {runs})",
            plan.len(),
            plan.steps_per_executor(),
            if profiling { "on " } else { "off" }
        );
    }
    Ok(profiled_runs)
}

/// A deterministic pseudo-random tensor in `[-scale, scale)`.
fn random(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Tensor::from_fn(shape, |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    })
}

/// The MLP block computed with plain loops, independent of boundscope's kernels.
fn direct_mlp_block(inputs: &[Tensor]) -> Tensor {
    let [x, w1, b1, w2, b2, gamma, beta] = inputs else { unreachable!("seven inputs") };
    let linear = |x: &[f32], w: &Tensor, bias: &Tensor| -> Vec<f32> {
        let mut out = vec![0.0f32; BATCH * HIDDEN];
        for i in 0..BATCH {
            for j in 0..HIDDEN {
                let mut acc = 0.0f32;
                for k in 0..HIDDEN {
                    acc += x[i * HIDDEN + k] * w.values::<f32>().unwrap()[j * HIDDEN + k];
                }
                out[i * HIDDEN + j] = acc + bias.values::<f32>().unwrap()[j];
            }
        }
        out
    };
    let gelu = |v: f32| 0.5 * v * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh());
    let h: Vec<f32> = linear(x.values::<f32>().unwrap(), w1, b1).into_iter().map(gelu).collect();
    let o = linear(&h, w2, b2);
    let mut y = vec![0.0f32; BATCH * HIDDEN];
    for i in 0..BATCH {
        let row: Vec<f32> =
            (0..HIDDEN).map(|j| o[i * HIDDEN + j] + x.values::<f32>().unwrap()[i * HIDDEN + j]).collect();
        let mean = row.iter().sum::<f32>() / HIDDEN as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / HIDDEN as f32;
        let normed: Vec<f32> = (0..HIDDEN)
            .map(|j| {
                (row[j] - mean) / (var + EPS).sqrt() * gamma.values::<f32>().unwrap()[j]
                    + beta.values::<f32>().unwrap()[j]
            })
            .collect();
        let max = normed.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = normed.iter().map(|v| (v - max).exp()).sum();
        for j in 0..HIDDEN {
            y[i * HIDDEN + j] = (normed[j] - max).exp() / z;
        }
    }
    Tensor::new(&[BATCH, HIDDEN], y).expect("shape matches")
}
