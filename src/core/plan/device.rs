//! Devices (accelerators) for executors that run on one: memory that workspaces own, moves
//! between host and device, and kernels that run on device memory.
//!
//! The core knows no accelerator API: an executor brings its device (the CUDA executors bring
//! one made with `cudarc`) and downcasts buffers to its own type. A plan compiled with device
//! executors inserts an explicit upload where a device op reads a host value, and a download
//! where a host op (or the caller) reads a device value; each workspace allocates its device
//! buffers once, so steady-state runs make no device allocation.

use std::any::Any;

use crate::error::{Error, Result};

/// Memory on a device, owned by a workspace or a [`DeviceTensor`](crate::DeviceTensor).
///
/// A buffer holds its value dense, row-major, in the words [`Device::upload`] writes (the
/// layout the runtime packs and unpacks): so a `reshape` on the device is a view of its
/// input's buffer, and the runtime asks no executor for a `reshape` kernel (a reshape that is a
/// plan output gets one, to own its buffer). Values whose lifetimes do not overlap share
/// memory (whole buffers of their length, or overlapping ranges of one block on a device that
/// [`allocates_within`](Device::allocates_within)): a kernel finds in its outputs what an
/// earlier step left, never zeros, and must not keep a buffer past its call.
///
/// Dropping one must be ordered after the work already queued on its device (as CUDA's
/// stream-ordered frees are): a run queued by `Plan::run_on_device` may still read a tensor the
/// caller drops right after.
pub trait DeviceBuffer: Send + Sync + 'static {
    /// Number of `f32` elements.
    fn len(&self) -> usize;
    /// Whether it holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For the device's executors to downcast.
    fn as_any(&self) -> &dyn Any;
    /// For the device's executors to downcast.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A device: allocates buffers and moves data to and from the host, in order.
pub trait Device: Send + Sync {
    /// A short name (`cuda:0`).
    fn name(&self) -> &str;
    /// A zeroed buffer of `len` elements.
    ///
    /// # Errors
    /// The device's allocation error.
    fn alloc(&self, len: usize) -> Result<Box<dyn DeviceBuffer>>;
    /// Copies host data into the first `source.len()` words of a device buffer (after the work
    /// already queued).
    ///
    /// # Errors
    /// [`Error::TransferLength`] when `target` holds fewer words than `source` (never a panic);
    /// the device's copy error.
    fn upload(&self, source: &[f32], target: &mut dyn DeviceBuffer) -> Result<()>;
    /// Copies the first `target.len()` words of a device buffer to the host, waiting for the
    /// work queued before it.
    ///
    /// # Errors
    /// [`Error::TransferLength`] when `source` holds fewer words than `target` (never a panic);
    /// the device's copy error.
    fn download(&self, source: &dyn DeviceBuffer, target: &mut [f32]) -> Result<()>;
    /// Whether it makes buffers within one allocation ([`alloc_within`](Self::alloc_within)):
    /// then a plan places the values it computes in one block of a workspace, values that are
    /// never live at the same time at overlapping ranges, instead of sharing whole buffers of
    /// one length among them. Default: no. A device that says yes overrides `alloc_within`
    /// too (workspaces count the block once).
    fn allocates_within(&self) -> bool {
        false
    }
    /// Buffers at the `(offset, len)` word ranges `parts` of one new allocation of `words`
    /// words, in the order of `parts`, when [`allocates_within`](Self::allocates_within) says
    /// so. Ranges may overlap: a plan gives overlapping ones to values never live at the same
    /// time, and orders their uses on the device's queue. The allocation lives as long as any
    /// of its buffers. Default: each part allocated on its own (correct, without the sharing).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] (or the device's allocation error); an error naming a part past
    /// the end of the allocation.
    fn alloc_within(&self, words: usize, parts: &[(usize, usize)]) -> Result<Vec<Box<dyn DeviceBuffer>>> {
        let _ = words;
        parts.iter().map(|&(_, len)| self.alloc(len)).collect()
    }
    /// Copies the first `target.len()` words of `source` into `target`, both on this device,
    /// after the work already queued. Default: through the host (a download and an upload, and
    /// a host buffer of `target.len()` words, allocated per call); devices override it with a
    /// copy on the device. Plans copy only where a run other than
    /// [`Plan::run_updating_on_device`](crate::Plan::run_updating_on_device) gives on the
    /// device an input that an update is written over ([`DeviceKernel::in_place`]).
    ///
    /// # Errors
    /// [`Error::TransferLength`] when `source` holds fewer words than `target`; the device's
    /// copy error; [`Error::OutOfMemory`] when the host cannot hold `target`'s words.
    fn copy(&self, source: &dyn DeviceBuffer, target: &mut dyn DeviceBuffer) -> Result<()> {
        if source.len() < target.len() {
            return Err(Error::TransferLength { direction: "copy", host: target.len(), device: source.len() });
        }
        let mut host = Vec::new();
        super::packing::reserve_words(&mut host, target.len(), "the default `Device::copy`'s host buffer")?;
        host.resize(target.len(), 0.0);
        self.download(source, &mut host)?;
        self.upload(&host, target)
    }
    /// Waits until the work queued on the device so far is done (for timing, or before reading
    /// device memory by other means). Default: nothing to wait for.
    ///
    /// # Errors
    /// The device's error.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// A queue of its own for one workspace's work (a CUDA stream), so that runs of one plan
    /// from several threads, each in its own workspace, overlap on the device. `None`: the
    /// device has one queue. Default: `None`.
    ///
    /// # Errors
    /// The device's error.
    fn new_queue(&self) -> Result<Option<Box<dyn DeviceQueue>>> {
        Ok(None)
    }
    /// A queue for one workspace's work that is the device's own queue
    /// ([`Plan::workspace_on_device_queue`](crate::Plan::workspace_on_device_queue)): entering
    /// and leaving it need not order anything with the device's queue, its runs come after what
    /// was queued there and before what is queued there later. A device that cannot capture
    /// such a queue into a graph refuses [`begin_capture`](Self::begin_capture) on it.
    /// Default: [`new_queue`](Self::new_queue) (a queue of its own).
    ///
    /// # Errors
    /// The device's error.
    fn device_queue(&self) -> Result<Option<Box<dyn DeviceQueue>>> {
        self.new_queue()
    }
    /// Sends this thread's device work to `queue` (a queue of this device's), after the work
    /// already queued on the device's own queue, until [`leave_queue`](Self::leave_queue).
    /// Default: nothing to do.
    ///
    /// # Errors
    /// The device's error.
    fn enter_queue(&self, _queue: &dyn DeviceQueue) -> Result<()> {
        Ok(())
    }
    /// Ends [`enter_queue`](Self::enter_queue): work queued on the device's own queue from
    /// now on (downloads, frees, other runs' inputs) comes after the work sent to `queue`.
    /// Default: nothing to do.
    ///
    /// # Errors
    /// The device's error.
    fn leave_queue(&self, _queue: &dyn DeviceQueue) -> Result<()> {
        Ok(())
    }
    /// Starts recording the work this thread queues (on the queue it entered, else the
    /// device's own), instead of running it, for [`end_capture`](Self::end_capture) (CUDA
    /// graphs). Default: unsupported.
    ///
    /// # Errors
    /// [`Error::GraphUnsupported`] when the device cannot capture.
    fn begin_capture(&self) -> Result<()> {
        Err(Error::GraphUnsupported { reason: format!("device `{}` cannot capture work into a graph", self.name()) })
    }
    /// Stops recording and returns what was recorded, ready to replay. Default: unsupported.
    ///
    /// # Errors
    /// [`Error::GraphUnsupported`] when the device cannot capture; the device's error.
    fn end_capture(&self) -> Result<Box<dyn DeviceGraph>> {
        Err(Error::GraphUnsupported { reason: format!("device `{}` cannot capture work into a graph", self.name()) })
    }
}

/// A queue of device work of one workspace (see [`Device::new_queue`]).
pub trait DeviceQueue: Send + Sync {
    /// For the device to downcast.
    fn as_any(&self) -> &dyn Any;
}

/// Work recorded on a device by [`Device::begin_capture`] and [`Device::end_capture`], replayed
/// as one launch.
pub trait DeviceGraph: Send + Sync {
    /// Queues one replay of the recorded work.
    ///
    /// # Errors
    /// The device's launch error.
    fn launch(&self) -> Result<()>;
}

/// A compiled bound symbol that runs on a device, reading and writing device buffers.
///
/// The plan calls [`run`](Self::run) on the thread that runs the plan, with the run's queue
/// entered ([`Device::enter_queue`]): the kernel queues its work there, reads only its inputs
/// and writes its outputs whole, and keeps no buffer past the call (the workspace hands the
/// same memory to other steps, in queue order). An error it returns is the run's error. For
/// CUDA, `executors::cuda::CudaKernel` wraps all of this (typed memory, the stream, state per
/// workspace) and spells out the contract.
pub trait DeviceKernel: Send + Sync {
    /// Queues the computation; outputs are sized to the shapes the trace declares.
    ///
    /// # Errors
    /// The device's launch error.
    fn run(&self, inputs: &[&dyn DeviceBuffer], outputs: &mut [&mut dyn DeviceBuffer]) -> Result<()>;

    /// What the plan's listing says of how the kernel runs, on its step's line after the
    /// executor (and any in-place note): the built-in kernels whose rows are split over
    /// thread-block clusters say `128 blocks in clusters of 8`. One line, no newline.
    /// Default: nothing.
    fn launch_note(&self) -> Option<String> {
        None
    }

    /// Whether the plan must call [`check_after_run`](Self::check_after_run) after each run
    /// (a kernel that checks its inputs on the device, as the built-in `embedding` checks its
    /// ids). Such a plan waits for the device at the end of every run, and cannot be captured
    /// as a graph. Default: no.
    fn checks_after_run(&self) -> bool {
        false
    }

    /// Reports what the kernel found while the run ran, once the run's device work is done (the
    /// plan calls it on the thread that queued the run, on the run's queue): an id out of range
    /// is [`Error::IndexOutOfRange`], returned by the run that
    /// queued the kernel. Default: nothing to report.
    ///
    /// # Errors
    /// What the kernel found, or the device's copy error.
    fn check_after_run(&self) -> Result<()> {
        Ok(())
    }

    /// Whether this kernel may write its output `output` over its input `input`: it reads and
    /// writes each element of the two at the same position only, reading it before writing it
    /// (an elementwise update, as an optimizer's step is). Default: no.
    ///
    /// The plan asks for the pairs [`OpView::in_place_updates`](crate::OpView::in_place_updates)
    /// lists: an output that updates a trace input in place ([`TraceBuilder::update`](crate::TraceBuilder::update))
    /// computed from that input, which no later step reads. Where the kernel agrees, the run
    /// hands it, at position `input`, an empty buffer (`len() == 0`), and at `output` the
    /// buffer that holds the input's value: with
    /// [`Plan::run_updating_on_device`](crate::Plan::run_updating_on_device), the caller's
    /// own, so that a training step keeps one copy of its parameters and optimizer state.
    fn in_place(&self, input: usize, output: usize) -> bool {
        let _ = (input, output);
        false
    }
}

/// The buffer a kernel run in place finds at the position of the input its output overwrites
/// ([`DeviceKernel::in_place`]), and what an input updated in place holds while a run lends
/// its memory to the workspace: no memory (a zero-sized box allocates nothing).
pub(crate) struct Vacant;

impl DeviceBuffer for Vacant {
    fn len(&self) -> usize {
        0
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
