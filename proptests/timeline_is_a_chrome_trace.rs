//! A `Timeline`'s file is a Chrome trace event file: valid JSON with a `traceEvents` array,
//! every event with name, ph, pid, tid and ts (and dur when complete), timestamps in order and
//! scopes properly nested per thread, one complete event per scope the plan ran; its folded
//! stacks split the runs' time among the scopes; and a directory that cannot be written is a
//! typed error that loses nothing recorded.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::guards::{folded_stacks, Recorder, Selection, Timeline};
use boundscope::passes::{FuseRegions, FusionStrategy, Pass, Pipeline};
use boundscope::{Arena, Error, Executor, Plan, Registry, Tensor, Trace};
use common::program::programs;
use proptest::prelude::*;
use serde_json::Value;

/// A complete event, its times in whole nanoseconds.
#[derive(Debug)]
struct Scope {
    tid: u64,
    name: String,
    start_ns: i64,
    end_ns: i64,
}

/// Microseconds (as written) to whole nanoseconds: the file keeps nanosecond resolution, and
/// comparing integers makes the nesting check exact.
fn nanos(micros: f64) -> i64 {
    (micros * 1e3).round() as i64
}

/// Checks `chrome` against the Chrome trace event format and returns its complete events.
fn check_chrome_trace(chrome: &Value) -> Result<Vec<Scope>, String> {
    let events = chrome
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("no `traceEvents` array in {chrome}"))?;
    let mut last_ts: BTreeMap<(u64, u64), f64> = BTreeMap::new();
    let mut scopes = Vec::new();
    for event in events {
        let name = event["name"].as_str().ok_or_else(|| format!("no string `name`: {event}"))?;
        let ph = event["ph"].as_str().ok_or_else(|| format!("no string `ph`: {event}"))?;
        let pid = event["pid"].as_u64().ok_or_else(|| format!("no integer `pid`: {event}"))?;
        let tid = event["tid"].as_u64().ok_or_else(|| format!("no integer `tid`: {event}"))?;
        let ts = event["ts"].as_f64().ok_or_else(|| format!("no number `ts`: {event}"))?;
        if !ts.is_finite() || ts < 0.0 {
            return Err(format!("`ts` not a time: {event}"));
        }
        let last = last_ts.entry((pid, tid)).or_insert(0.0);
        if ts < *last {
            return Err(format!("`ts` goes back on thread {tid}: {ts} after {last}"));
        }
        *last = ts;
        match ph {
            "M" => {}
            "X" => {
                let dur = event["dur"].as_f64().ok_or_else(|| format!("no number `dur`: {event}"))?;
                if !dur.is_finite() || dur < 0.0 {
                    return Err(format!("`dur` not a duration: {event}"));
                }
                if event["cat"].as_str().is_none() || event["args"]["executor"].as_str().is_none() {
                    return Err(format!("no `cat` or `args.executor`: {event}"));
                }
                let start_ns = nanos(ts);
                scopes.push(Scope { tid, name: name.to_string(), start_ns, end_ns: start_ns + nanos(dur) });
            }
            other => return Err(format!("unexpected phase {other:?}: {event}")),
        }
    }
    // Per thread, each scope lies inside every scope still open when it starts.
    let mut open: BTreeMap<u64, Vec<(i64, &str)>> = BTreeMap::new();
    for scope in &scopes {
        let stack = open.entry(scope.tid).or_default();
        while stack.last().is_some_and(|&(end, _)| end <= scope.start_ns) {
            stack.pop();
        }
        if let Some(&(end, parent)) = stack.last() {
            if scope.end_ns > end {
                return Err(format!("{scope:?} starts inside `{parent}` (ends {end} ns) but ends after it"));
            }
        }
        stack.push((scope.end_ns, &scope.name));
    }
    Ok(scopes)
}

/// Reads a written file as JSON.
fn read_file(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))
}

/// Reads and checks a written file.
fn check_file(path: &Path) -> Result<Vec<Scope>, String> {
    check_chrome_trace(&read_file(path)?)
}

/// Checks the folded stacks of a checked file's `scopes`: every line is frames and a positive
/// count, its frames are the thread's name, a run (`trace`), then labels of scopes; and the
/// counts (self times, rounded to microseconds per stack) add up to the runs' total time, to
/// within half a microsecond per scope.
fn check_folded_stacks(folded: &str, scopes: &[Scope]) -> Result<(), String> {
    let labels: std::collections::BTreeSet<&str> = scopes.iter().map(|s| s.name.as_str()).collect();
    let mut total_us = 0u64;
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').ok_or_else(|| format!("no count: {line:?}"))?;
        let count: u64 = count.parse().map_err(|e| format!("count not a number ({e}): {line:?}"))?;
        if count == 0 {
            return Err(format!("a stack of zero: {line:?}"));
        }
        let frames: Vec<&str> = stack.split(';').collect();
        if frames.len() < 2 || frames[1] != "trace" || !frames[1..].iter().all(|f| labels.contains(f)) {
            return Err(format!("not thread;trace;labels...: {line:?}"));
        }
        total_us += count;
    }
    let runs_ns: i64 = scopes.iter().filter(|s| s.name == "trace").map(|s| s.end_ns - s.start_ns).sum();
    let error_ns = (total_us as i64 * 1000 - runs_ns).abs();
    if error_ns > 500 * scopes.len() as i64 {
        return Err(format!("the stacks add up to {total_us} µs, the runs to {runs_ns} ns"));
    }
    Ok(())
}

/// A directory of its own under the temporary directory.
fn scratch_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("boundscope-{name}-{}", std::process::id()))
}

/// Attaches `guard` around the run and to every bound symbol.
fn attach(trace: &mut Trace<'_>, guard: impl boundscope::guards::Guard + Clone) {
    trace.attach_trace_guard(guard.clone()).unwrap();
    trace.attach_guard(Selection::All, guard).unwrap();
}

fn strategies() -> impl Strategy<Value = FusionStrategy> {
    prop_oneof![Just(FusionStrategy::Consecutive), Just(FusionStrategy::Dataflow)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// For random programs, fused or not, run `runs` times: the written file passes the
    /// format check and holds one complete event per scope run (the run plus each top-level
    /// bound symbol, per run), with the labels a `Recorder` on the same scopes saw; its folded
    /// stacks pass theirs.
    #[test]
    fn a_written_timeline_is_a_chrome_trace_with_every_scope(
        program in programs(true),
        fuse in any::<bool>(),
        strategy in strategies(),
        runs in 1usize..5,
        seed in any::<u64>(),
    ) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let prims = Pipeline::standard().run(&program.build(&arena, &registry).unwrap(), &arena).unwrap();
        let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new());
        let mut trace = if fuse { FuseRegions::new(fusion.clone()).strategy(strategy).run(&prims, &arena).unwrap() } else { prims };
        let timeline = Timeline::new();
        let recorder = Recorder::new();
        attach(&mut trace, timeline.clone());
        attach(&mut trace, recorder.clone());
        let plan = Plan::compile(&trace, &[fusion, CpuReference::shared()]).unwrap();
        let inputs = program.input_data(seed);
        let refs: Vec<&Tensor> = inputs.iter().collect();
        for _ in 0..runs {
            plan.run(&refs).unwrap();
        }
        let dir = scratch_dir("timeline-proptest");
        let path = timeline.write_chrome_trace(&dir).unwrap();
        let chrome = read_file(&path);
        std::fs::remove_file(&path).ok();
        std::fs::remove_dir(&dir).ok();
        let chrome = chrome.map_err(TestCaseError::fail)?;
        let scopes = check_chrome_trace(&chrome).map_err(TestCaseError::fail)?;
        prop_assert_eq!(scopes.len(), runs * (1 + trace.len()), "{}", plan);
        let folded = folded_stacks(&chrome);
        check_folded_stacks(&folded, &scopes).map_err(|e| TestCaseError::fail(format!("{e}\n{folded}")))?;
        let mut labels: Vec<_> = scopes.iter().map(|s| s.name.clone()).collect();
        let mut recorded: Vec<_> = recorder.ranges().iter().map(|r| r.label.to_string()).collect();
        labels.sort();
        recorded.sort();
        prop_assert_eq!(labels, recorded);
        // Drained: the next file holds nothing recorded before it.
        prop_assert_eq!(check_chrome_trace(&timeline.to_chrome_trace()).map_err(TestCaseError::fail)?.len(), 0);
    }
}

/// Three threads running one plan at once: each gets its own `tid`, and the scopes of each
/// thread nest and are in order.
#[test]
fn threads_get_tracks_of_their_own() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[32, 32]).unwrap();
    let h = b.matmul(x, x).unwrap();
    let s = b.sigmoid(h).unwrap();
    let y = b.mul(h, s).unwrap();
    b.output(y).unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new());
    let mut fused = FuseRegions::new(fusion.clone()).run(&b.finish().unwrap(), &arena).unwrap();
    let timeline = Timeline::new();
    attach(&mut fused, timeline.clone());
    let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
    let input = Tensor::from_fn(&[32, 32], |i| i as f32 / 1024.0);
    let (threads, runs) = (3, 4);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..runs {
                    plan.run(&[&input]).unwrap();
                }
            });
        }
    });
    let scopes = check_chrome_trace(&timeline.to_chrome_trace()).unwrap();
    let mut per_thread: BTreeMap<u64, usize> = BTreeMap::new();
    for scope in &scopes {
        *per_thread.entry(scope.tid).or_default() += 1;
    }
    // matmul, then one fused region: two bound symbols, and the run.
    assert_eq!(fused.len(), 2, "{fused}");
    assert_eq!(per_thread.len(), threads, "{per_thread:?}");
    assert!(per_thread.values().all(|&n| n == runs * 3), "{per_thread:?}");
}

/// The checkers themselves reject what they must: events out of order, scopes that overlap
/// without nesting, events without a required field; stacks that do not add up, name unknown
/// scopes, start outside a run or weigh nothing.
#[test]
fn the_checker_rejects_broken_files() {
    let event = |name: &str, ts: f64, dur: f64| serde_json::json!({"name": name, "cat": "op", "ph": "X", "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {"executor": "e"}});
    let file = |events: Vec<Value>| serde_json::json!({ "traceEvents": events });
    assert_eq!(check_chrome_trace(&file(vec![event("a", 0.0, 10.0), event("b", 2.0, 3.0)])).unwrap().len(), 2);
    assert!(check_chrome_trace(&file(vec![event("a", 0.0, 10.0), event("b", 5.0, 10.0)])).is_err());
    assert!(check_chrome_trace(&file(vec![event("a", 5.0, 1.0), event("b", 2.0, 1.0)])).is_err());
    let mut no_tid = event("a", 0.0, 1.0);
    no_tid.as_object_mut().unwrap().remove("tid");
    assert!(check_chrome_trace(&file(vec![no_tid])).is_err());
    let mut no_dur = event("a", 0.0, 1.0);
    no_dur.as_object_mut().unwrap().remove("dur");
    assert!(check_chrome_trace(&file(vec![no_dur])).is_err());
    assert!(check_chrome_trace(&serde_json::json!({ "events": [] })).is_err());
    // And the folded stacks' checker: a run of 10 µs with `b` (3 µs) inside it.
    let scopes = check_chrome_trace(&file(vec![event("trace", 0.0, 10.0), event("b", 2.0, 3.0)])).unwrap();
    assert_eq!(check_folded_stacks("t;trace 7\nt;trace;b 3\n", &scopes), Ok(()));
    assert!(check_folded_stacks("t;trace 10\nt;trace;b 3\n", &scopes).is_err(), "13 µs in 10");
    assert!(check_folded_stacks("t;trace 7\nt;trace;c 3\n", &scopes).is_err(), "no scope `c`");
    assert!(check_folded_stacks("t;b 7\nt;trace;b 3\n", &scopes).is_err(), "not in a run");
    assert!(check_folded_stacks("t;trace 10\nt;trace;b 0\n", &scopes).is_err(), "a stack of zero");
}

/// A directory under a regular file cannot be made: the typed error names it, and the scopes
/// recorded are still there for the next drain.
#[test]
fn an_unwritable_directory_is_a_typed_error_and_loses_nothing() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[8]).unwrap();
    let y = b.exp(x).unwrap();
    b.output(y).unwrap();
    let mut trace = b.finish().unwrap();
    let timeline = Timeline::new();
    attach(&mut trace, timeline.clone());
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    plan.run(&[&Tensor::zeros(&[8])]).unwrap();

    let dir = scratch_dir("timeline-unwritable");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-regular-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let under_file = file.join("traces");
    let err = timeline.write_chrome_trace(&under_file).unwrap_err();
    assert!(
        matches!(&err, Error::UnwritableDirectory { directory, .. } if directory == &under_file.display().to_string()),
        "{err:?}"
    );
    assert!(err.to_string().contains("cannot write a file into the directory"), "{err}");

    let path = timeline.write_chrome_trace(&dir).unwrap();
    assert_eq!(check_file(&path).unwrap().len(), 2, "the run and exp, kept through the failed write");
    std::fs::remove_dir_all(&dir).ok();
}
