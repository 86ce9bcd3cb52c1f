//! `Recorder`: an in-process range tree that tests and users read back without any profiler,
//! and export as Chrome trace JSON (Perfetto, chrome://tracing).

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Instant;

use super::{Guard, GuardKind, GuardPolicy, GuardSite, Level, ScopedGuard};
use crate::error::Result;

/// One recorded range.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedRange {
    /// Unique within its recorder, in order of entry.
    pub id: u64,
    /// The range of the same recorder that was open on the same thread when this one began.
    pub parent: Option<u64>,
    /// The label (symbol name, region label, user label).
    pub label: Arc<str>,
    /// Its level.
    pub level: Level,
    /// The thread it ran on.
    pub thread: ThreadId,
    /// A small number per thread (1, 2, ...), for exports.
    pub thread_index: u64,
    /// Start, in ns since the recorder was made.
    pub start_ns: u64,
    /// End, in ns since the recorder was made.
    pub end_ns: u64,
}

/// Records every range it is attached to, with its parent, thread and times. Clones share one
/// record.
///
/// It keeps at most [`Recorder::DEFAULT_CAPACITY`] ranges (or
/// [`with_capacity`](Self::with_capacity)'s) until [`clear`](Self::clear): a guard left on a
/// long training loop does not grow without bound. Ranges entered once it is full are dropped
/// and counted ([`dropped_ranges`](Self::dropped_ranges), and `otherData.dropped_ranges` in the
/// Chrome trace), the first ones entered being kept; a range inside a dropped one is dropped
/// too, so every kept range's `parent` is kept.
///
/// ```
/// use boundscope::guards::{Recorder, Selection};
/// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[4]).unwrap();
/// let y = b.exp(x).unwrap();
/// b.output(y).unwrap();
/// let mut trace = b.finish().unwrap();
/// let recorder = Recorder::new();
/// trace.attach_trace_guard(recorder.clone()).unwrap();
/// trace.attach_guard(Selection::All, recorder.clone()).unwrap();
/// let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
/// plan.run(&[&Tensor::zeros(&[4])]).unwrap();
/// let ranges = recorder.ranges();
/// assert_eq!(ranges.len(), 2);
/// assert_eq!(ranges[1].label.as_ref(), "exp");
/// assert_eq!(ranges[1].parent, Some(ranges[0].id)); // op inside trace
/// assert!(recorder.to_chrome_trace().contains("\"ph\":\"X\""));
/// ```
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<RecorderInner>,
}

struct RecorderInner {
    id: u64,
    epoch: Instant,
    next_range: AtomicU64,
    ranges: Mutex<Vec<RecordedRange>>,
    /// Ranges it keeps at most between clears.
    capacity: u64,
    /// Places asked for since the last clear, by ranges entered outside any dropped one (a
    /// place is taken at entry, so that a parent, entered first, is kept whenever its child
    /// is): those up to `capacity` are kept.
    kept: AtomicU64,
    /// Ranges dropped because it was full, over its life.
    dropped: AtomicU64,
}

struct OpenRange {
    recorder: u64,
    id: u64,
    parent: Option<u64>,
    start_ns: u64,
    /// Whether it is recorded when it ends (not past the capacity).
    kept: bool,
}

thread_local! {
    static OPEN: RefCell<Vec<OpenRange>> = const { RefCell::new(Vec::new()) };
    static THREAD_INDEX: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// A small number for the current thread (1, 2, ... in order of first use), the same for every
/// guard that records threads (`Recorder`, `Timeline`), so that their traces agree on `tid`s.
pub(crate) fn thread_index() -> u64 {
    THREAD_INDEX.with(|t| *t)
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// Ranges a recorder made by [`new`](Self::new) keeps between clears: 1,048,576 (about
    /// 80 MiB).
    pub const DEFAULT_CAPACITY: usize = 1 << 20;

    /// An empty recorder that keeps up to [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) ranges.
    pub fn new() -> Self {
        Self::with_capacity(Self::DEFAULT_CAPACITY)
    }

    /// An empty recorder that keeps up to `ranges` ranges between clears, dropping and counting
    /// those entered past them ([`dropped_ranges`](Self::dropped_ranges)). Memory grows with
    /// what is kept; nothing is reserved up front.
    ///
    /// ```
    /// use boundscope::guards::{Recorder, Selection};
    /// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
    /// let registry = Registry::with_builtins();
    /// let arena = Arena::new();
    /// let mut b = TraceBuilder::new(&arena, &registry);
    /// let x = b.input(&[4])?;
    /// let y = b.exp(x)?;
    /// b.output(y)?;
    /// let mut trace = b.finish()?;
    /// let recorder = Recorder::with_capacity(3);
    /// trace.attach_trace_guard(recorder.clone())?;
    /// trace.attach_guard(Selection::All, recorder.clone())?;
    /// let plan = Plan::compile(&trace, &[CpuReference::shared()])?;
    /// let x = Tensor::zeros(&[4]);
    /// plan.run(&[&x])?; // the run's range and `exp`'s: 2 kept
    /// plan.run(&[&x])?; // the run's range kept, `exp`'s dropped (it is full)
    /// assert_eq!((recorder.len(), recorder.dropped_ranges()), (3, 1));
    /// assert!(recorder.to_chrome_trace().contains("\"dropped_ranges\":1"));
    /// recorder.clear(); // room for 3 more
    /// plan.run(&[&x])?;
    /// assert_eq!((recorder.len(), recorder.dropped_ranges()), (2, 1));
    /// # Ok::<(), boundscope::Error>(())
    /// ```
    pub fn with_capacity(ranges: usize) -> Self {
        static NEXT_RECORDER: AtomicU64 = AtomicU64::new(1);
        Self {
            inner: Arc::new(RecorderInner {
                id: NEXT_RECORDER.fetch_add(1, Ordering::Relaxed),
                epoch: Instant::now(),
                next_range: AtomicU64::new(0),
                ranges: Mutex::new(Vec::new()),
                capacity: u64::try_from(ranges).unwrap_or(u64::MAX),
                kept: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Ranges dropped so far because the recorder was full (see
    /// [`with_capacity`](Self::with_capacity)), counted as each ends (one still open is not
    /// counted yet); [`clear`](Self::clear) does not reset it.
    pub fn dropped_ranges(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Every completed range, by thread, then start time, then entry order.
    pub fn ranges(&self) -> Vec<RecordedRange> {
        let mut ranges = self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ranges.sort_by_key(|r| (r.thread_index, r.start_ns, r.id));
        ranges
    }

    /// Number of completed ranges.
    pub fn len(&self) -> usize {
        self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets everything recorded, making room for as many ranges again. (Ranges still open
    /// are recorded when they end, past the room they took before.)
    pub fn clear(&self) {
        let mut ranges = self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner());
        ranges.clear();
        ranges.shrink_to(0);
        self.inner.kept.store(0, Ordering::Relaxed);
    }

    /// The ranges as Chrome trace JSON: complete (`"ph":"X"`) events in microseconds, one
    /// `tid` per thread, category = level. Perfetto and chrome://tracing open it.
    pub fn to_chrome_trace(&self) -> String {
        let mut json = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[");
        for (i, r) in self.ranges().iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str("{\"name\":");
            push_json_string(&mut json, &r.label);
            let _ = write!(
                json,
                ",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":{},\"args\":{{\"id\":{}",
                r.level.name(),
                r.start_ns as f64 / 1e3,
                r.end_ns.saturating_sub(r.start_ns) as f64 / 1e3,
                r.thread_index,
                r.id
            );
            if let Some(p) = r.parent {
                let _ = write!(json, ",\"parent\":{p}");
            }
            json.push_str("}}");
        }
        let _ = write!(json, "],\"otherData\":{{\"dropped_ranges\":{}}}}}", self.dropped_ranges());
        json
    }

    /// Writes [`to_chrome_trace`](Self::to_chrome_trace) to a file.
    ///
    /// ```
    /// use boundscope::guards::Recorder;
    /// let err = Recorder::new().write_chrome_trace("/nonexistent/dir/trace.json").unwrap_err();
    /// assert!(err.to_string().contains("/nonexistent/dir/trace.json"), "{err}");
    /// ```
    ///
    /// # Errors
    /// [`Error::UnwritableFile`](crate::Error::UnwritableFile), naming the path, if writing
    /// fails.
    pub fn write_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> crate::Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_chrome_trace())
            .map_err(|e| crate::Error::UnwritableFile { path: path.display().to_string(), detail: e.to_string() })
    }
}

fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

struct PreparedRecord {
    inner: Arc<RecorderInner>,
    label: Arc<str>,
    level: Level,
}

impl PreparedRecord {
    fn now_ns(&self) -> u64 {
        self.inner.epoch.elapsed().as_nanos() as u64
    }
}

impl ScopedGuard for PreparedRecord {
    fn on_enter(&self) -> u64 {
        let id = self.inner.next_range.fetch_add(1, Ordering::Relaxed);
        let start_ns = self.now_ns();
        OPEN.with(|open| {
            let mut open = open.borrow_mut();
            let parent = open.iter().rev().find(|o| o.recorder == self.inner.id);
            // Inside a dropped range, dropped too; else kept while there is room.
            let kept =
                parent.is_none_or(|p| p.kept) && self.inner.kept.fetch_add(1, Ordering::Relaxed) < self.inner.capacity;
            let parent = parent.map(|o| o.id);
            open.push(OpenRange { recorder: self.inner.id, id, parent, start_ns, kept });
        });
        id
    }

    fn on_exit(&self, entered: u64) {
        let end_ns = self.now_ns();
        let open = OPEN.with(|open| {
            let mut open = open.borrow_mut();
            let at = open.iter().rposition(|o| o.recorder == self.inner.id && o.id == entered)?;
            Some(open.remove(at))
        });
        // A range that is not open was entered elsewhere; there is nothing sound to record.
        let Some(open) = open else { return };
        if !open.kept {
            self.inner.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let range = RecordedRange {
            id: entered,
            parent: open.parent,
            label: self.label.clone(),
            level: self.level,
            thread: std::thread::current().id(),
            thread_index: thread_index(),
            start_ns: open.start_ns,
            end_ns,
        };
        self.inner.ranges.lock().unwrap_or_else(|p| p.into_inner()).push(range);
    }
}

impl Guard for Recorder {
    /// The backward of what it surrounds is recorded too, labelled `<label> (backward)`.
    fn on_backward(&self, forward_label: &str, _forward_position: Option<usize>) -> super::OnBackward {
        super::OnBackward::Relabeled(super::backward_label(forward_label))
    }

    fn kind(&self) -> GuardKind {
        GuardKind::Recorder
    }

    /// Recorded ranges of fused ops merge into their region's range, like NVTX ranges.
    fn policy(&self) -> GuardPolicy {
        GuardPolicy::MoveToEnclosing
    }

    fn merge_key(&self) -> Option<String> {
        Some(format!("recorder:{}", self.inner.id))
    }

    fn prepare(&self, site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>> {
        Ok(Box::new(PreparedRecord { inner: self.inner.clone(), label: Arc::from(site.label), level: site.level }))
    }
}
