//! Scalar definitions of the elementwise prims, shared by every CPU executor so that fused and
//! unfused code compute exactly the same function.
//!
//! The dispatch macros bind a *function item* (a zero-sized type of its own) rather than a
//! function pointer, so the loop that receives it is monomorphized and the arithmetic inlined
//! and vectorized, instead of one indirect call per element.

/// `sqrt(2 / pi)`, for the tanh form of GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

#[inline(always)]
pub(crate) fn neg(x: f32) -> f32 {
    -x
}
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    x.exp()
}
#[inline(always)]
pub(crate) fn log(x: f32) -> f32 {
    x.ln()
}
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    x.tanh()
}
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
#[inline(always)]
pub(crate) fn relu(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}
#[inline(always)]
pub(crate) fn add(a: f32, b: f32) -> f32 {
    a + b
}
#[inline(always)]
pub(crate) fn sub(a: f32, b: f32) -> f32 {
    a - b
}
#[inline(always)]
pub(crate) fn mul(a: f32, b: f32) -> f32 {
    a * b
}
#[inline(always)]
pub(crate) fn div(a: f32, b: f32) -> f32 {
    a / b
}
#[inline(always)]
pub(crate) fn maximum(a: f32, b: f32) -> f32 {
    a.max(b)
}

/// Evaluates `$body` with `$f` bound to the unary prim `$op`'s scalar function, or evaluates
/// `$otherwise` if `$op` is not a unary prim.
macro_rules! with_unary {
    ($op:expr, $f:ident => $body:expr, _ => $otherwise:expr) => {{
        use $crate::core::ir::prims;
        use $crate::executors::cpu_reference::math;
        match $op {
            prims::NEG => {
                let $f = math::neg;
                $body
            }
            prims::EXP => {
                let $f = math::exp;
                $body
            }
            prims::LOG => {
                let $f = math::log;
                $body
            }
            prims::TANH => {
                let $f = math::tanh;
                $body
            }
            prims::SIGMOID => {
                let $f = math::sigmoid;
                $body
            }
            prims::RELU => {
                let $f = math::relu;
                $body
            }
            prims::GELU => {
                let $f = math::gelu;
                $body
            }
            _ => $otherwise,
        }
    }};
}

/// Like [`with_unary!`] for the binary prims.
macro_rules! with_binary {
    ($op:expr, $f:ident => $body:expr, _ => $otherwise:expr) => {{
        use $crate::core::ir::prims;
        use $crate::executors::cpu_reference::math;
        match $op {
            prims::ADD => {
                let $f = math::add;
                $body
            }
            prims::SUB => {
                let $f = math::sub;
                $body
            }
            prims::MUL => {
                let $f = math::mul;
                $body
            }
            prims::DIV => {
                let $f = math::div;
                $body
            }
            prims::MAXIMUM => {
                let $f = math::maximum;
                $body
            }
            _ => $otherwise,
        }
    }};
}

pub(crate) use {with_binary, with_unary};
