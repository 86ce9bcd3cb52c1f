//! On a GPU: a user's own GPU executor (`MyGpu`, `examples/shared/my_gpu_executor.rs`: an NVRTC
//! kernel and a cuBLAS call, claiming symbols of its own) beside `CudaOps` gives the CPU
//! reference's results with host tensors, device tensors and in a graph; pushes exactly its own
//! op ranges, as the plan's range map says; is timed by `CudaEventTimer`; keeps one state per
//! workspace; and the typed-memory API refuses what does not fit with typed errors.
//!
//! Without a usable GPU every test prints `SKIPPED` with the reason and passes: run the test
//! binary on the GPU machine (`cargo test --release --no-run`, then carry it there).

mod common;

#[path = "../examples/shared/my_gpu_executor.rs"]
mod my_gpu_executor;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use boundscope::executors::cuda::{self, device_kernel, CudaDevice, CudaEventTimer, CudaKernel, CudaOps, CudaRun};
use boundscope::executors::CpuReference;
use boundscope::guards::{NvtxRange, Selection};
use boundscope::passes::{Pass, ProfileOps};
use boundscope::{
    Arena, Availability, DType, Device, DeviceKernel, DeviceTensor, Error, Executor, OpView, Plan, PushedBy, RunInput,
    Tensor, TensorMeta, TraceBuilder,
};
use common::nvtx_capture;
use common::ranges::{pushes_in, pushes_of};
use my_gpu_executor::{MyGpu, MY_GPU_DOMAIN};

/// The device, or `None` after saying why the test is skipped.
fn device(test: &str) -> Option<Arc<CudaDevice>> {
    match cuda::availability() {
        Availability::Available => Some(CudaDevice::new().expect("available")),
        Availability::Unavailable(reason) => {
            println!("SKIPPED: {test}: {reason}; run this test binary on a GPU machine");
            None
        }
    }
}

fn inputs(m: usize, k: usize, n: usize) -> [Tensor; 3] {
    [
        Tensor::from_fn(&[m, k], |i| ((i * 37) % 101) as f32 / 101.0 - 0.5),
        Tensor::from_fn(&[k, n], |i| ((i * 53) % 89) as f32 / 890.0 - 0.05),
        Tensor::from_fn(&[n], |i| (i % 7) as f32 / 7.0 - 0.5),
    ]
}

#[test]
fn a_users_kernels_match_the_reference_in_stream_runs_and_graphs() {
    let Some(gpu) = device("a_users_kernels_match_the_reference_in_stream_runs_and_graphs") else { return };
    let registry = my_gpu_executor::registry().unwrap();
    let arena = Arena::new();
    // Odd sizes: no kernel of MyGpu's may rely on multiples of its block.
    for (m, k, n) in [(64, 256, 512), (3, 5, 7), (33, 129, 257)] {
        let trace = my_gpu_executor::program(&arena, &registry, m, k, n).unwrap();
        let mine: Arc<dyn Executor> = Arc::new(MyGpu::new(gpu.clone()).unwrap());
        let plan = Plan::compile(&trace, &[mine, Arc::new(CudaOps::new(gpu.clone()))]).unwrap();
        let listing = plan.to_string();
        assert!(listing.contains("my_gpu") && listing.contains("cuda_ops"), "{listing}");
        let data = inputs(m, k, n);
        let refs: Vec<&Tensor> = data.iter().collect();
        let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
        let host = plan.run(&refs).unwrap();
        let tolerance = 1e-4;
        assert!(host[0].max_abs_diff(&expected[0]) <= tolerance, "{m}x{k}x{n}: {}", host[0].max_abs_diff(&expected[0]));

        let shared: Arc<dyn Device> = gpu.clone();
        let uploaded: Vec<DeviceTensor> =
            data.iter().map(|t| DeviceTensor::upload(&shared, t.view()).unwrap()).collect();
        let run_inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
        let mut workspace = plan.workspace().unwrap();
        let stream_run = plan.run_on_device(&mut workspace, &run_inputs).unwrap().to_host(0).unwrap();
        assert_eq!(stream_run, host[0], "{m}x{k}x{n}: device tensors in, the same result");

        let mut captured: Vec<DeviceTensor> =
            data.iter().map(|t| DeviceTensor::upload(&shared, t.view()).unwrap()).collect();
        let mut graph_ws = plan.workspace().unwrap();
        let mut graph = plan.capture(&mut graph_ws, captured.iter_mut().collect()).unwrap();
        assert_eq!(graph.replay().unwrap().to_host(0).unwrap(), stream_run, "{m}x{k}x{n}: a replay, the same");
        // New data reaches the user's kernels in the replay.
        let doubled = Tensor::from_fn(&[m, k], |i| 2.0 * data[0].values::<f32>().unwrap()[i]);
        graph.input_mut(0).unwrap().copy_from_host(doubled.view()).unwrap();
        let replayed = graph.replay().unwrap().to_host(0).unwrap();
        let want =
            Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&doubled, &data[1], &data[2]]).unwrap();
        assert!(replayed.max_abs_diff(&want[0]) <= tolerance, "{m}x{k}x{n}: refilled replay");
    }
}

#[test]
fn a_users_bf16_kernel_reads_and_writes_bf16_memory() {
    let Some(gpu) = device("a_users_bf16_kernel_reads_and_writes_bf16_memory") else { return };
    let registry = my_gpu_executor::registry().unwrap();
    let arena = Arena::new();
    for (m, n) in [(64, 512), (1, 1), (7, 3), (5, 1001)] {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(DType::BF16, &[m, n])).unwrap();
        let bias = b.input_with(&TensorMeta::new(DType::BF16, &[n])).unwrap();
        let y = b.call("bias_gelu", &[x.into(), bias.into()]).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &[Arc::new(MyGpu::new(gpu.clone()).unwrap()) as Arc<dyn Executor>]).unwrap();
        let x = Tensor::from_fn(&[m, n], |i| (i % 29) as f32 / 7.0 - 2.0).to_dtype(DType::BF16);
        let bias = Tensor::from_fn(&[n], |i| (i % 5) as f32 / 5.0 - 0.5).to_dtype(DType::BF16);
        let got = plan.run(&[&x, &bias]).unwrap();
        assert_eq!(got[0].dtype(), DType::BF16);
        let want = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&x, &bias]).unwrap();
        // One rounding of the same f32 math on each side: at most one bf16 step apart (the
        // GPU's tanhf and the CPU's differ in the last f32 bit), and mostly equal.
        let (g, w) = (got[0].values::<half::bf16>().unwrap(), want[0].values::<half::bf16>().unwrap());
        let mut equal = 0;
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            let steps = (i32::from(a.to_bits() as i16) - i32::from(b.to_bits() as i16)).abs();
            assert!(steps <= 1, "{m}x{n}: element {i}: {a} against {b}");
            equal += usize::from(steps == 0);
        }
        assert!(equal * 10 >= g.len() * 9, "{m}x{n}: only {equal} of {} equal", g.len());
    }
}

#[test]
fn a_users_executor_pushes_its_own_op_ranges_and_is_timed() {
    let Some(gpu) = device("a_users_executor_pushes_its_own_op_ranges_and_is_timed") else { return };
    if !nvtx_capture::is_installed() {
        println!("SKIPPED: a_users_executor_pushes_its_own_op_ranges_and_is_timed: the NVTX capture is not this process's NVTX tool");
        return;
    }
    let registry = my_gpu_executor::registry().unwrap();
    let arena = Arena::new();
    let (m, k, n) = (64, 256, 512);
    let trace = my_gpu_executor::program(&arena, &registry, m, k, n).unwrap();
    let mut profiled =
        ProfileOps::new().with_trace_range(NvtxRange::new().label("step").unwrap()).run(&trace, &arena).unwrap();
    profiled.attach_guard(Selection::All, NvtxRange::new().domain(MY_GPU_DOMAIN).unwrap()).unwrap();
    let timer = CudaEventTimer::new(gpu.clone());
    profiled.attach_guard(Selection::All, timer.clone()).unwrap();
    let mine: Arc<dyn Executor> = Arc::new(MyGpu::new(gpu.clone()).unwrap());
    let plan = Plan::compile(&profiled, &[mine, Arc::new(CudaOps::new(gpu.clone()))]).unwrap();
    let pushed_by = |label: &str| {
        let ranges = plan.range_map().ranges().iter();
        ranges
            .filter(|r| r.domain == MY_GPU_DOMAIN && r.label == label)
            .map(|r| r.pushed_by.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(pushed_by("my_matmul"), [PushedBy::Executor("my_gpu".into())], "{plan:#}");
    assert_eq!(pushed_by("bias_gelu"), [PushedBy::Executor("my_gpu".into())], "{plan:#}");
    assert_eq!(pushed_by("tanh"), [PushedBy::Runtime], "{plan:#}");
    let data = inputs(m, k, n);
    let shared: Arc<dyn Device> = gpu.clone();
    let uploaded: Vec<DeviceTensor> = data.iter().map(|t| DeviceTensor::upload(&shared, t.view()).unwrap()).collect();
    let run_inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
    let mut workspace = plan.workspace().unwrap();
    for _ in 0..3 {
        nvtx_capture::events_on_current_thread();
        plan.run_on_device(&mut workspace, &run_inputs).unwrap();
        let events = nvtx_capture::events_on_current_thread();
        assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{plan:#}");
    }
    gpu.synchronize().unwrap();
    let stats = timer.stats();
    for label in ["my_matmul", "bias_gelu", "tanh"] {
        let s = stats
            .iter()
            .find(|s| s.label == label)
            .unwrap_or_else(|| panic!("no device time for `{label}`: {stats:?}"));
        assert_eq!(s.count, 3, "{label}");
        assert!(s.min > std::time::Duration::ZERO, "{label}: its kernels ran between the timer's events");
    }
}

/// Counts its states made and dropped, and checks the typed-memory API's refusals.
struct Probe {
    made: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
    streams: Arc<Mutex<Vec<usize>>>,
}

/// A state that counts its drop.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl CudaKernel for Probe {
    type State = Counted;

    fn new_state(&self, run: &CudaRun<'_>) -> boundscope::Result<Counted> {
        self.made.fetch_add(1, Ordering::SeqCst);
        self.streams.lock().unwrap().push(run.stream().cu_stream() as usize);
        Ok(Counted(self.dropped.clone()))
    }

    fn run(&self, run: &mut CudaRun<'_>, _state: &mut Counted) -> boundscope::Result<()> {
        assert_eq!((run.input_count(), run.output_count()), (1, 1));
        assert_eq!(run.input_shape(0)?, [4, 3]);
        assert_eq!(run.input_dtype(0)?, DType::BF16);
        assert_eq!(run.ordinal(), 0);
        // The wrong element type, and a tensor past the last: typed errors.
        assert!(matches!(
            run.input::<f32>(0),
            Err(Error::DTypeMismatch { expected: DType::F32, got: DType::BF16, .. })
        ));
        assert!(matches!(run.input::<half::bf16>(1), Err(Error::Execution { .. })));
        assert_eq!(run.outputs::<half::bf16>()?.len(), 1);
        assert!(matches!(run.outputs::<f32>(), Err(Error::DTypeMismatch { .. })));
        let memory = run.input_memory(0)?;
        assert_eq!((memory.len, memory.dtype), (12, DType::BF16));
        // Typed memory of 12 bf16 values (six device words): a copy on the run's stream.
        let x = run.input::<half::bf16>(0)?;
        assert_eq!(x.len(), 12);
        let stream = run.stream().clone();
        let mut y = run.output::<half::bf16>(0)?;
        stream.memcpy_dtod(&x, &mut y).map_err(|e| run.error(e))
    }

    fn launch_note(&self) -> Option<String> {
        Some("a copy of 12 bf16 values".into())
    }
}

/// Claims `neg` and runs it as a copy (so that the result says the kernel ran).
struct ProbeExecutor {
    gpu: Arc<CudaDevice>,
    probe: Arc<Probe>,
}

impl Executor for ProbeExecutor {
    fn name(&self) -> &str {
        "probe"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.name() == "neg"
    }
    fn dtypes(&self) -> &[DType] {
        &[DType::BF16]
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(self.gpu.clone())
    }
    fn compile_device(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn DeviceKernel>> {
        let probe = Probe {
            made: self.probe.made.clone(),
            dropped: self.probe.dropped.clone(),
            streams: self.probe.streams.clone(),
        };
        device_kernel(&self.gpu, self.name(), op, probe)
    }
}

#[test]
fn each_workspace_has_its_own_state_dropped_with_it() {
    let Some(gpu) = device("each_workspace_has_its_own_state_dropped_with_it") else { return };
    let registry = boundscope::Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input_with(&TensorMeta::new(DType::BF16, &[4, 3])).unwrap();
    let y = b.neg(x).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let probe = Arc::new(Probe {
        made: Arc::new(AtomicUsize::new(0)),
        dropped: Arc::new(AtomicUsize::new(0)),
        streams: Arc::new(Mutex::new(Vec::new())),
    });
    let executor: Arc<dyn Executor> = Arc::new(ProbeExecutor { gpu: gpu.clone(), probe: probe.clone() });
    let plan = Plan::compile(&trace, &[executor]).unwrap();
    // The kernel's launch note reaches the plan's listing, after its executor.
    let step = plan.to_string().lines().find(|l| l.contains("= neg(")).unwrap_or_default().to_string();
    assert!(step.contains("probe") && step.ends_with("a copy of 12 bf16 values"), "{plan}");
    let x = Tensor::from_fn(&[4, 3], |i| i as f32 - 5.5).to_dtype(DType::BF16);
    let (mut first, mut second) = (plan.workspace().unwrap(), plan.workspace().unwrap());
    for _ in 0..3 {
        assert_eq!(plan.run_with(&mut first, &[&x]).unwrap().to_tensors()[0], x, "the copy ran");
        plan.run_with(&mut second, &[&x]).unwrap();
    }
    assert_eq!(probe.made.load(Ordering::SeqCst), 2, "one state per workspace, made at its first run");
    let streams = probe.streams.lock().unwrap().clone();
    assert_ne!(streams[0], streams[1], "each on its workspace's own stream");
    drop(first);
    assert_eq!(probe.dropped.load(Ordering::SeqCst), 1, "dropped with its workspace");
    drop(second);
    assert_eq!(probe.dropped.load(Ordering::SeqCst), 2);

    // A kernel called by hand, outside any run, keeps one state of its own, dropped with it.
    let executor = ProbeExecutor { gpu: gpu.clone(), probe: probe.clone() };
    let op = OpView::of(&trace, 0).unwrap();
    let kernel = executor.compile_device(&op).unwrap();
    let shared: Arc<dyn Device> = gpu.clone();
    let input = DeviceTensor::upload(&shared, x.view()).unwrap();
    let mut output = shared.alloc(6).unwrap();
    for _ in 0..2 {
        kernel.run(&[input.buffer()], &mut [&mut *output]).unwrap();
    }
    assert_eq!(probe.made.load(Ordering::SeqCst), 3, "one state for the calls by hand");
    drop(kernel);
    assert_eq!(probe.dropped.load(Ordering::SeqCst), 3, "dropped with the kernel");
}
