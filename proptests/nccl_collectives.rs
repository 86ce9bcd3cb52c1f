//! On a GPU with NCCL: the collectives run by `NcclExecutor` on device buffers, on a world of
//! one rank (NCCL refuses two ranks on one GPU; `examples/ranks.rs --nccl` runs several on a
//! machine with several GPUs). Each collective in each dtype gives what the host executor gives
//! on a world of one, with host tensors, device tensors and in a graph; the collectives sit
//! beside fused kernels in one plan; each pushes exactly its op range, as the range map says;
//! and the typed errors: a trace of another world size, an aborted communicator.
//!
//! Without a usable GPU or NCCL every test prints `SKIPPED` with the reason and passes: run
//! the test binary on the GPU machine (`cargo test --release --no-run`, then carry it there).

mod common;

use std::sync::Arc;

use boundscope::distributed::{
    CollectiveExecutor, Collectives, InProcessGroup, NcclCommunicator, NcclExecutor, ReduceOp,
};
use boundscope::executors::cuda::{self, CudaDevice, CudaFusion, CudaOps};
use boundscope::guards::{NvtxRange, Selection};
use boundscope::passes::{FuseRegions, Pass, ProfileOps};
use boundscope::{
    Arena, Availability, DType, Device, DeviceTensor, Error, Executor, Plan, PushedBy, Registry, RunInput, Tensor,
    TensorMeta, Trace, TraceBuilder,
};
use common::nvtx_capture;
use common::ranges::{pushes_in, pushes_of};

/// The device and a world of one on it, or `None` after saying why the test is skipped.
fn world_of_one(test: &str) -> Option<(Arc<CudaDevice>, NcclCommunicator)> {
    if let Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: {test}: {reason}; run this test binary on a GPU machine");
        return None;
    }
    let gpu = CudaDevice::new().expect("available");
    match NcclCommunicator::single(gpu.clone(), "one") {
        Ok(comm) => Some((gpu, comm)),
        Err(e @ Error::ExecutorUnavailable { .. }) => {
            println!("SKIPPED: {test}: {e}; run this test binary on a GPU machine with NCCL");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

fn registry() -> (Registry, Collectives) {
    let mut registry = Registry::with_builtins();
    let collectives = Collectives::register(&mut registry).unwrap();
    (registry, collectives)
}

/// Every collective of `x` ([rows, 3] of `dtype`) on a world of one, each after a `mul` and
/// followed by an `add` (so they sit between fused kernels).
fn every_collective<'a>(
    arena: &'a Arena,
    registry: &'a Registry,
    c: &Collectives,
    dtype: DType,
    rows: usize,
) -> Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input_with(&TensorMeta::new(dtype, &[rows, 3])).unwrap();
    let doubled = b.mul(x, x).unwrap();
    let outputs = [
        c.all_reduce(&mut b, doubled, ReduceOp::Sum).unwrap(),
        c.all_reduce(&mut b, doubled, ReduceOp::Mean).unwrap(),
        c.all_reduce(&mut b, x, ReduceOp::Max).unwrap(),
        c.all_gather(&mut b, doubled, 1).unwrap(),
        c.reduce_scatter(&mut b, x, ReduceOp::Sum, 1).unwrap(),
        c.broadcast(&mut b, doubled, 0).unwrap(),
    ];
    for o in outputs {
        let after = b.add(o, o).unwrap();
        b.output(after).unwrap();
    }
    b.finish().unwrap()
}

#[test]
fn every_collective_in_every_dtype_matches_the_host_executor() {
    let Some((gpu, comm)) = world_of_one("every_collective_in_every_dtype_matches_the_host_executor") else {
        return;
    };
    println!("NCCL {}", NcclCommunicator::version().unwrap());
    let (registry, c) = registry();
    // A watchdog with room to spare follows every collective run here, and aborts none.
    comm.watch(std::time::Duration::from_secs(60)).unwrap();
    let comm = Arc::new(comm);
    let nccl = NcclExecutor::of(comm.clone(), &c).shared();
    let arena = Arena::new();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        // 1,000,003 rows: more than NCCL moves in one chunk, and odd.
        for rows in [1usize, 7, 1_000_003] {
            let trace = every_collective(&arena, &registry, &c, dtype, rows);
            let fusion: Arc<dyn Executor> = Arc::new(CudaFusion::new(gpu.clone()));
            let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
            let executors = [nccl.clone(), fusion, Arc::new(CudaOps::new(gpu.clone()))];
            let plan = Plan::compile(&fused, &executors).unwrap();
            let listing = plan.to_string();
            assert!(listing.contains("nccl") && listing.contains("CudaFusion"), "{listing}");
            let host_comm = InProcessGroup::new("host", 1).unwrap().remove(0);
            let host = [CollectiveExecutor::new(host_comm, &c).shared(), boundscope::executors::CpuReference::shared()];
            let reference = Plan::compile(&trace, &host).unwrap();
            let x = Tensor::from_fn(&[rows, 3], |i| ((i * 37) % 101) as f32 / 10.0 - 5.0).to_dtype(dtype);
            let expected = reference.run(&[&x]).unwrap();
            let same = |got: &[Tensor], how: &str| {
                assert_eq!(got.len(), expected.len());
                for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                    assert_eq!(g.dtype(), dtype);
                    assert_eq!(g.to_f32_vec(), e.to_f32_vec(), "{dtype} {rows} rows, output {i}, {how}");
                }
            };
            same(&plan.run(&[&x]).unwrap(), "host tensors");
            let device: Arc<dyn Device> = gpu.clone();
            let mut on_device = DeviceTensor::upload(&device, x.view()).unwrap();
            let mut workspace = plan.workspace().unwrap();
            let outputs = plan.run_on_device(&mut workspace, &[RunInput::from(&on_device)]).unwrap();
            same(&(0..6).map(|i| outputs.to_host(i).unwrap()).collect::<Vec<_>>(), "device tensors");
            if rows <= 7 {
                let mut graph_workspace = plan.workspace().unwrap();
                let mut graph = plan.capture(&mut graph_workspace, vec![&mut on_device]).unwrap();
                for _ in 0..2 {
                    let replayed = graph.replay().unwrap();
                    same(&(0..6).map(|i| replayed.to_host(i).unwrap()).collect::<Vec<_>>(), "graph replay");
                }
            }
        }
    }
    comm.check().unwrap();
}

/// A watchdog aborts a communicator whose collective has not ended within its timeout (here
/// 1 us, behind a product of tens of milliseconds, as a rank that hangs would leave it): the
/// run that queued it returns, and `check` and every later collective say why.
#[test]
fn a_watchdog_aborts_a_collective_that_does_not_end_in_time() {
    use std::time::{Duration, Instant};
    let Some((gpu, comm)) = world_of_one("a_watchdog_aborts_a_collective_that_does_not_end_in_time") else {
        return;
    };
    let comm = Arc::new(comm);
    comm.watch(Duration::from_micros(1)).unwrap();
    let (registry, c) = registry();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8192, 8192]).unwrap();
    let y = b.matmul(x, x).unwrap();
    let y = c.all_reduce(&mut b, y, ReduceOp::Sum).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let executors =
        [NcclExecutor::of(comm.clone(), &c).shared(), Arc::new(CudaOps::new(gpu.clone())) as Arc<dyn Executor>];
    let plan = Plan::compile(&trace, &executors).unwrap();
    let x = Tensor::from_fn(&[8192, 8192], |i| (i % 7) as f32 * 1e-3);
    let _ = plan.run(&[&x]);
    let start = Instant::now();
    while !comm.is_aborted() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let err = comm.check().unwrap_err();
    assert!(matches!(err, Error::Collective { .. }) && err.to_string().contains("did not end within"), "{err}");
    let err = plan.run(&[&x]).unwrap_err();
    assert!(matches!(&err, Error::Collective { .. }) && err.to_string().contains("did not end within"), "{err}");
}

#[test]
fn each_collective_pushes_exactly_its_range_in_its_domain() {
    let Some((gpu, comm)) = world_of_one("each_collective_pushes_exactly_its_range_in_its_domain") else { return };
    if !nvtx_capture::is_installed() {
        println!("SKIPPED: each_collective_pushes_exactly_its_range_in_its_domain: the NVTX capture is not this process's NVTX tool");
        return;
    }
    let (registry, c) = registry();
    let arena = Arena::new();
    let trace = every_collective(&arena, &registry, &c, DType::F32, 64);
    let mut profiled =
        ProfileOps::new().with_trace_range(NvtxRange::new().label("step").unwrap()).run(&trace, &arena).unwrap();
    profiled.attach_guard(Selection::All, NvtxRange::new().domain("collectives").unwrap()).unwrap();
    let executors = [NcclExecutor::new(comm, &c).shared(), Arc::new(CudaOps::new(gpu.clone())) as Arc<dyn Executor>];
    let plan = Plan::compile(&profiled, &executors).unwrap();
    let by_nccl = plan
        .range_map()
        .ranges()
        .iter()
        .filter(|r| r.domain == "collectives" && r.pushed_by == PushedBy::Executor("nccl".into()))
        .map(|r| r.label.clone())
        .collect::<Vec<_>>();
    assert_eq!(
        by_nccl,
        ["all_reduce_sum", "all_reduce_mean", "all_reduce_max", "all_gather", "reduce_scatter_sum", "broadcast"],
        "{plan:#}"
    );
    let x = Tensor::from_fn(&[64, 3], |i| i as f32);
    for _ in 0..2 {
        nvtx_capture::events_on_current_thread();
        plan.run(&[&x]).unwrap();
        let events = nvtx_capture::events_on_current_thread();
        assert_eq!(pushes_of(&events), pushes_in(plan.range_map()), "{plan:#}");
    }
}

#[test]
fn another_world_size_and_an_aborted_communicator_are_typed_errors() {
    let Some((gpu, comm)) = world_of_one("another_world_size_and_an_aborted_communicator_are_typed_errors") else {
        return;
    };
    let (registry, c) = registry();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4, 2]).unwrap();
    let gathered = c.all_gather(&mut b, x, 2).unwrap();
    b.output(gathered).unwrap();
    let two = b.finish().unwrap();
    let comm = Arc::new(comm);
    let executors =
        [NcclExecutor::of(comm.clone(), &c).shared(), Arc::new(CudaOps::new(gpu.clone())) as Arc<dyn Executor>];
    let err = Plan::compile(&two, &executors).unwrap_err().to_string();
    assert!(err.contains("built for a world of 2 ranks, but communicator `one` has 1"), "{err}");
    // Two ranks on one GPU, or a rank outside the world: NCCL's refusal or ours, typed.
    let err =
        NcclCommunicator::new(gpu.clone(), "bad", &boundscope::distributed::NcclId::new().unwrap(), 2, 2).unwrap_err();
    assert!(matches!(err, Error::Collective { .. }) && err.to_string().contains("outside a world of 2"), "{err}");

    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4, 2]).unwrap();
    let summed = c.all_reduce(&mut b, x, ReduceOp::Sum).unwrap();
    b.output(summed).unwrap();
    let one = b.finish().unwrap();
    let plan = Plan::compile(&one, &executors).unwrap();
    let data = Tensor::from_fn(&[4, 2], |i| i as f32);
    assert_eq!(plan.run(&[&data]).unwrap()[0].to_f32_vec(), data.to_f32_vec());
    comm.abort();
    assert!(comm.is_aborted());
    let err = plan.run(&[&data]).unwrap_err();
    assert!(matches!(&err, Error::Collective { .. }) && err.to_string().contains("aborted"), "{err}");
}

#[test]
fn a_ranks_streams_carry_its_name() {
    let Some((gpu, comm)) = world_of_one("a_ranks_streams_carry_its_name") else { return };
    if !nvtx_capture::is_installed() {
        println!("SKIPPED: a_ranks_streams_carry_its_name: the NVTX capture is not this process's NVTX tool");
        return;
    }
    gpu.name_streams("rank 0");
    let (registry, c) = registry();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8]).unwrap();
    let y = c.all_reduce(&mut b, x, ReduceOp::Sum).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let plan = Plan::compile(&trace, &[NcclExecutor::new(comm, &c).shared()]).unwrap();
    let device: Arc<dyn Device> = gpu.clone();
    let x = DeviceTensor::upload(&device, Tensor::from_fn(&[8], |i| i as f32).view()).unwrap();
    let mut workspace = plan.workspace().unwrap();
    plan.run_on_device(&mut workspace, &[RunInput::from(&x)]).unwrap();
    let names: Vec<String> = nvtx_capture::stream_names().into_iter().map(|(_, name)| name).collect();
    assert!(names.iter().any(|n| n == "rank 0 cuda:0"), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("rank 0 workspace ")), "{names:?}");
}

/// A data-parallel training step (`DataParallel` buckets, their `all_reduce` started on NCCL's
/// own stream during the backward and waited for before the optimizer) on a world of one gives
/// the plain step's parameters, through the front end on the GPU, whatever the bucket size.
#[test]
fn a_data_parallel_step_on_one_rank_equals_the_plain_step() {
    use boundscope::distributed::DataParallel;
    use boundscope::frontend::{Environment, ProfiledSession};
    use boundscope::optim::AdamW;
    use boundscope::options::Options;
    use boundscope::passes::Grad;
    let Some((_gpu, comm)) = world_of_one("a_data_parallel_step_on_one_rank_equals_the_plain_step") else { return };
    let (registry, c) = registry();
    let comm = Arc::new(comm);
    let arena = Arena::new();
    let (rows, d, hidden) = (64, 48, 96);
    let step_of = |dp: Option<DataParallel>| {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[rows, d]).unwrap();
        let (w1, b1, w2) =
            (b.input(&[d, hidden]).unwrap(), b.input(&[hidden]).unwrap(), b.input(&[hidden, d]).unwrap());
        let h = b.matmul(x, w1).unwrap();
        let h = b.add(h, b1).unwrap();
        let h = b.gelu(h).unwrap();
        let y = b.scope("out", |b| b.matmul(h, w2)).unwrap();
        let sq = b.mul(y, y).unwrap();
        let sq = b.reshape(sq, &[1, rows * d]).unwrap();
        let loss = b.sum(sq).unwrap();
        b.output(loss).unwrap();
        let grad = Grad::new(&[w1, b1, w2]);
        let grad = match dp {
            Some(dp) => grad.in_buckets(dp),
            None => grad,
        };
        grad.training_step(&b.finish().unwrap(), &arena, &AdamW::new()).unwrap()
    };
    let mut options = Options::new();
    options.set_str("runtime.device", "cuda").unwrap();
    let session = || ProfiledSession::new(options.clone(), &Environment::from_pairs(&[])).unwrap();
    let train = |plan: &Plan| -> Vec<Vec<f32>> {
        let mut ws = plan.workspace().unwrap();
        let mut x = Tensor::from_fn(&[rows, d], |i| ((i * 13) % 17) as f32 / 17.0 - 0.5);
        let mut params = [
            Tensor::from_fn(&[d, hidden], |i| ((i * 7) % 11) as f32 / 110.0 - 0.05),
            Tensor::from_fn(&[hidden], |i| (i % 5) as f32 / 50.0),
            Tensor::from_fn(&[hidden, d], |i| ((i * 3) % 13) as f32 / 130.0 - 0.05),
        ];
        let mut state: Vec<Tensor> = (0..6).map(|k| Tensor::zeros(params[k / 2].shape())).collect();
        for t in 1..=3 {
            let mut scalars = AdamW::new().step_values(t, 1e-2);
            let [w1, b1, w2] = &mut params;
            let mut refs: Vec<&mut Tensor> = vec![&mut x, w1, b1, w2];
            refs.extend(scalars.iter_mut());
            refs.extend(state.iter_mut());
            plan.run_updating(&mut ws, &mut refs).unwrap();
        }
        params.iter().map(Tensor::to_f32_vec).collect()
    };
    let expected = train(&session().compile(&step_of(None).trace, &arena).unwrap());
    for bucket_bytes in [1, 20_000, 25 << 20] {
        let step = step_of(Some(DataParallel::new(&c).bucket_bytes(bucket_bytes)));
        let dp = session().with_executor(NcclExecutor::of(comm.clone(), &c).shared());
        let plan = dp.compile(&step.trace, &arena).unwrap();
        assert!(plan.to_string().contains("nccl"), "{plan}");
        let got = train(&plan);
        for (p, (g, e)) in got.iter().zip(&expected).enumerate() {
            let diff = g.iter().zip(e).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(diff <= 1e-6, "{bucket_bytes}-byte buckets, parameter {p}: {diff}");
        }
    }
}

/// A rank whose peers never join does not hang: after its timeout the communicator is aborted
/// and the rank gets a typed error naming the wait.
#[test]
fn a_rank_whose_peers_never_join_fails_in_time() {
    use std::time::{Duration, Instant};
    let Some((gpu, _one)) = world_of_one("a_rank_whose_peers_never_join_fails_in_time") else { return };
    let id = boundscope::distributed::NcclId::new().unwrap();
    let start = Instant::now();
    let err = NcclCommunicator::with_timeout(gpu, "lonely", &id, 0, 2, Duration::from_secs(2)).unwrap_err();
    let waited = start.elapsed();
    println!("a lonely rank 0 of 2 gave up after {waited:?}: {err}");
    assert!(
        matches!(err, Error::Collective { .. }) && err.to_string().contains("the other ranks of 2 to join"),
        "{err}"
    );
    assert!(waited < Duration::from_secs(20), "{waited:?}");
}

/// A started `all_reduce` and its waits, captured into a graph: the capture fails unless the
/// run's stream joins the collectives' stream before it ends (the wait does), and replays give
/// the host executor's results, with a product queued between the start and the waits.
#[test]
fn started_all_reduces_and_their_waits_replay_in_a_graph() {
    let Some((gpu, comm)) = world_of_one("started_all_reduces_and_their_waits_replay_in_a_graph") else { return };
    let (registry, c) = registry();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[64, 64]).unwrap();
    let doubled = b.mul_scalar(x, 2.0).unwrap();
    let started = c.all_reduce_start(&mut b, doubled, ReduceOp::Mean).unwrap();
    let meanwhile = b.matmul(x, x).unwrap();
    let top = c.all_reduce_wait(&mut b, started, doubled, 0, &[32, 64]).unwrap();
    let bottom = c.all_reduce_wait(&mut b, started, doubled, 32 * 64, &[32, 64]).unwrap();
    let joined = b.concat(&[top, bottom], 0).unwrap();
    // A whole wait is a view of the started value (no copy): it only joins the streams.
    let whole = c.all_reduce_wait(&mut b, started, doubled, 0, &[64, 64]).unwrap();
    let y = b.add(joined, meanwhile).unwrap();
    let y = b.add(y, whole).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let executors = [NcclExecutor::new(comm, &c).shared(), Arc::new(CudaOps::new(gpu.clone())) as Arc<dyn Executor>];
    let plan = Plan::compile(&trace, &executors).unwrap();
    let views = plan.to_string().lines().filter(|l| l.contains("all_reduce_wait")).count();
    assert_eq!(views, 3, "{plan}");
    let host_comm = InProcessGroup::new("host", 1).unwrap().remove(0);
    let host = [CollectiveExecutor::new(host_comm, &c).shared(), boundscope::executors::CpuReference::shared()];
    let reference = Plan::compile(&trace, &host).unwrap();
    let data = Tensor::from_fn(&[64, 64], |i| ((i * 13) % 29) as f32 / 29.0 - 0.5);
    let expected = reference.run(&[&data]).unwrap()[0].to_f32_vec();
    let close = |got: &[f32], how: &str| {
        let diff = got.iter().zip(&expected).map(|(g, e)| (g - e).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-4, "{how}: {diff}");
    };
    close(&plan.run(&[&data]).unwrap()[0].to_f32_vec(), "stream run");
    let device: Arc<dyn Device> = gpu.clone();
    let mut input = DeviceTensor::upload(&device, data.view()).unwrap();
    let mut workspace = plan.workspace().unwrap();
    let mut graph = plan.capture(&mut workspace, vec![&mut input]).unwrap();
    for _ in 0..3 {
        close(&graph.replay().unwrap().to_host(0).unwrap().to_f32_vec(), "graph replay");
    }
}

/// A run that fails between an `all_reduce`'s start and its wait (a user's kernel returns an
/// error there) leaves nothing behind: the run's stream joins the collectives' stream as the
/// run leaves its workspace, and the next run in the same workspace gives the right result.
#[test]
fn a_run_that_fails_between_a_start_and_its_wait_leaves_the_next_run_right() {
    use boundscope::executors::cuda::{device_kernel, CudaKernel, CudaRun};
    use boundscope::{kernel_fn, ArgInfo, Category, DeviceKernel, OpView, ParamKind, RunInput, Symbol, TensorMeta};
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some((gpu, comm)) = world_of_one("a_run_that_fails_between_a_start_and_its_wait_leaves_the_next_run_right")
    else {
        return;
    };
    static FAIL: AtomicBool = AtomicBool::new(true);
    /// A copy on the GPU that fails while `FAIL` is set.
    struct MaybeFail;
    impl CudaKernel for MaybeFail {
        type State = ();
        fn new_state(&self, _run: &CudaRun<'_>) -> boundscope::Result<()> {
            Ok(())
        }
        fn run(&self, run: &mut CudaRun<'_>, _state: &mut ()) -> boundscope::Result<()> {
            if FAIL.load(Ordering::SeqCst) {
                return Err(run.error("failing on purpose"));
            }
            let x = run.input::<f32>(0)?;
            let stream = run.stream().clone();
            let mut y = run.output::<f32>(0)?;
            stream.memcpy_dtod(&x, &mut y).map_err(|e| run.error(e))
        }
    }
    struct Failing(Arc<CudaDevice>);
    impl Executor for Failing {
        fn name(&self) -> &str {
            "failing"
        }
        fn claims(&self, op: &OpView<'_>) -> bool {
            op.name() == "maybe_fail"
        }
        fn device(&self) -> Option<Arc<dyn Device>> {
            Some(self.0.clone())
        }
        fn compile_device(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn DeviceKernel>> {
            device_kernel(&self.0, "failing", op, MaybeFail)
        }
    }
    let (mut registry, c) = registry();
    registry
        .register(
            Symbol::new("maybe_fail", Category::Elementwise)
                .params(&[ParamKind::Tensor])
                .shape_rule(|args| match args {
                    [ArgInfo::Tensor { dtype, shape }] => Ok(TensorMeta::new(*dtype, shape)),
                    _ => Err("maybe_fail takes a tensor".into()),
                })
                .cpu_kernel(|_| {
                    Ok(kernel_fn(|inputs, outputs| {
                        outputs[0].values_mut::<f32>()?.copy_from_slice(inputs[0].values::<f32>()?);
                        Ok(())
                    }))
                }),
        )
        .unwrap();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[1 << 20]).unwrap();
    let doubled = b.mul_scalar(x, 2.0).unwrap();
    let started = c.all_reduce_start(&mut b, doubled, ReduceOp::Sum).unwrap();
    let copied = b.call("maybe_fail", &[x.into()]).unwrap();
    let waited = c.all_reduce_wait(&mut b, started, doubled, 0, &[1 << 20]).unwrap();
    let y = b.add(waited, copied).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let executors = [
        NcclExecutor::new(comm, &c).shared(),
        Arc::new(Failing(gpu.clone())) as Arc<dyn Executor>,
        Arc::new(CudaOps::new(gpu.clone())),
    ];
    let plan = Plan::compile(&trace, &executors).unwrap();
    let data = Tensor::from_fn(&[1 << 20], |i| (i % 101) as f32);
    let device: Arc<dyn Device> = gpu.clone();
    let input = DeviceTensor::upload(&device, data.view()).unwrap();
    let mut workspace = plan.workspace().unwrap();
    let err = plan.run_on_device(&mut workspace, &[RunInput::from(&input)]).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("failing on purpose"), "{err}");
    FAIL.store(false, Ordering::SeqCst);
    let out = plan.run_on_device(&mut workspace, &[RunInput::from(&input)]).unwrap().to_host(0).unwrap();
    let expected: Vec<f32> = data.to_f32_vec().iter().map(|v| 3.0 * v).collect();
    assert_eq!(out.to_f32_vec(), expected);
}
