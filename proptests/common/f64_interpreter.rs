//! A naive interpreter of traces in `f64`: every built-in prim by coordinates, composites
//! through the subsymbols they were bound with. Slow and obvious; shares no code with
//! boundscope's kernels. Integer values (ids, masks) are held as `f64` too (exact for the
//! sizes the tests use); casts between floats are exact here.

use std::collections::HashMap;

use boundscope::{Arg, BoundSymbol, Trace, ValueId};

#[derive(Clone, Debug)]
pub struct T64 {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl T64 {
    pub fn new(shape: &[usize], data: Vec<f64>) -> Self {
        assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape: shape.to_vec(), data }
    }

    fn numel(shape: &[usize]) -> usize {
        shape.iter().product()
    }

    /// The element at `index` of a tensor of `out_rank` axes that this one broadcasts to.
    fn at_broadcast(&self, index: &[usize]) -> f64 {
        let offset = index.len() - self.shape.len();
        let mut flat = 0;
        for (a, &d) in self.shape.iter().enumerate() {
            flat = flat * d + if d == 1 { 0 } else { index[offset + a] };
        }
        self.data[flat]
    }
}

pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        let d = shape[a].max(1);
        index[a] = flat % d;
        flat /= d;
    }
    index
}

fn ravel(index: &[usize], shape: &[usize]) -> usize {
    index.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|i| {
            let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
            let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
            da.max(db)
        })
        .collect()
}

/// Evaluates `trace` on `inputs` (in the trace's input order); returns its outputs.
pub fn evaluate(trace: &Trace<'_>, inputs: &[T64]) -> Vec<T64> {
    let mut env: HashMap<ValueId, T64> = HashMap::new();
    for (&v, t) in trace.inputs().iter().zip(inputs) {
        env.insert(v, t.clone());
    }
    for bsym in trace.bound_symbols() {
        run(trace, bsym, &mut env);
    }
    trace.outputs().iter().map(|o| env[o].clone()).collect()
}

fn run(trace: &Trace<'_>, bsym: &BoundSymbol<'_>, env: &mut HashMap<ValueId, T64>) {
    if !bsym.subsymbols().is_empty() {
        for sub in bsym.subsymbols() {
            run(trace, sub, env);
        }
        return;
    }
    let name = trace.symbol_name(bsym);
    let args = bsym.args();
    let t = |i: usize| -> &T64 { &env[&args[i].value().unwrap_or_else(|| panic!("{name}: argument {i}"))] };
    let dims = |i: usize| -> &[usize] {
        match args[i] {
            Arg::Dims(d) => d,
            _ => panic!("{name}: argument {i} is not dims"),
        }
    };
    let scalar = |i: usize| -> f64 {
        match args[i] {
            Arg::Scalar(s) => s as f64,
            _ => panic!("{name}: argument {i} is not a scalar"),
        }
    };
    let out = match name {
        "neg" | "exp" | "log" | "tanh" | "sigmoid" | "relu" | "gelu" => {
            let x = t(0);
            let f = |v: f64| match name {
                "neg" => -v,
                "exp" => v.exp(),
                "log" => v.ln(),
                "tanh" => v.tanh(),
                "sigmoid" => 1.0 / (1.0 + (-v).exp()),
                "relu" => v.max(0.0),
                _ => 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh()),
            };
            T64::new(&x.shape, x.data.iter().map(|&v| f(v)).collect())
        }
        "add" | "sub" | "mul" | "div" | "maximum" | "lt" | "le" | "gt" | "ge" | "eq" | "ne" => {
            let a = t(0).clone();
            let b = match args[1] {
                Arg::Scalar(s) => T64::new(&[], vec![s as f64]),
                _ => t(1).clone(),
            };
            let shape = broadcast_shape(&a.shape, &b.shape);
            let f = |x: f64, y: f64| match name {
                "add" => x + y,
                "sub" => x - y,
                "mul" => x * y,
                "div" => x / y,
                "maximum" => x.max(y),
                "lt" => (x < y) as u8 as f64,
                "le" => (x <= y) as u8 as f64,
                "gt" => (x > y) as u8 as f64,
                "ge" => (x >= y) as u8 as f64,
                "eq" => (x == y) as u8 as f64,
                _ => (x != y) as u8 as f64,
            };
            let data = (0..T64::numel(&shape))
                .map(|i| {
                    let index = unravel(i, &shape);
                    f(a.at_broadcast(&index), b.at_broadcast(&index))
                })
                .collect();
            T64::new(&shape, data)
        }
        "where" => {
            let (c, a) = (t(0).clone(), t(1).clone());
            let b = match args[2] {
                Arg::Scalar(s) => T64::new(&[], vec![s as f64]),
                _ => t(2).clone(),
            };
            let shape = broadcast_shape(&broadcast_shape(&c.shape, &a.shape), &b.shape);
            let data = (0..T64::numel(&shape))
                .map(|i| {
                    let index = unravel(i, &shape);
                    if c.at_broadcast(&index) != 0.0 {
                        a.at_broadcast(&index)
                    } else {
                        b.at_broadcast(&index)
                    }
                })
                .collect();
            T64::new(&shape, data)
        }
        "sum" | "max" | "sum_axis" | "max_axis" | "argmax" => {
            let x = t(0);
            let axis = if name == "sum" || name == "max" { x.shape.len() - 1 } else { dims(1)[0] };
            let mut shape = x.shape.clone();
            shape[axis] = 1;
            let data = (0..T64::numel(&shape))
                .map(|i| {
                    let mut index = unravel(i, &shape);
                    let values: Vec<f64> = (0..x.shape[axis])
                        .map(|k| {
                            index[axis] = k;
                            x.data[ravel(&index, &x.shape)]
                        })
                        .collect();
                    match name {
                        "sum" | "sum_axis" => values.iter().sum(),
                        "argmax" => {
                            let mut best = 0;
                            for (k, &v) in values.iter().enumerate() {
                                if v > values[best] {
                                    best = k;
                                }
                            }
                            best as f64
                        }
                        _ => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    }
                })
                .collect();
            T64::new(&shape, data)
        }
        "matmul" => {
            let (a, b) = (t(0), t(1));
            let (ra, rb) = (a.shape.len(), b.shape.len());
            let (m, k, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]);
            let batch = broadcast_shape(&a.shape[..ra - 2], &b.shape[..rb - 2]);
            let mut shape = batch.clone();
            shape.extend([m, n]);
            let a_batch = T64::new(&a.shape[..ra - 2], vec![0.0; T64::numel(&a.shape[..ra - 2])]);
            let b_batch = T64::new(&b.shape[..rb - 2], vec![0.0; T64::numel(&b.shape[..rb - 2])]);
            let batch_index = |t: &T64, index: &[usize]| -> usize {
                let offset = index.len() - t.shape.len();
                t.shape.iter().enumerate().fold(0, |acc, (i, &d)| acc * d + if d == 1 { 0 } else { index[offset + i] })
            };
            let mut data = vec![0.0; T64::numel(&shape)];
            for bi in 0..T64::numel(&batch) {
                let index = unravel(bi, &batch);
                let (pa, pb) = (batch_index(&a_batch, &index), batch_index(&b_batch, &index));
                for i in 0..m {
                    for j in 0..n {
                        data[(bi * m + i) * n + j] =
                            (0..k).map(|l| a.data[(pa * m + i) * k + l] * b.data[(pb * k + l) * n + j]).sum();
                    }
                }
            }
            T64::new(&shape, data)
        }
        "reshape" => T64::new(dims(1), t(0).data.clone()),
        "cast" => t(0).clone(),
        "transpose" => {
            let (x, perm) = (t(0), dims(1));
            let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
            let data = (0..T64::numel(&shape))
                .map(|i| {
                    let index = unravel(i, &shape);
                    let mut source = vec![0; shape.len()];
                    for (o, &p) in perm.iter().enumerate() {
                        source[p] = index[o];
                    }
                    x.data[ravel(&source, &x.shape)]
                })
                .collect();
            T64::new(&shape, data)
        }
        "broadcast_to" => {
            let (x, shape) = (t(0), dims(1));
            T64::new(shape, (0..T64::numel(shape)).map(|i| x.at_broadcast(&unravel(i, shape))).collect())
        }
        "slice" | "pad" => {
            let x = t(0);
            let d = dims(1);
            let axis = d[0];
            let mut shape = x.shape.clone();
            let (offset, fill) = if name == "slice" {
                shape[axis] = d[2] - d[1];
                (d[1] as isize, 0.0)
            } else {
                shape[axis] += d[1] + d[2];
                (-(d[1] as isize), scalar(2))
            };
            let data = (0..T64::numel(&shape))
                .map(|i| {
                    let mut index = unravel(i, &shape);
                    let source = index[axis] as isize + offset;
                    if source < 0 || source as usize >= x.shape[axis] {
                        fill
                    } else {
                        index[axis] = source as usize;
                        x.data[ravel(&index, &x.shape)]
                    }
                })
                .collect();
            T64::new(&shape, data)
        }
        "concat" => {
            let (a, b, axis) = (t(0), t(1), dims(2)[0]);
            let mut shape = a.shape.clone();
            shape[axis] += b.shape[axis];
            let data = (0..T64::numel(&shape))
                .map(|i| {
                    let mut index = unravel(i, &shape);
                    if index[axis] < a.shape[axis] {
                        a.data[ravel(&index, &a.shape)]
                    } else {
                        index[axis] -= a.shape[axis];
                        b.data[ravel(&index, &b.shape)]
                    }
                })
                .collect();
            T64::new(&shape, data)
        }
        "causal_mask" => {
            let x = t(0);
            let r = x.shape.len();
            let data = (0..x.data.len())
                .map(|i| {
                    let index = unravel(i, &x.shape);
                    if index[r - 1] > index[r - 2] {
                        f64::NEG_INFINITY
                    } else {
                        x.data[i]
                    }
                })
                .collect();
            T64::new(&x.shape, data)
        }
        "embedding" => {
            let (w, ids) = (t(0), t(1));
            let width = w.shape[1];
            let mut shape = ids.shape.clone();
            shape.push(width);
            let data = ids.data.iter().flat_map(|&id| w.data[id as usize * width..][..width].to_vec()).collect();
            T64::new(&shape, data)
        }
        "gather_last" => {
            let (x, ids) = (t(0), t(1));
            let n = *x.shape.last().unwrap();
            T64::new(&ids.shape, ids.data.iter().enumerate().map(|(r, &id)| x.data[r * n + id as usize]).collect())
        }
        "scatter_last" => {
            let (v, ids, n) = (t(0), t(1), dims(2)[0]);
            let mut shape = v.shape.clone();
            shape.push(n);
            let mut data = vec![0.0; T64::numel(&shape)];
            for (r, (&x, &id)) in v.data.iter().zip(&ids.data).enumerate() {
                data[r * n + id as usize] = x;
            }
            T64::new(&shape, data)
        }
        "embedding_backward" => {
            let (g, ids, rows) = (t(0), t(1), dims(2)[0]);
            let width = *g.shape.last().unwrap();
            let mut data = vec![0.0; rows * width];
            for (i, &id) in ids.data.iter().enumerate() {
                for c in 0..width {
                    data[id as usize * width + c] += g.data[i * width + c];
                }
            }
            T64::new(&[rows, width], data)
        }
        other => panic!("the f64 interpreter has no `{other}`"),
    };
    env.insert(bsym.outputs()[0], out);
}
