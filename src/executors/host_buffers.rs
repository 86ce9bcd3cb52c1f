//! The host buffers a compiled CPU kernel takes, from the op it was compiled for, checked on
//! each [`Kernel::run`](crate::Kernel::run): a caller outside a plan (an executor of one's own
//! that runs the built-in kernels for the ops it does not handle) gets a typed error for
//! buffers of another count, dtype or length, where the kernels, written for the buffers a plan
//! passes, would index out of bounds. Both CPU executors check with it: the reference's
//! built-in kernels and `CpuFusion`'s regions.

use smallvec::SmallVec;

use crate::core::ir::checked_numel;
use crate::core::plan::OpView;
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::DType;

/// The dtype and element count of each input and output buffer of one compiled op.
pub(crate) struct HostBuffers {
    inputs: SmallVec<[(DType, usize); 4]>,
    outputs: SmallVec<[(DType, usize); 2]>,
}

impl HostBuffers {
    /// The buffers of `op`'s tensors: of their own dtypes, or all of `dtype` (a kernel that
    /// reads and writes that dtype only).
    pub fn of(op: &OpView<'_>, dtype: Option<DType>) -> Result<Self> {
        // (A shape past any buffer, which no finished trace holds, matches none.)
        let buffer =
            |v| Ok((dtype.unwrap_or_else(|| op.dtype_of(v)), checked_numel(op.shape_of(v)?).unwrap_or(usize::MAX)));
        let bound = op.bound_symbol();
        Ok(Self {
            inputs: bound.inputs().map(buffer).collect::<Result<_>>()?,
            outputs: bound.outputs().iter().map(|&v| buffer(v)).collect::<Result<_>>()?,
        })
    }

    /// `Ok` for buffers of the count, dtypes and lengths compiled for; else
    /// [`Error::Execution`] from `executor`'s kernel of `symbol`, naming what it takes.
    pub fn check(
        &self,
        executor: &str,
        symbol: &str,
        inputs: &[TensorRef<'_>],
        outputs: &[TensorMut<'_>],
    ) -> Result<()> {
        let fits = inputs.len() == self.inputs.len()
            && outputs.len() == self.outputs.len()
            && inputs.iter().zip(&self.inputs).all(|(t, &(d, n))| t.data.dtype() == d && t.data.len() == n)
            && outputs.iter().zip(&self.outputs).all(|(t, &(d, n))| t.data.dtype() == d && t.data.len() == n);
        if fits {
            return Ok(());
        }
        let list = |buffers: &mut dyn Iterator<Item = (DType, usize)>| {
            buffers.map(|(d, n)| format!("{d}[{n}]")).collect::<Vec<_>>().join(", ")
        };
        Err(Error::Execution {
            executor: executor.into(),
            symbol: symbol.into(),
            message: format!(
                "it takes inputs ({}) and outputs ({}) (dtype[elements]), not ({}) and ({}); pass buffers of the \
                 dtypes and shapes it was compiled for",
                list(&mut self.inputs.iter().copied()),
                list(&mut self.outputs.iter().copied()),
                list(&mut inputs.iter().map(|t| (t.data.dtype(), t.data.len()))),
                list(&mut outputs.iter().map(|t| (t.data.dtype(), t.data.len()))),
            ),
        })
    }
}
