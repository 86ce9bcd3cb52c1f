//! GPU benchmark and check of the CUDA code generated for fused regions (run on a machine with
//! an NVIDIA GPU; elsewhere it prints a SKIPPED line and exits 0).
//!
//! For `x = a*b + 1; y = x*sigmoid(x)` and a layer-norm-like chain at 2^24 and 2^28 elements
//! it runs: the fused region (one generated kernel), the same ops unfused (one generated kernel
//! each), and a device-to-device copy of the same size (the bandwidth ceiling), timed with CUDA
//! events; it checks the fused and unfused results against the CPU reference executor (at
//! 2^24), and measures the host time to launch one region. Lines starting `RESULT ` are JSON
//! for `scripts/gpu_report.py`, which puts them next to PyTorch's (`scripts/torch_baseline.py`).
//!
//! ```text
//! cargo build --release --example cuda_bench      # here; then on the GPU machine:
//! ./cuda_bench | tee results.txt                  # or: ./cuda_bench --ncu (a short run for ncu --nvtx)
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use boundscope::executors::{cuda, CpuFusion, CpuReference};
use boundscope::guards::{Guard, GuardSite, Level, NvtxRange};
use boundscope::passes::{FuseRegions, Pass};
use boundscope::{Arena, Availability, Executor, OpView, Plan, Registry, Tensor, Trace};
use cudarc::driver::{sys, CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

#[path = "../benches/chains.rs"]
mod chains;

use chains::{norm_chain, swish_chain};

const BLOCK: u32 = 256;

/// A compiled region kernel and how to launch it.
struct DeviceRegion {
    label: String,
    function: CudaFunction,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    work: usize,
    vectorized: bool,
    ops: u32,
}

/// Every region of `fused` compiled with NVRTC; `values` maps value ids to device buffers.
fn compile_regions(ctx: &Arc<CudaContext>, fused: &Trace<'_>, prefix: &str) -> Result<Vec<DeviceRegion>, String> {
    let mut regions = Vec::new();
    for (i, bsym) in fused.bound_symbols().iter().enumerate() {
        let op = view(fused, i);
        let kernel = format!("{prefix}{i}");
        let generated = cuda::region_source(&op, &kernel)?;
        let ptx = cudarc::nvrtc::compile_ptx(&generated.source).map_err(|e| format!("{e:?}\n{}", generated.source))?;
        let module = ctx.load_module(ptx).map_err(|e| e.to_string())?;
        let function = module.load_function(&kernel).map_err(|e| e.to_string())?;
        let ops: Vec<&str> = bsym.subsymbols().iter().map(|s| fused.symbol_name(s)).collect();
        regions.push(DeviceRegion {
            label: if ops.len() == 1 { ops[0].to_string() } else { format!("CudaFusion{i}: ({})", ops.join(", ")) },
            function,
            inputs: bsym.inputs().map(|v| v.index()).collect(),
            outputs: bsym.outputs().iter().map(|v| v.index()).collect(),
            work: if generated.vectorized { generated.numel / 4 } else { generated.numel },
            vectorized: generated.vectorized,
            ops: ops.len() as u32,
        });
    }
    Ok(regions)
}

fn view<'t>(trace: &'t Trace<'t>, i: usize) -> OpView<'t> {
    // Plans make OpViews; a benchmark that drives kernels itself asks the executor API for one.
    boundscope::OpView::of(trace, i).expect("a bound symbol")
}

fn launch(
    stream: &Arc<CudaStream>,
    region: &DeviceRegion,
    buffers: &mut [Option<CudaSlice<f32>>],
    n: i64,
    sms: u32,
) -> Result<(), String> {
    let grid = (region.work.div_ceil(BLOCK as usize) as u32).clamp(1, sms * 16);
    let mut outputs: smallvec::SmallVec<[CudaSlice<f32>; 2]> =
        region.outputs.iter().map(|&o| buffers[o].take().expect("allocated")).collect();
    let result = {
        let mut builder = stream.launch_builder(&region.function);
        for &k in &region.inputs {
            builder.arg(buffers[k].as_ref().expect("allocated"));
        }
        for o in outputs.iter_mut() {
            builder.arg(o);
        }
        builder.arg(&n);
        let config = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernel takes exactly these arguments: one device pointer per region input
        // and output, each buffer sized for its value, then the element count as `long long`.
        unsafe { builder.launch(config) }.map(|_| ()).map_err(|e| e.to_string())
    };
    for (&o, buffer) in region.outputs.iter().zip(outputs) {
        buffers[o] = Some(buffer);
    }
    result
}

fn main() -> ExitCode {
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: cuda_bench: {reason}");
        return ExitCode::SUCCESS;
    }
    match run(std::env::args().any(|a| a == "--ncu")) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(ncu: bool) -> Result<bool, String> {
    let ctx = CudaContext::new(0).map_err(|e| e.to_string())?;
    // SAFETY: everything here runs in order on the one default stream, so cudarc's per-buffer
    // events (which order work across streams, at a cost per launch) are not needed.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.default_stream();
    let sms = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| e.to_string())? as u32;
    println!("device: {} ({sms} SMs)", ctx.name().map_err(|e| e.to_string())?);
    let registry = Registry::with_builtins();
    let trace_range = prepare_range("cuda_bench", Level::Trace, 0)?;
    let _run = trace_range.enter();
    let sizes: &[usize] = if ncu { &[1 << 20] } else { &[1 << 24, 1 << 28] };
    let mut all_ok = true;
    for &n in sizes {
        for (chain, build) in
            [("swish", swish_chain as for<'a> fn(&'a Arena, &'a Registry, usize) -> Trace<'a>), ("norm", norm_chain)]
        {
            let arena = Arena::new();
            let trace = build(&arena, &registry, n);
            let fusion: Arc<dyn Executor> = CpuFusion::shared();
            let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).map_err(|e| e.to_string())?;
            let unfused =
                FuseRegions::new(fusion).min_ops(1).max_ops(1).run(&trace, &arena).map_err(|e| e.to_string())?;
            let start = Instant::now();
            let fused_regions = compile_regions(&ctx, &fused, "fused")?;
            let unfused_regions = compile_regions(&ctx, &unfused, "op")?;
            let compile_ms = start.elapsed().as_secs_f64() * 1e3;

            // Inputs: a random host chunk, tiled over each device buffer.
            let mut buffers: Vec<Option<CudaSlice<f32>>> = (0..trace.value_count()).map(|_| None).collect();
            let mut host_inputs = Vec::new();
            for (k, &v) in trace.inputs().iter().enumerate() {
                let shape = trace.value_meta(v).map_err(|e| e.to_string())?.shape;
                let len: usize = shape.iter().product();
                let chunk: Vec<f32> = random_chunk(len.min(1 << 22), k as u64 + 1);
                let mut device = stream.alloc_zeros::<f32>(len).map_err(|e| e.to_string())?;
                for offset in (0..len).step_by(chunk.len()) {
                    let take = chunk.len().min(len - offset);
                    let mut target = device.slice_mut(offset..offset + take);
                    stream.memcpy_htod(&chunk[..take], &mut target).map_err(|e| e.to_string())?;
                }
                buffers[v.index()] = Some(device);
                if n <= 1 << 24 {
                    host_inputs.push(Tensor::from_fn(&shape, |i| chunk[i % chunk.len()]));
                }
            }
            for (id, buffer) in buffers.iter_mut().enumerate() {
                let produced = fused_regions.iter().chain(&unfused_regions).any(|r| r.outputs.contains(&id));
                if produced && buffer.is_none() {
                    let len: usize = trace
                        .value_meta(boundscope::ValueId::from_index(id))
                        .map_err(|e| e.to_string())?
                        .shape
                        .iter()
                        .product();
                    *buffer = Some(stream.alloc_zeros::<f32>(len).map_err(|e| e.to_string())?);
                }
            }
            let n_arg = n as i64;
            let output = trace.outputs()[0].index();

            // Correctness against the CPU reference executor.
            if !host_inputs.is_empty() {
                let refs: Vec<&Tensor> = host_inputs.iter().collect();
                let expected = Plan::compile(&trace, &[CpuReference::shared()])
                    .map_err(|e| e.to_string())?
                    .run(&refs)
                    .map_err(|e| e.to_string())?;
                for (name, regions) in [("fused", &fused_regions), ("unfused", &unfused_regions)] {
                    for r in regions.iter() {
                        launch(&stream, r, &mut buffers, n_arg, sms)?;
                    }
                    let got =
                        stream.clone_dtoh(buffers[output].as_ref().expect("allocated")).map_err(|e| e.to_string())?;
                    let worst = got
                        .iter()
                        .zip(expected[0].data())
                        .map(|(g, e)| (g - e).abs() / e.abs().max(1.0))
                        .fold(0.0f32, f32::max);
                    let ok = worst <= 1e-5;
                    all_ok &= ok;
                    println!(
                        "check {chain} n=2^{} {name}: max relative difference to the CPU reference {worst:.2e}: {}",
                        n.trailing_zeros(),
                        if ok { "OK" } else { "MISMATCH" }
                    );
                }
            }

            // Timing with CUDA events: fused, unfused, and a copy of one full-size array.
            let reps = if ncu {
                2
            } else if n > 1 << 24 {
                20
            } else {
                100
            };
            let time = |what: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
                what()?;
                let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
                let (start, end) = (
                    ctx.new_event(flags).map_err(|e| e.to_string())?,
                    ctx.new_event(flags).map_err(|e| e.to_string())?,
                );
                start.record(&stream).map_err(|e| e.to_string())?;
                for _ in 0..reps {
                    what()?;
                }
                end.record(&stream).map_err(|e| e.to_string())?;
                end.synchronize().map_err(|e| e.to_string())?;
                Ok(start.elapsed_ms(&end).map_err(|e| e.to_string())? as f64 / reps as f64)
            };
            let ranges: Vec<_> = fused_regions
                .iter()
                .map(|r| prepare_range(&r.label, Level::Region, r.ops))
                .collect::<Result<_, _>>()?;
            let op_ranges: Vec<_> =
                unfused_regions.iter().map(|r| prepare_range(&r.label, Level::Op, 1)).collect::<Result<_, _>>()?;
            let fused_ms = time(&mut || {
                for (r, range) in fused_regions.iter().zip(&ranges) {
                    range.in_scope(|| launch(&stream, r, &mut buffers, n_arg, sms))?;
                }
                Ok(())
            })?;
            let unfused_ms = time(&mut || {
                for (r, range) in unfused_regions.iter().zip(&op_ranges) {
                    range.in_scope(|| launch(&stream, r, &mut buffers, n_arg, sms))?;
                }
                Ok(())
            })?;
            let mut copy_src = stream.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
            let mut copy_dst = stream.alloc_zeros::<f32>(n).map_err(|e| e.to_string())?;
            stream
                .memcpy_dtod(buffers[trace.inputs()[0].index()].as_ref().expect("input"), &mut copy_src)
                .map_err(|e| e.to_string())?;
            let copy_ms = time(&mut || stream.memcpy_dtod(&copy_src, &mut copy_dst).map_err(|e| e.to_string()))?;

            // Host time to launch one region (enqueue only).
            stream.synchronize().map_err(|e| e.to_string())?;
            let launches = if ncu { 2 } else { 200 };
            let start = Instant::now();
            for _ in 0..launches {
                launch(&stream, &fused_regions[0], &mut buffers, n_arg, sms)?;
            }
            let host_us = start.elapsed().as_secs_f64() * 1e6 / launches as f64;
            stream.synchronize().map_err(|e| e.to_string())?;

            // Useful bytes: every input read once, the output written once.
            let useful: usize = trace
                .inputs()
                .iter()
                .chain(trace.outputs())
                .map(|&v| trace.value_meta(v).map(|m| m.numel() * 4).unwrap_or(0))
                .sum();
            let gbps = |ms: f64| useful as f64 / (ms * 1e-3) / 1e9;
            let copy_gbps = (2 * n * 4) as f64 / (copy_ms * 1e-3) / 1e9;
            println!(
                "{chain} n=2^{}: fused {fused_ms:.3} ms ({:.0} GB/s, {:.0}% of copy), unfused {unfused_ms:.3} ms ({:.0} GB/s), copy {copy_ms:.3} ms ({copy_gbps:.0} GB/s), host {host_us:.2} us per region launch, NVRTC {compile_ms:.0} ms, vectorized {}",
                n.trailing_zeros(), gbps(fused_ms), 100.0 * gbps(fused_ms) / copy_gbps, gbps(unfused_ms), fused_regions.iter().all(|r| r.vectorized)
            );
            for (implementation, ms) in [("boundscope_fused", fused_ms), ("boundscope_unfused", unfused_ms)] {
                println!("RESULT {{\"impl\":\"{implementation}\",\"chain\":\"{chain}\",\"n\":{n},\"ms\":{ms},\"gbps\":{},\"copy_gbps\":{copy_gbps},\"host_us\":{host_us}}}", gbps(ms));
            }
        }
    }
    Ok(all_ok)
}

fn prepare_range(label: &str, level: Level, ops: u32) -> Result<Box<dyn boundscope::guards::ScopedGuard>, String> {
    let site = GuardSite { label, level, executor: "cuda_fusion", ops };
    NvtxRange::new().prepare(&site).map_err(|e| e.to_string())
}

fn random_chunk(len: usize, seed: u64) -> Vec<f32> {
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
