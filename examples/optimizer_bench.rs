//! An optimizer step on the GPU, timed: AdamW with PyTorch's defaults (weight decay 0.01) over
//! GPT-2 124M's 148 parameters (f32), parameters, gradients and moments on the device, updated
//! in place (`Plan::run_updating_on_device`), fused for `CudaFusion`. Side by side in one run:
//! the updates joined into one region (a few multi-tensor launches, what `FuseRegions` does for
//! an executor that [joins](boundscope::Executor::joins) regions) and one region per parameter.
//!
//! ```text
//! cargo build --release --example optimizer_bench    # then, on the GPU machine:
//! optimizer_bench                                    # ms per step, each way
//! python3 scripts/torch_adamw.py                     # PyTorch's fused AdamW on the same shapes
//! ```
//! Prints `ms per step` over 200 steps after 20 of warm-up, five rounds alternating the two
//! plans. Without a GPU it says so and exits with status 0.

use std::sync::Arc;
use std::time::Instant;

use boundscope::optim::AdamW;
use boundscope::passes::{FuseRegions, Pass, Pipeline};
use boundscope::{Arena, DeviceTensor, Executor, Plan, Registry, RunInputMut, Tensor, TraceBuilder};

const WARMUP: usize = 20;
const STEPS: usize = 200;
const ROUNDS: usize = 5;

/// GPT-2 124M's parameters, in its checkpoint's order (the LM head is tied to `wte`).
fn gpt2_shapes() -> Vec<Vec<usize>> {
    let mut shapes = vec![vec![50257, 768], vec![1024, 768]];
    for _ in 0..12 {
        for shape in [
            &[768][..],
            &[768],
            &[768, 2304],
            &[2304],
            &[768, 768],
            &[768],
            &[768],
            &[768],
            &[768, 3072],
            &[3072],
            &[3072, 768],
            &[768],
        ] {
            shapes.push(shape.to_vec());
        }
    }
    shapes.extend([vec![768], vec![768]]);
    shapes
}

fn main() -> boundscope::Result<()> {
    #[cfg(feature = "cuda")]
    {
        use boundscope::executors::cuda::{self, CudaDevice, CudaFusion, CudaOps};
        if let boundscope::Availability::Unavailable(reason) = cuda::availability() {
            eprintln!("SKIPPED: optimizer_bench: {reason}");
            return Ok(());
        }
        let device = CudaDevice::new()?;
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let adamw = AdamW::new();
        let hyper = adamw.step_inputs(&mut b)?;
        for shape in gpt2_shapes() {
            let (p, g) = (b.input(&shape)?, b.input(&shape)?);
            adamw.update(&mut b, &hyper, p, g)?;
        }
        let step = b.finish()?;
        let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()));
        let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(device.clone()));
        let executors = [fusion.clone(), ops];
        let prims = Pipeline::for_executors(&executors).run(&step, &arena)?;
        let mut plans = Vec::new();
        for join in [true, false] {
            let fused = FuseRegions::new(fusion.clone()).join(join).run(&prims, &arena)?;
            let plan = Plan::compile(&fused, &executors)?;
            let regions = fused.bound_symbols().iter().filter(|b| b.symbol() == boundscope::prims::REGION).count();
            let label = if join { "joined" } else { "a region per parameter" };
            plans.push((label, regions, plan));
        }

        let shared: Arc<dyn boundscope::Device> = device.clone();
        let mut inputs = Vec::new();
        for (k, &v) in step.inputs().iter().enumerate() {
            let meta = step.value_meta(v)?;
            let host = Tensor::from_fn(&meta.shape, |i| ((i * 7 + k * 13) % 101) as f32 / 101.0 * 0.04 - 0.02);
            inputs.push(DeviceTensor::upload(&shared, host.view())?);
        }
        let mut scalars: Vec<Tensor> = (0..3).map(|_| Tensor::from_fn(&[], |_| 0.0)).collect();
        let mut workspaces =
            plans.iter().map(|(_, _, plan)| plan.workspace()).collect::<boundscope::Result<Vec<_>>>()?;
        let mut totals = vec![Vec::new(); plans.len()];
        let mut t = 0u64;
        for _ in 0..ROUNDS {
            for (i, (_, _, plan)) in plans.iter().enumerate() {
                let mut run = |steps: usize, t: &mut u64| -> boundscope::Result<()> {
                    for _ in 0..steps {
                        *t += 1;
                        for (k, value) in adamw.step_scalars(*t, 1e-4).into_iter().enumerate() {
                            scalars[k].values_mut::<f32>()?[0] = value;
                            inputs[k].copy_from_host(scalars[k].view())?;
                        }
                        let mut refs: Vec<RunInputMut<'_>> = inputs.iter_mut().map(RunInputMut::from).collect();
                        plan.run_updating_on_device(&mut workspaces[i], &mut refs)?;
                    }
                    Ok(())
                };
                run(WARMUP, &mut t)?;
                boundscope::Device::synchronize(&*device)?;
                let start = Instant::now();
                run(STEPS, &mut t)?;
                boundscope::Device::synchronize(&*device)?;
                totals[i].push(start.elapsed().as_secs_f64() * 1e3 / STEPS as f64);
            }
        }
        for ((label, regions, _), ms) in plans.iter().zip(&mut totals) {
            ms.sort_by(f64::total_cmp);
            println!(
                "boundscope AdamW over GPT-2's 148 parameters (f32), {label}: {regions} region(s), {:.3} ms per step (median of {ROUNDS}; {:.3}-{:.3})",
                ms[ROUNDS / 2],
                ms[0],
                ms[ROUNDS - 1]
            );
        }
    }
    Ok(())
}
