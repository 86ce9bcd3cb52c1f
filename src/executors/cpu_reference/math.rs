//! Scalar definitions of the elementwise prims, shared by every CPU executor so that fused and
//! unfused code compute exactly the same function. Public so that your own CPU kernels (and
//! hand-written baselines) can compute the same function too.
//!
//! ```
//! use boundscope::executors::math;
//! assert!((math::exp(1.0) - std::f32::consts::E).abs() < 1e-6);
//! assert_eq!(math::relu(-2.0), 0.0);
//! ```
//!
//! The dispatch macros bind a *function item* (a zero-sized type of its own) rather than a
//! function pointer, so the loop that receives it is monomorphized and the arithmetic inlined
//! and vectorized, instead of one indirect call per element.

/// `sqrt(2 / pi)`, for the tanh form of GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `-x`.
#[inline(always)]
pub fn neg(x: f32) -> f32 {
    -x
}
/// `e^x` to about 1 ulp (Cephes' polynomial), written so that loops over it vectorize: a
/// branch-free range reduction instead of libm's `expf` call per element.
///
/// Same special values as `f32::exp`: NaN for NaN, infinity above 88.72, zero below -103.97
/// (subnormal results in between, as libm gives).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting it rounds to an integer
    const MAX: f32 = 88.722_83;
    const MIN: f32 = -103.972_08;
    // Comparisons rather than `clamp`, and integer work on the bits of the rounded float
    // rather than an `as` cast: both keep the loop vectorizable. NaN passes through.
    let clamped = if x < MIN { MIN } else { x };
    let clamped = if clamped > MAX { MAX } else { clamped };
    let shifted = clamped * LOG2E + ROUND;
    let k = shifted - ROUND;
    let r = clamped - k * LN2_HI - k * LN2_LO;
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // 2^k in two normal halves, so that k from -150 to 128 needs no special case. The integer
    // k sits in the low bits of `shifted` (|k| < 2^22).
    let k = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let half = k >> 1;
    let scale_a = f32::from_bits((half.wrapping_add(127) << 23) as u32);
    let scale_b = f32::from_bits((k.wrapping_sub(half).wrapping_add(127) << 23) as u32);
    let y = e_r * scale_a * scale_b;
    let y = if x > MAX { f32::INFINITY } else { y };
    if x < MIN {
        0.0
    } else {
        y
    }
}
/// Natural logarithm.
#[inline(always)]
pub fn log(x: f32) -> f32 {
    x.ln()
}
/// Hyperbolic tangent.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    x.tanh()
}
/// `1 / (1 + e^-x)`, with [`exp`].
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}
/// `max(x, 0)`; NaN for NaN, as in PyTorch. (One comparison and a select, so that loops over
/// it vectorize: `x.max(0.0)` would give 0 for NaN.)
#[inline(always)]
pub fn relu(x: f32) -> f32 {
    if x <= 0.0 {
        0.0
    } else {
        x
    }
}
/// GELU, tanh form.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}
/// `a + b`.
#[inline(always)]
pub fn add(a: f32, b: f32) -> f32 {
    a + b
}
/// `a - b`.
#[inline(always)]
pub fn sub(a: f32, b: f32) -> f32 {
    a - b
}
/// `a * b`.
#[inline(always)]
pub fn mul(a: f32, b: f32) -> f32 {
    a * b
}
/// `a / b`.
#[inline(always)]
pub fn div(a: f32, b: f32) -> f32 {
    a / b
}
/// The larger of `a` and `b`; NaN if either is NaN, as PyTorch's `maximum` (`f32::max` would
/// return the other one). Compares and selects, so that loops over it vectorize.
#[inline(always)]
pub fn maximum(a: f32, b: f32) -> f32 {
    if a > b || a.is_nan() {
        a
    } else {
        b
    }
}

/// The largest element of `row` (the `max` prim over one row): NaN if any element is NaN, as
/// PyTorch's `amax`; negative infinity for an empty row.
///
/// ```
/// use boundscope::executors::math;
/// assert_eq!(math::row_max(&[1.0, 3.0, 2.0]), 3.0);
/// assert!(math::row_max(&[1.0, f32::NAN, 2.0]).is_nan());
/// assert_eq!(math::row_max(&[]), f32::NEG_INFINITY);
/// ```
#[inline]
pub fn row_max(row: &[f32]) -> f32 {
    // Independent lanes, combined at the end: a fold of `maximum` through one accumulator
    // does not vectorize (LLVM vectorizes only the `f32::max` reduction, which drops NaN).
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, maximum);
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = maximum(*lane, x);
        }
    }
    lanes.into_iter().fold(rest, maximum)
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

#[cfg(test)]
mod tests {
    #[test]
    fn row_max_is_the_largest_element_or_nan_in_every_lane() {
        for n in 0..40 {
            let row: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let want = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(super::row_max(&row), want, "{n}");
            for at in 0..n {
                let mut with_nan = row.clone();
                with_nan[at] = f32::NAN;
                assert!(super::row_max(&with_nan).is_nan(), "NaN at {at} of {n}");
            }
        }
    }

    #[test]
    fn exp_is_within_two_ulps_of_libm_and_keeps_special_values() {
        let mut worst = 0.0f32;
        let mut x = -87.3f32; // normal results; below, subnormals lose precision in libm too
        while x < 88.72 {
            let (got, want) = (super::exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 2.5e-7, "max relative error {worst}");
        assert_eq!(super::exp(0.0), 1.0);
        assert!(super::exp(f32::NAN).is_nan());
        assert_eq!(super::exp(100.0), f32::INFINITY);
        assert_eq!(super::exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(super::exp(-200.0), 0.0);
        assert_eq!(super::exp(f32::NEG_INFINITY), 0.0);
        assert!(super::sigmoid(-100.0) >= 0.0 && super::sigmoid(100.0) == 1.0);
    }
}
