//! Random well-formed programs, described independently of boundscope so that the same
//! description can be built as a trace and evaluated by the oracle.

use proptest::prelude::*;

use boundscope::{Arena, Registry, Result, Trace, TraceBuilder, ValueId};

/// One op of a program; operands are indices into the program's values (inputs first).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Unary(&'static str, usize),
    Binary(&'static str, usize, Operand),
    Reduce(&'static str, usize),
    Matmul(usize, usize),
    Reshape(usize, Vec<usize>),
    Transpose(usize, Vec<usize>),
    BroadcastTo(usize, Vec<usize>),
    Softmax(usize),
    LayerNorm(usize, f32, Option<usize>, Option<usize>),
    Linear(usize, usize, Option<usize>),
    /// `slice(x, axis, start, end)`.
    Slice(usize, usize, usize, usize),
    /// `concat([x, y], axis)`.
    Concat(usize, usize, usize),
    /// `sum_dim` or `max_dim` over `axis`, keepdim or not.
    ReduceAxis(&'static str, usize, usize, bool),
    CausalMask(usize),
    LogSoftmax(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    Value(usize),
    Scalar(f32),
}

/// A program: input shapes, ops, and which values are outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub inputs: Vec<Vec<usize>>,
    pub ops: Vec<Op>,
    pub outputs: Vec<usize>,
}

/// Names of the scopes [`Program::build_in_scopes`] makes: module-like ones, and two that are
/// also op names (a scope `exp` around an `exp` alone: one range, by the rule).
pub const SCOPE_NAMES: [&str; 6] = ["layer", "0", "attn", "mlp", "exp", "neg"];

const UNARY: [&str; 7] = ["neg", "exp", "log", "tanh", "sigmoid", "relu", "gelu"];
const BINARY: [&str; 5] = ["add", "sub", "mul", "div", "maximum"];

/// Raw random choices, turned into a well-formed program by [`Program::from_choices`].
type Choice = (u8, u32, u32, f32);

/// Random well-formed programs of elementwise, reduction, matmul and shape ops, and (when
/// `composites`) softmax, layer_norm and linear.
pub fn programs(composites: bool) -> impl Strategy<Value = Program> {
    programs_of((1usize..5, 1usize..5, 1usize..5), composites)
}

/// [`programs`] with composites and the ops of a transformer beyond them: `slice` and `concat`
/// along any axis, `sum_dim` and `max_dim` over any axis (keepdim or not), `causal_mask` and
/// `log_softmax`.
pub fn transformer_programs() -> impl Strategy<Value = Program> {
    let choices = prop::collection::vec((any::<u8>(), any::<u32>(), any::<u32>(), -2.0f32..2.0), 1..14);
    let outputs = prop::collection::vec(any::<u32>(), 0..3);
    ((1usize..5, 1usize..5, 1usize..5), choices, outputs).prop_map(|((m, n, k), choices, outputs)| {
        Program::from_choices_of(m, n, k, &choices, &outputs, KINDS_WITH_TRANSFORMER_OPS)
    })
}

/// Kinds of op [`Program::from_choices_of`] picks among: prims, then composites, then the
/// transformer ops.
const PRIM_KINDS: u8 = 10;
const KINDS_WITH_COMPOSITES: u8 = 13;
const KINDS_WITH_TRANSFORMER_OPS: u8 = 18;

/// [`programs`] whose inputs have dimensions `m`, `n`, `k` drawn from `dims`: large ones make
/// the CPU executors split ops over threads.
pub fn programs_of(
    dims: impl Strategy<Value = (usize, usize, usize)>,
    composites: bool,
) -> impl Strategy<Value = Program> {
    let choices = prop::collection::vec((any::<u8>(), any::<u32>(), any::<u32>(), -2.0f32..2.0), 1..14);
    let outputs = prop::collection::vec(any::<u32>(), 0..3);
    (dims, choices, outputs)
        .prop_map(move |((m, n, k), choices, outputs)| Program::from_choices(m, n, k, &choices, &outputs, composites))
}

/// Whether value `x` (inputs first, then one value per op) is the output of a `layer_norm`.
fn produced_by_layer_norm(ops: &[Op], inputs: usize, x: usize) -> bool {
    x >= inputs && matches!(ops.get(x - inputs), Some(Op::LayerNorm(..)))
}

impl Program {
    fn from_choices(m: usize, n: usize, k: usize, choices: &[Choice], outs: &[u32], composites: bool) -> Program {
        let kinds = if composites { KINDS_WITH_COMPOSITES } else { PRIM_KINDS };
        Self::from_choices_of(m, n, k, choices, outs, kinds)
    }

    fn from_choices_of(m: usize, n: usize, k: usize, choices: &[Choice], outs: &[u32], kinds: u8) -> Program {
        let inputs = vec![vec![m, n], vec![n, k], vec![n], vec![m, 1], vec![k, n]];
        let mut shapes = inputs.clone();
        let mut ops = Vec::new();
        for &(kind, a, b, s) in choices {
            let pick = |x: u32, len: usize| x as usize % len;
            let x = pick(a, shapes.len());
            let sx = shapes[x].clone();
            let op = match kind % kinds {
                0 => Op::Unary(UNARY[pick(b, UNARY.len())], x),
                1 | 2 => {
                    let name = BINARY[pick(b, BINARY.len())];
                    let candidates: Vec<usize> =
                        (0..shapes.len()).filter(|&i| broadcast(&sx, &shapes[i]).is_some()).collect();
                    if b % 5 == 0 {
                        Op::Binary(name, x, Operand::Scalar(s))
                    } else {
                        Op::Binary(name, x, Operand::Value(candidates[pick(b / 5, candidates.len())]))
                    }
                }
                // The rows of a layer-normed value sum to zero in exact arithmetic: their f32 sum
                // is rounding noise whose sign (and so `log` of it: -inf, NaN or a finite
                // number) neither the runtime nor the oracle's nudges can pin down. Such a sum
                // would test the noise, not the runtime: take the row's max instead.
                3 if b % 2 == 0 && !produced_by_layer_norm(&ops, inputs.len(), x) => Op::Reduce("sum", x),
                3 => Op::Reduce("max", x),
                4 => {
                    let candidates: Vec<usize> = (0..shapes.len())
                        .filter(|&i| sx.len() == 2 && shapes[i].len() == 2 && shapes[i][0] == sx[1])
                        .collect();
                    if candidates.is_empty() {
                        Op::Unary("tanh", x)
                    } else {
                        Op::Matmul(x, candidates[pick(b, candidates.len())])
                    }
                }
                5 => {
                    let numel: usize = sx.iter().product();
                    let dims = match b % 3 {
                        0 => vec![numel],
                        1 => vec![numel, 1],
                        _ => sx.iter().rev().copied().collect(),
                    };
                    Op::Reshape(x, dims)
                }
                6 => Op::Transpose(x, (0..sx.len()).rev().collect()),
                7 if sx.len() >= 4 => Op::Unary("neg", x),
                7 => {
                    let mut dims = vec![2];
                    dims.extend(sx.iter().map(|&d| if d == 1 && b % 2 == 0 { 3 } else { d }));
                    Op::BroadcastTo(x, dims)
                }
                8 | 9 => Op::Unary(UNARY[pick(b, UNARY.len())], x),
                10 => Op::Softmax(x),
                11 => {
                    let last = *sx.last().unwrap_or(&0);
                    let params: Vec<usize> = (0..shapes.len()).filter(|&i| shapes[i] == [last]).collect();
                    let weight = (!params.is_empty() && b % 3 != 0).then(|| params[pick(b, params.len())]);
                    let bias = weight.and_then(|_| (b % 2 == 0).then(|| params[pick(b / 2, params.len())]));
                    Op::LayerNorm(x, 1e-5, weight, bias)
                }
                13 => {
                    let axis = pick(b, sx.len());
                    let d = sx[axis];
                    let start = pick(b / 7, d);
                    let end = start + 1 + pick(b / 61, d - start);
                    Op::Slice(x, axis, start, end)
                }
                14 => {
                    let axis = pick(b, sx.len());
                    let candidates: Vec<usize> = (0..shapes.len())
                        .filter(|&i| {
                            let si = &shapes[i];
                            si.len() == sx.len() && (0..sx.len()).all(|j| j == axis || si[j] == sx[j])
                        })
                        .collect();
                    Op::Concat(x, candidates[pick(b / 7, candidates.len())], axis)
                }
                15 => {
                    let axis = pick(b, sx.len());
                    // Sums over a layer-normed row are rounding noise (see kind 3).
                    let last = axis + 1 == sx.len();
                    let name = if b % 2 == 0 && !(last && produced_by_layer_norm(&ops, inputs.len(), x)) {
                        "sum_dim"
                    } else {
                        "max_dim"
                    };
                    // Every value keeps rank >= 1.
                    Op::ReduceAxis(name, x, axis, sx.len() == 1 || b % 3 != 0)
                }
                16 if sx.len() >= 2 => Op::CausalMask(x),
                16 => Op::Unary("neg", x),
                17 => Op::LogSoftmax(x),
                _ => {
                    let candidates: Vec<usize> = (0..shapes.len())
                        .filter(|&i| sx.len() == 2 && shapes[i].len() == 2 && shapes[i][1] == sx[1])
                        .collect();
                    if candidates.is_empty() {
                        Op::Unary("sigmoid", x)
                    } else {
                        let w = candidates[pick(b, candidates.len())];
                        let out = shapes[w][0];
                        let biases: Vec<usize> = (0..shapes.len()).filter(|&i| shapes[i] == [out]).collect();
                        let bias = (!biases.is_empty() && b % 2 == 0).then(|| biases[pick(b / 2, biases.len())]);
                        Op::Linear(x, w, bias)
                    }
                }
            };
            // Shape ops on rank-0 or reductions of rank-0 values do not occur: every value has
            // rank >= 1 (inputs do, and no op lowers rank).
            shapes.push(op.output_shape(&shapes));
            ops.push(op);
        }
        let last = shapes.len() - 1;
        let mut outputs = vec![last];
        outputs.extend(outs.iter().map(|&o| inputs.len() + o as usize % ops.len()));
        Program { inputs, ops, outputs }
    }

    /// Builds the program as a trace.
    pub fn build<'a>(&self, arena: &'a Arena, registry: &'a Registry) -> Result<Trace<'a>> {
        self.build_in_scopes(arena, registry, &[])
    }

    /// [`build`](Self::build), with named scopes around its ops: before op `k`,
    /// `scopes[k].0 % 3` scopes open (named `SCOPE_NAMES[scopes[k].2 % 6]`); after it,
    /// `scopes[k].1 % 3` of the open ones close; the rest close at the end.
    pub fn build_in_scopes<'a>(
        &self,
        arena: &'a Arena,
        registry: &'a Registry,
        scopes: &[(u8, u8, usize)],
    ) -> Result<Trace<'a>> {
        let mut b = TraceBuilder::new(arena, registry);
        let mut values: Vec<ValueId> = Vec::new();
        for shape in &self.inputs {
            values.push(b.input(shape)?);
        }
        let mut open = 0;
        for (k, op) in self.ops.iter().enumerate() {
            let (opens, closes, name) = scopes.get(k).copied().unwrap_or((0, 0, 0));
            for j in 0..opens % 3 {
                b.enter_scope(SCOPE_NAMES[(name + j as usize) % SCOPE_NAMES.len()])?;
                open += 1;
            }
            let v = match op {
                Op::Unary(name, x) => b.call(name, &[values[*x].into()])?,
                Op::Binary(name, x, Operand::Value(y)) => b.call(name, &[values[*x].into(), values[*y].into()])?,
                Op::Binary(name, x, Operand::Scalar(s)) => b.call(name, &[values[*x].into(), (*s).into()])?,
                Op::Reduce(name, x) => b.call(name, &[values[*x].into()])?,
                Op::Matmul(x, y) => b.matmul(values[*x], values[*y])?,
                Op::Reshape(x, d) => b.reshape(values[*x], d)?,
                Op::Transpose(x, p) => b.transpose(values[*x], p)?,
                Op::BroadcastTo(x, d) => b.broadcast_to(values[*x], d)?,
                Op::Softmax(x) => b.softmax(values[*x])?,
                Op::LayerNorm(x, eps, w, bias) => {
                    b.layer_norm(values[*x], *eps, w.map(|i| values[i]), bias.map(|i| values[i]))?
                }
                Op::Linear(x, w, bias) => b.linear(values[*x], values[*w], bias.map(|i| values[i]))?,
                Op::Slice(x, axis, start, end) => b.slice(values[*x], *axis, *start, *end)?,
                Op::Concat(x, y, axis) => b.concat(&[values[*x], values[*y]], *axis)?,
                Op::ReduceAxis("sum_dim", x, axis, keep) => b.sum_dim(values[*x], *axis, *keep)?,
                Op::ReduceAxis(_, x, axis, keep) => b.max_dim(values[*x], *axis, *keep)?,
                Op::CausalMask(x) => b.causal_mask(values[*x])?,
                Op::LogSoftmax(x) => b.log_softmax(values[*x])?,
            };
            values.push(v);
            for _ in 0..(closes % 3).min(open) {
                b.exit_scope()?;
                open -= 1;
            }
        }
        for _ in 0..open {
            b.exit_scope()?;
        }
        for &o in &self.outputs {
            b.output(values[o])?;
        }
        b.finish()
    }

    /// The element count of the program's largest value (inputs and every op's result).
    #[allow(dead_code)] // not every test binary that includes this file uses it
    pub fn largest_value(&self) -> usize {
        let mut shapes = self.inputs.clone();
        for op in &self.ops {
            let shape = op.output_shape(&shapes);
            shapes.push(shape);
        }
        shapes.iter().map(|s| s.iter().product::<usize>()).max().unwrap_or(0)
    }

    /// Deterministic inputs in `[-1, 1)`, different per seed.
    pub fn input_data(&self, seed: u64) -> Vec<boundscope::Tensor> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        self.inputs
            .iter()
            .map(|shape| {
                boundscope::Tensor::from_fn(shape, |_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
            })
            .collect()
    }
}

impl Op {
    /// The shape of the op's result, from the shapes of the values before it.
    pub fn output_shape(&self, shapes: &[Vec<usize>]) -> Vec<usize> {
        match self {
            Op::Unary(_, x) | Op::Softmax(x) | Op::LayerNorm(x, ..) | Op::CausalMask(x) | Op::LogSoftmax(x) => {
                shapes[*x].clone()
            }
            Op::Slice(x, axis, start, end) => {
                let mut s = shapes[*x].clone();
                s[*axis] = end - start;
                s
            }
            Op::Concat(x, y, axis) => {
                let mut s = shapes[*x].clone();
                s[*axis] += shapes[*y][*axis];
                s
            }
            Op::ReduceAxis(_, x, axis, keep) => {
                let mut s = shapes[*x].clone();
                if *keep {
                    s[*axis] = 1;
                } else {
                    s.remove(*axis);
                }
                s
            }
            Op::Binary(_, x, Operand::Scalar(_)) => shapes[*x].clone(),
            Op::Binary(_, x, Operand::Value(y)) => broadcast(&shapes[*x], &shapes[*y]).expect("picked compatible"),
            Op::Reduce(_, x) => {
                let mut s = shapes[*x].clone();
                *s.last_mut().expect("rank >= 1") = 1;
                s
            }
            Op::Matmul(x, y) => vec![shapes[*x][0], shapes[*y][1]],
            Op::Linear(x, w, _) => vec![shapes[*x][0], shapes[*w][0]],
            Op::Reshape(_, d) | Op::BroadcastTo(_, d) => d.clone(),
            Op::Transpose(x, p) => p.iter().map(|&i| shapes[*x][i]).collect(),
        }
    }
}

/// Numpy broadcast of two shapes, written independently of boundscope's.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let get = |s: &[usize], i: usize| if i < rank - s.len() { 1 } else { s[i - (rank - s.len())] };
    (0..rank)
        .map(|i| match (get(a, i), get(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// `y = x + 1/512` and `z = (y - 1) * 512` over bf16 `[n]`, both outputs: from all-ones input,
/// `y` rounds to 1 (a tie, to even), so `z` is 1 when it reads `y`'s `f32` value (inside a
/// fused region: `torch.compile`'s rule) and 0 when it reads the rounded one (op by op).
pub fn reads_its_own_16_bit_output<'a>(arena: &'a Arena, registry: &'a Registry, n: usize) -> Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input_with(&boundscope::TensorMeta::new(boundscope::DType::BF16, &[n])).unwrap();
    let y = b.add_scalar(x, 1.0 / 512.0).unwrap();
    let d = b.sub_scalar(y, 1.0).unwrap();
    let z = b.mul_scalar(d, 512.0).unwrap();
    b.output(y).unwrap();
    b.output(z).unwrap();
    b.finish().unwrap()
}
