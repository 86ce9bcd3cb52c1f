//! The programs the benchmarks measure: the two chains of the fusion benchmarks, shared by
//! `benches/fusion.rs` (CPU) and `examples/cuda_bench.rs` (GPU), and the 1,000 trivial ops of
//! the guards ladder, shared by `benches/guards.rs` (wall clock) and
//! `benches/instruction_counts.rs` (instructions), so that each pair times the same program.
#![allow(dead_code)]

use boundscope::{Arena, Registry, Trace, TraceBuilder};

/// Row length of the layer-norm-like chain.
pub const COLS: usize = 1024;

/// `x = a*b + 1; y = x*sigmoid(x)` over `n` elements.
pub fn swish_chain<'a>(arena: &'a Arena, registry: &'a Registry, n: usize) -> Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let a = b.input(&[n]).expect("valid");
    let c = b.input(&[n]).expect("valid");
    let ab = b.mul(a, c).expect("valid");
    let x = b.add_scalar(ab, 1.0).expect("valid");
    let s = b.sigmoid(x).expect("valid");
    let y = b.mul(x, s).expect("valid");
    b.output(y).expect("valid");
    b.finish().expect("valid")
}

/// `y = (x - mean) * rstd * w + b` over `[n / COLS, COLS]`, `mean` and `rstd` per row, `w` and
/// `b` per column.
pub fn norm_chain<'a>(arena: &'a Arena, registry: &'a Registry, n: usize) -> Trace<'a> {
    let rows = n / COLS;
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[rows, COLS]).expect("valid");
    let mean = b.input(&[rows, 1]).expect("valid");
    let rstd = b.input(&[rows, 1]).expect("valid");
    let w = b.input(&[COLS]).expect("valid");
    let bias = b.input(&[COLS]).expect("valid");
    let c = b.sub(x, mean).expect("valid");
    let m = b.mul(c, rstd).expect("valid");
    let s = b.mul(m, w).expect("valid");
    let y = b.add(s, bias).expect("valid");
    b.output(y).expect("valid");
    b.finish().expect("valid")
}

/// `ops` alternating `add_scalar` and `mul` ops on a 1-element input: runtime and guard overhead
/// with next to no arithmetic.
pub fn trivial_chain<'a>(arena: &'a Arena, registry: &'a Registry, ops: usize) -> Trace<'a> {
    scoped_trivial_chain(arena, registry, ops, 0)
}

/// [`trivial_chain`], with every `per_scope` ops (0: none) in a scope `layer.<k>`, all inside
/// one scope `model`.
#[allow(dead_code)] // not every benchmark that includes this file uses every chain
pub fn scoped_trivial_chain<'a>(arena: &'a Arena, registry: &'a Registry, ops: usize, per_scope: usize) -> Trace<'a> {
    let mut b = TraceBuilder::with_capacity(arena, registry, ops);
    let x = b.input(&[1]).expect("valid");
    let mut v = x;
    if per_scope > 0 {
        b.enter_scope("model").expect("valid");
    }
    for i in 0..ops {
        if per_scope > 0 && i % per_scope == 0 {
            if i > 0 {
                b.exit_scope().expect("open");
            }
            b.enter_scope(&format!("{}", i / per_scope)).expect("valid");
        }
        v = if i % 2 == 0 { b.add_scalar(v, 1.0) } else { b.mul(v, x) }.expect("valid");
    }
    if per_scope > 0 {
        b.exit_scope().expect("open");
        b.exit_scope().expect("open");
    }
    b.output(v).expect("valid");
    b.finish().expect("valid")
}
