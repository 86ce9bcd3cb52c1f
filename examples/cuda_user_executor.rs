//! Your own GPU kernels as an executor, beside `CudaOps` (needs an NVIDIA GPU; elsewhere it
//! prints a SKIPPED line and exits 0).
//!
//! `MyGpu` (`examples/shared/my_gpu_executor.rs`) claims two symbols of its own: `bias_gelu`,
//! an NVRTC-compiled kernel of its own in `f32` and bf16, and `my_matmul`, a cuBLAS call with
//! a handle and a workspace per plan workspace. Its kernels get typed device memory, launch on
//! the run's stream, are captured into the plan's graph, and sit inside the NVTX range it
//! pushes itself around each op, in its own domain (`my_gpu`). The example runs
//! `y = tanh(bias_gelu(my_matmul(x, w), b))` with `tanh` on `CudaOps`: host tensors in and
//! out, device-resident stream runs, and a graph; and `bias_gelu` alone in bf16. It exits
//! non-zero if a result differs from the CPU reference (the symbols' own CPU kernels).
//!
//! Then it measures what a plan adds to a kernel launched by hand: the host time to queue a
//! plan of `bias_gelu` steps, per step, against the host time of the same launches queued by
//! hand on a stream, side by side in one run (lines `RESULT {json}`); and the same for a plan of
//! `CudaOps` `tanh` steps against its own generated kernel (`executors::cuda::op_source`)
//! launched by hand: the driver's launch floor for that kernel. The `tanh` plan is timed twice:
//! in a workspace with a stream of its own (`Plan::workspace`) and in one on the device's own
//! stream (`Plan::workspace_on_device_queue`), which records no event per run.
//!
//! ```text
//! cargo build --release --example cuda_user_executor   # here; then on the GPU machine:
//! ./cuda_user_executor            # checks, then the host-time figures
//! ./cuda_user_executor --ncu      # checks only, with every op profiled: for ncu --nvtx
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use boundscope::executors::cuda::cudarc::driver::{CudaFunction, CudaStream, DevicePtr, DevicePtrMut};
use boundscope::executors::cuda::{self, CudaDevice, CudaEventTimer, CudaKernel, CudaOps, CudaRun};
use boundscope::executors::CpuReference;
use boundscope::guards::{NvtxRange, Selection};
use boundscope::passes::{Pass, ProfileOps};
use boundscope::{
    Arena, Availability, DType, Device, DeviceTensor, Error, Executor, Plan, PushedBy, Registry, RunInput, Tensor,
    TraceBuilder,
};

#[path = "shared/my_gpu_executor.rs"]
mod my_gpu_executor;
#[path = "shared/nsys_check.rs"]
mod nsys_check;
use my_gpu_executor::{BiasGeluArgs, MyGpu, MY_GPU_DOMAIN};

fn main() -> ExitCode {
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: cuda_user_executor: {reason}");
        return ExitCode::SUCCESS;
    }
    let profile_only = std::env::args().any(|a| a == "--ncu");
    match check().and_then(|ok| if ok && !profile_only { measure().map(|()| ok) } else { Ok(ok) }) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the program through `MyGpu` and `CudaOps` every way a user would, against the CPU
/// reference; true if every result matches and each op of `MyGpu` got exactly its own range.
fn check() -> boundscope::Result<bool> {
    let gpu = CudaDevice::new()?;
    let registry = my_gpu_executor::registry()?;
    let arena = Arena::new();
    let (m, k, n) = (64, 256, 512);
    let trace = my_gpu_executor::program(&arena, &registry, m, k, n)?;
    // Every op profiled, in the library's domain and in MyGpu's, and timed on the device.
    let mut profiled =
        ProfileOps::new().with_trace_range(NvtxRange::new().label("cuda_user_executor")?).run(&trace, &arena)?;
    profiled.attach_guard(Selection::All, NvtxRange::new().domain(MY_GPU_DOMAIN)?)?;
    let timer = CudaEventTimer::new(gpu.clone());
    profiled.attach_guard(Selection::All, timer.clone())?;

    let mine: Arc<dyn Executor> = Arc::new(MyGpu::new(gpu.clone())?);
    let plan = Plan::compile(&profiled, &[mine, Arc::new(CudaOps::new(gpu.clone()))])?;
    let reference = Plan::compile(&trace, &[CpuReference::shared()])?;
    println!("{plan}");

    let x = Tensor::from_fn(&[m, k], |i| ((i * 37) % 101) as f32 / 101.0 - 0.5);
    let w = Tensor::from_fn(&[k, n], |i| ((i * 53) % 89) as f32 / 890.0 - 0.05);
    let b = Tensor::from_fn(&[n], |i| (i % 7) as f32 / 7.0 - 0.5);
    let expected = reference.run(&[&x, &w, &b])?;
    let mut ok = true;
    let mut report = |what: &str, got: &Tensor, expected: &Tensor, tolerance: f32| {
        let diff = got.max_abs_diff(expected);
        println!("{what}: max |plan - CPU reference| = {diff:.2e}");
        ok &= diff <= tolerance;
    };

    // Host tensors in and out.
    let host = plan.run(&[&x, &w, &b])?;
    report("host tensors", &host[0], &expected[0], 1e-4);
    // Device-resident stream runs.
    let device: Arc<dyn Device> = gpu.clone();
    let mut inputs = [
        DeviceTensor::upload(&device, x.view())?,
        DeviceTensor::upload(&device, w.view())?,
        DeviceTensor::upload(&device, b.view())?,
    ];
    let mut workspace = plan.workspace()?;
    let on_device = plan.run_on_device(&mut workspace, &inputs.iter().map(RunInput::from).collect::<Vec<_>>())?;
    report("device tensors, stream run", &on_device.to_host(0)?, &expected[0], 1e-4);
    // A graph: MyGpu's NVRTC kernel and cuBLAS call replay with CudaOps' kernel.
    let mut graph_workspace = plan.workspace()?;
    let [x_dev, w_dev, b_dev] = &mut inputs;
    let mut graph = plan.capture(&mut graph_workspace, vec![x_dev, w_dev, b_dev])?;
    report("graph replay", &graph.replay()?.to_host(0)?, &expected[0], 1e-4);
    let x2 = Tensor::from_fn(&[m, k], |i| ((i * 11) % 31) as f32 / 31.0 - 0.5);
    graph.input_mut(0).expect("three inputs").copy_from_host(x2.view())?;
    let expected2 = reference.run(&[&x2, &w, &b])?;
    report("graph replay, new input", &graph.replay()?.to_host(0)?, &expected2[0], 1e-4);
    drop(graph);

    // bias_gelu alone in bf16: typed bf16 device memory.
    let mut bf16 = TraceBuilder::new(&arena, &registry);
    let xb = bf16.input_with(&boundscope::TensorMeta::new(DType::BF16, &[m, n]))?;
    let bb = bf16.input_with(&boundscope::TensorMeta::new(DType::BF16, &[n]))?;
    let yb = bf16.call("bias_gelu", &[xb.into(), bb.into()])?;
    bf16.output(yb)?;
    let bf16 = bf16.finish()?;
    let bf16_plan = Plan::compile(&bf16, &[Arc::new(MyGpu::new(gpu.clone())?) as Arc<dyn Executor>])?;
    let (xb, bb) =
        (Tensor::from_fn(&[m, n], |i| (i % 29) as f32 / 7.0 - 2.0).to_dtype(DType::BF16), b.to_dtype(DType::BF16));
    let got = bf16_plan.run(&[&xb, &bb])?;
    let want = Plan::compile(&bf16, &[CpuReference::shared()])?.run(&[&xb, &bb])?;
    // The same f32 math rounded once to bf16: equal, up to one bf16 step where the two devices'
    // tanh differ in the last f32 bit right at a rounding boundary.
    report("bf16", &got[0].to_dtype(DType::F32), &want[0].to_dtype(DType::F32), 1.6e-2);

    // One range per op in MyGpu's domain: its own for its ops, the runtime's for `tanh`.
    let ranges = plan.range_map().ranges();
    let in_domain =
        |label: &str| ranges.iter().filter(|r| r.domain == MY_GPU_DOMAIN && r.label == label).collect::<Vec<_>>();
    for label in ["my_matmul", "bias_gelu"] {
        let pushed = in_domain(label);
        let by_it = pushed.len() == 1 && pushed[0].pushed_by == PushedBy::Executor("my_gpu".into());
        println!("`{label}` in domain `{MY_GPU_DOMAIN}`: {} range(s), pushed by my_gpu: {by_it}", pushed.len());
        ok &= by_it;
    }
    ok &= in_domain("tanh").len() == 1;
    for stats in timer.stats() {
        println!(
            "device time of `{}`: {} runs, mean {:.1} us",
            stats.label,
            stats.count,
            stats.mean().as_secs_f64() * 1e6
        );
    }
    nsys_check::write_expected_ranges(&plan.range_map().counts_tsv(2));
    Ok(ok)
}

/// Host time to queue `steps` launches of `bias_gelu` through a plan (stream runs, device
/// tensors in, outputs left on the device) and by hand (the same function, the same raw
/// launch, on a stream and buffers of our own), per step; printed as `RESULT` lines.
fn measure() -> boundscope::Result<()> {
    let gpu = CudaDevice::new()?;
    let registry = my_gpu_executor::registry()?;
    let arena = Arena::new();
    let (rows, cols, reps) = (64usize, 256usize, 2000usize);
    let mine = Arc::new(MyGpu::new(gpu.clone())?);
    let device: Arc<dyn Device> = gpu.clone();
    let x_host = Tensor::from_fn(&[rows, cols], |i| i as f32 / 1e4);
    let bias_host = Tensor::from_fn(&[cols], |i| i as f32 / 1e3);
    let x = DeviceTensor::upload(&device, x_host.view())?;
    let bias = DeviceTensor::upload(&device, bias_host.view())?;
    let run_inputs = [RunInput::from(&x), RunInput::from(&bias)];
    // By hand: a stream and buffers of our own.
    let failed = |what: &str, e: &dyn std::fmt::Debug| Error::Execution {
        executor: "by hand".into(),
        symbol: what.into(),
        message: format!("{e:?}"),
    };
    let stream = gpu.context().new_stream().map_err(|e| failed("new_stream", &e))?;
    let x_mine = stream.clone_htod(x_host.values::<f32>()?).map_err(|e| failed("upload", &e))?;
    let bias_mine = stream.clone_htod(bias_host.values::<f32>()?).map_err(|e| failed("upload", &e))?;
    let mut y_mine = stream.alloc_zeros::<f32>(rows * cols).map_err(|e| failed("alloc", &e))?;
    let function = mine.bias_gelu_f32();
    let tanh = generated_tanh(&gpu, &registry, &[rows, cols])?;
    let mut tanh_out = stream.alloc_zeros::<f32>(rows * cols).map_err(|e| failed("alloc", &e))?;
    let nothing: Arc<dyn Executor> = Arc::new(LaunchesNothing(gpu.clone()));
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(gpu.clone()));
    for steps in [1usize, 12, 100] {
        let chain = |op: &str| -> boundscope::Result<boundscope::Trace<'_>> {
            let mut b = TraceBuilder::new(&arena, &registry);
            let (input, bias_in) = (b.input(&[rows, cols])?, b.input(&[cols])?);
            let mut h = input;
            for _ in 0..steps {
                h = if op == "tanh" { b.tanh(h)? } else { b.call(op, &[h.into(), bias_in.into()])? };
            }
            b.output(h)?;
            b.finish()
        };
        let plans = [
            Plan::compile(&chain("bias_gelu")?, &[mine.clone() as Arc<dyn Executor>])?,
            Plan::compile(&chain("bias_gelu")?, std::slice::from_ref(&nothing))?,
            Plan::compile(&chain("tanh")?, std::slice::from_ref(&ops))?,
        ];
        // The plan each workspace runs: the `tanh` plan twice, the second time on the device's
        // own stream.
        let plan_of = [0, 1, 2, 2];
        let mut workspaces = [
            plans[0].workspace()?,
            plans[1].workspace()?,
            plans[2].workspace()?,
            plans[2].workspace_on_device_queue()?,
        ];
        // 0..4: the workspaces; 4: by hand; 5: the generated `tanh` by hand.
        let mut times: [Vec<u128>; 6] = Default::default();
        for rep in 0..reps + 100 {
            // Each waits for the device outside its timed part, so that none queues behind a full
            // launch queue; which goes first rotates.
            for turn in 0..6 {
                let which = (rep + turn) % 6;
                let start = Instant::now();
                if which < 4 {
                    plans[plan_of[which]].run_on_device(&mut workspaces[which], &run_inputs)?;
                } else if which == 5 {
                    let (x, y) = (x_mine.device_ptr(&stream).0, tanh_out.device_ptr_mut(&stream).0);
                    for _ in 0..steps {
                        tanh.launch(&stream, x, y).map_err(|e| failed("launch", &e))?;
                    }
                } else {
                    let (x, bias) = (x_mine.device_ptr(&stream).0, bias_mine.device_ptr(&stream).0);
                    let y = y_mine.device_ptr_mut(&stream).0;
                    for _ in 0..steps {
                        launch_by_hand(&function, &stream, [x, bias, y], rows * cols, cols)
                            .map_err(|e| failed("launch", &e))?;
                    }
                }
                let elapsed = start.elapsed().as_nanos();
                gpu.synchronize()?;
                stream.synchronize().map_err(|e| failed("synchronize", &e))?;
                // The first 100 warm up.
                if rep >= 100 {
                    times[which].push(elapsed);
                }
            }
        }
        let [plan_us, nothing_us, tanh_us, tanh_shared_us, hand_us, tanh_hand_us] = times.map(|mut v| {
            v.sort_unstable();
            v[v.len() / 2] as f64 / 1e3
        });
        println!(
            "RESULT {{\"workload\": \"user kernel, host time to queue\", \"steps\": {steps}, \"plan_us\": {plan_us:.2}, \
             \"by_hand_us\": {hand_us:.2}, \"added_us_per_step\": {:.3}, \"plan_of_kernels_that_launch_nothing_us\": \
             {nothing_us:.2}, \"plan_of_cuda_ops_tanh_us\": {tanh_us:.2}, \"generated_tanh_by_hand_us\": \
             {tanh_hand_us:.2}, \"tanh_plan_over_launch_floor\": {:.3}, \"plan_of_cuda_ops_tanh_on_device_queue_us\": \
             {tanh_shared_us:.2}, \"on_device_queue_over_launch_floor\": {:.3}}}",
            (plan_us - hand_us) / steps as f64,
            tanh_us / tanh_hand_us,
            tanh_shared_us / tanh_hand_us
        );
    }
    Ok(())
}

/// Claims `bias_gelu` with a kernel that queues nothing: what a plan costs per step, launches
/// aside.
struct LaunchesNothing(Arc<CudaDevice>);

struct Nothing;

impl CudaKernel for Nothing {
    type State = ();
    fn new_state(&self, _run: &CudaRun<'_>) -> boundscope::Result<()> {
        Ok(())
    }
    fn run(&self, _run: &mut CudaRun<'_>, _state: &mut ()) -> boundscope::Result<()> {
        Ok(())
    }
}

impl Executor for LaunchesNothing {
    fn name(&self) -> &str {
        "launches_nothing"
    }
    fn claims(&self, op: &boundscope::OpView<'_>) -> bool {
        op.name() == "bias_gelu"
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(self.0.clone())
    }
    fn compile_device(&self, op: &boundscope::OpView<'_>) -> boundscope::Result<Box<dyn boundscope::DeviceKernel>> {
        cuda::device_kernel(&self.0, self.name(), op, Nothing)
    }
}

/// The kernel `CudaOps` generates for `tanh` over `shape` (`executors::cuda::op_source`),
/// compiled and loaded by hand, to launch without a plan.
struct GeneratedTanh {
    function: CudaFunction,
    blocks: u32,
    numel: i64,
}

fn generated_tanh(gpu: &Arc<CudaDevice>, registry: &Registry, shape: &[usize]) -> boundscope::Result<GeneratedTanh> {
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, registry);
    let x = b.input(shape)?;
    let y = b.tanh(x)?;
    b.output(y)?;
    let trace = b.finish()?;
    let op = boundscope::OpView::of(&trace, 0)?;
    let failed =
        |what: &str, e: String| Error::Execution { executor: "by hand".into(), symbol: what.into(), message: e };
    let generated = cuda::op_source(&op, "tanh_by_hand").map_err(|e| failed("op_source", e))?;
    let ptx = cuda::cudarc::nvrtc::compile_ptx(&generated.source).map_err(|e| failed("nvrtc", format!("{e:?}")))?;
    let module = gpu.context().load_module(ptx).map_err(|e| failed("load", format!("{e:?}")))?;
    let function = module.load_function(&generated.kernel).map_err(|e| failed("load", format!("{e:?}")))?;
    // As `CudaOps` launches its generated kernels: a thread per vector, blocks of 256.
    let blocks = generated.threads.div_ceil(256).max(1) as u32;
    Ok(GeneratedTanh { function, blocks, numel: generated.numel as i64 })
}

impl GeneratedTanh {
    fn launch(&self, stream: &CudaStream, x: u64, y: u64) -> Result<(), cuda::cudarc::driver::DriverError> {
        let (mut x, mut y, mut n) = (x, y, self.numel);
        let mut params =
            [(&mut x as *mut u64).cast::<std::ffi::c_void>(), (&mut y as *mut u64).cast(), (&mut n as *mut i64).cast()];
        // SAFETY: the generated kernel takes one input pointer, one output pointer and `long
        // long n`; both buffers hold `n` values.
        unsafe {
            cuda::cudarc::driver::result::launch_kernel(
                self.function.cu_function(),
                (self.blocks, 1, 1),
                (256, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
    }
}

/// One launch of `bias_gelu_f32` by hand, as a program without a plan makes it.
fn launch_by_hand(
    function: &CudaFunction,
    stream: &CudaStream,
    pointers: [u64; 3],
    len: usize,
    n: usize,
) -> Result<(), cuda::cudarc::driver::DriverError> {
    let mut args = BiasGeluArgs { pointers, len: len as i64, n: n as i64 };
    let config = args.config().expect("a grid of fewer than 2^32 blocks");
    // SAFETY: the kernel's parameters, as `MyGpu` passes them; the buffers hold `len` and `n`
    // values.
    unsafe {
        cuda::cudarc::driver::result::launch_kernel(
            function.cu_function(),
            config.grid_dim,
            config.block_dim,
            0,
            stream.cu_stream(),
            &mut args.params(),
        )
    }
}
