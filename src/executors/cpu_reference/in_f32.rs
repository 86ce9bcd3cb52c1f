//! Float kernels of the CPU executors compute in `f32`: a kernel written for `f32` views runs
//! on bf16 and f16 tensors through [`InF32`], which widens their values into per-thread `f32`
//! scratch, runs the kernel there, and rounds each output once into its own dtype, as
//! PyTorch's CPU kernels do.

use std::cell::RefCell;

use smallvec::SmallVec;

use crate::core::ir::DType;
use crate::core::plan::{Kernel, OpView};
use crate::core::tensor::{with_values, Data, DataMut, Element, TensorMut, TensorRef};
use crate::error::Result;

/// A float kernel that reads and writes `f32` views, run on views of any float dtype.
pub(crate) struct InF32 {
    inner: Box<dyn Kernel>,
}

impl InF32 {
    /// `inner`, `op`'s kernel written for `f32` views, made to take `op`'s dtypes: as it is when
    /// every tensor of `op` is `f32`.
    pub fn wrap(inner: Box<dyn Kernel>, op: &OpView<'_>) -> Box<dyn Kernel> {
        if op.dtypes().iter().all(|&d| d == DType::F32) {
            inner
        } else {
            Box::new(InF32 { inner })
        }
    }
}

/// Views built on the stack: as many as a fused region's inputs or outputs usually are (the
/// fusion program's own lists hold as many), so that runs do not allocate.
const INLINE: usize = 16;

thread_local! {
    /// `f32` copies of one kernel call's tensors, kept by each thread that runs kernels so that
    /// steady-state runs allocate nothing (each buffer grows to the largest tensor it held).
    static SCRATCH: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

impl Kernel for InF32 {
    fn run(&self, inputs: &[TensorRef<'_>], outputs: &mut [TensorMut<'_>]) -> Result<()> {
        // Taken out for the call (a kernel that runs another `InF32` on this thread finds it
        // empty and allocates its own), put back after.
        let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
        let wanted = inputs.len() + outputs.len();
        if scratch.len() < wanted {
            scratch.resize_with(wanted, Vec::new);
        }
        let (ins, outs) = scratch.split_at_mut(inputs.len());
        for (buffer, input) in ins.iter_mut().zip(inputs) {
            widen(input.data, buffer);
        }
        let result = {
            let views: SmallVec<[TensorRef<'_>; INLINE]> = inputs
                .iter()
                .zip(ins.iter())
                .map(|(input, buffer)| TensorRef { shape: input.shape, data: Data::F32(buffer) })
                .collect();
            let mut wide: SmallVec<[TensorMut<'_>; INLINE]> = SmallVec::new();
            for (buffer, output) in outs.iter_mut().zip(outputs.iter()) {
                buffer.clear();
                buffer.resize(output.len(), 0.0);
                wide.push(TensorMut { shape: output.shape, data: DataMut::F32(buffer) });
            }
            self.inner.run(&views, &mut wide)
        };
        if result.is_ok() {
            for (output, buffer) in outputs.iter_mut().zip(outs.iter()) {
                narrow(buffer, output.data.reborrow());
            }
        }
        SCRATCH.with(|s| *s.borrow_mut() = scratch);
        result
    }
}

/// `data`'s values as `f32`, into `buffer` (exact for float dtypes).
pub(crate) fn widen(data: Data<'_>, buffer: &mut Vec<f32>) {
    buffer.clear();
    with_values!(Data, data, x => buffer.extend(x.iter().map(|v| v.to_f32())));
}

/// `values` rounded once into `out`'s dtype.
pub(crate) fn narrow(values: &[f32], out: DataMut<'_>) {
    with_values!(DataMut, out, o => {
        for (o, &v) in o.iter_mut().zip(values) {
            *o = Element::from_f32(v);
        }
    });
}
