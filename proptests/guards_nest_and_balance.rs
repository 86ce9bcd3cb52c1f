//! Invariants 1, 2, 4 and 5 (listed in the crate documentation, `src/lib.rs`) on random traces with random guard attachments:
//! attaching changes nothing but annotations; guards are balanced, last-in first-out, properly
//! nested and on the entering thread, after success, errors and panics, from four threads at
//! once; exactly one range per guarded bound symbol that ran; passes lose no guard silently.

mod common;

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boundscope::executors::CpuReference;
use boundscope::guards::{ClosureGuard, GuardPolicy, RecordedRange, Recorder, Selection};
use boundscope::passes::Pipeline;
use boundscope::{
    kernel_fn, Arena, BoundSymbol, BoundSymbolId, Error, Executor, Kernel, ListingOptions, OpView, Plan, Registry,
    Trace,
};
use common::program::{programs, Program};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Target {
    Trace,
    Op(usize),
    Named(usize),
    Positions(usize, usize),
    Subsymbols(usize, usize),
    All,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Recorder,
    Closure(GuardPolicy),
}

fn targets() -> impl Strategy<Value = Target> {
    prop_oneof![
        Just(Target::Trace),
        any::<usize>().prop_map(Target::Op),
        any::<usize>().prop_map(Target::Named),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Target::Positions(a, b)),
        (any::<usize>(), 1usize..3).prop_map(|(a, d)| Target::Subsymbols(a, d)),
        Just(Target::All),
    ]
}

fn kinds() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Recorder),
        Just(Kind::Closure(GuardPolicy::Keep)),
        Just(Kind::Closure(GuardPolicy::MoveToEnclosing)),
        Just(Kind::Closure(GuardPolicy::DropWithReason("test guard only makes sense on the original op"))),
    ]
}

fn attachments() -> impl Strategy<Value = Vec<(Target, Kind)>> {
    prop::collection::vec((targets(), kinds()), 0..6)
}

thread_local! {
    /// Closure-guard events on this thread: (guard tag, entering?).
    static LOG: RefCell<Vec<(usize, bool)>> = const { RefCell::new(Vec::new()) };
}

fn take_log() -> Vec<(usize, bool)> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

fn closure_guard(tag: usize, policy: GuardPolicy) -> ClosureGuard {
    ClosureGuard::new(
        move || LOG.with(|l| l.borrow_mut().push((tag, true))),
        move || LOG.with(|l| l.borrow_mut().push((tag, false))),
    )
    .with_policy(policy)
}

fn subsymbol_count(bsym: &BoundSymbol<'_>, depth: usize) -> usize {
    if depth == 0 {
        return 0;
    }
    bsym.subsymbols().iter().map(|s| 1 + subsymbol_count(s, depth - 1)).sum()
}

fn max_depth(bsym: &BoundSymbol<'_>) -> usize {
    bsym.subsymbols().iter().map(|s| 1 + max_depth(s)).max().unwrap_or(0)
}

/// Attaches everything it can; returns the number of ranges one successful run must produce
/// (recorder) and the number of closure entries.
/// Where a recorder attachment lands: the run, an op, or a subsymbol (by its path).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Scope {
    Trace,
    Op(usize),
    Subsymbol(usize, Vec<usize>),
}

/// The subsymbols of `bsym` down to `depth`, as paths of subsymbol indices.
fn subsymbol_paths(bsym: &BoundSymbol<'_>, depth: usize, prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    if depth == 0 {
        return;
    }
    for (i, sub) in bsym.subsymbols().iter().enumerate() {
        prefix.push(i);
        out.push(prefix.clone());
        subsymbol_paths(sub, depth - 1, prefix, out);
        prefix.pop();
    }
}

/// Attaches the guards `specs` describe. Returns how many ranges the recorder records per run
/// (one per scope it is attached to, however many times: clones of one recorder are one
/// guard), how many closure scopes there are (each closure guard is its own object), and how
/// many attachments the recorder got.
fn attach(trace: &mut Trace<'_>, specs: &[(Target, Kind)], recorder: &Recorder) -> (usize, usize, usize) {
    let mut recorded: std::collections::HashSet<Scope> = Default::default();
    let (mut closures, mut recorder_attachments) = (0, 0);
    let len = trace.len();
    for (tag, (target, kind)) in specs.iter().enumerate() {
        let mut scopes: Vec<Scope> = Vec::new();
        let count = match *target {
            Target::Trace => {
                scopes.push(Scope::Trace);
                match kind {
                    Kind::Recorder => trace.attach_trace_guard(recorder.clone()),
                    Kind::Closure(p) => trace.attach_trace_guard(closure_guard(tag, *p)),
                }
                .unwrap();
                1
            }
            Target::Subsymbols(i, depth) => {
                let op = BoundSymbolId::from_index(i % len);
                let bsym = trace.bound_symbols()[i % len];
                let result = match kind {
                    Kind::Recorder => trace.attach_subsymbol_guard(op, depth, recorder.clone()),
                    Kind::Closure(p) => trace.attach_subsymbol_guard(op, depth, closure_guard(tag, *p)),
                };
                if depth > max_depth(&bsym) {
                    assert!(matches!(result, Err(Error::DepthOutOfRange { .. })), "{result:?}");
                    0
                } else {
                    let n = result.unwrap();
                    assert_eq!(n, subsymbol_count(&bsym, depth));
                    let mut paths = Vec::new();
                    subsymbol_paths(&bsym, depth, &mut Vec::new(), &mut paths);
                    scopes.extend(paths.into_iter().map(|path| Scope::Subsymbol(i % len, path)));
                    n
                }
            }
            ref other => {
                let name;
                let selection = match *other {
                    Target::Op(i) => Selection::Op(BoundSymbolId::from_index(i % len)),
                    Target::Named(i) => {
                        name = trace.symbol_name(&trace.bound_symbols()[i % len]).to_string();
                        Selection::Named(&name)
                    }
                    Target::Positions(a, b) => {
                        let (a, b) = (a % (len + 1), b % (len + 1));
                        Selection::Positions(a.min(b)..a.max(b))
                    }
                    _ => Selection::All,
                };
                let expected = match *other {
                    Target::Named(i) => {
                        let id = trace.bound_symbols()[i % len].symbol();
                        trace.bound_symbols().iter().filter(|b| b.symbol() == id).count()
                    }
                    Target::Positions(a, b) => (a % (len + 1)).abs_diff(b % (len + 1)),
                    Target::All => len,
                    _ => 1,
                };
                let n = match kind {
                    Kind::Recorder => trace.attach_guard(selection, recorder.clone()),
                    Kind::Closure(p) => trace.attach_guard(selection, closure_guard(tag, *p)),
                }
                .unwrap();
                assert_eq!(n, expected);
                let positions: Vec<usize> = match *other {
                    Target::Op(i) => vec![i % len],
                    Target::Named(i) => {
                        let id = trace.bound_symbols()[i % len].symbol();
                        (0..len).filter(|&p| trace.bound_symbols()[p].symbol() == id).collect()
                    }
                    Target::Positions(a, b) => {
                        let (a, b) = (a % (len + 1), b % (len + 1));
                        (a.min(b)..a.max(b)).collect()
                    }
                    _ => (0..len).collect(),
                };
                scopes.extend(positions.into_iter().map(Scope::Op));
                n
            }
        };
        assert_eq!(count, scopes.len());
        match kind {
            Kind::Recorder => {
                recorded.extend(scopes);
                recorder_attachments += count;
            }
            Kind::Closure(_) => closures += count,
        }
    }
    (recorded.len(), closures, recorder_attachments)
}

/// Recorded ranges of one thread nest: each lies inside its parent, siblings do not overlap.
fn check_nesting(ranges: &[RecordedRange]) -> Result<(), TestCaseError> {
    for r in ranges {
        prop_assert!(r.start_ns <= r.end_ns);
        if let Some(p) = r.parent {
            let parent = ranges.iter().find(|x| x.id == p);
            prop_assert!(parent.is_some(), "parent {} of {} missing", p, r.id);
            let parent = parent.unwrap();
            prop_assert!(parent.start_ns <= r.start_ns && r.end_ns <= parent.end_ns);
            prop_assert!(parent.id < r.id, "a parent is entered first");
        }
    }
    for a in ranges {
        for b in ranges {
            let disjoint = a.end_ns <= b.start_ns || b.end_ns <= a.start_ns;
            let nested = (a.start_ns <= b.start_ns && b.end_ns <= a.end_ns)
                || (b.start_ns <= a.start_ns && a.end_ns <= b.end_ns);
            prop_assert!(disjoint || nested, "{:?} and {:?} overlap without nesting", a, b);
        }
    }
    Ok(())
}

/// The closure log is balanced and last-in first-out.
fn check_lifo(log: &[(usize, bool)]) -> Result<(), TestCaseError> {
    let mut stack = Vec::new();
    for &(tag, entering) in log {
        if entering {
            stack.push(tag);
        } else {
            prop_assert_eq!(stack.pop(), Some(tag), "exit out of order in {:?}", log);
        }
    }
    prop_assert!(stack.is_empty(), "unbalanced: {:?}", log);
    Ok(())
}

/// Fails (error or panic) at the `n`-th kernel run it counts, then runs normally.
struct FailAt {
    countdown: Arc<AtomicUsize>,
    panic: bool,
}

impl Executor for FailAt {
    fn name(&self) -> &str {
        "fail_at"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        CpuReference::new().claims(op)
    }
    fn compile(&self, op: &OpView<'_>) -> boundscope::Result<Box<dyn Kernel>> {
        let inner = CpuReference::new().compile(op)?;
        let (countdown, panic) = (self.countdown.clone(), self.panic);
        Ok(kernel_fn(move |inputs, outputs| {
            if countdown.fetch_sub(1, Ordering::Relaxed) == 1 {
                if panic {
                    panic!("test executor panics on purpose");
                }
                return Err(Error::Execution {
                    executor: "fail_at".into(),
                    symbol: "?".into(),
                    message: "on purpose".into(),
                });
            }
            inner.run(inputs, outputs)
        }))
    }
}

fn strip_annotations(listing: &str) -> String {
    listing
        .lines()
        .filter(|l| !l.starts_with("# guards"))
        .map(|l| l.split("  # @").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

fn build<'a>(program: &Program, arena: &'a Arena, registry: &'a Registry) -> Trace<'a> {
    program.build(arena, registry).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Attaching guards changes neither the bound symbols nor the listing, apart from
    /// annotations; with guards hidden, the listing is exactly the unguarded one.
    #[test]
    fn attaching_changes_nothing_but_annotations(program in programs(true), specs in attachments()) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let plain = build(&program, &arena, &registry);
        let mut guarded = plain.clone();
        attach(&mut guarded, &specs, &Recorder::new());
        prop_assert_eq!(plain.len(), guarded.len());
        for (a, b) in plain.bound_symbols().iter().zip(guarded.bound_symbols()) {
            prop_assert_eq!(a.symbol(), b.symbol());
            prop_assert_eq!(a.outputs(), b.outputs());
            prop_assert_eq!(a.args(), b.args());
        }
        let hidden = ListingOptions { guards: false, ..Default::default() };
        prop_assert_eq!(plain.listing(hidden).to_string(), guarded.listing(hidden).to_string());
        prop_assert_eq!(strip_annotations(&guarded.to_string()), strip_annotations(&plain.to_string()));
        prop_assert_eq!(plain.to_string().lines().count() + usize::from(guarded.to_string().contains("# guards around")),
            guarded.to_string().lines().count());
    }

    /// One successful run gives exactly one recorded range per guarded bound symbol (and per
    /// subsymbol and trace attachment), properly nested, and a balanced LIFO closure log; the
    /// same after the standard passes, which carry or record every guard.
    #[test]
    fn one_balanced_range_per_guarded_op(program in programs(true), specs in attachments()) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let mut trace = build(&program, &arena, &registry);
        let recorder = Recorder::new();
        let (ranges, closures, attached) = attach(&mut trace, &specs, &recorder);
        let inputs = program.input_data(7);
        let refs: Vec<_> = inputs.iter().collect();
        take_log();
        let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        prop_assert!(plan.dropped_guards().is_empty());
        plan.run(&refs).unwrap();
        let recorded = recorder.ranges();
        prop_assert_eq!(recorded.len(), ranges);
        check_nesting(&recorded)?;
        let log = take_log();
        prop_assert_eq!(log.len(), 2 * closures);
        check_lifo(&log)?;
        // Labels: op ranges carry their symbol's name.
        for r in &recorded {
            prop_assert!(r.label.as_ref() == "trace" || registry.lookup(&r.label).is_ok(), "{}", r.label);
        }

        // Invariant 5: the standard passes keep each guard, or drop it with a reason.
        let before = trace.guard_attachment_count();
        let passed = Pipeline::standard().run(&trace, &arena).unwrap();
        let after = passed.guard_attachment_count();
        let dropped = passed.dropped_guards();
        for d in dropped {
            prop_assert!(!d.reason.is_empty() && !d.pass.is_empty());
        }
        // Subsymbol attachments expand into one per subsymbol; every other attachment is
        // carried one-to-one or dropped with a reason: nothing disappears.
        prop_assert!(before <= attached + closures);
        prop_assert_eq!(after + dropped.len(), attached + closures, "lost guards ({} before)", before);
        recorder.clear();
        take_log();
        let plan = Plan::compile(&passed, &[CpuReference::shared()]).unwrap();
        plan.run(&refs).unwrap();
        check_nesting(&recorder.ranges())?;
        check_lifo(&take_log())?;
    }

    /// After an executor error or a panic at a random step, every entered guard has been
    /// exited, in reverse order, and the plan runs correctly again.
    #[test]
    fn guards_exit_after_errors_and_panics(
        program in programs(true),
        specs in attachments(),
        fail_at in 1usize..40,
        panic in any::<bool>(),
    ) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let mut trace = build(&program, &arena, &registry);
        let recorder = Recorder::new();
        let (ranges, closures, _) = attach(&mut trace, &specs, &recorder);
        let countdown = Arc::new(AtomicUsize::new(0));
        let failing: Arc<dyn Executor> = Arc::new(FailAt { countdown: countdown.clone(), panic });
        let plan = Plan::compile(&trace, &[failing]).unwrap();
        let inputs = program.input_data(3);
        let refs: Vec<_> = inputs.iter().collect();
        take_log();
        countdown.store(fail_at, Ordering::Relaxed);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| plan.run(&refs)));
        let failed = fail_at <= plan.len();
        match (&outcome, failed, panic) {
            (Err(_), true, true) | (Ok(Err(Error::Execution { .. })), true, false) | (Ok(Ok(_)), false, _) => {}
            _ => prop_assert!(false, "unexpected outcome {:?} (failed {}, panic {})", outcome.as_ref().map(|r| r.as_ref().map(|_| ())), failed, panic),
        }
        check_nesting(&recorder.ranges())?;
        let log = take_log();
        check_lifo(&log)?;
        prop_assert!(recorder.len() <= ranges && log.len() <= 2 * closures);
        // And the plan is whole again.
        recorder.clear();
        countdown.store(0, Ordering::Relaxed);
        prop_assert!(plan.run(&refs).is_ok());
        prop_assert_eq!(recorder.len(), ranges);
        prop_assert_eq!(take_log().len(), 2 * closures);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// One plan run from four threads at once: each thread's ranges are complete and properly
    /// nested on their own, and each thread's closure log is balanced.
    #[test]
    fn four_threads_each_get_their_own_nesting(program in programs(true), specs in attachments()) {
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let mut trace = build(&program, &arena, &registry);
        let recorder = Recorder::new();
        let (ranges, closures, _) = attach(&mut trace, &specs, &recorder);
        let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
        let inputs = program.input_data(11);
        let runs = 5;
        let logs: Vec<Vec<(usize, bool)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let refs: Vec<_> = inputs.iter().collect();
                        for _ in 0..runs {
                            plan.run(&refs).unwrap();
                        }
                        take_log()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for log in &logs {
            prop_assert_eq!(log.len(), 2 * closures * runs);
            check_lifo(log)?;
        }
        let all = recorder.ranges();
        prop_assert_eq!(all.len(), 4 * runs * ranges);
        let mut threads: Vec<_> = all.iter().map(|r| r.thread).collect();
        threads.sort_by_key(|t| format!("{t:?}"));
        threads.dedup();
        prop_assert!(threads.len() == 4 || ranges == 0);
        for t in threads {
            let mine: Vec<_> = all.iter().filter(|r| r.thread == t).cloned().collect();
            prop_assert_eq!(mine.len(), runs * ranges);
            check_nesting(&mine)?;
        }
    }
}
