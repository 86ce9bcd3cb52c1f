//! The buffers a built-in kernel of the CPU reference takes, from the op it was compiled for,
//! checked on each [`Kernel::run`]: a caller outside a plan (an executor of one's own that runs
//! the reference's kernels for the ops it does not handle) gets a typed error for buffers of
//! another count, dtype or length, where the kernels, written for the buffers a plan passes,
//! indexed out of bounds. A plan's map path ([`Kernel::as_map`], the small elementwise ops)
//! is left as it was: the plan checks what it passes there once, when it is compiled.

use smallvec::SmallVec;

use crate::core::ir::checked_numel;
use crate::core::plan::{Kernel, MapKernel, OpView};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::DType;

/// A built-in kernel with the dtype and element count of each buffer it takes.
pub(super) struct CheckedBuffers {
    kernel: Box<dyn Kernel>,
    inputs: SmallVec<[(DType, usize); 4]>,
    outputs: SmallVec<[(DType, usize); 2]>,
    symbol: String,
}

impl CheckedBuffers {
    /// `kernel`, compiled for `op`, checking its buffers against `op`'s tensors.
    pub fn wrap(kernel: Box<dyn Kernel>, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
        // (A shape past any buffer, which no finished trace holds, matches none.)
        let buffer = |v| Ok((op.dtype_of(v), checked_numel(op.shape_of(v)?).unwrap_or(usize::MAX)));
        let bound = op.bound_symbol();
        Ok(Box::new(Self {
            kernel,
            inputs: bound.inputs().map(buffer).collect::<Result<_>>()?,
            outputs: bound.outputs().iter().map(|&v| buffer(v)).collect::<Result<_>>()?,
            symbol: op.name().to_string(),
        }))
    }

    fn check(&self, inputs: &[TensorRef<'_>], outputs: &[TensorMut<'_>]) -> Result<()> {
        let fits = inputs.len() == self.inputs.len()
            && outputs.len() == self.outputs.len()
            && inputs.iter().zip(&self.inputs).all(|(t, &(d, n))| t.data.dtype() == d && t.data.len() == n)
            && outputs.iter().zip(&self.outputs).all(|(t, &(d, n))| t.data.dtype() == d && t.data.len() == n);
        if fits {
            return Ok(());
        }
        let expected = |buffers: &[(DType, usize)]| {
            buffers.iter().map(|(d, n)| format!("{d}[{n}]")).collect::<Vec<_>>().join(", ")
        };
        let given = |buffers: &mut dyn Iterator<Item = (DType, usize)>| {
            buffers.map(|(d, n)| format!("{d}[{n}]")).collect::<Vec<_>>().join(", ")
        };
        Err(Error::Execution {
            executor: super::CpuReference::NAME.into(),
            symbol: self.symbol.clone(),
            message: format!(
                "it takes inputs ({}) and outputs ({}) (dtype[elements]), not ({}) and ({}); pass buffers of the \
                 dtypes and shapes it was compiled for",
                expected(&self.inputs),
                expected(&self.outputs),
                given(&mut inputs.iter().map(|t| (t.data.dtype(), t.data.len()))),
                given(&mut outputs.iter().map(|t| (t.data.dtype(), t.data.len()))),
            ),
        })
    }
}

impl Kernel for CheckedBuffers {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        self.check(inputs, outputs)?;
        self.kernel.run(inputs, outputs)
    }

    fn as_map(&self) -> Option<&dyn MapKernel> {
        self.kernel.as_map()
    }
}
