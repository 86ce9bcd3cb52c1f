//! The gradient rule of every built-in prim and of the composites that are differentiated
//! whole (the others are differentiated through their decompositions): each binds the ops
//! that compute the gradient of each argument from the output's gradient.
//!
//! Rules that do more than one rounding's worth of math on 16-bit values compute in `f32`
//! (as PyTorch's backward kernels do); `passes::Grad` casts every gradient to its argument's
//! dtype.

use crate::core::ir::{prims, Arg, DType, SymbolId, TraceBuilder, ValueId, VjpInput};
use crate::error::{Error, Result};

/// The gradients of one bound symbol's arguments, one entry per argument.
pub(super) type Grads = Vec<Option<ValueId>>;

/// A built-in's rule.
pub(super) type BuiltinRule = for<'a> fn(&mut TraceBuilder<'a>, &VjpInput<'_, 'a>) -> Result<Grads>;

/// The rule of built-in `id`, if it has one (prims that make integers have none: no gradient
/// flows through them; composites without one are differentiated through their prims).
pub(super) fn builtin_rule(id: SymbolId) -> Option<BuiltinRule> {
    use prims::*;
    Some(match id {
        NEG => |b, op| one(b.neg(op.cotangent)),
        EXP => |b, op| one(b.mul(op.cotangent, op.output)),
        LOG => |b, op| one(b.div(op.cotangent, tensor(op, 0)?)),
        TANH => |b, op| {
            let [g, y] = widened(b, [op.cotangent, op.output])?;
            let gy = b.mul(g, y)?;
            let gyy = b.mul(gy, y)?;
            one(b.sub(g, gyy))
        },
        SIGMOID => |b, op| {
            let [g, y] = widened(b, [op.cotangent, op.output])?;
            let gy = b.mul(g, y)?;
            let gyy = b.mul(gy, y)?;
            one(b.sub(gy, gyy))
        },
        RELU => |b, op| {
            let positive = b.compare_scalar(GT, tensor(op, 0)?, 0.0)?;
            one(b.where_scalar(positive, op.cotangent, 0.0))
        },
        GELU => |b, op| {
            let [g, x] = widened(b, [op.cotangent, tensor(op, 0)?])?;
            let slope = gelu_slope(b, x)?;
            one(b.mul(g, slope))
        },
        ADD => |b, op| binary(b, op, |_, g, _, _| Ok((g, Some(g)))),
        SUB => |b, op| binary(b, op, |b, g, _, _| Ok((g, Some(b.neg(g)?)))),
        MUL => |b, op| match op.args[1] {
            Arg::Scalar(s) => one(b.mul_scalar(op.cotangent, s)),
            _ => binary(b, op, |b, g, x, y| Ok((b.mul(g, y)?, Some(b.mul(g, x)?)))),
        },
        DIV => |b, op| match op.args[1] {
            Arg::Scalar(s) => one(b.div_scalar(op.cotangent, s)),
            _ => binary(b, op, |b, g, _, y| {
                let dx = b.div(g, y)?;
                let ratio = b.mul(dx, op.output)?;
                Ok((dx, Some(b.neg(ratio)?)))
            }),
        },
        MAXIMUM => maximum,
        SUM | SUM_AXIS => |b, op| {
            let x = tensor(op, 0)?;
            let shape = b.shape(x)?;
            one(b.broadcast_to(op.cotangent, shape))
        },
        MAX => |b, op| max(b, op, None),
        MAX_AXIS => |b, op| max(b, op, Some(axis(op)?)),
        MATMUL => |b, op| {
            let (x, y, g) = (tensor(op, 0)?, tensor(op, 1)?, op.cotangent);
            let dx = b.matmul_transposed(g, y)?;
            let dy = b.transposed_matmul(x, g)?;
            Ok(vec![Some(unbroadcast(b, dx, x)?), Some(unbroadcast(b, dy, y)?)])
        },
        RESHAPE => |b, op| {
            let shape = b.shape(tensor(op, 0)?)?;
            one(b.reshape(op.cotangent, shape))
        },
        TRANSPOSE => |b, op| {
            let perm = dims(op, 1)?;
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            one(b.transpose(op.cotangent, &inverse))
        },
        BROADCAST_TO => |b, op| one(unbroadcast(b, op.cotangent, tensor(op, 0)?)),
        CAST => |b, op| {
            let x = tensor(op, 0)?;
            let dtype = b.dtype(x)?;
            if dtype.is_integer() {
                return Ok(vec![None, None]);
            }
            one(b.cast(op.cotangent, dtype))
        },
        SLICE => |b, op| {
            let size = b.shape(tensor(op, 0)?)?;
            match *dims(op, 1)? {
                [axis, start, end] => one(b.pad(op.cotangent, axis, start, size[axis] - end, 0.0)),
                _ => Err(malformed(op)),
            }
        },
        CONCAT => |b, op| {
            let (x, y) = (tensor(op, 0)?, tensor(op, 1)?);
            let axis = axis_at(op, 2)?;
            let (first, second) = (b.shape(x)?[axis], b.shape(y)?[axis]);
            let dx = b.slice(op.cotangent, axis, 0, first)?;
            let dy = b.slice(op.cotangent, axis, first, first + second)?;
            Ok(vec![Some(dx), Some(dy)])
        },
        CAUSAL_MASK => |b, op| {
            // Where the mask kept the score: a zero tensor, masked, is 0 exactly there.
            let zeros = full_like(b, op.cotangent, 0.0)?;
            let masked = b.causal_mask(zeros)?;
            let kept = b.compare_scalar(EQ, masked, 0.0)?;
            one(b.where_scalar(kept, op.cotangent, 0.0))
        },
        EMBEDDING => |b, op| {
            let (weight, ids) = (tensor(op, 0)?, tensor(op, 1)?);
            let rows = b.shape(weight)?[0];
            Ok(vec![Some(b.embedding_backward(op.cotangent, ids, rows)?), None])
        },
        GATHER_LAST => |b, op| {
            let (x, ids) = (tensor(op, 0)?, tensor(op, 1)?);
            let n = *b.shape(x)?.last().ok_or_else(|| malformed(op))?;
            Ok(vec![Some(b.scatter_last(op.cotangent, ids, n)?), None])
        },
        WHERE => |b, op| {
            let (cond, x) = (tensor(op, 0)?, tensor(op, 1)?);
            let dx = b.where_scalar(cond, op.cotangent, 0.0)?;
            let dx = unbroadcast(b, dx, x)?;
            let dy = match op.value(2) {
                Some(y) => {
                    let other = b.compare_scalar(EQ, cond, 0.0)?;
                    let dy = b.where_scalar(other, op.cotangent, 0.0)?;
                    Some(unbroadcast(b, dy, y)?)
                }
                None => None,
            };
            Ok(vec![None, Some(dx), dy])
        },
        PAD => |b, op| match *dims(op, 1)? {
            [axis, before, _] => {
                let len = b.shape(tensor(op, 0)?)?[axis];
                Ok(vec![Some(b.slice(op.cotangent, axis, before, before + len)?), None, None])
            }
            _ => Err(malformed(op)),
        },
        SCATTER_LAST => |b, op| Ok(vec![Some(b.gather_last(op.cotangent, tensor(op, 1)?)?), None, None]),
        EMBEDDING_BACKWARD => |b, op| Ok(vec![Some(b.embedding(op.cotangent, tensor(op, 1)?)?), None, None]),
        SOFTMAX => |b, op| {
            let [g, y] = widened(b, [op.cotangent, op.output])?;
            let gy = b.mul(g, y)?;
            let dot = b.sum(gy)?;
            let centered = b.sub(g, dot)?;
            one(b.mul(y, centered))
        },
        LOG_SOFTMAX => |b, op| {
            let [g, y] = widened(b, [op.cotangent, op.output])?;
            let total = b.sum(g)?;
            let p = b.exp(y)?;
            let spread = b.mul(p, total)?;
            one(b.sub(g, spread))
        },
        LAYER_NORM => layer_norm,
        LINEAR => |b, op| {
            let (x, w, g) = (tensor(op, 0)?, tensor(op, 1)?, op.cotangent);
            let dx = b.matmul(g, w)?;
            let dw = b.transposed_matmul(g, x)?;
            let mut grads = vec![Some(dx), Some(dw)];
            if let Some(bias) = op.value(2) {
                grads.push(Some(unbroadcast(b, g, bias)?));
            }
            Ok(grads)
        },
        MATMUL_TRANSPOSED => |b, op| {
            let (x, y, g) = (tensor(op, 0)?, tensor(op, 1)?, op.cotangent);
            let dx = b.matmul(g, y)?;
            let dy = b.transposed_matmul(g, x)?;
            Ok(vec![Some(unbroadcast(b, dx, x)?), Some(unbroadcast(b, dy, y)?)])
        },
        CROSS_ENTROPY => |b, op| {
            let (logits, targets) = (tensor(op, 0)?, tensor(op, 1)?);
            Ok(vec![Some(b.cross_entropy_backward(logits, targets, op.cotangent)?), None])
        },
        SCALED_DOT_PRODUCT_ATTENTION => attention,
        QKV_ATTENTION => |b, op| {
            let (qkv, g) = (tensor(op, 0)?, op.cotangent);
            let heads = axis_at(op, 1)?;
            let (scale, causal) = (scalar_at(op, 2)?, scalar_at(op, 3)? != 0.0);
            let dtype = b.dtype(qkv)?;
            let g = if b.dtype(g)? == dtype { g } else { b.cast(g, dtype)? };
            Ok(vec![Some(b.qkv_attention_backward(qkv, g, heads, causal, scale)?), None, None, None])
        },
        _ => return None,
    })
}

/// One gradient, for the first argument.
fn one(grad: Result<ValueId>) -> Result<Grads> {
    Ok(vec![Some(grad?)])
}

fn malformed(op: &VjpInput<'_, '_>) -> Error {
    Error::NoGradient { symbol: op.name.to_string(), detail: "its arguments do not fit its signature".into() }
}

fn tensor(op: &VjpInput<'_, '_>, i: usize) -> Result<ValueId> {
    op.value(i).ok_or_else(|| malformed(op))
}

fn dims<'a>(op: &VjpInput<'_, 'a>, i: usize) -> Result<&'a [usize]> {
    match op.args.get(i) {
        Some(Arg::Dims(d)) => Ok(d),
        _ => Err(malformed(op)),
    }
}

fn scalar_at(op: &VjpInput<'_, '_>, i: usize) -> Result<f32> {
    match op.args.get(i) {
        Some(Arg::Scalar(s)) => Ok(*s),
        _ => Err(malformed(op)),
    }
}

fn axis_at(op: &VjpInput<'_, '_>, i: usize) -> Result<usize> {
    dims(op, i)?.first().copied().ok_or_else(|| malformed(op))
}

fn axis(op: &VjpInput<'_, '_>) -> Result<usize> {
    axis_at(op, 1)
}

/// The values, cast to `f32` where they are 16-bit.
fn widened<const N: usize>(b: &mut TraceBuilder<'_>, values: [ValueId; N]) -> Result<[ValueId; N]> {
    let mut out = values;
    for v in &mut out {
        *v = crate::core::ir::wide(b, *v)?;
    }
    Ok(out)
}

/// `grad` (of a broadcast result) summed down to the shape of `like` (the operand that was
/// broadcast): over the leading axes `like` lacks and the axes where it has size 1.
pub(super) fn unbroadcast(b: &mut TraceBuilder<'_>, grad: ValueId, like: ValueId) -> Result<ValueId> {
    let (from, to) = (b.shape(grad)?.to_vec(), b.shape(like)?.to_vec());
    if from == to {
        return Ok(grad);
    }
    let offset = from.len() - to.len().min(from.len());
    let reduced: Vec<bool> =
        (0..from.len()).map(|axis| (axis < offset || to[axis - offset] == 1) && from[axis] != 1).collect();
    // Only leading axes (a bias's gradient): one product with a row of ones, which reads the
    // gradient once at memory speed on every executor (a reduction over a leading axis walks
    // each column on its own).
    let prefix = reduced.iter().take_while(|&&r| r).count();
    if prefix > 0 && reduced[prefix..].iter().all(|&r| !r) {
        let rows: usize = from[..prefix].iter().product();
        let cols: usize = from[prefix..].iter().product();
        let ones = crate::core::ir::full_of_shape(b, grad, &[1, rows], 1.0)?;
        let g = if from.len() == 2 && prefix == 1 { grad } else { b.reshape(grad, &[rows, cols])? };
        let summed = b.matmul(ones, g)?;
        return b.reshape(summed, &to);
    }
    let mut g = grad;
    for (axis, &reduce) in reduced.iter().enumerate() {
        if reduce {
            g = b.sum_dim(g, axis, true)?;
        }
    }
    b.reshape(g, &to)
}

/// A tensor of `like`'s shape and dtype holding `value` everywhere: `pad` of an empty slice, so
/// that no value of `like` (an infinity, a NaN) can leak into it.
pub(super) fn full_like(b: &mut TraceBuilder<'_>, like: ValueId, value: f32) -> Result<ValueId> {
    let shape = b.shape(like)?.to_vec();
    crate::core::ir::full_of_shape(b, like, &shape, value)
}

/// A binary elementwise op's gradients: `grads(g, x, y)` gives them at the output's shape,
/// then each is summed down to its operand's shape. A scalar second operand gets none.
fn binary<'a>(
    b: &mut TraceBuilder<'a>,
    op: &VjpInput<'_, 'a>,
    grads: impl FnOnce(&mut TraceBuilder<'a>, ValueId, ValueId, ValueId) -> Result<(ValueId, Option<ValueId>)>,
) -> Result<Grads> {
    let x = tensor(op, 0)?;
    match op.value(1) {
        Some(y) => {
            let (dx, dy) = grads(b, op.cotangent, x, y)?;
            let dx = unbroadcast(b, dx, x)?;
            let dy = match dy {
                Some(dy) => Some(unbroadcast(b, dy, y)?),
                None => None,
            };
            Ok(vec![Some(dx), dy])
        }
        None => Ok(vec![Some(unbroadcast(b, op.cotangent, x)?), None]),
    }
}

/// `maximum(x, y)`: the gradient goes to the larger operand, half to each where they are equal,
/// all of it to both where one is NaN (as PyTorch's: `1 - [x < y] - [x == y] / 2` for `x`).
fn maximum<'a>(b: &mut TraceBuilder<'a>, op: &VjpInput<'_, 'a>) -> Result<Grads> {
    let x = tensor(op, 0)?;
    let g = op.cotangent;
    let dtype = b.dtype(g)?;
    let share = |b: &mut TraceBuilder<'a>, smaller: ValueId, equal: ValueId| -> Result<ValueId> {
        let smaller = b.cast(smaller, dtype)?;
        let equal = b.cast(equal, dtype)?;
        let half = b.mul_scalar(equal, 0.5)?;
        let lost = b.add(smaller, half)?;
        let lost = b.neg(lost)?;
        let weight = b.add_scalar(lost, 1.0)?;
        b.mul(g, weight)
    };
    match op.args[1] {
        Arg::Scalar(s) => {
            let smaller = b.compare_scalar(prims::LT, x, s)?;
            let equal = b.compare_scalar(prims::EQ, x, s)?;
            Ok(vec![Some(share(b, smaller, equal)?), None])
        }
        _ => {
            let y = tensor(op, 1)?;
            let equal = b.eq(x, y)?;
            let (x_smaller, y_smaller) = (b.lt(x, y)?, b.gt(x, y)?);
            let dx = share(b, x_smaller, equal)?;
            let dy = share(b, y_smaller, equal)?;
            Ok(vec![Some(unbroadcast(b, dx, x)?), Some(unbroadcast(b, dy, y)?)])
        }
    }
}

/// `max` over the last axis (`axis: None`) or `axis`: the gradient shared evenly by the
/// elements equal to the maximum, as PyTorch's `amax`.
fn max<'a>(b: &mut TraceBuilder<'a>, op: &VjpInput<'_, 'a>, axis: Option<usize>) -> Result<Grads> {
    let x = tensor(op, 0)?;
    let (g, y) = (op.cotangent, op.output);
    let dtype = b.dtype(g)?;
    let hits = b.eq(x, y)?;
    let hits = b.cast(hits, DType::F32)?;
    let count = match axis {
        None => b.sum(hits)?,
        Some(axis) => b.sum_dim(hits, axis, true)?,
    };
    let share = b.div(hits, count)?;
    let share = if dtype == DType::F32 { share } else { b.cast(share, dtype)? };
    one(b.mul(share, g))
}

/// The slope of `gelu`'s tanh form at `x`:
/// `0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2)`, `t = tanh(c (x + k x^3))`.
fn gelu_slope(b: &mut TraceBuilder<'_>, x: ValueId) -> Result<ValueId> {
    const K: f32 = 0.044715;
    let c = (2.0 / std::f32::consts::PI).sqrt();
    let x2 = b.mul(x, x)?;
    let x3 = b.mul(x2, x)?;
    let cubic = b.mul_scalar(x3, K)?;
    let inner = b.add(x, cubic)?;
    let u = b.mul_scalar(inner, c)?;
    let t = b.tanh(u)?;
    let one_plus = b.add_scalar(t, 1.0)?;
    let left = b.mul_scalar(one_plus, 0.5)?;
    let t2 = b.mul(t, t)?;
    let minus_t2 = b.neg(t2)?;
    let sech2 = b.add_scalar(minus_t2, 1.0)?;
    let du = b.mul_scalar(x2, 3.0 * K)?;
    let du = b.add_scalar(du, 1.0)?;
    let du = b.mul_scalar(du, c)?;
    let half_x = b.mul_scalar(x, 0.5)?;
    let right = b.mul(half_x, sech2)?;
    let right = b.mul(right, du)?;
    b.add(left, right)
}

/// `layer_norm(x, eps, weight?, bias?)`: one `layer_norm_backward` for `x` and, for the
/// weight and bias, one `layer_norm_weight_backward` sliced into its two rows (both recompute
/// the normalised rows in `f32` from `x`; CudaOps runs each as its own kernels).
fn layer_norm<'a>(b: &mut TraceBuilder<'a>, op: &VjpInput<'_, 'a>) -> Result<Grads> {
    let eps = scalar_at(op, 1)?;
    let (x, g, weight) = (tensor(op, 0)?, op.cotangent, op.value(2));
    let dx = b.layer_norm_backward(x, g, eps, weight)?;
    let mut grads = vec![Some(dx), None];
    if weight.is_some() {
        let n = *b.shape(x)?.last().ok_or_else(|| malformed(op))?;
        let sums = b.layer_norm_weight_backward(x, g, eps)?;
        for (row, param) in [(0, weight), (1, op.value(3))] {
            if param.is_some() {
                let sum = b.slice(sums, 0, row, row + 1)?;
                grads.push(Some(b.reshape(sum, &[n])?));
            }
        }
    }
    Ok(grads)
}

/// `scaled_dot_product_attention(q, k, v, scale, causal)` (operands of another dtype cast to
/// the result's first): `ir::attention_gradients` (one `scaled_dot_product_attention_backward`,
/// sliced, whose decomposition is the math, in 16 bits as PyTorch's math attention under
/// autocast).
fn attention<'a>(b: &mut TraceBuilder<'a>, op: &VjpInput<'_, 'a>) -> Result<Grads> {
    let (scale, causal) = (scalar_at(op, 3)?, scalar_at(op, 4)? != 0.0);
    let (q, k, v, g) = (tensor(op, 0)?, tensor(op, 1)?, tensor(op, 2)?, op.cotangent);
    let dtype = b.dtype(op.output)?;
    let mut in_dtype = |x: ValueId| if b.dtype(x)? == dtype { Ok(x) } else { b.cast(x, dtype) };
    let (q, k, v, g) = (in_dtype(q)?, in_dtype(k)?, in_dtype(v)?, in_dtype(g)?);
    let [dq, dk, dv] = crate::core::ir::attention_gradients(b, [q, k, v, g], scale, causal, false)?;
    Ok(vec![Some(dq), Some(dk), Some(dv), None, None])
}
