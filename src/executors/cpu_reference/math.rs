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
/// `e^x` within 1 ulp of the exact value (tested) (Cephes' polynomial), written so that loops over it vectorize: a
/// branch-free range reduction instead of libm's `expf` call per element.
///
/// Same special values as `f32::exp`: NaN for NaN, infinity above 88.72, zero below -103.97
/// (subnormal results in between, as libm gives).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_evaluated::<false>(x)
}

/// [`exp`] with its range reduction and polynomial evaluated by fused multiply-adds (about 20
/// operations where `exp` takes 30), within 1 ulp of the exact value (tested), with the same
/// special values. The same bits on every processor, since `f32::mul_add` is one rounding
/// everywhere (in software where the hardware has no FMA, slowly); not the same bits as `exp`,
/// so it serves kernels documented as within an ulp of their decomposition (`softmax` whole).
#[inline(always)]
pub(crate) fn exp_fused(x: f32) -> f32 {
    exp_evaluated::<true>(x)
}

/// [`exp`] (`FUSED` false: each product and sum rounded) or [`exp_fused`] (`FUSED` true: each
/// `a * b + c` one fused multiply-add).
#[inline(always)]
fn exp_evaluated<const FUSED: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting it rounds to an integer
    const MAX: f32 = 88.722_83;
    const MIN: f32 = -103.972_08;
    // `a * b + c`. (`k * -h + c` is `c - k * h` exactly: negation is exact.)
    let fma = |a: f32, b: f32, c: f32| if FUSED { a.mul_add(b, c) } else { a * b + c };
    // Comparisons rather than `clamp`, and integer work on the bits of the rounded float
    // rather than an `as` cast: both keep the loop vectorizable. NaN passes through.
    let clamped = if x < MIN { MIN } else { x };
    let clamped = if clamped > MAX { MAX } else { clamped };
    let shifted = fma(clamped, LOG2E, ROUND);
    let k = shifted - ROUND;
    let r = fma(k, -LN2_HI, clamped);
    let r = fma(k, -LN2_LO, r);
    let p = 1.987_569_1e-4f32;
    let p = fma(p, r, 1.398_199_9e-3);
    let p = fma(p, r, 8.333_452e-3);
    let p = fma(p, r, 4.166_579_6e-2);
    let p = fma(p, r, 1.666_666_5e-1);
    let p = fma(p, r, 0.5);
    let e_r = fma(p * r, r, r) + 1.0;
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
/// Natural logarithm, within 1 ulp of the exact value (tested) (Cephes' polynomial), branch-free so that loops over it
/// vectorize: NaN below zero and for NaN, negative infinity at `±0`, infinity at infinity;
/// subnormal inputs are scaled into the normal range first.
///
/// ```
/// use boundscope::executors::math;
/// assert!((math::log(10.0) - 10f32.ln()).abs() <= f32::EPSILON * 3.0);
/// assert_eq!(math::log(0.0), f32::NEG_INFINITY);
/// assert!(math::log(-1.0).is_nan());
/// ```
#[inline(always)]
pub fn log(x: f32) -> f32 {
    const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    const TWO_23: f32 = 8_388_608.0;
    let subnormal = x < f32::MIN_POSITIVE;
    let scaled = if subnormal { x * TWO_23 } else { x };
    let bits = scaled.to_bits();
    // x = m * 2^e with m in [0.5, 1).
    let e = ((bits >> 23) & 0xff) as i32 - 126;
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    // Then m in [sqrt(1/2), sqrt(2)) around 1, and f = m - 1.
    let low = m < SQRT_HALF;
    let e = if low { e - 1 } else { e };
    let f = if low { m + m - 1.0 } else { m - 1.0 };
    let e = e as f32 - if subnormal { 23.0 } else { 0.0 };
    let z = f * f;
    let p = 7.037_683_6e-2f32;
    let p = p * f - 1.151_461e-1;
    let p = p * f + 1.167_699_9e-1;
    let p = p * f - 1.242_014_1e-1;
    let p = p * f + 1.424_932_3e-1;
    let p = p * f - 1.666_805_8e-1;
    let p = p * f + 2.000_071_4e-1;
    let p = p * f - 2.499_999_4e-1;
    let p = p * f + 3.333_333e-1;
    let y = p * f * z;
    let y = y + -2.121_944_4e-4 * e;
    let y = y + -0.5 * z;
    let r = f + y + 0.693_359_4 * e;
    let r = if x == f32::INFINITY { f32::INFINITY } else { r };
    let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
    if x < 0.0 || x.is_nan() {
        f32::NAN
    } else {
        r
    }
}
/// Hyperbolic tangent, within 2 ulps of the exact value (tested; 1 measured), branch-free so that loops over it vectorize: Cephes'
/// odd polynomial for `|x| < 0.625`, `1 - 2 / (e^2|x| + 1)` with the sign of `x` above.
///
/// ```
/// use boundscope::executors::math;
/// assert!((math::tanh(0.5) - 0.5f32.tanh()).abs() <= f32::EPSILON);
/// assert_eq!(math::tanh(f32::INFINITY), 1.0);
/// assert_eq!(math::tanh(-0.0).to_bits(), (-0.0f32).to_bits());
/// ```
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let p = -5.704_988_7e-3f32;
    let p = p * z + 2.063_909e-2;
    let p = p * z - 5.373_971_6e-2;
    let p = p * z + 1.333_144_2e-1;
    let p = p * z - 3.333_328e-1;
    let small = a + a * z * p;
    let large = 1.0 - 2.0 / (exp(a + a) + 1.0);
    // Odd: computed for |x|, given the sign of x (so that tanh(-0) is -0).
    if a < 0.625 { small } else { large }.copysign(x)
}
/// `1 / (1 + e^-x)`, its exponential [`exp`]'s steps evaluated by fused multiply-adds (within
/// an ulp of the exact value, as `softmax` whole takes it): the fused swish chain runs 10-30%
/// faster than with `exp` itself; within 2 ulps of the exact value either way (tested).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_fused(-x))
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
    0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)))
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

/// The sum of `row` (the `sum` prim over one row), added in 16 interleaved partial sums over
/// blocks of 4,096 elements, the blocks' sums combined pairwise: the loop vectorizes, every
/// instruction set adds in the same order, and past a block the rounding error grows with the
/// logarithm of the row's length, not with its length. Zero for an empty row.
///
/// ```
/// use boundscope::executors::math;
/// assert_eq!(math::row_sum(&[1.0, 2.0, 3.5]), 6.5);
/// assert_eq!(math::row_sum(&[]), 0.0);
/// // 2^24 tenths: 1,677,725.6, 2.4 parts in a million over 1,677,721.6 (16 running sums,
/// // without blocks, read 1,694,269.5: 1% over).
/// let sum = math::row_sum(&vec![0.1; 1 << 24]);
/// assert!((f64::from(sum) / 1_677_721.6 - 1.0).abs() < 3e-6);
/// ```
#[inline]
pub fn row_sum(row: &[f32]) -> f32 {
    let full = row.len() - row.len() % LaneSum::LANES;
    LaneSum::of_row(&row[..full], LaneMap::Identity, &row[full..])
}

/// The partial sums of [`row_sum`], for a row added in pieces (tiles of a fused region) in the
/// same order as in one piece: every piece but the last must hold a multiple of
/// [`LANES`](Self::LANES) elements. The order depends only on each element's position in the
/// row: the blocks start every [`BLOCK`](Self::BLOCK) elements from the row's first.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneSum {
    /// The open block's partial sums.
    lanes: [f32; Self::LANES],
    /// Elements added to the open block: a multiple of `LANES`, up to `BLOCK` (a full block is
    /// closed when the next element comes, so that a row of one block is added as before
    /// blocks: 16 lanes, combined at the end).
    in_block: usize,
    /// The sums of closed blocks, combined pairwise as they close (a binary counter):
    /// `levels[l]` holds the sum of `2^l` blocks where bit `l` of `closed` is set.
    levels: [f32; Self::LEVELS],
    /// Blocks closed.
    closed: u64,
}

impl LaneSum {
    /// Partial sums; a row's element `i` goes to lane `i % LANES`.
    pub(crate) const LANES: usize = 16;

    /// Elements per block: 256 additions per lane, whose rounding error (at most 256 units in
    /// the last place, as a rule far fewer) bounds the sum's, with the pairwise combination's
    /// (one unit per doubling of the row past a block).
    pub(crate) const BLOCK: usize = 4096;

    /// Levels of the pairwise combination: enough for any row `usize` can count.
    const LEVELS: usize = 64 - Self::BLOCK.trailing_zeros() as usize;

    pub(crate) const fn new() -> Self {
        Self { lanes: [0.0; Self::LANES], in_block: 0, levels: [0.0; Self::LEVELS], closed: 0 }
    }

    /// Adds the next `x.len()` elements of the row, a multiple of [`LANES`](Self::LANES).
    #[inline(always)]
    pub(crate) fn add(&mut self, x: &[f32]) {
        self.add_mapped(x, LaneMap::Identity);
    }

    /// Adds `map(x)` for the next `x.len()` elements `x` of the row (a multiple of
    /// [`LANES`](Self::LANES)), with [`add_to_lanes`] block by block.
    #[inline(always)]
    pub(crate) fn add_mapped(&mut self, x: &[f32], map: LaneMap) {
        debug_assert!(x.len().is_multiple_of(Self::LANES));
        self.by_blocks(x.len(), |lanes, piece| add_to_lanes(lanes, &x[piece], map));
    }

    /// Writes `out[i] = f(x[i])` and adds each to the sum, for the next `x.len()` elements of
    /// the row (a multiple of [`LANES`](Self::LANES)): one pass where writing and then
    /// [`add`](Self::add)ing the written values take two, with the same additions in the same
    /// order (the same bits).
    #[inline(always)]
    pub(crate) fn add_written(&mut self, f: impl Fn(f32) -> f32, x: &[f32], out: &mut [f32]) {
        debug_assert!(x.len().is_multiple_of(Self::LANES) && out.len() == x.len());
        self.by_blocks(x.len(), |lanes, piece| {
            let (written, now) = (&mut out[piece.clone()], &x[piece]);
            for (o, x) in written.chunks_exact_mut(Self::LANES).zip(now.chunks_exact(Self::LANES)) {
                for ((lane, o), &x) in lanes.iter_mut().zip(o).zip(x) {
                    *o = f(x);
                    *lane += *o;
                }
            }
        });
    }

    /// Adds `count` (a multiple of [`LANES`](Self::LANES)) copies of `x`.
    pub(crate) fn add_constant(&mut self, x: f32, count: usize) {
        debug_assert!(count.is_multiple_of(Self::LANES));
        self.by_blocks(count, |lanes, piece| {
            for _ in 0..piece.len() / Self::LANES {
                for lane in lanes.iter_mut() {
                    *lane += x;
                }
            }
        });
    }

    /// Takes the row's next `len` elements (a multiple of [`LANES`](Self::LANES)) in pieces
    /// that end where blocks end: `add(lanes, piece)` adds the elements at `piece` (positions
    /// from the first of the `len`) to the open block's lanes, each piece after closing a full
    /// block. What [`add_mapped`](Self::add_mapped), [`add_written`](Self::add_written) and
    /// [`add_constant`](Self::add_constant) share.
    #[inline(always)]
    fn by_blocks(&mut self, len: usize, mut add: impl FnMut(&mut [f32; Self::LANES], std::ops::Range<usize>)) {
        let mut start = 0;
        while start < len {
            let take = self.room().min(len - start);
            add(&mut self.lanes, start..start + take);
            self.in_block += take;
            start += take;
        }
    }

    /// The sum of a whole row: `map(x)` for `x` (a multiple of [`LANES`](Self::LANES)), then
    /// `rest` (already mapped), as a `LaneSum` that adds `x` and finishes with `rest` gives it,
    /// bit for bit. A row of one block (the common case) is added in 16 lanes alone, without
    /// the blocks' state, which made `layer_norm`'s rows 4-8% slower.
    #[inline(always)]
    pub(crate) fn of_row(x: &[f32], map: LaneMap, rest: &[f32]) -> f32 {
        if x.len() <= Self::BLOCK {
            let mut lanes = [0.0f32; Self::LANES];
            add_to_lanes(&mut lanes, x, map);
            return Self::combined(&mut lanes) + rest_sum(rest);
        }
        let mut sum = Self::new();
        sum.add_mapped(x, map);
        sum.finish(rest)
    }

    /// Elements the open block takes before it is full, closing a full one first.
    #[inline(always)]
    fn room(&mut self) -> usize {
        if self.in_block == Self::BLOCK {
            self.close_block();
        }
        Self::BLOCK - self.in_block
    }

    /// Closes the full open block: its sum joins the pairwise combination of closed blocks.
    #[cold]
    #[inline(never)]
    fn close_block(&mut self) {
        let mut sum = Self::combined(&mut self.lanes);
        self.lanes = [0.0; Self::LANES];
        self.in_block = 0;
        // Carried up the levels as in a binary counter: two sums of `2^l` blocks each make one
        // of `2^(l + 1)`.
        let mut level = 0;
        while self.closed >> level & 1 == 1 {
            sum += self.levels[level];
            level += 1;
        }
        self.levels[level] = sum;
        self.closed += 1;
    }

    /// The lanes added pairwise, so that the combination vectorizes too.
    #[inline(always)]
    fn combined(lanes: &mut [f32; Self::LANES]) -> f32 {
        let mut width = Self::LANES / 2;
        while width > 0 {
            for i in 0..width {
                lanes[i] += lanes[i + width];
            }
            width /= 2;
        }
        lanes[0]
    }

    /// The row's sum, given its last fewer-than-[`LANES`](Self::LANES) elements: the open
    /// block's, then the closed blocks' from the smallest combination up, then the rest.
    #[inline(always)]
    pub(crate) fn finish(mut self, rest: &[f32]) -> f32 {
        let mut sum = Self::combined(&mut self.lanes);
        if self.closed != 0 {
            sum = self.finish_closed(sum);
        }
        sum + rest_sum(rest)
    }

    /// `open` (the open block's sum) and the closed blocks' sums, smallest first.
    #[cold]
    #[inline(never)]
    fn finish_closed(&self, open: f32) -> f32 {
        let mut sum = open;
        for level in 0..Self::LEVELS {
            if self.closed >> level & 1 == 1 {
                sum += self.levels[level];
            }
        }
        sum
    }
}

/// `lanes += map(x)` for `x` (a multiple of [`LaneSum::LANES`]), element `i` to lane `i % 16`.
///
/// The lanes are 16 floats, one AVX-512 register: on processors with AVX-512 the loop is
/// written with its instructions, since the compiler vectorises this loop over 16 lanes with
/// four 128-bit registers (2.7 times slower, measured). The same operations in the same order
/// either way: the same bits.
#[inline(always)]
fn add_to_lanes(lanes: &mut [f32; LaneSum::LANES], x: &[f32], map: LaneMap) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the processor has AVX-512F, checked just above.
        unsafe { add_lanes_avx512(lanes, x, map) };
        return;
    }
    for chunk in x.chunks_exact(LaneSum::LANES) {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += map.apply(x);
        }
    }
}

/// The last fewer-than-[`LaneSum::LANES`] elements of a row, added in order from +0.
#[inline(always)]
fn rest_sum(rest: &[f32]) -> f32 {
    rest.iter().fold(0.0, |acc, &x| acc + x)
}

/// What [`LaneSum::add_mapped`] adds for each element `x`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LaneMap {
    /// `x`.
    Identity,
    /// `(x - mean)^2`, the terms of a variance.
    CentredSquare(f32),
}

impl LaneMap {
    #[inline(always)]
    pub(crate) fn apply(self, x: f32) -> f32 {
        match self {
            Self::Identity => x,
            Self::CentredSquare(mean) => {
                let c = sub(x, mean);
                mul(c, c)
            }
        }
    }
}

/// `lanes += map(x)`, 16 values at a time, for [`add_to_lanes`].
///
/// # Safety
/// The processor has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_lanes_avx512(lanes: &mut [f32; LaneSum::LANES], x: &[f32], map: LaneMap) {
    use std::arch::x86_64::*;
    // SAFETY: loads and stores of 16 floats inside `lanes` and inside each whole chunk of `x`.
    unsafe {
        let mut acc = _mm512_loadu_ps(lanes.as_ptr());
        match map {
            LaneMap::Identity => {
                for chunk in x.chunks_exact(16) {
                    acc = _mm512_add_ps(acc, _mm512_loadu_ps(chunk.as_ptr()));
                }
            }
            LaneMap::CentredSquare(mean) => {
                let mean = _mm512_set1_ps(mean);
                for chunk in x.chunks_exact(16) {
                    let c = _mm512_sub_ps(_mm512_loadu_ps(chunk.as_ptr()), mean);
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(c, c));
                }
            }
        }
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
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

    /// Long rows of varied values are summed within a few parts in 10^7 of the exact sum (16
    /// running sums, without blocks, were 1.2e-3 off over 2^26 values like these), for lengths
    /// on and off the block boundaries (`row_sum` takes the AVX-512 loop or the portable one,
    /// whichever the processor has: the same additions).
    #[test]
    fn long_rows_sum_to_within_a_few_parts_in_ten_million() {
        use super::LaneSum;
        let block = LaneSum::BLOCK;
        for len in [block - 1, block, block + 16, 3 * block + 5, 1 << 20, (1 << 22) + 7, 1 << 24] {
            // Positive values (no cancellation: the relative error is the rounding's).
            let row: Vec<f32> = (0..len).map(|i| 0.1 + ((i * 7919) % 1000) as f32 * 1e-4).collect();
            let exact: f64 = row.iter().map(|&x| f64::from(x)).sum();
            let got = f64::from(super::row_sum(&row));
            assert!((got / exact - 1.0).abs() < 4e-7, "{len}: {got} against {exact}");
        }
    }

    /// A row added in pieces (a fused region's tiles: multiples of 16 values, boundaries
    /// anywhere relative to the blocks) gives the bits of the row added whole, whichever of
    /// `add`, `add_written` and `add_constant` adds each piece.
    #[test]
    fn a_row_added_in_pieces_across_blocks_gives_the_bits_of_the_whole_row() {
        use super::LaneSum;
        let len = 3 * LaneSum::BLOCK + 16 * 37 + 9;
        let row: Vec<f32> = (0..len).map(|i| ((i * 31) % 97) as f32 * 0.013 - 0.6).collect();
        let whole = super::row_sum(&row);
        let full = len - len % LaneSum::LANES;
        for piece in [16, 48, 1024, 4080, 4096, 4112, 9000 / 16 * 16] {
            let (mut added, mut written) = (LaneSum::new(), LaneSum::new());
            let mut out = vec![0.0; full];
            for (start, chunk) in (0..full).step_by(piece).zip(row[..full].chunks(piece)) {
                added.add(chunk);
                written.add_written(|x| x, chunk, &mut out[start..start + chunk.len()]);
            }
            assert_eq!(added.finish(&row[full..]).to_bits(), whole.to_bits(), "pieces of {piece}");
            assert_eq!(written.finish(&row[full..]).to_bits(), whole.to_bits(), "written in pieces of {piece}");
            assert_eq!(out, row[..full], "written values, pieces of {piece}");
        }
        // A constant row, added as constants in pieces and as values whole.
        let constant = vec![0.37f32; len];
        let mut added = LaneSum::new();
        for start in (0..full).step_by(4112) {
            added.add_constant(0.37, (full - start).min(4112));
        }
        assert_eq!(added.finish(&constant[full..]).to_bits(), super::row_sum(&constant).to_bits());
    }

    /// Rows of one block or less are added as before blocks (16 lanes, combined pairwise, then
    /// the rest): their bits do not depend on the block.
    #[test]
    fn rows_of_one_block_are_added_in_sixteen_lanes() {
        use super::LaneSum;
        for len in [0, 1, 15, 16, 17, 1000, LaneSum::BLOCK - 3, LaneSum::BLOCK] {
            let row: Vec<f32> = (0..len).map(|i| ((i * 13) % 29) as f32 * 0.11 - 1.3).collect();
            let full = len - len % 16;
            let mut lanes = [0.0f32; 16];
            for chunk in row[..full].chunks_exact(16) {
                for (lane, &x) in lanes.iter_mut().zip(chunk) {
                    *lane += x;
                }
            }
            for width in [8, 4, 2, 1] {
                for i in 0..width {
                    lanes[i] += lanes[i + width];
                }
            }
            let rest = row[full..].iter().fold(0.0f32, |acc, &x| acc + x);
            assert_eq!(super::row_sum(&row).to_bits(), (lanes[0] + rest).to_bits(), "{len}");
            // `row_sum` takes a shortcut for one block (`LaneSum::of_row`); a `LaneSum`, as
            // a fused region's tiles use, gives the same bits.
            let mut tiles = LaneSum::new();
            for tile in row[..full].chunks(48) {
                tiles.add(tile);
            }
            assert_eq!(tiles.finish(&row[full..]).to_bits(), (lanes[0] + rest).to_bits(), "{len} in tiles");
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
        for x in [0.0, f32::NAN, 100.0, f32::INFINITY, -200.0, f32::NEG_INFINITY, 88.72, -103.9, -90.0] {
            let (fused, plain) = (super::exp_fused(x), super::exp(x));
            assert!(
                fused == plain || (fused.is_nan() && plain.is_nan()) || ((fused - plain) / plain).abs() < 2.5e-7,
                "{x}"
            );
        }
    }
}

#[cfg(test)]
mod accuracy {
    /// Distance in units in the last place between `got` and the f32 nearest to `want`.
    pub(super) fn ulps(got: f32, want: f64) -> u32 {
        let want = want as f32;
        if got == want || (got.is_nan() && want.is_nan()) {
            return 0;
        }
        let key = |x: f32| {
            let b = x.to_bits() as i64;
            if b < 0x8000_0000 {
                b
            } else {
                0x8000_0000 - b
            }
        };
        (key(got) - key(want)).unsigned_abs().min(u32::MAX as u64) as u32
    }

    /// Every 97th f32 between `lo` and `hi` (both finite, same sign handled by walking bits).
    pub(super) fn sweep(lo: f32, hi: f32) -> impl Iterator<Item = f32> {
        let mut x = lo;
        std::iter::from_fn(move || {
            if x > hi {
                return None;
            }
            let here = x;
            let bits = x.to_bits();
            x = if x >= 0.0 {
                f32::from_bits(bits + 97)
            } else if bits - 97 > 0x8000_0000 {
                f32::from_bits(bits - 97)
            } else {
                0.0
            };
            Some(here)
        })
    }

    /// The accuracy the docs state, on every 97th float of each function's range (about 20
    /// million inputs each): measured worst 1 ulp for `exp`, `exp_fused`, `log` and `tanh`, 2
    /// for `sigmoid` (near 0; the same with `exp`).
    #[test]
    fn exp_log_and_tanh_are_within_their_stated_ulps_of_the_exact_value() {
        for (name, f, exact, lo, hi, bound) in [
            ("exp", super::exp as fn(f32) -> f32, f64::exp as fn(f64) -> f64, -87.0f32, 88.7f32, 1),
            ("exp_fused", super::exp_fused, f64::exp, -87.0, 88.7, 1),
            ("log", super::log, f64::ln, 1e-44, 3e38, 1),
            ("tanh", super::tanh, f64::tanh, -20.0, 20.0, 2),
            ("sigmoid", super::sigmoid, |x| 1.0 / (1.0 + (-x).exp()), -87.0, 40.0, 2),
        ] {
            let (worst, at) = sweep(lo, hi).map(|x| (ulps(f(x), exact(x as f64)), x)).max_by_key(|w| w.0).unwrap();
            assert!(worst <= bound, "{name}: {worst} ulps at {at:e}, more than the {bound} stated");
        }
    }
}
