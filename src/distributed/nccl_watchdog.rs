//! The watchdog of an [`NcclCommunicator`](super::NcclCommunicator): a thread that aborts the
//! communicator when a collective does not end in time (a rank failed or hangs) or NCCL reports
//! an error, as PyTorch's NCCL watchdog does, so that no rank waits forever.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{result as driver, sys as driver_sys, CudaContext, CudaEvent};
use cudarc::nccl::{result as nccl, sys};

/// How many collectives in flight it follows at once (those past it are not followed; the
/// ones before them on the same streams cover a hang).
const FOLLOWED: usize = 64;

/// How often it looks.
const PERIOD: Duration = Duration::from_millis(5);

/// What the communicator and its watchdog share.
pub(super) struct Shared {
    comm: Comm,
    aborted: AtomicBool,
    /// Why it was aborted, when the watchdog (or NCCL) did it.
    failure: Mutex<Option<String>>,
    /// Serializes the calls made on the communicator (not its abort).
    pub(super) calls: Mutex<()>,
    watch: Mutex<Watch>,
    stop: Condvar,
}

/// The communicator handle.
struct Comm(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread; calls are serialized by
// `Shared::calls`, and `ncclCommAbort`, which NCCL allows from another thread while a call
// waits, is made once (`Shared::aborted`).
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// The collectives followed, and the events free to follow more.
#[derive(Default)]
struct Watch {
    timeout: Option<Duration>,
    in_flight: VecDeque<(CudaEvent, Instant)>,
    free: Vec<CudaEvent>,
    stopping: bool,
}

impl Shared {
    pub(super) fn new(comm: sys::ncclComm_t) -> Self {
        Self {
            comm: Comm(comm),
            aborted: AtomicBool::new(false),
            failure: Mutex::new(None),
            calls: Mutex::new(()),
            watch: Mutex::new(Watch::default()),
            stop: Condvar::new(),
        }
    }

    pub(super) fn handle(&self) -> sys::ncclComm_t {
        self.comm.0
    }

    /// Aborts it once (`ncclCommAbort`), saying why.
    pub(super) fn abort(&self, why: Option<String>) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            if let Some(why) = why {
                *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
            }
            // SAFETY: the handle came from `ncclCommInitRankConfig` and is aborted once.
            let _ = unsafe { nccl::comm_abort(self.comm.0) };
        }
    }

    pub(super) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Why the watchdog aborted it, if it did.
    pub(super) fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Follows the collective just queued on `stream` (not while the stream is captured into a
    /// graph: a captured collective runs at the graph's replays).
    pub(super) fn follow(&self, stream: driver_sys::CUstream) {
        let mut watch = self.watch.lock().unwrap_or_else(PoisonError::into_inner);
        if watch.timeout.is_none() || capturing(stream) {
            return;
        }
        let Some(event) = watch.free.pop() else { return };
        // SAFETY: the event and the stream belong to the communicator's device's context.
        if unsafe { driver::event::record(event.cu_event(), stream) }.is_ok() {
            watch.in_flight.push_back((event, Instant::now()));
        } else {
            watch.free.push(event);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.abort(None);
    }
}

/// Whether `stream` is being captured into a graph.
fn capturing(stream: driver_sys::CUstream) -> bool {
    let mut status = driver_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is written; the stream is alive (the caller queues work on it).
    let asked = unsafe { driver_sys::cuStreamIsCapturing(stream, &mut status) };
    asked != driver_sys::CUresult::CUDA_SUCCESS
        || status != driver_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// The watchdog's thread, stopped and joined when dropped.
pub(super) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Follows `shared`'s collectives from now on: one that has not ended `timeout` after it
    /// was queued, or an error NCCL reports, aborts the communicator.
    pub(super) fn start(
        shared: &Arc<Shared>,
        context: &Arc<CudaContext>,
        timeout: Duration,
    ) -> std::result::Result<Self, String> {
        let flags = Some(driver_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let mut events = Vec::with_capacity(FOLLOWED);
        for _ in 0..FOLLOWED {
            events.push(context.new_event(flags).map_err(|e| format!("making the watchdog's events: {e:?}"))?);
        }
        {
            let mut watch = shared.watch.lock().unwrap_or_else(PoisonError::into_inner);
            watch.timeout = Some(timeout);
            watch.free = events;
            watch.in_flight.reserve(FOLLOWED);
        }
        let (watched, context) = (shared.clone(), context.clone());
        let thread = std::thread::Builder::new()
            .name("boundscope-nccl-watchdog".into())
            .spawn(move || watch(&watched, &context))
            .map_err(|e| format!("starting the watchdog's thread: {e}"))?;
        Ok(Self { shared: shared.clone(), thread: Some(thread) })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.watch.lock().unwrap_or_else(PoisonError::into_inner).stopping = true;
        self.shared.stop.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The watchdog's loop.
fn watch(shared: &Shared, context: &Arc<CudaContext>) {
    let _ = context.bind_to_thread();
    let mut watch = shared.watch.lock().unwrap_or_else(PoisonError::into_inner);
    while !watch.stopping && !shared.is_aborted() {
        let timeout = watch.timeout.unwrap_or(Duration::MAX);
        // Collectives end in order per stream; look at each followed one from the oldest.
        let mut late = None;
        let mut i = 0;
        while i < watch.in_flight.len() {
            let (event, queued) = &watch.in_flight[i];
            match event.try_is_complete() {
                Ok(true) => {
                    if let Some((event, _)) = watch.in_flight.remove(i) {
                        watch.free.push(event);
                    }
                }
                Ok(false) if queued.elapsed() > timeout => {
                    late = Some(format!(
                        "a collective did not end within {timeout:?} of being queued (a rank failed or hangs)"
                    ));
                    break;
                }
                Ok(false) => i += 1,
                Err(e) => {
                    late = Some(format!("the device failed while a collective ran: {e:?}"));
                    break;
                }
            }
        }
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: the handle is NCCL's; `state` is written.
        let asked = unsafe { sys::ncclCommGetAsyncError(shared.handle(), &mut state) };
        if late.is_none()
            && asked == sys::ncclResult_t::ncclSuccess
            && !matches!(state, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress)
        {
            late = Some(format!("NCCL reported {state:?} (a rank failed)"));
        }
        if let Some(why) = late {
            drop(watch);
            shared.abort(Some(why));
            return;
        }
        watch = shared.stop.wait_timeout(watch, PERIOD).unwrap_or_else(PoisonError::into_inner).0;
    }
}
