//! `CudaDevice`: one CUDA context, its stream and one per workspace, buffers from `cudarc`, a
//! cache of compiled kernels (each generated source compiled by NVRTC once per device), graphs,
//! and page-locked staging for large uploads.

use std::any::Any;
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice};
use cudarc::nvrtc::Ptx;

use super::stream_order::{OwnStream, QueueOrder, StreamOrder};
use super::{availability, RegionSource};
use crate::core::plan::{Availability, Device, DeviceBuffer, DeviceGraph, DeviceQueue};
use crate::error::{Error, Result};
use crate::executors::worker_pool::{parts_for, run_parts_writing};

/// A CUDA device: context, its own stream (uploads and downloads outside runs, and the order
/// between runs), a stream per workspace that runs on it (see `Device::new_queue`), compiled
/// kernels, and page-locked staging buffers for large uploads.
pub struct CudaDevice {
    name: String,
    ordinal: usize,
    context: Arc<CudaContext>,
    /// The device's own stream, and its order with the workspaces' streams.
    order: Arc<StreamOrder>,
    kernels: Mutex<HashMap<String, CudaFunction>>,
    /// The virtual architecture kernels are compiled for: the GPU's own where NVRTC compiles
    /// for it (so that sources may use its instructions, behind `__CUDA_ARCH__`), else NVRTC's
    /// default ([`kernel_arch`]).
    arch: Option<&'static str>,
    /// Host-to-device and device-to-host copies made so far.
    transfers: AtomicU64,
    /// Page-locked staging for large uploads and downloads; one staged transfer at a time.
    staging: Mutex<Staging>,
    /// Page-locked allocations made so far.
    pins: AtomicU64,
    /// What its streams' names start with ([`name_streams`](Self::name_streams)).
    stream_prefix: Mutex<String>,
}

/// Two page-locked chunks of [`STAGING_CHUNK`] words, used in turn: a transfer of any size goes
/// through them a chunk at a time, so that filling (or emptying) one on the host overlaps the
/// copy of the other on the bus. Made by the first staged transfer and kept: the pinned memory
/// is the same whatever the sizes a plan moves, and nothing is pinned again.
#[derive(Default)]
struct Staging {
    chunks: Vec<Chunk>,
    /// The chunk the next transfer starts with.
    next: usize,
}

/// A staging chunk and the event after the last copy from or into it.
struct Chunk {
    host: PinnedHostSlice<f32>,
    copied: cudarc::driver::CudaEvent,
}

impl Drop for Chunk {
    /// The copy using it finishes before it is freed.
    fn drop(&mut self) {
        let _ = self.copied.synchronize();
    }
}

/// The virtual architecture kernels are compiled for on a GPU of compute capability
/// `major.minor`: its own (`compute_90` on Hopper), where this NVRTC compiles for it (an NVRTC
/// older than the GPU does not know it); else `None`, NVRTC's default. Asked once per device,
/// so that every kernel compiles once, and a kernel that fails to compile for the GPU's own
/// architecture says so instead of quietly taking the default's code.
fn kernel_arch(major: i32, minor: i32) -> Option<&'static str> {
    // One string per device opened (a handful per process: devices are shared and kept).
    let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
    let options = cudarc::nvrtc::CompileOptions { arch: Some(arch), ..Default::default() };
    let probe = "extern \"C\" __global__ void boundscope_probe() {}";
    cudarc::nvrtc::compile_ptx_with_opts(probe, options).is_ok().then_some(arch)
}

/// `source` compiled to PTX for `arch` (NVRTC's default architecture for `None`).
fn compile(source: &str, arch: Option<&'static str>) -> std::result::Result<Ptx, cudarc::nvrtc::CompileError> {
    cudarc::nvrtc::compile_ptx_with_opts(source, cudarc::nvrtc::CompileOptions { arch, ..Default::default() })
}

thread_local! {
    /// The queues entered on this thread (innermost last), with the address of their device's
    /// [`StreamOrder`] (one per device).
    static CURRENT_QUEUE: std::cell::RefCell<Vec<(usize, Arc<Queue>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The state users' kernels keep per workspace ([`CudaKernel::State`](super::CudaKernel::State)),
/// by kernel id.
type KernelStates = Mutex<Vec<(u64, Box<dyn Any + Send>)>>;

/// A workspace's own CUDA stream, and what users' kernels keep for it.
pub(crate) struct CudaQueue(Arc<Queue>);

pub(crate) struct Queue {
    /// Dropped first: a user's handle made for the stream goes before it.
    states: KernelStates,
    /// Its events and epoch in the order with the device's stream (see `stream_order`).
    pub(crate) order: QueueOrder,
    pub(crate) stream: Arc<CudaStream>,
    /// Streams with work of the run's that the run's stream must wait for before the run
    /// leaves the queue ([`CudaRun::keep_joined`](super::CudaRun::keep_joined)).
    pub(crate) joins: Joins,
}

/// The streams a run must join before it leaves its queue (see [`Queue::joins`]), with their
/// count beside them, written under the lock: a run that leaves with none (almost every run)
/// takes no lock.
#[derive(Default)]
pub(crate) struct Joins {
    streams: Mutex<Vec<Arc<CudaStream>>>,
    len: AtomicUsize,
}

impl Joins {
    /// Adds `side`, unless it is there already.
    pub(crate) fn add(&self, side: &Arc<CudaStream>) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if !streams.iter().any(|s| Arc::ptr_eq(s, side)) {
            streams.push(side.clone());
        }
        self.len.store(streams.len(), Ordering::Release);
    }

    /// Removes `side`, if it is there.
    fn remove(&self, side: &Arc<CudaStream>) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.retain(|s| !Arc::ptr_eq(s, side));
        self.len.store(streams.len(), Ordering::Release);
    }

    /// Makes `stream` wait for every stream added, which are then removed (all of them, also
    /// after a failed wait); the first failure is returned.
    fn join_all(&self, stream: &CudaStream) -> Result<()> {
        // (Streams are added by the run's own thread, before it leaves: none is missed.)
        if self.len.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let mut joined = Ok(());
        for side in streams.drain(..) {
            if joined.is_ok() {
                joined = stream.join(&side).map_err(|e| cuda_error("join a kernel's stream", e));
            }
        }
        self.len.store(0, Ordering::Release);
        joined
    }
}

/// Where a thread's work for a device goes ([`CudaDevice::run_place`]).
pub(crate) enum RunPlace {
    /// The queue of the run in progress on the device.
    Run(Arc<Queue>),
    /// Outside any run: the device's own stream.
    Outside,
    /// The thread is in a run on another device (a kernel given this device while its
    /// executor runs on another).
    InAnotherDevicesRun,
}

impl Queue {
    /// The state user kernel `id` keeps in this queue's workspace, taken out for the kernel's
    /// call (`None`: it has none there yet); [`put_state`](Self::put_state) puts it back. Taken
    /// out, not borrowed, so that no lock is held while the user's code runs.
    pub(crate) fn take_state(&self, id: u64) -> Option<Box<dyn Any + Send>> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        states.iter().position(|(k, _)| *k == id).map(|i| states.swap_remove(i).1)
    }

    /// Puts back a state taken by [`take_state`](Self::take_state) (no allocation once the
    /// workspace has held it).
    pub(crate) fn put_state(&self, id: u64, state: Box<dyn Any + Send>) {
        self.states.lock().unwrap_or_else(|p| p.into_inner()).push((id, state));
    }
}

/// The stream work goes to ([`CudaDevice::stream`]).
pub(crate) enum WorkStream<'d> {
    /// The queue of the run in progress.
    Queue(Arc<Queue>),
    /// The device's own stream, outside runs.
    Own(OwnStream<'d>),
}

impl std::ops::Deref for WorkStream<'_> {
    type Target = Arc<CudaStream>;
    fn deref(&self) -> &Arc<CudaStream> {
        match self {
            Self::Queue(queue) => &queue.stream,
            Self::Own(own) => own,
        }
    }
}

impl DeviceQueue for CudaQueue {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Uploads and downloads of at least this many words (1 MiB) go through page-locked staging.
const STAGED_UPLOAD: usize = 1 << 18;

/// Words per staging chunk (16 MiB).
const STAGING_CHUNK: usize = 1 << 22;

/// A device buffer of `f32`: an allocation of its own, or a range of a block that several
/// buffers share ([`Device::alloc_within`]).
pub struct CudaBuffer {
    /// Never replaced (what `slice_mut` lends is written through, never swapped for another):
    /// `address` is its address.
    slice: ManuallyDrop<CudaSlice<f32>>,
    /// The order of the device's streams, which a buffer's free waits in.
    order: Arc<StreamOrder>,
    /// The block whose range this buffer is, if any (kept alive by its ranges).
    block: Option<Arc<CudaBuffer>>,
    /// The slice's device address, read once: a launch reads it from here, not through
    /// cudarc's `DevicePtr`, whose per-buffer events are off on every `CudaDevice` (it would
    /// only return the same address, at a cost per buffer and launch).
    address: sys::CUdeviceptr,
}

impl CudaBuffer {
    fn new(slice: CudaSlice<f32>, order: Arc<StreamOrder>, block: Option<Arc<CudaBuffer>>) -> Self {
        // (Event tracking is off on this context: `device_ptr` records and waits for nothing.)
        let address = cudarc::driver::DevicePtr::device_ptr(&slice, slice.stream()).0;
        Self { slice: ManuallyDrop::new(slice), order, block, address }
    }
}

impl Drop for CudaBuffer {
    /// Freed on the device's stream after the runs that may still use it: those that left
    /// their queues, and the one in progress on this thread, if any. A range of a block frees
    /// nothing: the block goes when its last range does.
    fn drop(&mut self) {
        // SAFETY: the slice is not used after this (the buffer is being dropped).
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        if self.block.is_some() {
            // Its memory is the block's.
            let _ = slice.leak();
            return;
        }
        // (Not while the run is being captured into a graph: nothing it captures is freed.)
        if let Some(queue) = current_queue_of(&self.order).filter(|q| !capturing(&q.stream)) {
            let _ = self.order.leave(&queue);
        }
        if self.order.wait_for_runs(None).is_err() {
            // The device is in error: wait for all of it rather than free memory in use.
            let _ = slice.stream().synchronize();
        }
        drop(slice);
    }
}

/// Whether `stream` is recording into a graph.
fn capturing(stream: &CudaStream) -> bool {
    stream.capture_status().is_ok_and(|s| s != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// The key of a device's entries in [`CURRENT_QUEUE`]: its stream order's address.
fn queue_key(order: &Arc<StreamOrder>) -> usize {
    Arc::as_ptr(order) as usize
}

/// The queue of the run in progress on this thread on the device of `order`, if any.
fn current_queue_of(order: &Arc<StreamOrder>) -> Option<Arc<Queue>> {
    let me = queue_key(order);
    CURRENT_QUEUE.with(|q| q.borrow().iter().rev().find(|(d, _)| *d == me).map(|(_, q)| q.clone()))
}

impl DeviceBuffer for CudaBuffer {
    fn len(&self) -> usize {
        self.slice.len()
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
    /// The process's handle of GPU 0 (as [`with_ordinal(0)`](Self::with_ordinal)), or why it
    /// cannot be used.
    ///
    /// # Errors
    /// [`Error::ExecutorUnavailable`] when there is no driver or no device.
    pub fn new() -> Result<Arc<Self>> {
        Self::with_ordinal(0)
    }

    /// The process's handle of GPU `ordinal`: every call for one GPU returns the same handle
    /// (one context, one set of streams, compiled kernels and staging buffers), so tensors
    /// uploaded through a handle you made run in plans of the front end, and the other way
    /// round. The handle lives until the process ends.
    ///
    /// ```no_run
    /// # // Needs a GPU: `proptests/cuda_matches_reference.rs` runs this on the H200.
    /// use std::sync::Arc;
    /// use boundscope::executors::cuda::CudaDevice;
    /// let a = CudaDevice::new()?;
    /// assert!(Arc::ptr_eq(&a, &CudaDevice::with_ordinal(0)?));
    /// assert_eq!(a.ordinal(), 0);
    /// # Ok::<(), boundscope::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::ExecutorUnavailable`] when there is no driver, or no GPU of that ordinal (the
    /// message gives the number of GPUs).
    pub fn with_ordinal(ordinal: usize) -> Result<Arc<Self>> {
        static DEVICES: Mutex<Vec<Arc<CudaDevice>>> = Mutex::new(Vec::new());
        let mut devices = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(device) = devices.iter().find(|d| d.ordinal == ordinal) {
            return Ok(device.clone());
        }
        let device = Arc::new(Self::open(ordinal)?);
        devices.push(device.clone());
        Ok(device)
    }

    /// A new handle of GPU `ordinal`, for [`with_ordinal`](Self::with_ordinal) to share.
    fn open(ordinal: usize) -> Result<Self> {
        if let Availability::Unavailable(reason) = availability() {
            return Err(Error::ExecutorUnavailable { executor: "cuda".into(), reason });
        }
        let count = CudaContext::device_count().map_err(|e| cuda_error("cuDeviceGetCount", e))?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(Error::ExecutorUnavailable {
                executor: "cuda".into(),
                reason: format!("there is no GPU {ordinal}: this machine has {count} (ordinals 0..{count})"),
            });
        }
        let context = CudaContext::new(ordinal).map_err(|e| cuda_error("CudaContext::new", e))?;
        // SAFETY: the runtime orders the streams it queues work on itself (`stream_order`:
        // the device's own stream and one per workspace); cudarc's per-buffer events (which
        // order work across streams, at a cost per launch) are not needed.
        unsafe { context.disable_event_tracking() };
        // A stream of its own, not the legacy default stream: work on it can be captured into
        // a CUDA graph.
        let stream = context.new_stream().map_err(|e| cuda_error("new stream", e))?;
        name_stream(&stream, &format!("{STREAM_PREFIX} cuda:{ordinal}"));
        let name = format!("cuda:{ordinal} ({})", context.name().unwrap_or_default());
        let kernels = Mutex::new(HashMap::new());
        let arch = context.compute_capability().ok().and_then(|(major, minor)| kernel_arch(major, minor));
        Ok(Self {
            name,
            ordinal,
            context,
            order: Arc::new(StreamOrder::new(stream)),
            kernels,
            arch,
            transfers: AtomicU64::new(0),
            staging: Mutex::new(Staging::default()),
            pins: AtomicU64::new(0),
            stream_prefix: Mutex::new(STREAM_PREFIX.into()),
        })
    }

    /// Says that the run in progress on this thread now waits for `side` (see
    /// [`CudaRun::keep_joined`](super::CudaRun::keep_joined)): it need not join it as it leaves.
    pub(crate) fn joined(&self, side: &Arc<CudaStream>) {
        if let Some(queue) = self.current_queue() {
            queue.joins.remove(side);
        }
    }

    /// Names `stream`, a stream of an executor's own on this device, `<prefix> <what>` (the
    /// prefix of [`name_streams`](Self::name_streams)).
    pub(crate) fn name_side_stream(&self, stream: &CudaStream, what: &str) {
        let prefix = self.stream_prefix.lock().unwrap_or_else(|p| p.into_inner()).clone();
        name_stream(stream, &format!("{prefix} {what}"));
    }

    /// Names its streams, as Nsight Systems shows them, `<prefix> cuda:<ordinal>` (its own) and
    /// `<prefix> workspace <n>` (each workspace's, made from now on), instead of `boundscope
    /// ...`: `rank 1` tells the ranks of a multi-process run apart in their timelines. Calls
    /// `nvtxNameCuStreamA`; nothing without a profiler.
    pub fn name_streams(&self, prefix: impl Into<String>) {
        let prefix = prefix.into();
        name_stream(self.order.stream(), &format!("{prefix} cuda:{}", self.ordinal));
        *self.stream_prefix.lock().unwrap_or_else(|p| p.into_inner()) = prefix;
    }

    /// The virtual architecture its kernels are compiled for (`compute_90` on Hopper), `None`
    /// where NVRTC's default is taken.
    pub(crate) fn arch(&self) -> Option<&'static str> {
        self.arch
    }

    /// Bytes of shared memory a block may take on this GPU when it asks for them (227 KB on
    /// Hopper); 0 where the driver does not say.
    pub(crate) fn shared_memory_per_block(&self) -> usize {
        let optin = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
        self.attribute_or_zero(optin)
    }

    /// Bytes of shared memory an SM holds for the blocks it runs (228 KB on Hopper); 0 where
    /// the driver does not say.
    pub(crate) fn shared_memory_per_sm(&self) -> usize {
        let per_sm = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR;
        self.attribute_or_zero(per_sm)
    }

    /// Bytes of the GPU's L2 cache (50 MiB on the H100 and H200); 0 where the driver does not
    /// say. Kernels with [`KernelVariants::keep_in_l2`](super::KernelVariants::keep_in_l2)
    /// leave tensors that fit in three quarters of it (their inputs in half) without the
    /// streaming hints.
    pub(crate) fn l2_cache_bytes(&self) -> usize {
        self.attribute_or_zero(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
    }

    /// The GPU's SMs (132 on the H100 SXM and the H200); 0 where the driver does not say.
    pub(crate) fn multiprocessors(&self) -> usize {
        self.attribute_or_zero(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    }

    /// Whether its kernels may run as thread-block clusters: they are compiled for its own
    /// architecture (see [`arch`](Self::arch)), Hopper's (`compute_90`) or later.
    pub(crate) fn clusters(&self) -> bool {
        let version = self.arch.and_then(|a| a.strip_prefix("compute_")).and_then(|v| v.parse::<u32>().ok());
        version.is_some_and(|v| v >= 90)
    }

    /// How many clusters of `function`, launched with `config`, fit on the GPU at once, as the
    /// driver counts them (`cuOccupancyMaxActiveClusters`): a cluster takes SMs of one GPC
    /// together, which a MIG instance or an MPS limit on SMs may not have.
    ///
    /// # Errors
    /// The driver's, as [`Error::Execution`].
    pub(crate) fn clusters_that_fit(&self, function: &CudaFunction, config: LaunchConfig) -> Result<u32> {
        // The query runs on this thread's current context, which a cached kernel did not set.
        self.context.bind_to_thread().map_err(|e| cuda_error("binding the device's context", e))?;
        function
            .occupancy_max_active_clusters(config, self.order.stream())
            .map_err(|e| cuda_error("counting the clusters of a kernel that fit the GPU", e))
    }

    /// A device attribute the driver gives as a count or a size; 0 where it does not say.
    fn attribute_or_zero(&self, attribute: sys::CUdevice_attribute) -> usize {
        self.context.attribute(attribute).ok().and_then(|b| usize::try_from(b).ok()).unwrap_or(0)
    }

    /// The GPU's ordinal (0 for the first).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The stream this thread's work on this device goes to: the workspace queue of the run
    /// in progress on this thread, else the device's own stream (after the runs that left
    /// their queues; counted as work on it when the handle is dropped, so queue the work
    /// before dropping it).
    pub(crate) fn stream(&self) -> WorkStream<'_> {
        match self.current_queue() {
            Some(queue) => WorkStream::Queue(queue),
            None => WorkStream::Own(self.order.own()),
        }
    }

    /// The stream a capture records on: the run's queue, else the device's own, with no wait
    /// (which would cross the capture's boundary).
    fn capture_stream(&self) -> Arc<CudaStream> {
        self.current_queue().map_or_else(|| self.order.stream().clone(), |q| q.stream.clone())
    }

    /// The workspace queue of the run in progress on this thread, if any.
    pub(crate) fn current_queue(&self) -> Option<Arc<Queue>> {
        current_queue_of(&self.order)
    }

    /// Where this thread's work for this device goes, from one look at the thread's queues:
    /// the queue of the run in progress on this device, or why there is none.
    pub(crate) fn run_place(&self) -> RunPlace {
        let me = queue_key(&self.order);
        CURRENT_QUEUE.with(|q| {
            let q = q.borrow();
            match q.iter().rev().find(|(d, _)| *d == me) {
                Some((_, queue)) => RunPlace::Run(queue.clone()),
                None if q.is_empty() => RunPlace::Outside,
                None => RunPlace::InAnotherDevicesRun,
            }
        })
    }

    /// The device's own stream, for work outside runs (see [`StreamOrder::own`]).
    pub(crate) fn own_stream(&self) -> OwnStream<'_> {
        self.order.own()
    }

    /// The CUDA context (for loading a module of your own, say).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// The compiled kernel of a generated source, compiling it with NVRTC the first time.
    pub(crate) fn function(&self, generated: &RegionSource) -> Result<CudaFunction> {
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = kernels.get(&generated.source) {
            return Ok(f.clone());
        }
        let ptx = compile(&generated.source, self.arch).map_err(|e| cuda_error(&generated.kernel, e))?;
        let module = self.context.load_module(ptx).map_err(|e| cuda_error(&generated.kernel, e))?;
        let function = module.load_function(&generated.kernel).map_err(|e| cuda_error(&generated.kernel, e))?;
        kernels.insert(generated.source.clone(), function.clone());
        Ok(function)
    }

    /// The kernel `kernel` of CUDA C `source` whose launches pass their parameters by hand
    /// (no region metadata), compiled once per source as [`function`](Self::function) does.
    pub(crate) fn hand_launched(&self, kernel: &str, source: String) -> Result<CudaFunction> {
        self.function(&RegionSource {
            kernel: kernel.to_string(),
            source,
            inputs: 0,
            outputs: 0,
            numel: 0,
            vectorized: false,
            threads: 0,
            input_lengths: Vec::new(),
            output_lengths: Vec::new(),
            in_place: Vec::new(),
            cluster: 1,
        })
    }

    /// The two staging chunks, made the first time.
    fn staging_chunks<'s>(&self, staging: &'s mut Staging) -> Result<&'s mut Staging> {
        while staging.chunks.len() < 2 {
            // SAFETY: the memory is uninitialized until written; every transfer writes the
            // part it reads before reading it (an upload fills it on the host, a download
            // copies into it on the device and waits).
            let host = unsafe { self.context.alloc_pinned_with_flags::<f32>(STAGING_CHUNK, 0) }
                .map_err(|e| cuda_error("alloc pinned", e))?;
            self.pins.fetch_add(1, Ordering::Relaxed);
            let copied = self.context.new_event(None).map_err(|e| cuda_error("staging event", e))?;
            staging.chunks.push(Chunk { host, copied });
        }
        Ok(staging)
    }

    /// Uploads through the staging chunks, each filled in parallel on the CPU workers while the
    /// other one is copied: a copy from pageable memory runs at a fraction of what the bus
    /// carries. Returns once the last chunk's copy is queued.
    fn staged_upload(&self, source: &[f32], target: &mut CudaSlice<f32>) -> Result<()> {
        let stream = self.stream();
        refuse_during_capture(&stream)?;
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let staging = self.staging_chunks(&mut staging)?;
        for (piece, from) in source.chunks(STAGING_CHUNK).enumerate() {
            let start = piece * STAGING_CHUNK;
            let chunk = &mut staging.chunks[staging.next];
            staging.next ^= 1;
            // The earlier copy from this chunk is done before it is filled again.
            chunk.copied.synchronize().map_err(|e| cuda_error("staging", e))?;
            let host = &mut chunk.host.as_mut_slice().map_err(|e| cuda_error("staging", e))?[..from.len()];
            // Filled on the CPU executors' worker threads (persistent, and named for profilers:
            // `boundscope-cpu-<k>`), a part each.
            let parts = parts_for(0, from.len(), STAGED_UPLOAD / 4);
            run_parts_writing(host, parts, 1, |r: std::ops::Range<usize>, to: &mut [f32]| to.copy_from_slice(&from[r]));
            let mut view = target.slice_mut(start..start + from.len());
            stream.memcpy_htod(&*host, &mut view).map_err(|e| cuda_error("upload", e))?;
            chunk.copied.record(&stream).map_err(|e| cuda_error("record event", e))?;
        }
        Ok(())
    }

    /// Downloads through the staging chunks: the device copies into one while the CPU workers
    /// empty the other. Waits for the device, as every download does.
    fn staged_download(&self, source: &CudaSlice<f32>, target: &mut [f32]) -> Result<()> {
        let stream = self.stream();
        refuse_during_capture(&stream)?;
        // The work queued before the download finishes before the staging lock is taken, so
        // that other threads' staged transfers do not wait for this thread's run.
        stream.synchronize().map_err(|e| cuda_error("synchronize", e))?;
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let staging = self.staging_chunks(&mut staging)?;
        let len = target.len();
        let pieces = len.div_ceil(STAGING_CHUNK);
        let piece_range = |piece: usize| piece * STAGING_CHUNK..((piece + 1) * STAGING_CHUNK).min(len);
        let queue = |chunk: &mut Chunk, piece: usize| -> Result<()> {
            let range = piece_range(piece);
            // An upload queued earlier (on any stream) may still be reading the chunk: this copy
            // comes after it.
            stream.wait(&chunk.copied).map_err(|e| cuda_error("wait event", e))?;
            let host = &mut chunk.host.as_mut_slice().map_err(|e| cuda_error("staging", e))?[..range.len()];
            stream.memcpy_dtoh(&source.slice(range), host).map_err(|e| cuda_error("download", e))?;
            chunk.copied.record(&stream).map_err(|e| cuda_error("record event", e))
        };
        for piece in 0..pieces.min(2) {
            queue(&mut staging.chunks[piece], piece)?;
        }
        for piece in 0..pieces {
            let chunk = &mut staging.chunks[piece % 2];
            chunk.copied.synchronize().map_err(|e| cuda_error("download", e))?;
            let range = piece_range(piece);
            let host = &chunk.host.as_slice().map_err(|e| cuda_error("staging", e))?[..range.len()];
            let to = &mut target[range];
            let parts = parts_for(0, to.len(), STAGED_UPLOAD / 4);
            run_parts_writing(to, parts, 1, |r: std::ops::Range<usize>, to: &mut [f32]| to.copy_from_slice(&host[r]));
            if piece + 2 < pieces {
                queue(chunk, piece + 2)?;
            }
        }
        // Uploads start with the chunk used longest ago.
        staging.next = pieces % 2;
        Ok(())
    }

    /// The copies between host and device made so far (uploads and downloads, by plans and by
    /// [`DeviceTensor`](crate::DeviceTensor)s): a plan whose values all stay on the device makes
    /// none per run.
    pub fn transfers(&self) -> u64 {
        self.transfers.load(Ordering::Relaxed)
    }

    /// The page-locked host allocations this device has made for staging so far: two, at the
    /// first transfer of 1 MiB or more, whatever the sizes transferred after it (a transfer of
    /// any size goes through them 16 MiB at a time).
    pub fn pinned_allocations(&self) -> u64 {
        self.pins.load(Ordering::Relaxed)
    }

    /// The number of kernels compiled so far.
    pub fn compiled_kernels(&self) -> usize {
        self.kernels.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A staged transfer cannot be recorded into a graph: it goes through the device's shared
/// staging chunks, which the host fills and empties around each copy.
fn refuse_during_capture(stream: &CudaStream) -> Result<()> {
    let status = stream.capture_status().map_err(|e| cuda_error("capture status", e))?;
    if status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(());
    }
    Err(Error::GraphUnsupported {
        reason: "a transfer of 1 MiB or more from or to host memory cannot be captured in a graph (it is staged \
                 through page-locked memory on the host); pass device tensors to the captured run"
            .into(),
    })
}

/// What stream names start with, unless [`CudaDevice::name_streams`] says otherwise.
const STREAM_PREFIX: &str = "boundscope";

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

/// A kernel was handed a buffer of another device.
const NOT_CUDA: &str = "not a CUDA buffer: a kernel gets buffers of the device its executor's `Executor::device` \
                        returns; make that the CudaDevice the kernel runs on";

pub(crate) fn slice(buffer: &dyn DeviceBuffer) -> Result<&CudaSlice<f32>> {
    buffer.as_any().downcast_ref::<CudaBuffer>().map(|b| &*b.slice).ok_or_else(|| cuda_error("buffer", NOT_CUDA))
}

pub(crate) fn slice_mut(buffer: &mut dyn DeviceBuffer) -> Result<&mut CudaSlice<f32>> {
    buffer
        .as_any_mut()
        .downcast_mut::<CudaBuffer>()
        .map(|b| &mut *b.slice)
        .ok_or_else(|| cuda_error("buffer", NOT_CUDA))
}

/// The device address of a buffer of a [`CudaDevice`], for a kernel's parameters: what
/// `slice(buffer)?.device_ptr(&stream).0` gives, without cudarc's bookkeeping per call.
/// The caller orders its launch on the run's stream, as for any address of a buffer.
pub(crate) fn address(buffer: &dyn DeviceBuffer) -> Result<sys::CUdeviceptr> {
    buffer.as_any().downcast_ref::<CudaBuffer>().map(|b| b.address).ok_or_else(|| cuda_error("buffer", NOT_CUDA))
}

impl CudaDevice {
    /// A zeroed allocation of `len` words (at least one).
    fn alloc_buffer(&self, len: usize) -> Result<CudaBuffer> {
        let bytes = len.max(1).saturating_mul(std::mem::size_of::<f32>());
        // On the device's own stream: the buffer may outlive the run that asks for it (whose
        // queue then waits for the allocation, below).
        let slice = self.order.own().alloc_zeros::<f32>(len.max(1)).map_err(|e| {
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
        if let Some(queue) = self.current_queue().filter(|q| !capturing(&q.stream)) {
            self.order.enter(&queue)?;
        }
        Ok(CudaBuffer::new(slice, self.order.clone(), None))
    }

    /// A workspace queue on `stream`: one of its own, or the device's own stream.
    fn queue_on(&self, stream: Arc<CudaStream>, on_device_stream: bool) -> Result<Option<Box<dyn DeviceQueue>>> {
        // Events for ordering only: no timestamps, which cost to record. (A queue on the
        // device's stream records none; made anyway, once per workspace.)
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let event = || self.context.new_event(flags).map_err(|e| cuda_error("new event", e));
        let order = QueueOrder::new(event()?, event()?, on_device_stream);
        Ok(Some(Box::new(CudaQueue(Arc::new(Queue {
            states: Mutex::new(Vec::new()),
            order,
            stream,
            joins: Joins::default(),
        })))))
    }
}

impl Device for CudaDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, len: usize) -> Result<Box<dyn DeviceBuffer>> {
        Ok(Box::new(self.alloc_buffer(len)?))
    }

    fn allocates_within(&self) -> bool {
        true
    }

    fn alloc_within(&self, words: usize, parts: &[(usize, usize)]) -> Result<Vec<Box<dyn DeviceBuffer>>> {
        if let Some(&(offset, len)) =
            parts.iter().find(|&&(offset, len)| offset.checked_add(len).is_none_or(|end| end > words))
        {
            return Err(cuda_error(
                "alloc_within",
                format!("a part of {len} words at offset {offset} is past the end of a block of {words}"),
            ));
        }
        let block = Arc::new(self.alloc_buffer(words)?);
        let stream = self.order.own();
        let base = block.address;
        let word = std::mem::size_of::<f32>() as u64;
        Ok(parts
            .iter()
            .map(|&(offset, len)| {
                // SAFETY: the range lies within the block (checked above), which the buffer
                // keeps alive; the slice is never freed (`CudaBuffer`'s drop leaks a range).
                let slice = unsafe { stream.upgrade_device_ptr::<f32>(base + offset as u64 * word, len) };
                Box::new(CudaBuffer::new(slice, self.order.clone(), Some(block.clone()))) as Box<dyn DeviceBuffer>
            })
            .collect())
    }

    fn upload(&self, source: &[f32], target: &mut dyn DeviceBuffer) -> Result<()> {
        let target = slice_mut(target)?;
        if source.len() > target.len() {
            return Err(Error::TransferLength { direction: "upload", host: source.len(), device: target.len() });
        }
        self.transfers.fetch_add(1, Ordering::Relaxed);
        if source.len() >= STAGED_UPLOAD {
            return self.staged_upload(source, target);
        }
        let mut view = target.slice_mut(0..source.len());
        self.stream().memcpy_htod(source, &mut view).map_err(|e| cuda_error("upload", e))
    }

    fn download(&self, source: &dyn DeviceBuffer, target: &mut [f32]) -> Result<()> {
        let source = slice(source)?;
        if target.len() > source.len() {
            return Err(Error::TransferLength { direction: "download", host: target.len(), device: source.len() });
        }
        self.transfers.fetch_add(1, Ordering::Relaxed);
        if target.len() >= STAGED_UPLOAD {
            return self.staged_download(source, target);
        }
        let view = source.slice(0..target.len());
        let Some(queue) = self.current_queue() else {
            self.order.own().memcpy_dtoh(&view, target).map_err(|e| cuda_error("download", e))?;
            return self.order.synchronize();
        };
        queue.stream.memcpy_dtoh(&view, target).map_err(|e| cuda_error("download", e))?;
        queue.stream.synchronize().map_err(|e| cuda_error("synchronize", e))
    }

    fn copy(&self, source: &dyn DeviceBuffer, target: &mut dyn DeviceBuffer) -> Result<()> {
        let (source, target) = (slice(source)?, slice_mut(target)?);
        let n = target.len();
        if source.len() < n {
            return Err(Error::TransferLength { direction: "copy", host: n, device: source.len() });
        }
        let mut view = target.slice_mut(0..n);
        self.stream().memcpy_dtod(&source.slice(0..n), &mut view).map_err(|e| cuda_error("copy", e))
    }

    fn synchronize(&self) -> Result<()> {
        if let Some(queue) = self.current_queue() {
            return queue.stream.synchronize().map_err(|e| cuda_error("synchronize", e));
        }
        // The device's own stream waits for every run that left its queue, and the host for
        // the stream.
        self.order.synchronize()
    }

    fn new_queue(&self) -> Result<Option<Box<dyn DeviceQueue>>> {
        let stream = self.context.new_stream().map_err(|e| cuda_error("new stream", e))?;
        let queue = QUEUES.fetch_add(1, Ordering::Relaxed) + 1;
        let prefix = self.stream_prefix.lock().unwrap_or_else(|p| p.into_inner()).clone();
        name_stream(&stream, &format!("{prefix} workspace {queue}"));
        self.queue_on(stream, false)
    }

    fn device_queue(&self) -> Result<Option<Box<dyn DeviceQueue>>> {
        self.queue_on(self.order.stream().clone(), true)
    }

    fn enter_queue(&self, queue: &dyn DeviceQueue) -> Result<()> {
        let queue =
            queue.as_any().downcast_ref::<CudaQueue>().ok_or_else(|| cuda_error("queue", "not a CUDA queue"))?;
        // The run comes after what the device's stream holds (uploads of its inputs, other
        // workspaces' runs), waiting only if something was queued there since the last run.
        self.order.enter(&queue.0)?;
        let me = queue_key(&self.order);
        CURRENT_QUEUE.with(|q| q.borrow_mut().push((me, queue.0.clone())));
        Ok(())
    }

    fn leave_queue(&self, queue: &dyn DeviceQueue) -> Result<()> {
        let me = queue_key(&self.order);
        CURRENT_QUEUE.with(|q| {
            let mut q = q.borrow_mut();
            if let Some(i) = q.iter().rposition(|(d, _)| *d == me) {
                q.remove(i);
            }
        });
        let queue =
            queue.as_any().downcast_ref::<CudaQueue>().ok_or_else(|| cuda_error("queue", "not a CUDA queue"))?;
        // Work a kernel left on a stream of its own (a run that failed between a collective's
        // start and its wait): the run's stream waits for it, on every way out of the run.
        let joined = queue.0.joins.join_all(&queue.0.stream);
        // What comes later on the device's stream (downloads, frees, graphs' inputs, other
        // workspaces' runs) waits for the run, also when a join failed (its error first).
        // (`Plan::capture` leaves after its capture has ended, so these joins are not recorded.)
        let left = self.order.leave(&queue.0);
        joined.and(left)
    }

    fn begin_capture(&self) -> Result<()> {
        if self.current_queue().is_some_and(|q| q.order.on_device_stream()) {
            return Err(Error::GraphUnsupported {
                reason: "the workspace runs on the device's own stream (`Plan::workspace_on_device_queue`), where \
                         other threads' transfers would join the graph: capture a workspace made by `Plan::workspace`"
                    .into(),
            });
        }
        // Thread-local mode: CUDA calls of other threads are not refused, and their runs go to
        // their own workspaces' streams, not to the one being recorded (`Plan::capture` records
        // on the workspace's queue).
        self.capture_stream()
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| cuda_error("begin capture", e))
    }

    fn end_capture(&self) -> Result<Box<dyn DeviceGraph>> {
        let graph = self
            .capture_stream()
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| cuda_error("end capture", e))?
            .ok_or_else(|| Error::GraphUnsupported { reason: "nothing was captured".into() })?;
        graph.upload().map_err(|e| cuda_error("graph upload", e))?;
        Ok(Box::new(CudaPlanGraph(Mutex::new(graph))))
    }
}
