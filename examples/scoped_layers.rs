//! Named scopes: a stack of 4 MLP layers built in scopes `layer.{i}.mlp` and `layer.{i}.norm`,
//! profiled by module, and fused across layers as `torch.compile` fuses across modules.
//!
//! ```text
//! cargo run --release --example scoped_layers
//! scripts/nsys-check target/release/examples/scoped_layers   # under Nsight Systems
//! scoped_layers --cuda    # on a GPU: CudaFusion and CudaOps; with ncu --nvtx, kernels by module
//! ```
//! Each layer is pre-norm, as in GPT-2: `layer_norm` in `layer.{i}.norm`, then
//! `x + linear(gelu(linear(.)))` in `layer.{i}.mlp`, all in the scope `layer`; the residual add
//! that ends one layer fuses with the first op of the next layer's norm. `ProfileOps` puts a range on every op and every scope (labelled with its
//! path), and the trace is fused for `CpuFusion` twice: across scopes (the default: a region
//! that straddles scopes sits in the innermost scope holding all its ops, and the plan's notes
//! say which scope ranges were cut around it) and within scopes (`FuseRegions::within_scopes`,
//! for exact attribution). The example prints both plans with their range maps, the time per
//! run of each (side by side, profiling off), and writes the ranges the profiled runs push for
//! `scripts/nsys-check`. Exits non-zero if a result differs from the reference.
//!
//! Measured on the 2-core development machine ([64, 256], CpuFusion, side by side, profiling
//! off, 2026-12-01): fused across scopes and within scopes 20 steps each, 1.255 ms per run
//! (1.00x; since the CPU reference runs `linear` and `layer_norm` whole, the regions left are
//! the same either way; before that, 41 and 44 steps, 3.26-3.33 ms). Under Nsight Systems
//! (`scripts/nsys-check`, in CI) 1,428 ranges arrive, every one in the range maps; on the H200, `ncu --nvtx --nvtx-include
//! "boundscope@layer.1.mlp/"` on `scoped_layers --cuda` shows each of that module's kernels
//! under `forward > layer > layer.1 > layer.1.mlp > linear_gelu` (or `linear`, `add`).
//! `proptests/range_map_matches_profiler.rs` runs 1,024 random programs in random nested
//! scopes, fused across and within scopes, with guards in three domains on scopes and ops.

use std::process::ExitCode;
use std::time::Instant;

use boundscope::executors::CpuReference;
use boundscope::guards::{Level, NvtxRange};
use boundscope::passes::{FuseRegions, Pass, Pipeline, ProfileOps};
use boundscope::{Arena, Plan, Registry, Tensor, Trace, TraceBuilder, ValueId};

#[path = "shared/executors.rs"]
mod executors;
#[path = "shared/nsys_check.rs"]
mod nsys_check;
use executors::executors;

const LAYERS: usize = 4;
const BATCH: usize = 64;
const HIDDEN: usize = 256;
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

/// The stack, every layer in its scopes; inputs: x, then per layer w1, b1, w2, b2, gamma, beta.
fn layers<'a>(arena: &'a Arena, registry: &'a Registry) -> boundscope::Result<Trace<'a>> {
    let mut b = TraceBuilder::new(arena, registry);
    let mut x = b.input(&[BATCH, HIDDEN])?;
    let mut weights: Vec<[ValueId; 6]> = Vec::new();
    for _ in 0..LAYERS {
        let shapes: [&[usize]; 6] = [&[HIDDEN, HIDDEN], &[HIDDEN], &[HIDDEN, HIDDEN], &[HIDDEN], &[HIDDEN], &[HIDDEN]];
        let mut layer = [ValueId::from_index(0); 6];
        for (w, shape) in layer.iter_mut().zip(shapes) {
            *w = b.input(shape)?;
        }
        weights.push(layer);
    }
    b.scope("layer", |b| {
        for (i, [w1, b1, w2, b2, gamma, beta]) in weights.iter().copied().enumerate() {
            // Pre-norm, as in GPT-2: x + mlp(layer_norm(x)).
            x = b.scope(&i.to_string(), |b| {
                let n = b.scope("norm", |b| b.layer_norm(x, 1e-5, Some(gamma), Some(beta)))?;
                b.scope("mlp", |b| {
                    let h = b.linear(n, w1, Some(b1))?;
                    let g = b.gelu(h)?;
                    let o = b.linear(g, w2, Some(b2))?;
                    b.add(o, x)
                })
            })?;
        }
        Ok(())
    })?;
    b.output(x)?;
    b.finish()
}

fn inputs(trace: &Trace<'_>) -> Vec<Tensor> {
    trace
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let shape = &trace.value_meta(v).expect("an input").shape;
            Tensor::from_fn(shape, |i| ((i * 7 + k * 13) % 29) as f32 / 290.0 - 0.05)
        })
        .collect()
}

/// Milliseconds per run of each plan, measured in turns (noise hits both alike).
fn time_per_run(plans: &[&Plan], inputs: &[Tensor]) -> boundscope::Result<Vec<f64>> {
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let mut workspaces = plans.iter().map(|p| p.workspace()).collect::<boundscope::Result<Vec<_>>>()?;
    let mut best = vec![f64::INFINITY; plans.len()];
    for _ in 0..5 {
        for (k, plan) in plans.iter().enumerate() {
            let start = Instant::now();
            for _ in 0..20 {
                plan.run_with(&mut workspaces[k], &views)?;
            }
            best[k] = best[k].min(start.elapsed().as_secs_f64() * 1e3 / 20.0);
        }
    }
    Ok(best)
}

fn run() -> boundscope::Result<bool> {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = layers(&arena, &registry)?;
    let paths: Vec<&str> = trace.scopes().iter().map(|s| s.path()).collect();
    println!("scopes: {}", paths.join(", "));

    // As the front end does: decomposed, then a range on every op and scope, then fused (ranges
    // attached to a composite before decomposition would keep its prims out of regions).
    let (fusion, executors) = executors(std::env::args().any(|a| a == "--cuda"))?;
    // Composites an executor runs better whole (CudaOps: linear, layer_norm) stay whole.
    let prims = Pipeline::for_executors(&executors).run(&trace, &arena)?;
    let prims = ProfileOps::new().with_trace_range(NvtxRange::new().label("forward")?).run(&prims, &arena)?;
    let across = Plan::compile(&FuseRegions::new(fusion.clone()).run(&prims, &arena)?, &executors)?;
    let within = Plan::compile(&FuseRegions::new(fusion).within_scopes(true).run(&prims, &arena)?, &executors)?;
    println!("== fused across scopes\n{across:#}");
    println!("== fused within scopes\n{within:#}");

    let inputs = inputs(&trace);
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let reference = Plan::compile(&trace, &[CpuReference::shared()])?.run(&refs)?;
    let mut ok = true;
    for (name, plan) in [("across", &across), ("within", &within)] {
        let diff = plan.run(&refs)?[0].max_abs_diff(&reference[0]);
        let scopes = plan.range_map().ranges().iter().filter(|r| r.level == Level::Scope).count();
        println!(
            "fused {name} scopes: {} steps, {scopes} scope ranges per run, max |plan - reference| = {diff:.2e}",
            plan.len()
        );
        ok &= diff <= 1e-4;
    }

    // The cost of each choice, side by side, with profiling off (ranges cost the same in both).
    for plan in [&across, &within] {
        plan.set_profiling(false);
    }
    let ms = time_per_run(&[&across, &within], &inputs)?;
    println!(
        "per run, profiling off: across scopes {:.3} ms ({} steps), within scopes {:.3} ms ({} steps): {:.2}x",
        ms[0],
        across.len(),
        ms[1],
        within.len(),
        ms[1] / ms[0]
    );

    // Profiled runs, for the profiler: what they push is what the range maps say.
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let mut expected = String::new();
    for plan in [&across, &within] {
        plan.set_profiling(true);
        let mut workspace = plan.workspace()?;
        for _ in 0..RUNS {
            plan.run_with(&mut workspace, &views)?;
        }
        // RUNS, and the run that checked its result.
        expected.push_str(&plan.range_map().counts_tsv(RUNS + 1));
    }
    nsys_check::write_expected_ranges(&expected);
    Ok(ok)
}
