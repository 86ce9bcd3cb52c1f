//! GPU benchmark of bf16 plans (run on a machine with an NVIDIA GPU; elsewhere it prints a
//! SKIPPED line and exits 0). Everything goes through `Plan`, with device-resident inputs
//! (`DeviceTensor`, bf16 values two per device word):
//!
//! - the swish and norm chains of `cuda_bench` in bf16 at 2^24 and 2^28 elements, fused by
//!   `CudaFusion` (16-byte loads and stores, `f32` registers), beside a device-to-device copy
//!   of the same bytes;
//! - a bf16 matmul 8192 x 8192 x 8192 (`CudaOps`, cuBLASLt, `f32` accumulation);
//! - the transformer MLP block of `cuda_bench` in bf16.
//!
//! Lines starting `RESULT ` are JSON; `scripts/torch_baseline_bf16.py` prints PyTorch's on the
//! same GPU, and `scripts/gpu_report_bf16.py` puts both side by side:
//!
//! ```text
//! cargo build --release --example cuda_bf16_bench  # here; then on the GPU machine:
//! (./cuda_bf16_bench; python3 scripts/torch_baseline_bf16.py) | python3 scripts/gpu_report_bf16.py
//! ```
//!
//! # Results on the H200
//!
//! On the H200, side by side with PyTorch 2.11 in bf16 in one run, every input a device tensor
//! (2026-11-30, `examples/cuda_bf16_bench.rs`):
//!
//! | bf16 workload | boundscope | torch eager | `torch.compile` | copy | goal |
//! | --- | --- | --- | --- | --- | --- |
//! | swish chain, 2^24 | 3715 GB/s (2.11x compile, 106% of copy) | 1088 | 1761 | 3518 | met |
//! | swish chain, 2^28 | 4285 GB/s (1.43x, 102%) | 1276 | 2990 | 4190 | met |
//! | norm chain, 2^24 | 3366 GB/s (3.25x, 96%) | 374 | 1035 | 3522 | met |
//! | norm chain, 2^28 | 3773 GB/s (1.09x, 90%) | 413 | 3459 | 4178 | met, at the edge of 90% (90-91% in every run) |
//! | matmul 8192 x 8192 x 8192 | 808 TFLOP/s (102% of `torch.matmul`; 100-101% in the runs before) | 796 | | | met (>= 90%) |
//! | transformer MLP block | 2.905 ms (757 TFLOP/s) | 3.099 ms | 2.946 ms | | met: 1.01x `torch.compile` |
//!
//! `torch.compile` at 2^24 varies a lot between runs (1035 to 1874 GB/s for the norm chain): compare
//! at 2^28. The transformer block's plan runs 4 kernels: the first product with its bias and gelu
//! in cuBLASLt's epilogue (`linear_gelu`), the second with its bias, the residual add,
//! and layer_norm. Before gelu moved into the epilogue it took 3.07-3.11 ms (0.95-0.97x);
//! `torch.compile` also fuses the residual add into its layer_norm kernel, which is the next step
//! here.
//! Reproduce:
//! ```sh
//! cargo build --release --example cuda_bf16_bench
//! # on the GPU machine, from the repository root:
//! (target/release/examples/cuda_bf16_bench; python3 scripts/torch_baseline_bf16.py) | python3 scripts/gpu_report_bf16.py
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use boundscope::executors::cuda::{self, CudaDevice, CudaFusion, CudaOps};
use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::passes::{FuseRegions, Pass, Pipeline};
use boundscope::{
    Arena, Availability, DType, Device, DeviceTensor, Executor, Plan, Registry, RunInput, Tensor, TensorMeta, Trace,
    TraceBuilder,
};

#[path = "shared/gpu_bench.rs"]
mod gpu_bench;

use gpu_bench::{copy_ms, random_chunk};

fn main() -> ExitCode {
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: cuda_bf16_bench: {reason}");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

const COLS: usize = 1024;

fn bf16(shape: &[usize]) -> TensorMeta {
    TensorMeta::new(DType::BF16, shape)
}

/// `x = a*b + 1; y = x*sigmoid(x)`, every value bf16.
fn swish<'a>(arena: &'a Arena, registry: &'a Registry, n: usize) -> boundscope::Result<Trace<'a>> {
    let mut b = TraceBuilder::new(arena, registry);
    let (x, y) = (b.input_with(&bf16(&[n]))?, b.input_with(&bf16(&[n]))?);
    let ab = b.mul(x, y)?;
    let v = b.add_scalar(ab, 1.0)?;
    let s = b.sigmoid(v)?;
    let out = b.mul(v, s)?;
    b.output(out)?;
    b.finish()
}

/// `(x - mean) * rstd * w + b` over `[n / 1024, 1024]`, every value bf16.
fn norm<'a>(arena: &'a Arena, registry: &'a Registry, n: usize) -> boundscope::Result<Trace<'a>> {
    let rows = n / COLS;
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input_with(&bf16(&[rows, COLS]))?;
    let mean = b.input_with(&bf16(&[rows, 1]))?;
    let rstd = b.input_with(&bf16(&[rows, 1]))?;
    let w = b.input_with(&bf16(&[COLS]))?;
    let bias = b.input_with(&bf16(&[COLS]))?;
    let c = b.sub(x, mean)?;
    let m = b.mul(c, rstd)?;
    let s = b.mul(m, w)?;
    let y = b.add(s, bias)?;
    b.output(y)?;
    b.finish()
}

type Chain = for<'a> fn(&'a Arena, &'a Registry, usize) -> boundscope::Result<Trace<'a>>;

fn run() -> Result<bool, String> {
    let e = |e: boundscope::Error| e.to_string();
    let gpu = CudaDevice::new().map_err(e)?;
    let device: Arc<dyn Device> = gpu.clone();
    println!("device: {}", device.name());
    let registry = Registry::with_builtins();
    let mut all_ok = true;
    for n in [1usize << 24, 1 << 28] {
        for (chain, build) in [("swish", swish as Chain), ("norm", norm)] {
            let arena = Arena::new();
            let trace = build(&arena, &registry, n).map_err(e)?;
            let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()));
            let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).map_err(e)?;
            let plan = Plan::compile(&fused, &[fusion, Arc::new(CudaOps::new(gpu.clone()))]).map_err(e)?;
            let host = random_inputs(&trace, 7);
            let uploaded = upload(&device, &host)?;
            let inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
            let mut ws = plan.workspace().map_err(e)?;
            if n == 1 << 24 {
                // Against CpuFusion, which rounds at the same points (a region's outputs).
                let cpu_fused = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).map_err(e)?;
                let cpu = Plan::compile(&cpu_fused, &[CpuFusion::shared(), CpuReference::shared()]).map_err(e)?;
                let refs: Vec<&Tensor> = host.iter().collect();
                let expected = cpu.run(&refs).map_err(e)?;
                let got = plan.run_on_device(&mut ws, &inputs).and_then(|o| o.to_host(0)).map_err(e)?;
                let worst = got
                    .to_f32_vec()
                    .iter()
                    .zip(expected[0].to_f32_vec())
                    .map(|(g, x)| (g - x).abs() / (x.abs().max(1.0) * 2f32.powi(-7)))
                    .fold(0.0f32, f32::max);
                let ok = worst <= 1.0 && got.dtype() == DType::BF16;
                all_ok &= ok;
                println!(
                    "check bf16 {chain} n=2^24: {worst:.2} bf16 ulps from CpuFusion: {}",
                    if ok { "OK" } else { "MISMATCH" }
                );
            }
            let reps = if n > 1 << 24 { 20 } else { 100 };
            plan.run_on_device(&mut ws, &inputs).map_err(e)?;
            device.synchronize().map_err(e)?;
            let start = Instant::now();
            for _ in 0..reps {
                plan.run_on_device(&mut ws, &inputs).map_err(e)?;
            }
            device.synchronize().map_err(e)?;
            let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
            // Useful bytes: every input read once, the output written once, 2 bytes each.
            let useful: usize = trace
                .inputs()
                .iter()
                .chain(trace.outputs())
                .map(|&v| trace.value_meta(v).map(|m| m.numel() * 2).unwrap_or(0))
                .sum();
            let gbps = useful as f64 / (ms * 1e-3) / 1e9;
            // The same bytes as the bf16 tensor: n / 2 floats.
            let copy = copy_ms(n / 2, reps)?;
            let copy_gbps = (2 * n * 2) as f64 / (copy * 1e-3) / 1e9;
            println!(
                "bf16 {chain} n=2^{}: fused plan {ms:.3} ms ({gbps:.0} GB/s, {:.0}% of copy), copy {copy:.3} ms ({copy_gbps:.0} GB/s)",
                n.trailing_zeros(),
                100.0 * gbps / copy_gbps
            );
            println!(
                "RESULT {{\"impl\":\"boundscope_fused_bf16\",\"chain\":\"{chain}\",\"n\":{n},\"ms\":{ms},\"gbps\":{gbps},\"copy_gbps\":{copy_gbps}}}"
            );
        }
    }
    matmul(&gpu, &registry)?;
    transformer(&gpu, &registry)?;
    Ok(all_ok)
}

fn random_inputs(trace: &Trace<'_>, seed: u64) -> Vec<Tensor> {
    trace
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let meta = trace.value_meta(v).expect("an input");
            let chunk = random_chunk(meta.numel().clamp(1, 1 << 20), seed + k as u64);
            Tensor::from_fn(&meta.shape, |i| chunk[i % chunk.len()]).to_dtype(meta.dtype)
        })
        .collect()
}

fn upload(device: &Arc<dyn Device>, host: &[Tensor]) -> Result<Vec<DeviceTensor>, String> {
    host.iter().map(|t| DeviceTensor::upload(device, t.view()).map_err(|e| e.to_string())).collect()
}

/// `ms` per run of `plan` over `runs` runs queued back to back, after one.
fn per_run(device: &Arc<dyn Device>, plan: &Plan, inputs: &[RunInput<'_>], runs: usize) -> Result<f64, String> {
    let e = |e: boundscope::Error| e.to_string();
    let mut ws = plan.workspace().map_err(e)?;
    plan.run_on_device(&mut ws, inputs).map_err(e)?;
    device.synchronize().map_err(e)?;
    let start = Instant::now();
    for _ in 0..runs {
        plan.run_on_device(&mut ws, inputs).map_err(e)?;
    }
    device.synchronize().map_err(e)?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / runs as f64)
}

/// A bf16 matmul 8192 x 8192 x 8192 through a plan (`CudaOps`: cuBLASLt, `f32` accumulation).
fn matmul(gpu: &Arc<CudaDevice>, registry: &Registry) -> Result<(), String> {
    let e = |e: boundscope::Error| e.to_string();
    let size = 8192;
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, registry);
    let x = b.input_with(&bf16(&[size, size])).map_err(e)?;
    let y = b.input_with(&bf16(&[size, size])).map_err(e)?;
    let z = b.matmul(x, y).map_err(e)?;
    b.output(z).map_err(e)?;
    let trace = b.finish().map_err(e)?;
    let plan = Plan::compile(&trace, &[Arc::new(CudaOps::new(gpu.clone()))]).map_err(e)?;
    let device: Arc<dyn Device> = gpu.clone();
    let uploaded = upload(&device, &random_inputs(&trace, 11))?;
    let inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
    let ms = per_run(&device, &plan, &inputs, 20)?;
    let tflops = 2.0 * (size as f64).powi(3) / (ms * 1e-3) / 1e12;
    println!("bf16 matmul 8192^3: {ms:.3} ms per run ({tflops:.0} TFLOP/s)");
    println!("RESULT {{\"impl\":\"boundscope_matmul_bf16\",\"ms\":{ms},\"tflops\":{tflops}}}");
    Ok(())
}

/// The transformer MLP block of `cuda_bench` in bf16: linear, gelu (tanh), linear, residual,
/// layer_norm; [8192, 4096] activations, 16384 hidden.
fn transformer(gpu: &Arc<CudaDevice>, registry: &Registry) -> Result<(), String> {
    let e = |e: boundscope::Error| e.to_string();
    let (tokens, model, hidden) = (8192, 4096, 16384);
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, registry);
    let x = b.input_with(&bf16(&[tokens, model])).map_err(e)?;
    let w1 = b.input_with(&bf16(&[hidden, model])).map_err(e)?;
    let b1 = b.input_with(&bf16(&[hidden])).map_err(e)?;
    let w2 = b.input_with(&bf16(&[model, hidden])).map_err(e)?;
    let b2 = b.input_with(&bf16(&[model])).map_err(e)?;
    let gamma = b.input_with(&bf16(&[model])).map_err(e)?;
    let beta = b.input_with(&bf16(&[model])).map_err(e)?;
    let h = b.linear(x, w1, Some(b1)).map_err(e)?;
    let g = b.gelu(h).map_err(e)?;
    let o = b.linear(g, w2, Some(b2)).map_err(e)?;
    let r = b.add(o, x).map_err(e)?;
    let n = b.layer_norm(r, 1e-5, Some(gamma), Some(beta)).map_err(e)?;
    b.output(n).map_err(e)?;
    let trace = b.finish().map_err(e)?;
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(gpu.clone()));
    let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()));
    let prims = Pipeline::for_executors(std::slice::from_ref(&ops)).run(&trace, &arena).map_err(e)?;
    let fused = FuseRegions::new(fusion.clone()).run(&prims, &arena).map_err(e)?;
    let plan = Plan::compile(&fused, &[fusion, ops]).map_err(e)?;
    let device: Arc<dyn Device> = gpu.clone();
    let host: Vec<Tensor> = random_inputs(&trace, 21)
        .into_iter()
        .map(|t| Tensor::from_fn(t.shape(), |i| t.values::<f32>().unwrap()[i] * 0.02).to_dtype(DType::BF16))
        .collect();
    let uploaded = upload(&device, &host)?;
    let inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
    let ms = per_run(&device, &plan, &inputs, 10)?;
    let flops = 2.0 * 2.0 * (tokens * model * hidden) as f64;
    println!(
        "bf16 transformer MLP block [8192, 4096] x 16384: {ms:.3} ms per run ({:.0} TFLOP/s), {} steps",
        flops / (ms * 1e-3) / 1e12,
        plan.len()
    );
    eprintln!("{plan}");
    println!("RESULT {{\"impl\":\"boundscope_transformer_bf16\",\"ms\":{ms}}}");
    Ok(())
}
