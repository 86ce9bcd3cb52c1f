//! The CPU executors' worker threads: one parallel section at a time, split into parts, with no
//! allocation per section.
//!
//! Why not `rayon`: its `install` from a thread outside its pool pushes the job onto a shared
//! injector queue that allocates a block every 63 jobs, which would break the promise that
//! steady-state runs allocate nothing; and its work stealing buys nothing for what the CPU
//! executors split, which is a streaming loop cut into one equal part per core. So the parts are
//! static: part `k` always runs on thread `k` (the caller runs part 0), which also means that
//! every thread's scratch is sized by the first run and never grows again.
//!
//! A plan run from several user threads at once does not oversubscribe the machine: one
//! parallel section holds the workers at a time, and a caller that finds them busy waits for
//! them (a section is one op or one region, microseconds to milliseconds). The NVTX ranges and
//! guards of an op stay on the calling thread, around the whole section.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The fewest elements of a streaming op worth a part of its own: below this, waking a worker
/// costs more than it saves, and small ops stay on the calling thread.
pub(crate) const MIN_ELEMENTS_PER_PART: usize = 1 << 16;

/// The fewest elements worth a part of their own for ops that spend nanoseconds on each
/// element (exponentials, logarithms, `tanh`, `gelu`, softmax and layer_norm rows), where
/// [`MIN_ELEMENTS_PER_PART`] is for streaming ops of a few instructions per element: a part
/// of this many costs tens of microseconds, well above what starting a section costs.
pub(crate) const MIN_COSTLY_ELEMENTS_PER_PART: usize = 1 << 13;

/// The fewest elements worth a part for elementwise op `op` (a prim's id).
pub(crate) fn min_elements_per_part(op: crate::core::ir::SymbolId) -> usize {
    use crate::core::ir::prims;
    if [prims::EXP, prims::LOG, prims::TANH, prims::SIGMOID, prims::GELU].contains(&op) {
        MIN_COSTLY_ELEMENTS_PER_PART
    } else {
        MIN_ELEMENTS_PER_PART
    }
}

/// How many threads the machine offers (at least 1), asked once per process:
/// `available_parallelism` reads the cgroup files on Linux and allocates each time.
pub(crate) fn available_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The number of parts to split `work` units into, for an executor configured with `threads`
/// (0: every core) when a part should hold at least `min_per_part` units: 1 for small work.
pub(crate) fn parts_for(threads: usize, work: usize, min_per_part: usize) -> usize {
    let threads = if threads == 0 { available_threads() } else { threads.min(available_threads()) };
    (work / min_per_part.max(1)).clamp(1, threads)
}

/// The units of part `part` of `parts` when `units` are split as evenly as they go.
#[inline]
pub(crate) fn part_range(part: usize, parts: usize, units: usize) -> std::ops::Range<usize> {
    let (base, extra) = (units / parts, units % parts);
    let start = part * base + part.min(extra);
    start..start + base + usize::from(part < extra)
}

/// Runs `job(part)` for every part in `0..parts`, part 0 on the calling thread and the others
/// on worker threads, and returns when all are done. A panic in any part is resumed on the
/// caller once every part has finished.
pub(crate) fn run_parts(parts: usize, job: &(dyn Fn(usize) + Sync)) {
    if parts <= 1 || IN_SECTION.get() {
        (0..parts).for_each(job);
        return;
    }
    let pool = pool();
    if pool.workers == 0 {
        (0..parts).for_each(job);
        return;
    }
    pool.run(parts.min(pool.workers + 1), parts, job);
}

/// Runs `job(units, out_part)` in `parts` parts, where `out` holds `unit` elements per unit
/// (the last unit may be shorter) and each part gets its own units and its own slice of `out`.
#[inline(always)]
pub(crate) fn run_parts_writing<T: Send, F: Fn(std::ops::Range<usize>, &mut [T]) + Sync>(
    out: &mut [T],
    parts: usize,
    unit: usize,
    job: F,
) {
    if parts <= 1 {
        // The common case (every small op): no division, no section.
        let units = if unit == 1 { out.len() } else { out.len().div_ceil(unit.max(1)) };
        job(0..units, out);
        return;
    }
    split_writing(out, parts, unit, &job);
}

/// The parts of [`run_parts_writing`] past one, out of line: the job's one direct call above is
/// then inlined into small ops' kernels.
#[inline(never)]
fn split_writing<T: Send, F: Fn(std::ops::Range<usize>, &mut [T]) + Sync>(
    out: &mut [T],
    parts: usize,
    unit: usize,
    job: &F,
) {
    let unit = unit.max(1);
    let units = out.len().div_ceil(unit);
    let (base, len) = (SharedMut(out.as_mut_ptr()), out.len());
    run_parts(parts, &|part| {
        let units = part_range(part, parts, units);
        let (start, end) = ((units.start * unit).min(len), (units.end * unit).min(len));
        // SAFETY: the parts' unit ranges are disjoint, so their element ranges are disjoint
        // slices of `out`, which the caller lends exclusively for the whole section.
        let slice = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        job(units, slice);
    });
}

/// A pointer into a buffer that the parts of one section write disjoint pieces of.
pub(crate) struct SharedMut<T = f32>(*mut T);

impl<T> Clone for SharedMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedMut<T> {}

// SAFETY: a section's parts only write disjoint element ranges through it, and the section
// ends before the borrow it was made from does; the elements are `Send`.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub(crate) fn new(buffer: &mut [T]) -> Self {
        Self(buffer.as_mut_ptr())
    }

    /// The pointer (a method, so that closures capture the whole `Send + Sync` wrapper).
    #[inline(always)]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

thread_local! {
    /// Whether this thread is inside a parallel section (a part that splits again runs inline).
    static IN_SECTION: Cell<bool> = const { Cell::new(false) };
}

/// How long a worker that finished a section, or a caller waiting for its workers, polls
/// before it sleeps on a condition variable. Plans run sections back to back (an op, then the
/// next): waking a sleeping thread costs a system call on each side and tens of microseconds on
/// a busy virtual machine, more than a small op takes, while a polling thread starts within a
/// fraction of a microsecond. OpenMP runtimes poll the same way (GNU's for about 300,000 spins,
/// Intel's for 200 ms); this is shorter, so that an idle process goes quiet quickly.
const POLL_BEFORE_SLEEPING: Duration = Duration::from_micros(100);

/// A job pointer workers may call while the section that published it is open.
#[derive(Clone, Copy)]
struct JobRef(*const (dyn Fn(usize) + Sync));

// SAFETY: the pointee is `Sync`, and `WorkerPool::run` keeps it alive (it does not return)
// until every worker that read the pointer has finished with it.
unsafe impl Send for JobRef {}

struct Section {
    /// Bumped for every section: workers wait for a new one.
    generation: u64,
    job: Option<JobRef>,
    /// Threads in the section (caller included), and parts in all.
    threads: usize,
    parts: usize,
    /// Workers of this section that have not finished yet.
    pending: usize,
    panic: Option<Box<dyn Any + Send>>,
    /// Workers asleep on `start`, and whether the caller sleeps on `done`: a condition
    /// variable is notified only when somebody sleeps on it.
    sleeping_workers: usize,
    caller_sleeps: bool,
}

struct WorkerPool {
    workers: usize,
    /// Held by the caller for the whole section: one section at a time.
    caller: Mutex<()>,
    section: Mutex<Section>,
    start: Condvar,
    done: Condvar,
    /// `Section::generation` and `Section::pending` as the polling threads read them (written
    /// under the section's lock, read without it).
    published: AtomicU64,
    unfinished: AtomicUsize,
}

fn pool() -> &'static WorkerPool {
    static POOL: OnceLock<WorkerPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let mut workers = 0;
        for k in 1..available_threads() {
            let name = format!("boundscope-cpu-{k}");
            let nvtx_name = std::ffi::CString::new(name.clone()).unwrap_or_default();
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                // Nsight shows the worker by this name; a no-op without a tool.
                nvtx::name_current_thread(nvtx_name);
                // Waits until the pool below is initialized.
                pool().work(k);
            });
            // A machine that refuses threads runs with fewer: sections then use fewer parts.
            if spawned.is_err() {
                break;
            }
            workers += 1;
        }
        WorkerPool {
            workers,
            caller: Mutex::new(()),
            section: Mutex::new(Section {
                generation: 0,
                job: None,
                threads: 0,
                parts: 0,
                pending: 0,
                panic: None,
                sleeping_workers: 0,
                caller_sleeps: false,
            }),
            start: Condvar::new(),
            done: Condvar::new(),
            published: AtomicU64::new(0),
            unfinished: AtomicUsize::new(0),
        }
    })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks; a poisoned lock still holds consistent data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WorkerPool {
    fn run(&self, threads: usize, parts: usize, job: &(dyn Fn(usize) + Sync)) {
        let _one_section = lock(&self.caller);
        // SAFETY: only the lifetime is erased. The pointer is cleared below before this
        // function returns, and not before every worker of this section has reported done.
        let erased: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(job) };
        let wake = {
            let mut section = lock(&self.section);
            section.generation = section.generation.wrapping_add(1);
            section.job = Some(JobRef(erased));
            section.threads = threads;
            section.parts = parts;
            section.pending = threads - 1;
            section.panic = None;
            self.unfinished.store(threads - 1, Ordering::Release);
            self.published.store(section.generation, Ordering::Release);
            section.sleeping_workers > 0
        };
        if wake {
            self.start.notify_all();
        }
        IN_SECTION.set(true);
        let mine = catch_unwind(AssertUnwindSafe(|| {
            let mut part = 0;
            while part < parts {
                job(part);
                part += threads;
            }
        }));
        IN_SECTION.set(false);
        poll_until(|| self.unfinished.load(Ordering::Acquire) == 0);
        let mut section = lock(&self.section);
        while section.pending > 0 {
            section.caller_sleeps = true;
            section = self.done.wait(section).unwrap_or_else(PoisonError::into_inner);
            section.caller_sleeps = false;
        }
        section.job = None;
        let theirs = section.panic.take();
        drop(section);
        if let Err(panic) = mine {
            resume_unwind(panic);
        }
        if let Some(panic) = theirs {
            resume_unwind(panic);
        }
    }

    /// Worker `k`'s loop: parts `k`, `k + threads`, ... of every section it is part of.
    fn work(&self, k: usize) {
        IN_SECTION.set(true);
        let mut seen = 0;
        // Whether this worker had a part in the last section: only then does it poll for the
        // next one (a section of fewer threads than the machine's leaves the others asleep).
        let mut busy = false;
        loop {
            if busy {
                poll_until(|| self.published.load(Ordering::Acquire) != seen);
            }
            busy = false;
            let (job, threads, parts) = {
                let mut section = lock(&self.section);
                while section.generation == seen || section.job.is_none() {
                    section.sleeping_workers += 1;
                    section = self.start.wait(section).unwrap_or_else(PoisonError::into_inner);
                    section.sleeping_workers -= 1;
                }
                seen = section.generation;
                match section.job {
                    Some(job) if k < section.threads => (job, section.threads, section.parts),
                    _ => continue,
                }
            };
            busy = true;
            let result = catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: the caller keeps the job alive until `pending` reaches 0, which
                // needs this worker's report below.
                let job = unsafe { &*job.0 };
                let mut part = k;
                while part < parts {
                    job(part);
                    part += threads;
                }
            }));
            let mut section = lock(&self.section);
            if let Err(panic) = result {
                section.panic.get_or_insert(panic);
            }
            section.pending -= 1;
            self.unfinished.store(section.pending, Ordering::Release);
            if section.pending == 0 && section.caller_sleeps {
                self.done.notify_one();
            }
        }
    }
}

/// Polls `ready` for up to [`POLL_BEFORE_SLEEPING`]; the caller then checks again under the
/// lock and sleeps if it is still not ready.
fn poll_until(ready: impl Fn() -> bool) {
    // The clock is read every 64 polls: a poll is a load and a pause (tens of nanoseconds).
    let mut started: Option<Instant> = None;
    let mut polls = 0u32;
    while !ready() {
        std::hint::spin_loop();
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(64) {
            let now = Instant::now();
            if now.duration_since(*started.get_or_insert(now)) >= POLL_BEFORE_SLEEPING {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn parts_cover_the_units_once_and_evenly() {
        for units in 0..50 {
            for parts in 1..9 {
                let ranges: Vec<_> = (0..parts).map(|p| part_range(p, parts, units)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[parts - 1].end, units);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let (min, max) = (ranges.iter().map(|r| r.len()).min(), ranges.iter().map(|r| r.len()).max());
                assert!(max.unwrap() - min.unwrap() <= 1);
            }
        }
    }

    #[test]
    fn small_work_stays_in_one_part_and_threads_are_capped() {
        assert_eq!(parts_for(0, 10, MIN_ELEMENTS_PER_PART), 1);
        assert_eq!(parts_for(1, 1 << 30, MIN_ELEMENTS_PER_PART), 1);
        assert_eq!(parts_for(0, 1 << 30, MIN_ELEMENTS_PER_PART), available_threads());
        assert_eq!(parts_for(1000, 1 << 30, MIN_ELEMENTS_PER_PART), available_threads());
    }

    #[test]
    fn every_part_runs_once_from_many_callers_at_once() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for parts in 1..12 {
                        let seen: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
                        run_parts(parts, &|p| {
                            seen[p].fetch_add(1, Ordering::Relaxed);
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * (1..12).sum::<usize>());
    }

    #[test]
    fn a_panicking_part_reaches_the_caller_after_every_part_ran() {
        let ran = AtomicUsize::new(0);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            run_parts(8, &|p| {
                ran.fetch_add(1, Ordering::Relaxed);
                if p == 5 {
                    panic!("part 5");
                }
            })
        }));
        assert!(caught.is_err());
        // The parts of a thread after its panicking one do not run; the others all do, and the
        // pool still works.
        assert!(ran.load(Ordering::Relaxed) >= 1);
        let after = AtomicUsize::new(0);
        run_parts(4, &|_| {
            after.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(after.load(Ordering::Relaxed), 4);
    }
}
