use super::*;
use crate::core::guards::{Recorder, Selection};
use crate::core::ir::{Category, ParamKind, Registry, Symbol, TensorMeta};

fn two_layer<'a>(b: &mut TraceBuilder<'a>) -> (ValueId, ValueId, ValueId) {
    let x = b.input(&[2, 3]).unwrap();
    let w = b.input(&[4, 3]).unwrap();
    let h = b.scope("mlp", |b| b.linear(x, w, None)).unwrap();
    let y = b.scope("act", |b| b.tanh(h)).unwrap();
    let rows = b.sum(y).unwrap();
    let rows = b.reshape(rows, &[1, 2]).unwrap();
    let loss = b.sum(rows).unwrap();
    b.output(loss).unwrap();
    (x, w, loss)
}

#[test]
fn bad_requests_are_typed_errors() {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let (x, w, loss) = two_layer(&mut b);
    let trace = b.finish().unwrap();
    let invalid = |wrt: &[ValueId]| matches!(Grad::new(wrt).run(&trace, &arena), Err(Error::InvalidGradient { .. }));
    assert!(invalid(&[loss]), "not an input");
    assert!(invalid(&[w, w]), "listed twice");
    assert!(!invalid(&[x, w]));

    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 3]).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    let err = Grad::new(&[x]).run(&b.finish().unwrap(), &arena).unwrap_err();
    assert!(err.to_string().contains("one float element"), "{err}");

    let mut b = TraceBuilder::new(&arena, &registry);
    let ids = b.input_with(&TensorMeta::new(DType::I64, &[1])).unwrap();
    let x = b.input(&[1]).unwrap();
    let y = b.add(x, x).unwrap();
    b.output(y).unwrap();
    let err = Grad::new(&[ids]).run(&b.finish().unwrap(), &arena).unwrap_err();
    assert!(err.to_string().contains("only float inputs"), "{err}");
}

#[test]
fn a_prim_of_your_own_needs_a_rule_and_one_that_does_not_fit_is_named() {
    let mut registry = Registry::with_builtins();
    let mine = Symbol::new("mystery", Category::Elementwise).params(&[ParamKind::Tensor]).same_shape_as_first();
    let wrong = Symbol::new("wrong", Category::Elementwise)
        .params(&[ParamKind::Tensor])
        .same_shape_as_first()
        .vjp(|b, op| Ok(vec![Some(b.sum(op.cotangent)?)]));
    let mine = registry.register(mine).unwrap();
    let wrong = registry.register(wrong).unwrap();
    let arena = Arena::new();
    for (symbol, needle) in [(mine, "mystery"), (wrong, "shape [2, 1]")] {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 3]).unwrap();
        let y = b.bind(symbol, &[x.into()]).unwrap();
        let s = b.sum(y).unwrap();
        let s = b.reshape(s, &[2]).unwrap();
        let loss = b.max_dim(s, 0, false).unwrap();
        b.output(loss).unwrap();
        let trace = b.finish().unwrap();
        let err = Grad::new(&[x]).run(&trace, &arena).unwrap_err();
        assert!(matches!(err, Error::NoGradient { .. }) && err.to_string().contains(needle), "{err}");
    }
    // Off the path from the parameter to the loss, it needs no rule.
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[1]).unwrap();
    let other = b.input(&[1]).unwrap();
    let y = b.bind(mine, &[other.into()]).unwrap();
    let loss = b.mul(x, y).unwrap();
    b.output(loss).unwrap();
    assert!(Grad::new(&[x]).run(&b.finish().unwrap(), &arena).is_ok());
}

/// A rule that leaves an argument on the path without an entry is refused: that argument would
/// otherwise get zeros. One without entries for arguments off the path is fine.
#[test]
fn a_rule_with_too_few_or_too_many_entries_is_named() {
    let mut registry = Registry::with_builtins();
    let plus = |name: &str, entries: usize| {
        Symbol::new(name, Category::Composite)
            .params(&[ParamKind::Tensor, ParamKind::Tensor])
            .same_shape_as_first()
            .decomposition(|b, a| b.add(a[0].value().unwrap(), a[1].value().unwrap()))
            .vjp(move |_, op| Ok(vec![Some(op.cotangent); entries]))
    };
    let short = registry.register(plus("short_plus", 1)).unwrap();
    let long = registry.register(plus("long_plus", 3)).unwrap();
    let arena = Arena::new();
    let grads = |symbol, both: bool| {
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[3]).unwrap();
        let w = b.input(&[3]).unwrap();
        let y = b.bind(symbol, &[x.into(), w.into()]).unwrap();
        let loss = b.sum(y).unwrap();
        b.output(loss).unwrap();
        let parameters = if both { vec![x, w] } else { vec![x] };
        Grad::new(&parameters).run(&b.finish().unwrap(), &arena).map(|_| ())
    };
    for (symbol, both, needle) in
        [(short, true, "returned 1 gradients for 2"), (long, false, "returned 3 gradients for 2")]
    {
        let err = grads(symbol, both).unwrap_err();
        assert!(matches!(err, Error::NoGradient { .. }) && err.to_string().contains(needle), "{err}");
        assert!(err.to_string().contains("one entry per argument"), "{err}");
    }
    grads(short, false).unwrap();
}

#[test]
fn backward_ops_sit_in_backward_scopes_in_reverse_and_forward_guards_stay_there() {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let (_, w, _) = two_layer(&mut b);
    let mut trace = b.finish().unwrap();
    trace.attach_guard(Selection::All, Recorder::new()).unwrap();
    let before = trace.guard_attachment_count();
    let grads = Grad::new(&[w]).run(&trace, &arena).unwrap();
    grads.verify().unwrap();
    // On the forward ops as before, and one more per forward op around its backward.
    assert_eq!(grads.guard_attachment_count(), 2 * before);
    for (position, attachments) in trace.guards.per_op.iter().enumerate() {
        assert_eq!(&grads.guards.per_op[position], attachments);
    }
    let paths: Vec<&str> = grads.scopes().iter().map(|s| s.path()).collect();
    assert_eq!(paths, ["mlp", "act", "backward", "backward.act", "backward.mlp"]);
    let act = grads.scopes().iter().find(|s| s.path() == "backward.act").unwrap();
    let mlp = grads.scopes().iter().find(|s| s.path() == "backward.mlp").unwrap();
    assert!(act.positions().end <= mlp.positions().start);
    // The forward is the trace's own, first; the gradient is the last output.
    assert_eq!(grads.bound_symbols()[..trace.len()].len(), trace.len());
    assert_eq!(grads.value_meta(grads.outputs()[1]).unwrap().shape.as_slice(), &[4, 3]);
}

#[test]
fn a_parameter_the_loss_ignores_gets_zeros_and_16_bit_parameters_get_16_bit_gradients() {
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input_with(&TensorMeta::new(DType::BF16, &[3])).unwrap();
    let unused = b.input(&[2]).unwrap();
    let y = b.gelu(x).unwrap();
    let y = b.reshape(y, &[1, 3]).unwrap();
    let loss = b.sum(y).unwrap();
    b.output(loss).unwrap();
    let grads = Grad::new(&[x, unused]).run(&b.finish().unwrap(), &arena).unwrap();
    assert_eq!(grads.value_meta(grads.outputs()[1]).unwrap(), TensorMeta::new(DType::BF16, &[3]));
    let plan = crate::Plan::compile(&grads, &[crate::executors::CpuReference::shared()]).unwrap();
    let xs =
        crate::Tensor::from_vec(&[3], vec![half::bf16::from_f32(-1.0), half::bf16::ZERO, half::bf16::ONE]).unwrap();
    let out = plan.run(&[&xs, &crate::Tensor::new(&[2], vec![5.0, 6.0]).unwrap()]).unwrap();
    let slope = out[1].to_f32_vec();
    assert!(
        (slope[1] - 0.5).abs() < 1e-6 && (slope[2] - 1.0833).abs() < 4e-3 && (slope[0] + 0.0833).abs() < 4e-3,
        "{slope:?}"
    );
    assert_eq!(out[2].to_f32_vec(), &[0.0, 0.0]);
}

#[test]
fn profiling_guards_repeat_on_the_backward_labelled_as_such_and_scope_guards_follow_their_scope() {
    use crate::core::guards::NvtxRange;
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let (_, w, _) = two_layer(&mut b);
    let mut trace = b.finish().unwrap();
    let recorder = Recorder::new();
    trace.attach_guard(Selection::All, recorder.clone()).unwrap();
    trace.attach_guard(Selection::Scope("mlp"), recorder.clone()).unwrap();
    trace.attach_guard(Selection::All, NvtxRange::new()).unwrap();
    // A guard that changes behaviour (the default answer) stays on the forward.
    trace.attach_guard(Selection::All, crate::core::guards::ClosureGuard::new(|| {}, || {})).unwrap();
    let forward_attachments = trace.guard_attachment_count();
    let grads = Grad::new(&[w]).run(&trace, &arena).unwrap();
    grads.verify().unwrap();
    // Five forward ops, each with a backward: a recorder and an NVTX range more on each.
    assert_eq!(grads.guard_attachment_count(), forward_attachments + 2 * 5);
    let listing = grads.to_string();
    assert!(listing.contains("tanh (backward)") && listing.contains("linear (backward)"), "{listing}");
    let plan = crate::Plan::compile(&grads, &[crate::executors::CpuReference::shared()]).unwrap();
    let x = crate::Tensor::from_fn(&[2, 3], |i| i as f32 * 0.1);
    let w = crate::Tensor::from_fn(&[4, 3], |i| 0.05 * i as f32 - 0.2);
    plan.run(&[&x, &w]).unwrap();
    let labels: Vec<String> = recorder.ranges().iter().map(|r| r.label.to_string()).collect();
    let at = |l: &str| labels.iter().position(|x| x == l).unwrap_or_else(|| panic!("no `{l}` in {labels:?}"));
    // Forward, then backward in reverse: tanh's backward before linear's.
    assert!(at("linear") < at("tanh") && at("tanh") < at("tanh (backward)"));
    assert!(at("tanh (backward)") < at("linear (backward)"));
    assert!(labels.iter().any(|l| l == "mlp") && labels.iter().any(|l| l == "mlp (backward)"), "{labels:?}");
}

#[test]
fn attention_gradients_in_16_bits_follow_the_f32_ones() {
    // The 16-bit rule is its own code path (16-bit products, `f32` probabilities kept in 16
    // bits): with a wrong scale, mask or product it lands far from the `f32` gradients.
    let grads_in = |dtypes: [DType; 3], scale: Option<f32>, causal: bool| -> Vec<Vec<f32>> {
        let dtype = dtypes.into_iter().reduce(DType::promote).unwrap();
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let shape = [2, 3, 7, 8];
        let (q, k, v) = (b.input(&shape).unwrap(), b.input(&shape).unwrap(), b.input(&shape).unwrap());
        let w = b.input(&shape).unwrap();
        let [qc, kc, vc] = [(q, dtypes[0]), (k, dtypes[1]), (v, dtypes[2])].map(|(x, d)| {
            if d == DType::F32 {
                x
            } else {
                b.cast(x, d).unwrap()
            }
        });
        let y = b.scaled_dot_product_attention(qc, kc, vc, causal, scale).unwrap();
        let y = if dtype == DType::F32 { y } else { b.cast(y, DType::F32).unwrap() };
        let weighted = b.mul(y, w).unwrap();
        let flat = b.reshape(weighted, &[1, 2 * 3 * 7 * 8]).unwrap();
        let loss = b.sum(flat).unwrap();
        b.output(loss).unwrap();
        let grads = Grad::new(&[q, k, v]).run(&b.finish().unwrap(), &arena).unwrap();
        // One `scaled_dot_product_attention_backward` (in f32 too), whose decomposition's
        // products give the forward's dtype (16-bit products in 16 bits).
        let backward: Vec<_> = grads
            .bound_symbols()
            .iter()
            .filter(|s| grads.symbol_name(s) == "scaled_dot_product_attention_backward")
            .collect();
        assert_eq!(backward.len(), 1);
        fn products(trace: &crate::core::ir::Trace<'_>, bsym: &crate::BoundSymbol<'_>, dtypes: &mut Vec<DType>) {
            for sub in bsym.subsymbols() {
                if trace.symbol_name(sub) == "matmul" {
                    dtypes.push(trace.value_meta(sub.outputs()[0]).unwrap().dtype);
                }
                products(trace, sub, dtypes);
            }
        }
        let mut dtypes = Vec::new();
        products(&grads, backward[0], &mut dtypes);
        assert!(dtypes.len() >= 4 && dtypes.iter().all(|&d| d == dtype), "{dtypes:?}");
        let plan = crate::Plan::compile(&grads, &[crate::executors::CpuReference::shared()]).unwrap();
        let fill = |seed: usize| {
            crate::Tensor::from_fn(&shape, move |i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0) * 1.5)
        };
        let inputs = [fill(1), fill(2), fill(3), fill(4)];
        let out = plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap();
        out[1..].iter().map(|t| t.to_f32_vec()).collect()
    };
    // Mixed operands: the result's dtype decides (f32 here: every step in f32).
    let mixed = [[DType::BF16, DType::F32, DType::F32], [DType::F32, DType::BF16, DType::BF16]];
    for (scale, causal) in [(None, true), (Some(0.3), false)] {
        let exact = grads_in([DType::F32; 3], scale, causal);
        for dtypes in [[DType::BF16; 3], [DType::F16; 3], mixed[0], mixed[1]] {
            let dtype = if dtypes.contains(&DType::F16) { DType::F16 } else { DType::BF16 };
            let approx = grads_in(dtypes, scale, causal);
            for (which, (e, a)) in exact.iter().zip(&approx).enumerate() {
                let largest = e.iter().fold(0f32, |m, x| m.max(x.abs()));
                let error = e.iter().zip(a).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / largest;
                let tolerance = if dtype == DType::BF16 { 3e-2 } else { 4e-3 };
                assert!(error < tolerance, "{dtype:?} gradient {which} (scale {scale:?}, causal {causal}): {error}");
                assert!(largest > 0.1, "gradient {which} is too small to compare: {largest}");
            }
        }
    }
}

#[test]
fn the_gradients_of_slices_that_tile_an_axis_join_with_one_concat() {
    // `x` split in three along its last axis (attention's q, k and v), each piece used: its
    // gradient is one `concat` of the pieces' gradients, not three pads and two adds. A fourth,
    // overlapping slice makes the pieces not tile: pads and adds, with the same values.
    let run = |overlap: bool, guard_on_a_slice: bool| {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 9]).unwrap();
        let parts = b.split(x, 1, &[2, 3, 4]).unwrap();
        let mut total = None;
        for (i, &p) in parts.iter().enumerate() {
            let scaled = b.mul_scalar(p, (i + 1) as f32).unwrap();
            let squares = b.mul(scaled, p).unwrap();
            let s = b.sum(squares).unwrap();
            let s = b.reshape(s, &[1, 2]).unwrap();
            let s = b.sum(s).unwrap();
            total = Some(match total {
                Some(t) => b.add(t, s).unwrap(),
                None => s,
            });
        }
        let mut loss = total.unwrap();
        if overlap {
            let extra = b.slice(x, 1, 1, 3).unwrap();
            let extra = b.reshape(extra, &[1, 4]).unwrap();
            let extra = b.sum(extra).unwrap();
            loss = b.add(loss, extra).unwrap();
        }
        b.output(loss).unwrap();
        let mut trace = b.finish().unwrap();
        let recorder = Recorder::new();
        if guard_on_a_slice {
            let first_slice = trace.bound_symbols().iter().position(|s| trace.symbol_name(s) == "slice").unwrap();
            trace.attach_guard(Selection::Positions(first_slice..first_slice + 1), recorder.clone()).unwrap();
        }
        let grads = Grad::new(&[x]).run(&trace, &arena).unwrap();
        let count = |name: &str| grads.bound_symbols().iter().filter(|s| grads.symbol_name(s) == name).count();
        let counts = (count("concat"), count("pad"));
        let plan = crate::Plan::compile(&grads, &[crate::executors::CpuReference::shared()]).unwrap();
        let input = crate::Tensor::from_fn(&[2, 9], |i| i as f32 - 4.0);
        let grad = plan.run(&[&input]).unwrap()[1].to_f32_vec();
        let labels: Vec<String> = recorder.ranges().iter().map(|r| r.label.to_string()).collect();
        (counts, grad, labels)
    };
    let ((concats, pads), tiled, _) = run(false, false);
    // (The one pad makes the loss's seed, a 1 from an empty slice.)
    assert_eq!((concats, pads), (2, 1), "one concat of three pieces (two binary concats), no pad of a piece");
    // d/dx of sum((i+1) x_i^2) is 2 (i+1) x_i, piece by piece.
    let factor = |column: usize| {
        if column < 2 {
            1.0
        } else if column < 5 {
            2.0
        } else {
            3.0
        }
    };
    let expected: Vec<f32> = (0..18).map(|i| 2.0 * factor(i % 9) * (i as f32 - 4.0)).collect();
    assert_eq!(tiled, expected);
    // A slice under a guard keeps its own pad, so that its backward has a range.
    let ((_, pads), guarded, labels) = run(false, true);
    assert_eq!(pads, 4, "the guarded slice's gradient is padded, the others' too (they no longer tile)");
    assert_eq!(guarded, expected);
    assert_eq!(labels, ["slice", "slice (backward)"]);
    let ((_, pads), overlapping, _) = run(true, false);
    assert_eq!(pads, 5, "overlapping slices are each padded");
    let expected: Vec<f32> =
        expected.iter().enumerate().map(|(i, e)| e + f32::from(u8::from((1..3).contains(&(i % 9))))).collect();
    assert_eq!(overlapping, expected);
}

#[test]
fn a_split_of_an_intermediate_value_also_used_whole_gets_both_gradients() {
    // `h = x * w` is split in two along its last axis (its pieces' gradients join when `h`'s
    // producer is differentiated) and also used whole; a slice of a slice adds a third path.
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 6]).unwrap();
    let w = b.input(&[2, 6]).unwrap();
    let h = b.mul(x, w).unwrap();
    let parts = b.split(h, 1, &[2, 4]).unwrap();
    let inner = b.slice(parts[1], 1, 1, 3).unwrap();
    let mut terms = Vec::new();
    for (i, v) in [parts[0], parts[1], h, inner].into_iter().enumerate() {
        let scaled = b.mul_scalar(v, (i + 1) as f32).unwrap();
        let squares = b.mul(scaled, v).unwrap();
        let n = b.shape(squares).unwrap().iter().product::<usize>();
        let flat = b.reshape(squares, &[1, n]).unwrap();
        terms.push(b.sum(flat).unwrap());
    }
    let mut loss = terms[0];
    for &t in &terms[1..] {
        loss = b.add(loss, t).unwrap();
    }
    b.output(loss).unwrap();
    let grads = Grad::new(&[w]).run(&b.finish().unwrap(), &arena).unwrap();
    let concats = grads.bound_symbols().iter().filter(|s| grads.symbol_name(s) == "concat").count();
    assert_eq!(concats, 1, "the split's two pieces join with one concat");
    let plan = crate::Plan::compile(&grads, &[crate::executors::CpuReference::shared()]).unwrap();
    let xs = crate::Tensor::from_fn(&[2, 6], |i| 0.5 + i as f32 * 0.25);
    let ws = crate::Tensor::from_fn(&[2, 6], |i| 1.0 - i as f32 * 0.125);
    let got = plan.run(&[&xs, &ws]).unwrap()[1].to_f32_vec();
    // d loss / d h_j = 2 h_j (1 [piece 0] or 2 [piece 1]) + 2 * 3 h_j + (2 * 4 h_j inside
    // columns 3..5); d loss / d w = x * d loss / d h.
    let (x, w) = (xs.to_f32_vec(), ws.to_f32_vec());
    for (i, &g) in got.iter().enumerate() {
        let (column, h) = (i % 6, x[i] * w[i]);
        let piece = if column < 2 { 1.0 } else { 2.0 };
        let inner = if (3..5).contains(&column) { 4.0 } else { 0.0 };
        let expected = x[i] * 2.0 * h * (piece + 3.0 + inner);
        assert!((g - expected).abs() <= 1e-5 * expected.abs().max(1.0), "w[{i}]: {g} against {expected}");
    }
}

#[test]
fn packed_attention_has_the_gradients_of_its_split_and_views() {
    // `qkv_attention` against what a model writes without it (split, reshape, permute,
    // `scaled_dot_product_attention`, permute and reshape back), in f32 and bf16: the same
    // gradient of `qkv`, from one `qkv_attention_backward` in `qkv`'s layout.
    let (batch, tokens, heads, head) = (2, 5, 2, 8);
    let c = heads * head;
    for dtype in [DType::F32, DType::BF16] {
        let grads = |packed: bool| -> (Vec<f32>, Vec<String>) {
            let (registry, arena) = (Registry::with_builtins(), Arena::new());
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input(&[batch, tokens, 3 * c]).unwrap();
            let w = b.input(&[batch, tokens, c]).unwrap();
            let qkv = if dtype == DType::F32 { x } else { b.cast(x, dtype).unwrap() };
            let y = if packed {
                b.qkv_attention(qkv, heads, true, None).unwrap()
            } else {
                let parts = b.split(qkv, 2, &[c, c, c]).unwrap();
                let [q, k, v] = [0, 1, 2].map(|i| {
                    let apart = b.reshape(parts[i], &[batch, tokens, heads, head]).unwrap();
                    b.permute(apart, &[0, 2, 1, 3]).unwrap()
                });
                let y = b.scaled_dot_product_attention(q, k, v, true, None).unwrap();
                let y = b.permute(y, &[0, 2, 1, 3]).unwrap();
                b.reshape(y, &[batch, tokens, c]).unwrap()
            };
            let y = if dtype == DType::F32 { y } else { b.cast(y, DType::F32).unwrap() };
            let weighted = b.mul(y, w).unwrap();
            let flat = b.reshape(weighted, &[1, batch * tokens * c]).unwrap();
            let loss = b.sum(flat).unwrap();
            b.output(loss).unwrap();
            let grads = Grad::new(&[x]).run(&b.finish().unwrap(), &arena).unwrap();
            let names = grads.bound_symbols().iter().map(|s| grads.symbol_name(s).to_string()).collect();
            let plan = crate::Plan::compile(&grads, &[crate::executors::CpuReference::shared()]).unwrap();
            let x = crate::Tensor::from_fn(&[batch, tokens, 3 * c], |i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 0.8);
            let w = crate::Tensor::from_fn(&[batch, tokens, c], |i| (i * 53 % 89) as f32 / 44.0 - 1.0);
            let out = plan.run(&[&x, &w]).unwrap();
            (out[1].to_f32_vec(), names)
        };
        let ((packed, names), (apart, _)) = (grads(true), grads(false));
        assert_eq!(names.iter().filter(|n| *n == "qkv_attention_backward").count(), 1, "{names:?}");
        assert!(!names.iter().any(|n| n == "concat" || n == "transpose"), "nothing joins the gradients: {names:?}");
        assert_eq!(packed.len(), batch * tokens * 3 * c);
        assert!(packed.iter().any(|g| g.abs() > 1e-3), "{dtype}: the gradient is not all zeros");
        assert_eq!(packed, apart, "{dtype}");
    }
}
