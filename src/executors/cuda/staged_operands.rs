//! `layer_norm`'s weight and bias staged in shared memory, for row kernels whose accesses are
//! aligned to the tensor rather than to the row ([`RowLayout::aligned`]: rows of odd lengths).
//!
//! Such a row starts `shift = row % vector` values after an access, so the columns of its
//! accesses are not aligned to the `[cols]` operands: read from global memory, each access took
//! two 16-byte loads and a shift of their words ([`load_shifted`](super::row_kernels::load_shifted)),
//! per operand. Staged, a block copies each operand once into shared memory, once for each of
//! the `vector` shifts, so that copy `s` holds column `c` at `c + s`: an access of a row
//! shifted by `s` finds its columns in copy `s` at a multiple of `vector`, one aligned 16-byte
//! load. The block then runs rows until none is left (its grid sized for the SMs, not the
//! rows), so that each copy is made once a block, not once a row.

use std::fmt::Write as _;

use super::row_kernels::{fit_an_sm, widen_raw, RowLayout};
use crate::core::ir::DType;

/// The staged copies of a row kernel's `[cols]` operands, inputs `in1`, `in2`, ... (see the
/// module's doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StagedOperands {
    /// Values a copy holds: the row's columns, rounded up to an access, and one access more
    /// (the last access of a row shifted by up to `vector - 1`).
    pub copy_len: usize,
    /// Values an access reads.
    pub vector: usize,
    pub cols: usize,
    /// Each operand's dtype and the byte offset of its copies in the block's shared memory.
    pub operands: Vec<(DType, usize)>,
    /// Bytes of shared memory the copies take, a block.
    pub bytes: usize,
    /// Blocks an SM the grid is sized for.
    pub blocks_per_sm: usize,
}

impl StagedOperands {
    /// The copies for rows of `cols` values laid out as `layout`, of operands of `dtypes`, where
    /// they apply: the rows' accesses aligned to the tensor, the rows held in registers alone
    /// (the block's shared memory is the copies'), each operand read 16 bytes an access, and
    /// the copies fitting `blocks_per_sm` blocks an SM (an SM's `sm_shared` bytes,
    /// [`fit_an_sm`]) and a block's `shared_limit`.
    pub fn for_rows(
        cols: usize,
        layout: &RowLayout,
        dtypes: &[DType],
        blocks_per_sm: usize,
        shared_limit: usize,
        sm_shared: usize,
    ) -> Option<Self> {
        let (v, blocks_per_sm) = (layout.vector, blocks_per_sm.max(1));
        let applies = layout.aligned
            && layout.in_registers_alone()
            && !dtypes.is_empty()
            && dtypes.iter().all(|d| v * d.size_bytes() == 16);
        if !applies {
            return None;
        }
        let copy_len = cols.div_ceil(v) * v + v;
        let mut bytes = 0;
        let operands = dtypes
            .iter()
            .map(|&d| {
                let at = bytes;
                bytes += v * copy_len * d.size_bytes();
                (d, at)
            })
            .collect();
        let fits = bytes <= shared_limit && fit_an_sm(blocks_per_sm, bytes, sm_shared);
        fits.then_some(Self { copy_len, vector: v, cols, operands, bytes, blocks_per_sm })
    }

    /// The C that declares the copies (`bs_staged1`, ... for inputs `in1`, ...) and fills them,
    /// the block's threads together, then waits for all of them: at the kernel's start, before
    /// its loop over rows.
    pub fn fill(&self) -> String {
        let (v, cols, copy_len) = (self.vector, self.cols, self.copy_len);
        let chunks = copy_len / v;
        let mut c = String::from("  extern __shared__ __align__(16) unsigned char bs_staged[];\n");
        for (k, &(dtype, at)) in self.operands.iter().enumerate() {
            let (k, ty) = (k + 1, super::codegen::element_type(dtype));
            let per_word = 4 / dtype.size_bytes();
            let bits = if per_word == 1 {
                format!("__float_as_uint(in{k}[col])")
            } else {
                format!("(unsigned int)in{k}[col]")
            };
            let _ = writeln!(c, "  {ty}* const bs_staged{k} = reinterpret_cast<{ty}*>(bs_staged + {at});");
            // 16 bytes of copy `s` at a time: its columns `c0` to `c0 + vector`, 0 past the
            // operand.
            let _ = writeln!(c, "  for (int i = threadIdx.x; i < {}; i += blockDim.x) {{", v * chunks);
            let _ = writeln!(c, "    const int s = i / {chunks}; const int c0 = (i - s * {chunks}) * {v} - s;");
            let _ = writeln!(c, "    unsigned int w[4] = {{0u, 0u, 0u, 0u}};");
            let _ = writeln!(c, "    #pragma unroll");
            let _ = writeln!(
                c,
                "    for (int e = 0; e < {v}; ++e) {{ const int col = c0 + e; if (col >= 0 && col < {cols}) w[e / {per_word}] |= {bits} << ({} * (e % {per_word})); }}",
                32 / per_word
            );
            let _ = writeln!(c, "    reinterpret_cast<uint4*>(bs_staged{k})[i] = make_uint4(w[0], w[1], w[2], w[3]);");
            let _ = writeln!(c, "  }}");
        }
        c.push_str("  __syncthreads();\n");
        c
    }

    /// The C that reads input `k`'s values at the access's columns `col` (of the row shifted by
    /// `shift`) into `float p[vector]`: one aligned load from its copy.
    pub fn read(&self, k: usize) -> String {
        let (dtype, _) = self.operands[k - 1];
        format!(
            "{{ const uint4 q = *reinterpret_cast<const uint4*>(bs_staged{k} + (int)(shift * {} + col + shift));{} }}",
            self.copy_len,
            widen_raw(dtype, self.vector, "q", "p")
        )
    }

    /// Blocks to launch for `needed` blocks of rows on a GPU of `sms` SMs: as many as run at
    /// once, each looping over rows, where the rows need more (`needed` where the SMs are
    /// unknown, 0).
    pub fn blocks(&self, needed: usize, sms: usize) -> usize {
        if sms == 0 {
            needed
        } else {
            needed.min(sms * self.blocks_per_sm)
        }
    }
}
