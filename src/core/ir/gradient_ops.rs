//! The prims that gradients need beyond the forward ops: `pad` (the gradient of `slice`),
//! `scatter_last` (of `gather_last`) and `embedding_backward` (of `embedding`): their shape
//! and dtype rules and typed builder methods. `passes::Grad` binds them; they are ordinary
//! prims, usable in any trace.

use super::bound_symbol::Arg;
use super::builder::TraceBuilder;
use super::ids::{SymbolId, ValueId};
use super::meta::{Shape, TensorMeta};
use super::prims::{dims_arg, float_tensor, tensor, PrimRule, RuleResult, EMBEDDING_BACKWARD, PAD, SCATTER_LAST};
use super::symbol::{ArgInfo, ParamKind};
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
}
