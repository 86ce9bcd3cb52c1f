//! The host side of stream runs, for counting its instructions: runs a plan of `STEPS`
//! generated `tanh` kernels (`CudaOps`, device tensors in, outputs left on the device) `RUNS`
//! times in one workspace, on the device's own stream (`device`, the default) or on one of its
//! own (`own`), and prints the host time per run.
//!
//! `scripts/host-cost` runs it under Valgrind's Callgrind against a stand-in for the CUDA driver
//! whose kernels do nothing (so that it runs on a machine without a GPU), counting only inside
//! `Plan::run_on_device`: the instructions the runtime adds per run and per step, the same on
//! every run, where a GPU machine's timings move by tens of percent between runs. On a GPU it
//! runs the real kernels (`cuda_user_executor` compares plans with launches by hand there).
//!
//! ```text
//! cargo build --release --example cuda_host_cost
//! target/release/examples/cuda_host_cost 12 10000 device
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use boundscope::executors::cuda::{self, CudaDevice, CudaOps};
use boundscope::{Arena, Availability, Device, DeviceTensor, Executor, Plan, Registry, RunInput, Tensor, TraceBuilder};

fn main() -> ExitCode {
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: cuda_host_cost: {reason}");
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| args.get(i).map_or(Ok(default), |a| a.parse::<usize>());
    let (Ok(steps), Ok(runs)) = (number(0, 12), number(1, 10_000)) else {
        eprintln!("usage: cuda_host_cost [STEPS [RUNS [device|own]]]");
        return ExitCode::from(2);
    };
    let on_device_queue = match args.get(2).map(String::as_str) {
        None | Some("device") => true,
        Some("own") => false,
        Some(other) => {
            eprintln!("unknown workspace `{other}`: `device` (the device's own stream) or `own`");
            return ExitCode::from(2);
        }
    };
    match measure(steps.max(1), runs.max(1), on_device_queue) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn measure(steps: usize, runs: usize, on_device_queue: bool) -> boundscope::Result<()> {
    let gpu = CudaDevice::new()?;
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let shape = [64usize, 256];
    let device: Arc<dyn Device> = gpu.clone();
    let x = DeviceTensor::upload(&device, Tensor::from_fn(&shape, |i| i as f32 / 1e4).view())?;
    let inputs = [RunInput::from(&x)];
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(gpu.clone()));
    let mut b = TraceBuilder::new(&arena, &registry);
    let mut h = b.input(&shape)?;
    for _ in 0..steps {
        h = b.tanh(h)?;
    }
    b.output(h)?;
    let plan = Plan::compile(&b.finish()?, std::slice::from_ref(&ops))?;
    let mut workspace = if on_device_queue { plan.workspace_on_device_queue()? } else { plan.workspace()? };
    let mut queued = std::time::Duration::ZERO;
    let mut done = 0;
    while done < runs {
        let chunk = (runs - done).min(100);
        let start = Instant::now();
        for _ in 0..chunk {
            plan.run_on_device(&mut workspace, &inputs)?;
        }
        queued += start.elapsed();
        done += chunk;
        // Outside the timed part, so that no run waits for a full launch queue.
        gpu.synchronize()?;
    }
    println!(
        "{steps} step(s), {runs} runs, {} workspace: {:.3} us of host time per run",
        if on_device_queue { "device-queue" } else { "own-stream" },
        queued.as_secs_f64() * 1e6 / runs as f64
    );
    Ok(())
}
