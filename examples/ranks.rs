//! Several ranks as processes, started as `torchrun` starts them: a tensor-parallel MLP block
//! (Megatron-style: the first weight split by columns, the second by rows, one `all_reduce`)
//! on each rank, checked against the whole block.
//!
//! ```text
//! cargo run --release --example ranks -- --world 4
//! ```
//!
//! Run without `RANK` set, it is the launcher: it starts `--world` copies of itself (2 by
//! default) with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` set (a free
//! port on the loopback), waits for them and exits non-zero if any failed. Run with `RANK`
//! set (by this launcher or another), it is one rank: it joins the others over TCP
//! (`distributed::TcpGroup`), names its thread `rank <r>` for NVTX, runs its shard and prints
//! how far its result is from the whole block's.

use std::process::{Command, ExitCode};
use std::time::Duration;

use boundscope::distributed::{CollectiveExecutor, Collectives, Communicator, RankEnv, ReduceOp, TcpGroup};
use boundscope::executors::CpuReference;
use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};

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
            "--world" => {
                world = args
                    .next()
                    .and_then(|w| w.parse().ok())
                    .filter(|&w| w >= 1)
                    .ok_or("--world takes a number of ranks, at least 1")?
            }
            other => return Err(format!("unknown argument `{other}` (ranks [--world N])")),
        }
    }
    if !HIDDEN.is_multiple_of(world) {
        return Err(format!("the hidden width {HIDDEN} must divide by --world ({world})"));
    }
    // A free port on the loopback for rank 0 (released before rank 0 binds it: another process
    // may take it in between, and then rank 0 says so; run again).
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
    let program = std::env::current_exe().map_err(|e| e.to_string())?;
    let children: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(&program)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .spawn()
                .map_err(|e| format!("starting rank {rank}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    // Wait for all; when one fails, stop the others (they would wait for it until their
    // timeout).
    let mut children: Vec<Option<std::process::Child>> = children.into_iter().map(Some).collect();
    let mut failed = Vec::new();
    while children.iter().any(Option::is_some) && failed.is_empty() {
        for (rank, slot) in children.iter_mut().enumerate() {
            if let Some(status) = slot.as_mut().map(|c| c.try_wait()).transpose().map_err(|e| e.to_string())?.flatten()
            {
                if !status.success() {
                    failed.push(rank);
                }
                *slot = None;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for child in children.iter_mut().flatten() {
        let _ = child.kill();
        let _ = child.wait();
    }
    if failed.is_empty() {
        println!("{world} ranks agree with the whole block");
        Ok(())
    } else {
        Err(format!("ranks {failed:?} failed"))
    }
}

/// One rank: its shard of the block, the `all_reduce`, and the check against the whole block.
fn rank() -> Result<(), String> {
    let e = |e: boundscope::Error| e.to_string();
    let env = RankEnv::from_env().map_err(e)?;
    nvtx::name_current_thread(std::ffi::CString::new(format!("rank {}", env.rank)).unwrap_or_default());
    let comm = TcpGroup::from_rank_env("ranks", &env, Duration::from_secs(60)).map_err(e)?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let part = HIDDEN / world;
    let data = |n: usize, seed: usize| -> Vec<f32> {
        (0..n).map(|i| (((i * 37 + seed * 11) % 23) as f32 - 11.0) / 32.0).collect()
    };
    let (x, w1, w2, bias) = (data(TOKENS * D, 1), data(D * HIDDEN, 2), data(HIDDEN * D, 3), data(D, 4));

    let mut registry = Registry::with_builtins();
    let collectives = Collectives::register(&mut registry).map_err(e)?;
    let arena = Arena::new();
    let block = |hidden: usize, sharded: bool| -> boundscope::Result<boundscope::Trace<'_>> {
        let mut b = TraceBuilder::new(&arena, &registry);
        let (xi, w1i, w2i, bi) =
            (b.input(&[TOKENS, D])?, b.input(&[D, hidden])?, b.input(&[hidden, D])?, b.input(&[D])?);
        let h = b.matmul(xi, w1i)?;
        let h = b.gelu(h)?;
        let mut y = b.matmul(h, w2i)?;
        if sharded {
            y = collectives.all_reduce(&mut b, y, ReduceOp::Sum)?;
        }
        let y = b.add(y, bi)?;
        b.output(y)?;
        b.finish()
    };
    let t = |shape: &[usize], v: Vec<f32>| Tensor::new(shape, v);
    let whole = Plan::compile(&block(HIDDEN, false).map_err(e)?, &[CpuReference::shared()]).map_err(e)?;
    let inputs =
        [t(&[TOKENS, D], x.clone()), t(&[D, HIDDEN], w1.clone()), t(&[HIDDEN, D], w2.clone()), t(&[D], bias.clone())];
    let inputs: Vec<Tensor> = inputs.into_iter().collect::<Result<_, _>>().map_err(e)?;
    let expected = whole.run(&inputs.iter().collect::<Vec<_>>()).map_err(e)?[0].to_f32_vec();

    let executors = [CollectiveExecutor::new(comm, &collectives).shared(), CpuReference::shared()];
    let sharded = Plan::compile(&block(part, true).map_err(e)?, &executors).map_err(e)?;
    let w1_columns: Vec<f32> =
        (0..D).flat_map(|i| w1[i * HIDDEN + rank * part..i * HIDDEN + (rank + 1) * part].to_vec()).collect();
    let w2_rows = w2[rank * part * D..(rank + 1) * part * D].to_vec();
    let shard = [t(&[TOKENS, D], x), t(&[D, part], w1_columns), t(&[part, D], w2_rows), t(&[D], bias)];
    let shard: Vec<Tensor> = shard.into_iter().collect::<Result<_, _>>().map_err(e)?;
    let got = sharded.run(&shard.iter().collect::<Vec<_>>()).map_err(e)?[0].to_f32_vec();
    let diff = got.iter().zip(&expected).map(|(g, x)| (g - x).abs()).fold(0.0f32, f32::max);
    println!("rank {rank} of {world}: largest difference from the whole block {diff:.1e}");
    if diff > 1e-4 {
        return Err(format!("rank {rank}: the sharded block differs from the whole one by {diff}"));
    }
    Ok(())
}
