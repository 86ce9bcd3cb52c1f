//! Collectives on the GPU through NCCL: [`NcclCommunicator`] (one rank's communicator, on one
//! [`CudaDevice`]) and [`NcclExecutor`], which runs the [`Collectives`] of a rank's plans on
//! device buffers, on the run's stream (a started `all_reduce` on a stream of the workspace's
//! own until its wait).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::nccl::{result as nccl, sys};

use cudarc::driver::{sys as driver, CudaEvent, CudaStream};

use super::collectives::{checked_collective, CollectiveStep, Collectives, COLLECTIVE_DTYPES};
use super::communicator::{Collective, Communicator, ReduceOp};
use super::in_process::DEFAULT_TIMEOUT;
use super::nccl_watchdog::{Shared, Watchdog};
use crate::core::ir::DType;
use crate::core::plan::{Device, DeviceKernel, EmittedRange, Executor, OpView};
use crate::error::{Error, Result};
use crate::executors::cuda::{device_kernel, CudaDevice, CudaKernel, CudaRun};

/// The 128 bytes that name one NCCL communicator before it exists (`ncclUniqueId`): rank 0
/// makes it ([`new`](Self::new)) and passes it to the other ranks (a file, a socket, or
/// [`NcclCommunicator::rendezvous`], which sends it over a host communicator); every rank then
/// joins with it.
#[derive(Clone, Copy)]
pub struct NcclId([u8; 128]);

impl NcclId {
    /// A new id (from `ncclGetUniqueId`, which also picks the network interface rank 0 listens
    /// on).
    ///
    /// # Errors
    /// [`Error::ExecutorUnavailable`] when NCCL's library cannot be loaded, or NCCL's own
    /// error.
    pub fn new() -> Result<Self> {
        nccl_present()?;
        let id = nccl::get_uniqueid().map_err(|e| nccl_failed("ncclGetUniqueId", e))?;
        Ok(Self(id.internal.map(|c| c as u8)))
    }

    /// Its bytes, to pass to the other ranks.
    pub fn as_bytes(&self) -> &[u8; 128] {
        &self.0
    }

    /// The id whose bytes another rank passed.
    pub fn from_bytes(bytes: [u8; 128]) -> Self {
        Self(bytes)
    }
}

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

/// Refuses before the first NCCL call when `libnccl` cannot be loaded (cudarc would panic).
fn nccl_present() -> Result<()> {
    // SAFETY: only tries to load the library.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    Err(Error::ExecutorUnavailable {
        executor: "nccl".into(),
        reason: "libnccl.so.2 cannot be loaded: install NCCL (the `nvidia-nccl-cu12` or `-cu13` Python package \
                 ships it) and put its folder on LD_LIBRARY_PATH"
            .into(),
    })
}

fn nccl_failed(call: &str, e: nccl::NcclError) -> Error {
    let code = e.0;
    Error::ExecutorUnavailable { executor: "nccl".into(), reason: format!("{call} failed: {code:?}") }
}

/// One rank's NCCL communicator, on one GPU: the transport of [`NcclExecutor`], which runs a
/// plan's collectives on device buffers, on the run's stream (so they are ordered with the
/// plan's kernels and captured into its graph; a started `all_reduce` on a stream of the
/// workspace's own, joined by its wait).
///
/// Make one per rank with the same [`NcclId`] and world size ([`new`](Self::new)); NCCL's
/// initialization returns once every rank has joined. [`rendezvous`](Self::rendezvous) passes
/// the id over a host communicator (a [`TcpGroup`](super::TcpGroup) made from the `torchrun`
/// variables), and [`single`](Self::single) makes a world of one (one GPU: NCCL refuses two ranks
/// on one GPU).
///
/// NCCL's semantics differ from the host communicators' in four ways: a sum is added in the
/// order of NCCL's ring or tree (every rank still gets the same bits); 16-bit values are
/// combined in their own dtype at each step of it (for two ranks: one sum in `f32`, rounded
/// once); a mean multiplies each value by `1 / world` rounded to the dtype before the sum
/// (`ncclAvg`: in bf16 on three ranks, by 0.33398, not a third), where the host divides the
/// sum; and a maximum over a NaN and a number is the number (`fmaxf`), where the host gives
/// NaN. An error of NCCL's is [`Error::Collective`]; [`abort`](Self::abort) stops a
/// communicator whose peers failed (its queued collectives end, its later ones fail at once).
/// Keep `NCCL_NVLS_ENABLE=0` in the environment of programs on machines with NVLink switches.
pub struct NcclCommunicator {
    /// The handle, shared with the watchdog.
    shared: Arc<Shared>,
    watchdog: std::sync::Mutex<Option<Watchdog>>,
    device: Arc<CudaDevice>,
    name: String,
    rank: usize,
    world: usize,
    /// How long it waits for NCCL's setup before it aborts.
    timeout: Duration,
    /// The stream started `all_reduce`s run on, per run stream (kept weakly): one per
    /// workspace, so that its collectives keep their order.
    side_streams: std::sync::Mutex<Vec<SideStream>>,
}

impl NcclCommunicator {
    /// Joins the communicator `id` names as rank `rank` of `world`, on `device`. Blocks until
    /// every rank has joined, for at most [`DEFAULT_TIMEOUT`] (see
    /// [`with_timeout`](Self::with_timeout)).
    ///
    /// # Errors
    /// [`Error::ExecutorUnavailable`] without NCCL's library; [`Error::Collective`] for a rank
    /// outside the world, ranks that do not all join in time, or NCCL's error (two ranks on
    /// one GPU, an id of another world).
    pub fn new(
        device: Arc<CudaDevice>,
        name: impl Into<String>,
        id: &NcclId,
        rank: usize,
        world: usize,
    ) -> Result<Self> {
        Self::with_timeout(device, name, id, rank, world, DEFAULT_TIMEOUT)
    }

    /// [`new`](Self::new), waiting at most `timeout` for NCCL's setup: the ranks joining, and
    /// the connections NCCL makes at a collective's first use. The communicator is NCCL's
    /// non-blocking kind: when the time runs out it is aborted and the call that waited
    /// returns [`Error::Collective`] (which names the wait), never a hang.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_timeout(
        device: Arc<CudaDevice>,
        name: impl Into<String>,
        id: &NcclId,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let name = name.into();
        nccl_present()?;
        let refuse = |detail: String| Error::Collective { communicator: name.clone(), rank, detail };
        if rank >= world {
            return Err(refuse(format!(
                "rank {rank} is outside a world of {world}: ranks are 0 to {}",
                world.max(1) - 1
            )));
        }
        let (rank_c, world_c) = match (i32::try_from(rank), i32::try_from(world)) {
            (Ok(r), Ok(w)) => (r, w),
            _ => return Err(refuse(format!("a world of {world} ranks is more than NCCL takes"))),
        };
        device.context().bind_to_thread().map_err(|e| refuse(format!("binding the CUDA context: {e:?}")))?;
        let id = sys::ncclUniqueId { internal: id.0.map(|b| b as std::ffi::c_char) };
        let version = nccl::get_nccl_version().map_err(|e| nccl_failed("ncclGetVersion", e))?;
        if version < 21400 {
            return Err(Error::ExecutorUnavailable {
                executor: "nccl".into(),
                reason: format!("NCCL {version} is older than 2.14, which communicators' settings need: update it"),
            });
        }
        // NCCL_CONFIG_INITIALIZER with `blocking = 0`: every other field NCCL's default, marked
        // undefined, the padding zeroed. The version is the lower of the loaded library's and
        // that of the header these bindings follow (2.30.0): NCCL reads the fields up to its own
        // size and gives those of later versions their defaults.
        const UNDEF: i32 = i32::MIN;
        // SAFETY: every field of the config is an integer or a pointer, for which zero is valid.
        let mut config: sys::ncclConfig_t = unsafe { std::mem::MaybeUninit::zeroed().assume_init() };
        config.size = std::mem::size_of::<sys::ncclConfig_t>();
        config.magic = 0xcafe_beef;
        config.version = version.min(23000) as u32;
        config.blocking = 0;
        for field in [
            &mut config.cgaClusterSize,
            &mut config.minCTAs,
            &mut config.maxCTAs,
            &mut config.splitShare,
            &mut config.trafficClass,
            &mut config.collnetEnable,
            &mut config.CTAPolicy,
            &mut config.shrinkShare,
            &mut config.nvlsCTAs,
            &mut config.nChannelsPerNetPeer,
            &mut config.nvlinkCentricSched,
            &mut config.graphUsageMode,
            &mut config.maxP2pPeers,
            &mut config.numRmaCtx,
        ] {
            *field = UNDEF;
        }
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` is written by NCCL; the id is 128 bytes as NCCL made them; `config`
        // lives for the call.
        if let Err(e) = unsafe { nccl::comm_init_rank_config(&mut comm, world_c, id, rank_c, &mut config) } {
            if !comm.is_null() {
                // SAFETY: NCCL made the handle before it failed; it is aborted once.
                let _ = unsafe { nccl::comm_abort(comm) };
            }
            return Err(refuse(format!("ncclCommInitRankConfig failed: {:?}", e.0)));
        }
        let communicator = Self {
            shared: Arc::new(Shared::new(comm)),
            watchdog: std::sync::Mutex::new(None),
            device,
            name,
            rank,
            world,
            timeout,
            side_streams: std::sync::Mutex::new(Vec::new()),
        };
        communicator.settle(&format!("the other ranks of {world} to join"))?;
        Ok(communicator)
    }

    /// Waits until NCCL's work in progress on the communicator (its setup, a collective's
    /// connections) is done, at most the timeout; then aborts it and says what it waited for.
    fn settle(&self, waiting_for: &str) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: the handle is NCCL's; `state` is written.
            let asked = unsafe { sys::ncclCommGetAsyncError(self.shared.handle(), &mut state) };
            let state = if asked == sys::ncclResult_t::ncclSuccess { state } else { asked };
            match state {
                sys::ncclResult_t::ncclSuccess => return Ok(()),
                sys::ncclResult_t::ncclInProgress if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                sys::ncclResult_t::ncclInProgress => {
                    self.abort_now();
                    return Err(self.error(format!(
                        "waited {:?} for {waiting_for} (a rank failed or hangs): the communicator is aborted",
                        self.timeout
                    )));
                }
                other => {
                    self.abort_now();
                    return Err(self.error(format!(
                        "NCCL failed while waiting for {waiting_for}: {other:?}; the communicator is aborted"
                    )));
                }
            }
        }
    }

    /// A world of one rank, on `device`: collectives copy (`all_reduce`, `broadcast`) or keep
    /// (`all_gather`, `reduce_scatter` of one part) their input. For programs written for
    /// several GPUs, run on one.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn single(device: Arc<CudaDevice>, name: impl Into<String>) -> Result<Self> {
        Self::new(device, name, &NcclId::new()?, 0, 1)
    }

    /// Joins a communicator of the same ranks as `host` (one per process, `torchrun`'s
    /// `RANK`/`WORLD_SIZE`): rank 0 makes the [`NcclId`] and broadcasts it over `host`; each
    /// rank joins on `device` (its `LOCAL_RANK`'s GPU).
    ///
    /// # Errors
    /// `host`'s error (a rank did not arrive within its timeout), and those of
    /// [`new`](Self::new).
    pub fn rendezvous(device: Arc<CudaDevice>, name: impl Into<String>, host: &dyn Communicator) -> Result<Self> {
        let name = name.into();
        let (rank, world) = (host.rank(), host.world_size());
        // Every rank says whether it can take part (rank 0 also makes the id), so that one that
        // cannot fails them all at once instead of leaving them to wait for it.
        let mut failure = nccl_present().err();
        let mut words = vec![0.0f32; 32];
        if rank == 0 && failure.is_none() {
            match NcclId::new() {
                // 128 bytes as 32 `f32`s: a broadcast copies their bits.
                Ok(id) => {
                    for (word, b) in words.iter_mut().zip(id.as_bytes().chunks_exact(4)) {
                        *word = f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        let mut any_failed = [0.0f32];
        host.run(Collective::AllReduce(ReduceOp::Max), &[f32::from(u8::from(failure.is_some()))], &mut any_failed)?;
        if let Some(e) = failure {
            return Err(e);
        }
        if any_failed[0] > 0.0 {
            return Err(Error::Collective {
                communicator: name,
                rank,
                detail: "another rank cannot use NCCL (its error is its own): fix that rank's machine".into(),
            });
        }
        let mut got = vec![0.0f32; words.len()];
        host.run(Collective::Broadcast { root: 0 }, &words, &mut got)?;
        let mut bytes = [0u8; 128];
        for (chunk, word) in bytes.chunks_exact_mut(4).zip(&got) {
            chunk.copy_from_slice(&word.to_bits().to_le_bytes());
        }
        Self::new(device, name, &NcclId::from_bytes(bytes), rank, world)
    }

    /// Its name, for ranges and errors.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The GPU it runs on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// NCCL's version, as `2.28.3`.
    ///
    /// # Errors
    /// Without NCCL's library, [`Error::ExecutorUnavailable`].
    pub fn version() -> Result<String> {
        nccl_present()?;
        let v = nccl::get_nccl_version().map_err(|e| nccl_failed("ncclGetVersion", e))?;
        Ok(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
    }

    /// Aborts the communicator (`ncclCommAbort`): collectives queued on its streams end
    /// without their results, and every later one fails with [`Error::Collective`]. Call it
    /// when another rank failed (or let [`watch`](Self::watch) do it); dropping the
    /// communicator aborts it too.
    pub fn abort(&self) {
        let _calls = self.shared.calls.lock().unwrap_or_else(|p| p.into_inner());
        self.abort_now();
    }

    /// Aborts it, with the calls' lock held (or before anyone else holds the communicator).
    fn abort_now(&self) {
        self.shared.abort(None);
    }

    /// Whether it was aborted.
    pub fn is_aborted(&self) -> bool {
        self.shared.is_aborted()
    }

    /// Starts a watchdog (a thread of its own, as PyTorch's): a collective that has not ended
    /// `timeout` after a run queued it (a rank failed or hangs), or an error NCCL reports,
    /// aborts the communicator, so that the queued collectives end (the run that waits for
    /// them returns) and every later collective, and [`check`](Self::check), is an
    /// [`Error::Collective`] saying why. It follows up to 64 collectives in flight, not those
    /// captured into graphs; the check costs a recorded event per collective. Calling it again
    /// replaces the timeout.
    ///
    /// # Errors
    /// [`Error::Collective`] when its events or thread cannot be made.
    pub fn watch(&self, timeout: Duration) -> Result<()> {
        let mut watchdog = self.watchdog.lock().unwrap_or_else(|p| p.into_inner());
        // The old one stops before the new one takes the events over.
        *watchdog = None;
        *watchdog = Some(Watchdog::start(&self.shared, self.device.context(), timeout).map_err(|e| self.error(e))?);
        Ok(())
    }

    /// `Ok` unless it was aborted: then why (the watchdog's finding, or an abort of yours). Call
    /// it after a step whose results you keep, when a watchdog runs: a run whose collectives
    /// were aborted returns, but its results are not the collectives'.
    ///
    /// # Errors
    /// [`Error::Collective`] as said.
    pub fn check(&self) -> Result<()> {
        match self.is_aborted() {
            false => Ok(()),
            true => Err(self.aborted_error()),
        }
    }

    fn aborted_error(&self) -> Error {
        let why = self.shared.failure().unwrap_or_else(|| "it was aborted".into());
        self.error(format!("the communicator is aborted: {why}; make a new one (every rank)"))
    }

    /// The side stream of `run`'s started `all_reduce`s (made at its first use), marked as
    /// having one more started on it. Entries of run streams that are gone are dropped.
    fn start_on(&self, run: &Arc<CudaStream>) -> Result<Arc<CudaStream>> {
        let mut streams = self.side_streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.retain(|s| s.run.strong_count() > 0);
        let index = match side_index(&streams, run) {
            Some(index) => index,
            None => {
                let stream = self
                    .device
                    .context()
                    .new_stream()
                    .map_err(|e| self.error(format!("making a stream for collectives: {e:?}")))?;
                self.device.name_side_stream(&stream, "collectives");
                let join = self
                    .device
                    .context()
                    .new_event(Some(driver::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(|e| self.error(format!("making an event for collectives: {e:?}")))?;
                streams.push(SideStream { run: Arc::downgrade(run), stream, pending: false, join });
                streams.len() - 1
            }
        };
        let side = &mut streams[index];
        side.pending = true;
        Ok(side.stream.clone())
    }

    /// Makes `run` wait for the `all_reduce`s started on its side stream since it last did:
    /// the side stream it joined, if anything was pending (the caller tells the run it joined
    /// it: `CudaDevice::joined`).
    fn join_into(&self, run: &Arc<CudaStream>) -> Result<Option<Arc<CudaStream>>> {
        let mut streams = self.side_streams.lock().unwrap_or_else(|p| p.into_inner());
        let Some(side) = side_index(&streams, run).map(|i| &mut streams[i]).filter(|s| s.pending) else {
            return Ok(None);
        };
        let failed = |e: cudarc::driver::DriverError| self.error(format!("joining the collectives' stream: {e:?}"));
        side.join.record(&side.stream).map_err(failed)?;
        run.wait(&side.join).map_err(failed)?;
        side.pending = false;
        Ok(Some(side.stream.clone()))
    }

    fn error(&self, detail: String) -> Error {
        Error::Collective { communicator: self.name.clone(), rank: self.rank, detail }
    }

    /// Queues `collective` of `count` input values of `dtype` from `input` to `output`, on
    /// `stream`.
    ///
    /// # Safety
    /// `input` and `output` are device memory of this communicator's GPU holding `count` and
    /// `collective.output_len(count, world)` values of `dtype`, alive until the stream has run
    /// the collective.
    unsafe fn enqueue(
        &self,
        collective: Collective,
        dtype: DType,
        input: u64,
        output: u64,
        count: usize,
        stream: sys::cudaStream_t,
    ) -> Result<()> {
        let _calls = self.shared.calls.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_aborted() {
            return Err(self.aborted_error());
        }
        let datatype = match dtype {
            DType::F32 => sys::ncclDataType_t::ncclFloat32,
            DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
            DType::F16 => sys::ncclDataType_t::ncclFloat16,
            other => return Err(self.error(format!("NCCL collectives here take f32, bf16 or f16, not {other}"))),
        };
        let op = |op: ReduceOp| match op {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Mean => sys::ncclRedOp_t::ncclAvg,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        };
        let (send, recv) = (input as *const std::ffi::c_void, output as *mut std::ffi::c_void);
        let comm = self.shared.handle();
        // SAFETY: the caller's contract; the counts are NCCL's (per rank for the gather's
        // input and the scatter's output).
        let status = unsafe {
            match collective {
                Collective::AllReduce(o) => nccl::all_reduce(send, recv, count, datatype, op(o), comm, stream),
                Collective::AllGather => nccl::all_gather(send, recv, count, datatype, comm, stream),
                Collective::ReduceScatter(o) => {
                    nccl::reduce_scatter(send, recv, count / self.world, datatype, op(o), comm, stream)
                }
                Collective::Broadcast { root } => {
                    nccl::broadcast(send, recv, count, datatype, root as i32, comm, stream)
                }
            }
        };
        match status {
            Ok(nccl::NcclStatus::InProgress) => self.settle(&format!("{collective} to be queued"))?,
            Ok(_) => {}
            Err(e) => return Err(self.error(format!("{collective} failed in NCCL: {:?}", e.0))),
        }
        self.shared.follow(stream as driver::CUstream);
        Ok(())
    }
}

/// Where `run`'s side stream is among `streams`.
fn side_index(streams: &[SideStream], run: &Arc<CudaStream>) -> Option<usize> {
    streams.iter().position(|s| std::ptr::eq(s.run.as_ptr(), Arc::as_ptr(run)))
}

/// The stream a run stream's started `all_reduce`s run on.
struct SideStream {
    /// The run stream.
    run: std::sync::Weak<CudaStream>,
    stream: Arc<CudaStream>,
    /// Whether an `all_reduce` started on it since the run stream last waited for it: a
    /// wait with nothing pending queues no wait (the first wait of a step's gradients joins
    /// the streams, the others only copy or nothing).
    pending: bool,
    /// The event the waits join the streams with.
    join: CudaEvent,
}

impl std::fmt::Debug for NcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCommunicator")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.device.ordinal())
            .finish()
    }
}

/// The executor of one rank's collectives on its GPU: runs the [`Collectives`] of its plans
/// through an [`NcclCommunicator`], on device buffers (`f32`, bf16, f16), on the run's stream,
/// so that they are ordered with the plan's kernels, captured into its graph and timed by
/// device timers (a started `all_reduce` runs on a stream of the workspace's own from its
/// start to its wait, which joins it). List it before the executors of the rest of the plan (`CudaOps`,
/// `CudaFusion`): it claims only the collectives.
///
/// Like [`CollectiveExecutor`](super::CollectiveExecutor), it pushes an op range around each
/// collective in its own NVTX domain (`collectives` unless [`in_domain`](Self::in_domain) says
/// otherwise), declared through [`Executor::emits`] so that the range map lists it. The range
/// spans the host call that queues the collective; on the device, `nsys` shows NCCL's kernel
/// inside it and `ncu --nvtx` attributes the kernel to it.
///
/// ```no_run
/// # // Needs a GPU and NCCL: `proptests/nccl_collectives.rs` runs this on the H200.
/// use std::sync::Arc;
/// use boundscope::distributed::{Collectives, NcclCommunicator, NcclExecutor, ReduceOp};
/// use boundscope::executors::cuda::{CudaDevice, CudaOps};
/// use boundscope::{Arena, Executor, Plan, Registry, Tensor, TraceBuilder};
/// let mut registry = Registry::with_builtins();
/// let collectives = Collectives::register(&mut registry)?;
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let grad = b.input(&[1024])?;
/// let mean = collectives.all_reduce(&mut b, grad, ReduceOp::Mean)?;
/// b.output(mean)?;
/// let trace = b.finish()?;
/// let gpu = CudaDevice::new()?;
/// let comm = NcclCommunicator::single(gpu.clone(), "dp")?;
/// let executors: [Arc<dyn Executor>; 2] =
///     [NcclExecutor::new(comm, &collectives).shared(), Arc::new(CudaOps::new(gpu))];
/// let plan = Plan::compile(&trace, &executors)?;
/// let x = Tensor::from_fn(&[1024], |i| i as f32);
/// assert_eq!(plan.run(&[&x])?[0].to_f32_vec(), x.to_f32_vec());
/// # Ok::<(), boundscope::Error>(())
/// ```
pub struct NcclExecutor {
    communicator: Arc<NcclCommunicator>,
    collectives: Collectives,
    name: String,
    emits: [EmittedRange; 1],
}

impl NcclExecutor {
    /// The executor of `communicator`'s rank, for the symbols `collectives` registered.
    pub fn new(communicator: NcclCommunicator, collectives: &Collectives) -> Self {
        Self::of(Arc::new(communicator), collectives)
    }

    /// [`new`](Self::new), for a communicator shared with other code (to
    /// [`abort`](NcclCommunicator::abort) it from a watchdog, say).
    pub fn of(communicator: Arc<NcclCommunicator>, collectives: &Collectives) -> Self {
        Self {
            communicator,
            collectives: collectives.clone(),
            name: "nccl".into(),
            emits: [EmittedRange::nvtx_ops(super::collectives::COLLECTIVES_DOMAIN)],
        }
    }

    /// The same, pushing its ranges in NVTX domain `domain`.
    pub fn in_domain(mut self, domain: impl Into<String>) -> Self {
        self.emits = [EmittedRange::nvtx_ops_in(domain)];
        self
    }

    /// As an `Arc<dyn Executor>`, for [`Plan::compile`](crate::Plan::compile)'s list.
    pub fn shared(self) -> Arc<dyn Executor> {
        Arc::new(self)
    }

    /// Its communicator.
    pub fn communicator(&self) -> &Arc<NcclCommunicator> {
        &self.communicator
    }
}

impl Executor for NcclExecutor {
    fn name(&self) -> &str {
        &self.name
    }

    fn claims(&self, op: &OpView<'_>) -> bool {
        matches!(self.collectives.collective_of(op), Ok(Some(_)))
    }

    fn dtypes(&self) -> &[DType] {
        &COLLECTIVE_DTYPES
    }

    fn device(&self) -> Option<Arc<dyn Device>> {
        Some(self.communicator.device.clone())
    }

    fn compile_device(&self, op: &OpView<'_>) -> Result<Box<dyn DeviceKernel>> {
        let comm = &self.communicator;
        let (collective, count) =
            checked_collective(&self.collectives, &self.name, op, comm.name(), comm.world_size())?;
        if self.output_views(op).is_some() {
            let range = op.region_range().map(|r| r.prepare()).transpose()?;
            return Ok(Box::new(JoinKernel { communicator: comm.clone(), range }));
        }
        let kernel = NcclKernel { communicator: comm.clone(), step: collective, count };
        device_kernel(&comm.device, &self.name, op, kernel)
    }

    /// A wait for a whole started value (not an output of the trace) is a view of it: it only
    /// joins the streams, and the optimizer reads the gradients where NCCL wrote them.
    fn output_views(&self, op: &OpView<'_>) -> Option<usize> {
        let whole = matches!(self.collectives.collective_of(op), Ok(Some((CollectiveStep::Wait { offset: 0 }, _))))
            && matches!((op.input_shape(0), op.output_shape(0)), (Ok(i), Ok(o)) if i.iter().product::<usize>() == o.iter().product::<usize>());
        (whole && !op.is_trace_output(0)).then_some(0)
    }

    fn emits(&self) -> &[EmittedRange] {
        &self.emits
    }
}

/// `all_reduce_wait` of a whole started value, whose output is the started value's buffer
/// ([`Executor::output_views`]): the run's stream waits for the collectives' stream, once per
/// step (the first wait), inside the op's range.
struct JoinKernel {
    communicator: Arc<NcclCommunicator>,
    range: Option<crate::core::plan::PreparedRegionRange>,
}

impl DeviceKernel for JoinKernel {
    fn run(
        &self,
        _inputs: &[&dyn crate::core::plan::DeviceBuffer],
        _outputs: &mut [&mut dyn crate::core::plan::DeviceBuffer],
    ) -> Result<()> {
        let device = &self.communicator.device;
        let join = || -> Result<()> {
            if let Some(side) = self.communicator.join_into(&device.stream())? {
                device.joined(&side);
            }
            Ok(())
        };
        match &self.range {
            Some(range) => range.in_scope(join),
            None => join(),
        }
    }
}

/// One collective, queued through NCCL on the run's stream; or an `all_reduce` started on the
/// workspace's stream for collectives, or waited for.
struct NcclKernel {
    communicator: Arc<NcclCommunicator>,
    step: CollectiveStep,
    /// Input values.
    count: usize,
}

impl CudaKernel for NcclKernel {
    /// The event a start orders its side stream after the run's stream with, per workspace.
    type State = Option<CudaEvent>;

    fn new_state(&self, run: &CudaRun<'_>) -> Result<Option<CudaEvent>> {
        if !matches!(self.step, CollectiveStep::Start(_)) {
            return Ok(None);
        }
        let flags = Some(driver::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        run.context().new_event(flags).map(Some).map_err(|e| run.error(e))
    }

    fn run(&self, run: &mut CudaRun<'_>, event: &mut Option<CudaEvent>) -> Result<()> {
        let (input, output) = (run.input_memory(0)?, run.output_memory(0)?);
        let comm = &self.communicator;
        let stream = run.stream().clone();
        match (self.step, event) {
            // SAFETY (both collectives): the plan checked that the buffers hold the op's tensors
            // (`count` values in, the collective's output length out, of the op's dtype). They
            // live until the stream has run what this run queues: on the run's stream, as every
            // step's; on the side stream, until the wait, which reads both (its inputs are the
            // started value and the started input).
            (CollectiveStep::Whole(collective), _) => unsafe {
                comm.enqueue(collective, input.dtype, input.ptr, output.ptr, self.count, stream.cu_stream() as _)
            },
            (CollectiveStep::Start(op), Some(event)) => {
                let side = comm.start_on(&stream)?;
                event.record(&stream).map_err(|e| run.error(e))?;
                side.wait(event).map_err(|e| run.error(e))?;
                // The collective reads and writes the op's buffers after this returns: the run
                // waits for it before it ends, if no wait of its own does (also when queueing it
                // fails half way).
                run.keep_joined(&side)?;
                let collective = Collective::AllReduce(op);
                unsafe {
                    comm.enqueue(collective, input.dtype, input.ptr, output.ptr, self.count, side.cu_stream() as _)
                }
            }
            (CollectiveStep::Wait { offset }, _) => {
                if let Some(side) = comm.join_into(&stream)? {
                    run.joined(&side);
                }
                let size = input.dtype.size_bytes();
                // SAFETY: the shape rule checked that the part (the output's values from
                // `offset`) lies inside the started values; the plan checked the buffers.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        output.ptr,
                        input.ptr + (offset * size) as u64,
                        output.len * size,
                        stream.cu_stream(),
                    )
                }
                .map_err(|e| run.error(e))
            }
            (CollectiveStep::Start(_), None) => Err(run.error("a started all_reduce without its event")),
        }
    }
}
