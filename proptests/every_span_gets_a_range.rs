//! Every span gets its NVTX range through `NvtxLayer`, however many labels a program has: past
//! the callsites the layer prepares, and past the 4,096 labels `TracingSpan` interns (after
//! which its spans share a callsite and carry their label in a field). Its own process: the
//! 10,000 labels leave callsites behind that would change what other tests measure.

mod common;

use boundscope::executors::CpuReference;
use boundscope::guards::{NvtxLayer, Selection, TracingSpan};
use boundscope::{Arena, BoundSymbolId, Plan, Registry, Tensor, TraceBuilder};
use common::nvtx_capture::{self, NvtxEventKind};
use common::ranges::pushes_of;
use tracing_subscriber::layer::SubscriberExt;

/// 10,000 labels through `TracingSpan` guards, under a layer that prepares 1,000 callsites: the
/// first 1,000 labels get prepared ranges, the next 3,096 (interned callsites past the layer's
/// table) and the last 5,904 (shared callsites, labelled by their field) ranges of their own.
/// Each span's range is pushed with its label, in order, and popped.
#[test]
fn ten_thousand_labels_each_get_their_range() {
    if !nvtx_capture::is_installed() {
        eprintln!("SKIPPED ten_thousand_labels_each_get_their_range: the NVTX capture is not this process's NVTX tool");
        return;
    }
    let registry = Registry::with_builtins();
    let layer = NvtxLayer::new().in_domain("labels").unwrap().prepared_callsites(1000);
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        // Two plans of 5,000 labelled ops each: one run's events fit the capture's log.
        for part in 0..2 {
            let arena = Arena::new();
            let mut b = TraceBuilder::new(&arena, &registry);
            let mut v = b.input(&[1]).unwrap();
            for _ in 0..5000 {
                v = b.neg(v).unwrap();
            }
            b.output(v).unwrap();
            let mut trace = b.finish().unwrap();
            let labels: Vec<String> = (0..5000).map(|i| format!("label {}", part * 5000 + i)).collect();
            for (i, label) in labels.iter().enumerate() {
                let span = TracingSpan::new().label(label).unwrap().level(tracing::Level::INFO);
                trace.attach_guard(Selection::Op(BoundSymbolId::from_index(i)), span).unwrap();
            }
            let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
            nvtx_capture::events_on_current_thread();
            plan.run(&[&Tensor::zeros(&[1])]).unwrap();
            let events = nvtx_capture::events_on_current_thread();
            assert_eq!(nvtx_capture::dropped_on_current_thread(), 0);
            let pushes = pushes_of(&events);
            let wrong: Vec<String> = labels
                .iter()
                .zip(pushes.iter().map(Some).chain(std::iter::repeat(None)))
                .filter(|(label, push)| push.is_none_or(|p| p.label != **label || p.domain != "labels"))
                .take(5)
                .map(|(label, push)| format!("{label}: {push:?}"))
                .collect();
            assert!(wrong.is_empty(), "part {part}: {} pushes for 5,000 spans; first wrong: {wrong:?}", pushes.len());
            assert_eq!(pushes.len(), 5000, "part {part}");
            let pops = events.iter().filter(|e| e.kind == NvtxEventKind::Pop).count();
            assert_eq!(pops, 5000, "part {part}: every range popped");
        }
    });
}

/// Two layers in one subscriber (two domains) each keep their own range in a span past their
/// prepared callsites, and each pushes its own, in its own domain.
#[test]
fn two_layers_keep_a_range_each_in_one_span() {
    if !nvtx_capture::is_installed() {
        eprintln!("SKIPPED two_layers_keep_a_range_each_in_one_span: the NVTX capture is not this process's NVTX tool");
        return;
    }
    let first = NvtxLayer::new().in_domain("first").unwrap().prepared_callsites(0);
    let second = NvtxLayer::new().in_domain("second").unwrap().prepared_callsites(0);
    let subscriber = tracing_subscriber::registry().with(first).with(second);
    tracing::subscriber::with_default(subscriber, || {
        nvtx_capture::events_on_current_thread();
        for _ in 0..3 {
            tracing::info_span!("both").in_scope(|| std::hint::black_box(1));
        }
        let pushes = pushes_of(&nvtx_capture::events_on_current_thread());
        let seen: Vec<(String, String)> = pushes.into_iter().map(|p| (p.domain, p.label)).collect();
        let one = [("first".to_string(), "both".to_string()), ("second".to_string(), "both".to_string())];
        assert_eq!(seen, [one.clone(), one.clone(), one].concat());
    });
}
