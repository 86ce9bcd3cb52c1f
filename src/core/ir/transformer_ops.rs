//! The ops of a transformer beyond an MLP block: slices and concatenation, reductions over any
//! axis and `argmax`, the causal mask, embedding lookups and gathers by integer ids (prims),
//! and `log_softmax`, `cross_entropy` and `scaled_dot_product_attention` (composites): their
//! shape and dtype rules, decompositions, and typed builder methods.

use super::bound_symbol::Arg;
use super::builder::TraceBuilder;
use super::ids::{SymbolId, ValueId};
use super::meta::{DType, Shape, TensorMeta};
use super::prims::{
    dims_arg, float_tensor, floats_only, in_f32, last_axis, missing, promoted, scalar, tensor, value, PrimRule,
    RuleResult, ARGMAX, CAUSAL_MASK, COMPARISONS, CONCAT, CROSS_ENTROPY, CROSS_ENTROPY_BACKWARD, EMBEDDING, EQ,
    GATHER_LAST, GE, GT, LE, LOG_SOFTMAX, LT, MATMUL_TRANSPOSED, MAX_AXIS, NE, SCALED_DOT_PRODUCT_ATTENTION,
    SCALED_DOT_PRODUCT_ATTENTION_BACKWARD, SLICE, SUM_AXIS, TRANSPOSED_MATMUL, WHERE,
};
use super::symbol::{ArgInfo, Category, ParamKind, Symbol};
use crate::error::{Error, Result};

/// The signature and rule of the prims this file defines.
pub(super) fn prim_rule(id: SymbolId) -> Option<(&'static [ParamKind], PrimRule)> {
    use ParamKind::*;
    Some(match id {
        SLICE => (&[Tensor, Dims], slice_rule),
        CONCAT => (&[Tensor, Tensor, Dims], concat_rule),
        SUM_AXIS | MAX_AXIS => (&[Tensor, Dims], reduce_axis_rule),
        ARGMAX => (&[Tensor, Dims], argmax_rule),
        CAUSAL_MASK => (&[Tensor], causal_mask_rule),
        EMBEDDING => (&[Tensor, Tensor], embedding_rule),
        GATHER_LAST => (&[Tensor, Tensor], gather_last_rule),
        _ if COMPARISONS.contains(&id) => (&[Tensor, TensorOrScalar], comparison_rule),
        WHERE => (&[Tensor, Tensor, TensorOrScalar], where_rule),
        _ => return super::gradient_ops::prim_rule(id),
    })
}

/// The composites this file defines, in id order (after `linear_gelu`).
pub(super) fn push_composites(symbols: &mut Vec<Symbol>) {
    use Category::Composite;
    use ParamKind::*;
    symbols.push(
        Symbol::new("log_softmax", Composite)
            .params(&[Tensor])
            .shape_rule(|args| {
                let (dtype, shape) = float_tensor(args, 0)?;
                last_axis(shape)?;
                Ok(TensorMeta::new(dtype, shape))
            })
            .decomposition(decompose_log_softmax),
    );
    symbols.push(
        Symbol::new("cross_entropy", Composite)
            .params(&[Tensor, Tensor])
            .shape_rule(cross_entropy_rule)
            .decomposition(decompose_cross_entropy),
    );
    symbols.push(
        Symbol::new("scaled_dot_product_attention", Composite)
            .params(&[Tensor, Tensor, Tensor, Scalar, Scalar])
            .shape_rule(attention_rule)
            .decomposition(decompose_attention),
    );
    symbols.push(
        Symbol::new("matmul_transposed", Composite)
            .params(&[Tensor, Tensor])
            .shape_rule(matmul_transposed_rule)
            .decomposition(decompose_matmul_transposed),
    );
    symbols.push(
        Symbol::new("transposed_matmul", Composite)
            .params(&[Tensor, Tensor])
            .shape_rule(transposed_matmul_rule)
            .decomposition(decompose_transposed_matmul),
    );
    symbols.push(
        Symbol::new("cross_entropy_backward", Composite)
            .params(&[Tensor, Tensor, Tensor])
            .shape_rule(cross_entropy_backward_rule)
            .decomposition(decompose_cross_entropy_backward),
    );
    symbols.push(
        Symbol::new("scaled_dot_product_attention_backward", Composite)
            .params(&[Tensor, Tensor, Tensor, Tensor, Scalar, Scalar])
            .shape_rule(attention_backward_rule)
            .decomposition(decompose_attention_backward),
    );
}

/// The permutation that swaps the last two of `rank` axes.
fn swap_last_two(rank: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..rank).collect();
    if rank >= 2 {
        perm.swap(rank - 2, rank - 1);
    }
    perm
}

fn matmul_transposed_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    float_tensor(args, 0)?;
    let (dtype_b, b) = float_tensor(args, 1)?;
    if b.len() < 2 {
        return Err("matmul_transposed takes tensors of rank 2 or more, [..., m, k] x [..., n, k]".into());
    }
    let bt: Shape = swap_last_two(b.len()).iter().map(|&p| b[p]).collect();
    super::prims::matmul_rule(&[args[0], ArgInfo::Tensor { dtype: dtype_b, shape: &bt }])
}

fn decompose_matmul_transposed(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let (x, y) = (value(args, 0), value(args, 1));
    let (x, y) = (x.ok_or_else(|| missing("matmul_transposed"))?, y.ok_or_else(|| missing("matmul_transposed"))?);
    let rank = b.shape(y)?.len();
    let yt = b.transpose(y, &swap_last_two(rank))?;
    b.matmul(x, yt)
}

fn transposed_matmul_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype_a, a) = float_tensor(args, 0)?;
    float_tensor(args, 1)?;
    if a.len() < 2 {
        return Err("transposed_matmul takes tensors of rank 2 or more, [..., k, m] x [..., k, n]".into());
    }
    let at: Shape = swap_last_two(a.len()).iter().map(|&p| a[p]).collect();
    super::prims::matmul_rule(&[ArgInfo::Tensor { dtype: dtype_a, shape: &at }, args[1]]).map_err(|_| {
        let b = match args.get(1) {
            Some(ArgInfo::Tensor { shape, .. }) => format!("{shape:?}"),
            _ => "?".into(),
        };
        format!(
            "transposed_matmul takes [..., k, m] x [..., k, n] (the first read transposed), batch dimensions \
             broadcast; got {a:?} and {b}"
        )
    })
}

fn decompose_transposed_matmul(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let (x, y) = (value(args, 0), value(args, 1));
    let (x, y) = (x.ok_or_else(|| missing("transposed_matmul"))?, y.ok_or_else(|| missing("transposed_matmul"))?);
    let rank = b.shape(x)?.len();
    let xt = b.transpose(x, &swap_last_two(rank))?;
    b.matmul(xt, y)
}

/// `axis` of a tensor of rank `rank`, or why not.
fn axis_of(dims: &[usize], rank: usize, what: &str) -> std::result::Result<usize, String> {
    match dims {
        [axis] if *axis < rank => Ok(*axis),
        [axis] => Err(format!("axis {axis} is out of range for a tensor of rank {rank}; give 0..{rank}")),
        _ => Err(format!("{what} takes one axis, [axis], not {dims:?}")),
    }
}

/// The error of a builder call `name` (`split`, `sum_dim`, ...) along an axis that a tensor of
/// `shape` lacks, reported as the call's, not as the prim's it would bind.
fn missing_axis(name: &str, shape: &[usize], axis: usize) -> Error {
    Error::ShapeMismatch {
        symbol: name.into(),
        shapes: vec![shape.to_vec()],
        detail: format!("there is no axis {axis} in a tensor of {} axes", shape.len()),
    }
}

/// An integer tensor argument (ids, targets).
fn ids_tensor<'m>(args: &[ArgInfo<'m>], i: usize, what: &str) -> std::result::Result<&'m [usize], String> {
    let (dtype, shape) = tensor(args, i)?;
    if !dtype.is_integer() {
        return Err(format!("{what} (argument {i}) must be i64 or i32, not {dtype}; cast it (`cast(x, DType::I64)`)"));
    }
    Ok(shape)
}

fn slice_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = tensor(args, 0)?;
    let (axis, start, end) = match dims_arg(args, 1)? {
        &[axis, start, end] => (axis, start, end),
        other => return Err(format!("slice takes [axis, start, end], not {other:?}")),
    };
    let axis = axis_of(&[axis], shape.len(), "slice")?;
    if start > end || end > shape[axis] {
        return Err(format!(
            "elements {start}..{end} do not lie within axis {axis} of size {}; give start <= end <= {}",
            shape[axis], shape[axis]
        ));
    }
    let mut out = Shape::from_slice(shape);
    out[axis] = end - start;
    Ok(TensorMeta { dtype, shape: out })
}

fn concat_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, a) = tensor(args, 0)?;
    let (other, b) = tensor(args, 1)?;
    if dtype != other {
        return Err(format!("the tensors are {dtype} and {other}; concatenate tensors of one dtype (cast first)"));
    }
    let axis = axis_of(dims_arg(args, 2)?, a.len(), "concat")?;
    let same_elsewhere = a.len() == b.len() && a.iter().zip(b).enumerate().all(|(i, (x, y))| i == axis || x == y);
    if !same_elsewhere {
        return Err(format!("{a:?} and {b:?} differ outside axis {axis}; only the concatenated axis may differ"));
    }
    let mut out = Shape::from_slice(a);
    out[axis] += b[axis];
    Ok(TensorMeta { dtype, shape: out })
}

fn reduce_axis_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = float_tensor(args, 0)?;
    let axis = axis_of(dims_arg(args, 1)?, shape.len(), "a reduction")?;
    let mut out = Shape::from_slice(shape);
    out[axis] = 1;
    Ok(TensorMeta { dtype, shape: out })
}

fn argmax_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, shape) = float_tensor(args, 0)?;
    let axis = axis_of(dims_arg(args, 1)?, shape.len(), "argmax")?;
    if shape[axis] == 0 {
        return Err(format!("argmax over axis {axis} of size 0 has no answer; reduce over a non-empty axis"));
    }
    let mut out = Shape::from_slice(shape);
    out[axis] = 1;
    Ok(TensorMeta { dtype: DType::I64, shape: out })
}

fn causal_mask_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = float_tensor(args, 0)?;
    if shape.len() < 2 {
        return Err("causal_mask needs a tensor of rank at least 2 ([..., rows, cols])".into());
    }
    Ok(TensorMeta::new(dtype, shape))
}

fn embedding_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, weight) = tensor(args, 0)?;
    let ids = ids_tensor(args, 1, "the ids")?;
    let [_, width] = weight else {
        return Err(format!("the weight must be [rows, width], not {weight:?}"));
    };
    let mut out = Shape::from_slice(ids);
    out.push(*width);
    Ok(TensorMeta { dtype, shape: out })
}

fn gather_last_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, x) = tensor(args, 0)?;
    let ids = ids_tensor(args, 1, "the ids")?;
    last_axis(x)?;
    if ids != &x[..x.len() - 1] {
        return Err(format!("the ids must have x's shape without its last axis, {:?}, not {ids:?}", &x[..x.len() - 1]));
    }
    Ok(TensorMeta::new(dtype, ids))
}

/// The broadcast shape of the tensor arguments (scalars broadcast to anything).
fn broadcast_all(args: &[ArgInfo<'_>]) -> std::result::Result<Shape, String> {
    let mut shape = Shape::new();
    for a in args {
        if let ArgInfo::Tensor { shape: s, .. } = a {
            shape = super::prims::broadcast_shapes(&shape, s)?;
        }
    }
    Ok(shape)
}

fn comparison_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    tensor(args, 0)?;
    Ok(TensorMeta { dtype: DType::I32, shape: broadcast_all(args)? })
}

fn where_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    ids_tensor(args, 0, "the condition")?;
    tensor(args, 1)?;
    let dtype = promoted(&args[1..]).unwrap_or(DType::F32);
    Ok(TensorMeta { dtype, shape: broadcast_all(args)? })
}

fn cross_entropy_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, logits) = float_tensor(args, 0)?;
    let targets = ids_tensor(args, 1, "the targets")?;
    match (logits, targets) {
        // The loss is `f32` for logits of every float dtype, as under `torch.autocast`.
        ([rows, _], [n]) if rows == n => Ok(TensorMeta::new(DType::F32, &[])),
        ([rows, _], _) => {
            Err(format!("the targets must be [{rows}] (one class per row of the logits), not {targets:?}"))
        }
        _ => Err(format!("the logits must be [rows, classes], not {logits:?} (reshape first)")),
    }
}

fn cross_entropy_backward_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, logits) = float_tensor(args, 0)?;
    cross_entropy_rule(&args[..2])?;
    let (_, grad) = float_tensor(args, 2)?;
    if grad.iter().product::<usize>() != 1 {
        return Err(format!("the gradient of the loss must be one element (the loss is []), not {grad:?}"));
    }
    Ok(TensorMeta::new(dtype, logits))
}

fn attention_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, q) = tensor(args, 0)?;
    let (_, k) = tensor(args, 1)?;
    let (_, v) = tensor(args, 2)?;
    floats_only(args)?;
    let dtype = promoted(args).unwrap_or(DType::F32);
    let rank = q.len();
    if rank < 2 || k.len() != rank || v.len() != rank {
        return Err(format!(
            "q, k and v must be [..., tokens, head] of one rank (at least 2), not {q:?}, {k:?}, {v:?}"
        ));
    }
    let (batch, t, d) = (&q[..rank - 2], q[rank - 2], q[rank - 1]);
    if &k[..rank - 2] != batch || &v[..rank - 2] != batch {
        return Err(format!("q, k and v must share their leading dimensions {batch:?}; got {k:?} and {v:?}"));
    }
    if k[rank - 1] != d {
        return Err(format!("q's head size is {d} and k's {}; they must match", k[rank - 1]));
    }
    if v[rank - 2] != k[rank - 2] {
        return Err(format!("k has {} tokens and v {}; they must match", k[rank - 2], v[rank - 2]));
    }
    let mut out = Shape::from_slice(batch);
    out.extend([t, v[rank - 1]]);
    Ok(TensorMeta { dtype, shape: out })
}

/// `[q.numel() + k.numel() + v.numel()]` in the operands' one dtype; `grad` is the attention's
/// result's shape.
fn attention_backward_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let forward = attention_rule(&[args[0], args[1], args[2]])?;
    let (dtype, grad) = float_tensor(args, 3)?;
    let dtypes: Vec<DType> = (0..4).map(|i| tensor(args, i).map(|(d, _)| d)).collect::<Result<_, _>>()?;
    if dtypes.iter().any(|&d| d != dtype) {
        return Err(format!(
            "q, k, v and grad must share one float dtype (got {dtypes:?}); cast them to the attention's result's"
        ));
    }
    if grad != forward.shape.as_slice() {
        return Err(format!("grad must have the attention's result's shape {:?}, not {grad:?}", forward.shape));
    }
    let numel = |i: usize| tensor(args, i).map(|(_, s)| s.iter().product::<usize>());
    let total = numel(0)?.checked_add(numel(1)?).and_then(|n| n.checked_add(numel(2).ok()?));
    let total = total.ok_or("q, k and v hold more elements together than an index can count")?;
    Ok(TensorMeta::new(dtype, &[total]))
}

fn decompose_log_softmax(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let x = value(args, 0).ok_or_else(|| missing("log_softmax"))?;
    in_f32(b, [Some(x)], |b, [x]| {
        let x = x.ok_or_else(|| missing("log_softmax"))?;
        let m = b.max(x)?;
        let shifted = b.sub(x, m)?;
        let e = b.exp(shifted)?;
        let z = b.sum(e)?;
        let log_z = b.log(z)?;
        b.sub(shifted, log_z)
    })
}

fn decompose_cross_entropy(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let logits = value(args, 0).ok_or_else(|| missing("cross_entropy"))?;
    let targets = value(args, 1).ok_or_else(|| missing("cross_entropy"))?;
    let rows = b.shape(targets)?.first().copied().ok_or_else(|| missing("cross_entropy"))?;
    // Only the logits are floats, widened to `f32`; the targets stay integers, and the loss
    // stays `f32` (not rounded back to the logits' dtype).
    let logits = if b.dtype(logits)? == DType::F32 { logits } else { b.cast(logits, DType::F32)? };
    let log_p = b.log_softmax(logits)?;
    let picked = b.gather_last(log_p, targets)?;
    let row = b.reshape(picked, &[1, rows])?;
    let total = b.sum(row)?;
    let total = b.reshape(total, &[])?;
    // The mean of an empty batch is NaN, as in PyTorch.
    b.mul_scalar(total, -1.0 / rows as f32)
}

/// `(softmax(logits) - one_hot(targets)) grad / rows`, in `f32`, rounded once to the logits'
/// dtype.
fn decompose_cross_entropy_backward(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let what = "cross_entropy_backward";
    let (logits, targets, grad) = (value(args, 0), value(args, 1), value(args, 2));
    let (logits, targets, grad) = (
        logits.ok_or_else(|| missing(what))?,
        targets.ok_or_else(|| missing(what))?,
        grad.ok_or_else(|| missing(what))?,
    );
    let dtype = b.dtype(logits)?;
    let (rows, classes) = match *b.shape(logits)? {
        [rows, classes] => (rows, classes),
        _ => return Err(missing(what)),
    };
    let wide =
        |b: &mut TraceBuilder<'_>, v: ValueId| if b.dtype(v)? == DType::F32 { Ok(v) } else { b.cast(v, DType::F32) };
    let (logits, grad) = (wide(b, logits)?, wide(b, grad)?);
    let grad = b.reshape(grad, &[])?;
    let p = b.softmax(logits)?;
    let per_row = b.mul_scalar(grad, 1.0 / rows as f32)?;
    let spread = b.mul(p, per_row)?;
    let column = b.broadcast_to(per_row, &[rows])?;
    let picked = b.scatter_last(column, targets, classes)?;
    let d = b.sub(spread, picked)?;
    if dtype == DType::F32 {
        Ok(d)
    } else {
        b.cast(d, dtype)
    }
}

fn decompose_attention(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let what = "scaled_dot_product_attention";
    let (q, k, v) = (value(args, 0), value(args, 1), value(args, 2));
    let (scale, causal) = (scalar(args, 3), scalar(args, 4) != 0.0);
    in_f32(b, [q, k, v], |b, [q, k, v]| {
        let (q, k, v) =
            (q.ok_or_else(|| missing(what))?, k.ok_or_else(|| missing(what))?, v.ok_or_else(|| missing(what))?);
        let scores = b.matmul_transposed(q, k)?;
        let mut scores = b.mul_scalar(scores, scale)?;
        if causal {
            scores = b.causal_mask(scores)?;
        }
        let p = b.softmax(scores)?;
        b.matmul(p, v)
    })
}

/// The gradients of attention with respect to q, k and v, recomputing the probabilities:
/// `dv = p^T g`, `ds = p (g v^T - rowsum(p g v^T)) scale`, `dq = ds k`, `dk = ds^T q`, each
/// flattened, then joined.
///
/// In `f32` every step is `f32`. In 16 bits it is like PyTorch's math attention under
/// autocast: the products take and give 16-bit values (accumulating in `f32`), `q` is scaled
/// before its product (exact for a power-of-two scale such as `1/sqrt(64)`; PyTorch scales `q`
/// and `k` by its square root), the probabilities are computed in `f32` and kept in 16 bits, and
/// `ds` is computed in `f32` from them and rounded once. The score-sized tensors, the largest of
/// a transformer's backward, then take two bytes an element.
fn decompose_attention_backward(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let what = "scaled_dot_product_attention_backward";
    let get = |i: usize| value(args, i).ok_or_else(|| missing(what));
    let (q, k, v, g) = (get(0)?, get(1)?, get(2)?, get(3)?);
    let grads = attention_backward_math(b, [q, k, v, g], scalar(args, 4), scalar(args, 5) != 0.0)?;
    let mut flat = grads;
    for (f, grad) in flat.iter_mut().zip(grads) {
        let n = b.shape(grad)?.iter().product::<usize>();
        *f = b.reshape(grad, &[n])?;
    }
    b.concat(&flat, 0)
}

/// `[dq, dk, dv]` of attention for `[q, k, v, grad]` of one float dtype: one
/// `scaled_dot_product_attention_backward` (CudaOps runs it whole: cuDNN's fused backward in 16
/// bits, the generated flash-attention backward in f32), its packed result sliced into the
/// three. What `passes::Grad` writes for attention. With `math_in_f32` (`qkv_attention_backward`'s
/// decomposition, which runs where that op does not run whole, so the packed op would not
/// either) `f32` gets the math directly ([`attention_backward_math`]): packing would only cost
/// copies.
pub(crate) fn attention_gradients(
    b: &mut TraceBuilder<'_>,
    [q, k, v, g]: [ValueId; 4],
    scale: f32,
    causal: bool,
    math_in_f32: bool,
) -> Result<[ValueId; 3]> {
    if math_in_f32 && b.dtype(q)? == DType::F32 {
        return attention_backward_math(b, [q, k, v, g], scale, causal);
    }
    let packed = b.scaled_dot_product_attention_backward(q, k, v, g, causal, scale)?;
    let mut grads = [packed; 3];
    let mut start = 0;
    for (grad, x) in grads.iter_mut().zip([q, k, v]) {
        let shape = b.shape(x)?.to_vec();
        let n = shape.iter().product::<usize>();
        let flat = b.slice(packed, 0, start, start + n)?;
        *grad = b.reshape(flat, &shape)?;
        start += n;
    }
    Ok(grads)
}

/// `[dq, dk, dv]` of attention for `[q, k, v, grad]` of one float dtype (see
/// [`decompose_attention_backward`]), computed by the products and the softmax's gradient.
fn attention_backward_math(
    b: &mut TraceBuilder<'_>,
    [q, k, v, g]: [ValueId; 4],
    scale: f32,
    causal: bool,
) -> Result<[ValueId; 3]> {
    let dtype = b.dtype(q)?;
    let mut scores = if dtype == DType::F32 {
        let scores = b.matmul_transposed(q, k)?;
        b.mul_scalar(scores, scale)?
    } else {
        let scaled_q = b.mul_scalar(q, scale)?;
        b.matmul_transposed(scaled_q, k)?
    };
    if causal {
        scores = b.causal_mask(scores)?;
    }
    let p = b.softmax(scores)?;
    let dv = b.transposed_matmul(p, g)?;
    let dp = b.matmul_transposed(g, v)?;
    let wide =
        |b: &mut TraceBuilder<'_>, x: ValueId| if b.dtype(x)? == DType::F32 { Ok(x) } else { b.cast(x, DType::F32) };
    let (dp_wide, p_wide) = (wide(b, dp)?, wide(b, p)?);
    let weighted = b.mul(dp_wide, p_wide)?;
    let dot = b.sum(weighted)?;
    let centered = b.sub(dp_wide, dot)?;
    let ds = b.mul(p_wide, centered)?;
    let ds = b.mul_scalar(ds, scale)?;
    let ds = if dtype == DType::F32 { ds } else { b.cast(ds, dtype)? };
    let dq = b.matmul(ds, k)?;
    let dk = b.transposed_matmul(ds, q)?;
    Ok([dq, dk, dv])
}

/// Typed methods for the transformer ops. Each one is `bind` with the symbol's fixed id.
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::{Arena, DType, Plan, Registry, Tensor, TensorMeta, TraceBuilder};
/// let (registry, arena) = (Registry::with_builtins(), Arena::new());
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let wte = b.input(&[10, 4]).unwrap();
/// let ids = b.input_with(&TensorMeta::new(DType::I64, &[2, 3])).unwrap();
/// let x = b.embedding(wte, ids).unwrap(); // [2, 3, 4]
/// let qkv = b.split(x, 2, &[2, 2]).unwrap(); // two [2, 3, 2]
/// let y = b.scaled_dot_product_attention(qkv[0], qkv[1], qkv[1], true, None).unwrap();
/// let logits = b.reshape(y, &[6, 2]).unwrap();
/// let targets = b.reshape(ids, &[6]).unwrap();
/// let targets = b.slice(targets, 0, 0, 6).unwrap();
/// let clipped = b.argmax(logits, 1, false).unwrap(); // [6] of i64, each 0 or 1
/// let loss = b.cross_entropy(logits, clipped).unwrap();
/// b.output(loss).unwrap();
/// b.output(targets).unwrap();
/// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
/// let wte = Tensor::from_fn(&[10, 4], |i| (i as f32 * 0.37).sin());
/// let ids = Tensor::from_vec(&[2, 3], vec![1i64, 5, 9, 0, 0, 3]).unwrap();
/// let out = plan.run(&[&wte, &ids]).unwrap();
/// assert_eq!(out[0].shape(), &[] as &[usize]);
/// assert!(out[0].to_f32_vec()[0] > 0.0);
/// assert_eq!(out[1].values::<i64>().unwrap(), &[1, 5, 9, 0, 0, 3]);
/// ```
impl<'a> TraceBuilder<'a> {
    /// Elements `start..end` of `x` along `axis` (`x[..., start:end, ...]`).
    pub fn slice(&mut self, x: ValueId, axis: usize, start: usize, end: usize) -> Result<ValueId> {
        self.bind(SLICE, &[Arg::Value(x), Arg::Dims(&[axis, start, end])])
    }

    /// `len` elements of `x` from `start` along `axis`, as `torch.narrow`.
    ///
    /// # Errors
    /// As [`slice`](Self::slice)'s, and [`Error::ShapeMismatch`] naming `narrow` where
    /// `start + len` is past what `usize` holds.
    pub fn narrow(&mut self, x: ValueId, axis: usize, start: usize, len: usize) -> Result<ValueId> {
        let Some(end) = start.checked_add(len) else {
            return Err(Error::ShapeMismatch {
                symbol: "narrow".into(),
                shapes: vec![self.shape(x)?.to_vec()],
                detail: format!("start {start} plus length {len} is past any axis"),
            });
        };
        self.slice(x, axis, start, end)
    }

    /// `x` cut along `axis` into consecutive pieces of `sizes` (which add up to the axis), as
    /// `torch.split` with a list: the attention's q, k and v from one product.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `x` has no axis `axis`, or `sizes` do not add up to its size.
    pub fn split(&mut self, x: ValueId, axis: usize, sizes: &[usize]) -> Result<Vec<ValueId>> {
        let shape = self.shape(x)?.to_vec();
        let Some(&size) = shape.get(axis) else {
            return Err(missing_axis("split", &shape, axis));
        };
        // (An overflowing total is no axis's size either.)
        if sizes.iter().try_fold(0usize, |t, &s| t.checked_add(s)) != Some(size) {
            return Err(Error::ShapeMismatch {
                symbol: "split".into(),
                shapes: vec![shape.clone()],
                detail: format!("sizes {sizes:?} do not add up to axis {axis} of {shape:?}"),
            });
        }
        let mut start = 0;
        let mut pieces = Vec::with_capacity(sizes.len());
        for &size in sizes {
            pieces.push(self.slice(x, axis, start, start + size)?);
            start += size;
        }
        Ok(pieces)
    }

    /// `parts` joined along `axis`, as `torch.cat`: one `concat` of two per part after the
    /// first, joined as a balanced tree (neighbours in pairs, then the pairs in pairs), so that
    /// each value is copied about `log2(parts)` times, not up to `parts` times as a chain of
    /// joins onto one growing value would copy the first part.
    ///
    /// # Errors
    /// [`Error::ArityMismatch`] for no parts; [`Error::ShapeMismatch`] for parts that differ
    /// outside `axis` or in dtype.
    pub fn concat(&mut self, parts: &[ValueId], axis: usize) -> Result<ValueId> {
        if parts.is_empty() {
            return Err(Error::ArityMismatch { symbol: "concat".into(), expected: "at least 1".into(), got: 0 });
        }
        let mut level = parts.to_vec();
        while level.len() > 1 {
            let mut joined = Vec::with_capacity(level.len().div_ceil(2));
            for pair in level.chunks(2) {
                joined.push(match *pair {
                    [a, b] => self.bind(CONCAT, &[Arg::Value(a), Arg::Value(b), Arg::Dims(&[axis])])?,
                    _ => pair[0],
                });
            }
            level = joined;
        }
        Ok(level[0])
    }

    /// `a @ b^T` over the last two axes: `[..., m, k] x [..., n, k] -> [..., m, n]`, batch
    /// dimensions broadcast as in `matmul` (attention's `q k^T`). CudaOps runs it as one product
    /// that reads `b` transposed; elsewhere it is a `transpose` and a `matmul`.
    pub fn matmul_transposed(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.bind(MATMUL_TRANSPOSED, &[Arg::Value(a), Arg::Value(b)])
    }

    /// `a^T @ b` over the last two axes: `[..., k, m] x [..., k, n] -> [..., m, n]`, batch
    /// dimensions broadcast as in `matmul` (the weight gradient of a product, `x^T g`). CudaOps
    /// runs it as one product that reads `a` transposed; elsewhere it is a `transpose` and a
    /// `matmul`.
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let (x, y) = (b.input(&[2, 3]).unwrap(), b.input(&[2, 1]).unwrap());
    /// let z = b.transposed_matmul(x, y).unwrap(); // [3, 1]
    /// b.output(z).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// let x = Tensor::new(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    /// let out = plan.run(&[&x, &Tensor::new(&[2, 1], vec![1.0, 10.0]).unwrap()]).unwrap();
    /// assert_eq!(out[0].to_f32_vec(), &[41.0, 52.0, 63.0]);
    /// ```
    pub fn transposed_matmul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.bind(TRANSPOSED_MATMUL, &[Arg::Value(a), Arg::Value(b)])
    }

    /// `x` with its axes permuted, as `torch.permute`: output axis `i` is input axis `perm[i]`
    /// (the `transpose` prim).
    pub fn permute(&mut self, x: ValueId, perm: &[usize]) -> Result<ValueId> {
        self.transpose(x, perm)
    }

    /// `name` (`sum_dim`, ...) over `axis` by prim `id`: an axis `x` lacks, and a tensor the
    /// prim refuses (an integer one), are reported as `name`'s, not as the prim's the call binds.
    fn reduce_axis(&mut self, name: &str, id: SymbolId, x: ValueId, axis: usize, keepdim: bool) -> Result<ValueId> {
        let shape = self.shape(x)?;
        if axis >= shape.len() {
            return Err(missing_axis(name, shape, axis));
        }
        if id == MAX_AXIS && shape[axis] == 0 {
            // As `torch.amax`: an empty axis has no maximum (the prims give max's identity,
            // -infinity, which `softmax` of empty rows relies on).
            let last =
                if axis + 1 == shape.len() { " (or use `max`, which gives -infinity over empty rows)" } else { "" };
            return Err(Error::ShapeMismatch {
                symbol: name.into(),
                shapes: vec![shape.to_vec()],
                detail: format!("axis {axis} is empty and has no maximum; reduce over a non-empty axis{last}"),
            });
        }
        // Over the last axis, the last-axis prims: the fusion executors fuse them. (What they
        // refuse, an integer tensor, is reported as `name`'s too.)
        let last = shape.len() - 1 == axis;
        let kept = match id {
            SUM_AXIS if last => self.sum(x),
            MAX_AXIS if last => self.max(x),
            _ => self.bind(id, &[Arg::Value(x), Arg::Dims(&[axis])]),
        }
        .map_err(|e| match e {
            Error::ShapeMismatch { shapes, detail, .. } => Error::ShapeMismatch { symbol: name.into(), shapes, detail },
            other => other,
        })?;
        if keepdim {
            return Ok(kept);
        }
        let mut shape = self.shape(kept)?.to_vec();
        shape.remove(axis);
        self.reshape(kept, &shape)
    }

    /// The sum over `axis`, as `torch.sum(x, axis, keepdim)`.
    pub fn sum_dim(&mut self, x: ValueId, axis: usize, keepdim: bool) -> Result<ValueId> {
        self.reduce_axis("sum_dim", SUM_AXIS, x, axis, keepdim)
    }

    /// The maximum over `axis`, as `torch.amax(x, axis, keepdim)` (NaN wins). An empty axis is
    /// an error, as in PyTorch.
    pub fn max_dim(&mut self, x: ValueId, axis: usize, keepdim: bool) -> Result<ValueId> {
        self.reduce_axis("max_dim", MAX_AXIS, x, axis, keepdim)
    }

    /// The mean over `axis`, as `torch.mean(x, axis, keepdim)`: the sum, times 1 / size.
    pub fn mean_dim(&mut self, x: ValueId, axis: usize, keepdim: bool) -> Result<ValueId> {
        let n = self.shape(x)?.get(axis).copied().unwrap_or(1);
        let sum = self.reduce_axis("mean_dim", SUM_AXIS, x, axis, keepdim)?;
        self.mul_scalar(sum, 1.0 / n as f32)
    }

    /// The `i64` index of the first maximum over `axis` (a NaN counts as the maximum), as
    /// `torch.argmax(x, axis, keepdim)`.
    pub fn argmax(&mut self, x: ValueId, axis: usize, keepdim: bool) -> Result<ValueId> {
        self.reduce_axis("argmax", ARGMAX, x, axis, keepdim)
    }

    fn compare(&mut self, id: SymbolId, a: ValueId, b: Arg<'_>) -> Result<ValueId> {
        self.bind(id, &[Arg::Value(a), b])
    }

    /// `a < b` elementwise (broadcasting), as `i32` 0 or 1. PyTorch gives `bool`; boundscope
    /// has no bool dtype, so masks are `i32` (every op that takes a mask reads non-zero as true).
    /// Integers compare exactly; an integer with a float compares as `f32`, as PyTorch promotes.
    pub fn lt(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.compare(LT, a, Arg::Value(b))
    }

    /// `a <= b` (see [`lt`](Self::lt)).
    pub fn le(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.compare(LE, a, Arg::Value(b))
    }

    /// `a > b` (see [`lt`](Self::lt)).
    pub fn gt(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.compare(GT, a, Arg::Value(b))
    }

    /// `a >= b` (see [`lt`](Self::lt)).
    pub fn ge(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.compare(GE, a, Arg::Value(b))
    }

    /// `a == b` (see [`lt`](Self::lt)).
    pub fn eq(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.compare(EQ, a, Arg::Value(b))
    }

    /// `a != b` (see [`lt`](Self::lt)): `ids != pad` is a padding mask.
    pub fn ne(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.compare(NE, a, Arg::Value(b))
    }

    /// `a` compared with the scalar `b` by `op` (one of [`prims::COMPARISONS`](super::prims::COMPARISONS)).
    ///
    /// # Errors
    /// [`Error::ArgumentKind`] (argument 0 of `compare_scalar`) if `op` is not a comparison.
    pub fn compare_scalar(&mut self, op: SymbolId, a: ValueId, b: f32) -> Result<ValueId> {
        if !COMPARISONS.contains(&op) {
            return Err(Error::ArgumentKind {
                symbol: "compare_scalar".into(),
                position: 0,
                expected: "a comparison, one of prims::COMPARISONS (LT, LE, GT, GE, EQ, NE)",
                got: "symbol that is not one",
            });
        }
        self.compare(op, a, Arg::Scalar(b))
    }

    /// `a` where the integer mask `cond` is non-zero, else `b`, all three broadcast, as
    /// `torch.where`; the result's dtype is `a`'s and `b`'s, promoted.
    pub fn where_(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.bind(WHERE, &[Arg::Value(cond), Arg::Value(a), Arg::Value(b)])
    }

    /// `a` where `cond` is non-zero, else the scalar `fill` (`a.masked_fill(cond == 0, fill)`).
    pub fn where_scalar(&mut self, cond: ValueId, a: ValueId, fill: f32) -> Result<ValueId> {
        self.bind(WHERE, &[Arg::Value(cond), Arg::Value(a), Arg::Scalar(fill)])
    }

    /// `x` with `-inf` above the diagonal of its last two axes: row `i` keeps columns `0..=i`,
    /// as `scaled_dot_product_attention(is_causal=True)` masks its scores.
    pub fn causal_mask(&mut self, x: ValueId) -> Result<ValueId> {
        self.bind(CAUSAL_MASK, &[Arg::Value(x)])
    }

    /// The rows of `weight` (`[rows, width]`) at integer `ids`: `[*ids.shape, width]`, as
    /// `torch.nn.functional.embedding`. An id outside `0..rows` fails the run with
    /// [`Error::IndexOutOfRange`].
    pub fn embedding(&mut self, weight: ValueId, ids: ValueId) -> Result<ValueId> {
        self.bind(EMBEDDING, &[Arg::Value(weight), Arg::Value(ids)])
    }

    /// `x[..., ids[...]]`: from each last-axis row of `x`, the element at the integer id of that
    /// row, as `torch.gather(x, -1, ids[..., None])[..., 0]`.
    pub fn gather_last(&mut self, x: ValueId, ids: ValueId) -> Result<ValueId> {
        self.bind(GATHER_LAST, &[Arg::Value(x), Arg::Value(ids)])
    }

    /// `log(softmax(x))` over the last axis, computed as `x - max - log(sum(exp(x - max)))`.
    pub fn log_softmax(&mut self, x: ValueId) -> Result<ValueId> {
        self.bind(LOG_SOFTMAX, &[Arg::Value(x)])
    }

    /// The mean over rows of `-log_softmax(logits)[row, targets[row]]`: logits `[rows,
    /// classes]`, integer targets `[rows]`, a zero-dimensional result, as
    /// `torch.nn.functional.cross_entropy`. The result is `f32` whatever the logits' float
    /// dtype, as under `torch.autocast` (16-bit logits are read as they are and computed on in
    /// `f32`: no cast of the logits first).
    pub fn cross_entropy(&mut self, logits: ValueId, targets: ValueId) -> Result<ValueId> {
        self.bind(CROSS_ENTROPY, &[Arg::Value(logits), Arg::Value(targets)])
    }

    /// The gradient of [`cross_entropy`](Self::cross_entropy) with respect to its logits, for
    /// the loss's gradient `grad` (one element): `(softmax(logits) - one_hot(targets)) grad /
    /// rows`, computed in `f32` and rounded once to the logits' dtype. `passes::Grad` writes
    /// it for `cross_entropy`; CudaOps runs it as one kernel that reads each row twice and
    /// writes it once, other executors as its decomposition.
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, DType, Plan, Registry, Tensor, TensorMeta, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let logits = b.input(&[2, 2]).unwrap();
    /// let targets = b.input_with(&TensorMeta::new(DType::I64, &[2])).unwrap();
    /// let grad = b.input(&[]).unwrap();
    /// let d = b.cross_entropy_backward(logits, targets, grad).unwrap();
    /// b.output(d).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// let logits = Tensor::new(&[2, 2], vec![0.0, 0.0, 0.0, 0.0]).unwrap();
    /// let targets = Tensor::from_vec(&[2], vec![1i64, 0]).unwrap();
    /// let out = plan.run(&[&logits, &targets, &Tensor::new(&[], vec![1.0]).unwrap()]).unwrap();
    /// assert_eq!(out[0].to_f32_vec(), &[0.25, -0.25, -0.25, 0.25]);
    /// ```
    pub fn cross_entropy_backward(&mut self, logits: ValueId, targets: ValueId, grad: ValueId) -> Result<ValueId> {
        self.bind(CROSS_ENTROPY_BACKWARD, &[Arg::Value(logits), Arg::Value(targets), Arg::Value(grad)])
    }

    /// `softmax(q k^T scale (+ causal mask)) v` for `q` `[..., tokens, head]` and `k`, `v`
    /// `[..., kv_tokens, head]`, as `torch.nn.functional.scaled_dot_product_attention`; `scale`
    /// defaults to `1 / sqrt(head)`.
    pub fn scaled_dot_product_attention(
        &mut self,
        q: ValueId,
        k: ValueId,
        v: ValueId,
        causal: bool,
        scale: Option<f32>,
    ) -> Result<ValueId> {
        let head = self.shape(q)?.last().copied().unwrap_or(1);
        let scale = scale.unwrap_or(1.0 / (head as f32).sqrt());
        let causal = if causal { 1.0 } else { 0.0 };
        self.bind(
            SCALED_DOT_PRODUCT_ATTENTION,
            &[Arg::Value(q), Arg::Value(k), Arg::Value(v), Arg::Scalar(scale), Arg::Scalar(causal)],
        )
    }

    /// The gradients of [`scaled_dot_product_attention`](Self::scaled_dot_product_attention)
    /// with respect to `q`, `k` and `v` for the result's gradient `grad`, packed one after the
    /// other into one `[q.numel() + k.numel() + v.numel()]` tensor (slice and reshape to get
    /// each); `q`, `k`, `v` and `grad` share one float dtype and `scale` is the forward's (no
    /// default here). `passes::Grad` writes it for 16-bit attention; CudaOps runs it in 16 bits as
    /// cuDNN's fused attention backward (which recomputes the forward's softmax statistics),
    /// other executors as its decomposition (the probabilities recomputed, then four products).
    ///
    /// ```
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let q = b.input(&[2, 4]).unwrap();
    /// let g = b.input(&[2, 4]).unwrap();
    /// let grads = b.scaled_dot_product_attention_backward(q, q, q, g, true, 0.5).unwrap();
    /// assert_eq!(b.shape(grads).unwrap(), &[24]); // dq, dk, dv: 8 elements each
    /// b.output(grads).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// let x = Tensor::new(&[2, 4], vec![0.5; 8]).unwrap();
    /// let out = plan.run(&[&x, &x]).unwrap();
    /// // With equal keys the probabilities are uniform and do not depend on q: dq is zero.
    /// assert!(out[0].to_f32_vec()[..8].iter().all(|d| d.abs() < 1e-6));
    /// ```
    pub fn scaled_dot_product_attention_backward(
        &mut self,
        q: ValueId,
        k: ValueId,
        v: ValueId,
        grad: ValueId,
        causal: bool,
        scale: f32,
    ) -> Result<ValueId> {
        let causal = if causal { 1.0 } else { 0.0 };
        self.bind(
            SCALED_DOT_PRODUCT_ATTENTION_BACKWARD,
            &[Arg::Value(q), Arg::Value(k), Arg::Value(v), Arg::Value(grad), Arg::Scalar(scale), Arg::Scalar(causal)],
        )
    }
}
