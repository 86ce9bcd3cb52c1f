//! Fused against unfused CPU execution on 2^24 floats, and against a hand-written single loop
//! (the limit on this machine), for two chains:
//! - `x = a*b + 1; y = x*sigmoid(x)` (4 ops);
//! - a layer-norm-like chain `y = (x - mean) * rstd * w + b` over `[16384, 1024]`, with `mean`
//!   and `rstd` per row (`[16384, 1]`) and `w`, `b` per column (`[1024]`): broadcast loads.
//!
//! Figures it exists to show: fused at least 2x faster than unfused; within 1.3x of the
//! hand-written loop; the extra memory of a fused region bounded by the block size (printed:
//! workspace bytes of both plans and the fusion scratch), not by the tensor size.
//!
//! `cargo bench --bench fusion`

use std::hint::black_box;
use std::time::Instant;

use boundscope::executors::{cpu_fusion_scratch_bytes, math, CpuFusion, CpuReference};
use boundscope::passes::{FuseRegions, Pass};
use boundscope::{Arena, Plan, Registry, Tensor, Trace, Workspace};
use criterion::{Criterion, Throughput};

mod chains;

use chains::COLS;

const N: usize = 1 << 24;

fn swish<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    chains::swish_chain(arena, registry, N)
}

fn norm<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    chains::norm_chain(arena, registry, N)
}

fn hand_swish(inputs: &[Tensor], out: &mut [f32]) {
    let (a, b) = (inputs[0].data(), inputs[1].data());
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        let x = a * b + 1.0;
        // The same sigmoid every executor computes (a vectorizable exp).
        *o = x * math::sigmoid(x);
    }
}

fn hand_norm(inputs: &[Tensor], out: &mut [f32]) {
    let (x, mean, rstd, w, b) =
        (inputs[0].data(), inputs[1].data(), inputs[2].data(), inputs[3].data(), inputs[4].data());
    for (r, (orow, xrow)) in out.chunks_exact_mut(COLS).zip(x.chunks_exact(COLS)).enumerate() {
        let (m, s) = (mean[r], rstd[r]);
        for (((o, &x), &w), &b) in orow.iter_mut().zip(xrow).zip(w).zip(b) {
            *o = (x - m) * s * w + b;
        }
    }
}

struct Case {
    name: &'static str,
    inputs: Vec<Tensor>,
    unfused: (Plan, Workspace),
    fused: (Plan, Workspace),
    hand: fn(&[Tensor], &mut [f32]),
    hand_out: Vec<f32>,
}

impl Case {
    fn new(
        name: &'static str,
        build: for<'a> fn(&'a Arena, &'a Registry) -> Trace<'a>,
        hand: fn(&[Tensor], &mut [f32]),
    ) -> Self {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = build(&arena, &registry);
        let unfused = Plan::compile(&trace, &[CpuReference::shared()]).expect("compiles");
        let fused_trace = FuseRegions::new(CpuFusion::shared()).run(&trace, &arena).expect("fuses");
        let fused = Plan::compile(&fused_trace, &[CpuFusion::shared(), CpuReference::shared()]).expect("compiles");
        assert_eq!(fused.len(), 1, "one region");
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let inputs: Vec<Tensor> = trace
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
            .collect();
        let (uw, fw) = (unfused.workspace().expect("allocates"), fused.workspace().expect("allocates"));
        Self { name, inputs, unfused: (unfused, uw), fused: (fused, fw), hand, hand_out: vec![0.0; N] }
    }

    fn run(&mut self, which: usize) {
        let views: Vec<_> = self.inputs.iter().map(Tensor::view).collect();
        match which {
            0 => {
                black_box(
                    self.unfused.0.run_with(&mut self.unfused.1, &views).expect("runs").get(0).map(|t| t.data[0]),
                );
            }
            1 => {
                black_box(self.fused.0.run_with(&mut self.fused.1, &views).expect("runs").get(0).map(|t| t.data[0]));
            }
            _ => {
                (self.hand)(&self.inputs, &mut self.hand_out);
                black_box(self.hand_out[0]);
            }
        }
    }

    fn check(&mut self) {
        let views: Vec<_> = self.inputs.iter().map(Tensor::view).collect();
        let u = self.unfused.0.run_with(&mut self.unfused.1, &views).expect("runs").get(0).expect("output").to_tensor();
        let f = self.fused.0.run_with(&mut self.fused.1, &views).expect("runs").get(0).expect("output").to_tensor();
        assert!(u.max_abs_diff(&f) <= 1e-5, "{}: fused differs from unfused by {}", self.name, u.max_abs_diff(&f));
    }
}

const VARIANTS: [&str; 3] = ["unfused", "fused", "hand_loop"];

fn main() {
    let mut cases = vec![Case::new("swish_chain", swish, hand_swish), Case::new("norm_chain", norm, hand_norm)];
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

    println!("\nfusion on 2^24 floats, ms per run (median of 9 interleaved rounds):");
    for case in &mut cases {
        let mut samples = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..9 {
            for (which, s) in samples.iter_mut().enumerate() {
                let start = Instant::now();
                case.run(which);
                s.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        let ms: Vec<f64> = samples
            .iter_mut()
            .map(|s| {
                s.sort_by(f64::total_cmp);
                s[s.len() / 2]
            })
            .collect();
        let (unfused, fused, hand) = (ms[0], ms[1], ms[2]);
        println!(
            "  {:<12} unfused {unfused:7.2}  fused {fused:7.2}  hand loop {hand:7.2}   unfused/fused {:.2} (goal >= 2: {})   fused/hand {:.2} (goal <= 1.3: {})",
            case.name,
            unfused / fused,
            if unfused / fused >= 2.0 { "met" } else { "NOT met" },
            fused / hand,
            if fused / hand <= 1.3 { "met" } else { "NOT met" },
        );
        println!(
            "  {:<12} workspace: unfused {:.0} MiB, fused {:.0} MiB (its outputs only); fusion scratch on this thread {} KiB",
            "",
            case.unfused.1.bytes() as f64 / (1 << 20) as f64,
            case.fused.1.bytes() as f64 / (1 << 20) as f64,
            cpu_fusion_scratch_bytes() / 1024,
        );
    }
}
