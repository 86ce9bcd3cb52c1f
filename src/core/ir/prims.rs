//! The built-in symbols: their fixed ids, shape rules, decompositions, and the typed builder
//! methods that apply them (`builder.add(a, b)`).
//!
//! Prims are run directly by executors; composites (`softmax`, `layer_norm`, `linear`) carry a
//! decomposition into prims, so that any executor that runs the prims runs them too.

use super::bound_symbol::Arg;
use super::builder::TraceBuilder;
use super::ids::{SymbolId, ValueId};
use super::meta::{DType, Shape, TensorMeta};
use super::symbol::{ArgInfo, Category, ParamKind, Symbol};
use crate::error::{Error, Result};

macro_rules! builtin_ids {
    ($($(#[$doc:meta])* $konst:ident = $index:literal, $name:literal;)*) => {
        $($(#[$doc])* pub const $konst: SymbolId = SymbolId::from_index($index);)*
        /// The built-in names, in id order.
        pub const BUILTIN_NAMES: &[&str] = &[$($name),*];
    };
}

builtin_ids! {
    /// `neg(x)`: `-x`.
    NEG = 0, "neg";
    /// `exp(x)`.
    EXP = 1, "exp";
    /// `log(x)`: natural logarithm.
    LOG = 2, "log";
    /// `tanh(x)`.
    TANH = 3, "tanh";
    /// `sigmoid(x)`: `1 / (1 + exp(-x))`.
    SIGMOID = 4, "sigmoid";
    /// `relu(x)`: `max(x, 0)`.
    RELU = 5, "relu";
    /// `gelu(x)`, tanh form: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GELU = 6, "gelu";
    /// `add(a, b)`: tensor + tensor (broadcasting) or tensor + scalar.
    ADD = 7, "add";
    /// `sub(a, b)`.
    SUB = 8, "sub";
    /// `mul(a, b)`.
    MUL = 9, "mul";
    /// `div(a, b)`.
    DIV = 10, "div";
    /// `maximum(a, b)`: elementwise maximum.
    MAXIMUM = 11, "maximum";
    /// `sum(x)`: sum over the last axis, kept as size 1.
    SUM = 12, "sum";
    /// `max(x)`: maximum over the last axis, kept as size 1 (-infinity over an empty axis).
    MAX = 13, "max";
    /// `matmul(a, b)`: `[..., m, k] x [..., k, n] -> [..., m, n]`, the batch dimensions
    /// broadcast as in `torch.matmul`.
    MATMUL = 14, "matmul";
    /// `reshape(x, dims)`: same elements, new shape.
    RESHAPE = 15, "reshape";
    /// `transpose(x, perm)`: permute axes; output axis `i` is input axis `perm[i]`.
    TRANSPOSE = 16, "transpose";
    /// `broadcast_to(x, dims)`: numpy-style broadcast to `dims`.
    BROADCAST_TO = 17, "broadcast_to";
    /// `cast(x, dtype)`: `x` converted to `dtype`, rounding to nearest (ties to even); values
    /// past the target's range become infinities, as in PyTorch.
    CAST = 18, "cast";
    /// `slice(x, [axis, start, end])`: elements `start..end` along `axis` (`narrow`).
    SLICE = 19, "slice";
    /// `concat(a, b, [axis])`: `a` then `b` along `axis`; the other dimensions match.
    CONCAT = 20, "concat";
    /// `sum_axis(x, [axis])`: sum over `axis`, kept as size 1.
    SUM_AXIS = 21, "sum_axis";
    /// `max_axis(x, [axis])`: maximum over `axis`, kept as size 1 (NaN if the axis holds one).
    MAX_AXIS = 22, "max_axis";
    /// `argmax(x, [axis])`: the `i64` index of the first maximum along `axis`, kept as size 1.
    ARGMAX = 23, "argmax";
    /// `causal_mask(x)`: `x` with `-inf` above the diagonal of its last two axes (row `i` keeps
    /// columns `0..=i`), as `scaled_dot_product_attention(is_causal=True)` masks scores.
    CAUSAL_MASK = 24, "causal_mask";
    /// `embedding(weight, ids)`: rows of `weight` `[rows, width]` gathered by integer `ids`
    /// of any shape: `[*ids, width]`.
    EMBEDDING = 25, "embedding";
    /// `gather_last(x, ids)`: `x[..., ids[...]]`: one element of each last-axis row of `x`
    /// `[..., n]`, picked by the integer `ids` `[...]` (`torch.gather` along the last axis).
    GATHER_LAST = 26, "gather_last";
    /// `lt(a, b)`: `a < b` elementwise (broadcasting; `b` may be a scalar), as `i32` 0 or 1.
    LT = 27, "lt";
    /// `le(a, b)`: `a <= b`, as `i32` 0 or 1.
    LE = 28, "le";
    /// `gt(a, b)`: `a > b`, as `i32` 0 or 1.
    GT = 29, "gt";
    /// `ge(a, b)`: `a >= b`, as `i32` 0 or 1.
    GE = 30, "ge";
    /// `eq(a, b)`: `a == b`, as `i32` 0 or 1.
    EQ = 31, "eq";
    /// `ne(a, b)`: `a != b`, as `i32` 0 or 1.
    NE = 32, "ne";
    /// `where(cond, a, b)`: `a` where the integer `cond` is non-zero, else `b` (a tensor or a
    /// scalar), all three broadcast.
    WHERE = 33, "where";
    /// `pad(x, [axis, before, after], fill)`: `x` with `before` elements of `fill` before it and
    /// `after` after it along `axis` (the gradient of `slice`).
    PAD = 34, "pad";
    /// `scatter_last(values, ids, [n])`: `[..., n]` of zeros with `values[...]` at column
    /// `ids[...]` of each last-axis row (the gradient of `gather_last`).
    SCATTER_LAST = 35, "scatter_last";
    /// `embedding_backward(grad, ids, [rows])`: `[rows, width]`, each row the sum of the rows of
    /// `grad` (`[*ids, width]`) whose id is that row (the gradient of `embedding`).
    EMBEDDING_BACKWARD = 36, "embedding_backward";
    /// `softmax(x)` over the last axis (composite).
    SOFTMAX = 37, "softmax";
    /// `layer_norm(x, eps, weight?, bias?)` over the last axis (composite).
    LAYER_NORM = 38, "layer_norm";
    /// `linear(x, w, bias?)`: `x @ w^T + bias`, `w` is `[out, in]` (composite).
    LINEAR = 39, "linear";
    /// `linear_gelu(x, w, bias?)`: `gelu(linear(x, w, bias))` (composite): what
    /// `passes::FoldEpilogues` makes of a `linear` whose only use is a `gelu`, for executors that
    /// run the activation in the product's epilogue.
    LINEAR_GELU = 40, "linear_gelu";
    /// `log_softmax(x)` over the last axis (composite).
    LOG_SOFTMAX = 41, "log_softmax";
    /// `cross_entropy(logits, targets)`: the mean over rows of `-log_softmax(logits)[target]`,
    /// logits `[rows, classes]`, integer targets `[rows]`, a zero-dimensional `f32` result for
    /// every float dtype of logits (composite), as `torch.nn.functional.cross_entropy` under
    /// `torch.autocast`.
    CROSS_ENTROPY = 42, "cross_entropy";
    /// `scaled_dot_product_attention(q, k, v, scale, causal)`: `softmax(q k^T scale (+ causal
    /// mask)) v` over `[..., tokens, head]` operands (composite).
    SCALED_DOT_PRODUCT_ATTENTION = 43, "scaled_dot_product_attention";
    /// `matmul_transposed(a, b)`: `a @ b^T` over the last two axes, `[..., m, k] x [..., n, k]
    /// -> [..., m, n]` (composite: a transpose and a product, which executors that read an
    /// operand transposed run as one product).
    MATMUL_TRANSPOSED = 44, "matmul_transposed";
    /// `transposed_matmul(a, b)`: `a^T @ b` over the last two axes, `[..., k, m] x [..., k, n]
    /// -> [..., m, n]` (composite: a transpose and a product, run as one product by executors
    /// that read an operand transposed): the weight gradients of products.
    TRANSPOSED_MATMUL = 45, "transposed_matmul";
    /// `cross_entropy_backward(logits, targets, grad)`: the gradient of `cross_entropy` with
    /// respect to its logits, `(softmax(logits) - one_hot(targets)) grad / rows`, in the
    /// logits' dtype (composite: what `passes::Grad` writes for `cross_entropy`).
    CROSS_ENTROPY_BACKWARD = 46, "cross_entropy_backward";
    /// `scaled_dot_product_attention_backward(q, k, v, grad, scale, causal)`: the gradients of
    /// `scaled_dot_product_attention` with respect to q, k and v, packed one after the other
    /// into one `[q.numel() + k.numel() + v.numel()]` tensor of their dtype (composite: what
    /// `passes::Grad` writes for 16-bit attention; CudaOps runs it as cuDNN's fused backward).
    SCALED_DOT_PRODUCT_ATTENTION_BACKWARD = 47, "scaled_dot_product_attention_backward";
    /// `layer_norm_backward(x, grad, eps, weight?)`: the gradient of `layer_norm(x, eps,
    /// weight?, bias?)` with respect to `x`, computed in `f32` from `x` (the rows' mean and
    /// variance taken again) and rounded once to `x`'s dtype (composite: what `passes::Grad`
    /// writes for `layer_norm`; CudaOps runs it as one row kernel).
    LAYER_NORM_BACKWARD = 48, "layer_norm_backward";
    /// `layer_norm_weight_backward(x, grad, eps)`: the gradients of `layer_norm`'s weight and
    /// bias, `f32` `[2, n]`: row 0 sums `grad * normalised x` over every row, row 1 sums `grad`
    /// (composite: what `passes::Grad` writes for `layer_norm`'s weight and bias; CudaOps runs
    /// it as two kernels, partial sums per block and their sum).
    LAYER_NORM_WEIGHT_BACKWARD = 49, "layer_norm_weight_backward";
    /// `qkv_attention(qkv, [heads], scale, causal)`: attention over a packed projection, `qkv`
    /// `[..., tokens, 3 * heads * head]` (q, k and v side by side), the result `[..., tokens,
    /// heads * head]` (composite: split, heads apart, `scaled_dot_product_attention`, heads
    /// joined; CudaOps runs it whole as attention is run, reading q, k and v in place).
    QKV_ATTENTION = 50, "qkv_attention";
    /// `qkv_attention_backward(qkv, grad, [heads], scale, causal)`: the gradient of
    /// `qkv_attention` with respect to `qkv`, in `qkv`'s layout (composite: what `passes::Grad`
    /// writes for `qkv_attention`; CudaOps runs it in 16 bits as cuDNN's fused attention
    /// backward, writing the gradient in place).
    QKV_ATTENTION_BACKWARD = 51, "qkv_attention_backward";
    /// A fusion region, made only by `passes::FuseRegions`; listed as `<Executor>Fusion<N>`.
    REGION = 52, "fusion_region";
}

/// The last prim: ids up to it are prims, the composites follow.
pub(crate) const LAST_PRIM: SymbolId = EMBEDDING_BACKWARD;

/// The unary elementwise prims, in id order.
pub const UNARY: [SymbolId; 7] = [NEG, EXP, LOG, TANH, SIGMOID, RELU, GELU];
/// The binary elementwise prims, in id order.
pub const BINARY: [SymbolId; 5] = [ADD, SUB, MUL, DIV, MAXIMUM];

// `elementwise_answer` tells these prims by their ids' ranges: the unary prims first, then the
// binary ones, each in a run.
const _: () = {
    let mut i = 0;
    while i < UNARY.len() {
        assert!(UNARY[i].index() == UNARY[0].index() + i);
        i += 1;
    }
    let mut i = 0;
    while i < BINARY.len() {
        assert!(BINARY[i].index() == BINARY[0].index() + i);
        i += 1;
    }
};

/// The dtype the shape rule of built-in prim `id` answers where its answer is the first
/// argument's own dtype and shape, found without calling the rule: a unary prim of a float
/// tensor, a binary one of a float tensor and a scalar, or of two float tensors of one dtype
/// and shape (most of a model's elementwise ops). `None` where the rule must decide
/// (broadcasts, promotions, errors). Wherever this answers, the rule answers the same (tested
/// for every unary and binary prim).
#[inline]
pub(crate) fn elementwise_answer(id: SymbolId, args: &[ArgInfo<'_>]) -> Option<DType> {
    match *args {
        [ArgInfo::Tensor { dtype, .. }] if is_unary(id) && !dtype.is_integer() => Some(dtype),
        _ if is_binary(id) => binary_answer(args).map(|(dtype, _)| dtype),
        _ => None,
    }
}

/// What the binary prims' rule answers without its general path: a float tensor with a scalar,
/// or with a tensor of its dtype and shape, gives that tensor's dtype and shape.
#[inline]
fn binary_answer<'m>(args: &[ArgInfo<'m>]) -> Option<(DType, &'m [usize])> {
    match *args {
        [ArgInfo::Tensor { dtype, shape }, ArgInfo::Scalar(_)] if !dtype.is_integer() => Some((dtype, shape)),
        [ArgInfo::Tensor { dtype, shape: a }, ArgInfo::Tensor { dtype: other, shape: b }]
            if dtype == other && !dtype.is_integer() && super::meta::same_dims(a, b) =>
        {
            Some((dtype, a))
        }
        _ => None,
    }
}

/// Whether `id` is a built-in unary prim (one of [`UNARY`], a run of ids).
#[inline]
pub(crate) fn is_unary(id: SymbolId) -> bool {
    (UNARY[0].index()..=UNARY[UNARY.len() - 1].index()).contains(&id.index())
}

/// Whether `id` is a built-in binary prim (one of [`BINARY`], a run of ids).
#[inline]
pub(crate) fn is_binary(id: SymbolId) -> bool {
    (BINARY[0].index()..=BINARY[BINARY.len() - 1].index()).contains(&id.index())
}

/// The comparison prims, in id order: `i32` results, 0 or 1.
pub const COMPARISONS: [SymbolId; 6] = [LT, LE, GT, GE, EQ, NE];

pub(crate) fn builtin_symbols() -> Vec<Symbol> {
    use Category::*;
    use ParamKind::*;
    let mut symbols = Vec::with_capacity(BUILTIN_NAMES.len());
    for (index, name) in BUILTIN_NAMES[..=LAST_PRIM.index()].iter().enumerate() {
        let id = SymbolId::from_index(index);
        let category = match id {
            SUM | MAX | SUM_AXIS | MAX_AXIS | ARGMAX => Reduction,
            MATMUL => Matmul,
            RESHAPE | TRANSPOSE | BROADCAST_TO | SLICE | CONCAT | EMBEDDING | GATHER_LAST | PAD | SCATTER_LAST
            | EMBEDDING_BACKWARD => Shape,
            _ => Elementwise,
        };
        let (params, rule) = prim_rule(id).expect("ids up to LAST_PRIM are prims");
        symbols.push(Symbol::new(*name, category).params(params).shape_rule(rule));
    }
    symbols.push(
        Symbol::new("softmax", Composite)
            .params(&[Tensor])
            .shape_rule(|args| {
                let (dtype, shape) = float_tensor(args, 0)?;
                last_axis(shape)?;
                Ok(TensorMeta::new(dtype, shape))
            })
            .decomposition(decompose_softmax),
    );
    symbols.push(
        Symbol::new("layer_norm", Composite)
            .params_with_optional(&[Tensor, Scalar, Tensor, Tensor], 2)
            .shape_rule(layer_norm_rule)
            .decomposition(decompose_layer_norm),
    );
    symbols.push(
        Symbol::new("linear", Composite)
            .params_with_optional(&[Tensor, Tensor, Tensor], 2)
            .shape_rule(linear_rule)
            .decomposition(decompose_linear),
    );
    symbols.push(
        Symbol::new("linear_gelu", Composite)
            .params_with_optional(&[Tensor, Tensor, Tensor], 2)
            .shape_rule(linear_rule)
            .decomposition(decompose_linear_gelu),
    );
    super::transformer_ops::push_composites(&mut symbols);
    super::gradient_ops::push_composites(&mut symbols);
    super::packed_attention::push_composites(&mut symbols);
    symbols.push(
        Symbol::new("fusion_region", Category::Fusion)
            .shape_rule(|_| Err("fusion regions are made by the fusion pass, not bound directly".to_string())),
    );
    debug_assert_eq!(symbols.len(), BUILTIN_NAMES.len());
    // The mark executors recognise built-in prims and composites by: only set here.
    for (index, symbol) in symbols.iter_mut().enumerate() {
        symbol.builtin = Some(SymbolId::from_index(index));
    }
    symbols
}

/// The signature and shape rule of built-in prim `id`, as [`builtin_symbols`] defines them
/// (every parameter required): what executors check a bound symbol of a built-in prim against
/// before trusting its shapes. `None` for ids that are not prims.
pub(crate) fn prim_rule(id: SymbolId) -> Option<(&'static [ParamKind], PrimRule)> {
    use ParamKind::*;
    Some(match id {
        _ if UNARY.contains(&id) => (&[Tensor], first_shape_rule),
        _ if BINARY.contains(&id) => (&[Tensor, TensorOrScalar], binary_rule),
        SUM | MAX => (&[Tensor], reduce_last_axis_rule),
        MATMUL => (&[Tensor, Tensor], matmul_rule),
        RESHAPE => (&[Tensor, Dims], reshape_rule),
        TRANSPOSE => (&[Tensor, Dims], transpose_rule),
        BROADCAST_TO => (&[Tensor, Dims], broadcast_to_rule),
        CAST => (&[Tensor, DType], cast_rule),
        _ => return super::transformer_ops::prim_rule(id),
    })
}

pub(super) type RuleResult = std::result::Result<TensorMeta, String>;
/// A built-in prim's shape rule.
pub(crate) type PrimRule = fn(&[ArgInfo<'_>]) -> RuleResult;

fn first_shape_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = float_tensor(args, 0)?;
    Ok(TensorMeta::new(dtype, shape))
}

/// Tensor argument `i` of a float op: an integer tensor is an error that says to cast it.
pub(super) fn float_tensor<'m>(args: &[ArgInfo<'m>], i: usize) -> std::result::Result<(DType, &'m [usize]), String> {
    let (dtype, shape) = tensor(args, i)?;
    if dtype.is_integer() {
        return Err(format!(
            "argument {i} is {dtype}, and this op computes on floats; cast it first (`cast(x, DType::F32)`)"
        ));
    }
    Ok((dtype, shape))
}

/// Every tensor argument of a float op is a float tensor.
pub(super) fn floats_only(args: &[ArgInfo<'_>]) -> std::result::Result<(), String> {
    for (i, a) in args.iter().enumerate() {
        if let ArgInfo::Tensor { .. } = a {
            float_tensor(args, i)?;
        }
    }
    Ok(())
}

pub(super) fn tensor<'m>(args: &[ArgInfo<'m>], i: usize) -> std::result::Result<(DType, &'m [usize]), String> {
    match args.get(i) {
        Some(ArgInfo::Tensor { dtype, shape }) => Ok((*dtype, shape)),
        _ => Err(format!("argument {i} must be a tensor")),
    }
}

/// `layer_norm`'s `eps` (argument `i`): a finite number of at least 0. A negative one can make
/// `variance + eps` negative and a NaN makes every result NaN, silently, where PyTorch takes
/// them.
pub(super) fn check_eps(args: &[ArgInfo<'_>], i: usize) -> std::result::Result<(), String> {
    match args.get(i) {
        Some(ArgInfo::Scalar(eps)) if eps.is_finite() && *eps >= 0.0 => Ok(()),
        Some(ArgInfo::Scalar(eps)) => Err(format!(
            "eps must be a finite number of at least 0 (it keeps the division by the standard deviation away from 0; \
             PyTorch's default is 1e-5), not {eps}"
        )),
        _ => Err(format!("argument {i} must be a scalar (eps)")),
    }
}

pub(super) fn last_axis(shape: &[usize]) -> std::result::Result<usize, String> {
    shape.last().copied().ok_or_else(|| "needs a tensor of rank at least 1 (it works on the last axis)".to_string())
}

/// Numpy-style broadcast of two shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> std::result::Result<Shape, String> {
    let rank = a.len().max(b.len());
    let mut out = Shape::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            (x, y) => {
                return Err(format!(
                    "dimension {i} (aligned from the right) is {x} in one and {y} in the other; \
                     sizes must match or one of them must be 1"
                ))
            }
        });
    }
    Ok(out)
}

fn cast_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, shape) = tensor(args, 0)?;
    match args.get(1) {
        Some(ArgInfo::DType(to)) => Ok(TensorMeta::new(*to, shape)),
        _ => Err("argument 1 must be a dtype".into()),
    }
}

/// The promoted dtype of the tensor arguments, as PyTorch's `result_type` gives it for floating
/// operands: the dimensioned tensors promote among themselves, a zero-dimensional tensor counts
/// only when no operand has dimensions (`bf16[4] + f32[]` is bf16, `bf16[] + f32[]` is f32), and
/// scalars never do (see [`DType::promote`]).
pub(super) fn promoted(args: &[ArgInfo<'_>]) -> Option<DType> {
    let of = |dimensioned: bool| {
        args.iter()
            .filter_map(|a| match a {
                ArgInfo::Tensor { dtype, shape } if shape.is_empty() != dimensioned => Some(*dtype),
                _ => None,
            })
            .reduce(DType::promote)
    };
    of(true).or_else(|| of(false))
}

/// The rule of elementwise binary ops: [`binary_rule_general`], with the common cases (a float
/// tensor with a scalar, or with a tensor of its dtype and shape) answered first
/// ([`binary_answer`], which `bind` takes before calling the rule).
fn binary_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    match binary_answer(args) {
        Some((dtype, shape)) => Ok(TensorMeta::new(dtype, shape)),
        None => binary_rule_general(args),
    }
}

/// Elementwise binary ops: float tensors (or a tensor and a scalar) of promoted dtype and
/// broadcast shape.
fn binary_rule_general(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, a) = tensor(args, 0)?;
    floats_only(args)?;
    let dtype = promoted(args).unwrap_or(DType::F32);
    match args.get(1) {
        Some(ArgInfo::Tensor { shape: b, .. }) => {
            if a == *b {
                return Ok(TensorMeta::new(dtype, a));
            }
            Ok(TensorMeta { dtype, shape: broadcast_shapes(a, b)? })
        }
        _ => Ok(TensorMeta::new(dtype, a)),
    }
}

fn reduce_last_axis_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = float_tensor(args, 0)?;
    last_axis(shape)?;
    let mut out = Shape::from_slice(shape);
    *out.last_mut().expect("rank checked") = 1;
    Ok(TensorMeta { dtype, shape: out })
}

pub(super) fn matmul_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, a) = float_tensor(args, 0)?;
    let (_, b) = float_tensor(args, 1)?;
    let dtype = promoted(args).unwrap_or(DType::F32);
    let (ra, rb) = (a.len(), b.len());
    if ra < 2 || rb < 2 {
        return Err("matmul takes tensors of rank 2 or more, [..., m, k] x [..., k, n]".into());
    }
    let (m, k, k2, n) = (a[ra - 2], a[ra - 1], b[rb - 2], b[rb - 1]);
    if k != k2 {
        return Err(format!("inner dimensions differ ({k} vs {k2}); need [..., m, k] x [..., k, n]"));
    }
    let mut out = broadcast_shapes(&a[..ra - 2], &b[..rb - 2]).map_err(|e| format!("batch dimensions: {e}"))?;
    out.extend([m, n]);
    Ok(TensorMeta { dtype, shape: out })
}

pub(super) fn dims_arg<'m>(args: &[ArgInfo<'m>], i: usize) -> std::result::Result<&'m [usize], String> {
    args.get(i).and_then(|a| a.dims()).ok_or_else(|| format!("argument {i} must be a list of dimensions"))
}

fn reshape_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = tensor(args, 0)?;
    let dims = dims_arg(args, 1)?;
    let too_many = |d: &[usize]| format!("{d:?} cannot be used: {}", super::meta::unusable_shape_detail(d));
    let from = super::meta::checked_numel(shape).ok_or_else(|| too_many(shape))?;
    let to = super::meta::checked_numel(dims).ok_or_else(|| too_many(dims))?;
    if from != to {
        return Err(format!("cannot reshape {from} elements into {dims:?} ({to} elements)"));
    }
    Ok(TensorMeta::new(dtype, dims))
}

fn transpose_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = tensor(args, 0)?;
    let perm = dims_arg(args, 1)?;
    let mut seen = vec![false; shape.len()];
    if perm.len() != shape.len() || perm.iter().any(|&p| p >= shape.len() || std::mem::replace(&mut seen[p], true)) {
        return Err(format!(
            "{perm:?} is not a permutation of the {} axes; give each of 0..{} exactly once",
            shape.len(),
            shape.len()
        ));
    }
    Ok(TensorMeta { dtype, shape: perm.iter().map(|&p| shape[p]).collect() })
}

fn broadcast_to_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (dtype, shape) = tensor(args, 0)?;
    let dims = dims_arg(args, 1)?;
    let out = broadcast_shapes(shape, dims)?;
    if out.as_slice() != dims {
        return Err(format!("cannot broadcast to {dims:?}: the result would be {:?}", out.as_slice()));
    }
    Ok(TensorMeta::new(dtype, dims))
}

fn layer_norm_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, shape) = tensor(args, 0)?;
    floats_only(args)?;
    check_eps(args, 1)?;
    // As its decomposition computes it: x's dtype, promoted by the weight and the bias.
    let dtype = promoted(args).unwrap_or(DType::F32);
    let n = last_axis(shape)?;
    for (i, what) in [(2, "weight"), (3, "bias")] {
        if args.len() > i {
            let (_, s) = tensor(args, i)?;
            if s != [n] {
                return Err(format!("{what} must have shape [{n}] (the last axis), not {s:?}"));
            }
        }
    }
    Ok(TensorMeta::new(dtype, shape))
}

fn linear_rule(args: &[ArgInfo<'_>]) -> RuleResult {
    let (_, x) = tensor(args, 0)?;
    floats_only(args)?;
    let dtype = promoted(args).unwrap_or(DType::F32);
    let (_, w) = tensor(args, 1)?;
    let (m, n) = match (x, w) {
        ([m, k], [n, k2]) if k == k2 => (*m, *n),
        ([_, k], [_, k2]) => return Err(format!("x has {k} features but the weight expects {k2}; w is [out, in]")),
        _ => return Err("linear takes x [m, in] and w [out, in]".into()),
    };
    if args.len() > 2 {
        let (_, b) = tensor(args, 2)?;
        if b != [n] {
            return Err(format!("bias must have shape [{n}], not {b:?}"));
        }
    }
    Ok(TensorMeta::new(dtype, &[m, n]))
}

pub(super) fn value(args: &[Arg<'_>], i: usize) -> Option<ValueId> {
    match args.get(i) {
        Some(Arg::Value(v)) => Some(*v),
        _ => None,
    }
}

pub(super) fn scalar(args: &[Arg<'_>], i: usize) -> f32 {
    match args.get(i) {
        Some(Arg::Scalar(s)) => *s,
        _ => 0.0,
    }
}

// Decompositions only run after the builder has checked the signature and shape rule, so the
// `value(..)` lookups below cannot miss; `missing` keeps that a typed error rather than a panic.
pub(super) fn missing(symbol: &str) -> Error {
    Error::InvalidSymbol { symbol: symbol.into(), detail: "decomposition called with unchecked arguments".into() }
}

/// `math` on `values` computed in `f32` and rounded once to the composite's dtype (the
/// promotion of `values`' dtypes): how PyTorch runs these composites, one kernel with `f32`
/// registers. A composite of 16-bit values decomposes into casts to `f32`, the math in `f32`,
/// and one cast of the result, so that every executor that runs the decomposition (the CPU
/// reference included, which rounds each prim) rounds only once; `f32` composites get no cast.
pub(super) fn in_f32<const N: usize>(
    b: &mut TraceBuilder<'_>,
    values: [Option<ValueId>; N],
    math: impl FnOnce(&mut TraceBuilder<'_>, [Option<ValueId>; N]) -> Result<ValueId>,
) -> Result<ValueId> {
    let mut dtypes = Vec::with_capacity(N);
    for v in values.iter().flatten() {
        dtypes.push(b.dtype(*v)?);
    }
    if dtypes.iter().all(|&d| d == DType::F32) {
        return math(b, values);
    }
    let out = dtypes.iter().copied().reduce(DType::promote).unwrap_or(DType::F32);
    let mut wide = values;
    for (v, &dtype) in wide.iter_mut().flatten().zip(&dtypes) {
        if dtype != DType::F32 {
            *v = b.cast(*v, DType::F32)?;
        }
    }
    let y = math(b, wide)?;
    if out == DType::F32 {
        Ok(y)
    } else {
        b.cast(y, out)
    }
}

fn decompose_softmax(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let x = value(args, 0).ok_or_else(|| missing("softmax"))?;
    in_f32(b, [Some(x)], |b, [x]| {
        let x = x.ok_or_else(|| missing("softmax"))?;
        let m = b.max(x)?;
        let shifted = b.sub(x, m)?;
        let e = b.exp(shifted)?;
        let z = b.sum(e)?;
        b.div(e, z)
    })
}

fn decompose_layer_norm(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let x = value(args, 0).ok_or_else(|| missing("layer_norm"))?;
    let eps = scalar(args, 1);
    in_f32(b, [Some(x), value(args, 2), value(args, 3)], |b, [x, weight, bias]| {
        let x = x.ok_or_else(|| missing("layer_norm"))?;
        let (mut y, _) = normalised_rows(b, x, eps)?;
        if let Some(w) = weight {
            y = b.mul(y, w)?;
        }
        if let Some(bias) = bias {
            y = b.add(y, bias)?;
        }
        Ok(y)
    })
}

/// The rows of `f32` `x` normalised over the last axis, `(x - mean) / sqrt(variance + eps)`, and
/// `1 / sqrt(variance + eps)` per row: `layer_norm`'s decomposition, which its backward ops
/// repeat.
pub(super) fn normalised_rows(b: &mut TraceBuilder<'_>, x: ValueId, eps: f32) -> Result<(ValueId, ValueId)> {
    let n = *b.shape(x)?.last().ok_or_else(|| missing("layer_norm"))? as f32;
    let total = b.sum(x)?;
    let mean = b.mul_scalar(total, 1.0 / n)?;
    let centered = b.sub(x, mean)?;
    let squares = b.mul(centered, centered)?;
    let square_sum = b.sum(squares)?;
    let variance = b.mul_scalar(square_sum, 1.0 / n)?;
    let shifted = b.add_scalar(variance, eps)?;
    // 1/sqrt(v) = exp(-0.5 * log(v)): the prims have no sqrt.
    let log_var = b.log(shifted)?;
    let half = b.mul_scalar(log_var, -0.5)?;
    let inv_std = b.exp(half)?;
    Ok((b.mul(centered, inv_std)?, inv_std))
}

fn decompose_linear_gelu(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let x = value(args, 0).ok_or_else(|| missing("linear_gelu"))?;
    let w = value(args, 1).ok_or_else(|| missing("linear_gelu"))?;
    in_f32(b, [Some(x), Some(w), value(args, 2)], |b, [x, w, bias]| {
        let (x, w) = (x.ok_or_else(|| missing("linear_gelu"))?, w.ok_or_else(|| missing("linear_gelu"))?);
        let h = b.linear(x, w, bias)?;
        b.gelu(h)
    })
}

fn decompose_linear(b: &mut TraceBuilder<'_>, args: &[Arg<'_>]) -> Result<ValueId> {
    let x = value(args, 0).ok_or_else(|| missing("linear"))?;
    let w = value(args, 1).ok_or_else(|| missing("linear"))?;
    in_f32(b, [Some(x), Some(w), value(args, 2)], |b, [x, w, bias]| {
        let (x, w) = (x.ok_or_else(|| missing("linear"))?, w.ok_or_else(|| missing("linear"))?);
        let wt = b.transpose(w, &[1, 0])?;
        let y = b.matmul(x, wt)?;
        match bias {
            Some(bias) => b.add(y, bias),
            None => Ok(y),
        }
    })
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $method:ident => $id:ident;)*) => {$(
        $(#[$doc])*
        pub fn $method(&mut self, x: ValueId) -> Result<ValueId> {
            self.bind($id, &[Arg::Value(x)])
        }
    )*};
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $method:ident, $scalar_method:ident => $id:ident;)*) => {$(
        $(#[$doc])*
        pub fn $method(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
            self.bind($id, &[Arg::Value(a), Arg::Value(b)])
        }
        $(#[$doc])*
        /// (tensor and scalar form)
        pub fn $scalar_method(&mut self, a: ValueId, b: f32) -> Result<ValueId> {
            self.bind($id, &[Arg::Value(a), Arg::Scalar(b)])
        }
    )*};
}

/// Typed methods for the built-in symbols. Each one is `bind` with the symbol's fixed id.
///
/// ```
/// use boundscope::{Arena, Registry, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[2, 8]).unwrap();
/// let w = b.input(&[4, 8]).unwrap();
/// let h = b.linear(x, w, None).unwrap();
/// let y = b.softmax(h).unwrap();
/// assert_eq!(b.shape(y).unwrap(), &[2, 4]);
/// ```
impl<'a> TraceBuilder<'a> {
    unary_methods! {
        /// Applies `neg`.
        neg => NEG;
        /// Applies `exp`.
        exp => EXP;
        /// Applies `log`.
        log => LOG;
        /// Applies `tanh`.
        tanh => TANH;
        /// Applies `sigmoid`.
        sigmoid => SIGMOID;
        /// Applies `relu`.
        relu => RELU;
        /// Applies `gelu` (tanh form).
        gelu => GELU;
        /// Sums the last axis (keepdim).
        sum => SUM;
        /// Takes the maximum of the last axis (keepdim): -infinity, max's identity, where the axis
        /// is empty ([`max_dim`](Self::max_dim) is an error there, as `torch.amax`).
        max => MAX;
        /// Applies `softmax` over the last axis.
        softmax => SOFTMAX;
    }

    binary_methods! {
        /// Applies `add`.
        add, add_scalar => ADD;
        /// Applies `sub`.
        sub, sub_scalar => SUB;
        /// Applies `mul`.
        mul, mul_scalar => MUL;
        /// Applies `div`.
        div, div_scalar => DIV;
        /// Applies `maximum`.
        maximum, maximum_scalar => MAXIMUM;
    }

    /// Applies `matmul`: `[..., m, k] x [..., k, n]`, batch dimensions broadcast.
    pub fn matmul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.bind(MATMUL, &[Arg::Value(a), Arg::Value(b)])
    }

    /// Applies `reshape`.
    pub fn reshape(&mut self, x: ValueId, dims: &[usize]) -> Result<ValueId> {
        self.bind(RESHAPE, &[Arg::Value(x), Arg::Dims(dims)])
    }

    /// Applies `transpose` with a permutation of the axes.
    pub fn transpose(&mut self, x: ValueId, perm: &[usize]) -> Result<ValueId> {
        self.bind(TRANSPOSE, &[Arg::Value(x), Arg::Dims(perm)])
    }

    /// Applies `broadcast_to`.
    pub fn broadcast_to(&mut self, x: ValueId, dims: &[usize]) -> Result<ValueId> {
        self.bind(BROADCAST_TO, &[Arg::Value(x), Arg::Dims(dims)])
    }

    /// Applies `cast`: `x` converted to `dtype` (rounding to nearest, ties to even; values past
    /// the target's range become infinities, as in PyTorch).
    ///
    /// ```
    /// use boundscope::{Arena, DType, Registry, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4]).unwrap();
    /// let h = b.cast(x, DType::BF16).unwrap();
    /// let y = b.exp(h).unwrap(); // computed in f32, rounded to bf16
    /// let z = b.add(y, x).unwrap(); // bf16 + f32 promotes to f32
    /// b.output(z).unwrap();
    /// let trace = b.finish().unwrap();
    /// assert_eq!(trace.value_meta(y).unwrap().dtype, DType::BF16);
    /// assert_eq!(trace.value_meta(z).unwrap().dtype, DType::F32);
    /// ```
    pub fn cast(&mut self, x: ValueId, dtype: DType) -> Result<ValueId> {
        self.bind(CAST, &[Arg::Value(x), Arg::DType(dtype)])
    }

    /// Applies `layer_norm` over the last axis; a bias needs a weight.
    pub fn layer_norm(
        &mut self,
        x: ValueId,
        eps: f32,
        weight: Option<ValueId>,
        bias: Option<ValueId>,
    ) -> Result<ValueId> {
        match (weight, bias) {
            (None, None) => self.bind(LAYER_NORM, &[Arg::Value(x), Arg::Scalar(eps)]),
            (Some(w), None) => self.bind(LAYER_NORM, &[Arg::Value(x), Arg::Scalar(eps), Arg::Value(w)]),
            (Some(w), Some(b)) => {
                self.bind(LAYER_NORM, &[Arg::Value(x), Arg::Scalar(eps), Arg::Value(w), Arg::Value(b)])
            }
            (None, Some(_)) => Err(Error::ArgumentKind {
                symbol: "layer_norm".into(),
                position: 2,
                expected: "a weight whenever a bias is given (pass a weight of ones)",
                got: "nothing",
            }),
        }
    }

    /// Applies `linear`: `x @ w^T (+ bias)`, `w` is `[out, in]`.
    pub fn linear(&mut self, x: ValueId, w: ValueId, bias: Option<ValueId>) -> Result<ValueId> {
        match bias {
            Some(b) => self.bind(LINEAR, &[Arg::Value(x), Arg::Value(w), Arg::Value(b)]),
            None => self.bind(LINEAR, &[Arg::Value(x), Arg::Value(w)]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[2, 3], &[3]).unwrap().as_slice(), &[2, 3]);
        assert_eq!(broadcast_shapes(&[2, 1], &[1, 4]).unwrap().as_slice(), &[2, 4]);
        assert_eq!(broadcast_shapes(&[], &[5]).unwrap().as_slice(), &[5]);
        assert!(broadcast_shapes(&[2, 3], &[4]).is_err());
    }

    #[test]
    fn the_binary_rules_common_cases_answer_as_its_general_path() {
        let shapes: [&[usize]; 5] = [&[], &[4], &[2, 3], &[1, 3], &[2, 4]];
        let dtypes = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64];
        let tensors: Vec<ArgInfo<'_>> = dtypes
            .iter()
            .flat_map(|&dtype| shapes.iter().map(move |&shape| ArgInfo::Tensor { dtype, shape }))
            .collect();
        let mut cases = 0;
        for &tensor in &tensors {
            for other in tensors.iter().copied().chain([ArgInfo::Scalar(2.0)]) {
                let args = [tensor, other];
                assert_eq!(binary_rule(&args), binary_rule_general(&args), "{args:?}");
                cases += 1;
            }
        }
        assert_eq!(cases, 650);
    }

    /// `elementwise_answer`, which `TraceBuilder::bind` takes instead of calling the rule, gives
    /// the rule's answer (the first argument's dtype and shape) wherever it gives one, for every
    /// built-in prim it could answer for, and answers the common cases (so that `bind` takes it).
    #[test]
    fn the_elementwise_answer_is_the_rules() {
        let shapes: [&[usize]; 6] = [&[], &[1], &[4], &[2, 3], &[1, 3], &[2, 4]];
        let dtypes = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64];
        let tensors: Vec<ArgInfo<'_>> = dtypes
            .iter()
            .flat_map(|&dtype| shapes.iter().map(move |&shape| ArgInfo::Tensor { dtype, shape }))
            .collect();
        let mut arg_lists: Vec<Vec<ArgInfo<'_>>> = tensors.iter().map(|&t| vec![t]).collect();
        for &tensor in &tensors {
            arg_lists.extend(tensors.iter().chain(&[ArgInfo::Scalar(2.0)]).map(|&other| vec![tensor, other]));
        }
        arg_lists.push(vec![ArgInfo::Scalar(1.0), tensors[0]]);
        let (mut answered, mut declined) = (0, 0);
        for id in (0..BUILTIN_NAMES.len()).map(SymbolId::from_index) {
            let rule = prim_rule(id).map(|(_, rule)| rule);
            for args in &arg_lists {
                let Some(dtype) = elementwise_answer(id, args) else {
                    declined += 1;
                    continue;
                };
                let rule = rule.unwrap_or_else(|| panic!("answered for {id:?}, which is no prim"));
                let ArgInfo::Tensor { shape, .. } = args[0] else { panic!("answered for {args:?}") };
                assert_eq!(rule(args), Ok(TensorMeta::new(dtype, shape)), "{id:?} {args:?}");
                answered += 1;
            }
        }
        // Each unary prim for each float tensor; each binary one for a float tensor with a
        // scalar or with itself in shape and dtype.
        let floats = 3 * shapes.len();
        assert_eq!(answered, UNARY.len() * floats + BINARY.len() * (floats + floats));
        assert!(declined > answered);
    }

    fn t(shape: &[usize]) -> ArgInfo<'_> {
        ArgInfo::Tensor { dtype: DType::F32, shape }
    }

    /// PyTorch's `torch.result_type` for every pair of float dtypes and operand categories
    /// (checked with PyTorch 2.11): a dimensioned tensor, a zero-dimensional one, a scalar.
    #[test]
    fn promotion_follows_pytorchs_three_categories() {
        use DType::{BF16, F16, F32};
        // Between two operands of one category (both dimensioned, or both zero-dimensional).
        let same_category = [
            (F32, F32, F32),
            (F32, BF16, F32),
            (F32, F16, F32),
            (BF16, F32, F32),
            (BF16, BF16, BF16),
            (BF16, F16, F32),
            (F16, F32, F32),
            (F16, BF16, F32),
            (F16, F16, F16),
        ];
        let dims: &[usize] = &[4];
        let zero: &[usize] = &[];
        for (a, b, expected) in same_category {
            for shape in [dims, zero] {
                let args = [ArgInfo::Tensor { dtype: a, shape }, ArgInfo::Tensor { dtype: b, shape }];
                assert_eq!(binary_rule(&args).unwrap().dtype, expected, "{a}{shape:?} with {b}{shape:?}");
            }
            // A dimensioned tensor with a zero-dimensional one: the dimensioned one's dtype,
            // in either order (bf16[4] + f32[] is bf16).
            let mixed = [ArgInfo::Tensor { dtype: a, shape: dims }, ArgInfo::Tensor { dtype: b, shape: zero }];
            assert_eq!(binary_rule(&mixed).unwrap().dtype, a, "{a}[4] with {b}[]");
            let mixed = [ArgInfo::Tensor { dtype: a, shape: zero }, ArgInfo::Tensor { dtype: b, shape: dims }];
            assert_eq!(binary_rule(&mixed).unwrap().dtype, b, "{a}[] with {b}[4]");
        }
        // A scalar never promotes, a zero-dimensional tensor's dtype included.
        for a in DType::FLOATS {
            for shape in [dims, zero] {
                let args = [ArgInfo::Tensor { dtype: a, shape }, ArgInfo::Scalar(2.5)];
                assert_eq!(binary_rule(&args).unwrap().dtype, a);
            }
        }
    }

    #[test]
    fn shape_rules() {
        assert_eq!(matmul_rule(&[t(&[2, 3]), t(&[3, 4])]).unwrap().shape.as_slice(), &[2, 4]);
        assert!(matmul_rule(&[t(&[2, 3]), t(&[2, 4])]).unwrap_err().contains("inner"));
        assert_eq!(reduce_last_axis_rule(&[t(&[2, 3])]).unwrap().shape.as_slice(), &[2, 1]);
        assert!(reduce_last_axis_rule(&[t(&[])]).is_err());
        assert_eq!(transpose_rule(&[t(&[2, 3, 4]), ArgInfo::Dims(&[2, 0, 1])]).unwrap().shape.as_slice(), &[4, 2, 3]);
        assert!(transpose_rule(&[t(&[2, 3]), ArgInfo::Dims(&[0, 0])]).is_err());
        assert!(transpose_rule(&[t(&[2, 3]), ArgInfo::Dims(&[0, 5])]).is_err());
        assert!(reshape_rule(&[t(&[2, 3]), ArgInfo::Dims(&[7])]).is_err());
        assert!(broadcast_to_rule(&[t(&[3]), ArgInfo::Dims(&[2, 3])]).is_ok());
        assert!(broadcast_to_rule(&[t(&[2, 3]), ArgInfo::Dims(&[3])]).is_err());
        assert_eq!(linear_rule(&[t(&[2, 8]), t(&[4, 8]), t(&[4])]).unwrap().shape.as_slice(), &[2, 4]);
        assert!(linear_rule(&[t(&[2, 8]), t(&[4, 8]), t(&[8])]).is_err());
        assert!(layer_norm_rule(&[t(&[2, 8]), ArgInfo::Scalar(1e-5), t(&[4])]).is_err());
    }

    #[test]
    fn layer_norm_refuses_an_eps_that_is_negative_or_not_finite() {
        use crate::{Arena, Registry};
        let (registry, arena) = (Registry::with_builtins(), Arena::new());
        let mut b = TraceBuilder::new(&arena, &registry);
        let x = b.input(&[2, 8]).unwrap();
        let g = b.input(&[2, 8]).unwrap();
        for eps in [-1e-5, f32::NAN, f32::INFINITY] {
            let err = b.layer_norm(x, eps, None, None).unwrap_err().to_string();
            assert!(err.contains("layer_norm") && err.contains("eps must be a finite number of at least 0"), "{err}");
            let err = b.layer_norm_backward(x, g, eps, None).unwrap_err().to_string();
            assert!(err.contains("eps must be"), "{err}");
            assert!(b.layer_norm_weight_backward(x, g, eps).is_err());
        }
        // 0 is PyTorch's too (a constant row then divides by 0, as it does there).
        assert!(b.layer_norm(x, 0.0, None, None).is_ok());
        assert!(b.layer_norm(x, 1e-5, None, None).is_ok());
    }
}
