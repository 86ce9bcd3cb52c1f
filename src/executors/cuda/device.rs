//! `CudaDevice`: one CUDA context, its stream and one per workspace, buffers from `cudarc`, a
//! cache of compiled kernels (each generated source compiled by NVRTC once per device), graphs,
//! and page-locked staging for large uploads.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, PinnedHostSlice};

use super::{availability, RegionSource};
use crate::core::plan::{Availability, Device, DeviceBuffer, DeviceGraph, DeviceQueue};
use crate::error::{Error, Result};
use crate::executors::worker_pool::{parts_for, run_parts_writing};

/// A CUDA device: context, its own stream (uploads and downloads outside runs, and the order
/// between runs), a stream per workspace that runs on it (see `Device::new_queue`), compiled
/// kernels, and page-locked staging buffers for large uploads.
pub struct CudaDevice {
    name: String,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Mutex<HashMap<String, CudaFunction>>,
    /// Host-to-device and device-to-host copies made so far.
    transfers: AtomicU64,
    /// Page-locked staging buffers for large uploads and downloads, one per size, the most
    /// recent last; one staged transfer at a time.
    staging: Mutex<Vec<Staging>>,
}

/// A page-locked staging buffer and the event after the last copy from it.
struct Staging {
    host: PinnedHostSlice<f32>,
    copied: Option<cudarc::driver::CudaEvent>,
}

impl Drop for Staging {
    /// The copy reading it finishes before it is freed.
    fn drop(&mut self) {
        if let Some(copied) = self.copied.take() {
            let _ = copied.synchronize();
        }
    }
}

thread_local! {
    /// The queues entered on this thread (innermost last), with the address of their device.
    static CURRENT_QUEUE: std::cell::RefCell<Vec<(usize, Arc<CudaStream>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A workspace's own CUDA stream.
pub(crate) struct CudaQueue(Arc<CudaStream>);

impl DeviceQueue for CudaQueue {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Uploads and downloads of at least this many elements (1 MiB) go through a page-locked
/// staging buffer.
const STAGED_UPLOAD: usize = 1 << 18;

/// How many staging buffers (of different sizes) a device keeps.
const STAGING_BUFFERS: usize = 8;

/// A device buffer of `f32`.
pub struct CudaBuffer(pub(crate) CudaSlice<f32>);

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

pub(crate) fn cuda_error(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Execution { executor: "cuda".into(), symbol: what.into(), message: format!("{e:?}") }
}

impl CudaDevice {
    /// Device 0, or why it cannot be used.
    ///
    /// # Errors
    /// [`Error::ExecutorUnavailable`] when there is no driver or no device.
    pub fn new() -> Result<Arc<Self>> {
        if let Availability::Unavailable(reason) = availability() {
            return Err(Error::ExecutorUnavailable { executor: "cuda".into(), reason });
        }
        let context = CudaContext::new(0).map_err(|e| cuda_error("CudaContext::new", e))?;
        // SAFETY: every plan queues its work, in order, on the one stream below; cudarc's
        // per-buffer events (which order work across streams, at a cost per launch) are not
        // needed.
        unsafe { context.disable_event_tracking() };
        // A stream of its own, not the legacy default stream: work on it can be captured into
        // a CUDA graph.
        let stream = context.new_stream().map_err(|e| cuda_error("new stream", e))?;
        name_stream(&stream, "boundscope cuda:0");
        let name = format!("cuda:0 ({})", context.name().unwrap_or_default());
        let kernels = Mutex::new(HashMap::new());
        Ok(Arc::new(Self {
            name,
            context,
            stream,
            kernels,
            transfers: AtomicU64::new(0),
            staging: Mutex::new(Vec::new()),
        }))
    }

    /// The stream this thread's work on this device goes to: the workspace queue of the run
    /// in progress on this thread, else the device's own stream.
    pub(crate) fn stream(&self) -> Arc<CudaStream> {
        let me = self as *const Self as usize;
        CURRENT_QUEUE
            .with(|q| q.borrow().iter().rev().find(|(d, _)| *d == me).map(|(_, s)| s.clone()))
            .unwrap_or_else(|| self.stream.clone())
    }

    /// The compiled kernel of a generated source, compiling it with NVRTC the first time.
    pub(crate) fn function(&self, generated: &RegionSource) -> Result<CudaFunction> {
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = kernels.get(&generated.source) {
            return Ok(f.clone());
        }
        let ptx = cudarc::nvrtc::compile_ptx(&generated.source).map_err(|e| cuda_error(&generated.kernel, e))?;
        let module = self.context.load_module(ptx).map_err(|e| cuda_error(&generated.kernel, e))?;
        let function = module.load_function(&generated.kernel).map_err(|e| cuda_error(&generated.kernel, e))?;
        kernels.insert(generated.source.clone(), function.clone());
        Ok(function)
    }

    /// The page-locked staging buffer of `len` elements (made, or reused from an earlier
    /// transfer of that size), once the last copy from or into it is done.
    fn staging_buffer<'s>(&self, staging: &'s mut Vec<Staging>, len: usize) -> Result<&'s mut Staging> {
        if !staging.iter().any(|s| s.host.len() == len) {
            if staging.len() >= STAGING_BUFFERS {
                // Dropping one waits for the copy still using it.
                staging.remove(0);
            }
            // SAFETY: the memory is uninitialized until written; every transfer writes the
            // part it reads before reading it (an upload fills it on the host, a download
            // copies into it on the device and waits).
            let host = unsafe { self.context.alloc_pinned::<f32>(len) }.map_err(|e| cuda_error("alloc pinned", e))?;
            staging.push(Staging { host, copied: None });
        }
        let buffer = staging.iter_mut().find(|s| s.host.len() == len).expect("just made");
        // An earlier copy from this buffer must be done before it is used again (cudarc's own
        // tracking is off on this device: see `new`).
        if let Some(copied) = buffer.copied.take() {
            copied.synchronize().map_err(|e| cuda_error("staging", e))?;
        }
        Ok(buffer)
    }

    /// Uploads through a page-locked staging buffer of `source`'s size (kept for the next
    /// transfer of that size), filled in parallel on the CPU workers: a copy from pageable
    /// memory runs at a fraction of what the bus carries.
    fn staged_upload(&self, source: &[f32], target: &mut dyn DeviceBuffer) -> Result<()> {
        let target = slice_mut(target)?;
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let buffer = self.staging_buffer(&mut staging, source.len())?;
        let host = buffer.host.as_mut_slice().map_err(|e| cuda_error("staging", e))?;
        // Filled on the CPU executors' worker threads (persistent, and named for profilers:
        // `boundscope-cpu-<k>`), a part each.
        let parts = parts_for(0, source.len(), STAGED_UPLOAD / 4);
        run_parts_writing(host, parts, 1, |r: std::ops::Range<usize>, to: &mut [f32]| to.copy_from_slice(&source[r]));
        let mut view = target.slice_mut(0..source.len());
        let stream = self.stream();
        stream.memcpy_htod(&buffer.host, &mut view).map_err(|e| cuda_error("upload", e))?;
        buffer.copied = Some(stream.record_event(None).map_err(|e| cuda_error("record event", e))?);
        Ok(())
    }

    /// Downloads through a page-locked staging buffer of `target`'s size: the device copies
    /// into it at the bus's speed, then the CPU workers copy it out in parallel. Waits for the
    /// device, as every download does.
    fn staged_download(&self, source: &dyn DeviceBuffer, target: &mut [f32]) -> Result<()> {
        let source = slice(source)?;
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let buffer = self.staging_buffer(&mut staging, target.len())?;
        let stream = self.stream();
        let view = source.slice(0..target.len());
        stream.memcpy_dtoh(&view, &mut buffer.host).map_err(|e| cuda_error("download", e))?;
        stream.synchronize().map_err(|e| cuda_error("synchronize", e))?;
        let host = buffer.host.as_slice().map_err(|e| cuda_error("staging", e))?;
        let parts = parts_for(0, target.len(), STAGED_UPLOAD / 4);
        run_parts_writing(target, parts, 1, |r: std::ops::Range<usize>, to: &mut [f32]| to.copy_from_slice(&host[r]));
        Ok(())
    }

    /// The copies between host and device made so far (uploads and downloads, by plans and by
    /// [`DeviceTensor`](crate::DeviceTensor)s): a plan whose values all stay on the device makes
    /// none per run.
    pub fn transfers(&self) -> u64 {
        self.transfers.load(Ordering::Relaxed)
    }

    /// The number of kernels compiled so far.
    pub fn compiled_kernels(&self) -> usize {
        self.kernels.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Workspace queues made so far, to number their streams' names.
static QUEUES: AtomicU64 = AtomicU64::new(0);

/// Gives `stream` a name that Nsight shows (`nvtxNameCuStreamA`); nothing without a tool.
fn name_stream(stream: &CudaStream, name: &str) {
    if let Ok(name) = std::ffi::CString::new(name) {
        let handle: nvtx::sys::CuStream = stream.cu_stream().cast();
        nvtx::name_cuda_resource(nvtx::CudaResource::Stream(handle), name);
    }
}

/// A captured CUDA graph; replays are serialized, as CUDA requires for one graph.
struct CudaPlanGraph(Mutex<CudaGraph>);

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// serialized (CUDA driver API, "Graph object thread safety"); the mutex serializes them.
unsafe impl Send for CudaPlanGraph {}
// SAFETY: as above: every use goes through the mutex.
unsafe impl Sync for CudaPlanGraph {}

impl DeviceGraph for CudaPlanGraph {
    fn launch(&self) -> Result<()> {
        let graph = self.0.lock().unwrap_or_else(|p| p.into_inner());
        graph.launch().map_err(|e| cuda_error("graph launch", e))
    }
}

pub(crate) fn slice(buffer: &dyn DeviceBuffer) -> Result<&CudaSlice<f32>> {
    buffer.as_any().downcast_ref::<CudaBuffer>().map(|b| &b.0).ok_or_else(|| cuda_error("buffer", "not a CUDA buffer"))
}

pub(crate) fn slice_mut(buffer: &mut dyn DeviceBuffer) -> Result<&mut CudaSlice<f32>> {
    buffer
        .as_any_mut()
        .downcast_mut::<CudaBuffer>()
        .map(|b| &mut b.0)
        .ok_or_else(|| cuda_error("buffer", "not a CUDA buffer"))
}

impl Device for CudaDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, len: usize) -> Result<Box<dyn DeviceBuffer>> {
        let bytes = len.max(1).saturating_mul(std::mem::size_of::<f32>());
        let slice = self.stream.alloc_zeros::<f32>(len.max(1)).map_err(|e| {
            if e.0 != sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                return cuda_error("alloc", e);
            }
            let free = cudarc::driver::result::mem_get_info().map(|(free, _)| free).unwrap_or(0);
            Error::OutOfMemory {
                what: format!("{} (device memory: {free} bytes free)", self.name),
                shape: vec![len],
                bytes,
            }
        })?;
        Ok(Box::new(CudaBuffer(slice)))
    }

    fn upload(&self, source: &[f32], target: &mut dyn DeviceBuffer) -> Result<()> {
        self.transfers.fetch_add(1, Ordering::Relaxed);
        if source.len() >= STAGED_UPLOAD {
            return self.staged_upload(source, target);
        }
        let target = slice_mut(target)?;
        let mut view = target.slice_mut(0..source.len());
        self.stream().memcpy_htod(source, &mut view).map_err(|e| cuda_error("upload", e))
    }

    fn download(&self, source: &dyn DeviceBuffer, target: &mut [f32]) -> Result<()> {
        self.transfers.fetch_add(1, Ordering::Relaxed);
        if target.len() >= STAGED_UPLOAD {
            return self.staged_download(source, target);
        }
        let source = slice(source)?;
        let view = source.slice(0..target.len());
        let stream = self.stream();
        stream.memcpy_dtoh(&view, target).map_err(|e| cuda_error("download", e))?;
        stream.synchronize().map_err(|e| cuda_error("synchronize", e))
    }

    fn synchronize(&self) -> Result<()> {
        // The device's own stream waits for every run that left its queue (see `leave_queue`).
        self.stream().synchronize().map_err(|e| cuda_error("synchronize", e))
    }

    fn new_queue(&self) -> Result<Option<Box<dyn DeviceQueue>>> {
        let stream = self.context.new_stream().map_err(|e| cuda_error("new stream", e))?;
        let queue = QUEUES.fetch_add(1, Ordering::Relaxed) + 1;
        name_stream(&stream, &format!("boundscope workspace {queue}"));
        Ok(Some(Box::new(CudaQueue(stream))))
    }

    fn enter_queue(&self, queue: &dyn DeviceQueue) -> Result<()> {
        let queue =
            queue.as_any().downcast_ref::<CudaQueue>().ok_or_else(|| cuda_error("queue", "not a CUDA queue"))?;
        // The run comes after what the device's stream holds (uploads of its inputs, say).
        let before = self.stream.record_event(None).map_err(|e| cuda_error("record event", e))?;
        queue.0.wait(&before).map_err(|e| cuda_error("wait event", e))?;
        let me = self as *const Self as usize;
        CURRENT_QUEUE.with(|q| q.borrow_mut().push((me, queue.0.clone())));
        Ok(())
    }

    fn leave_queue(&self, queue: &dyn DeviceQueue) -> Result<()> {
        let me = self as *const Self as usize;
        CURRENT_QUEUE.with(|q| {
            let mut q = q.borrow_mut();
            if let Some(i) = q.iter().rposition(|(d, _)| *d == me) {
                q.remove(i);
            }
        });
        let queue =
            queue.as_any().downcast_ref::<CudaQueue>().ok_or_else(|| cuda_error("queue", "not a CUDA queue"))?;
        // What comes later on the device's stream (downloads, frees, graphs' inputs) waits for
        // the run.
        let after = queue.0.record_event(None).map_err(|e| cuda_error("record event", e))?;
        self.stream.wait(&after).map_err(|e| cuda_error("wait event", e))
    }

    fn begin_capture(&self) -> Result<()> {
        // Thread-local mode: CUDA calls of other threads are not refused, and their runs go to
        // their own workspaces' streams, not to the one being recorded (`Plan::capture` records
        // on the workspace's queue).
        self.stream()
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| cuda_error("begin capture", e))
    }

    fn end_capture(&self) -> Result<Box<dyn DeviceGraph>> {
        let graph = self
            .stream()
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| cuda_error("end capture", e))?
            .ok_or_else(|| Error::GraphUnsupported { reason: "nothing was captured".into() })?;
        graph.upload().map_err(|e| cuda_error("graph upload", e))?;
        Ok(Box::new(CudaPlanGraph(Mutex::new(graph))))
    }
}
