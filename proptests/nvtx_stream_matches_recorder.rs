//! What reaches the NVTX API (captured by a static NVTX injection in this test binary) is the
//! same range tree the in-process recorder sees: same labels, same nesting, same order, one
//! push and one pop per range, the library's domain, a category per level.

mod common;

use boundscope::executors::CpuReference;
use boundscope::guards::{NvtxRange, Recorder, Selection, DEFAULT_DOMAIN};
use boundscope::passes::Pass;
use boundscope::passes::{Pipeline, ProfileOps};
use boundscope::{Arena, BoundSymbolId, Plan, Registry};
use common::nvtx_capture::{self, NvtxEvent, NvtxEventKind};
use common::program::programs;
use proptest::prelude::*;

/// A range rebuilt from a push/pop stream: (label, parent index, category, payload).
type Node = (String, Option<usize>, u32, Option<u64>);

/// Rebuilds the ranges of `domain` from the stream, in push order, or says why it cannot.
fn tree_from_stream(events: &[NvtxEvent], domain: &str) -> Result<Vec<Node>, String> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    for e in events.iter().filter(|e| e.domain.as_deref() == Some(domain)) {
        match e.kind {
            NvtxEventKind::Push => {
                let label = e.message.clone().ok_or("a push without a message")?;
                nodes.push((label, stack.last().copied(), e.category, e.payload));
                stack.push(nodes.len() - 1);
            }
            NvtxEventKind::Pop => {
                stack.pop().ok_or("a pop without a push")?;
            }
        }
    }
    if stack.is_empty() {
        Ok(nodes)
    } else {
        Err(format!("{} ranges never popped", stack.len()))
    }
}

fn category_of(level: boundscope::guards::Level) -> u32 {
    match level {
        boundscope::guards::Level::Trace => 1,
        boundscope::guards::Level::Region => 2,
        boundscope::guards::Level::Op => 3,
        boundscope::guards::Level::Subsymbol => 4,
        boundscope::guards::Level::Scope => 5,
        _ => 0,
    }
}

#[test]
fn the_capture_is_installed() {
    assert!(nvtx_capture::is_installed(), "the static NVTX injection did not load; is NVTX_INJECTION64_PATH set?");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For random programs with an NVTX range and a recorder on every op, around the run and
    /// on a composite's subsymbols, before and after the standard passes, the NVTX stream and
    /// the recorder give the same tree.
    #[test]
    fn nvtx_stream_equals_recorder_tree(program in programs(true), composite in any::<usize>(), decompose in any::<bool>()) {
        prop_assume!(nvtx_capture::is_installed());
        let registry = Registry::with_builtins();
        let arena = Arena::new();
        let built = program.build(&arena, &registry).unwrap();
        let trace = if decompose { Pipeline::standard().run(&built, &arena).unwrap() } else { built };
        let mut profiled = ProfileOps::new().with_trace_range(NvtxRange::new()).run(&trace, &arena).unwrap();
        let recorder = Recorder::new();
        profiled.attach_trace_guard(recorder.clone()).unwrap();
        profiled.attach_guard(Selection::All, recorder.clone()).unwrap();
        // Subsymbol ranges on one composite, if there is one.
        let composites: Vec<usize> =
            (0..profiled.len()).filter(|&i| !profiled.bound_symbols()[i].subsymbols().is_empty()).collect();
        if !composites.is_empty() {
            let op = BoundSymbolId::from_index(composites[composite % composites.len()]);
            profiled.attach_subsymbol_guard(op, 1, NvtxRange::new()).unwrap();
            profiled.attach_subsymbol_guard(op, 1, recorder.clone()).unwrap();
        }
        let plan = Plan::compile(&profiled, &[CpuReference::shared()]).unwrap();
        let inputs = program.input_data(5);
        let refs: Vec<_> = inputs.iter().collect();
        nvtx_capture::events_on_current_thread();
        plan.run(&refs).unwrap();
        let events = nvtx_capture::events_on_current_thread();
        prop_assert_eq!(nvtx_capture::dropped_on_current_thread(), 0);

        let pushes = events.iter().filter(|e| e.kind == NvtxEventKind::Push).count();
        let pops = events.iter().filter(|e| e.kind == NvtxEventKind::Pop).count();
        prop_assert_eq!(pushes, pops);
        let nvtx = tree_from_stream(&events, DEFAULT_DOMAIN).map_err(TestCaseError::fail)?;
        prop_assert_eq!(nvtx.len(), pushes, "every range is in the library's domain");

        let mut recorded = recorder.ranges();
        recorded.sort_by_key(|r| r.id);
        prop_assert_eq!(nvtx.len(), recorded.len());
        for (i, (n, r)) in nvtx.iter().zip(&recorded).enumerate() {
            prop_assert_eq!(&n.0, r.label.as_ref(), "range {}", i);
            let parent = r.parent.map(|p| recorded.iter().position(|x| x.id == p).unwrap());
            prop_assert_eq!(n.1, parent, "parent of range {} ({})", i, r.label);
            prop_assert_eq!(n.2, category_of(r.level), "category of range {} ({})", i, r.label);
            // No range has a direct parent with the same label at the same level.
            if let Some(p) = parent {
                prop_assert!(!(recorded[p].label == r.label && recorded[p].level == r.level));
            }
        }
    }
}

#[test]
fn user_labels_domains_colors_and_payloads_reach_nvtx() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = boundscope::TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2, 4]).unwrap();
    let y = b.softmax(x).unwrap();
    b.output(y).unwrap();
    let trace = b.finish().unwrap();
    let mut prims = boundscope::passes::Decompose.run(&trace, &arena).unwrap();
    prims
        .attach_guard(
            Selection::Named("exp"),
            NvtxRange::new().label("the exp").unwrap().domain("mine").unwrap().color(0xFF00FF00).payload(42),
        )
        .unwrap();
    let mut softmax = trace.clone();
    softmax.attach_guard(Selection::All, NvtxRange::new()).unwrap();
    let spanned = boundscope::passes::Decompose.run(&softmax, &arena).unwrap();
    let mut lean = trace.clone();
    lean.attach_guard(Selection::All, NvtxRange::new().details(false)).unwrap();
    let lean = boundscope::passes::Decompose.run(&lean, &arena).unwrap();

    // A user's payload replaces the structured one; softmax's five prims carry their details
    // (this capture takes payload schemas, as a current Nsight does).
    let softmax_details =
        "first_step=0; steps=5; ops=5; bytes_read=32; bytes_written=32; flops=40; inputs=f32[2, 4]; outputs=f32[2, 4]";
    for (t, domain, label, payload, color, details) in [
        (&prims, "mine", "the exp", Some(42), Some(0xFF00FF00), None),
        (&spanned, DEFAULT_DOMAIN, "softmax", None, None, Some(softmax_details)),
        (&lean, DEFAULT_DOMAIN, "softmax", Some(5), None, None),
    ] {
        let plan = Plan::compile(t, &[CpuReference::shared()]).unwrap();
        nvtx_capture::events_on_current_thread();
        plan.run(&[&boundscope::Tensor::zeros(&[2, 4])]).unwrap();
        let events = nvtx_capture::events_on_current_thread();
        let tree = tree_from_stream(&events, domain).unwrap();
        assert_eq!(tree.len(), 1, "{events:?}");
        assert_eq!(tree[0].0, label);
        assert_eq!(tree[0].3, payload);
        let push =
            events.iter().find(|e| e.kind == NvtxEventKind::Push && e.message.as_deref() == Some(label)).unwrap();
        let expected = details.map(|d| format!("plan={}; {d}", plan.id()));
        assert_eq!(push.details, expected);
        if let Some(color) = color {
            let push = events.iter().find(|e| e.kind == NvtxEventKind::Push).unwrap();
            assert_eq!(push.color, Some(color));
        }
    }
}
