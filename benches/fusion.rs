//! Fused against unfused CPU execution on 2^24 floats, against a hand-written single loop
//! compiled for the same vector instructions and split over the same threads (the limit for
//! this function), and against a streaming pass over the same bytes with no arithmetic (the
//! machine's memory-bandwidth limit), for two chains:
//! - `x = a*b + 1; y = x*sigmoid(x)` (4 ops);
//! - a layer-norm-like chain `y = (x - mean) * rstd * w + b` over `[16384, 1024]`, with `mean`
//!   and `rstd` per row (`[16384, 1]`) and `w`, `b` per column (`[1024]`): broadcast loads.
//!
//! Figures it exists to show, side by side in one run: fused at most 1.5x the streaming pass;
//! fused at least 2x faster than unfused; fused within 1.3x of the hand-written loop; large ops
//! on every core at least 1.7x faster than on one (`threads(1)`); the extra memory of a fused
//! region bounded by the block size (printed: workspace bytes of both plans and the fusion
//! scratch), not by the tensor size.
//!
//! `cargo bench --bench fusion`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use boundscope::executors::{cpu_fusion_scratch_bytes, math, CpuFusion, CpuReference};
use boundscope::passes::{FuseRegions, Pass};
use boundscope::{Arena, Executor, Plan, Registry, Tensor, Trace, TraceBuilder, Workspace};
use criterion::{Criterion, Throughput};
use multiversion::multiversion;

mod chains;

use chains::COLS;

const N: usize = 1 << 24;

fn swish<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    chains::swish_chain(arena, registry, N)
}

fn norm<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    chains::norm_chain(arena, registry, N)
}

/// The threads the hand loops and streaming passes use: those the executors use by default.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `f(start, out_piece)` over `out` cut into one piece per thread (a multiple of `unit`
/// elements each), on scoped threads. Spawning them costs tens of microseconds, under 1% of
/// these runs.
fn split(out: &mut [f32], unit: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let units = out.len() / unit;
    let per = units.div_ceil(threads()) * unit;
    std::thread::scope(|scope| {
        for (k, piece) in out.chunks_mut(per).enumerate() {
            let f = &f;
            scope.spawn(move || f(k * per, piece));
        }
    });
}

#[multiversion(targets = "simd")]
fn swish_loop(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        let x = a * b + 1.0;
        // The same sigmoid every executor computes (a vectorizable exp).
        *o = x * math::sigmoid(x);
    }
}

fn hand_swish(inputs: &[Tensor], out: &mut [f32]) {
    let (a, b) = (inputs[0].values::<f32>().unwrap(), inputs[1].values::<f32>().unwrap());
    split(out, 1, |start, out| swish_loop(&a[start..], &b[start..], out));
}

#[multiversion(targets = "simd")]
fn norm_loop(x: &[f32], mean: &[f32], rstd: &[f32], w: &[f32], b: &[f32], first_row: usize, out: &mut [f32]) {
    for (r, (orow, xrow)) in out.chunks_exact_mut(COLS).zip(x.chunks_exact(COLS)).enumerate() {
        let (m, s) = (mean[first_row + r], rstd[first_row + r]);
        for (((o, &x), &w), &b) in orow.iter_mut().zip(xrow).zip(w).zip(b) {
            *o = (x - m) * s * w + b;
        }
    }
}

fn hand_norm(inputs: &[Tensor], out: &mut [f32]) {
    let (x, mean, rstd, w, b) = (
        inputs[0].values::<f32>().unwrap(),
        inputs[1].values::<f32>().unwrap(),
        inputs[2].values::<f32>().unwrap(),
        inputs[3].values::<f32>().unwrap(),
        inputs[4].values::<f32>().unwrap(),
    );
    split(out, COLS, |start, out| norm_loop(&x[start..], mean, rstd, w, b, start / COLS, out));
}

#[multiversion(targets = "simd")]
fn add_loop(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = a + b;
    }
}

/// The swish chain's bytes with no arithmetic to speak of: two reads and a write.
fn stream_swish(inputs: &[Tensor], out: &mut [f32]) {
    let (a, b) = (inputs[0].values::<f32>().unwrap(), inputs[1].values::<f32>().unwrap());
    split(out, 1, |start, out| add_loop(&a[start..], &b[start..], out));
}

/// The norm chain's bytes (its per-row and per-column inputs are 0.2% of them): a read and a
/// write.
fn stream_norm(inputs: &[Tensor], out: &mut [f32]) {
    let x = inputs[0].values::<f32>().unwrap();
    split(out, 1, |start, out| out.copy_from_slice(&x[start..start + out.len()]));
}

/// A plan and its workspace.
struct Compiled(Plan, Workspace);

struct Case {
    name: &'static str,
    inputs: Vec<Tensor>,
    /// Unfused and fused, on every core, then on one.
    plans: [Compiled; 4],
    hand: fn(&[Tensor], &mut [f32]),
    stream: fn(&[Tensor], &mut [f32]),
    out: Vec<f32>,
}

/// The unfused and the fused plan of `trace` for executors that use `threads` threads.
fn plans(trace: &Trace<'_>, arena: &Arena, threads: usize) -> [Compiled; 2] {
    let reference: Arc<dyn Executor> = Arc::new(CpuReference::new().threads(threads));
    let fusion = Arc::new(CpuFusion::new().threads(threads));
    let unfused = Plan::compile(trace, std::slice::from_ref(&reference)).expect("compiles");
    let fused_trace = FuseRegions::new(fusion.clone()).run(trace, arena).expect("fuses");
    let fused = Plan::compile(&fused_trace, &[fusion, reference]).expect("compiles");
    assert_eq!(fused.len(), 1, "one region");
    [unfused, fused].map(|plan| {
        let workspace = plan.workspace().expect("allocates");
        Compiled(plan, workspace)
    })
}

impl Case {
    fn new(
        name: &'static str,
        build: for<'a> fn(&'a Arena, &'a Registry) -> Trace<'a>,
        hand: fn(&[Tensor], &mut [f32]),
        stream: fn(&[Tensor], &mut [f32]),
    ) -> Self {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = build(&arena, &registry);
        let [unfused, fused] = plans(&trace, &arena, 0);
        let [unfused_1, fused_1] = plans(&trace, &arena, 1);
        let inputs = random_inputs(&trace);
        Self { name, inputs, plans: [unfused, fused, unfused_1, fused_1], hand, stream, out: vec![0.0; N] }
    }

    /// Runs variant `which` of [`VARIANTS`].
    fn run(&mut self, which: usize) {
        let views: Vec<_> = self.inputs.iter().map(Tensor::view).collect();
        match which {
            0..4 => {
                let Compiled(plan, workspace) = &mut self.plans[which];
                black_box(plan.run_with(workspace, &views).expect("runs").get(0).map(|t| t.data.f32_at(0)));
            }
            4 => {
                (self.hand)(&self.inputs, &mut self.out);
                black_box(self.out[0]);
            }
            _ => {
                (self.stream)(&self.inputs, &mut self.out);
                black_box(self.out[0]);
            }
        }
    }

    fn check(&mut self) {
        let views: Vec<_> = self.inputs.iter().map(Tensor::view).collect();
        let mut results = self.plans.iter_mut().map(|Compiled(plan, workspace)| {
            plan.run_with(workspace, &views).expect("runs").get(0).expect("output").to_tensor()
        });
        let unfused = results.next().expect("four plans");
        for (other, name) in results.zip(["fused", "unfused on one thread", "fused on one thread"]) {
            let diff = unfused.max_abs_diff(&other);
            assert!(diff <= 1e-5, "{}: {name} differs from unfused by {diff}", self.name);
        }
        (self.hand)(&self.inputs, &mut self.out);
        let hand = Tensor::new(unfused.shape(), self.out.clone()).expect("same shape");
        assert!(unfused.max_abs_diff(&hand) <= 1e-5, "{}: the hand loop computes something else", self.name);
    }
}

fn random_inputs(trace: &Trace<'_>) -> Vec<Tensor> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    trace
        .inputs()
        .iter()
        .map(|&v| {
            let shape = trace.value_meta(v).expect("input").shape;
            Tensor::from_fn(&shape, |_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
        })
        .collect()
}

/// Single large ops, on every core against one: `exp` (arithmetic-bound), `add` (memory-bound)
/// over 2^24 floats, and a 1024 x 1024 x 1024 matmul.
fn single_ops() -> Vec<(&'static str, [Compiled; 2], Vec<Tensor>)> {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut cases = Vec::new();
    type Build = for<'a> fn(&mut TraceBuilder<'a>) -> boundscope::ValueId;
    let ops: [(&str, Build); 3] = [
        ("exp", |b| {
            let x = b.input(&[N]).expect("valid");
            b.exp(x).expect("valid")
        }),
        ("add", |b| {
            let (x, y) = (b.input(&[N]).expect("valid"), b.input(&[N]).expect("valid"));
            b.add(x, y).expect("valid")
        }),
        ("matmul", |b| {
            let (x, y) = (b.input(&[1024, 1024]).expect("valid"), b.input(&[1024, 1024]).expect("valid"));
            b.matmul(x, y).expect("valid")
        }),
    ];
    for (name, build) in ops {
        let mut b = TraceBuilder::new(&arena, &registry);
        let y = build(&mut b);
        b.output(y).expect("valid");
        let trace = b.finish().expect("valid");
        let compiled = [0, 1].map(|threads| {
            let plan = Plan::compile(&trace, &[Arc::new(CpuReference::new().threads(threads))]).expect("compiles");
            let workspace = plan.workspace().expect("allocates");
            Compiled(plan, workspace)
        });
        cases.push((name, compiled, random_inputs(&trace)));
    }
    cases
}

/// Median milliseconds of each of `variants`, run in interleaved rounds.
fn interleaved(rounds: usize, variants: usize, mut run: impl FnMut(usize)) -> Vec<f64> {
    let mut samples = vec![Vec::new(); variants];
    for _ in 0..rounds {
        for (which, s) in samples.iter_mut().enumerate() {
            let start = Instant::now();
            run(which);
            s.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    samples
        .iter_mut()
        .map(|s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2]
        })
        .collect()
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

const VARIANTS: [&str; 6] = ["unfused", "fused", "unfused_1_thread", "fused_1_thread", "hand_loop", "stream"];

fn main() {
    let mut cases = vec![
        Case::new("swish_chain", swish, hand_swish, stream_swish),
        Case::new("norm_chain", norm, hand_norm, stream_norm),
    ];
    let mut criterion = Criterion::default().sample_size(10).configure_from_args();
    for case in &mut cases {
        case.check();
        let mut group = criterion.benchmark_group(format!("fusion/{}", case.name));
        group.throughput(Throughput::Elements(N as u64));
        for (which, name) in VARIANTS.iter().enumerate() {
            group.bench_function(*name, |b| b.iter(|| case.run(which)));
        }
        group.finish();
    }
    criterion.final_summary();

    println!(
        "\nfusion on 2^24 floats, {} threads, ms per run (median of 9 interleaved rounds); stream: the same bytes, no arithmetic",
        threads()
    );
    for case in &mut cases {
        let ms = interleaved(9, VARIANTS.len(), |which| case.run(which));
        let (unfused, fused, unfused_1, fused_1, hand, stream) = (ms[0], ms[1], ms[2], ms[3], ms[4], ms[5]);
        println!(
            "  {:<12} unfused {unfused:6.2}  fused {fused:6.2}  hand loop {hand:6.2}  stream {stream:6.2}   |  one thread: unfused {unfused_1:6.2}  fused {fused_1:6.2}",
            case.name
        );
        println!(
            "  {:<12} fused/stream {:.2} (goal <= 1.5: {})  unfused/fused {:.2} (goal >= 2: {})  fused/hand {:.2} (goal <= 1.3: {})  fused 1 thread/all {:.2}",
            "",
            fused / stream,
            verdict(fused / stream <= 1.5),
            unfused / fused,
            verdict(unfused / fused >= 2.0),
            fused / hand,
            verdict(fused / hand <= 1.3),
            fused_1 / fused,
        );
        println!(
            "  {:<12} workspace: unfused {:.0} MiB, fused {:.0} MiB (its outputs only); fusion scratch on this thread {} KiB",
            "",
            case.plans[0].1.bytes() as f64 / (1 << 20) as f64,
            case.plans[1].1.bytes() as f64 / (1 << 20) as f64,
            cpu_fusion_scratch_bytes() / 1024,
        );
    }
    println!("\nlarge single ops (CpuReference), ms per run (median of 9 interleaved rounds):");
    for (name, mut compiled, inputs) in single_ops() {
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let ms = interleaved(9, 2, |which| {
            let Compiled(plan, workspace) = &mut compiled[which];
            black_box(plan.run_with(workspace, &views).expect("runs").get(0).map(|t| t.data.f32_at(0)));
        });
        println!(
            "  {name:<8} every core {:7.2}  one thread {:7.2}   one/every {:.2} (goal >= 1.7 on 2 cores: {})",
            ms[0],
            ms[1],
            ms[1] / ms[0],
            verdict(ms[1] / ms[0] >= 1.7),
        );
    }
}
