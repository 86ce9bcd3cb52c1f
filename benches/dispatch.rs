//! Runtime overhead per bound symbol: a plan of 1,000 trivial ops on 1-element tensors, so that
//! executor and runtime overhead dominate.
//!
//! Figure it exists to show: at most 50 ns per bound symbol (time per iteration / 1,000; the
//! throughput line gives the same as ops per second).
//!
//! `cargo bench --bench dispatch`

use boundscope::executors::CpuReference;
use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const OPS: usize = 1_000;

fn dispatch(c: &mut Criterion) {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[1]).expect("valid");
    let mut v = x;
    for i in 0..OPS {
        v = if i % 2 == 0 { b.add_scalar(v, 1.0) } else { b.mul(v, x) }.expect("valid");
    }
    b.output(v).expect("valid");
    let trace = b.finish().expect("valid");
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).expect("compiles");
    let input = Tensor::new(&[1], vec![0.5]).expect("valid");
    let views = [input.view()];
    let mut workspace = plan.workspace().expect("allocates");

    let mut group = c.benchmark_group("dispatch");
    group.throughput(Throughput::Elements(OPS as u64));
    group.bench_function("cpu_reference_1000_ops", |bench| {
        bench.iter(|| plan.run_with(&mut workspace, &views).expect("runs").get(0).map(|t| t.data.f32_at(0)))
    });
    group.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
