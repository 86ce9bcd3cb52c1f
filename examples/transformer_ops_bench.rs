//! GPU benchmark of the transformer ops at GPT-2's shapes (batch 8, 1,024 tokens, 12 heads of
//! 64, width 768), in f32 and bf16, through `Plan` with device inputs, as a user's program runs
//! them (on a machine without a GPU it prints a SKIPPED line and exits 0): attention's two
//! batched products (`q k^T` as `matmul_transposed`, `p v`), a product with a broadcast weight,
//! the copies of `slice`, `concat` and `permute`, causal attention, and its forward with its
//! backward (`attention_training`).
//! Each plan's result is checked against a `torch`-free reference: the same plan on
//! `CpuReference` at a smaller batch. Lines starting `RESULT ` are JSON;
//! `scripts/torch_transformer_ops.py` prints PyTorch's for the same workloads and
//! `scripts/transformer_ops_report.py` puts them side by side.
//!
//! ```text
//! cargo build --release --example transformer_ops_bench   # here; then on the GPU machine:
//! (./transformer_ops_bench; python3 scripts/torch_transformer_ops.py) | python3 scripts/transformer_ops_report.py
//! ```
//!
//! Both take an optional list of workloads (`attention,cross_entropy`) as their first argument;
//! `softmax_<cols>`, `layer_norm_<cols>` and `sum_sq_<cols>` sweep row lengths from 32 to 2^20
//! (`rows` runs them all); `attention_<tokens>_<head>_<causal|full>` sweep attention's lengths
//! and head sizes (`attention_sweep` runs them all).

use std::process::ExitCode;
use std::sync::Arc;

use boundscope::executors::cuda::{self, CudaDevice, KernelVariants};
use boundscope::{Arena, DType, Device, Registry, Tensor, TensorMeta, TraceBuilder, ValueId};

#[path = "shared/gpu_bench.rs"]
mod gpu_bench;

use gpu_bench::{check_against_reference, gpu_plan, ms_per_device_run, useful_bytes};

type Build = fn(&mut TraceBuilder<'_>, &[ValueId]) -> boundscope::Result<ValueId>;

/// A workload: its name, its inputs' shapes (at batch `b`), how to build it, and its useful
/// bytes or FLOPs per run (the figure it is judged by).
struct Workload {
    name: &'static str,
    inputs: fn(usize) -> Vec<Vec<usize>>,
    build: Build,
    /// FLOPs per run at batch `b` (0: judged by bytes moved).
    flops: fn(usize) -> f64,
    /// Inputs that are `i64` ids, with the size of the table they index.
    ids: &'static [(usize, usize)],
}

/// GPT-2's vocabulary.
const VOCAB: usize = 50257;

const T: usize = 1024;
const H: usize = 12;
const D: usize = 64;
const C: usize = 768;

fn workloads() -> Vec<Workload> {
    let mut all = vec![
        Workload {
            name: "qk_t",
            inputs: |b| vec![vec![b, H, T, D], vec![b, H, T, D]],
            build: |g, v| g.matmul_transposed(v[0], v[1]),
            flops: |b| 2.0 * (b * H * T * T * D) as f64,
            ids: &[],
        },
        Workload {
            name: "pv",
            inputs: |b| vec![vec![b, H, T, T], vec![b, H, T, D]],
            build: |g, v| g.matmul(v[0], v[1]),
            flops: |b| 2.0 * (b * H * T * T * D) as f64,
            ids: &[],
        },
        Workload {
            name: "x_w",
            inputs: |b| vec![vec![b, T, C], vec![C, 4 * C]],
            build: |g, v| g.matmul(v[0], v[1]),
            flops: |b| 2.0 * (b * T * C * 4 * C) as f64,
            ids: &[],
        },
        Workload {
            name: "slice",
            inputs: |b| vec![vec![b, T, 3 * C]],
            build: |g, v| g.slice(v[0], 2, C, 2 * C),
            flops: |_| 0.0,
            ids: &[],
        },
        Workload {
            name: "concat",
            inputs: |b| vec![vec![b, T, C], vec![b, T, C]],
            build: |g, v| g.concat(&[v[0], v[1]], 2),
            flops: |_| 0.0,
            ids: &[],
        },
        Workload {
            name: "permute",
            inputs: |b| vec![vec![b, T, H, D]],
            build: |g, v| g.permute(v[0], &[0, 2, 1, 3]),
            flops: |_| 0.0,
            ids: &[],
        },
        Workload {
            name: "attention",
            inputs: |b| vec![vec![b, H, T, D], vec![b, H, T, D], vec![b, H, T, D]],
            build: |g, v| g.scaled_dot_product_attention(v[0], v[1], v[2], true, None),
            // Causal: half the score matrix, as PyTorch's kernels count it.
            flops: |b| 2.0 * (b * H * T * T * D) as f64,
            ids: &[],
        },
        Workload {
            name: "attention_training",
            inputs: |b| vec![vec![b, H, T, D]; 4],
            // What a training step runs: the forward, and the gradients of q, k and v from the
            // result's gradient (the first output, the one checked).
            build: |g, v| {
                let grads =
                    g.scaled_dot_product_attention_backward(v[0], v[1], v[2], v[3], true, 1.0 / (D as f32).sqrt())?;
                g.output(grads)?;
                g.scaled_dot_product_attention(v[0], v[1], v[2], true, None)
            },
            // The forward's two products and the backward's five (one the scores again), halved.
            flops: |b| 7.0 * (b * H * T * T * D) as f64,
            ids: &[],
        },
        Workload {
            name: "embedding",
            inputs: |b| vec![vec![VOCAB, C], vec![b, T]],
            build: |g, v| g.embedding(v[0], v[1]),
            flops: |_| 0.0,
            ids: &[(1, VOCAB)],
        },
        Workload {
            name: "cross_entropy",
            inputs: |b| vec![vec![b * T, VOCAB], vec![b * T]],
            build: |g, v| g.cross_entropy(v[0], v[1]),
            flops: |_| 0.0,
            ids: &[(1, VOCAB)],
        },
    ];
    all.extend(row_workloads());
    all.extend(attention_workloads());
    all
}

/// Attention at other lengths and head sizes than GPT-2's, 12 heads, causal or not: named
/// `attention_<tokens>_<head>_<causal|full>` (`attention_sweep` runs them all).
fn attention_workloads() -> Vec<Workload> {
    macro_rules! attention {
        ($(($t:literal, $d:literal, $causal:literal, $kind:literal)),*) => {
            vec![$(
                Workload {
                    name: concat!("attention_", stringify!($t), "_", stringify!($d), "_", $kind),
                    inputs: |b| vec![vec![b, H, $t, $d]; 3],
                    build: |g, v| g.scaled_dot_product_attention(v[0], v[1], v[2], $causal, None),
                    flops: |b| if $causal { 2.0 } else { 4.0 } * (b * H * $t * $t * $d) as f64,
                    ids: &[],
                },
            )*]
        };
    }
    attention!(
        (256, 64, true, "causal"),
        (512, 64, true, "causal"),
        (2048, 64, true, "causal"),
        (4096, 64, true, "causal"),
        (1024, 16, true, "causal"),
        (1024, 32, true, "causal"),
        (1024, 48, true, "causal"),
        (1024, 64, false, "full"),
        (4096, 64, false, "full")
    )
}

/// Elements of a row-op workload at batch 8 (a sixteenth at batch 1, for the check).
const ROW_ELEMENTS: usize = 1 << 24;

/// `softmax`, `layer_norm` (with weight and bias) and `sum(x * x)` over the last axis (a fused
/// region ending in a reduction) over rows of 32 to 2^20 values: named `softmax_<cols>`,
/// `layer_norm_<cols>`, `sum_sq_<cols>`, `2^24` values in all.
fn row_workloads() -> Vec<Workload> {
    macro_rules! rows {
        ($($cols:literal),*) => {
            vec![$(
                Workload {
                    name: concat!("softmax_", stringify!($cols)),
                    inputs: |b| vec![vec![(ROW_ELEMENTS / $cols * b / 8).max(1), $cols]],
                    build: |g, v| g.softmax(v[0]),
                    flops: |_| 0.0,
                    ids: &[],
                },
                Workload {
                    name: concat!("sum_sq_", stringify!($cols)),
                    inputs: |b| vec![vec![(ROW_ELEMENTS / $cols * b / 8).max(1), $cols]],
                    build: |g, v| {
                        let sq = g.mul(v[0], v[0])?;
                        g.sum(sq)
                    },
                    flops: |_| 0.0,
                    ids: &[],
                },
                Workload {
                    name: concat!("layer_norm_", stringify!($cols)),
                    inputs: |b| vec![vec![(ROW_ELEMENTS / $cols * b / 8).max(1), $cols], vec![$cols], vec![$cols]],
                    build: |g, v| g.layer_norm(v[0], 1e-5, Some(v[1]), Some(v[2])),
                    flops: |_| 0.0,
                    ids: &[],
                },
            )*]
        };
    }
    rows!(32, 128, 768, 1024, 1000, 4096, 16384, 65536, 1048576)
}

fn main() -> ExitCode {
    if let boundscope::Availability::Unavailable(reason) = cuda::availability() {
        println!("SKIPPED: transformer_ops_bench: {reason}");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn trace<'a>(
    arena: &'a Arena,
    registry: &'a Registry,
    w: &Workload,
    batch: usize,
    dtype: DType,
) -> boundscope::Result<boundscope::Trace<'a>> {
    let mut b = TraceBuilder::new(arena, registry);
    let mut values = Vec::new();
    for (k, shape) in (w.inputs)(batch).iter().enumerate() {
        let dtype = if w.ids.iter().any(|&(i, _)| i == k) { DType::I64 } else { dtype };
        values.push(b.input_with(&TensorMeta::new(dtype, shape))?);
    }
    let y = (w.build)(&mut b, &values)?;
    b.output(y)?;
    b.finish()
}

fn inputs(w: &Workload, batch: usize, dtype: DType) -> Vec<Tensor> {
    (w.inputs)(batch)
        .iter()
        .enumerate()
        .map(|(k, shape)| match w.ids.iter().find(|&&(i, _)| i == k) {
            Some(&(_, bound)) => {
                let n: usize = shape.iter().product();
                Tensor::from_vec(shape, (0..n).map(|i: usize| (i.wrapping_mul(2654435761) % bound) as i64).collect())
                    .expect("the shape's count")
            }
            None => Tensor::from_fn(shape, |i| {
                ((i.wrapping_mul(2654435761).wrapping_add(k * 97) % 1000) as f32 / 500.0) - 1.0
            })
            .to_dtype(dtype),
        })
        .collect()
}

fn run() -> Result<(), String> {
    let e = |e: boundscope::Error| e.to_string();
    let gpu = CudaDevice::new().map_err(e)?;
    let device: Arc<dyn Device> = gpu.clone();
    println!("device: {}", device.name());
    let registry = Registry::with_builtins();
    // An optional first argument names the workloads to run (comma-separated).
    let only = std::env::args().nth(1);
    let wanted = |name: &str| {
        let row_op = ["softmax_", "layer_norm_", "sum_sq_"].iter().any(|p| name.starts_with(p));
        let swept = name.starts_with("attention_") && name != "attention_training";
        only.as_deref().is_none_or(|list| {
            list.split(',').any(|n| n == name || (n == "rows" && row_op) || (n == "attention_sweep" && swept))
        })
    };
    for dtype in [DType::F32, DType::BF16] {
        for w in workloads().into_iter().filter(|w| wanted(w.name)) {
            // Correctness first, at batch 1, against the CPU reference.
            let arena = Arena::new();
            let small = trace(&arena, &registry, &w, 1, dtype).map_err(e)?;
            let diff = check_against_reference(
                &gpu,
                &small,
                &arena,
                &inputs(&w, 1, dtype),
                dtype,
                w.name,
                KernelVariants::default(),
            )?;
            // Then the full shape, inputs on the device, outputs left there.
            let batch = 8;
            let full = trace(&arena, &registry, &w, batch, dtype).map_err(e)?;
            let plan = gpu_plan(&gpu, &full, &arena).map_err(e)?;
            let ms = ms_per_device_run(&device, &plan, &inputs(&w, batch, dtype), 100)?;
            let bytes = useful_bytes(&full);
            let flops = (w.flops)(batch);
            let steps = plan.steps_per_executor();
            println!(
                "RESULT {{\"impl\":\"boundscope\",\"op\":\"{}\",\"dtype\":\"{dtype}\",\"ms\":{ms},\"gbps\":{},\"tflops\":{},\"check\":{diff}}}",
                w.name,
                bytes as f64 / (ms * 1e-3) / 1e9,
                flops / (ms * 1e-3) / 1e12,
            );
            eprintln!("{} {dtype}: {ms:.3} ms per run, steps {steps:?}", w.name);
        }
    }
    Ok(())
}
