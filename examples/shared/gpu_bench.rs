//! What the GPU benchmarks (`cuda_bench`, `cuda_bf16_bench`, `transformer_ops_bench`,
//! `gpu_sweep`) share: the copy that sets the bandwidth ceiling, deterministic random data, the
//! plan a user compiles for the GPU, its check against the CPU reference, and its timing with
//! device inputs. (Each uses part of it.)
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Instant;

use boundscope::executors::cuda::{CudaDevice, CudaFusion, CudaOps, KernelVariants};
use boundscope::executors::CpuReference;
use boundscope::passes::{FuseRegions, Pass, Pipeline};
use boundscope::{Arena, DType, Device, DeviceTensor, Executor, Plan, RunInput, Tensor, Trace, Workspace};
use cudarc::driver::CudaContext;

/// The plan a user compiles for the GPU: composites CudaOps runs whole kept, the rest
/// decomposed and fused, on CudaFusion and CudaOps (the CPU reference for what neither runs).
pub fn gpu_plan(gpu: &Arc<CudaDevice>, trace: &Trace<'_>, arena: &Arena) -> boundscope::Result<Plan> {
    gpu_plan_with(gpu, trace, arena, KernelVariants::default())
}

/// [`gpu_plan`], its executors generating `variants` of their kernels.
pub fn gpu_plan_with(
    gpu: &Arc<CudaDevice>,
    trace: &Trace<'_>,
    arena: &Arena,
    variants: KernelVariants,
) -> boundscope::Result<Plan> {
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(gpu.clone()).with_variants(variants));
    let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()).with_variants(variants));
    let prims = Pipeline::for_executors(std::slice::from_ref(&ops)).run(trace, arena)?;
    let fused = FuseRegions::new(fusion.clone()).run(&prims, arena)?;
    Plan::compile(&fused, &[fusion, ops, CpuReference::shared()])
}

/// `trace`'s first output through [`gpu_plan_with`] `variants` against the CPU reference on
/// `inputs`: the largest difference relative to the reference's largest magnitude (at least 1),
/// or an error naming `name` past the tolerance of `dtype` (1e-4 in f32, 2e-2 in 16 bits).
pub fn check_against_reference(
    gpu: &Arc<CudaDevice>,
    trace: &Trace<'_>,
    arena: &Arena,
    inputs: &[Tensor],
    dtype: DType,
    name: &str,
    variants: KernelVariants,
) -> Result<f32, String> {
    let e = |e: boundscope::Error| e.to_string();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let expected = Plan::compile(trace, &[CpuReference::shared()]).map_err(e)?.run(&refs).map_err(e)?;
    let got = gpu_plan_with(gpu, trace, arena, variants).map_err(e)?.run(&refs).map_err(e)?;
    let scale = expected[0].to_f32_vec().iter().fold(1f32, |m, v| m.max(v.abs()));
    let diff = got[0].max_abs_diff(&expected[0]) / scale;
    let tolerance = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
    if diff.is_nan() || diff > tolerance {
        return Err(format!("{name} {dtype}: differs from the CPU reference by {diff} (relative)"));
    }
    Ok(diff)
}

/// The useful bytes of a run of `trace`: every input read once, every output written once.
pub fn useful_bytes(trace: &Trace<'_>) -> usize {
    trace
        .inputs()
        .iter()
        .chain(trace.outputs())
        .map(|&v| trace.value_meta(v).map(|m| m.numel() * m.dtype.size_bytes()).unwrap_or(0))
        .sum()
}

/// Milliseconds per run of `plan` with `inputs` uploaded once and its outputs left on the
/// device, as a user's program runs it: 3 runs to warm up, then the mean of `reps`.
pub fn ms_per_device_run(device: &Arc<dyn Device>, plan: &Plan, inputs: &[Tensor], reps: usize) -> Result<f64, String> {
    let e = |e: boundscope::Error| e.to_string();
    let uploaded = upload_all(device, inputs)?;
    let run_inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
    let mut ws = plan.workspace().map_err(e)?;
    ms_per_run_in(device, plan, &mut ws, &run_inputs, reps)
}

/// `inputs` uploaded to `device`, each once.
pub fn upload_all(device: &Arc<dyn Device>, inputs: &[Tensor]) -> Result<Vec<DeviceTensor>, String> {
    inputs.iter().map(|t| DeviceTensor::upload(device, t.view())).collect::<Result<_, _>>().map_err(|e| e.to_string())
}

/// Milliseconds per run of `plan` in `ws` with inputs already on the device, its outputs left
/// there: 3 runs to warm up, then the mean of `reps`. Kept across calls, the workspace and the
/// inputs keep their addresses: plans timed in turn share the inputs, and each keeps its own
/// workspace from round to round.
pub fn ms_per_run_in(
    device: &Arc<dyn Device>,
    plan: &Plan,
    ws: &mut Workspace,
    run_inputs: &[RunInput<'_>],
    reps: usize,
) -> Result<f64, String> {
    let e = |e: boundscope::Error| e.to_string();
    for _ in 0..3 {
        plan.run_on_device(ws, run_inputs).map_err(e)?;
    }
    device.synchronize().map_err(e)?;
    let start = Instant::now();
    for _ in 0..reps {
        plan.run_on_device(ws, run_inputs).map_err(e)?;
    }
    device.synchronize().map_err(e)?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / reps as f64)
}

/// A device-to-device copy of `n` floats, per copy: the bandwidth ceiling, with the CUDA
/// runtime's own copy (not boundscope's).
pub fn copy_ms(n: usize, reps: usize) -> Result<f64, String> {
    let context = CudaContext::new(0).map_err(|e| e.to_string())?;
    let stream = context.default_stream();
    let source = stream.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
    let mut target = stream.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
    stream.memcpy_dtod(&source, &mut target).map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    let start = Instant::now();
    for _ in 0..reps {
        stream.memcpy_dtod(&source, &mut target).map_err(|e| e.to_string())?;
    }
    stream.synchronize().map_err(|e| e.to_string())?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / reps as f64)
}

/// `len` values in `[-1, 1)` from an xorshift generator seeded with `seed`.
pub fn random_chunk(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
