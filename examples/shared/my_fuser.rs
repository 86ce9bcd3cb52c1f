//! `MyFuser`, a user's fusion executor, and `swish`, a user's symbol: shared by the examples
//! that embed boundscope with their own executor (`custom_executor`, `ranges_in_three_domains`).

use boundscope::{
    kernel_fn, Arena, Category, EmittedRange, Executor, Fusible, Kernel, OpView, ParamKind, Registry, Symbol, Trace,
    TraceBuilder,
};

/// The scalar swish function.
pub fn swish(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Our elementwise symbol, with its own CPU kernel.
pub fn swish_symbol() -> Symbol {
    Symbol::new("swish", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first().cpu_kernel(|_| {
        Ok(kernel_fn(|inputs, outputs| {
            for (o, &x) in outputs[0].values_mut::<f32>()?.iter_mut().zip(inputs[0].values::<f32>()?) {
                *o = swish(x);
            }
            Ok(())
        }))
    })
}

/// The scalar function of each unary op MyFuser can fuse.
fn scalar_fn(name: &str) -> Option<fn(f32) -> f32> {
    Some(match name {
        "neg" => |x: f32| -x,
        "exp" => f32::exp,
        "tanh" => f32::tanh,
        "relu" => |x: f32| if x > 0.0 || x.is_nan() { x } else { 0.0 }, // NaN stays NaN, as in PyTorch
        "swish" => swish,
        _ => return None,
    })
}

/// Fuses chains of unary ops into one loop; emits an NVTX range per region, in its own domain.
pub struct MyFuser;

pub const MY_DOMAIN: &str = "my_fuser";
/// MyFuser pushes its region ranges in its own domain, and says so.
static EMITS: [EmittedRange; 1] = [EmittedRange::nvtx_regions(MY_DOMAIN)];

impl Executor for MyFuser {
    fn name(&self) -> &str {
        "my_fuser"
    }

    fn fusion_prefix(&self) -> &str {
        "My"
    }

    fn fusible(&self, op: &OpView<'_>) -> Fusible {
        if scalar_fn(op.name()).is_some() {
            Fusible::Elementwise
        } else {
            Fusible::No
        }
    }

    /// Our regions with one input and one output; others run unfused on the other executors.
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.is_region_of(self) && op.bound_symbol().inputs().count() == 1 && op.output_count() == 1
    }

    fn compile(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn Kernel>> {
        let chain: Vec<fn(f32) -> f32> = op.region_ops()?.iter().filter_map(|o| scalar_fn(o.name())).collect();
        // Profiling asked for a range around this region: push it ourselves, in our domain.
        let range = op.region_range().map(|r| r.prepare()).transpose()?;
        Ok(kernel_fn(move |inputs, outputs| {
            let x = inputs[0].values::<f32>()?;
            let out = outputs[0].values_mut::<f32>()?;
            let mut run = || {
                for (o, &x) in out.iter_mut().zip(x) {
                    *o = chain.iter().fold(x, |v, f| f(v));
                }
            };
            match &range {
                Some(range) => range.in_scope(run),
                None => run(),
            }
            Ok(())
        }))
    }

    fn emits(&self) -> &[EmittedRange] {
        &EMITS
    }
}

/// `z = matmul(neg(swish(tanh(matmul(x, w)))), w)` on `[n, n]` inputs: a chain MyFuser fuses
/// between two ops it does not. `registry` must hold `swish` ([`swish_symbol`]).
pub fn swish_program<'a>(arena: &'a Arena, registry: &'a Registry, n: usize) -> boundscope::Result<Trace<'a>> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[n, n])?;
    let w = b.input(&[n, n])?;
    let h = b.matmul(x, w)?;
    let t = b.tanh(h)?;
    let s = b.call("swish", &[t.into()])?;
    let y = b.neg(s)?;
    let z = b.matmul(y, w)?;
    b.output(z)?;
    b.finish()
}
