use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::core::ir::{Arena, Registry, Trace, TraceBuilder};
use crate::executors::CpuReference;
use crate::guards::{Level, NvtxRange, Selection};
use crate::passes::{Grad, Pass, ProfileOps};
use crate::{Error, Executor, Plan, PushedBy, Tensor};

/// How the ranks of a test talk: threads of one group, or TCP on the loopback.
#[derive(Clone, Copy, Debug)]
enum Transport {
    InProcess,
    Tcp,
}

/// `world` communicators, made by `use_rank(rank, communicator)` inside `world` threads (a TCP
/// group's ranks must connect at the same time): each thread's result.
fn with_ranks<R: Send>(
    transport: Transport,
    world: usize,
    use_rank: impl Fn(usize, Arc<dyn Communicator>) -> R + Sync,
) -> Vec<R> {
    let timeout = Duration::from_secs(20);
    let mut in_process: Vec<Option<InProcessGroup>> = match transport {
        Transport::InProcess => InProcessGroup::new("test", world).unwrap().into_iter().map(Some).collect(),
        Transport::Tcp => (0..world).map(|_| None).collect(),
    };
    let listener = std::sync::Mutex::new(Some(std::net::TcpListener::bind("127.0.0.1:0").unwrap()));
    let address = listener.lock().unwrap().as_ref().unwrap().local_addr().unwrap().to_string();
    thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (use_rank, listener, address) = (&use_rank, &listener, &address);
                let own = in_process[rank].take();
                s.spawn(move || {
                    let comm: Arc<dyn Communicator> = match (own, rank) {
                        (Some(group), _) => Arc::new(group),
                        (None, 0) => {
                            let l = listener.lock().unwrap().take().unwrap();
                            Arc::new(TcpGroup::serve("test", l, world, timeout).unwrap())
                        }
                        (None, _) => Arc::new(TcpGroup::join("test", address, rank, world, timeout).unwrap()),
                    };
                    use_rank(rank, comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs `trace` on `world` ranks, rank `r` with `inputs(r)`: each rank's outputs.
fn on_ranks(
    transport: Transport,
    trace: &Trace<'_>,
    collectives: &Collectives,
    world: usize,
    inputs: impl Fn(usize) -> Vec<Tensor> + Sync,
) -> Vec<crate::Result<Vec<Tensor>>> {
    with_ranks(transport, world, |rank, comm| {
        let executors = [CollectiveExecutor::of(comm, collectives).shared(), CpuReference::shared()];
        let plan = Plan::compile(trace, &executors)?;
        let mine = inputs(rank);
        let refs: Vec<&Tensor> = mine.iter().collect();
        plan.run(&refs)
    })
}

fn registry_with_collectives() -> (Registry, Collectives) {
    let mut registry = Registry::with_builtins();
    let collectives = Collectives::register(&mut registry).unwrap();
    (registry, collectives)
}

#[test]
fn every_collective_gives_every_rank_what_nccl_would() {
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[6, 2]).unwrap();
    let outputs = [
        c.all_reduce(&mut b, x, ReduceOp::Sum).unwrap(),
        c.all_reduce(&mut b, x, ReduceOp::Mean).unwrap(),
        c.all_reduce(&mut b, x, ReduceOp::Max).unwrap(),
        c.all_gather(&mut b, x, 3).unwrap(),
        c.reduce_scatter(&mut b, x, ReduceOp::Sum, 3).unwrap(),
        c.broadcast(&mut b, x, 2).unwrap(),
    ];
    for o in outputs {
        b.output(o).unwrap();
    }
    let trace = b.finish().unwrap();
    // Rank r holds r * 100 + i at element i; rank 1 has a NaN at element 5.
    let value = |r: usize, i: usize| if r == 1 && i == 5 { f32::NAN } else { (r * 100 + i) as f32 };
    let input = |r: usize| vec![Tensor::new(&[6, 2], (0..12).map(|i| value(r, i)).collect()).unwrap()];
    let sum = |i: usize| (0..3).map(|r| value(r, i)).sum::<f32>();
    let mut results = on_ranks(Transport::InProcess, &trace, &c, 3, input);
    results.extend(on_ranks(Transport::Tcp, &trace, &c, 3, input));
    assert_eq!(results.len(), 6);
    for (i, result) in results.into_iter().enumerate() {
        let rank = i % 3;
        let out: Vec<Vec<f32>> = result.unwrap().iter().map(Tensor::to_f32_vec).collect();
        let same = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y || x.is_nan() && y.is_nan())
        };
        let expected_sum: Vec<f32> = (0..12).map(sum).collect();
        assert!(same(&out[0], &expected_sum), "rank {rank}: {:?}", out[0]);
        assert!(same(&out[1], &expected_sum.iter().map(|s| s / 3.0).collect::<Vec<_>>()), "{:?}", out[1]);
        let max: Vec<f32> = (0..12).map(|i| if i == 5 { f32::NAN } else { value(2, i) }).collect();
        assert!(same(&out[2], &max), "a NaN on any rank is the maximum: {:?}", out[2]);
        let gathered: Vec<f32> = (0..3).flat_map(|r| (0..12).map(move |i| value(r, i))).collect();
        assert!(same(&out[3], &gathered), "{:?}", out[3]);
        // Rank r gets rows 2r and 2r + 1 of the sum.
        assert!(same(&out[4], &expected_sum[rank * 4..rank * 4 + 4]), "rank {rank}: {:?}", out[4]);
        assert!(same(&out[5], &(0..12).map(|i| value(2, i)).collect::<Vec<_>>()), "{:?}", out[5]);
    }
    let shapes: Vec<Vec<usize>> = outputs.iter().map(|&o| trace.value_meta(o).unwrap().shape.to_vec()).collect();
    assert_eq!(shapes, [vec![6, 2], vec![6, 2], vec![6, 2], vec![18, 2], vec![2, 2], vec![6, 2]]);
}

/// 16-bit collectives combine in `f32` and round once: a bf16 sum over 3 ranks is the `f32`
/// sum of the widened values rounded to bf16 (not bf16 rounded at each step), and gathers
/// move the bits unchanged.
#[test]
fn sixteen_bit_collectives_combine_in_f32_and_round_once() {
    use crate::DType;
    let (registry, c) = registry_with_collectives();
    for dtype in [DType::BF16, DType::F16] {
        let arena = Arena::new();
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input_with(&crate::TensorMeta::new(dtype, &[4, 2])).unwrap();
        let sum = c.all_reduce(&mut b, x, ReduceOp::Sum).unwrap();
        let gathered = c.all_gather(&mut b, x, 3).unwrap();
        b.output(sum).unwrap();
        b.output(gathered).unwrap();
        let trace = b.finish().unwrap();
        // Values whose sum rounded at each step differs from the sum rounded once: 256 + 1 + 1
        // is 256 step by step in bf16 (8 bits), 258 once; 2048 + 1 + 1 is 2048 step by step in
        // f16 (11 bits), 2050 once.
        let big = if dtype == DType::BF16 { 256.0 } else { 2048.0 };
        let value = |r: usize, i: usize| if i == 0 { [big, 1.0, 1.0][r] } else { (r * 8 + i) as f32 * 0.37 };
        let input =
            |r: usize| vec![Tensor::new(&[4, 2], (0..8).map(|i| value(r, i)).collect()).unwrap().to_dtype(dtype)];
        let widened = |r: usize, i: usize| input(r)[0].to_f32_vec()[i];
        for result in on_ranks(Transport::InProcess, &trace, &c, 3, input) {
            let out = result.unwrap();
            assert_eq!(out[0].dtype(), dtype);
            let expected: Vec<f32> = (0..8).map(|i| (0..3).map(|r| widened(r, i)).sum::<f32>()).collect();
            let expected = Tensor::new(&[4, 2], expected).unwrap().to_dtype(dtype).to_f32_vec();
            assert_eq!(out[0].to_f32_vec(), expected, "{dtype}");
            assert_eq!(out[0].to_f32_vec()[0], big + 2.0, "{dtype}: rounded once");
            let gathered: Vec<f32> = (0..3).flat_map(|r| input(r)[0].to_f32_vec()).collect();
            assert_eq!(out[1].to_f32_vec(), gathered, "{dtype}");
        }
    }
}

/// A Megatron-style MLP block on `world` ranks: the first weight split by columns, the second
/// by rows, one `all_reduce` of the partial products, the bias added once after it.
#[test]
fn a_tensor_parallel_mlp_block_equals_the_whole_one() {
    let (d, hidden, tokens) = (8, 16, 5);
    let data = |n: usize, seed: usize| {
        (0..n).map(|i| (((i * 37 + seed * 11) % 23) as f32 - 11.0) / 16.0).collect::<Vec<f32>>()
    };
    let (x, w1, w2, bias) = (data(tokens * d, 1), data(d * hidden, 2), data(hidden * d, 3), data(d, 4));
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let whole = {
        let mut b = TraceBuilder::new(&arena, &registry);
        let (xi, w1i, w2i, bi) = (
            b.input(&[tokens, d]).unwrap(),
            b.input(&[d, hidden]).unwrap(),
            b.input(&[hidden, d]).unwrap(),
            b.input(&[d]).unwrap(),
        );
        let h = b.matmul(xi, w1i).unwrap();
        let h = b.gelu(h).unwrap();
        let y = b.matmul(h, w2i).unwrap();
        let y = b.add(y, bi).unwrap();
        b.output(y).unwrap();
        b.finish().unwrap()
    };
    let t = |shape: &[usize], v: &[f32]| Tensor::new(shape, v.to_vec()).unwrap();
    let expected = Plan::compile(&whole, &[CpuReference::shared()])
        .unwrap()
        .run(&[&t(&[tokens, d], &x), &t(&[d, hidden], &w1), &t(&[hidden, d], &w2), &t(&[d], &bias)])
        .unwrap()[0]
        .to_f32_vec();
    for world in [2, 4] {
        let part = hidden / world;
        let mut b = TraceBuilder::new(&arena, &registry);
        let (xi, w1i, w2i, bi) = (
            b.input(&[tokens, d]).unwrap(),
            b.input(&[d, part]).unwrap(),
            b.input(&[part, d]).unwrap(),
            b.input(&[d]).unwrap(),
        );
        let h = b.matmul(xi, w1i).unwrap();
        let h = b.gelu(h).unwrap();
        let partial = b.matmul(h, w2i).unwrap();
        let y = c.all_reduce(&mut b, partial, ReduceOp::Sum).unwrap();
        let y = b.add(y, bi).unwrap();
        b.output(y).unwrap();
        let sharded = b.finish().unwrap();
        let transport = if world == 2 { Transport::Tcp } else { Transport::InProcess };
        let results = on_ranks(transport, &sharded, &c, world, |r| {
            // Columns r*part.. of w1 ([d, hidden], row-major), rows r*part.. of w2.
            let w1_cols: Vec<f32> =
                (0..d).flat_map(|i| w1[i * hidden + r * part..i * hidden + (r + 1) * part].to_vec()).collect();
            let w2_rows = w2[r * part * d..(r + 1) * part * d].to_vec();
            vec![t(&[tokens, d], &x), t(&[d, part], &w1_cols), t(&[part, d], &w2_rows), t(&[d], &bias)]
        });
        let first = results[0].as_ref().unwrap()[0].to_f32_vec();
        for (rank, result) in results.iter().enumerate() {
            let got = result.as_ref().unwrap()[0].to_f32_vec();
            assert_eq!(got, first, "every rank gets the same bits (rank {rank} of {world})");
            let diff = got.iter().zip(&expected).map(|(g, e)| (g - e).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-5, "{world} ranks, {transport:?}: {diff}");
        }
    }
}

#[test]
fn ranks_that_disagree_all_get_a_typed_error() {
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let trace_of = |n: usize| {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[n]).unwrap();
        let y = c.all_reduce(&mut b, x, ReduceOp::Sum).unwrap();
        b.output(y).unwrap();
        b.finish().unwrap()
    };
    let (four, three) = (trace_of(4), trace_of(3));
    let run = |rank: usize, comm: Arc<dyn Communicator>| {
        let (trace, n) = if rank == 0 { (&four, 4) } else { (&three, 3) };
        let plan = Plan::compile(trace, &[CollectiveExecutor::of(comm, &c).shared()]).unwrap();
        plan.run(&[&Tensor::new(&[n], vec![1.0; n]).unwrap()]).unwrap_err()
    };
    let mut errors = with_ranks(Transport::InProcess, 2, run);
    errors.extend(with_ranks(Transport::Tcp, 2, run));
    for (i, e) in errors.iter().enumerate() {
        let text = e.to_string();
        assert!(matches!(e, Error::Collective { rank: r, .. } if *r == i % 2), "{e:?}");
        assert!(text.contains("rank 0: all_reduce(sum) of 4 values, rank 1: all_reduce(sum) of 3 values"), "{text}");
    }
}

#[test]
fn a_rank_that_never_arrives_fails_the_others_in_time_and_aborts_the_group() {
    let mut ranks = InProcessGroup::with_timeout("hang", 2, Duration::from_millis(200)).unwrap();
    let late = ranks.pop().unwrap();
    let early = ranks.pop().unwrap();
    let start = Instant::now();
    let err = early.run(Collective::AllReduce(ReduceOp::Sum), &[1.0], &mut [0.0]).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    let text = err.to_string();
    assert!(text.contains("for ranks [1], which did not arrive") && text.contains("aborted"), "{text}");
    // The group stays aborted: the late rank fails at once rather than waiting for rank 0.
    let start = Instant::now();
    let err = late.run(Collective::AllReduce(ReduceOp::Sum), &[1.0], &mut [0.0]).unwrap_err();
    assert!(start.elapsed() < Duration::from_millis(150), "{:?}", start.elapsed());
    assert!(matches!(err, Error::Collective { rank: 1, .. }), "{err:?}");
}

#[test]
fn bad_collectives_are_typed_errors_before_anything_runs() {
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[3, 2]).unwrap();
    let err = c.reduce_scatter(&mut b, x, ReduceOp::Sum, 2).unwrap_err().to_string();
    assert!(err.contains("multiple of the world size"), "{err}");
    let ids = b.input_with(&crate::TensorMeta::new(crate::DType::I64, &[4])).unwrap();
    let err = c.all_reduce(&mut b, ids, ReduceOp::Sum).unwrap_err().to_string();
    assert!(err.contains("f32, bf16 or f16 tensors, not i64") && err.contains("cast it"), "{err}");
    assert!(c.all_gather(&mut b, x, 0).unwrap_err().to_string().contains("world size must be a whole number"));
    // Registered once per registry.
    let mut again = Registry::with_builtins();
    Collectives::register(&mut again).unwrap();
    assert!(matches!(Collectives::register(&mut again), Err(Error::DuplicateSymbol { .. })));

    // A trace built for another world size, a broadcast root outside the world, no executor.
    let gathered = c.all_gather(&mut b, x, 4).unwrap();
    b.output(gathered).unwrap();
    let trace = b.finish().unwrap();
    let comm = InProcessGroup::new("two", 2).unwrap().remove(0);
    let err = Plan::compile(&trace, &[CollectiveExecutor::new(comm, &c).shared()]).unwrap_err().to_string();
    assert!(err.contains("built for a world of 4 ranks, but communicator `two` has 2"), "{err}");
    let err = Plan::compile(&trace, &[CpuReference::shared()]).unwrap_err();
    assert!(matches!(&err, Error::NoExecutor { .. }) && err.to_string().contains("all_gather"), "{err}");
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[3]).unwrap();
    let y = c.broadcast(&mut b, x, 5).unwrap();
    b.output(y).unwrap();
    let comm = InProcessGroup::new("two", 2).unwrap().remove(0);
    let err =
        Plan::compile(&b.finish().unwrap(), &[CollectiveExecutor::new(comm, &c).shared()]).unwrap_err().to_string();
    assert!(err.contains("broadcast from rank 5, but the world has ranks 0 to 1"), "{err}");
}

/// The gradients of the sum of the ranks' losses, through `all_reduce`, `all_gather` and
/// `reduce_scatter` (their rules bind collectives in the backward, which every rank runs in
/// the same order), against the closed form; the maxima and `broadcast` have none yet.
#[test]
fn gradients_flow_through_collectives_as_those_of_the_ranks_summed_losses() {
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let (x, w, k) = (b.input(&[4]).unwrap(), b.input(&[4]).unwrap(), b.input(&[4]).unwrap());
    let h = b.mul(x, w).unwrap();
    let y = c.all_reduce(&mut b, h, ReduceOp::Sum).unwrap();
    let g = c.all_gather(&mut b, y, 2).unwrap();
    let g2 = b.mul(g, g).unwrap();
    let q = c.reduce_scatter(&mut b, g2, ReduceOp::Sum, 2).unwrap();
    let weighted = b.mul(q, k).unwrap();
    let loss = b.sum(weighted).unwrap();
    b.output(loss).unwrap();
    let grads = Grad::new(&[w]).run(&b.finish().unwrap(), &arena).unwrap();
    let values =
        |r: usize, seed: usize| (0..4).map(|i| ((i * 7 + r * 3 + seed) % 5) as f32 / 4.0 - 0.4).collect::<Vec<f32>>();
    let results = on_ranks(Transport::InProcess, &grads, &c, 2, |r| {
        (0..3).map(|seed| Tensor::new(&[4], values(r, seed)).unwrap()).collect()
    });
    // y = x0 w0 + x1 w1; every rank's q is 2 y^2, so the total loss is 2 sum(y^2 (k0 + k1)) and
    // its gradient by w_r is 4 y (k0 + k1) x_r.
    let (x0, w0, k0, x1, w1, k1) = (values(0, 0), values(0, 1), values(0, 2), values(1, 0), values(1, 1), values(1, 2));
    for (r, result) in results.into_iter().enumerate() {
        let got = result.unwrap()[1].to_f32_vec();
        let xr = if r == 0 { &x0 } else { &x1 };
        for i in 0..4 {
            let y = x0[i] * w0[i] + x1[i] * w1[i];
            let expected = 4.0 * y * (k0[i] + k1[i]) * xr[i];
            assert!((got[i] - expected).abs() < 1e-5, "rank {r}, element {i}: {} against {expected}", got[i]);
        }
    }
    for without in ["all_reduce_max", "broadcast"] {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[3]).unwrap();
        let y = if without == "broadcast" {
            c.broadcast(&mut b, x, 0).unwrap()
        } else {
            c.all_reduce(&mut b, x, ReduceOp::Max).unwrap()
        };
        let loss = b.sum(y).unwrap();
        b.output(loss).unwrap();
        let err = Grad::new(&[x]).run(&b.finish().unwrap(), &arena).unwrap_err();
        assert!(matches!(&err, Error::NoGradient { .. }) && err.to_string().contains(without), "{err}");
    }
}

#[test]
fn the_executor_pushes_one_op_range_per_collective_in_its_domain() {
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let y = b.exp(x).unwrap();
    let y = c.all_reduce(&mut b, y, ReduceOp::Mean).unwrap();
    b.output(y).unwrap();
    let mut profiled = ProfileOps::new().run(&b.finish().unwrap(), &arena).unwrap();
    profiled.attach_guard(Selection::All, NvtxRange::new().domain("collectives").unwrap()).unwrap();
    let comm = InProcessGroup::new("solo", 1).unwrap().remove(0);
    let executor: Arc<dyn Executor> = CollectiveExecutor::new(comm, &c).shared();
    let plan = Plan::compile(&profiled, &[executor, CpuReference::shared()]).unwrap();
    let ranges = plan.range_map().ranges();
    let in_domain = |label: &str, domain: &str| {
        ranges
            .iter()
            .filter(|r| r.label == label && r.domain == domain)
            .map(|r| (r.level, r.pushed_by.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(in_domain("all_reduce_mean", "collectives"), [(Level::Op, PushedBy::Executor("collectives".into()))]);
    assert_eq!(in_domain("all_reduce_mean", "boundscope"), [(Level::Op, PushedBy::Runtime)]);
    assert_eq!(in_domain("exp", "collectives"), [(Level::Op, PushedBy::Runtime)]);
    // A world of one rank: the collective is the identity, and runs.
    let out = plan.run(&[&Tensor::new(&[4], vec![0.0; 4]).unwrap()]).unwrap();
    assert_eq!(out[0].to_f32_vec(), vec![1.0; 4]);
}

#[test]
fn a_tcp_rank_that_never_sends_fails_the_others_in_time() {
    let timeout = Duration::from_millis(300);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let silent = thread::spawn(move || TcpGroup::join("hang", &address, 1, 2, timeout).unwrap());
    let rank0 = TcpGroup::serve("hang", listener, 2, timeout).unwrap();
    let rank1 = silent.join().unwrap();
    let start = Instant::now();
    let err = rank0.run(Collective::AllReduce(ReduceOp::Sum), &[1.0], &mut [0.0]).unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(err.contains("rank 1 did not send its part of all_reduce(sum)") && err.contains("aborted"), "{err}");
    // Rank 0 closed the connection: rank 1 learns at once, and both stay aborted.
    let start = Instant::now();
    let err = rank1.run(Collective::AllReduce(ReduceOp::Sum), &[1.0], &mut [0.0]).unwrap_err();
    assert!(start.elapsed() < Duration::from_millis(250), "{:?}", start.elapsed());
    assert!(matches!(err, Error::Collective { rank: 1, .. }), "{err:?}");
    assert!(rank0.run(Collective::AllGather, &[1.0], &mut [0.0; 2]).unwrap_err().to_string().contains("aborted"));
}

#[test]
fn tcp_ranks_of_another_world_or_missing_are_refused() {
    let timeout = Duration::from_secs(5);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let stranger = thread::spawn(move || TcpGroup::join("w", &address, 1, 3, timeout).err().map(|e| e.to_string()));
    let err = TcpGroup::serve("w", listener, 2, timeout).err().unwrap().to_string();
    assert!(err.contains("rank 1 joined expecting 3 ranks, but this group has 2"), "{err}");
    assert!(stranger.join().unwrap().unwrap().contains("refused"));
    // Nobody joins: rank 0 says who is missing, in time.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let err = TcpGroup::serve("w", listener, 3, Duration::from_millis(100)).err().unwrap().to_string();
    assert!(err.contains("ranks [1, 2] did not connect"), "{err}");
    let err = RankEnv::from_vars(|n| match n {
        "RANK" => Some("2".into()),
        "WORLD_SIZE" => Some("2".into()),
        _ => None,
    })
    .unwrap_err();
    assert!(matches!(err, Error::InvalidEnvironment { .. }) && err.to_string().contains("from 0 to 1"), "{err}");
}

/// A rank that cannot run a collective (a length the world does not divide, a wrong output)
/// still takes part: every rank fails at once with its reason, and the group goes on.
#[test]
fn a_rank_that_cannot_run_a_collective_fails_every_rank_at_once() {
    for transport in [Transport::InProcess, Transport::Tcp] {
        let outcomes = with_ranks(transport, 2, |rank, comm| {
            let start = Instant::now();
            let n = if rank == 0 { 4 } else { 3 };
            let err = comm.run(Collective::ReduceScatter(ReduceOp::Sum), &vec![1.0; n], &mut [0.0; 2]).unwrap_err();
            let elapsed = start.elapsed();
            let mut out = [0.0; 2];
            comm.run(Collective::AllReduce(ReduceOp::Sum), &[1.0, rank as f32], &mut out).unwrap();
            (err.to_string(), elapsed, out)
        });
        for (rank, (err, elapsed, out)) in outcomes.into_iter().enumerate() {
            assert!(
                err.contains("rank 1: reduce_scatter splits its input in 2 equal parts"),
                "{transport:?} {rank}: {err}"
            );
            assert!(elapsed < Duration::from_secs(5), "{transport:?}: {elapsed:?}");
            assert_eq!(out, [2.0, 1.0], "{transport:?}: the group is still usable");
        }
    }
}

#[test]
fn extreme_sizes_and_timeouts_are_errors_not_panics() {
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[1 << 60, 0]).unwrap();
    let err = c.all_gather(&mut b, x, 16).unwrap_err().to_string();
    assert!(err.contains("overflows"), "{err}");
    // "Wait for ever" is a year, not an overflow.
    let solo = InProcessGroup::with_timeout("forever", 1, Duration::MAX).unwrap().remove(0);
    let mut out = [0.0];
    solo.run(Collective::Broadcast { root: 0 }, &[3.0], &mut out).unwrap();
    assert_eq!(out, [3.0]);
}

/// A stray connection (another program on the port) is dropped and the ranks still meet; a
/// group of 0 ranks and bad variables are typed errors.
#[test]
fn tcp_rendezvous_drops_strangers_and_refuses_nonsense() {
    use std::io::Write;
    let timeout = Duration::from_secs(10);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let stranger_address = address.clone();
    let stranger = thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(&stranger_address).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
        thread::sleep(Duration::from_millis(50));
        TcpGroup::join("meet", &stranger_address, 1, 2, timeout).unwrap()
    });
    let rank0 = TcpGroup::serve("meet", listener, 2, timeout).unwrap();
    let rank1 = stranger.join().unwrap();
    let two = thread::spawn(move || {
        let mut out = [0.0; 2];
        rank1.run(Collective::AllGather, &[1.0], &mut out).unwrap();
        out
    });
    let mut out = [0.0; 2];
    rank0.run(Collective::AllGather, &[0.0], &mut out).unwrap();
    assert_eq!((out, two.join().unwrap()), ([0.0, 1.0], [0.0, 1.0]));

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    assert!(TcpGroup::serve("none", listener, 0, timeout).err().unwrap().to_string().contains("0 ranks"));
    let vars = |port: &'static str| {
        move |name: &str| match name {
            "RANK" => Some("0".to_string()),
            "WORLD_SIZE" => Some("1".to_string()),
            "MASTER_PORT" => Some(port.to_string()),
            _ => None,
        }
    };
    // Port 0 would have rank 0 listen where the system picks, which no other rank knows.
    for port in ["70000", "0"] {
        let err = RankEnv::from_vars(vars(port)).unwrap_err().to_string();
        assert!(err.contains("MASTER_PORT") && err.contains("1 to 65535"), "{err}");
    }
    let zero = |name: &str| (name == "WORLD_SIZE" || name == "RANK").then(|| "0".to_string());
    assert!(RankEnv::from_vars(zero).unwrap_err().to_string().contains("WORLD_SIZE"));
    // A world size past any cluster (a typo) is refused, not allocated for.
    let huge = |name: &str| match name {
        "WORLD_SIZE" => Some("100000000000000".to_string()),
        "RANK" => Some("0".to_string()),
        _ => None,
    };
    let err = RankEnv::from_vars(huge).unwrap_err().to_string();
    assert!(err.contains("WORLD_SIZE") && err.contains(&format!("1 to {MAX_WORLD_SIZE}")), "{err}");
    let past = MAX_WORLD_SIZE + 1;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let err = TcpGroup::serve("huge", listener, usize::MAX, timeout).err().unwrap().to_string();
    assert!(err.contains("past the most a group takes"), "{err}");
    let err = TcpGroup::join("huge", &address, 1, past, timeout).err().unwrap().to_string();
    assert!(err.contains("past the most a group takes"), "{err}");
    let err = InProcessGroup::new("huge", usize::MAX).err().unwrap().to_string();
    assert!(err.contains("past the most a group takes"), "{err}");
}

/// Rank 0 reads what a rank's header announces as it arrives: a header announcing far more
/// than is sent (a stray client that knows the greeting, another build) ends in a typed error
/// when the connection closes, with nothing allocated for the announced size (2^40 values, 4
/// TiB, which aborted the process before).
#[test]
fn tcp_rank_0_does_not_allocate_what_a_header_announces() {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(10);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let liar = thread::spawn(move || {
        // Rank 1 by hand: the greeting (magic, rank, world), rank 0's answer, then an all-gather
        // header announcing 2^40 values, 8 bytes of them, and the connection closed.
        let mut s = std::net::TcpStream::connect(&address).unwrap();
        for word in [0x6273_6331u32, 1, 2] {
            s.write_all(&word.to_le_bytes()).unwrap();
        }
        let mut answer = [1u8];
        s.read_exact(&mut answer).unwrap();
        assert_eq!(answer, [0]);
        let mut h = [0u8; 16];
        h[0] = 1;
        h[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        s.write_all(&h).unwrap();
        s.write_all(&[0; 8]).unwrap();
    });
    let rank0 = TcpGroup::serve("liar", listener, 2, timeout).unwrap();
    liar.join().unwrap();
    let mut out = [0.0; 2];
    let err = rank0.run(Collective::AllGather, &[0.0], &mut out).unwrap_err();
    assert!(matches!(err, Error::Collective { .. }), "{err}");
}

/// The standard passes leave collectives whole (no decomposition, nothing fuses across them):
/// a fused plan on two ranks gives the unfused plan's result.
#[test]
fn collectives_pass_through_fusion_and_the_pipeline() {
    use crate::executors::CpuFusion;
    use crate::passes::Pipeline;
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[16, 8]).unwrap();
    let y = b.exp(x).unwrap();
    let y = b.mul_scalar(y, 0.5).unwrap();
    let y = c.all_reduce(&mut b, y, ReduceOp::Sum).unwrap();
    let y = b.tanh(y).unwrap();
    let y = b.add_scalar(y, 1.0).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let results = with_ranks(Transport::InProcess, 2, |rank, comm| {
        let executors = [CollectiveExecutor::of(comm, &c).shared(), CpuFusion::shared(), CpuReference::shared()];
        let arena = Arena::new();
        let fused = Pipeline::for_executors(&executors).run(&trace, &arena).unwrap();
        let plan = Plan::compile(&fused, &executors).unwrap();
        assert!(plan.steps_per_executor().contains(&("collectives", 1)), "{plan}");
        let input = Tensor::new(&[16, 8], (0..128).map(|i| (i + rank) as f32 / 64.0).collect()).unwrap();
        plan.run(&[&input]).unwrap()[0].to_f32_vec()
    });
    let expected: Vec<f32> = (0..128)
        .map(|i| {
            let part = |r: usize| ((i + r) as f32 / 64.0).exp() * 0.5;
            (part(0) + part(1)).tanh() + 1.0
        })
        .collect();
    for got in results {
        let diff = got.iter().zip(&expected).map(|(g, e)| (g - e).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "{diff}");
    }
}

/// An MLP's training step on `world` ranks, each with its part of the batch and its gradients
/// averaged in buckets (`DataParallel`), against one rank on the whole batch: after three SGD
/// steps every rank holds the same parameters, those of the whole batch's steps (the mean loss
/// over the batch is the mean of the ranks' mean losses). Bucket sizes from one gradient each to
/// one bucket for all.
#[test]
fn data_parallel_steps_keep_every_rank_equal_to_one_rank_on_the_whole_batch() {
    use crate::optim::Sgd;
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let (batch, d, hidden) = (8, 3, 5);
    let step_of = |rows: usize, dp: Option<DataParallel>| {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[rows, d]).unwrap();
        let target = b.input(&[rows, 1]).unwrap();
        let (w1, b1, w2) =
            (b.input(&[d, hidden]).unwrap(), b.input(&[hidden]).unwrap(), b.input(&[hidden, 1]).unwrap());
        let h = b.matmul(x, w1).unwrap();
        let h = b.add(h, b1).unwrap();
        let h = b.tanh(h).unwrap();
        let y = b.matmul(h, w2).unwrap();
        let err = b.sub(y, target).unwrap();
        let sq = b.mul(err, err).unwrap();
        let sq = b.reshape(sq, &[1, rows]).unwrap();
        let total = b.sum(sq).unwrap();
        let loss = b.mul_scalar(total, 1.0 / rows as f32).unwrap();
        b.output(loss).unwrap();
        let grad = Grad::new(&[w1, b1, w2]);
        let grad = match dp {
            Some(dp) => grad.in_buckets(dp),
            None => grad,
        };
        grad.training_step(&b.finish().unwrap(), &arena, &Sgd::new()).unwrap()
    };
    let data =
        |n: usize, seed: usize| (0..n).map(|i| (((i * 7 + seed * 3) % 11) as f32 - 5.0) / 8.0).collect::<Vec<_>>();
    let (xs, targets) = (data(batch * d, 1), data(batch, 2));
    let initial = [data(d * hidden, 3), data(hidden, 4), data(hidden, 5)];
    let shapes: [&[usize]; 3] = [&[d, hidden], &[hidden], &[hidden, 1]];
    // Runs `steps` SGD steps of `plan` on rows `rows` of the batch: the parameters after them.
    let train = |plan: &Plan, rows: std::ops::Range<usize>| -> Vec<Vec<f32>> {
        let mut ws = plan.workspace().unwrap();
        let n = rows.len();
        let mut x = Tensor::new(&[n, d], xs[rows.start * d..rows.end * d].to_vec()).unwrap();
        let mut t = Tensor::new(&[n, 1], targets[rows].to_vec()).unwrap();
        let mut params: Vec<Tensor> =
            initial.iter().zip(shapes).map(|(v, s)| Tensor::new(s, v.clone()).unwrap()).collect();
        for step in 1..=3 {
            let [mut lr, mut factor] = Sgd::new().step_values(step, 0.1);
            let [w1, b1, w2] = &mut params[..] else { unreachable!() };
            plan.run_updating(&mut ws, &mut [&mut x, &mut t, w1, b1, w2, &mut lr, &mut factor]).unwrap();
        }
        params.iter().map(Tensor::to_f32_vec).collect()
    };
    let whole = Plan::compile(&step_of(batch, None).trace, &[CpuReference::shared()]).unwrap();
    let expected = train(&whole, 0..batch);
    for world in [2, 4] {
        for bucket_bytes in [1, 32, 1 << 20] {
            let step = step_of(batch / world, Some(DataParallel::new(&c).bucket_bytes(bucket_bytes)));
            // A bucket's starts come together: count the runs of them.
            let is_start: Vec<bool> = step
                .trace
                .bound_symbols()
                .iter()
                .map(|s| step.trace.symbol_name(s).starts_with("all_reduce_start"))
                .collect();
            let starts = is_start.iter().filter(|&&s| s).count();
            let buckets = (0..is_start.len()).filter(|&i| is_start[i] && (i == 0 || !is_start[i - 1])).count();
            let expected_buckets = match bucket_bytes {
                1 => 3,
                32 => 2,
                _ => 1,
            };
            assert_eq!((starts, buckets), (3, expected_buckets), "{bucket_bytes}-byte buckets:\n{}", step.trace);
            let results = with_ranks(Transport::InProcess, world, |rank, comm| {
                let executors = [CollectiveExecutor::of(comm, &c).shared(), CpuReference::shared()];
                let plan = Plan::compile(&step.trace, &executors).unwrap();
                let part = batch / world;
                train(&plan, rank * part..(rank + 1) * part)
            });
            for (rank, params) in results.iter().enumerate() {
                assert_eq!(params, &results[0], "rank {rank} of {world} holds the same bits");
                for (p, (got, want)) in params.iter().zip(&expected).enumerate() {
                    let diff = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
                    assert!(diff < 1e-5, "{world} ranks, {bucket_bytes}-byte buckets, parameter {p}: {diff}");
                }
            }
        }
    }
}

/// Buckets start inside the backward, as soon as they are full: with one gradient per bucket,
/// the first `all_reduce_start` comes before the backward's last ops (those of the first
/// layer), not after all of them; each sits in a scope `backward.grad_sync`.
#[test]
fn gradient_buckets_start_while_the_backward_goes_on() {
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4, 3]).unwrap();
    let (w1, w2) = (b.input(&[3, 3]).unwrap(), b.input(&[3, 3]).unwrap());
    let h = b.matmul(x, w1).unwrap();
    let h = b.scope("layer2", |b| b.matmul(h, w2)).unwrap();
    let h = b.reshape(h, &[1, 12]).unwrap();
    let loss = b.sum(h).unwrap();
    b.output(loss).unwrap();
    let trace = b.finish().unwrap();
    let grads = Grad::new(&[w1, w2]).in_buckets(DataParallel::new(&c).bucket_bytes(1)).run(&trace, &arena).unwrap();
    let names: Vec<&str> = grads.bound_symbols().iter().map(|s| grads.symbol_name(s)).collect();
    let first_start = names.iter().position(|n| n.starts_with("all_reduce_start")).expect("a start");
    let last_matmul = names.iter().rposition(|n| n.contains("matmul")).expect("the backward's products");
    assert!(first_start < last_matmul, "w2's bucket starts before w1's gradient is computed: {names:?}");
    assert_eq!(grads.scope_path(first_start), Some("backward.grad_sync"));
    let waits: Vec<usize> = (0..names.len()).filter(|&i| names[i] == "all_reduce_wait").collect();
    assert_eq!(waits.len(), 2);
    assert!(waits.iter().all(|&i| i > last_matmul && grads.scope_path(i) == Some("backward.grad_sync")));
    // A start that returns another shape is a typed error, not a silent loss.
    let wrong = crate::passes::GradientBuckets::new(1, |b, x| b.sum(x), |b, s, _| b.add_scalar(s, 0.0));
    let err = Grad::new(&[w1, w2]).in_buckets(wrong).run(&trace, &arena).unwrap_err();
    assert!(matches!(err, Error::InvalidGradient { .. }) && err.to_string().contains("another shape"), "{err}");
}

/// A started `all_reduce` is read by its waits only: anything else reading it, none waiting
/// for it, or its being an output of the trace is a typed error when the plan compiles.
#[test]
fn a_started_all_reduce_read_by_anything_but_its_waits_is_refused() {
    let (registry, c) = registry_with_collectives();
    let arena = Arena::new();
    let build = |misuse: usize| {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[4]).unwrap();
        let started = c.all_reduce_start(&mut b, x, ReduceOp::Sum).unwrap();
        match misuse {
            0 => {
                let early = b.exp(started).unwrap();
                let waited = c.all_reduce_wait(&mut b, started, x, 0, &[4]).unwrap();
                let y = b.add(early, waited).unwrap();
                b.output(y).unwrap();
            }
            1 => {
                let other = b.exp(x).unwrap();
                b.output(other).unwrap();
                b.output(started).unwrap();
            }
            2 => b.output(started).unwrap(),
            4 => {
                let other = b.exp(x).unwrap();
                let waited = c.all_reduce_wait(&mut b, started, other, 0, &[4]).unwrap();
                b.output(waited).unwrap();
            }
            _ => {
                let half = c.all_reduce_wait(&mut b, started, x, 2, &[2]).unwrap();
                b.output(half).unwrap();
            }
        }
        b.finish().unwrap()
    };
    let compile = |trace: &Trace<'_>| {
        let comm = InProcessGroup::new("one", 1).unwrap().remove(0);
        Plan::compile(trace, &[CollectiveExecutor::new(comm, &c).shared(), CpuReference::shared()])
    };
    let err = compile(&build(0)).unwrap_err().to_string();
    assert!(err.contains("`exp` reads a started all_reduce"), "{err}");
    for misuse in [1, 2] {
        let err = compile(&build(misuse)).unwrap_err().to_string();
        assert!(err.contains("is an output of the trace"), "{err}");
    }
    let err = compile(&build(4)).unwrap_err().to_string();
    assert!(err.contains("not the tensor its all_reduce started from"), "{err}");
    // A part of the result: values 2 and 3.
    let plan = compile(&build(3)).unwrap();
    let out = plan.run(&[&Tensor::new(&[4], vec![1.0, 2.0, 3.0, 4.0]).unwrap()]).unwrap();
    assert_eq!(out[0].to_f32_vec(), [3.0, 4.0]);
    // A part outside the values is refused by the shape rule.
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[4]).unwrap();
    let started = c.all_reduce_start(&mut b, x, ReduceOp::Sum).unwrap();
    let err = c.all_reduce_wait(&mut b, started, x, 3, &[2]).unwrap_err().to_string();
    assert!(err.contains("does not fit"), "{err}");
}
