//! Several ranks as processes, started as `torchrun` starts them: a tensor-parallel MLP block
//! (Megatron-style: the first weight split by columns, the second by rows, one `all_reduce`)
//! on each rank, checked against the whole block.
//!
//! ```text
//! cargo run --release --example ranks -- --world 4           # CPU ranks, over TCP
//! ranks --world 2 --nccl                                      # one GPU per rank, through NCCL
//! ranks --world 2 --nccl --bench                              # and the figures (RESULT lines)
//! ```
//!
//! Run without `RANK` set, it is the launcher: it starts `--world` copies of itself (2 by
//! default) with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` set (a free
//! port on the loopback) and its own arguments, waits for them and exits non-zero if any
//! failed (stopping the others). Run with `RANK` set (by this launcher, `torchrun` or another),
//! it is one rank: it joins the others over TCP (`distributed::TcpGroup`), names its thread
//! `rank <r>` for NVTX, runs its shard and prints how far its result is from the whole block's.
//!
//! With `--nccl`, each rank runs on GPU `LOCAL_RANK`: the TCP group passes NCCL's id
//! (`NcclCommunicator::rendezvous`), the block runs on `CudaOps` with its `all_reduce` on
//! `NcclExecutor`, and the rank's streams are named `rank <r> ...` for Nsight Systems. With
//! `--bench` too, rank 0 prints `RESULT {json}` lines: the `all_reduce` of 256 MiB of `f32`
//! through a plan (algorithm and bus bandwidth, as `nccl-tests` and
//! `scripts/torch_all_reduce.py` count them) and a larger tensor-parallel block against the
//! whole block on one GPU. Keep `NCCL_NVLS_ENABLE=0` set (the launcher sets it).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boundscope::distributed::{
    Collective, CollectiveExecutor, Collectives, Communicator, NcclCommunicator, NcclExecutor, RankEnv, ReduceOp,
    TcpGroup,
};
use boundscope::executors::cuda::{CudaDevice, CudaOps};
use boundscope::executors::CpuReference;
#[path = "shared/launcher.rs"]
mod launcher;

use boundscope::{
    Arena, DType, Device, DeviceTensor, Executor, Plan, Registry, RunInput, Tensor, TensorMeta, Trace, TraceBuilder,
};

const D: usize = 64;
const HIDDEN: usize = 192;
const TOKENS: usize = 32;

fn main() -> ExitCode {
    let result = if std::env::var_os("RANK").is_some() { rank() } else { launch() };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts `--world` ranks of this program and waits for them.
fn launch() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut world = 2;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--nccl" | "--bench" => {}
            "--world" => {
                world = args
                    .next()
                    .and_then(|w| w.parse().ok())
                    .filter(|&w| w >= 1)
                    .ok_or("--world takes a number of ranks, at least 1")?
            }
            other => return Err(format!("unknown argument `{other}` (ranks [--world N] [--nccl [--bench]])")),
        }
    }
    if !HIDDEN.is_multiple_of(world) {
        return Err(format!("the hidden width {HIDDEN} must divide by --world ({world})"));
    }
    launcher::launch(world)?;
    println!("{world} ranks agree with the whole block");
    Ok(())
}

/// One rank: its shard of the block, the `all_reduce`, and the check against the whole block;
/// with `--nccl --bench`, the figures.
fn rank() -> Result<(), String> {
    let e = |e: boundscope::Error| e.to_string();
    let flag = |name: &str| std::env::args().any(|a| a == name);
    let (on_gpu, bench) = (flag("--nccl"), flag("--bench"));
    let env = RankEnv::from_env().map_err(e)?;
    nvtx::name_current_thread(std::ffi::CString::new(format!("rank {}", env.rank)).unwrap_or_default());
    let tcp = Arc::new(TcpGroup::from_rank_env("ranks", &env, Duration::from_secs(60)).map_err(e)?);
    let (rank, world) = (tcp.rank(), tcp.world_size());
    let mut registry = Registry::with_builtins();
    let collectives = Collectives::register(&mut registry).map_err(e)?;
    let arena = Arena::new();
    let block = Block { arena: &arena, registry: &registry, collectives: &collectives };

    let (executors, gpu): (Vec<Arc<dyn Executor>>, _) = if on_gpu {
        let gpu = CudaDevice::with_ordinal(env.local_rank).map_err(e)?;
        gpu.name_streams(format!("rank {rank}"));
        let nccl = NcclCommunicator::rendezvous(gpu.clone(), "ranks", &*tcp).map_err(e)?;
        // A rank that fails or hangs aborts the others' collectives after a minute.
        nccl.watch(Duration::from_secs(60)).map_err(e)?;
        (vec![NcclExecutor::new(nccl, &collectives).shared(), Arc::new(CudaOps::new(gpu.clone()))], Some(gpu))
    } else {
        let host: Arc<dyn Communicator> = tcp.clone();
        (vec![CollectiveExecutor::of(host, &collectives).shared(), CpuReference::shared()], None)
    };

    // The whole block on the CPU reference, this rank's shard on its executors.
    let (tokens, d, hidden) = (TOKENS, D, HIDDEN);
    let part = hidden / world;
    let whole =
        Plan::compile(&block.trace(tokens, d, hidden, false, DType::F32).map_err(e)?, &[CpuReference::shared()])
            .map_err(e)?;
    let inputs = block.inputs(tokens, d, hidden);
    let expected = whole.run(&inputs.iter().collect::<Vec<_>>()).map_err(e)?[0].to_f32_vec();
    let sharded = Plan::compile(&block.trace(tokens, d, part, true, DType::F32).map_err(e)?, &executors).map_err(e)?;
    let shard = shard_of(&inputs, rank, world);
    let got = sharded.run(&shard.iter().collect::<Vec<_>>()).map_err(e)?[0].to_f32_vec();
    let diff = got.iter().zip(&expected).map(|(g, x)| (g - x).abs()).fold(0.0f32, f32::max);
    println!("rank {rank} of {world}: largest difference from the whole block {diff:.1e}");
    if diff > 1e-4 {
        return Err(format!("rank {rank}: the sharded block differs from the whole one by {diff}"));
    }
    match gpu {
        Some(gpu) if bench => measure(&gpu, &tcp, &block, &executors).map_err(e),
        _ => Ok(()),
    }
}

/// The tensor-parallel MLP block's traces and data.
struct Block<'a> {
    arena: &'a Arena,
    registry: &'a Registry,
    collectives: &'a Collectives,
}

impl<'a> Block<'a> {
    /// `gelu(x w1) w2 + bias`, with `x [tokens, d]`, `w1 [d, hidden]`, `w2 [hidden, d]`; a shard
    /// (`hidden` a part of the whole) sums its partial product over the ranks before the bias.
    fn trace(
        &self,
        tokens: usize,
        d: usize,
        hidden: usize,
        sharded: bool,
        dtype: DType,
    ) -> boundscope::Result<Trace<'a>> {
        let mut b = TraceBuilder::new(self.arena, self.registry);
        let input = |b: &mut TraceBuilder<'a>, shape: &[usize]| b.input_with(&TensorMeta::new(dtype, shape));
        let (x, w1, w2, bias) = (
            input(&mut b, &[tokens, d])?,
            input(&mut b, &[d, hidden])?,
            input(&mut b, &[hidden, d])?,
            input(&mut b, &[d])?,
        );
        let h = b.matmul(x, w1)?;
        let h = b.gelu(h)?;
        let mut y = b.matmul(h, w2)?;
        if sharded {
            y = self.collectives.all_reduce(&mut b, y, ReduceOp::Sum)?;
        }
        let y = b.add(y, bias)?;
        b.output(y)?;
        b.finish()
    }

    /// The whole block's `x`, `w1`, `w2` and bias.
    fn inputs(&self, tokens: usize, d: usize, hidden: usize) -> Vec<Tensor> {
        let data = |shape: &[usize], seed: usize| {
            Tensor::from_fn(shape, |i| (((i * 37 + seed * 11) % 23) as f32 - 11.0) / 32.0 / (d as f32).sqrt())
        };
        vec![data(&[tokens, d], 1), data(&[d, hidden], 2), data(&[hidden, d], 3), data(&[d], 4)]
    }
}

/// Rank `rank`'s shard of the block's inputs: `w1`'s columns and `w2`'s rows of its part.
fn shard_of(inputs: &[Tensor], rank: usize, world: usize) -> Vec<Tensor> {
    let (w1, w2) = (inputs[1].to_f32_vec(), inputs[2].to_f32_vec());
    let (d, hidden) = (inputs[1].shape()[0], inputs[1].shape()[1]);
    let part = hidden / world;
    let columns = Tensor::from_fn(&[d, part], |i| w1[(i / part) * hidden + rank * part + i % part]);
    let rows = Tensor::new(&[part, d], w2[rank * part * d..(rank + 1) * part * d].to_vec()).expect("its length");
    let dtype = inputs[0].dtype();
    vec![inputs[0].clone(), columns.to_dtype(dtype), rows.to_dtype(dtype), inputs[3].clone()]
}

/// Milliseconds per run of `plan` on device-resident `inputs`, over `runs` runs after three
/// warm-up runs (the ranks start together).
fn ms_per_run(
    gpu: &Arc<CudaDevice>,
    tcp: &TcpGroup,
    plan: &Plan,
    inputs: &[Tensor],
    runs: usize,
) -> boundscope::Result<f64> {
    let device: Arc<dyn Device> = gpu.clone();
    let uploaded: Vec<DeviceTensor> =
        inputs.iter().map(|t| DeviceTensor::upload(&device, t.view())).collect::<boundscope::Result<_>>()?;
    let run_inputs: Vec<RunInput<'_>> = uploaded.iter().map(RunInput::from).collect();
    let mut workspace = plan.workspace()?;
    for _ in 0..3 {
        plan.run_on_device(&mut workspace, &run_inputs)?;
    }
    device.synchronize()?;
    barrier(tcp)?;
    let start = Instant::now();
    for _ in 0..runs {
        plan.run_on_device(&mut workspace, &run_inputs)?;
    }
    device.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e3 / runs as f64)
}

/// Waits for every rank (a one-value `all_reduce` over TCP).
fn barrier(tcp: &TcpGroup) -> boundscope::Result<()> {
    tcp.run(Collective::AllReduce(ReduceOp::Sum), &[0.0], &mut [0.0])
}

/// The figures, printed by rank 0: `all_reduce` of 256 MiB, and a bf16 tensor-parallel block
/// against the whole block on one GPU.
fn measure(
    gpu: &Arc<CudaDevice>,
    tcp: &TcpGroup,
    block: &Block<'_>,
    executors: &[Arc<dyn Executor>],
) -> boundscope::Result<()> {
    let (rank, world) = (tcp.rank(), tcp.world_size());
    let len = 64 << 20;
    let mut b = TraceBuilder::new(block.arena, block.registry);
    let x = b.input(&[len])?;
    let y = block.collectives.all_reduce(&mut b, x, ReduceOp::Sum)?;
    b.output(y)?;
    let all_reduce = Plan::compile(&b.finish()?, executors)?;
    let ms = ms_per_run(gpu, tcp, &all_reduce, &[Tensor::from_fn(&[len], |i| (i % 7) as f32)], 20)?;
    let bytes = (len * 4) as f64;
    let algbw = bytes / (ms * 1e-3) / 1e9;
    let busbw = algbw * 2.0 * (world - 1) as f64 / world as f64;
    if rank == 0 {
        println!(
            "RESULT {{\"impl\": \"boundscope\", \"bench\": \"all_reduce\", \"world\": {world}, \"bytes\": {bytes}, \
             \"ms\": {ms:.4}, \"algbw_gbps\": {algbw:.1}, \"busbw_gbps\": {busbw:.1}}}"
        );
    }
    // A transformer-sized block in bf16: the whole on one GPU, a shard per rank.
    let (tokens, d, hidden) = (8192, 4096, 16384);
    let inputs: Vec<Tensor> = block.inputs(tokens, d, hidden).iter().map(|t| t.to_dtype(DType::BF16)).collect();
    let whole = Plan::compile(&block.trace(tokens, d, hidden, false, DType::BF16)?, &executors[1..])?;
    let whole_ms = ms_per_run(gpu, tcp, &whole, &inputs, 10)?;
    let sharded = Plan::compile(&block.trace(tokens, d, hidden / world, true, DType::BF16)?, executors)?;
    let sharded_ms = ms_per_run(gpu, tcp, &sharded, &shard_of(&inputs, rank, world), 10)?;
    if rank == 0 {
        println!(
            "RESULT {{\"impl\": \"boundscope\", \"bench\": \"tensor_parallel_mlp\", \"world\": {world}, \
             \"shape\": [{tokens}, {d}, {hidden}], \"whole_ms\": {whole_ms:.3}, \"sharded_ms\": {sharded_ms:.3}, \
             \"ratio\": {:.3}}}",
            sharded_ms / whole_ms
        );
    }
    Ok(())
}
