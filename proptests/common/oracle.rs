//! A naive direct evaluator: every op by coordinates, composites by their textbook formulas.
//! Slow and obvious; shares no code with boundscope's kernels or decompositions.

use super::program::{broadcast, Op, Operand, Program};

#[derive(Clone, Debug)]
pub struct Value {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for axis in (0..shape.len()).rev() {
        index[axis] = flat % shape[axis];
        flat /= shape[axis];
    }
    index
}

fn ravel(index: &[usize], shape: &[usize]) -> usize {
    index.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// The element of `v` that broadcasts to `out_index` of an output of rank `out_rank`.
fn broadcast_read(v: &Value, out_index: &[usize]) -> f32 {
    let offset = out_index.len() - v.shape.len();
    let index: Vec<usize> =
        v.shape.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { out_index[offset + i] }).collect();
    v.data[ravel(&index, &v.shape)]
}

fn unary(name: &str, x: f32) -> f32 {
    match name {
        "neg" => -x,
        "exp" => x.exp(),
        "log" => x.ln(),
        "tanh" => x.tanh(),
        "sigmoid" => 1.0 / (1.0 + (-x).exp()),
        "relu" => {
            if x.is_nan() {
                x
            } else {
                x.max(0.0)
            }
        }
        "gelu" => 0.5 * x * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()),
        _ => unreachable!("{name}"),
    }
}

fn binary(name: &str, a: f32, b: f32) -> f32 {
    match name {
        "add" => a + b,
        "sub" => a - b,
        "mul" => a * b,
        "div" => a / b,
        "maximum" => maximum(a, b),
        _ => unreachable!("{name}"),
    }
}

/// PyTorch's `maximum`: NaN if either is NaN (`f32::max` returns the other one).
fn maximum(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

fn map_rows(x: &Value, f: impl Fn(&[f32]) -> Vec<f32>) -> Value {
    let n = *x.shape.last().unwrap();
    let data = x.data.chunks(n.max(1)).flat_map(f).collect();
    Value { shape: x.shape.clone(), data }
}

/// Evaluates every value of the program (inputs first), returning all of them.
pub fn evaluate(program: &Program, inputs: &[boundscope::Tensor]) -> Vec<Value> {
    evaluate_nudged(program, inputs, None)
}

/// Relative size of a nudge: about 8 ulps of f32.
const NUDGE: f32 = 1e-6;

/// Multiplies each element by `1 + NUDGE` or `1 - NUDGE`, by a pseudo-random pattern.
fn nudge(value: &mut Value, pattern: u64, salt: u64) {
    for (i, x) in value.data.iter_mut().enumerate() {
        let bit = ((i as u64 + 1).wrapping_mul(pattern) ^ salt.wrapping_mul(0xC2B2_AE35)) >> 17 & 1;
        *x *= if bit == 1 { 1.0 + NUDGE } else { 1.0 - NUDGE };
    }
}

/// One intermediate value nudged as [`nudge`] nudges elements, when `pattern` is given.
fn jiggle(x: f32, pattern: Option<u64>, salt: u64, element: u64) -> f32 {
    match pattern {
        Some(pattern) => {
            let bit = ((element + 1).wrapping_mul(pattern) ^ salt.wrapping_mul(0x85EB_CA6B)) >> 17 & 1;
            x * if bit == 1 { 1.0 + NUDGE } else { 1.0 - NUDGE }
        }
        None => x,
    }
}

/// [`evaluate`], with every input and every op's result nudged by `pattern` when it is given:
/// a model of the rounding an f32 implementation adds at each step.
fn evaluate_nudged(program: &Program, inputs: &[boundscope::Tensor], pattern: Option<u64>) -> Vec<Value> {
    let mut values: Vec<Value> =
        inputs.iter().map(|t| Value { shape: t.shape().to_vec(), data: t.to_f32_vec() }).collect();
    if let Some(pattern) = pattern {
        for (k, v) in values.iter_mut().enumerate() {
            nudge(v, pattern, k as u64);
        }
    }
    for op in &program.ops {
        let v = match op {
            Op::Unary(name, x) => {
                let x = &values[*x];
                Value { shape: x.shape.clone(), data: x.data.iter().map(|&v| unary(name, v)).collect() }
            }
            Op::Binary(name, x, Operand::Scalar(s)) => {
                let x = &values[*x];
                Value { shape: x.shape.clone(), data: x.data.iter().map(|&v| binary(name, v, *s)).collect() }
            }
            Op::Binary(name, x, Operand::Value(y)) => {
                let (x, y) = (&values[*x], &values[*y]);
                let shape = broadcast(&x.shape, &y.shape).unwrap();
                let numel = shape.iter().product();
                let data = (0..numel)
                    .map(|i| {
                        let idx = unravel(i, &shape);
                        binary(name, broadcast_read(x, &idx), broadcast_read(y, &idx))
                    })
                    .collect();
                Value { shape, data }
            }
            Op::Reduce(name, x) => {
                let x = &values[*x];
                let mut shape = x.shape.clone();
                let n = *shape.last().unwrap();
                *shape.last_mut().unwrap() = 1;
                let rows = shape.iter().product::<usize>();
                let data = (0..rows)
                    .map(|r| {
                        let row = &x.data[r * n..(r + 1) * n];
                        if *name == "sum" {
                            row.iter().fold(0.0, |a, &b| a + b)
                        } else {
                            row.iter().fold(f32::NEG_INFINITY, |a, &b| maximum(a, b))
                        }
                    })
                    .collect();
                Value { shape, data }
            }
            Op::Matmul(x, y) => matmul(&values[*x], &values[*y], false),
            Op::Reshape(x, d) => Value { shape: d.clone(), data: values[*x].data.clone() },
            Op::Transpose(x, perm) => {
                let x = &values[*x];
                let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
                let data = (0..x.data.len())
                    .map(|i| {
                        let out_index = unravel(i, &shape);
                        let mut in_index = vec![0; perm.len()];
                        for (o, &p) in perm.iter().enumerate() {
                            in_index[p] = out_index[o];
                        }
                        x.data[ravel(&in_index, &x.shape)]
                    })
                    .collect();
                Value { shape, data }
            }
            Op::BroadcastTo(x, d) => {
                let x = &values[*x];
                let numel = d.iter().product();
                Value { shape: d.clone(), data: (0..numel).map(|i| broadcast_read(x, &unravel(i, d))).collect() }
            }
            Op::Softmax(x) => map_rows(&values[*x], |row| {
                let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| maximum(a, b));
                let z: f32 = row.iter().map(|v| (v - max).exp()).sum();
                row.iter().map(|v| (v - max).exp() / z).collect()
            }),
            Op::LayerNorm(x, eps, w, b) => {
                let (w, b) = (w.map(|i| values[i].data.clone()), b.map(|i| values[i].data.clone()));
                // Its intermediates are nudged too: the decomposition rounds each of them, and
                // `y * w + b` can cancel (w = b, y near -1), magnifying their rounding.
                let salt = values.len() as u64;
                map_rows(&values[*x], |row| {
                    let n = row.len() as f32;
                    let mean = jiggle(row.iter().sum::<f32>() / n, pattern, salt, 1);
                    let var = jiggle(row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n, pattern, salt, 2);
                    row.iter()
                        .enumerate()
                        .map(|(j, v)| {
                            let y = jiggle((v - mean) / (var + eps).sqrt(), pattern, salt, 3 + j as u64);
                            let y = w.as_ref().map_or(y, |w| jiggle(y * w[j], pattern, salt, 1 << 20 | j as u64));
                            b.as_ref().map_or(y, |b| y + b[j])
                        })
                        .collect()
                })
            }
            Op::Slice(x, axis, start, _) => {
                let x = &values[*x];
                let shape = op_shape(op, &values);
                let numel = shape.iter().product();
                let data = (0..numel)
                    .map(|i| {
                        let mut idx = unravel(i, &shape);
                        idx[*axis] += start;
                        x.data[ravel(&idx, &x.shape)]
                    })
                    .collect();
                Value { shape, data }
            }
            Op::Concat(x, y, axis) => {
                let (x, y) = (&values[*x], &values[*y]);
                let shape = op_shape(op, &values);
                let numel = shape.iter().product();
                let data = (0..numel)
                    .map(|i| {
                        let mut idx = unravel(i, &shape);
                        if idx[*axis] < x.shape[*axis] {
                            x.data[ravel(&idx, &x.shape)]
                        } else {
                            idx[*axis] -= x.shape[*axis];
                            y.data[ravel(&idx, &y.shape)]
                        }
                    })
                    .collect();
                Value { shape, data }
            }
            Op::ReduceAxis(name, x, axis, _) => {
                let x = &values[*x];
                let mut kept = x.shape.clone();
                kept[*axis] = 1;
                let numel = kept.iter().product();
                let data = (0..numel)
                    .map(|i| {
                        let mut idx = unravel(i, &kept);
                        let along = (0..x.shape[*axis]).map(|j| {
                            idx[*axis] = j;
                            x.data[ravel(&idx, &x.shape)]
                        });
                        let along: Vec<f32> = along.collect();
                        if *name == "sum_dim" {
                            along.iter().fold(0.0, |a, &b| a + b)
                        } else {
                            along.iter().fold(f32::NEG_INFINITY, |a, &b| maximum(a, b))
                        }
                    })
                    .collect();
                Value { shape: op_shape(op, &values), data }
            }
            Op::CausalMask(x) => {
                let x = &values[*x];
                let rank = x.shape.len();
                let data = (0..x.data.len())
                    .map(|i| {
                        let idx = unravel(i, &x.shape);
                        if idx[rank - 1] > idx[rank - 2] {
                            f32::NEG_INFINITY
                        } else {
                            x.data[i]
                        }
                    })
                    .collect();
                Value { shape: x.shape.clone(), data }
            }
            Op::LogSoftmax(x) => {
                // `x - max - log(sum(exp(x - max)))`; its log-sum is nudged too (the result can
                // cancel to near 0 at the row's maximum, magnifying that rounding).
                let salt = values.len() as u64;
                map_rows(&values[*x], |row| {
                    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| maximum(a, b));
                    let z: f32 = row.iter().map(|v| (v - max).exp()).sum();
                    let log_z = jiggle(z.ln(), pattern, salt, 1);
                    row.iter().map(|v| (v - max) - log_z).collect()
                })
            }
            Op::Linear(x, w, b) => {
                let mut y = matmul(&values[*x], &values[*w], true);
                if let Some(b) = b {
                    let n = y.shape[1];
                    for (i, v) in y.data.iter_mut().enumerate() {
                        *v += values[*b].data[i % n];
                    }
                }
                y
            }
        };
        let mut v = v;
        if let Some(pattern) = pattern {
            nudge(&mut v, pattern, values.len() as u64);
        }
        values.push(v);
    }
    values
}

/// The shape of `op`'s result, from its operands' values.
fn op_shape(op: &Op, values: &[Value]) -> Vec<usize> {
    let shapes: Vec<Vec<usize>> = values.iter().map(|v| v.shape.clone()).collect();
    op.output_shape(&shapes)
}

/// `x @ y`, or `x @ y^T` when `transpose_y`.
fn matmul(x: &Value, y: &Value, transpose_y: bool) -> Value {
    let (m, k) = (x.shape[0], x.shape[1]);
    let n = if transpose_y { y.shape[0] } else { y.shape[1] };
    let mut data = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                let yv = if transpose_y { y.data[j * k + p] } else { y.data[p * n + j] };
                acc += x.data[i * k + p] * yv;
            }
            data[i * n + j] = acc;
        }
    }
    Value { shape: vec![m, n], data }
}

/// What f32 rounding alone can make of one element, modelled by nudged evaluations (see
/// [`evaluate_with_spread`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    /// The largest move of a nudged evaluation from the plain one, among those where both are
    /// finite (0 if none is).
    pub finite: f32,
    /// The element in each nudged evaluation.
    pub nudged: [f32; 2],
}

/// Evaluates the program, and per element what the evaluation gives when every input and every
/// op's result is nudged by about 8 ulps, up or down by a fixed pseudo-random pattern (two
/// patterns): how much f32 rounding alone can move it, and whether it can overflow (or stop
/// overflowing). Mixed directions, because uniform scaling would hide cancellations
/// (`w * c + b` near zero).
pub fn evaluate_with_spread(program: &Program, inputs: &[boundscope::Tensor]) -> (Vec<Value>, Vec<Vec<Spread>>) {
    let values = evaluate(program, inputs);
    let mut spread: Vec<Vec<Spread>> = values.iter().map(|v| vec![Spread::default(); v.data.len()]).collect();
    for (k, pattern) in [0x9E37_79B9u64, 0x85EB_CA6Bu64].into_iter().enumerate() {
        for ((s, v), n) in spread.iter_mut().zip(&values).zip(evaluate_nudged(program, inputs, Some(pattern))) {
            for ((s, &a), &b) in s.iter_mut().zip(&v.data).zip(&n.data) {
                s.nudged[k] = b;
                if a.is_finite() && b.is_finite() {
                    s.finite = s.finite.max((a - b).abs());
                }
            }
        }
    }
    (values, spread)
}
