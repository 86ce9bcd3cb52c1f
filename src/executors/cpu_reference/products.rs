//! Matrix products on the CPU: a packed, register-blocked product in the manner of BLIS and the
//! `gemm` crate. `b` is packed in panels of `NR` columns (`KC` rows deep, `NC` columns wide),
//! `a` in panels of `MR` rows, into packing buffers each thread makes once (about 1.1 MB, on
//! its first product) and keeps, so that steady-state runs allocate nothing, and an `MR x NR`
//! block of the result is kept in registers while the panels stream through.
//!
//! The register block is written per instruction set, chosen when the product runs: 12 x 32 on
//! AVX-512 (24 accumulating registers, enough fused multiply-adds in flight for two FMA units),
//! 6 x 16 on AVX2 with FMA (12), and a portable 6 x 16 that the compiler vectorises for anything
//! else. Packing transposes 16 x 16 tiles in registers on AVX-512, since `linear` packs its
//! `[out, in]` weight transposed on every run.
//!
//! Every element of the result is one chain of fused multiply-adds over `k` in order, starting
//! from zero: `out[i][j] = fma(a[i][k-1], b[k-1][j], ... fma(a[i][0], b[0][j], 0))`. So the
//! result does not depend on the blocking, on the instruction set, on which rows or columns a
//! thread computes, or on the number of threads: it is the same bits for every split and every
//! block (`products_are_the_same_bits_for_every_split_and_every_block`).
//!
//! Why not a crate: `gemm` 0.19 and `matrixmultiply` 0.3 (the products candle and ndarray use)
//! allocate their packing buffers on every call and take no scratch from the caller (read again
//! in `gemm-common` 0.19: `MemBuffer::new` and `vec!` per call), which would break the promise
//! that steady-state runs allocate nothing; `gemm` also splits its work over `rayon`, beside the
//! CPU executors' own worker threads. Single-threaded, this kernel runs at PyTorch's (MKL's)
//! speed on an AVX-512 machine (about 100 GFLOP/s a core at 1024^3, side by side).

use std::cell::RefCell;
use std::ops::Range;

use multiversion::multiversion;

/// Depth of a packed panel: `KC x NR` of `b` stays in L1.
const KC: usize = 256;
/// Rows of `a` packed at once (a multiple of every kernel's `MR`): `MC x KC` stays in L2.
const MC: usize = 96;
/// Columns of `b` packed at once (a multiple of every kernel's `NR`): `KC x NC` stays in L3.
const NC: usize = 1024;

/// A register block: an `MR x NR` block of the result kept in registers while packed panels of
/// `a` (`kc x MR`, column by column) and `b` (`kc x NR`, row by row) stream through.
trait RegisterBlock {
    /// Rows of the block.
    const MR: usize;
    /// Columns of the block.
    const NR: usize;

    /// `c[MR x NR] = c (if `continuing`, else 0) + a_panel @ b_panel` over `kc`, one fused
    /// multiply-add per element and step in `k` order; then `bias` (`NR` values) is added to
    /// each element. `c` starts at the block's first element, rows `ldc` apart.
    ///
    /// # Safety
    /// `c` is valid for `MR` rows of `NR` values `ldc` apart, the panels hold `kc` steps, and the
    /// processor has the instructions the implementation was compiled for.
    unsafe fn run(
        kc: usize,
        a_panel: &[f32],
        b_panel: &[f32],
        c: *mut f32,
        ldc: usize,
        continuing: bool,
        bias: Option<&[f32]>,
    );

    /// Writes `panel[p * width + j] = rows[j * stride + p]` for `j < count` and `p < kc`, and
    /// zeros for `count <= j < width`: `count` rows of `kc` values, `stride` apart, transposed
    /// into a packed panel (`a`'s panels, and `b`'s when `b` is stored transposed).
    #[inline(always)]
    fn pack_transposed(rows: &[f32], stride: usize, count: usize, kc: usize, width: usize, panel: &mut [f32]) {
        transpose_scalar(rows, stride, 0..count, 0..kc, width, panel);
        for j in count..width {
            for p in 0..kc {
                panel[p * width + j] = 0.0;
            }
        }
    }
}

/// `panel[p * width + j] = rows[j * stride + p]` for `j` in `js` and `p` in `ps`.
#[inline(always)]
fn transpose_scalar(rows: &[f32], stride: usize, js: Range<usize>, ps: Range<usize>, width: usize, panel: &mut [f32]) {
    for j in js {
        let row = &rows[j * stride..][ps.clone()];
        for (p, &x) in ps.clone().zip(row) {
            panel[p * width + j] = x;
        }
    }
}

/// The portable block, 6 x 16 (two AVX2 vectors a row), vectorised by the compiler for each
/// instruction set `multiversion` compiles [`product_portable`] for.
struct Portable;

impl RegisterBlock for Portable {
    const MR: usize = 6;
    const NR: usize = 16;

    #[inline(always)]
    unsafe fn run(
        kc: usize,
        a_panel: &[f32],
        b_panel: &[f32],
        c: *mut f32,
        ldc: usize,
        continuing: bool,
        bias: Option<&[f32]>,
    ) {
        const MR: usize = Portable::MR;
        const NR: usize = Portable::NR;
        let mut acc = [[0f32; NR]; MR];
        if continuing {
            for (i, row) in acc.iter_mut().enumerate() {
                // SAFETY: the caller promises MR rows of NR values, ldc apart.
                row.copy_from_slice(unsafe { std::slice::from_raw_parts(c.add(i * ldc), NR) });
            }
        }
        for (av, bv) in a_panel.chunks_exact(MR).zip(b_panel.chunks_exact(NR)).take(kc) {
            for (row, &x) in acc.iter_mut().zip(av) {
                for (c, &y) in row.iter_mut().zip(bv) {
                    *c = x.mul_add(y, *c);
                }
            }
        }
        for (i, row) in acc.iter_mut().enumerate() {
            if let Some(bias) = bias {
                for (c, &x) in row.iter_mut().zip(bias) {
                    *c += x;
                }
            }
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), NR) }.copy_from_slice(row);
        }
    }
}

/// The AVX-512 block, 12 x 32: 24 of the 32 vector registers accumulate, so that enough fused
/// multiply-adds are in flight to hide their latency (a 6 x 16 block keeps only 6 in flight on
/// AVX-512, a third of what two FMA units need).
#[cfg(target_arch = "x86_64")]
struct Avx512;

#[cfg(target_arch = "x86_64")]
impl RegisterBlock for Avx512 {
    const MR: usize = 12;
    const NR: usize = 32;

    #[inline(always)]
    unsafe fn run(
        kc: usize,
        a_panel: &[f32],
        b_panel: &[f32],
        c: *mut f32,
        ldc: usize,
        continuing: bool,
        bias: Option<&[f32]>,
    ) {
        use std::arch::x86_64::*;
        const MR: usize = Avx512::MR;
        debug_assert!(a_panel.len() >= kc * MR && b_panel.len() >= kc * 32);
        // SAFETY: only reached from `product_avx512`, compiled for AVX-512F and called after
        // the processor said it has it; every pointer stays inside the panels (`kc` steps of
        // MR and 32 values) and inside the `MR x 32` block of `c` the caller vouches for.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); 2 * MR];
            if continuing {
                for i in 0..MR {
                    acc[2 * i] = _mm512_loadu_ps(c.add(i * ldc));
                    acc[2 * i + 1] = _mm512_loadu_ps(c.add(i * ldc + 16));
                }
            }
            let (mut a, mut b) = (a_panel.as_ptr(), b_panel.as_ptr());
            for _ in 0..kc {
                let (b0, b1) = (_mm512_loadu_ps(b), _mm512_loadu_ps(b.add(16)));
                for i in 0..MR {
                    let x = _mm512_set1_ps(*a.add(i));
                    acc[2 * i] = _mm512_fmadd_ps(x, b0, acc[2 * i]);
                    acc[2 * i + 1] = _mm512_fmadd_ps(x, b1, acc[2 * i + 1]);
                }
                a = a.add(MR);
                b = b.add(32);
            }
            if let Some(bias) = bias {
                let (x0, x1) = (_mm512_loadu_ps(bias.as_ptr()), _mm512_loadu_ps(bias.as_ptr().add(16)));
                for i in 0..MR {
                    acc[2 * i] = _mm512_add_ps(acc[2 * i], x0);
                    acc[2 * i + 1] = _mm512_add_ps(acc[2 * i + 1], x1);
                }
            }
            for i in 0..MR {
                _mm512_storeu_ps(c.add(i * ldc), acc[2 * i]);
                _mm512_storeu_ps(c.add(i * ldc + 16), acc[2 * i + 1]);
            }
        }
    }

    /// Tiles of 16 rows by 16 values transposed in registers (a linear's weight is packed so on
    /// every run: one scalar move per value made packing cost as much as small products).
    #[inline(always)]
    fn pack_transposed(rows: &[f32], stride: usize, count: usize, kc: usize, width: usize, panel: &mut [f32]) {
        use std::arch::x86_64::*;
        let whole_p = kc / 16 * 16;
        let mut j0 = 0;
        while j0 < width {
            let tile_rows = 16.min(width - j0);
            let present = count.saturating_sub(j0).min(tile_rows);
            // Lanes of a stored row that belong to this panel.
            let mask: __mmask16 = if tile_rows == 16 { 0xffff } else { (1u16 << tile_rows) - 1 };
            for p0 in (0..whole_p).step_by(16) {
                // SAFETY: compiled only into `product_avx512` (AVX-512F); each load reads 16
                // values of row `j0 + j < count` from `p0 < whole_p <= kc`, inside `rows`
                // (checked by the slice below), and each masked store writes `tile_rows` values
                // at `(p0 + i) * width + j0`, inside `panel` (`kc * width` values).
                unsafe {
                    let zero = _mm512_setzero_ps();
                    let mut r = [zero; 16];
                    for (j, r) in r.iter_mut().enumerate().take(present) {
                        let row = &rows[(j0 + j) * stride + p0..][..16];
                        *r = _mm512_loadu_ps(row.as_ptr());
                    }
                    let t = transpose_16x16(r);
                    let out = &mut panel[p0 * width + j0..];
                    assert!(out.len() >= 15 * width + tile_rows);
                    for (i, t) in t.iter().enumerate() {
                        _mm512_mask_storeu_ps(out.as_mut_ptr().add(i * width), mask, *t);
                    }
                }
            }
            transpose_scalar(rows, stride, j0..j0 + present, whole_p..kc, width, panel);
            for j in j0 + present..j0 + tile_rows {
                for p in whole_p..kc {
                    panel[p * width + j] = 0.0;
                }
            }
            j0 += 16;
        }
    }
}

/// The transpose of 16 vectors of 16 values: `out[i]` lane `j` is `rows[j]` lane `i`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn transpose_16x16(r: [std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // SAFETY: register shuffles only; compiled into AVX-512F code alone (see the caller).
    unsafe {
        // Interleave pairs of rows: lanes (r0[0], r1[0], r0[1], r1[1]) per 128-bit lane.
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // 4 x 4 blocks within each 128-bit lane.
        let mut u = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            let (a, b, c, d) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
            u[4 * i] = _mm512_shuffle_ps::<0x44>(a, c);
            u[4 * i + 1] = _mm512_shuffle_ps::<0xee>(a, c);
            u[4 * i + 2] = _mm512_shuffle_ps::<0x44>(b, d);
            u[4 * i + 3] = _mm512_shuffle_ps::<0xee>(b, d);
        }
        // 128-bit lanes across the four groups of four rows.
        let mut v = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            v[i] = _mm512_shuffle_f32x4::<0x88>(u[i], u[4 + i]);
            v[4 + i] = _mm512_shuffle_f32x4::<0xdd>(u[i], u[4 + i]);
            v[8 + i] = _mm512_shuffle_f32x4::<0x88>(u[8 + i], u[12 + i]);
            v[12 + i] = _mm512_shuffle_f32x4::<0xdd>(u[8 + i], u[12 + i]);
        }
        let mut out = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            out[i] = _mm512_shuffle_f32x4::<0x88>(v[i], v[8 + i]);
            out[8 + i] = _mm512_shuffle_f32x4::<0xdd>(v[i], v[8 + i]);
            out[4 + i] = _mm512_shuffle_f32x4::<0x88>(v[4 + i], v[12 + i]);
            out[12 + i] = _mm512_shuffle_f32x4::<0xdd>(v[4 + i], v[12 + i]);
        }
        out
    }
}

/// The AVX2 block, 6 x 16: 12 of the 16 vector registers accumulate (two per row), one holds
/// the broadcast element of `a` and two the row of `b`.
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl RegisterBlock for Avx2 {
    const MR: usize = 6;
    const NR: usize = 16;

    #[inline(always)]
    unsafe fn run(
        kc: usize,
        a_panel: &[f32],
        b_panel: &[f32],
        c: *mut f32,
        ldc: usize,
        continuing: bool,
        bias: Option<&[f32]>,
    ) {
        use std::arch::x86_64::*;
        const MR: usize = Avx2::MR;
        debug_assert!(a_panel.len() >= kc * MR && b_panel.len() >= kc * 16);
        // SAFETY: only reached from `product_avx2`, compiled for AVX2 and FMA and called after
        // the processor said it has them; every pointer stays inside the panels (`kc` steps of
        // MR and 16 values) and inside the `MR x 16` block of `c` the caller vouches for.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 2 * MR];
            if continuing {
                for i in 0..MR {
                    acc[2 * i] = _mm256_loadu_ps(c.add(i * ldc));
                    acc[2 * i + 1] = _mm256_loadu_ps(c.add(i * ldc + 8));
                }
            }
            let (mut a, mut b) = (a_panel.as_ptr(), b_panel.as_ptr());
            for _ in 0..kc {
                let (b0, b1) = (_mm256_loadu_ps(b), _mm256_loadu_ps(b.add(8)));
                for i in 0..MR {
                    let x = _mm256_broadcast_ss(&*a.add(i));
                    acc[2 * i] = _mm256_fmadd_ps(x, b0, acc[2 * i]);
                    acc[2 * i + 1] = _mm256_fmadd_ps(x, b1, acc[2 * i + 1]);
                }
                a = a.add(MR);
                b = b.add(16);
            }
            if let Some(bias) = bias {
                let (x0, x1) = (_mm256_loadu_ps(bias.as_ptr()), _mm256_loadu_ps(bias.as_ptr().add(8)));
                for i in 0..MR {
                    acc[2 * i] = _mm256_add_ps(acc[2 * i], x0);
                    acc[2 * i + 1] = _mm256_add_ps(acc[2 * i + 1], x1);
                }
            }
            for i in 0..MR {
                _mm256_storeu_ps(c.add(i * ldc), acc[2 * i]);
                _mm256_storeu_ps(c.add(i * ldc + 8), acc[2 * i + 1]);
            }
        }
    }
}

/// A thread's packing buffers: `MC x KC` of `a` and `KC x NC` of `b`, the most any product
/// packs at once, each starting on a cache line (so that no vector load of a panel straddles
/// two lines; the allocator's alignment for `f32` is 4 bytes).
struct Packs {
    a: Vec<CacheLine>,
    b: Vec<CacheLine>,
}

/// 16 floats on a cache line of their own.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([f32; 16]);

impl Packs {
    fn new() -> Self {
        let lines = |floats: usize| vec![CacheLine([0.0; 16]); floats.div_ceil(16)];
        Self { a: lines(MC * KC), b: lines(NC * KC) }
    }

    /// Both buffers as floats.
    fn split(&mut self) -> (&mut [f32], &mut [f32]) {
        let floats = |lines: &mut Vec<CacheLine>| {
            // SAFETY: `CacheLine` is `repr(C)` around 16 floats with no padding (64 bytes), so
            // the lines are a contiguous run of `16 * len` floats.
            unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<f32>(), lines.len() * 16) }
        };
        (floats(&mut self.a), floats(&mut self.b))
    }
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
/// element after its chain, as it is written. (The executor's kernels use [`matmul_block`],
/// which splits columns too.)
#[cfg(test)]
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
    assert!(out.len() >= rows.len() * n, "the output holds the rows it is given");
    // SAFETY: `out` is borrowed exclusively and holds every row the product writes.
    unsafe { matmul_block(a, b, layout, bias, out.as_mut_ptr(), rows, 0..n, k, n) };
}

/// Rows `rows` and columns `columns` of `a @ b (+ bias)` into `out`, which points at the first
/// element of row `rows.start` of an `[.., n]` row-major result (the other columns are not
/// touched, so parts of one product may write disjoint columns of the same rows at once).
///
/// # Safety
/// `out` is valid for writes of `rows.len()` rows of `n` values, and nothing else reads or
/// writes columns `columns` of those rows until this returns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_block(
    a: &[f32],
    b: &[f32],
    layout: BLayout,
    bias: Option<&[f32]>,
    out: *mut f32,
    rows: Range<usize>,
    columns: Range<usize>,
    k: usize,
    n: usize,
) {
    // SAFETY: passed on from the caller; the fastest blocks run on this processor.
    unsafe { matmul_block_with(Blocks::fastest(), a, b, layout, bias, out, rows, columns, k, n) }
}

/// [`matmul_block`] with the given register blocks.
///
/// # Safety
/// [`matmul_block`]'s, and `blocks` is one of [`Blocks::available`].
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_block_with(
    blocks: Blocks,
    a: &[f32],
    b: &[f32],
    layout: BLayout,
    bias: Option<&[f32]>,
    out: *mut f32,
    rows: Range<usize>,
    columns: Range<usize>,
    k: usize,
    n: usize,
) {
    if columns.is_empty() || rows.is_empty() {
        return;
    }
    assert!(columns.end <= n && bias.is_none_or(|bias| bias.len() >= n));
    let m = rows.len();
    if k == 0 {
        for i in 0..m {
            // SAFETY: row `i` of the result, columns `columns`: the caller lends them.
            let row = unsafe { std::slice::from_raw_parts_mut(out.add(i * n + columns.start), columns.len()) };
            match bias {
                Some(bias) => row.copy_from_slice(&bias[columns.clone()]),
                None => row.fill(0.0),
            }
        }
        return;
    }
    let a = &a[rows.start * k..rows.end * k];
    assert!(b.len() >= k * n);
    PACKS.with(|packs| {
        let mut packs = packs.borrow_mut();
        // The largest block's panels, rounded up: MC and NC are multiples of every block's size.
        let (a_pack, b_pack) = packs.get_or_insert_with(Packs::new).split();
        let job = ProductJob { a, b, layout, bias, out, columns, m, k, n, a_pack, b_pack };
        // SAFETY: the caller vouches for `blocks` and lends the output.
        unsafe { blocks.product(job) };
    });
}

/// The register blocks, by the instructions they need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blocks {
    /// [`Avx512`]: AVX-512F and FMA.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// [`Avx2`]: AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// [`Portable`]: any processor.
    Portable,
}

impl Blocks {
    /// Every block this processor runs, fastest first.
    fn available() -> impl Iterator<Item = Self> {
        #[cfg(target_arch = "x86_64")]
        let x86 = {
            use std::arch::is_x86_feature_detected as has;
            let fma = has!("fma");
            [(Self::Avx512, fma && has!("avx512f")), (Self::Avx2, fma && has!("avx2"))]
        };
        #[cfg(not(target_arch = "x86_64"))]
        let x86: [(Self, bool); 0] = [];
        x86.into_iter().filter(|&(_, has)| has).map(|(blocks, _)| blocks).chain([Self::Portable])
    }

    /// The fastest block this processor runs (the feature checks are cached atomics).
    #[inline]
    fn fastest() -> Self {
        Self::available().next().unwrap_or(Self::Portable)
    }

    /// [`product`] with these blocks.
    ///
    /// # Safety
    /// `self` is one of [`Blocks::available`]; [`product`]'s contract.
    unsafe fn product(self, job: ProductJob<'_>) {
        // SAFETY: passed on from the caller: the processor has each block's instructions.
        unsafe {
            match self {
                #[cfg(target_arch = "x86_64")]
                Self::Avx512 => product_avx512(job),
                #[cfg(target_arch = "x86_64")]
                Self::Avx2 => product_avx2(job),
                Self::Portable => product_portable(job),
            }
        }
    }
}

/// One product's operands, result and scratch, for [`product`]: `a` is `[m, k]`, `b` as
/// `layout` says, and the result's columns `columns` of `m` rows of `n` values start at `out`;
/// `a_pack` and `b_pack` are the thread's packing buffers.
struct ProductJob<'a> {
    a: &'a [f32],
    b: &'a [f32],
    layout: BLayout,
    bias: Option<&'a [f32]>,
    out: *mut f32,
    columns: Range<usize>,
    m: usize,
    k: usize,
    n: usize,
    a_pack: &'a mut [f32],
    b_pack: &'a mut [f32],
}

/// [`product`] with the portable block, compiled for each instruction set the processor may
/// have.
#[multiversion(targets = "simd")]
unsafe fn product_portable(job: ProductJob<'_>) {
    // SAFETY: passed on from the caller.
    unsafe { product::<Portable>(job) };
}

/// [`product`] with the AVX2 block.
///
/// # Safety
/// The processor has AVX2 and FMA; [`product`]'s contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn product_avx2(job: ProductJob<'_>) {
    // SAFETY: passed on from the caller.
    unsafe { product::<Avx2>(job) };
}

/// [`product`] with the AVX-512 block.
///
/// # Safety
/// The processor has AVX-512F and FMA; [`product`]'s contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn product_avx512(job: ProductJob<'_>) {
    // SAFETY: passed on from the caller.
    unsafe { product::<Avx512>(job) };
}

/// `out[m, n] = a[m, k] @ b (+ bias)`, with `a_pack` and `b_pack` as scratch, in the loops of
/// BLIS: panels of `b` (`KC x NC`, kept in L2) outside, blocks of rows of `a` (`MC x KC`) inside
/// them, and each register-high panel of `a` (`KC x MR`, kept in L1) run against every
/// register-wide panel of `b` in turn.
///
/// # Safety
/// `job.out` is valid for writes of `m` rows of `n` values and lent exclusively in its
/// columns; the processor runs `B`'s instructions.
#[inline(always)]
unsafe fn product<B: RegisterBlock>(job: ProductJob<'_>) {
    let ProductJob { a, b, layout, bias, out, columns, m, k, n, a_pack, b_pack } = job;
    let (mr, nr) = (B::MR, B::NR);
    // A partial block (at the right or bottom edge) runs on a copy, so that the block always
    // reads and writes whole MR x NR blocks.
    let mut edge = [0f32; 12 * 32];
    debug_assert!(mr * nr <= edge.len() && MC.is_multiple_of(mr) && NC.is_multiple_of(nr));
    // The element (row, column) of the result.
    let element = |row: usize, column: usize| {
        // SAFETY: row < m and column < n, inside what the caller lends.
        unsafe { out.add(row * n + column) }
    };
    for j0 in columns.clone().step_by(NC) {
        let nc = NC.min(columns.end - j0);
        let column_panels = nc.div_ceil(nr);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            let last = p0 + kc == k;
            pack_b::<B>(b, layout, b_pack, nr, j0, nc, p0, kc, k, n);
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                let row_panels = mc.div_ceil(mr);
                pack_a::<B>(a, a_pack, mr, i0, mc, p0, kc, k);
                for ip in 0..row_panels {
                    let rows = mr.min(mc - ip * mr);
                    let ap = &a_pack[ip * kc * mr..(ip + 1) * kc * mr];
                    for jp in 0..column_panels {
                        let cols = nr.min(nc - jp * nr);
                        let bp = &b_pack[jp * kc * nr..(jp + 1) * kc * nr];
                        let first_column = j0 + jp * nr;
                        let bias = bias.filter(|_| last).map(|bias| &bias[first_column..]);
                        let first_row = i0 + ip * mr;
                        if rows == mr && cols == nr {
                            // SAFETY: the block's MR rows of NR values lie inside the lent
                            // output (rows and columns were checked whole just above); the
                            // block's instruction set is the one this function was compiled for.
                            unsafe { B::run(kc, ap, bp, element(first_row, first_column), n, p0 > 0, bias) };
                            continue;
                        }
                        // The chains go on from what the previous panels of `k` left.
                        let edge = &mut edge[..mr * nr];
                        if p0 > 0 {
                            for i in 0..rows {
                                // SAFETY: `cols` values of a lent row, not aliased by `edge`.
                                let from =
                                    unsafe { std::slice::from_raw_parts(element(first_row + i, first_column), cols) };
                                edge[i * nr..][..cols].copy_from_slice(from);
                            }
                        }
                        let mut bias_row = [0f32; 32];
                        let bias = bias.map(|bias| {
                            bias_row[..cols].copy_from_slice(&bias[..cols]);
                            &bias_row[..nr]
                        });
                        // SAFETY: `edge` holds MR rows of NR values, NR apart.
                        unsafe { B::run(kc, ap, bp, edge.as_mut_ptr(), nr, p0 > 0, bias) };
                        for i in 0..rows {
                            // SAFETY: as above.
                            let to =
                                unsafe { std::slice::from_raw_parts_mut(element(first_row + i, first_column), cols) };
                            to.copy_from_slice(&edge[i * nr..][..cols]);
                        }
                    }
                }
            }
        }
    }
}

/// Packs `b[p0..p0 + kc, j0..j0 + nc]` into panels of `nr` columns (`kc x nr` each, row by
/// row), zero-padded past `nc`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pack_b<B: RegisterBlock>(
    b: &[f32],
    layout: BLayout,
    pack: &mut [f32],
    nr: usize,
    j0: usize,
    nc: usize,
    p0: usize,
    kc: usize,
    k: usize,
    n: usize,
) {
    let panels = nc.div_ceil(nr);
    for jp in 0..panels {
        let cols = nr.min(nc - jp * nr);
        let first = j0 + jp * nr;
        let panel = &mut pack[jp * kc * nr..(jp + 1) * kc * nr];
        match layout {
            // Whole panels copy a constant width (vector moves, not a `memcpy` call per row).
            BLayout::Rows if cols == B::NR => {
                for (p, dst) in panel.chunks_exact_mut(B::NR).enumerate() {
                    dst.copy_from_slice(&b[(p0 + p) * n + first..][..B::NR]);
                }
            }
            BLayout::Rows => {
                for (p, dst) in panel.chunks_exact_mut(nr).enumerate() {
                    dst[..cols].copy_from_slice(&b[(p0 + p) * n + first..][..cols]);
                    dst[cols..].fill(0.0);
                }
            }
            BLayout::Transposed => B::pack_transposed(&b[first * k + p0..], k, cols, kc, nr, panel),
        }
    }
}

/// Packs `a[i0..i0 + mc, p0..p0 + kc]` into panels of `mr` rows (`kc x mr` each, column by
/// column), zero-padded past `mc`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pack_a<B: RegisterBlock>(
    a: &[f32],
    pack: &mut [f32],
    mr: usize,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    k: usize,
) {
    for ip in 0..mc.div_ceil(mr) {
        let rows = mr.min(mc - ip * mr);
        let panel = &mut pack[ip * kc * mr..(ip + 1) * kc * mr];
        B::pack_transposed(&a[(i0 + ip * mr) * k + p0..], k, rows, kc, mr, panel);
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

    /// Rows `rows`, columns `columns` of the product with `blocks`, into `out` (the whole result).
    #[allow(clippy::too_many_arguments)]
    fn part_with(
        blocks: Blocks,
        (a, b, layout, bias): (&[f32], &[f32], BLayout, Option<&[f32]>),
        out: &mut [f32],
        rows: Range<usize>,
        columns: Range<usize>,
        k: usize,
        n: usize,
    ) {
        let at = out[rows.start * n..].as_mut_ptr();
        // SAFETY: `out` holds every row, borrowed exclusively; `blocks` comes from `available`.
        unsafe { matmul_block_with(blocks, a, b, layout, bias, at, rows, columns, k, n) };
    }

    #[test]
    fn products_are_the_same_bits_for_every_split_and_every_block() {
        let blocks: Vec<Blocks> = Blocks::available().collect();
        println!("register blocks this processor runs: {blocks:?}");
        // Shapes across the block edges: partial register blocks, several panels of k, of rows
        // and of columns.
        for &(m, k, n) in
            &[(1, 1, 1), (7, 3, 17), (13, 300, 33), (100, 513, 40), (6, 256, 1030), (200, 5, 3), (25, 40, 70)]
        {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 1.0).collect();
            for layout in [BLayout::Rows, BLayout::Transposed] {
                let expected = by_definition(&a, &b, layout, m, k, n);
                for &blocks in &blocks {
                    for parts in [1, 2, 3, 7] {
                        // By rows, then by columns.
                        for by_columns in [false, true] {
                            let mut out = vec![f32::NAN; m * n];
                            let units = if by_columns { n } else { m };
                            let mut start = 0;
                            for part in 0..parts {
                                let end = (units * (part + 1)) / parts;
                                let (rows, columns) = if by_columns { (0..m, start..end) } else { (start..end, 0..n) };
                                part_with(blocks, (&a, &b, layout, None), &mut out, rows, columns, k, n);
                                start = end;
                            }
                            let same = out.iter().zip(&expected).all(|(x, y)| x.to_bits() == y.to_bits());
                            let split = if by_columns { "columns" } else { "rows" };
                            assert!(same, "{m}x{k}x{n} {layout:?} {blocks:?}: {parts} parts by {split} differ from the definition");
                        }
                    }
                    // A bias is added once, after each element's chain, also when the columns
                    // are split (the bias is read by absolute column).
                    let with_bias: Vec<f32> = expected.iter().enumerate().map(|(i, &e)| e + bias[i % n]).collect();
                    // All columns at once, then a third and two thirds.
                    for cut in [n, n / 3] {
                        let mut out = vec![f32::NAN; m * n];
                        for part in [0..cut, cut..n] {
                            part_with(blocks, (&a, &b, layout, Some(&bias)), &mut out, 0..m, part, k, n);
                        }
                        let same = out.iter().zip(&with_bias).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{m}x{k}x{n} {blocks:?} bias, columns cut at {cut}");
                    }
                }
                // The public entry uses the fastest.
                let mut out = vec![f32::NAN; m * n];
                matmul_rows(&a, &b, layout, None, &mut out, 0..m, k, n);
                assert!(out.iter().zip(&expected).all(|(x, y)| x.to_bits() == y.to_bits()));
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
