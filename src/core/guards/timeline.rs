//! `Timeline`: the host begin and end of every scope a plan runs, written as one Chrome trace
//! event file (chrome://tracing, ui.perfetto.dev), without Nsight.
//!
//! Built for the hot path. [`Recorder`](super::Recorder) keeps a tree (ids, parents) behind one
//! lock and allocates per range; a timeline keeps only `(site, start, end)` per scope, appended
//! to a buffer of the entering thread that is reserved when that thread first closes a scope of
//! this timeline and reused after every drain, so that once each thread has warmed up a run
//! allocates nothing and threads never wait for each other. Labels, levels and executors are
//! prepared once per site when a plan is compiled ([`Guard::prepare`]); they are joined with the
//! timestamps, and turned into JSON, only when you ask for the file.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};

use super::{Guard, GuardKind, GuardPolicy, GuardSite, Level, ScopedGuard, TimerStats};
use crate::error::{Error, Result};

/// Scopes each thread keeps between two drains, unless [`Timeline::with_capacity`] says
/// otherwise: 65 536 (1.5 MiB per thread).
pub const DEFAULT_CAPACITY: usize = 1 << 16;

/// The track name [`Timeline::add_cuda_event_timer`] gives device times.
pub const CUDA_EVENTS_TRACK: &str = "GPU (CUDA events)";

/// Records the host begin and end of every scope it is attached to (a run, a region, an op, a
/// subsymbol span) into per-thread buffers, and writes them as one Chrome trace event file.
/// Clones share one timeline.
///
/// Each thread's buffer holds [`DEFAULT_CAPACITY`] scopes (or [`with_capacity`](Self::with_capacity)'s),
/// reserved when the thread first closes a scope of this timeline; a drain
/// ([`to_chrome_trace`](Self::to_chrome_trace), [`write_chrome_trace`](Self::write_chrome_trace))
/// empties it and keeps its memory, so that runs after the first allocate nothing. Scopes that
/// close while a thread's buffer is full are dropped and counted
/// ([`dropped_scopes`](Self::dropped_scopes), and `otherData.dropped_scopes` in the file): whole
/// scopes, so what is kept still nests. A scope is recorded when it closes; one still open at a
/// drain goes into the next.
///
/// Like the other profiling guards it records nothing while
/// [`Plan::set_profiling`](crate::Plan::set_profiling) is off.
///
/// ```
/// use boundscope::guards::{Selection, Timeline};
/// use boundscope::{executors::CpuReference, Arena, Plan, Registry, Tensor, TraceBuilder};
/// let registry = Registry::with_builtins();
/// let arena = Arena::new();
/// let mut b = TraceBuilder::new(&arena, &registry);
/// let x = b.input(&[4])?;
/// let y = b.exp(x)?;
/// let z = b.neg(y)?;
/// b.output(z)?;
/// let mut trace = b.finish()?;
/// let timeline = Timeline::new();
/// trace.attach_trace_guard(timeline.clone())?;
/// trace.attach_guard(Selection::All, timeline.clone())?;
/// let plan = Plan::compile(&trace, &[CpuReference::shared()])?;
/// for _ in 0..2 {
///     plan.run(&[&Tensor::zeros(&[4])])?;
/// }
/// let chrome = timeline.to_chrome_trace();
/// let scopes: Vec<_> = chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
/// assert_eq!(scopes.len(), 2 * 3); // per run: the run, exp, neg
/// assert_eq!(scopes[0]["name"], "trace");
/// assert_eq!(scopes[1]["name"], "exp");
/// assert_eq!(scopes[1]["cat"], "op");
/// assert_eq!(scopes[1]["args"]["executor"], "cpu_reference");
///
/// let path = timeline.write_chrome_trace(std::env::temp_dir())?; // open it in ui.perfetto.dev
/// assert!(path.exists());
/// # std::fs::remove_file(path).ok();
/// # Ok::<(), boundscope::Error>(())
/// ```
#[derive(Clone)]
pub struct Timeline {
    inner: Arc<TimelineInner>,
}

struct TimelineInner {
    id: u64,
    epoch: Instant,
    capacity: usize,
    /// What each site surrounds; a span names its site by index.
    sites: Mutex<Sites>,
    /// Every thread's buffer, in order of first use.
    threads: Mutex<Vec<Arc<ThreadBuffer>>>,
    /// Device times added since the last drain.
    device: Mutex<Vec<DeviceTrack>>,
    /// Scopes dropped because a buffer was full, over the timeline's life.
    dropped: AtomicU64,
}

/// The sites of a timeline: at most [`Timeline::MAX_SITES`] of their own, then one shared site
/// per level for the rest.
#[derive(Default)]
struct Sites {
    list: Vec<Site>,
    index: HashMap<Site, usize>,
    /// Sites prepared under a shared one.
    past_bound: u64,
}

impl Sites {
    /// The index of `site`, added if new; past the bound, the index of its level's shared site.
    fn intern(&mut self, site: Site) -> usize {
        if let Some(&index) = self.index.get(&site) {
            return index;
        }
        let site = if self.list.len() < Timeline::MAX_SITES {
            site
        } else {
            let shared =
                Site { label: PAST_BOUND_LABEL.to_string(), level: site.level, executor: String::new(), ops: 0 };
            if let Some(&index) = self.index.get(&shared) {
                self.past_bound += 1;
                return index;
            }
            self.past_bound += 1;
            shared
        };
        self.list.push(site.clone());
        self.index.insert(site, self.list.len() - 1);
        self.list.len() - 1
    }
}

/// The label of the shared sites of scopes past [`Timeline::MAX_SITES`].
pub const PAST_BOUND_LABEL: &str = "(sites past the timeline's bound)";

#[derive(Clone, PartialEq, Eq, Hash)]
struct Site {
    label: String,
    level: Level,
    executor: String,
    ops: u32,
}

struct ThreadBuffer {
    /// A small number per thread (1, 2, ...), shared by every timeline of the process.
    thread_index: u64,
    thread_name: String,
    spans: Mutex<Vec<Span>>,
}

#[derive(Clone, Copy)]
struct Span {
    site: usize,
    start_ns: u64,
    end_ns: u64,
}

struct DeviceTrack {
    name: String,
    stats: Vec<TimerStats>,
}

thread_local! {
    /// This thread's buffer of each timeline it has used: `(timeline id, buffer)`.
    static BUFFERS: RefCell<Vec<(u64, Arc<ThreadBuffer>)>> = const { RefCell::new(Vec::new()) };
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Timeline {
    /// Distinct sites (label, level, executor and op count) a timeline describes one by one.
    /// Scopes of later sites (labels that vary per request, say) are recorded under one shared
    /// site per level, labelled [`PAST_BOUND_LABEL`], and counted
    /// ([`sites_past_bound`](Self::sites_past_bound), and `otherData.sites_past_bound` in the file):
    /// their times stay, their own labels do not, and the memory a timeline keeps per site stays
    /// bounded.
    pub const MAX_SITES: usize = 1 << 16;

    /// An empty timeline whose threads keep [`DEFAULT_CAPACITY`] scopes each between drains.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// An empty timeline whose threads keep up to `scopes_per_thread` scopes each between
    /// drains (24 bytes each, reserved when a thread first closes a scope). A capacity the
    /// machine cannot reserve records nothing on that thread: every scope is counted as dropped.
    ///
    /// ```
    /// use boundscope::guards::{Guard, GuardSite, Level, Timeline};
    /// let timeline = Timeline::with_capacity(1);
    /// let site = GuardSite::new("add", Level::Op, "cpu", 1);
    /// let prepared = timeline.prepare(&site)?;
    /// prepared.in_scope(|| ());
    /// prepared.in_scope(|| ()); // the buffer is full: dropped, and counted
    /// assert_eq!(timeline.dropped_scopes(), 1);
    /// assert_eq!(timeline.to_chrome_trace()["otherData"]["dropped_scopes"], 1);
    /// prepared.in_scope(|| ()); // drained: room again
    /// assert_eq!(timeline.dropped_scopes(), 1);
    /// # Ok::<(), boundscope::Error>(())
    /// ```
    pub fn with_capacity(scopes_per_thread: usize) -> Self {
        static NEXT_TIMELINE: AtomicU64 = AtomicU64::new(1);
        Self {
            inner: Arc::new(TimelineInner {
                id: NEXT_TIMELINE.fetch_add(1, Ordering::Relaxed),
                epoch: Instant::now(),
                capacity: scopes_per_thread,
                sites: Mutex::new(Sites::default()),
                threads: Mutex::new(Vec::new()),
                device: Mutex::new(Vec::new()),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Scopes dropped so far because a thread's buffer was full (see
    /// [`with_capacity`](Self::with_capacity)); drains do not reset it.
    pub fn dropped_scopes(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Sites prepared under a shared site because the timeline already described
    /// [`MAX_SITES`](Self::MAX_SITES) of its own (each preparation counts: a plan compiled
    /// again counts again).
    ///
    /// ```
    /// use boundscope::guards::{Guard, GuardSite, Level, Timeline, PAST_BOUND_LABEL};
    /// let timeline = Timeline::with_capacity(Timeline::MAX_SITES + 2);
    /// for i in 0..Timeline::MAX_SITES + 2 {
    ///     let label = format!("request {i}");
    ///     timeline.prepare(&GuardSite::new(&label, Level::Op, "cpu", 1))?.in_scope(|| ());
    /// }
    /// assert_eq!(timeline.sites_past_bound(), 2);
    /// let chrome = timeline.to_chrome_trace();
    /// assert_eq!(chrome["otherData"]["sites_past_bound"], 2);
    /// let last = chrome["traceEvents"].as_array().unwrap().iter().rev().find(|e| e["ph"] == "X").unwrap();
    /// assert_eq!(last["name"], PAST_BOUND_LABEL);
    /// # Ok::<(), boundscope::Error>(())
    /// ```
    pub fn sites_past_bound(&self) -> u64 {
        lock(&self.inner.sites).past_bound
    }

    /// Adds per-label device times as a track of their own, named `track`, to the next drain.
    ///
    /// These are totals, not timestamps: the track shows one complete event per label, laid
    /// end to end from the first host scope of the file, whose length is the label's total
    /// device time and whose `args` hold `count`, `mean_us`, `min_us` and `max_us`; the track's
    /// name says that it is not aligned to host time. ([`CudaEventTimer`] keeps totals per
    /// label, not the time of each entry, so this is what it can give;
    /// [`add_cuda_event_timer`](Self::add_cuda_event_timer) calls this.) Labels that never ran
    /// are left out.
    ///
    /// [`CudaEventTimer`]: crate::executors::cuda
    ///
    /// ```
    /// use std::time::Duration;
    /// use boundscope::guards::{TimerStats, Timeline};
    /// let timeline = Timeline::new();
    /// let ms = Duration::from_millis;
    /// let stats = TimerStats { label: "CudaFusion0".into(), count: 4, total: ms(8), min: ms(1), max: ms(3) };
    /// timeline.add_device_summary("GPU", &[stats]);
    /// let chrome = timeline.to_chrome_trace();
    /// let events = chrome["traceEvents"].as_array().unwrap();
    /// let device = events.iter().find(|e| e["ph"] == "X").unwrap();
    /// assert_eq!(device["name"], "CudaFusion0");
    /// assert_eq!(device["dur"], 8000.0);
    /// assert_eq!(device["args"]["mean_us"], 2000.0);
    /// ```
    pub fn add_device_summary(&self, track: &str, stats: &[TimerStats]) {
        let stats = stats.iter().filter(|s| s.count > 0).cloned().collect();
        lock(&self.inner.device).push(DeviceTrack { name: track.to_string(), stats });
    }

    /// Adds a [`CudaEventTimer`](crate::executors::cuda::CudaEventTimer)'s device times to the
    /// next drain, on the track [`CUDA_EVENTS_TRACK`]: as a summary per label (see
    /// [`add_device_summary`](Self::add_device_summary)), because the timer keeps totals per
    /// label, not per-entry timestamps that could be aligned with the host scopes. Waits for
    /// the device work the timer recorded so far.
    ///
    /// ```no_run
    /// # #[cfg(feature = "cuda")] {
    /// use boundscope::executors::cuda::{CudaDevice, CudaEventTimer};
    /// use boundscope::guards::Timeline;
    /// let timer = CudaEventTimer::new(CudaDevice::new().unwrap());
    /// let timeline = Timeline::new();
    /// // ... attach both to a plan's trace, run it ...
    /// timeline.add_cuda_event_timer(&timer);
    /// timeline.write_chrome_trace(".").unwrap();
    /// # }
    /// ```
    #[cfg(feature = "cuda")]
    pub fn add_cuda_event_timer(&self, timer: &crate::executors::cuda::CudaEventTimer) {
        self.add_device_summary(CUDA_EVENTS_TRACK, &timer.stats());
    }

    /// Takes every scope recorded since the last drain (and the device tracks added) and returns
    /// them as a Chrome trace event object: `traceEvents` holds a `process_name` and a
    /// `thread_name` metadata event (`"ph":"M"`) per track, then one complete event
    /// (`"ph":"X"`) per scope, per thread in order of start (a parent before the scopes inside
    /// it), with `name` = label, `cat` = level (`trace`, `scope`, `region`, `op`, `subsymbol`), `pid`,
    /// `tid` (one per thread), `ts` and `dur` in microseconds since the timeline was made, and
    /// `args` = `executor` and `ops`. `otherData` holds `dropped_scopes` (so far, see
    /// [`dropped_scopes`](Self::dropped_scopes)), `capacity_per_thread` and `sites_past_bound`
    /// (see [`MAX_SITES`](Self::MAX_SITES)).
    ///
    /// Runs off the hot path: each thread's buffer is locked only while it is copied. The
    /// buffers of threads that have exited are freed once drained.
    pub fn to_chrome_trace(&self) -> Value {
        let inner = &self.inner;
        let mut threads = Vec::new();
        {
            // Taken only here and when a thread closes its first scope: never per scope.
            let mut registry = lock(&inner.threads);
            // A buffer only the registry holds belongs to a thread that has exited, and that
            // thread can record no more: decided before the copy, so that a thread that records
            // and exits while the others are copied keeps its buffer, and its scopes, until the
            // next drain.
            let exited: Vec<bool> = registry.iter().map(|buffer| Arc::strong_count(buffer) == 1).collect();
            for buffer in registry.iter() {
                let mut spans = {
                    let mut held = lock(&buffer.spans);
                    let copied = held.clone();
                    held.clear(); // keeps the reserved memory
                    copied
                };
                // By start, longer first: a parent comes before a child that starts with it.
                spans.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
                threads.push((buffer.thread_index, buffer.thread_name.clone(), spans));
            }
            #[cfg(test)]
            tests::AFTER_COPY.with(|hook| {
                if let Some(hook) = hook.borrow_mut().as_mut() {
                    hook();
                }
            });
            let mut gone = exited.into_iter();
            registry.retain(|_| !gone.next().unwrap_or(false));
        }
        let device: Vec<DeviceTrack> = std::mem::take(&mut *lock(&inner.device));
        let dropped_now = inner.dropped.load(Ordering::Relaxed);

        let pid = std::process::id();
        let sites = lock(&inner.sites);
        let mut events = vec![json!({
            "name": "process_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
            "args": { "name": "boundscope" },
        })];
        for (thread_index, thread_name, spans) in &threads {
            if spans.is_empty() {
                continue;
            }
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": pid, "tid": thread_index, "ts": 0,
                "args": { "name": thread_name },
            }));
        }
        let mut first_start_ns = u64::MAX;
        for (thread_index, _, spans) in &threads {
            for span in spans {
                first_start_ns = first_start_ns.min(span.start_ns);
                let site = &sites.list[span.site];
                events.push(json!({
                    "name": site.label,
                    "cat": site.level.name(),
                    "ph": "X",
                    "pid": pid,
                    "tid": thread_index,
                    "ts": micros(span.start_ns),
                    "dur": micros(span.end_ns.saturating_sub(span.start_ns)),
                    "args": { "executor": site.executor, "ops": site.ops },
                }));
            }
        }
        // Device tracks take thread ids past every host thread's.
        let mut tid = threads.iter().map(|(thread_index, _, _)| *thread_index).max().unwrap_or(0);
        let first_start_ns = if first_start_ns == u64::MAX { 0 } else { first_start_ns };
        for track in &device {
            tid += 1;
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "ts": 0,
                "args": { "name": format!("{}: total per label, not aligned to host time", track.name) },
            }));
            let mut at_ns = first_start_ns;
            for s in &track.stats {
                let total_ns = u64::try_from(s.total.as_nanos()).unwrap_or(u64::MAX);
                events.push(json!({
                    "name": s.label,
                    "cat": "device_summary",
                    "ph": "X",
                    "pid": pid,
                    "tid": tid,
                    "ts": micros(at_ns),
                    "dur": micros(total_ns),
                    "args": {
                        "count": s.count,
                        "mean_us": s.mean().as_nanos() as f64 / 1e3,
                        "min_us": s.min.as_nanos() as f64 / 1e3,
                        "max_us": s.max.as_nanos() as f64 / 1e3,
                    },
                }));
                at_ns = at_ns.saturating_add(total_ns);
            }
        }
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "dropped_scopes": dropped_now,
                "capacity_per_thread": inner.capacity,
                "sites_past_bound": sites.past_bound,
            },
        })
    }

    /// Drains the timeline ([`to_chrome_trace`](Self::to_chrome_trace)) into a new file
    /// `boundscope-timeline-<process id>-<n>.json` in `dir` (made if missing, with its parents)
    /// and returns its path. Open it in chrome://tracing or ui.perfetto.dev.
    ///
    /// # Errors
    /// [`Error::UnwritableDirectory`] if `dir` cannot be made or the file cannot be created or
    /// written (the directory is checked before the timeline is drained, so nothing recorded is
    /// lost then; a write that fails half way, a full disk say, loses this drain's scopes).
    ///
    /// ```
    /// use boundscope::guards::Timeline;
    /// use boundscope::Error;
    /// let file = std::env::temp_dir().join(format!("boundscope-doc-{}", std::process::id()));
    /// std::fs::write(&file, b"a file, not a directory").unwrap();
    /// let err = Timeline::new().write_chrome_trace(file.join("traces")).unwrap_err();
    /// assert!(matches!(err, Error::UnwritableDirectory { .. }));
    /// # std::fs::remove_file(file).ok();
    /// ```
    pub fn write_chrome_trace(&self, dir: impl AsRef<Path>) -> Result<PathBuf> {
        static NEXT_FILE: AtomicU64 = AtomicU64::new(0);
        let dir = dir.as_ref();
        let unwritable = |e: std::io::Error| Error::UnwritableDirectory {
            directory: dir.display().to_string(),
            detail: e.to_string(),
        };
        std::fs::create_dir_all(dir).map_err(unwritable)?;
        let name =
            format!("boundscope-timeline-{}-{}.json", std::process::id(), NEXT_FILE.fetch_add(1, Ordering::Relaxed));
        let path = dir.join(name);
        let file = std::fs::File::create(&path).map_err(unwritable)?;
        let mut writer = std::io::BufWriter::new(file);
        serde_json::to_writer(&mut writer, &self.to_chrome_trace()).map_err(|e| unwritable(e.into()))?;
        writer.flush().map_err(unwritable)?;
        Ok(path)
    }

    /// Appends a closed scope to this thread's buffer (made, and reserved, the first time);
    /// counts it as dropped if the buffer is full or the thread-local storage is already gone
    /// (a scope closing while its thread exits).
    fn record(&self, span: Span) {
        let inner = &self.inner;
        let recorded = BUFFERS.try_with(|buffers| {
            let Ok(mut buffers) = buffers.try_borrow_mut() else { return false };
            let buffer = match buffers.iter().find(|(id, _)| *id == inner.id) {
                Some((_, buffer)) => buffer.clone(),
                None => {
                    // Forget the buffers of timelines that are gone (only this thread holds them).
                    buffers.retain(|(_, b)| Arc::strong_count(b) > 1);
                    let mut spans = Vec::new();
                    // A capacity that cannot be reserved leaves the buffer empty: it drops all.
                    let _ = spans.try_reserve_exact(inner.capacity);
                    let current = std::thread::current();
                    let buffer = Arc::new(ThreadBuffer {
                        thread_index: super::recorder::thread_index(),
                        thread_name: current.name().map_or_else(|| format!("{:?}", current.id()), str::to_string),
                        spans: Mutex::new(spans),
                    });
                    lock(&inner.threads).push(buffer.clone());
                    buffers.push((inner.id, buffer.clone()));
                    buffer
                }
            };
            let mut spans = lock(&buffer.spans);
            // `capacity()`, not the requested one: never grow, so never allocate here.
            if spans.len() < spans.capacity() {
                spans.push(span);
                true
            } else {
                false
            }
        });
        if recorded != Ok(true) {
            inner.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Folds a Chrome trace's complete events into folded stacks, the text flame graph tools read
/// (inferno's `flamegraph`, Brendan Gregg's `flamegraph.pl`, speedscope): one line per stack,
/// its frames joined by `;`, then a space and its weight, here its *self* time in whole
/// microseconds, so that a frame's width in the graph is the time spent in it.
///
/// `chrome_trace` is what [`Timeline::to_chrome_trace`] returns (or such a file read back, or a
/// bare array of events). Per track (`pid`, `tid`), the complete events (`"ph":"X"`) are nested
/// by their times: an event lies inside every event still open when it starts. A stack is the
/// track's name (from its `thread_name` metadata event; `thread <tid>` without one), then the
/// names of the events open, outermost first (of two with the same start, the longer; of two
/// with the same start and end, the one listed first); its weight is, summed over every event that ends
/// it, the event's duration less the time its children cover (taken to the nanosecond, as the
/// file keeps it, then rounded to the nearest microsecond per stack). Stacks that round to zero
/// are left out; other phases, and events without a name, `ts` or `dur`, are ignored; `;` in
/// a name becomes `:` and line breaks become spaces, so that every line parses. Lines come in
/// order of their frames, so that stacks sharing a prefix are next to each other (inferno's
/// `Options::no_sort` can keep that order). Every run of a plan adds to the same stacks: the
/// graph shows where the time of all the runs drained went, not when.
///
/// ```
/// use boundscope::guards::folded_stacks;
/// use serde_json::json;
/// let x = |name: &str, ts: f64, dur: f64| json!({"name": name, "ph": "X", "pid": 1, "tid": 1, "ts": ts, "dur": dur});
/// let chrome = json!({ "traceEvents": [
///     {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "ts": 0, "args": {"name": "main"}},
///     x("trace", 0.0, 100.0), x("matmul", 10.0, 60.0), x("CpuFusion0", 70.0, 20.0), // a run
///     x("trace", 200.0, 50.0), x("matmul", 205.0, 40.0),                            // another
/// ]});
/// assert_eq!(
///     folded_stacks(&chrome),
///     "main;trace 30\nmain;trace;CpuFusion0 20\nmain;trace;matmul 100\n",
/// );
/// ```
///
/// With a timeline, `folded_stacks(&timeline.to_chrome_trace())` drains it;
/// `examples/timeline_flamegraph.rs` renders the lines as an SVG with the `inferno` crate.
pub fn folded_stacks(chrome_trace: &Value) -> String {
    struct Complete<'a> {
        name: &'a str,
        start_ns: i64,
        end_ns: i64,
    }
    /// An event whose end has not been reached yet, and its duration less its children's.
    struct Open {
        end_ns: i64,
        self_ns: i64,
    }
    let events = match chrome_trace {
        Value::Array(events) => events.as_slice(),
        other => other.get("traceEvents").and_then(Value::as_array).map_or(&[][..], Vec::as_slice),
    };
    let mut track_names: HashMap<(u64, u64), &str> = HashMap::new();
    let mut tracks: BTreeMap<(u64, u64), Vec<Complete<'_>>> = BTreeMap::new();
    for event in events {
        let (Some(pid), Some(tid)) = (event["pid"].as_u64(), event["tid"].as_u64()) else { continue };
        match event["ph"].as_str() {
            Some("M") if event["name"] == "thread_name" => {
                if let Some(name) = event["args"]["name"].as_str() {
                    track_names.insert((pid, tid), name);
                }
            }
            Some("X") => {
                let (Some(name), Some(ts), Some(dur)) =
                    (event["name"].as_str(), event["ts"].as_f64(), event["dur"].as_f64())
                else {
                    continue;
                };
                if !(ts.is_finite() && dur.is_finite() && dur >= 0.0) {
                    continue;
                }
                // Whole nanoseconds (what the file was written from): nesting is then exact.
                let start_ns = (ts * 1e3).round() as i64;
                let end_ns = start_ns.saturating_add((dur * 1e3).round() as i64);
                tracks.entry((pid, tid)).or_default().push(Complete { name, start_ns, end_ns });
            }
            _ => {}
        }
    }

    // Self time per stack, in nanoseconds; ordered by frames, so shared prefixes stay together.
    let mut self_ns: BTreeMap<Vec<String>, i64> = BTreeMap::new();
    for ((pid, tid), mut scopes) in tracks {
        // By start, longer first: a parent comes before a child that starts with it.
        scopes.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
        let root = track_names.get(&(pid, tid)).map_or_else(|| format!("thread {tid}"), |name| frame_name(name));
        let mut frames = vec![root];
        let mut open: Vec<Open> = Vec::new();
        let mut close = |frames: &mut Vec<String>, closed: Open| {
            let total = self_ns.entry(frames.clone()).or_default();
            *total = total.saturating_add(closed.self_ns.max(0));
            frames.pop();
        };
        for scope in scopes {
            while let Some(closed) = open.pop_if(|o| o.end_ns <= scope.start_ns) {
                close(&mut frames, closed);
            }
            if let Some(parent) = open.last_mut() {
                // Only the part inside the parent (all of it, when events nest as scopes do).
                parent.self_ns = parent.self_ns.saturating_sub(scope.end_ns.min(parent.end_ns) - scope.start_ns);
            }
            frames.push(frame_name(scope.name));
            open.push(Open { end_ns: scope.end_ns, self_ns: scope.end_ns - scope.start_ns });
        }
        while let Some(closed) = open.pop() {
            close(&mut frames, closed);
        }
    }

    let mut folded = String::new();
    for (frames, ns) in self_ns {
        let micros = ns.saturating_add(500) / 1000;
        if micros > 0 {
            let _ = writeln!(folded, "{} {micros}", frames.join(";"));
        }
    }
    folded
}

/// A name as one frame of a folded stack: `;` separates frames and a line ends a stack.
fn frame_name(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

fn micros(ns: u64) -> f64 {
    ns as f64 / 1e3
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

struct PreparedTimeline {
    timeline: Timeline,
    site: usize,
}

impl ScopedGuard for PreparedTimeline {
    fn on_enter(&self) -> u64 {
        self.timeline.inner.epoch.elapsed().as_nanos() as u64
    }

    fn on_exit(&self, entered: u64) {
        let end_ns = self.timeline.inner.epoch.elapsed().as_nanos() as u64;
        self.timeline.record(Span { site: self.site, start_ns: entered, end_ns });
    }
}

impl Guard for Timeline {
    /// The backward of what it surrounds is recorded too, labelled `<label> (backward)`.
    fn on_backward(&self, forward_label: &str, _forward_position: Option<usize>) -> super::OnBackward {
        super::OnBackward::Relabeled(super::backward_label(forward_label))
    }

    fn kind(&self) -> GuardKind {
        GuardKind::Timeline
    }

    /// A fused op's scope moves to (and merges into) its region's, like NVTX ranges.
    fn policy(&self) -> GuardPolicy {
        GuardPolicy::MoveToEnclosing
    }

    fn merge_key(&self) -> Option<String> {
        Some(format!("timeline:{}", self.inner.id))
    }

    fn prepare(&self, site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>> {
        let described = Site {
            label: site.label.to_string(),
            level: site.level,
            executor: site.executor.to_string(),
            ops: site.ops,
        };
        // A plan compiled again reuses its sites' entries.
        let index = lock(&self.inner.sites).intern(described);
        Ok(Box::new(PreparedTimeline { timeline: self.clone(), site: index }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Run by `to_chrome_trace` on this thread between copying the buffers and freeing
        /// those of exited threads.
        pub(super) static AFTER_COPY: std::cell::RefCell<Option<Box<dyn FnMut()>>> = const { std::cell::RefCell::new(None) };
    }

    fn threads(timeline: &Timeline) -> usize {
        lock(&timeline.inner.threads).len()
    }

    #[test]
    fn a_drain_frees_the_buffers_of_threads_that_exited_and_keeps_the_others() {
        let timeline = Timeline::with_capacity(8);
        let site = GuardSite::new("op", Level::Op, "me", 1);
        let prepared = timeline.prepare(&site).unwrap();
        prepared.in_scope(|| ());
        // A thread joined (not scoped: a scope may return before the thread's thread-locals
        // are destroyed), so that its buffer is released when the check below runs.
        let shared: std::sync::Arc<dyn ScopedGuard> = std::sync::Arc::from(prepared);
        let other = shared.clone();
        std::thread::spawn(move || other.in_scope(|| ())).join().unwrap();
        let prepared = shared;
        assert_eq!(threads(&timeline), 2);
        let chrome = timeline.to_chrome_trace();
        let scopes = chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count();
        assert_eq!(scopes, 2, "the exited thread's scope is drained before its buffer goes");
        assert_eq!(threads(&timeline), 1, "this thread's buffer stays, reserved");
        prepared.in_scope(|| ());
        assert_eq!(threads(&timeline), 1);
    }

    /// A thread alive when a drain starts keeps its buffer through that drain even if it exits
    /// right after: what it records in between reaches the next drain, and only then is its
    /// buffer freed (a reviewer's probe lost such scopes when the buffers of exited threads were
    /// chosen after the copy).
    #[test]
    fn scopes_of_a_thread_that_exits_during_a_drain_reach_the_next_drain() {
        let timeline = Timeline::with_capacity(8);
        let site = GuardSite::new("op", Level::Op, "me", 1);
        let shared: std::sync::Arc<dyn ScopedGuard> = std::sync::Arc::from(timeline.prepare(&site).unwrap());
        let (drained_tx, drained_rx) = std::sync::mpsc::channel::<()>();
        let (recorded_tx, recorded_rx) = std::sync::mpsc::channel::<()>();
        let other = shared.clone();
        let worker = std::thread::spawn(move || {
            other.in_scope(|| ());
            recorded_tx.send(()).unwrap();
            drained_rx.recv().unwrap();
            other.in_scope(|| ());
        });
        recorded_rx.recv().unwrap();
        // Between the copy and the freeing of exited threads' buffers, the worker records a
        // second scope and exits.
        let mut worker = Some(worker);
        AFTER_COPY.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move || {
                if let Some(worker) = worker.take() {
                    drained_tx.send(()).unwrap();
                    worker.join().unwrap();
                }
            }))
        });
        let first = timeline.to_chrome_trace();
        AFTER_COPY.with(|hook| *hook.borrow_mut() = None);
        let count =
            |chrome: &Value| chrome["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count();
        assert_eq!(count(&first), 1);
        assert_eq!(threads(&timeline), 1, "the worker's buffer, kept: it was alive when the drain began");
        let second = timeline.to_chrome_trace();
        assert_eq!(count(&second), 1, "the scope recorded after the first drain");
        assert_eq!(threads(&timeline), 0, "freed once drained after the thread exited");
        assert_eq!(timeline.dropped_scopes(), 0);
    }

    /// Two named threads and one without a name, events out of order and nested three deep:
    /// each stack weighs its self time (duration less its children's), summed over its
    /// events and rounded to whole microseconds; stacks of zero are left out.
    #[test]
    fn folded_stacks_nest_events_per_thread_and_weigh_self_time() {
        let x = |tid: u64, name: &str, ts: f64, dur: f64| json!({"name": name, "cat": "op", "ph": "X", "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": {}});
        let thread = |tid: u64, name: &str| json!({"name": "thread_name", "ph": "M", "pid": 7, "tid": tid, "ts": 0, "args": {"name": name}});
        let chrome = json!({ "traceEvents": [
            {"name": "process_name", "ph": "M", "pid": 7, "tid": 0, "ts": 0, "args": {"name": "boundscope"}},
            thread(1, "main"),
            thread(2, "worker;1"),
            // Thread 1, a first run: trace [0, 1000] > region [100, 600] > a, b; then c.
            x(1, "trace", 0.0, 1000.0),
            x(1, "a", 150.0, 100.0),          // before its parents: sorted by start
            x(1, "region", 100.0, 500.0),
            x(1, "b", 300.0, 50.4),
            x(1, "c", 700.0, 200.0),
            // Thread 2, on its own track although its times overlap thread 1's: an op that
            // starts with its run (listed first, but shorter: the inner one) and leaves the run
            // 0.3 µs of self time.
            x(2, "a", 0.0, 299.7),
            x(2, "trace", 0.0, 300.0),
            // Thread 1, a second run: trace [2000, 2100] > region [2010, 2090].
            x(1, "trace", 2000.0, 100.0),
            x(1, "region", 2010.0, 80.0),
            // A thread without a name, an instant event (ignored), one with no `dur` (ignored).
            x(3, "x", 5.0, 2.25),
            {"name": "mark", "ph": "i", "pid": 7, "tid": 3, "ts": 6.0},
            {"name": "broken", "ph": "X", "pid": 7, "tid": 3, "ts": 6.0},
        ]});
        let expected = [
            "main;trace 320", // 1000 - 500 - 200, and 100 - 80
            "main;trace;c 200",
            "main;trace;region 430",   // 500 - 100 - 50.4 = 349.6, and 80
            "main;trace;region;a 100", // thread 2's `a` is a stack of its own
            "main;trace;region;b 50",  // 50.4
            "thread 3;x 2",            // 2.25
            "worker:1;trace;a 300",    // 299.7; `worker:1;trace`, 0.3, rounds to 0: left out
        ];
        assert_eq!(folded_stacks(&chrome), expected.map(|line| format!("{line}\n")).concat());
        // A bare array of events is a Chrome trace too.
        assert_eq!(folded_stacks(&chrome["traceEvents"]), folded_stacks(&chrome));
        assert_eq!(folded_stacks(&json!({})), "");
    }
}
