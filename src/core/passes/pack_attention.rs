//! Packing attention over a fused projection: the split, views and attention a model writes
//! (as Hugging Face's GPT-2 does) become one `qkv_attention`, which executors that take strided
//! operands run without copying q, k and v out of the projection or the heads back together.

use crate::core::ir::{prims, Arena, Arg, BoundSymbol, Trace, TraceBuilder, ValueId};
use crate::error::Result;

use super::Pass;

/// Replaces attention written over a packed projection by one
/// [`qkv_attention`](crate::TraceBuilder::qkv_attention): where `qkv` is `[..., tokens, 3 *
/// width]`, and
///
/// ```text
/// q = permute(reshape(slice(qkv, last axis, 0..width),         [..., tokens, heads, head]), tokens <-> heads)
/// k = permute(reshape(slice(qkv, last axis, width..2 width),   ...), ...)
/// v = permute(reshape(slice(qkv, last axis, 2 width..3 width), ...), ...)
/// y = reshape(permute(scaled_dot_product_attention(q, k, v), tokens <-> heads), [..., tokens, width])
/// ```
///
/// with every value between `qkv` and `y` read only there (and not returned), the twelve bound
/// symbols become one `qkv_attention(qkv, heads)` defining `y`, whose subsymbols are the twelve:
/// executors that do not run it whole run exactly what they ran before. Run it before
/// [`Grad`](crate::passes::Grad), so that the backward is one `qkv_attention_backward` in
/// `qkv`'s layout too (not the split's and views' gradients). Like
/// [`FoldEpilogues`](crate::passes::FoldEpilogues), a trace with guards on its bound symbols is
/// left as it is: profile after this pass, as the front end does.
///
/// ```
/// use boundscope::passes::{PackAttention, Pass};
/// use boundscope::{prims, Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let (batch, tokens, heads, head) = (2, 16, 4, 8);
/// let width = heads * head;
/// let qkv = b.input(&[batch, tokens, 3 * width]).unwrap();
/// let parts = b.split(qkv, 2, &[width, width, width]).unwrap();
/// let [q, k, v] = [0, 1, 2].map(|i| {
///     let apart = b.reshape(parts[i], &[batch, tokens, heads, head]).unwrap();
///     b.permute(apart, &[0, 2, 1, 3]).unwrap()
/// });
/// let y = b.scaled_dot_product_attention(q, k, v, true, None).unwrap();
/// let y = b.permute(y, &[0, 2, 1, 3]).unwrap();
/// let y = b.reshape(y, &[batch, tokens, width]).unwrap();
/// b.output(y).unwrap();
/// let packed = PackAttention.run(&b.finish().unwrap(), &arena).unwrap();
/// assert_eq!(packed.len(), 1);
/// assert_eq!(packed.bound_symbols()[0].symbol(), prims::QKV_ATTENTION);
/// assert_eq!(packed.bound_symbols()[0].outputs(), &[y]);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct PackAttention;

impl Pass for PackAttention {
    fn name(&self) -> &str {
        "pack_attention"
    }

    fn run<'a>(&self, trace: &Trace<'a>, arena: &'a Arena) -> Result<Trace<'a>> {
        if trace.guards.per_op.iter().any(|a| !a.is_empty()) {
            return Ok(trace.clone());
        }
        let bsyms = trace.bound_symbols();
        let reads = super::top_level_reads(trace);
        // The position of each value's producer.
        let mut defined_at = vec![None; trace.value_count()];
        for (p, b) in bsyms.iter().enumerate() {
            for o in b.outputs() {
                if let Some(d) = defined_at.get_mut(o.index()) {
                    *d = Some(p);
                }
            }
        }
        let matches: Vec<Packed> =
            (0..bsyms.len()).filter_map(|p| Packed::find(trace, p, &reads, &defined_at)).collect();
        if matches.is_empty() {
            return Ok(trace.clone());
        }
        // For each old position: the match it belongs to, if any.
        let mut member = vec![None; bsyms.len()];
        for (m, packed) in matches.iter().enumerate() {
            for &p in &packed.positions {
                member[p] = Some(m);
            }
        }
        let mut builder = TraceBuilder::rewrite(trace, arena);
        let mut placed = vec![None; matches.len()];
        let mut new_position = Vec::with_capacity(bsyms.len());
        for (p, bsym) in bsyms.iter().enumerate() {
            let Some(m) = member[p] else {
                new_position.push(Some(builder.len()));
                builder.push_copy(bsym);
                continue;
            };
            // The composite goes where the attention was: after `qkv`, before `y`'s readers.
            let packed = &matches[m];
            if p == packed.attention {
                placed[m] = Some(builder.len());
                builder.push_copy_with_comment(&packed.bound_symbol(bsyms, arena), packed.comment);
            }
            new_position.push(None);
        }
        for (m, packed) in matches.iter().enumerate() {
            for &p in &packed.positions {
                new_position[p] = placed[m];
            }
        }
        builder.carry_guards(trace, &new_position, self.name(), |_| String::new())?;
        builder.finish()
    }
}

/// One attention over a packed projection found in a trace.
struct Packed<'a> {
    qkv: ValueId,
    heads: usize,
    /// The attention's scale and causal flag.
    scalars: [f32; 2],
    y: ValueId,
    /// The attention's position.
    attention: usize,
    /// The twelve bound symbols' positions, in trace order.
    positions: Vec<usize>,
    comment: Option<&'a str>,
}

impl<'a> Packed<'a> {
    /// The pattern around the `scaled_dot_product_attention` at `position`, if it is one.
    /// `reads` and `defined_at` give each value's top-level reads and producer's position.
    fn find(trace: &Trace<'a>, position: usize, reads: &[usize], defined_at: &[Option<usize>]) -> Option<Self> {
        let bsyms = trace.bound_symbols();
        let attention = &bsyms[position];
        let registry = trace.registry();
        let prim = |b: &BoundSymbol<'_>| registry.get(b.symbol()).ok().and_then(|s| s.symbol.builtin_prim());
        let composite = |b: &BoundSymbol<'_>| registry.get(b.symbol()).ok().and_then(|s| s.symbol.builtin_composite());
        if composite(attention) != Some(prims::SCALED_DOT_PRODUCT_ATTENTION) {
            return None;
        }
        let reads = |v: ValueId| reads.get(v.index()).copied().unwrap_or(0);
        let shape = |v: ValueId| trace.value_meta(v).ok().map(|m| m.shape);
        let dims = |b: &BoundSymbol<'a>, i: usize| match b.args().get(i) {
            Some(Arg::Dims(d)) => Some(*d),
            _ => None,
        };
        // The single producer of `v`, if it is `id` and `v` is read once.
        let producer = |v: ValueId, id| {
            let p = defined_at.get(v.index()).copied().flatten()?;
            (prim(&bsyms[p]) == Some(id) && reads(v) == 1 && bsyms[p].outputs() == [v]).then_some(p)
        };
        let scalar = |i: usize| match attention.args().get(i) {
            Some(Arg::Scalar(s)) => Some(*s),
            _ => None,
        };
        let [y_heads] = attention.outputs() else { return None };
        let inputs: Vec<ValueId> = attention.inputs().collect();
        let [q, k, v] = inputs[..] else { return None };
        let heads_shape = shape(q)?;
        let rank = heads_shape.len();
        if rank < 3 {
            return None;
        }
        let swap: Vec<usize> = (0..rank)
            .map(|i| {
                if i == rank - 3 {
                    rank - 2
                } else if i == rank - 2 {
                    rank - 3
                } else {
                    i
                }
            })
            .collect();
        let (heads, head) = (heads_shape[rank - 3], heads_shape[rank - 1]);
        let width = heads * head;
        let mut positions = vec![position];
        let mut qkv = None;
        for (i, part) in [q, k, v].into_iter().enumerate() {
            let t = producer(part, prims::TRANSPOSE)?;
            let r = producer(bsyms[t].inputs().next()?, prims::RESHAPE)?;
            let s = producer(bsyms[r].inputs().next()?, prims::SLICE)?;
            let source = bsyms[s].inputs().next()?;
            let source_shape = shape(source)?;
            let apart = shape(bsyms[r].outputs()[0])?;
            let fits = dims(&bsyms[t], 1)? == swap.as_slice()
                && source_shape.len() == rank - 1
                && source_shape[rank - 2] == 3 * width
                && apart[..rank - 2] == source_shape[..rank - 2]
                && apart[rank - 2..] == [heads, head]
                && dims(&bsyms[s], 1)? == [rank - 2, i * width, (i + 1) * width]
                && *qkv.get_or_insert(source) == source;
            if !fits || shape(part)? != heads_shape {
                return None;
            }
            positions.extend([s, r, t]);
        }
        // The result, read once by the permute back, whose result is read once by the reshape
        // that joins the width.
        let reader = |v: ValueId| {
            let p = bsyms.iter().position(|b| b.inputs().any(|x| x == v))?;
            (reads(v) == 1).then_some(p)
        };
        let t = reader(*y_heads)?;
        let [together] = bsyms[t].outputs() else { return None };
        let r = reader(*together)?;
        let [y] = bsyms[r].outputs() else { return None };
        let mut result = shape(qkv?)?.to_vec();
        *result.last_mut()? = width;
        let fits = prim(&bsyms[t]) == Some(prims::TRANSPOSE)
            && dims(&bsyms[t], 1)? == swap.as_slice()
            && prim(&bsyms[r]) == Some(prims::RESHAPE)
            && shape(*y)?.as_slice() == result.as_slice();
        if !fits {
            return None;
        }
        let y = *y;
        positions.extend([t, r]);
        positions.sort_unstable();
        Some(Self {
            qkv: qkv?,
            heads,
            scalars: [scalar(3)?, scalar(4)?],
            y,
            attention: position,
            positions,
            comment: attention.comment(),
        })
    }

    /// The `qkv_attention` that replaces the match, its subsymbols the matched bound symbols.
    fn bound_symbol(&self, bsyms: &[BoundSymbol<'a>], arena: &'a Arena) -> BoundSymbol<'a> {
        let bump = arena.bump();
        let subsymbols: Vec<BoundSymbol<'a>> = self.positions.iter().map(|&p| bsyms[p]).collect();
        let args = [
            Arg::Value(self.qkv),
            Arg::Dims(bump.alloc_slice_copy(&[self.heads])),
            Arg::Scalar(self.scalars[0]),
            Arg::Scalar(self.scalars[1]),
        ];
        BoundSymbol {
            symbol: prims::QKV_ATTENTION,
            args: bump.alloc_slice_copy(&args),
            outputs: bump.alloc_slice_copy(&[self.y]),
            subsymbols: bump.alloc_slice_copy(&subsymbols),
            extras: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::guards::{Recorder, Selection};
    use crate::executors::CpuReference;
    use crate::{Plan, Registry, Tensor};

    /// How a model might write attention over `qkv`, and what to change in it.
    #[derive(Clone, Copy, Debug, Default)]
    struct Variant {
        /// No batch axis: `qkv` is `[tokens, 3 * width]`.
        unbatched: bool,
        /// k read from the first third, q from the second.
        swapped: bool,
        /// q also returned (read twice).
        q_returned: bool,
        /// The heads joined back in another order.
        wrong_join: bool,
        /// The parts' batch and token axes regrouped (`[2, 6]` viewed as `[3, 4]`).
        regrouped: bool,
        /// k sliced from a second input of `qkv`'s shape.
        k_elsewhere: bool,
        /// The attention's result (heads apart) also returned.
        result_returned: bool,
        /// The heads joined straight into `[batch * tokens, width]`.
        joined_flat: bool,
        /// No heads: q, k and v are the slices themselves.
        headless: bool,
    }

    /// Attention over `qkv` written as `variant` says, in scope `attn` (the attention itself
    /// in `attn.sdpa`).
    fn attention<'a>(arena: &'a Arena, registry: &'a Registry, variant: Variant) -> Trace<'a> {
        let (tokens, heads, head) = (6, 2, 4);
        let width = heads * head;
        let lead: &[usize] = if variant.unbatched { &[] } else { &[2] };
        let rank = lead.len() + 3;
        let shape = |last: &[usize]| lead.iter().chain(last).copied().collect::<Vec<_>>();
        let mut b = TraceBuilder::new(arena, registry);
        let qkv = b.input(&shape(&[tokens, 3 * width])).unwrap();
        let other = if variant.k_elsewhere { Some(b.input(&shape(&[tokens, 3 * width])).unwrap()) } else { None };
        let (y, q, heads_apart) = b
            .scope("attn", |b| {
                let mut parts = b.split(qkv, rank - 2, &[width, width, width])?;
                if let Some(other) = other {
                    parts[1] = b.slice(other, rank - 2, width, 2 * width)?;
                }
                if variant.swapped {
                    parts.swap(0, 1);
                }
                let mut swap: Vec<usize> = (0..rank).collect();
                swap.swap(rank - 3, rank - 2);
                let apart = if variant.regrouped { vec![3, 4, heads, head] } else { shape(&[tokens, heads, head]) };
                let mut views = Vec::new();
                for part in parts {
                    views.push(if variant.headless {
                        part
                    } else {
                        let apart = b.reshape(part, &apart)?;
                        b.permute(apart, &swap)?
                    });
                }
                let y =
                    b.scope("sdpa", |b| b.scaled_dot_product_attention(views[0], views[1], views[2], true, None))?;
                if variant.headless {
                    return Ok((y, views[0], y));
                }
                let join = if variant.wrong_join {
                    let mut other: Vec<usize> = (0..rank).collect();
                    other.swap(rank - 2, rank - 1);
                    other
                } else {
                    swap
                };
                let joined = b.permute(y, &join)?;
                let out = if variant.joined_flat {
                    vec![lead.iter().product::<usize>() * tokens, width]
                } else {
                    shape(&[tokens, width])
                };
                Ok((b.reshape(joined, &out)?, views[0], y))
            })
            .unwrap();
        b.output(y).unwrap();
        if variant.q_returned {
            b.output(q).unwrap();
        }
        if variant.result_returned {
            b.output(heads_apart).unwrap();
        }
        b.finish().unwrap()
    }

    fn run(trace: &Trace<'_>) -> Vec<Vec<f32>> {
        let plan = Plan::compile(trace, &[CpuReference::shared()]).unwrap();
        let inputs: Vec<Tensor> = trace
            .inputs()
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                let shape = trace.value_meta(v).unwrap().shape;
                Tensor::from_fn(&shape, |i| (((i + 7 * k) * 37 % 101) as f32 / 50.0 - 1.0) * 0.9)
            })
            .collect();
        plan.run(&inputs.iter().collect::<Vec<_>>()).unwrap().iter().map(|t| t.to_f32_vec()).collect()
    }

    #[test]
    fn attention_over_a_split_projection_packs_into_one_op_with_the_same_results() {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        for unbatched in [false, true] {
            let trace = attention(&arena, &registry, Variant { unbatched, ..Variant::default() });
            let packed = PackAttention.run(&trace, &arena).unwrap();
            assert_eq!(packed.len(), 1, "{packed}");
            let op = &packed.bound_symbols()[0];
            assert_eq!(op.symbol(), prims::QKV_ATTENTION);
            assert_eq!(op.subsymbols().len(), 12, "its subsymbols are what it replaced");
            assert_eq!(op.outputs(), trace.outputs());
            // The innermost scope holding everything it replaced.
            assert_eq!(packed.scope_path(0), Some("attn"));
            // The decomposition is the ops it replaced: the same bits.
            assert_eq!(run(&packed), run(&trace));
            // And CpuReference running the composite's own decomposition agrees too.
            let mut b = TraceBuilder::new(&arena, &registry);
            let qkv = b.input(trace.value_meta(trace.inputs()[0]).unwrap().shape.as_slice()).unwrap();
            let y = b.qkv_attention(qkv, 2, true, None).unwrap();
            b.output(y).unwrap();
            assert_eq!(run(&b.finish().unwrap()), run(&trace));
        }
    }

    #[test]
    fn attention_written_otherwise_is_left_as_it_is() {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let base = Variant::default();
        for variant in [
            Variant { swapped: true, ..base },
            Variant { q_returned: true, ..base },
            Variant { wrong_join: true, ..base },
            Variant { regrouped: true, ..base },
            Variant { k_elsewhere: true, ..base },
            Variant { result_returned: true, ..base },
            Variant { joined_flat: true, ..base },
            Variant { headless: true, ..base },
            Variant { headless: true, unbatched: true, ..base },
        ] {
            let trace = attention(&arena, &registry, variant);
            let after = PackAttention.run(&trace, &arena).unwrap();
            assert_eq!(after.len(), trace.len(), "{variant:?}:\n{after}");
            assert!(after.bound_symbols().iter().all(|b| b.symbol() != prims::QKV_ATTENTION), "{variant:?}");
            assert_eq!(run(&after), run(&trace), "{variant:?}");
        }
        // A guard on any op leaves the trace as it is (profile after packing).
        let mut trace = attention(&arena, &registry, base);
        trace.attach_guard(Selection::Positions(0..1), Recorder::new()).unwrap();
        assert_eq!(PackAttention.run(&trace, &arena).unwrap().len(), trace.len());
    }
}
