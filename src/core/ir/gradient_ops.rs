//! The ops that gradients need beyond the forward ops: the prims `pad` (the gradient of
//! `slice`), `scatter_last` (of `gather_last`) and `embedding_backward` (of `embedding`), and
//! the composites `layer_norm_backward` and `layer_norm_weight_backward` (of `layer_norm`):
//! their shape and dtype rules, decompositions and typed builder methods. `passes::Grad` binds
//! them; they are ordinary symbols, usable in any trace.

use super::bound_symbol::Arg;
use super::builder::TraceBuilder;
use super::ids::{SymbolId, ValueId};
use super::meta::{DType, Shape, TensorMeta};
use super::prims::{
    check_eps, dims_arg, float_tensor, last_axis, missing, normalised_rows, scalar, tensor, value, PrimRule,
    RuleResult, EMBEDDING_BACKWARD, LAYER_NORM_BACKWARD, LAYER_NORM_WEIGHT_BACKWARD, PAD, SCATTER_LAST,
};
use super::symbol::{ArgInfo, Category, ParamKind, Symbol};
use crate::error::Result;

/// The signature and rule of the prims this file defines.
pub(super) fn prim_rule(id: SymbolId) -> Option<(&'static [ParamKind], PrimRule)> {
    use ParamKind::*;
    Some(match id {
        PAD => (&[Tensor, Dims, Scalar], pad_rule),
        SCATTER_LAST => (&[Tensor, Tensor, Dims], scatter_last_rule),
        EMBEDDING_BACKWARD => (&[Tensor, Tensor, Dims], embedding_backward_rule),
        _ => return None,
    })
}

/// The composites this file defines, in id order (after `scaled_dot_product_attention_backward`).
pub(super) fn push_composites(symbols: &mut Vec<Symbol>) {
    use Category::Composite;
    use ParamKind::*;
    symbols.push(
        Symbol::new("layer_norm_backward", Composite)
            .params_with_optional(&[Tensor, Tensor, Scalar, Tensor], 3)
            .shape_rule(layer_norm_backward_rule)
            .decomposition(decompose_layer_norm_backward),
    );
    symbols.push(
        Symbol::new("layer_norm_weight_backward", Composite)
            .params(&[Tensor, Tensor, Scalar])
            .shape_rule(layer_norm_weight_backward_rule)
            .decomposition(decompose_layer_norm_weight_backward),
    );
    debug_assert_eq!(symbols.len(), LAYER_NORM_WEIGHT_BACKWARD.index() + 1);
    debug_assert_eq!(symbols[LAYER_NORM_BACKWARD.index()].name(), "layer_norm_backward");
}

/// `x` and the gradient `grad` of a `layer_norm` over `x`'s last axis: floats of one shape.
/// Returns `x`'s dtype and shape.
fn normalised_operands<'m>(args: &[ArgInfo<'m>]) -> std::result::Result<(DType, &'m [usize]), String> {
    let (dtype, shape) = float_tensor(args, 0)?;
    let (_, grad) = float_tensor(args, 1)?;
    check_eps(args, 2)?;
    last_axis(shape)?;
    if grad != shape {
        return Err(format!("the gradient must have x's shape {shape:?}, not {grad:?}"));
    }
    Ok((dtype, shape))
}

fn layer_norm_backward_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = normalised_operands(args)?;
    let n = last_axis(shape)?;
    if args.len() > 3 {
        let (_, w) = float_tensor(args, 3)?;
        if w != [n] {
            return Err(format!("the weight must have shape [{n}] (x's last axis), not {w:?}"));
        }
    }
    Ok(TensorMeta::new(dtype, shape))
}

fn layer_norm_weight_backward_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, shape) = normalised_operands(args)?;
    Ok(TensorMeta::new(DType::F32, &[2, last_axis(shape)?]))
}

/// `value` in `f32` (cast if it is another dtype).
pub(crate) fn wide(b: &mut TraceBuilder<'_>, value: ValueId) -> Result<ValueId> {
    if b.dtype(value)? == DType::F32 {
        Ok(value)
    } else {
        b.cast(value, DType::F32)
    }
}

fn decompose_layer_norm_backward(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let what = "layer_norm_backward";
    let (x, g) = (value(args, 0).ok_or_else(|| missing(what))?, value(args, 1).ok_or_else(|| missing(what))?);
    let dtype = b.dtype(x)?;
    let (x, g) = (wide(b, x)?, wide(b, g)?);
    let (normed, inv_std) = normalised_rows(b, x, scalar(args, 2))?;
    let inv_n = 1.0 / *b.shape(x)?.last().ok_or_else(|| missing(what))? as f32;
    let dnormed = match value(args, 3) {
        Some(w) => {
            let w = wide(b, w)?;
            b.mul(g, w)?
        }
        None => g,
    };
    let dsum = b.sum(dnormed)?;
    let dmean = b.mul_scalar(dsum, inv_n)?;
    let dot = b.mul(dnormed, normed)?;
    let dot = b.sum(dot)?;
    let dot_mean = b.mul_scalar(dot, inv_n)?;
    let projected = b.mul(normed, dot_mean)?;
    let dx = b.sub(dnormed, dmean)?;
    let dx = b.sub(dx, projected)?;
    let dx = b.mul(dx, inv_std)?;
    if dtype == DType::F32 {
        Ok(dx)
    } else {
        b.cast(dx, dtype)
    }
}

fn decompose_layer_norm_weight_backward(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let what = "layer_norm_weight_backward";
    let (x, g) = (value(args, 0).ok_or_else(|| missing(what))?, value(args, 1).ok_or_else(|| missing(what))?);
    let (x, g) = (wide(b, x)?, wide(b, g)?);
    let (normed, _) = normalised_rows(b, x, scalar(args, 2))?;
    let gw = b.mul(g, normed)?;
    // Sums over every row: one product with a row of ones each, which reads the rows once at
    // memory speed on every executor.
    let shape = b.shape(g)?.to_vec();
    let n = *shape.last().ok_or_else(|| missing(what))?;
    let rows: usize = shape[..shape.len() - 1].iter().product();
    let ones = full_of_shape(b, g, &[1, rows], 1.0)?;
    let mut sums = [gw, g];
    for s in &mut sums {
        let matrix = if shape.len() == 2 { *s } else { b.reshape(*s, &[rows, n])? };
        *s = b.matmul(ones, matrix)?;
    }
    b.concat(&sums, 0)
}

/// A tensor of `shape` in `like`'s dtype holding `value`, made from `like` without reading
/// it: `pad` of an empty slice, so that no value of `like` (an infinity, a NaN) can leak in.
pub(crate) fn full_of_shape(b: &mut TraceBuilder<'_>, like: ValueId, shape: &[usize], value: f32) -> Result<ValueId> {
    // A zero-dimensional `like` is one element: reshaped to `[1]` for the slice.
    let like = if b.shape(like)?.is_empty() { b.reshape(like, &[1])? } else { like };
    let empty = b.slice(like, 0, 0, 0)?;
    let empty = b.reshape(empty, &[0])?;
    let full = b.pad(empty, 0, 0, shape.iter().product(), value)?;
    if shape.len() == 1 {
        return Ok(full);
    }
    b.reshape(full, shape)
}

fn integer_ids<'m>(args: &[ArgInfo<'m>], i: usize) -> std::result::Result<&'m [usize], String> {
    let (dtype, shape) = tensor(args, i)?;
    if !dtype.is_integer() {
        return Err(format!("the ids (argument {i}) must be i64 or i32, not {dtype}"));
    }
    Ok(shape)
}

fn pad_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = tensor(args, 0)?;
    let (axis, before, after) = match dims_arg(args, 1)? {
        &[axis, before, after] => (axis, before, after),
        other => return Err(format!("pad takes [axis, before, after], not {other:?}")),
    };
    if axis >= shape.len() {
        return Err(format!("axis {axis} is out of range for a tensor of rank {}", shape.len()));
    }
    let mut out = Shape::from_slice(shape);
    out[axis] = before
        .checked_add(after)
        .and_then(|p| p.checked_add(shape[axis]))
        .ok_or_else(|| format!("padding {before} + {after} elements overflows the axis"))?;
    Ok(TensorMeta { dtype, shape: out })
}

fn scatter_last_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, values) = float_tensor(args, 0)?;
    let ids = integer_ids(args, 1)?;
    let n = match dims_arg(args, 2)? {
        &[n] => n,
        other => return Err(format!("scatter_last takes [n], the length of the rows it makes, not {other:?}")),
    };
    if ids != values {
        return Err(format!("the ids must have the values' shape {values:?}, not {ids:?}"));
    }
    let mut out = Shape::from_slice(values);
    out.push(n);
    Ok(TensorMeta { dtype, shape: out })
}

fn embedding_backward_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, grad) = float_tensor(args, 0)?;
    let ids = integer_ids(args, 1)?;
    let rows = match dims_arg(args, 2)? {
        &[rows] => rows,
        other => return Err(format!("embedding_backward takes [rows], the rows of the weight, not {other:?}")),
    };
    match grad.split_last() {
        Some((&width, lead)) if lead == ids => Ok(TensorMeta::new(dtype, &[rows, width])),
        _ => Err(format!("the gradient must be the ids' shape {ids:?} and a width, not {grad:?}")),
    }
}

/// Typed methods for the gradient prims. Each one is `bind` with the symbol's fixed id.
///
/// ```
/// use boundscope::executors::CpuReference;
/// use boundscope::{Arena, DType, Plan, Registry, Tensor, TensorMeta, TraceBuilder};
/// let (registry, arena) = (Registry::with_builtins(), Arena::new());
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 2]).unwrap();
/// let ids = b.input_with(&TensorMeta::new(DType::I64, &[2])).unwrap();
/// let padded = b.pad(x, 1, 1, 0, 0.0).unwrap(); // [2, 3]: a column of zeros first
/// let picked = b.sum(x).unwrap(); // [2, 1]
/// let picked = b.reshape(picked, &[2]).unwrap();
/// let rows = b.scatter_last(picked, ids, 3).unwrap(); // [2, 3]
/// let table = b.embedding_backward(x, ids, 3).unwrap(); // [3, 2]
/// for v in [padded, rows, table] {
///     b.output(v).unwrap();
/// }
/// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
/// let x = Tensor::new(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
/// let ids = Tensor::from_vec(&[2], vec![2i64, 2]).unwrap();
/// let out = plan.run(&[&x, &ids]).unwrap();
/// assert_eq!(out[0].to_f32_vec(), &[0.0, 1.0, 2.0, 0.0, 3.0, 4.0]);
/// assert_eq!(out[1].to_f32_vec(), &[0.0, 0.0, 3.0, 0.0, 0.0, 7.0]);
/// assert_eq!(out[2].to_f32_vec(), &[0.0, 0.0, 0.0, 0.0, 4.0, 6.0]);
/// ```
impl TraceBuilder<'_> {
    /// `x` with `before` elements of `fill` before it and `after` after it along `axis`, as
    /// `torch.nn.functional.pad` with a constant; the gradient of [`slice`](Self::slice).
    pub fn pad(&mut self, x: ValueId, axis: usize, before: usize, after: usize, fill: f32) -> Result<ValueId> {
        self.bind(PAD, &[Arg::Value(x), Arg::Dims(&[axis, before, after]), Arg::Scalar(fill)])
    }

    /// Rows of length `n`, zero except for `values[...]` at column `ids[...]` of each row (the
    /// gradient of [`gather_last`](Self::gather_last)). An id outside `0..n` fails the run with
    /// [`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange).
    pub fn scatter_last(&mut self, values: ValueId, ids: ValueId, n: usize) -> Result<ValueId> {
        self.bind(SCATTER_LAST, &[Arg::Value(values), Arg::Value(ids), Arg::Dims(&[n])])
    }

    /// A `[rows, width]` table whose row `r` is the sum of the rows of `grad` (`[*ids, width]`)
    /// at the positions where `ids` is `r` (the gradient of [`embedding`](Self::embedding)'s
    /// weight), summed in `f32`. An id outside `0..rows` fails the run with
    /// [`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange).
    pub fn embedding_backward(&mut self, grad: ValueId, ids: ValueId, rows: usize) -> Result<ValueId> {
        self.bind(EMBEDDING_BACKWARD, &[Arg::Value(grad), Arg::Value(ids), Arg::Dims(&[rows])])
    }

    /// The gradient of [`layer_norm(x, eps, weight, _)`](Self::layer_norm) with respect to `x`,
    /// given the gradient `grad` of its result (`x`'s shape): in `f32`, the rows' mean and
    /// variance taken again from `x`, rounded once to `x`'s dtype. What `passes::Grad` writes
    /// for `layer_norm`; CudaOps runs it as one row kernel, other executors its decomposition.
    ///
    /// ```
    /// use boundscope::executors::CpuReference;
    /// use boundscope::{Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let (registry, arena) = (Registry::with_builtins(), Arena::new());
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[1, 2]).unwrap();
    /// let g = b.input(&[1, 2]).unwrap();
    /// let dx = b.layer_norm_backward(x, g, 0.0, None).unwrap();
    /// let dw_db = b.layer_norm_weight_backward(x, g, 0.0).unwrap(); // [2, 2]
    /// b.output(dx).unwrap();
    /// b.output(dw_db).unwrap();
    /// let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    /// let x = Tensor::new(&[1, 2], vec![1.0, 3.0]).unwrap(); // normalised: [-1, 1]
    /// let g = Tensor::new(&[1, 2], vec![1.0, 1.0]).unwrap();
    /// let out = plan.run(&[&x, &g]).unwrap();
    /// assert_eq!(out[0].to_f32_vec(), &[0.0, 0.0]); // a shift of the row changes nothing
    /// assert_eq!(out[1].to_f32_vec(), &[-1.0, 1.0, 1.0, 1.0]); // sum of g * normalised; of g
    /// ```
    pub fn layer_norm_backward(
        &mut self,
        x: ValueId,
        grad: ValueId,
        eps: f32,
        weight: Option<ValueId>,
    ) -> Result<ValueId> {
        match weight {
            Some(w) => {
                self.bind(LAYER_NORM_BACKWARD, &[Arg::Value(x), Arg::Value(grad), Arg::Scalar(eps), Arg::Value(w)])
            }
            None => self.bind(LAYER_NORM_BACKWARD, &[Arg::Value(x), Arg::Value(grad), Arg::Scalar(eps)]),
        }
    }

    /// The gradients of [`layer_norm(x, eps, ...)`](Self::layer_norm)'s weight and bias, given
    /// the gradient `grad` of its result: `f32` `[2, n]`, row 0 the sum over every row of
    /// `grad * (x - mean) / sqrt(variance + eps)`, row 1 the sum of `grad`. What `passes::Grad`
    /// writes for them; CudaOps runs it as a kernel of partial sums per block and one of their
    /// sums (example: [`layer_norm_backward`](Self::layer_norm_backward)).
    pub fn layer_norm_weight_backward(&mut self, x: ValueId, grad: ValueId, eps: f32) -> Result<ValueId> {
        self.bind(LAYER_NORM_WEIGHT_BACKWARD, &[Arg::Value(x), Arg::Value(grad), Arg::Scalar(eps)])
    }
}

#[cfg(test)]
mod tests {
    use crate::{Arena, DType, Error, Registry, TensorMeta, TraceBuilder};

    #[test]
    fn layer_norm_backward_ops_name_bad_operands() {
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[4, 8]).unwrap();
        let other = b.input(&[4, 7]).unwrap();
        let w = b.input(&[7]).unwrap();
        let ids = b.input_with(&TensorMeta::new(DType::I64, &[4, 8])).unwrap();
        let message = |e: Error| match e {
            Error::ShapeMismatch { .. } | Error::UnsupportedDType { .. } => e.to_string(),
            other => panic!("not a shape or dtype error: {other:?}"),
        };
        let e = message(b.layer_norm_backward(x, other, 1e-5, None).unwrap_err());
        assert!(e.contains("the gradient must have x's shape"), "{e}");
        let e = message(b.layer_norm_backward(x, x, 1e-5, Some(w)).unwrap_err());
        assert!(e.contains("the weight must have shape [8]"), "{e}");
        let e = message(b.layer_norm_weight_backward(ids, ids, 1e-5).unwrap_err());
        assert!(e.contains("cast it first"), "{e}");
        // Well-formed: x's dtype and shape; the sums `f32` [2, n].
        let h = b.input_with(&TensorMeta::new(DType::BF16, &[2, 3, 8])).unwrap();
        let w = b.input(&[8]).unwrap();
        let dx = b.layer_norm_backward(h, h, 1e-5, Some(w)).unwrap();
        assert_eq!((b.dtype(dx).unwrap(), b.shape(dx).unwrap().to_vec()), (DType::BF16, vec![2, 3, 8]));
        let sums = b.layer_norm_weight_backward(h, h, 1e-5).unwrap();
        assert_eq!((b.dtype(sums).unwrap(), b.shape(sums).unwrap().to_vec()), (DType::F32, vec![2, 8]));
    }
}
