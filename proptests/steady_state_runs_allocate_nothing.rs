//! A plan run in a reused workspace allocates nothing, whatever the program: unfused or fused,
//! with guards nested deeply or not, profiling on or off, regions with up to 8 inputs and 4
//! outputs, ranks up to 6 (and a rank-9 transpose), zero-sized dimensions, and ops large enough
//! to be split over the worker threads. The counter sees the calling thread only (so that tests
//! running in parallel do not disturb each other): `worker_threads_allocate_nothing`, a binary
//! of one test, counts every thread, the worker threads included.

mod common;
#[path = "../examples/shared/gpt2.rs"]
#[allow(dead_code)]
mod gpt2;
#[cfg(feature = "cuda")]
#[path = "../examples/shared/my_gpu_executor.rs"]
mod my_gpu_executor;

use std::sync::Arc;

use boundscope::executors::{CpuFusion, CpuReference};
use std::sync::atomic::{AtomicUsize, Ordering};

use boundscope::guards::{ClosureGuard, HostTimer, NvtxRange, Selection, Timeline};
use boundscope::passes::{FuseRegions, FusionStrategy, Pass, Pipeline, ProfileOps};
use boundscope::{Arena, Executor, Plan, Registry, Tensor, Trace, TraceBuilder};
use common::allocations::{allocations_during, CountingAllocator};
use common::program::{programs, programs_of};
use proptest::prelude::*;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn the_counter_counts() {
    assert_eq!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 64]))), 1);
}

/// Heap allocations made by three runs after a warm-up run, in one workspace.
fn steady_state_allocations(plan: &Plan, inputs: &[Tensor]) -> usize {
    let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
    let mut workspace = plan.workspace().unwrap();
    plan.run_with(&mut workspace, &views).unwrap();
    allocations_during(|| {
        for _ in 0..3 {
            plan.run_with(&mut workspace, &views).unwrap();
        }
    })
}

/// Attaches `nested` distinct closure guards around the run (each its own scope, nested), a
/// closure guard and a timer on every op, and (when `profile`) an NVTX range per op. (Not a
/// `Recorder`: it keeps the ranges it records, up to its capacity, so its memory grows with
/// them by design.)
fn guard(trace: &mut Trace<'_>, nested: usize, profile: bool) {
    let entries = Arc::new(AtomicUsize::new(0));
    let counter = || {
        let entries = entries.clone();
        ClosureGuard::new(
            move || {
                entries.fetch_add(1, Ordering::Relaxed);
            },
            || {},
        )
    };
    for _ in 0..nested {
        trace.attach_trace_guard(counter()).unwrap();
    }
    trace.attach_guard(Selection::All, counter()).unwrap();
    trace.attach_guard(Selection::All, HostTimer::new()).unwrap();
    if profile {
        trace.attach_guard(Selection::All, NvtxRange::new()).unwrap();
    }
}

/// A region-shaped program: `inputs` inputs of one shape combined by a chain of binary ops,
/// unary ops after, and `outputs` of the intermediate values returned.
#[derive(Clone, Debug)]
struct Wide {
    shape: Vec<usize>,
    inputs: usize,
    unary: usize,
    outputs: usize,
}

fn wide_programs() -> impl Strategy<Value = Wide> {
    let shape = prop::collection::vec(0usize..4, 1..7);
    (shape, 1usize..9, 0usize..4, 1usize..5).prop_map(|(shape, inputs, unary, outputs)| Wide {
        shape,
        inputs,
        unary,
        outputs,
    })
}

impl Wide {
    fn build<'a>(&self, arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
        let mut b = TraceBuilder::new(arena, registry);
        let inputs: Vec<_> = (0..self.inputs).map(|_| b.input(&self.shape).unwrap()).collect();
        let mut values = vec![inputs[0]];
        for (i, &x) in inputs.iter().enumerate().skip(1) {
            let last = *values.last().unwrap();
            values.push(if i % 2 == 0 { b.mul(last, x).unwrap() } else { b.add(last, x).unwrap() });
        }
        for i in 0..self.unary {
            let last = *values.last().unwrap();
            values.push(if i % 2 == 0 { b.tanh(last).unwrap() } else { b.neg(last).unwrap() });
        }
        if values.len() == 1 {
            let only = values[0];
            values.push(b.exp(only).unwrap());
        }
        // The last value and up to three earlier results (not inputs).
        let results = &values[self.inputs.min(values.len() - 1)..];
        for &v in results.iter().rev().take(self.outputs) {
            b.output(v).unwrap();
        }
        b.finish().unwrap()
    }

    fn input_data(&self) -> Vec<Tensor> {
        (0..self.inputs).map(|k| Tensor::from_fn(&self.shape, |i| (i + k) as f32 / 7.0 - 0.5)).collect()
    }
}

fn strategies() -> impl Strategy<Value = FusionStrategy> {
    prop_oneof![Just(FusionStrategy::Consecutive), Just(FusionStrategy::Dataflow)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After one warm-up run, running a plan again in the same workspace makes zero heap
    /// allocations, for random programs including composites.
    #[test]
    fn steady_state_runs_allocate_nothing(program in programs(true), seed in any::<u64>()) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = program.build(&arena, &registry).unwrap();
        let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let count = steady_state_allocations(&plan, &program.input_data(seed));
        prop_assert_eq!(count, 0, "{} steps", plan.len());
    }

    /// The same for fused plans with guards: nested up to 20 deep around the run, on every op
    /// and region, profiling on or off.
    #[test]
    fn fused_and_guarded_runs_allocate_nothing(
        program in programs(true),
        strategy in strategies(),
        block in 1usize..64,
        nested in 0usize..20,
        profile in any::<bool>(),
        profiling_on in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = Pipeline::standard().run(&program.build(&arena, &registry).unwrap(), &arena).unwrap();
        let profiled = if profile { ProfileOps::new().run(&trace, &arena).unwrap() } else { trace };
        let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new().block_size(block));
        let mut fused = FuseRegions::new(fusion.clone()).strategy(strategy).run(&profiled, &arena).unwrap();
        guard(&mut fused, nested, profile);
        let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
        plan.set_profiling(profiling_on);
        let count = steady_state_allocations(&plan, &program.input_data(seed));
        prop_assert_eq!(count, 0, "{}", plan);
    }

    /// Regions with up to 8 inputs and 4 outputs, ranks up to 6, zero-sized dimensions; fused
    /// and unfused, guarded.
    #[test]
    fn wide_regions_allocate_nothing(wide in wide_programs(), block in 1usize..64, nested in 0usize..20) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = wide.build(&arena, &registry);
        let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new().block_size(block));
        let mut fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
        guard(&mut fused, nested, true);
        let inputs = wide.input_data();
        let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
        prop_assert_eq!(steady_state_allocations(&plan, &inputs), 0, "{}", plan);
        let mut unfused = trace.clone();
        guard(&mut unfused, nested, true);
        let plan = Plan::compile(&unfused, &[CpuReference::shared()]).unwrap();
        prop_assert_eq!(steady_state_allocations(&plan, &inputs), 0, "{}", plan);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Programs over tensors of 2^17 to 2^19 elements, which the CPU executors split over the
    /// machine's cores: fused and unfused, guarded and profiled, still allocate nothing (on any
    /// thread) after the first run.
    #[test]
    fn runs_split_over_threads_allocate_nothing(
        program in programs_of((256usize..512, 512usize..1024, 1usize..3), false),
        nested in 0usize..4,
        seed in any::<u64>(),
    ) {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            eprintln!("SKIPPED: one core here, so no op is split over threads");
            return Ok(());
        }
        // A rare draw (an outer product of two long vectors) asks for terabytes: a typed
        // `OutOfMemory` from the workspace, not what this test is about.
        prop_assume!(program.largest_value() <= 1 << 24);
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = program.build(&arena, &registry).unwrap();
        let inputs = program.input_data(seed);
        let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        prop_assert_eq!(steady_state_allocations(&plan, &inputs), 0, "{}", plan);
        let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new());
        let mut fused = FuseRegions::new(fusion.clone()).run(&ProfileOps::new().run(&trace, &arena).unwrap(), &arena).unwrap();
        guard(&mut fused, nested, true);
        let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
        plan.set_profiling(true);
        prop_assert_eq!(steady_state_allocations(&plan, &inputs), 0, "{}", plan);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A `Timeline` on the run and on every op or region, with any buffer capacity (full
    /// buffers included), adds no allocation to a run once the running thread's buffer is
    /// reserved by the warm-up run, before and after a drain.
    #[test]
    fn a_timeline_allocates_nothing_after_warm_up(
        program in programs(true),
        capacity in 0usize..64,
        seed in any::<u64>(),
    ) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = Pipeline::standard().run(&program.build(&arena, &registry).unwrap(), &arena).unwrap();
        let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new());
        let mut fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
        let timeline = Timeline::with_capacity(capacity);
        fused.attach_trace_guard(timeline.clone()).unwrap();
        fused.attach_guard(Selection::All, timeline.clone()).unwrap();
        let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
        let inputs = program.input_data(seed);
        prop_assert_eq!(steady_state_allocations(&plan, &inputs), 0, "{}", plan);
        // Four runs: what the buffer holds, and the rest counted as dropped.
        let scopes = 4 * (1 + fused.len());
        let chrome = timeline.to_chrome_trace();
        let kept = chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count();
        prop_assert_eq!(kept, scopes.min(capacity));
        prop_assert_eq!(timeline.dropped_scopes() as usize, scopes - kept);
        // The drain kept the buffer's memory.
        prop_assert_eq!(steady_state_allocations(&plan, &inputs), 0, "{}", plan);
    }
}

#[test]
fn a_rank_9_transpose_allocates_nothing() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let shape = [2, 1, 2, 1, 2, 1, 2, 1, 2];
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&shape).unwrap();
    let y = b.transpose(x, &[8, 7, 6, 5, 4, 3, 2, 1, 0]).unwrap();
    b.output(y).unwrap();
    let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    let input = Tensor::from_fn(&shape, |i| i as f32);
    assert_eq!(steady_state_allocations(&plan, std::slice::from_ref(&input)), 0);
    // And it is right: reversing every axis of this shape reverses the flat order's bits.
    let out = plan.run(&[&input]).unwrap();
    let expected: Vec<f32> = (0..32u32).map(|i| (i.reverse_bits() >> 27) as f32).collect();
    assert_eq!(out[0].to_f32_vec(), expected.as_slice());
}

#[test]
fn a_session_run_allocates_only_what_a_plan_run_does() {
    use boundscope::frontend::{Environment, ProfiledSession};
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[16, 32]).unwrap();
    let w = b.input(&[32, 32]).unwrap();
    let h = b.linear(x, w, None).unwrap();
    let y = b.gelu(h).unwrap();
    let z = b.softmax(y).unwrap();
    b.output(z).unwrap();
    let trace = b.finish().unwrap();
    // `runtime.device` is `auto`: the GPU where there is one (the CUDA executors), else the CPU.
    let env = Environment::from_pairs(&[("BOUNDSCOPE_NVTX", "1")]);
    let session = ProfiledSession::new(boundscope::options::Options::new(), &env).unwrap();
    let inputs = [Tensor::from_fn(&[16, 32], |i| i as f32 / 512.0), Tensor::zeros(&[32, 32])];
    let refs = [&inputs[0], &inputs[1]];
    session.run(&trace, &arena, &refs).unwrap();
    let plan = session.plan(&trace, &arena).unwrap();
    plan.run(&refs).unwrap();
    let by_plan = allocations_during(|| drop(plan.run(&refs).unwrap()));
    let by_session = allocations_during(|| drop(session.run(&trace, &arena, &refs).unwrap()));
    assert_eq!(by_session, by_plan, "the session adds no allocation to a plan's run (its owned outputs)");
    // And through a workspace of one's own, nothing at all.
    assert_eq!(steady_state_allocations(&plan, &inputs), 0);
}

/// Host allocations of three runs of `plan` with `inputs` uploaded to `device` (after a first
/// run, which warms the workspace up).
#[cfg(feature = "cuda")]
fn device_run_allocations(
    plan: &Plan,
    device: &Arc<boundscope::executors::cuda::CudaDevice>,
    inputs: &[Tensor],
) -> usize {
    use boundscope::{DeviceTensor, RunInput};
    let shared: Arc<dyn boundscope::Device> = device.clone();
    let on_device: Vec<DeviceTensor> =
        inputs.iter().map(|t| DeviceTensor::upload(&shared, t.view()).unwrap()).collect();
    let run_inputs: Vec<RunInput<'_>> = on_device.iter().map(RunInput::from).collect();
    let mut workspace = plan.workspace().unwrap();
    plan.run_on_device(&mut workspace, &run_inputs).unwrap();
    allocations_during(|| {
        for _ in 0..3 {
            plan.run_on_device(&mut workspace, &run_inputs).unwrap();
        }
    })
}

/// On a GPU: a fused, profiled plan on the CUDA executors (generated kernels, cuBLAS matmul,
/// the softmax's reduction) run with device-resident inputs, and with host inputs uploaded and
/// outputs downloaded, allocates nothing after its first run. Elsewhere it says why it is
/// skipped.
#[cfg(feature = "cuda")]
#[test]
fn cuda_runs_allocate_nothing() {
    use boundscope::executors::cuda::{self, CudaDevice, CudaFusion, CudaOps};
    use boundscope::Availability;
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: cuda_runs_allocate_nothing: {reason}; run this test binary on a GPU machine");
        return;
    }
    let device = CudaDevice::new().unwrap();
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[64, 256]).unwrap();
    let w = b.input(&[256, 256]).unwrap();
    let h = b.matmul(x, w).unwrap();
    let g = b.gelu(h).unwrap();
    let y = b.softmax(g).unwrap();
    b.output(y).unwrap();
    let trace = Pipeline::standard().run(&b.finish().unwrap(), &arena).unwrap();
    let profiled = ProfileOps::new().run(&trace, &arena).unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(device.clone()));
    let fused = FuseRegions::new(fusion.clone()).run(&profiled, &arena).unwrap();
    let plan =
        Plan::compile(&fused, &[fusion, Arc::new(CudaOps::new(device.clone())), CpuReference::shared()]).unwrap();
    plan.set_profiling(true);
    let inputs = [
        Tensor::from_fn(&[64, 256], |i| (i % 7) as f32 / 7.0),
        Tensor::from_fn(&[256, 256], |i| (i % 5) as f32 / 50.0),
    ];
    assert_eq!(device_run_allocations(&plan, &device, &inputs), 0, "device-resident runs\n{plan}");
    assert_eq!(steady_state_allocations(&plan, &inputs), 0, "host inputs in, outputs out\n{plan}");
}

/// A CudaFusion region of more buffers than a launch lists on the stack (12 inputs, 6 outputs)
/// launches without allocating once warm (its lists are kept per thread). On a GPU machine
/// only.
#[cfg(feature = "cuda")]
#[test]
fn a_cuda_region_of_many_buffers_allocates_nothing() {
    use boundscope::executors::cuda::{self, CudaDevice, CudaFusion, CudaOps};
    use boundscope::Availability;
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!(
            "SKIPPED: a_cuda_region_of_many_buffers_allocates_nothing: {reason}; run this test binary on a GPU machine"
        );
        return;
    }
    let device = CudaDevice::new().unwrap();
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let xs: Vec<_> = (0..12).map(|_| b.input(&[64]).unwrap()).collect();
    let mut sum = xs[0];
    for (k, &x) in xs.iter().enumerate().skip(1) {
        sum = b.add(sum, x).unwrap();
        if k % 2 == 1 {
            b.output(sum).unwrap();
        }
    }
    let trace = b.finish().unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(device.clone()));
    let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
    let plan =
        Plan::compile(&fused, &[fusion, Arc::new(CudaOps::new(device.clone())), CpuReference::shared()]).unwrap();
    let regions = plan.steps_per_executor().into_iter().find(|(name, _)| *name == "cuda_fusion");
    assert_eq!(regions, Some(("cuda_fusion", 1)), "one region of 18 buffers\n{plan}");
    let inputs: Vec<Tensor> = (0..12).map(|k| Tensor::from_fn(&[64], |i| (i + k) as f32 * 0.01)).collect();
    assert_eq!(device_run_allocations(&plan, &device, &inputs), 0, "device-resident runs\n{plan}");
    // And the region computes what it should: the last sum is every input's.
    let out = plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap();
    let expected: Vec<f32> = (0..64).map(|i| (0..12).map(|k| (i + k) as f32 * 0.01).sum()).collect();
    let last = out.last().unwrap().to_f32_vec();
    assert!(last.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-4), "{last:?}");
}

/// A user's GPU executor (`MyGpu`: an NVRTC kernel of its own, and a cuBLAS call with a handle
/// per workspace) beside `CudaOps`: device-resident runs allocate nothing after the first (in
/// which its per-workspace state is made), except what cuBLAS's own `sgemm` allocates, which is
/// measured by calling it by hand on the same shapes. On a GPU machine only.
#[cfg(feature = "cuda")]
#[test]
fn a_users_gpu_executor_allocates_nothing() {
    use boundscope::executors::cuda::cudarc::cublas::{sys, CudaBlas, Gemm, GemmConfig};
    use boundscope::executors::cuda::{self, CudaDevice, CudaOps};
    use boundscope::{Availability, DeviceTensor, RunInput};
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: a_users_gpu_executor_allocates_nothing: {reason}; run this test binary on a GPU machine");
        return;
    }
    let device = CudaDevice::new().unwrap();
    let registry = my_gpu_executor::registry().unwrap();
    let arena = Arena::new();
    let shared: Arc<dyn boundscope::Device> = device.clone();
    let (m, k, n) = (64, 256, 256);
    let upload = |t: &Tensor| DeviceTensor::upload(&shared, t.view()).unwrap();
    let (x, w, bias) = (
        upload(&Tensor::from_fn(&[m, k], |i| (i % 7) as f32 / 7.0)),
        upload(&Tensor::from_fn(&[k, n], |i| (i % 5) as f32 / 50.0)),
        upload(&Tensor::from_fn(&[n], |i| (i % 3) as f32 / 3.0)),
    );
    let runs_allocate = |trace: &Trace<'_>, inputs: &[&DeviceTensor]| {
        let profiled = ProfileOps::new().run(trace, &arena).unwrap();
        let mine: Arc<dyn Executor> = Arc::new(my_gpu_executor::MyGpu::new(device.clone()).unwrap());
        let plan = Plan::compile(&profiled, &[mine, Arc::new(CudaOps::new(device.clone()))]).unwrap();
        plan.set_profiling(true);
        let run_inputs: Vec<RunInput<'_>> = inputs.iter().map(|t| RunInput::from(*t)).collect();
        let mut workspace = plan.workspace().unwrap();
        plan.run_on_device(&mut workspace, &run_inputs).unwrap();
        let count = allocations_during(|| {
            for _ in 0..3 {
                plan.run_on_device(&mut workspace, &run_inputs).unwrap();
            }
        });
        (count, plan.to_string())
    };
    // The NVRTC kernel, with CudaOps' tanh after it: nothing.
    let mut b = TraceBuilder::new(&arena, &registry);
    let (h, bias_in) = (b.input(&[m, n]).unwrap(), b.input(&[n]).unwrap());
    let g = b.call("bias_gelu", &[h.into(), bias_in.into()]).unwrap();
    let y = b.tanh(g).unwrap();
    b.output(y).unwrap();
    let h_on_device = upload(&Tensor::from_fn(&[m, n], |i| (i % 11) as f32 / 11.0));
    let (count, plan) = runs_allocate(&b.finish().unwrap(), &[&h_on_device, &bias]);
    assert_eq!(count, 0, "device-resident runs with a user's NVRTC kernel\n{plan}");

    // The whole program, cuBLAS included: what three sgemm calls by hand allocate, no more.
    let trace = my_gpu_executor::program(&arena, &registry, m, k, n).unwrap();
    let (count, plan) = runs_allocate(&trace, &[&x, &w, &bias]);
    let stream = device.context().new_stream().unwrap();
    let blas = CudaBlas::new(stream.clone()).unwrap();
    let (a, bm) = (stream.alloc_zeros::<f32>(m * k).unwrap(), stream.alloc_zeros::<f32>(k * n).unwrap());
    let mut c = stream.alloc_zeros::<f32>(m * n).unwrap();
    let (mi, ki, ni) = (m as i32, k as i32, n as i32);
    let config = GemmConfig {
        transa: sys::cublasOperation_t::CUBLAS_OP_N,
        transb: sys::cublasOperation_t::CUBLAS_OP_N,
        m: ni,
        n: mi,
        k: ki,
        alpha: 1.0f32,
        lda: ni,
        ldb: ki,
        beta: 0.0,
        ldc: ni,
    };
    // SAFETY: the buffers hold k x n, m x k and m x n values.
    unsafe { blas.gemm(config, &bm, &a, &mut c) }.unwrap();
    let by_hand = allocations_during(|| {
        for _ in 0..3 {
            // SAFETY: as above.
            unsafe { blas.gemm(config, &bm, &a, &mut c) }.unwrap();
        }
    });
    stream.synchronize().unwrap();
    println!("three runs with cuBLAS: {count} allocations; three sgemm calls by hand: {by_hand}");
    assert_eq!(count, by_hand, "the plan adds no allocation to cuBLAS's own\n{plan}");
}

/// Staged transfers (1 MiB and more) allocate nothing per run and pin nothing after the first,
/// in `f32` and in 16 bits, however many sizes a plan moves: [1024, 1024] inputs of each dtype
/// (the sizes of a transformer's activations), and a plan with 12 distinct transfer sizes (more
/// than the 8 staging buffers a device used to keep, one per size). On a GPU machine only.
#[cfg(feature = "cuda")]
#[test]
fn staged_cuda_transfers_allocate_nothing_and_pin_once() {
    use boundscope::executors::cuda::{self, CudaDevice, CudaOps};
    use boundscope::{Availability, DType};
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: staged_cuda_transfers_allocate_nothing_and_pin_once: {reason}; run this test binary on a GPU machine");
        return;
    }
    let device = CudaDevice::new().unwrap();
    let registry = Registry::with_builtins();
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()));
    let mut shapes: Vec<(DType, Vec<usize>)> =
        [DType::F32, DType::BF16, DType::F16].into_iter().map(|d| (d, vec![1024, 1024])).collect();
    // 12 sizes from 1 MiB up (in device words).
    shapes.extend((0..12).map(|k| (DType::F32, vec![(1 << 18) + k * 40_000])));
    let arena = Arena::new();
    let trace = exp_of_each(&arena, &registry, &shapes);
    let plan = Plan::compile(&trace, &[ops]).unwrap();
    let inputs: Vec<Tensor> = shapes
        .iter()
        .map(|(dtype, shape)| Tensor::from_fn(shape, |i| (i % 11) as f32 / 11.0).to_dtype(*dtype))
        .collect();
    // The warm-up run pins the staging memory, once.
    let pinned = device.pinned_allocations();
    assert_eq!(steady_state_allocations(&plan, &inputs), 0, "staged transfers\n{plan}");
    assert!(device.pinned_allocations() - pinned <= 2, "pinned {} times", device.pinned_allocations() - pinned);
    let pinned = device.pinned_allocations();
    assert_eq!(steady_state_allocations(&plan, &inputs), 0);
    assert_eq!(device.pinned_allocations(), pinned, "nothing pinned again");
    // And the results are whole.
    let out = plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap();
    let expected =
        Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&inputs.iter().collect::<Vec<_>>()).unwrap();
    for (got, want) in out.iter().zip(&expected) {
        let worst = got.to_f32_vec().iter().zip(want.to_f32_vec()).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst <= 1e-2, "{worst}");
    }
}

/// `exp` of an input of each dtype and shape, each an output.
#[cfg(feature = "cuda")]
fn exp_of_each<'a>(arena: &'a Arena, registry: &'a Registry, shapes: &[(boundscope::DType, Vec<usize>)]) -> Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    for (dtype, shape) in shapes {
        let x = b.input_with(&boundscope::TensorMeta::new(*dtype, shape)).unwrap();
        let y = b.exp(x).unwrap();
        b.output(y).unwrap();
    }
    b.finish().unwrap()
}

/// A bf16 region of 6 inputs and 3 outputs on CpuFusion (computed in f32 scratch), and the new
/// ops on the CPU reference (a batched product, a slice, a gather, comparisons and `where`, a
/// reduction over a middle axis): no allocation after the first run.
#[test]
fn wide_bf16_regions_and_transformer_ops_allocate_nothing() {
    use boundscope::{DType, TensorMeta};
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let xs: Vec<_> = (0..6).map(|_| b.input_with(&TensorMeta::new(DType::BF16, &[4, 8])).unwrap()).collect();
    let s = b.add(xs[0], xs[1]).unwrap();
    let s = b.mul(s, xs[2]).unwrap();
    let t = b.sub(s, xs[3]).unwrap();
    let u = b.div(t, xs[4]).unwrap();
    let v = b.maximum(u, xs[5]).unwrap();
    for y in [s, t, v] {
        b.output(y).unwrap();
    }
    let trace = b.finish().unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new());
    let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
    let inputs: Vec<Tensor> =
        (0..6).map(|k| Tensor::from_fn(&[4, 8], |i| (i + k) as f32 * 0.25 + 1.0).to_dtype(DType::BF16)).collect();
    let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
    assert!(plan.to_string().contains("cpu_fusion"), "{plan}");
    assert_eq!(steady_state_allocations(&plan, &inputs), 0, "{plan}");

    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input_with(&TensorMeta::new(DType::BF16, &[2, 3, 4])).unwrap();
    let w = b.input_with(&TensorMeta::new(DType::BF16, &[4, 5])).unwrap();
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[2, 3])).unwrap();
    let y = b.matmul(x, w).unwrap();
    let sl = b.slice(y, 2, 1, 4).unwrap();
    let picked = b.gather_last(sl, ids).unwrap();
    let m = b.compare_scalar(boundscope::prims::GT, picked, 0.0).unwrap();
    let z = b.where_scalar(m, picked, -1.0).unwrap();
    let r = b.sum_dim(y, 1, false).unwrap();
    // A sum over more than 256 rows of another axis than the last: its levels of running sums
    // are the kernel's, made when the plan compiles.
    let columns = b.input(&[3, 300, 4]).unwrap();
    let c = b.sum_dim(columns, 1, false).unwrap();
    b.output(z).unwrap();
    b.output(r).unwrap();
    b.output(c).unwrap();
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let inputs = [
        Tensor::from_fn(&[2, 3, 4], |i| i as f32 * 0.1 - 1.0).to_dtype(DType::BF16),
        Tensor::from_fn(&[4, 5], |i| i as f32 * 0.05).to_dtype(DType::BF16),
        Tensor::from_vec(&[2, 3], vec![0i64, 1, 2, 2, 1, 0]).unwrap(),
        Tensor::from_fn(&[3, 300, 4], |i| i as f32 * 1e-3),
    ];
    assert_eq!(steady_state_allocations(&plan, &inputs), 0, "{plan}");
}

/// A training step: an embedding, an MLP and `cross_entropy`, profiled, differentiated
/// (`passes::Grad`), every parameter updated in place by AdamW, fused: after a warm-up, steps
/// through `run_updating` (the learning rate and bias corrections changed each step, in place)
/// allocate nothing.
#[test]
fn a_training_step_allocates_nothing() {
    use boundscope::optim::AdamW;
    use boundscope::passes::Grad;
    use boundscope::{DType, TensorMeta};
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[8])).unwrap();
    let targets = b.input_with(&TensorMeta::new(DType::I64, &[8])).unwrap();
    let (wte, w1, b1, w2) = (
        b.input(&[10, 16]).unwrap(),
        b.input(&[32, 16]).unwrap(),
        b.input(&[32]).unwrap(),
        b.input(&[10, 32]).unwrap(),
    );
    let x = b.embedding(wte, ids).unwrap();
    let h = b
        .scope("mlp", |b| {
            let h = b.linear(x, w1, Some(b1))?;
            b.gelu(h)
        })
        .unwrap();
    let logits = b.linear(h, w2, None).unwrap();
    let loss = b.cross_entropy(logits, targets).unwrap();
    b.output(loss).unwrap();
    let forward = ProfileOps::new().run(&b.finish().unwrap(), &arena).unwrap();
    let params = [wte, w1, b1, w2];
    let adamw = AdamW::new();
    let train = Grad::new(&params).training_step(&forward, &arena, &adamw).unwrap().trace;
    let fusion = CpuFusion::shared();
    let train = FuseRegions::new(fusion.clone()).run(&train, &arena).unwrap();
    let plan = Plan::compile(&train, &[fusion, CpuReference::shared()]).unwrap();
    let mut tensors: Vec<Tensor> = train
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let meta = train.value_meta(v).unwrap();
            match meta.dtype {
                DType::I64 => Tensor::from_vec(&meta.shape, (0..8).map(|i| (i * 3 + k as i64) % 10).collect()).unwrap(),
                _ if k < 6 => Tensor::from_fn(&meta.shape, |i| ((i * 7 + k * 13) % 17) as f32 / 17.0 - 0.5),
                _ => Tensor::from_fn(&meta.shape, |_| 0.0),
            }
        })
        .collect();
    let mut refs: Vec<&mut Tensor> = tensors.iter_mut().collect();
    let mut workspace = plan.workspace().unwrap();
    let set_step = |refs: &mut [&mut Tensor], t: u64| {
        for (slot, value) in refs[6..9].iter_mut().zip(adamw.step_scalars(t, 1e-2)) {
            slot.values_mut::<f32>().unwrap()[0] = value;
        }
    };
    set_step(&mut refs, 1);
    let first = plan.run_updating(&mut workspace, &mut refs).unwrap().get(0).unwrap().values::<f32>().unwrap()[0];
    let mut last = first;
    let allocations = allocations_during(|| {
        for t in 2..5 {
            set_step(&mut refs, t);
            last = plan.run_updating(&mut workspace, &mut refs).unwrap().get(0).unwrap().values::<f32>().unwrap()[0];
        }
    });
    assert_eq!(allocations, 0, "{plan}");
    assert!(last < first, "the loss went from {first} to {last}");
}

/// A training step on the GPU with its parameters and AdamW moments on the device
/// (`Plan::run_updating_on_device`, updates written over the inputs): after a warm-up step, steps
/// allocate nothing on the host. On a GPU machine only.
#[cfg(feature = "cuda")]
#[test]
fn a_training_step_on_the_gpu_allocates_nothing() {
    use boundscope::executors::cuda::{self, CudaDevice, CudaFusion, CudaOps};
    use boundscope::optim::AdamW;
    use boundscope::passes::Grad;
    use boundscope::{Availability, DType, DeviceTensor, RunInputMut, TensorMeta};
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!(
            "SKIPPED: a_training_step_on_the_gpu_allocates_nothing: {reason}; run this test binary on a GPU machine"
        );
        return;
    }
    let device = CudaDevice::new().unwrap();
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[64])).unwrap();
    let targets = b.input_with(&TensorMeta::new(DType::I64, &[64])).unwrap();
    let (wte, w1, w2) = (b.input(&[100, 128]).unwrap(), b.input(&[256, 128]).unwrap(), b.input(&[100, 256]).unwrap());
    let x = b.embedding(wte, ids).unwrap();
    let h = b.linear(x, w1, None).unwrap();
    let h = b.gelu(h).unwrap();
    let logits = b.linear(h, w2, None).unwrap();
    let loss = b.cross_entropy(logits, targets).unwrap();
    b.output(loss).unwrap();
    let params = [wte, w1, w2];
    let forward = ProfileOps::new().run(&b.finish().unwrap(), &arena).unwrap();
    let adamw = AdamW::new();
    let step = Grad::new(&params).training_step(&forward, &arena, &adamw).unwrap().trace;
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()));
    let prims = Pipeline::for_executors(std::slice::from_ref(&ops)).run(&step, &arena).unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(device.clone()));
    let fused = FuseRegions::new(fusion.clone()).run(&prims, &arena).unwrap();
    let plan = Plan::compile(&fused, &[fusion, ops]).unwrap();
    let shared: Arc<dyn boundscope::Device> = device.clone();
    let mut on_device: Vec<DeviceTensor> = step
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let meta = step.value_meta(v).unwrap();
            let host = match meta.dtype {
                DType::I64 => {
                    Tensor::from_vec(&meta.shape, (0..64).map(|i| (i * 7 + k as i64) % 100).collect()).unwrap()
                }
                _ if k < 5 => Tensor::from_fn(&meta.shape, |i| ((i * 7 + k * 13) % 23) as f32 / 230.0 - 0.05),
                _ => Tensor::from_fn(&meta.shape, |_| 0.0),
            };
            DeviceTensor::upload(&shared, host.view()).unwrap()
        })
        .collect();
    let mut hyper_values: Vec<Tensor> = (0..3).map(|_| Tensor::from_fn(&[], |_| 0.0)).collect();
    let mut workspace = plan.workspace().unwrap();
    let mut set_step = |on_device: &mut [DeviceTensor], t: u64| {
        for (k, value) in adamw.step_scalars(t, 1e-2).into_iter().enumerate() {
            hyper_values[k].values_mut::<f32>().unwrap()[0] = value;
            on_device[5 + k].copy_from_host(hyper_values[k].view()).unwrap();
        }
    };
    set_step(&mut on_device, 1);
    let first = {
        let mut inputs: Vec<RunInputMut<'_>> = on_device.iter_mut().map(RunInputMut::from).collect();
        plan.run_updating_on_device(&mut workspace, &mut inputs).unwrap().to_host(0).unwrap().to_f32_vec()[0]
    };
    let allocations = allocations_during(|| {
        for t in 2..5 {
            set_step(&mut on_device, t);
            let [ids, targets, wte, w1, w2, lr, size, root, m0, v0, m1, v1, m2, v2] = &mut on_device[..] else {
                panic!("14 inputs")
            };
            let mut inputs = [ids, targets, wte, w1, w2, lr, size, root, m0, v0, m1, v1, m2, v2].map(RunInputMut::from);
            plan.run_updating_on_device(&mut workspace, &mut inputs).unwrap();
        }
    });
    let mut inputs: Vec<RunInputMut<'_>> = on_device.iter_mut().map(RunInputMut::from).collect();
    let last = plan.run_updating_on_device(&mut workspace, &mut inputs).unwrap().to_host(0).unwrap().to_f32_vec()[0];
    assert_eq!(allocations, 0, "{plan}");
    assert!(last < first, "the loss went from {first} to {last}");
}

/// GPT-2's training step (the tiny config: 2 layers, width 64, 4 heads, batch 2 x 128 tokens;
/// attention, `layer_norm`, `cross_entropy`, `passes::Grad`, AdamW in place), compiled by the
/// front end as `examples/gpt2.rs` compiles it, in f32 and with bf16 compute: after a warm-up
/// step, a step's run allocates nothing on the host, on the CPU and (on a GPU machine, with
/// cuDNN's attention and its backward) on the GPU. Only the run is counted: the caller's own
/// list of inputs is built outside it.
#[test]
fn a_gpt2_training_step_allocates_nothing() {
    use boundscope::frontend::{Environment, ProfiledSession};
    use boundscope::optim::AdamW;
    use boundscope::options::Options;
    use boundscope::passes::Grad;
    use boundscope::{DType, DeviceTensor, RunInputMut};
    for device in ["cpu", "cuda"] {
        let mut options = Options::new();
        options.set_str("runtime.device", device).unwrap();
        let session = match ProfiledSession::new(options, &Environment::from_pairs(&[])) {
            Ok(s) => s,
            Err(e) => {
                println!("SKIPPED ({device} case): a_gpt2_training_step_allocates_nothing: {e}; run this test binary on a GPU machine");
                continue;
            }
        };
        for compute in [DType::F32, DType::BF16] {
            let config = gpt2::Config::TINY;
            let (batch, tokens) = (2, 128);
            let (registry, arena) = (Registry::with_builtins(), Arena::new());
            let model = gpt2::build(&arena, &registry, &config, batch, tokens, compute, false).unwrap();
            let adamw = AdamW::new().weight_decay(0.01);
            let step = Grad::new(&model.parameters).training_step(&model.trace, &arena, &adamw).unwrap();
            let plan = session.compile(&step.trace, &arena).unwrap();
            let ids =
                Tensor::from_vec(&[batch, tokens], (0..(batch * tokens) as i64).map(|i| (i * 37) % 512).collect())
                    .unwrap();
            let mut host: Vec<Tensor> = std::iter::once(ids).chain(config.initial_parameters(7)).collect();
            let first_scalar = host.len();
            host.extend(adamw.step_values(1, 1e-3));
            for &v in &step.trace.inputs()[host.len()..] {
                let meta = step.trace.value_meta(v).unwrap();
                host.push(Tensor::try_zeros_of(meta.dtype, &meta.shape).unwrap());
            }
            let mut stored: Vec<Result<DeviceTensor, Tensor>> = host
                .into_iter()
                .map(|t| match session.device() {
                    Some(d) => Ok(DeviceTensor::upload(&d, t.view()).unwrap()),
                    None => Err(t),
                })
                .collect();
            let mut ws = plan.workspace().unwrap();
            let mut losses = Vec::new();
            let mut allocations = Vec::new();
            for t in 1..=4u64 {
                for (k, s) in adamw.step_values(t, 1e-3).iter().enumerate() {
                    match &mut stored[first_scalar + k] {
                        Ok(d) => d.copy_from_host(s.view()).unwrap(),
                        Err(h) => *h = s.clone(),
                    }
                }
                let mut inputs: Vec<RunInputMut<'_>> = stored
                    .iter_mut()
                    .map(|s| match s {
                        Ok(d) => RunInputMut::Device(d),
                        Err(h) => RunInputMut::Host(h),
                    })
                    .collect();
                let mut outputs = None;
                allocations.push(allocations_during(|| {
                    outputs = Some(plan.run_updating_on_device(&mut ws, &mut inputs).unwrap());
                }));
                losses.push(outputs.unwrap().to_host(0).unwrap().to_f32_vec()[0]);
            }
            let case = format!("{device}, {compute}");
            // The first step warms the workspace up.
            assert_eq!(&allocations[1..], [0, 0, 0], "{case}: host allocations per step");
            assert!(losses[3] < losses[0], "{case}: the loss went from {} to {}", losses[0], losses[3]);
        }
    }
}

/// Collectives allocate nothing once warm: two ranks (threads of this process, each counting
/// its own allocations: whichever arrives last combines) run a plan with an `all_reduce` and an
/// `all_gather`, and the three runs after a warm-up one allocate nothing on either rank.
#[test]
fn collectives_on_two_ranks_allocate_nothing_once_warm() {
    use boundscope::distributed::{CollectiveExecutor, Collectives, InProcessGroup, ReduceOp};
    let mut registry = Registry::with_builtins();
    let collectives = Collectives::register(&mut registry).unwrap();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[64, 32]).unwrap();
    let y = b.tanh(x).unwrap();
    let summed = collectives.all_reduce(&mut b, y, ReduceOp::Sum).unwrap();
    let gathered = collectives.all_gather(&mut b, summed, 2).unwrap();
    let out = b.mul_scalar(gathered, 0.5).unwrap();
    b.output(out).unwrap();
    let trace = b.finish().unwrap();
    let warm = std::sync::Barrier::new(2);
    let counted = std::thread::scope(|s| {
        let handles: Vec<_> = InProcessGroup::new("steady", 2)
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (trace, collectives, warm) = (&trace, &collectives, &warm);
                s.spawn(move || {
                    let executors = [CollectiveExecutor::new(comm, collectives).shared(), CpuReference::shared()];
                    let plan = Plan::compile(trace, &executors).unwrap();
                    let input = Tensor::new(&[64, 32], vec![rank as f32; 64 * 32]).unwrap();
                    let views = [input.view()];
                    let mut workspace = plan.workspace().unwrap();
                    plan.run_with(&mut workspace, &views).unwrap();
                    warm.wait();
                    allocations_during(|| {
                        for _ in 0..3 {
                            plan.run_with(&mut workspace, &views).unwrap();
                        }
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
    });
    assert_eq!(counted, 0);
}
