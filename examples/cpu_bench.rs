//! CPU benchmark, side by side with `scripts/torch_cpu.py` (PyTorch eager on the CPU, same
//! shapes, every core): products (`matmul` at [1024]^3, [64, 256] x [256, 256] and GPT-2's MLP
//! shape [512, 768] x [768, 3072]) and MLP blocks (the quickstart's `linear, gelu, linear,
//! residual, layer_norm, softmax` at [64, 256], hidden 256, and GPT-2's `linear, gelu, linear`
//! at [512, 768], hidden 3072), and `softmax` and `layer_norm` over 512 rows of 768 to 4,096
//! (`softmax_<n>`, `layer_norm_<n>`), and the swish chain `x = a * b + 1; x * sigmoid(x)` over
//! 2^24 values (against `torch.compile` too), each through `Plan` as a user compiles it: the standard passes
//! keeping the composites the CPU executors run whole, elementwise chains fused for CpuFusion,
//! the rest on the CPU reference. Each result is checked against the CPU reference alone first.
//! Lines starting `RESULT ` are JSON; `scripts/transformer_ops_report.py` puts both side by side.
//!
//! Arguments name the workloads to run (all by default); `--profile` times every op with a
//! `HostTimer` and prints each op's mean on stderr.
//!
//! ```text
//! cargo build --release --example cpu_bench
//! (target/release/examples/cpu_bench; python3 scripts/torch_cpu.py) | python3 scripts/transformer_ops_report.py
//! ```

use std::sync::Arc;
use std::time::Instant;

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::guards::{HostTimer, Selection};
use boundscope::passes::{FuseRegions, Pass, Pipeline};
use boundscope::{Arena, Executor, Plan, Registry, Tensor, Trace, TraceBuilder, ValueId};

type Build = fn(&mut TraceBuilder<'_>, &[ValueId]) -> boundscope::Result<ValueId>;

struct Workload {
    name: &'static str,
    inputs: Vec<Vec<usize>>,
    build: Build,
    /// Multiply-add FLOPs per run (for products), or elements (row ops).
    flops: f64,
    /// Useful bytes per run (every input read once, the output written once) for elementwise
    /// chains, which are judged by GB/s; 0 for the others.
    bytes: f64,
}

fn mlp(g: &mut TraceBuilder<'_>, v: &[ValueId]) -> boundscope::Result<ValueId> {
    let h = g.linear(v[0], v[1], Some(v[2]))?;
    let h = g.gelu(h)?;
    g.linear(h, v[3], Some(v[4]))
}

/// Rows of each row op's input.
const ROWS: usize = 512;

fn workloads() -> Vec<Workload> {
    let product = |m: usize, k: usize, n: usize| 2.0 * (m * k * n) as f64;
    let mut rows = Vec::new();
    for (cols, softmax, layer_norm) in [
        (768, "softmax_768", "layer_norm_768"),
        (1024, "softmax_1024", "layer_norm_1024"),
        (2048, "softmax_2048", "layer_norm_2048"),
        (4096, "softmax_4096", "layer_norm_4096"),
    ] {
        // FLOPs stand for elements here: the report shows milliseconds.
        let elements = (ROWS * cols) as f64;
        rows.push(Workload {
            name: softmax,
            inputs: vec![vec![ROWS, cols]],
            build: |g, v| g.softmax(v[0]),
            flops: elements,
            bytes: 0.0,
        });
        rows.push(Workload {
            name: layer_norm,
            inputs: vec![vec![ROWS, cols], vec![cols], vec![cols]],
            build: |g, v| g.layer_norm(v[0], 1e-5, Some(v[1]), Some(v[2])),
            flops: elements,
            bytes: 0.0,
        });
    }
    let mut all = vec![
        Workload {
            name: "matmul_1024",
            inputs: vec![vec![1024, 1024], vec![1024, 1024]],
            build: |g, v| g.matmul(v[0], v[1]),
            flops: product(1024, 1024, 1024),
            bytes: 0.0,
        },
        Workload {
            name: "matmul_64x256x256",
            inputs: vec![vec![64, 256], vec![256, 256]],
            build: |g, v| g.matmul(v[0], v[1]),
            flops: product(64, 256, 256),
            bytes: 0.0,
        },
        Workload {
            name: "matmul_512x768x3072",
            inputs: vec![vec![512, 768], vec![768, 3072]],
            build: |g, v| g.matmul(v[0], v[1]),
            flops: product(512, 768, 3072),
            bytes: 0.0,
        },
        Workload {
            name: "quickstart_block",
            inputs: vec![vec![64, 256], vec![256, 256], vec![256], vec![256, 256], vec![256], vec![256], vec![256]],
            build: |g, v| {
                let o = mlp(g, &[v[0], v[1], v[2], v[3], v[4]])?;
                let r = g.add(o, v[0])?;
                let n = g.layer_norm(r, 1e-5, Some(v[5]), Some(v[6]))?;
                g.softmax(n)
            },
            flops: 2.0 * product(64, 256, 256),
            bytes: 0.0,
        },
        Workload {
            name: "gpt2_mlp_512",
            inputs: vec![vec![512, 768], vec![3072, 768], vec![3072], vec![768, 3072], vec![768]],
            build: mlp,
            flops: 2.0 * product(512, 768, 3072),
            bytes: 0.0,
        },
    ];
    all.extend(rows);
    // The swish chain of the fusion benchmarks, fused by CpuFusion into one region: judged by
    // GB/s against `torch.compile` on the CPU (`scripts/torch_cpu.py` compiles it).
    const CHAIN: usize = 1 << 24;
    all.push(Workload {
        name: "swish_chain_2^24",
        inputs: vec![vec![CHAIN], vec![CHAIN]],
        build: |g, v| {
            let x = g.mul(v[0], v[1])?;
            let x = g.add_scalar(x, 1.0)?;
            let s = g.sigmoid(x)?;
            g.mul(x, s)
        },
        flops: 8.0 * CHAIN as f64,
        bytes: 3.0 * 4.0 * CHAIN as f64,
    });
    all
}

fn trace<'a>(arena: &'a Arena, registry: &'a Registry, w: &Workload) -> boundscope::Result<Trace<'a>> {
    let mut b = TraceBuilder::new(arena, registry);
    let values = w.inputs.iter().map(|s| b.input(s)).collect::<boundscope::Result<Vec<_>>>()?;
    let y = (w.build)(&mut b, &values)?;
    b.output(y)?;
    b.finish()
}

fn main() -> boundscope::Result<()> {
    let registry = Registry::with_builtins();
    let fusion = CpuFusion::shared();
    let executors: Vec<Arc<dyn Executor>> = vec![fusion.clone(), CpuReference::shared()];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("machine: {threads} threads");
    // `--profile`: each op's mean host time, on stderr, after the timed runs.
    let profile = std::env::args().any(|a| a == "--profile");
    // Other arguments name the workloads to run (all when none is named).
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    for w in workloads().into_iter().filter(|w| only.is_empty() || only.iter().any(|o| o == w.name)) {
        let arena = Arena::new();
        let trace = trace(&arena, &registry, &w)?;
        let inputs: Vec<Tensor> = w
            .inputs
            .iter()
            .enumerate()
            .map(|(k, s)| Tensor::from_fn(s, |i| (((i * 37 + k * 11) % 101) as f32 / 101.0 - 0.5) * 0.2))
            .collect();
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let prims = Pipeline::for_executors(&executors).run(&trace, &arena)?;
        let mut fused = FuseRegions::new(fusion.clone()).run(&prims, &arena)?;
        let timer = HostTimer::new();
        if profile {
            fused.attach_guard(Selection::All, timer.clone())?;
        }
        let plan = Plan::compile(&fused, &executors)?;
        let expected = Plan::compile(&trace, &[CpuReference::shared()])?.run(&refs)?;
        let got = plan.run(&refs)?;
        let diff = got[0].max_abs_diff(&expected[0]);
        if diff.is_nan() || diff > 1e-3 {
            eprintln!("{}: differs from the CPU reference by {diff}", w.name);
            std::process::exit(1);
        }
        let mut ws = plan.workspace()?;
        let reps = ((2e9 / w.flops) as usize).clamp(5, 2000);
        for _ in 0..3 {
            plan.run_with(&mut ws, &refs)?;
        }
        let start = Instant::now();
        for _ in 0..reps {
            plan.run_with(&mut ws, &refs)?;
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
        println!(
            "RESULT {{\"impl\":\"boundscope\",\"op\":\"{}\",\"dtype\":\"f32\",\"ms\":{ms},\"gbps\":{},\"tflops\":{}}}",
            w.name,
            w.bytes / (ms * 1e-3) / 1e9,
            if w.bytes > 0.0 { 0.0 } else { w.flops / (ms * 1e-3) / 1e12 }
        );
        for stats in timer.stats() {
            eprintln!("{}: {:>12} {:.4} ms x {}", w.name, stats.label, stats.mean().as_secs_f64() * 1e3, stats.count);
        }
    }
    Ok(())
}
