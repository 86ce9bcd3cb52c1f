//! Rounding a kernel's results to their dtype: the CPU executors compute in `f32` and round
//! each result to its op's dtype (bf16, f16), as PyTorch's CPU kernels do.

use crate::core::ir::DType;
use crate::core::plan::{Kernel, OpView};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::Result;

/// Runs a kernel, then rounds each output that is not `f32` to its dtype, in place.
pub(crate) struct RoundOutputs {
    pub inner: Box<dyn Kernel>,
}

impl RoundOutputs {
    /// `inner`, `op`'s kernel, rounding its outputs when one of them is not `f32`.
    pub fn wrap(inner: Box<dyn Kernel>, op: &OpView<'_>) -> Box<dyn Kernel> {
        if op.output_dtypes().all(|d| d == DType::F32) {
            inner
        } else {
            Box::new(RoundOutputs { inner })
        }
    }
}

impl Kernel for RoundOutputs {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        self.inner.run(inputs, outputs)?;
        for output in outputs.iter_mut() {
            round_in_place(output.dtype, output.data);
        }
        Ok(())
    }
}

/// Rounds every element of `data` to `dtype`.
pub(crate) fn round_in_place(dtype: DType, data: &mut [f32]) {
    if dtype != DType::F32 {
        for x in data {
            *x = dtype.round(*x);
        }
    }
}
