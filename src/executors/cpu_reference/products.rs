//! Matrix products on the CPU: a packed, register-blocked product in the manner of BLIS and the
//! `gemm` crate. `b` is packed in panels of [`NR`] columns (`KC` rows deep, `NC` columns wide),
//! `a` in panels of [`MR`] rows, into packing buffers each thread makes once (about 1.1 MB, on
//! its first product) and keeps, so that steady-state runs allocate nothing, and an `MR x NR`
//! block of the result is kept in
//! registers while the panels stream through, compiled for each instruction set the processor
//! may have (AVX-512, AVX2 with FMA, ...).
//!
//! Every element of the result is one chain of fused multiply-adds over `k` in order, starting
//! from zero: `out[i][j] = fma(a[i][k-1], b[k-1][j], ... fma(a[i][0], b[0][j], 0))`. So the
//! result does not depend on the blocking, on which rows a thread computes, or on the number of
//! threads: it is the same bits for every split (`products_are_the_same_bits_for_every_split`).
//!
//! Why not a crate: `gemm` 0.19 and `matrixmultiply` 0.3 (the products candle and ndarray use)
//! allocate their packing buffers on every call and take no scratch from the caller, which would
//! break the promise that steady-state runs allocate nothing; on this project's CPU machine this
//! kernel ran at 0.7-1.07x `gemm`'s single-threaded speed side by side (1.0-1.07x at [1024]^3,
//! 0.8x at [64, 256] x [256, 256], 0.7-0.9x at [512, 768] x [768, 3072]).

use std::cell::RefCell;
use std::ops::Range;

use multiversion::multiversion;

/// Rows of the register block.
const MR: usize = 6;
/// Columns of the register block (two AVX2 vectors, one AVX-512 vector).
const NR: usize = 16;
/// Depth of a packed panel: `KC x NR` of `b` stays in L1.
const KC: usize = 256;
/// Rows of `a` packed at once: `MC x KC` stays in L2.
const MC: usize = 96;
/// Columns of `b` packed at once: `KC x NC` stays in L3.
const NC: usize = 1024;

/// A thread's packing buffers: `MC x KC` of `a` and `KC x NC` of `b`, the most any product
/// packs at once.
struct Packs {
    a: Vec<f32>,
    b: Vec<f32>,
}

thread_local! {
    /// This thread's packing buffers, made on its first product.
    static PACKS: RefCell<Option<Packs>> = const { RefCell::new(None) };
}

/// How `b` is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BLayout {
    /// `[k, n]`, row-major.
    Rows,
    /// `[n, k]`, row-major: read transposed (`linear`'s weight, `matmul_transposed`).
    Transposed,
}

/// Rows `rows` of `a @ b (+ bias)` into `out`, which holds exactly those rows: `a` is `[m, k]`
/// row-major, `b` is `[k, n]` or `[n, k]` as `layout` says, `bias` (`[n]`) is added to each
/// element after its chain, as it is written.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_rows(
    a: &[f32],
    b: &[f32],
    layout: BLayout,
    bias: Option<&[f32]>,
    out: &mut [f32],
    rows: Range<usize>,
    k: usize,
    n: usize,
) {
    if n == 0 || rows.is_empty() {
        return;
    }
    if k == 0 {
        for row in out.chunks_exact_mut(n) {
            match bias {
                Some(bias) => row.copy_from_slice(&bias[..n]),
                None => row.fill(0.0),
            }
        }
        return;
    }
    let a = &a[rows.start * k..rows.end * k];
    PACKS.with(|packs| {
        let mut packs = packs.borrow_mut();
        let packs =
            packs.get_or_insert_with(|| Packs { a: vec![0.0; MC.div_ceil(MR) * MR * KC], b: vec![0.0; NC * KC] });
        product(a, b, layout, bias, out, rows.len(), k, n, &mut packs.a, &mut packs.b);
    });
}

/// `out[m, n] = a[m, k] @ b`, with `a_pack` and `b_pack` as scratch.
#[allow(clippy::too_many_arguments)]
#[multiversion(targets = "simd")]
fn product(
    a: &[f32],
    b: &[f32],
    layout: BLayout,
    bias: Option<&[f32]>,
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    a_pack: &mut [f32],
    b_pack: &mut [f32],
) {
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        let column_panels = nc.div_ceil(NR);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            pack_b(b, layout, b_pack, j0, nc, p0, kc, k, n);
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                let row_panels = mc.div_ceil(MR);
                pack_a(a, a_pack, i0, mc, p0, kc, k);
                for jp in 0..column_panels {
                    let cols = NR.min(nc - jp * NR);
                    let bp = &b_pack[jp * kc * NR..(jp + 1) * kc * NR];
                    for ip in 0..row_panels {
                        let block_rows = MR.min(mc - ip * MR);
                        let ap = &a_pack[ip * kc * MR..(ip + 1) * kc * MR];
                        let at = (i0 + ip * MR) * n + j0 + jp * NR;
                        // The chains go on from what the previous panels of `k` left.
                        let mut acc = [[0f32; NR]; MR];
                        if p0 > 0 {
                            for (i, row) in acc.iter_mut().enumerate().take(block_rows) {
                                row[..cols].copy_from_slice(&out[at + i * n..][..cols]);
                            }
                        }
                        block(kc, ap, bp, &mut acc);
                        let last = p0 + kc == k;
                        for (i, row) in acc.iter().enumerate().take(block_rows) {
                            let dst = &mut out[at + i * n..][..cols];
                            match bias.filter(|_| last) {
                                Some(bias) => {
                                    let bias = &bias[j0 + jp * NR..][..cols];
                                    for ((o, &c), &x) in dst.iter_mut().zip(&row[..cols]).zip(bias) {
                                        *o = c + x;
                                    }
                                }
                                None => dst.copy_from_slice(&row[..cols]),
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The register block: `acc += a_panel @ b_panel` over `kc`, one fused multiply-add per
/// element and step.
#[inline(always)]
fn block(kc: usize, a_panel: &[f32], b_panel: &[f32], acc: &mut [[f32; NR]; MR]) {
    for (av, bv) in a_panel.chunks_exact(MR).zip(b_panel.chunks_exact(NR)).take(kc) {
        for (row, &x) in acc.iter_mut().zip(av) {
            for (c, &y) in row.iter_mut().zip(bv) {
                *c = x.mul_add(y, *c);
            }
        }
    }
}

/// Packs `b[p0..p0 + kc, j0..j0 + nc]` into panels of `NR` columns (`kc x NR` each, row by
/// row), zero-padded past `nc`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pack_b(
    b: &[f32],
    layout: BLayout,
    pack: &mut [f32],
    j0: usize,
    nc: usize,
    p0: usize,
    kc: usize,
    k: usize,
    n: usize,
) {
    let panels = nc.div_ceil(NR);
    for jp in 0..panels {
        let cols = NR.min(nc - jp * NR);
        let first = j0 + jp * NR;
        let panel = &mut pack[jp * kc * NR..(jp + 1) * kc * NR];
        for (p, dst) in panel.chunks_exact_mut(NR).enumerate() {
            match layout {
                BLayout::Rows => dst[..cols].copy_from_slice(&b[(p0 + p) * n + first..][..cols]),
                BLayout::Transposed => {
                    for (jj, d) in dst[..cols].iter_mut().enumerate() {
                        *d = b[(first + jj) * k + p0 + p];
                    }
                }
            }
            dst[cols..].fill(0.0);
        }
    }
}

/// Packs `a[i0..i0 + mc, p0..p0 + kc]` into panels of `MR` rows (`kc x MR` each, column by
/// column), zero-padded past `mc`.
#[inline(always)]
fn pack_a(a: &[f32], pack: &mut [f32], i0: usize, mc: usize, p0: usize, kc: usize, k: usize) {
    let panels = mc.div_ceil(MR);
    for ip in 0..panels {
        let rows = MR.min(mc - ip * MR);
        let panel = &mut pack[ip * kc * MR..(ip + 1) * kc * MR];
        for ii in 0..MR {
            if ii < rows {
                let row = &a[(i0 + ip * MR + ii) * k + p0..][..kc];
                for (p, &x) in row.iter().enumerate() {
                    panel[p * MR + ii] = x;
                }
            } else {
                for p in 0..kc {
                    panel[p * MR + ii] = 0.0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a @ b` by the definition, each element one chain of fused multiply-adds in `k` order.
    fn by_definition(a: &[f32], b: &[f32], layout: BLayout, m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut c = 0f32;
                for p in 0..k {
                    let y = match layout {
                        BLayout::Rows => b[p * n + j],
                        BLayout::Transposed => b[j * k + p],
                    };
                    c = a[i * k + p].mul_add(y, c);
                }
                out[i * n + j] = c;
            }
        }
        out
    }

    #[test]
    fn products_are_the_same_bits_for_every_split() {
        // Shapes across the block edges: partial register blocks, several panels of k, of rows
        // and of columns.
        for &(m, k, n) in &[(1, 1, 1), (7, 3, 17), (13, 300, 33), (100, 513, 40), (6, 256, 1030), (200, 5, 3)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0).collect();
            for layout in [BLayout::Rows, BLayout::Transposed] {
                let expected = by_definition(&a, &b, layout, m, k, n);
                for parts in [1, 2, 3, 7] {
                    let mut out = vec![f32::NAN; m * n];
                    let mut row = 0;
                    for part in 0..parts {
                        let end = (m * (part + 1)) / parts;
                        matmul_rows(&a, &b, layout, None, &mut out[row * n..end * n], row..end, k, n);
                        row = end;
                    }
                    let same = out.iter().zip(&expected).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{m}x{k}x{n} {layout:?} in {parts} parts differs from the definition");
                }
                // A bias is added once, after each element's chain.
                let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 1.0).collect();
                let mut out = vec![f32::NAN; m * n];
                matmul_rows(&a, &b, layout, Some(&bias), &mut out, 0..m, k, n);
                let with_bias = expected.iter().enumerate().map(|(i, &e)| e + bias[i % n]);
                assert!(out.iter().zip(with_bias).all(|(x, y)| x.to_bits() == y.to_bits()), "{m}x{k}x{n} bias");
            }
        }
    }

    #[test]
    fn empty_depth_gives_zeros_and_specials_propagate() {
        let mut out = vec![f32::NAN; 6];
        matmul_rows(&[], &[], BLayout::Rows, None, &mut out, 0..2, 0, 3);
        assert_eq!(out, vec![0.0; 6]);
        let a = [f32::INFINITY, 1.0, 2.0, 0.0];
        let b = [0.0, 1.0, 1.0, 1.0];
        let mut out = vec![0.0; 4];
        matmul_rows(&a, &b, BLayout::Rows, None, &mut out, 0..2, 2, 2);
        assert!(out[0].is_nan(), "inf * 0 is NaN, as in PyTorch");
        assert_eq!(out[1], f32::INFINITY);
        assert_eq!(&out[2..], &[0.0, 2.0]);
    }
}
