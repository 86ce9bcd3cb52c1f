//! The reference's built-in kernels, checking the buffers they are given on each
//! [`Kernel::run`] ([`HostBuffers`]). A plan's map path ([`Kernel::as_map`], the small
//! elementwise ops) is left as it was: the plan checks what it passes there once, when it is
//! compiled.

use crate::core::plan::{Kernel, MapKernel, OpView};
use crate::core::tensor::{TensorMut, TensorRef};
use crate::error::Result;
use crate::executors::host_buffers::HostBuffers;

/// A built-in kernel with the buffers it takes.
pub(super) struct CheckedBuffers {
    kernel: Box<dyn Kernel>,
    buffers: HostBuffers,
    symbol: String,
}

impl CheckedBuffers {
    /// `kernel`, compiled for `op`, checking its buffers against `op`'s tensors.
    pub fn wrap(kernel: Box<dyn Kernel>, op: &OpView<'_>) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(Self { kernel, buffers: HostBuffers::of(op, None)?, symbol: op.name().to_string() }))
    }
}

impl Kernel for CheckedBuffers {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        self.buffers.check(super::CpuReference::NAME, &self.symbol, inputs, outputs)?;
        self.kernel.run(inputs, outputs)
    }

    fn as_map(&self) -> Option<&dyn MapKernel> {
        self.kernel.as_map()
    }
}
