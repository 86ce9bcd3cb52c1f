//! Plan compilation and the run loop: errors, workspace reuse after failures, threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;
use crate::core::ir::{prims, Arena, Registry, TraceBuilder};
use crate::core::tensor::Tensor;
use crate::error::Error;
use crate::executors::CpuReference;

fn exp_then_add<'a>(arena: &'a Arena, registry: &'a Registry) -> crate::core::ir::Trace<'a> {
    let mut b = TraceBuilder::new(arena, registry);
    let x = b.input(&[2, 3]).unwrap();
    let y = b.exp(x).unwrap();
    let z = b.add(y, x).unwrap();
    b.output(z).unwrap();
    b.finish().unwrap()
}

/// Fails (or panics) on `exp` when its flag is set; otherwise defers to the reference.
struct Flaky {
    fail: Arc<AtomicBool>,
    panic: Arc<AtomicBool>,
}

impl Executor for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }
    fn claims(&self, op: &OpView<'_>) -> bool {
        op.symbol_id() == prims::EXP
    }
    fn compile(&self, op: &OpView<'_>) -> crate::Result<Box<dyn Kernel>> {
        let inner = CpuReference.compile(op)?;
        let (fail, panic) = (self.fail.clone(), self.panic.clone());
        Ok(kernel_fn(move |inputs, outputs| {
            if panic.load(Ordering::Relaxed) {
                panic!("flaky kernel panics on purpose");
            }
            if fail.load(Ordering::Relaxed) {
                return Err(Error::Execution {
                    executor: "flaky".into(),
                    symbol: "exp".into(),
                    message: "on purpose".into(),
                });
            }
            inner.run(inputs, outputs)
        }))
    }
}

#[test]
fn checks_inputs_and_workspace() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = exp_then_add(&arena, &registry);
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    let other = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    assert!(matches!(plan.run(&[]), Err(Error::InputCount { expected: 1, got: 0 })));
    let wrong = Tensor::zeros(&[3, 2]);
    assert!(matches!(plan.run(&[&wrong]), Err(Error::InputShape { index: 0, .. })));
    let mut ws = other.workspace();
    let x = Tensor::zeros(&[2, 3]);
    assert!(matches!(plan.run_with(&mut ws, &[x.view()]), Err(Error::WorkspaceMismatch)));
    assert_eq!(plan.run(&[&x]).unwrap()[0].data(), &[1.0; 6]);
}

#[test]
fn no_executor_names_symbol_and_executors_tried() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = exp_then_add(&arena, &registry);
    let flaky = Arc::new(Flaky { fail: Arc::default(), panic: Arc::default() });
    let err = Plan::compile(&trace, &[flaky]).unwrap_err();
    assert_eq!(err, Error::NoExecutor { symbol: "add".into(), tried: vec!["flaky".into()] });
    assert!(err.to_string().contains("tried: flaky"));
}

#[test]
fn workspace_stays_usable_after_an_error_and_a_panic() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = exp_then_add(&arena, &registry);
    let fail = Arc::new(AtomicBool::new(false));
    let panic = Arc::new(AtomicBool::new(false));
    let flaky = Arc::new(Flaky { fail: fail.clone(), panic: panic.clone() });
    let plan = Plan::compile(&trace, &[flaky, CpuReference::shared()]).unwrap();
    assert_eq!(plan.steps_per_executor(), vec![("flaky", 1), ("cpu_reference", 1)]);
    let x = Tensor::zeros(&[2, 3]);
    let mut ws = plan.workspace();

    fail.store(true, Ordering::Relaxed);
    assert!(matches!(plan.run_with(&mut ws, &[x.view()]), Err(Error::Execution { .. })));
    fail.store(false, Ordering::Relaxed);
    assert_eq!(plan.run_with(&mut ws, &[x.view()]).unwrap().get(0).unwrap().data, &[1.0; 6]);

    panic.store(true, Ordering::Relaxed);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = plan.run_with(&mut ws, &[x.view()]);
    }));
    assert!(caught.is_err());
    panic.store(false, Ordering::Relaxed);
    assert_eq!(plan.run_with(&mut ws, &[x.view()]).unwrap().get(0).unwrap().data, &[1.0; 6]);
}

#[test]
fn output_that_is_an_input_is_copied() {
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let mut b = TraceBuilder::new(&arena, &registry);
    let x = b.input(&[2]).unwrap();
    let y = b.neg(x).unwrap();
    b.output(x).unwrap();
    b.output(y).unwrap();
    let plan = Plan::compile(&b.finish().unwrap(), &[CpuReference::shared()]).unwrap();
    let out = plan.run(&[&Tensor::new(&[2], vec![1.0, -2.0]).unwrap()]).unwrap();
    assert_eq!(out[0].data(), &[1.0, -2.0]);
    assert_eq!(out[1].data(), &[-1.0, 2.0]);
    assert!(plan.to_string().contains("copy of input t0"));
}

#[test]
fn plan_runs_from_many_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Plan>();
    let registry = Registry::with_builtins();
    let arena = Arena::new();
    let trace = exp_then_add(&arena, &registry);
    let plan = Plan::compile(&trace, &[CpuReference::shared()]).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let plan = &plan;
            s.spawn(move || {
                let x = Tensor::from_fn(&[2, 3], |i| (i + t) as f32 * 0.1);
                for _ in 0..100 {
                    let out = plan.run(&[&x]).unwrap();
                    for (o, v) in out[0].data().iter().zip(x.data()) {
                        assert!((o - (v.exp() + v)).abs() < 1e-6);
                    }
                }
            });
        }
    });
}
