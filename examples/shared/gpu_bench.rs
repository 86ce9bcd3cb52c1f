//! What the GPU benchmarks (`cuda_bench`, `cuda_bf16_bench`, `transformer_ops_bench`,
//! `gpu_sweep`) share: the copy that sets the bandwidth ceiling, deterministic random data, and
//! the plan a user compiles for the GPU. (Each uses part of it.)
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Instant;

use boundscope::executors::cuda::{CudaDevice, CudaFusion, CudaOps};
use boundscope::executors::CpuReference;
use boundscope::passes::{FuseRegions, Pass, Pipeline};
use boundscope::{Arena, Executor, Plan, Trace};
use cudarc::driver::CudaContext;

/// The plan a user compiles for the GPU: composites CudaOps runs whole kept, the rest
/// decomposed and fused, on CudaFusion and CudaOps (the CPU reference for what neither runs).
pub fn gpu_plan(gpu: &Arc<CudaDevice>, trace: &Trace<'_>, arena: &Arena) -> boundscope::Result<Plan> {
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(gpu.clone()));
    let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()));
    let prims = Pipeline::for_executors(std::slice::from_ref(&ops)).run(trace, arena)?;
    let fused = FuseRegions::new(fusion.clone()).run(&prims, arena)?;
    Plan::compile(&fused, &[fusion, ops, CpuReference::shared()])
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
