//! The CPU executors' inner loops, compiled once per vector instruction set and chosen at run
//! time: AVX-512, AVX2 + FMA, SSE4.1 on x86-64, NEON on AArch64, plain code elsewhere.
//!
//! Why `multiversion`: the scalar functions in [`math`](super::math) are written so that
//! loops over them vectorize (branch-free `exp`, `tanh`, `log`, comparisons as selects), so the
//! only thing missing for wide vectors was compiling those loops for wider instruction sets and
//! picking the widest the processor has. `multiversion` does exactly that for plain Rust code,
//! with the choice made once and cached in an atomic, so no op needs hand-written intrinsics
//! and one binary runs everywhere. Rust never contracts `a * b + c` into a fused multiply-add on
//! its own, so every version computes bit-identical results: a plan gives the same numbers on
//! every machine.
//!
//! Each function takes a scalar function item (a zero-sized type) so that its loop is
//! monomorphized per op and the arithmetic inlined into each instruction-set version.

use multiversion::multiversion;

/// Below this many elements a loop runs as plain code on the calling instruction set: picking
/// a version costs more than wide vectors save there (the dispatch benchmark's 1-element ops).
const SHORT: usize = 16;

/// `out[i] = f(x[i])`.
#[inline(always)]
pub(crate) fn map_unary<F: Fn(f32) -> f32>(f: F, x: &[f32], out: &mut [f32]) {
    if let ([o], [v]) = (&mut *out, x) {
        // One value (a loss, a step count, a learning rate): no loop to set up.
        *o = f(*v);
    } else if out.len() < SHORT {
        unary_loop(&f, x, out)
    } else {
        map_unary_wide(f, x, out)
    }
}

/// [`unary_loop`], one version per instruction set.
#[multiversion(targets = "simd")]
fn map_unary_wide<F: Fn(f32) -> f32>(f: F, x: &[f32], out: &mut [f32]) {
    unary_loop(&f, x, out)
}

/// The loop of [`map_unary`], inlined into each instruction set's version.
#[inline(always)]
fn unary_loop<F: Fn(f32) -> f32>(f: &F, x: &[f32], out: &mut [f32]) {
    // Indexed over slices of one length (what `zip` does, without its setup for short loops).
    let n = out.len().min(x.len());
    let (x, out) = (&x[..n], &mut out[..n]);
    for i in 0..n {
        out[i] = f(x[i]);
    }
}

/// `out[i] = f(a[i], b[i])`.
#[inline(always)]
pub(crate) fn map_binary<F: Fn(f32, f32) -> f32>(f: F, a: &[f32], b: &[f32], out: &mut [f32]) {
    if let ([o], [x], [y]) = (&mut *out, a, b) {
        // As in `map_unary`.
        *o = f(*x, *y);
    } else if out.len() < SHORT {
        binary_loop(&f, a, b, out)
    } else {
        map_binary_wide(f, a, b, out)
    }
}

/// [`binary_loop`], one version per instruction set.
#[multiversion(targets = "simd")]
fn map_binary_wide<F: Fn(f32, f32) -> f32>(f: F, a: &[f32], b: &[f32], out: &mut [f32]) {
    binary_loop(&f, a, b, out)
}

/// The loop of [`map_binary`], inlined into each instruction set's version.
#[inline(always)]
fn binary_loop<F: Fn(f32, f32) -> f32>(f: &F, a: &[f32], b: &[f32], out: &mut [f32]) {
    // As in `unary_loop`.
    let n = out.len().min(a.len()).min(b.len());
    let (a, b, out) = (&a[..n], &b[..n], &mut out[..n]);
    for i in 0..n {
        out[i] = f(a[i], b[i]);
    }
}

/// `out[i] = f(a[i], b)`: a unary loop over `a`.
#[inline(always)]
pub(crate) fn map_binary_scalar_right<F: Fn(f32, f32) -> f32>(f: F, a: &[f32], b: f32, out: &mut [f32]) {
    map_unary(move |x| f(x, b), a, out)
}

/// `out[i] = f(a, b[i])`: a unary loop over `b`.
#[inline(always)]
pub(crate) fn map_binary_scalar_left<F: Fn(f32, f32) -> f32>(f: F, a: f32, b: &[f32], out: &mut [f32]) {
    map_unary(move |y| f(a, y), b, out)
}

/// The sum of each row of `rows` (rows of `n > 0` elements) into `out`, as
/// [`math::row_sum`](super::math::row_sum) adds them.
#[multiversion(targets = "simd")]
pub(crate) fn row_sums(rows: &[f32], n: usize, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(n)) {
        *o = super::math::row_sum(row);
    }
}

/// Adds `x` (a multiple of 16 elements) to a row's partial sums.
#[multiversion(targets = "simd")]
pub(crate) fn add_to_lanes(sum: &mut super::math::LaneSum, x: &[f32]) {
    sum.add(x);
}

/// The largest element of each row of `rows` (rows of `n > 0` elements) into `out`: NaN if
/// the row holds one.
#[multiversion(targets = "simd")]
pub(crate) fn row_maxima(rows: &[f32], n: usize, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(n)) {
        *o = super::math::row_max(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executors::math;

    /// Inputs that cover every branch of the math: normal, tiny, huge, signed zeros, specials.
    fn awkward_inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-3000..3000).map(|i| i as f32 * 0.037).collect();
        v.extend([0.0, -0.0, 1e-30, -1e-30, 1e-45, 3e38, -3e38, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        v.extend((0..200).map(|i| f32::from_bits(0x0000_1000 + i * 7919)));
        v
    }

    #[test]
    fn every_instruction_set_computes_what_the_scalar_function_computes() {
        let x = awkward_inputs();
        let mut out = vec![0.0; x.len()];
        type Unary = fn(f32) -> f32;
        let ops: [(&str, Unary); 7] = [
            ("exp", math::exp),
            ("log", math::log),
            ("tanh", math::tanh),
            ("sigmoid", math::sigmoid),
            ("gelu", math::gelu),
            ("relu", math::relu),
            ("neg", math::neg),
        ];
        for (name, f) in ops {
            map_unary(f, &x, &mut out);
            for (&v, &o) in x.iter().zip(&out) {
                // Called one element at a time through `black_box`, the scalar function runs
                // unvectorized: the vector loop must give the same bits.
                let want = f(std::hint::black_box(v));
                assert!(
                    o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()),
                    "{name}({v:e}) = {o:e}, not {want:e}"
                );
            }
        }
        let y: Vec<f32> = x.iter().rev().copied().collect();
        map_binary(math::maximum, &x, &y, &mut out);
        for ((&a, &b), &o) in x.iter().zip(&y).zip(&out) {
            let want = math::maximum(std::hint::black_box(a), b);
            assert!(o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()));
        }
    }

    #[test]
    fn reductions_match_the_scalar_row_functions() {
        let rows: Vec<f32> = (0..37 * 5).map(|i| ((i * 31) % 17) as f32 * 0.1 - 0.7).collect();
        let (mut sums, mut maxima) = (vec![0.0; 5], vec![0.0; 5]);
        row_sums(&rows, 37, &mut sums);
        row_maxima(&rows, 37, &mut maxima);
        for (r, row) in rows.chunks_exact(37).enumerate() {
            assert_eq!(sums[r], math::row_sum(std::hint::black_box(row)));
            assert_eq!(maxima[r], math::row_max(std::hint::black_box(row)));
            let exact: f64 = row.iter().map(|&x| x as f64).sum();
            assert!((sums[r] as f64 - exact).abs() < 1e-5);
        }
    }
}
