//! A training step on the GPU, timed: an MLP classifier of GPT-2's widths (8,192 tokens of
//! 768, a hidden layer of 3,072 with `gelu`, 1,024 classes, `cross_entropy`), its backward
//! from `passes::Grad` and AdamW in place, parameters and moments on the device
//! (`Plan::run_updating_on_device`), fused for `CudaFusion`; f32 (no TF32).
//!
//! ```text
//! cargo build --release --example training_bench     # then, on the GPU machine:
//! training_bench                                     # ms per step, and the loss
//! training_bench --profile                           # and the device time of each op
//! python3 scripts/torch_training.py                  # the same step in PyTorch, eager and compiled
//! ```
//! Prints `ms per step` over 50 steps after 10 of warm-up (the device synchronised before the
//! clock stops). Without a GPU it says so and exits with status 0.

use std::sync::Arc;
use std::time::Instant;

use boundscope::optim::AdamW;
use boundscope::passes::{FuseRegions, Grad, Pass, Pipeline};
use boundscope::{Arena, DType, DeviceTensor, Executor, Plan, Registry, RunInputMut, Tensor, TensorMeta, TraceBuilder};

const TOKENS: usize = 8192;
const WIDTH: usize = 768;
const HIDDEN: usize = 3072;
const CLASSES: usize = 1024;
const WARMUP: usize = 10;
const STEPS: usize = 50;

fn main() -> boundscope::Result<()> {
    #[cfg(feature = "cuda")]
    {
        use boundscope::executors::cuda::{self, CudaDevice, CudaFusion, CudaOps};
        if let boundscope::Availability::Unavailable(reason) = cuda::availability() {
            eprintln!("SKIPPED: training_bench: {reason}");
            return Ok(());
        }
        let device = CudaDevice::new()?;
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[TOKENS, WIDTH])?;
        let targets = b.input_with(&TensorMeta::new(DType::I64, &[TOKENS]))?;
        let (w1, b1) = (b.input(&[HIDDEN, WIDTH])?, b.input(&[HIDDEN])?);
        let (w2, b2) = (b.input(&[CLASSES, HIDDEN])?, b.input(&[CLASSES])?);
        let h = b.linear(x, w1, Some(b1))?;
        let h = b.gelu(h)?;
        let logits = b.linear(h, w2, Some(b2))?;
        let loss = b.cross_entropy(logits, targets)?;
        b.output(loss)?;
        let parameters = [w1, b1, w2, b2];
        let adamw = AdamW::new();
        let step = Grad::new(&parameters).training_step(&b.finish()?, &arena, &adamw)?.trace;
        let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()));
        let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(device.clone()));
        let executors = [fusion.clone(), ops];
        let mut fused =
            FuseRegions::new(fusion).run(&Pipeline::for_executors(&executors).run(&step, &arena)?, &arena)?;
        // `--profile`: device time per op and region, from CUDA events around each.
        let timer = cuda::CudaEventTimer::new(device.clone());
        let profile = std::env::args().any(|a| a == "--profile");
        if profile {
            fused.attach_guard(boundscope::guards::Selection::All, timer.clone())?;
        }
        let plan = Plan::compile(&fused, &executors)?;
        eprintln!("{plan}");

        let shared: Arc<dyn boundscope::Device> = device.clone();
        let mut inputs = Vec::new();
        for (k, &v) in step.inputs().iter().enumerate() {
            let meta = step.value_meta(v)?;
            let n: usize = meta.shape.iter().product();
            let host = match meta.dtype {
                DType::I64 => Tensor::from_vec(&meta.shape, (0..n).map(|i| ((i * 7919) % CLASSES) as i64).collect())?,
                _ if k < 6 => Tensor::from_fn(&meta.shape, |i| ((i * 7 + k * 13) % 101) as f32 / 101.0 * 0.04 - 0.02),
                _ => Tensor::from_fn(&meta.shape, |_| 0.0),
            };
            inputs.push(DeviceTensor::upload(&shared, host.view())?);
        }
        let mut workspace = plan.workspace()?;
        let mut scalars: Vec<Tensor> = (0..3).map(|_| Tensor::from_fn(&[], |_| 0.0)).collect();
        let mut step_once = |inputs: &mut [DeviceTensor], t: u64| -> boundscope::Result<()> {
            for (k, value) in adamw.step_scalars(t, 1e-3).into_iter().enumerate() {
                scalars[k].values_mut::<f32>()?[0] = value;
                inputs[6 + k].copy_from_host(scalars[k].view())?;
            }
            let mut refs: Vec<RunInputMut<'_>> = inputs.iter_mut().map(RunInputMut::from).collect();
            plan.run_updating_on_device(&mut workspace, &mut refs)?;
            Ok(())
        };
        for t in 1..=WARMUP as u64 {
            step_once(&mut inputs, t)?;
        }
        boundscope::Device::synchronize(&*device)?;
        let start = Instant::now();
        for t in 0..STEPS as u64 {
            step_once(&mut inputs, WARMUP as u64 + 1 + t)?;
        }
        boundscope::Device::synchronize(&*device)?;
        let ms = start.elapsed().as_secs_f64() * 1e3 / STEPS as f64;
        let mut refs: Vec<RunInputMut<'_>> = inputs.iter_mut().map(RunInputMut::from).collect();
        let loss = plan.run_updating_on_device(&mut workspace, &mut refs)?.to_host(0)?.to_f32_vec()[0];
        println!("boundscope training step (f32, {TOKENS}x{WIDTH} -> {HIDDEN} -> {CLASSES}, AdamW): {ms:.3} ms per step, loss {loss:.4}");
        // Device memory: the workspace's device buffers, plus the inputs (data, parameters,
        // moments), read where they are.
        let held: usize =
            step.inputs().iter().map(|&v| step.value_meta(v).map_or(0, |m| m.numel() * m.dtype.size_bytes())).sum();
        println!(
            "boundscope device memory: workspace {:.1} MiB, inputs {:.1} MiB",
            workspace.device_bytes() as f64 / (1 << 20) as f64,
            held as f64 / (1 << 20) as f64
        );
        if profile {
            let mut stats = timer.stats();
            stats.sort_by_key(|s| std::cmp::Reverse(s.total));
            for s in stats.iter().take(20) {
                println!(
                    "  {:>8.3} ms per step  {}",
                    s.total.as_secs_f64() * 1e3 / s.count.max(1) as f64
                        * (s.count as f64 / (WARMUP + STEPS + 1) as f64),
                    s.label
                );
            }
        }
    }
    Ok(())
}
