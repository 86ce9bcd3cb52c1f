//! Attention over a packed projection: `qkv_attention(qkv, [heads], scale, causal)` reads q, k
//! and v side by side along the last axis of one tensor, `[..., tokens, 3 * heads * head]`, as
//! GPT-2's `c_attn` (and most fused q/k/v projections) writes them, and gives the heads side by
//! side, `[..., tokens, heads * head]`, as the output projection reads them;
//! `qkv_attention_backward` gives the gradient in `qkv`'s own layout. Their shape rules,
//! decompositions and typed builder methods.
//!
//! The decomposition is what a model writes without them (as Hugging Face's GPT-2 does): split
//! the last axis in three, view each part as `[..., heads, tokens, head]` (a reshape and a
//! permute), `scaled_dot_product_attention`, then the permute and reshape back. Executors that
//! run attention through a library taking strided operands (CudaOps, with cuDNN's fused
//! attention) run the composite whole, reading q, k and v in place and writing the result and
//! the gradients in their final layouts: none of the six copies of the split and permutes, and
//! in the backward none of the three permutes and the concatenation that join the gradients.

use super::bound_symbol::Arg;
use super::builder::TraceBuilder;
use super::ids::ValueId;
use super::meta::{Shape, TensorMeta};
use super::prims::{
    dims_arg, float_tensor, missing, scalar, value, RuleResult, LAYER_NORM_WEIGHT_BACKWARD, QKV_ATTENTION,
    QKV_ATTENTION_BACKWARD,
};
use super::symbol::{ArgInfo, Category, ParamKind, Symbol};
use crate::error::Result;

/// The composites this file defines, in id order (after `layer_norm_weight_backward`).
pub(super) fn push_composites(symbols: &mut Vec<Symbol>) {
    use Category::Composite;
    use ParamKind::*;
    debug_assert_eq!(symbols.len(), LAYER_NORM_WEIGHT_BACKWARD.index() + 1);
    symbols.push(
        Symbol::new("qkv_attention", Composite)
            .params(&[Tensor, Dims, Scalar, Scalar])
            .shape_rule(qkv_attention_rule)
            .decomposition(decompose_qkv_attention),
    );
    symbols.push(
        Symbol::new("qkv_attention_backward", Composite)
            .params(&[Tensor, Tensor, Dims, Scalar, Scalar])
            .shape_rule(qkv_attention_backward_rule)
            .decomposition(decompose_qkv_attention_backward),
    );
    debug_assert_eq!(symbols.len(), QKV_ATTENTION_BACKWARD.index() + 1);
}

/// How a packed `qkv` tensor splits: its leading dimensions, tokens, heads and head size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PackedHeads {
    /// The dimensions before the tokens.
    pub batch: Shape,
    pub tokens: usize,
    pub heads: usize,
    pub head: usize,
}

impl PackedHeads {
    /// The split of a `qkv` of `shape` into `heads` heads, or why it does not split.
    pub fn of(shape: &[usize], heads: &[usize]) -> std::result::Result<Self, String> {
        let (heads, parts) = match heads {
            [h] if *h > 0 => (*h, h.checked_mul(3).ok_or(format!("{h} heads are more than an index can count"))?),
            _ => return Err(format!("heads must be one count of at least 1, as [12], not {heads:?}")),
        };
        let (&width, rest) = shape
            .split_last()
            .filter(|(_, rest)| !rest.is_empty())
            .ok_or_else(|| format!("qkv must be [..., tokens, 3 * heads * head] (rank 2 or more), not {shape:?}"))?;
        let (&tokens, batch) = rest.split_last().ok_or("unreachable: rank checked above")?;
        if width == 0 || !width.is_multiple_of(parts) {
            return Err(format!(
                "qkv's last axis ({width}) must be 3 * heads * head with head >= 1: a positive multiple of 3 * {heads}"
            ));
        }
        Ok(Self { batch: Shape::from_slice(batch), tokens, heads, head: width / parts })
    }

    /// `heads * head`: the width of each of q, k and v, and of the result's last axis.
    pub fn width(&self) -> usize {
        self.heads * self.head
    }

    /// The result's shape, `[..., tokens, heads * head]`.
    fn result(&self) -> Shape {
        let mut shape = self.batch.clone();
        shape.extend([self.tokens, self.width()]);
        shape
    }

    /// `[..., tokens, heads, head]`: a part of `qkv` (or the result) with its heads apart.
    fn split_heads(&self) -> Shape {
        let mut shape = self.batch.clone();
        shape.extend([self.tokens, self.heads, self.head]);
        shape
    }

    /// The permutation that swaps the tokens and heads axes of [`split_heads`](Self::split_heads)
    /// (its own inverse).
    fn swap(&self) -> Vec<usize> {
        let rank = self.batch.len() + 3;
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 3, rank - 2);
        perm
    }
}

fn qkv_attention_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = float_tensor(args, 0)?;
    let heads = PackedHeads::of(shape, dims_arg(args, 1)?)?;
    Ok(TensorMeta { dtype, shape: heads.result() })
}

fn qkv_attention_backward_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = float_tensor(args, 0)?;
    let (grad_dtype, grad) = float_tensor(args, 1)?;
    let heads = PackedHeads::of(shape, dims_arg(args, 2)?)?;
    if grad_dtype != dtype {
        return Err(format!("qkv and grad must share one float dtype (got {dtype:?} and {grad_dtype:?}); cast grad"));
    }
    if grad != heads.result().as_slice() {
        return Err(format!("grad must have the attention's result's shape {:?}, not {grad:?}", heads.result()));
    }
    Ok(TensorMeta::new(dtype, shape))
}

/// `qkv`'s three parts, each as `[..., heads, tokens, head]`.
fn heads_of(b: &mut TraceBuilder<'_>, qkv: ValueId, heads: usize) -> Result<([ValueId; 3], PackedHeads)> {
    let shape = b.shape(qkv)?.to_vec();
    let split = PackedHeads::of(&shape, &[heads])
        .map_err(|detail| crate::Error::InvalidSymbol { symbol: "qkv_attention".into(), detail })?;
    let c = split.width();
    let parts = b.split(qkv, shape.len() - 1, &[c, c, c])?;
    let mut views = [parts[0]; 3];
    for (view, part) in views.iter_mut().zip(parts) {
        let apart = b.reshape(part, &split.split_heads())?;
        *view = b.permute(apart, &split.swap())?;
    }
    Ok((views, split))
}

/// `[..., heads, tokens, head]` back to `[..., tokens, heads * head]`.
fn heads_joined(b: &mut TraceBuilder<'_>, x: ValueId, split: &PackedHeads) -> Result<ValueId> {
    let together = b.permute(x, &split.swap())?;
    b.reshape(together, &split.result())
}

/// The heads count of a checked `Dims` argument.
fn heads_arg(args: &[Arg<'_>], i: usize, what: &str) -> Result<usize> {
    match args.get(i) {
        Some(Arg::Dims([h])) => Ok(*h),
        _ => Err(missing(what)),
    }
}

fn decompose_qkv_attention(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let what = "qkv_attention";
    let qkv = value(args, 0).ok_or_else(|| missing(what))?;
    let ([q, k, v], split) = heads_of(b, qkv, heads_arg(args, 1, what)?)?;
    let y = b.scaled_dot_product_attention(q, k, v, scalar(args, 3) != 0.0, Some(scalar(args, 2)))?;
    heads_joined(b, y, &split)
}

/// The gradients of q, k and v as `passes::Grad` writes them for `scaled_dot_product_attention`
/// (but the math in `f32`: see `attention_gradients`), each joined back to `[..., tokens,
/// heads * head]`, then concatenated along the last axis: `qkv`'s layout.
fn decompose_qkv_attention_backward(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let what = "qkv_attention_backward";
    let (qkv, g) = (value(args, 0).ok_or_else(|| missing(what))?, value(args, 1).ok_or_else(|| missing(what))?);
    let ([q, k, v], split) = heads_of(b, qkv, heads_arg(args, 2, what)?)?;
    let g = b.reshape(g, &split.split_heads())?;
    let g = b.permute(g, &split.swap())?;
    let grads =
        super::transformer_ops::attention_gradients(b, [q, k, v, g], scalar(args, 3), scalar(args, 4) != 0.0, true)?;
    let mut joined = grads;
    for (j, grad) in joined.iter_mut().zip(grads) {
        *j = heads_joined(b, grad, &split)?;
    }
    b.concat(&joined, split.batch.len() + 1)
}

impl<'a> TraceBuilder<'a> {
    /// Causal (or not) attention of `heads` heads over a packed projection `qkv`: `[...,
    /// tokens, 3 * heads * head]` holding q, k and v one after the other along the last axis
    /// (each `heads` heads of `head` values, as GPT-2's `c_attn` writes them); the result is
    /// `[..., tokens, heads * head]`, the heads side by side. The same as splitting `qkv` in
    /// three, viewing each part as `[..., heads, tokens, head]`,
    /// [`scaled_dot_product_attention`](Self::scaled_dot_product_attention) and joining the
    /// heads back (its decomposition), without the copies: CudaOps runs it whole (cuDNN's fused
    /// attention in 16 bits, the generated flash kernel in f32) reading q, k and v in place, and
    /// its gradient
    /// ([`qkv_attention_backward`](Self::qkv_attention_backward)) lands in `qkv`'s layout.
    /// `scale` defaults to `1 / sqrt(head)`.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when `qkv` is not a float tensor of
    /// rank 2 or more whose last axis is a positive multiple of `3 * heads`, or `heads` is 0.
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let qkv = b.input(&[2, 3, 12]).unwrap(); // batch 2, 3 tokens, 2 heads of 2
    /// let y = b.qkv_attention(qkv, 2, true, None).unwrap();
    /// assert_eq!(b.shape(y).unwrap(), &[2, 3, 4]);
    /// b.output(y).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// let x: Vec<f32> = (0..72).map(|i| i as f32 / 72.0).collect();
    /// let out = plan.run(&[&Tensor::new(&[2, 3, 12], x.clone()).unwrap()]).unwrap();
    /// // Causal: the first token attends only to itself, so its result is its own v.
    /// assert_eq!(&out[0].to_f32_vec()[..4], &x[8..12]);
    /// ```
    pub fn qkv_attention(&mut self, qkv: ValueId, heads: usize, causal: bool, scale: Option<f32>) -> Result<ValueId> {
        let width = self.shape(qkv)?.last().copied().unwrap_or(0);
        let head = (width / 3).checked_div(heads).unwrap_or(1).max(1);
        let scale = scale.unwrap_or(1.0 / (head as f32).sqrt());
        let causal = if causal { 1.0 } else { 0.0 };
        self.bind(QKV_ATTENTION, &[Arg::Value(qkv), Arg::Dims(&[heads]), Arg::Scalar(scale), Arg::Scalar(causal)])
    }

    /// The gradient of [`qkv_attention`](Self::qkv_attention) with respect to `qkv`, for the
    /// result's gradient `grad`, in `qkv`'s shape and layout (dq, dk and dv side by side along
    /// the last axis); `scale` is the forward's (no default here). `passes::Grad` writes it for
    /// `qkv_attention`; CudaOps runs it in 16 bits as cuDNN's fused attention backward, writing
    /// dq, dk and dv in place.
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let qkv = b.input(&[3, 6]).unwrap(); // 3 tokens, one head of 2
    /// let grad = b.input(&[3, 2]).unwrap();
    /// let d = b.qkv_attention_backward(qkv, grad, 1, true, 0.5).unwrap();
    /// assert_eq!(b.shape(d).unwrap(), &[3, 6]);
    /// b.output(d).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// let qkv = Tensor::new(&[3, 6], vec![0.5; 18]).unwrap();
    /// let out = plan.run(&[&qkv, &Tensor::new(&[3, 2], vec![1.0; 6]).unwrap()]).unwrap();
    /// // The first token's v gets the gradient of every token that attends to it: 1 + 1/2 + 1/3.
    /// assert!((out[0].to_f32_vec()[4] - 11.0 / 6.0).abs() < 1e-6);
    /// ```
    pub fn qkv_attention_backward(
        &mut self,
        qkv: ValueId,
        grad: ValueId,
        heads: usize,
        causal: bool,
        scale: f32,
    ) -> Result<ValueId> {
        let causal = if causal { 1.0 } else { 0.0 };
        self.bind(
            QKV_ATTENTION_BACKWARD,
            &[Arg::Value(qkv), Arg::Value(grad), Arg::Dims(&[heads]), Arg::Scalar(scale), Arg::Scalar(causal)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::PackedHeads;

    #[test]
    fn packed_heads_name_what_does_not_split() {
        assert_eq!(PackedHeads::of(&[2, 5, 36], &[3]).unwrap().head, 4);
        assert_eq!(PackedHeads::of(&[5, 36], &[3]).unwrap().batch.len(), 0);
        for (shape, heads, says) in [
            (&[36][..], &[3][..], "rank 2 or more"),
            (&[5, 35], &[3], "multiple of 3 * 3"),
            (&[5, 0], &[3], "multiple of 3 * 3"),
            (&[5, 36], &[0], "at least 1"),
            (&[5, 36], &[3, 1], "one count"),
            (&[5, 6], &[usize::MAX / 2], "more than an index can count"),
            (&[5, 6], &[usize::MAX / 3 + 1], "more than an index can count"),
        ] {
            let e = PackedHeads::of(shape, heads).unwrap_err();
            assert!(e.contains(says), "{shape:?} / {heads:?}: {e}");
        }
    }
}
