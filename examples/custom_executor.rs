//! Embedding boundscope: your own symbol and your own fusion executor, beside the built-in
//! ones, with NVTX ranges that still nest correctly.
//!
//! ```text
//! cargo run --release --example custom_executor
//! ```
//! `MyFuser` fuses chains of unary elementwise ops (the built-in ones and our own `swish`) into
//! one loop, and pushes its own NVTX range per region in its own domain (`my_fuser`), as
//! nvFuser does. It declares that it does, so the runtime emits no second range for its
//! regions; it takes the label the runtime would have used from the plan. Exits non-zero if the
//! fused result differs from the reference, or if any region got more or fewer than one range.

use std::process::ExitCode;
use std::sync::Arc;

use boundscope::executors::CpuReference;
use boundscope::guards::{GuardKind, Level, NvtxRange, Recorder, Selection};
use boundscope::passes::{FuseRegions, Pass, ProfileOps};
use boundscope::{
    kernel_fn, Arena, Category, EmittedRange, Executor, Fusible, Kernel, OpView, ParamKind, Plan, Registry, Symbol,
    Tensor, TraceBuilder,
};

fn swish(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Our elementwise symbol, with its own CPU kernel.
fn swish_symbol() -> Symbol {
    Symbol::new("swish", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first().cpu_kernel(|_| {
        Ok(kernel_fn(|inputs, outputs| {
            for (o, &x) in outputs[0].data.iter_mut().zip(inputs[0].data) {
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
        "relu" => |x: f32| x.max(0.0),
        "swish" => swish,
        _ => return None,
    })
}

/// Fuses chains of unary ops into one loop; emits an NVTX range per region, in its own domain.
struct MyFuser;

const MY_DOMAIN: &str = "my_fuser";
const EMITS: [EmittedRange; 1] = [EmittedRange { kind: GuardKind::NvtxRange, level: Level::Region }];

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
        let range = op.region_range().map(|r| r.prepare(self.name(), Some(MY_DOMAIN))).transpose()?;
        Ok(kernel_fn(move |inputs, outputs| {
            let mut run = || {
                for (o, &x) in outputs[0].data.iter_mut().zip(inputs[0].data) {
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

fn run() -> boundscope::Result<bool> {
    let mut registry = Registry::with_builtins();
    registry.register(swish_symbol())?;
    let arena = Arena::new();

    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[256, 256])?;
    let w = b.input(&[256, 256])?;
    let h = b.matmul(x, w)?;
    let t = b.tanh(h)?;
    let s = b.call("swish", &[t.into()])?;
    let y = b.neg(s)?;
    let z = b.matmul(y, w)?;
    b.output(z)?;
    let trace = b.finish()?;

    // Profile every op and the run, record the range tree, fuse for MyFuser.
    let mut profiled = ProfileOps::new().with_trace_range(NvtxRange::new().label("step")?).run(&trace, &arena)?;
    let recorder = Recorder::new();
    profiled.attach_trace_guard(recorder.clone())?;
    profiled.attach_guard(Selection::All, recorder.clone())?;
    let my_fuser: Arc<dyn Executor> = Arc::new(MyFuser);
    let fused = FuseRegions::new(my_fuser.clone()).run(&profiled, &arena)?;
    println!("{fused}");

    let plan = Plan::compile(&fused, &[my_fuser, CpuReference::shared()])?;
    println!("{plan}");
    let inputs = [
        Tensor::from_fn(&[256, 256], |i| (i % 17) as f32 / 17.0 - 0.5),
        Tensor::from_fn(&[256, 256], |i| (i % 13) as f32 / 130.0),
    ];
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let got = plan.run(&refs)?;
    let reference = Plan::compile(&trace, &[CpuReference::shared()])?.run(&refs)?;
    let diff = got[0].max_abs_diff(&reference[0]);
    println!("max |fused - reference| = {diff:.3e}");

    // The range tree: the run ⊃ one range per op or region, none duplicated.
    let ranges = recorder.ranges();
    for r in &ranges {
        let depth = if r.parent.is_some() { 1 } else { 0 };
        println!(
            "{:indent$}{} [{}] {:.1} us",
            "",
            r.label,
            r.level.name(),
            (r.end_ns - r.start_ns) as f64 / 1e3,
            indent = 2 * depth
        );
    }
    let regions = ranges.iter().filter(|r| r.level == Level::Region).count();
    let one_per_region = regions == 1 && ranges.len() == 1 + fused.len();
    println!(
        "{regions} region range(s) in the record; the NVTX one is pushed by MyFuser in domain `{MY_DOMAIN}`, \
         the runtime pushed none for it"
    );
    // For scripts/nsys-check: one run; its range and the two matmuls in our library's domain,
    // the region's one range in MyFuser's.
    println!("boundscope-expected-ranges: boundscope {}", 1 + fused.len() - regions);
    println!("boundscope-expected-ranges: {MY_DOMAIN} {regions}");
    Ok(diff <= 1e-5 && one_per_region)
}
