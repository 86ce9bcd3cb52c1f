//! Building traces of 1,000 and 10,000 bound symbols in a reused arena, against a baseline
//! that boxes each bound symbol and keeps the boxes in a `Vec`.
//!
//! Figure it exists to show: the arena builder is at least 3x faster than the baseline and
//! makes zero heap allocations per bound symbol (printed before the timings).
//!
//! `cargo bench --bench trace_build`

mod counting_allocator;

use std::hint::black_box;

use boundscope::{Arena, Registry, TraceBuilder, ValueId};
use counting_allocator::{allocations_during, CountingAllocator};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// A chain of `n` checked bound symbols alternating `add(x, 1.0)`, `mul(x, y)` and `exp(x)`.
fn build_arena(arena: &Arena, registry: &Registry, n: usize, sized: bool) -> usize {
    let mut b =
        if sized { TraceBuilder::with_capacity(arena, registry, n) } else { TraceBuilder::new(arena, registry) };
    let x = b.input(&[4]).expect("valid");
    let mut v = x;
    for i in 0..n {
        v = match i % 3 {
            0 => b.add_scalar(v, 1.0),
            1 => b.mul(v, x),
            _ => b.exp(v),
        }
        .expect("valid");
    }
    b.output(v).expect("valid");
    b.finish().expect("valid").len()
}

/// The baseline: the same bound symbols, each in its own `Box`, with `Vec` fields, unchecked.
// The boxes are the point of this baseline.
#[allow(dead_code, clippy::vec_box)]
struct BoxedBoundSymbol {
    symbol: u32,
    args: Vec<ValueId>,
    scalars: Vec<f32>,
    outputs: Vec<ValueId>,
    output_shape: Vec<usize>,
    subsymbols: Vec<Box<BoxedBoundSymbol>>,
}

fn build_boxed(n: usize) -> usize {
    let mut trace: Vec<Box<BoxedBoundSymbol>> = Vec::new();
    let mut v = 0usize;
    for i in 0..n {
        let (args, scalars) = match i % 3 {
            0 => (vec![ValueId::from_index(v)], vec![1.0]),
            1 => (vec![ValueId::from_index(v), ValueId::from_index(0)], vec![]),
            _ => (vec![ValueId::from_index(v)], vec![]),
        };
        v += 1;
        trace.push(Box::new(BoxedBoundSymbol {
            symbol: (i % 3) as u32,
            args,
            scalars,
            outputs: vec![ValueId::from_index(v)],
            output_shape: vec![4],
            subsymbols: Vec::new(),
        }));
    }
    black_box(&trace);
    trace.len()
}

fn report_allocations(registry: &Registry) {
    let mut arena = Arena::new();
    for n in [1_000, 10_000] {
        build_arena(&arena, registry, n, false); // warm the arena up to size
        arena.reset();
        let (arena_allocs, _) = allocations_during(|| build_arena(&arena, registry, n, false));
        arena.reset();
        let (boxed_allocs, _) = allocations_during(|| build_boxed(n));
        println!(
            "trace_build/{n}: heap allocations: arena (reused) {arena_allocs} ({:.4} per bound symbol), \
             boxed baseline {boxed_allocs} ({:.2} per bound symbol)",
            arena_allocs as f64 / n as f64,
            boxed_allocs as f64 / n as f64
        );
    }
}

fn trace_build(c: &mut Criterion) {
    let registry = Registry::with_builtins();
    report_allocations(&registry);
    let mut group = c.benchmark_group("trace_build");
    for n in [1_000usize, 10_000] {
        group.throughput(Throughput::Elements(n as u64));
        let mut arena = Arena::new();
        for (name, sized) in [("arena", false), ("arena_with_capacity", true)] {
            group.bench_with_input(BenchmarkId::new(name, n), &n, |bench, &n| {
                bench.iter(|| {
                    let len = build_arena(&arena, &registry, n, sized);
                    arena.reset();
                    len
                })
            });
        }
        group.bench_with_input(BenchmarkId::new("boxed_baseline", n), &n, |bench, &n| bench.iter(|| build_boxed(n)));
    }
    group.finish();
}

criterion_group!(benches, trace_build);
criterion_main!(benches);
