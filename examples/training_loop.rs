//! Training a small classifier with gradients from `passes::Grad`, profiled by module.
//!
//! ```text
//! cargo run --release --example training_loop
//! scripts/nsys-check target/release/examples/training_loop   # under Nsight Systems
//! training_loop --cuda    # on a GPU: CudaFusion and CudaOps (the CPU reference for the rest)
//! ```
//! A two-layer MLP (`fc1`: `linear` 2 -> 32, `act`: `gelu`, `fc2`: `linear` 32 -> 3, then
//! `cross_entropy`) learns which of three blobs each of 96 generated points comes from. One
//! trace holds the forward and, from `passes::Grad`, the backward: every op has an NVTX range
//! (`ProfileOps`), every module a range of its path, and each op's backward a range
//! `<op> (backward)` inside the scope `backward.<module>`, so Nsight Systems shows a step as
//! forward, then backward, grouped by module, then the optimizer. AdamW (learning rate 0.05)
//! updates the weights and its moments in place inside the same plan (`optim::AdamW`,
//! `Plan::run_updating`): the gradients never leave it, and the plan is fused for `CpuFusion`
//! (or `CudaFusion`).
//! Prints the loss per step and exits non-zero unless it falls to a tenth of where it starts.

use std::process::ExitCode;

use boundscope::guards::{NvtxRange, Selection};
use boundscope::optim::AdamW;
use boundscope::passes::{FuseRegions, Grad, Pass, Pipeline, ProfileOps};
use boundscope::{Arena, DType, Plan, Registry, Tensor, TensorMeta, TraceBuilder};

#[path = "shared/executors.rs"]
mod executors;
#[path = "shared/nsys_check.rs"]
mod nsys_check;
use executors::executors;

const POINTS: usize = 96;
const HIDDEN: usize = 32;
const CLASSES: usize = 3;
const STEPS: usize = 60;
const LEARNING_RATE: f32 = 0.05;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A deterministic value in [-1, 1) for `i` (no random-number crate needed).
fn noise(i: usize) -> f32 {
    let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let h = (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Points around three centres on a circle, and the centre each comes from.
fn blobs() -> (Vec<f32>, Vec<i64>) {
    let mut points = Vec::with_capacity(POINTS * 2);
    let mut labels = Vec::with_capacity(POINTS);
    for p in 0..POINTS {
        let class = p % CLASSES;
        let angle = class as f32 * std::f32::consts::TAU / CLASSES as f32;
        points.push(2.0 * angle.cos() + 0.6 * noise(2 * p));
        points.push(2.0 * angle.sin() + 0.6 * noise(2 * p + 1));
        labels.push(class as i64);
    }
    (points, labels)
}

fn run() -> boundscope::Result<bool> {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[POINTS, 2])?;
    let targets = b.input_with(&TensorMeta::new(DType::I64, &[POINTS]))?;
    let (w1, b1) = (b.input(&[HIDDEN, 2])?, b.input(&[HIDDEN])?);
    let (w2, b2) = (b.input(&[CLASSES, HIDDEN])?, b.input(&[CLASSES])?);
    let h = b.scope("fc1", |b| b.linear(x, w1, Some(b1)))?;
    let h = b.scope("act", |b| b.gelu(h))?;
    let logits = b.scope("fc2", |b| b.linear(h, w2, Some(b2)))?;
    let loss = b.scope("loss", |b| b.cross_entropy(logits, targets))?;
    b.output(loss)?;
    let forward = b.finish()?;

    // A range on every op and module (and one around each step), then the backward.
    let profiled = ProfileOps::new().with_trace_range(NvtxRange::new().label("step")?).run(&forward, &arena)?;
    let parameters = [w1, b1, w2, b2];
    // Then AdamW, in place, in the scope `optimizer`: the step's outputs are the loss and the
    // updates (the gradients need not leave the plan).
    let adamw = AdamW::new();
    let mut step = Grad::new(&parameters).training_step(&profiled, &arena, &adamw)?.trace;
    step.attach_guard(Selection::Scope("optimizer"), NvtxRange::new())?;
    let (fusion, executors) = executors(std::env::args().any(|a| a == "--cuda"))?;
    let fused = FuseRegions::new(fusion).run(&Pipeline::for_executors(&executors).run(&step, &arena)?, &arena)?;
    let plan = Plan::compile(&fused, &executors)?;
    eprintln!("{plan}");

    // Every input of the step, in the trace's order: data, parameters, AdamW's per-step
    // values, each parameter's moments (zeros).
    let (points, labels) = blobs();
    let mut tensors = vec![Tensor::new(&[POINTS, 2], points)?, Tensor::from_vec(&[POINTS], labels)?];
    tensors.push(Tensor::from_fn(&[HIDDEN, 2], |i| 0.5 * noise(1000 + i)));
    tensors.push(Tensor::new(&[HIDDEN], vec![0.0; HIDDEN])?);
    tensors.push(Tensor::from_fn(&[CLASSES, HIDDEN], |i| 0.2 * noise(2000 + i)));
    tensors.push(Tensor::new(&[CLASSES], vec![0.0; CLASSES])?);
    for &v in &step.inputs()[tensors.len()..] {
        tensors.push(Tensor::from_fn(&step.value_meta(v)?.shape, |_| 0.0));
    }
    let mut inputs: Vec<&mut Tensor> = tensors.iter_mut().collect();
    let mut workspace = plan.workspace()?;
    let mut losses = Vec::with_capacity(STEPS);
    for t in 1..=STEPS as u64 {
        for (slot, value) in inputs[6..9].iter_mut().zip(adamw.step_scalars(t, LEARNING_RATE)) {
            slot.values_mut::<f32>()?[0] = value;
        }
        let out = plan.run_updating(&mut workspace, &mut inputs)?;
        let loss = out.get(0).map_or(f32::NAN, |l| l.values::<f32>().map_or(f32::NAN, |v| v[0]));
        println!("step {t:>3}  loss {loss:.4}");
        losses.push(loss);
    }
    nsys_check::write_expected_ranges(&plan.range_map().counts_tsv(STEPS));
    let (first, last) = (losses[0], losses[STEPS - 1]);
    // (A NaN loss fails too.)
    if last.is_nan() || last >= first / 10.0 {
        eprintln!("error: the loss went from {first} to {last}; it should fall to a tenth");
        return Ok(false);
    }
    Ok(true)
}
