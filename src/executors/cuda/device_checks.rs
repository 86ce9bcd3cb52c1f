//! What the kernels that check their ids on the device share (`embedding`, `gather_last`,
//! `cross_entropy`): a fault buffer per stream (`[flag, position, id low, id high]`), with any
//! scratch the kernel needs beside it, the CUDA C that records a fault, reading and clearing it
//! after the run, the launch of a kernel from raw parameters, and the check of a kernel's buffers
//! against the lengths it was compiled for.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig};

use super::device::cuda_error;
use crate::core::plan::DeviceBuffer;
use crate::error::{Error, Result};

/// CUDA C that records a fault at `position` for `id` (both `long long` expressions in scope
/// of a kernel with an `unsigned int* fault` parameter): the first to arrive wins.
pub(super) fn record_fault(position: &str, id: &str) -> String {
    format!(
        "if (atomicCAS(fault, 0u, 1u) == 0u) {{ fault[1] = (unsigned int)({position}); fault[2] = (unsigned int)({id}); \
         fault[3] = (unsigned int)(({id}) >> 32); }}"
    )
}

/// One fault buffer (and scratch `S`) per stream a kernel ran on.
pub(super) struct PerStream<S> {
    entries: Mutex<Vec<(usize, CudaSlice<u32>, S)>>,
}

impl<S> PerStream<S> {
    pub(super) fn new() -> Self {
        Self { entries: Mutex::new(Vec::new()) }
    }

    /// Calls `f` with the fault buffer and scratch of `stream`, made the first time (`make`
    /// makes the scratch); entries of streams nobody else holds any more are freed first, so
    /// there is one per live stream.
    pub(super) fn with<R>(
        &self,
        stream: &Arc<CudaStream>,
        make: impl FnOnce(&Arc<CudaStream>) -> Result<S>,
        f: impl FnOnce(&mut CudaSlice<u32>, &mut S) -> Result<R>,
    ) -> Result<R> {
        let key = stream.cu_stream() as usize;
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if !entries.iter().any(|(s, _, _)| *s == key) {
            entries.retain(|(_, fault, _)| Arc::strong_count(fault.stream()) > 1);
            let fault = stream.alloc_zeros::<u32>(4).map_err(|e| cuda_error("fault buffer", e))?;
            entries.push((key, fault, make(stream)?));
        }
        let (_, fault, scratch) =
            entries.iter_mut().find(|(s, _, _)| *s == key).ok_or_else(|| cuda_error("fault buffer", "missing"))?;
        f(fault, scratch)
    }

    /// What `stream`'s kernels recorded, read after its work is done and cleared:
    /// [`Error::IndexOutOfRange`] naming `symbol` and `bound`, or nothing.
    pub(super) fn check(&self, stream: &Arc<CudaStream>, symbol: &str, bound: usize) -> Result<()> {
        let key = stream.cu_stream() as usize;
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some((_, fault, _)) = entries.iter_mut().find(|(s, _, _)| *s == key) else { return Ok(()) };
        let mut found = [0u32; 4];
        stream.memcpy_dtoh(&*fault, &mut found[..]).map_err(|e| cuda_error("read the fault buffer", e))?;
        stream.synchronize().map_err(|e| cuda_error("synchronize", e))?;
        if found[0] == 0 {
            return Ok(());
        }
        stream.memset_zeros(fault).map_err(|e| cuda_error("clear the fault buffer", e))?;
        let index = (u64::from(found[2]) | (u64::from(found[3]) << 32)) as i64;
        Err(Error::IndexOutOfRange { symbol: symbol.into(), index, position: found[1] as usize, bound })
    }
}

/// Launches `function` on `stream` with `config` and these parameters.
///
/// # Safety
/// `params` must point at exactly the kernel's parameters, in order, alive for the call, and
/// every buffer they name must hold what the kernel reads and writes.
pub(super) unsafe fn launch(
    function: &CudaFunction,
    stream: &CudaStream,
    config: LaunchConfig,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { launch_raw(function, stream, config, params) }.map_err(|e| cuda_error("launch", e))
}

/// [`launch`], with the driver's own error.
///
/// # Safety
/// As for [`launch`].
pub(super) unsafe fn launch_raw(
    function: &CudaFunction,
    stream: &CudaStream,
    config: LaunchConfig,
    params: &mut [*mut c_void],
) -> std::result::Result<(), cudarc::driver::DriverError> {
    let LaunchConfig { grid_dim, block_dim, shared_mem_bytes } = config;
    let (function, stream) = (function.cu_function(), stream.cu_stream());
    // SAFETY: the caller's contract.
    unsafe { cudarc::driver::result::launch_kernel(function, grid_dim, block_dim, shared_mem_bytes, stream, params) }
}

/// The elements of each buffer a kernel reads and writes, from the shapes it was compiled
/// for: checked before each launch, since nothing on the device checks bounds.
pub(super) struct BufferLengths {
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
}

impl BufferLengths {
    /// `Ok` if there are as many buffers as the kernel takes, each holding at least the
    /// elements it reads or writes.
    pub fn check(&self, kernel: &str, inputs: &[&dyn DeviceBuffer], outputs: &[&mut dyn DeviceBuffer]) -> Result<()> {
        self.check_for("cuda", kernel, inputs, outputs)
    }

    /// [`check`](Self::check), for a kernel of the executor named `executor`.
    pub fn check_for(
        &self,
        executor: &str,
        kernel: &str,
        inputs: &[&dyn DeviceBuffer],
        outputs: &[&mut dyn DeviceBuffer],
    ) -> Result<()> {
        self.check_with(executor, kernel, inputs, outputs, &[])
    }

    /// [`check`](Self::check) for a kernel that may write outputs over inputs (the `(input,
    /// output)` pairs of `in_place`): such an input may be empty, its value then being in that
    /// output (`DeviceKernel::in_place`), whose length counts for it.
    pub fn check_in_place(
        &self,
        kernel: &str,
        inputs: &[&dyn DeviceBuffer],
        outputs: &[&mut dyn DeviceBuffer],
        in_place: &[(usize, usize)],
    ) -> Result<()> {
        self.check_with("cuda", kernel, inputs, outputs, in_place)
    }

    fn check_with(
        &self,
        executor: &str,
        kernel: &str,
        inputs: &[&dyn DeviceBuffer],
        outputs: &[&mut dyn DeviceBuffer],
        in_place: &[(usize, usize)],
    ) -> Result<()> {
        // Every launch checks: the common case, each buffer at least as long as the kernel's
        // value, in few instructions; the rest (an input written over, left empty) below.
        if inputs.len() == self.inputs.len()
            && outputs.len() == self.outputs.len()
            && inputs.iter().zip(&self.inputs).all(|(b, &need)| b.len() >= need)
            && outputs.iter().zip(&self.outputs).all(|(b, &need)| b.len() >= need)
        {
            return Ok(());
        }
        let fail =
            |message: String| Err(Error::Execution { executor: executor.into(), symbol: kernel.into(), message });
        if inputs.len() != self.inputs.len() || outputs.len() != self.outputs.len() {
            return fail(format!(
                "it takes {} input and {} output buffer(s), not {} and {}; pass one per tensor argument and output",
                self.inputs.len(),
                self.outputs.len(),
                inputs.len(),
                outputs.len()
            ));
        }
        let input_length = |k: usize, b: &&dyn DeviceBuffer| match in_place.iter().find(|&&(i, _)| i == k) {
            Some(&(_, o)) if b.is_empty() => outputs[o].len(),
            _ => b.len(),
        };
        let lengths = inputs.iter().enumerate().map(|(k, b)| input_length(k, b)).chain(outputs.iter().map(|b| b.len()));
        for (i, (have, need)) in lengths.zip(self.inputs.iter().chain(&self.outputs)).enumerate() {
            if have < *need {
                let which =
                    if i < inputs.len() { format!("input {i}") } else { format!("output {}", i - inputs.len()) };
                return fail(format!(
                    "{which} holds {have} device words, but the kernel accesses {need}; pass buffers sized for the \
                     shapes it was compiled for"
                ));
            }
        }
        Ok(())
    }
}
