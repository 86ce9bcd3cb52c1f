//! On a GPU: random programs run by plans on the CUDA executors (fused regions and per-op
//! kernels, cuBLAS matmul, the rest on the CPU with explicit transfers) equal the CPU reference
//! executor, and each fused region gets exactly one NVTX range, pushed by `CudaFusion`.
//!
//! Without a usable GPU every test here prints `SKIPPED` with the reason and passes: run the
//! test binary on the GPU machine (`cargo test --release --no-run`, then carry it there).

mod common;

use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use boundscope::executors::cuda::{self, CudaDevice, CudaEventTimer, CudaFusion, CudaOps, KernelVariants};
use boundscope::executors::CpuReference;
use boundscope::guards::{NvtxRange, Selection, DEFAULT_DOMAIN};
use boundscope::passes::{FuseRegions, FusionStrategy, Pass, Pipeline, ProfileOps};
use boundscope::{
    prims, Arena, Availability, DType, DeviceTensor, Executor, Plan, Registry, RunInput, Tensor, TensorMeta,
};
use common::nvtx_capture::{self, NvtxEventKind};
use common::program::{programs, transformer_programs, Op, Operand, Program};
use common::ranges::{pushes_in, pushes_of};
use proptest::prelude::*;

/// The device, or `None` after printing (once) why the tests are skipped.
fn the_device() -> Option<Arc<CudaDevice>> {
    static DEVICE: OnceLock<Option<Arc<CudaDevice>>> = OnceLock::new();
    DEVICE
        .get_or_init(|| match cuda::availability() {
            Availability::Available => Some(CudaDevice::new().expect("available")),
            Availability::Unavailable(reason) => {
                println!("SKIPPED: cuda_matches_reference: {reason}; run this test binary on a GPU machine");
                None
            }
        })
        .clone()
}

/// The process has one handle per GPU, so its transfer counter counts every test's copies:
/// tests that count transfers hold this exclusively, the others share it.
static COUNTING_TRANSFERS: RwLock<()> = RwLock::new(());

/// The device, with a shared hold on [`COUNTING_TRANSFERS`] for the caller's test.
fn device() -> Option<(Arc<CudaDevice>, RwLockReadGuard<'static, ()>)> {
    let device = the_device()?;
    Some((device, COUNTING_TRANSFERS.read().unwrap_or_else(|p| p.into_inner())))
}

/// The device, alone: no other test transfers while the guard lives.
fn device_alone() -> Option<(Arc<CudaDevice>, RwLockWriteGuard<'static, ()>)> {
    let device = the_device()?;
    Some((device, COUNTING_TRANSFERS.write().unwrap_or_else(|p| p.into_inner())))
}

/// The kernel variants every test here runs the CUDA executors with: the defaults, unless
/// `KERNEL_VARIANTS_UNDER_TEST` names others, a comma list read in order: `none` (every variant
/// off: `KernelVariants::NONE`), `all`, or the name of one of `KernelVariants::EACH` to turn on
/// (`none,fast_exp2`: that one alone). The GPU runs this binary once more with `all` and with
/// `none` before a variant's default changes. A name it does not know fails the test.
fn variants_under_test() -> KernelVariants {
    static VARIANTS: OnceLock<KernelVariants> = OnceLock::new();
    *VARIANTS.get_or_init(|| {
        let Ok(names) = std::env::var("KERNEL_VARIANTS_UNDER_TEST") else { return KernelVariants::default() };
        let mut variants = KernelVariants::default();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let known =
                KernelVariants::EACH.iter().chain(&[("all", KernelVariants::ALL), ("none", KernelVariants::NONE)]);
            match known.clone().find(|(n, _)| *n == name) {
                Some((_, v)) if name == "none" => variants = *v,
                Some((_, v)) => variants = variants | *v,
                None => panic!(
                    "KERNEL_VARIANTS_UNDER_TEST: unknown variant `{name}` ({})",
                    known.map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        println!("kernel variants under test: {variants:?}");
        variants
    })
}

/// `CudaOps` on `device`, generating [`variants_under_test`].
fn cuda_ops(device: Arc<CudaDevice>) -> CudaOps {
    CudaOps::new(device).with_variants(variants_under_test())
}

/// `CudaFusion` on `device`, generating [`variants_under_test`].
fn cuda_fusion(device: Arc<CudaDevice>) -> CudaFusion {
    CudaFusion::new(device).with_variants(variants_under_test())
}

/// GPU `expf`, `tanhf` and cuBLAS summation order differ from the CPU's in the last bits.
const TOLERANCE: f32 = 1e-4;

/// The quickstart's MLP block: linear, gelu, linear, residual, layer_norm, softmax.
fn quickstart_block<'a>(arena: &'a Arena, registry: &'a Registry) -> boundscope::Trace<'a> {
    let mut b = boundscope::TraceBuilder::new(arena, registry);
    let (batch, hidden) = (64, 256);
    let x = b.input(&[batch, hidden]).unwrap();
    let w1 = b.input(&[hidden, hidden]).unwrap();
    let b1 = b.input(&[hidden]).unwrap();
    let w2 = b.input(&[hidden, hidden]).unwrap();
    let b2 = b.input(&[hidden]).unwrap();
    let gamma = b.input(&[hidden]).unwrap();
    let beta = b.input(&[hidden]).unwrap();
    let h = b.linear(x, w1, Some(b1)).unwrap();
    let g = b.gelu(h).unwrap();
    let o = b.linear(g, w2, Some(b2)).unwrap();
    let r = b.add(o, x).unwrap();
    let n = b.layer_norm(r, 1e-5, Some(gamma), Some(beta)).unwrap();
    let y = b.softmax(n).unwrap();
    b.output(y).unwrap();
    b.finish().unwrap()
}

/// Inputs for a trace: deterministic values in [-0.5, 0.5), each of its input's dtype.
fn inputs_for(trace: &boundscope::Trace<'_>) -> Vec<boundscope::Tensor> {
    trace
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let meta = trace.value_meta(v).unwrap();
            boundscope::Tensor::from_fn(&meta.shape, |i| ((i * 7 + k * 13) % 29) as f32 / 29.0 - 0.5)
                .to_dtype(meta.dtype)
        })
        .collect()
}

/// `trace` decomposed for the CUDA executors (`linear` stays whole for `CudaOps`) and fused for
/// `CudaFusion` on `device`, and that executor.
fn fused_for_cuda<'a>(
    device: &Arc<CudaDevice>,
    trace: &boundscope::Trace<'a>,
    arena: &'a Arena,
) -> (boundscope::Trace<'a>, Arc<dyn Executor>) {
    fused_for_cuda_with(device, trace, arena, variants_under_test())
}

/// [`fused_for_cuda`] with the CUDA executors generating `variants`.
fn fused_for_cuda_with<'a>(
    device: &Arc<CudaDevice>,
    trace: &boundscope::Trace<'a>,
    arena: &'a Arena,
    variants: KernelVariants,
) -> (boundscope::Trace<'a>, Arc<dyn Executor>) {
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()).with_variants(variants));
    let prims_only = Pipeline::for_executors(&[ops]).run(trace, arena).unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(device.clone()).with_variants(variants));
    (FuseRegions::new(fusion.clone()).run(&prims_only, arena).unwrap(), fusion)
}

/// How far (in units in the last place of the output's dtype) the GPU's fused plan of `trace`
/// is from CpuFusion's on `inputs`, with the GPU plan's listing for messages.
fn ulps_from_cpu_fusion(
    device: &Arc<CudaDevice>,
    trace: &boundscope::Trace<'_>,
    arena: &Arena,
    inputs: &[boundscope::Tensor],
) -> (f32, String) {
    ulps_from_cpu_fusion_with(device, trace, arena, inputs, variants_under_test())
}

/// [`ulps_from_cpu_fusion`] with the CUDA executors generating `variants`.
fn ulps_from_cpu_fusion_with(
    device: &Arc<CudaDevice>,
    trace: &boundscope::Trace<'_>,
    arena: &Arena,
    inputs: &[boundscope::Tensor],
    variants: KernelVariants,
) -> (f32, String) {
    use boundscope::executors::CpuFusion;
    let refs: Vec<&boundscope::Tensor> = inputs.iter().collect();
    let (fused_gpu, fusion) = fused_for_cuda_with(device, trace, arena, variants);
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()).with_variants(variants));
    let gpu = Plan::compile(&fused_gpu, &[fusion, ops]).unwrap();
    let fused_cpu = FuseRegions::new(CpuFusion::shared()).run(trace, arena).unwrap();
    let cpu = Plan::compile(&fused_cpu, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    let out = trace.value_meta(trace.outputs()[0]).unwrap().dtype;
    (ulps(&gpu.run(&refs).unwrap()[0], &cpu.run(&refs).unwrap()[0], out), gpu.to_string())
}

/// `tensors` uploaded to `device`.
fn upload(device: &Arc<CudaDevice>, tensors: &[boundscope::Tensor]) -> Vec<boundscope::DeviceTensor> {
    let on_device: Arc<dyn boundscope::Device> = device.clone();
    tensors.iter().map(|t| boundscope::DeviceTensor::upload(&on_device, t.view()).unwrap()).collect()
}

/// The quickstart's MLP block on the CUDA executors equals the CPU reference.
#[test]
fn the_quickstart_program_matches_on_cuda() {
    let Some((device, _sharing)) = device() else { return };
    println!("running on {}", boundscope::Device::name(&*device));
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = quickstart_block(&arena, &registry);
    let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
    // Device time per op and region, from CUDA events, over 3 runs.
    let mut fused = fused;
    let events = CudaEventTimer::new(device.clone());
    fused.attach_guard(boundscope::guards::Selection::All, events.clone()).unwrap();
    // And a timeline of the host scopes, to which the device times are added as their own track.
    let timeline = boundscope::guards::Timeline::new();
    fused.attach_guard(boundscope::guards::Selection::All, timeline.clone()).unwrap();
    let plan = Plan::compile(&fused, &[fusion, Arc::new(cuda_ops(device)), CpuReference::shared()]).unwrap();
    println!("{plan}");
    let inputs = inputs_for(&trace);
    let refs: Vec<_> = inputs.iter().collect();
    let got = plan.run(&refs).unwrap();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
    let diff = got[0].max_abs_diff(&expected[0]);
    println!("max |cuda - cpu| = {diff:e}");
    assert!(diff <= 1e-5, "{diff}");
    plan.run(&refs).unwrap();
    plan.run(&refs).unwrap();
    let stats = events.stats();
    let labels: Vec<&str> = fused.bound_symbols().iter().map(|b| fused.symbol_name(b)).collect();
    for s in &stats {
        // A region's timer label is its name followed by its ops (`CudaFusion0: (...)`).
        let times = labels.iter().filter(|l| s.label == **l || s.label.starts_with(&format!("{l}:"))).count() as u64;
        println!("{:<48} {} x, device {:?} mean, {:?} min, {:?} max", s.label, s.count, s.mean(), s.min, s.max);
        assert_eq!(s.count, 3 * times.max(1), "{}", s.label);
        assert!(s.min <= s.max && s.total > std::time::Duration::ZERO);
    }
    // Every top-level bound symbol is timed: the composites CudaOps runs whole (two linear,
    // layer_norm, softmax) under their own names.
    let mut timed: Vec<&str> = stats.iter().map(|s| s.label.as_str()).collect();
    let mut distinct = labels.clone();
    timed.sort_unstable();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(timed, distinct, "{stats:?}");
    assert!(timed.contains(&"layer_norm") && timed.contains(&"softmax"), "{stats:?}");
    // The timeline: the host scopes of the three runs, and the device track with one event per
    // label the timer saw, each as long as the label's total device time.
    timeline.add_cuda_event_timer(&events);
    let chrome = timeline.to_chrome_trace();
    let trace_events = chrome["traceEvents"].as_array().unwrap();
    let device_tid = trace_events
        .iter()
        .find(|e| {
            e["ph"] == "M"
                && e["name"] == "thread_name"
                && e["args"]["name"].as_str().is_some_and(|n| n.starts_with(boundscope::guards::CUDA_EVENTS_TRACK))
        })
        .map(|e| e["tid"].clone())
        .expect("a device track");
    let on_device: Vec<_> = trace_events.iter().filter(|e| e["ph"] == "X" && e["tid"] == device_tid).collect();
    assert_eq!(on_device.len(), stats.len(), "one event per label: {on_device:?}");
    for s in &stats {
        let event = on_device.iter().find(|e| e["name"] == s.label.as_str()).expect("the label's event");
        let dur = event["dur"].as_f64().unwrap();
        assert!((dur - s.total.as_secs_f64() * 1e6).abs() <= 1.0, "{}: {dur} us", s.label);
    }
    let host = trace_events.iter().filter(|e| e["ph"] == "X" && e["tid"] != device_tid).count();
    assert_eq!(host, 3 * fused.len(), "a host scope per top-level bound symbol and run");
}

/// With its inputs on the device, the quickstart's block runs every step there (shape ops
/// included) and makes no transfer between host and device per run; reading the output is one.
#[test]
fn the_quickstart_block_stays_on_the_device() {
    // Alone on the device, so that its transfer counter counts this test's copies only.
    let Some((device, _alone)) = device_alone() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = quickstart_block(&arena, &registry);
    let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
    let plan = Plan::compile(&fused, &[fusion, Arc::new(cuda_ops(device.clone())), CpuReference::shared()]).unwrap();
    let listing = plan.to_string();
    println!("{listing}");
    // Only the inputs' uploads and the output's download move data; no step runs on the host.
    assert_eq!(listing.matches("upload ").count(), trace.inputs().len(), "{listing}");
    assert_eq!(listing.matches("download ").count(), 1, "{listing}");
    assert!(plan.steps_per_executor().iter().all(|(e, _)| *e != "cpu_reference"), "{listing}");
    // Each `linear` is one cuBLASLt product with its bias: no transpose, no separate bias add;
    // the first with the gelu after it in its epilogue.
    assert_eq!(listing.matches(" linear_gelu(").count(), 1, "{listing}");
    assert_eq!(listing.matches(" linear(").count(), 1, "{listing}");
    assert!(!listing.contains("transpose") && !listing.contains(" gelu("), "{listing}");
    let inputs = inputs_for(&trace);
    let uploaded = upload(&device, &inputs);
    let run_inputs: Vec<boundscope::RunInput<'_>> = uploaded.iter().map(boundscope::RunInput::from).collect();
    let mut workspace = plan.workspace().unwrap();
    plan.run_on_device(&mut workspace, &run_inputs).unwrap();
    let before = device.transfers();
    for _ in 0..5 {
        plan.run_on_device(&mut workspace, &run_inputs).unwrap();
    }
    assert_eq!(device.transfers(), before, "runs with device inputs and outputs transfer nothing");
    let got = plan.run_on_device(&mut workspace, &run_inputs).unwrap().to_host(0).unwrap();
    assert_eq!(device.transfers(), before + 1, "reading the output is one download");
    let refs: Vec<_> = inputs.iter().collect();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
    let diff = got.max_abs_diff(&expected[0]);
    println!("device-resident block: max |cuda - cpu| = {diff:e}");
    assert!(diff <= 1e-5, "{diff}");
}

/// The quickstart's block captured as a graph replays to the same result as a stream run, inside
/// the plan's run-level guards only (as its range map says), and refuses other inputs.
#[test]
fn the_quickstart_block_replays_as_a_graph() {
    // Alone on the device, for its transfer counter.
    let Some((device, _alone)) = device_alone() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = quickstart_block(&arena, &registry);
    let (mut fused, fusion) = fused_for_cuda(&device, &trace, &arena);
    fused = ProfileOps::new().with_trace_range(NvtxRange::new().label("block").unwrap()).run(&fused, &arena).unwrap();
    let recorder = boundscope::guards::Recorder::new();
    fused.attach_trace_guard(recorder.clone()).unwrap();
    let plan = Plan::compile(&fused, &[fusion, Arc::new(cuda_ops(device.clone()))]).unwrap();
    let inputs = inputs_for(&trace);
    let uploaded = upload(&device, &inputs);
    let run_inputs: Vec<boundscope::RunInput<'_>> = uploaded.iter().map(boundscope::RunInput::from).collect();
    let mut stream_ws = plan.workspace().unwrap();
    let expected = plan.run_on_device(&mut stream_ws, &run_inputs).unwrap().to_host(0).unwrap();
    let mut graph_ws = plan.workspace().unwrap();
    let mut captured = upload(&device, &inputs);
    let mut graph = plan.capture(&mut graph_ws, captured.iter_mut().collect()).unwrap();
    recorder.clear();
    nvtx_capture::events_on_current_thread();
    let before = device.transfers();
    for _ in 0..3 {
        graph.replay().unwrap();
    }
    assert_eq!(device.transfers(), before, "replays transfer nothing");
    let events = nvtx_capture::events_on_current_thread();
    let got = graph.replay().unwrap().to_host(0).unwrap();
    assert_eq!(got, expected, "a replay computes what a stream run computes");
    assert_eq!(recorder.len(), 4, "run-level guards surround each replay");
    if nvtx_capture::is_installed() {
        let map = graph.range_map();
        assert_eq!(map.len(), 1);
        let replays: Vec<_> = (0..3).flat_map(|_| pushes_in(&map)).collect();
        assert_eq!(pushes_of(&events), replays);
    }
    // New data, refilled in place, reaches the next replay.
    let doubled = boundscope::Tensor::from_fn(inputs[0].shape(), |i| 2.0 * inputs[0].values::<f32>().unwrap()[i]);
    graph.input_mut(0).unwrap().copy_from_host(doubled.view()).unwrap();
    let refilled = graph.replay().unwrap().to_host(0).unwrap();
    let mut changed = inputs.clone();
    changed[0] = doubled;
    let changed_uploaded = upload(&device, &changed);
    let changed_inputs: Vec<boundscope::RunInput<'_>> =
        changed_uploaded.iter().map(boundscope::RunInput::from).collect();
    let expected = plan.run_on_device(&mut stream_ws, &changed_inputs).unwrap().to_host(0).unwrap();
    assert_eq!(refilled, expected);
}

/// One plan run from four threads at once, each in its own workspace (its own stream), each
/// with its own device inputs: every run's result is its own.
#[test]
fn runs_from_several_threads_each_get_their_own_result() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = quickstart_block(&arena, &registry);
    let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
    let plan = Plan::compile(&fused, &[fusion, Arc::new(cuda_ops(device.clone()))]).unwrap();
    let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let base = inputs_for(&trace);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (plan, reference, base, device) = (&plan, &reference, &base, &device);
            scope.spawn(move || {
                let mut inputs = base.clone();
                inputs[0] = boundscope::Tensor::from_fn(base[0].shape(), |i| {
                    base[0].values::<f32>().unwrap()[i] * (t + 1) as f32
                });
                let refs: Vec<_> = inputs.iter().collect();
                let expected = reference.run(&refs).unwrap();
                let uploaded = upload(device, &inputs);
                let run_inputs: Vec<boundscope::RunInput<'_>> =
                    uploaded.iter().map(boundscope::RunInput::from).collect();
                let mut workspace = plan.workspace().unwrap();
                for _ in 0..20 {
                    plan.run_on_device(&mut workspace, &run_inputs).unwrap();
                }
                let got = plan.run_on_device(&mut workspace, &run_inputs).unwrap().to_host(0).unwrap();
                let diff = got.max_abs_diff(&expected[0]);
                assert!(diff <= 1e-5, "thread {t}: {diff}");
                // And through the plan's pool, host inputs in and out.
                let pooled = plan.run(&refs).unwrap();
                assert!(pooled[0].max_abs_diff(&expected[0]) <= 1e-5, "thread {t}, pooled");
            });
        }
    });
}

/// Large uploads and downloads go through reused page-locked staging buffers: back-to-back
/// transfers of one size with different data each arrive whole, both ways, and so does a
/// download that shares its buffer size with an upload in between.
#[test]
fn staged_uploads_and_downloads_arrive_whole() {
    let Some((device, _sharing)) = device() else { return };
    let n = 1 << 20;
    let tensors: Vec<boundscope::Tensor> =
        (0..4).map(|k| boundscope::Tensor::from_fn(&[n], |i| (i * (k + 1)) as f32 + k as f32)).collect();
    let uploaded = upload(&device, &tensors);
    for (tensor, on_device) in tensors.iter().zip(&uploaded) {
        assert_eq!(&on_device.to_host().unwrap(), tensor);
    }
    // Downloads and uploads of one size alternating through the shared staging buffer, and a
    // size below the staging threshold.
    for (k, on_device) in uploaded.iter().enumerate() {
        let again = upload(&device, &tensors[(k + 1) % 4..(k + 1) % 4 + 1]);
        assert_eq!(&on_device.to_host().unwrap(), &tensors[k]);
        assert_eq!(&again[0].to_host().unwrap(), &tensors[(k + 1) % 4]);
    }
    let small = boundscope::Tensor::from_fn(&[1000], |i| i as f32);
    assert_eq!(upload(&device, std::slice::from_ref(&small))[0].to_host().unwrap(), small);
    // Sizes that take several 16 MiB staging chunks, used in turn, both ways.
    for n in [2 * (1 << 22) + 5, 3 * (1 << 22)] {
        let big = boundscope::Tensor::from_fn(&[n], |i| (i % 1009) as f32 + (i / 1009) as f32 * 0.5);
        assert_eq!(upload(&device, std::slice::from_ref(&big))[0].to_host().unwrap(), big, "{n} words");
    }
}

/// Staged transfers from two threads at once, on two streams (the device's own, and a plan's
/// workspace queue), through the shared staging chunks, several chunks each: every copy
/// arrives whole (a chunk is never refilled while a copy on another stream still reads it).
#[test]
fn staged_transfers_from_two_streams_at_once_arrive_whole() {
    let Some((device, _sharing)) = device() else { return };
    let n = 2 * (1 << 22) + 5;
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[n]).unwrap();
    let y = b.neg(x).unwrap();
    b.output(y).unwrap();
    let plan = Plan::compile(&b.finish().unwrap(), &[Arc::new(cuda_ops(device.clone()))]).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            for k in 0..4 {
                let t = boundscope::Tensor::from_fn(&[n], |i| (i % 977) as f32 + k as f32);
                let on_device = upload(&device, std::slice::from_ref(&t));
                assert_eq!(on_device[0].to_host().unwrap(), t, "device stream, round {k}");
            }
        });
        s.spawn(|| {
            let mut workspace = plan.workspace().unwrap();
            for k in 0..4 {
                let t = boundscope::Tensor::from_fn(&[n], |i| (i % 613) as f32 - k as f32);
                let out = plan.run_with(&mut workspace, &[t.view()]).unwrap().to_tensors();
                assert!(
                    out[0].to_f32_vec().into_iter().zip(t.to_f32_vec()).all(|(y, x)| y == -x),
                    "workspace stream, round {k}"
                );
            }
        });
    });
}

/// The device's stream and every workspace's stream carry NVTX names (Nsight shows them), and
/// the threads that fill staging buffers are the named CPU workers.
#[test]
fn streams_and_staging_threads_are_named_for_nvtx() {
    let Some((device, _sharing)) = device() else { return };
    if !nvtx_capture::is_installed() {
        println!("SKIPPED: streams_and_staging_threads_are_named_for_nvtx: an NVTX tool is attached");
        return;
    }
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = quickstart_block(&arena, &registry);
    let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
    let plan = Plan::compile(&fused, &[fusion, Arc::new(cuda_ops(device.clone()))]).unwrap();
    // A workspace makes its stream on its first run (as its device buffers).
    let uploaded = upload(&device, &inputs_for(&trace));
    let run_inputs: Vec<boundscope::RunInput<'_>> = uploaded.iter().map(boundscope::RunInput::from).collect();
    let mut workspaces = [plan.workspace().unwrap(), plan.workspace().unwrap()];
    for workspace in &mut workspaces {
        plan.run_on_device(workspace, &run_inputs).unwrap();
    }
    let names = nvtx_capture::stream_names();
    assert!(names.iter().any(|(_, n)| n == "boundscope cuda:0"), "{names:?}");
    let queues: Vec<_> = names.iter().filter(|(_, n)| n.starts_with("boundscope workspace ")).collect();
    assert!(queues.len() >= 2, "two workspaces, two named streams: {names:?}");
    // A staged upload fills its staging chunk on the named CPU workers.
    upload(&device, &[boundscope::Tensor::zeros(&[1 << 22])]);
    let threads = nvtx_capture::thread_names();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        assert!(threads.iter().any(|(_, n)| n == "boundscope-cpu-1"), "{threads:?}");
    }
}

/// Device memory that cannot be had is a typed error naming the bytes asked for and free.
#[test]
fn out_of_device_memory_is_a_typed_error() {
    let Some((device, _sharing)) = device() else { return };
    let err = boundscope::Device::alloc(&*device, 1 << 40).err().expect("4 TiB cannot be allocated");
    assert!(matches!(err, boundscope::Error::OutOfMemory { bytes, .. } if bytes == 1 << 42), "{err}");
    assert!(err.to_string().contains("bytes free"), "{err}");
}

/// NaN propagates as in PyTorch through `relu`, `maximum` (either side) and row `max`, in fused
/// regions (`CudaFusion`) and per-op kernels (`CudaOps`), as on the CPU.
#[test]
fn nan_propagates_on_cuda() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4, 64]).unwrap();
    let y = b.input(&[4, 64]).unwrap();
    let r = b.relu(x).unwrap();
    let xy = b.maximum(x, y).unwrap();
    let yx = b.maximum(y, x).unwrap();
    let m = b.max(x).unwrap();
    for v in [r, xy, yx, m] {
        b.output(v).unwrap();
    }
    let trace = b.finish().unwrap();
    let nan_at = |i: usize| i % 64 == 37 && i / 64 != 2; // one NaN in rows 0, 1 and 3
    let xs = boundscope::Tensor::from_fn(&[4, 64], |i| if nan_at(i) { f32::NAN } else { i as f32 - 100.0 });
    let ys = boundscope::Tensor::from_fn(&[4, 64], |i| if i % 64 == 5 { f32::NAN } else { 0.5 });
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&xs, &ys]).unwrap();
    assert!(
        expected[0].to_f32_vec()[37].is_nan()
            && expected[1].to_f32_vec()[5].is_nan()
            && expected[2].to_f32_vec()[37].is_nan()
    );
    assert!(expected[3].to_f32_vec()[0].is_nan() && !expected[3].to_f32_vec()[2].is_nan());
    let fusion: Arc<dyn Executor> = Arc::new(cuda_fusion(device.clone()));
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device));
    for fused in [true, false] {
        let trace = if fused { FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap() } else { trace.clone() };
        let plan = Plan::compile(&trace, &[fusion.clone(), ops.clone(), CpuReference::shared()]).unwrap();
        let device_steps = plan.steps_per_executor().iter().filter(|(e, _)| e.starts_with("cuda")).count();
        assert!(device_steps > 0, "{plan}");
        let got = plan.run(&[&xs, &ys]).unwrap();
        common::close_all(&got, &expected, 0.0).unwrap_or_else(|m| panic!("fused: {fused}: {m}\n{plan}"));
    }
}

/// A device kernel run outside a plan, with buffers smaller than the shapes it was compiled
/// for (or too few of them), is a typed error before anything is launched: the generated
/// kernels and cuBLAS check no bounds on the device.
#[test]
fn kernels_refuse_buffers_smaller_than_their_shapes() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[64, 32]).unwrap();
    let w = b.input(&[32, 16]).unwrap();
    let e = b.exp(x).unwrap();
    let y = b.matmul(e, w).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let ops = cuda_ops(device.clone());
    let alloc = |len| boundscope::Device::alloc(&*device, len).unwrap();
    for (position, lengths) in [(0, [64 * 32, 0, 64 * 32]), (1, [64 * 32, 32 * 16, 64 * 16])] {
        let kernel = ops.compile_device(&boundscope::OpView::of(&trace, position).unwrap()).unwrap();
        let inputs: Vec<_> = lengths[..2].iter().filter(|&&n| n > 0).map(|&n| alloc(n)).collect();
        let mut output = alloc(lengths[2]);
        let input_refs: Vec<&dyn boundscope::DeviceBuffer> = inputs.iter().map(|b| &**b).collect();
        kernel.run(&input_refs, &mut [&mut *output]).unwrap();
        let mut small = alloc(lengths[2] - 1);
        let err = kernel.run(&input_refs, &mut [&mut *small]).unwrap_err();
        assert!(matches!(err, boundscope::Error::Execution { .. }) && err.to_string().contains("holds"), "{err}");
        let too_few = &input_refs[..input_refs.len() - 1];
        assert!(kernel.run(too_few, &mut [&mut *output]).is_err());
    }
}

/// The largest difference between `got` and `expected` in units of `dtype`'s last place at
/// each element's magnitude (at least 1).
fn ulps(got: &boundscope::Tensor, expected: &boundscope::Tensor, dtype: boundscope::DType) -> f32 {
    let eps = match dtype {
        boundscope::DType::BF16 => 2f32.powi(-7),
        boundscope::DType::F16 => 2f32.powi(-10),
        _ => 2f32.powi(-23),
    };
    got.to_f32_vec()
        .into_iter()
        .zip(expected.to_f32_vec())
        .map(|(g, e)| if g == e { 0.0 } else { (g - e).abs() / (eps * e.abs().max(1.0)) })
        .fold(0.0, f32::max)
}

/// bf16 and f16 plans on the GPU (16-byte vector loads and stores, `f32` registers, cuBLASLt
/// products with `f32` accumulation) equal the CPU executors with the same rounding points:
/// fused regions against CpuFusion (rounding only a region's outputs), per-op kernels against
/// the CPU reference (rounding every op), within one unit in the last place (two for products,
/// whose sums are in another order); casts, uploads and downloads exactly.
#[test]
fn bf16_and_f16_plans_match_the_cpu_executors() {
    use boundscope::executors::CpuFusion;
    use boundscope::{DType, DeviceTensor, Tensor, TensorMeta, TraceBuilder};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    for dtype in [DType::BF16, DType::F16] {
        let arena = Arena::new();
        let t = |shape: &[usize]| TensorMeta::new(dtype, shape);
        // The norm and swish chains, a mixed-dtype op, a product and a cast, in one trace.
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&t(&[32, 64])).unwrap();
        let mean = b.input_with(&t(&[32, 1])).unwrap();
        let w = b.input_with(&t(&[64])).unwrap();
        let f = b.input(&[32, 64]).unwrap();
        let m = b.input_with(&t(&[64, 48])).unwrap();
        let c = b.sub(x, mean).unwrap();
        let n = b.mul(c, w).unwrap();
        let s = b.sigmoid(n).unwrap();
        let swish = b.mul(n, s).unwrap();
        let mixed = b.mul(swish, f).unwrap(); // promotes to f32
        let product = b.matmul(swish, m).unwrap();
        let cast = b.cast(f, dtype).unwrap();
        // Shape ops move 16-bit values as they are.
        let transposed = b.transpose(m, &[1, 0]).unwrap();
        let spread = b.broadcast_to(w, &[32, 64]).unwrap();
        let reshaped = b.reshape(x, &[64, 32]).unwrap();
        for v in [swish, mixed, product, cast, transposed, spread, reshaped] {
            b.output(v).unwrap();
        }
        let trace = b.finish().unwrap();
        let inputs = inputs_for(&trace);
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let (fused_gpu, fusion) = fused_for_cuda(&device, &trace, &arena);
        let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
        let gpu_fused = Plan::compile(&fused_gpu, &[fusion, ops.clone()]).unwrap();
        let gpu_ops = Plan::compile(&trace, &[ops]).unwrap();
        let fused_cpu = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).unwrap();
        let cpu_fused = Plan::compile(&fused_cpu, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
        let cpu_ops = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        println!("{dtype}: {gpu_fused}");
        assert!(gpu_fused.steps_per_executor().iter().all(|(e, _)| *e != "cpu_reference"), "{gpu_fused}");
        let (gf, go, cf, co) = (
            gpu_fused.run(&refs).unwrap(),
            gpu_ops.run(&refs).unwrap(),
            cpu_fused.run(&refs).unwrap(),
            cpu_ops.run(&refs).unwrap(),
        );
        for (i, limit) in [(0, 1.0), (1, 1.0), (2, 2.0), (3, 0.0), (4, 0.0), (5, 0.0), (6, 0.0)] {
            let out = trace.value_meta(trace.outputs()[i]).unwrap().dtype;
            let (fused, per_op) = (ulps(&gf[i], &cf[i], out), ulps(&go[i], &co[i], out));
            println!("{dtype} output {i} ({out}): fused {fused} ulps, per op {per_op} ulps from the CPU's");
            assert!(fused <= limit && per_op <= limit, "{dtype} output {i}: {fused} / {per_op} ulps");
            assert_eq!((gf[i].dtype(), go[i].dtype()), (out, out));
        }
        // layer_norm and softmax, which CudaOps runs whole (a warp per row, `f32` throughout,
        // one rounding): within one unit of the f32 result rounded once.
        let mut b = TraceBuilder::new(&arena, &registry);
        let rows = b.input_with(&t(&[16, 64])).unwrap();
        let gamma = b.input_with(&t(&[64])).unwrap();
        let beta = b.input_with(&t(&[64])).unwrap();
        let normed = b.layer_norm(rows, 1e-5, Some(gamma), Some(beta)).unwrap();
        let soft = b.softmax(rows).unwrap();
        b.output(normed).unwrap();
        b.output(soft).unwrap();
        let whole = b.finish().unwrap();
        let mut b = TraceBuilder::new(&arena, &registry);
        let (r32, g32, b32) = (b.input(&[16, 64]).unwrap(), b.input(&[64]).unwrap(), b.input(&[64]).unwrap());
        let n32 = b.layer_norm(r32, 1e-5, Some(g32), Some(b32)).unwrap();
        let s32 = b.softmax(r32).unwrap();
        b.output(n32).unwrap();
        b.output(s32).unwrap();
        let in_f32 = b.finish().unwrap();
        let row_inputs: Vec<Tensor> = [&[16usize, 64][..], &[64], &[64]]
            .iter()
            .enumerate()
            .map(|(k, shape)| Tensor::from_fn(shape, |i| ((i * 5 + k * 11) % 23) as f32 / 11.0 - 1.0).to_dtype(dtype))
            .collect();
        let (whole_gpu, _) = fused_for_cuda(&device, &whole, &arena);
        let plan = Plan::compile(&whole_gpu, &[Arc::new(cuda_ops(device.clone())) as Arc<dyn Executor>]).unwrap();
        assert_eq!(plan.len(), 7, "three uploads, two row kernels, two downloads: {plan}");
        let got = plan.run(&row_inputs.iter().collect::<Vec<_>>()).unwrap();
        let widened: Vec<Tensor> = row_inputs.iter().map(|t| t.to_dtype(DType::F32)).collect();
        let exact = Plan::compile(&in_f32, &[CpuReference::shared()])
            .unwrap()
            .run(&widened.iter().collect::<Vec<_>>())
            .unwrap();
        for i in 0..2 {
            let d = ulps(&got[i], &exact[i].to_dtype(dtype), dtype);
            println!("{dtype} row kernel {i}: {d} ulps from the f32 result rounded once");
            assert!(d <= 1.0, "{dtype} row kernel {i}: {d} ulps");
        }
        // Device tensors of 16-bit values: uploaded packed, read back exactly; a device input
        // of another dtype is a typed error.
        let on_device: Arc<dyn boundscope::Device> = device.clone();
        let up = DeviceTensor::upload(&on_device, inputs[0].view()).unwrap();
        assert_eq!(up.dtype(), dtype);
        assert_eq!(up.to_host().unwrap(), inputs[0]);
        let uploaded: Vec<DeviceTensor> =
            inputs.iter().map(|t| DeviceTensor::upload(&on_device, t.view()).unwrap()).collect();
        let run_inputs: Vec<boundscope::RunInput<'_>> = uploaded.iter().map(boundscope::RunInput::from).collect();
        let mut ws = gpu_fused.workspace().unwrap();
        let on_gpu = gpu_fused.run_on_device(&mut ws, &run_inputs).unwrap().to_host(0).unwrap();
        assert_eq!(on_gpu, gf[0]);
        let wrong = DeviceTensor::upload(&on_device, inputs[3].view()).unwrap(); // f32
        let mut mixed_up: Vec<boundscope::RunInput<'_>> = run_inputs.clone();
        mixed_up[0] = boundscope::RunInput::from(&wrong);
        let err = gpu_fused.run_on_device(&mut ws, &mixed_up).err().expect("a dtype error");
        assert!(matches!(err, boundscope::Error::InputDType { index: 0, .. }), "{err}");
    }
}

/// A fused region over enough rows that each thread of a 16-bit kernel takes several
/// (`gelu((x - mean) * scale + bias)`, `scale` and `bias` rows read once per thread for all of
/// its rows, `mean` per row) equals CpuFusion within one unit in the last place: bf16 and f16
/// over [8192, 1024] (2 rows a thread), a bf16 region with an `f32` row, bf16 and f16 over [8192,
/// 8192] (16 rows a thread: two batches of 8 with `KernelVariants::batched_rows`), bf16 over [8192,
/// 4096] with an `f32` input `z` read whole too (8 rows a thread, batches of 2), and f32 (a row
/// a thread); each with the variants under test, with `batched_rows` and without it (the
/// variant batches only the three cases whose tensors outgrow the L2 of today's GPUs).
#[test]
fn row_broadcasts_held_over_several_rows_match_the_cpu_executors() {
    use boundscope::{DType, TensorMeta, TraceBuilder};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    for (dtype, bias_dtype, [rows, cols], z_dtype) in [
        (DType::F32, DType::F32, [8192, 1024], None),
        (DType::BF16, DType::BF16, [8192, 1024], None),
        (DType::F16, DType::F16, [8192, 1024], None),
        (DType::BF16, DType::F32, [8192, 1024], None),
        (DType::BF16, DType::BF16, [8192, 8192], None),
        (DType::F16, DType::F16, [8192, 8192], None),
        (DType::BF16, DType::BF16, [8192, 4096], Some(DType::F32)),
    ] {
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(dtype, &[rows, cols])).unwrap();
        let mean = b.input_with(&TensorMeta::new(dtype, &[rows, 1])).unwrap();
        let scale = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
        let bias = b.input_with(&TensorMeta::new(bias_dtype, &[cols])).unwrap();
        let c = b.sub(x, mean).unwrap();
        let y = b.mul(c, scale).unwrap();
        let mut y = b.add(y, bias).unwrap();
        if let Some(z_dtype) = z_dtype {
            let z = b.input_with(&TensorMeta::new(z_dtype, &[rows, cols])).unwrap();
            y = b.add(y, z).unwrap();
        }
        let y = b.gelu(y).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let inputs = inputs_for(&trace);
        for batched_rows in [false, true] {
            let variants = KernelVariants { batched_rows, ..variants_under_test() };
            let (d, plan) = ulps_from_cpu_fusion_with(&device, &trace, &arena, &inputs, variants);
            let case = format!("{dtype} (bias {bias_dtype}, z {z_dtype:?}) over [{rows}, {cols}], {variants:?}");
            println!("{case}: {d} ulps from CpuFusion");
            assert!(d <= 1.0, "{case}: {d} ulps\n{plan}");
        }
    }
}

/// Regions whose broadcasts the vectors straddle (read per element beside whole inputs read a
/// vector an access), with a tail past the last whole vector, or of fewer values than a vector,
/// in f32, bf16 and f16, equal CpuFusion within one unit in the last place: `[8, 12]` with a
/// per-row `[8, 1]`, `[5, 7]` with a `[7]` row (a tail of 3), `[1335, 50257]` with a
/// `[50257]` row (GPT-2's vocabulary) and with a per-row `[1335, 1]`, `[2, 3, 2, 4]` with
/// `[3, 1, 4]`, and `[3]`. In 16 bits, rows read per vector with two aligned accesses and a
/// shift, at every shift: rows of 9 (a vector in two rows nearly everywhere), `[3, 5, 19]`
/// with `[5, 19]` (rows repeated along the first axis, the second access past the operand's
/// end near it), and per-row values over several axes (`[4, 2, 11]` with `[4, 1, 1]`).
#[test]
fn broadcasts_that_straddle_vectors_and_tails_match_the_cpu_executors() {
    use boundscope::{DType, TensorMeta, TraceBuilder};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let cases: [(&[usize], &[usize]); 10] = [
        (&[8, 12], &[8, 1]),
        (&[5, 7], &[7]),
        (&[1335, 50257], &[50257]),
        (&[1335, 50257], &[1335, 1]),
        (&[2, 3, 2, 4], &[3, 1, 4]),
        (&[3], &[1]),
        (&[64, 9], &[9]),
        (&[3, 5, 19], &[5, 19]),
        (&[7, 33], &[7, 1]),
        (&[4, 2, 11], &[4, 1, 1]),
    ];
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for (shape, other) in cases {
            let arena = Arena::new();
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, shape)).unwrap();
            let w = b.input_with(&TensorMeta::new(dtype, other)).unwrap();
            let y = b.mul(x, w).unwrap();
            let y = b.add_scalar(y, 0.25).unwrap();
            let y = b.gelu(y).unwrap();
            b.output(y).unwrap();
            let trace = b.finish().unwrap();
            let inputs = inputs_for(&trace);
            let (d, gpu) = ulps_from_cpu_fusion(&device, &trace, &arena, &inputs);
            assert!(d <= 1.0, "{dtype} {shape:?} x {other:?}: {d} ulps from CpuFusion\n{gpu}");
        }
    }
}

/// Workspaces made and dropped one after another do not leave their cuBLASLt workspaces (32 MiB
/// each, one per stream) behind: the device's free memory stays where it was.
#[test]
fn workspaces_made_and_dropped_leave_no_device_memory_behind() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = quickstart_block(&arena, &registry);
    let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
    let plan = Plan::compile(&fused, &[fusion, Arc::new(cuda_ops(device.clone()))]).unwrap();
    let uploaded = upload(&device, &inputs_for(&trace));
    let run_inputs: Vec<boundscope::RunInput<'_>> = uploaded.iter().map(boundscope::RunInput::from).collect();
    let context = cudarc::driver::CudaContext::new(0).unwrap();
    let free = || {
        boundscope::Device::synchronize(&*device).unwrap();
        context.bind_to_thread().unwrap();
        cudarc::driver::result::mem_get_info().unwrap().0
    };
    let run_once = || {
        let mut workspace = plan.workspace().unwrap();
        plan.run_on_device(&mut workspace, &run_inputs).unwrap();
    };
    run_once();
    let before = free();
    for _ in 0..40 {
        run_once();
    }
    let after = free();
    let lost = before.saturating_sub(after);
    println!("device memory lost over 40 workspaces: {} MiB", lost >> 20);
    assert!(lost < 128 << 20, "{} MiB lost: a workspace per stream is kept after its stream is gone", lost >> 20);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// CUDA plans equal the CPU reference; one NVTX range per top-level bound symbol and one
    /// around the run, whoever emits it. Programs of the prims and composites, and of the
    /// transformer ops (slices and concatenations along any axis, reductions over any axis,
    /// the causal mask, `log_softmax`).
    #[test]
    fn cuda_plans_match_the_reference(
        program in prop_oneof![programs(true), transformer_programs()],
        dataflow in any::<bool>(),
        whole in any::<bool>(),
        seed in any::<u64>(),
    ) {
        plan_matches_the_reference(&program, dataflow, whole, seed)?;
    }
}

/// A case `cuda_plans_match_the_reference` found on the H200: a `div` by a decomposed
/// `layer_norm` of two values times its weight plus a bias equal to the weight, which cancels.
/// The plan gave -5,581.70 where the CPU reference gives -5,580.93 (1.4e-4 apart, past the
/// tolerance), and the direct evaluation -5,582.84; nudged by a few ulps, the direct
/// evaluation moves by up to 137, so rounding decides the element and the plan is right.
#[test]
fn a_division_by_what_cancels_is_held_to_its_spread() {
    let program = Program {
        inputs: vec![vec![4, 2], vec![2, 1], vec![2], vec![4, 1], vec![1, 2]],
        ops: vec![
            Op::Softmax(4),
            Op::BroadcastTo(3, vec![2, 4, 3]),
            Op::BroadcastTo(3, vec![2, 4, 3]),
            Op::LayerNorm(4, 1e-5, Some(2), Some(2)),
            Op::Transpose(1, vec![1, 0]),
            Op::Binary("div", 3, Operand::Value(8)),
        ],
        outputs: vec![10],
    };
    let strayed = plan_matches_the_reference(&program, false, false, 1464802527021699889).unwrap();
    eprintln!("strayed from the CPU reference and held to its spread: {strayed}");
}

/// The property of `cuda_plans_match_the_reference`, for one program: `true` where an output
/// strayed from the CPU reference and its spread decided it.
fn plan_matches_the_reference(
    program: &Program,
    dataflow: bool,
    whole: bool,
    seed: u64,
) -> Result<bool, TestCaseError> {
    let Some((device, _sharing)) = device() else { return Ok(false) };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = program.build(&arena, &registry).unwrap();
    // Half the cases keep what `CudaOps` prefers whole (linear, softmax, layer_norm).
    let pipeline = if whole {
        Pipeline::for_executors(&[Arc::new(cuda_ops(device.clone())) as Arc<dyn Executor>])
    } else {
        Pipeline::standard()
    };
    let prims_only = pipeline.run(&trace, &arena).unwrap();
    let mut profiled = ProfileOps::new().with_trace_range(NvtxRange::new()).run(&prims_only, &arena).unwrap();
    // And the application's own ranges, in a domain of its own.
    profiled.attach_guard(Selection::All, NvtxRange::new().domain("user").unwrap()).unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(cuda_fusion(device.clone()));
    let strategy = if dataflow { FusionStrategy::Dataflow } else { FusionStrategy::Consecutive };
    let fused = FuseRegions::new(fusion.clone()).strategy(strategy).run(&profiled, &arena).unwrap();
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device));
    let plan = Plan::compile(&fused, &[fusion, ops, CpuReference::shared()]).unwrap();
    let reference = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let inputs = program.input_data(seed);
    let refs: Vec<_> = inputs.iter().collect();
    nvtx_capture::events_on_current_thread();
    let got = plan.run(&refs).unwrap();
    let events = nvtx_capture::events_on_current_thread();
    let expected = reference.run(&refs).unwrap();
    let strayed = common::close_all(&got, &expected, TOLERANCE);
    if let Err(against_reference) = &strayed {
        // An element that divides by what cancels (a `layer_norm`'s output plus its bias,
        // say) is decided by rounding: held, as the CPU plans are, to the spread of nudged
        // direct evaluations (`common::close`), not to the reference's own rounding alone.
        let (direct, spread) = common::oracle::evaluate_with_spread(program, &inputs);
        // (The direct evaluation gives every value of the program, its inputs first.)
        for (out, &index) in got.iter().zip(&program.outputs) {
            common::close(out.view(), &direct[index], &spread[index], TOLERANCE).map_err(|m| {
                TestCaseError::fail(format!(
                    "value {index}: {m} (against the CPU reference: {against_reference})\n{fused}\n{plan}"
                ))
            })?;
        }
    }
    if nvtx_capture::is_installed() {
        // What the NVTX API saw is the plan's range map, exactly.
        prop_assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{:#}", plan);
        let pushes = events
            .iter()
            .filter(|e| e.kind == NvtxEventKind::Push && e.domain.as_deref() == Some(DEFAULT_DOMAIN))
            .count();
        prop_assert_eq!(pushes, 1 + fused.len(), "{}", fused);
        let regions = fused.bound_symbols().iter().filter(|b| b.symbol() == prims::REGION).count();
        let region_ranges = events
            .iter()
            .filter(|e| {
                e.domain.as_deref() == Some(DEFAULT_DOMAIN)
                    && e.message.as_deref().is_some_and(|m| m.starts_with("CudaFusion"))
            })
            .count();
        prop_assert_eq!(region_ranges, regions);
    }
    Ok(strayed.is_err())
}

/// One device object per GPU: `CudaDevice::new` and `with_ordinal(0)` give the process's one
/// handle, the front end uses it too (`ProfiledSession::device`), so a tensor uploaded through
/// a handle the user made runs in a session's plan; an ordinal past the GPUs is a typed error
/// that says how many there are.
#[test]
fn one_handle_per_gpu_and_the_front_end_shares_it() {
    use boundscope::frontend::{Environment, ProfiledSession};
    use boundscope::options::Options;
    use boundscope::{DeviceTensor, RunInput, Tensor};
    let Some((device, _sharing)) = device() else { return };
    let mine = CudaDevice::new().unwrap();
    assert!(Arc::ptr_eq(&mine, &device) && Arc::ptr_eq(&mine, &CudaDevice::with_ordinal(0).unwrap()));
    assert_eq!(mine.ordinal(), 0);
    let count = cudarc::driver::CudaContext::device_count().unwrap() as usize;
    let err = CudaDevice::with_ordinal(count).err().expect("no such GPU");
    assert!(err.to_string().contains(&format!("this machine has {count}")), "{err}");
    let session =
        ProfiledSession::new(Options::new(), &Environment::from_pairs(&[("BOUNDSCOPE_DEVICE", "cuda")])).unwrap();
    let theirs = session.device().expect("a GPU session has a device");
    let as_device: Arc<dyn boundscope::Device> = mine.clone();
    assert!(std::ptr::addr_eq(Arc::as_ptr(&theirs), Arc::as_ptr(&as_device)));
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4096]).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let host = Tensor::from_fn(&[4096], |i| (i % 13) as f32 / 13.0);
    let on_device = DeviceTensor::upload(&as_device, host.view()).unwrap();
    let plan = session.plan(&trace, &arena).unwrap();
    let mut workspace = plan.workspace().unwrap();
    let out = plan.run_on_device(&mut workspace, &[RunInput::from(&on_device)]).unwrap().to_host(0).unwrap();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&host]).unwrap();
    assert!(out.to_f32_vec().iter().zip(expected[0].to_f32_vec()).all(|(a, b)| (a - b).abs() < TOLERANCE));
}

/// The front end configures both CUDA executors from its developer options (`cuda.*`: the
/// kernel variants): a plan of a bf16 `softmax` and a fused 16-bit `sigmoid` chain, with every
/// variant away from its default, lists them all in its header and reports none unused (the
/// executors were configured with them), and its results equal the reference's (which the
/// default kernels' would too: the variants' own results are checked by the row and subnormal
/// tests).
#[test]
fn the_front_end_generates_the_kernel_variants_its_options_choose() {
    use boundscope::frontend::{Environment, ProfiledSession};
    use boundscope::options::Options;
    use boundscope::{Tensor, TraceBuilder};
    let Some((_device, _sharing)) = device() else { return };
    let mut options = Options::new();
    options.set_developer("cuda.fast_exp2", false).unwrap();
    options.set_developer("cuda.int32_row_columns", true).unwrap();
    options.set_developer("cuda.streaming_rows", false).unwrap();
    options.set_developer("cuda.keep_in_l2", false).unwrap();
    options.set_developer("cuda.batched_rows", false).unwrap();
    let session = ProfiledSession::new(options, &Environment::from_pairs(&[("BOUNDSCOPE_DEVICE", "cuda")])).unwrap();
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input_with(&TensorMeta::new(DType::BF16, &[64, 1001])).unwrap();
    let y = b.softmax(x).unwrap();
    let s = b.sigmoid(x).unwrap();
    let z = b.mul(s, x).unwrap();
    b.output(y).unwrap();
    b.output(z).unwrap();
    let trace = b.finish().unwrap();
    let plan = session.plan(&trace, &arena).unwrap();
    let executors: Vec<&str> = plan.steps_per_executor().into_iter().map(|(e, _)| e).collect();
    assert!(executors.contains(&"cuda_ops") && executors.contains(&"cuda_fusion"), "{plan}");
    assert_eq!(
        plan.developer_options(),
        [
            "cuda.fast_exp2=false",
            "cuda.int32_row_columns=true",
            "cuda.streaming_rows=false",
            "cuda.keep_in_l2=false",
            "cuda.batched_rows=false"
        ],
        "{plan}"
    );
    assert!(plan.unused_options().is_empty(), "{:?}", plan.unused_options());
    let input = Tensor::from_fn(&[64, 1001], |i| ((i * 37) % 101) as f32 / 10.0 - 5.0).to_dtype(DType::BF16);
    let got = plan.run(&[&input]).unwrap();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&input]).unwrap();
    for (g, e) in got.iter().zip(&expected) {
        let scale = e.to_f32_vec().iter().fold(1f32, |m, v| m.max(v.abs()));
        assert!(g.max_abs_diff(e) / scale < 2e-2, "{plan}");
    }
}

/// Transfers through the public `Device` trait with a device buffer shorter than the host
/// data are typed errors naming both lengths, staged (2^20 words) or not (1,000), both ways:
/// never a panic inside cudarc.
#[test]
fn transfers_of_the_wrong_length_are_typed_errors() {
    use boundscope::{Device, Error};
    let Some((device, _sharing)) = device() else { return };
    for n in [1000usize, 1 << 20] {
        let host = vec![1.0f32; n];
        let mut short = device.alloc(n - 1).unwrap();
        let err = device.upload(&host, &mut *short).unwrap_err();
        assert_eq!(err, Error::TransferLength { direction: "upload", host: n, device: n - 1 });
        assert!(err.to_string().contains(&format!("{n} words into a device buffer of {}", n - 1)), "{err}");
        let mut back = vec![0.0f32; n];
        let err = device.download(&*short, &mut back).unwrap_err();
        assert_eq!(err, Error::TransferLength { direction: "download", host: n, device: n - 1 });
        // A buffer at least as long takes the data (into its first words) and gives it back.
        let mut long = device.alloc(n + 7).unwrap();
        device.upload(&host, &mut *long).unwrap();
        device.download(&*long, &mut back).unwrap();
        assert_eq!(back, host);
    }
}

/// Inside a fused region on the GPU, an op reads the `f32` value of a 16-bit value the region
/// also writes (rounded): `torch.compile`'s rule, as CpuFusion follows it
/// (`dtypes_match_direct_evaluation`). `y = x + 1/512` is 1 in bf16, `z = (y - 1) * 512` is 1.
#[test]
fn a_fused_region_reads_the_f32_value_of_its_own_16_bit_outputs_on_the_gpu() {
    use boundscope::{DType, Tensor};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = common::program::reads_its_own_16_bit_output(&arena, &registry, 4096);
    let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
    let plan = Plan::compile(&fused, &[fusion]).unwrap();
    assert_eq!(plan.steps_per_executor()[0], ("cuda_fusion", 1), "one fused region\n{plan}");
    let out = plan.run(&[&Tensor::from_fn(&[4096], |_| 1.0).to_dtype(DType::BF16)]).unwrap();
    assert!(out[0].to_f32_vec().iter().all(|&v| v == 1.0), "y is stored rounded");
    assert!(out[1].to_f32_vec().iter().all(|&v| v == 1.0), "z reads y's f32 value: {:?}", &out[1].to_f32_vec()[..4]);
}

/// Zero-dimensional operands promote as in PyTorch on the GPU too: `bf16[n] + f32[]` is bf16,
/// computed in `f32` and rounded once, in a fused region and per op, equal to the CPU reference.
#[test]
fn zero_dimensional_operands_promote_as_in_pytorch_on_the_gpu() {
    use boundscope::{DType, Tensor, TensorMeta};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input_with(&TensorMeta::new(DType::BF16, &[1000])).unwrap();
    let s = b.input_with(&TensorMeta::new(DType::F32, &[])).unwrap();
    let y = b.add(x, s).unwrap();
    let z = b.mul(y, s).unwrap();
    b.output(z).unwrap();
    let trace = b.finish().unwrap();
    assert_eq!(trace.value_meta(z).unwrap().dtype, DType::BF16);
    let inputs =
        [Tensor::from_fn(&[1000], |i| i as f32 / 7.0).to_dtype(DType::BF16), Tensor::new(&[], vec![1.3]).unwrap()];
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
    let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
    let fused_plan = Plan::compile(&fused, &[fusion, ops.clone()]).unwrap();
    let per_op = Plan::compile(&trace, &[ops]).unwrap();
    let cpu_fused = FuseRegions::new(boundscope::executors::CpuFusion::shared()).run(&trace, &arena).unwrap();
    let cpu_fused =
        Plan::compile(&cpu_fused, &[boundscope::executors::CpuFusion::shared()]).unwrap().run(&refs).unwrap();
    let fused_out = fused_plan.run(&refs).unwrap();
    let per_op_out = per_op.run(&refs).unwrap();
    assert_eq!(fused_out[0].dtype(), DType::BF16);
    assert!(ulps(&per_op_out[0], &expected[0], DType::BF16) <= 1.0);
    assert!(ulps(&fused_out[0], &cpu_fused[0], DType::BF16) <= 1.0);
}

/// A transformer's ops beside CudaOps: integer ids and every dtype cross the host-device
/// boundary in their own bits; ops CudaOps does not run yet (embedding, batched products,
/// slices, the loss) run on the CPU reference in the same plan, and the results equal the CPU
/// reference's alone.
#[test]
fn transformer_ops_run_beside_cuda_ops_with_typed_transfers() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (tokens, width, vocab) = (8, 16, 32);
        let mut b = boundscope::TraceBuilder::new(&arena, &registry);
        let wte = b.input_with(&TensorMeta::new(dtype, &[vocab, width])).unwrap();
        let ids = b.input_with(&TensorMeta::new(DType::I64, &[2, tokens])).unwrap();
        let x = b.embedding(wte, ids).unwrap();
        let h = b.layer_norm(x, 1e-5, None, None).unwrap();
        let qkv = b.split(h, 2, &[8, 8]).unwrap();
        let a = b.scaled_dot_product_attention(qkv[0], qkv[1], qkv[1], true, None).unwrap();
        let t = b.exp(a).unwrap();
        let logits = b.reshape(t, &[2 * tokens, 8]).unwrap();
        let flat = b.reshape(ids, &[2 * tokens]).unwrap();
        // Targets from the gathered rows, which are exact on both: an argmax of the logits could
        // flip between near ties when attention rounds differently.
        let firsts = b.slice(x, 2, 0, 8).unwrap();
        let firsts = b.reshape(firsts, &[2 * tokens, 8]).unwrap();
        let classes = b.argmax(firsts, 1, false).unwrap();
        let loss = b.cross_entropy(logits, classes).unwrap();
        for v in [loss, flat, classes, logits] {
            b.output(v).unwrap();
        }
        let trace = b.finish().unwrap();
        let wte = Tensor::from_fn(&[vocab, width], |i| ((i * 37 % 101) as f32 / 50.0) - 1.0).to_dtype(dtype);
        let ids =
            Tensor::from_vec(&[2, tokens], (0..2 * tokens as i64).map(|i| (i * 5 + (1 << 40)) % 32).collect()).unwrap();
        let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&wte, &ids]).unwrap();
        let plan = Plan::compile(&trace, &[Arc::new(cuda_ops(device.clone())), CpuReference::shared()]).unwrap();
        let listing = plan.to_string();
        assert!(listing.contains("cuda_ops"), "{listing}");
        let got = plan.run(&[&wte, &ids]).unwrap();
        assert_eq!(got[1], expected[1], "{dtype}: ids cross unchanged");
        assert_eq!(got[2], expected[2], "{dtype}: the targets are exact");
        // Relative to the largest value: in 16 bits, cuDNN's attention rounds its probabilities
        // before the second product, which the reference's f32 decomposition does not.
        let tolerance = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
        for i in [0, 3] {
            let scale = expected[i].to_f32_vec().iter().fold(1f32, |m, v| m.max(v.abs()));
            let diff = got[i].max_abs_diff(&expected[i]);
            assert!(diff <= tolerance * scale, "{dtype}: output {i} differs by {diff} (scale {scale})\n{listing}");
        }
        // An i64 device tensor round-trips exactly.
        let on: Arc<dyn boundscope::Device> = device.clone();
        let big = Tensor::from_vec(&[3], vec![i64::MIN, (1 << 53) + 1, -7]).unwrap();
        assert_eq!(DeviceTensor::upload(&on, big.view()).unwrap().to_host().unwrap(), big);
    }
}

/// The transformer ops CudaOps runs (strided batched products, slices, concatenation, the
/// causal mask, reductions over any axis, argmax, moves of i64 values) equal the CPU
/// reference's on the H200, in every float dtype, over random shapes, axes and broadcasts; a
/// product whose batch broadcast one strided batched call cannot read runs on the CPU instead.
#[test]
fn transformer_ops_on_cuda_match_the_reference() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let cuda: Vec<Arc<dyn Executor>> = vec![Arc::new(cuda_ops(device.clone())), CpuReference::shared()];
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 24, ..ProptestConfig::default() });
    let strategy = (
        proptest::collection::vec(1usize..5, 2..5),
        0usize..8,
        0usize..8,
        proptest::sample::select(vec![DType::F32, DType::BF16, DType::F16]),
        1usize..40,
    );
    runner
        .run(&strategy, |(shape, axis_pick, cut, dtype, k)| {
            let arena = Arena::new();
            let rank = shape.len();
            let axis = axis_pick % rank;
            let cut = cut % (shape[axis] + 1);
            let mut b = boundscope::TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, &shape)).unwrap();
            let ids = b.input_with(&TensorMeta::new(DType::I64, &shape)).unwrap();
            // Products: x as [..., m, n] times [n, k] (b broadcast), [..., n, k] (both batched),
            // and [1, .., m, n] times [..., n, k] (a broadcast).
            let (m, n) = (shape[rank - 2], shape[rank - 1]);
            let w2 = b.input_with(&TensorMeta::new(dtype, &[n, k])).unwrap();
            let mut wb_shape = shape[..rank - 2].to_vec();
            wb_shape.extend([n, k]);
            let wb = b.input_with(&TensorMeta::new(dtype, &wb_shape)).unwrap();
            let a1 = b.input_with(&TensorMeta::new(dtype, &[m, n])).unwrap();
            let parts = b.split(x, axis, &[cut, shape[axis] - cut]).unwrap();
            let joined = b.concat(&parts, axis).unwrap();
            let masked = b.causal_mask(joined).unwrap();
            let positive = b.compare_scalar(prims::GT, x, 0.0).unwrap();
            let below = b.lt(x, a1).unwrap();
            let outs = [
                b.matmul(x, w2).unwrap(),
                b.matmul(x, wb).unwrap(),
                b.matmul(a1, wb).unwrap(),
                b.matmul_transposed(x, x).unwrap(),
                b.matmul_transposed(a1, x).unwrap(),
                // x^T x ([..., n, n], batched) and x^T w ([n, k], w read by every product).
                b.transposed_matmul(x, x).unwrap(),
                b.transposed_matmul(a1, a1).unwrap(),
                masked,
                b.sum_dim(x, axis, false).unwrap(),
                b.max_dim(x, axis, true).unwrap(),
                b.argmax(x, axis, false).unwrap(),
                b.slice(ids, axis, cut, shape[axis]).unwrap(),
                b.where_scalar(positive, x, -1.5).unwrap(),
                b.where_(below, x, a1).unwrap(),
                below,
                b.eq(ids, ids).unwrap(),
            ];
            for v in outs {
                b.output(v).unwrap();
            }
            let trace = b.finish().unwrap();
            let data = [
                Tensor::from_fn(&shape, |i| ((i * 37 % 101) as f32 / 40.0) - 1.2).to_dtype(dtype),
                Tensor::from_vec(
                    &shape,
                    (0..shape.iter().product::<usize>() as i64).map(|i| i * (1 << 40) - 3).collect(),
                )
                .unwrap(),
                Tensor::from_fn(&[n, k], |i| ((i * 13 % 29) as f32 / 20.0) - 0.7).to_dtype(dtype),
                Tensor::from_fn(&wb_shape, |i| ((i * 7 % 31) as f32 / 25.0) - 0.6).to_dtype(dtype),
                Tensor::from_fn(&[m, n], |i| ((i * 11 % 23) as f32 / 15.0) - 0.8).to_dtype(dtype),
            ];
            let refs: Vec<&Tensor> = data.iter().collect();
            let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
            let plan = Plan::compile(&trace, &cuda).unwrap();
            let listing = plan.to_string();
            for op in [
                "matmul",
                "matmul_transposed",
                "transposed_matmul",
                "slice",
                "concat",
                "causal_mask",
                "argmax",
                "lt",
                "gt",
                "eq",
                "where",
            ] {
                let on_cpu = listing.lines().any(|l| l.contains(&format!("= {op}(")) && l.contains("cpu_reference"));
                prop_assert!(!on_cpu, "{} ran on the CPU:\n{}", op, listing);
            }
            let got = plan.run(&refs).unwrap();
            let tolerance = match dtype {
                DType::F32 => 1e-4,
                _ => 2e-2,
            };
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                prop_assert_eq!(g.dtype(), e.dtype());
                if e.dtype().is_integer() {
                    prop_assert_eq!(g, e, "output {} ({}) differs\n{}", i, dtype, listing);
                } else {
                    let (g, e) = (g.to_f32_vec(), e.to_f32_vec());
                    let scale = e.iter().filter(|v| v.is_finite()).fold(1f32, |m, v| m.max(v.abs()));
                    // Equal (the mask's infinities included), or within the tolerance.
                    let bad = g
                        .iter()
                        .zip(&e)
                        .position(|(a, b)| a != b && ((a - b).abs() > tolerance * scale || (a - b).is_nan()));
                    prop_assert!(
                        bad.is_none(),
                        "output {} ({}) differs at {:?}\n{}",
                        i,
                        dtype,
                        bad.map(|j| (g[j], e[j])),
                        listing
                    );
                }
            }
            Ok(())
        })
        .unwrap();
    // A batch broadcast one strided call cannot express: [2, 1] x [1, 3] batches.
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 1, 4, 5]).unwrap();
    let w = b.input(&[1, 3, 5, 6]).unwrap();
    let y = b.matmul(x, w).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &cuda).unwrap();
    assert!(plan.to_string().lines().any(|l| l.contains("matmul(") && l.contains("cpu_reference")), "{plan}");
    let (x, w) =
        (Tensor::from_fn(&[2, 1, 4, 5], |i| i as f32 * 0.1), Tensor::from_fn(&[1, 3, 5, 6], |i| i as f32 * 0.01));
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&x, &w]).unwrap();
    assert!(plan.run(&[&x, &w]).unwrap()[0].max_abs_diff(&expected[0]) < 1e-4);
}

/// Moves whose contiguous runs are whole 16-byte vectors (slices of the last axis, concat,
/// permutes that keep the last axis), which CudaOps copies a vector per thread, in every dtype,
/// equal the CPU reference's bit for bit; so do the same moves at lengths that are not.
#[test]
fn vectorized_moves_on_cuda_are_exact() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let cuda: Vec<Arc<dyn Executor>> = vec![Arc::new(cuda_ops(device.clone())), CpuReference::shared()];
    for dtype in DType::ALL {
        for (t, h, d) in [(4, 3, 16), (5, 2, 8), (3, 2, 6), (2, 3, 5)] {
            let arena = Arena::new();
            let mut b = boundscope::TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, &[2, t, 3 * h * d])).unwrap();
            let y = b.input_with(&TensorMeta::new(dtype, &[2, t, h, d])).unwrap();
            let outs = [
                b.slice(x, 2, h * d, 2 * h * d).unwrap(),
                b.concat(&[y, y], 3).unwrap(),
                b.concat(&[y, y], 1).unwrap(),
                b.permute(y, &[0, 2, 1, 3]).unwrap(),
            ];
            for v in outs {
                b.output(v).unwrap();
            }
            let trace = b.finish().unwrap();
            let data = [
                Tensor::from_fn(&[2, t, 3 * h * d], |i| i as f32 - 7.0).to_dtype(dtype),
                Tensor::from_fn(&[2, t, h, d], |i| 3.0 - i as f32).to_dtype(dtype),
            ];
            let expected =
                Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&data[0], &data[1]]).unwrap();
            let plan = Plan::compile(&trace, &cuda).unwrap();
            assert!(!plan.to_string().contains("cpu_reference"), "{plan}");
            let got = plan.run(&[&data[0], &data[1]]).unwrap();
            assert_eq!(got, expected, "{dtype} ({t}, {h}, {d})\n{plan}");
        }
    }
}

/// Fused regions of 2 to 24 inputs and one or two outputs (3 to 26 buffers) launch with every
/// size of parameter list, those on the stack (up to 17 parameters: the buffers and the element
/// count) and the longer ones built per thread, and equal the CPU reference: each input in its
/// place.
#[test]
fn fused_regions_of_many_buffers_launch_each_in_its_place() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    for inputs in [2, 3, 5, 6, 7, 14, 15, 16, 24] {
        let arena = Arena::new();
        let mut b = boundscope::TraceBuilder::new(&arena, &registry);
        let xs: Vec<_> = (0..inputs).map(|_| b.input(&[1000]).unwrap()).collect();
        // `y = y * x + x` over the inputs in turn (two inputs exchanged would show), and but for
        // two inputs (3 buffers, 4 parameters) the sum of the first and last: a second output.
        let mut y = xs[0];
        for &x in &xs[1..] {
            let scaled = b.mul(y, x).unwrap();
            y = b.add(scaled, x).unwrap();
        }
        b.output(y).unwrap();
        if inputs > 2 {
            let ends = b.add(xs[0], xs[inputs - 1]).unwrap();
            b.output(ends).unwrap();
        }
        let trace = b.finish().unwrap();
        let data = inputs_for(&trace);
        let refs: Vec<&Tensor> = data.iter().collect();
        let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
        let plan = Plan::compile(&fused, &[fusion, Arc::new(cuda_ops(device.clone()))]).unwrap();
        let device_steps: Vec<_> = plan.steps_per_executor().into_iter().filter(|(e, _)| *e != "runtime").collect();
        assert_eq!(device_steps, vec![("cuda_fusion", 1)], "one region\n{plan}");
        let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
        let got = plan.run(&refs).unwrap();
        common::close_all(&got, &expected, TOLERANCE).unwrap_or_else(|e| panic!("{inputs} inputs: {e}\n{plan}"));
    }
}

/// `embedding` and `gather_last` run on the device with their ids checked there: results equal
/// the CPU reference's, an id out of range is `Error::IndexOutOfRange` from the run that
/// queued it (stream runs too), the next good run is clean, and a graph capture says why it
/// cannot replay the check.
#[test]
fn gathers_on_cuda_check_their_ids_on_the_device() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let cuda: Vec<Arc<dyn Executor>> = vec![Arc::new(cuda_ops(device.clone())), CpuReference::shared()];
    for (dtype, id_dtype) in [(DType::F32, DType::I64), (DType::BF16, DType::I32), (DType::F16, DType::I64)] {
        let arena = Arena::new();
        let mut b = boundscope::TraceBuilder::new(&arena, &registry);
        let wte = b.input_with(&TensorMeta::new(dtype, &[50, 8])).unwrap();
        let ids = b.input_with(&TensorMeta::new(id_dtype, &[3, 7])).unwrap();
        let x = b.embedding(wte, ids).unwrap();
        let logits = b.reshape(x, &[21, 8]).unwrap();
        let targets = b.reshape(ids, &[21]).unwrap();
        let targets = b.cast(targets, DType::I64).unwrap();
        let small = b.compare_scalar(prims::LT, targets, 8.0).unwrap();
        let clipped = b.where_scalar(small, targets, 0.0).unwrap();
        let loss = b.cross_entropy(logits, clipped).unwrap();
        b.output(x).unwrap();
        b.output(loss).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &cuda).unwrap();
        let listing = plan.to_string();
        for op in ["embedding(", "cross_entropy("] {
            let line = listing.lines().find(|l| l.contains(op));
            assert!(line.is_some_and(|l| l.contains("cuda_ops")), "{op} not on the GPU:\n{listing}");
        }
        let weight = Tensor::from_fn(&[50, 8], |i| (i as f32 * 0.1).sin()).to_dtype(dtype);
        let good = Tensor::from_vec(&[3, 7], (0..21i64).map(|i| (i * 13) % 50).collect()).unwrap().to_dtype(id_dtype);
        let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&weight, &good]).unwrap();
        let got = plan.run(&[&weight, &good]).unwrap();
        assert_eq!(got[0], expected[0], "{dtype}: the rows, bit for bit");
        let tolerance = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
        assert!(got[1].max_abs_diff(&expected[1]) <= tolerance, "{dtype}: loss {:?} vs {:?}", got[1], expected[1]);
        let mut values: Vec<i64> = (0..21i64).map(|i| (i * 13) % 50).collect();
        values[17] = 50;
        let bad = Tensor::from_vec(&[3, 7], values).unwrap().to_dtype(id_dtype);
        match plan.run(&[&weight, &bad]) {
            Err(boundscope::Error::IndexOutOfRange { index: 50, position: 17, bound: 50, .. }) => {}
            other => panic!("{dtype}: {other:?}"),
        }
        assert_eq!(plan.run(&[&weight, &good]).unwrap()[0], expected[0], "the fault was cleared");
        // Stream runs with device inputs report it too.
        let on: Arc<dyn boundscope::Device> = device.clone();
        let (w_dev, bad_dev) =
            (DeviceTensor::upload(&on, weight.view()).unwrap(), DeviceTensor::upload(&on, bad.view()).unwrap());
        let mut ws = plan.workspace().unwrap();
        let err = plan.run_on_device(&mut ws, &[RunInput::from(&w_dev), RunInput::from(&bad_dev)]).err();
        assert!(matches!(err, Some(boundscope::Error::IndexOutOfRange { .. })), "{err:?}");
        let (mut w_dev, mut good_dev) = (w_dev, DeviceTensor::upload(&on, good.view()).unwrap());
        let err = plan.capture(&mut ws, vec![&mut w_dev, &mut good_dev]).err();
        assert!(
            matches!(&err, Some(boundscope::Error::GraphUnsupported { reason }) if reason.contains("checks its inputs")),
            "{err:?}"
        );
        // Rows that are not whole 16-byte vectors: an element per thread.
        let mut b = boundscope::TraceBuilder::new(&arena, &registry);
        let table = b.input_with(&TensorMeta::new(dtype, &[9, 5])).unwrap();
        let ids = b.input_with(&TensorMeta::new(id_dtype, &[4])).unwrap();
        let rows = b.embedding(table, ids).unwrap();
        b.output(rows).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &cuda).unwrap();
        let table = Tensor::from_fn(&[9, 5], |i| i as f32).to_dtype(dtype);
        let ids = Tensor::from_vec(&[4], vec![8i64, 0, 3, 3]).unwrap().to_dtype(id_dtype);
        let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&table, &ids]).unwrap();
        assert_eq!(plan.run(&[&table, &ids]).unwrap(), expected, "{dtype}: width 5");
        let ids = Tensor::from_vec(&[4], vec![8i64, -1, 3, 3]).unwrap().to_dtype(id_dtype);
        assert!(matches!(
            plan.run(&[&table, &ids]),
            Err(boundscope::Error::IndexOutOfRange { index: -1, position: 1, .. })
        ));
        // gather_last, and cross_entropy whole, with a target out of range.
        let mut b = boundscope::TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&TensorMeta::new(dtype, &[300, 37])).unwrap();
        let t = b.input_with(&TensorMeta::new(id_dtype, &[300])).unwrap();
        let picked = b.gather_last(x, t).unwrap();
        let loss = b.cross_entropy(x, t).unwrap();
        b.output(picked).unwrap();
        b.output(loss).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &cuda).unwrap();
        assert!(!plan.to_string().contains("cpu_reference"), "{plan}");
        let x = Tensor::from_fn(&[300, 37], |i| ((i * 7919 % 1000) as f32 / 100.0) - 5.0).to_dtype(dtype);
        let mut targets: Vec<i64> = (0..300).map(|i| (i * 11) % 37).collect();
        let t = Tensor::from_vec(&[300], targets.clone()).unwrap().to_dtype(id_dtype);
        let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&x, &t]).unwrap();
        let got = plan.run(&[&x, &t]).unwrap();
        assert_eq!(got[0], expected[0], "{dtype}: gather_last");
        // The loss is f32 for every dtype of logits (16-bit ones read as they are, not rounded
        // after): as close to the reference in bf16 as in f32.
        assert_eq!(got[1].dtype(), DType::F32, "{dtype}: the loss's dtype");
        let (g, e) = (got[1].to_f32_vec()[0], expected[1].to_f32_vec()[0]);
        assert!((g - e).abs() <= 1e-5 * e.abs().max(1.0), "{dtype}: cross_entropy {g} against {e}");
        let good_targets = t.clone();
        targets[123] = 37;
        let t = Tensor::from_vec(&[300], targets).unwrap().to_dtype(id_dtype);
        match plan.run(&[&x, &t]) {
            Err(boundscope::Error::IndexOutOfRange { index: 37, position: 123, bound: 37, .. }) => {}
            other => panic!("{dtype}: {other:?}"),
        }
        // Both checked kernels found a bad id; the next good run reports neither.
        assert_eq!(plan.run(&[&x, &good_targets]).unwrap()[0], expected[0], "{dtype}: every fault was cleared");
        // A masked vocabulary (-inf logits) wider than a block: the loss stays finite.
        let mut b = boundscope::TraceBuilder::new(&arena, &registry);
        let logits = b.input_with(&TensorMeta::new(dtype, &[2, 300])).unwrap();
        let t = b.input_with(&TensorMeta::new(id_dtype, &[2])).unwrap();
        let loss = b.cross_entropy(logits, t).unwrap();
        let big = b.input_with(&TensorMeta::new(DType::I32, &[3])).unwrap();
        let keep = b.compare_scalar(prims::GT, big, 0.0).unwrap();
        let filled = b.where_scalar(keep, big, 3e9).unwrap();
        b.output(loss).unwrap();
        b.output(filled).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, &cuda).unwrap();
        let logits = Tensor::from_fn(&[2, 300], |i| if i % 300 < 40 { f32::NEG_INFINITY } else { (i % 7) as f32 })
            .to_dtype(dtype);
        let t = Tensor::from_vec(&[2], vec![45i64, 299]).unwrap().to_dtype(id_dtype);
        let big = Tensor::from_vec(&[3], vec![5i32, -1, 0]).unwrap();
        let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&logits, &t, &big]).unwrap();
        let got = plan.run(&[&logits, &t, &big]).unwrap();
        let (g, e) = (got[0].to_f32_vec()[0], expected[0].to_f32_vec()[0]);
        assert!(e.is_finite() && (g - e).abs() <= tolerance * e.abs().max(1.0), "{dtype}: masked loss {g} against {e}");
        assert_eq!(got[1], expected[1], "where's i32 fill saturates as on the CPU");
    }
}

/// `scaled_dot_product_attention` runs whole on CudaOps: in bf16 and f16 through cuDNN's fused
/// attention, in f32 (and head sizes up to 64) through the generated flash-attention kernel;
/// either way one step of the plan, no `[tokens, tokens]` scores in memory. Random batches,
/// heads, token counts (queries and keys of different lengths, causal or not) and head sizes
/// equal the CPU reference's `f32` decomposition (within bf16's tolerance in 16 bits, 1e-4 in
/// f32); in a captured graph either kernel replays what a stream run computes; f32 with heads
/// of 128 (which neither takes) runs decomposed, with the same results.
#[test]
fn attention_runs_whole_and_matches_the_reference() {
    let Some((device, _sharing)) = device() else { return };
    let cudnn = cuda::fused_attention();
    if let Err(why) = &cudnn {
        println!("SKIPPED (16-bit cases): attention_runs_whole_and_matches_the_reference: {why}");
    }
    let registry = Registry::with_builtins();
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
    let executors = [ops.clone(), CpuReference::shared()];
    fn build<'a>(
        arena: &'a Arena,
        registry: &'a Registry,
        shapes: [&[usize]; 3],
        dtype: DType,
        causal: bool,
    ) -> boundscope::Trace<'a> {
        let mut b = boundscope::TraceBuilder::new(arena, registry);
        let [q, k, v] = shapes.map(|s| b.input_with(&TensorMeta::new(dtype, s)).unwrap());
        let y = b.scaled_dot_product_attention(q, k, v, causal, None).unwrap();
        b.output(y).unwrap();
        b.finish().unwrap()
    }
    let data = |shapes: [&[usize]; 3], dtype| {
        let mut seed = 0usize;
        shapes.map(|s| {
            seed += 1;
            Tensor::from_fn(s, |i| (((i * 37 + seed * 11) % 101) as f32 / 50.0) - 1.0).to_dtype(dtype)
        })
    };
    let whole = |plan: &Plan| {
        plan.to_string().lines().any(|l| l.contains("= scaled_dot_product_attention(") && l.contains(CudaOps::NAME))
    };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 24, ..ProptestConfig::default() });
    let strategy = (
        1usize..3,
        1usize..5,
        proptest::sample::select(vec![1usize, 7, 64, 129, 300]),
        proptest::sample::select(vec![1usize, 9, 64, 128, 257]),
        proptest::sample::select(vec![16usize, 32, 64, 128]),
        proptest::sample::select(vec![DType::BF16, DType::F16, DType::F32]),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(batch, heads, tq, tkv, head, dtype, causal)| {
            if dtype != DType::F32 && cudnn.is_err() {
                return Ok(());
            }
            let arena = Arena::new();
            let (qs, kvs) = ([batch, heads, tq, head], [batch, heads, tkv, head]);
            let shapes: [&[usize]; 3] = [&qs, &kvs, &kvs];
            let trace = build(&arena, &registry, shapes, dtype, causal);
            let inputs = data(shapes, dtype);
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
            let kept = Pipeline::for_executors(std::slice::from_ref(&ops)).run(&trace, &arena).unwrap();
            let plan = Plan::compile(&kept, &executors).unwrap();
            let runs_whole = dtype != DType::F32 || head <= 64;
            prop_assert_eq!(whole(&plan), runs_whole, "{} head {}:\n{}", dtype, head, plan);
            let got = plan.run(&refs).unwrap();
            let (g, e) = (got[0].to_f32_vec(), expected[0].to_f32_vec());
            let scale = e.iter().fold(1f32, |m, v| m.max(v.abs()));
            let worst = g.iter().zip(&e).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let tolerance = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
            prop_assert!(worst <= tolerance * scale, "{dtype} {qs:?} {kvs:?} causal {causal}: off by {worst}");
            Ok(())
        })
        .unwrap();
    // GPT-2's attention, in a graph: a replay equals a stream run, through either kernel.
    for dtype in [DType::BF16, DType::F32] {
        if dtype == DType::BF16 && cudnn.is_err() {
            continue;
        }
        let arena = Arena::new();
        let s: &[usize] = &[2, 12, 1024, 64];
        let trace = build(&arena, &registry, [s, s, s], dtype, true);
        let kept = Pipeline::for_executors(std::slice::from_ref(&ops)).run(&trace, &arena).unwrap();
        let plan = Plan::compile(&kept, &executors).unwrap();
        assert!(whole(&plan), "{plan}");
        let inputs = data([s, s, s], dtype);
        let uploaded = upload(&device, &inputs);
        let run_inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
        let mut stream_ws = plan.workspace().unwrap();
        let expected = plan.run_on_device(&mut stream_ws, &run_inputs).unwrap().to_host(0).unwrap();
        let mut graph_ws = plan.workspace().unwrap();
        let mut captured = upload(&device, &inputs);
        let mut graph = plan.capture(&mut graph_ws, captured.iter_mut().collect()).unwrap();
        graph.replay().unwrap();
        let replayed = graph.replay().unwrap().to_host(0).unwrap();
        assert_eq!(replayed, expected, "{dtype}: a replay computes what a stream run computes");
    }
    // f32 with heads of 128: decomposed, and still the reference's result.
    let arena = Arena::new();
    let wide: &[usize] = &[1, 2, 33, 128];
    let trace = build(&arena, &registry, [wide, wide, wide], DType::F32, true);
    let kept = Pipeline::for_executors(std::slice::from_ref(&ops)).run(&trace, &arena).unwrap();
    let plan = Plan::compile(&kept, &executors).unwrap();
    assert!(!whole(&plan), "neither kernel takes f32 heads of 128:\n{plan}");
    let inputs = data([wide, wide, wide], DType::F32);
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
    assert!(plan.run(&refs).unwrap()[0].max_abs_diff(&expected[0]) < 1e-4);
}

/// `softmax` and `layer_norm` on CudaOps over rows of every layout (a few threads, a warp, a
/// block holding the row in registers, a block streaming it; 16-byte, narrower and scalar
/// accesses) equal the CPU's `f32` math rounded once to their dtype: within the order of the
/// sums in `f32`, one unit in the last place in 16 bits. Rows with an infinity or a NaN give
/// what the CPU gives; a `softmax` row of values near -200 gives its own result. Also over
/// tensors past half of L2, whose kernels take the streaming hints. A test a dtype, so that the
/// three run at once (each compiles a few hundred kernels with NVRTC); `cargo test
/// row_ops_match_the_reference_at_every_row_length` runs all three.
#[test]
fn row_ops_match_the_reference_at_every_row_length_in_f32() {
    row_ops_match_the_reference_at_every_row_length(boundscope::DType::F32);
}

/// [`row_ops_match_the_reference_at_every_row_length_in_f32`], in bf16.
#[test]
fn row_ops_match_the_reference_at_every_row_length_in_bf16() {
    row_ops_match_the_reference_at_every_row_length(boundscope::DType::BF16);
}

/// [`row_ops_match_the_reference_at_every_row_length_in_f32`], in f16.
#[test]
fn row_ops_match_the_reference_at_every_row_length_in_f16() {
    row_ops_match_the_reference_at_every_row_length(boundscope::DType::F16);
}

/// The row test over rows of `dtype`.
fn row_ops_match_the_reference_at_every_row_length(dtype: boundscope::DType) {
    use boundscope::{DType, Tensor, TensorMeta, TraceBuilder};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    // (Past 1 << 20: GPT-2's vocabulary, over 41 rows, and an odd length streamed, over 10: rows
    // starting at every alignment.)
    let lengths = [
        1,
        2,
        3,
        8,
        31,
        32,
        33,
        100,
        768,
        1000,
        1001,
        1002,
        1024,
        4096,
        4097,
        8193,
        12288,
        16384,
        20001,
        30001,
        32768,
        40000,
        61440,
        65536,
        1 << 20,
        50257,
        200003,
        100003,
    ];
    // The default kernels, those without variants, each variant alone (`KernelVariants::EACH`)
    // and all, whatever `KERNEL_VARIANTS_UNDER_TEST` says.
    let each = KernelVariants::EACH.map(|(_, v)| v);
    for variants in [KernelVariants::default(), KernelVariants::NONE, KernelVariants::ALL].into_iter().chain(each) {
        let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()).with_variants(variants));
        // (GPT-2's vocabulary over 41 rows: rows starting at every alignment of a 16-byte access,
        // so that `layer_norm` reads its weight and bias at every shift.)
        let shapes = lengths.iter().enumerate().map(|(i, &cols)| {
            let rows = if cols == 50257 { 41 } else { [1, 3, 257][i % 3].min((1 << 21) / cols).max(1) };
            (rows, cols)
        });
        // Then tensors past half of an H100's or H200's L2, whose kernels take the streaming
        // hints: f32 `softmax` over [100, 65537] stopped with CUDA_ERROR_ILLEGAL_INSTRUCTION
        // when its rows' copies to shared memory took an L2 cache hint.
        // And rows of odd lengths whose `layer_norm` stages its weight and bias in shared
        // memory, more than its blocks run at once on an H100 or H200 (132 SMs x 4 blocks: 8,448
        // rows of 257, 16 a block; 4,224 of 1,001, 8 a block), so that each block runs several.
        // And short rows of odd lengths over many tiles (`KernelVariants::tiled_rows`: a block
        // reads a run of rows whole), the last one short, tensors whose last 16 bytes are partial
        // (rows of 1 to 9 are tiled in every dtype, rows of 17 to 255 in 16 bits and 33 in f32 are
        // pipelined tiles, `KernelVariants::pipelined_tiles`). Pipelined, the last three in 16 bits
        // and [70001, 33] in f32 run more tiles than their blocks (at most 4 an SM), so that each
        // block copies the next tile while it runs one. Rows of up to 10 bytes run several a thread
        // (`KernelVariants::wide_tiles`: in 16 bits tiles of 4,096 rows of 1 value, 2,048 of 2,
        // 1,280 of 3, 768 of 5; in f32 2,048 rows of 1, 1,024 of 2; rows of 7 one a thread, 256 a
        // tile), the last tile short. With `KernelVariants::pipelined_passes` (in `ALL`), 16-bit
        // pipelined tiles hold two or three rows a thread (64 rows of 100, 32 of 255, 192 of 33),
        // the last tile short; [120001, 33] runs more such tiles than blocks (625 tiles of 192
        // rows).
        let tiled = [
            (70001, 1),
            (40001, 2),
            (100003, 3),
            (50001, 5),
            (9001, 7),
            (3001, 9),
            (2049, 33),
            (515, 100),
            (259, 150),
            (131, 255),
            (70001, 33),
            (40009, 100),
            (35001, 255),
            (120001, 33),
        ];
        // And rows kept by thread-block clusters (`KernelVariants::clustered_rows`, which takes
        // 53 rows or more on 132 SMs, whose blocks fill their waves; the rows of 100,003 and
        // 200,003 above are fewer, streamed): [100, 65537] in f32 `layer_norm`, [66, 131073] in
        // every dtype and op (clusters of 2 or 3; 16-bit `softmax` as read).
        let clustered = [(100, 65537), (66, 131073)];
        for (rows, cols) in shapes.chain(clustered).chain([(333, 50257), (9000, 257), (5000, 1001)]).chain(tiled) {
            for layer_norm in [false, true] {
                fn build<'a>(
                    arena: &'a Arena,
                    registry: &'a Registry,
                    dtype: DType,
                    [rows, cols]: [usize; 2],
                    layer_norm: bool,
                ) -> boundscope::Trace<'a> {
                    let mut b = TraceBuilder::new(arena, registry);
                    let x = b.input_with(&TensorMeta::new(dtype, &[rows, cols])).unwrap();
                    let y = if layer_norm {
                        let w = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
                        let bias = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
                        b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap()
                    } else {
                        b.softmax(x).unwrap()
                    };
                    b.output(y).unwrap();
                    b.finish().unwrap()
                }
                let arena = Arena::new();
                let trace = build(&arena, &registry, dtype, [rows, cols], layer_norm);
                let kept = Pipeline::for_executors(std::slice::from_ref(&ops)).run(&trace, &arena).unwrap();
                let plan = Plan::compile(&kept, std::slice::from_ref(&ops)).unwrap();
                assert!(plan.steps_per_executor().contains(&("cuda_ops", 1)), "one kernel\n{plan}");
                let mut inputs: Vec<Tensor> = trace
                    .inputs()
                    .iter()
                    .enumerate()
                    .map(|(k, &v)| {
                        let shape = trace.value_meta(v).unwrap().shape.to_vec();
                        Tensor::from_fn(&shape, |e| ((e * 37 + k * 11) % 101) as f32 / 25.0 - 2.0).to_dtype(dtype)
                    })
                    .collect();
                if cols <= 2 && rows > 3 {
                    // Rows of 1 and 2 (several a thread): an infinity in row 1 and a NaN (for
                    // softmax, -infinity) in row 3; a row misplaced in its tile would show them
                    // in a neighbour.
                    let mut x = inputs[0].to_dtype(DType::F32).to_f32_vec();
                    x[cols] = f32::INFINITY;
                    x[3 * cols] = if layer_norm { f32::NAN } else { f32::NEG_INFINITY };
                    inputs[0] = Tensor::new(&[rows, cols], x).unwrap().to_dtype(dtype);
                } else if cols > 2 && rows > 1 {
                    // Row 1 holds an infinity (and, for layer_norm, a NaN): what the CPU gives.
                    let mut x = inputs[0].to_dtype(DType::F32).to_f32_vec();
                    x[cols] = f32::INFINITY;
                    x[cols + 2] = if layer_norm { f32::NAN } else { f32::NEG_INFINITY };
                    if !layer_norm && rows > 2 {
                        // Row 2 far below zero: a maximum that took the values of the rows
                        // beside it, or a neutral other than -infinity, would show.
                        x[2 * cols..3 * cols].iter_mut().for_each(|v| *v -= 200.0);
                    }
                    inputs[0] = Tensor::new(&[rows, cols], x).unwrap().to_dtype(dtype);
                }
                let refs: Vec<&Tensor> = inputs.iter().collect();
                let got = plan.run(&refs).unwrap();
                let expected = exact_row_op(&inputs, layer_norm, cols);
                let op = if layer_norm { "layer_norm" } else { "softmax" };
                let what = format!("{op} over [{rows}, {cols}] in {dtype}, {variants:?}");
                for (k, (&g, &e)) in got[0].to_f32_vec().iter().zip(&expected).enumerate() {
                    if e.is_nan() || g.is_nan() {
                        assert!(e.is_nan() && g.is_nan(), "{what}: element {k}: {g} against {e}");
                        continue;
                    }
                    // f32: the sums' rounding; 16 bits: the exact value rounded once, give or
                    // take the one f32 rounding at a tie, and for `layer_norm` the f32 result's
                    // own error before that rounding: near 0 its terms (up to about 4 here)
                    // cancel, and an error of an f32 ulp of theirs is several 16-bit ulps of
                    // the result (f16 [100, 65537]: 6.5327e-5 against 6.5410e-5, 1.4 ulps).
                    let f32_tolerance = 2e-5 * e.abs().max(1.0) as f32;
                    let before_rounding = if layer_norm { f32_tolerance } else { 0.0 };
                    let tolerance = match dtype {
                        DType::F32 => f32_tolerance,
                        DType::BF16 => 2f32.powi(-8) * (e.abs() as f32).max(2f32.powi(-126)) * 2.0 + before_rounding,
                        _ => 2f32.powi(-11) * (e.abs() as f32).max(2f32.powi(-14)) * 2.0 + before_rounding,
                    };
                    assert!((f64::from(g) - e).abs() <= f64::from(tolerance), "{what}: element {k}: {g} against {e}");
                }
            }
        }
    }
}

/// `layer_norm` over f32 rows far from zero (values 1,000 give or take 2) equals the exact
/// result within 1e-3 of each value, in every layout of its mean and variance: streamed in one
/// pass (`KernelVariants::one_pass_moments`) and in three, split over a cluster or a block's
/// own; kept on chip by a cluster, a block and its registers. A variance taken as the mean
/// square less the squared mean (in `f32`) is off by several percent over such rows.
#[test]
fn layer_norm_of_rows_far_from_zero_matches_the_reference() {
    use boundscope::{DType, Tensor, TraceBuilder};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let one_pass = KernelVariants { one_pass_moments: true, ..KernelVariants::default() };
    let each = [
        // Streamed, split over a cluster (one pass and three).
        ([3, 1 << 20], one_pass),
        ([3, 1 << 20], KernelVariants { one_pass_moments: false, ..KernelVariants::default() }),
        // Streamed by a block, an odd length (accesses aligned to the tensor).
        ([300, 100003], KernelVariants { clustered_rows: false, ..one_pass }),
        // Kept on chip by a cluster (53 rows or more on 132 SMs), by a block, in registers.
        ([66, 100003], KernelVariants::default()),
        ([41, 50257], KernelVariants::default()),
        ([64, 1024], KernelVariants::default()),
    ];
    for ([rows, cols], variants) in each {
        let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()).with_variants(variants));
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[rows, cols]).unwrap();
        let w = b.input(&[cols]).unwrap();
        let bias = b.input(&[cols]).unwrap();
        let y = b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap();
        b.output(y).unwrap();
        let trace = b.finish().unwrap();
        let plan = Plan::compile(&trace, std::slice::from_ref(&ops)).unwrap();
        assert!(plan.steps_per_executor().contains(&("cuda_ops", 1)), "one kernel\n{plan}");
        let value = |e: usize, k: usize| ((e * 37 + k * 11) % 101) as f32 / 25.0 - 2.0;
        let inputs = [
            Tensor::from_fn(&[rows, cols], |e| 1000.0 + value(e, 0)),
            Tensor::from_fn(&[cols], |e| value(e, 1)),
            Tensor::from_fn(&[cols], |e| value(e, 2)),
        ];
        assert_eq!(inputs[0].dtype(), DType::F32);
        let got = plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap();
        let expected = exact_row_op(&inputs, true, cols);
        for (k, (&g, &e)) in got[0].to_f32_vec().iter().zip(&expected).enumerate() {
            let tolerance = 1e-3 * e.abs().max(1.0);
            assert!(
                (f64::from(g) - e).abs() <= tolerance,
                "[{rows}, {cols}], {variants:?}: element {k}: {g} against {e}"
            );
        }
    }
}

/// `layer_norm` over rows of odd lengths whose weight and bias are staged in shared memory (rows
/// held in registers), with more rows than the GPU's blocks run at once, so that each block
/// runs several with the copies it made, equals the exact result within the output's rounding,
/// with the default kernels: in each dtype, and over bf16 rows with an f32 weight and bias
/// (accesses of 4 values, f32 copies). Rows 16 bytes divide and longer odd rows (not staged)
/// beside them.
#[test]
fn layer_norm_with_its_weight_and_bias_staged_matches_the_reference() {
    use boundscope::{DType, Tensor, TensorMeta, TraceBuilder};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()));
    let dtypes =
        [(DType::F32, DType::F32), (DType::BF16, DType::BF16), (DType::F16, DType::F16), (DType::BF16, DType::F32)];
    for (dtype, weight_dtype) in dtypes {
        // (Rows of 33 and 16-bit rows of 100: read as pipelined tiles,
        // `KernelVariants::pipelined_tiles`, the f32 results of bf16 rows too; 16-bit rows of 5:
        // tiles of 768 rows, 3 a thread, `KernelVariants::wide_tiles`.)
        let shapes = [
            (3, 1001),
            (5000, 1001),
            (9000, 257),
            (20000, 513),
            (41, 4097),
            (64, 1024),
            (7001, 33),
            (3000, 100),
            (50001, 5),
        ];
        for (rows, cols) in shapes {
            let arena = Arena::new();
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, &[rows, cols])).unwrap();
            let w = b.input_with(&TensorMeta::new(weight_dtype, &[cols])).unwrap();
            let bias = b.input_with(&TensorMeta::new(weight_dtype, &[cols])).unwrap();
            let y = b.layer_norm(x, 1e-5, Some(w), Some(bias)).unwrap();
            b.output(y).unwrap();
            let trace = b.finish().unwrap();
            let kept = Pipeline::for_executors(std::slice::from_ref(&ops)).run(&trace, &arena).unwrap();
            let plan = Plan::compile(&kept, std::slice::from_ref(&ops)).unwrap();
            assert!(plan.steps_per_executor().contains(&("cuda_ops", 1)), "one kernel\n{plan}");
            let value = |e: usize, k: usize| ((e * 37 + k * 11) % 101) as f32 / 25.0 - 2.0;
            let inputs = [
                Tensor::from_fn(&[rows, cols], |e| value(e, 0)).to_dtype(dtype),
                Tensor::from_fn(&[cols], |e| value(e, 1)).to_dtype(weight_dtype),
                Tensor::from_fn(&[cols], |e| value(e, 2)).to_dtype(weight_dtype),
            ];
            let got = plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap();
            let expected = exact_row_op(&inputs, true, cols);
            let out_dtype = got[0].dtype();
            // The output's rounding of the f32 result, and that result's own error (see the row
            // test).
            let rounding = match out_dtype {
                DType::BF16 => 2f64.powi(-8) * 2.0,
                DType::F16 => 2f64.powi(-11) * 2.0,
                _ => 0.0,
            };
            for (k, (&g, &e)) in got[0].to_f32_vec().iter().zip(&expected).enumerate() {
                let tolerance = rounding * e.abs().max(2f64.powi(-14)) + 2e-5 * e.abs().max(1.0);
                assert!(
                    (f64::from(g) - e).abs() <= tolerance,
                    "{dtype} rows, {weight_dtype} weight, [{rows}, {cols}]: element {k}: {g} against {e}"
                );
            }
        }
    }
}

/// bf16 `softmax` results below bf16's normal range (its subnormals, 2^-133 to 2^-126) are not
/// flushed to 0 in any layout (a row in registers, kept as read in shared memory, streamed, read
/// as tiles; 16-byte and aligned accesses), by the kernels without variants or by those of
/// `KernelVariants::fast_exp2` (alone, in the defaults, with all), whose one-instruction `exp2`
/// flushes below 2^-126 (bf16 results are scaled by 2^8 first).
/// Each row holds one 0 and values 87 to 93 below it: results e^-87 to e^-93 (2^-125.5 to
/// 2^-134), most of them bf16 subnormals, which a flush would turn to 0.
#[test]
fn softmax_results_below_the_normal_range_survive_in_bf16() {
    use boundscope::{Tensor, TraceBuilder};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let fast_exp2 = KernelVariants { fast_exp2: true, ..KernelVariants::NONE };
    for variants in [KernelVariants::NONE, fast_exp2, KernelVariants::default(), KernelVariants::ALL] {
        let ops: Arc<dyn Executor> = Arc::new(CudaOps::new(device.clone()).with_variants(variants));
        // ([300, 33]: read as tiles, `KernelVariants::pipelined_tiles`.)
        for [rows, cols] in [[4, 1024], [3, 65536], [3, 50257], [2, 1 << 20], [2, 200003], [300, 33]] {
            let arena = Arena::new();
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(DType::BF16, &[rows, cols])).unwrap();
            let y = b.softmax(x).unwrap();
            b.output(y).unwrap();
            let trace = b.finish().unwrap();
            let plan = Plan::compile(&trace, std::slice::from_ref(&ops)).unwrap();
            assert!(plan.steps_per_executor().contains(&("cuda_ops", 1)), "one row kernel\n{plan}");
            let x = Tensor::from_fn(&[rows, cols], |i| {
                let (r, c) = (i / cols, i % cols);
                if c == (r * 7) % cols {
                    0.0
                } else {
                    -87.0 - ((c * 13 + r) % 61) as f32 * 0.1
                }
            })
            .to_dtype(DType::BF16);
            let got = plan.run(&[&x]).unwrap()[0].to_f32_vec();
            let expected = exact_row_op(std::slice::from_ref(&x), false, cols);
            let what = format!("softmax over [{rows}, {cols}] in bf16, {variants:?}");
            // Results a flush to 0 would miss by more than the tolerance.
            let subnormal = expected.iter().filter(|&&e| (2f64.powi(-132)..2f64.powi(-126)).contains(&e)).count();
            assert!(subnormal > rows * cols / 4, "{what}: {subnormal} subnormal results");
            for (k, (&g, &e)) in got.iter().zip(&expected).enumerate() {
                // The exact value rounded once, give or take the f32 rounding at a tie: an
                // ulp of bf16 (2^-133 among subnormals).
                let tolerance = 2f64.powi(-8) * e.abs().max(2f64.powi(-126)) * 2.0;
                assert!((f64::from(g) - e).abs() <= tolerance, "{what}: element {k}: {g:e} against {e:e}");
            }
        }
    }
}

/// `softmax`, or `layer_norm` with its weight and bias, of each row of `inputs[0]`, in `f64`
/// from the inputs' values: the exact result, give or take `f64` rounding.
fn exact_row_op(inputs: &[boundscope::Tensor], layer_norm: bool, cols: usize) -> Vec<f64> {
    let values = |t: &boundscope::Tensor| t.to_f32_vec().into_iter().map(f64::from).collect::<Vec<f64>>();
    let x = values(&inputs[0]);
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        if layer_norm {
            let (w, b) = (values(&inputs[1]), values(&inputs[2]));
            let mean = row.iter().sum::<f64>() / cols as f64;
            let variance = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
            let inv_std = 1.0 / (variance + 1e-5f32 as f64).sqrt();
            out.extend(row.iter().enumerate().map(|(c, v)| (v - mean) * inv_std * w[c] + b[c]));
        } else {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| if m.is_nan() || m > v { m } else { v });
            let z: f64 = row.iter().map(|v| (v - m).exp()).sum();
            out.extend(row.iter().map(|v| (v - m).exp() / z));
        }
    }
    out
}

/// A fused region ending in a last-axis `sum` or `max` (with an elementwise output beside it,
/// or alone) over rows of every length its layout distinguishes (a few threads per row, a warp,
/// several warps, several rows a group of lanes in 16 bits, a block, a cluster of blocks,
/// accesses aligned to the tensor), in f32, bf16 and f16, with a scalar or a broadcast `[cols]`
/// operand, equals the exact result (in `f64`) within the `f32` rounding of its sum and the
/// rounding of its dtype, in each output.
#[test]
fn fused_reductions_match_the_reference_at_every_row_length() {
    use boundscope::executors::cuda::cudarc::driver::sys::CUdevice_attribute as Attribute;
    use boundscope::{DType, Tensor, TensorMeta, TraceBuilder};
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    // Thread-block clusters: Hopper and later.
    let clusters =
        device.context().attribute(Attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).is_ok_and(|m| m >= 9);
    let sms = device.context().attribute(Attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap_or(0) as usize;
    // In 16 bits, rows of one access a thread are taken several to a group of lanes: row
    // counts that no group size divides (257, 1,027) and a row past the last group's first.
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        // The result is rounded once to its dtype (16-bit regions compute in `float`).
        let rounding = match dtype {
            DType::BF16 => 2f64.powi(-8),
            DType::F16 => 2f64.powi(-11),
            _ => 0.0,
        };
        // Rows of 50,257 values and longer (64 KB or more) are few: split over clusters of
        // blocks where the GPU has them (`KernelVariants::split_reductions`). Where the
        // reduction is the region's only output (`alone`), rows that 16 bytes do not divide
        // (50,257, 200,003) are read through accesses aligned to the tensor.
        for cols in [1, 2, 7, 8, 16, 31, 33, 64, 100, 128, 256, 1000, 1024, 4096, 8193, 50257, 65536, 200003, 1 << 20] {
            let rows = [1027, 3, 257, 5][cols % 4].min((1 << 20) / cols).max(1);
            for (max, broadcast, alone) in [
                (false, false, false),
                (true, false, false),
                (false, true, false),
                (true, true, false),
                (false, false, true),
                (true, false, true),
            ] {
                let arena = Arena::new();
                let mut b = TraceBuilder::new(&arena, &registry);
                let x = b.input_with(&TensorMeta::new(dtype, &[rows, cols])).unwrap();
                let h = if broadcast {
                    let w = b.input_with(&TensorMeta::new(dtype, &[cols])).unwrap();
                    b.mul(x, w).unwrap()
                } else {
                    b.mul_scalar(x, 0.5).unwrap()
                };
                let e = b.exp(h).unwrap();
                let r = if max { b.max(e).unwrap() } else { b.sum(e).unwrap() };
                if !alone {
                    b.output(e).unwrap();
                }
                b.output(r).unwrap();
                let trace = b.finish().unwrap();
                let (fused, fusion) = fused_for_cuda(&device, &trace, &arena);
                let plan = Plan::compile(&fused, &[fusion, Arc::new(cuda_ops(device.clone()))]).unwrap();
                assert!(plan.steps_per_executor().contains(&("cuda_fusion", 1)), "one region\n{plan}");
                // The long rows are split where they are at most a quarter as many as SMs (the
                // GPU's clusters fitting), and the listing says so; others never are.
                let listed = plan.to_string().contains(" in clusters of ");
                let may_split = clusters && variants_under_test().split_reductions && cols >= 50257;
                assert!(may_split || !listed, "rows of {cols}: split\n{plan}");
                assert!(listed || !may_split || 4 * rows > sms, "rows of {cols}: not split\n{plan}");
                let input = Tensor::from_fn(&[rows, cols], |i| ((i * 37) % 101) as f32 / 25.0 - 2.0).to_dtype(dtype);
                let scale = Tensor::from_fn(&[cols], |j| 0.25 + (j % 5) as f32 * 0.1).to_dtype(dtype);
                let got = if broadcast { plan.run(&[&input, &scale]).unwrap() } else { plan.run(&[&input]).unwrap() };
                let (x, w) = (input.to_f32_vec(), scale.to_f32_vec());
                let (exps, sums) =
                    if alone { (Vec::new(), got[0].to_f32_vec()) } else { (got[0].to_f32_vec(), got[1].to_f32_vec()) };
                for (k, row) in x.chunks(cols).enumerate() {
                    let values: Vec<f64> = row
                        .iter()
                        .enumerate()
                        .map(|(j, &v)| (f64::from(v) * if broadcast { f64::from(w[j]) } else { 0.5 }).exp())
                        .collect();
                    for (j, &value) in values.iter().enumerate().filter(|_| !alone) {
                        let g = f64::from(exps[k * cols + j]);
                        assert!(
                            (g - value).abs() <= (1e-6 + rounding) * value,
                            "{dtype} rows of {cols} (broadcast: {broadcast}), exp at [{k}, {j}]: {g} against {value}"
                        );
                    }
                    let exact = if max {
                        values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    } else {
                        values.iter().sum()
                    };
                    let g = f64::from(sums[k]);
                    // (An f16 sum past 65,504 rounds to infinity, as in PyTorch.)
                    if dtype == DType::F16 && exact >= 65520.0 {
                        assert_eq!(g, f64::INFINITY, "f16 rows of {cols}, row {k}: {g} against {exact}");
                        continue;
                    }
                    let tolerance = (2e-6 * (cols as f64).log2().max(1.0) + rounding) * exact.abs().max(1.0);
                    assert!(
                        (g - exact).abs() <= tolerance,
                        "{dtype} rows of {cols} (broadcast: {broadcast}), row {k} of {rows}: {g} against {exact} (max: {max})"
                    );
                }
            }
        }
    }
}

/// `scaled_dot_product_attention_backward` (what `passes::Grad` writes for attention) runs
/// whole on CudaOps: in bf16 and f16 through cuDNN's fused backward (the forward again with its
/// softmax statistics, then the backward), in f32 through the generated flash-attention
/// backward (head sizes a multiple of 16 up to 64). dq, dk and dv equal the CPU reference's
/// `f32` decomposition on the same (rounded) operands, each within its dtype's tolerance
/// relative to its largest value, over random batches, heads, query and key lengths (longer
/// or shorter than the other, not multiples of the kernels' tiles), head sizes, scales and
/// causal or not. GPT-2's shape must run whole; in 16 bits others run whole where cuDNN takes
/// them (the test prints those it did not), in f32 exactly those the generated kernel takes;
/// all equal the reference, and in f32 the first query's dq is exactly 0 where causal, as in
/// the decomposition. A 5% error in the scale fails it.
#[test]
fn attention_backward_runs_whole_and_matches_the_reference() {
    let Some((device, _sharing)) = device() else { return };
    let cudnn = cuda::fused_attention();
    if let Err(why) = &cudnn {
        println!("SKIPPED (16-bit cases): attention_backward_runs_whole_and_matches_the_reference: {why}");
    }
    let registry = Registry::with_builtins();
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
    let executors = [ops.clone(), CpuReference::shared()];
    fn build<'a>(
        arena: &'a Arena,
        registry: &'a Registry,
        shapes: [&[usize]; 2],
        dtype: DType,
        causal: bool,
        scale: f32,
    ) -> boundscope::Trace<'a> {
        let mut b = boundscope::TraceBuilder::new(arena, registry);
        let [q, k, v, g] = [0, 1, 1, 0].map(|i| b.input_with(&TensorMeta::new(dtype, shapes[i])).unwrap());
        let grads = b.scaled_dot_product_attention_backward(q, k, v, g, causal, scale).unwrap();
        b.output(grads).unwrap();
        b.finish().unwrap()
    }
    let whole = |plan: &Plan| {
        plan.to_string()
            .lines()
            .any(|l| l.contains("= scaled_dot_product_attention_backward(") && l.contains(CudaOps::NAME))
    };
    let not_whole = std::cell::RefCell::new(Vec::new());
    let check = |batch: usize, heads: usize, tq: usize, tkv: usize, head: usize, dtype: DType, causal: bool| {
        let (qs, kvs) = ([batch, heads, tq, head], [batch, heads, tkv, head]);
        let scale = 1.0 / (head as f32).sqrt();
        let mut seed = 0usize;
        let inputs: Vec<Tensor> = [&qs, &kvs, &kvs, &qs]
            .iter()
            .map(|s| {
                seed += 1;
                Tensor::from_fn(*s, |i| (((i * 37 + seed * 11) % 101) as f32 / 50.0) - 1.0).to_dtype(dtype)
            })
            .collect();
        let wide: Vec<Tensor> = inputs.iter().map(|t| t.to_dtype(DType::F32)).collect();
        let arena = Arena::new();
        let reference = |scale| {
            let trace = build(&arena, &registry, [&qs, &kvs], DType::F32, causal, scale);
            let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
            plan.run(&wide.iter().collect::<Vec<_>>()).unwrap()[0].to_f32_vec()
        };
        let expected = reference(scale);
        let trace = build(&arena, &registry, [&qs, &kvs], dtype, causal, scale);
        let plan = Plan::compile(&trace, &executors).unwrap();
        let case = format!("{dtype} q {qs:?} kv {kvs:?} causal {causal}");
        if dtype == DType::F32 {
            let flash = head.is_multiple_of(16) && head <= 64;
            assert_eq!(
                whole(&plan),
                flash,
                "{case}: f32 runs whole exactly where the flash backward takes it:\n{plan}"
            );
        } else if !whole(&plan) {
            not_whole.borrow_mut().push(case.clone());
        }
        let got = plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap()[0].to_f32_vec();
        let tolerance = match dtype {
            DType::F32 => 1e-4,
            DType::BF16 => 3e-2,
            _ => 1e-2,
        };
        let (nq, nk) = (qs.iter().product::<usize>(), kvs.iter().product::<usize>());
        let off = |got: &[f32], expected: &[f32]| {
            let mut worst = 0f32;
            for (name, range) in [("dq", 0..nq), ("dk", nq..nq + nk), ("dv", nq + nk..nq + 2 * nk)] {
                let e = &expected[range.clone()];
                let largest = e.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
                let w = got[range].iter().zip(e).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) / largest;
                if w > tolerance {
                    return Err(format!("{case}: {name} off by {w} of its largest value"));
                }
                worst = worst.max(w);
            }
            Ok(worst)
        };
        off(&got, &expected).unwrap();
        if dtype == DType::F32 && causal && whole(&plan) {
            // Each plane's first query sees one key with probability 1: the decomposition's
            // score gradient there is exactly 0, and so is the kernel's (AdamW would turn noise
            // in such zeros into whole steps of the learning rate).
            for plane in 0..batch * heads {
                let row = &got[plane * tq * head..][..head];
                assert!(row.iter().all(|&x| x == 0.0), "{case}: dq of plane {plane}'s first query: {row:?}");
            }
        }
        (plan, off(&got, &reference(scale * 1.05)).is_err())
    };
    let dtypes = if cudnn.is_ok() { vec![DType::BF16, DType::F16, DType::F32] } else { vec![DType::F32] };
    // GPT-2's attention (batch 2 here), in each dtype: whole, and a wrong scale is caught.
    for &dtype in &dtypes {
        let (plan, scale_matters) = check(2, 12, 1024, 1024, 64, dtype, true);
        assert!(whole(&plan), "GPT-2's attention backward runs whole in {dtype}:\n{plan}");
        assert!(scale_matters, "{dtype}: a 5% error in the scale must fail the comparison");
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 36, ..ProptestConfig::default() });
    let strategy = (
        1usize..3,
        1usize..5,
        proptest::sample::select(vec![1usize, 7, 64, 129, 300]),
        proptest::sample::select(vec![9usize, 64, 128, 256, 384]),
        proptest::sample::select(vec![16usize, 32, 48, 64, 128]),
        proptest::sample::select(dtypes.clone()),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(batch, heads, tq, tkv, head, dtype, causal)| {
            check(batch, heads, tq, tkv, head, dtype, causal);
            Ok(())
        })
        .unwrap();
    for case in not_whole.borrow().iter() {
        println!("attention_backward: ran decomposed (cuDNN did not take it): {case}");
    }
}

/// `qkv_attention` and its backward (q, k and v side by side in one `[..., tokens, 3 * heads *
/// head]` tensor, the layout GPT-2's `c_attn` writes) run whole on CudaOps, reading the parts in
/// place: through cuDNN in bf16 and f16 and the generated flash kernels in f32 (head sizes up
/// to 64), the backward writing dq, dk and dv in `qkv`'s layout. Each equals the CPU
/// reference's `f32` decomposition (split, views, attention) on the same rounded values, each
/// part of the gradient within its dtype's tolerance relative to its largest value, for GPT-2's
/// shape and random batches (with and without a batch axis), heads, tokens and head sizes. At
/// GPT-2's shape a 5% error in the scale fails the comparison.
#[test]
fn qkv_attention_runs_whole_and_matches_the_reference() {
    let Some((device, _sharing)) = device() else { return };
    let cudnn = cuda::fused_attention();
    if let Err(why) = &cudnn {
        println!("SKIPPED (16-bit cases): qkv_attention_runs_whole_and_matches_the_reference: {why}");
    }
    let registry = Registry::with_builtins();
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
    let executors = [ops.clone(), CpuReference::shared()];
    let check = |lead: &[usize], tokens: usize, heads: usize, head: usize, dtype: DType, causal: bool| {
        let (c, gpt2) = (heads * head, tokens == 1024);
        let shape = |width: usize| lead.iter().copied().chain([tokens, width]).collect::<Vec<_>>();
        let (qkv_shape, out_shape) = (shape(3 * c), shape(c));
        let scale = 1.0 / (head as f32).sqrt();
        // The forward (of `qkv`) or the backward (of `qkv` and the result's gradient) at
        // `scale`: on CudaOps (where it prefers it whole) or the CPU reference.
        let plan_of = |dtype: DType, backward: bool, scale: f32, gpu: bool| -> Plan {
            let arena = Arena::new();
            let mut b = boundscope::TraceBuilder::new(&arena, &registry);
            let qkv = b.input_with(&TensorMeta::new(dtype, &qkv_shape)).unwrap();
            let y = if backward {
                let g = b.input_with(&TensorMeta::new(dtype, &out_shape)).unwrap();
                b.qkv_attention_backward(qkv, g, heads, causal, scale).unwrap()
            } else {
                b.qkv_attention(qkv, heads, causal, Some(scale)).unwrap()
            };
            b.output(y).unwrap();
            let trace = b.finish().unwrap();
            if !gpu {
                return Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
            }
            let kept = Pipeline::for_executors(std::slice::from_ref(&ops)).run(&trace, &arena).unwrap();
            Plan::compile(&kept, &executors).unwrap()
        };
        let inputs = [
            Tensor::from_fn(&qkv_shape, |i| (((i * 37 + 11) % 101) as f32 / 50.0) - 1.0).to_dtype(dtype),
            Tensor::from_fn(&out_shape, |i| (((i * 53 + 7) % 89) as f32 / 44.0) - 1.0).to_dtype(dtype),
        ];
        let wide: Vec<Tensor> = inputs.iter().map(|t| t.to_dtype(DType::F32)).collect();
        let case = format!("{dtype} qkv {qkv_shape:?} heads {heads} causal {causal}");
        // Each part's worst error relative to its largest value: q, k, v (or the result) by column.
        let parts = |backward: bool| if backward { 3 } else { 1 };
        let off = |got: &[f32], expected: &[f32], backward: bool| -> f32 {
            let width = parts(backward) * c;
            (0..parts(backward))
                .map(|part| {
                    let mine = |i: &usize| (i % width) / c == part;
                    let idx: Vec<usize> = (0..expected.len()).filter(mine).collect();
                    let largest = idx.iter().fold(1e-3f32, |m, &i| m.max(expected[i].abs()));
                    idx.iter().map(|&i| (got[i] - expected[i]).abs()).fold(0f32, f32::max) / largest
                })
                .fold(0f32, f32::max)
        };
        for backward in [false, true] {
            let symbol = if backward { "= qkv_attention_backward(" } else { "= qkv_attention(" };
            let n = if backward { 2 } else { 1 };
            let reference = |scale| {
                let plan = plan_of(DType::F32, backward, scale, false);
                plan.run(&wide[..n].iter().collect::<Vec<_>>()).unwrap()[0].to_f32_vec()
            };
            let plan = plan_of(dtype, backward, scale, true);
            let whole = plan.to_string().lines().any(|l| l.contains(symbol) && l.contains(CudaOps::NAME));
            // The backward in 16 bits runs whole where cuDNN takes the shape (before 9.16, key
            // lengths a multiple of 128): always at GPT-2's.
            if dtype == DType::F32 || !backward || tokens.is_multiple_of(128) {
                // f32: the generated kernels (the backward's heads a multiple of 16, as here).
                let runs_whole = if dtype == DType::F32 { head <= 64 } else { head.is_multiple_of(8) };
                assert_eq!(whole, runs_whole, "{case} backward {backward}:\n{plan}");
            } else if !whole {
                println!("qkv_attention_backward: ran decomposed (cuDNN did not take it): {case}");
            }
            let got = plan.run(&inputs[..n].iter().collect::<Vec<_>>()).unwrap()[0].to_f32_vec();
            let tolerance = match dtype {
                DType::F32 => 1e-4,
                DType::BF16 => 3e-2,
                _ => 1e-2,
            };
            let worst = off(&got, &reference(scale), backward);
            assert!(worst <= tolerance, "{case} backward {backward}: off by {worst} of its largest value");
            if gpt2 {
                assert!(
                    off(&got, &reference(scale * 1.05), backward) > tolerance,
                    "{case} backward {backward}: a 5% error in the scale must fail the comparison"
                );
            }
        }
    };
    let dtypes = if cudnn.is_ok() { vec![DType::BF16, DType::F16, DType::F32] } else { vec![DType::F32] };
    for &dtype in &dtypes {
        // GPT-2's attention (batch 2 here), with c_attn's result viewed as [batch, tokens, 3 * 768].
        check(&[2], 1024, 12, 64, dtype, true);
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 24, ..ProptestConfig::default() });
    let strategy = (
        proptest::sample::select(vec![vec![], vec![1usize], vec![2, 3]]),
        // Multiples of 128 too: before cuDNN 9.16 only those run the backward whole.
        proptest::sample::select(vec![7usize, 64, 128, 129, 256, 300]),
        1usize..5,
        // Heads of 128, which the flash kernel does not take: whole in 16 bits means cuDNN.
        proptest::sample::select(vec![16usize, 32, 64, 128]),
        proptest::sample::select(dtypes.clone()),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(lead, tokens, heads, head, dtype, causal)| {
            check(&lead, tokens, heads, head, dtype, causal);
            Ok(())
        })
        .unwrap();
}

/// `layer_norm_backward` and `layer_norm_weight_backward` (what `passes::Grad` writes for
/// `layer_norm`) run whole on CudaOps (one row kernel; partial sums per block and their sum)
/// and equal the CPU reference's `f32` decompositions on the same (rounded) operands: the
/// input's gradient within its dtype's tolerance relative to its largest value, the weight's
/// and bias's sums within 1e-4 of theirs, over rows of 1 to 5,000 values (short rows several to
/// a warp, odd lengths, rows over a block's warps), f32, bf16 and f16, with an f32 or a same-dtype
/// weight or none. Rows too long for the kernels run decomposed and match too. Leaving the
/// weight out of the reference fails the comparison.
#[test]
fn layer_norm_backward_runs_whole_and_matches_the_reference() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let executors: [Arc<dyn Executor>; 2] = [Arc::new(cuda_ops(device.clone())), CpuReference::shared()];
    fn build<'a>(
        arena: &'a Arena,
        registry: &'a Registry,
        shape: &[usize],
        dtype: DType,
        weight: Option<DType>,
        eps: f32,
    ) -> boundscope::Trace<'a> {
        let mut b = boundscope::TraceBuilder::new(arena, registry);
        let x = b.input_with(&TensorMeta::new(dtype, shape)).unwrap();
        let g = b.input_with(&TensorMeta::new(dtype, shape)).unwrap();
        let w = weight.map(|d| b.input_with(&TensorMeta::new(d, &shape[shape.len() - 1..])).unwrap());
        let dx = b.layer_norm_backward(x, g, eps, w).unwrap();
        let sums = b.layer_norm_weight_backward(x, g, eps).unwrap();
        b.output(dx).unwrap();
        b.output(sums).unwrap();
        b.finish().unwrap()
    }
    let whole = |plan: &Plan, name: &str| {
        plan.to_string().lines().any(|l| l.contains(&format!("= {name}(")) && l.contains(CudaOps::NAME))
    };
    let off = |got: &[f32], expected: &[f32]| {
        let largest = expected.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        got.iter().zip(expected).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max) / largest
    };
    let check = |rows: usize, cols: usize, dtype: DType, weight: Option<DType>, eps: f32| {
        let shape = [rows, cols];
        let arena = Arena::new();
        let mut inputs = vec![
            // Rows of other means and spreads, so that every statistic matters.
            Tensor::from_fn(&shape, |i| {
                let (r, c) = (i / cols, i % cols);
                (r % 7) as f32 - 3.0 + (1.0 + (r % 3) as f32) * (((c * 37 + r * 11) % 101) as f32 / 50.0 - 1.0)
            })
            .to_dtype(dtype),
            Tensor::from_fn(&shape, |i| ((i * 53 + 17) % 97) as f32 / 48.0 - 1.0).to_dtype(dtype),
        ];
        if let Some(w) = weight {
            inputs.push(Tensor::from_fn(&[cols], |c| 0.5 + ((c * 29) % 31) as f32 / 31.0).to_dtype(w));
        }
        let wide: Vec<Tensor> = inputs.iter().map(|t| t.to_dtype(DType::F32)).collect();
        let reference = |weight: Option<DType>, wide: &[Tensor]| {
            let trace = build(&arena, &registry, &shape, DType::F32, weight.map(|_| DType::F32), eps);
            let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
            let out = plan.run(&wide.iter().collect::<Vec<_>>()).unwrap();
            (out[0].to_f32_vec(), out[1].to_f32_vec())
        };
        let (dx, sums) = reference(weight, &wide);
        let trace = build(&arena, &registry, &shape, dtype, weight, eps);
        let plan = Plan::compile(&trace, &executors).unwrap();
        let out = plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap();
        let case = format!("{dtype} [{rows}, {cols}] weight {weight:?} eps {eps}");
        let tolerance = match dtype {
            DType::BF16 => 2e-2,
            DType::F16 => 4e-3,
            _ => 1e-4,
        };
        let (dx_off, sums_off) = (off(&out[0].to_f32_vec(), &dx), off(&out[1].to_f32_vec(), &sums));
        assert!(dx_off <= tolerance, "{case}: the input's gradient is off by {dx_off} of its largest value");
        assert!(sums_off <= 1e-4, "{case}: the weight's and bias's sums are off by {sums_off}");
        // (A row of one value has no gradient, whatever the weight.)
        if weight.is_some() && cols > 1 {
            let (unweighted, _) = reference(None, &wide[..2]);
            let miss = off(&out[0].to_f32_vec(), &unweighted);
            assert!(miss > tolerance, "{case}: the weight must matter ({miss})");
        }
        (whole(&plan, "layer_norm_backward"), whole(&plan, "layer_norm_weight_backward"))
    };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for &weight in &[None, Some(DType::F32), Some(dtype)] {
            for (rows, cols) in [(300, 768), (5, 1), (33, 3), (64, 32), (7, 1001), (3, 4096), (2, 5000), (1, 40000)] {
                let (input_whole, weight_whole) = check(rows, cols, dtype, weight, 1e-5);
                assert_eq!(input_whole, cols <= 24 * 1024, "{dtype} [{rows}, {cols}]: the input's gradient whole");
                assert_eq!(weight_whole, cols <= 4096, "{dtype} [{rows}, {cols}]: the weight's whole");
            }
        }
        // `eps` 0, and rows that leave a warp's last row groups empty (8 threads a row, 4 rows
        // a warp): the groups past the last row add nothing (their `1/sqrt(0)` is infinite).
        check(33, 32, dtype, Some(dtype), 0.0);
    }
}

/// `h @ w @ ... @ w`, `products` products: with `w` the identity ([`identity`]), a chain that
/// keeps the GPU busy while the host runs ahead and gives back `h`.
fn products_of(
    b: &mut boundscope::TraceBuilder<'_>,
    h: boundscope::ValueId,
    w: boundscope::ValueId,
    products: usize,
) -> boundscope::ValueId {
    (0..products).fold(h, |h, _| b.matmul(h, w).unwrap())
}

/// The `[n, n]` identity matrix.
fn identity(n: usize) -> Tensor {
    Tensor::from_fn(&[n, n], |i| if i / n == i % n { 1.0 } else { 0.0 })
}

/// Runs are ordered with the work on the device's own stream around them, with no synchronize
/// in between, while the GPU runs behind the host (each run is 40 products): an upload into a
/// run's input comes after the run before it read it (the device's stream waits for the runs
/// that left their queues before its own work) and before the run after it (a run waits for the
/// device's stream when work was queued there since its workspace last waited); an input
/// dropped as soon as its run is queued keeps its values for that run (its memory is freed, and
/// handed to the next upload, after the run). Every run's output is checked once everything is
/// queued. Without either wait this fails (checked on the H200 by removing each).
#[test]
fn runs_are_ordered_with_uploads_and_frees_between_them() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    // Under 1 MiB, so that uploads are not staged (a staged upload waits on the host).
    let (rows, cols, products, runs) = (255, 1024, 40, 8);
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let (x, w) = (b.input(&[rows, cols]).unwrap(), b.input(&[cols, cols]).unwrap());
    let h = products_of(&mut b, x, w, products);
    b.output(h).unwrap();
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &[Arc::new(cuda_ops(device.clone()))]).unwrap();
    let on_device: Arc<dyn boundscope::Device> = device.clone();
    // The identity, so that every run's output is its input: the value `k + 1` everywhere.
    let identity = identity(cols);
    let filled = |k: usize| Tensor::from_fn(&[rows, cols], |_| (k + 1) as f32);
    let w_on_device = DeviceTensor::upload(&on_device, identity.view()).unwrap();
    // Half of them on the device's own stream, taking turns with the others.
    let mut workspaces: Vec<_> = (0..runs)
        .map(|k| if k % 2 == 0 { plan.workspace() } else { plan.workspace_on_device_queue() }.unwrap())
        .collect();
    let check = |outputs: Vec<boundscope::DeviceOutputs<'_>>, case: &str| {
        for (k, output) in outputs.iter().enumerate() {
            let got = output.to_host(0).unwrap();
            let wrong = got.values::<f32>().unwrap().iter().filter(|&&v| v != (k + 1) as f32).count();
            assert_eq!(wrong, 0, "{case}: run {k} read another run's input in {wrong} places");
        }
    };
    // Each workspace runs once first, so that the runs below are steady-state runs.
    let mut x_on_device = DeviceTensor::upload(&on_device, filled(0).view()).unwrap();
    for workspace in &mut workspaces {
        plan.run_on_device(workspace, &[RunInput::from(&x_on_device), RunInput::from(&w_on_device)]).unwrap();
    }
    boundscope::Device::synchronize(&*device).unwrap();
    for _round in 0..3 {
        // One input, refilled between the runs.
        let mut outputs = Vec::new();
        for (k, workspace) in workspaces.iter_mut().enumerate() {
            x_on_device.copy_from_host(filled(k).view()).unwrap();
            let inputs = [RunInput::from(&x_on_device), RunInput::from(&w_on_device)];
            outputs.push(plan.run_on_device(workspace, &inputs).unwrap());
        }
        check(outputs, "one input refilled between runs");
        // A new input per run, dropped as soon as the run is queued.
        let mut outputs = Vec::new();
        for (k, workspace) in workspaces.iter_mut().enumerate() {
            let x_k = DeviceTensor::upload(&on_device, filled(k).view()).unwrap();
            outputs.push(plan.run_on_device(workspace, &[RunInput::from(&x_k), RunInput::from(&w_on_device)]).unwrap());
        }
        check(outputs, "inputs dropped after queuing their runs");
        // One workspace, one run after another, each into its own input.
        let inputs: Vec<_> = (0..runs).map(|k| DeviceTensor::upload(&on_device, filled(k).view()).unwrap()).collect();
        for mut alone in [plan.workspace().unwrap(), plan.workspace_on_device_queue().unwrap()] {
            for (k, input) in inputs.iter().enumerate() {
                let got =
                    plan.run_on_device(&mut alone, &[RunInput::from(input), RunInput::from(&w_on_device)]).unwrap();
                if k + 1 == runs {
                    let got = got.to_host(0).unwrap();
                    assert!(got.values::<f32>().unwrap().iter().all(|&v| v == runs as f32), "the last run");
                }
            }
        }
    }
    // A workspace on the device's own stream is not captured: other threads' transfers there
    // would join the graph.
    let mut shared = plan.workspace_on_device_queue().unwrap();
    let mut w_again = DeviceTensor::upload(&on_device, identity.view()).unwrap();
    let err = plan.capture(&mut shared, vec![&mut x_on_device, &mut w_again]).err().unwrap();
    assert!(
        matches!(err, boundscope::Error::GraphUnsupported { .. })
            && err.to_string().contains("made by `Plan::workspace`"),
        "{err}"
    );
}

/// A run on the device's own stream (`Plan::workspace_on_device_queue`) that updates a device
/// tensor in place comes before the next run, in a workspace with a stream of its own, that
/// reads the tensor: also when the host has seen all the work before it finish (a download in
/// between), so that only the run's own count in the order with the device's stream, taken as
/// it leaves, makes the reader wait.
#[test]
fn a_run_on_the_device_stream_comes_before_the_run_that_reads_its_update() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let (rows, cols, products) = (255, 1024, 40);
    let (writer_arena, reader_arena) = (Arena::new(), Arena::new());
    // The writer: x <- x @ w ... @ w + 1 (w the identity: each run adds one to every value).
    let mut b = boundscope::TraceBuilder::new(&writer_arena, &registry);
    let (x, w, one) =
        (b.input(&[rows, cols]).unwrap(), b.input(&[cols, cols]).unwrap(), b.input(&[rows, cols]).unwrap());
    let h = products_of(&mut b, x, w, products);
    let h = b.add(h, one).unwrap();
    b.update(x, h).unwrap();
    b.output(h).unwrap();
    let writer = Plan::compile(&b.finish().unwrap(), &[Arc::new(cuda_ops(device.clone()))]).unwrap();
    // The reader: x @ w ... @ w, that is x.
    let mut b = boundscope::TraceBuilder::new(&reader_arena, &registry);
    let (x, w) = (b.input(&[rows, cols]).unwrap(), b.input(&[cols, cols]).unwrap());
    let h = products_of(&mut b, x, w, products);
    b.output(h).unwrap();
    let reader = Plan::compile(&b.finish().unwrap(), &[Arc::new(cuda_ops(device.clone()))]).unwrap();
    let on_device: Arc<dyn boundscope::Device> = device.clone();
    let identity = identity(cols);
    let mut x_on_device = DeviceTensor::upload(&on_device, Tensor::zeros(&[rows, cols]).view()).unwrap();
    let mut w_on_device = DeviceTensor::upload(&on_device, identity.view()).unwrap();
    let mut one_on_device = DeviceTensor::upload(&on_device, Tensor::from_fn(&[rows, cols], |_| 1.0).view()).unwrap();
    let (mut writing, mut reading) = (writer.workspace_on_device_queue().unwrap(), reader.workspace().unwrap());
    for k in 1..=8 {
        let mut inputs = [
            boundscope::RunInputMut::from(&mut x_on_device),
            boundscope::RunInputMut::from(&mut w_on_device),
            boundscope::RunInputMut::from(&mut one_on_device),
        ];
        writer.run_updating_on_device(&mut writing, &mut inputs).unwrap();
        let got = reader
            .run_on_device(&mut reading, &[RunInput::from(&x_on_device), RunInput::from(&w_on_device)])
            .unwrap()
            .to_host(0)
            .unwrap();
        let wrong = got.values::<f32>().unwrap().iter().filter(|&&v| v != k as f32).count();
        assert_eq!(wrong, 0, "run {k}: the reader read {wrong} values before the writer's run wrote them");
    }
}

/// A composite with a guard on its subsymbols runs decomposed on the GPU, as on the CPU
/// reference: its subsymbols' guards run, none is dropped, and the results match.
#[test]
fn cuda_ops_decomposes_composites_with_guards_on_their_subsymbols() {
    use boundscope::guards::Recorder;
    use boundscope::BoundSymbolId;
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let (x, w) = (b.input(&[16, 32]).unwrap(), b.input(&[24, 32]).unwrap());
    let h = b.linear(x, w, None).unwrap();
    let y = b.softmax(h).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let inputs = inputs_for(&trace);
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let expected = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&refs).unwrap();
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
    let executors = [ops, CpuReference::shared()];
    let steps_on_gpu = |plan: &Plan| plan.to_string().lines().filter(|l| l.contains("cuda_ops")).count();
    let whole = Plan::compile(&Pipeline::for_executors(&executors).run(&trace, &arena).unwrap(), &executors).unwrap();
    assert_eq!(steps_on_gpu(&whole), 2, "{whole}");
    for op in 0..2 {
        let mut guarded = trace.clone();
        let recorder = Recorder::new();
        guarded.attach_subsymbol_guard(BoundSymbolId::from_index(op), 1, recorder.clone()).unwrap();
        let prims = Pipeline::for_executors(&executors).run(&guarded, &arena).unwrap();
        let plan = Plan::compile(&prims, &executors).unwrap();
        assert!(steps_on_gpu(&plan) > 2, "op {op} stayed whole:\n{plan}");
        assert!(plan.dropped_guards().is_empty() && prims.dropped_guards().is_empty(), "{plan}");
        let got = plan.run(&refs).unwrap();
        assert!(!recorder.ranges().is_empty(), "op {op}: the subsymbol guards ran");
        common::close_all(&got, &expected, TOLERANCE).unwrap();
    }
}

/// Training traces (`passes::Grad`, then AdamW in place) on the CUDA executors equal the CPU
/// reference: an MLP classifier and a small attention block (embedding, `layer_norm`, the q, k,
/// v split, causal attention, `cross_entropy`), in f32 and with bf16 compute, fused for
/// `CudaFusion`; gradients after one step and losses over five steps of `run_updating`.
#[test]
fn training_steps_on_cuda_match_the_reference() {
    use boundscope::optim::AdamW;
    use boundscope::passes::Grad;
    let Some((device, _sharing)) = device() else { return };
    for attention in [false, true] {
        for bf16 in [false, true] {
            let registry = Registry::with_builtins();
            let arena = Arena::new();
            let mut b = boundscope::TraceBuilder::new(&arena, &registry);
            let (rows, width, classes) = (32, 64, 16);
            let ids = b.input_with(&TensorMeta::new(DType::I64, &[rows])).unwrap();
            let targets = b.input_with(&TensorMeta::new(DType::I64, &[rows])).unwrap();
            let wte = b.input(&[classes, width]).unwrap();
            let w1 = b.input(&[3 * width, width]).unwrap();
            let w2 = b.input(&[classes, width]).unwrap();
            let params = [wte, w1, w2];
            let low = |b: &mut boundscope::TraceBuilder<'_>, v| if bf16 { b.cast(v, DType::BF16).unwrap() } else { v };
            let x = b.embedding(wte, ids).unwrap();
            let x = low(&mut b, x);
            let h = if attention {
                let n = b.layer_norm(x, 1e-5, None, None).unwrap();
                let w = low(&mut b, w1);
                let qkv = b.linear(n, w, None).unwrap();
                let parts = b.split(qkv, 1, &[width, width, width]).unwrap();
                let [q, k, v] = [0, 1, 2].map(|i| b.reshape(parts[i], &[2, rows / 2, width]).unwrap());
                let y = b.scaled_dot_product_attention(q, k, v, true, None).unwrap();
                let y = b.reshape(y, &[rows, width]).unwrap();
                b.add(x, y).unwrap()
            } else {
                let w = low(&mut b, w1);
                let h = b.linear(x, w, None).unwrap();
                let h = b.gelu(h).unwrap();
                b.slice(h, 1, 0, width).unwrap()
            };
            let w = low(&mut b, w2);
            let logits = b.linear(h, w, None).unwrap();
            let logits = b.cast(logits, DType::F32).unwrap();
            let loss = b.cross_entropy(logits, targets).unwrap();
            b.output(loss).unwrap();
            let backward = Grad::new(&params).run(&b.finish().unwrap(), &arena).unwrap();
            let mut b = boundscope::TraceBuilder::continuing(&backward, &arena);
            let adamw = AdamW::new();
            let hyper = adamw.step_inputs(&mut b).unwrap();
            for (k, &p) in params.iter().enumerate() {
                adamw.update(&mut b, &hyper, p, backward.outputs()[1 + k]).unwrap();
            }
            let step = b.finish().unwrap();
            let (fused, fusion) = fused_for_cuda(&device, &step, &arena);
            let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
            let gpu = Plan::compile(&fused, &[fusion, ops, CpuReference::shared()]).unwrap();
            let cpu = Plan::compile(&step, &[CpuReference::shared()]).unwrap();
            let mut tensors: Vec<Vec<Tensor>> = (0..2)
                .map(|_| {
                    step.inputs()
                        .iter()
                        .enumerate()
                        .map(|(k, &v)| {
                            let meta = step.value_meta(v).unwrap();
                            match meta.dtype {
                                DType::I64 => Tensor::from_vec(
                                    &meta.shape,
                                    (0..rows).map(|i| ((i * 5 + k) % classes) as i64).collect(),
                                )
                                .unwrap(),
                                _ if k < 5 => {
                                    Tensor::from_fn(&meta.shape, |i| ((i * 7 + k * 13) % 23) as f32 / 23.0 - 0.5)
                                }
                                _ => Tensor::from_fn(&meta.shape, |_| 0.0),
                            }
                        })
                        .collect()
                })
                .collect();
            let tolerance = if bf16 { 3e-2 } else { 2e-3 };
            let case = format!("attention {attention}, bf16 {bf16}");
            let (mut gpu_ws, mut cpu_ws) = (gpu.workspace().unwrap(), cpu.workspace().unwrap());
            for t in 1..=5u64 {
                let [gpu_inputs, cpu_inputs] = &mut tensors[..] else { unreachable!() };
                for inputs in [&mut *gpu_inputs, &mut *cpu_inputs] {
                    for (slot, value) in inputs[5..8].iter_mut().zip(adamw.step_scalars(t, 1e-2)) {
                        slot.values_mut::<f32>().unwrap()[0] = value;
                    }
                }
                let mut gpu_refs: Vec<&mut Tensor> = gpu_inputs.iter_mut().collect();
                let mut cpu_refs: Vec<&mut Tensor> = cpu_inputs.iter_mut().collect();
                let got = gpu.run_updating(&mut gpu_ws, &mut gpu_refs).unwrap().to_tensors();
                let want = cpu.run_updating(&mut cpu_ws, &mut cpu_refs).unwrap().to_tensors();
                common::close_all(&got[..1], &want[..1], tolerance)
                    .unwrap_or_else(|e| panic!("{case}, step {t}: loss: {e}"));
                if t == 1 {
                    // The gradients (after the loss), before any update has moved the two apart.
                    common::close_all(&got[1..4], &want[1..4], tolerance)
                        .unwrap_or_else(|e| panic!("{case}: gradients: {e}\n{gpu}"));
                }
            }
        }
    }
}

/// An AdamW step (with weight decay) over 150 parameters of several shapes, lengths that four
/// divides and that it does not, f32 and bf16: `CudaFusion` joins every update into one region
/// (a few multi-tensor launches, not 150) whose results equal the CPU reference's, over three
/// steps written back into the tensors.
#[test]
fn an_optimizer_step_over_many_parameters_runs_joined_and_matches_the_reference() {
    use boundscope::optim::AdamW;
    let Some((device, _sharing)) = device() else { return };
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let adamw = AdamW::new().weight_decay(0.01);
    let hyper = adamw.step_inputs(&mut b).unwrap();
    let shapes: [&[usize]; 5] = [&[768], &[3, 7], &[64, 32], &[5], &[1]];
    for i in 0..150 {
        let dtype = if i % 3 == 2 { DType::BF16 } else { DType::F32 };
        let p = b.input_with(&TensorMeta::new(dtype, shapes[i % 5])).unwrap();
        let g = b.input(shapes[i % 5]).unwrap();
        adamw.update(&mut b, &hyper, p, g).unwrap();
    }
    let step = b.finish().unwrap();
    let (fused, fusion) = fused_for_cuda(&device, &step, &arena);
    let regions = fused.bound_symbols().iter().filter(|b| b.symbol() == prims::REGION).count();
    assert_eq!(regions, 1, "{fused}");
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
    let gpu = Plan::compile(&fused, &[fusion, ops, CpuReference::shared()]).unwrap();
    let cpu = Plan::compile(&step, &[CpuReference::shared()]).unwrap();
    let inputs = |_| -> Vec<Tensor> {
        step.inputs()
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                let meta = step.value_meta(v).unwrap();
                Tensor::from_fn(&meta.shape, |i| ((i * 7 + k * 13) % 23) as f32 / 23.0 - 0.5).to_dtype(meta.dtype)
            })
            .collect()
    };
    let [mut on_gpu, mut on_cpu]: [Vec<Tensor>; 2] = [0, 1].map(inputs);
    let (mut gpu_ws, mut cpu_ws) = (gpu.workspace().unwrap(), cpu.workspace().unwrap());
    for t in 1..=3u64 {
        for tensors in [&mut on_gpu, &mut on_cpu] {
            for (slot, value) in tensors[..3].iter_mut().zip(adamw.step_scalars(t, 1e-2)) {
                *slot = Tensor::from_fn(&[], |_| value);
            }
        }
        gpu.run_updating(&mut gpu_ws, &mut on_gpu.iter_mut().collect::<Vec<_>>()).unwrap();
        cpu.run_updating(&mut cpu_ws, &mut on_cpu.iter_mut().collect::<Vec<_>>()).unwrap();
        for (k, (got, want)) in on_gpu.iter().zip(&on_cpu).enumerate() {
            let tolerance = if got.dtype() == DType::BF16 { 1e-2 } else { 1e-5 };
            common::close_all(std::slice::from_ref(got), std::slice::from_ref(want), tolerance)
                .unwrap_or_else(|e| panic!("step {t}, input {k}: {e}"));
        }
    }
}

/// The gradients' prims (`pad`, `scatter_last`, `embedding_backward`) run on `CudaOps` and equal
/// the CPU reference (exactly: moves, and sums of the few rows here); a bad id is
/// `Error::IndexOutOfRange` from the run.
#[test]
fn gradient_prims_run_on_cuda_and_match_the_reference() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    for dtype in [DType::F32, DType::BF16] {
        for (width, fill) in [(16, 0.0), (6, 0.0), (16, 0.5)] {
            let arena = Arena::new();
            let mut b = boundscope::TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, &[5, width])).unwrap();
            let ids = b.input_with(&TensorMeta::new(DType::I64, &[5])).unwrap();
            let padded = b.pad(x, 1, 8, 8, fill).unwrap();
            let row = b.sum(x).unwrap();
            let row = b.reshape(row, &[5]).unwrap();
            let scattered = b.scatter_last(row, ids, 7).unwrap();
            b.output(padded).unwrap();
            b.output(scattered).unwrap();
            if dtype == DType::F32 {
                let table = b.embedding_backward(x, ids, 7).unwrap();
                b.output(table).unwrap();
            }
            let trace = b.finish().unwrap();
            let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
            let plan = Plan::compile(&trace, &[ops]).unwrap();
            let x_values = Tensor::from_fn(&[5, width], |i| (i as f32 * 0.37).sin()).to_dtype(dtype);
            let ids_values = Tensor::from_vec(&[5], vec![3i64, 0, 3, 6, 3]).unwrap();
            let got = plan.run(&[&x_values, &ids_values]).unwrap();
            let want =
                Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&x_values, &ids_values]).unwrap();
            common::close_all(&got, &want, 1e-6).unwrap_or_else(|e| panic!("{dtype} width {width}: {e}\n{plan}"));
            let bad = Tensor::from_vec(&[5], vec![3i64, 0, 7, 6, 3]).unwrap();
            let err = plan.run(&[&x_values, &bad]).unwrap_err();
            assert!(matches!(err, boundscope::Error::IndexOutOfRange { index: 7, .. }), "{err}");
        }
    }
}

/// `causal_mask` on CudaOps equals the CPU reference bit for bit, with rows that are whole
/// 16-byte vectors (masked lane by lane across the diagonal) and rows that are not; queries
/// fewer or more than keys.
#[test]
fn causal_masks_on_cuda_are_exact() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let cuda: Vec<Arc<dyn Executor>> = vec![Arc::new(cuda_ops(device.clone()))];
    let shapes: [&[usize]; 5] = [&[2, 3, 37, 40], &[5, 64, 64], &[3, 17, 24], &[9, 7], &[4, 1, 1024]];
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for shape in shapes {
            let arena = Arena::new();
            let mut b = boundscope::TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, shape)).unwrap();
            let y = b.causal_mask(x).unwrap();
            b.output(y).unwrap();
            let trace = b.finish().unwrap();
            let plan = Plan::compile(&trace, &cuda).unwrap();
            let x = Tensor::from_fn(shape, |i| (i as f32 * 0.37).sin()).to_dtype(dtype);
            let want = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&x]).unwrap();
            assert_eq!(plan.run(&[&x]).unwrap(), want, "{dtype} {shape:?}");
        }
    }
}

/// 16-bit products with a dimension that is not a multiple of 8 (GPT-2's vocabulary of 50,257)
/// run padded with zeros on CudaOps (`matmul`, `linear` with its bias, `transposed_matmul`,
/// `matmul_transposed`, batched and broadcast), and equal the CPU reference.
#[test]
fn padded_16_bit_products_match_the_reference() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let cuda: Vec<Arc<dyn Executor>> = vec![Arc::new(cuda_ops(device.clone()))];
    type Build = fn(
        &mut boundscope::TraceBuilder<'_>,
        boundscope::ValueId,
        boundscope::ValueId,
        boundscope::ValueId,
    ) -> boundscope::ValueId;
    let cases: [(&str, &[usize], &[usize], Build); 6] = [
        ("matmul", &[300, 257], &[257, 263], |b, x, y, _| b.matmul(x, y).unwrap()),
        ("linear", &[259, 300], &[261, 300], |b, x, w, bias| b.linear(x, w, Some(bias)).unwrap()),
        ("transposed_matmul", &[257, 270], &[257, 300], |b, x, y, _| b.transposed_matmul(x, y).unwrap()),
        ("matmul_transposed", &[260, 257], &[300, 257], |b, x, y, _| b.matmul_transposed(x, y).unwrap()),
        ("batched", &[3, 260, 257], &[3, 257, 258], |b, x, y, _| b.matmul(x, y).unwrap()),
        ("broadcast", &[3, 260, 257], &[257, 300], |b, x, y, _| b.matmul(x, y).unwrap()),
    ];
    for dtype in [DType::BF16, DType::F16] {
        for (name, xs, ys, build) in cases {
            let arena = Arena::new();
            let mut b = boundscope::TraceBuilder::new(&arena, &registry);
            let x = b.input_with(&TensorMeta::new(dtype, xs)).unwrap();
            let y = b.input_with(&TensorMeta::new(dtype, ys)).unwrap();
            let bias = b.input_with(&TensorMeta::new(dtype, &ys[..1])).unwrap();
            let z = build(&mut b, x, y, bias);
            b.output(z).unwrap();
            let trace = b.finish().unwrap();
            let plan = Plan::compile(&trace, &cuda).unwrap();
            let steps = plan.steps_per_executor();
            assert!(steps.contains(&("cuda_ops", 1)), "{name}: one product\n{plan}");
            let fill = |shape: &[usize], seed: usize| {
                Tensor::from_fn(shape, |i| (((i * 7919 + seed) % 2001) as f32 / 1000.0) - 1.0).to_dtype(dtype)
            };
            let inputs = [fill(xs, 1), fill(ys, 2), fill(&ys[..1], 3)];
            let want =
                Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&inputs.iter().collect::<Vec<_>>());
            let got = plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap();
            // One rounding to 16 bits (2^-8 relative) apart, and the order of f32 sums.
            common::close_all(&got, &want.unwrap(), 2e-2).unwrap_or_else(|e| panic!("{dtype} {name}: {e}"));
            let (g, w) = (got[0].to_f32_vec(), plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap()[0].to_f32_vec());
            assert_eq!(g, w, "{dtype} {name}: a second run gives the same bits");
        }
    }
}

/// `cross_entropy_backward` runs whole on CudaOps (one kernel) and equals the CPU reference's
/// decomposition: rows of 1 to 50,257 classes (GPT-2's vocabulary: rows not whole 16-byte
/// vectors), f32/bf16/f16 logits, an f32 or bf16 gradient of the loss, rows holding a NaN or
/// masked (-inf) classes; a target out of range is `IndexOutOfRange` after the run.
#[test]
fn cross_entropy_backward_runs_whole_and_matches_the_reference() {
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let cuda: Vec<Arc<dyn Executor>> = vec![Arc::new(cuda_ops(device.clone()))];
    for (rows, classes) in [(1, 1), (7, 5), (33, 300), (5, 4099), (3, 50257), (0, 8)] {
        for (dtype, grad_dtype) in [(DType::F32, DType::F32), (DType::BF16, DType::F32), (DType::F16, DType::BF16)] {
            let arena = Arena::new();
            let mut b = boundscope::TraceBuilder::new(&arena, &registry);
            let logits = b.input_with(&TensorMeta::new(dtype, &[rows, classes])).unwrap();
            let targets = b.input_with(&TensorMeta::new(DType::I64, &[rows])).unwrap();
            let grad = b.input_with(&TensorMeta::new(grad_dtype, &[])).unwrap();
            let d = b.cross_entropy_backward(logits, targets, grad).unwrap();
            b.output(d).unwrap();
            let trace = b.finish().unwrap();
            let plan = Plan::compile(&trace, &cuda).unwrap();
            assert!(plan.steps_per_executor().contains(&("cuda_ops", 1)), "one kernel:\n{plan}");
            let x = Tensor::from_fn(&[rows, classes], |i| match i {
                _ if rows > 2 && i == classes + 1 => f32::NAN,
                _ if rows > 2 && i / classes == 2 && i % 3 == 0 => f32::NEG_INFINITY,
                _ => ((i * 7919 % 1000) as f32 / 100.0) - 5.0,
            })
            .to_dtype(dtype);
            let mut ids: Vec<i64> = (0..rows as i64).map(|r| (r * 31 + 1) % classes as i64).collect();
            let t = Tensor::from_vec(&[rows], ids.clone()).unwrap();
            let g = Tensor::from_vec(&[], vec![1.7f32]).unwrap().to_dtype(grad_dtype);
            let want = Plan::compile(&trace, &[CpuReference::shared()]).unwrap().run(&[&x, &t, &g]).unwrap();
            let got = plan.run(&[&x, &t, &g]).unwrap();
            let (got_v, want_v) = (got[0].to_f32_vec(), want[0].to_f32_vec());
            // Relative to the largest magnitude a value can have, grad / rows.
            let bound = 1.7 / rows.max(1) as f32;
            let tolerance = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            for (i, (a, e)) in got_v.iter().zip(&want_v).enumerate() {
                let close = (a.is_nan() && e.is_nan()) || (a - e).abs() <= tolerance * bound;
                assert!(close, "{rows}x{classes} {dtype}/{grad_dtype}: element {i}: {a} against {e}");
            }
            if rows > 0 {
                ids[rows - 1] = classes as i64;
                let bad = Tensor::from_vec(&[rows], ids).unwrap();
                match plan.run(&[&x, &bad, &g]) {
                    Err(boundscope::Error::IndexOutOfRange { position, .. }) => assert_eq!(position, rows - 1),
                    other => panic!("{rows}x{classes} {dtype}: {other:?}"),
                }
                let again = plan.run(&[&x, &t, &g]).unwrap()[0].to_f32_vec();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                assert_eq!(bits(&again), bits(&got_v), "the fault was cleared");
            }
        }
    }
}

/// A training step whose parameters and AdamW moments live on the device
/// (`Plan::run_updating_on_device`: each fused AdamW kernel writes its updates over the
/// caller's tensors) gives, step after step, the same bits as the same plan updating host
/// tensors; the tensors keep their memory, and an output written into its input says to read
/// the input.
#[test]
fn training_on_the_device_updates_parameters_in_place() {
    use boundscope::optim::AdamW;
    use boundscope::passes::Grad;
    use boundscope::RunInputMut;
    let Some((device, _sharing)) = device() else { return };
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let (rows, width, classes) = (64, 128, 10);
    let x = b.input(&[rows, width]).unwrap();
    let targets = b.input_with(&TensorMeta::new(DType::I64, &[rows])).unwrap();
    let (w1, b1, w2) =
        (b.input(&[width, width]).unwrap(), b.input(&[width]).unwrap(), b.input(&[classes, width]).unwrap());
    let params = [w1, b1, w2];
    let h = b.linear(x, w1, Some(b1)).unwrap();
    let h = b.gelu(h).unwrap();
    let logits = b.linear(h, w2, None).unwrap();
    let loss = b.cross_entropy(logits, targets).unwrap();
    b.output(loss).unwrap();
    let adamw = AdamW::new();
    let step = Grad::new(&params).training_step(&b.finish().unwrap(), &arena, &adamw).unwrap().trace;
    let (fused, fusion) = fused_for_cuda(&device, &step, &arena);
    let ops: Arc<dyn Executor> = Arc::new(cuda_ops(device.clone()));
    let plan = Plan::compile(&fused, &[fusion, ops]).unwrap();
    let mut host: Vec<Tensor> = step
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let meta = step.value_meta(v).unwrap();
            match meta.dtype {
                DType::I64 => {
                    Tensor::from_vec(&meta.shape, (0..rows).map(|i| ((i * 3) % classes) as i64).collect()).unwrap()
                }
                _ if k < 5 => Tensor::from_fn(&meta.shape, |i| ((i * 7 + k * 13) % 23) as f32 / 23.0 - 0.5),
                _ => Tensor::from_fn(&meta.shape, |_| 0.0),
            }
        })
        .collect();
    let mut on_device = upload(&device, &host);
    let (mut host_ws, mut device_ws) = (plan.workspace().unwrap(), plan.workspace().unwrap());
    // Parameters (2..5) and moments (8..): updated where they are, in their own memory.
    let state: Vec<usize> = (2..5).chain(8..host.len()).collect();
    let memory = |t: &boundscope::DeviceTensor| t.buffer() as *const dyn boundscope::DeviceBuffer as *const u8;
    let held: Vec<*const u8> = state.iter().map(|&k| memory(&on_device[k])).collect();
    for t in 1..=4u64 {
        for (k, value) in (5..8).zip(adamw.step_scalars(t, 1e-2)) {
            host[k].values_mut::<f32>().unwrap()[0] = value;
            on_device[k].copy_from_host(host[k].view()).unwrap();
        }
        let mut refs: Vec<&mut Tensor> = host.iter_mut().collect();
        let want = plan.run_updating(&mut host_ws, &mut refs).unwrap().to_tensors();
        let mut inputs: Vec<RunInputMut<'_>> = on_device.iter_mut().map(RunInputMut::from).collect();
        let got = plan.run_updating_on_device(&mut device_ws, &mut inputs).unwrap();
        assert_eq!(got.to_host(0).unwrap().to_f32_vec(), want[0].to_f32_vec(), "step {t}: the loss");
        let updates: Vec<(usize, usize)> = plan.updates().collect();
        let exchanged: Vec<bool> = (0..got.len()).map(|i| got.to_host(i).is_err()).collect();
        assert!(
            matches!(got.to_host(1), Err(boundscope::Error::InvalidUpdate { .. })),
            "an exchanged output: updates {updates:?}, exchanged {exchanged:?}, on device {:?}\n{plan}",
            (0..got.len()).map(|i| got.device_buffer(i).is_some()).collect::<Vec<_>>()
        );
        for k in 2..5 {
            assert_eq!(on_device[k].to_host().unwrap().to_f32_vec(), host[k].to_f32_vec(), "step {t}: parameter {k}");
        }
        for (&k, &before) in state.iter().zip(&held) {
            assert_eq!(memory(&on_device[k]), before, "step {t}: input {k} was updated in its own memory\n{plan}");
        }
    }
    // The workspace holds neither an upload of the inputs given on the device nor a second copy
    // of what the step updates.
    let state_bytes: usize = state.iter().map(|&k| host[k].numel() * 4).sum();
    assert!(device_ws.device_bytes() + state_bytes <= plan.device_bytes(), "{plan}");
}
