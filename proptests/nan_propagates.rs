//! NaN propagates as in PyTorch: `relu(NaN)`, `maximum(NaN, x)`, `maximum(x, NaN)` and `max`
//! over a row holding a NaN are NaN, on every CPU executor, fused or not.

use boundscope::executors::{math, CpuFusion, CpuReference};
use boundscope::passes::{FuseRegions, Pass};
use boundscope::{Arena, Plan, Registry, Tensor, Trace, TraceBuilder};

const NAN: f32 = f32::NAN;

/// `x` is `[2, 4]` with a NaN in row 0; `c` is `[2, 1]`, NaN in row 1. Outputs, in order:
/// `relu(x)`, `maximum(x, y)`, `maximum(y, x)`, `maximum(x, NaN)`, `maximum(y, c)`, `max(x)`,
/// `max(maximum(y, c))`.
fn nan_trace<'a>(arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[2, 4]).unwrap();
    let y = b.input(&[2, 4]).unwrap();
    let c = b.input(&[2, 1]).unwrap();
    let r = b.relu(x).unwrap();
    let xy = b.maximum(x, y).unwrap();
    let yx = b.maximum(y, x).unwrap();
    let xs = b.maximum_scalar(x, NAN).unwrap();
    let mx = b.max(x).unwrap();
    // A second region: a row broadcast, then its rows' maximum.
    let yc = b.maximum(y, c).unwrap();
    let myc = b.max(yc).unwrap();
    for v in [r, xy, yx, xs, yc, mx, myc] {
        b.output(v).unwrap();
    }
    b.finish().unwrap()
}

fn inputs() -> [Tensor; 3] {
    [
        Tensor::new(&[2, 4], vec![-1.0, NAN, 2.0, 0.5, 3.0, -2.0, 1.0, -0.5]).unwrap(),
        Tensor::new(&[2, 4], vec![0.0, 1.0, NAN, -3.0, 1.0, 1.0, 1.0, 1.0]).unwrap(),
        Tensor::new(&[2, 1], vec![0.25, NAN]).unwrap(),
    ]
}

/// What PyTorch gives (`torch.relu`, `torch.maximum`, `amax(-1, keepdim=True)`).
fn expected() -> Vec<Vec<f32>> {
    vec![
        vec![0.0, NAN, 2.0, 0.5, 3.0, 0.0, 1.0, 0.0],
        vec![0.0, NAN, NAN, 0.5, 3.0, 1.0, 1.0, 1.0],
        vec![0.0, NAN, NAN, 0.5, 3.0, 1.0, 1.0, 1.0],
        vec![NAN; 8],
        vec![0.25, 1.0, NAN, 0.25, NAN, NAN, NAN, NAN],
        vec![NAN, 3.0],
        vec![NAN, NAN],
    ]
}

/// Equal, NaN matching NaN.
fn check(executor: &str, got: &[Tensor]) {
    for (i, (g, e)) in got.iter().zip(expected()).enumerate() {
        let same = g.to_f32_vec().len() == e.len()
            && g.to_f32_vec().iter().zip(&e).all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
        assert!(same, "{executor}: output {i} is {:?}, PyTorch gives {e:?}", g.to_f32_vec());
    }
}

#[test]
fn the_reference_propagates_nan() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = nan_trace(&arena, &registry);
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let inputs = inputs();
    check("cpu_reference", &plan.run(&[&inputs[0], &inputs[1], &inputs[2]]).unwrap());
}

#[test]
fn fused_regions_propagate_nan() {
    let (arena, registry) = (Arena::new(), Registry::with_builtins());
    let trace = nan_trace(&arena, &registry);
    let fused = FuseRegions::new(CpuFusion::shared()).min_ops(1).run(&trace, &arena).unwrap();
    let plan = Plan::compile(&fused, &[CpuFusion::shared(), CpuReference::shared()]).unwrap();
    assert_eq!(plan.steps_per_executor(), vec![("cpu_fusion", fused.len())], "{fused}");
    let inputs = inputs();
    check("cpu_fusion", &plan.run(&[&inputs[0], &inputs[1], &inputs[2]]).unwrap());
}

#[test]
fn the_scalar_functions_propagate_nan() {
    assert!(math::relu(NAN).is_nan());
    assert!(math::maximum(NAN, 1.0).is_nan() && math::maximum(1.0, NAN).is_nan());
    assert!(math::maximum(NAN, f32::NEG_INFINITY).is_nan() && math::maximum(f32::INFINITY, NAN).is_nan());
    assert_eq!((math::relu(-0.5), math::relu(0.0), math::relu(2.0)), (0.0, 0.0, 2.0));
    assert_eq!((math::maximum(1.0, 2.0), math::maximum(2.0, 1.0)), (2.0, 2.0));
}
