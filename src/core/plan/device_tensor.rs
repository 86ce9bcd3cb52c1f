//! Tensors in a device's memory, and a plan's inputs wherever they live.
//!
//! A [`DeviceTensor`] is made by an explicit upload and stays on its device until dropped:
//! weights and any input that does not change between runs are uploaded once and passed to
//! every run by reference ([`RunInput::Device`]), so that the plan skips their uploads. Reading
//! a device value on the host is always an explicit call that waits for the device
//! ([`DeviceTensor::to_host`], [`DeviceOutputs::to_host`](crate::DeviceOutputs::to_host)); no
//! run copies a tensor between host and device silently.

use std::sync::Arc;

use super::device::{Device, DeviceBuffer};
use super::packing;
use crate::core::ir::Shape;
use crate::core::tensor::{Storage, Tensor, TensorRef};
use crate::error::{Error, Result};

/// A tensor in a device's memory.
///
/// ```no_run
/// # // Needs a GPU: see `proptests/cuda_matches_reference.rs` for the tested version.
/// # #[cfg(feature = "cuda")] {
/// use std::sync::Arc;
/// use boundscope::executors::cuda::{CudaDevice, CudaFusion, CudaOps};
/// use boundscope::{Arena, Device, DeviceTensor, Plan, Registry, RunInput, Tensor, TraceBuilder};
/// let device = CudaDevice::new()?;
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[1024])?;
/// let y = b.exp(x)?;
/// b.output(y)?;
/// let plan = Plan::compile(&b.finish()?, &[Arc::new(CudaOps::new(device.clone()))])?;
/// let on_device: Arc<dyn Device> = device;
/// let x = DeviceTensor::upload(&on_device, Tensor::zeros(&[1024]).view())?; // once
/// let mut workspace = plan.workspace()?;
/// let outputs = plan.run_on_device(&mut workspace, &[RunInput::from(&x)])?; // no transfer
/// assert_eq!(outputs.to_host(0)?.to_f32_vec()[0], 1.0); // waits for the device
/// # }
/// # Ok::<(), boundscope::Error>(())
/// ```
pub struct DeviceTensor {
    shape: Shape,
    dtype: crate::DType,
    buffer: Box<dyn DeviceBuffer>,
    device: Arc<dyn Device>,
    /// Which memory `buffer` is, unique in the process: made with the buffer, kept by refills,
    /// changed when the buffer is exchanged (see [`buffer_identity`](Self::buffer_identity)).
    memory: u64,
}

/// A new [`DeviceTensor::memory`].
fn new_memory() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl DeviceTensor {
    /// Copies `tensor` to `device` (after the work already queued there).
    ///
    /// # Errors
    /// The device's allocation or copy error.
    pub fn upload(device: &Arc<dyn Device>, tensor: TensorRef<'_>) -> Result<Self> {
        check_holds(tensor)?;
        let mut buffer = device.alloc(packing::words(tensor.dtype(), tensor.data.len()))?;
        upload_values(&**device, tensor, &mut *buffer)?;
        Ok(Self {
            shape: Shape::from_slice(tensor.shape),
            dtype: tensor.dtype(),
            buffer,
            device: device.clone(),
            memory: new_memory(),
        })
    }

    /// Its dtype (its values are stored in their own bits: 16-bit ones two per device word).
    pub fn dtype(&self) -> crate::DType {
        self.dtype
    }

    /// Overwrites it with `tensor`, of its shape, in place (after the work already queued on
    /// the device, so a run queued before reads the old data): how new data reaches a graph's
    /// inputs ([`PlanGraph::input_mut`](crate::PlanGraph::input_mut)).
    ///
    /// # Errors
    /// [`Error::CopyMismatch`] for data of another shape or dtype (naming both),
    /// [`Error::InvalidTensor`] for data that does not fill its shape; the device's copy error.
    pub fn copy_from_host(&mut self, tensor: TensorRef<'_>) -> Result<()> {
        check_holds(tensor)?;
        if tensor.shape != self.shape.as_slice() || tensor.dtype() != self.dtype {
            return Err(Error::CopyMismatch {
                expected: crate::TensorMeta::new(self.dtype, &self.shape),
                got: crate::TensorMeta::new(tensor.dtype(), tensor.shape),
            });
        }
        upload_values(&*self.device, tensor, &mut *self.buffer)
    }

    /// Which memory it holds: the same for as long as this tensor holds that buffer (refills
    /// included), another once it is replaced or swapped, never one a tensor dropped before
    /// had (an address could be: the allocator reuses it).
    pub(crate) fn buffer_identity(&self) -> u64 {
        self.memory
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The device it lives on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Its memory.
    pub fn buffer(&self) -> &dyn DeviceBuffer {
        &*self.buffer
    }

    /// Copies it to the host, waiting for the work queued on the device before.
    ///
    /// # Errors
    /// The device's copy error.
    pub fn to_host(&self) -> Result<Tensor> {
        download(&*self.device, &*self.buffer, &self.shape, self.dtype)
    }
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor").field("shape", &self.shape).field("device", &self.device.name()).finish()
    }
}

/// A tensor whose data fills its shape.
fn check_holds(tensor: TensorRef<'_>) -> Result<()> {
    crate::core::tensor::holds(tensor.shape, tensor.data.len())
}

/// Uploads `tensor`'s values into `buffer`, in their own bits.
fn upload_values(device: &dyn Device, tensor: TensorRef<'_>, buffer: &mut dyn DeviceBuffer) -> Result<()> {
    packing::upload(device, tensor.data, buffer, &mut Vec::new())
}

/// Copies `len(shape)` values of `dtype` of a device buffer to a new host tensor.
pub(crate) fn download(
    device: &dyn Device,
    buffer: &dyn DeviceBuffer,
    shape: &[usize],
    dtype: crate::DType,
) -> Result<Tensor> {
    let numel: usize = shape.iter().product();
    let mut tensor = Tensor::from_storage(shape, Storage::try_zeros(dtype, numel, "a download to the host", shape)?);
    packing::download(device, buffer, tensor.data_mut(), &mut Vec::new())?;
    Ok(tensor)
}

/// One input of a run, wherever it lives.
#[derive(Clone, Copy)]
pub enum RunInput<'a> {
    /// On the host: the plan uploads it if a device step reads it.
    Host(TensorRef<'a>),
    /// On the plan's device: the plan reads it there, with no transfer.
    Device(&'a DeviceTensor),
}

impl<'a> From<TensorRef<'a>> for RunInput<'a> {
    fn from(tensor: TensorRef<'a>) -> Self {
        RunInput::Host(tensor)
    }
}

impl<'a> From<&'a Tensor> for RunInput<'a> {
    fn from(tensor: &'a Tensor) -> Self {
        RunInput::Host(tensor.view())
    }
}

impl<'a> From<&'a DeviceTensor> for RunInput<'a> {
    fn from(tensor: &'a DeviceTensor) -> Self {
        RunInput::Device(tensor)
    }
}

/// One input of [`Plan::run_updating_on_device`](crate::Plan::run_updating_on_device), which
/// may be written back (the in-place updates): on the host, or on the plan's device (updated in
/// its own memory, or by exchanging buffers with the run's output; never by a copy).
pub enum RunInputMut<'a> {
    /// On the host.
    Host(&'a mut Tensor),
    /// On the plan's device.
    Device(&'a mut DeviceTensor),
}

impl<'a> From<&'a mut Tensor> for RunInputMut<'a> {
    fn from(tensor: &'a mut Tensor) -> Self {
        RunInputMut::Host(tensor)
    }
}

impl<'a> From<&'a mut DeviceTensor> for RunInputMut<'a> {
    fn from(tensor: &'a mut DeviceTensor) -> Self {
        RunInputMut::Device(tensor)
    }
}

impl PlanInput for RunInputMut<'_> {
    #[inline(always)]
    fn as_run_input(&self) -> RunInput<'_> {
        match self {
            RunInputMut::Host(t) => RunInput::Host(t.view()),
            RunInputMut::Device(t) => RunInput::Device(t),
        }
    }
}

impl DeviceTensor {
    /// Exchanges its memory with `buffer` (of its length: the caller checks).
    pub(crate) fn swap_buffer(&mut self, buffer: &mut Box<dyn DeviceBuffer>) {
        std::mem::swap(&mut self.buffer, buffer);
        self.memory = new_memory();
    }
}

/// What [`Plan::run_with`](crate::Plan::run_with) and
/// [`Plan::run_on_device`](crate::Plan::run_on_device) take as inputs: host views
/// ([`TensorRef`]) or [`RunInput`]s, which may be on the device.
pub trait PlanInput {
    /// Where it is.
    fn as_run_input(&self) -> RunInput<'_>;
}

impl PlanInput for TensorRef<'_> {
    #[inline(always)]
    fn as_run_input(&self) -> RunInput<'_> {
        RunInput::Host(*self)
    }
}

impl PlanInput for &Tensor {
    #[inline(always)]
    fn as_run_input(&self) -> RunInput<'_> {
        RunInput::Host(self.view())
    }
}

impl PlanInput for &mut Tensor {
    #[inline(always)]
    fn as_run_input(&self) -> RunInput<'_> {
        RunInput::Host(self.view())
    }
}

impl PlanInput for RunInput<'_> {
    #[inline(always)]
    fn as_run_input(&self) -> RunInput<'_> {
        *self
    }
}
