//! Large ops and fused regions split over the machine's cores compute exactly what they compute
//! on one thread, keep their guards and NVTX ranges on the calling thread, and run on worker
//! threads named for NVTX.

mod common;

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use boundscope::executors::{CpuFusion, CpuReference};
use boundscope::guards::{ClosureGuard, NvtxRange, Selection};
use boundscope::passes::{FuseRegions, Pass, ProfileOps};
use boundscope::{Arena, Executor, Plan, Registry, Tensor, Trace, TraceBuilder};
use common::nvtx_capture;
use common::program::programs_of;
use proptest::prelude::*;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The unfused and fused plans of `trace` for CPU executors limited to `threads` threads.
fn plans(trace: &Trace<'_>, arena: &Arena, threads: usize) -> [Plan; 2] {
    let reference: Arc<dyn Executor> = Arc::new(CpuReference::new().threads(threads));
    let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new().threads(threads));
    let fused = FuseRegions::new(fusion.clone()).run(trace, arena).unwrap();
    [
        Plan::compile(trace, std::slice::from_ref(&reference)).unwrap(),
        Plan::compile(&fused, &[fusion, reference]).unwrap(),
    ]
}

/// Each value's bits, every NaN as one: which NaN an operation returns when several of its
/// operands are NaN (the sign of `log(-1)` against `-log(-1)`) depends on the instruction's
/// operand order, which IEEE 754 leaves open and which a product's register block and its edges
/// order differently; that a value is NaN does not depend on the split.
fn bits(tensors: &[Tensor]) -> Vec<Vec<u32>> {
    let canonical = |x: f32| if x.is_nan() { f32::NAN.to_bits() } else { x.to_bits() };
    tensors.iter().map(|t| t.to_f32_vec().iter().map(|&x| canonical(x)).collect()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A plan's results are bit for bit the same on one thread and on every core, fused or not:
    /// ops are split only between elements and between whole rows, never inside a row's sum.
    #[test]
    fn results_do_not_depend_on_the_thread_count(
        program in programs_of((200usize..600, 300usize..900, 1usize..4), true),
        seed in any::<u64>(),
    ) {
        if cores() < 2 {
            eprintln!("SKIPPED: one core here, so nothing is split over threads");
            return Ok(());
        }
        // Products of the large dimensions, broadcast, can reach billions of values (one case
        // in about a thousand asked for 2.5 GB at once, and four plans hold several): splits
        // show at millions.
        prop_assume!(program.largest_value() <= 1 << 24);
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let trace = boundscope::passes::Pipeline::standard()
            .run(&program.build(&arena, &registry).unwrap(), &arena)
            .unwrap();
        let inputs = program.input_data(seed);
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let [unfused_1, fused_1] = plans(&trace, &arena, 1);
        let [unfused, fused] = plans(&trace, &arena, 0);
        let one = bits(&unfused_1.run(&refs).unwrap());
        prop_assert_eq!(&one, &bits(&unfused.run(&refs).unwrap()), "unfused\n{}", unfused);
        let fused_one = bits(&fused_1.run(&refs).unwrap());
        prop_assert_eq!(&fused_one, &bits(&fused.run(&refs).unwrap()), "fused\n{}", fused);
    }
}

/// A fused region of 2^20 elements and a large unfused op, both split over the cores: the
/// capture holds every NVTX event on the calling thread only, balanced; a closure guard on each
/// enters and exits on the calling thread; and the workers are named `boundscope-cpu-<k>`.
#[test]
fn guards_and_ranges_stay_on_the_calling_thread_and_workers_are_named() {
    if !nvtx_capture::is_installed() {
        eprintln!("SKIPPED: an NVTX tool is attached (NVTX_INJECTION64_PATH), so the in-process capture is off");
        return;
    }
    if cores() < 2 {
        eprintln!("SKIPPED: one core here, so nothing is split over threads");
        return;
    }
    let (registry, arena) = (Registry::with_builtins(), Arena::new());
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[1024, 1024]).unwrap();
    let w = b.input(&[1024]).unwrap();
    let y = b.mul(x, w).unwrap();
    let z = b.sigmoid(y).unwrap();
    let s = b.sum(z).unwrap();
    let t = b.exp(x).unwrap();
    let m = b.matmul(t, x).unwrap();
    b.output(s).unwrap();
    b.output(m).unwrap();
    let trace = ProfileOps::new().run(&b.finish().unwrap(), &arena).unwrap();
    let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new());
    let mut fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
    let threads: Arc<Mutex<Vec<ThreadId>>> = Arc::default();
    let (on_enter, on_exit) = (threads.clone(), threads.clone());
    fused
        .attach_guard(
            Selection::All,
            ClosureGuard::new(
                move || on_enter.lock().unwrap().push(std::thread::current().id()),
                move || on_exit.lock().unwrap().push(std::thread::current().id()),
            ),
        )
        .unwrap();
    fused.attach_guard(Selection::All, NvtxRange::new()).unwrap();
    let plan = Plan::compile(&fused, &[fusion, CpuReference::shared()]).unwrap();
    plan.set_profiling(true);
    let inputs = [Tensor::from_fn(&[1024, 1024], |i| (i % 17) as f32 / 17.0), Tensor::from_fn(&[1024], |i| i as f32)];
    let before = nvtx_capture::take_events();
    drop(before);
    plan.run(&[&inputs[0], &inputs[1]]).unwrap();
    let events = nvtx_capture::take_events();
    let me = std::thread::current().id();
    assert!(!events.is_empty(), "the run pushed ranges");
    assert!(events.iter().all(|e| e.thread == me), "every NVTX event on the calling thread: {events:#?}");
    let pushes = events.iter().filter(|e| e.kind == nvtx_capture::NvtxEventKind::Push).count();
    assert_eq!(pushes * 2, events.len(), "as many pops as pushes");
    assert_eq!(common::ranges::pushes_of(&events), common::ranges::pushes_in(plan.range_map()), "the range map");
    let seen = threads.lock().unwrap();
    assert!(seen.len() >= 2 * plan.len() && seen.iter().all(|&t| t == me), "guards on {seen:?}");
    let names = nvtx_capture::thread_names();
    for k in 1..cores() {
        let name = format!("boundscope-cpu-{k}");
        assert!(names.iter().any(|(_, n)| *n == name), "{name} not named in {names:?}");
    }
}

/// Edge cases of the split, fused and not: rows longer than a block (tiles, whose partial sums
/// carry across tiles inside one part), fewer rows than threads, one long row, a column, zero
/// rows, and blocks of odd sizes; each bit for bit the same on one thread and on every core, and
/// within rounding of the reference.
#[test]
fn awkward_shapes_and_blocks_split_the_same_as_one_thread() {
    if cores() < 2 {
        eprintln!("SKIPPED: one core here, so nothing is split over threads");
        return;
    }
    for (rows, cols) in [(3, 70_000), (300, 1_500), (1, 1 << 18), (1 << 17, 1), (0, 1 << 18), (5, 40_000)] {
        for block in [16, 100, 1024, 4099] {
            let (registry, arena) = (Registry::with_builtins(), Arena::new());
            let mut b = TraceBuilder::new(&arena, &registry);
            let x = b.input(&[rows, cols]).unwrap();
            let w = b.input(&[cols]).unwrap();
            let m = b.input(&[rows, 1]).unwrap();
            let y = b.mul(x, w).unwrap();
            let z = b.sub(y, m).unwrap();
            let t = b.tanh(z).unwrap();
            let s = b.sum(t).unwrap();
            let mx = b.max(z).unwrap();
            b.output(s).unwrap();
            b.output(mx).unwrap();
            b.output(t).unwrap();
            let trace = b.finish().unwrap();
            let inputs = [
                Tensor::from_fn(&[rows, cols], |i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0),
                Tensor::from_fn(&[cols], |i| (i % 13) as f32 / 6.0 - 1.0),
                Tensor::from_fn(&[rows, 1], |i| (i % 5) as f32 / 4.0),
            ];
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let mut results = Vec::new();
            for threads in [1, 0] {
                let reference: Arc<dyn Executor> = Arc::new(CpuReference::new().threads(threads));
                let fusion: Arc<dyn Executor> = Arc::new(CpuFusion::new().threads(threads).block_size(block));
                let fused = FuseRegions::new(fusion.clone()).run(&trace, &arena).unwrap();
                let plan = Plan::compile(&fused, &[fusion, reference.clone()]).unwrap();
                let unfused = Plan::compile(&trace, &[reference]).unwrap();
                results.push((bits(&plan.run(&refs).unwrap()), unfused.run(&refs).unwrap()));
            }
            let what = format!("[{rows}, {cols}] in blocks of {block}");
            assert_eq!(results[0].0, results[1].0, "fused, {what}");
            let unfused_bits = |r: &Vec<Tensor>| bits(r);
            assert_eq!(unfused_bits(&results[0].1), unfused_bits(&results[1].1), "unfused, {what}");
            // Fused against the reference: within rounding (sums of up to 2^18 terms).
            let fused_values: Vec<Vec<f32>> =
                results[1].0.iter().map(|t| t.iter().map(|&b| f32::from_bits(b)).collect()).collect();
            for (k, (got, want)) in fused_values.iter().zip(&results[1].1).enumerate() {
                for (g, w) in got.iter().zip(want.to_f32_vec()) {
                    let tolerance = 1e-4 * w.abs().max(1.0) * if k == 0 { (cols as f32).sqrt() } else { 1.0 };
                    assert!((g - w).abs() <= tolerance, "output {k}, {what}: {g} vs {w}");
                }
            }
        }
    }
}
