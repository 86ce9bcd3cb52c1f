//! 100 training steps of a small classifier (`linear`, `gelu`, `linear`, `cross_entropy`;
//! gradients and SGD with momentum in place from `passes::Grad::training_step` and `optim::Sgd`,
//! run by `Plan::run_updating`), fused or not, give the losses of the same training written out by
//! hand here in `f64`: forward, backward and update.

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::optim::Sgd;
use boundscope::passes::{FuseRegions, Grad, Pass};
use boundscope::{Arena, DType, Executor, Plan, Registry, Tensor, TensorMeta, TraceBuilder};
use std::sync::Arc;

const N: usize = 24;
const H: usize = 8;
const C: usize = 3;
const STEPS: usize = 100;
const LR: f32 = 0.1;
const MOMENTUM: f32 = 0.9;

fn value(i: usize) -> f32 {
    ((i * 37 + 11) % 101) as f32 / 101.0 - 0.5
}

struct Data {
    x: Vec<f32>,
    targets: Vec<i64>,
    params: [Vec<f32>; 4],
}

fn data() -> Data {
    let x: Vec<f32> = (0..N * 2).map(|i| 3.0 * value(i)).collect();
    // The class: how many of the two coordinates are positive.
    let targets = (0..N).map(|r| (x[2 * r] > 0.0) as i64 + (x[2 * r + 1] > 0.0) as i64).collect();
    Data {
        x,
        targets,
        params: [
            (0..H * 2).map(|i| value(500 + i)).collect(),
            vec![0.0; H],
            (0..C * H).map(|i| value(900 + i)).collect(),
            vec![0.0; C],
        ],
    }
}

fn gelu(x: f64) -> (f64, f64) {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let k = 0.044715;
    let t = (c * (x + k * x * x * x)).tanh();
    (0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * k * x * x))
}

/// The losses of `STEPS` steps, by hand.
fn by_hand(d: &Data) -> Vec<f64> {
    let mut p: Vec<Vec<f64>> = d.params.iter().map(|v| v.iter().map(|&x| x as f64).collect()).collect();
    let mut buf: Vec<Vec<f64>> = p.iter().map(|v| vec![0.0; v.len()]).collect();
    let x: Vec<f64> = d.x.iter().map(|&v| v as f64).collect();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (w1, b1, w2, b2) = (&p[0], &p[1], &p[2], &p[3]);
        let mut h = vec![0.0; N * H];
        let mut a = vec![0.0; N * H];
        let mut slope = vec![0.0; N * H];
        for r in 0..N {
            for j in 0..H {
                h[r * H + j] = b1[j] + (0..2).map(|i| x[r * 2 + i] * w1[j * 2 + i]).sum::<f64>();
                (a[r * H + j], slope[r * H + j]) = gelu(h[r * H + j]);
            }
        }
        let mut dlogits = vec![0.0; N * C];
        let mut loss = 0.0;
        for r in 0..N {
            let logits: Vec<f64> =
                (0..C).map(|c| b2[c] + (0..H).map(|j| a[r * H + j] * w2[c * H + j]).sum::<f64>()).collect();
            let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
            let t = d.targets[r] as usize;
            loss -= (logits[t] - m - z.ln()) / N as f64;
            for c in 0..C {
                dlogits[r * C + c] = ((logits[c] - m).exp() / z - if c == t { 1.0 } else { 0.0 }) / N as f64;
            }
        }
        losses.push(loss);
        let mut grads: Vec<Vec<f64>> = p.iter().map(|v| vec![0.0; v.len()]).collect();
        let mut dh = vec![0.0; N * H];
        for r in 0..N {
            for c in 0..C {
                let g = dlogits[r * C + c];
                grads[3][c] += g;
                for j in 0..H {
                    grads[2][c * H + j] += g * a[r * H + j];
                    dh[r * H + j] += g * w2[c * H + j];
                }
            }
        }
        for r in 0..N {
            for j in 0..H {
                let g = dh[r * H + j] * slope[r * H + j];
                grads[1][j] += g;
                for i in 0..2 {
                    grads[0][j * 2 + i] += g * x[r * 2 + i];
                }
            }
        }
        for k in 0..4 {
            for i in 0..p[k].len() {
                buf[k][i] = if step == 0 { grads[k][i] } else { MOMENTUM as f64 * buf[k][i] + grads[k][i] };
                p[k][i] -= LR as f64 * buf[k][i];
            }
        }
    }
    losses
}

fn by_plan(d: &Data, fused: bool) -> Vec<f32> {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[N, 2]).unwrap();
    let targets = b.input_with(&TensorMeta::new(DType::I64, &[N])).unwrap();
    let params = [b.input(&[H, 2]).unwrap(), b.input(&[H]).unwrap(), b.input(&[C, H]).unwrap(), b.input(&[C]).unwrap()];
    let h = b.linear(x, params[0], Some(params[1])).unwrap();
    let a = b.gelu(h).unwrap();
    let logits = b.linear(a, params[2], Some(params[3])).unwrap();
    let loss = b.cross_entropy(logits, targets).unwrap();
    b.output(loss).unwrap();
    let sgd = Sgd::new().momentum(MOMENTUM);
    let mut step = Grad::new(&params).training_step(&b.finish().unwrap(), &arena, &sgd).unwrap().trace;
    let mut executors: Vec<Arc<dyn Executor>> = vec![CpuReference::shared()];
    if fused {
        let fusion = CpuFusion::shared();
        step = FuseRegions::new(fusion.clone()).run(&step, &arena).unwrap();
        executors.insert(0, fusion);
    }
    let plan = Plan::compile(&step, &executors).unwrap();
    let mut tensors =
        vec![Tensor::new(&[N, 2], d.x.clone()).unwrap(), Tensor::from_vec(&[N], d.targets.clone()).unwrap()];
    let shapes: [&[usize]; 4] = [&[H, 2], &[H], &[C, H], &[C]];
    for (values, shape) in d.params.iter().zip(shapes) {
        tensors.push(Tensor::new(shape, values.clone()).unwrap());
    }
    tensors.push(Tensor::new(&[], vec![0.0]).unwrap());
    tensors.push(Tensor::new(&[], vec![0.0]).unwrap());
    for shape in shapes {
        tensors.push(Tensor::from_fn(shape, |_| 0.0));
    }
    assert_eq!(tensors.len(), step.inputs().len());
    let mut inputs: Vec<&mut Tensor> = tensors.iter_mut().collect();
    let mut workspace = plan.workspace().unwrap();
    let mut losses = Vec::new();
    for t in 1..=STEPS as u64 {
        for (slot, v) in inputs[6..8].iter_mut().zip(sgd.step_scalars(t, LR)) {
            slot.values_mut::<f32>().unwrap()[0] = v;
        }
        losses
            .push(plan.run_updating(&mut workspace, &mut inputs).unwrap().get(0).unwrap().values::<f32>().unwrap()[0]);
    }
    losses
}

#[test]
fn a_hundred_steps_give_the_losses_written_out_by_hand() {
    let d = data();
    let expected = by_hand(&d);
    assert!(expected[STEPS - 1] < expected[0] * 0.6, "the hand-written training learns: {expected:?}");
    for fused in [false, true] {
        let got = by_plan(&d, fused);
        for (step, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert!((*g as f64 - e).abs() <= 2e-4 * (1.0 + e.abs()), "fused {fused}, step {step}: {g} vs {e}");
        }
    }
}
