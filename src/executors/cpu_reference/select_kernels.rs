//! CPU reference comparisons (`lt` ... `ne`: `i32` 0 or 1) and `where`, in every dtype, with
//! numpy broadcasting of every operand.

use super::kernels::broadcast_strides;
use crate::core::ir::{prims, Arg, Shape, SymbolId};
use crate::core::plan::{Kernel, OpView};
use crate::core::tensor::{with_values, Data, DataMut, Element, TensorMut, TensorRef};
use crate::error::Result;

/// Calls `f(i, offsets)` for each element `i` of `shape`, in order, with the offset of that
/// element in each operand read through its broadcast `strides`.
fn for_each_broadcast<const N: usize>(shape: &[usize], strides: &[Shape; N], mut f: impl FnMut(usize, [usize; N])) {
    let numel: usize = shape.iter().product();
    let rank = shape.len();
    let mut index: Shape = smallvec::smallvec![0; rank];
    let mut offsets = [0usize; N];
    for i in 0..numel {
        f(i, offsets);
        for axis in (0..rank).rev() {
            index[axis] += 1;
            for (o, s) in offsets.iter_mut().zip(strides) {
                *o += s[axis];
            }
            if index[axis] < shape[axis] {
                break;
            }
            for (o, s) in offsets.iter_mut().zip(strides) {
                *o -= s[axis] * shape[axis];
            }
            index[axis] = 0;
        }
    }
}

/// The broadcast strides of tensor argument `i` of `op` into its output's shape, or `None`
/// where the argument is a scalar.
fn strides_of(op: &OpView<'_>, position: usize, out: &[usize]) -> Result<Option<Shape>> {
    Ok(match op.args().get(position) {
        Some(Arg::Value(v)) => Some(broadcast_strides(op.shape_of(*v)?, out)),
        _ => None,
    })
}

/// A comparison of two operands (the second may be a scalar).
pub(super) struct Compare {
    op: SymbolId,
    shape: Shape,
    strides: [Shape; 2],
    scalar: Option<f32>,
}

impl Compare {
    pub(super) fn new(id: SymbolId, op: &OpView<'_>) -> Result<Self> {
        let shape = Shape::from_slice(op.output_shape(0)?);
        let a = strides_of(op, 0, &shape)?.unwrap_or_default();
        let (b, scalar) = match strides_of(op, 1, &shape)? {
            Some(b) => (b, None),
            None => (smallvec::smallvec![0; shape.len()], Some(op.scalar(1)?)),
        };
        Ok(Self { op: id, shape, strides: [a, b], scalar })
    }
}

/// Values compared as PyTorch compares them after promotion: integers with integers exactly,
/// anything with a float as `f32`.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Value {
    Int(i64),
    Float(f32),
}

impl Value {
    fn of<T: Element>(x: T) -> Self {
        if T::DTYPE.is_integer() {
            Value::Int(x.to_i64())
        } else {
            Value::Float(x.to_f32())
        }
    }

    fn float(self) -> f32 {
        match self {
            Value::Int(i) => i as f32,
            Value::Float(f) => f,
        }
    }
}

fn compare(op: SymbolId, a: Value, b: Value) -> bool {
    let (a, b) = match (a, b) {
        (Value::Int(_), Value::Int(_)) => (a, b),
        _ => (Value::Float(a.float()), Value::Float(b.float())),
    };
    match op {
        prims::LT => a < b,
        prims::LE => a <= b,
        prims::GT => a > b,
        prims::GE => a >= b,
        prims::EQ => a == b,
        _ => a != b,
    }
}

impl Kernel for Compare {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        let out = outputs[0].values_mut::<i32>()?;
        let at = |data: Data<'_>, i: usize| with_values!(Data, data, x => Value::of(x[i]));
        let a = inputs[0].data;
        let b = |o: usize| match self.scalar {
            Some(s) => Value::Float(s),
            None => at(inputs[1].data, o),
        };
        for_each_broadcast(&self.shape, &self.strides, |i, [oa, ob]| {
            out[i] = i32::from(compare(self.op, at(a, oa), b(ob)));
        });
        Ok(())
    }
}

/// `where(cond, a, b)`.
pub(super) struct Where {
    shape: Shape,
    strides: [Shape; 3],
    fill: Option<f32>,
}

impl Where {
    pub(super) fn new(op: &OpView<'_>) -> Result<Self> {
        let shape = Shape::from_slice(op.output_shape(0)?);
        let cond = strides_of(op, 0, &shape)?.unwrap_or_default();
        let a = strides_of(op, 1, &shape)?.unwrap_or_default();
        let (b, fill) = match strides_of(op, 2, &shape)? {
            Some(b) => (b, None),
            None => (smallvec::smallvec![0; shape.len()], Some(op.scalar(2)?)),
        };
        Ok(Self { shape, strides: [cond, a, b], fill })
    }
}

impl Kernel for Where {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        fn select<T: Element>(w: &Where, inputs: &[TensorRef<'_>], out: &mut [T]) {
            let truth = |data: Data<'_>, i: usize| match data {
                Data::I64(x) => x[i] != 0,
                Data::I32(x) => x[i] != 0,
                other => other.f32_at(i) != 0.0,
            };
            let value = |data: Data<'_>, i: usize| with_values!(Data, data, x => T::convert(x[i]));
            let fill = w.fill.map(T::from_f32);
            for_each_broadcast(&w.shape, &w.strides, |i, [oc, oa, ob]| {
                out[i] = if truth(inputs[0].data, oc) {
                    value(inputs[1].data, oa)
                } else {
                    match fill {
                        Some(f) => f,
                        None => value(inputs[2].data, ob),
                    }
                };
            });
        }
        with_values!(DataMut, outputs[0].data.reborrow(), out => select(self, inputs, out));
        Ok(())
    }
}
