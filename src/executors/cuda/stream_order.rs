//! The order between a device's own stream and its workspaces' streams, kept with as few
//! driver calls per run as the work on the device's own stream allows.
//!
//! A run goes to its workspace's stream (a [`Queue`]). It must come after what the device's
//! own stream holds (uploads and allocations made outside runs), and what is queued later on the
//! device's own stream (downloads, frees, other workspaces' runs) must come after it. Done
//! eagerly, that is two event records and two waits per run, about half the host time a
//! one-step plan adds over launching its kernel by hand. Here:
//! - **Entering** waits for the device's stream only when something was queued on it since
//!   the workspace's stream last waited for it and the host has not seen it finish: an
//!   *epoch* counts what was queued there (bumped after the work is queued), each queue keeps
//!   the epoch it last waited for, and a synchronize records the epoch it saw done.
//! - **Leaving** records the queue's `left` event and marks the queue *unwaited*; the device's
//!   stream waits for it before its next own work ([`StreamOrder::own`]), before another
//!   workspace's run enters, and before a buffer of the device is freed
//!   ([`StreamOrder::wait_for_runs`], which `CudaBuffer`'s drop calls).
//!
//! A run in steady state, its inputs and outputs on the device, so makes one driver call of
//! its own (the `left` record) instead of four, where one workspace runs with nothing queued on
//! the device's stream in between (or only work the host saw finish: a synchronize, a
//! download). Two workspaces taking turns still pay about four: each run waits for the other's.
//!
//! A queue on the device's own stream (`Plan::workspace_on_device_queue`) makes none: entering
//! waits only for other queues' runs (as the device's own work does), and leaving counts the
//! run's work in the epoch, like any work queued there.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaStream};
use smallvec::SmallVec;

use super::device::{cuda_error, Queue};
use crate::error::Result;

/// The order between a device's own stream and its queues (see the module's docs).
pub(crate) struct StreamOrder {
    /// The device's own stream.
    stream: Arc<CudaStream>,
    /// How many times work was queued on the device's own stream; bumped after the work is
    /// queued, so that a queue that reads it waits for everything counted.
    epoch: AtomicU64,
    /// An epoch whose work the host has seen finish (a synchronize of the device's stream
    /// after it): queues need not wait for what it counts.
    done: AtomicU64,
    /// Queues whose latest run the device's stream has not waited for yet (without
    /// duplicates; the vector keeps its capacity, so steady-state runs allocate nothing).
    unwaited: Mutex<Vec<Arc<Queue>>>,
    /// `unwaited`'s length, written under its lock: a wait with nothing to wait for (every run
    /// of a workspace on the device's own stream) takes no lock.
    unwaited_len: AtomicUsize,
}

/// A queue's part of the order: its events, and the epoch of the device's stream it last
/// waited for.
pub(crate) struct QueueOrder {
    /// Whether the queue's stream is the device's own (`Plan::workspace_on_device_queue`): its
    /// runs need no event, the stream keeps their order with the rest of its work.
    on_device_stream: bool,
    /// Recorded on the device's stream when a run enters and must wait for it; made once.
    entered: CudaEvent,
    /// Recorded on the queue as a run leaves it; waited for by the device's stream.
    left: CudaEvent,
    /// The epoch the queue's stream last waited for (`u64::MAX`: never).
    seen: AtomicU64,
}

impl QueueOrder {
    /// The order of a queue on a stream of its own, or on the device's own stream.
    pub(crate) fn new(entered: CudaEvent, left: CudaEvent, on_device_stream: bool) -> Self {
        Self { on_device_stream, entered, left, seen: AtomicU64::new(u64::MAX) }
    }

    /// Whether the queue's stream is the device's own.
    pub(crate) fn on_device_stream(&self) -> bool {
        self.on_device_stream
    }
}

/// The device's own stream, handed out for work outside runs: made after the stream has waited
/// for every run that left its queue, and counted in the epoch when dropped (after the work).
pub(crate) struct OwnStream<'o> {
    order: &'o StreamOrder,
}

impl std::ops::Deref for OwnStream<'_> {
    type Target = Arc<CudaStream>;
    fn deref(&self) -> &Arc<CudaStream> {
        &self.order.stream
    }
}

impl Drop for OwnStream<'_> {
    fn drop(&mut self) {
        self.order.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

impl StreamOrder {
    pub(crate) fn new(stream: Arc<CudaStream>) -> Self {
        Self {
            stream,
            epoch: AtomicU64::new(0),
            done: AtomicU64::new(0),
            unwaited: Mutex::new(Vec::new()),
            unwaited_len: AtomicUsize::new(0),
        }
    }

    /// The device's own stream, bare: for a capture's begin and end, which must not wait (see
    /// [`own`](Self::own) to queue work).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits until the work queued on the device's own stream, and the runs that left their
    /// queues, are done; queues then need not wait for any of it.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.wait_for_runs(None)?;
        // Counted work was queued before its count: all of `queued` is done after the wait.
        let queued = self.epoch.load(Ordering::Acquire);
        self.stream.synchronize().map_err(|e| cuda_error("synchronize", e))?;
        self.done.fetch_max(queued, Ordering::AcqRel);
        Ok(())
    }

    /// The device's own stream, for work outside runs, after it has waited for every run that
    /// left its queue. A failed wait (a device already in error) is reported by the work that
    /// follows, which fails too.
    pub(crate) fn own(&self) -> OwnStream<'_> {
        let _ = self.wait_for_runs(None);
        OwnStream { order: self }
    }

    /// The device's own stream waits for the runs that left their queues and that it has not
    /// waited for yet, except `except`'s (a queue that enters needs no wait for its own runs:
    /// its stream keeps their order). Each wait is counted in the epoch, so that other queues
    /// wait for it when they enter; the queue waited for does not, where nothing else was
    /// queued on the device's stream in between.
    pub(crate) fn wait_for_runs(&self, except: Option<&Queue>) -> Result<()> {
        // (A run that left its queue before this call began was counted before it: its
        // `leave` stored the length under the lock, released after.)
        if self.unwaited_len.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let mut done: SmallVec<[Arc<Queue>; 8]> = SmallVec::new();
        let result = {
            let mut unwaited = self.unwaited.lock().unwrap_or_else(|p| p.into_inner());
            let mut result = Ok(());
            let mut i = 0;
            while i < unwaited.len() {
                let queue = &unwaited[i];
                if except.is_some_and(|e| std::ptr::eq(e, &**queue)) {
                    i += 1;
                    continue;
                }
                if let Err(e) = self.stream.wait(&queue.order.left) {
                    result = Err(cuda_error("wait event", e));
                    break;
                }
                let before = self.epoch.fetch_add(1, Ordering::AcqRel);
                let _ = queue.order.seen.compare_exchange(before, before + 1, Ordering::AcqRel, Ordering::Relaxed);
                let queue = unwaited.swap_remove(i);
                if Arc::strong_count(&queue) > 1 {
                    drop(queue);
                } else {
                    // Its workspace is gone: dropped below, without the lock.
                    done.push(queue);
                }
            }
            self.unwaited_len.store(unwaited.len(), Ordering::Release);
            result
        };
        // Dropped without the lock held: a queue whose workspace is gone drops its users'
        // states here.
        drop(done);
        result
    }

    /// A run enters `queue`: its stream comes after what the device's stream holds.
    pub(crate) fn enter(&self, queue: &Queue) -> Result<()> {
        if queue.order.on_device_stream {
            // The run goes to the device's stream itself, after what it holds: only other
            // queues' runs are still to be waited for.
            return self.wait_for_runs(None);
        }
        self.wait_for_runs(Some(queue))?;
        let now = self.epoch.load(Ordering::Acquire);
        if queue.order.seen.load(Ordering::Acquire) == now || self.done.load(Ordering::Acquire) >= now {
            // Nothing was queued on the device's stream since this queue last waited for it,
            // or all of it is done.
            return Ok(());
        }
        queue.order.entered.record(&self.stream).map_err(|e| cuda_error("record event", e))?;
        queue.stream.wait(&queue.order.entered).map_err(|e| cuda_error("wait event", e))?;
        queue.order.seen.store(now, Ordering::Release);
        Ok(())
    }

    /// A run leaves `queue`: the device's stream waits for it before its next own work.
    pub(crate) fn leave(&self, queue: &Arc<Queue>) -> Result<()> {
        if queue.order.on_device_stream {
            // Work the run queued on the device's stream: counted, so that other queues wait
            // for it when they enter.
            self.epoch.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        queue.order.left.record(&queue.stream).map_err(|e| cuda_error("record event", e))?;
        let mut unwaited = self.unwaited.lock().unwrap_or_else(|p| p.into_inner());
        if !unwaited.iter().any(|q| Arc::ptr_eq(q, queue)) {
            unwaited.push(queue.clone());
            self.unwaited_len.store(unwaited.len(), Ordering::Release);
        }
        Ok(())
    }
}
